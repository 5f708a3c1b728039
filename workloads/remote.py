"""What a Locust master and a worker on another host say to each other (no Locust import here).

A Locust worker started by ``tuner load-worker`` on a load host shares no files with
the master: it does not see the schedule or the records directory. The locustfile
exchanges these payloads in Locust custom messages (``runner.send_message``; the data
travels as msgpack, so only plain dicts, lists, strings and numbers)::

    worker                                master
      test starts (spawn) --SHARE_REQUEST-->
                          <--SHARE--------- its share of the schedule and settings
      every FLUSH_S ------RECORDS---------> appended to records.jsonl.w<i>
      done -------------RECORDS (stats)---> records, then records.jsonl.w<i>.stats.json
                          <--DONE---------- the worker quits; its agent starts the next

A worker that connects to a run already under way (its agent restarted it while the
master waited for slower workers) gets a share with no requests and idles until the
master quits.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from workloads.runner import WorkerStats, is_local_address

SHARE_REQUEST = "tuner_share_request"
SHARE = "tuner_share"
RECORDS = "tuner_records"
DONE = "tuner_done"


class Share(BaseModel):
    """Master -> remote worker: its part of the schedule and everything needed to send it.

    ``requests`` holds the share's `ScheduledRequest` JSON lines in send order
    (`workloads.schedule.share_of`: whole sessions, dealt round-robin); None: the
    worker is not part of this run (it connected after the run started).
    ``turns_until_s``: ``TUNER_TURNS_UNTIL_S`` (a later turn due at or after this
    offset is not sent); None: no limit.
    """

    model_config = ConfigDict(frozen=True)

    index: int
    count: int
    host: str  # the server's base URL as the master sees it
    model: str
    start_at_s: float  # Unix time of offset 0 (load hosts need NTP-synced clocks)
    request_timeout_s: float
    max_in_flight: int  # this worker's share of the cap
    api_key: str | None = None
    requests: list[str] | None = None
    turns_until_s: float | None = None

    def to_data(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def from_data(cls, data: Any) -> Share:
        return cls.model_validate(data)


class RecordBatch(BaseModel):
    """Remote worker -> master: records (`RequestRecord` JSON lines) since the last batch;
    the last batch of a share carries the worker's stats."""

    model_config = ConfigDict(frozen=True)

    index: int
    lines: list[str]
    stats: WorkerStats | None = None

    def to_data(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_data(cls, data: Any) -> RecordBatch:
        return cls.model_validate(data)


def reachable_url(url: str, master_host: str) -> str:
    """The server's URL as a remote worker must use it: a loopback or wildcard host in it
    means the master's machine, which the worker reaches as ``master_host``."""
    parts = urlsplit(url)
    if parts.hostname is None or not is_local_address(parts.hostname):
        return url
    host = f"[{master_host}]" if ":" in master_host else master_host
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    if parts.username:
        password = f":{parts.password}" if parts.password else ""
        netloc = f"{parts.username}{password}@{netloc}"
    return parts._replace(netloc=netloc).geturl()

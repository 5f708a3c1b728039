"""The contract between workload generation and load generation: schedules in, records out.

A *schedule* is the plan of one load run: every request with the offset (seconds
from the start of the run) at which it is planned. Requests without ``follows``
(single requests, sessions' first turns) are open loop: sent at that offset,
whatever the server is doing. A later turn of a session (``follows`` set) is closed
loop within its session: sent ``think_time_s`` after the answer it extends arrived,
as a user would; its offset is only the plan. A *record* is what the load generator
measured for one request. Both are JSON Lines files, so Locust (its own process,
gevent-patched) and the tuner never share memory, and every run leaves its evidence
on disk.

Times in records are Unix seconds (``time.time()``) of the load generator's clock;
``scheduled_s`` is when the request was due: the run start plus its offset, or for a
later turn its predecessor's answer (``answer_s``) plus the think time. Latencies
are measured from it (no coordinated omission: a stalled server cannot delay the
clock the latency is measured against; it delays a user's next turn only as it
would delay a real user's).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from workloads.load_errors import was_sent


class Api(StrEnum):
    COMPLETIONS = "completions"
    CHAT = "chat"


@dataclass(frozen=True)
class ScheduledRequest:
    """One request of the plan."""

    request_id: str
    # Offset from the start of the run: when it is sent (follows None), or only when it
    # was planned (a later turn, sent when the answer it extends is in; see follows).
    send_s: float
    api: Api
    prompt_tokens: int
    max_tokens: int
    prompt: str | None = None  # completions
    messages: list[dict[str, str]] | None = None  # chat: [{"role": ..., "content": ...}]
    warmup: bool = False  # sent before the measured window, excluded from results
    session_id: str | None = None  # multi-turn conversation this request belongs to
    turn: int = 0
    # A later turn: the request id of the turn whose answer it extends. The load generator
    # sends it ``think_time_s`` after that answer arrived (``send_s`` is only the plan);
    # None: sent at ``send_s`` (a first turn, or the first turn of a session already under
    # way when the schedule opens, whose earlier turns were never sent).
    follows: str | None = None
    think_time_s: float = 0.0
    # False: sent without streaming, one response at the end (see sample_streams).
    stream: bool = True
    # Streamed: tokens the server is asked to batch into each event (vLLM's per-request
    # ``stream_interval``; 1: every token its own event; see sample_streams).
    stream_interval: int = 1

    def to_json(self) -> str:
        """This request's line on its own, whole (a file's lines: ``ScheduleCodec``)."""
        return ScheduleCodec().encode(self)

    @classmethod
    def from_json(cls, line: str) -> ScheduledRequest:
        """A whole line (one that takes history from an earlier one says so: ValueError)."""
        return ScheduleCodec().decode(line)


@dataclass(frozen=True)
class RequestRecord:
    """What the load generator measured for one request (Unix seconds)."""

    request_id: str
    # When it was due: run start + send_s, or for a later turn answer_s + think_time_s.
    scheduled_s: float
    sent_s: float
    prompt_tokens: int  # as the server counted them (usage), else as scheduled
    output_tokens: int  # from the usage chunk when present, else token events
    status: int  # HTTP status; 0 when the connection failed
    first_token_s: float | None = None
    end_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    error: str | None = None
    warmup: bool = False
    worker: str = ""  # which load-generator process sent it
    streamed: bool = True  # False: no token timings, only the end (a sampled-out request)
    # A later turn (ScheduledRequest.follows): when the answer it extends arrived (the
    # predecessor's end, or the time recorded for one that failed or was not sent).
    answer_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> RequestRecord:
        return cls(**json.loads(line))


HISTORY_FIELD = "history"


class ScheduleCodec:
    """A schedule's JSON lines with each conversation's history written once.

    A later turn's messages begin with those of the turn it follows, which grow with
    every turn: written whole, a chat level's schedule is hundreds of megabytes, which
    every load-generator process reads. Where the turn it follows was written before
    it by the same codec, a line carries only its new messages and ``history``, how
    many it takes from that turn; anything else is written whole. Lines are read back
    in the order written, by one codec per file or share."""

    def __init__(self) -> None:
        self._messages: dict[str, list[dict[str, str]]] = {}

    def encode(self, request: ScheduledRequest) -> str:
        data: dict[str, Any] = {f.name: getattr(request, f.name) for f in fields(request)}
        messages = request.messages
        earlier = self._messages.get(request.follows) if request.follows is not None else None
        if messages is not None:
            self._messages[request.request_id] = messages
            if earlier and messages[: len(earlier)] == earlier:
                data["messages"] = messages[len(earlier) :]
                data[HISTORY_FIELD] = len(earlier)
        return json.dumps(data, separators=(",", ":"))

    def decode(self, line: str) -> ScheduledRequest:
        data = json.loads(line)
        taken = data.pop(HISTORY_FIELD, None)
        if taken is not None:
            earlier = self._messages.get(data["follows"])
            if earlier is None or len(earlier) < taken:
                raise ValueError(
                    f"request {data['request_id']!r} takes {taken} messages from "
                    f"{data['follows']!r}, which is not before it in the schedule"
                )
            data["messages"] = earlier[:taken] + data["messages"]
        data["api"] = Api(data["api"])
        request = ScheduledRequest(**data)
        if request.messages is not None:
            self._messages[request.request_id] = request.messages
        return request


def write_schedule(path: Path, requests: Iterable[ScheduledRequest]) -> int:
    """Write ``requests`` in send order (``ScheduleCodec``), whole or not at all (a load
    generator still reading the file it replaces reads the old one); how many."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    codec = ScheduleCodec()
    count = 0
    with tmp.open("w", encoding="utf-8") as out:
        for request in sorted(requests, key=lambda r: r.send_s):
            out.write(codec.encode(request) + "\n")
            count += 1
    tmp.replace(path)
    return count


def reached(
    requests: Iterable[ScheduledRequest], records: Iterable[RequestRecord], until_s: float = 0.0
) -> list[ScheduledRequest]:
    """The part of a schedule a run sent: every request recorded as sent (a later turn is
    sent when its answer is in, which may be before its plan), and one without a record
    where it was planned before offset ``until_s`` (a run that records only what it sent
    stopped there). A level's schedule is planned for its longest window and most levels
    stop far sooner: what it never sent is not kept."""
    sent = {r.request_id: was_sent(r.error) for r in records}
    return [
        r
        for r in requests
        if sent.get(r.request_id, False) or (r.request_id not in sent and r.send_s < until_s)
    ]


def request_body(request: ScheduledRequest, model: str) -> bytes:
    """The JSON body vLLM generates exactly ``max_tokens`` tokens for: streamed with a usage
    chunk, or (a request sampled out of streaming) one response carrying its usage."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": request.max_tokens,
        "min_tokens": request.max_tokens,
        "ignore_eos": True,
        "stream": request.stream,
    }
    if request.stream:
        body["stream_options"] = {"include_usage": True}
        if request.stream_interval > 1:
            body["stream_interval"] = request.stream_interval
            # each chunk says how many tokens so far: a stream cut off at a level's end
            # counts its own tokens, not its chunks (which would make its TPOT 10x longer)
            body["stream_options"]["continuous_usage_stats"] = True
    if request.api is Api.CHAT:
        body["messages"] = request.messages
    else:
        body["prompt"] = request.prompt
    return json.dumps(body, separators=(",", ":")).encode()


def sample_streams(
    requests: Iterable[ScheduledRequest], fraction: float, interval_tokens: int = 1
) -> list[ScheduledRequest]:
    """Stream only ``fraction`` of the requests; the rest are sent without streaming.
    Streamed ones ask for ``interval_tokens`` tokens an event.

    The server does the same work either way; the load generator reads one response
    instead of one event per token, so a fast server can be loaded fully while token
    timings (TTFT, ITL, TPOT) come from a uniform sample of the requests. The choice
    is a hash of the request id: the same requests are streamed in every run.

    ``interval_tokens`` > 1 keeps every request's TTFT and TPOT at a fraction of the
    events: vLLM's per-request ``stream_interval`` (from 0.27; an older server ignores
    it and streams every token) sends the first token alone, then a chunk every
    ``interval_tokens`` tokens, and the last one at once; what it does not show is how
    the tokens within a chunk were spaced (the ITL is a chunk's mean).
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"stream fraction {fraction} is out of range; accepted: 0 < f <= 1")
    if interval_tokens < 1:
        raise ValueError(f"stream interval {interval_tokens} is out of range; accepted: >= 1")
    if fraction >= 1.0 and interval_tokens == 1:
        return list(requests)
    return [
        replace(
            r,
            stream=r.stream if fraction >= 1.0 else in_hashed_share(r.request_id, fraction),
            stream_interval=interval_tokens,
        )
        for r in requests
    ]


def share_of(
    schedule: Sequence[ScheduledRequest], index: int, count: int
) -> list[ScheduledRequest]:
    """Load-generator process ``index`` of ``count``'s part of the schedule, in send order.

    Units (a session's requests together, or a request without a session) are dealt
    round-robin in the order they first appear in send order, so every turn of a
    session goes to the process that waits for its answers, and N processes each
    offer about 1/N of the rate. Without sessions this is request ``i`` (in send
    order) with ``i % count == index``.
    """
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"share {index} of {count} is out of range; accepted: 0..count-1")
    units: dict[str, int] = {}
    next_unit = 0
    share: list[ScheduledRequest] = []
    for request in sorted(schedule, key=lambda r: r.send_s):  # stable: ties keep their order
        if request.session_id is None:
            unit = next_unit
            next_unit += 1
        elif (unit := units.get(request.session_id, -1)) < 0:
            unit = units[request.session_id] = next_unit
            next_unit += 1
        if unit % count == index:
            share.append(request)
    return share


@dataclass(frozen=True)
class SegmentHeader:
    """How a segment of a chained run (``workloads.chain``) takes over from those before it.

    From ``offset_s`` (seconds from the run's offset 0) the segment's requests (the
    schedule at ``schedule``, its offsets counted from ``offset_s``) are the new load:
    the earlier segments' new arrivals (open-loop first turns) due at or after it are
    withdrawn, the sessions already under way carry on into it, and of those only
    ``keep_under_way`` do (a lower rate thins them: a session carries on when
    ``carries_on(session_id, keep_under_way, salt)``). A withdrawn request is neither
    sent nor recorded, only counted (``WorkerStats.withdrawn``)."""

    index: int  # 1, 2, ...: segment 0 is the run's schedule
    offset_s: float
    schedule: str  # absolute path of a schedule file (write_schedule's), read once
    keep_under_way: float = 1.0
    salt: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> SegmentHeader:
        return cls(**json.loads(line))


def carries_on(session_id: str | None, keep: float, salt: str) -> bool:
    """Whether a session under way carries on into a segment that keeps ``keep`` of them:
    a hash of the salt and the session id, so every load-generator process agrees."""
    if keep >= 1.0 or session_id is None:
        return True
    return in_hashed_share(f"{salt}/{session_id}", keep)


def in_hashed_share(key: str, fraction: float) -> bool:
    """Whether ``key`` falls in a share ``fraction`` of all keys: its crc32 against the
    fraction of the 32-bit range, the same in every process and every run."""
    return zlib.crc32(key.encode()) < int(fraction * (1 << 32))


def segment_path(segments_dir: Path, index: int) -> Path:
    return segments_dir / f"segment-{index}.jsonl"


def write_segment(segments_dir: Path, header: SegmentHeader) -> None:
    """Write a segment's header whole (a load generator polls for the file; its schedule
    must be written before)."""
    path = segment_path(segments_dir, header.index)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(header.to_json() + "\n", encoding="utf-8")
    tmp.replace(path)


def read_segment_header(path: Path) -> SegmentHeader:
    return SegmentHeader.from_json(path.read_text(encoding="utf-8"))


def snapshot_request_path(segments_dir: Path, index: int) -> Path:
    """Asks every load-generator process for snapshot ``index`` of what it has in flight."""
    return segments_dir / f"snapshot-{index}"


def snapshot_path(segments_dir: Path, index: int, worker_index: int) -> Path:
    """Process ``worker_index``'s answer: a record per request in flight, as far as it got
    (``error`` ABORTED, as a request cut off at a run's stop), written whole."""
    return segments_dir / f"snapshot-{index}.w{worker_index}"


def read_schedule(path: Path) -> list[ScheduledRequest]:
    """A schedule as ``write_schedule`` wrote it."""
    codec = ScheduleCodec()
    with path.open(encoding="utf-8") as fh:
        return [codec.decode(line) for line in fh if line.strip()]


def write_records(path: Path, records: Iterable[RequestRecord]) -> None:
    """Records as JSON lines, in the order given."""
    with path.open("w", encoding="utf-8") as out:
        for record in records:
            out.write(record.to_json() + "\n")


def read_records(path: Path) -> Iterator[RequestRecord]:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield RequestRecord.from_json(line)

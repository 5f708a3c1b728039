"""Locust load generator: a schedule of streaming OpenAI-API requests, open loop across
sessions, closed loop within one.

Run by `workloads.runner.run_load` (headless subprocess), or directly with the web UI::

    TUNER_SCHEDULE=runs/x/schedule.jsonl TUNER_RECORDS=runs/x/records.jsonl TUNER_MODEL=qwen2.5-7b \\
        locust -f workloads/locustfile.py --host http://127.0.0.1:8000 [--processes N]

Configuration (environment variables, read when a test starts, never at import):

``TUNER_SCHEDULE``
    Path of the schedule (`workloads.schedule.ScheduledRequest` JSON lines, as
    `workloads.schedule.write_schedule` writes them). Required.
``TUNER_RECORDS``
    Records path. Process ``i`` appends one `RequestRecord` JSON line per request to
    ``<TUNER_RECORDS>.w<i>`` (flushed per record) and writes its `WorkerStats` to
    ``<TUNER_RECORDS>.w<i>.stats.json`` when its share is done. Default ``records.jsonl``.
``TUNER_MODEL``
    Served model name (the requests' ``model`` field). Required.
``TUNER_MAX_IN_FLIGHT``
    Cap on requests in flight over all processes (each process takes its share, rounded
    up). A request due while its process is at its cap is not sent: it is recorded with
    the error ``not sent: in-flight cap reached`` and counted. Default 4096.
``TUNER_WORKER_INDEX`` / ``TUNER_WORKER_COUNT``
    This process sends share ``index`` of ``count`` (`workloads.schedule.share_of`):
    units (a session's requests, or a request without a session) dealt round-robin in
    the order they first appear in send order, so N processes each offer about 1/N of
    the rate and a session's turns all go out from the process that waits for their
    answers. Defaults: under ``--processes N`` (or ``--master``/``--worker``) the index
    Locust's master gave the worker and the number of workers the master expects;
    otherwise 0 and 1.
``TUNER_START_AT``
    Unix time of offset 0 of the schedule, shared by every process (each sends one
    ``GET /v1/models`` before it, to warm its HTTP client up). Honoured by the first
    test of a process; later tests (web UI restarts) and an unset value start 1 s after
    the test starts.
``TUNER_GO_FILE``
    Set by the harness for local processes: once warmed up, the process writes its
    ready mark (`workloads.runner.ready_path`) and waits for this file, which holds an
    earlier offset 0, written once every process is ready; ``TUNER_START_AT`` stays the
    latest start, kept if the file does not come.
``TUNER_REQUEST_TIMEOUT_S``
    A request not finished this long after its scheduled time is abandoned and recorded
    with a timeout error. Default 600.
``TUNER_TURNS_UNTIL_S``
    Offset from ``TUNER_START_AT``: a session's later turn due at or after it is not sent
    and not recorded (the user's turn falls after the measurement), only counted
    (``turns_after_window`` in the stats). Unset: no limit.
``TUNER_SEGMENTS``
    A folder: the schedule grows while the run goes on (a chained run,
    ``workloads.chain``). Every ``SEGMENT_POLL_S`` the dispatcher looks there for the
    next ``segment-<k>.jsonl`` (``workloads.schedule.SegmentHeader``: its offset from
    ``TUNER_START_AT`` and the schedule file it brings, read a few lines at a time
    between sends, its offsets counted from the segment's): from the segment's offset the
    earlier segments' new arrivals are withdrawn, the sessions under way carry on (as
    many as it keeps), and its own requests join. It also answers each
    ``snapshot-<n>`` there with ``snapshot-<n>.w<i>``: a record of every request in
    flight, as far as it got. The run then never ends by itself; its caller stops it.
    Local processes only.
``VLLM_API_KEY``
    Sent as ``Authorization: Bearer`` when set.

A worker on another host (started by ``tuner load-worker --master HOST:PORT``) has no
``TUNER_SCHEDULE``: that is how it knows it is remote. At test start it asks the master
for its share; the master (which has the environment above) answers with the share
and the settings (`workloads.remote.Share`). The worker sends its records back in
batches every ``FLUSH_S`` and its stats with the last batch; the master writes them to
``<TUNER_RECORDS>.w<i>`` and its ``.stats.json`` as a local process would, answers,
and the worker quits (its agent starts a fresh one for the next run). With remote
workers the master quits once every worker's stats are written, and a worker that
connects to a run already under way idles until then. A loopback or wildcard host in
the server's URL is replaced, on a remote worker, by the master's host.

How it sends: when a test starts, each load-generating process (not a master) starts
one dispatcher greenlet. Open-loop requests (``follows`` None, or the turn it follows
is not in this share) are due at their send time. A later turn of a session
(``follows``) is closed loop: due when the record of the turn it extends is written,
at that turn's answer (its ``end_s``; for one that failed or was not sent, the time
recorded) plus ``think_time_s``; its record keeps both (``answer_s``, ``scheduled_s``),
and latencies count from ``scheduled_s`` as for any request. A slow server thus delays
a user's next turn, never the arrival of new sessions. Each pending turn has a greenlet
that sleeps until it is due, as the dispatcher does for the open-loop ones; the run is
done once every chain of turns is. For each due request the body is encoded while
waiting, and at its time a greenlet POSTs it (``stream``, ``stream_options.include_usage``,
``max_tokens`` = ``min_tokens``, ``ignore_eos``) with geventhttpclient on a kept-alive
connection (one spare connection is kept open ahead of need) and reads the SSE stream
line by line as bytes arrive (``readline`` on the raw response: Locust's ``iter_lines``
/ ``iter_content`` batch events and would blur inter-token times). Every token event
(a ``data:`` chunk whose first choice carries non-empty text or delta content) is
timestamped; output and prompt tokens come from the usage chunk (else the event count
and the scheduled prompt length). The Locust users are an idle vehicle; the dispatcher
never waits for one, so a slow server cannot slow the arrivals. A request due while
the process is at its in-flight cap, open-loop or later turn, is recorded as not sent.

What the times are (`StampedSocket`): ``sent_s`` is when the request was handed to the
kernel (after any connection set-up), and on Linux over plain HTTP a token's time is
the kernel's receive stamp of its bytes (``SO_TIMESTAMPNS``), so neither depends on
when this process got round to the stream; elsewhere, when the line was read. How late
the process read its streams is in its stats (``read_delay_*``, ``coalesced_events``).

Locust's own response time for a stream would be the time to the headers; instead one
request event per request is fired with the TTFT (from the scheduled time) as its
response time, under the name ``<api> TTFT``, so the web UI and the summary show it.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import socket
import struct
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import gevent
from gevent.event import AsyncResult, Event
from gevent.pool import Group
from geventhttpclient import HTTPClient
from locust import User, constant, events, task
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from workloads.load_errors import (
    ABORTED,
    CAP_REACHED,
    STOPPED_BEFORE_SEND,
    TIMED_OUT,
)
from workloads.remote import (
    DONE,
    RECORDS,
    SHARE,
    SHARE_REQUEST,
    RecordBatch,
    Share,
    reachable_url,
)
from workloads.runner import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_REQUEST_TIMEOUT_S,
    WorkerStats,
    connected_workers_path,
    ready_path,
    worker_records_path,
    worker_stats_path,
)
from workloads.schedule import (
    Api,
    RequestRecord,
    ScheduleCodec,
    ScheduledRequest,
    SegmentHeader,
    carries_on,
    read_schedule,
    read_segment_header,
    request_body,
    segment_path,
    share_of,
    snapshot_path,
    snapshot_request_path,
)

log = logging.getLogger(__name__)

PATHS = {Api.COMPLETIONS: "/v1/completions", Api.CHAT: "/v1/chat/completions"}
UNSET_START_DELAY_S = 1.0
CONNECTION_TIMEOUT_S = 10.0
ERROR_BODY_LIMIT = 500
# The last stretch before a send time is spent yielding, not in a timer (_sleep_until).
SPIN_S = 0.0015
IDLE_YIELD_S = 50e-6  # a yield this short found nothing else to run
# Linux's SO_TIMESTAMPNS (= SCM_TIMESTAMPNS; Python's socket module does not name it) on
# the architectures where asm-generic/socket.h defines it; elsewhere no kernel timestamps.
SO_TIMESTAMPNS = 35 if sys.platform == "linux" and os.uname().machine in (
    "x86_64", "aarch64", "arm64", "armv7l", "i686", "riscv64", "s390x", "ppc64le"
) else None  # fmt: skip
# Remote workers: records go to the master in batches this often; how long a worker waits
# for its share, and for the master's answer to its last batch before it quits anyway.
FLUSH_S = 0.5
SHARE_WAIT_S = 30.0
DONE_WAIT_S = 30.0
LATE_WARNING_S = 0.01
GO_POLL_S = 0.01  # how often a ready process looks for TUNER_GO_FILE
# The event loop's probe: a timer this often, whose lateness is how long anything ready
# (a token's bytes, a send time) waited for the loop (``loop_delay_*`` in the stats).
LOOP_PROBE_S = 0.05
SEGMENT_POLL_S = 0.1  # a chained run: how often the dispatcher looks for segments and snapshots
SEGMENT_LINES_AT_ONCE = 20  # a segment's schedule lines parsed between two yields
_TIMESPEC = struct.Struct("@ll")  # struct timespec: tv_sec, tv_nsec
_CMSG_SPACE = socket.CMSG_SPACE(_TIMESPEC.size)


class StampedSocket(gevent.socket.socket):  # type: ignore[misc]
    """A gevent TCP socket that knows when its bytes left and when they reached this host.

    ``sent_s``: when the latest ``sendall`` handed the request to the kernel (after any
    connection set-up and request building, which are the client's own delay).
    ``received_s``: with ``SO_TIMESTAMPNS`` the kernel stamps each received segment;
    ``recv`` reads with ``recvmsg`` and keeps the stamp of the last segment it returned
    (None when the kernel gave none). A token's time is then when its bytes arrived,
    not when this process got round to reading them: a server writes a whole decode
    step's tokens at once, and a client reading 32 streams one after another would
    otherwise stamp the last of them a few milliseconds late, more when its core is
    shared. Segments the kernel merged before the read carry the latest one's stamp
    (``coalesced_events`` in the worker stats). ``TCP_NODELAY`` too: a request
    leaves in one segment without waiting for an acknowledgement.
    """

    def __init__(self, family: int, kind: int, proto: int = 0) -> None:
        super().__init__(family, kind, proto)
        self.sent_s: float | None = None  # when the latest sendall began
        self.received_s: float | None = None
        self.stamping = False
        self.drained = False  # the last read took everything the kernel had
        if kind == socket.SOCK_STREAM:
            self.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if SO_TIMESTAMPNS is not None:
            try:
                self.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                self.stamping = True
            except OSError:
                pass

    def sendall(self, data: bytes, flags: int = 0) -> None:
        self.sent_s = time.time()
        super().sendall(data, flags)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if not self.stamping:
            return super().recv(bufsize, flags)  # type: ignore[no-any-return]
        if self.drained and self.timeout is None:
            # A stream's next event is rarely there yet: wait until it is, rather than
            # try first and fail (a syscall and an exception per token event otherwise).
            self._wait(self._read_event)
        data, ancillary, _flags, _address = self.recvmsg(bufsize, _CMSG_SPACE, flags)
        self.drained = len(data) < bufsize
        self.received_s = None
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                seconds, nanoseconds = _TIMESPEC.unpack_from(payload)
                self.received_s = seconds + nanoseconds * 1e-9
        return data  # type: ignore[no-any-return]


@dataclass(frozen=True)
class LoadSettings:
    """This process's configuration: from the environment and Locust's runner (a local
    process), or from the master's `Share` (a remote worker: no paths)."""

    schedule_path: Path | None
    records_path: Path | None  # TUNER_RECORDS; this process writes records_path + ".w<index>"
    model: str
    host: str
    worker_index: int
    worker_count: int
    max_in_flight: int  # this process's share of the cap
    start_at_s: float
    request_timeout_s: float
    api_key: str | None
    turns_until_s: float | None = None  # TUNER_TURNS_UNTIL_S, an offset from start_at_s
    segments_dir: Path | None = None  # TUNER_SEGMENTS: a chained run's segments
    go_path: Path | None = None  # TUNER_GO_FILE: an earlier offset 0, once every process is ready

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str], environment: Environment, *, first_test: bool
    ) -> LoadSettings:
        schedule = environ.get("TUNER_SCHEDULE")
        model = environ.get("TUNER_MODEL")
        if not schedule or not model:
            raise ValueError("TUNER_SCHEDULE and TUNER_MODEL must be set (see the locustfile)")
        if not environment.host:
            raise ValueError("no host: pass --host http://HOST:PORT")
        index, count = _worker_position(environ, environment)
        total_cap = int(environ.get("TUNER_MAX_IN_FLIGHT") or DEFAULT_MAX_IN_FLIGHT)
        start_at = environ.get("TUNER_START_AT")
        return cls(
            schedule_path=Path(schedule),
            records_path=Path(environ.get("TUNER_RECORDS") or "records.jsonl"),
            model=model,
            host=environment.host,
            worker_index=index,
            worker_count=count,
            max_in_flight=max(1, math.ceil(total_cap / count)),
            start_at_s=(
                float(start_at) if start_at and first_test else time.time() + UNSET_START_DELAY_S
            ),
            request_timeout_s=float(
                environ.get("TUNER_REQUEST_TIMEOUT_S") or DEFAULT_REQUEST_TIMEOUT_S
            ),
            api_key=environ.get("VLLM_API_KEY") or None,
            turns_until_s=turns_until_from_env(environ),
            segments_dir=Path(environ["TUNER_SEGMENTS"]) if environ.get("TUNER_SEGMENTS") else None,
            go_path=(
                Path(environ["TUNER_GO_FILE"])
                if environ.get("TUNER_GO_FILE") and start_at and first_test
                else None
            ),
        )

    @classmethod
    def from_share(cls, share: Share, environ: Mapping[str, str], master_host: str) -> LoadSettings:
        return cls(
            schedule_path=None,
            records_path=None,
            model=share.model,
            host=reachable_url(share.host, master_host),
            worker_index=share.index,
            worker_count=share.count,
            max_in_flight=share.max_in_flight,
            start_at_s=share.start_at_s,
            request_timeout_s=share.request_timeout_s,
            api_key=share.api_key or environ.get("VLLM_API_KEY") or None,
            turns_until_s=share.turns_until_s,
        )

    @property
    def worker(self) -> str:
        return f"w{self.worker_index}"


def turns_until_from_env(environ: Mapping[str, str]) -> float | None:
    """``TUNER_TURNS_UNTIL_S`` as a number; None when unset or empty."""
    text = environ.get("TUNER_TURNS_UNTIL_S")
    return float(text) if text else None


def _worker_position(environ: Mapping[str, str], environment: Environment) -> tuple[int, int]:
    runner = environment.runner
    options = environment.parsed_options
    if "TUNER_WORKER_COUNT" in environ:
        count = int(environ["TUNER_WORKER_COUNT"])
    elif isinstance(runner, WorkerRunner) and options is not None:
        count = int(getattr(options, "expect_workers", 1) or 1)
    else:
        count = 1
    if "TUNER_WORKER_INDEX" in environ:
        index = int(environ["TUNER_WORKER_INDEX"])
    elif isinstance(runner, WorkerRunner):
        index = runner.worker_index
    else:
        index = 0
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"worker index {index} of {count} is out of range; accepted: 0..count-1")
    return index, count


def _choice_text(chunk: Mapping[str, Any]) -> str | None:
    choices = chunk.get("choices")
    if not choices:
        return None
    choice = choices[0]
    if "text" in choice:
        return choice["text"]  # type: ignore[no-any-return]
    delta = choice.get("delta") or {}
    return delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")


def _chunk_error(chunk: Mapping[str, Any]) -> str | None:
    error = chunk.get("error")
    if isinstance(error, Mapping):
        return str(error.get("message") or error)
    if error:
        return str(error)
    if chunk.get("object") == "error":
        return str(chunk.get("message") or chunk)
    return None


def _error_text(status: int, body: bytes) -> str:
    try:
        parsed = json.loads(body)
        message = (_chunk_error(parsed) if isinstance(parsed, Mapping) else None) or parsed
    except ValueError:
        message = body.decode(errors="replace")
    return f"HTTP {status}: {str(message)[:ERROR_BODY_LIMIT]}"


def _percentile_ms(values_s: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), in milliseconds."""
    if not values_s:
        return None
    ordered = sorted(values_s)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return 1000 * (ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def _resolve_once(client: HTTPClient) -> None:
    """Make the client's connection pool reuse one name resolution for every connection."""
    pool = getattr(client, "_connection_pool", None)
    resolve = getattr(pool, "_resolve", None)
    if pool is None or resolve is None:  # another geventhttpclient: keep its behaviour
        log.warning("geventhttpclient has no _connection_pool._resolve; resolving per connection")
        return
    addresses = resolve()
    pool._resolve = lambda: addresses


def _stamp_sockets(client: HTTPClient) -> bool:
    """Make the client's plain-TCP connections `StampedSocket`s; False where it cannot."""
    pool = getattr(client, "_connection_pool", None)
    if client.ssl or pool is None or not hasattr(pool, "_create_tcp_socket"):
        return False  # TLS reads do not reach recv; another geventhttpclient: its sockets
    pool._create_tcp_socket = StampedSocket
    return SO_TIMESTAMPNS is not None


def _idle_connections(client: HTTPClient) -> int | None:
    """Connections waiting in the client's pool; None when this geventhttpclient hides them."""
    queue = getattr(getattr(client, "_connection_pool", None), "_socket_queue", None)
    return None if queue is None else int(queue.qsize())


def _split_share(
    share: list[ScheduledRequest],
) -> tuple[list[ScheduledRequest], dict[str, list[ScheduledRequest]]]:
    """The share's open-loop requests (send order), and its later turns by the request id
    whose answer each extends. A turn that follows one outside the share (a warm-up turn
    an earlier run sent), or that no open-loop request leads to (a cycle of ``follows``,
    never answered), is open loop."""
    ids = {request.request_id for request in share}
    followers: dict[str, list[ScheduledRequest]] = {}
    for request in share:
        if request.follows is not None and request.follows in ids:
            followers.setdefault(request.follows, []).append(request)
    reached = {r.request_id for r in share if r.follows is None or r.follows not in ids}
    stack = list(reached)
    while stack:
        for turn in followers.get(stack.pop(), ()):
            if turn.request_id not in reached:
                reached.add(turn.request_id)
                stack.append(turn.request_id)
    if len(reached) < len(share):
        followers = {
            follows: [turn for turn in turns if turn.request_id in reached]
            for follows, turns in followers.items()
            if follows in reached
        }
    chained = {turn.request_id for turns in followers.values() for turn in turns}
    return [r for r in share if r.request_id not in chained], followers


@dataclass(slots=True)
class _Exchange:
    """What one sent request's exchange has measured so far (kept when it fails part-way)."""

    sent_s: float  # when the request went out (the socket's time where it knows)
    status: int = 0
    error: str | None = None
    token_times_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None  # from the usage, when the server gave it
    output_tokens: int | None = None


class Dispatcher:
    """Sends one process's share of the schedule: open-loop requests at their send times, a
    session's later turns when the answer each extends is in (plus its think time);
    records every request, except later turns due after ``turns_until_s`` (counted)."""

    def __init__(
        self,
        settings: LoadSettings,
        environment: Environment,
        share: list[ScheduledRequest],
        sink: FileSink | MasterSink,
    ) -> None:
        self.settings = settings
        self.environment = environment
        self.share = share
        self.sink = sink
        url = urlsplit(settings.host)
        self.path_prefix = url.path.rstrip("/")
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if settings.api_key:
            headers["Authorization"] = f"Bearer {settings.api_key}"
        self.headers = headers
        self.client = HTTPClient.from_url(
            settings.host,
            concurrency=settings.max_in_flight,
            connection_timeout=CONNECTION_TIMEOUT_S,
            # No timeout per socket operation (each would start a timer per token event):
            # every request runs under its own deadline (TUNER_REQUEST_TIMEOUT_S).
            network_timeout=None,
        )
        self.kernel_timestamps = _stamp_sockets(self.client)
        self.opening_spare = False
        self.group = Group()  # requests in flight
        self.waiting = Group()  # a greenlet per later turn, sleeping until it is due
        self.open_loop, self.followers = _split_share(share)
        self.next_index = 0  # the next open-loop request to dispatch
        # Requests neither dispatched nor dropped (share order), and of them the later
        # turns already due at a known time: request id -> (scheduled_s, answer_s).
        self.unsent = {request.request_id: request for request in share}
        self.due: dict[str, tuple[float, float]] = {}
        self.outstanding = len(share)  # requests neither recorded nor dropped
        # A chained run (TUNER_SEGMENTS): the next segment and snapshot to look for, the
        # sessions that did not carry on into a segment, and what is in flight (by id).
        self.next_segment = 1
        self.segments_taken_on = 0  # the open-loop queue was rebuilt this many times
        self.next_snapshot = 1
        self.next_poll_s = 0.0
        self.withdrawn_sessions: set[str] = set()
        self.reader: gevent.Greenlet[Any, Any] | None = None  # reading the next segment
        self.flying: dict[str, tuple[ScheduledRequest, float, float | None, _Exchange]] = {}
        self.all_done = Event()
        if not share:
            self.all_done.set()
        self.stopping = False  # stop() is recording the rest: no more turns are planned
        self.in_flight = 0
        self.peak_in_flight = 0
        self.lags_s: list[float] = []
        self.spin_s = 0.0  # time spent yielding with nothing else to do (_sleep_until)
        self.read_delays_s: list[float] = []  # token event: read by this process - arrived
        self.token_events = 0
        self.coalesced_events = 0
        self.loop_delays_s: list[float] = []  # the loop probe's lateness (_probe_loop)
        self.probe: gevent.Greenlet[Any, Any] | None = None
        self.counts = {
            "sent": 0,
            "cap_hits": 0,
            "completed": 0,
            "failed": 0,
            "stopped": 0,
            "turns_after_window": 0,
            "withdrawn": 0,
        }
        self.stopped_early = False
        self.finished = False
        self.started_s = 0.0
        self.cpu_start_s = 0.0
        self.wall_start_s = 0.0
        self.greenlet: gevent.Greenlet[Any, Any] | None = None

    def start(self) -> None:
        # Everything alive now (Locust, its imports, the schedule) lives to the end: out of
        # the collector's way. Each token event allocates a few dicts, so collections are
        # frequent, and a full one walking Locust's heap cost about a tenth of this
        # process's CPU while streaming (perf, 32 streams). Locust does the same for
        # --processes (before forking), not for one process.
        gc.collect()
        gc.freeze()
        self.greenlet = gevent.spawn(self._run)
        self.greenlet.link_exception(self._crashed)

    def _go(self, settings: LoadSettings) -> LoadSettings:
        """With ``TUNER_GO_FILE``: say this process is ready, then take the offset 0 the
        harness writes once every process is (earlier than ``TUNER_START_AT``, which stays
        the start if it does not come in time)."""
        if settings.go_path is None or settings.records_path is None:
            return settings
        mark = ready_path(settings.records_path, settings.worker_index)
        mark.write_text(repr(self.started_s), encoding="utf-8")
        while time.time() < settings.start_at_s:
            try:
                go_s = float(settings.go_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):  # not written yet (it is renamed into place whole)
                gevent.sleep(GO_POLL_S)
                continue
            return replace(settings, start_at_s=min(go_s, settings.start_at_s))
        return settings

    def _crashed(self, greenlet: gevent.Greenlet[Any, Any]) -> None:
        log.error("%s: dispatcher failed: %r", self.settings.worker, greenlet.exception)
        _give_up(self.environment)  # the quit fires test_stop: stop() records the rest

    def _run(self) -> None:
        self._warm_up()
        self.started_s = time.time()
        settings = self.settings = self._go(self.settings)
        if self.started_s > settings.start_at_s:
            log.warning(
                "%s: ready %.3f s after TUNER_START_AT; the first sends are late",
                settings.worker,
                self.started_s - settings.start_at_s,
            )
        while (delay := settings.start_at_s - time.time()) > 0:
            gevent.sleep(delay)
        self.cpu_start_s = time.process_time()
        self.wall_start_s = time.time()
        self.probe = gevent.spawn(self._probe_loop)
        log.info(
            "%s: sending %d requests (%d open loop, %d after the answer they extend)",
            settings.worker,
            len(self.share),
            len(self.open_loop),
            len(self.share) - len(self.open_loop),
        )
        chained = settings.segments_dir is not None
        while chained or self.next_index < len(self.open_loop):
            if chained and time.time() >= self.next_poll_s:
                self._poll_segments()
            if self.next_index >= len(self.open_loop):  # a chained run waits for more
                gevent.sleep(SEGMENT_POLL_S)
                continue
            request = self.open_loop[self.next_index]
            scheduled_s = settings.start_at_s + request.send_s
            if chained and scheduled_s > self.next_poll_s:
                # A segment read meanwhile may bring earlier requests, or withdraw this one.
                gevent.sleep(max(0.0, min(scheduled_s, self.next_poll_s) - time.time()))
                continue
            if request.session_id in self.withdrawn_sessions:
                self.next_index += 1
                self._withdraw(request)
                continue
            # Encoded while waiting for the send time, so its cost is not send lag.
            body = request_body(request, settings.model)
            taken_on = self.segments_taken_on
            self._sleep_until(scheduled_s)
            if self.segments_taken_on != taken_on:
                continue  # a segment rebuilt the queue meanwhile (and may have withdrawn it)
            self.next_index += 1
            self._dispatch(request, scheduled_s, body, None)
        self.all_done.wait()  # every chain of turns recorded or dropped
        self.group.join()
        self._finish()
        runner = self.environment.runner
        # A remote worker quits once the master has written its records (its agent then
        # starts the next worker).
        if isinstance(self.sink, MasterSink) and not _State.done.wait(timeout=DONE_WAIT_S):
            log.warning("%s: no answer from the master to the last records", settings.worker)
        if _quits_when_done(self.environment) and runner is not None:
            log.info("%s: every request done; quitting", settings.worker)
            runner.quit()

    def _poll_segments(self) -> None:
        """A chained run: take on every segment written since the last look, and answer
        every snapshot asked for."""
        self.next_poll_s = time.time() + SEGMENT_POLL_S
        folder = self.settings.segments_dir
        assert folder is not None
        path = segment_path(folder, self.next_segment)
        if self.reader is None and path.exists():
            self.reader = gevent.spawn(self._read_segment, path)
            self.reader.link_exception(self._crashed)
        while snapshot_request_path(folder, self.next_snapshot).exists():
            self._write_snapshot(
                snapshot_path(folder, self.next_snapshot, self.settings.worker_index)
            )
            self.next_snapshot += 1

    def _read_segment(self, path: Path) -> None:
        """Read a segment's schedule a few lines at a time, yielding between them (a
        level's schedule can be a hundred megabytes of conversation history, and parsing it
        at once would stall every send and stream for seconds), then take it on."""
        header = read_segment_header(path)
        requests: list[ScheduledRequest] = []
        codec = ScheduleCodec()
        with Path(header.schedule).open(encoding="utf-8") as fh:
            for count, line in enumerate(fh, 1):
                if line.strip():
                    request = codec.decode(line)
                    requests.append(replace(request, send_s=request.send_s + header.offset_s))
                if count % SEGMENT_LINES_AT_ONCE == 0:
                    gevent.sleep(0)
        late_s = time.time() - (self.settings.start_at_s + header.offset_s)
        if late_s > 0:
            log.warning(
                "%s: segment %d read %.3f s after its offset; its first sends are late",
                self.settings.worker, header.index, late_s,
            )  # fmt: skip
        self.next_segment += 1
        self.reader = None
        self._take_on(header, requests)
        del requests
        gc.freeze()  # as at the start (Dispatcher.start): the new schedule lives on

    def _take_on(self, header: SegmentHeader, requests: list[ScheduledRequest]) -> None:
        """From ``header.offset_s``: the earlier segments' new arrivals withdrawn, the sessions
        under way thinned to what the segment keeps, its own share of requests added."""
        share = share_of(requests, self.settings.worker_index, self.settings.worker_count)
        ahead = self.open_loop[self.next_index :]
        arrivals = [r for r in ahead if r.turn == 0 and r.send_s >= header.offset_s]
        for request in arrivals:
            self._withdraw(request)
        sessions = {r.session_id for r in self.unsent.values() if r.session_id is not None}
        ending = {s for s in sessions if not carries_on(s, header.keep_under_way, header.salt)}
        self.withdrawn_sessions.update(ending)
        for request in [r for r in self.unsent.values() if r.session_id in ending]:
            self._withdraw(request)
        open_loop, followers = _split_share(share)
        for follows, turns in followers.items():
            self.followers.setdefault(follows, []).extend(turns)
        self.unsent.update((r.request_id, r) for r in share)
        self.outstanding += len(share)
        if share:
            self.all_done.clear()
        withdrawn = {r.request_id for r in arrivals}
        kept = [r for r in ahead if r.request_id not in withdrawn]
        self.open_loop = self.open_loop[: self.next_index] + sorted(
            kept + open_loop, key=lambda r: r.send_s
        )
        self.segments_taken_on += 1
        log.info(
            "%s: segment %d from offset %.3f s: %d requests, %d arrivals withdrawn, "
            "%d of %d sessions under way carry on",
            self.settings.worker, header.index, header.offset_s, len(share), len(arrivals),
            len(sessions - self.withdrawn_sessions), len(sessions),
        )  # fmt: skip

    def _write_snapshot(self, path: Path) -> None:
        """Every request in flight, as far as it got (``error`` ABORTED), written whole,
        after this process's stats so far (``<path>.stats.json``)."""
        write_stats(path.with_name(path.name + ".stats.json"), self._stats())
        now = time.time()
        lines = []
        for request, scheduled_s, answer_s, exchange in list(self.flying.values()):
            record = self._sent_record(request, scheduled_s, answer_s, exchange, now)
            lines.append(replace(record, error=ABORTED).to_json() + "\n")
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(lines), encoding="utf-8")
        tmp.replace(path)

    def _withdraw(self, request: ScheduledRequest) -> None:
        """Left out of a chained run (a new arrival after the next segment's offset, or a
        session that does not carry on into it), with the turns that follow it: neither
        sent nor recorded, only counted."""
        dropped = [request]
        while dropped:
            turn = dropped.pop()
            if self.unsent.pop(turn.request_id, None) is None:
                continue
            self.due.pop(turn.request_id, None)
            self.counts["withdrawn"] += 1
            self.outstanding -= 1
            dropped.extend(self.followers.get(turn.request_id, ()))
        if self.outstanding <= 0:
            self.all_done.set()

    def _dispatch(
        self, request: ScheduledRequest, scheduled_s: float, body: bytes, answer_s: float | None
    ) -> None:
        """At its time: send it, or record it not sent when this process is at its cap."""
        del self.unsent[request.request_id]
        self.due.pop(request.request_id, None)
        if self.in_flight >= self.settings.max_in_flight:
            self.counts["cap_hits"] += 1
            self._not_sent(request, scheduled_s, CAP_REACHED, answer_s)
            return
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self.group.spawn(self._send, request, scheduled_s, body, answer_s)

    def _answered(self, record: RequestRecord) -> None:
        """A record is written: the turns that extend its answer are due, think time later."""
        if self.stopping:
            return
        # The answer's arrival; a request that failed or was not sent: the time recorded.
        answer_s = record.end_s if record.end_s is not None else record.sent_s
        for turn in self.followers.get(record.request_id, ()):
            self._plan_turn(turn, answer_s)
        self.outstanding -= 1
        if self.outstanding <= 0:
            self.all_done.set()

    def _plan_turn(self, turn: ScheduledRequest, answer_s: float) -> None:
        if turn.session_id in self.withdrawn_sessions:
            self._withdraw(turn)
            return
        scheduled_s = answer_s + turn.think_time_s
        until_s = self.settings.turns_until_s
        if until_s is not None and scheduled_s >= self.settings.start_at_s + until_s:
            self._drop_after_window(turn)
            return
        self.due[turn.request_id] = (scheduled_s, answer_s)
        waiter = self.waiting.spawn(self._follow, turn, scheduled_s, answer_s)
        waiter.link_exception(self._crashed)

    def _follow(self, turn: ScheduledRequest, scheduled_s: float, answer_s: float) -> None:
        """A later turn's greenlet: encode, sleep until it is due, dispatch."""
        body = request_body(turn, self.settings.model)
        self._sleep_until(scheduled_s)
        if turn.session_id in self.withdrawn_sessions:  # it did not carry on into a segment
            self._withdraw(turn)
            return
        self._dispatch(turn, scheduled_s, body, answer_s)

    def _drop_after_window(self, turn: ScheduledRequest) -> None:
        """Due after the window: the user's turn, and every turn after it in its session,
        fall outside the measurement. Neither sent nor recorded, only counted."""
        dropped = [turn]
        while dropped:
            request = dropped.pop()
            del self.unsent[request.request_id]
            self.counts["turns_after_window"] += 1
            self.outstanding -= 1
            dropped.extend(self.followers.get(request.request_id, ()))

    def _probe_loop(self) -> None:
        """Measure the event loop's delay: a timer every ``LOOP_PROBE_S`` and how late it
        fires (the timer's own resolution, about a millisecond, included). A loop busy
        reading streams, encoding bodies or collecting garbage is late for everything
        ready meanwhile: token bytes read late, requests sent late. It costs twenty
        wake-ups a second."""
        delays = self.loop_delays_s
        while True:
            due = time.perf_counter() + LOOP_PROBE_S
            gevent.sleep(LOOP_PROBE_S)
            delays.append(max(time.perf_counter() - due, 0.0))

    def _sleep_until(self, when_s: float) -> None:
        """Wake at ``when_s`` to well under a millisecond.

        The event loop's timers wake up to a millisecond late (epoll's timeout is in whole
        milliseconds, rounded up), which was most of the send lag: p50 1.3 ms at 32
        streams (``benchmarks/load_accuracy.py``). So the last stretch is spent yielding
        to the loop (``sleep(0)`` still polls the sockets, so streams keep being read).
        Yields that found nothing else to do are counted, and their time is left out of
        the CPU this process reports, so an idle spin does not look like saturation.
        """
        while (delay := when_s - time.time()) > SPIN_S:
            gevent.sleep(delay - SPIN_S)
        while (now := time.time()) < when_s:
            gevent.sleep(0)
            if (spent := time.time() - now) < IDLE_YIELD_S:
                self.spin_s += spent

    def _warm_up(self) -> None:
        """Before offset 0: resolve the host once, then one ``GET /v1/models``.

        The first request's one-off costs (connection, first use of the HTTP code) stall
        the event loop for several milliseconds and would show as send lag of the first
        scheduled requests. And geventhttpclient resolves the host again for every new
        connection, through gevent's thread-pool resolver, whose thread waits for the GIL
        while the loop is busy reading streams: measured at 64 streams, that added 16 ms
        to the mean TTFT and made the send lag p99 18 ms instead of 3.5 ms
        (``benchmarks/locust_event_rate.py``).
        """
        worker = self.settings.worker
        try:
            with gevent.Timeout(CONNECTION_TIMEOUT_S):
                _resolve_once(self.client)
                response = self.client.get(self.path_prefix + "/v1/models", headers=self.headers)
                response.read()
                response.release()
            log.info("%s: warm-up GET /v1/models: HTTP %d", worker, response.status_code)
        except (Exception, gevent.Timeout) as exc:  # the schedule's requests record failures
            log.warning("%s: warm-up before the schedule failed: %r", worker, exc)

    def stop(self) -> None:
        """The test stopped (run time, UI, SIGTERM): abort what is in flight, record the rest
        (a later turn at the time it was due; with its answer not in yet it was not due by
        the stop, so at its plan or the stop, whichever is later: a window over before the
        stop does not count it as a request it failed to send)."""
        if self.finished:
            return
        self.stopping = True
        self.stopped_early = True
        if self.greenlet is not None and self.greenlet is not gevent.getcurrent():
            self.greenlet.kill(block=True)
        self.waiting.kill(block=True)
        self.group.kill(block=True, timeout=5.0)
        if not self.wall_start_s:
            self.cpu_start_s, self.wall_start_s = time.process_time(), time.time()
        stopped_s = time.time()
        for request in list(self.unsent.values()):
            due = self.due.get(request.request_id)
            scheduled_s, answer_s = due or (self.settings.start_at_s + request.send_s, None)
            if due is None and request.follows is not None:
                scheduled_s = max(scheduled_s, stopped_s)
            self.counts["stopped"] += 1
            self._not_sent(request, scheduled_s, STOPPED_BEFORE_SEND, answer_s)
        self.unsent.clear()
        self.due.clear()
        self._finish()

    def _send(
        self, request: ScheduledRequest, scheduled_s: float, body: bytes, answer_s: float | None
    ) -> None:
        """A request's greenlet: POST it, read the answer before its deadline, record it."""
        # vLLM (and the simulator) take the request id from this header.
        headers = {**self.headers, "X-Request-Id": request.request_id}
        # sent_s is replaced by when the request went out, where the socket knows.
        exchange = _Exchange(sent_s=time.time())
        self.counts["sent"] += 1
        self.flying[request.request_id] = (request, scheduled_s, answer_s, exchange)
        try:
            self._exchange(request, scheduled_s, body, headers, exchange)
        finally:
            self.flying.pop(request.request_id, None)
        end_s = time.time()
        record = self._sent_record(request, scheduled_s, answer_s, exchange, end_s)
        self.counts["completed" if record.ok else "failed"] += 1
        self._write(record)
        first = record.first_token_s
        self._fire(request, (first if first is not None else end_s) - scheduled_s, record)

    def _exchange(
        self,
        request: ScheduledRequest,
        scheduled_s: float,
        body: bytes,
        headers: dict[str, str],
        exchange: _Exchange,
    ) -> None:
        """POST, read the answer into ``exchange`` by the deadline; a failure is its error."""
        settings = self.settings
        response = None
        remaining_s = max(scheduled_s + settings.request_timeout_s - exchange.sent_s, 0.001)
        deadline = gevent.Timeout(remaining_s)
        deadline.start()
        try:
            response = self.client.request(
                "POST", self.path_prefix + PATHS[request.api], body=body, headers=headers
            )
            self._read_response(request, response, exchange)
        except gevent.Timeout as exc:
            if exc is not deadline:
                raise
            exchange.error = TIMED_OUT.format(timeout_s=settings.request_timeout_s)
        except gevent.GreenletExit:
            exchange.error = ABORTED
        except Exception as exc:  # any failure of one request is a measurement, not a crash
            exchange.error = f"{type(exc).__name__}: {exc}"[:ERROR_BODY_LIMIT]
        finally:
            deadline.close()
            if response is not None:
                response.release()  # closes the connection unless the response was read to its end
            self.in_flight -= 1
            self.lags_s.append(exchange.sent_s - scheduled_s)

    def _read_response(self, request: ScheduledRequest, response: Any, exchange: _Exchange) -> None:
        """The send time from the socket, then the error body, the whole answer or the stream."""
        # The connection the request went out on and the stream arrives on.
        sock = getattr(response, "_sock", None)
        if isinstance(sock, StampedSocket) and sock.sent_s is not None:
            exchange.sent_s = sock.sent_s
        self._keep_a_spare_connection()
        exchange.status = status = response.status_code
        if status != 200:
            exchange.error = _error_text(status, response.read())
        elif not request.stream:  # sent whole: only its end and its usage are known
            usage = json.loads(response.read()).get("usage") or {}
            exchange.prompt_tokens = usage.get("prompt_tokens")
            exchange.output_tokens = usage.get("completion_tokens")
        else:
            # When the connection is stamped, a token's time is when its bytes reached
            # this host (see StampedSocket).
            stamped = sock if isinstance(sock, StampedSocket) and sock.stamping else None
            self._read_stream(response, stamped, exchange)

    def _read_stream(
        self, response: Any, stamped: StampedSocket | None, exchange: _Exchange
    ) -> None:
        """Read an SSE stream line by line: each token event's time, the usage, an error."""
        token_times = exchange.token_times_s
        done = False
        last_arrival_s: float | None = None
        readline = response.readline
        while line := readline(b"\n"):
            now = time.time()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                continue
            chunk = json.loads(payload)
            if _choice_text(chunk):
                arrived_s = stamped.received_s if stamped is not None else None
                if arrived_s is None:
                    token_times.append(now)
                else:
                    token_times.append(arrived_s)
                    self.read_delays_s.append(now - arrived_s)
                    if arrived_s == last_arrival_s:
                        self.coalesced_events += 1
                    last_arrival_s = arrived_s
                self.token_events += 1
            if usage := chunk.get("usage"):
                exchange.prompt_tokens = usage.get("prompt_tokens", exchange.prompt_tokens)
                exchange.output_tokens = usage.get("completion_tokens", exchange.output_tokens)
            if (chunk_error := _chunk_error(chunk)) is not None:
                exchange.error = f"stream error: {chunk_error[:ERROR_BODY_LIMIT]}"
                break
        if exchange.error is None and not done:
            exchange.error = "stream ended without [DONE]"

    def _sent_record(
        self,
        request: ScheduledRequest,
        scheduled_s: float,
        answer_s: float | None,
        exchange: _Exchange,
        end_s: float,
    ) -> RequestRecord:
        """The record of a sent request; the usage's token counts where the server gave them."""
        token_times = exchange.token_times_s
        return RequestRecord(
            request_id=request.request_id,
            scheduled_s=scheduled_s,
            sent_s=exchange.sent_s,
            prompt_tokens=(
                request.prompt_tokens if exchange.prompt_tokens is None else exchange.prompt_tokens
            ),
            output_tokens=(
                len(token_times) if exchange.output_tokens is None else exchange.output_tokens
            ),
            status=exchange.status,
            first_token_s=token_times[0] if token_times else None,
            end_s=end_s,
            token_times_s=token_times,
            error=exchange.error,
            warmup=request.warmup,
            worker=self.settings.worker,
            streamed=request.stream,
            answer_s=answer_s,
        )

    def _keep_a_spare_connection(self) -> None:
        """Open a connection in the background when none is left idle for the next request.

        A request that has to connect first waits for the handshake, during which this
        process reads other streams: measured as send lag and as time to first token.
        """
        if self.opening_spare or self.in_flight >= self.settings.max_in_flight:
            return
        if _idle_connections(self.client) != 0:
            return
        self.opening_spare = True
        gevent.spawn(self._open_spare)

    def _open_spare(self) -> None:
        pool = self.client._connection_pool
        try:
            sock = pool.get_socket()  # none is idle: this connects
        except Exception as exc:  # the next request meets the same failure and records it
            log.debug("%s: cannot open a spare connection: %s", self.settings.worker, exc)
            return
        finally:
            self.opening_spare = False
        pool.return_socket(sock)

    def _not_sent(
        self, request: ScheduledRequest, scheduled_s: float, error: str, answer_s: float | None
    ) -> None:
        record = RequestRecord(
            request_id=request.request_id,
            scheduled_s=scheduled_s,
            sent_s=time.time(),
            prompt_tokens=request.prompt_tokens,
            output_tokens=0,
            status=0,
            error=error,
            warmup=request.warmup,
            worker=self.settings.worker,
            answer_s=answer_s,
        )
        self._write(record)
        self._fire(request, 0.0, record)

    def _write(self, record: RequestRecord) -> None:
        self.sink.write(record)
        self._answered(record)

    def _fire(
        self, request: ScheduledRequest, response_time_s: float, record: RequestRecord
    ) -> None:
        self.environment.events.request.fire(
            request_type="POST",
            name=f"{request.api.value} TTFT",
            response_time=1000 * response_time_s,
            response_length=record.output_tokens,
            exception=None if record.ok else RuntimeError(record.error or f"HTTP {record.status}"),
            context={"request_id": request.request_id},
            start_time=record.scheduled_s,
            url=self.path_prefix + PATHS[request.api],
        )

    def _finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        settings = self.settings
        if self.probe is not None and self.probe is not gevent.getcurrent():
            self.probe.kill(block=False)
        stats = self._stats()
        self.client.close()
        self.sink.finish(stats)
        log.info(
            "%s: %d sent, %d completed, %d failed, %d cap hits, %d turns after the window; "
            "CPU %.0f%%, lag p99 %s ms, event-loop delay p99 %s ms",
            settings.worker,
            stats.sent,
            stats.completed,
            stats.failed,
            stats.cap_hits,
            stats.turns_after_window,
            stats.cpu_percent,
            "-" if stats.send_lag_p99_ms is None else f"{stats.send_lag_p99_ms:.2f}",
            "-" if stats.loop_delay_p99_ms is None else f"{stats.loop_delay_p99_ms:.2f}",
        )

    def _stats(self) -> WorkerStats:
        """What this process measured about itself so far."""
        settings = self.settings
        wall_start_s = self.wall_start_s or time.time()
        wall_s = max(time.time() - wall_start_s, 1e-9)
        cpu_start_s = self.cpu_start_s or time.process_time()
        cpu_s = max(time.process_time() - cpu_start_s - self.spin_s, 0.0)
        return WorkerStats(
            worker=settings.worker,
            index=settings.worker_index,
            count=settings.worker_count,
            scheduled=len(self.share),
            sent=self.counts["sent"],
            cap_hits=self.counts["cap_hits"],
            completed=self.counts["completed"],
            failed=self.counts["failed"],
            not_sent_stopped=self.counts["stopped"],
            turns_after_window=self.counts["turns_after_window"],
            withdrawn=self.counts["withdrawn"],
            max_in_flight=settings.max_in_flight,
            peak_in_flight=self.peak_in_flight,
            start_late_s=self.started_s - settings.start_at_s if self.started_s else 0.0,
            wall_s=wall_s,
            cpu_s=cpu_s,
            cpu_percent=100 * cpu_s / wall_s,
            send_lag_p50_ms=_percentile_ms(self.lags_s, 50),
            send_lag_p99_ms=_percentile_ms(self.lags_s, 99),
            send_lag_max_ms=1000 * max(self.lags_s) if self.lags_s else None,
            stopped_early=self.stopped_early,
            kernel_timestamps=self.kernel_timestamps,
            token_events=self.token_events,
            coalesced_events=self.coalesced_events,
            read_delay_p50_ms=_percentile_ms(self.read_delays_s, 50),
            read_delay_p99_ms=_percentile_ms(self.read_delays_s, 99),
            loop_delay_p50_ms=_percentile_ms(self.loop_delays_s, 50),
            loop_delay_p99_ms=_percentile_ms(self.loop_delays_s, 99),
            loop_delay_max_ms=1000 * max(self.loop_delays_s) if self.loop_delays_s else None,
        )


def write_stats(stats_path: Path, stats: WorkerStats) -> None:
    """Write a process's stats whole: the runner polls for this file."""
    tmp = stats_path.with_name(stats_path.name + ".tmp")
    tmp.write_text(stats.model_dump_json(indent=2) + "\n", encoding="utf-8")
    tmp.replace(stats_path)


class FileSink:
    """A local process's records and stats: files beside the schedule (flushed per record)."""

    def __init__(self, records_path: Path, index: int) -> None:
        self.records_path = records_path
        self.index = index
        path = worker_records_path(records_path, index)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.records: IO[str] = path.open("a", encoding="utf-8")

    def write(self, record: RequestRecord) -> None:
        self.records.write(record.to_json() + "\n")
        self.records.flush()

    def finish(self, stats: WorkerStats) -> None:
        self.records.close()
        write_stats(worker_stats_path(self.records_path, self.index), stats)


class MasterSink:
    """A remote worker's records and stats: to the master in batches every ``FLUSH_S``."""

    def __init__(self, environment: Environment, index: int) -> None:
        self.environment = environment
        self.index = index
        self.lines: list[str] = []
        self.flusher = gevent.spawn(self._flush_every)

    def write(self, record: RequestRecord) -> None:
        self.lines.append(record.to_json())

    def _flush_every(self) -> None:
        while True:
            gevent.sleep(FLUSH_S)
            if self.lines:
                self._send(None)

    def _send(self, stats: WorkerStats | None) -> None:
        lines, self.lines = self.lines, []
        batch = RecordBatch(index=self.index, lines=lines, stats=stats)
        runner = self.environment.runner
        assert runner is not None
        runner.send_message(RECORDS, batch.to_data())

    def finish(self, stats: WorkerStats) -> None:
        if self.flusher is not gevent.getcurrent():
            self.flusher.kill(block=True)
        self._send(stats)


class _State:
    """The dispatcher of the test running in this process (None between tests); on a
    remote worker, the master's share and its answer to the last records."""

    dispatcher: Dispatcher | None = None
    tests_started = 0
    share: AsyncResult[Share] = AsyncResult()
    done = Event()
    master: _Master | None = None


def _is_remote() -> bool:
    """A worker on another host than the master: it has no schedule file."""
    return "TUNER_SCHEDULE" not in os.environ


def _quits_when_done(environment: Environment) -> bool:
    """Headless, or a remote worker (its agent starts the next one): quit when the share is done."""
    options = environment.parsed_options
    headless = options is not None and bool(options.headless)
    return headless or (isinstance(environment.runner, WorkerRunner) and _is_remote())


class _Master:
    """The master's side of remote workers: shares out, records in, quit when all are done."""

    def __init__(self, environment: Environment, runner: MasterRunner) -> None:
        self.environment = environment
        self.runner = runner
        self.records_path = Path(os.environ.get("TUNER_RECORDS") or "records.jsonl")
        self.count = int(os.environ.get("TUNER_WORKER_COUNT") or 1)
        options = environment.parsed_options
        processes = int(getattr(options, "processes", 0) or 0) if options is not None else 0
        self.remote = max(self.count - processes, 0)
        if options is not None and "TUNER_WORKER_COUNT" in os.environ:
            # --processes N makes Locust expect N workers; the remote ones come on top.
            options.expect_workers = self.count
        self.connected: set[str] = set()
        self.schedule: list[ScheduledRequest] | None = None
        runner.register_message(SHARE_REQUEST, self.on_share_request)
        runner.register_message(RECORDS, self.on_records)
        environment.events.worker_connect.add_listener(self.on_connect)

    def on_connect(self, client_id: str, **_kwargs: Any) -> None:
        self.connected.add(client_id)
        path = connected_workers_path(self.records_path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"connected": len(self.connected), "expected": self.count}))
        tmp.replace(path)

    def on_test_start(self) -> None:
        if self.remote:
            gevent.spawn(self._quit_when_all_done)

    def on_share_request(self, environment: Environment, msg: Any, **_kwargs: Any) -> None:
        index = self.runner.get_worker_index(msg.node_id)
        requests: list[str] | None = None
        if index < self.count:
            if self.schedule is None:
                self.schedule = read_schedule(Path(os.environ["TUNER_SCHEDULE"]))
            # The same split as the local processes make (_on_test_start).
            codec = ScheduleCodec()  # the worker decodes its share in the same order
            requests = [codec.encode(r) for r in share_of(self.schedule, index, self.count)]
        else:
            log.warning("worker %s (index %d) joined a run already under way", msg.node_id, index)
        cap = int(os.environ.get("TUNER_MAX_IN_FLIGHT") or DEFAULT_MAX_IN_FLIGHT)
        share = Share(
            index=index,
            count=self.count,
            host=environment.host or "",
            model=os.environ.get("TUNER_MODEL", ""),
            start_at_s=float(os.environ.get("TUNER_START_AT") or time.time() + 1.0),
            request_timeout_s=float(
                os.environ.get("TUNER_REQUEST_TIMEOUT_S") or DEFAULT_REQUEST_TIMEOUT_S
            ),
            max_in_flight=max(1, math.ceil(cap / self.count)),
            api_key=os.environ.get("VLLM_API_KEY") or None,
            requests=requests,
            turns_until_s=turns_until_from_env(os.environ),
        )
        self.runner.send_message(SHARE, share.to_data(), client_id=msg.node_id)
        log.info("sent w%d its share: %d requests", index, len(requests or ()))

    def on_records(self, environment: Environment, msg: Any, **_kwargs: Any) -> None:
        batch = RecordBatch.from_data(msg.data)
        index = self.runner.get_worker_index(msg.node_id)
        if batch.lines:
            with worker_records_path(self.records_path, index).open("a", encoding="utf-8") as out:
                out.write("".join(line + "\n" for line in batch.lines))
        if batch.stats is None:
            return
        write_stats(worker_stats_path(self.records_path, index), batch.stats)
        if batch.stats.start_late_s > LATE_WARNING_S:
            log.warning(
                "w%d (remote) was ready %.3f s after TUNER_START_AT: its first sends are late "
                "(are the load hosts' clocks synchronized with NTP?)",
                index,
                batch.stats.start_late_s,
            )
        log.info("w%d (remote): %d records and its stats written", index, batch.stats.scheduled)
        self.runner.send_message(DONE, None, client_id=msg.node_id)

    def _quit_when_all_done(self) -> None:
        """With remote workers, quit once every share's stats are written: a remote worker's
        agent may connect a fresh worker to this run, which would keep it alive."""
        while not all(
            worker_stats_path(self.records_path, index).exists() for index in range(self.count)
        ):
            gevent.sleep(0.2)
        options = self.environment.parsed_options
        if options is not None and options.headless:
            log.info("every worker's share is done; quitting")
            self.runner.quit()


@events.init.add_listener
def _on_init(environment: Environment, runner: Any = None, **_kwargs: Any) -> None:
    if isinstance(runner, MasterRunner):
        _State.master = _Master(environment, runner)
    elif isinstance(runner, WorkerRunner) and _is_remote():
        runner.register_message(SHARE, _on_share)
        runner.register_message(DONE, _on_done)


def _on_share(environment: Environment, msg: Any, **_kwargs: Any) -> None:
    _State.share.set(Share.from_data(msg.data))


def _on_done(environment: Environment, msg: Any, **_kwargs: Any) -> None:
    _State.done.set()


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_kwargs: Any) -> None:
    if isinstance(environment.runner, MasterRunner):
        if _State.master is not None:
            _State.master.on_test_start()
        return  # the master only aggregates; its workers send
    _State.tests_started += 1
    if isinstance(environment.runner, WorkerRunner) and _is_remote():
        gevent.spawn(_start_remote, environment)
        return
    try:
        settings = LoadSettings.from_env(
            os.environ, environment, first_test=_State.tests_started == 1
        )
        assert settings.schedule_path is not None and settings.records_path is not None
        schedule = read_schedule(settings.schedule_path)
        share = share_of(schedule, settings.worker_index, settings.worker_count)
        sink = FileSink(settings.records_path, settings.worker_index)
        _State.dispatcher = Dispatcher(settings, environment, share, sink)
    except Exception:
        log.exception("cannot send the schedule")
        _give_up(environment)
        return
    _State.dispatcher.start()


def _start_remote(environment: Environment) -> None:
    """A remote worker's test start: ask the master for the share, then send it."""
    runner = environment.runner
    assert isinstance(runner, WorkerRunner)
    try:
        runner.send_message(SHARE_REQUEST, {})
        share = _State.share.get(timeout=SHARE_WAIT_S)
        if share.requests is None:
            log.info("w%d: the run was under way when this worker joined; idle", share.index)
            return
        options = environment.parsed_options
        master_host = str(getattr(options, "master_host", "") or runner.master_host)
        settings = LoadSettings.from_share(share, os.environ, master_host)
        if time.time() > settings.start_at_s:
            log.warning(
                "%s: got its share %.3f s after TUNER_START_AT (clocks synchronized with NTP?)",
                settings.worker,
                time.time() - settings.start_at_s,
            )
        codec = ScheduleCodec()
        requests = [codec.decode(line) for line in share.requests]
        sink = MasterSink(environment, settings.worker_index)
        _State.dispatcher = Dispatcher(settings, environment, requests, sink)
    except (Exception, gevent.Timeout):
        log.exception("cannot send the share of the schedule")
        _give_up(environment)
        return
    _State.dispatcher.start()


def _give_up(environment: Environment) -> None:
    """Headless, nothing is left to wait for: exit non-zero instead of idling to --run-time."""
    environment.process_exit_code = 2
    runner = environment.runner
    if _quits_when_done(environment) and runner is not None:
        gevent.spawn(runner.quit)


@events.test_stop.add_listener
def _on_test_stop(environment: Environment, **_kwargs: Any) -> None:
    if _State.dispatcher is not None:
        _State.dispatcher.stop()
        _State.dispatcher = None


@events.quitting.add_listener
def _on_quitting(environment: Environment, **_kwargs: Any) -> None:
    _on_test_stop(environment)


class ScheduleVehicle(User):
    """Locust needs a user to run; this one idles. The dispatcher sends the schedule."""

    wait_time = constant(60)

    @task
    def idle(self) -> None:
        pass

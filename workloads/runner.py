"""Run a schedule against an OpenAI-compatible server with Locust, as a subprocess.

`run_load` writes the schedule to ``out_dir/schedule.jsonl``, starts ``python -m locust``
headless on ``workloads/locustfile.py`` in its own process group (output in
``out_dir/locust.log``), waits until every scheduled request has finished or timed
out, merges the records of every Locust process into ``out_dir/requests.jsonl`` and
returns a `LoadRun`.

Files in ``out_dir``::

    schedule.jsonl                  the schedule, sorted by send time
    locust.log                      Locust's stdout and stderr
    records.jsonl.w<i>              records of Locust process i (appended, one per request)
    records.jsonl.w<i>.stats.json   that process's `WorkerStats`
    workers-connected.json          with remote workers: how many connected to the master
    requests.jsonl                  every record, merged, sorted by scheduled time

How the load is generated (see the locustfile for the details): in each Locust process
one dispatcher greenlet walks that process's share of the schedule (whole sessions,
dealt round-robin over the processes: `workloads.schedule.share_of`) and, at each
open-loop request's send time, spawns a greenlet that sends it and reads the stream.
A session's later turn is sent once the answer it extends has arrived, plus the think
time (closed loop within a session; sessions keep arriving open loop). With
``turns_until_s`` a later turn that would go out at or after that offset is neither
sent nor recorded (the user's turn falls after the measurement), only counted
(``turns_after_window``). Users are only the vehicle Locust needs to run
(one per process, idle): a request never waits for a free user, so a stalled server
cannot slow the offered load, and the number of users does not have to be sized to
rate × latency. What bounds the greenlets is the in-flight cap: a request due while
``max_in_flight`` requests are in flight is recorded as not sent
(`load_errors.CAP_REACHED`) and counted in ``cap_hits``.

Load from several hosts (``remote_workers``): the master listens on ``master_bind`` and
waits for ``processes`` local workers and ``remote_workers`` Locust workers started by
``tuner load-worker --master HOST:PORT`` on load hosts. A remote worker shares no files
with the master: it gets its share of the schedule and its settings from the master
and sends its records and stats back in Locust messages (`workloads.remote`); the
master writes them to the same ``records.jsonl.w<i>`` files, so a run reads the same
whoever generated it. The schedule's offset 0 is a wall-clock time every worker
honours, so load hosts need clocks synchronized with NTP (a worker's lateness is in
its stats, ``start_late_s``). The server's URL, as the master sees it, goes to the
remote workers; a loopback or wildcard host in it is replaced there by the master's
host, so a server launched beside the master must listen on an interface they reach.

This module never imports Locust or gevent: ``import locust`` monkey-patches the
process, so it happens only inside the subprocess.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from workloads.client_lag import judge_client
from workloads.load_errors import LoadConfigError, LoadGeneratorError
from workloads.schedule import (
    Api,
    RequestRecord,
    ScheduledRequest,
    reached,
    read_records,
    write_records,
    write_schedule,
)

log = logging.getLogger(__name__)

LOCUSTFILE = Path(__file__).resolve().with_name("locustfile.py")
PROJECT_ROOT = LOCUSTFILE.parent.parent

DEFAULT_REQUEST_TIMEOUT_S = 600.0
DEFAULT_MAX_IN_FLIGHT = 4096
# Time from launch to offset 0 of the schedule: Locust imports (about 1 s), forks its
# workers and connects them to the master before the test starts. The latest start: local
# processes say when they are ready (`ready_path`), and once all have, offset 0 is moved
# up to GO_MARGIN_S from then (`go_path`); on an idle machine one process is ready about
# 0.5 s after its launch.
STARTUP_LEAD_S = 3.0
STARTUP_LEAD_PER_PROCESS_S = 0.5
# With a master (--processes N > 1, or remote workers): its workers report ready, then
# it sends the spawn jobs about a second later. A CI run with 2 processes was ready
# 0.7 s after a 4 s lead.
STARTUP_LEAD_MASTER_S = 2.0
# With remote workers: the master waits for each to connect, then sends it its share.
STARTUP_LEAD_REMOTE_S = 3.0
WORKERS_WAIT_S = 30.0  # how long the master waits for every worker to connect
# After the last request's deadline: Locust stops, prints its summary and exits.
SHUTDOWN_GRACE_S = 30.0
KILL_GRACE_S = 5.0
# From the moment every local process is ready to offset 0: time for each to read the go
# file (it looks every 10 ms) and to encode its first request.
GO_MARGIN_S = 0.3
GO_POLL_S = 0.02  # how often the harness looks for the ready marks

Spawn = Callable[[list[str], Path, dict[str, str]], "subprocess.Popen[bytes]"]


def worker_records_path(records_path: Path, index: int) -> Path:
    """Where Locust process ``index`` appends its records (``TUNER_RECORDS`` + ``.w<index>``)."""
    return records_path.with_name(f"{records_path.name}.w{index}")


def worker_stats_path(records_path: Path, index: int) -> Path:
    """Where Locust process ``index`` writes its `WorkerStats` when its share is done."""
    return records_path.with_name(f"{records_path.name}.w{index}.stats.json")


def ready_path(records_path: Path, index: int) -> Path:
    """Where Locust process ``index`` marks that it is warmed up and waits for offset 0."""
    return records_path.with_name(f"{records_path.name}.w{index}.ready")


def go_path(records_path: Path) -> Path:
    """Where the harness writes offset 0 (Unix time) once every local process is ready."""
    return records_path.with_name(f"{records_path.name}.go")


def connected_workers_path(records_path: Path) -> Path:
    """Where the master keeps the count of workers that connected to it (remote runs)."""
    return records_path.with_name("workers-connected.json")


def startup_lead_s(processes: int, remote_workers: int = 0) -> float:
    """Seconds from launching Locust to offset 0 of the schedule."""
    lead = STARTUP_LEAD_S + STARTUP_LEAD_PER_PROCESS_S * (processes + remote_workers)
    if processes > 1 or remote_workers:
        lead += STARTUP_LEAD_MASTER_S
    return lead + (STARTUP_LEAD_REMOTE_S if remote_workers else 0.0)


def parse_host_port(text: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6addr]:PORT`` for IPv6) as (host, port); LoadConfigError naming ``what``."""
    host, sep, port_text = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    accepted = "accepted: HOST:PORT with a port 1-65535, e.g. 10.0.0.5:5557"
    if not sep or not host or not port_text:
        raise LoadConfigError(f"{what} {text!r} has no host and port; {accepted}")
    try:
        port = int(port_text)
    except ValueError:
        raise LoadConfigError(
            f"{what} {text!r}: port {port_text!r} is not a number; {accepted}"
        ) from None
    if not 1 <= port <= 65535:
        raise LoadConfigError(f"{what} {text!r}: port {port} is out of range; {accepted}")
    return host, port


def is_any_address(host: str) -> bool:
    """Whether ``host`` is a wildcard bind address (every interface), not one to connect to."""
    if host in ("*", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def is_local_address(host: str) -> bool:
    """Loopback or wildcard: an address that means 'this machine' only on this machine."""
    if host == "localhost" or is_any_address(host):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class WorkerStats(BaseModel):
    """What one Locust process measured about itself (its ``.stats.json``)."""

    model_config = ConfigDict(frozen=True)

    worker: str  # "w<index>", as in its records
    index: int
    count: int
    scheduled: int  # requests in this process's share
    sent: int
    cap_hits: int  # not sent: the in-flight cap was reached
    completed: int  # sent and answered without error
    failed: int  # sent, ended with an error (HTTP status, stream error, timeout, aborted)
    not_sent_stopped: int  # not sent: the run was stopped before their send time
    max_in_flight: int  # this process's cap
    peak_in_flight: int
    start_late_s: float  # ready to send (after its warm-up) minus TUNER_START_AT; > 0: late
    wall_s: float  # from TUNER_START_AT (or the dispatcher start, if later) to the last record
    cpu_s: float  # process CPU time (user + system) over wall_s
    cpu_percent: float  # cpu_s / wall_s × 100 (100 = one core)
    send_lag_p50_ms: float | None  # sent_s - scheduled_s over sent requests
    send_lag_p99_ms: float | None
    send_lag_max_ms: float | None
    stopped_early: bool  # Locust stopped the test before the share was done
    # Token times are the kernel's receive stamps of their bytes (Linux, plain HTTP);
    # otherwise when this process read them.
    kernel_timestamps: bool = False
    token_events: int = 0
    # Token events that arrived in one read with their stream's previous token event:
    # the process fell a whole token gap behind on that stream, and both carry the
    # later arrival time (their gap reads as 0).
    coalesced_events: int = 0
    # With kernel stamps: how long token bytes waited before this process read them.
    read_delay_p50_ms: float | None = None
    read_delay_p99_ms: float | None = None
    # How late a periodic timer of this process's event loop fired (every
    # LOOP_PROBE_S): how long a token or an answer waited for the loop to be read.
    loop_delay_p50_ms: float | None = None
    loop_delay_p99_ms: float | None = None
    loop_delay_max_ms: float | None = None
    # Later turns due at or after TUNER_TURNS_UNTIL_S: neither sent nor recorded.
    turns_after_window: int = 0
    # A chained run: requests withdrawn by a later segment, neither sent nor recorded.
    withdrawn: int = 0


class LoadRun(BaseModel):
    """The outcome of one `run_load`: where its evidence is and whether the client kept up."""

    model_config = ConfigDict(frozen=True)

    out_dir: Path
    schedule_path: Path
    records_path: Path  # requests.jsonl, every record merged
    log_path: Path
    processes: int  # local Locust processes
    start_at_s: float  # Unix time of offset 0
    wall_s: float  # from launch to the Locust process group's exit
    num_scheduled: int
    num_records: int
    # Scheduled requests without a record (the Locust process was killed or stopped),
    # less the turns_after_window, which are left unrecorded by design.
    num_missing: int
    cap_hits: int
    workers: tuple[WorkerStats, ...]
    client_saturated: bool
    saturation_reason: str | None
    exit_code: int | None  # Locust's; None when it had to be killed
    killed: bool  # past its deadline (or on the caller's stop_when), the process group was killed
    stopped_by_caller: bool = False  # stop_when() returned True before the schedule was done
    remote_workers: int = 0  # Locust workers on other hosts (tuner load-worker)
    turns_after_window: int = 0  # later turns due at or after turns_until_s: not sent


def run_load(
    *,
    base_url: str,
    model: str,
    schedule: Sequence[ScheduledRequest],
    out_dir: Path,
    processes: int = 1,
    remote_workers: int = 0,
    master_bind: str | None = None,
    max_in_flight: int | None = None,
    timeout_s: float | None = None,
    spawn: Spawn | None = None,
    stop_when: Callable[[], bool] | None = None,
    workers_wait_s: float = WORKERS_WAIT_S,
    turns_until_s: float | None = None,
    segments_dir: Path | None = None,
    start_at_s: float | None = None,
    horizon_s: float | None = None,
    schedule_path: Path | None = None,
) -> LoadRun:
    """Send ``schedule`` to ``base_url`` (e.g. ``http://127.0.0.1:8000``) and collect the records.

    ``processes``: Locust processes (``--processes N`` when N > 1); the schedule is split
    between them round-robin by session (`workloads.schedule.share_of`), so each sends
    about 1/N of the rate and waits for the answers its own sessions' later turns extend.
    ``remote_workers`` K: Locust workers on other hosts (``tuner load-worker --master
    HOST:PORT``), with ``master_bind`` (``HOST:PORT``) where the master listens for them;
    the schedule is split over the ``processes + K`` workers the same way. The master
    waits ``workers_wait_s`` for all of them to connect (LoadGeneratorError naming how
    many did otherwise). ``max_in_flight``: cap on requests in flight over all processes, split evenly
    (default 4096). ``timeout_s``: a request unfinished this long after its scheduled time
    is abandoned and recorded with a timeout error (default 600 s); the whole run is
    bounded by the latest send time (`latest_send_s`: later turns wait for answers)
    plus ``timeout_s`` plus a shutdown grace, after which
    the Locust process group is killed. ``spawn(cmd, log_path, env)`` starts the process
    instead of `subprocess.Popen` (e.g. to register it with a cleanup registry); it must
    put the process in its own process group with its output in ``log_path``.
    ``stop_when()`` is polled every 0.1 s; once it returns True the run is stopped early
    (a warm-up that reached its target, a level whose SLO is already clearly broken):
    requests not yet sent or still in flight then have no record (``num_missing``).
    ``turns_until_s``: offset (from the schedule's offset 0) at and after which a later
    turn of a session is not sent or recorded, only counted (``turns_after_window``);
    None: no limit.
    ``segments_dir``: a chained run (``workloads.chain``): the schedule grows by the
    segments written there while the run goes on, and it ends only when ``stop_when``
    says so or ``horizon_s`` (seconds from offset 0) has passed; local processes only.
    ``start_at_s``: Unix time of offset 0 (default: the start-up lead from now).
    ``schedule_path``: ``schedule`` is already written there (``write_schedule``), where
    Locust reads it (default: written to ``out_dir/schedule.jsonl``).
    """
    if segments_dir is not None and remote_workers:
        raise LoadConfigError(
            f"a chained run's segments are files in {segments_dir}, which remote workers "
            "cannot read; accepted: local processes only"
        )
    bind = _validate(
        schedule,
        processes=processes,
        remote_workers=remote_workers,
        master_bind=master_bind,
        max_in_flight=max_in_flight,
        timeout_s=timeout_s,
        turns_until_s=turns_until_s,
    )
    generators = _Generators(
        processes=processes,
        remote_workers=remote_workers,
        master_bind=master_bind,
        bind=bind,
        workers_wait_s=workers_wait_s,
    )
    request_timeout_s = DEFAULT_REQUEST_TIMEOUT_S if timeout_s is None else timeout_s
    cap = DEFAULT_MAX_IN_FLIGHT if max_in_flight is None else max_in_flight

    files = _fresh_files(out_dir)
    if schedule_path is not None:
        files = dataclasses.replace(
            files, schedule_path=schedule_path.absolute(), schedule_written=False
        )
        num_scheduled = len(schedule)
    else:
        num_scheduled = write_schedule(files.schedule_path, schedule)
    clock = _plan_clock(
        schedule, generators, request_timeout_s, turns_until_s,
        start_at_s=start_at_s, horizon_s=horizon_s,
    )  # fmt: skip
    cmd = _locust_command(
        base_url,
        processes=processes,
        run_time_s=clock.run_time_s,
        remote_workers=remote_workers,
        bind=bind,
        workers_wait_s=workers_wait_s,
    )
    # Offset 0 moves up once the local processes are ready; a chained run's (given) and a
    # run with remote workers (whose shares the master sends at a fixed time) keep theirs.
    adaptive = start_at_s is None and not remote_workers and segments_dir is None
    env = _locust_env(
        schedule_path=files.schedule_path,
        records_path=files.worker_base,
        model=model,
        max_in_flight=cap,
        processes=processes,
        remote_workers=remote_workers,
        start_at_s=clock.start_at_s,
        request_timeout_s=request_timeout_s,
        turns_until_s=turns_until_s,
        segments_dir=segments_dir,
        go_file=go_path(files.worker_base) if adaptive else None,
    )
    log.info(
        "locust: %d requests, %d local process(es), %d remote worker(s), offset 0 at %.3f%s, "
        "log %s",
        num_scheduled,
        processes,
        remote_workers,
        clock.start_at_s,
        " at the latest" if adaptive else "",
        files.log_path,
    )
    go = _Go(files.worker_base, processes, clock.start_at_s) if adaptive else None
    ended = _run_locust(cmd, env, files, clock, generators.total, spawn, stop_when, go)
    return _collect(schedule, files, clock, ended, generators, num_scheduled=num_scheduled)


@dataclass(frozen=True)
class _Generators:
    """Who generates the load: local Locust processes, remote workers, the master's address."""

    processes: int
    remote_workers: int
    master_bind: str | None
    bind: tuple[str, int] | None  # master_bind as (host, port); None without remote workers
    workers_wait_s: float

    @property
    def total(self) -> int:
        """Every Locust worker, local and remote."""
        return self.processes + self.remote_workers


@dataclass(frozen=True)
class _RunFiles:
    """Where one run's files are (absolute: Locust runs in ``out_dir``)."""

    out_dir: Path
    schedule_path: Path  # schedule.jsonl
    worker_base: Path  # records.jsonl: process i appends to records.jsonl.w<i>
    merged_path: Path  # requests.jsonl, every record merged
    log_path: Path  # locust.log
    connected_path: Path  # workers-connected.json (remote workers)
    schedule_written: bool = True  # False: the caller wrote the schedule (and keeps it)


def _fresh_files(out_dir: Path) -> _RunFiles:
    """The run's files in ``out_dir`` (made absolute and created), an earlier run's removed."""
    out_dir = out_dir.absolute()  # Locust runs in out_dir: the paths it is given are absolute
    out_dir.mkdir(parents=True, exist_ok=True)
    worker_base = out_dir / "records.jsonl"
    files = _RunFiles(
        out_dir=out_dir,
        schedule_path=out_dir / "schedule.jsonl",
        worker_base=worker_base,
        merged_path=out_dir / "requests.jsonl",
        log_path=out_dir / "locust.log",
        connected_path=connected_workers_path(worker_base),
    )
    stale_files = (*out_dir.glob(f"{worker_base.name}.w*"), files.merged_path, files.connected_path)
    for stale in stale_files:  # an earlier run's
        stale.unlink(missing_ok=True)
    return files


@dataclass(frozen=True)
class _RunClock:
    """When a run was launched, when its offset 0 is, how long Locust runs, when it is killed."""

    launched_s: float  # Unix time
    start_at_s: float  # Unix time of offset 0
    run_time_s: int  # Locust's --run-time
    deadline_s: float  # Unix time past which the process group is killed


def _plan_clock(
    schedule: Sequence[ScheduledRequest],
    generators: _Generators,
    request_timeout_s: float,
    turns_until_s: float | None,
    *,
    start_at_s: float | None = None,
    horizon_s: float | None = None,
) -> _RunClock:
    """The run's times from now: offset 0 after the start-up lead (or at ``start_at_s``), a
    deadline past the last send (or past ``horizon_s``, a chained run's)."""
    launched_s = time.time()
    if start_at_s is None:
        start_at_s = launched_s + startup_lead_s(generators.processes, generators.remote_workers)
    last_send_s = latest_send_s(schedule, request_timeout_s, turns_until_s)
    if horizon_s is not None:
        last_send_s = max(last_send_s, horizon_s)
    run_time_s = math.ceil(start_at_s - launched_s + last_send_s + request_timeout_s + 5.0)
    deadline_s = launched_s + run_time_s + SHUTDOWN_GRACE_S
    if generators.remote_workers:  # --run-time counts from the test start, after they connected
        deadline_s += generators.workers_wait_s
    return _RunClock(
        launched_s=launched_s, start_at_s=start_at_s, run_time_s=run_time_s, deadline_s=deadline_s
    )


@dataclass(frozen=True)
class _LocustEnd:
    """How the Locust process group ended."""

    wall_s: float  # from launch to the group's exit
    exit_code: int | None  # Locust's; None when it had to be killed
    killed: bool  # past its deadline (or on stop_when), the group was killed
    stopped_by_caller: bool  # stop_when() returned True before the deadline
    start_at_s: float  # Unix time of offset 0: the clock's, or the earlier one the go file gave


def _run_locust(
    cmd: list[str],
    env: dict[str, str],
    files: _RunFiles,
    clock: _RunClock,
    workers_total: int,
    spawn: Spawn | None,
    stop_when: Callable[[], bool] | None,
    go: _Go | None = None,
) -> _LocustEnd:
    """Start Locust in its own process group, wait for it to end (or stop it), kill what is left."""
    proc = (spawn or _popen)(cmd, files.log_path, env)
    pgid = _own_group(proc, files.log_path)
    killed = False
    try:
        killed = _wait(proc, files.worker_base, workers_total, clock.deadline_s, stop_when, go)
    finally:
        # Also on success: nothing of the group (forked workers) may outlive the run.
        _stop_group(proc, pgid)
    wall_s = time.time() - clock.launched_s
    return _LocustEnd(
        wall_s=wall_s,
        exit_code=None if killed else proc.returncode,
        killed=killed,
        stopped_by_caller=killed and stop_when is not None and time.time() < clock.deadline_s,
        start_at_s=go.start_at_s if go is not None else clock.start_at_s,
    )


def _collect(
    schedule: Sequence[ScheduledRequest],
    files: _RunFiles,
    clock: _RunClock,
    ended: _LocustEnd,
    generators: _Generators,
    *,
    num_scheduled: int,
) -> LoadRun:
    """Read every process's stats and records, merge the records, and sum the run up."""
    workers = _read_worker_stats(files.worker_base, generators.total)
    records = _merge(files.worker_base, generators.total, files.merged_path)
    if not workers and not records:
        raise _nothing_measured(files, ended, generators)
    if ended.stopped_by_caller and files.schedule_written:
        # the schedule as sent: a level stopped by its caller reached a fraction of its plan
        write_schedule(files.schedule_path, reached(schedule, records))
    if len(workers) < generators.total:
        log.warning(
            "only %d of %d Locust processes wrote their stats", len(workers), generators.total
        )
    saturated, reason = client_saturation(workers)
    turns_after_window = sum(worker.turns_after_window for worker in workers)
    withdrawn = sum(worker.withdrawn for worker in workers)
    return LoadRun(
        out_dir=files.out_dir,
        schedule_path=files.schedule_path,
        records_path=files.merged_path,
        log_path=files.log_path,
        processes=generators.processes,
        start_at_s=ended.start_at_s,
        wall_s=ended.wall_s,
        num_scheduled=num_scheduled,
        num_records=len(records),
        num_missing=_num_missing(schedule, records, turns_after_window + withdrawn),
        cap_hits=sum(worker.cap_hits for worker in workers),
        workers=workers,
        client_saturated=saturated,
        saturation_reason=reason,
        exit_code=ended.exit_code,
        killed=ended.killed,
        stopped_by_caller=ended.stopped_by_caller,
        remote_workers=generators.remote_workers,
        turns_after_window=turns_after_window,
    )


def _read_worker_stats(worker_base: Path, workers_total: int) -> tuple[WorkerStats, ...]:
    """The `WorkerStats` of every Locust process that wrote them, by index."""
    return tuple(
        WorkerStats.model_validate_json(path.read_text(encoding="utf-8"))
        for index in range(workers_total)
        if (path := worker_stats_path(worker_base, index)).exists()
    )


def _nothing_measured(
    files: _RunFiles, ended: _LocustEnd, generators: _Generators
) -> LoadGeneratorError:
    """The error of a run that left no stats and no records: who did not connect, or the log."""
    total = generators.total
    connected = _connected_count(files.connected_path)
    bind = generators.bind
    if bind is not None and not ended.stopped_by_caller and connected < total:
        return LoadGeneratorError(
            f"only {connected} of {total} Locust workers ({generators.processes} local, "
            f"{generators.remote_workers} remote) connected to the master on "
            f"{generators.master_bind} within {generators.workers_wait_s:g} s; start "
            f"`tuner load-worker --master HOST:{bind[1]}` on each load host, reaching this "
            f"host through its firewall (log {files.log_path})"
        )
    return LoadGeneratorError(
        f"Locust exited with {ended.exit_code} without measuring anything; "
        f"last lines of {files.log_path}:\n{_tail(files.log_path)}"
    )


def _num_missing(
    schedule: Sequence[ScheduledRequest], records: Sequence[RequestRecord], turns_after_window: int
) -> int:
    """Scheduled requests without a record, less the later turns left unrecorded by design."""
    recorded_ids = {record.request_id for record in records}
    unrecorded = sum(1 for request in schedule if request.request_id not in recorded_ids)
    return max(unrecorded - turns_after_window, 0)


def latest_send_s(
    schedule: Sequence[ScheduledRequest], request_timeout_s: float, turns_until_s: float | None
) -> float:
    """The latest offset a request of ``schedule`` can be sent at.

    Open-loop requests go at their ``send_s``; a later turn of a session waits for the
    answer it extends, which takes at most ``request_timeout_s`` after that turn was
    due, then ``think_time_s``; and none goes at or after ``turns_until_s``.
    """
    by_id = {request.request_id: request for request in schedule}
    latest: dict[str, float] = {}

    def bound(request: ScheduledRequest) -> float:
        chain: list[ScheduledRequest] = []
        while (
            request.follows is not None
            and request.follows in by_id
            and request.request_id not in latest
            and len(chain) <= len(by_id)  # a cycle of follows is not a chain
        ):
            chain.append(request)
            request = by_id[request.follows]
        at_s = latest.setdefault(request.request_id, request.send_s)
        for turn in reversed(chain):
            at_s = latest.setdefault(turn.request_id, at_s + request_timeout_s + turn.think_time_s)
        return at_s

    open_loop_s = max(r.send_s for r in schedule if r.follows is None or r.follows not in by_id)
    followers_s = max(
        (bound(r) for r in schedule if r.follows is not None and r.follows in by_id),
        default=open_loop_s,
    )
    if turns_until_s is not None:
        followers_s = min(followers_s, turns_until_s)
    return max(open_loop_s, followers_s)


def client_saturation(workers: Sequence[WorkerStats]) -> tuple[bool, str | None]:
    """Whether any Locust process lagged past the stated bounds, and why
    (``workloads.client_lag``)."""
    lag = judge_client(workers)
    return lag.lagged, lag.reason


def _connected_count(path: Path) -> int:
    try:
        return int(json.loads(path.read_text(encoding="utf-8"))["connected"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


@dataclass(frozen=True, kw_only=True)
class GeneratorNames:
    """How a caller names the three load-generator settings in its error messages: the
    keyword arguments of `run_load` (``processes=0``) or a command's flags
    (``--processes 0``). The checks and their wording are `validate_generators`' alone."""

    processes: str = "processes"
    remote_workers: str = "remote_workers"
    master_bind: str = "master_bind"
    joiner: str = "="  # between a name and its value: "=" for keywords, " " for flags

    def show(self, name: str, value: object) -> str:
        return f"{name}{self.joiner}{value}"


KEYWORD_NAMES = GeneratorNames()


def validate_generators(
    *,
    processes: int,
    remote_workers: int,
    master_bind: str | None,
    names: GeneratorNames = KEYWORD_NAMES,
) -> tuple[str, int] | None:
    """Check how the load is generated; the master's (host, port) when remote workers come.

    The only check of these settings: `run_load` and the tuner's commands both call it,
    each with its own ``names``. ``processes`` may be 0 with remote workers: this host
    then runs only the master. A bad value is one LoadConfigError line naming it and what
    is accepted."""
    p, r, b = names.processes, names.remote_workers, names.master_bind
    if processes < (0 if remote_workers else 1):
        raise LoadConfigError(
            f"{names.show(p, processes)} is out of range; accepted: an integer >= 1 "
            f"(>= 0 with {r}: all the load from load hosts)"
        )
    if remote_workers < 0:
        raise LoadConfigError(
            f"{names.show(r, remote_workers)} is out of range; accepted: an integer >= 0"
        )
    if remote_workers and master_bind is None:
        raise LoadConfigError(
            f"{names.show(r, remote_workers)} needs {names.show(b, 'HOST:PORT')}, "
            "where the Locust master listens for them; accepted e.g. 0.0.0.0:5557"
        )
    if master_bind is not None and not remote_workers:
        raise LoadConfigError(
            f"{names.show(b, repr(master_bind))} is only used with remote workers; "
            f"accepted: {names.show(r, 'K')} (K >= 1) with it, or no {b}"
        )
    return None if master_bind is None else parse_host_port(master_bind, b)


def _validate(
    schedule: Sequence[ScheduledRequest],
    *,
    processes: int,
    remote_workers: int,
    master_bind: str | None,
    max_in_flight: int | None,
    timeout_s: float | None,
    turns_until_s: float | None = None,
) -> tuple[str, int] | None:
    if not schedule:
        raise LoadConfigError("schedule is empty; accepted: at least one request")
    bind = validate_generators(
        processes=processes, remote_workers=remote_workers, master_bind=master_bind
    )
    total = processes + remote_workers
    if max_in_flight is not None and max_in_flight < total:
        raise LoadConfigError(
            f"max_in_flight={max_in_flight} is out of range; accepted: >= Locust workers ({total})"
        )
    if timeout_s is not None and not timeout_s > 0:
        raise LoadConfigError(f"timeout_s={timeout_s} is out of range; accepted: > 0")
    if turns_until_s is not None and not 0 <= turns_until_s < math.inf:
        raise LoadConfigError(
            f"turns_until_s={turns_until_s} is out of range; accepted: >= 0, or None (no limit)"
        )
    ids: set[str] = set()
    for request in schedule:
        if request.request_id in ids:
            raise LoadConfigError(
                f"request_id {request.request_id!r} appears twice in the schedule"
            )
        ids.add(request.request_id)
        if request.send_s < 0:
            raise LoadConfigError(
                f"request {request.request_id!r} has send_s={request.send_s}; accepted: >= 0"
            )
        if request.max_tokens < 1:
            raise LoadConfigError(
                f"request {request.request_id!r} has max_tokens={request.max_tokens}; accepted: >= 1"
            )
        if request.api is Api.COMPLETIONS and request.prompt is None:
            raise LoadConfigError(f"completions request {request.request_id!r} has no prompt")
        if request.api is Api.CHAT and not request.messages:
            raise LoadConfigError(f"chat request {request.request_id!r} has no messages")
    return bind


def _locust_command(
    base_url: str,
    *,
    processes: int,
    run_time_s: int,
    remote_workers: int = 0,
    bind: tuple[str, int] | None = None,
    workers_wait_s: float = WORKERS_WAIT_S,
) -> list[str]:
    workers = processes + remote_workers
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--host",
        base_url,
        # One idle vehicle user per process: the dispatcher, not the users, sends.
        "--users",
        str(workers),
        "--spawn-rate",
        str(workers),
        "--run-time",
        f"{run_time_s}s",
        "--only-summary",
        # Failed requests are measurements, not a failure of the load generator.
        "--exit-code-on-error",
        "0",
    ]
    if bind is not None:
        # Locust's --processes sets --expect-workers to N; the locustfile raises it to
        # TUNER_WORKER_COUNT (local + remote) on the master. Local workers connect to
        # the bind address, or to loopback when it is every interface.
        host, port = bind
        connect = "127.0.0.1" if is_any_address(host) else host
        cmd += ["--master-bind-host", host, "--master-bind-port", str(port),
                "--expect-workers", str(workers),
                "--expect-workers-max-wait", str(math.ceil(workers_wait_s))]  # fmt: skip
        if processes:
            cmd += ["--processes", str(processes), "--master-host", connect,
                    "--master-port", str(port)]  # fmt: skip
        else:  # every worker is remote: this host runs only the master
            cmd.append("--master")
    elif processes > 1:
        # The master's port for its workers: Locust's default (5557, every interface) is
        # taken by any other Locust run with workers on the machine.
        port_text = str(_free_local_port())
        cmd += ["--processes", str(processes), "--master-bind-host", "127.0.0.1",
                "--master-bind-port", port_text, "--master-host", "127.0.0.1", "--master-port", port_text]  # fmt: skip
    return cmd


def _free_local_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _locust_env(
    *,
    schedule_path: Path,
    records_path: Path,
    model: str,
    max_in_flight: int,
    processes: int,
    start_at_s: float,
    request_timeout_s: float,
    remote_workers: int = 0,
    turns_until_s: float | None = None,
    segments_dir: Path | None = None,
    go_file: Path | None = None,
) -> dict[str, str]:
    env = locust_base_env()
    env.update(
        TUNER_SCHEDULE=str(schedule_path),
        TUNER_RECORDS=str(records_path),
        TUNER_MODEL=model,
        TUNER_MAX_IN_FLIGHT=str(max_in_flight),
        TUNER_WORKER_COUNT=str(processes + remote_workers),
        TUNER_START_AT=repr(start_at_s),
        TUNER_REQUEST_TIMEOUT_S=repr(request_timeout_s),
    )
    if turns_until_s is not None:
        env["TUNER_TURNS_UNTIL_S"] = repr(turns_until_s)
    if segments_dir is not None:
        env["TUNER_SEGMENTS"] = str(segments_dir.absolute())
    if go_file is not None:
        env["TUNER_GO_FILE"] = str(go_file.absolute())
    # With several processes Locust forks the workers; each takes its index from the master.
    env.pop("TUNER_WORKER_INDEX", None)
    if processes == 1 and not remote_workers:
        env["TUNER_WORKER_INDEX"] = "0"
    return env


def locust_base_env() -> dict[str, str]:
    """The caller's environment for a Locust process, less what must not reach it.

    LOCUST_* settings would change the command line's meaning; TUNER_* settings are
    the harness's (TUNER_STORAGE holds a database password; a TUNER_SCHEDULE would make
    a remote worker read a file it does not have). The project is on PYTHONPATH.
    """
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("LOCUST_", "TUNER_"))
    }
    python_path = [str(PROJECT_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(PYTHONPATH=os.pathsep.join(python_path), PYTHONUNBUFFERED="1")
    return env


def _popen(cmd: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as out:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=log_path.parent,  # away from any locust.conf or pyproject.toml of the caller
            start_new_session=True,
        )


def _own_group(proc: subprocess.Popen[bytes], log_path: Path) -> int | None:
    """The process group to signal; None when the process already exited."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return None
    if pgid == os.getpgrp():
        proc.kill()
        proc.wait()
        raise LoadConfigError(
            f"spawn started Locust in the caller's process group (log {log_path}); "
            "accepted: a process in its own group (start_new_session=True)"
        )
    return pgid


def _wait(
    proc: subprocess.Popen[bytes],
    worker_base: Path,
    workers: int,
    deadline_s: float,
    stop_when: Callable[[], bool] | None = None,
    go: _Go | None = None,
) -> bool:
    """Wait for Locust to exit; True when it ran past the deadline (or stop_when) and was
    stopped. ``go``: offset 0 is moved up once every local process is ready."""
    done_grace_until: float | None = None
    while proc.poll() is None:
        if go is not None and not go.settled:
            go.poll()
            time.sleep(GO_POLL_S)
            continue
        now = time.time()
        if now > deadline_s:
            log.warning("Locust still running past its deadline; stopping its process group")
            return True
        if stop_when is not None and stop_when():
            log.info("load run stopped early by its caller")
            return True
        if done_grace_until is None and all(
            worker_stats_path(worker_base, index).exists() for index in range(workers)
        ):
            # Every share is done; Locust quits on its own, give it time to print its summary.
            done_grace_until = now + SHUTDOWN_GRACE_S
        if done_grace_until is not None and now > done_grace_until:
            log.warning("Locust did not exit after every process finished; stopping it")
            return False
        time.sleep(0.1)
    return False


@dataclass
class _Go:
    """Offset 0 moved up: once every local process wrote its ready mark, ``go_path`` gets
    ``GO_MARGIN_S`` from now, if that is before the clock's (the latest) start."""

    worker_base: Path
    processes: int
    start_at_s: float  # the latest start, then the one written
    settled: bool = False

    def poll(self) -> None:
        now = time.time()
        if now + GO_MARGIN_S >= self.start_at_s:
            self.settled = True  # too late to move it up: every process keeps the latest
            return
        if not all(ready_path(self.worker_base, i).exists() for i in range(self.processes)):
            return
        start_s = now + GO_MARGIN_S
        path = go_path(self.worker_base)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(repr(start_s), encoding="utf-8")
        partial.replace(path)  # whole, never half-written
        self.start_at_s = start_s
        self.settled = True
        log.debug("every Locust process ready: offset 0 moved up to %.3f", start_s)


def _stop_group(proc: subprocess.Popen[bytes], pgid: int | None) -> None:
    """SIGTERM to the whole group, then SIGKILL to what is left."""
    if pgid is not None:
        _signal_group(pgid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_GRACE_S)
    if pgid is not None:
        _signal_group(pgid, signal.SIGKILL)
    proc.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _merge(worker_base: Path, workers: int, merged_path: Path) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    for index in range(workers):
        path = worker_records_path(worker_base, index)
        if path.exists():
            records.extend(read_records(path))
    records.sort(key=lambda record: (record.scheduled_s, record.request_id))
    write_records(merged_path, records)
    return records


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(cannot read: {exc})"

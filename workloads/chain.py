"""A chained run: one Locust run whose schedule grows by segments while it goes on.

A rate search measures several rates on one server. Sent as separate runs, each rate
starts from a server drained to empty and pays again for the steady state: the
running batch, the KV cache and, for multi-turn workloads, the prefix cache of the
conversations under way. Chained, the rates follow one another on the same run:

* the first rate's schedule starts the run (``start``); the run never ends by itself;
* each next rate is a segment (``append``: its schedule file, offsets counted from
  the segment's own) from an offset a little ahead of now: from
  there the earlier rates' new arrivals are withdrawn, the conversations already
  under way carry on into it with their history in the server's cache (a lower rate
  keeps only its share of them, ``SegmentHeader.keep_under_way``), and the segment's
  own requests (new arrivals at its rate, and for a higher rate the conversations
  that rate has under way on top) join them;
* ``snapshot`` asks every process for what it has in flight, as far as it got, so a
  rate's window can be measured when it closes without waiting for its longest
  answers, as a run cut at its end measures them (``ABORTED`` records);
* ``close`` stops the run and returns its ``LoadRun``.

The run goes on in a thread of this process (``workloads.runner.run_load``, which
waits on the Locust subprocess), so the caller keeps measuring while it does. Files
in ``out_dir``: those of ``run_load`` (its records, ``locust.log``; segment 0 is the
schedule file ``start`` names), and ``segments/`` with the segments' headers and the
snapshots (``workloads.schedule``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from workloads.load_errors import LoadGeneratorError
from workloads.runner import LoadRun, Spawn, WorkerStats, run_load, startup_lead_s
from workloads.schedule import (
    RequestRecord,
    ScheduledRequest,
    SegmentHeader,
    snapshot_path,
    snapshot_request_path,
    write_segment,
)

HORIZON_S = 6 * 3600.0  # a chained run's longest life: its caller stops it long before
SNAPSHOT_WAIT_S = 10.0


@dataclass(frozen=True)
class Snapshot:
    """What a chained run had in flight at one moment, and its processes' stats so far."""

    in_flight: tuple[RequestRecord, ...] = ()
    workers: tuple[WorkerStats, ...] = ()


class LoadChain:
    """One chained run against ``base_url`` (see the module); a context manager that
    stops the run on exit."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        out_dir: Path,
        processes: int = 1,
        spawn: Spawn | None = None,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.out_dir = out_dir.absolute()
        self.segments_dir = self.out_dir / "segments"
        self.processes = processes
        self.spawn = spawn
        self.start_at_s = 0.0  # Unix time of offset 0, once started
        self.segments = 0
        self._snapshots = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._run: LoadRun | None = None
        self._error: BaseException | None = None

    def __enter__(self) -> LoadChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(raise_error=False)

    @property
    def started(self) -> bool:
        return self._thread is not None

    def running(self) -> bool:
        """The Locust run is still going on (False once it ended, by ``close`` or a failure)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, schedule: Sequence[ScheduledRequest], schedule_path: Path) -> float:
        """Start the run on ``schedule`` (segment 0), already written at ``schedule_path``
        (``write_schedule``); returns the Unix time of its offset 0."""
        if self._thread is not None:
            raise RuntimeError("a chained run starts once")
        self.segments_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.segments_dir.iterdir():
            stale.unlink()
        self.start_at_s = time.time() + startup_lead_s(self.processes)
        self._thread = threading.Thread(
            target=self._go, args=(list(schedule), schedule_path), name="load-chain", daemon=True
        )
        self._thread.start()
        return self.start_at_s

    def _go(self, schedule: list[ScheduledRequest], schedule_path: Path) -> None:
        try:
            self._run = run_load(
                base_url=self.base_url, model=self.model, schedule=schedule,
                schedule_path=schedule_path,
                out_dir=self.out_dir, processes=self.processes, spawn=self.spawn,
                stop_when=self._stop.is_set, segments_dir=self.segments_dir,
                start_at_s=self.start_at_s, horizon_s=HORIZON_S,
            )  # fmt: skip
        except BaseException as exc:  # re-raised where the caller closes the run
            self._error = exc

    def offset_now_s(self) -> float:
        """Seconds since the run's offset 0."""
        return time.time() - self.start_at_s

    def append(
        self,
        schedule_path: Path,
        *,
        offset_s: float,
        keep_under_way: float = 1.0,
        salt: str = "",
    ) -> SegmentHeader:
        """The next segment: the schedule written at ``schedule_path`` takes over from
        ``offset_s`` (seconds from the run's offset 0; its own offsets count from there;
        see ``SegmentHeader``)."""
        if not self.running():
            raise LoadGeneratorError(f"the chained run in {self.out_dir} is not running")
        self.segments += 1
        header = SegmentHeader(
            index=self.segments, offset_s=offset_s, schedule=str(schedule_path.absolute()),
            keep_under_way=keep_under_way, salt=salt,
        )  # fmt: skip
        write_segment(self.segments_dir, header)
        return header

    def snapshot(self, timeout_s: float = SNAPSHOT_WAIT_S) -> Snapshot:
        """A record of every request in flight now, as far as it got (error ABORTED), and
        the processes' stats; empty when the run is not going on or a process does not
        answer in time."""
        if not self.running():
            return Snapshot()
        self._snapshots += 1
        index = self._snapshots
        snapshot_request_path(self.segments_dir, index).touch()
        paths = [snapshot_path(self.segments_dir, index, i) for i in range(self.processes)]
        deadline = time.monotonic() + timeout_s
        while not all(p.exists() for p in paths):
            if time.monotonic() > deadline or not self.running():
                return Snapshot()
            time.sleep(0.02)
        records: list[RequestRecord] = []
        workers: list[WorkerStats] = []
        for path in paths:
            records.extend(
                RequestRecord.from_json(line)
                for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip()
            )
            stats = path.with_name(path.name + ".stats.json")
            workers.append(WorkerStats.model_validate_json(stats.read_text(encoding="utf-8")))
        return Snapshot(in_flight=tuple(records), workers=tuple(workers))

    def close(self, *, raise_error: bool = True) -> LoadRun | None:
        """Stop the run (the processes record what was left unsent) and wait for it; its
        ``LoadRun``, or None when it never started. A failure of the run is raised here."""
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        if self._error is not None and raise_error:
            error, self._error = self._error, None
            raise error
        return self._run

"""One whole trial: launch, sample GPU memory, warm up, load, scrape /metrics, stop.

Everything a trial measured is written to its directory, so reports can be rebuilt
without rerunning anything:

    <trial dir>/server.log      the server's own output
    <trial dir>/gpu.csv         GPU memory timeline
    <trial dir>/kv-fill/        warm-up by KV-cache fill, when the workload asks for it
    <trial dir>/warmup/         the warm-up load run (schedule, records, Locust log)
    <trial dir>/load/           the measured load run (schedule.jsonl, requests.jsonl,
                                locust.log, metrics.csv: /metrics over the run,
                                backlog.json: the backlog guard's verdict, ``tuner.serving.backlog``)
    <trial dir>/result.json     the TrialResult

``LiveServer`` holds a launched server with its GPU sampler for as long as a
caller needs it: ``tuner trial`` measures once, the tuning loop measures several
request rates on the same server.

Warm-up requests are sent as a load run of their own and finish before the
measured window opens, so the window's token counts on the client and the
server's /metrics counters describe the same requests.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

from pydantic import BaseModel, ConfigDict, Field

from tuner.errors import WorkloadLoadError
from tuner.run.layout import BACKLOG_JSON
from tuner.serving.backlog import BacklogCheck, check_backlog, clearly_growing
from tuner.serving.client_lag import ClientChange, ClientRule, ClientSetup, LevelClient, plan_remedy
from tuner.serving.gpu_sampler import (
    GpuSampler,
    GpuSourceKind,
    GpuSummary,
    ProcessTree,
    make_source,
    release_watch,
)
from tuner.serving.host_cpu import HostCpuSample, host_cpu_sample, others_share
from tuner.serving.load import (
    LOCAL_LOAD,
    LoadGenerators,
    SloVerdict,
    locust_spawner,
    percentile_shares,
    plan_schedule,
    run_schedule,
    scaled_schedule,
    split_warmup,
    summarise_records,
)
from tuner.serving.processes import ChildRegistry
from tuner.serving.prometheus_scrape import (
    KvUsageWatcher,
    MetricsSample,
    ServerCounters,
    read_metrics_csv,
    scrape,
)
from tuner.serving.server import Backend, LaunchSpec, ServerProcess, StartupResult, TrialOutcome
from tuner.serving.window import (
    WINDOW_FILE,
    LevelPlan,
    WindowClose,
    WindowOpening,
    state_correlation_s,
    steady_opening,
    window_closes,
)
from workloads.chain import LoadChain, Snapshot
from workloads.client_lag import ServerClockLag, judge_client
from workloads.load_errors import LoadConfigError, LoadGeneratorError
from workloads.load_result import LoadResult
from workloads.runner import WorkerStats
from workloads.schedule import (
    RequestRecord,
    ScheduledRequest,
    reached,
    read_records,
    read_schedule,
    sample_streams,
    write_records,
    write_schedule,
)
from workloads.slo import SloMetric
from workloads.slo_bootstrap import hold_share
from workloads.spec import WarmupSpec, WorkloadSpec
from workloads.stationary import lookback_s

log = logging.getLogger(__name__)

VERDICT_EVERY_S = 2.0  # wall seconds between readings of a held window's records
# A level's /metrics watcher samples every WATCH_INTERVAL_S wall seconds, and on a
# faster simulated clock every WATCH_INTERVAL_S of the emulated GPU's (``watch_interval_s``).
WATCH_INTERVAL_S = 0.25
WATCH_MIN_INTERVAL_S = 0.1


def watch_interval_s(time_scale: float) -> float:
    """The /metrics watcher's interval on a clock of ``time_scale``, in wall seconds: on a
    faster simulated clock as many samples per emulated second as on the GPU's own (the
    window's steady test wants 10 in its trailing 5.5 emulated seconds; at 4x a quarter
    second's samples gave 5, and every level waited out its longest warm-up), never more
    often than every ``WATCH_MIN_INTERVAL_S`` (each scrape takes the server's core)."""
    return max(WATCH_MIN_INTERVAL_S, WATCH_INTERVAL_S * min(time_scale, 1.0))


# A chained level's segment starts this long (wall) after it is written: the load
# generators look for segments every 0.1 s, then read its schedule a few lines at a time
# between their sends and streams (SEGMENT_READ_BYTES_PER_S: a seventh of what one
# process parses alone, 340 MB/s: a chat level's 10-minute schedule of 160 MB is read
# in time with a lead of 3.7 s; one read late says so in its locust.log).
SEGMENT_LEAD_S = 0.5
SEGMENT_READ_BYTES_PER_S = 50e6


class LoadMeasurement(BaseModel):
    """One measured load run on a live server, in the emulated GPU's time."""

    model_config = ConfigDict(frozen=True)

    out_dir: str
    outcome: TrialOutcome  # READY, or how the engine died during the run
    load: LoadResult
    slo: SloVerdict
    server: ServerCounters | None = None
    death: StartupResult | None = None
    client_saturated: bool = False  # the client lagged past its bounds (``client``)
    client_saturation_reason: str | None = None
    # The load generator's lag over the run and its verdict, how the load was generated,
    # and for a level measured again, the attempts set aside (tuner.serving.client_lag).
    client: LevelClient | None = None
    stopped_early: bool = False  # by the SLO stop rule
    backlog: BacklogCheck | None = None  # the backlog guard on the window (tuner.serving.backlog)
    stopped_by_backlog: bool = False  # the queue grew clearly: stopped before its window ended
    window: WindowOpening | None = (
        None  # a rate-search level: when its window opened (tuner.serving.window)
    )
    # Wall seconds of the load run, from its schedule's offset 0 to its stop (None: not
    # recorded): with ``window``, where a level's time went (tuner.run.evaluation.LevelSeconds).
    run_wall_s: float | None = None
    # A rate-search level: the ids of the requests its window measured (what was sent,
    # later turns at their answers' times), for its evidence; not written out.
    measured_ids: tuple[str, ...] = Field(default=(), exclude=True)


class KvFill(BaseModel):
    """What warm-up by KV-cache fill reached."""

    model_config = ConfigDict(frozen=True)

    target: float
    reached: float | None
    seconds: float
    requests_sent: int


class TrialResult(BaseModel):
    """What one trial found: settings, startup, load, server counters, GPU, outcome."""

    model_config = ConfigDict(frozen=True)

    outcome: TrialOutcome
    trial_dir: str
    settings: dict[str, object]
    startup: StartupResult
    load: LoadResult | None = None
    slo: SloVerdict | None = None
    server: ServerCounters | None = None
    gpu: GpuSummary | None = None
    client_saturated: bool = False
    client_saturation_reason: str | None = None
    death: StartupResult | None = None
    kv_fill: KvFill | None = None
    backlog: BacklogCheck | None = None


class _ServerPids:
    """The server's process tree once it has a pid (vLLM starts worker processes)."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.tree: ProcessTree | None = None

    def __call__(self) -> frozenset[int]:
        if self.tree is None and self.server.pid is not None:
            self.tree = ProcessTree(self.server.pid)
        return self.tree() if self.tree is not None else frozenset()


class ReleaseWatch(Protocol):
    """What a server's stop saw of its device memory (``ServerProcess``)."""

    @property
    def memory_released(self) -> bool | None: ...

    @property
    def baseline_used_bytes(self) -> dict[int, int]: ...


class TrialServer(Protocol):
    """What every launch of a tune (a trial, an edge probe, a confirmation) measures on:
    ``LiveServer``, or a stand-in with its behaviour (``tuner.twin.virtual_server.VirtualServer``,
    the simulated engine on the twin's virtual clock)."""

    launch: LaunchSpec
    time_scale: float
    generators: LoadGenerators
    source_kind: GpuSourceKind
    startup: StartupResult | None
    gpu: GpuSummary | None

    @property
    def server(self) -> ReleaseWatch: ...

    @property
    def ready(self) -> bool: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def fill_kv_cache(self, workload: WorkloadSpec, warmup: WarmupSpec) -> KvFill | None: ...

    def warm_up(self, workload: WorkloadSpec, warm: list[ScheduledRequest]) -> None: ...

    def chain(self, out_dir: Path) -> LoadChain | None: ...

    def measure(
        self,
        workload: WorkloadSpec,
        schedule: list[ScheduledRequest],
        *,
        out_dir: Path,
        stop_when: StopFactory | None = None,
        drain_s: float | None = None,
        level: LevelPlan | None = None,
        chain: LevelChain | None = None,
    ) -> LoadMeasurement: ...


class ServerFactory(Protocol):
    """Makes the server of one launch of a tune (``tuner.search.evaluate.live_server``):
    ``LiveServer`` (the default, what the command line always uses), or another
    ``TrialServer`` with the same arguments."""

    def __call__(
        self,
        launch: LaunchSpec,
        *,
        trial_dir: Path,
        registry: ChildRegistry,
        gpu_source: str = ...,
        generators: LoadGenerators = ...,
        stream_fraction: float = ...,
        stream_interval: int = ...,
    ) -> TrialServer: ...


def settings_of(spec: LaunchSpec) -> dict[str, object]:
    params = spec.params.model_dump(exclude_none=True, exclude={"other_process_bytes"})
    return {
        "backend": spec.backend.value,
        "model": spec.model,
        "gpu": spec.gpu,
        "vllm_version": spec.vllm_version,
        **params,
        "swap_space_gib": spec.swap_space_gib,
        "enable_prefix_caching": spec.enable_prefix_caching,
        **{name.replace("-", "_"): value for name, value in spec.offloading_flags},
    }


class LiveServer:
    """A launched server and its GPU sampler, from launch to stop (a context manager).

    On entry the server is launched and waited for; ``startup`` says how that went
    and the caller measures only when it is READY. On exit the sampler and the
    server stop, whatever happened, and ``gpu`` holds the timeline's summary.
    ``time_scale`` is the simulator's ``--time-scale`` (1 for vLLM);
    ``stream_fraction`` the share of requests streamed and ``stream_interval`` the tokens
    each streamed event carries (``workloads.schedule.sample_streams``).
    """

    def __init__(
        self,
        launch: LaunchSpec,
        *,
        trial_dir: Path,
        registry: ChildRegistry,
        gpu_source: str = "auto",
        gpu_sample_interval_s: float = 0.1,
        generators: LoadGenerators = LOCAL_LOAD,
        stream_fraction: float = 1.0,
        stream_interval: int = 1,
    ) -> None:
        self.launch = launch
        self.stream_fraction = stream_fraction
        self.stream_interval = stream_interval
        self._server_lagged = False  # the last level's simulated server fell behind its clock
        self.trial_dir = trial_dir
        self.registry = registry
        self.generators = generators
        self.time_scale = launch.sim_time_scale if launch.backend is Backend.SIM else 1.0
        trial_dir.mkdir(parents=True, exist_ok=True)
        self.source_kind = GpuSourceKind.requested(
            gpu_source, simulated=launch.backend is Backend.SIM
        )
        # NVML reads the server's own GPUs: of those the host makes visible, the first
        # one per tensor-parallel rank (never another job's, nor a visible GPU it leaves idle)
        devices = launch.server_devices()
        self.server = ServerProcess(
            launch, registry=registry, log_path=trial_dir / "server.log",
            memory_source=release_watch(self.source_kind, visible=devices),
        )  # fmt: skip
        self.sampler = GpuSampler(
            make_source(self.source_kind, base_url=self.server.base_url, visible=devices),
            interval_s=gpu_sample_interval_s,
            timeline_path=trial_dir / "gpu.csv",
            pids=_ServerPids(self.server),
        )
        self._sampling = False
        self.startup: StartupResult | None = None
        self.gpu: GpuSummary | None = None
        self.death: StartupResult | None = None

    @property
    def model(self) -> str:
        return self.launch.served_model_name or self.launch.model

    @property
    def ready(self) -> bool:
        return (
            self.startup is not None
            and self.startup.outcome is TrialOutcome.READY
            and self.death is None
        )

    def __enter__(self) -> LiveServer:
        try:
            # NVML before the launch: startup memory is in the timeline
            if self.source_kind is GpuSourceKind.NVML:
                self.sampler.start()
                self._sampling = True
            self.startup = self.server.wait_ready()
            if self.startup.outcome is TrialOutcome.READY and not self._sampling:
                self.sampler.start()
                self._sampling = True
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close()

    def _close(self) -> None:
        try:
            if self._sampling:
                self._sampling = False
                self.gpu = self.sampler.stop()
        finally:
            self.server.stop()

    def fill_kv_cache(self, workload: WorkloadSpec, warmup: WarmupSpec) -> KvFill | None:
        """Warm up until the KV cache is ``warmup.kv_cache_fill`` full or ``max_s`` passed."""
        if warmup.kv_cache_fill is None:
            return None
        target = warmup.kv_cache_fill
        spec, schedule = fill_schedule(
            workload, warmup, self.launch.params.max_model_len, self.stream_fraction,
            self.stream_interval,
        )  # fmt: skip
        if not schedule:
            return KvFill(target=target, reached=None, seconds=0.0, requests_sent=0)
        watcher = KvUsageWatcher(
            self.server.base_url, interval_s=watch_interval_s(self.time_scale)
        ).start()
        began = time.monotonic()
        try:
            run = run_schedule(
                spec, schedule, base_url=self.server.base_url, model=self.model,
                out_dir=self.trial_dir / "kv-fill", registry=self.registry,
                generators=self.generators, time_scale=self.time_scale,
                stop_when=lambda: (watcher.peak or 0.0) >= target,
            )  # fmt: skip
        finally:
            reached = watcher.stop()
        return KvFill(
            target=target,
            reached=reached,
            seconds=time.monotonic() - began,
            requests_sent=run.run.num_records,
        )

    def warm_up(self, workload: WorkloadSpec, warm: list[ScheduledRequest]) -> None:
        """Send the workload's own warm-up requests; stopped once the last one is sent, so
        the measured window never waits for the warm-up's longest answers."""
        if not warm:
            return
        out_dir = self.trial_dir / "warmup"
        due = self._after_schedule(warm, drain_s=0.0)
        try:
            run_schedule(
                workload, sample_streams(warm, self.stream_fraction, self.stream_interval),
                base_url=self.server.base_url, model=self.model, out_dir=out_dir,
                registry=self.registry, generators=self.generators, time_scale=self.time_scale,
                stop_when=lambda: due(out_dir),
            )  # fmt: skip
        except WorkloadLoadError as exc:  # a warm-up that measured nothing still warmed
            log.warning("warm-up in %s: %s", out_dir, exc)

    def _after_schedule(
        self, schedule: list[ScheduledRequest], *, drain_s: float
    ) -> Callable[[Path], bool]:
        """True once the schedule's last send and ``drain_s`` more (emulated seconds) passed,
        and the load generator has recorded something (a slow start is waited for)."""
        last_s = max((r.send_s for r in schedule), default=0.0)
        lead_s = self.generators.startup_lead_s
        deadline = time.monotonic() + lead_s + (last_s + drain_s) * self.time_scale

        def due(out_dir: Path) -> bool:
            if time.monotonic() < deadline:
                return False
            return any(p.stat().st_size > 0 for p in out_dir.glob("records.jsonl.w*"))

        return due

    def measure(
        self,
        workload: WorkloadSpec,
        schedule: list[ScheduledRequest],
        *,
        out_dir: Path,
        stop_when: StopFactory | None = None,
        drain_s: float | None = None,
        level: LevelPlan | None = None,
        chain: LevelChain | None = None,
    ) -> LoadMeasurement:
        """One measured load run; /metrics deltas over exactly its window.

        ``chain`` (with ``level``): the level is the next segment of a rate search's
        chained run instead of a run of its own (``_measure_chained``).

        ``level``: a rate-search level sent as one schedule, warm-up then window
        (``tuner.serving.window``): the window opens once the server is steady (``WindowRule``,
        which also cuts the run a ``drain_s`` after the window and stops a clearly
        growing queue), and only the window's requests are measured; ``window.json``
        says when it opened and why.

        ``drain_s`` (emulated seconds): stop the run that long after the last send, and
        measure requests still in flight as far as they got, rather than waiting for the
        longest answer (``LoadResult.from_records(cut_short=True)``). The backlog guard
        (``tuner.serving.backlog``) judges the window and writes ``backlog.json``; ``stop_when``
        may stop the run early (``StopRule``, ``BacklogStopRule``, both with ``AnyStop``).
        """
        if chain is not None and level is not None:
            return self._measure_chained(
                workload, schedule, out_dir=out_dir, chain=chain, stop_when=stop_when,
                drain_s=drain_s or 0.0, level=level,
            )  # fmt: skip
        for stale in ("backlog-stop.json", WINDOW_FILE):  # an earlier run's
            (out_dir / stale).unlink(missing_ok=True)
        host_before = host_cpu_sample()
        before = scrape(self.server.base_url)
        watcher = KvUsageWatcher(
            self.server.base_url,
            interval_s=watch_interval_s(self.time_scale),
            csv_path=out_dir / "metrics.csv",
        ).start()
        window_rule: _BoundWindowRule | None = None
        if level is not None:
            window_rule = self._window_rule(workload, level, watcher, drain_s or 0.0).bind(out_dir)
            stop_when = AnyStop(stop_when, _Bound(window_rule))
        rule = stop_when.bind(out_dir, phase=window_rule) if stop_when is not None else None
        due = self._after_schedule(schedule, drain_s=drain_s) if drain_s is not None else None
        cut = (lambda: due(out_dir)) if due is not None else None
        fired: list[str] = []

        def stop() -> bool:
            if rule is not None and rule():
                fired.append(str(getattr(rule, "reason", "slo")))
                return True
            if cut is not None and cut():
                fired.append("cut")
                return True
            return False

        run = run_schedule(
            workload, sample_streams(schedule, self.stream_fraction, self.stream_interval),
            base_url=self.server.base_url, model=self.model, out_dir=out_dir,
            registry=self.registry, generators=self.generators, time_scale=self.time_scale,
            stop_when=stop if rule is not None or cut is not None else None,
            cut_short=cut is not None,
        )  # fmt: skip
        stopped_at = time.time()
        peak_kv = watcher.stop()
        watcher.write_csv(out_dir / "metrics.csv")
        return self._conclude(
            workload, out_dir, _Ended(
                records=list(read_records(run.run.records_path)), start_unix_s=run.run.start_at_s,
                stopped_unix_s=stopped_at, fired=tuple(fired), result=run.result,
                verdict=run.verdict, workers=run.run.workers,
                stopped_by_caller=run.run.stopped_by_caller,
                stop_text=getattr(rule, "text", None) if fired else None,
            ), before=before, watcher=watcher, peak_kv=peak_kv, window_rule=window_rule,
            host_before=host_before,
        )  # fmt: skip

    def _window_rule(
        self, workload: WorkloadSpec, level: LevelPlan, watcher: KvUsageWatcher, drain_s: float
    ) -> WindowRule:
        return WindowRule(
            level, time_scale=self.time_scale, drain_s=drain_s,
            ttft_limit_ms=loosest_ttft_ms(workload), samples=watcher.snapshot, workload=workload,
        )  # fmt: skip

    @property
    def client_rule(self) -> ClientRule:
        """The bounds on the load generator's lag and the remedies' limits."""
        return self.generators.client_rule

    def client_setup(self) -> ClientSetup:
        """How this server's load is generated now."""
        g = self.generators
        return ClientSetup(
            processes=g.processes, remote_workers=g.remote_workers, time_scale=self.time_scale
        )

    def client_remedy(self) -> ClientChange | None:
        """The next remedy for a client that lagged (``tuner.serving.client_lag.plan_remedy``):
        more local processes, else on the simulated engine a slower clock; None: no more."""
        return plan_remedy(
            self.client_rule, self.client_setup(),
            simulated=self.launch.backend is Backend.SIM, cores=os.cpu_count(),
            server_lagged=self._server_lagged,
        )  # fmt: skip

    def apply_client_change(self, change: ClientChange) -> None:
        """Generate every following load as ``change.after`` says: the processes, and on the
        simulated engine its clock (``POST /sim/time-scale``; the server keeps its state)."""
        after = change.after
        if after.time_scale != self.time_scale:
            if self.launch.backend is not Backend.SIM:
                raise WorkloadLoadError(
                    f"only the simulated engine's clock can be slowed, not {self.launch.backend.value}'s"
                )
            set_sim_time_scale(self.server.base_url, after.time_scale)
            self.time_scale = after.time_scale
        if after.processes != self.generators.processes:
            self.generators = dataclasses.replace(self.generators, processes=after.processes)
        log.info(
            "%s: more room for the level's client; from now on %s",
            self.trial_dir,
            change.describe(),
        )

    def chain(self, out_dir: Path) -> LoadChain | None:
        """A chained run for a rate search's levels on this server (``workloads.chain``), or
        None where its segments cannot reach the load generators (remote workers)."""
        if self.generators.remote_workers:
            return None
        return LoadChain(
            base_url=self.server.base_url, model=self.model, out_dir=out_dir,
            processes=self.generators.processes, spawn=locust_spawner(self.registry),
        )  # fmt: skip

    def _measure_chained(
        self,
        workload: WorkloadSpec,
        schedule: list[ScheduledRequest],
        *,
        out_dir: Path,
        chain: LevelChain,
        stop_when: StopFactory | None,
        drain_s: float,
        level: LevelPlan,
    ) -> LoadMeasurement:
        """A level as the next segment of the search's chained run: the server is not
        drained between levels, and the conversations under way carry on into it
        (``workloads.chain``). Its window is measured as ``measure``'s is, from the run's
        records whose intended send time falls in it; what is still in flight when the
        level ends is measured as far as it got (the run's snapshot), as a cut run's is."""
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in ("backlog-stop.json", WINDOW_FILE, "requests.jsonl"):  # an earlier run's
            (out_dir / stale).unlink(missing_ok=True)
        k = self.time_scale
        sent = sample_streams(
            scaled_schedule(schedule, k), self.stream_fraction, self.stream_interval
        )
        write_schedule(out_dir / "schedule.jsonl", sent)  # offsets from the level's offset 0
        host_before = host_cpu_sample()
        before = scrape(self.server.base_url)
        watcher = KvUsageWatcher(
            self.server.base_url,
            interval_s=watch_interval_s(self.time_scale),
            csv_path=out_dir / "metrics.csv",
        ).start()
        load = chain.load
        try:
            if not load.started:
                start = load.start(sent, out_dir / "schedule.jsonl")
            else:
                size = (out_dir / "schedule.jsonl").stat().st_size
                offset_s = load.offset_now_s() + SEGMENT_LEAD_S + size / SEGMENT_READ_BYTES_PER_S
                load.append(
                    out_dir / "schedule.jsonl", offset_s=offset_s,
                    keep_under_way=chain.keep_under_way, salt=out_dir.name,
                )  # fmt: skip
                start = load.start_at_s + offset_s
            window_rule = self._window_rule(workload, level, watcher, drain_s).bind(
                out_dir, records_dir=load.out_dir, start_unix_s=start
            )
            rule = AnyStop(stop_when, _Bound(window_rule)).bind(
                load.out_dir, since_unix_s=start, phase=window_rule
            )
            while not rule():
                if not load.running():
                    load.close()  # raises the run's failure
                    raise WorkloadLoadError(f"the chained load run in {load.out_dir} ended")
                time.sleep(0.1)
        except (LoadConfigError, LoadGeneratorError) as exc:
            watcher.stop()
            raise WorkloadLoadError(f"load run failed: {exc}") from exc
        except BaseException:
            watcher.stop()
            raise
        stopped_at = time.time()
        snapshot = load.snapshot()
        records = chained_records(
            window_rule.records_so_far(), snapshot, since_unix_s=start, until_unix_s=stopped_at
        )
        write_records(out_dir / "requests.jsonl", records)
        # the schedule as sent: what the level reached of it (its plan ran to its longest window)
        write_schedule(out_dir / "schedule.jsonl", reached(sent, records, stopped_at - start))
        peak_kv = watcher.stop()
        watcher.write_csv(out_dir / "metrics.csv")
        return self._conclude(
            workload, out_dir, _Ended(
                records=records, start_unix_s=start, stopped_unix_s=stopped_at,
                fired=(str(rule.reason),), workers=snapshot.workers, stopped_by_caller=True,
                stop_text=rule.text,
            ), before=before, watcher=watcher, peak_kv=peak_kv, window_rule=window_rule,
            host_before=host_before,
        )  # fmt: skip

    def _conclude(
        self,
        workload: WorkloadSpec,
        out_dir: Path,
        ended: _Ended,
        *,
        before: dict[str, float],
        watcher: KvUsageWatcher,
        peak_kv: float | None,
        window_rule: _BoundWindowRule | None,
        host_before: HostCpuSample | None = None,
    ) -> LoadMeasurement:
        """A load run's measurement: its window's records against the SLO, the backlog
        guard's verdict (``backlog.json``), /metrics deltas, whether the engine died."""
        after = scrape(self.server.base_url)
        died = self.server.engine_outcome()
        if died is not None:
            self.death = died
        start = ended.start_unix_s
        stopped_at = ended.stopped_unix_s
        k = self.time_scale
        records = ended.records
        load, verdict = ended.result, ended.verdict
        window_start, window_end = start, start + workload.duration_s * k
        opening: WindowOpening | None = None
        if window_rule is None:
            assert load is not None and verdict is not None, "a run without a level sums itself"
        else:
            opened = window_rule.final(watcher.samples, stopped_at)
            opening, records, load, verdict = in_window(
                workload, opened, records, start_unix_s=start, time_scale=k, out_dir=out_dir,
                stop_text=ended.stop_text,
            )  # fmt: skip
            window_start = start + opening.opened_at_s * k
            window_end = window_start + opening.window_s * k
        fired = ended.fired
        # Stopped by the queue's growth: the check that decided it is the level's verdict
        # (the window's few seconds after it may read steady once the load is cut).
        stopped_by = window_rule.check if window_rule is not None and "backlog" in fired else None
        backlog = backlog_verdict(
            workload, watcher.samples, records, window=(window_start, window_end),
            stopped_unix_s=stopped_at, time_scale=k, stopped_by=stopped_by, out_dir=out_dir,
        )  # fmt: skip
        server_lag = (
            sim_clock_lag(self.server.base_url, start, stopped_at)
            if self.launch.backend is Backend.SIM
            else None
        )
        lag = judge_client(
            ended.workers, self.client_rule.bounds.for_slo(workload.slo, time_scale=k), server_lag,
            host_others_share=others_share(host_before, host_cpu_sample()),
        )  # fmt: skip
        self._server_lagged = lag.server_lagged
        return LoadMeasurement(
            out_dir=str(out_dir),
            outcome=died.outcome if died is not None else TrialOutcome.READY,
            load=load,
            slo=verdict,
            window=opening,
            server=ServerCounters.between(before, after, peak_kv) if after else None,
            death=died,
            client_saturated=lag.lagged,
            client_saturation_reason=lag.reason,
            client=LevelClient(lag=lag, setup=self.client_setup()),
            stopped_early=ended.stopped_by_caller and "slo" in fired,
            backlog=backlog,
            stopped_by_backlog=ended.stopped_by_caller and "backlog" in fired,
            run_wall_s=max(0.0, stopped_at - start),
            measured_ids=tuple(r.request_id for r in records) if opening is not None else (),
        )


def set_sim_time_scale(base_url: str, time_scale: float) -> None:
    """Set a simulated server's clock (``POST /sim/time-scale``); WorkloadLoadError if it
    does not answer or refuses."""
    body = json.dumps({"time_scale": time_scale}).encode()
    request = urllib.request.Request(
        base_url.rstrip("/") + "/sim/time-scale", data=body, method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
    except (urllib.error.URLError, OSError) as exc:
        raise WorkloadLoadError(
            f"the simulated server at {base_url} did not take time scale {time_scale:g}: {exc}"
        ) from exc


def sim_clock_lag(base_url: str, since_unix_s: float, until_unix_s: float) -> ServerClockLag | None:
    """How late a simulated server's steps started over a span (``GET /sim/lag``); None
    where it does not say (an older simulator, a failed read: the level is judged by its
    client alone)."""
    url = f"{base_url.rstrip('/')}/sim/lag?since={since_unix_s!r}&until={until_unix_s!r}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return ServerClockLag.model_validate_json(response.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        log.warning("the simulated server's clock lag over the level is unknown: %s", exc)
        return None


@dataclass(frozen=True)
class _Ended:
    """How a load run of ``LiveServer.measure`` ended: its records and first summary."""

    records: list[RequestRecord]
    start_unix_s: float  # offset 0 of its schedule
    stopped_unix_s: float
    fired: tuple[str, ...]  # the stop rules that ended it ("slo", "backlog", "cut")
    workers: tuple[WorkerStats, ...]  # what each load process measured about itself
    stopped_by_caller: bool
    # The whole run summed up (None for a level: its window is, in ``_conclude``).
    result: LoadResult | None = None
    verdict: SloVerdict | None = None
    # Why the rule that fired stopped the run, where its reason is not enough (a level
    # stopped in its warm-up, before its window held a request): the level's verdict.
    stop_text: str | None = None


@dataclass
class LevelChain:
    """A rate search's chained run (``LiveServer.chain``), and how much of the population
    under way the next level keeps (``SegmentHeader.keep_under_way``: a lower rate thins
    it), which the search sets before each level."""

    load: LoadChain
    keep_under_way: float = 1.0


def chained_records(
    written: list[RequestRecord], snapshot: Snapshot, *, since_unix_s: float, until_unix_s: float
) -> list[RequestRecord]:
    """A chained run's records intended between two times: those ``written`` (intended
    from ``since_unix_s`` on), and for those still in flight the snapshot's, as far as
    they got (in intended-send order)."""
    done = {r.request_id: r for r in written if r.scheduled_s < until_unix_s}
    for record in snapshot.in_flight:
        if since_unix_s <= record.scheduled_s < until_unix_s:
            done.setdefault(record.request_id, record)
    return sorted(done.values(), key=lambda r: (r.scheduled_s, r.request_id))


def fill_schedule(
    workload: WorkloadSpec,
    warmup: WarmupSpec,
    max_model_len: int | None,
    stream_fraction: float,
    stream_interval: int = 1,
) -> tuple[WorkloadSpec, list[ScheduledRequest]]:
    """What a warm-up by KV-cache fill sends (``fill_kv_cache``): the workload without its
    own warm-up, for ``warmup.max_s``, on a seed of its own, and its schedule, every
    request a warm-up one, its streamed share sampled."""
    spec = workload.model_copy(
        update={"duration_s": warmup.max_s, "warmup": WarmupSpec(), "seed": workload.seed + 7919}
    )
    schedule = plan_schedule(spec, max_model_len=max_model_len)
    return spec, sample_streams(
        [dataclasses.replace(r, warmup=True) for r in schedule], stream_fraction, stream_interval
    )


def in_window(
    workload: WorkloadSpec,
    opening: WindowOpening,
    records: list[RequestRecord],
    *,
    start_unix_s: float,
    time_scale: float,
    out_dir: Path,
    stop_text: str | None = None,
) -> tuple[WindowOpening, list[RequestRecord], LoadResult, SloVerdict]:
    """A level's records over the window its rule opened, judged against the SLO (with
    the share of resamples of them that meet it: ``workloads.slo_bootstrap``), and the
    opening with the requests it measured (written to ``window.json``). ``stop_text``: a
    stop before the window held a request (``SloTally.text``), which is then the verdict."""
    k = time_scale
    window_start = start_unix_s + opening.opened_at_s * k
    window_end = window_start + opening.window_s * k
    kept = [r for r in records if not r.warmup and window_start <= r.scheduled_s < window_end]
    load, verdict = summarise_records(
        workload, kept, window_s=opening.window_s, time_scale=k, cut_short=True
    )
    share = hold_share(kept, workload.slo, time_scale=k, cut_short=True)
    verdict = verdict.model_copy(update={"hold_share": share})
    if stop_text is not None:
        verdict = verdict.model_copy(update={"met": False, "violations": [stop_text]})
    opening = opening.model_copy(update={"requests": load.num_requests})
    opening.write(out_dir)
    return opening, kept, load, verdict


def backlog_verdict(
    workload: WorkloadSpec,
    samples: list[MetricsSample],
    records: list[RequestRecord],
    *,
    window: tuple[float, float],
    stopped_unix_s: float,
    time_scale: float,
    stopped_by: BacklogCheck | None,
    out_dir: Path,
) -> BacklogCheck:
    """The backlog guard's verdict on a run's window (unix seconds, cut at the stop),
    written to ``backlog.json``; ``stopped_by``: the check that stopped the run for its
    queue's growth, which is the verdict then."""
    backlog = stopped_by or check_backlog(
        samples, records,
        window_start_unix_s=window[0],
        window_end_unix_s=min(window[1], stopped_unix_s),
        time_scale=time_scale, ttft_limit_ms=loosest_ttft_ms(workload),
        kv_horizon_s=lookback_s(workload),
    )  # fmt: skip
    (out_dir / BACKLOG_JSON).write_text(backlog.model_dump_json(indent=2), "utf-8")
    return backlog


def loosest_ttft_ms(workload: WorkloadSpec) -> float | None:
    """The workload's largest TTFT limit (the backlog guard's TTFT margin is a share of it)."""
    limits = [o.limit_ms for o in workload.slo.objectives() if o.metric is SloMetric.TTFT]
    return max(limits) if limits else None


class LevelPhase(Protocol):
    """What a level's early stop reads of its window (``WindowRule``'s bound check)."""

    def opened_unix_s(self) -> float | None:
        """When the level's window opened (Unix seconds); None while it warms up."""
        ...

    def queue_backing_up(self) -> bool:
        """Whether the server's waiting queue is still backing up: not drained below
        ``BACKED_UP_SHARE`` of its peak in the level so far (True where /metrics does not
        say)."""
        ...


class StopFactory(Protocol):
    """Makes the ``stop_when`` check of one load run, given the run's directory."""

    def bind(
        self, out_dir: Path, *, since_unix_s: float | None = None, phase: LevelPhase | None = None
    ) -> Callable[[], bool]:
        """The check of the run whose records are written in ``out_dir``; ``since_unix_s``:
        of its records only those intended from then on (a chained run's level);
        ``phase``: the level's window, where the run is a rate-search level."""
        ...


class StopRule:
    """When a load run may stop early: too many requests have already broken the SLO.

    Reads the run's records as they are written: once more than ``max_bad`` of the
    requests scheduled so far have missed the TTFT objective (finished late, or still
    waiting for their first token past it), the run's p99 cannot meet the SLO. A run
    that goes on past the requests ``max_bad`` was sized for (a window held on for its
    server's correlation time) is allowed ``bad_fraction`` of the requests it recorded.

    On a rate-search level (``phase``: its window) the warm-up is not judged as its window
    is. A level starts on an empty server with its conversations already under way
    (``workloads.stationary``), each arriving with a history the server's prefix cache has
    never held, so its first turn gap is a surge of long prefills that queues requests past
    the TTFT limit and then drains, at rates the server sustains. In the warm-up the rule
    therefore stops the run only while the server's queue is still backing up
    (``LevelPhase.queue_backing_up``): an overloaded server's queue keeps growing, a
    surge's drains. Once the window opens, only requests intended from its opening count,
    as only they are measured.
    """

    def __init__(
        self, ttft_limit_ms: float, *, time_scale: float, max_bad: int, bad_fraction: float = 0.0
    ) -> None:
        self.ttft_limit_s = ttft_limit_ms / 1000.0 * time_scale
        self.max_bad = max_bad
        self.bad_fraction = bad_fraction

    def bind(
        self, out_dir: Path, *, since_unix_s: float | None = None, phase: LevelPhase | None = None
    ) -> _BoundStopRule:
        return _BoundStopRule(self, out_dir, since_unix_s, phase)


# A level's queue still backing up (``_BoundWindowRule.queue_backing_up``): its last few
# /metrics readings average at least this share of its peak in the level. A start's surge
# drains to nothing within a turn gap; an overloaded server's queue stays near its peak.
BACKED_UP_SHARE = 0.5
BACKED_UP_SAMPLES = 3


class RecordTail:
    """The records a running load run has written so far (``records.jsonl.w*``), read on
    from where the last reading stopped: a rule that looks every second at a window of
    ten minutes parses each record once. A line still being written waits for the next
    reading; warm-up records are left out, and with ``since_unix_s`` those intended before
    it (a chained run's earlier levels)."""

    def __init__(self, out_dir: Path, *, since_unix_s: float | None = None) -> None:
        self.out_dir = out_dir
        self.since_unix_s = since_unix_s
        self.records: list[RequestRecord] = []
        self._offsets: dict[Path, int] = {}

    def read(self) -> list[RequestRecord]:
        """The records appended since the last reading (also kept in ``records``)."""
        new: list[RequestRecord] = []
        for path in sorted(self.out_dir.glob("records.jsonl.w*")):
            start = self._offsets.get(path, 0)
            try:
                with path.open("rb") as f:
                    f.seek(start)
                    chunk = f.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n") + 1  # whole lines only
            self._offsets[path] = start + end
            for line in chunk[:end].decode("utf-8", errors="replace").splitlines():
                try:
                    record = RequestRecord.from_json(line)
                except (ValueError, TypeError):
                    continue  # a damaged line
                if not record.warmup and (
                    self.since_unix_s is None or record.scheduled_s >= self.since_unix_s
                ):
                    new.append(record)
        self.records.extend(new)
        return new


class SloTally:
    """``StopRule``'s count of a run's requests that missed the TTFT objective, as they are
    read (``_BoundStopRule`` on a live run, the twin's replay of it on the virtual clock).
    Times are the caller's own (Unix seconds live, emulated seconds in the replay): a
    request counts from the window's opening on once the level's window opened
    (``window_opened``); before it, the rule fires only while the queue backs up
    (``fires``; ``StopRule``'s docstring says why)."""

    def __init__(self, rule: StopRule) -> None:
        self.rule = rule
        self.bad = 0
        self.seen = 0
        self.from_s: float | None = None  # the window's opening, once it opened
        self.in_warmup = False  # it fired before the level's window opened
        self._tallied: list[tuple[float, bool]] = []  # (intended at, late), every request

    def add(self, at_s: float, *, late: bool) -> None:
        self._tallied.append((at_s, late))
        if self.from_s is None or at_s >= self.from_s:
            self.seen += 1
            self.bad += late

    def window_opened(self, at_s: float) -> None:
        """From now on only requests intended from ``at_s`` on count."""
        if self.from_s is not None:
            return
        self.from_s = at_s
        kept = [late for t, late in self._tallied if t >= at_s]
        self.seen, self.bad = len(kept), sum(kept)

    def fires(self, *, warming_up: bool, backing_up: Callable[[], bool]) -> bool:
        """Whether the run stops: more late than twice its allowance, and in a level's
        warm-up (``warming_up``) only while its queue backs up (``backing_up``)."""
        rule = self.rule
        if self.bad <= max(rule.max_bad, math.ceil(rule.bad_fraction * self.seen) + 2):
            return False
        if warming_up:
            self.in_warmup = backing_up()  # else a start's surge, draining
            return self.in_warmup
        return True

    @property
    def text(self) -> str | None:
        """The verdict of a level it stopped in its warm-up (its window held nothing)."""
        if not self.in_warmup:
            return None
        return (
            f"stopped in its warm-up: {self.bad} of {self.seen} requests missed the TTFT limit "
            f"and the server's queue was still backing up"
        )


def queue_backing_up(samples: Sequence[MetricsSample], *, since_unix_s: float | None) -> bool:
    """Whether the server's waiting queue is still backing up: its last
    ``BACKED_UP_SAMPLES`` readings from ``since_unix_s`` on average more than nothing and at
    least ``BACKED_UP_SHARE`` of its peak since then (True where /metrics gives no queue:
    an early stop then stands as it would without this test)."""
    queue = [
        s.waiting
        for s in samples
        if s.waiting is not None and (since_unix_s is None or s.unix_s >= since_unix_s)
    ]
    if not queue:
        return True
    recent = queue[-BACKED_UP_SAMPLES:]
    now = sum(recent) / len(recent)
    return now > 0.0 and now >= BACKED_UP_SHARE * max(queue)


class _BoundStopRule:
    reason = "slo"

    def __init__(
        self, rule: StopRule, out_dir: Path, since_unix_s: float | None = None,
        phase: LevelPhase | None = None,
    ) -> None:  # fmt: skip
        self.rule = rule
        self.phase = phase
        self.tail = RecordTail(out_dir, since_unix_s=since_unix_s)
        self.tally = SloTally(rule)
        self._last_check = 0.0

    @property
    def in_warmup(self) -> bool:
        return self.tally.in_warmup

    @property
    def text(self) -> str | None:
        return self.tally.text

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self._last_check < 1.0:
            return False
        self._last_check = now
        phase, tally = self.phase, self.tally
        opened = phase.opened_unix_s() if phase is not None else None
        if opened is not None:
            tally.window_opened(opened)
        limit_s = self.rule.ttft_limit_s
        for r in self.tail.read():
            late = (
                not r.ok if r.first_token_s is None else r.first_token_s - r.scheduled_s > limit_s
            )
            tally.add(r.scheduled_s, late=late)
        return tally.fires(
            warming_up=phase is not None and opened is None,
            backing_up=phase.queue_backing_up if phase is not None else lambda: True,
        )


def growing_backlog(
    out_dir: Path, samples: list[MetricsSample], *, window_start_unix_s: float,
    now_unix_s: float, window_s: float, time_scale: float, ttft_limit_ms: float | None,
) -> BacklogCheck | None:  # fmt: skip
    """The guard's check of a window so far when its queue clearly grows (then also left
    in ``backlog-stop.json``), else None: the early stop of ``BacklogStopRule`` and
    ``WindowRule``."""
    check = check_backlog(
        samples, (), window_start_unix_s=window_start_unix_s, window_end_unix_s=now_unix_s,
        time_scale=time_scale, ttft_limit_ms=ttft_limit_ms,
    )  # fmt: skip
    elapsed_s = (now_unix_s - window_start_unix_s) / time_scale
    if not clearly_growing(check, elapsed_s=elapsed_s, window_s=window_s):
        return None
    (out_dir / "backlog-stop.json").write_text(check.model_dump_json(indent=2), "utf-8")
    return check


class BacklogStopRule:
    """When a level may stop early: its queue clearly grows (``tuner.serving.backlog.clearly_growing``,
    after a third of its ``window_s``, emulated seconds).

    Reads the run's directory as it is written, like ``StopRule``: the /metrics timeline
    (``metrics.csv``, appended by the watcher) and, to place offset 0 of the schedule in
    time, the schedule and the first record. When it fires it leaves the check that
    decided in ``backlog-stop.json``.
    """

    def __init__(self, window_s: float, *, time_scale: float, ttft_limit_ms: float | None) -> None:
        self.window_s = window_s
        self.time_scale = time_scale
        self.ttft_limit_ms = ttft_limit_ms

    def bind(
        self, out_dir: Path, *, since_unix_s: float | None = None, phase: LevelPhase | None = None
    ) -> _BoundBacklogStop:
        bound = _BoundBacklogStop(self, out_dir)
        bound.start_unix_s = since_unix_s
        return bound


class _BoundBacklogStop:
    reason = "backlog"

    def __init__(self, rule: BacklogStopRule, out_dir: Path) -> None:
        self.rule = rule
        self.out_dir = out_dir
        self.start_unix_s: float | None = None
        self.check: BacklogCheck | None = None
        self._offsets: dict[str, float] | None = None  # the schedule's, by request id
        self._last_check = 0.0

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self._last_check < 1.0:
            return False
        self._last_check = now
        start = self.start_unix_s = self.start_unix_s or self._schedule_start()
        if start is None:
            return False
        unix_now = time.time()
        elapsed_s = (unix_now - start) / self.rule.time_scale
        if elapsed_s < self.rule.window_s / 3.0:
            return False
        try:
            samples = read_metrics_csv(self.out_dir / "metrics.csv")
        except (OSError, ValueError, KeyError, TypeError):
            return False  # not written yet, or a row being written
        self.check = growing_backlog(
            self.out_dir, samples, window_start_unix_s=start, now_unix_s=unix_now,
            window_s=self.rule.window_s, time_scale=self.rule.time_scale,
            ttft_limit_ms=self.rule.ttft_limit_ms,
        )  # fmt: skip
        return self.check is not None

    def _schedule_start(self) -> float | None:
        """Unix time of the schedule's offset 0 (see ``schedule_start_unix``)."""
        if self._offsets is None:
            self._offsets = open_loop_offsets(self.out_dir)
        return None if self._offsets is None else schedule_start_unix(self.out_dir, self._offsets)


def schedule_start_unix(out_dir: Path, offsets: dict[str, float]) -> float | None:
    """Unix time of a run's offset 0: a record's intended send time less its offset
    (``offsets``: the schedule's open-loop requests, by request id; a later turn's
    intended time follows its answer, not its plan)."""
    for path in sorted(out_dir.glob("records.jsonl.w*")):
        try:
            with path.open(encoding="utf-8") as fh:
                for line, _ in zip(fh, range(64), strict=False):
                    record = RequestRecord.from_json(line)
                    if record.request_id in offsets:
                        return record.scheduled_s - offsets[record.request_id]
        except (OSError, ValueError, TypeError):
            continue  # nothing recorded yet, or a line still being written
    return None


def open_loop_offsets(out_dir: Path) -> dict[str, float] | None:
    """The schedule's open-loop send offsets by request id (None: not written yet)."""
    try:  # written whole before the load generator starts
        schedule = read_schedule(out_dir / "schedule.jsonl")
    except (OSError, ValueError, TypeError):
        return None
    return {r.request_id: r.send_s for r in schedule if r.follows is None}


class WindowRule:
    """A rate-search level's window (``tuner.serving.window``): opens it once the server is steady
    (or the longest warm-up is spent) and writes ``window.json``; closes it once it is long
    enough (``window_closes``: the server state's correlation times, and with ``workload``
    the SLO's verdict over the requests of the window so far whose answers are due, read
    from the run's records every ``VERDICT_EVERY_S``); stops the run when the
    queue clearly grows through the window (``tuner.serving.backlog.clearly_growing``, reason
    ``backlog``, leaving ``backlog-stop.json``), else a ``drain_s`` after the window
    closes (reason ``cut``). ``samples``: the /metrics timeline so far."""

    def __init__(
        self, plan: LevelPlan, *, time_scale: float, drain_s: float,
        ttft_limit_ms: float | None, samples: Callable[[], list[MetricsSample]],
        workload: WorkloadSpec | None = None,
    ) -> None:  # fmt: skip
        self.plan = plan
        self.time_scale = time_scale
        self.drain_s = drain_s
        self.ttft_limit_ms = ttft_limit_ms
        self.samples = samples
        self.workload = workload  # its SLO's verdict over the window so far holds it on

    def bind(
        self, out_dir: Path, *, records_dir: Path | None = None, start_unix_s: float | None = None
    ) -> _BoundWindowRule:
        """``records_dir``: where the run's records are written (a chained run's folder;
        default ``out_dir``); ``start_unix_s``: the level's offset 0 when it is known
        (a chained level), else read from the schedule and the first records."""
        return _BoundWindowRule(self, out_dir, records_dir=records_dir, start_unix_s=start_unix_s)


class _BoundWindowRule:
    def __init__(
        self, rule: WindowRule, out_dir: Path, *, records_dir: Path | None = None,
        start_unix_s: float | None = None,
    ) -> None:  # fmt: skip
        self.rule = rule
        self.out_dir = out_dir
        self.reason = "cut"
        self.start_unix_s: float | None = start_unix_s
        self.opening: WindowOpening | None = None
        self.check: BacklogCheck | None = None  # the check that stopped the level, if one did
        self._offsets: dict[str, float] | None = None
        self._last_check = 0.0
        self._shares: list[float] | None = None
        self._last_verdict = 0.0
        self._tail = RecordTail(records_dir or out_dir, since_unix_s=start_unix_s)

    def _window_shares(self, opened_unix_s: float, now_unix_s: float) -> list[float] | None:
        """The SLO percentiles of the window so far, as shares of their limits: the
        requests sent in it at least a drain ago (their answers are due, or late);
        refreshed every ``VERDICT_EVERY_S`` of wall time (None: no workload to judge by, or
        a fixed window, which closes at its length whatever the verdict)."""
        rule = self.rule
        if rule.workload is None or rule.plan.window_max_s is None:
            return None
        now = time.monotonic()
        if self._shares is not None and now - self._last_verdict < VERDICT_EVERY_S:
            return self._shares
        self._last_verdict = now
        k = rule.time_scale
        due_unix = now_unix_s - rule.drain_s * k
        self._tail.read()
        records = [r for r in self._tail.records if opened_unix_s <= r.scheduled_s < due_unix]
        if not records:
            self._shares = []
            return self._shares
        span_s = max((due_unix - opened_unix_s) / k, 1e-3)
        load, _ = summarise_records(
            rule.workload, records, window_s=span_s, time_scale=k, cut_short=True
        )
        self._shares = percentile_shares(rule.workload, load)
        return self._shares

    def opened_unix_s(self) -> float | None:
        """When the window opened (Unix seconds); None while the level warms up."""
        if self.opening is None or self.start_unix_s is None:
            return None
        return self.start_unix_s + self.opening.opened_at_s * self.rule.time_scale

    def queue_backing_up(self) -> bool:
        """Whether the server's waiting queue is still backing up in this level
        (``queue_backing_up`` since the level began)."""
        return queue_backing_up(self.rule.samples(), since_unix_s=self.start_unix_s)

    def records_so_far(self) -> list[RequestRecord]:
        """Every record of the run written so far that this level's window could hold
        (intended from its offset 0 on, the warm-up's left out), read on from the last
        reading."""
        self._tail.read()
        return self._tail.records

    def final(self, samples: list[MetricsSample], stopped_unix_s: float) -> WindowOpening:
        """The window as the run left it: closed, or (stopped before it closed) as long as
        it had lasted when the run stopped, at least its shortest."""
        opening = self.opening or self.open_now(samples, final=True)
        if opening.closed is not None:
            return opening
        k = self.rule.time_scale
        start = self.start_unix_s or (samples[0].unix_s if samples else stopped_unix_s)
        opened_unix = start + opening.opened_at_s * k
        lasted_s = min(
            max(0.0, (stopped_unix_s - opened_unix) / k), self.rule.plan.longest_window_s
        )
        tau = state_correlation_s(
            samples, start_unix_s=opened_unix, now_unix_s=stopped_unix_s, time_scale=k
        )
        return opening.closed_at(max(opening.window_s, lasted_s), WindowClose.STOPPED, tau)

    def open_now(self, samples: list[MetricsSample], *, final: bool = False) -> WindowOpening:
        """The opening from the samples so far; ``final``: the run is over without the
        window having opened (stopped early): it opens where the test would have said."""
        plan = self.rule.plan
        start = self.start_unix_s or (samples[0].unix_s if samples else time.time())
        k = self.rule.time_scale
        for sample in samples if final else samples[-1:]:
            opening = steady_opening(
                plan, samples, start_unix_s=start, now_unix_s=sample.unix_s, time_scale=k
            )
            if opening is not None:
                return opening
        last = samples[-1].unix_s if samples else start
        return WindowOpening(
            warmup_min_s=plan.warmup_min_s, warmup_max_s=plan.warmup_max_s,
            opened_at_s=min(plan.warmup_max_s, max(0.0, (last - start) / k)),
            steady_at_open=False, test=plan.test(), window_s=plan.window_s,
            needed_requests=plan.needed_requests, window_max_s=plan.window_max_s,
            correlation_floor_s=plan.correlation_floor_s, carried_on=plan.carried_on,
            trace_pass_s=plan.trace_pass_s,
        )  # fmt: skip

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self._last_check < 0.5:
            return False
        self._last_check = now
        if self.start_unix_s is None:
            if self._offsets is None:
                self._offsets = open_loop_offsets(self.out_dir)
            if self._offsets is None:
                return False
            self.start_unix_s = schedule_start_unix(self.out_dir, self._offsets)
            if self.start_unix_s is None:
                return False
        rule, start, k = self.rule, self.start_unix_s, self.rule.time_scale
        unix_now = time.time()
        samples = rule.samples()
        if self.opening is None:
            if not samples:
                return False
            opening = steady_opening(
                rule.plan, samples, start_unix_s=start, now_unix_s=unix_now, time_scale=k
            )
            if opening is None:
                return False
            self.opening = opening
            opening.write(self.out_dir)
        opened_unix = start + self.opening.opened_at_s * k
        elapsed_s = (unix_now - opened_unix) / k
        if self.opening.closed is None and elapsed_s >= self.opening.window_s:
            closing = window_closes(
                rule.plan, self.opening, samples, opened_unix_s=opened_unix,
                now_unix_s=unix_now, time_scale=k,
                shares=self._window_shares(opened_unix, unix_now),
            )  # fmt: skip
            if closing is not None:
                self.opening = closing
                closing.write(self.out_dir)
        if self.opening.closed is not None and elapsed_s >= self.opening.window_s + rule.drain_s:
            self.reason = "cut"
            return True
        self.check = growing_backlog(
            self.out_dir, samples, window_start_unix_s=opened_unix, now_unix_s=unix_now,
            window_s=rule.plan.window_s, time_scale=k, ttft_limit_ms=rule.ttft_limit_ms,
        )  # fmt: skip
        if self.check is not None:
            self.reason = "backlog"
            return True
        return False


class _Bound:
    """A check already bound to its directory, as a StopFactory (for AnyStop)."""

    def __init__(self, check: Callable[[], bool]) -> None:
        self.check = check

    def bind(
        self, out_dir: Path, *, since_unix_s: float | None = None, phase: LevelPhase | None = None
    ) -> Callable[[], bool]:
        return self.check


class AnyStop:
    """Several stop rules as one: a run stops once any of them fires (None entries are
    left out); the bound check's ``reason`` names the rule that fired."""

    def __init__(self, *rules: StopFactory | None) -> None:
        self.rules = [r for r in rules if r is not None]

    def bind(
        self, out_dir: Path, *, since_unix_s: float | None = None, phase: LevelPhase | None = None
    ) -> _BoundAnyStop:
        return _BoundAnyStop(
            [r.bind(out_dir, since_unix_s=since_unix_s, phase=phase) for r in self.rules]
        )


class _BoundAnyStop:
    def __init__(self, checks: list[Callable[[], bool]]) -> None:
        self.checks = checks
        self.reason: str | None = None
        self.text: str | None = None  # the fired check's own account, where it gives one

    def __call__(self) -> bool:
        for check in self.checks:
            if check():
                self.reason = str(getattr(check, "reason", "slo"))
                self.text = getattr(check, "text", None)
                return True
        return False


def run_trial(
    launch: LaunchSpec,
    workload: WorkloadSpec,
    *,
    trial_dir: Path,
    registry: ChildRegistry,
    gpu_source: str = "auto",
    gpu_sample_interval_s: float = 0.1,
    model_dir: Path | None = None,
    generators: LoadGenerators = LOCAL_LOAD,
) -> TrialResult:
    """Run one trial; a server that fails to start or dies is an outcome, not an exception."""
    schedule = plan_schedule(
        workload, max_model_len=launch.params.max_model_len, model_dir=model_dir
    )
    warm, measured = split_warmup(schedule)
    fields: dict[str, object] = {"trial_dir": str(trial_dir), "settings": settings_of(launch)}
    live = LiveServer(
        launch, trial_dir=trial_dir, registry=registry, gpu_source=gpu_source,
        gpu_sample_interval_s=gpu_sample_interval_s, generators=generators,
    )  # fmt: skip
    with live:
        assert live.startup is not None
        fields["startup"] = live.startup
        fields["outcome"] = live.startup.outcome
        if live.ready:
            fields["kv_fill"] = live.fill_kv_cache(workload, workload.warmup)
            live.warm_up(workload, warm)
            m = live.measure(workload, measured, out_dir=trial_dir / "load")
            fields.update(
                outcome=m.outcome, death=m.death, load=m.load, slo=m.slo, server=m.server,
                client_saturated=m.client_saturated,
                client_saturation_reason=m.client_saturation_reason, backlog=m.backlog,
            )  # fmt: skip
    fields["gpu"] = live.gpu
    result = TrialResult.model_validate(fields)
    (trial_dir / "result.json").write_text(result.model_dump_json(indent=2), encoding="utf-8")
    return result

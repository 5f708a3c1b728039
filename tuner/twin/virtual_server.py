"""The simulated engine as a tune's server, on the twin's virtual clock: no process, no socket, no Locust.

``VirtualServer`` stands in for ``tuner.serving.live_server.LiveServer`` wherever a tune
launches a server (a trial, an edge probe, a confirmation: ``TrialServer``, made by
``tuner.search.evaluate.live_server`` through ``run_tune(server_factory=)``), as httpx's
``MockTransport`` stands in for a network: the same decisions are taken on the same
evidence, in a fraction of a second per level instead of its wall-clock length. The
command line never uses it; tests of the tune's decisions do (``tests/virtual.py``).

What is the same as the simulated backend (``tuner sim-serve`` behind ``LiveServer``):

* the startup: the command ``ServerProcess`` would run, its flags parsed by ``sim-serve``'s
  own parser and started by its own code (``tuner.sim.serve_cli.start_offline``: the
  memory model, the release's startup lines and failure messages, the compile cache in the
  run's ``vllm-cache``) into ``server.log``, read back by ``tuner.vllm.log`` and
  ``tuner.vllm.classify`` into the same ``StartupResult``;
* a load run: the schedule as sent (``sample_streams``, ``schedule.jsonl``) on the engine
  sim-serve would build (``tuner.sim.build.build_engine``), later turns at their answers'
  times (``tuner.sim.simulate.run``'s ``follows``), turned into the load generator's
  ``RequestRecord`` (``requests.jsonl``: cut-off requests ``ABORTED`` as far as they got),
  /metrics samples as often as the live watcher's (``watch_interval_s``, ``metrics.csv``)
  and the server's counters;
* the rules that end a run, replayed on the virtual clock at the live rules' own check
  intervals with their own functions: a level's window (``steady_opening``,
  ``window_closes``, ``tuner.serving.live_server.growing_backlog``'s ``clearly_growing``), the SLO
  stop (``StopRule``), an edge probe's hold (``WorstCaseHold``: ``kv_peaked``, its cap);
  then the window's records against the SLO (``summarise_records``), the backlog guard
  (``check_backlog``, ``backlog.json``) and ``window.json``, as ``LiveServer`` concludes.

What differs, and is said where it is recorded (``MEASURED_ON`` in the tune's notes, the
startup's ``note``, ``server.log``'s first line, the GPU summary's ``note``):

* every load run (KV fill, warm-up, level, probe) starts on a fresh engine: a level is its
  own run (``chain`` is None), and no prefix cache or queue carries over from the run before;
* no wall time passes: launches, levels and stops take what the CPU takes (the tune's time
  budget sees that), and Unix times in the records are a virtual clock that starts at the
  server's entry and moves on by each run's virtual length (times ``time_scale``);
* the GPU timeline is the simulated engine's memory model, as sim-serve's ``/sim/gpu``
  reports it, one reading at the start and at the end of each run (utilization and power
  not reported); no device memory is watched for release;
* a stop rule of another kind than those above is not applied.
"""

from __future__ import annotations

import bisect
import csv
import dataclasses
import functools
import logging
import math
import os
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import overload

from tuner.errors import ConfigError
from tuner.serving.backlog import BacklogCheck, check_backlog, clearly_growing
from tuner.serving.eviction_scrape import (
    EvictionEvidence,
    LostHistoryCounts,
    ResidencyHistogram,
)
from tuner.serving.gpu_sampler import (
    NOT_SAMPLED_NOTE,
    TIMELINE_COLUMNS,
    GpuSample,
    GpuSourceKind,
    GpuSummary,
    summarize,
)
from tuner.serving.live_server import (
    VERDICT_EVERY_S,
    AnyStop,
    KvFill,
    LevelChain,
    LoadMeasurement,
    SloTally,
    StopFactory,
    StopRule,
    WindowRule,
    backlog_verdict,
    fill_schedule,
    in_window,
    loosest_ttft_ms,
    queue_backing_up,
    watch_interval_s,
)
from tuner.serving.load import (
    LOCAL_LOAD,
    LoadGenerators,
    percentile_shares,
    scaled_schedule,
    summarise_records,
)
from tuner.serving.processes import ChildRegistry
from tuner.serving.prometheus_scrape import MetricsSample, ServerCounters
from tuner.serving.server import (
    CACHE_ROOT_ENV,
    Backend,
    LaunchSpec,
    ServerProcess,
    StartupResult,
    TrialOutcome,
    server_cache_root,
)
from tuner.serving.window import (
    WINDOW_FILE,
    LevelPlan,
    WindowOpening,
    steady_opening,
    window_closes,
)
from tuner.serving.worst_case_hold import (
    HOLD_CHECK_EVERY_S,
    BoundHold,
    HoldEnd,
    WorstCaseHold,
    kv_peaked,
)
from tuner.sim.api import process_used_bytes
from tuner.sim.build import build_engine
from tuner.sim.serve_cli import OfflineStart, start_offline
from tuner.sim.serve_log import VllmLog, log_engine_dead
from tuner.sim.simulate import (
    EngineSample,
    FailureReason,
    RequestOutcome,
    SimulationResult,
    run,
)
from tuner.sim.tokenizer import ChatEncoder, encode
from tuner.vllm.classify import classify_failure, engine_death_failure, log_excerpt
from tuner.vllm.failures import StartupFailure
from tuner.vllm.kv_cache_metrics import IDLE_BEFORE_EVICT_METRIC, LIFETIME_METRIC, REUSE_GAP_METRIC
from tuner.vllm.log import parse_startup_log
from tuner.vllm.versions import VllmVersion
from workloads.chain import LoadChain
from workloads.load_errors import ABORTED
from workloads.schedule import (
    RequestRecord,
    ScheduledRequest,
    sample_streams,
    write_records,
    write_schedule,
)
from workloads.slo import Slo
from workloads.spec import WarmupSpec, WorkloadSpec
from workloads.traces import TraceRecord

log = logging.getLogger(__name__)

MEASURED_ON = (
    "the twin's virtual clock (tuner.twin.virtual_server): the simulated engine in this "
    "process, no server launched, no load generator run"
)
NOT_LAUNCHED = "not launched: " + MEASURED_ON
GPU_NOTE = (
    "the simulated engine's memory model on the twin's virtual clock (no server was "
    "launched; utilization and power not reported)"
)
WINDOW_CHECK_S = 0.5  # how often the live window rule looks (wall seconds)
STOP_CHECK_S = 1.0  # how often the live SLO stop rule looks (wall seconds)
WORKER = "virtual"  # the records' load-generator process
RUN_GAP_S = 1.0  # virtual-clock seconds between one run's stop and the next one's start


@dataclass
class NoProcess:
    """What a stop saw of the device memory: nothing to watch (``ReleaseWatch``)."""

    memory_released: bool | None = None
    baseline_used_bytes: dict[int, int] = field(default_factory=dict)


@dataclass
class _Ended:
    """Where the live rules would have stopped a run, and what they left."""

    stop_s: float  # virtual seconds from the run's offset 0
    fired: tuple[str, ...] = ()  # "slo", "backlog", "cut", "hold"
    opening: WindowOpening | None = None  # a level's window, when it opened before the stop
    backlog: BacklogCheck | None = None  # the check that stopped a level for its queue
    text: str | None = None  # a level stopped in its warm-up: its verdict (``SloTally.text``)


class VirtualServer:
    """The simulated engine of one launch on the twin's virtual clock (a ``TrialServer``;
    the module's docstring says what is the same as ``LiveServer`` and what differs)."""

    MEASURED_ON = MEASURED_ON  # what run_tune writes in the run's notes

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
        if launch.backend is not Backend.SIM:
            raise ConfigError(
                f"the twin's virtual clock serves the simulated engine only, not {launch.backend.value!r}"
            )
        self.launch = launch
        self.trial_dir = trial_dir
        self.registry = registry  # nothing is spawned: kept for the signature
        self.generators = generators
        self.stream_fraction = stream_fraction
        # the twin's streams carry every token: a chunked stream saves the load generator's
        # events, which the virtual clock does not spend
        self.stream_interval = stream_interval
        self.time_scale = launch.sim_time_scale
        # its levels take no wall time of their own: no deadline cuts their windows
        # (``tuner.search.rate_search``'s ``held_until``)
        self.virtual_clock = True
        self.source_kind = GpuSourceKind.requested(gpu_source, simulated=True)
        self.server = NoProcess()
        self.startup: StartupResult | None = None
        self.gpu: GpuSummary | None = None
        self.death: StartupResult | None = None
        self.log_path = trial_dir / "server.log"
        self._offline: OfflineStart | None = None
        self._chats: ChatEncoder | None = None
        self._epoch_unix_s = 0.0
        self._clock_unix_s = 0.0  # the virtual clock: Unix seconds of the next run's start
        self._gpu_rows: list[GpuSample] = []
        trial_dir.mkdir(parents=True, exist_ok=True)

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

    # -- launch and stop ----------------------------------------------------------------------

    def __enter__(self) -> VirtualServer:
        self._epoch_unix_s = self._clock_unix_s = time.time()
        # The command ServerProcess would run (flags adapted to the emulated release); the
        # port is never bound.
        process = ServerProcess(
            dataclasses.replace(self.launch, port=self.launch.port or 8000),
            registry=self.registry, log_path=self.log_path,
        )  # fmt: skip
        command = process.command
        sim_argv = command[command.index("sim-serve") + 1 :]
        cache_root = server_cache_root(self.launch.cache_dir, dict(self.launch.env))
        environ = dict(os.environ)
        if cache_root is not None:
            cache_root.mkdir(parents=True, exist_ok=True)
            environ[CACHE_ROOT_ENV] = str(cache_root)
        version = (
            VllmVersion.parse(self.launch.vllm_version)
            if self.launch.vllm_version
            else VllmVersion.current()
        )
        with self.log_path.open("w", encoding="utf-8") as out:
            out.write(
                f"# tuner: {NOT_LAUNCHED}; the command it stands for: {shlex.join(command)}\n"
            )
            out.flush()
            self._offline = start_offline(sim_argv, VllmLog(version, out=out, err=out), environ)
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        dropped = [f"{d.flag}: {d.reason}" for d in process.dropped]
        code = self._offline.exit_code
        failure: StartupFailure | None = None
        if code is None:
            outcome = TrialOutcome.READY
        else:
            failure = classify_failure(text)
            outcome = TrialOutcome.of_failure(failure) if failure else TrialOutcome.CRASHED
        around = failure.message[:40] if failure else None
        self.startup = StartupResult(
            outcome=outcome, failure=failure,
            report=parse_startup_log(text) if code is None else None,
            ready_s=0.0 if code is None else None, exit_code=code, log_path=str(self.log_path),
            log_excerpt=log_excerpt(text, around=around), command=command,
            dropped_flags=dropped, base_url=f"virtual://{self.launch.name}", note=NOT_LAUNCHED,
        )  # fmt: skip
        if self.ready:
            self._gpu_reading()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.startup is None or self.startup.outcome is not TrialOutcome.READY:
            return  # as LiveServer: no timeline before the server was ready
        self._gpu_reading()
        self.gpu = self._write_gpu_timeline()
        with self.log_path.open("a", encoding="utf-8") as out:
            out.write(f"# tuner: stopped ({MEASURED_ON})\n")

    def chain(self, out_dir: Path) -> LoadChain | None:
        """None: each level is a load run of its own (``search_rate`` then never chains)."""
        return None

    # -- the GPU timeline ---------------------------------------------------------------------

    def _gpu_reading(self) -> None:
        offline = self._offline
        if offline is None or offline.plan is None or offline.launch is None:
            return
        total = offline.launch.gpu.nvml_total_bytes
        used = process_used_bytes(offline.plan)
        self._gpu_rows.append(
            GpuSample(
                t_s=self._clock_unix_s - self._epoch_unix_s, device_index=0, total_bytes=total,
                used_bytes=used, free_bytes=max(total - used, 0),
                utilization_percent=math.nan, power_watts=math.nan, temperature_c=None,
                process_used_bytes=used,
            )
        )  # fmt: skip

    def _write_gpu_timeline(self) -> GpuSummary:
        if self.source_kind is GpuSourceKind.NONE:
            return GpuSummary(source=GpuSourceKind.NONE.value, samples=0, note=NOT_SAMPLED_NOTE)
        if self.source_kind is not GpuSourceKind.SIM:
            return GpuSummary(source=self.source_kind.value, samples=0, note=GPU_NOTE)
        path = self.trial_dir / "gpu.csv"
        with path.open("w", encoding="utf-8", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(TIMELINE_COLUMNS)
            for s in self._gpu_rows:
                writer.writerow([getattr(s, name) for name in TIMELINE_COLUMNS])
        if self._gpu_rows:  # the report places gpu.csv by its modification time
            last = self._epoch_unix_s + self._gpu_rows[-1].t_s
            os.utime(path, (last, last))
        summary = summarize(self._gpu_rows, source=GpuSourceKind.SIM.value)
        return summary.model_copy(update={"note": GPU_NOTE})

    # -- runs on the virtual clock ------------------------------------------------------------

    def _simulate(
        self, schedule: Sequence[ScheduledRequest], stop_at_s: float | None
    ) -> SimulationResult:
        """The schedule on a fresh engine of these settings (virtual seconds)."""
        offline = self._offline
        assert offline is not None and offline.launch is not None, "not started"
        sim = offline.launch
        plan, engine = build_engine(
            sim.model, sim.gpu, sim.params, sim.version, sim.options, sim.step_costs
        )
        assert engine is not None, "a server that started has an engine"
        vocab = sim.model.vocab_size
        if self._chats is None:
            self._chats = ChatEncoder(vocab)
        chats = self._chats
        records = [
            TraceRecord(
                arrival_s=r.send_s, prompt_tokens=r.prompt_tokens, output_tokens=r.max_tokens
            )
            for r in schedule
        ]
        ids = _PromptIds(schedule, chats, vocab)
        index = {r.request_id: i for i, r in enumerate(schedule)}
        follows = [index.get(r.follows) if r.follows is not None else None for r in schedule]
        return run(
            engine, records, slo=Slo(), vocab=vocab, max_model_len=plan.max_model_len,
            prompt_token_ids=ids, stop_at_s=stop_at_s,
            follows=follows if any(f is not None for f in follows) else None,
            think_s=[r.think_time_s for r in schedule],
            sample_every_s=watch_interval_s(self.time_scale) / self.time_scale, keep_requests=True,
        )  # fmt: skip

    def _samples(
        self, result: SimulationResult, start_unix_s: float, stop_s: float
    ) -> list[MetricsSample]:
        k = self.time_scale
        return [
            MetricsSample(
                unix_s=start_unix_s + s.t_s * k, kv_cache_usage=s.kv_usage,
                running=float(s.running), waiting=float(s.waiting),
                preemptions_total=float(s.preemptions_total),
            )
            for s in result.samples
            if s.t_s <= stop_s
        ]  # fmt: skip

    def _records(
        self,
        schedule: Sequence[ScheduledRequest],
        result: SimulationResult,
        start_unix_s: float,
        stop_s: float,
        *,
        cut: bool,
    ) -> list[RequestRecord]:
        """The load generator's records of the requests sent before ``stop_s``: answered,
        failed, or (``cut``: the run was stopped) cut off in flight as far as they got."""
        k = self.time_scale
        out: list[RequestRecord] = []
        for o in result.requests:
            if o.arrival_s >= stop_s:
                continue  # not sent before the stop
            r = schedule[o.index]
            at = start_unix_s + o.arrival_s * k
            answer = start_unix_s + (o.arrival_s - r.think_time_s) * k if r.follows else None
            common = dict(
                request_id=r.request_id, scheduled_s=at, sent_s=at, prompt_tokens=o.prompt_tokens,
                warmup=r.warmup, worker=WORKER, streamed=r.stream, answer_s=answer,
            )  # fmt: skip
            times = [start_unix_s + t * k for t in o.token_times_s if t <= stop_s]
            shown = times if r.stream else []
            if o.failure is not None:
                out.append(
                    RequestRecord(
                        **common, output_tokens=0, status=o.http_status or 0,  # type: ignore[arg-type]
                        end_s=at, error=o.message,
                    )
                )  # fmt: skip
            elif o.finish_s is not None and o.finish_s <= stop_s:
                out.append(
                    RequestRecord(
                        **common, output_tokens=o.output_tokens, status=200,  # type: ignore[arg-type]
                        first_token_s=shown[0] if shown else None,
                        end_s=start_unix_s + o.finish_s * k, token_times_s=shown,
                    )
                )  # fmt: skip
            elif cut:
                out.append(
                    RequestRecord(
                        **common, output_tokens=len(times), status=200,  # type: ignore[arg-type]
                        first_token_s=shown[0] if shown else None,
                        end_s=start_unix_s + stop_s * k, token_times_s=shown, error=ABORTED,
                    )
                )  # fmt: skip
        return sorted(out, key=lambda rec: (rec.scheduled_s, rec.request_id))

    def _advance(self, start_unix_s: float, stop_s: float) -> None:
        self._clock_unix_s = start_unix_s + stop_s * self.time_scale + RUN_GAP_S

    def fill_kv_cache(self, workload: WorkloadSpec, warmup: WarmupSpec) -> KvFill | None:
        """``LiveServer.fill_kv_cache`` on the virtual clock: the fill's schedule until the
        KV cache reads ``warmup.kv_cache_fill`` full (or ``max_s`` passed); its seconds are
        the virtual run's (times ``time_scale``), not wall time."""
        if warmup.kv_cache_fill is None:
            return None
        target = warmup.kv_cache_fill
        _, schedule = fill_schedule(
            workload, warmup, self.launch.params.max_model_len, self.stream_fraction
        )
        if not schedule:
            return KvFill(target=target, reached=None, seconds=0.0, requests_sent=0)
        result = self._simulate(schedule, warmup.max_s)
        full = next((s for s in result.samples if s.kv_usage >= target), None)
        stop_s = full.t_s if full is not None else warmup.max_s
        seen = [s.kv_usage for s in result.samples if s.t_s <= stop_s]
        start = self._clock_unix_s
        self._advance(start, stop_s)
        return KvFill(
            target=target, reached=max(seen) if seen else None, seconds=stop_s * self.time_scale,
            requests_sent=sum(1 for o in result.requests if o.arrival_s < stop_s),
        )  # fmt: skip

    def warm_up(self, workload: WorkloadSpec, warm: list[ScheduledRequest]) -> None:
        """The warm-up's time passes on the virtual clock; every run starts on a fresh
        engine (the module's docstring), so nothing else of it carries on."""
        if warm:
            self._advance(self._clock_unix_s, max(r.send_s for r in warm))

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
        """``LiveServer.measure`` on the virtual clock (``chain`` is never given: ``chain``
        returns None). The same files: ``schedule.jsonl``, ``requests.jsonl``,
        ``metrics.csv``, ``backlog.json``, a level's ``window.json``."""
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in ("backlog-stop.json", WINDOW_FILE):  # an earlier run's
            (out_dir / stale).unlink(missing_ok=True)
        k = self.time_scale
        sent = sample_streams(schedule, self.stream_fraction)
        write_schedule(out_dir / "schedule.jsonl", scaled_schedule(sent, k))
        start = self._clock_unix_s
        last_send_s = max((r.send_s for r in sent), default=0.0)
        horizon: float | None = None
        if level is not None:
            horizon = level.total_s + (drain_s or 0.0) + 2 * WINDOW_CHECK_S / k
        elif drain_s is not None:
            horizon = last_send_s + drain_s
        hold = _hold_of(stop_when)
        if hold is not None and horizon is None:
            horizon = max(0.0, hold.cap_s - self.generators.startup_lead_s) / k
        # A level's window closes long before its longest: simulated to its shortest first,
        # then twice as far until a rule stops it (the run up to a time is the same run).
        reach = horizon
        if level is not None and horizon is not None:
            shortest_s = level.warmup_max_s + level.window_s + (drain_s or 0.0)
            reach = min(horizon, shortest_s + 2 * WINDOW_CHECK_S / k)
        while True:
            result = self._simulate(sent, reach)
            ended = self._replay(
                workload, sent, result, start, out_dir=out_dir, stop_when=stop_when,
                drain_s=drain_s, level=level, horizon_s=reach, hold=hold,
            )  # fmt: skip
            if ended.fired or reach is None or horizon is None or reach >= horizon - 1e-9:
                break
            reach = min(horizon, 2 * reach)
        stopped_by_caller = bool(ended.fired)
        cut = stopped_by_caller or (drain_s is not None)
        records = self._records(sent, result, start, ended.stop_s, cut=cut)
        write_records(out_dir / "requests.jsonl", records)
        samples = self._samples(result, start, ended.stop_s)
        _write_metrics_csv(out_dir / "metrics.csv", samples)
        stopped_unix = start + ended.stop_s * k
        died = self._death(result, ended.stop_s)
        window_start, window_end = start, start + workload.duration_s * k
        opening: WindowOpening | None = None
        if level is None:
            load, verdict = summarise_records(
                workload, records, window_s=workload.duration_s, time_scale=k, cut_short=cut
            )
        else:
            rule = self._window_rule(workload, level, samples, drain_s or 0.0).bind(
                out_dir, start_unix_s=start
            )
            rule.opening = ended.opening
            opening, records, load, verdict = in_window(
                workload, rule.final(samples, stopped_unix), records,
                start_unix_s=start, time_scale=k, out_dir=out_dir, stop_text=ended.text,
            )  # fmt: skip
            window_start = start + opening.opened_at_s * k
            window_end = window_start + opening.window_s * k
        backlog = backlog_verdict(
            workload, samples, records, window=(window_start, window_end),
            stopped_unix_s=stopped_unix, time_scale=k,
            stopped_by=ended.backlog if "backlog" in ended.fired else None, out_dir=out_dir,
        )  # fmt: skip
        self._advance(start, ended.stop_s)
        return LoadMeasurement(
            out_dir=str(out_dir),
            outcome=died.outcome if died is not None else TrialOutcome.READY,
            load=load,
            slo=verdict,
            window=opening,
            server=_counters(records, samples, result, ended.stop_s, k),
            death=died,
            stopped_early=stopped_by_caller and "slo" in ended.fired,
            backlog=backlog,
            stopped_by_backlog=stopped_by_caller and "backlog" in ended.fired,
            measured_ids=tuple(r.request_id for r in records) if opening is not None else (),
        )

    def _window_rule(
        self, workload: WorkloadSpec, level: LevelPlan, samples: list[MetricsSample], drain_s: float
    ) -> WindowRule:
        return WindowRule(
            level, time_scale=self.time_scale, drain_s=drain_s,
            ttft_limit_ms=loosest_ttft_ms(workload), samples=lambda: samples, workload=workload,
        )  # fmt: skip

    def _death(self, result: SimulationResult, stop_s: float) -> StartupResult | None:
        """How the engine died during the run (sim-serve's words in ``server.log``), or None."""
        if result.engine_died is None or _died_at_s(result) > stop_s:
            return None
        offline = self._offline
        assert offline is not None and offline.launch is not None
        with self.log_path.open("a", encoding="utf-8") as out:
            log_engine_dead(VllmLog(offline.launch.version, out=out, err=out), result.engine_died)
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        failure = engine_death_failure(text)
        assert self.startup is not None
        self.death = self.startup.model_copy(
            update={
                "outcome": TrialOutcome.ENGINE_DIED, "failure": failure, "report": None,
                "log_excerpt": log_excerpt(text, around=failure.message[:40] if failure else None),
                "note": f"the simulated engine died under load ({MEASURED_ON})",
            }
        )  # fmt: skip
        return self.death

    # -- the live rules, replayed on the virtual clock ----------------------------------------

    def _replay(
        self,
        workload: WorkloadSpec,
        sent: list[ScheduledRequest],
        result: SimulationResult,
        start_unix_s: float,
        *,
        out_dir: Path,
        stop_when: StopFactory | None,
        drain_s: float | None,
        level: LevelPlan | None,
        horizon_s: float | None,
        hold: WorstCaseHold | None,
    ) -> _Ended:
        """Where the run stops: the first check, at the live rules' own intervals, that fires
        (in ``AnyStop``'s order: the caller's rules, then the level's window), else the run's
        own end (every answer in)."""
        k = self.time_scale
        end_s = _run_end_s(result.requests)
        last_s = horizon_s if horizon_s is not None else end_s
        died_at_s = _died_at_s(result)
        known = sorted(
            ((_known_at_s(o, died_at_s), o) for o in result.requests), key=lambda pair: pair[0]
        )
        slo_rules = [r for r in _rules(stop_when) if isinstance(r, StopRule)]
        window = _WindowReplay(
            self._window_rule(workload, level, [], drain_s or 0.0), start_unix_s, out_dir
        ) if level is not None else None  # fmt: skip
        samples_all = self._samples(result, start_unix_s, math.inf)
        sample_times = [s.unix_s for s in samples_all]
        known_times = [at for at, _ in known]
        known_all = [o for _, o in known]
        slo_counts = [_SloCount(rule, sent, k) for rule in slo_rules]
        if hold is not None:
            bound = hold.bind(out_dir)
            if hold.deadline_s is not None and hold.deadline_s <= time.monotonic():
                _held(bound, HoldEnd.DEADLINE, known, 0.0, samples_all, start_unix_s, k)
                return _Ended(stop_s=0.0, fired=("hold",))
        step = min(WINDOW_CHECK_S, HOLD_CHECK_EVERY_S, STOP_CHECK_S) / k
        t = 0.0
        while t <= last_s + 1e-9:
            now_unix = start_unix_s + t * k
            samples = samples_all[: bisect.bisect_right(sample_times, now_unix)]
            written = known_all[: bisect.bisect_right(known_times, t)]
            if slo_counts and _on_beat(t, STOP_CHECK_S / k):
                opening = window.opening if window is not None else None
                for count in slo_counts:
                    if count.broken(
                        written, opened_at_s=opening.opened_at_s if opening else None,
                        warming_up=window is not None and opening is None,
                        backing_up=functools.partial(queue_backing_up, samples, since_unix_s=start_unix_s),
                    ):  # fmt: skip
                        return _Ended(
                            stop_s=t, fired=("slo",), opening=opening, text=count.tally.text
                        )
            if hold is not None and hold.bound is not None and _on_beat(t, HOLD_CHECK_EVERY_S / k):
                cap_s = max(0.0, hold.cap_s - self.generators.startup_lead_s) / k
                readings = [(s.unix_s, s.kv_cache_usage) for s in samples]
                if readings:
                    hold.bound.peak_usage = max(u for _, u in readings)
                if t >= cap_s - 1e-9 or kv_peaked(readings):
                    end = HoldEnd.KV_PEAKED if kv_peaked(readings) else HoldEnd.CAP
                    _held(hold.bound, end, known, t, samples_all, start_unix_s, k)
                    return _Ended(stop_s=t, fired=("hold",))
            if window is not None and _on_beat(t, WINDOW_CHECK_S / k):
                fired = window.check(t, samples, written, sent)
                if fired is not None:
                    return _Ended(
                        stop_s=t, fired=(fired,), opening=window.opening, backlog=window.backlog
                    )
            if level is None and drain_s is not None and t >= last_send_of(sent) + drain_s - 1e-9:
                return _Ended(stop_s=t, fired=("cut",))
            if horizon_s is None and t >= end_s:
                break
            t = round(t + step, 9)
        stop = min(last_s, max(t, 0.0)) if horizon_s is not None else end_s
        return _Ended(stop_s=stop, opening=window.opening if window is not None else None)


class _WindowReplay:
    """``tuner.serving.live_server.WindowRule``'s decisions at one check instant of the virtual clock."""

    def __init__(self, rule: WindowRule, start_unix_s: float, out_dir: Path) -> None:
        self.rule = rule
        self.start_unix_s = start_unix_s
        self.out_dir = out_dir
        self.opening: WindowOpening | None = None
        self.backlog: BacklogCheck | None = None
        self._shares: list[float] | None = None
        self._shares_at_s = -math.inf

    def check(
        self,
        t_s: float,
        samples: list[MetricsSample],
        written: list[RequestOutcome],
        sent: list[ScheduledRequest],
    ) -> str | None:
        """Why the rule stops the level at ``t_s`` ("cut", "backlog"), or None."""
        rule, start, k = self.rule, self.start_unix_s, self.rule.time_scale
        plan = rule.plan
        now_unix = start + t_s * k
        if self.opening is None:
            if not samples:
                return None
            opening = steady_opening(
                plan, samples, start_unix_s=start, now_unix_s=now_unix, time_scale=k
            )
            if opening is None:
                return None
            self.opening = opening
            opening.write(self.out_dir)
        opened_unix = start + self.opening.opened_at_s * k
        elapsed_s = (now_unix - opened_unix) / k
        if self.opening.closed is None and elapsed_s >= self.opening.window_s:
            closing = window_closes(
                plan, self.opening, samples, opened_unix_s=opened_unix, now_unix_s=now_unix,
                time_scale=k, shares=self._window_shares(t_s, opened_unix, now_unix, written, sent),
            )  # fmt: skip
            if closing is not None:
                self.opening = closing
                closing.write(self.out_dir)
        if self.opening.closed is not None and elapsed_s >= self.opening.window_s + rule.drain_s:
            return "cut"
        check = check_backlog(
            samples, (), window_start_unix_s=opened_unix, window_end_unix_s=now_unix,
            time_scale=k, ttft_limit_ms=rule.ttft_limit_ms,
        )  # fmt: skip
        if clearly_growing(check, elapsed_s=elapsed_s, window_s=plan.window_s):
            (self.out_dir / "backlog-stop.json").write_text(
                check.model_dump_json(indent=2), "utf-8"
            )
            self.backlog = check
            return "backlog"
        return None

    def _window_shares(
        self,
        t_s: float,
        opened_unix_s: float,
        now_unix_s: float,
        written: list[RequestOutcome],
        sent: list[ScheduledRequest],
    ) -> list[float] | None:
        """As ``_BoundWindowRule._window_shares``: the window's SLO percentiles so far as
        shares of their limits, refreshed every ``VERDICT_EVERY_S`` (wall)."""
        rule = self.rule
        if rule.workload is None or rule.plan.window_max_s is None:
            return None
        k = rule.time_scale
        if self._shares is not None and (t_s - self._shares_at_s) * k < VERDICT_EVERY_S:
            return self._shares
        self._shares_at_s = t_s
        due_unix = now_unix_s - rule.drain_s * k
        records = [
            r for r in _written_records(written, sent, self.start_unix_s, k)
            if not r.warmup and opened_unix_s <= r.scheduled_s < due_unix
        ]  # fmt: skip
        if not records:
            self._shares = []
            return self._shares
        span_s = max((due_unix - opened_unix_s) / k, 1e-3)
        load, _ = summarise_records(
            rule.workload, records, window_s=span_s, time_scale=k, cut_short=True
        )
        self._shares = percentile_shares(rule.workload, load)
        return self._shares


class _PromptIds(Sequence[list[int]]):
    """Each request's prompt token ids, encoded when the engine first takes the request
    (``run`` reads them then): a level stopped early never encodes the rest."""

    def __init__(self, schedule: Sequence[ScheduledRequest], chats: ChatEncoder, vocab: int):
        self.schedule = schedule
        self.chats = chats
        self.vocab = vocab
        self._ids: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self.schedule)

    @overload
    def __getitem__(self, index: int) -> list[int]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[list[int]]: ...

    def __getitem__(self, index: int | slice) -> list[int] | Sequence[list[int]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index not in self._ids:
            r = self.schedule[index]
            self._ids[index] = (
                self.chats.encode_chat(r.messages)
                if r.messages is not None
                else encode(r.prompt or "", self.vocab)
            )
        return self._ids[index]


def _rules(stop_when: StopFactory | None) -> list[StopFactory]:
    """The rules of a stop factory (``AnyStop``'s, or itself)."""
    if stop_when is None:
        return []
    if isinstance(stop_when, AnyStop):
        return [r for rule in stop_when.rules for r in _rules(rule)]
    return [stop_when]


def _hold_of(stop_when: StopFactory | None) -> WorstCaseHold | None:
    return next((r for r in _rules(stop_when) if isinstance(r, WorstCaseHold)), None)


def _on_beat(t_s: float, every_s: float) -> bool:
    """Whether a rule that looks every ``every_s`` looks at ``t_s``."""
    if every_s <= 0:
        return True
    q = t_s / every_s
    return abs(q - round(q)) < 1e-6


def last_send_of(sent: Sequence[ScheduledRequest]) -> float:
    return max((r.send_s for r in sent), default=0.0)


def _known_at_s(o: RequestOutcome, died_at_s: float) -> float:
    """When the load generator writes a request's record: at its answer, at once for a
    refusal, at the engine's death for one it took down, never before the stop for one
    still in flight."""
    if o.finish_s is not None:
        return o.finish_s
    if o.failure is FailureReason.ENGINE_DIED:
        return max(o.arrival_s, died_at_s)
    if o.failure is not None:
        return o.arrival_s
    return math.inf


def _died_at_s(result: SimulationResult) -> float:
    """When the engine died in a run (virtual seconds; inf: it did not): its last step
    (the run ends there), as far as its samples and answers place it."""
    if result.engine_died is None:
        return math.inf
    times = [s.t_s for s in result.samples]
    times += [o.finish_s for o in result.requests if o.finish_s is not None]
    return max(times, default=0.0)


def _run_end_s(outcomes: Sequence[RequestOutcome]) -> float:
    ends = [o.finish_s if o.finish_s is not None else o.arrival_s for o in outcomes]
    return max(ends, default=0.0)


def _written_records(
    written: Sequence[RequestOutcome],
    sent: Sequence[ScheduledRequest],
    start_unix_s: float,
    k: float,
) -> list[RequestRecord]:
    """The records of requests answered or refused so far (what a rule reads of a run)."""
    out = []
    for o in written:
        r = sent[o.index]
        at = start_unix_s + o.arrival_s * k
        times = [start_unix_s + t * k for t in o.token_times_s] if r.stream else []
        out.append(
            RequestRecord(
                request_id=r.request_id, scheduled_s=at, sent_s=at, prompt_tokens=o.prompt_tokens,
                output_tokens=o.output_tokens, status=200 if o.failure is None else (o.http_status or 0),
                first_token_s=times[0] if times else None,
                end_s=start_unix_s + o.finish_s * k if o.finish_s is not None else at,
                token_times_s=times, error=o.message if o.failure is not None else None,
                warmup=r.warmup, worker=WORKER, streamed=r.stream,
            )
        )  # fmt: skip
    return out


class _SloCount:
    """``StopRule``'s check (``SloTally``) over the records written so far, counted on as
    they come (warm-up left out; a request sent whole has no first token in its record: only
    its failure counts), in the emulated seconds of the run's offset 0."""

    def __init__(self, rule: StopRule, sent: Sequence[ScheduledRequest], k: float) -> None:
        self.tally = SloTally(rule)
        self.sent = sent
        self.k = k
        self.read = 0

    def broken(
        self,
        written: Sequence[RequestOutcome],
        *,
        opened_at_s: float | None,
        warming_up: bool,
        backing_up: Callable[[], bool],
    ) -> bool:
        """``opened_at_s``: the level's window's opening (None: not open, or no level);
        ``warming_up``: a level's, before its window opened."""
        tally = self.tally
        if opened_at_s is not None:
            tally.window_opened(opened_at_s)
        limit_s = tally.rule.ttft_limit_s
        for o in written[self.read :]:
            request = self.sent[o.index]
            if request.warmup:
                continue
            if o.failure is not None or o.first_token_s is None or not request.stream:
                late = o.failure is not None
            else:
                late = (o.first_token_s - o.arrival_s) * self.k > limit_s
            tally.add(o.arrival_s, late=late)
        self.read = len(written)
        return tally.fires(warming_up=warming_up, backing_up=backing_up)


def _held(
    bound: BoundHold,
    end: HoldEnd,
    known: Sequence[tuple[float, RequestOutcome]],
    t_s: float,
    samples: Sequence[MetricsSample],
    start_unix_s: float,
    k: float,
) -> None:
    """The hold as ``BoundHold`` leaves it when it stops the run at ``t_s``."""
    bound.ended = end
    bound.errors = sum(1 for at, o in known if at <= t_s and o.failure is not None)
    readings = [s.kv_cache_usage for s in samples if s.unix_s <= start_unix_s + t_s * k]
    if readings:
        bound.peak_usage = max(readings)


def _counters(
    records: Sequence[RequestRecord],
    samples: Sequence[MetricsSample],
    result: SimulationResult,
    stop_s: float,
    time_scale: float,
) -> ServerCounters:
    """What the server counted over a run, as ``ServerCounters.between`` reads /metrics
    before and after it: tokens from the records, the engine's counters at its last sample
    before the stop (a fresh engine counts from 0), its sampled evictions up to the stop
    (``--kv-cache-metrics``; in the server's seconds, as sim-serve's clock shows them)."""
    last = next((e for e in reversed(result.samples) if e.t_s <= stop_s), None)
    queries = last.prefix_queries_tokens if last is not None else 0
    hits = last.prefix_hits_tokens if last is not None else 0
    return ServerCounters(
        generation_tokens=sum(r.output_tokens for r in records),
        prompt_tokens=sum(r.prompt_tokens for r in records if r.status != 0),
        num_preemptions=last.preemptions_total if last is not None else 0,
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        prefix_cache_hit_rate=hits / queries if queries > 0 else None,
        max_kv_cache_usage=max((s.kv_cache_usage for s in samples), default=None),
        eviction=_eviction(result, last, stop_s, time_scale),
    )


def _eviction(
    result: SimulationResult, last: EngineSample | None, stop_s: float, k: float
) -> EvictionEvidence:
    """The run's eviction evidence as sim-serve's /metrics would show it (the residency
    histograms where the server runs with ``--kv-cache-metrics``)."""
    histograms: dict[str, ResidencyHistogram] = {}
    if result.evictions is not None:
        events = [e for e in result.evictions if e.at_s <= stop_s]
        histograms = {
            "lifetime": ResidencyHistogram.of(LIFETIME_METRIC, [e.lifetime_s * k for e in events]),
            "idle_before_evict": ResidencyHistogram.of(
                IDLE_BEFORE_EVICT_METRIC, [e.idle_s * k for e in events]
            ),
            "reuse_gap": ResidencyHistogram.of(
                REUSE_GAP_METRIC, [g * k for e in events for g in e.reuse_gaps_s]
            ),
        }
    return EvictionEvidence(lost_history=_lost_history(last), **histograms)


def _lost_history(last: EngineSample | None) -> LostHistoryCounts:
    """The twin's own truth of later turns' misses (the engine's, as the simulated server
    exports it under ``tuner_sim:``), from its counters at the last sample."""
    if last is None:
        return LostHistoryCounts(
            continuing_requests=0, history_evicted_requests=0,
            continuing_miss_tokens=0, evicted_under_way_tokens=0,
        )  # fmt: skip
    return LostHistoryCounts(
        continuing_requests=last.continuing_requests,
        history_evicted_requests=last.history_evicted_requests,
        continuing_miss_tokens=last.continuing_miss_tokens,
        evicted_under_way_tokens=last.evicted_under_way_tokens,
    )


def _write_metrics_csv(path: Path, samples: Sequence[MetricsSample]) -> None:
    """The /metrics timeline as ``KvUsageWatcher.write_csv`` writes it."""
    with path.open("w", encoding="utf-8", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(MetricsSample.COLUMNS)
        for sample in samples:
            writer.writerow(sample.row())

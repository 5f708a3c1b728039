"""The OOM edge: how far the best settings can go before vLLM fails to start or dies.

For the chosen settings, the highest ``--gpu-memory-utilization`` and the largest
``--max-num-seqs`` that still start and survive the workload's worst case (its
longest prompt and longest output, ``max-num-seqs`` of them at once). The calibrated
memory model places the first probe; each probe is a real launch, then steps of the
resolution (doubling while the edge is not bracketed) and bisection until the bracket
is one resolution wide, the launch budget is spent or the time budget is.

Only an out-of-memory outcome brackets the edge (``ProbeVerdict``, ``tuner.run.edge``):
vLLM failing to start for memory (``TrialOutcome.STARTUP_OOM``, a ``StartupFailureKind``
that ``is_out_of_memory``) or dying of it under the worst case (``RUNTIME_OOM``). Anything
else (a startup timeout, a crash, the hub refusing the model, a port taken, a rejected
configuration, failed requests) says nothing of memory: the probe is launched once more,
once the previous server's memory is released, and when that fails too not by memory
it is INCONCLUSIVE, kept with its outcome and vLLM's words, and the bracket does not move.

The worst case is held until the KV cache has peaked (vLLM's ``kv_cache_usage_perc``
read from /metrics: full, or falling from its peak as answers finish) or every output
finished, at most ``edge_load_s`` (emulated seconds) and never past the time budget's
deadline. vLLM preallocates its KV cache, so the device's used memory says nothing of
this; a run cut short before the cache peaked measured a startup edge only, and says
so (``HoldEnd.startup_only``). Every probe is kept: settings, verdict, outcome, how the
hold ended, peak memory and KV usage, request errors, evidence directory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

from tuner.run.budget import LaunchKind
from tuner.run.edge import EdgeProbe, EdgeResult, KnobEdge, ProbeVerdict, WorstCase
from tuner.run.evaluation import Evaluation
from tuner.run.layout import RunLayout
from tuner.search.budget import TimeBudget
from tuner.search.context import StudySetup, TuneContext
from tuner.search.evaluate import live_server, predicted_plan
from tuner.serving.gpu_sampler import GpuSummary, release_watch, wait_until_released
from tuner.serving.live_server import LoadMeasurement, StopFactory
from tuner.serving.load import LoadGenerators, plan_schedule
from tuner.serving.processes import ChildRegistry
from tuner.serving.server import StartupResult, TrialOutcome
from tuner.serving.worst_case_hold import (
    HoldEnd,
    WorstCaseHold,
)
from tuner.vllm.failures import StartupFailure, StartupFailureKind
from tuner.vllm.space import Knob, TrialParams
from workloads.prompts import completion_text, prompt_builder_for
from workloads.schedule import Api, ScheduledRequest
from workloads.spec import WarmupSpec, WorkloadSpec

log = logging.getLogger(__name__)

UTILIZATION_CEILING = 1.0  # vLLM accepts 0 < utilization <= 1
SEQS_CEILING = 8192
# A retry waits this long (beyond the stop's own wait) for the previous server's memory.
RELEASE_RETRY_S = 120.0
# Before any probe measured a hold: twice the best trial's longest answer (its p99 TTFT
# and p99 TPOT over the worst case's output), capped at edge_load_s.
HOLD_PRIOR_FACTOR = 2.0


def worst_case(ctx: TuneContext, concurrency: int) -> WorstCase:
    """The workload's longest prompt and longest output, from its own schedule."""
    schedule = plan_schedule(
        ctx.workload, max_model_len=ctx.base.max_model_len, model_dir=ctx.model_dir
    )  # counted as vLLM counts them: the model's tokenizer and chat template
    prompt = max((r.prompt_tokens for r in schedule), default=1)
    output = max((r.max_tokens for r in schedule), default=1)
    limit = ctx.base.max_model_len or ctx.model.max_position_embeddings
    if prompt + output > limit:
        prompt = max(1, limit - output)
    return WorstCase(
        prompt_tokens=prompt,
        output_tokens=output,
        concurrency=concurrency,
        load_s=ctx.config.edge_load_s,
    )


def worst_case_schedule(case: WorstCase, model_dir: Path | None) -> list[ScheduledRequest]:
    builder = prompt_builder_for(model_dir)
    return [
        ScheduledRequest(
            request_id=f"worst-{i}",
            send_s=0.0,
            api=Api.COMPLETIONS,
            prompt_tokens=case.prompt_tokens,
            max_tokens=case.output_tokens,
            prompt=completion_text(builder, case.prompt_tokens, seed=1000 + i),  # BOS in
        )
        for i in range(case.concurrency)
    ]


def is_out_of_memory(outcome: TrialOutcome, failure: StartupFailure | None) -> bool:
    """An out-of-memory outcome: a startup OOM, or any failure vLLM's words class as one
    (the runtime OOM of a death under load included)."""
    if failure is not None and (
        failure.kind.is_out_of_memory or failure.kind is StartupFailureKind.RUNTIME_OOM
    ):
        return True
    return outcome is TrialOutcome.STARTUP_OOM


def probe_verdict(
    outcome: TrialOutcome, failure: StartupFailure | None, *, request_errors: int
) -> ProbeVerdict:
    """HELD: served the worst case without a failed request; OUT_OF_MEMORY: an
    out-of-memory outcome; INCONCLUSIVE: anything else."""
    if is_out_of_memory(outcome, failure):
        return ProbeVerdict.OUT_OF_MEMORY
    if outcome is TrialOutcome.READY and request_errors == 0:
        return ProbeVerdict.HELD
    return ProbeVerdict.INCONCLUSIVE


class ProbeServer(Protocol):
    """What a probe uses of a live server (``tuner.serving.live_server.LiveServer``)."""

    time_scale: float
    generators: LoadGenerators

    @property
    def startup(self) -> StartupResult | None: ...

    @property
    def gpu(self) -> GpuSummary | None: ...

    @property
    def ready(self) -> bool: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def measure(
        self,
        workload: WorkloadSpec,
        schedule: list[ScheduledRequest],
        *,
        out_dir: Path,
        stop_when: StopFactory | None = None,
    ) -> LoadMeasurement: ...

    def memory_released(self) -> bool | None:
        """After the stop: whether the device memory came back (None: not watched)."""
        ...

    def await_release(self, timeout_s: float) -> bool:
        """Wait (up to ``timeout_s``) for the device memory to come back."""
        ...


# Makes the live server of one probe: (settings, evidence directory) -> server.
ProbeLauncher = Callable[[TrialParams, Path], ProbeServer]


class LiveProbeServer:
    """A ``LiveServer`` as a probe uses it (``ProbeServer``)."""

    def __init__(
        self, ctx: TuneContext, setup: StudySetup, params: TrialParams, out_dir: Path,
        registry: ChildRegistry,
    ) -> None:  # fmt: skip
        self.live = live_server(ctx, setup, params, out_dir, registry)
        self.time_scale = self.live.time_scale
        self.generators = self.live.generators

    @property
    def startup(self) -> StartupResult | None:
        return self.live.startup

    @property
    def gpu(self) -> GpuSummary | None:
        return self.live.gpu

    @property
    def ready(self) -> bool:
        return self.live.ready

    def __enter__(self) -> LiveProbeServer:
        self.live.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.live.__exit__(exc_type, exc, tb)

    def measure(
        self,
        workload: WorkloadSpec,
        schedule: list[ScheduledRequest],
        *,
        out_dir: Path,
        stop_when: StopFactory | None = None,
    ) -> LoadMeasurement:
        return self.live.measure(workload, schedule, out_dir=out_dir, stop_when=stop_when)

    def memory_released(self) -> bool | None:
        return self.live.server.memory_released

    def await_release(self, timeout_s: float) -> bool:
        # the server's own GPUs, as its launch watched them (never another job's)
        source = release_watch(self.live.source_kind, visible=self.live.launch.server_devices())
        if source is None:
            return True
        try:
            source.open()
            return wait_until_released(
                source, baseline_used_bytes=self.live.server.baseline_used_bytes,
                timeout_s=timeout_s,
            )  # fmt: skip
        except Exception:  # an unreadable device: nothing more to wait for
            log.warning("GPU memory release not checked again", exc_info=True)
            return False
        finally:
            source.close()


def hold_prior_s(ctx: TuneContext, case: WorstCase, best: Evaluation | None) -> float:
    """The worst case's hold before any probe measured one (emulated seconds): twice the
    best trial's longest answer at its best level (p99 TTFT, and p99 TPOT over the worst
    case's output), at most the cap; the cap without such a level."""
    level = best.best or (best.levels[-1] if best.levels else None) if best is not None else None
    if level is None:
        return case.load_s
    ttft, tpot = level.load.ttft_ms.p99, level.load.tpot_ms.p99
    if ttft is None or tpot is None:
        return case.load_s
    answer_s = (ttft + tpot * case.output_tokens) / 1000.0
    return min(case.load_s, HOLD_PRIOR_FACTOR * answer_s)


class EdgeSearch:
    """The probes of one tune's edge search, each checked against the deadline first."""

    def __init__(
        self,
        ctx: TuneContext,
        setup: StudySetup,
        registry: ChildRegistry,
        progress: object,
        *,
        budget: TimeBudget | None = None,
        deadline_s: float | None = None,
        best: Evaluation | None = None,
        launcher: ProbeLauncher | None = None,
    ) -> None:
        self.ctx = ctx
        self.setup = setup
        self.registry = registry
        self.progress = progress
        self.budget = budget
        self.deadline_s = deadline_s  # monotonic; None: the budget's end
        self.best = best
        self.launcher: ProbeLauncher = launcher or (
            lambda params, out: LiveProbeServer(ctx, setup, params, out, registry)
        )
        self.probes: list[EdgeProbe] = []
        self.out_dir = RunLayout(ctx.run_dir).edge_dir
        self.stopped: str | None = None  # why the search stopped for time
        self._previous: ProbeServer | None = None

    def _say(self, line: str) -> None:
        if callable(self.progress):
            self.progress(line)

    # -- time ---------------------------------------------------------------------------------

    def hold_estimate_s(self, case: WorstCase) -> float:
        """The next probe's hold (wall seconds, the load generator's lead included): the
        longest a probe so far held that was not cut short, else ``hold_prior_s``."""
        k = self.setup.time_scale
        lead = self.ctx.config.load_generators().startup_lead_s
        held = [
            p.hold_s for p in self.probes
            if p.hold_s is not None and p.hold_end is not None and not p.hold_end.startup_only
        ]  # fmt: skip
        emulated = max(held) if held else hold_prior_s(self.ctx, case, self.best)
        return lead + emulated * k

    def _fits(self, name: str, case: WorstCase) -> bool:
        """Whether a probe (a launch, its hold, its stop) ends before the deadline; said
        when it does not."""
        if self.budget is None:
            return True
        need = self.budget.launch_estimate_s() + self.hold_estimate_s(case)
        skip = self.budget.fits(LaunchKind.EDGE_PROBE, name, need, deadline_s=self.deadline_s)
        if skip is None:
            return True
        self.stopped = skip.text()
        self._say(skip.text())
        return False

    # -- one probe --------------------------------------------------------------------------

    def probe(self, knob: Knob, params: TrialParams) -> EdgeProbe | None:
        """One value's verdict: a launch, and a second when the first failed not by memory.
        None: not launched, the time budget does not allow it."""
        first = self._attempt(knob, params, attempt=1)
        if first is None or first.verdict is not ProbeVerdict.INCONCLUSIVE:
            return first
        return self._attempt(knob, params, attempt=2) or first

    def _released(self) -> bool:
        """Whether the previous probe's server gave its device memory back (waiting for
        it up to ``RELEASE_RETRY_S`` more when its stop did not see it)."""
        previous = self._previous
        if previous is None or previous.memory_released() is not False:
            return True
        if previous.await_release(RELEASE_RETRY_S):
            self._previous = None
            return True
        return False

    def _attempt(self, knob: Knob, params: TrialParams, *, attempt: int) -> EdgeProbe | None:
        value = float(getattr(params, knob.field))
        name = f"edge probe {knob.flag} {value:g}" + (" (retry)" if attempt > 1 else "")
        seqs = params.max_num_seqs or 256
        if not self._fits(name, worst_case(self.ctx, seqs)):
            return None
        if not self._released():  # a launch now would see less free memory than it asks
            self.stopped = (
                f"{name} not started: the previous server's GPU memory was not released "
                f"within {RELEASE_RETRY_S:.0f} s of its stop"
            )
            self._say(self.stopped)
            return None
        out = self.out_dir / (f"{knob.value}-{value:g}" + (f"-try{attempt}" if attempt > 1 else ""))
        predicted = predicted_plan(self.ctx, self.setup, params)
        began = time.monotonic()
        live = self.launcher(params, out)
        self._previous = live
        measurement: LoadMeasurement | None = None
        hold: WorstCaseHold | None = None
        launched = held_at = began
        with live:
            launched = held_at = time.monotonic()
            startup = live.startup
            assert startup is not None
            if live.ready:
                report_seqs = startup.report.max_num_seqs if startup.report else None
                case = worst_case(self.ctx, report_seqs or seqs)
                schedule = worst_case_schedule(case, self.ctx.model_dir)
                stop_s = self._stop_estimate_s()
                hold = WorstCaseHold(
                    cap_s=live.generators.startup_lead_s + case.load_s * live.time_scale,
                    deadline_s=(self._deadline() - stop_s) if self.budget is not None else None,
                )
                measurement = live.measure(
                    _worst_spec(self.ctx, case), schedule, out_dir=out / "load", stop_when=hold
                )
                held_at = time.monotonic()
        stopped_at = time.monotonic()
        result = self._probe_of(
            knob, value, params, out, attempt=attempt, predicted_fits=(
                predicted.fits if predicted is not None else None
            ), startup=startup, measurement=measurement, hold=hold, gpu=live.gpu,
            wall_s=stopped_at - began, launch_s=launched - began, hold_wall_s=held_at - launched,
            time_scale=live.time_scale, lead_s=live.generators.startup_lead_s,
        )  # fmt: skip
        if self.budget is not None:
            self.budget.record(
                LaunchKind.EDGE_PROBE, name, began_s=began, launch_s=launched - began,
                measure_s=held_at - launched, stop_s=stopped_at - held_at,
                ready=startup.outcome is TrialOutcome.READY, deadline_s=self._deadline(),
            )  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)
        (out / "probe.json").write_text(result.model_dump_json(indent=2), encoding="utf-8")
        self.probes.append(result)
        peak = (
            f"peak {result.peak_used_bytes / 2**30:.1f}/{result.total_bytes / 2**30:.1f} GiB"
            if result.peak_used_bytes and result.total_bytes
            else ""
        )
        kv = (
            f"KV cache peak {result.peak_kv_cache_usage:.0%}"
            if result.peak_kv_cache_usage is not None
            else ""
        )
        errors = f"{result.request_errors} failed request(s)" if result.request_errors else ""
        extras = "  ".join(x for x in (peak, kv, errors) if x)
        said = result.said()
        if attempt == 1 and result.verdict is ProbeVerdict.INCONCLUSIVE:
            said = (
                f"{result.failure_kind or result.outcome.value}, not an out-of-memory outcome; "
                "launching it once more once its GPU memory is released"
            )
        self._say(f"edge probe  {knob.flag} {value:g}: {said}" + (f"  {extras}" if extras else ""))
        return result

    def _deadline(self) -> float:
        assert self.budget is not None
        return self.deadline_s if self.deadline_s is not None else self.budget.deadline_s

    def _stop_estimate_s(self) -> float:
        """What stopping the probe's server takes (its memory's release included)."""
        if self.budget is None:
            return 0.0
        stops = [r.stop_s for r in self.budget.launches if r.stop_s is not None and r.ready]
        return max(stops[-3:]) if stops else 0.1 * self.budget.launch_prior_s

    def _probe_of(
        self,
        knob: Knob,
        value: float,
        params: TrialParams,
        out: Path,
        *,
        attempt: int,
        predicted_fits: bool | None,
        startup: StartupResult,
        measurement: LoadMeasurement | None,
        hold: WorstCaseHold | None,
        gpu: GpuSummary | None,
        wall_s: float,
        launch_s: float,
        hold_wall_s: float,
        time_scale: float,
        lead_s: float,
    ) -> EdgeProbe:
        died = measurement is not None and measurement.outcome is not TrialOutcome.READY
        death = measurement.death if measurement is not None and died else None
        failure = death.failure if death is not None else startup.failure
        outcome = measurement.outcome if measurement is not None else startup.outcome
        bound = hold.bound if hold is not None else None
        hold_end: HoldEnd | None = None
        errors: int | None = None
        requests: int | None = None
        if measurement is not None:
            requests = measurement.load.num_requests
            if died:
                hold_end = HoldEnd.ENGINE_DIED
            elif bound is not None and bound.ended is not None:
                hold_end = bound.ended
            else:
                hold_end = HoldEnd.OUTPUTS_FINISHED
            # a run stopped by the hold: the requests it cut off are no errors
            errors = (
                bound.errors
                if bound is not None and bound.ended is not None
                else measurement.load.num_errors
            )
        verdict = probe_verdict(outcome, failure, request_errors=errors or 0)
        kind = failure.kind.value if failure else None
        message = failure.message[:400] if failure else None
        if failure is None and verdict is ProbeVerdict.INCONCLUSIVE:
            if errors:
                kind = "request_errors"
                message = f"{errors} of {requests} worst-case requests failed; the engine lived"
            elif startup.failure is None and outcome is not TrialOutcome.READY:
                message = (startup.log_excerpt or "")[-400:] or None
        peak_kv = (
            measurement.server.max_kv_cache_usage
            if measurement is not None and measurement.server is not None
            else None
        )
        if peak_kv is None and bound is not None:
            peak_kv = bound.peak_usage
        return EdgeProbe(
            knob=knob,
            value=value,
            flags=dict(params.flags()),
            predicted_fits=predicted_fits,
            outcome=outcome,
            verdict=verdict,
            survived=verdict is ProbeVerdict.HELD,
            attempt=attempt,
            failure_kind=kind,
            failure_message=message,
            peak_used_bytes=gpu.peak_used_bytes if gpu else None,
            total_bytes=gpu.total_bytes if gpu else None,
            headroom_bytes=gpu.headroom_bytes if gpu else None,
            kv_cache_tokens=startup.report.kv_cache_tokens if startup.report else None,
            num_preemptions=measurement.server.num_preemptions
            if measurement is not None and measurement.server
            else None,
            hold_end=hold_end,
            hold_s=max(0.0, hold_wall_s - lead_s) / time_scale if measurement is not None else None,
            peak_kv_cache_usage=peak_kv,
            requests=requests,
            request_errors=errors,
            dir=str(out),
            time_scale=time_scale,
            wall_s=wall_s,
            launch_s=launch_s,
        )

    # -- the searches --------------------------------------------------------------------------

    def utilization(self, params: TrialParams, max_launches: int) -> KnobEdge:
        res = self.ctx.config.edge_resolution
        start = params.gpu_memory_utilization or self.ctx.version.default_gpu_memory_utilization
        predicted = self._predicted_edge(
            params, Knob.GPU_MEMORY_UTILIZATION, start, UTILIZATION_CEILING, res
        )
        first = predicted if predicted is not None else start
        return self._bisect(
            params, Knob.GPU_MEMORY_UTILIZATION, start=start, first=first, res=res,
            ceiling=UTILIZATION_CEILING, floor=0.05, predicted=predicted,
            max_launches=max_launches,
        )  # fmt: skip

    def max_num_seqs(self, params: TrialParams, max_launches: int) -> KnobEdge | None:
        if max_launches <= 0:
            return None
        start = float(params.max_num_seqs or 256)
        predicted = self._predicted_edge(params, Knob.MAX_NUM_SEQS, start, SEQS_CEILING, 1.0)
        if predicted is not None and predicted >= SEQS_CEILING:
            return KnobEdge(
                knob=Knob.MAX_NUM_SEQS, start=start, predicted=predicted, highest_ok=None,
                lowest_failed=None, resolution=1.0, launches=0,
                note=f"the memory model sees no startup failure up to {SEQS_CEILING}; not probed",
            )  # fmt: skip
        first = predicted if predicted is not None else start
        res = max(1.0, round(first / 16))
        return self._bisect(
            params, Knob.MAX_NUM_SEQS, start=start, first=first, res=res, ceiling=SEQS_CEILING,
            floor=1.0, predicted=predicted, max_launches=max_launches,
        )  # fmt: skip

    def _predicted_edge(
        self, params: TrialParams, knob: Knob, start: float, ceiling: float, res: float
    ) -> float | None:
        """The memory model's highest value (on the resolution grid) that starts."""

        def fits(value: float) -> bool:
            plan = predicted_plan(self.ctx, self.setup, _with(params, knob, value))
            return plan is not None and plan.fits

        if predicted_plan(self.ctx, self.setup, params) is None:
            return None
        lo = _grid(start, res)
        if not fits(lo):
            return None
        hi = _grid(ceiling, res)
        if fits(hi):
            return hi
        while hi - lo > res * 1.0001:
            mid = _grid((lo + hi) / 2, res)
            if mid in (lo, hi):
                break
            if fits(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def _bisect(
        self,
        params: TrialParams,
        knob: Knob,
        *,
        start: float,
        first: float,
        res: float,
        ceiling: float,
        floor: float,
        predicted: float | None,
        max_launches: int,
    ) -> KnobEdge:
        """Probes from ``first``: up while every probe held, down while every one ran out of
        memory, then bisection. Only HELD and OUT_OF_MEMORY move the bracket; an
        inconclusive value ends the search there (what failed twice not by memory would
        fail so at the next value too), as does the time budget."""
        ok: float | None = None
        bad: float | None = None
        ok_startup_only = False
        inconclusive: list[float] = []
        notes: list[str] = []
        value = _grid(first, res)
        step = res
        probed = 0
        launches = 0
        while probed < max_launches:
            found = self.probe(knob, _with(params, knob, value))
            launches = sum(1 for p in self.probes if p.knob is knob)
            if found is None:
                notes.append(f"stopped: {self.stopped}")
                break
            probed += 1
            if found.verdict is ProbeVerdict.INCONCLUSIVE:
                inconclusive.append(value)
                notes.append(
                    f"{value:g} inconclusive twice ({found.failure_kind or found.outcome.value}): "
                    "not an out-of-memory outcome, the bracket stops there"
                )
                break
            if found.verdict is ProbeVerdict.HELD:
                if ok is None or value > ok:
                    ok, ok_startup_only = value, found.startup_edge_only
            else:
                bad = value if bad is None else min(bad, value)
            if ok is not None and bad is not None and bad - ok <= res * 1.0001:
                break
            if bad is None:
                if value >= ceiling:
                    break
                nxt = min(ceiling, value + step)
                step *= 2
            elif ok is None:
                if value <= floor:
                    break
                nxt = max(floor, value - step)
                step *= 2
            else:
                nxt = _grid((ok + bad) / 2, res)
                if nxt in (ok, bad):
                    break
            value = _grid(nxt, res)
        if ok_startup_only:
            notes.append(
                f"{ok:g} held a startup edge only: the worst case was cut short before the KV "
                "cache peaked"
            )
        return KnobEdge(
            knob=knob, start=start, predicted=predicted, highest_ok=ok, lowest_failed=bad,
            resolution=res, launches=launches, note="; ".join(notes), inconclusive=inconclusive,
            highest_ok_startup_only=ok_startup_only,
        )  # fmt: skip


def _worst_spec(ctx: TuneContext, case: WorstCase) -> WorkloadSpec:
    return ctx.workload.model_copy(
        update={"duration_s": case.load_s, "warmup": WarmupSpec(), "api": Api.COMPLETIONS}
    )


def _with(params: TrialParams, knob: Knob, value: float) -> TrialParams:
    typed: float | int = round(value) if knob is Knob.MAX_NUM_SEQS else round(value, 4)
    return params.model_copy(update={knob.field: typed})


def _grid(value: float, res: float) -> float:
    return round(round(value / res) * res, 6)


def find_edge(
    ctx: TuneContext,
    setup: StudySetup,
    params: TrialParams,
    registry: ChildRegistry,
    progress: object,
    *,
    budget: TimeBudget | None = None,
    deadline_s: float | None = None,
    best: Evaluation | None = None,
    launcher: ProbeLauncher | None = None,
) -> EdgeResult:
    """The edge of ``params`` (see the module's docstring); with ``budget``, every probe
    is checked against ``deadline_s`` (monotonic; default the budget's end) before it is
    launched, and its hold never runs past it. ``best``: the trial of these settings,
    whose answers estimate the hold before a probe measured one."""
    if ctx.gpu is None:
        return EdgeResult(
            worst_case=None, utilization=None, max_num_seqs=None, probes=[],
            skipped="no GPU: vLLM's CPU build sizes its KV cache from VLLM_CPU_KVCACHE_SPACE",
        )  # fmt: skip
    search = EdgeSearch(
        ctx, setup, registry, progress, budget=budget, deadline_s=deadline_s, best=best,
        launcher=launcher,
    )  # fmt: skip
    util = search.utilization(params, ctx.config.max_edge_launches)
    seqs = (
        search.max_num_seqs(params, ctx.config.seqs_edge_launches)
        if search.stopped is None
        else None
    )
    concurrency = params.max_num_seqs or 256
    result = EdgeResult(
        worst_case=worst_case(ctx, concurrency),
        utilization=util,
        max_num_seqs=seqs,
        probes=search.probes,
        skipped=(
            f"no probe launched: {search.stopped}"
            if not search.probes and search.stopped is not None
            else None
        ),
    )
    search.out_dir.mkdir(parents=True, exist_ok=True)
    RunLayout(ctx.run_dir).edge_json.write_text(result.model_dump_json(indent=2), encoding="utf-8")
    return result

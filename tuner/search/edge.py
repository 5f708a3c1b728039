"""The OOM edge: how far the best settings can go before vLLM fails to start or dies.

For the chosen settings, the highest ``--gpu-memory-utilization`` and the largest
``--max-num-seqs`` that still start and survive the workload's worst case (its
longest prompt and longest output, ``max-num-seqs`` of them at once) with the
device's peak memory below its total. The calibrated memory model places the
first probe; each probe is a real launch, then steps of the resolution (doubling
while the edge is not bracketed) and bisection until the bracket is one
resolution wide or the launch budget is spent. Every probe is kept: settings,
outcome, peak memory, headroom, evidence directory.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tuner.rundir import RunLayout
from tuner.search.context import StudySetup, TuneContext
from tuner.search.evaluate import live_server, predicted_plan
from tuner.search.space import Knob, TrialParams
from tuner.serving.load import plan_schedule
from tuner.serving.processes import ChildRegistry
from tuner.serving.server import TrialOutcome
from workloads.prompts import prompt_builder_for, text_of
from workloads.schedule import Api, ScheduledRequest
from workloads.spec import WarmupSpec, WorkloadSpec

log = logging.getLogger(__name__)

UTILIZATION_CEILING = 1.0  # vLLM accepts 0 < utilization <= 1
SEQS_CEILING = 8192


class WorstCase(BaseModel):
    model_config = ConfigDict(frozen=True)

    prompt_tokens: int
    output_tokens: int
    concurrency: int  # max-num-seqs of the probe
    load_s: float  # emulated seconds of load per probe


class EdgeProbe(BaseModel):
    model_config = ConfigDict(frozen=True)

    knob: Knob
    value: float
    flags: dict[str, object]
    predicted_fits: bool | None
    outcome: TrialOutcome
    survived: bool
    failure_kind: str | None = None
    failure_message: str | None = None
    peak_used_bytes: int | None = None
    total_bytes: int | None = None
    headroom_bytes: int | None = None
    kv_cache_tokens: int | None = None
    num_preemptions: int | None = None
    dir: str
    wall_s: float


class KnobEdge(BaseModel):
    """One knob's edge: the highest value that held, the lowest that failed."""

    model_config = ConfigDict(frozen=True)

    knob: Knob
    start: float  # the recommended settings' value
    predicted: float | None  # the memory model's highest value that starts
    highest_ok: float | None
    lowest_failed: float | None
    resolution: float
    launches: int
    note: str = ""

    @property
    def bracketed(self) -> bool:
        return (
            self.highest_ok is not None
            and self.lowest_failed is not None
            and self.lowest_failed - self.highest_ok <= self.resolution * 1.0001
        )


class EdgeResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    worst_case: WorstCase | None
    utilization: KnobEdge | None
    max_num_seqs: KnobEdge | None
    probes: list[EdgeProbe]
    skipped: str | None = None


def worst_case(ctx: TuneContext, concurrency: int) -> WorstCase:
    """The workload's longest prompt and longest output, from its own schedule."""
    schedule = plan_schedule(ctx.workload, max_model_len=ctx.base.max_model_len)
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
            prompt=text_of(builder, case.prompt_tokens, seed=1000 + i),
        )
        for i in range(case.concurrency)
    ]


class EdgeSearch:
    def __init__(
        self, ctx: TuneContext, setup: StudySetup, registry: ChildRegistry, progress: object
    ) -> None:
        self.ctx = ctx
        self.setup = setup
        self.registry = registry
        self.progress = progress
        self.probes: list[EdgeProbe] = []
        self.out_dir = RunLayout(ctx.run_dir).edge_dir

    def _say(self, line: str) -> None:
        if callable(self.progress):
            self.progress(line)

    # -- one probe --------------------------------------------------------------------------

    def probe(self, knob: Knob, params: TrialParams) -> EdgeProbe:
        value = float(getattr(params, knob.field))
        out = self.out_dir / f"{knob.value}-{value:g}"
        predicted = predicted_plan(self.ctx, self.setup, params)
        began = time.monotonic()
        live = live_server(self.ctx, self.setup, params, out, self.registry)
        measurement = None
        startup = None
        with live:
            startup = live.startup
            assert startup is not None
            if live.ready:
                seqs = startup.report.max_num_seqs if startup.report else None
                case = worst_case(self.ctx, seqs or params.max_num_seqs or 256)
                schedule = worst_case_schedule(case, self.ctx.model_dir)
                deadline = time.monotonic() + case.load_s * live.time_scale
                measurement = live.measure(
                    _worst_spec(self.ctx, case), schedule, out_dir=out / "load",
                    stop_when=_Deadline(deadline),
                )  # fmt: skip
        gpu = live.gpu
        died = measurement is not None and measurement.outcome is not TrialOutcome.READY
        failure = (
            measurement.death.failure
            if died and measurement is not None and measurement.death
            else startup.failure
        )
        over = (
            gpu is not None
            and gpu.peak_used_bytes is not None
            and gpu.total_bytes is not None
            and gpu.peak_used_bytes >= gpu.total_bytes
        )
        outcome = measurement.outcome if measurement is not None else startup.outcome
        result = EdgeProbe(
            knob=knob,
            value=value,
            flags=dict(params.flags()),
            predicted_fits=predicted.fits if predicted is not None else None,
            outcome=outcome,
            survived=outcome is TrialOutcome.READY and not over,
            failure_kind=failure.kind.value
            if failure
            else ("peak_at_device_total" if over else None),
            failure_message=failure.message[:400] if failure else None,
            peak_used_bytes=gpu.peak_used_bytes if gpu else None,
            total_bytes=gpu.total_bytes if gpu else None,
            headroom_bytes=gpu.headroom_bytes if gpu else None,
            kv_cache_tokens=startup.report.kv_cache_tokens if startup.report else None,
            num_preemptions=measurement.server.num_preemptions
            if measurement is not None and measurement.server
            else None,
            dir=str(out),
            wall_s=time.monotonic() - began,
        )
        (out / "probe.json").write_text(result.model_dump_json(indent=2), encoding="utf-8")
        self.probes.append(result)
        peak = (
            f"peak {result.peak_used_bytes / 2**30:.1f}/{result.total_bytes / 2**30:.1f} GiB"
            if result.peak_used_bytes and result.total_bytes
            else ""
        )
        self._say(
            f"edge probe  {knob.flag} {value:g}: "
            + ("held" if result.survived else f"FAILED ({result.failure_kind})")
            + (f"  {peak}" if peak else "")
        )
        return result

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
        ok: float | None = None
        bad: float | None = None
        value = _grid(first, res)
        step = res
        launches = 0
        while launches < max_launches:
            launches += 1
            held = self.probe(knob, _with(params, knob, value)).survived
            if held:
                ok = value if ok is None else max(ok, value)
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
        return KnobEdge(
            knob=knob, start=start, predicted=predicted, highest_ok=ok, lowest_failed=bad,
            resolution=res, launches=launches,
        )  # fmt: skip


class _Deadline:
    def __init__(self, at_s: float) -> None:
        self.at_s = at_s

    def bind(self, out_dir: Path, *, since_unix_s: float | None = None) -> _Deadline:
        return self

    def __call__(self) -> bool:
        return time.monotonic() >= self.at_s


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
) -> EdgeResult:
    if ctx.gpu is None:
        return EdgeResult(
            worst_case=None, utilization=None, max_num_seqs=None, probes=[],
            skipped="no GPU: vLLM's CPU build sizes its KV cache from VLLM_CPU_KVCACHE_SPACE",
        )  # fmt: skip
    search = EdgeSearch(ctx, setup, registry, progress)
    util = search.utilization(params, ctx.config.max_edge_launches)
    seqs = search.max_num_seqs(params, ctx.config.seqs_edge_launches)
    concurrency = params.max_num_seqs or 256
    result = EdgeResult(
        worst_case=worst_case(ctx, concurrency),
        utilization=util,
        max_num_seqs=seqs,
        probes=search.probes,
    )
    search.out_dir.mkdir(parents=True, exist_ok=True)
    (search.out_dir / "edge.json").write_text(result.model_dump_json(indent=2), encoding="utf-8")
    return result

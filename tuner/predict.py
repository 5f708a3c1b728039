"""Serving predicted on the simulator's virtual clock: a workload under given settings, in CPU seconds.

The tuning loop uses this to place its first probes (the first request rate a
trial measures, the first utilization the OOM-edge search launches), and the
search-efficiency benchmark to compute a whole landscape. The prompts are the
workload's own text through the simulator's tokenizer, so prefix sharing (system
prompts, multi-turn history) is what ``tuner sim-serve`` would see.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tuner.gpus import GpuSpec
from tuner.memory import MemoryPlan, ServingParams
from tuner.models import ModelSpec
from tuner.sim.build import SimOptions, build_engine
from tuner.sim.simulate import SimulationResult, Slo, run
from tuner.sim.tokenizer import encode, encode_chat
from tuner.versions import VllmVersion
from workloads.build import build_schedule
from workloads.schedule import ScheduledRequest
from workloads.spec import SloMetric, WorkloadSpec
from workloads.traces import TraceRecord


@dataclass(frozen=True)
class Setup:
    """What the simulated server would be launched with."""

    model: ModelSpec
    gpu: GpuSpec
    version: VllmVersion
    params: ServingParams
    options: SimOptions = field(default_factory=SimOptions)


@dataclass(frozen=True)
class Prediction:
    rate_per_s: float  # the workload's arrival rate
    plan: MemoryPlan
    result: SimulationResult | None  # None: the server would not start
    met: bool


def simulate_schedule(
    setup: Setup, schedule: list[ScheduledRequest], slo: Slo, stop_at_s: float | None = None
) -> tuple[MemoryPlan, SimulationResult | None]:
    plan, engine = build_engine(setup.model, setup.gpu, setup.params, setup.version, setup.options)
    if engine is None:
        return plan, None
    vocab = setup.model.vocab_size
    records = [
        TraceRecord(arrival_s=r.send_s, prompt_tokens=r.prompt_tokens, output_tokens=r.max_tokens)
        for r in schedule
    ]
    ids = [
        encode_chat(r.messages, vocab) if r.messages is not None else encode(r.prompt or "", vocab)
        for r in schedule
    ]
    result = run(
        engine, records, slo=slo, vocab=vocab, max_model_len=plan.max_model_len,
        prompt_token_ids=ids, stop_at_s=stop_at_s,
    )  # fmt: skip
    return plan, result


def slo_met(spec: WorkloadSpec, result: SimulationResult) -> bool:
    """The workload's objectives against a simulated run (any failed request breaks it)."""
    if result.num_failed or result.engine_died:
        return False
    fields = {
        SloMetric.TTFT: result.ttft_ms,
        SloMetric.ITL: result.itl_ms,
        SloMetric.TPOT: result.tpot_ms,
        SloMetric.E2E: result.e2e_ms,
    }
    for objective in spec.slo.objectives():
        value = getattr(fields[objective.metric], f"p{objective.percentile}")
        if value > objective.limit_ms:
            return False
    return True


def predict(setup: Setup, spec: WorkloadSpec, rate_per_s: float | None = None) -> Prediction:
    """One simulated run of the workload's measured window (warm-up left out)."""
    if rate_per_s is not None:
        spec = spec.with_rate(rate_per_s)
    schedule = [r for r in build_schedule(spec) if not r.warmup]
    origin = min((r.send_s for r in schedule), default=0.0)
    schedule = [_shift(r, origin) for r in schedule]
    limits = {o.metric: o.limit_ms for o in spec.slo.objectives()}
    slo = Slo(
        ttft_s=limits.get(SloMetric.TTFT, math.inf) / 1000.0,
        tpot_s=min(limits.get(SloMetric.TPOT, math.inf), limits.get(SloMetric.ITL, math.inf))
        / 1000.0,
    )
    # Cut where a measured level is cut (tuner.rate_search.drain_s), not at the last answer.
    drain = max(4.0, 1.5 * limits.get(SloMetric.TTFT, 0.0) / 1000.0)
    plan, result = simulate_schedule(setup, schedule, slo, stop_at_s=spec.duration_s + drain)
    rate = rate_per_s if rate_per_s is not None else (spec.mean_rate_per_s or 0.0)
    met = result is not None and slo_met(spec, result)
    return Prediction(rate_per_s=rate, plan=plan, result=result, met=met)


def max_rate(
    setup: Setup,
    spec: WorkloadSpec,
    *,
    start_rate_per_s: float | None = None,
    precision: float = 0.05,
    max_runs: int = 12,
) -> float:
    """The highest arrival rate whose simulated run meets the SLO (0: none does).

    Brackets from ``start_rate_per_s`` (default: the workload's) by doubling or
    halving, then bisects to ``precision`` (relative).
    """
    rate = start_rate_per_s or spec.mean_rate_per_s
    if rate is None:  # closed: no rate to search
        return 0.0
    low: float | None = None
    high: float | None = None
    for _ in range(max_runs):
        if predict(setup, spec, rate).met:
            low = rate
        else:
            high = rate
        if high is None:
            rate *= 2.0
        elif low is None:
            if rate < 1e-3:
                return 0.0
            rate /= 2.0
        elif high / low <= 1.0 + precision:
            break
        else:
            rate = math.sqrt(low * high)
    return low or 0.0


def _shift(request: ScheduledRequest, origin: float) -> ScheduledRequest:
    from dataclasses import replace

    return replace(request, send_s=request.send_s - origin)

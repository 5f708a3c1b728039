"""The simulated engine's fast path (``tuner.sim.deferred``, ``run``'s default) against the
engine stepped one step at a time (``run(step_by_step=True)``, as ``tuner sim-serve`` runs it):
the same runs.

Each scenario runs both ways and checks what the summary reports: the same finished and
failed requests, generated tokens, preemptions and prefix-cache hit rate, and every
latency percentile within 1 %. The paths are in fact identical (the same step
durations, tokens, token times and blocks), which the scenarios check too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tuner.serving.level_schedule import level_workload
from tuner.sim import simulate
from tuner.sim.blocks import EvictionPolicy
from tuner.sim.build import SimOptions, build_engine
from tuner.sim.cpu_tier import OffloadPolicy, TransferType
from tuner.sim.deferred import DeferredStepper, StepOutcome
from tuner.sim.engine import RequestStatus, SimEngine, SimRequest
from tuner.sim.simulate import SimulationResult, run, synthetic_arrivals
from tuner.twin import prediction as predict
from tuner.twin.prediction import Setup, simulate_schedule
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import MemoryPlan, ServingParams
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion
from workloads.build import build_schedule
from workloads.slo import Slo
from workloads.spec import load_workload
from workloads.traces import TraceRecord

LLAMA = resolve_model("llama-3.1-8b")
SLO = Slo.p99(ttft_ms=2000.0, tpot_ms=100.0)
PERCENTILES = [
    (metric, q)
    for metric in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
    for q in ("p50", "p90", "p99")
]
# A request's state at the end of a run: what each path must leave the same.
REQUEST_STATE = (
    "status", "num_computed_tokens", "output_token_ids", "token_times_s", "block_ids",
    "block_hashes", "num_cached_blocks", "num_preemptions", "cached_prompt_tokens",
    "first_token_s", "last_token_s", "finish_s", "finish_reason",
)  # fmt: skip


class _Recording(SimEngine):
    """A SimEngine that keeps every request it was given."""

    def __init__(self, engine: SimEngine) -> None:
        super().__init__(engine.config, engine.timer)
        self.added: list[SimRequest] = []
        self.swaps = 0

    def add_request(self, request: SimRequest) -> None:
        self.added.append(request)
        super().add_request(request)

    def _preempt(self, request: SimRequest, now_s: float) -> float:
        cost_s = super()._preempt(request, now_s)
        self.swaps += request.status is RequestStatus.SWAPPED
        return cost_s


@dataclasses.dataclass
class _Run:
    result: SimulationResult
    engine: _Recording


EngineFactory = Callable[[], SimEngine]


def _engine(
    gpu: str = "H100-80GB",
    options: SimOptions | None = None,
    version: VllmVersion | None = None,
    **params: Any,
) -> EngineFactory:
    def make() -> SimEngine:
        plan, engine = build_engine(
            LLAMA, get_gpu(gpu), ServingParams(**params), version or VllmVersion.current(), options
        )
        assert engine is not None, plan.failure
        return engine

    return make


def _run_both(make: EngineFactory, records: list[TraceRecord], **kwargs: Any) -> list[_Run]:
    runs = []
    for step_by_step in (True, False):
        engine = _Recording(make())
        result = run(
            engine, records, slo=SLO, vocab=LLAMA.vocab_size,
            max_model_len=engine.config.max_model_len, step_by_step=step_by_step, **kwargs,
        )  # fmt: skip
        runs.append(_Run(result, engine))
    return runs


def _assert_same(slow: _Run, fast: _Run) -> None:
    """The brief's equivalence, then the stronger fact: the very same run."""
    a, b = slow.result, fast.result
    assert (a.num_finished, a.num_failed) == (b.num_finished, b.num_failed)
    assert slow.engine.generation_tokens_total == fast.engine.generation_tokens_total
    assert a.num_preemptions == b.num_preemptions
    assert a.prefix_cache_hit_rate == b.prefix_cache_hit_rate
    for metric, q in PERCENTILES:
        x, y = getattr(getattr(a, metric), q), getattr(getattr(b, metric), q)
        assert (x is None) == (y is None), (metric, q)
        if x is not None:
            assert y == pytest.approx(x, rel=0.01), (metric, q)
    assert a.model_dump() == b.model_dump()
    assert a.samples == b.samples and a.arrivals_s == b.arrivals_s
    assert len(slow.engine.added) == len(fast.engine.added)
    for x, y in zip(slow.engine.added, fast.engine.added, strict=True):
        for name in REQUEST_STATE:
            assert getattr(x, name) == getattr(y, name), (x.request_id, name)
    assert [r.request_id for r in slow.engine.running] == [
        r.request_id for r in fast.engine.running
    ]
    assert slow.engine.pool.num_free == fast.engine.pool.num_free


def _overload(duration_s: float = 30.0) -> list[TraceRecord]:
    """Long requests faster than a small KV cache drains them: preemptions."""
    return synthetic_arrivals(
        rate_per_s=8, duration_s=duration_s, prompt_tokens=1500, output_tokens=700,
        shared_prefix_tokens=500, shared_fraction=0.5,
    )  # fmt: skip


SMALL_CACHE = {"max_model_len": 8192, "gpu_memory_utilization": 0.25}  # ~1200 blocks on an H100


@pytest.fixture
def captured_engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[_Recording]]:
    """The engines ``simulate_schedule`` builds, recording their requests."""
    engines: list[_Recording] = []

    def recording_build(*args: Any, **kwargs: Any) -> tuple[MemoryPlan, SimEngine | None]:
        plan, engine = build_engine(*args, **kwargs)
        if engine is None:
            return plan, None
        engines.append(_Recording(engine))
        return plan, engines[-1]

    monkeypatch.setattr(predict, "build_engine", recording_build)
    yield engines


def _schedule_both(
    engines: list[_Recording], setup: Setup, workload: str, rate: float | None, **kwargs: Any
) -> list[_Run]:
    spec = load_workload(workload)
    level = level_workload(spec, rate, 60.0, window=(0.0, 60.0))
    schedule = build_schedule(level)
    runs = []
    for step_by_step in (True, False):
        _, result = simulate_schedule(
            setup, schedule, level.slo, step_by_step=step_by_step, **kwargs
        )
        assert result is not None
        runs.append(_Run(result, engines[-1]))
    return runs


def test_chat_conversations_reusing_their_history(captured_engines: list[_Recording]) -> None:
    setup = Setup(LLAMA, get_gpu("H100-80GB"), VllmVersion.current(), ServingParams())
    slow, fast = _schedule_both(
        captured_engines, setup, "chat", 5.75, stop_at_s=70.0, measure_from_s=0.0,
        measure_to_s=60.0, sample_every_s=0.25,
    )  # fmt: skip
    assert slow.result.prefix_cache_hit_rate > 0.1  # later turns hit their history
    assert slow.result.num_finished > 500
    _assert_same(slow, fast)


def test_the_code_trace(captured_engines: list[_Recording]) -> None:
    setup = Setup(LLAMA, get_gpu("H100-80GB"), VllmVersion.current(), ServingParams())
    slow, fast = _schedule_both(captured_engines, setup, "code", 4.0, stop_at_s=66.0)
    assert slow.result.num_finished > 100
    _assert_same(slow, fast)


def test_an_overload_that_preempts() -> None:
    slow, fast = _run_both(_engine(**SMALL_CACHE), _overload())
    assert slow.result.num_preemptions > 50
    _assert_same(slow, fast)


@pytest.mark.parametrize("policy", list(EvictionPolicy))
def test_preemption_under_each_eviction_policy(policy: EvictionPolicy) -> None:
    make = _engine(options=SimOptions(eviction_policy=policy), **SMALL_CACHE)
    slow, fast = _run_both(make, _overload(15.0))
    assert slow.result.num_preemptions > 0
    _assert_same(slow, fast)


def test_preemption_swapping_to_host_memory() -> None:
    make = _engine(
        options=SimOptions(swap_space_gib=0.5), version=VllmVersion.parse("0.10"), **SMALL_CACHE
    )
    slow, fast = _run_both(make, _overload(20.0))
    assert slow.engine.swaps > 10  # swapped out to host memory, then back in
    _assert_same(slow, fast)


@pytest.mark.parametrize("policy", list(OffloadPolicy))
def test_kv_offloading_to_cpu_memory(policy: OffloadPolicy) -> None:
    make = _engine(
        options=SimOptions(kv_offloading_size_gib=4.0, offload_policy=policy), **SMALL_CACHE
    )
    slow, fast = _run_both(make, _overload(15.0))
    tiers = [run.engine.cpu_tier for run in (slow, fast)]
    assert tiers[0] is not None and tiers[1] is not None
    assert tiers[0].transfers[TransferType.LOAD].count > 0  # preempted ones came back
    assert tiers[0].external_hits_tokens == tiers[1].external_hits_tokens
    assert tiers[0].transfers == tiers[1].transfers
    _assert_same(slow, fast)


def test_without_prefix_caching() -> None:
    make = _engine(options=SimOptions(enable_prefix_caching=False), **SMALL_CACHE)
    slow, fast = _run_both(make, _overload(15.0))
    assert slow.result.prefix_cache_hit_rate == 0.0
    _assert_same(slow, fast)


def test_a_run_cut_at_stop_at_s_counts_the_requests_still_running() -> None:
    records = synthetic_arrivals(rate_per_s=5, duration_s=30, prompt_tokens=800, output_tokens=600)
    slow, fast = _run_both(_engine("L4-24GB", max_model_len=8192), records, stop_at_s=12.0)
    assert slow.engine.running and slow.result.tpot_ms.count > slow.result.num_finished
    _assert_same(slow, fast)


def test_answers_cut_by_max_model_len() -> None:
    records = synthetic_arrivals(
        rate_per_s=10, duration_s=10, prompt_tokens=1500, output_tokens=900
    )
    slow, fast = _run_both(_engine(max_model_len=2048), records)
    lengths = {len(r.output_token_ids) for r in slow.engine.added}
    assert lengths == {2048 - 1500}  # max_tokens is cut to what the context leaves
    _assert_same(slow, fast)


@pytest.mark.parametrize("block_size", [1, 32])
def test_other_block_sizes(block_size: int) -> None:
    base = _engine(max_model_len=4096)()
    config = dataclasses.replace(
        base.config, block_size=block_size, num_gpu_blocks=8000 // block_size
    )

    def make() -> SimEngine:
        return SimEngine(config, base.timer)

    records = synthetic_arrivals(
        rate_per_s=10, duration_s=8, prompt_tokens=300, output_tokens=300,
        shared_prefix_tokens=100, shared_fraction=0.5,
    )  # fmt: skip
    slow, fast = _run_both(make, records)
    _assert_same(slow, fast)


def test_identical_prompts_whose_answers_collide() -> None:
    """Every prompt the same and a 50-token vocabulary: requests whose ids give the same
    output tokens share output blocks, so the order of caching and eviction inside a
    step decides which block holds a hash."""
    base = _engine(max_model_len=4096)()
    config = dataclasses.replace(base.config, num_gpu_blocks=900, vocab_size=50)

    def make() -> SimEngine:
        return SimEngine(config, base.timer)

    records = synthetic_arrivals(
        rate_per_s=20, duration_s=10, prompt_tokens=256, output_tokens=400,
        shared_prefix_tokens=256, shared_fraction=1.0,
    )  # fmt: skip
    slow, fast = _run_both(make, records)
    output_blocks = [h for r in slow.engine.added for h in r.block_hashes[256 // 16 :]]
    assert len(set(output_blocks)) < len(output_blocks)  # answers' blocks shared
    assert slow.result.num_preemptions > 0
    _assert_same(slow, fast)


def test_plain_engine_steps_mixed_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path's fallback (the engine's own step, every deferred token written
    first) in the middle of a run leaves it the same run."""

    class Mixed(DeferredStepper):
        def step(self, now_s: float) -> StepOutcome:
            if self.step_index % 7 == 3:
                return self._plain_step(now_s)
            return super().step(now_s)

    monkeypatch.setattr(simulate, "DeferredStepper", Mixed)
    slow, fast = _run_both(_engine(**SMALL_CACHE), _overload(15.0))
    assert slow.result.num_preemptions > 0
    _assert_same(slow, fast)

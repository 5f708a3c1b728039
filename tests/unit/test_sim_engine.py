"""The simulated engine's scheduler, block pool and timing, without any socket."""

from __future__ import annotations

import pytest

from tuner.sim.blocks import BlockPool, EvictionPolicy
from tuner.sim.build import SimOptions, build_engine
from tuner.sim.engine import RequestStatus, SimEngine, SimRequest, block_hashes
from tuner.sim.timing import StepWork
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion

MODEL = resolve_model("llama-3.1-8b")
H100 = get_gpu("H100-80GB")
CURRENT = VllmVersion.current()


def engine(*, kv_bytes: int | None = None, max_model_len: int = 8192, **kw: object) -> SimEngine:
    params = ServingParams(max_model_len=max_model_len, kv_cache_memory_bytes=kv_bytes, **kw)  # type: ignore[arg-type]
    plan, eng = build_engine(MODEL, H100, params, CURRENT)
    assert eng is not None, plan.failure
    return eng


def drain(eng: SimEngine, limit: int = 100_000) -> float:
    now = 0.0
    for _ in range(limit):
        if not eng.has_work:
            return now
        now += eng.step(now).duration_s
    raise AssertionError("engine did not finish")


def req(i: int, prompt: list[int], out: int = 8) -> SimRequest:
    return SimRequest(request_id=f"r{i}", prompt_token_ids=prompt, max_tokens=out, arrival_s=0.0)


def test_every_request_gets_exactly_max_tokens() -> None:
    eng = engine()
    reqs = [req(i, list(range(i, i + 100)), out=5 + i) for i in range(20)]
    for r in reqs:
        eng.add_request(r)
    drain(eng)
    assert [len(r.output_token_ids) for r in reqs] == [5 + i for i in range(20)]
    assert eng.generation_tokens_total == sum(5 + i for i in range(20))
    assert eng.prompt_tokens_total == 20 * 100
    assert all(r.status is RequestStatus.FINISHED for r in reqs)
    assert eng.pool.usage == 0.0


def test_chunked_prefill_splits_a_long_prompt_across_steps() -> None:
    eng = engine(max_num_batched_tokens=2048)
    r = req(0, list(range(7000)), out=1)
    eng.add_request(r)
    steps = 0
    now = 0.0
    while eng.has_work:
        result = eng.step(now)
        assert result.num_scheduled_tokens <= 2048
        now += result.duration_s
        steps += 1
    assert steps == 4  # 2048 + 2048 + 2048 + 856


def test_max_num_seqs_bounds_the_batch() -> None:
    eng = engine(max_num_seqs=4)
    for i in range(12):
        eng.add_request(req(i, [i] * 50, out=20))
    now = 0.0
    while eng.has_work:
        result = eng.step(now)
        assert result.num_running <= 4
        now += result.duration_s


def test_shared_prefix_hits_the_cache() -> None:
    eng = engine()
    system = list(range(1000, 1000 + 16 * 20))  # 20 full blocks
    first = req(0, [*system, 1, 2, 3])
    eng.add_request(first)
    drain(eng)
    second = req(1, [*system, 7, 8, 9])
    eng.add_request(second)
    drain(eng)
    assert second.cached_prompt_tokens == 16 * 20
    assert eng.prefix_hits_tokens == 16 * 20
    assert eng.prefix_queries_tokens == 2 * (16 * 20 + 3)


def test_requests_admitted_in_the_same_step_share_the_prefix_blocks() -> None:
    """vLLM caches a block when it is scheduled, so the next admission reuses it at once."""
    eng = engine()
    system = list(range(1000, 1000 + 16 * 4))  # 4 full blocks
    first, second = req(0, [*system, 1, 2, 3]), req(1, [*system, 7, 8, 9])
    eng.add_request(first)
    eng.add_request(second)
    result = eng.step(0.0)
    assert result.num_running == 2
    assert second.cached_prompt_tokens == 16 * 4
    assert result.num_scheduled_tokens == (16 * 4 + 3) + 3
    assert first.block_ids[:4] == second.block_ids[:4]


def test_output_blocks_are_cached_for_a_resumed_request() -> None:
    eng = engine()
    r = req(0, list(range(40)), out=40)  # 80 tokens: 5 full blocks, 3 of them past the prompt
    eng.add_request(r)
    drain(eng)
    assert r.block_hashes[:2] == block_hashes(list(range(40)), 16)[:2]
    assert len(r.block_hashes) == 80 // 16
    # The last output token never goes through the model, so its block is never cached.
    assert len(eng.pool.lookup(r.block_hashes, now_s=1.0)) == 4


def test_the_null_block_is_never_handed_out() -> None:
    pool = BlockPool(8)
    assert pool.num_free == 7
    assert pool.allocate(8, now_s=0.0) is None
    blocks = pool.allocate(7, now_s=0.0)
    assert blocks is not None and 0 not in blocks
    assert pool.usage == 1.0


@pytest.mark.parametrize(("version", "admitted_at_once"), [("0.18", True), ("0.19", False)])
def test_from_0_19_a_prompt_waits_until_it_fits_whole(version: str, admitted_at_once: bool) -> None:
    """scheduler_reserve_full_isl: the first chunk fitting is no longer enough."""
    params = ServingParams(
        max_model_len=1024, kv_cache_memory_bytes=64 * 2 * 1024 * 1024, max_num_batched_tokens=128
    )
    _, eng = build_engine(MODEL, H100, params, VllmVersion.parse(version))
    assert eng is not None and eng.pool.num_free == 63
    running = req(0, list(range(600)), out=200)  # holds 38 blocks once prefilled
    eng.add_request(running)
    now = 0.0
    while running.first_token_s is None:
        now += eng.step(now).duration_s
    long = req(1, list(range(5000, 5500)), out=1)  # needs 32 blocks, 8 for its first chunk
    eng.add_request(long)
    eng.step(now)
    assert (long.status is RequestStatus.RUNNING) is admitted_at_once
    drain(eng)
    assert len(long.output_token_ids) == 1 and len(running.output_token_ids) == 200


def test_a_small_kv_cache_preempts_and_still_finishes_everything() -> None:
    eng = engine(kv_bytes=64 * 2 * 1024 * 1024, max_model_len=1024)  # 64 blocks of 16 tokens
    reqs = [req(i, list(range(i * 1000, i * 1000 + 200)), out=100) for i in range(8)]
    for r in reqs:
        eng.add_request(r)
    drain(eng)
    assert eng.num_preemptions > 0
    assert all(len(r.output_token_ids) == 100 for r in reqs)


def test_swap_space_moves_preempted_requests_to_host_instead_of_recomputing() -> None:
    params = ServingParams(max_model_len=1024, kv_cache_memory_bytes=64 * 2 * 1024 * 1024)
    _, recompute = build_engine(MODEL, H100, params, VllmVersion.parse("0.17"))
    _, swapping = build_engine(
        MODEL, H100, params, VllmVersion.parse("0.17"), SimOptions(swap_space_gib=4)
    )
    assert recompute is not None and swapping is not None
    assert swapping.config.swap_blocks > 0
    seen_swapped = False
    for eng in (recompute, swapping):
        for i in range(8):
            eng.add_request(req(i, list(range(i * 1000, i * 1000 + 200)), out=100))
        now = 0.0
        while eng.has_work:
            now += eng.step(now).duration_s
            seen_swapped |= any(r.status is RequestStatus.SWAPPED for r in eng.waiting)
    assert seen_swapped
    assert recompute.num_preemptions > 0 and swapping.num_preemptions > 0
    # Under 0.18+ there is no swap space at all.
    _, modern = build_engine(MODEL, H100, params, CURRENT, SimOptions(swap_space_gib=4))
    assert modern is not None and modern.config.swap_blocks == 0


def test_decode_step_time_is_bandwidth_bound() -> None:
    eng = engine()
    one = eng.timer.step_s(
        StepWork(num_tokens=1, num_seqs=1, context_tokens=1000, attention_pairs=1000)
    )
    # 16 GB of weights at 80% of 3.35 TB/s is about 6 ms, plus overhead.
    assert 0.005 < one < 0.009
    big = eng.timer.step_s(
        StepWork(num_tokens=8192, num_seqs=8, context_tokens=8192, attention_pairs=4e6)
    )
    assert big > 10 * one  # a full prefill chunk is compute-bound


def test_fp8_kv_cache_reads_half_the_bytes() -> None:
    auto = engine()
    fp8 = engine(kv_cache_dtype="fp8")
    work = StepWork(
        num_tokens=256, num_seqs=256, context_tokens=256 * 4000, attention_pairs=256 * 4000
    )
    assert fp8.timer.step_s(work) < auto.timer.step_s(work)
    assert fp8.config.num_gpu_blocks == pytest.approx(2 * auto.config.num_gpu_blocks, rel=0.01)


def test_logprobs_beyond_the_headroom_kill_the_engine() -> None:
    params = ServingParams(max_model_len=8192, gpu_memory_utilization=0.99)
    _, eng = build_engine(MODEL, H100, params, VllmVersion.parse("0.11"))
    assert eng is not None
    for i in range(800):
        eng.add_request(
            SimRequest(
                request_id=f"l{i}",
                prompt_token_ids=[i] * 10,
                max_tokens=4,
                arrival_s=0.0,
                logprobs=5,
            )
        )
    with pytest.raises(Exception, match="CUDA out of memory"):
        drain(eng)
    assert eng.dead is not None


@pytest.mark.parametrize("policy", list(EvictionPolicy))
def test_eviction_policies_choose_their_victim(policy: EvictionPolicy) -> None:
    pool = BlockPool(5, policy)  # 4 blocks and the null block
    blocks = pool.allocate(4, now_s=0.0)
    assert blocks is not None
    for i, block in enumerate(blocks):
        pool.cache_block(block, block_hash=100 + i, depth=i, now_s=float(i))
    # Block 0 is reused three times; all are then freed at different times.
    for t in (1.0, 2.0, 3.0):
        pool.lookup([100], now_s=t)
    pool.free(blocks[::-1], now_s=4.0)
    pool.free([blocks[0]] * 3, now_s=5.0)
    assert pool.num_free == 4
    victim = pool.allocate(1, now_s=6.0)
    assert victim is not None
    if policy is EvictionPolicy.LFU:
        assert victim[0] != blocks[0]  # the most reused block survives
    if policy is EvictionPolicy.LRU:
        assert victim[0] != blocks[0]  # it was also the most recently freed
    assert pool.lookup([100 + blocks.index(victim[0])], now_s=7.0) == []

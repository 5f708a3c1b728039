"""KV offloading to CPU memory in the simulated engine: the tier's capacity, vLLM's lru and
arc policies, store_threshold, and what a CPU hit does to a request's time to first token."""

from __future__ import annotations

from itertools import pairwise

import pytest

from tuner.sim.build import SimOptions, build_engine
from tuner.sim.cpu_tier import CpuTier, CpuTierConfig, OffloadPolicy, TransferType
from tuner.sim.engine import SimEngine, SimRequest
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion

MODEL = resolve_model("llama-3.1-8b")
H100 = get_gpu("H100-80GB")
BLOCK_BYTES = 2 * 8 * 128 * 2 * 16 * 32  # llama-3.1-8b, bf16, 16-token blocks: 2 MiB


def tier(blocks: int, policy: OffloadPolicy = OffloadPolicy.LRU, threshold: int = 0) -> CpuTier:
    return CpuTier(
        CpuTierConfig(
            num_blocks=blocks,
            bytes_per_block=BLOCK_BYTES,
            host_link_bytes_per_s=50e9,
            policy=policy,
            store_threshold=threshold,
        )
    )


def test_capacity_in_blocks_is_the_size_over_a_blocks_bytes() -> None:
    config = CpuTierConfig.sized(4.0, BLOCK_BYTES, 50e9)
    assert BLOCK_BYTES == 2 << 20
    assert config.num_blocks == 2048  # 4 GiB of 2 MiB blocks
    small = tier(3)
    assert small.offer([1, 2, 3, 4, 5], 0.0) == 0  # more than the tier: the store is dropped
    assert small.offer([1, 2], 0.0) == 2
    assert small.offer([3, 4], 0.0) == 2  # one evicted to make room
    assert small.num_stored == 3
    assert small.evictions == 1
    assert small.usage == 1.0


def test_a_transfer_takes_its_bytes_over_the_host_link_one_direction_at_a_time() -> None:
    t = tier(100)
    t.offer(list(range(10)), 0.0)
    done = t.load(10, 0.0)
    assert done == pytest.approx(10 * BLOCK_BYTES / 50e9)
    assert t.load(10, 0.0) == pytest.approx(2 * done)  # queued behind the first load
    stores = t.transfers[TransferType.STORE]
    assert stores.bytes == 10 * BLOCK_BYTES and stores.count == 1


def _scan_workload(t: CpuTier) -> int:
    """A hot prefix of 4 blocks, asked for again after every 3 one-off scans of 4 blocks,
    in a tier of 8: the hits on the hot prefix. Under LRU the second scan after it pushes
    it out; ARC keeps it in T2 (seen twice) and evicts the scans from T1."""
    hot = [1, 2, 3, 4]
    hits = 0
    t.offer(hot, 0.0)
    t.touch(hot)  # a second request with the prefix: T1 -> T2 under ARC
    for i in range(10):
        for j in range(3):
            scan = [1000 + 100 * i + 10 * j + k for k in range(4)]
            t.touch(scan)
            t.lookup(scan)
            t.offer(scan, 0.0)
        t.touch(hot)
        found = t.lookup(hot)
        hits += found
        if found < len(hot):
            t.offer(hot, 0.0)
    return hits


def test_arc_keeps_a_reused_prefix_that_lru_loses_to_scans() -> None:
    lru_hits = _scan_workload(tier(8, OffloadPolicy.LRU))
    arc_hits = _scan_workload(tier(8, OffloadPolicy.ARC))
    assert arc_hits == 10 * 4
    assert lru_hits == 0


def test_arc_ghost_hits_move_its_target() -> None:
    t = tier(2, OffloadPolicy.ARC)
    policy = t.policy
    t.offer([1, 2], 0.0)
    t.offer([3], 0.0)  # evicts 1 from T1 into B1
    assert 1 not in policy and t.lookup([1]) == 0
    t.touch([1])  # a request asks for 1 again: recency matters, T1's target grows
    assert policy.target_t1 == 1.0


def test_store_threshold_stores_a_block_only_once_it_was_offered_that_often() -> None:
    t = tier(100, threshold=2)
    assert t.offer([1, 2], 0.0) == 0
    assert t.stores_skipped == 2
    assert t.offer([1, 2], 0.0) == 2  # the second request with the same blocks
    assert t.lookup([1, 2]) == 2
    plain = tier(100)
    assert plain.offer([1, 2], 0.0) == 2


def offload_engine(
    size_gib: float, kv_bytes: int, max_model_len: int, **options: object
) -> SimEngine:
    params = ServingParams(max_model_len=max_model_len, kv_cache_memory_bytes=kv_bytes)
    plan, eng = build_engine(
        MODEL,
        H100,
        params,
        VllmVersion.current(),
        SimOptions(kv_offloading_size_gib=size_gib, **options),  # type: ignore[arg-type]
    )
    assert eng is not None, plan.failure
    return eng


def run_alone(eng: SimEngine, request: SimRequest, start_s: float) -> float:
    """Run one request from ``start_s`` to its end; its time to first token."""
    request.arrival_s = start_s
    eng.add_request(request)
    now = start_s
    while eng.has_work:
        now += eng.step(now).duration_s
    assert request.first_token_s is not None
    return request.first_token_s - start_s


def _prompt(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i) % 120_000 for i in range(n)]


@pytest.mark.parametrize("prefix_tokens", [2048, 4096])
def test_a_cpu_hit_is_faster_than_a_recompute_and_slower_than_a_gpu_hit(
    prefix_tokens: int,
) -> None:
    long = _prompt(1, prefix_tokens)
    # A GPU cache of ~1.1 prefixes: a second long prompt evicts the first from the GPU.
    kv_bytes = int(1.1 * prefix_tokens * BLOCK_BYTES / 16)
    eng = offload_engine(8.0, kv_bytes, prefix_tokens + 64)
    cold = run_alone(eng, SimRequest("a", [*long, 1], 1, 0.0), 0.0)
    gpu_hit = run_alone(eng, SimRequest("b", [*long, 2], 1, 0.0), 10.0)
    run_alone(eng, SimRequest("c", [*_prompt(2, prefix_tokens), 3], 1, 0.0), 20.0)
    cpu_hit = run_alone(eng, SimRequest("d", [*long, 4], 1, 0.0), 30.0)
    tier_ = eng.cpu_tier
    assert tier_ is not None
    # The prefix's head stayed on the GPU (its tail is evicted first), the rest came back
    # from the CPU: nothing of it recomputed.
    assert tier_.external_hits_tokens > 0.8 * prefix_tokens
    assert eng.prefix_hits_tokens + tier_.external_hits_tokens >= 2 * prefix_tokens
    assert gpu_hit < cpu_hit < cold
    load_s = tier_.external_hits_tokens / 16 * BLOCK_BYTES / H100.pcie_bandwidth_bytes_per_s
    assert cpu_hit == pytest.approx(load_s + gpu_hit, rel=0.25)
    assert cold / cpu_hit > 2  # vLLM's post: 2-22x lower TTFT on CPU hits


def test_without_offloading_the_evicted_prefix_is_recomputed() -> None:
    long = _prompt(1, 4096)
    kv_bytes = int(1.1 * 4096 * BLOCK_BYTES / 16)
    params = ServingParams(max_model_len=4096 + 64, kv_cache_memory_bytes=kv_bytes)
    _, eng = build_engine(MODEL, H100, params, VllmVersion.current())
    assert eng is not None and eng.cpu_tier is None
    cold = run_alone(eng, SimRequest("a", [*long, 1], 1, 0.0), 0.0)
    run_alone(eng, SimRequest("c", [*_prompt(2, 4096), 3], 1, 0.0), 20.0)
    again = run_alone(eng, SimRequest("d", [*long, 4], 1, 0.0), 30.0)
    assert again > 0.85 * cold  # only the head of the prefix was still on the GPU


def test_a_request_loading_from_the_cpu_does_not_stop_the_others() -> None:
    long = _prompt(1, 16384)
    kv_bytes = int(1.2 * 16384 * BLOCK_BYTES / 16)
    eng = offload_engine(8.0, kv_bytes, 16384 + 64)
    run_alone(eng, SimRequest("a", [*long, 1], 1, 0.0), 0.0)
    run_alone(eng, SimRequest("c", [*_prompt(2, 16384), 3], 1, 0.0), 10.0)
    decoding = SimRequest("e", _prompt(3, 64), 200, 20.0)
    eng.add_request(decoding)
    now = 20.0
    while len(decoding.output_token_ids) < 10:
        now += eng.step(now).duration_s
    loading = SimRequest("d", [*long, 4], 1, now)
    eng.add_request(loading)
    while eng.has_work:
        now += eng.step(now).duration_s
    load_s = loading.load_done_s - loading.arrival_s
    assert load_s > 0.02
    gaps = [b - a for a, b in pairwise(decoding.token_times_s)]
    assert max(gaps) < 0.5 * load_s  # the batch decoded on while the load ran

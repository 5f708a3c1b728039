"""The simulated engine's ground truth of prefix misses (``tuner.sim.lost_history``) and
its ``--kv-cache-metrics`` residency samples (``tuner.sim.residency``)."""

from __future__ import annotations

import itertools

from tuner.sim.build import SimOptions, build_engine
from tuner.sim.engine import SimEngine, SimRequest
from tuner.sim.lost_history import LostHistory, MissCause, MissedBy
from tuner.sim.residency import ResidencyRecorder
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion

MODEL = resolve_model("llama-3.1-8b")  # 128 KiB of KV a token: a 16-token block is 2 MiB
H100 = get_gpu("H100-80GB")
_ids = itertools.count()


def engine(kv_mib: int, *, sample: float | None = None) -> SimEngine:
    params = ServingParams(max_model_len=2560, kv_cache_memory_bytes=kv_mib << 20)
    options = SimOptions(kv_cache_metrics_sample=sample)
    plan, eng = build_engine(MODEL, H100, params, VllmVersion.current(), options)
    assert eng is not None, plan.failure
    return eng


def run(
    eng: SimEngine, prompts: list[list[int]], now_s: float, out: int = 16
) -> tuple[float, list[SimRequest]]:
    reqs = [
        SimRequest(request_id=f"r{next(_ids)}", prompt_token_ids=p, max_tokens=out, arrival_s=now_s)
        for p in prompts
    ]
    for r in reqs:
        eng.add_request(r)
    while eng.has_work:
        now_s += eng.step(now_s).duration_s
    return now_s, reqs


def chat_with_floods(kv_mib: int, *, flood: int, sample: float | None = None) -> SimEngine:
    """Four conversations of four turns (each turn: the history, its answer, 300 new
    tokens); between turns, ``flood`` one-off requests of 400 tokens each."""
    eng = engine(kv_mib, sample=sample)
    token = itertools.count(1)
    history = {c: [next(token) for _ in range(800)] for c in range(4)}
    now = 0.0
    for _turn in range(4):
        now, turns = run(eng, list(history.values()), now)
        for c, r in zip(history, turns, strict=True):
            history[c] = [*r.prompt_token_ids, *r.output_token_ids] + [
                next(token) for _ in range(300)
            ]
        now, _ = run(eng, [[next(token) for _ in range(400)] for _ in range(flood)], now + 5.0)
        now += 5.0
    return eng


def test_long_conversations_losing_their_kv_to_short_requests_show_a_high_share() -> None:
    small = chat_with_floods(384, flood=40)  # 3072 tokens: under a flood of 16,000
    history = small.pool.history
    assert history is not None
    assert history.continuing_requests == 12  # turns 2 to 4 of four conversations
    assert history.history_evicted_requests == 12
    share = history.evicted_under_way_share
    assert share is not None and share > 0.6, history.miss_tokens


def test_a_roomy_cache_shows_no_conversation_evicted() -> None:
    roomy = chat_with_floods(4096, flood=40)
    history = roomy.pool.history
    assert history is not None
    assert history.continuing_requests == 12
    assert history.history_evicted_requests == 0
    assert history.evicted_under_way_share == 0.0
    assert history.miss_tokens[MissedBy.CONTINUING, MissCause.NEW] > 0  # the new messages


def test_a_shared_prefix_evicted_is_not_a_conversation_under_way() -> None:
    lost = LostHistory(block_size=16)
    system = [1, 2, 3]  # three block hashes of a system prompt another conversation sent
    lost.turn_ended([*system, 4, 5], 5)
    for h in system:
        lost.evicted(h)
    lost.admitted([*system, 9, 10], usable=5, hit_blocks=0)  # a new conversation
    assert lost.miss_tokens[MissedBy.OTHER, MissCause.EVICTED] == 3 * 16
    assert lost.miss_tokens[MissedBy.OTHER, MissCause.NEW] == 2 * 16
    assert lost.continuing_requests == 0
    assert lost.evicted_under_way_share is None  # no later turn missed


def test_residency_samples_end_in_eviction_events_with_vllms_times() -> None:
    rec = ResidencyRecorder(1.0, prefix_caching=True)
    rec.allocated([7], 1.0)
    rec.accessed([7], 3.0)
    rec.accessed([7], 4.5)
    assert rec.drain() == []
    rec.allocated([7], 10.0)  # handed out again: its last life ends
    (event,) = rec.drain()
    assert (event.lifetime_s, event.idle_s, event.reuse_gaps_s) == (9.0, 5.5, (1.5,))
    off = ResidencyRecorder(1.0, prefix_caching=False)  # vLLM evicts only with caching on
    off.allocated([7], 1.0)
    off.allocated([7], 2.0)
    assert off.drain() == []


def test_the_engine_samples_evictions_under_pressure() -> None:
    eng = chat_with_floods(384, flood=40, sample=1.0)
    residency = eng.pool.residency
    assert residency is not None
    events = residency.drain()
    assert len(events) > 100
    assert all(e.lifetime_s >= e.idle_s >= 0 for e in events)

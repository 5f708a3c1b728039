"""A level's plan (warm-up and window lengths) and when its window opens (tuner.serving.window)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest

from tuner.serving.level_schedule import plan_level_schedule
from tuner.serving.load import plan_schedule, split_warmup
from tuner.serving.prometheus_scrape import MetricsSample
from tuner.serving.window import (
    FAR_CORRELATIONS,
    MAX_WINDOW_REQUESTS,
    MAX_WINDOW_S,
    MIN_SESSION_WINDOW_S,
    MIN_WINDOW_S,
    VERDICT_BAND,
    WINDOW_CORRELATIONS,
    LevelPlan,
    WindowClose,
    WindowOpening,
    held_until,
    kv_verdict_clear,
    needed_requests,
    steady_opening,
    verdict_band,
    verdict_clear,
    window_closes,
)
from tuner.twin.prediction import REFERENCE_WINDOW_S, reference_window_s
from workloads.spec import load_workload, parse_workload
from workloads.stationary import expected_turns, turn_gap_s

SINGLE = """
name: single
api: completions
arrival: {kind: poisson, rate_per_s: 10}
prompt_tokens: {kind: fixed, value: 100}
output_tokens: {kind: fixed, value: 100}
duration_s: 10
slo:
  ttft: {p90_ms: 1000}
"""


def test_a_chat_window_holds_enough_requests_for_its_p99() -> None:
    spec = load_workload("chat")
    level, plan, schedule = plan_level_schedule(spec, 2.0)
    assert plan.needed_requests == needed_requests(spec) == 200
    # About 7 requests/s at 2 conversations/s: 200 requests take about 29 s, and a chat
    # window holds at least a mean conversation's lifetime, and 60 s
    assert 5.0 < plan.requests_per_s < 9.0
    assert 200 / plan.requests_per_s < plan.window_s == MIN_SESSION_WINDOW_S
    _, slower, _ = plan_level_schedule(spec, 0.5)
    assert slower.window_s == pytest.approx(200 / slower.requests_per_s)  # 200 take longer
    # The shortest warm-up is one turn gap (think 5 s + an expected answer); the longest,
    # one turn gap per turn of the longest conversation (6).
    assert 8.0 < plan.warmup_min_s < 16.0
    assert plan.warmup_max_s == pytest.approx(6 * plan.warmup_min_s)
    assert level.duration_s == pytest.approx(plan.total_s)
    assert max(r.send_s for r in schedule) < plan.total_s


def test_a_busy_level_is_held_to_three_lifetimes_and_a_slow_one_to_the_cap() -> None:
    spec = load_workload("rag")  # no sessions: a request's lifetime sets the shortest
    _, busy, _ = plan_level_schedule(spec, 40.0)
    assert busy.window_s >= MIN_WINDOW_S
    lifetime = 0.5 + statistics.median(r.max_tokens for r in plan_schedule(spec)) * 0.03
    assert busy.window_s == pytest.approx(3 * lifetime, rel=0.15)
    _, slow, _ = plan_level_schedule(spec, 0.05)
    assert slow.window_s == MAX_WINDOW_S


def test_a_session_window_holds_a_mean_conversation() -> None:
    """A busy chat level holds 60 s (1.3 mean conversations: 3.5 turns of a turn gap);
    agent sessions, longer than 60 s, hold one mean session."""
    _, chat, _ = plan_level_schedule(load_workload("chat"), 40.0)
    assert chat.window_s == MIN_SESSION_WINDOW_S
    agent = load_workload("agent")
    _, level, schedule = plan_level_schedule(agent, 2.0)
    assert agent.sessions is not None
    median = statistics.median(r.max_tokens for r in schedule)
    lifetime = expected_turns(agent) * turn_gap_s(agent.sessions, median)
    assert level.window_s == pytest.approx(lifetime, rel=0.02)  # the provisional plan's median
    assert lifetime > MIN_SESSION_WINDOW_S


def test_a_trace_replay_measures_one_pass_or_its_busiest_stretch() -> None:
    """A replayed trace's steady state is the trace looped: a window holds one pass, and
    where a pass is longer than the longest window, the pass's busiest stretch of it."""
    spec = load_workload("code")  # 1,000 requests: a pass lasts 1000 / rate seconds
    _, quick, schedule = plan_level_schedule(spec, 4.0)
    assert quick.trace_pass_s == pytest.approx(250.0)
    assert quick.window_s == quick.longest_window_s == pytest.approx(250.0)
    opened = [r for r in schedule if quick.warmup_min_s <= r.send_s < quick.warmup_min_s + 250.0]
    assert len(opened) == pytest.approx(1000, abs=2)
    level, slow, schedule = plan_level_schedule(spec, 0.4)
    assert slow.trace_pass_s == pytest.approx(2500.0)
    assert slow.window_s == slow.longest_window_s == MAX_WINDOW_S
    start = slow.warmup_min_s
    held = sum(1 for r in schedule if start <= r.send_s < start + MAX_WINDOW_S)
    assert held > 2 * 0.4 * MAX_WINDOW_S  # the trace's bursts, not a lull
    # The same trace at the same rate from its first request puts its lull there.
    plain = spec.with_rate(0.4)
    assert level.arrival.start_share > 0.0  # type: ignore[union-attr]
    _, unplaced = split_warmup(plan_schedule(level.model_copy(update={"arrival": plain.arrival})))
    assert sum(1 for r in unplaced if start <= r.send_s < start + MAX_WINDOW_S) < held / 2
    # The twin's long reference run places its window by the same rule.
    assert reference_window_s(spec, 0.4) == REFERENCE_WINDOW_S == MAX_WINDOW_S
    assert reference_window_s(spec, 4.0) == pytest.approx(250.0)


def test_fixed_window_and_warmup_are_kept() -> None:
    spec = parse_workload(SINGLE, label="single.yaml")
    _, plan, _ = plan_level_schedule(spec, 10.0, window_s=3.0, warmup_s=1.0)
    assert (plan.window_s, plan.warmup_min_s, plan.warmup_max_s) == (3.0, 1.0, 1.0)
    _, auto, _ = plan_level_schedule(spec, 10.0)
    assert auto.needed_requests == 50  # a p90 needs 20; at least 50
    # 10 req/s: 50 requests in 5 s; three lifetimes of a 100-token answer are longer.
    assert auto.window_s == pytest.approx(3 * (0.5 + 100 * 0.03))
    assert auto.warmup_min_s == pytest.approx(2 * (0.5 + 100 * 0.03))


PLAN = LevelPlan(
    warmup_min_s=4.0, warmup_max_s=20.0, window_s=30.0, needed_requests=200, requests_per_s=10.0
)


def _samples(kv: list[float], running: list[float], every_s: float = 0.25) -> list[MetricsSample]:
    return [
        MetricsSample(
            unix_s=1000.0 + i * every_s,
            kv_cache_usage=k,
            running=r,
            waiting=0.0,
            preemptions_total=0.0,
        )
        for i, (k, r) in enumerate(zip(kv, running, strict=True))
    ]


def test_the_window_opens_once_kv_and_running_stop_rising() -> None:
    # A ramp for 6 s, then flat with noise.
    n = 60
    kv = [min(0.6, 0.1 * i * 0.25) + 0.01 * ((i * 7) % 3 - 1) for i in range(n)]
    running = [min(60.0, 10.0 * i * 0.25) + ((i * 5) % 3 - 1) for i in range(n)]
    samples = _samples(kv, running)
    opened = None
    for i in range(len(samples)):
        opened = steady_opening(
            PLAN, samples[: i + 1], start_unix_s=1000.0, now_unix_s=samples[i].unix_s,
            time_scale=1.0,
        )  # fmt: skip
        if opened is not None:
            break
    assert opened is not None and opened.steady_at_open
    assert 6.0 + 5.0 * 0.5 < opened.opened_at_s < 15.0  # the ramp has left the trailing span
    assert opened.window_s == PLAN.window_s and "kept up" in opened.test


def test_a_slow_rise_that_would_matter_over_the_window_keeps_it_closed() -> None:
    # KV usage +0.5 points a second: 0.03 over the 6-s span, 0.15 over the 30-s window.
    n = 100
    kv = [0.3 + 0.005 * i * 0.25 for i in range(n)]
    samples = _samples(kv, [50.0] * n)
    for i in range(40, n - 1):  # 10 s to 25 s: past the minimum, up to the maximum
        now = samples[i].unix_s
        opened = steady_opening(PLAN, samples[: i + 1], start_unix_s=1000.0, now_unix_s=now,
                                time_scale=1.0)  # fmt: skip
        if now - 1000.0 < PLAN.warmup_max_s:
            assert opened is None, opened
        else:
            assert opened is not None and not opened.steady_at_open
            assert opened.opened_at_s == pytest.approx(PLAN.warmup_max_s, abs=0.3)
            break
    else:
        pytest.fail("the window never opened")


def test_a_population_still_settling_from_above_keeps_it_closed() -> None:
    # Running requests fall by 4 a second: -24 over the span, -120 over the window.
    n = 100
    samples = _samples([0.5] * n, [200.0 - 4.0 * i * 0.25 for i in range(n)])
    now = samples[60].unix_s  # 15 s in: past the minimum, before the maximum
    assert (
        steady_opening(PLAN, samples[:61], start_unix_s=1000.0, now_unix_s=now, time_scale=1.0)
        is None
    )


def _ar1_samples(
    tau_s: float, length_s: float, seed: int, every_s: float = 0.25
) -> list[MetricsSample]:
    """Running and KV usage swinging around their means with a correlation time of ``tau_s``."""
    import math
    import random

    rng = random.Random(seed)
    phi = math.exp(-every_s / tau_s)
    x = 0.0
    running, kv = [], []
    for _ in range(int(length_s / every_s)):
        x = phi * x + rng.gauss(0.0, math.sqrt(1.0 - phi * phi))
        running.append(max(0.0, 100.0 + 30.0 * x))
        kv.append(min(1.0, max(0.0, 0.4 + 0.1 * x)))
    return _samples(kv, running, every_s)


AUTO = PLAN.model_copy(update={"window_max_s": MAX_WINDOW_S})


def _opening(plan: LevelPlan) -> WindowOpening:
    return WindowOpening(
        warmup_min_s=plan.warmup_min_s, warmup_max_s=plan.warmup_max_s, opened_at_s=0.0,
        steady_at_open=True, test=plan.test(), window_s=plan.window_s,
        needed_requests=plan.needed_requests, window_max_s=plan.window_max_s,
        correlation_floor_s=plan.correlation_floor_s,
    )  # fmt: skip


def _first_close(
    plan: LevelPlan,
    samples: list[MetricsSample],
    shares: Callable[[float], list[float]] | None = None,
) -> WindowOpening | None:
    """Where the live rule would close the window, checking every 2 s of the run;
    ``shares``: the window's SLO percentiles against its length so far."""
    opening = _opening(plan)
    start = samples[0].unix_s
    for now in range(2, int(samples[-1].unix_s - start) + 1, 2):
        closed = window_closes(
            plan, opening, samples, opened_unix_s=start, now_unix_s=start + now, time_scale=1.0,
            shares=shares(now) if shares is not None else None,
        )  # fmt: skip
        if closed is not None:
            return closed
    return None


def test_a_quickly_forgetting_server_closes_at_the_shortest_window() -> None:
    closed = _first_close(AUTO, _ar1_samples(0.5, 200.0, seed=1))
    assert closed is not None and closed.closed is WindowClose.SHORTEST
    assert closed.window_s == pytest.approx(AUTO.window_s, abs=2.0)
    assert closed.correlation_s is not None and closed.correlation_s < 1.0
    assert closed.window_min_s == AUTO.window_s


def test_a_slow_server_is_held_for_its_correlation_times() -> None:
    closed = _first_close(AUTO, _ar1_samples(10.0, 600.0, seed=2))
    assert closed is not None and closed.closed is WindowClose.HELD
    assert closed.correlation_s is not None
    assert closed.window_s >= WINDOW_CORRELATIONS * closed.correlation_s
    assert closed.window_s > 2 * AUTO.window_s
    assert "correlation time" in closed.summary()


def test_a_verdict_near_the_slo_holds_the_window_until_it_is_clear() -> None:
    samples = _ar1_samples(0.5, 700.0, seed=5)
    # the worst percentile at 90 % of its limit: within the band until it narrows to 11 %
    closed = _first_close(AUTO, samples, lambda t: [0.3, 0.9])
    assert closed is not None and closed.closed is WindowClose.HELD
    assert closed.slo_share == 0.9 and closed.band is not None
    assert closed.band <= 1 / 0.9 - 1
    assert closed.window_s == pytest.approx(
        AUTO.window_s * (VERDICT_BAND / (1 / 0.9 - 1)) ** 2, abs=2.0
    )
    # at the limit it is never clear: the longest window
    at_limit = _first_close(AUTO, samples, lambda t: [1.0])
    assert at_limit is not None and at_limit.closed is WindowClose.LONGEST
    assert at_limit.window_s == MAX_WINDOW_S
    # far from it either way: the shortest
    for shares in ([0.2], [0.3, 2.5]):
        far = _first_close(AUTO, samples, lambda t, s=shares: s)
        assert far is not None and far.closed is WindowClose.SHORTEST
    # nothing measured yet is not clear either
    assert verdict_clear([], 0.1) is False
    assert verdict_band(AUTO, 4 * AUTO.window_s) == pytest.approx(VERDICT_BAND / 2)


def test_a_server_slower_than_the_longest_window_allows_says_so() -> None:
    plan = PLAN.model_copy(update={"window_max_s": 120.0})
    closed = _first_close(plan, _ar1_samples(30.0, 200.0, seed=3))
    assert closed is not None and closed.closed is WindowClose.LONGEST
    assert closed.window_s == 120.0
    assert "wanted" in closed.summary()


def test_a_fixed_window_closes_at_its_length_whatever_the_server() -> None:
    closed = _first_close(PLAN, _ar1_samples(30.0, 200.0, seed=4))
    assert closed is not None and closed.closed is WindowClose.FIXED
    assert closed.window_s == PLAN.window_s


def test_an_automatic_plan_runs_its_schedule_to_the_longest_window() -> None:
    spec = parse_workload(SINGLE, label="single.yaml")
    level, plan, schedule = plan_level_schedule(spec, 10.0)
    assert plan.window_max_s == MAX_WINDOW_S  # 10 req/s: 6,000 requests in 10 minutes
    assert plan.total_s == pytest.approx(plan.warmup_max_s + MAX_WINDOW_S)
    assert level.duration_s == pytest.approx(plan.total_s)
    assert max(r.send_s for r in schedule) > plan.warmup_max_s + 0.9 * MAX_WINDOW_S
    _, fixed, _ = plan_level_schedule(spec, 10.0, window_s=3.0, warmup_s=1.0)
    assert fixed.window_max_s is None and fixed.total_s == 4.0
    _, fast, _ = plan_level_schedule(spec, 100.0)  # the longest holds 20,000 requests
    assert fast.window_max_s == pytest.approx(MAX_WINDOW_REQUESTS / fast.requests_per_s, rel=0.01)


def test_a_lower_rates_memory_holds_a_quickly_forgetting_window_on() -> None:
    # 0.5 s of its own; a level that held below it measured 8 s: 20 of those
    plan = AUTO.model_copy(update={"correlation_floor_s": 8.0})
    samples = _ar1_samples(0.5, 400.0, seed=6)
    closed = _first_close(plan, samples, lambda t: [0.7])  # near its limit: 20 of them
    assert closed is not None and closed.closed is WindowClose.HELD
    assert closed.correlation_s == 8.0 and closed.correlation_floor_s == 8.0
    assert closed.correlations_wanted == WINDOW_CORRELATIONS
    assert closed.window_s == pytest.approx(WINDOW_CORRELATIONS * 8.0, abs=2.0)
    far = _first_close(plan, samples, lambda t: [0.3])  # far from it: 5 of them
    assert far is not None and far.correlations_wanted == FAR_CORRELATIONS
    assert far.window_s == pytest.approx(FAR_CORRELATIONS * 8.0, abs=2.0)
    # a fixed window takes no floor
    fixed = plan_level_schedule(
        parse_workload(SINGLE, label="single.yaml"), 10.0, window_s=3.0, correlation_floor_s=8.0
    )[1]
    assert fixed.correlation_floor_s is None


def test_the_floor_is_the_longest_memory_of_a_level_that_held_at_or_below_the_rate() -> None:
    from tuner.search.rate_search import RateLevel, correlation_floor

    def level(rate: float, met: bool, tau: float | None) -> RateLevel:
        window = _opening(AUTO).model_copy(update={"correlation_s": tau})
        m = SimpleNamespace(window=window)  # only its window is read
        return RateLevel.model_construct(index=0, rate_per_s=rate, met=met, measurement=m)

    levels = [level(1.0, True, 2.0), level(2.0, True, 6.0), level(3.0, False, 30.0),
              level(4.0, True, None)]  # fmt: skip
    assert correlation_floor(levels, 2.5) == 6.0  # the broken level's backlog does not count
    assert correlation_floor(levels, 1.5) == 2.0  # nor a higher rate's
    assert correlation_floor(levels, 0.5) is None
    assert correlation_floor(levels, None) is None


def test_a_kv_cache_that_may_or_may_not_fill_within_a_conversation_holds_the_window() -> None:
    """20 s of KV usage rising 0.3 points a second through noise: projected over a
    150-s conversation it ends near a full cache, which the fit cannot yet tell; rising
    1 point a second, or not at all, it can."""
    rng = np.random.default_rng(3)

    def clear(slope_per_s: float, horizon_s: float) -> bool:
        kv = [0.40 + slope_per_s * 0.25 * i + rng.normal(0.0, 0.03) for i in range(81)]
        plan = PLAN.model_copy(update={"kv_horizon_s": horizon_s})
        return kv_verdict_clear(
            plan, _samples(kv, [8.0] * 81), opened_unix_s=1000.0, now_unix_s=1020.0,
            time_scale=1.0,
        )  # fmt: skip

    assert not clear(0.004, 150.0)  # 0.48 + 0.6: about full, undecided
    assert clear(0.02, 150.0)  # fills surely
    assert clear(0.0, 150.0)  # flat: stays surely
    assert clear(0.004, 0.0)  # no sessions: not projected
    assert chat_plan_horizon() > 60.0


def chat_plan_horizon() -> float:
    _, plan, _ = plan_level_schedule(load_workload("chat"), 5.0)
    return plan.kv_horizon_s


def test_a_window_held_on_is_cut_to_end_its_level_by_the_searchs_deadline() -> None:
    """The 10-minute tune's confirmation level at 4x (time scale 0.25): its longest window
    10 emulated minutes, held on near the limit; with 100 wall seconds left it is cut so
    that its longest warm-up, the window, the drain and a level's overhead end by then,
    never below its shortest window, and a window closed there says why."""
    from tuner.serving.window import LEVEL_OVERHEAD_S

    left_s, drain_s = 100.0, 12.0
    cut = held_until(AUTO, left_s, 0.25, drain_s)
    room_s = (left_s - LEVEL_OVERHEAD_S) / 0.25 - AUTO.warmup_max_s - drain_s
    assert cut.window_max_s == pytest.approx(room_s) and cut.cut_to_deadline
    assert cut.window_s == AUTO.window_s  # the shortest stands
    assert held_until(AUTO, 1000.0, 0.25, drain_s) == AUTO  # the longest ends in time
    shortest = held_until(AUTO, 10.0, 0.25, drain_s)
    assert shortest.window_max_s == AUTO.window_s
    assert held_until(PLAN, 10.0, 0.25, drain_s) == PLAN  # a fixed window: --level-duration
    at_limit = _first_close(cut, _ar1_samples(0.5, 700.0, seed=5), lambda t: [1.0])
    assert at_limit is not None and at_limit.closed is WindowClose.DEADLINE
    assert at_limit.window_s == pytest.approx(room_s) and at_limit.cut
    assert "cut to end by its search's deadline" in at_limit.summary()

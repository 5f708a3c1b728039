"""A level's plan (warm-up and window lengths) and when its window opens (tuner.serving.window)."""

from __future__ import annotations

import pytest

from tuner.search.rate_search import plan_level_schedule
from tuner.serving.metrics import MetricsSample
from tuner.serving.window import (
    MAX_WINDOW_S,
    MIN_WINDOW_S,
    LevelPlan,
    needed_requests,
    steady_opening,
)
from workloads.spec import load_workload, parse_workload

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
    # About 7 requests/s at 2 conversations/s: 200 requests take about 29 s.
    assert 5.0 < plan.requests_per_s < 9.0
    assert plan.window_s == pytest.approx(200 / plan.requests_per_s)
    # The shortest warm-up is one turn gap (think 5 s + an expected answer); the longest,
    # one turn gap per turn of the longest conversation (6).
    assert 8.0 < plan.warmup_min_s < 16.0
    assert plan.warmup_max_s == pytest.approx(6 * plan.warmup_min_s)
    assert level.duration_s == pytest.approx(plan.total_s)
    assert max(r.send_s for r in schedule) < plan.total_s


def test_a_busy_level_is_held_to_three_lifetimes_and_a_slow_one_to_the_cap() -> None:
    spec = load_workload("chat")
    _, busy, _ = plan_level_schedule(spec, 40.0)
    assert busy.window_s >= MIN_WINDOW_S
    assert busy.window_s == pytest.approx(3 * (0.5 + 250 * 0.03), rel=0.15)  # median answer
    _, slow, _ = plan_level_schedule(spec, 0.05)
    assert slow.window_s == MAX_WINDOW_S


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

"""A level that carries on from the one before on a chained run (issue 16, cost): what it
adds to the conversations under way, what it keeps of them, its ids and its warm-up
(tuner.serving.level_schedule.CarryOn, tuner.serving.window.plan_level)."""

from __future__ import annotations

import pytest

from tuner.search.rate_search import planned_requests
from tuner.serving.level_schedule import CarryOn, plan_level_schedule
from workloads.schedule import carries_on
from workloads.spec import load_workload

RATE = 6.0


def _leads(schedule: list) -> set[str]:  # type: ignore[type-arg]
    """Sessions already under way when the schedule opens: their first request sent is a
    later turn."""
    return {r.session_id for r in schedule if r.follows is None and r.turn > 0}


def test_a_higher_rate_adds_only_the_conversations_it_has_on_top() -> None:
    """A Poisson population at r2 is one at r1 plus one at r2 - r1: going from 4/s to 6/s
    keeps the 4/s already under way and adds a third of the 6/s population."""
    spec = load_workload("chat")
    _, fresh_plan, fresh = plan_level_schedule(spec, RATE, window_s=60.0)
    carry = CarryOn(from_rate_per_s=4.0, id_prefix="L1.")
    _, plan, joined = plan_level_schedule(spec, RATE, window_s=60.0, carry_on=carry)
    assert carry.new_share(RATE) == pytest.approx(1 / 3)
    assert carry.keep_under_way(RATE) == 1.0
    all_leads, kept = _leads(fresh), _leads(joined)
    assert len(all_leads) > 150
    assert len(kept) / len(all_leads) == pytest.approx(1 / 3, abs=0.08)
    # The new arrivals are all there, every id (and what it follows) named apart.
    arrivals = {r.request_id for r in fresh if r.session_id not in all_leads}
    assert {r.request_id[3:] for r in joined if r.session_id not in kept} == arrivals
    assert all(r.request_id.startswith("L1.") and r.session_id.startswith("L1.") for r in joined)  # type: ignore[union-attr]
    ids = {r.request_id for r in joined}
    assert all(r.follows is None or r.follows in ids for r in joined)
    # It added a third of its conversations: a third of a turn gap's warm-up at least.
    assert fresh_plan.carried_on is None
    assert plan.carried_on == pytest.approx(1 / 3)
    assert plan.warmup_min_s == pytest.approx(fresh_plan.warmup_min_s / 3)
    assert plan.warmup_max_s == fresh_plan.warmup_max_s


def test_a_lower_rate_adds_none_and_keeps_its_share_of_those_under_way() -> None:
    spec = load_workload("chat")
    carry = CarryOn(from_rate_per_s=8.0, id_prefix="L2.")
    _, plan, joined = plan_level_schedule(spec, RATE, window_s=60.0, carry_on=carry)
    assert _leads(joined) == set()
    assert carry.keep_under_way(RATE) == pytest.approx(0.75)
    assert plan.warmup_min_s == 3.0  # MIN_WARMUP_S: nothing new to settle
    kept = sum(carries_on(f"chat-{i:06d}", 0.75, "level-2") for i in range(4000))
    assert kept / 4000 == pytest.approx(0.75, abs=0.03)


def test_without_sessions_the_warm_up_is_one_request_lifetime() -> None:
    spec = load_workload("rag")
    _, fresh, _ = plan_level_schedule(spec, 3.0, window_s=30.0)
    _, carried, joined = plan_level_schedule(
        spec, 3.0, window_s=30.0, carry_on=CarryOn(from_rate_per_s=2.0, id_prefix="L1.")
    )
    assert carried.warmup_min_s == pytest.approx(max(3.0, fresh.warmup_min_s / 2))
    assert joined and all(r.request_id.startswith("L1.") for r in joined)


def test_the_early_stop_is_sized_for_the_carried_conversations_too() -> None:
    """A carried level's own schedule holds few of the conversations it serves (most carry
    on from the level before); the SLO stop rule is sized for all of them."""
    spec = load_workload("chat")
    _, plan, fresh = plan_level_schedule(spec, RATE, window_s=30.0)
    carry = CarryOn(from_rate_per_s=RATE, id_prefix="L1.")
    _, carried_plan, joined = plan_level_schedule(spec, RATE, window_s=30.0, carry_on=carry)
    until_s = carried_plan.warmup_max_s + carried_plan.window_s
    own = sum(1 for r in joined if r.send_s < until_s)
    assert own < 0.8 * planned_requests(plan, fresh)  # its leads all carry on: none added
    assert planned_requests(carried_plan, joined) == pytest.approx(
        planned_requests(plan, fresh), rel=0.15
    )

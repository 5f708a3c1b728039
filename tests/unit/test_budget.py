"""The tune's time budget: launches counted as measured (a stated prior before any), the
reserve for the edge, the confirmations and the quality gate growing with them, and a launch that would not
end before its deadline not started, with why."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from tuner.run.budget import LaunchKind
from tuner.run.evaluation import Evaluation, LevelRecord, Verdict
from tuner.search.budget import (
    FINISH_S,
    SIM_LAUNCH_OVERHEAD_S,
    VLLM_LAUNCH_PRIOR_S,
    TimeBudget,
    launch_prior_s,
)
from tuner.search.config import load_config
from tuner.search.context import StudySetup, TuneContext, resolve
from tuner.search.quality_gate import gate_need_s, may_gate
from tuner.search.rate_search import LEAST_EDGE_DRAWS
from tuner.search.recommend import (
    PRIOR_DRAW_LEVELS,
    confirm,
    draws_that_fit,
    levels_that_fit,
    pools_with_trial,
    prior_draw_levels,
)
from tuner.search.tune import (
    RESERVE_SHARE,
    _full_reserve_s,
    _least_reserve_s,
    confirm_reserve_s,
    edge_deadline_s,
    edge_reserve_s,
    level_estimate_s,
    reserve_s,
)
from tuner.serving.server import Backend, TrialOutcome
from tuner.vllm.space import Knob, Range, TrialParams
from workloads.load_result import LoadResult, Percentiles

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "workloads" / "tiny.yaml"


@pytest.fixture
def ctx(tmp_path: Path) -> TuneContext:
    config = load_config(
        None,
        {
            "backend": "sim", "gpu": "L4", "model": "llama-3.1-8b", "workload": str(TINY),
            "max_model_len": 256, "run_dir": tmp_path / "run", "sim_startup_delay_s": 4.0,
            "budget_min": 10.0,
        },
    )  # fmt: skip
    return resolve(config)


def _budget(ctx: TuneContext, path: Path | None = None) -> TimeBudget:
    return TimeBudget.of(ctx, time.monotonic(), path)


def _longer(ctx: TuneContext, budget_min: float) -> TuneContext:
    return dataclasses.replace(ctx, config=ctx.config.model_copy(update={"budget_min": budget_min}))


def _launch(budget: TimeBudget, seconds: float, *, ready: bool = True) -> None:
    budget.record(
        LaunchKind.TRIAL, "trial", began_s=time.monotonic(), launch_s=seconds, measure_s=20.0,
        stop_s=1.0, ready=ready,
    )  # fmt: skip


def test_a_launch_is_the_stated_prior_until_one_is_measured(ctx: TuneContext) -> None:
    budget = _budget(ctx)
    assert launch_prior_s(ctx) == 4.0 + SIM_LAUNCH_OVERHEAD_S
    assert budget.launch_estimate_s() == launch_prior_s(ctx)
    _launch(budget, 150.0)
    assert budget.launch_estimate_s() == pytest.approx(151.0)  # to ready, and the stop
    _launch(budget, 2.0, ready=False)  # a launch that failed fast says nothing of one that starts
    assert budget.launch_estimate_s() == pytest.approx(151.0)


def test_vllm_launches_are_estimated_in_minutes_before_any_is_measured(ctx: TuneContext) -> None:
    real = dataclasses.replace(ctx, backend=Backend.VLLM)
    assert launch_prior_s(real) == VLLM_LAUNCH_PRIOR_S >= 60.0


def test_the_reserve_grows_with_the_launches_measured(ctx: TuneContext) -> None:
    ctx = _longer(ctx, 240.0)  # where no share of the budget bounds it
    setup = StudySetup()
    budget = _budget(ctx)
    before = reserve_s(ctx, setup, budget)
    for _ in range(3):
        _launch(budget, 180.0)  # real vLLM launches: minutes
    after = reserve_s(ctx, setup, budget)
    # three edge probes and three confirmation launches at ~181 s each, a quarter more
    assert after - before == pytest.approx(1.25 * 6 * (181.0 - launch_prior_s(ctx)))


def test_a_launch_that_would_not_end_before_the_deadline_is_not_started(
    ctx: TuneContext, tmp_path: Path
) -> None:
    path = tmp_path / "budget.json"
    budget = TimeBudget(began_s=time.monotonic(), budget_s=100.0, launch_prior_s=60.0, path=path)
    assert budget.fits(LaunchKind.EDGE_PROBE, "edge probe 0.95", 50.0) is None
    skip = budget.fits(LaunchKind.EDGE_PROBE, "edge probe 0.96", 150.0)
    assert skip is not None
    assert "edge probe 0.96 not started" in skip.text()
    assert "150 s" in skip.reason and "before the end of the budget" in skip.reason
    written = json.loads(path.read_text())
    assert [s["name"] for s in written["skipped"]] == ["edge probe 0.96"]
    early = budget.fits(
        LaunchKind.CONFIRMATION, "confirmation", 50.0, deadline_s=time.monotonic() + 10.0
    )
    assert early is not None and "its deadline" in early.reason


def test_the_edge_yields_only_to_the_recommendations_own_confirmation(ctx: TuneContext) -> None:
    """The OOM edge is one of the tune's answers; the conservative and aggressive variants'
    confirmations run in what it leaves (a 4-minute tune on the GPU-host rehearsal skipped
    every edge probe for them and left a minute unused)."""
    ctx = _longer(ctx, 240.0)  # where no share of the budget bounds the reserve
    budget = _budget(ctx)
    _launch(budget, 60.0)
    setup = StudySetup()
    assert reserve_s(ctx, setup, budget) == _full_reserve_s(ctx, setup, budget, None)
    end_s = budget.deadline_s  # (the end of a 240-minute budget: room for all of it)
    own = confirm_reserve_s(ctx, setup, budget, variants=False)
    every = confirm_reserve_s(ctx, setup, budget)
    assert own > 0 and every - own >= 2 * 61.0  # two variants, a measured launch each
    assert edge_deadline_s(ctx, setup, budget, None, end_s) == pytest.approx(end_s - 1.25 * own)


def test_a_resumed_run_estimates_its_launches_from_those_the_study_measured(
    ctx: TuneContext, tmp_path: Path
) -> None:
    """The GPU-host walk: a tune interrupted after trial 0 (a 25-s launch measured) and
    resumed estimated every launch at the 180-s prior again, and skipped its whole edge."""
    path = tmp_path / "budget.json"
    first = TimeBudget.of(ctx, time.monotonic(), path)
    _launch(first, 150.0)
    resumed = TimeBudget.of(ctx, time.monotonic(), path)
    assert resumed.measured and resumed.launch_estimate_s() == pytest.approx(151.0)
    _launch(resumed, 60.0)
    kept = json.loads(path.read_text())
    assert [r["launch_s"] for r in kept["earlier"]] == [150.0]
    assert [r["launch_s"] for r in kept["launches"]] == [60.0]
    again = TimeBudget.of(ctx, time.monotonic(), path)  # a third run sees both
    assert [r.launch_s for r in again.earlier] == [150.0, 60.0]


def test_the_reserve_keeps_the_quality_gates_two_launches_where_it_may_run(
    ctx: TuneContext,
) -> None:
    setup = StudySetup()
    budget = _budget(ctx)
    for _ in range(3):
        _launch(budget, 180.0)
    kv = ctx.space.range_of(Knob.KV_CACHE_DTYPE)
    assert kv is not None and "fp8" in kv.values()  # L4: fp8 KV is in the space
    assert not may_gate(ctx)  # the simulated engine: nothing to measure, nothing kept
    real = dataclasses.replace(ctx, backend=Backend.VLLM)
    assert may_gate(real)
    # two launches at ~181 s, each asked 32 prompts of up to 32 tokens at a batch of one
    need = gate_need_s(real, budget)
    assert need == pytest.approx(2 * (181.0 + 32 * (2 * 0.5 + 32 * 0.05)))
    assert reserve_s(real, setup, budget) - reserve_s(ctx, setup, budget) == pytest.approx(
        1.25 * need
    )
    off = dataclasses.replace(real, config=real.config.model_copy(update={"quality_gate": False}))
    assert not may_gate(off)
    auto_only = dataclasses.replace(
        real,
        space=real.space.model_copy(
            update={
                "ranges": tuple(
                    r
                    if r.knob is not Knob.KV_CACHE_DTYPE
                    else Range(knob=r.knob, choices=("auto",))
                    for r in real.space.ranges
                )
            }
        ),
    )
    assert not may_gate(auto_only)  # no value in the space changes numerics


def _trial(levels_s: float, rates: list[float], time_scale: float) -> Evaluation:
    load = LoadResult(
        num_requests=100, num_completed=100, num_errors=0, num_not_sent=0, error_rate=0.0,
        window_s=10.0, duration_s=10.0, offered_rate=1.0, achieved_rate=1.0,
        request_throughput=1.0, output_token_throughput=100.0, output_tokens=1000,
        prompt_tokens=1000, slo=None, num_good=100, goodput=1.0,
        ttft_ms=Percentiles(count=100, p99=551.0), itl_ms=Percentiles(),
        tpot_ms=Percentiles(count=100, p99=40.0), e2e_ms=Percentiles(),
        send_lag_ms=Percentiles(), prompt_buckets=(),
    )  # fmt: skip
    level = LevelRecord(
        rate_per_s=0.0, met=True, stopped_early=False, dir="level", load=load, violations=[],
        num_preemptions=None, max_kv_cache_usage=None, prefix_cache_hit_rate=None,
    )  # fmt: skip
    levels = [level.model_copy(update={"rate_per_s": r}) for r in rates]
    return Evaluation(
        dir="t", params=TrialParams(), flags={}, verdict=Verdict.MET,
        outcome=TrialOutcome.READY, levels=levels, levels_s=levels_s, launch_s=2.0,
        stop_s=0.2, time_scale=time_scale,
    )  # fmt: skip


def test_a_confirmation_that_pools_its_trial_is_counted_at_its_draws_levels(
    ctx: TuneContext,
) -> None:
    """Where the best trial bracketed its goodput, the recommendation's confirmation
    measures the draws the trial lacks at that bracket's two ends and pools the trial's
    levels: the reserve counts two levels a draw (two for the default two draws, four for
    three; two at the least), not three of its own and the two its edge draws add (156 s
    of a 10-minute tune's 561 went to such a confirmation of five levels)."""
    setup = StudySetup()
    budget = _budget(ctx)
    _launch(budget, 2.0)
    held = _trial(120.0, [6.02, 6.32], time_scale=1.5)  # both held: a lower bound
    bracketed = held.model_copy(
        update={
            "levels": [held.levels[0], held.levels[1].model_copy(update={"met": False})],
            "rate_per_s": 6.02,
        }
    )
    assert not pools_with_trial(ctx, held) and pools_with_trial(ctx, bracketed)
    level_s = 60.0 / 1.5
    # the default four draws: the three the trial lacks, at both ends
    assert ctx.config.edge_draws == 4
    pooled = confirm_reserve_s(ctx, setup, budget, bracketed, variants=False)
    assert pooled == pytest.approx(2.0 + 1.0 + 3 * PRIOR_DRAW_LEVELS * level_s)
    ctx = dataclasses.replace(ctx, config=ctx.config.model_copy(update={"edge_draws": 2}))
    pooled = confirm_reserve_s(ctx, setup, budget, bracketed, variants=False)
    assert pooled == pytest.approx(2.0 + 1.0 + PRIOR_DRAW_LEVELS * level_s)
    own = confirm_reserve_s(ctx, setup, budget, held, variants=False)
    assert own == pytest.approx(2.0 + 1.0 + (3 + 2) * level_s)
    # three draws asked for: the two the trial lacks, at both ends; one at the least
    three = dataclasses.replace(ctx, config=ctx.config.model_copy(update={"edge_draws": 3}))
    assert prior_draw_levels(3) == 2 * PRIOR_DRAW_LEVELS
    pooled = confirm_reserve_s(three, setup, budget, bracketed, variants=False)
    assert pooled == pytest.approx(2.0 + 1.0 + 2 * PRIOR_DRAW_LEVELS * level_s)
    least = confirm_reserve_s(three, setup, budget, bracketed, variants=False, draws=1)
    assert least == pytest.approx(2.0 + 1.0 + PRIOR_DRAW_LEVELS * level_s)
    # no edge draws asked for, or repeats: the confirmation brackets on its own
    one_draw = dataclasses.replace(ctx, config=ctx.config.model_copy(update={"edge_draws": 1}))
    assert not pools_with_trial(one_draw, bracketed)
    repeats = dataclasses.replace(ctx, config=ctx.config.model_copy(update={"repeats": 3}))
    assert not pools_with_trial(repeats, bracketed)


def test_a_short_budget_keeps_at_most_its_share_back_but_never_less_than_the_least(
    ctx: TuneContext,
) -> None:
    """A 10-minute tune of the default chat workload kept 1,325 s back for the edge and
    the confirmations (its first trial's two levels took 248 s) and ran that one trial.
    Now a short budget keeps at most ``RESERVE_SHARE`` of itself back, and never less
    than one edge probe and the recommendation's own confirmation over two rates. (Here
    a trial whose two levels took 120 s, on a clock 1.5x slower than now's.)"""
    setup = StudySetup()  # the clock of now at the GPU's pace; the trial ran 1.5x slower
    best = _trial(120.0, [6.02, 6.32], time_scale=1.5)
    budget = _budget(ctx)  # 10 minutes
    _launch(budget, 2.0)
    full = _full_reserve_s(ctx, setup, budget, best)
    least = _least_reserve_s(ctx, setup, budget, best)
    assert least < RESERVE_SHARE * budget.budget_s < full
    assert reserve_s(ctx, setup, budget, best) == pytest.approx(RESERVE_SHARE * 600.0)
    # a confirmation's level as the trial's took on average: least is one probe and two
    own_two = confirm_reserve_s(ctx, setup, budget, best, variants=False, levels=2, draws=1)
    assert own_two == pytest.approx(2.0 + 1.0 + 2 * 60.0 / 1.5)
    # the full one counts the six levels the confirmation's three edge draws add
    with_draws = confirm_reserve_s(ctx, setup, budget, best, variants=False, levels=2)
    assert with_draws == pytest.approx(own_two + 6 * 60.0 / 1.5)
    # the edge yields to the least of it: two rates, two draws (its other draws where
    # they fit after the edge)
    end_s = budget.deadline_s
    least_draws = confirm_reserve_s(
        ctx, setup, budget, best, variants=False, levels=2, draws=LEAST_EDGE_DRAWS
    )
    assert least_draws == pytest.approx(own_two + 2 * 60.0 / 1.5)
    assert edge_deadline_s(ctx, setup, budget, best, end_s) == pytest.approx(
        end_s - 1.25 * least_draws
    )
    # slower measured trials: the least binds, whatever the share
    slow = _trial(500.0, [6.02, 6.32], time_scale=1.5)
    assert RESERVE_SHARE * 600.0 < _least_reserve_s(ctx, setup, budget, slow) < 600.0
    assert reserve_s(ctx, setup, budget, slow) == pytest.approx(
        _least_reserve_s(ctx, setup, budget, slow)
    )
    # a long budget keeps everything back, as before
    long_ctx = _longer(ctx, 240.0)
    long_budget = _budget(long_ctx)
    _launch(long_budget, 2.0)
    assert reserve_s(long_ctx, setup, long_budget, best) == pytest.approx(
        _full_reserve_s(long_ctx, setup, long_budget, best)
    )


def test_no_time_is_kept_for_a_confirmation_that_no_longer_fits(ctx: TuneContext) -> None:
    """A 10-minute default tune whose pick kept a slower clock (its server fell behind on a
    busy host): its levels counted 102 s each, and the least the tune states (one edge
    probe and two confirmation levels: 311 s) was kept back from the 191 s left after its
    trial. No third trial started, the confirmation did not fit either, and the tune ended
    163 s early. Where the least no longer fits in what is left, the trials have the
    time the confirmation cannot use (the edge's probe is still kept)."""
    setup = StudySetup()
    slow = _trial(500.0, [6.02, 6.32], time_scale=1.5)  # 166 s a level now
    roomy = _budget(ctx)
    _launch(roomy, 2.0)
    kept = reserve_s(ctx, setup, roomy, slow)
    assert kept == pytest.approx(_least_reserve_s(ctx, setup, roomy, slow))
    late = TimeBudget(began_s=time.monotonic() - 420.0, budget_s=600.0, launch_prior_s=2.0)
    _launch(late, 2.0)
    assert late.left_s() < _least_reserve_s(ctx, setup, late, slow)  # 180 s left
    edge_only = reserve_s(ctx, setup, late, slow)
    assert edge_only < late.left_s() and edge_only < kept
    probe = edge_reserve_s(ctx, setup, late, slow, probes=1)
    assert probe > 0.0
    assert edge_only == pytest.approx(1.25 * probe + FINISH_S)


def test_a_confirmations_levels_follow_the_clock_of_now_and_fit_what_is_left(
    ctx: TuneContext,
) -> None:
    """A trial measured 1.5x slower than the clock of now: its levels count two thirds."""
    best = _trial(300.0, [6.0, 6.3], time_scale=1.5)
    assert level_estimate_s(StudySetup(time_scale=1.0), best) == pytest.approx(100.0)
    budget = TimeBudget(began_s=time.monotonic(), budget_s=250.0, launch_prior_s=10.0)
    assert levels_that_fit(budget, 3, 100.0, None) == 2  # 250 s - a 10-s launch: two
    assert levels_that_fit(budget, 1, 100.0, None) == 1
    assert levels_that_fit(budget, 3, 300.0, None) == 0
    assert levels_that_fit(budget, 3, 0.0, None) == 3  # no estimate: all of them


def test_a_confirmation_measures_as_many_of_its_draws_as_fit() -> None:
    """``--edge-draws 3`` on a budget that holds two: two, not one (a confirmation fell
    from the draws asked for to none where all did not fit); the least where none fits
    (whether it runs at all is the budget's to say). A pooled confirmation measures two
    levels a draw its trial lacks."""

    assert prior_draw_levels(3) == 4 and prior_draw_levels(2) == 2  # 40-s levels: 160, 80
    assert draws_that_fit(3, 2, 190.0, 40.0, prior_draw_levels) == 3
    assert draws_that_fit(3, 2, 140.0, 40.0, prior_draw_levels) == 2
    assert draws_that_fit(3, 2, 40.0, 40.0, prior_draw_levels) == 2  # the least
    assert prior_draw_levels(3, trial_draws=2) == PRIOR_DRAW_LEVELS

    def own_three(draws: int) -> int:  # three rates of its own and its edge draws
        return 3 + 2 * (draws - 1)

    assert draws_that_fit(4, 1, 90.0, 20.0, own_three) == 1
    assert draws_that_fit(4, 1, 100.0, 20.0, own_three) == 2
    assert draws_that_fit(4, 1, 180.0, 20.0, own_three) == 4


def test_a_confirmation_runs_only_where_two_of_its_rates_fit(ctx: TuneContext) -> None:
    """The 10-minute default tune confirmed its recommendation over the one rate that fit:
    the rate its trial held broke on a fresh server, and the tune said "goodput 0" of
    settings that held 8.31/s. A confirmation of several rates needs two."""
    budget = TimeBudget(began_s=time.monotonic(), budget_s=150.0, launch_prior_s=10.0)
    skipped: list[str] = []
    ran = confirm(
        ctx, StudySetup(), "recommended", TrialParams(), registry=None,  # type: ignore[arg-type]
        start_rate_per_s=8.3, repeats=1, max_levels=3, budget=budget, level_s=100.0,
        skipped=skipped,
    )  # fmt: skip
    assert ran is None
    assert len(skipped) == 1 and "2 of 3 rate(s) at the least" in skipped[0]
    assert levels_that_fit(budget, 3, 100.0, None) == 1


def test_the_edge_has_the_time_where_no_confirmation_would_fit_in_it(ctx: TuneContext) -> None:
    """A 10-minute default tune came to its edge with 145 s left, kept them for the
    recommendation's confirmation (two rates, 186 s), skipped that too and ended 2.5
    minutes early with neither. Where the confirmation's least does not fit, the edge's
    probes may run to the end."""
    setup = StudySetup()
    best = _trial(248.0, [6.02, 6.32], time_scale=1.0)  # 124 s a level
    budget = TimeBudget(began_s=time.monotonic(), budget_s=145.0, launch_prior_s=2.0)
    end_s = budget.deadline_s
    assert confirm_reserve_s(ctx, setup, budget, best, variants=False, levels=2) > 145.0
    assert edge_deadline_s(ctx, setup, budget, best, end_s) == pytest.approx(end_s)
    roomy = TimeBudget(began_s=time.monotonic(), budget_s=1000.0, launch_prior_s=2.0)
    assert edge_deadline_s(ctx, setup, roomy, best, roomy.deadline_s) < roomy.deadline_s


def test_a_trial_is_started_where_its_first_two_levels_fit() -> None:
    """The next trial is counted at a whole trial as the last took, or where less at the
    twin's bracket (two levels), which its rate search measures before the deadline; before
    any level was measured, a whole trial."""
    from tuner.search.study.trial_loop import SHORT_TRIAL_LEVELS, next_trial_levels_s

    assert SHORT_TRIAL_LEVELS == 2
    assert next_trial_levels_s(149.0, 36.0) == pytest.approx(72.0)
    assert next_trial_levels_s(60.0, 36.0) == pytest.approx(60.0)  # the last trial took two
    assert next_trial_levels_s(149.0, 0.0) == pytest.approx(149.0)


def test_what_comes_before_a_trials_launch_is_counted_in_it() -> None:
    """The 10-minute tune's fourth trial (series 4, quiet): 48 s before the search's
    deadline at its launch, its first two levels counted at 54 s after a 2-s launch; its
    settings drawn and the twin's prediction for them had taken 10 s before. Counted, it
    is not started (it measured one level, and its lower bound became the best)."""
    from tuner.search.study.trial_loop import next_trial_need_s

    need = next_trial_need_s(10.0, 2.0, 54.1, 27.1)
    assert need == pytest.approx(66.1)
    assert need > 58.0 > next_trial_need_s(0.0, 2.0, 54.1, 27.1)  # left at the check


def test_a_budget_that_holds_few_trials_spends_no_fit_or_extra_level_that_costs_one() -> None:
    """The default 10-minute tune (wall-l): 202 s before the search's deadline at trial
    1's launch, a trial of its first two levels counted at 47 s, six trials still wanted.
    Its levels past the first two end where three more trials still fit; after it, a fit
    (45 s) with 120 s left would leave one trial of two, so none runs. With more trials
    ahead than FEW_TRIALS_LEFT, or none, both are spent as before."""
    from tuner.search.study.trial_loop import (
        FEW_TRIALS_LEFT,
        extra_deadline_s,
        fit_costs_a_trial,
        further_trials,
    )

    assert further_trials(202.0, 47.0, 6) == 4 and further_trials(202.0, 47.0, 2) == 2
    assert further_trials(-5.0, 47.0, 6) == 0
    deadline = 1000.0
    extra = extra_deadline_s(deadline, deadline - 202.0, 47.0, 6)
    assert extra == pytest.approx(deadline - 3 * 47.0)  # three trials after its two levels
    assert extra_deadline_s(deadline, deadline - 60.0, 47.0, 6) is None  # none after it anyway
    assert extra_deadline_s(deadline, deadline - 2000.0, 47.0, 60) is None  # many ahead
    assert extra_deadline_s(deadline, deadline - 202.0, 47.0, 0) is None  # none wanted
    assert fit_costs_a_trial(120.0, 45.0, 47.0, 6)  # two trials fit; one after the fit
    assert not fit_costs_a_trial(120.0, 20.0, 47.0, 6)  # still two after it
    assert not fit_costs_a_trial(2000.0, 45.0, 47.0, 60)  # many ahead: the fit places them
    assert FEW_TRIALS_LEFT == 3

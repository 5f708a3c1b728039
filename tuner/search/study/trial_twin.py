"""The twin's part in the trial loop (``TrialTwin``): where it places a trial's first rate,
what it predicts for the trial's settings, and what it learns from each trial measured
(its step costs fitted to the levels, recorded in ``twin.json`` with its error before and
after). The loop (``tuner.search.study.trial_loop``) owns the study's set-up and passes
the one of now to each call; a fit returns the set-up to measure with from then on.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path

from tuner.run.evaluation import Evaluation, Verdict
from tuner.run.goodput import GoodputBound
from tuner.run.layout import RunLayout
from tuner.run.twin_record import TrialFit, TwinRecord
from tuner.search.context import StudySetup, TuneContext
from tuner.search.optuna_store import FrozenTrial
from tuner.search.study.records import Progress, load_evaluation
from tuner.search.study.trial_lines import twin_line
from tuner.serving.level_schedule import plan_level_schedule
from tuner.sim.build import offloading_options
from tuner.twin.fit import (
    FIT_DONE_SHARE,
    FIT_WITHIN_SHARE,
    FITTED,
    MAX_LEVELS,
    MeasuredLevel,
    fit,
    goodput_worse,
    read_level,
    read_twin,
)
from tuner.twin.prediction import Setup, SustainedRate, sustained_rate
from tuner.twin.screen import SCREEN_LADDER_STEP
from tuner.vllm.space import TrialParams

log = logging.getLogger(__name__)


# A fit after a trial spends at most this share of the tune's budget (30 s of a 10-minute
# one; a fit of 40 replays took 84 s on two cores after trial 1 of the default tune).
FIT_BUDGET_SHARE = 0.05
# What a fit costs the search: its replays and the pick's screen of the candidates with
# the new factors after it (16-18 s after a 30-s fit on the default tune).
FIT_PICK_FACTOR = 1.5


# A prediction near a rate that held (the twin's screen of the same settings with the same
# step costs: the highest of its rungs, SCREEN_LADDER_STEP apart, that held; or the goodput
# a fit was made to) starts there and moves by a rung first: the bracket closes on the
# first two runs where the rate lies within the rung above. It starts at the rate that
# held, not above it: a first run that holds plans the next ones with its own answer times
# (``sustained_rate``), where one above it, planned with the workload's expected ones,
# can open with too many conversations under way and tip into a backlog the server would
# not build (the pick of ``test_a_pick_is_predicted_from_the_rate_its_screen_held``).
# Twelve settings of the default tune's space (util 0.9 and 0.97, 64 to 512 sequences,
# auto and fp8 KV), each from its screen: 56 runs in 74 s on one core, against 72 in
# 95 s from the defaults' goodput by doubling; the four fp8 ones at 256 and 512
# sequences, the twin's picks, 32 s against 44 s (``benchmarks/twin_prediction_start.py``).
NEAR_FIRST_STEP = SCREEN_LADDER_STEP


def fit_cost_s(budget_min: float) -> float:
    """The wall seconds a fit after a trial is counted to take from a tune's search."""
    return FIT_PICK_FACTOR * FIT_BUDGET_SHARE * budget_min * 60.0


class TrialTwin:
    """The twin's predictions for the trials and its learning from them, for one worker
    of a study; its predictions are cached per settings until a fit changes its costs."""

    def __init__(self, ctx: TuneContext, progress: Progress) -> None:
        self.ctx = ctx
        self.progress = progress
        self._predicted: dict[str, SustainedRate] = {}

    def record(self) -> TwinRecord:
        """The twin's record so far: this run's (a resumed run goes on from its last fit),
        else the one ``--twin-from`` names, else the paper's factors."""
        own = RunLayout(self.ctx.run_dir).twin_json
        if own.is_file():
            return read_twin(self.ctx.run_dir)
        if self.ctx.config.twin_from is not None:
            started = read_twin(self.ctx.config.twin_from)
            return TwinRecord(factors=started.factors)
        return TwinRecord()

    def places(self, setup: StudySetup) -> bool:
        """Whether the twin places the first rates and plans the sessions: on a GPU
        profile from the start; on a device it has no published rates for (vLLM's CPU
        build) once it has learned its step costs from a trial (or ``--twin-from``)."""
        if self.ctx.twin is None:
            return False
        return self.ctx.gpu is not None or setup.timing.source == FITTED

    def start_rate(
        self,
        params: TrialParams,
        setup: StudySetup,
        fallback: float | None,
        near_rate_per_s: float | None = None,
    ) -> float | None:
        """The first rate to measure: 10% below the simulator's prediction for these
        settings (so the first level usually holds and the next one brackets the edge),
        else ``fallback`` (the best goodput so far, else the workload's own rate).
        ``near_rate_per_s``: the twin's screen of these settings, where it has one
        (``predicted_max_rate``)."""
        if not self.places(setup):
            return fallback
        predicted = self.predicted_max_rate(params, setup, fallback, near_rate_per_s)
        return predicted * 0.9 if predicted > 0 else fallback

    def prediction(
        self,
        params: TrialParams,
        setup: StudySetup,
        fallback: float | None,
        near_rate_per_s: float | None = None,
    ) -> SustainedRate | None:
        """The twin's sustained rate for these settings and its answer times there, where
        it can place one (``places``)."""
        if not self.places(setup):
            return None
        return self._sustained(params, setup, fallback, near_rate_per_s)

    def setup_for(self, params: TrialParams, setup: StudySetup) -> Setup:
        """The twin's server for ``params`` with the step costs of ``setup``."""
        twin = self.ctx.twin
        assert twin is not None
        device, base = twin
        return Setup(
            self.ctx.model, device, self.ctx.version, params.serving(base),
            options=offloading_options(params), timing=setup.timing,
        )  # fmt: skip

    def predicted_max_rate(
        self,
        params: TrialParams,
        setup: StudySetup,
        start: float | None,
        near_rate_per_s: float | None = None,
    ) -> float:
        """The simulator's highest arrival rate it sustains in the steady state, a level's
        warm-up and window long (``tuner.twin.prediction.sustained_rate``; cached per
        settings). It brackets from ``start`` by doubling or halving, or near
        ``near_rate_per_s`` (a rate that held, the rate within a rung above it) by
        ``NEAR_FIRST_STEP`` first."""
        return self._sustained(params, setup, start, near_rate_per_s).rate_per_s

    def _sustained(
        self,
        params: TrialParams,
        setup: StudySetup,
        start: float | None,
        near_rate_per_s: float | None = None,
    ) -> SustainedRate:
        ctx = self.ctx
        key = params.model_dump_json()
        if key not in self._predicted:
            near = near_rate_per_s if near_rate_per_s and near_rate_per_s > 0 else None
            start = near or start
            rate = start or ctx.workload.mean_rate_per_s
            _, plan, _ = plan_level_schedule(
                ctx.workload, rate, window_s=ctx.config.level_duration_s,
                warmup_s=ctx.config.level_warmup_s,
            )  # fmt: skip
            self._predicted[key] = sustained_rate(
                self.setup_for(params, setup), ctx.workload, warmup_s=plan.warmup_max_s,
                window_s=plan.window_s, start_rate_per_s=start, precision=0.05, max_runs=10,
                first_step=NEAR_FIRST_STEP if near else None,
            )  # fmt: skip
        return self._predicted[key]

    def last_off_share(self) -> float | None:
        """How far the twin's goodput prediction for the last trial measured (and fitted
        after, or found within its noise) was off what it measured (predicted / measured
        - 1; None: none yet)."""
        offs = [
            off
            for one in self.record().fits
            if (off := TrialFit.share_off(one.predicted_rate_per_s, one.measured_rate_per_s))
            is not None
        ]
        return offs[-1] if offs else None

    def learn(
        self,
        number: int,
        params: TrialParams,
        ev: Evaluation,
        predicted: SustainedRate | None,
        *,
        setup: StudySetup,
        complete: list[FrozenTrial],
        last: bool = False,
        costs_trial: bool = False,
    ) -> StudySetup:
        """Fit the twin's step costs to the levels trial ``number`` measured (and the
        busiest held level of the latest ``complete`` trials before it;
        ``tuner.twin.fit``); ``twin.json`` records the fit with the twin's error before
        and after. Returns the set-up to measure with from now: ``setup`` with the fitted
        costs where they were adopted, else ``setup`` unchanged. ``last``: no further
        trial fits the budget; after the first fit, none runs then (it would place the
        rates of trials that will not run, in the time of the OOM edge and the
        confirmation). ``costs_trial``: its time would leave fewer further trials fitting
        the budget; after the first fit, none runs then either (a trial more measures
        what a fit predicts)."""
        ctx = self.ctx
        if not ctx.config.twin_fit or ctx.twin is None:
            return setup
        levels = self._fit_levels(number, params, ev, setup, complete)
        measured = ev.stated_goodput.arrival_rate_per_s if ev.verdict is Verdict.MET else None
        before = predicted.rate_per_s if predicted else None
        if not levels:  # a trial that did not start, or measured nothing, says nothing
            if ev.levels:  # one that measured levels has its line in twin.json all the same
                self._record(
                    TrialFit(
                        trial=number, levels=[], before=setup.timing, after=setup.timing,
                        error_before=None, error_after=None, evaluations=0,
                        measured_rate_per_s=measured, predicted_rate_per_s=before,
                        predicted_after_per_s=before, adopted=False, fitted=False,
                        kept_because=no_levels_reason(number, ev),
                    )
                )  # fmt: skip
            return setup
        # The first fit always runs: it is what makes the factors the device's own. After
        # it, none runs where the twin's goodput prediction lies within the trial's own
        # capacity interval (the trial cannot tell the two apart: measurements decide, and
        # a fit to its percentiles alone moves no rate the search places), or where it is
        # within FIT_WITHIN_SHARE of the levels' percentiles. The first runs to its budget,
        # and later ones stop within FIT_DONE_SHARE: the first runs while the twin's screen
        # of the space finishes (the next pick waits for it: 146 s against trial 0's 113 s on
        # the default tune), and its closeness carries to the next trial's levels (0.6% off
        # trial 0's left the twin 3% off trial 1's, within their noise; 2.3% left it 5.4%
        # off, and a second fit took 42 s).
        fitted_before = setup.timing.source == FITTED
        agrees = fitted_before and predicted_within(predicted, ev)
        spared = fitted_before and (last or costs_trial) and not agrees
        within = FIT_WITHIN_SHARE if fitted_before else None
        result = fit(
            self.setup_for(params, setup), levels,
            max_seconds=FIT_BUDGET_SHARE * ctx.config.budget_min * 60.0,
            within_share=math.inf if agrees or spared else within,
            done_share=FIT_DONE_SHARE if fitted_before else None,
        )  # fmt: skip
        after: float | None
        if result.fitted:
            learned = setup.learned(result.after)
            self._predicted.clear()  # every prediction so far was made with the old factors
            # (from the goodput measured, which factors fitted to its levels predict nearly)
            after = self._sustained(params, learned, measured or None, measured).rate_per_s
            # Measurements decide: factors that fit the percentiles but put the goodput the
            # trial measured further off are not taken (the levels measured something the
            # step costs do not explain, e.g. a load generator that fell behind).
            adopted = not goodput_worse(
                before, after, measured, lower_bound=ev.goodput_bound is GoodputBound.LOWER_BOUND
            )
            if not adopted:
                learned = setup
                self._predicted.clear()
        else:  # already within the levels' noise: the factors and predictions stand
            learned, after, adopted = setup, before, True
        one = TrialFit(
            trial=number, levels=[lv.name for lv in levels], before=result.before,
            after=result.after, error_before=result.error_before.median_share,
            error_after=result.error_after.median_share, evaluations=result.evaluations,
            measured_rate_per_s=measured, predicted_rate_per_s=before,
            predicted_after_per_s=after, adopted=adopted, fitted=result.fitted,
            kept_because=None if result.fitted else (
                f"its goodput prediction within trial {number}'s 90% capacity interval"
                if agrees
                else "no further trial fits the budget" if spared and last
                else "its time would cost a further trial of the budget" if spared
                else f"within {100 * FIT_WITHIN_SHARE:.0f}% of its levels"
            ),
        )  # fmt: skip
        self._record(one)
        return learned

    def _record(self, one: TrialFit) -> None:
        """Add ``one`` to ``twin.json`` and say it on the terminal and in the log."""
        self.record().with_fit(one).write(RunLayout(self.ctx.run_dir).twin_json)
        line = twin_line(one)
        log.info(line.strip())
        self.progress(line)

    def _held_levels(
        self, number: int, params: TrialParams, ev: Evaluation, setup: StudySetup
    ) -> list[MeasuredLevel]:
        """A trial's levels that held, as the twin replays them (all of them where none
        held: a backlog's percentiles are its queue's, which the smallest error in a
        step's cost changes by seconds)."""
        trial_dir = RunLayout(self.ctx.run_dir).trial_dir(number)
        held = {Path(lv.dir).name for lv in ev.levels if lv.met}
        # a level its client could not keep up with measured the client, not the server
        scales = {Path(lv.dir).name: lv.time_scale for lv in ev.levels if not lv.unmeasurable}
        paths = [p for p in sorted(trial_dir.glob("level-*")) if p.name in scales]
        paths = [p for p in paths if p.name in held] or paths
        twin = self.ctx.twin
        serving = params.serving(twin[1] if twin is not None else self.ctx.base)
        return [
            replace(level, params=serving)
            for path in paths
            if (level := read_level(path, time_scale=scales[path.name] or setup.time_scale))
            is not None
        ]

    def _fit_levels(
        self,
        number: int,
        params: TrialParams,
        ev: Evaluation,
        setup: StudySetup,
        complete: list[FrozenTrial],
    ) -> list[MeasuredLevel]:
        """What a fit after trial ``number`` replays: the busiest held level of each of the
        latest earlier trials, and this trial's latest held levels, ``MAX_LEVELS`` in all."""
        earlier: list[MeasuredLevel] = []
        for t in reversed(complete):
            if len(earlier) >= MAX_LEVELS - 1:
                break
            if t.number == number or (done := load_evaluation(t)) is None:
                continue
            params_t = self.ctx.space.from_optuna(t.params)
            theirs = self._held_levels(t.number, params_t, done, setup)
            if theirs:
                earlier.append(theirs[-1])
        own = self._held_levels(number, params, ev, setup)
        return [*reversed(earlier), *own[-(MAX_LEVELS - len(earlier)) :]] if own else []


def no_levels_reason(number: int, ev: Evaluation) -> str:
    """Why a trial that measured levels left the twin none to replay: its load generator
    lagged at every level (the levels measured the client, not the server), or no level's
    window opened."""
    if ev.levels and all(lv.unmeasurable for lv in ev.levels):
        return f"no level of trial {number} measured the server (its load generator lagged at each)"
    return f"no level of trial {number} has a window to replay"


def predicted_within(predicted: SustainedRate | None, ev: Evaluation) -> bool:
    """Whether the twin's goodput prediction for a trial's settings lies within the
    capacity interval the trial measured (its levels' own statistics; open upwards where
    no rate broke)."""
    interval = ev.capacity_interval
    if predicted is None or interval is None:
        return False
    rate = predicted.rate_per_s
    return interval.low_per_s <= rate and (
        interval.high_per_s is None or rate <= interval.high_per_s
    )

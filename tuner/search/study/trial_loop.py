"""The trial loop: each trial is one candidate launched, warmed up, loaded and scored
(``TrialLoop``): vLLM's defaults first, then the twin's picks and the sampler's, within
the time budget; the twin calibrated and fitted from what each trial measured.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from tuner.errors import ConfigError, LogParseError
from tuner.run.budget import LaunchKind
from tuner.run.evaluation import Evaluation, Verdict
from tuner.run.layout import RunLayout
from tuner.search import optuna_store
from tuner.search.boot_calibration import adopt, wants
from tuner.search.budget import RECENT_LAUNCHES, TimeBudget
from tuner.search.clock import (
    client_events_per_s,
    clock_text,
    host_busy_lag,
    measured_clock,
    server_lag_scale,
)
from tuner.search.compile_cache import CompileLaunches
from tuner.search.context import (
    MAX_STREAM_INTERVAL,
    StudySetup,
    TuneContext,
    auto_stream_fraction,
    auto_stream_interval,
    auto_time_scale,
)
from tuner.search.evaluate import evaluate
from tuner.search.optuna_store import (
    FrozenTrial,
    Trial,
    TrialState,
)
from tuner.search.rate_search import BRACKET_LEVELS
from tuner.search.study.claims import Duty
from tuner.search.study.opening import OpenStudy, retry_trial
from tuner.search.study.records import (
    OTHERS_POLL_S,
    Progress,
    TrialRole,
    best_trial,
    load_evaluation,
    objective_values,
    record,
)
from tuner.search.study.settings import SETTINGS_ATTR
from tuner.search.study.trial_lines import trial_line
from tuner.search.study.trial_twin import TrialTwin, fit_cost_s
from tuner.serving.level_schedule import level_workload
from tuner.serving.load import plan_schedule
from tuner.serving.processes import ChildRegistry
from tuner.serving.server import Backend, server_cache_root
from tuner.serving.window import MIN_WINDOW_S
from tuner.twin.screen import TwinSearch
from tuner.vllm.log import calibration_from_report
from tuner.vllm.memory import Calibration
from tuner.vllm.space import TrialParams, vllm_defaults
from tuner.vllm.versions import (
    REQUEST_STREAM_INTERVAL,
    VllmVersion,
    logged_disagreement,
    logged_version,
)

log = logging.getLogger(__name__)


PREPARE_WAIT_S = 600.0
# The study's attribute holding the clock the run measures on now (``StudySetup.clock_record``):
# a resumed run starts there. The study's ``time_scale`` stays the one it chose first (a
# ``--time-scale`` given on resume is checked against it).
CLOCK_ATTR = "clock_now"
# A trial is started where its first levels fit before the search's deadline, the twin's
# bracket of its rate (``tuner.search.rate_search``: a right prediction is bracketed in
# two), and measures as many levels as end before it; not only where a whole trial, as the
# last took, fits. On a 10-minute default tune a trial's levels took 48 to 149 s.
SHORT_TRIAL_LEVELS = BRACKET_LEVELS


class TrialLoop:
    """Runs trials until the study has ``trials`` complete ones or the time is up."""

    def __init__(
        self,
        ctx: TuneContext,
        opened: OpenStudy,
        registry: ChildRegistry,
        *,
        deadline_s: float,
        progress: Progress,
        budget: TimeBudget | None = None,
        reserve_s: Callable[[], float] | None = None,
    ) -> None:
        """``deadline_s``: when the search stops starting trials (monotonic). With ``budget``
        (the tune's, which counts every launch) and ``reserve_s`` (what the edge search and
        the confirmations after it take, re-estimated from the launches measured), the
        search stops at the budget's end less the reserve, re-read before every trial."""
        self.ctx = ctx
        # How every trial is measured: the study's own once prepare() has read it, then
        # calibrated after the first real startup (each launch is given the one of now).
        self.setup = StudySetup()
        self.study = opened.study
        self.storage = opened.storage
        self.claims = opened.claims
        self.settings = opened.settings
        self.registry = registry
        self.deadline_s = deadline_s
        self.progress = progress
        self.budget = budget
        self.reserve_s = reserve_s
        self.trial_estimate_s = 0.0
        self.levels_estimate_s = 0.0  # what a trial measures once launched (wall seconds)
        self.level_estimate_s = 0.0  # one of its levels (wall seconds; 0: none measured yet)
        # before its launch: its settings drawn and the twin's prediction for them (wall
        # seconds, as the last trial's took; 0: none yet)
        self.before_launch_s = 0.0
        self.last_evaluation: Evaluation | None = None  # this worker's last trial's
        self._launch_deadline_s = deadline_s  # what the next trial was checked against
        self._first_launch = True  # the next trial is the first (measured to the budget's end)
        self._current_trial: int | None = None
        self._version_checked = False  # the first vLLM startup's log against the version read
        self.twin = TwinSearch(ctx, progress)  # its screen of the space and its picks
        self.trial_twin = TrialTwin(ctx, progress)  # its predictions for trials, its fits
        # What each new (block size, KV dtype) costs: its first launch compiles.
        self.compile_launches = CompileLaunches(server_cache_root(ctx.run_dir / "vllm-cache"))

    # -- set-up shared by every worker --------------------------------------------------------

    def prepare(self) -> StudySetup:
        """Time scale, streamed share, calibration and the baseline trial, decided once per
        study: the first worker claims the set-up (``Claims``), the others wait for it
        and adopt what it chose. Returns the set-up (also kept as ``self.setup``)."""
        attrs = self.study.user_attrs
        if "time_scale" not in attrs:
            if self.claims.take(Duty.PREPARE):
                time_scale, fraction, interval = self._choose_measurement()
                for key, value in {
                    SETTINGS_ATTR: self.settings.model_dump(mode="json"),
                    "model": self.ctx.config.model,
                    "gpu": self.ctx.gpu_name,
                    "backend": self.ctx.backend.value,
                    "vllm_version": str(self.ctx.version),
                    "workload": self.ctx.workload.name,
                    "objective": self.ctx.config.objective.value,
                    "space": self.ctx.space.describe(),
                    "stream_fraction": fraction,
                    "stream_interval": interval,
                }.items():
                    self.study.set_user_attr(key, value)
                if not self.study.trials:
                    defaults = vllm_defaults(
                        self.ctx.space, self.ctx.version, self.ctx.gpu_or_default
                    )
                    self.study.enqueue_trial(
                        self.ctx.space.to_optuna(defaults),
                        user_attrs={"role": TrialRole.DEFAULT.value},
                    )
                self.study.set_user_attr("time_scale", time_scale)  # last: set-up complete
            else:
                self.progress("another worker is setting this study up; waiting for it")
                deadline = time.monotonic() + PREPARE_WAIT_S
                while "time_scale" not in self.study.user_attrs:
                    if time.monotonic() > deadline:
                        raise ConfigError(
                            f"study {self.study.study_name!r}: the worker setting it up did not "
                            f"finish within {PREPARE_WAIT_S:.0f} s; accepted: start again with --resume"
                        )
                    time.sleep(1.0)
            attrs = optuna_store.load_study(self.storage, self.study.study_name).user_attrs
        calibration = self.setup.calibration
        if "calibration" in attrs and calibration is None:
            calibration = Calibration.model_validate(attrs["calibration"])
        self.setup = StudySetup(
            time_scale=float(attrs["time_scale"]),
            stream_fraction=float(attrs.get("stream_fraction", 1.0)),
            stream_interval=int(attrs.get("stream_interval", 1)),
            calibration=calibration,
            timing=self.trial_twin.record().factors,
        )
        if CLOCK_ATTR in attrs and self._clock_adapts():  # a resumed run: the clock of then
            self.setup = self.setup.with_clock_record(attrs[CLOCK_ATTR])
            log.info(
                "clock: the simulated GPU's clock %s (time scale %g), %d tokens an event, "
                "as the run before left it", clock_text(self.setup.time_scale),
                self.setup.time_scale, self.setup.stream_interval,
            )  # fmt: skip
        return self.setup

    def _clock_adapts(self) -> bool:
        """Whether the run chooses its clock as it goes: the simulated engine, no
        ``--time-scale`` given."""
        return self.ctx.backend is Backend.SIM and self.ctx.config.time_scale is None

    def _record_clock(self, before: dict[str, object]) -> None:
        """The clock of now in the study (``CLOCK_ATTR``) where it changed from ``before``."""
        now = self.setup.clock_record()
        if now != before:
            self.study.set_user_attr(CLOCK_ATTR, now)

    def _choose_measurement(self) -> tuple[float, float, int]:
        """The simulator's time scale, the share of requests streamed and the tokens a
        streamed event carries, so the load generator keeps up with the busiest rate the
        search will offer. Where the target vLLM reads a request's own ``stream_interval``
        and the SLO has no ITL objective, every request is streamed with as many tokens an
        event as the load generator needs at the fastest clock; elsewhere a share of the
        requests is streamed, every token an event."""
        ctx = self.ctx
        config = ctx.config
        fraction = config.stream_fraction
        interval = config.stream_interval
        if ctx.backend is not Backend.SIM and fraction is not None:
            return 1.0, fraction, interval or 1
        if ctx.gpu is None or ctx.workload.mean_rate_per_s is None:
            return config.time_scale or 1.0, fraction or 1.0, interval or 1
        defaults = vllm_defaults(ctx.space, ctx.version, ctx.gpu)
        rate = self.trial_twin.predicted_max_rate(
            defaults, self.setup, config.rate or ctx.workload.mean_rate_per_s
        )
        if rate <= 0:
            return config.time_scale or 1.0, fraction or 1.0, interval or 1
        # What the busiest level offers: its schedule's requests and tokens per second.
        busiest_s = config.level_duration_s or MIN_WINDOW_S
        spec = level_workload(ctx.workload, rate * 1.3, busiest_s, window=(0.0, busiest_s))
        schedule = [r for r in plan_schedule(spec) if not r.warmup]
        requests_per_s = len(schedule) / busiest_s
        tokens_per_s = sum(r.max_tokens for r in schedule) / busiest_s
        sim = ctx.backend is Backend.SIM
        fastest = (config.time_scale or config.fastest_time_scale) if sim else 1.0
        if interval is None:
            interval = (
                auto_stream_interval(tokens_per_s, requests_per_s, config.max_events_per_s, fastest)
                if self._chunks_adapt()
                else 1
            )
        if fraction is None:
            fraction = (
                auto_stream_fraction(
                    tokens_per_s, requests_per_s, config.max_events_per_s,
                    config.min_stream_fraction,
                )
                if interval == 1
                else 1.0
            )  # fmt: skip
        if not sim:
            scale = 1.0
        elif config.time_scale is not None:
            scale = config.time_scale
        else:
            scale = auto_time_scale(
                tokens_per_s, requests_per_s, config.max_events_per_s, fraction,
                fastest=config.fastest_time_scale, stream_interval=interval,
            )  # fmt: skip
        chunks = f", {interval} tokens an event" if interval > 1 else ""
        self.progress(
            f"the busiest level offers ~{requests_per_s:,.0f} requests/s and "
            f"~{tokens_per_s:,.0f} tokens/s: streaming {fraction:.0%} of requests{chunks}"
            + (
                f", the simulated GPU's clock {clock_text(scale)} (results in its own time)"
                if scale != 1.0
                else ""
            )
        )
        return scale, fraction, interval

    def _chunks_adapt(self) -> bool:
        """Whether the tokens a streamed event carries are the harness's to choose: the
        target vLLM reads a request's own ``stream_interval``, the SLO has no ITL objective
        (a chunk's tokens share one arrival), and neither the interval nor the streamed
        share was given."""
        ctx = self.ctx
        config = ctx.config
        return (
            ctx.version.at_least(REQUEST_STREAM_INTERVAL)
            and ctx.workload.slo.itl is None
            and config.stream_interval is None
            and config.stream_fraction is None
        )

    def _adapt_clock(self, ev: Evaluation) -> str | None:
        """On the simulated engine with an automatic clock: the next launches' clock as fast
        as this trial's load generator showed room for, with more tokens an event where
        they are the harness's to choose (``tuner.search.clock.measured_clock``), said when
        it changes; what the next trial is estimated to measure changes with it."""
        ctx = self.ctx
        if not self._clock_adapts() or not ev.levels:
            return None
        before, interval = self.setup.time_scale, self.setup.stream_interval
        clock = measured_clock(
            ev.levels, max_events_per_s=ctx.config.max_events_per_s,
            fastest=ctx.config.fastest_time_scale, stream_interval=interval,
            max_stream_interval=MAX_STREAM_INTERVAL if self._chunks_adapt() else None,
        )  # fmt: skip
        if clock is None or (
            math.isclose(clock.time_scale, before) and clock.stream_interval == interval
        ):
            return None
        scale = clock.time_scale
        self.setup = replace(self.setup, time_scale=scale, stream_interval=clock.stream_interval)
        self.levels_estimate_s *= scale / before
        self.level_estimate_s *= scale / before
        chunks = (
            f", {clock.stream_interval} tokens an event (was {interval})"
            if clock.stream_interval != interval
            else ""
        )
        run = (
            f"keep the simulated GPU's clock {clock_text(scale)} (time scale {scale:g})"
            if math.isclose(scale, before)
            else f"run the simulated GPU's clock {clock_text(scale)} (time scale {scale:g}, "
            f"was {before:g})"
        )
        line = (
            f"{'':>9}clock: the load generator's busiest level asked "
            f"{max(client_events_per_s(lv) or 0.0 for lv in ev.levels):,.0f} events per "
            f"emulated second; the next launches {run}{chunks}"
        )
        log.info("%s", line.strip())
        return line

    def _keep_slower_clock(self, params: TrialParams, ev: Evaluation) -> None:
        """On the simulated engine with an automatic clock: where this trial's simulated
        server fell behind its clock (``server_lag_scale``), the settings' later launches
        start on the clock it was measured on after (``StudySetup.with_slower_clock``);
        the next trials of other settings keep the clock their load generator allows."""
        if not self._clock_adapts():
            return
        scale = server_lag_scale(ev.levels)
        if scale is None and (busy := host_busy_lag(ev.levels)) is not None:
            log.info(
                "clock: %s: its simulated server fell behind the clock while other processes "
                "took %.0f%% of the host's CPU; its later launches keep the clock of the "
                "study", params.short(), 100 * busy,
            )  # fmt: skip
        if scale is None or scale <= self.setup.time_scale_for(params):
            return
        self.setup = self.setup.with_slower_clock(params, scale)
        log.info(
            "clock: %s: its simulated server fell behind the clock; its later launches run "
            "the simulated GPU's clock %s (time scale %g)", params.short(), clock_text(scale), scale,
        )  # fmt: skip

    # -- the loop ---------------------------------------------------------------------------------

    def complete_trials(self) -> list[FrozenTrial]:
        return optuna_store.trials_in(self.study, TrialState.COMPLETE)

    def running_trials(self) -> list[FrozenTrial]:
        return optuna_store.trials_in(self.study, TrialState.RUNNING)

    def run(self) -> None:
        """``_run_trials``; the twin's screen, where one is still under way, is stopped (where
        a pick was made from its first pass, the rest is waited for first)."""
        try:
            self._run_trials()
            self.twin.finish()
        finally:
            self.twin.stop()

    def _run_trials(self) -> None:
        """Run trials until the study has ``trials`` complete ones and none running.

        Between its trials a worker runs none, so the RUNNING trials are other
        workers': it starts another only while complete and running trials together
        are fewer than wanted, and otherwise waits for them (until its deadline), so
        the finalize sees every trial. A worker that died mid-trial stops sending
        heartbeats: its trial is failed here and retried (the storage's callback
        enqueues it with the same settings), and a waiting worker runs the retry.
        """
        wanted = self.ctx.config.trials
        said_waiting = False
        while True:
            optuna_store.fail_stale(self.study)
            done = len(self.complete_trials())
            running = len(self.running_trials())
            self._update_deadline()
            left = self.deadline_s - time.monotonic()
            if done >= wanted and running == 0:
                return
            if done + running >= wanted:
                if left <= 0:
                    self.progress(
                        f"time budget spent: not waiting for the {running} trial(s) other "
                        "workers are running"
                    )
                    return
                if not said_waiting:
                    self.progress(
                        f"{done} trial(s) complete, {running} running on other workers: "
                        "waiting for them"
                    )
                    said_waiting = True
                time.sleep(OTHERS_POLL_S)
                continue
            said_waiting = False
            if not self._next_trial_fits(done, left):
                return
            began = time.monotonic()
            try:
                self._twin_turn()
                self.study.optimize(self._objective, n_trials=1, catch=())
            except KeyboardInterrupt:  # SIGINT or SIGTERM: Optuna has failed the trial
                self._retry_cut_off()
                raise
            took = time.monotonic() - began
            self.trial_estimate_s = (
                max(self.trial_estimate_s * 0.5, took) if self.trial_estimate_s else took
            )

    # -- the time budget ----------------------------------------------------------------------

    def _update_deadline(self) -> None:
        """The search's deadline: the budget's end less what the edge search and the
        confirmations are now estimated to take (launches measured so far)."""
        if self.budget is not None and self.reserve_s is not None:
            self.deadline_s = self.budget.deadline_s - self.reserve_s()

    def _next_trial_fits(self, done: int, left_s: float) -> bool:
        """Whether the next trial's launch is started: the first one (vLLM's defaults, the
        baseline) when its launch ends before the budget's end; the next ones when a whole
        trial (a launch as measured, and what trials measured once launched) ends before
        the search's deadline. Said when not."""
        budget = self.budget
        if budget is None:  # the trials' own wall time only
            if done > 0 and left_s < self.trial_estimate_s:
                self.progress(
                    f"time budget: {left_s:.0f} s left, a trial takes ~{self.trial_estimate_s:.0f} s; "
                    "stopping the search"
                )
                return False
            return True
        if done > 0 and self.levels_estimate_s == 0.0:
            self.levels_estimate_s = self._levels_measured_before()  # a resumed study's
        self._first_launch = done == 0 and self.levels_estimate_s == 0.0
        if self._first_launch:
            self._launch_deadline_s = budget.deadline_s
            skip = budget.fits(LaunchKind.TRIAL, "the first trial", budget.launch_estimate_s())
        else:
            self._launch_deadline_s = self.deadline_s
            need = self._next_trial_need_s(budget)
            reserve = max(0.0, budget.deadline_s - self.deadline_s)
            skip = budget.fits(
                LaunchKind.TRIAL, "the next trial", need, deadline_s=self.deadline_s,
                note=(
                    f"at least its first {SHORT_TRIAL_LEVELS} levels; "
                    f"{reserve:.0f} s kept for the OOM edge and the confirmations"
                ),
            )  # fmt: skip
        if skip is None:
            return True
        self.progress(f"time budget: {skip.text()}; stopping the search")
        return False

    def _next_trial_need_s(self, budget: TimeBudget) -> float:
        """What the next trial is counted to take (``next_trial_need_s``)."""
        return next_trial_need_s(
            self.before_launch_s, budget.launch_estimate_s(), self.levels_estimate_s,
            self.level_estimate_s,
        )  # fmt: skip

    def _wanted_after(self) -> int:
        """The trials still wanted after the one under way."""
        return max(0, self.ctx.config.trials - len(self.complete_trials()) - 1)

    def _extra_deadline_s(self) -> float | None:
        """When the levels of the trial about to launch past its first
        ``SHORT_TRIAL_LEVELS`` must end (``extra_deadline_s``); None: no budget, or the
        first trial (vLLM's defaults, the baseline, measured to the budget's end)."""
        budget = self.budget
        if budget is None or self._first_launch:
            return None
        return extra_deadline_s(
            self.deadline_s, time.monotonic(), self._next_trial_need_s(budget),
            self._wanted_after(),
        )  # fmt: skip

    def _fit_costs_a_trial(self) -> bool:
        """Whether a fit of the twin now would cost one of the few trials left
        (``fit_costs_a_trial``)."""
        budget = self.budget
        if budget is None:
            return False
        return fit_costs_a_trial(
            self.deadline_s - time.monotonic(), fit_cost_s(self.ctx.config.budget_min),
            self._next_trial_need_s(budget), self._wanted_after(),
        )  # fmt: skip

    def _another_trial_fits(self) -> bool:
        """Whether a trial after the one just measured could start before the search's
        deadline, as ``_next_trial_fits`` will count it (nothing recorded; no budget: it
        could)."""
        if self.budget is None:
            return True
        return self._next_trial_need_s(self.budget) <= self.deadline_s - time.monotonic()

    def _levels_measured_before(self) -> float:
        """What the study's last trials measured once launched (their levels), for a run
        that resumes a study: the longest of the last ``RECENT_LAUNCHES``; 0 where none."""
        measured = [  # on the clock of now (a trial ran on its own: ``Evaluation.time_scale``)
            levels_s
            for trial in self.complete_trials()
            if (ev := load_evaluation(trial)) is not None
            and (levels_s := ev.levels_s_at(self.setup.time_scale))
        ]
        return max(measured[-RECENT_LAUNCHES:], default=0.0)

    def _count_launch(self, number: int, ev: Evaluation) -> None:
        """The trial's launch in the budget, and what its levels took in the estimate."""
        self.last_evaluation = ev
        if ev.launch_s is None:
            return  # screened: nothing launched
        # (on the clock the next launches start on, before ``_adapt_clock`` changes it;
        # ``Evaluation.levels_s_at``: each level on its own clock, its lagged attempts not)
        levels = ev.levels_s_at(self.setup.time_scale) or 0.0
        self.levels_estimate_s = max(self.levels_estimate_s * 0.5, levels)
        if ev.levels:
            self.level_estimate_s = max(self.level_estimate_s * 0.5, levels / len(ev.levels))
        if self.budget is not None:
            self.budget.record_evaluation(
                LaunchKind.TRIAL, f"trial {number}", ev,
                began_s=time.monotonic() - (ev.launch_s + (ev.levels_s or 0.0) + (ev.stop_s or 0.0)),
                deadline_s=self._launch_deadline_s,
            )  # fmt: skip
        self._update_deadline()  # the reserve, with this launch measured

    def _twin_turn(self) -> None:
        """The twin's part before a trial: its screen started beside the first one (vLLM's
        defaults, enqueued), and after that its best untried setting enqueued while it
        predicts one above the best measured (``tuner.twin.screen``)."""
        ctx = self.ctx
        if not ctx.config.twin_search or self.twin.done:
            return
        if ctx.twin is None:
            self.twin.done = True
            return
        if not self.twin.started and ctx.config.trials - len(self.complete_trials()) < 2:
            self.twin.done = True  # no trial after this one for the twin to choose
            return
        if not self.twin.started:  # (the prediction it starts from is a simulation of its own)
            fallback = self.fallback_rate()
            defaults = vllm_defaults(ctx.space, ctx.version, ctx.gpu_or_default)
            self.twin.start(
                self.setup.timing,
                self.trial_twin.predicted_max_rate(defaults, self.setup, fallback)
                or fallback
                or 1.0,
            )
        if optuna_store.trials_in(self.study, TrialState.WAITING):
            return  # enqueued first: vLLM's defaults, or a retry
        trials = optuna_store.trials_in(self.study)
        tried = [
            ctx.space.from_optuna(t.params or t.system_attrs.get("fixed_params") or {})
            for t in trials
        ]
        best = best_trial(self.study)
        best_params = ctx.space.from_optuna(best.params) if best is not None else None
        pick = self.twin.pick(tried, best_params, self.setup.timing)
        if pick is None:
            return
        self.study.enqueue_trial(
            ctx.space.to_optuna(pick.params),
            user_attrs={
                "role": TrialRole.TWIN.value,
                "twin_rate_per_s": pick.predicted_rate_per_s,
                "landscape_rate_per_s": pick.landscape_rate_per_s,
            },
        )
        self.progress(
            f"twin: next {pick.params.short()} (predicted {pick.predicted_rate_per_s:.2f}/s)"
        )

    def _retry_cut_off(self) -> None:
        """The trial an interruption cut off runs again, with the same settings, on
        ``--resume``: an interrupted trial measured nothing."""
        number = self._current_trial
        if number is None:
            return
        trial = optuna_store.trials_in(self.study)[number]
        if trial.state is TrialState.FAIL:
            retry_trial(self.study, trial)
            log.info("trial %d was interrupted; --resume runs it again", number)

    def _objective(self, trial: Trial) -> float | tuple[float, float]:
        self._current_trial = trial.number
        entered = time.monotonic()
        ctx = self.ctx
        params = ctx.space.suggest(trial)
        role = trial.user_attrs.get("role", TrialRole.SEARCH.value)
        out_dir = RunLayout(ctx.run_dir).trial_dir(trial.number)
        if out_dir.is_dir() and any(out_dir.iterdir()):
            # Trial n of this study is the only writer of trials/<n>: what is there is
            # another study's evidence (open_study refuses such a run directory up front).
            raise ConfigError(
                f"{out_dir} already holds another trial's evidence, which trial "
                f"{trial.number} of study {self.study.study_name!r} would overwrite; "
                "accepted: another --run-dir"
            )
        fallback = self.fallback_rate()  # reads the study's trials: once per trial
        # a twin's pick was screened with the step costs of now: its prediction starts there
        near = trial.user_attrs.get("twin_rate_per_s")
        start = self.trial_twin.start_rate(params, self.setup, fallback, near)
        predicted = self.trial_twin.prediction(params, self.setup, fallback, near)
        compiled_before = self.compile_launches.entries()
        self.before_launch_s = time.monotonic() - entered
        evaluation = evaluate(
            ctx, self.setup, params, out_dir=out_dir, registry=self.registry, start_rate_per_s=start,
            predicted_rate_per_s=(predicted.rate_per_s or None) if predicted else None,
            predicted_answer_times=predicted.answer_times if predicted else None,
            # the first trial (vLLM's defaults) is started when its launch ends before the
            # budget's end, and measured to it; the next ones to the search's deadline
            deadline=self._launch_deadline_s if self.budget is not None else None,
            twin_off_share=self.trial_twin.last_off_share() if predicted else None,
            extra_deadline=self._extra_deadline_s(),
        )  # fmt: skip
        self._count_launch(trial.number, evaluation)
        before = self.setup.clock_record()
        clock = self._adapt_clock(evaluation)
        self._keep_slower_clock(params, evaluation)
        self._record_clock(before)
        self._calibrate(evaluation)
        self._cross_check_version(evaluation)
        self.setup = self.trial_twin.learn(
            trial.number, params, evaluation, predicted, setup=self.setup,
            complete=self.complete_trials(), last=not self._another_trial_fits(),
            costs_trial=self._fit_costs_a_trial(),
        )  # fmt: skip
        record(trial, evaluation, role=role)
        line = self._line(trial.number, evaluation)
        compiled = self.compile_launches.launched(
            params, evaluation.startup_s, before=compiled_before
        )
        lines = [line, *([f"{'':>9}{compiled}"] if compiled is not None else []), clock]
        self.progress("\n".join(text for text in lines if text))
        return objective_values(ctx.config.objective, evaluation)

    def start_rate(self, params: TrialParams) -> float | None:
        """The first rate to measure for ``params``, with the twin's step costs of now
        (``TrialTwin.start_rate``): the edge search and the confirmations start there too."""
        return self.trial_twin.start_rate(params, self.setup, self.fallback_rate())

    def fallback_rate(self) -> float | None:
        """A trial's first rate where the twin places none: the best goodput so far, else
        ``--rate``, else the workload's own rate."""
        ctx = self.ctx
        return self.best_rate() or ctx.config.rate or ctx.workload.mean_rate_per_s

    def best_rate(self) -> float | None:
        rates = [
            float(t.user_attrs["rate_per_s"])
            for t in self.complete_trials()
            if t.user_attrs.get("verdict") == Verdict.MET and t.user_attrs.get("rate_per_s")
        ]
        return max(rates) if rates else None

    def _calibrate(self, evaluation: Evaluation) -> None:
        """The memory model calibrated from the first startup that measured vLLM's budget,
        in the boot state production pods start in: again from a later trial that booted
        in that state where the first did not (``tuner.search.boot_calibration``)."""
        ctx = self.ctx
        production = ctx.config.production_boot_state
        current = self.setup.calibration
        if evaluation.startup is None or ctx.gpu is None or not wants(current, production):
            return
        try:
            found = calibration_from_report(
                evaluation.startup, source=str(Path(evaluation.dir) / "server.log")
            )
        except LogParseError as exc:  # say once why the first startup cannot calibrate
            if current is None and "calibration_skipped" not in self.study.user_attrs:
                self.study.set_user_attr("calibration_skipped", str(exc))
                self.progress(f"memory model not calibrated: {exc}")
            return
        except ConfigError:
            return
        except Exception:  # a log without the memory summary: keep the uncalibrated model
            log.info("no calibration from %s", evaluation.dir, exc_info=True)
            return
        adopted = adopt(
            current, found, production=production, settings=evaluation.params.serving(ctx.base),
            model=ctx.model, gpu=ctx.gpu, version=ctx.version,
        )  # fmt: skip
        if adopted is None:
            return
        calibration = adopted.calibration
        self.setup = self.setup.calibrated(calibration)
        self.study.set_user_attr("calibration", calibration.model_dump(mode="json"))
        RunLayout(ctx.run_dir).calibration_json.write_text(
            calibration.model_dump_json(indent=2), encoding="utf-8"
        )
        self.progress(adopted.line)

    def _cross_check_version(self, evaluation: Evaluation) -> None:
        """After the first vLLM launch: one line when the release its startup log names is
        not the one read from its packages before launching (or assumed, unread)."""
        if self._version_checked or self.ctx.backend is not Backend.VLLM:
            return
        server_log = Path(evaluation.dir) / "server.log"
        if evaluation.outcome is None or not server_log.is_file():
            return  # screened, not launched
        self._version_checked = True
        logged = logged_version(server_log.read_text(encoding="utf-8", errors="replace"))
        installed = self.ctx.installed_version
        read = VllmVersion.read(installed) if installed else None
        line = logged_disagreement(read, self.ctx.version, logged)
        if line:
            self.progress(line)

    def _line(self, number: int, ev: Evaluation) -> str:
        return trial_line(self.study, number, ev, deadline_s=self.deadline_s)


# Where the budget holds at most this many further trials, neither a fit of the twin nor
# a level past a trial's first two is spent where it would cost one of them: each is a
# setting measured, and the recommendation's confirmation measures the best again. With
# more to come, a fit places all of their rates and a closed bracket ranks them. The
# default 10-minute tune measured three trials where a fit after trial 1 (45 s, the twin
# 7% off its levels before and after) and trial 1's third level left 16 s for a fourth
# that needed 47 (`benchmarks/make_tune_wall.md`, wall-l).
FEW_TRIALS_LEFT = 3


def further_trials(left_s: float, need_s: float, wanted: int) -> int:
    """How many trials of ``need_s`` each fit in ``left_s``, at most ``wanted``."""
    if need_s <= 0.0:
        return wanted
    return max(0, min(wanted, math.floor(left_s / need_s)))


def extra_deadline_s(deadline_s: float, now_s: float, need_s: float, wanted: int) -> float | None:
    """When a trial launched at ``now_s`` must end its levels past its first two, so that
    as many further trials of ``need_s`` fit before ``deadline_s`` as would after those
    two, where that is at most ``FEW_TRIALS_LEFT`` (None: no further trial fits anyway,
    or more than that many do)."""
    further = further_trials(deadline_s - now_s - need_s, need_s, wanted)
    if not 0 < further <= FEW_TRIALS_LEFT:
        return None
    return deadline_s - further * need_s


def fit_costs_a_trial(left_s: float, fit_s: float, need_s: float, wanted: int) -> bool:
    """Whether a fit of ``fit_s`` leaves fewer of at most ``FEW_TRIALS_LEFT`` further
    trials of ``need_s`` fitting in ``left_s``."""
    now = further_trials(left_s, need_s, wanted)
    return 0 < now <= FEW_TRIALS_LEFT and further_trials(left_s - fit_s, need_s, wanted) < now


def next_trial_need_s(
    before_launch_s: float, launch_s: float, levels_estimate_s: float, level_estimate_s: float
) -> float:
    """What the next trial is counted to take before the search's deadline (wall seconds):
    what came before the last trial's launch (its settings drawn and the twin's prediction
    for them), a launch as measured, and its levels (``next_trial_levels_s``). Uncounted,
    the prediction (10 s) let the 10-minute tune's fourth trial start with 48 s left for
    the 56 its first two levels needed: it measured one, and its "at least 8.11" became
    the best."""
    return before_launch_s + launch_s + next_trial_levels_s(levels_estimate_s, level_estimate_s)


def next_trial_levels_s(levels_estimate_s: float, level_estimate_s: float) -> float:
    """What the next trial is counted to measure before the search's deadline (wall
    seconds): a whole trial as the last ones took (``levels_estimate_s``), or where less its
    first ``SHORT_TRIAL_LEVELS`` levels (``level_estimate_s`` one; 0: none measured yet)."""
    if level_estimate_s <= 0.0:
        return levels_estimate_s
    return min(levels_estimate_s, SHORT_TRIAL_LEVELS * level_estimate_s)

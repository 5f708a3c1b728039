"""The terminal's lines on the trial loop: one per trial (``trial_line``), why a trial did
not serve, and what a fit of the twin changed.
"""

from __future__ import annotations

import time
from pathlib import Path

from tuner.run.evaluation import Evaluation, Verdict
from tuner.run.goodput import GoodputBound, GoodputUnit
from tuner.run.twin_record import TrialFit
from tuner.search import optuna_store
from tuner.search.optuna_store import (
    Study,
    TrialState,
)
from tuner.search.study.records import arrival_goodput, best_trial, ties_with_best
from tuner.twin.fit import FIT_WITHIN_SHARE


def trial_line(study: Study, number: int, ev: Evaluation, *, deadline_s: float) -> str:
    """The terminal's line on trial ``number``: its settings, verdict and goodput (or why it
    did not serve), the best so far and the time left before ``deadline_s`` (monotonic)."""
    # this trial is recorded but not yet complete: the best so far counts it too
    running = [t for t in optuna_store.trials_in(study, TrialState.RUNNING) if t.number == number]  # fmt: skip
    best = best_trial(study, also=running)
    best_text = "best -"
    if best is not None:
        at_least = best.user_attrs.get("goodput_bound") == GoodputBound.LOWER_BOUND
        arrivals = arrival_goodput(best)
        unit = unit_of(best.user_attrs.get("goodput_unit"))
        gpus = int(best.user_attrs.get("ranked_gpus") or 1)
        per_gpu = f", {arrivals / gpus:.2f} per GPU" if gpus > 1 else ""
        best_text = (
            f"best {'>=' if at_least else ''}{arrivals:.2f} {unit.label} (#{best.number}{per_gpu})"
        )
        if number != best.number and any(
            t.number == number for t in ties_with_best(study, best, also=running)
        ):
            best_text += f", tie with #{best.number} within the noise"

    left = max(0.0, deadline_s - time.monotonic())
    if ev.verdict is Verdict.MET:
        what = f"goodput {ev.stated_goodput.text()}"
        if ev.params.gpus > 1:  # the search ranks per GPU: say what this one holds
            what += f" ({ev.stated_goodput.arrival_rate_per_s / ev.params.gpus:.2f} per GPU)"
        if ev.capacity_interval is not None:
            what += f" {ev.capacity_interval.bracket()}"
        what += f"  p99 TTFT {ev.p99_ttft_ms or 0:,.0f} ms"
    elif ev.failure is not None or ev.verdict in (Verdict.STARTUP_FAILED, Verdict.DIED):
        what = did_not_serve(ev)
    elif ev.levels and all(lv.unmeasurable for lv in ev.levels):
        what = "no rate measurable: the client could not keep up"
    else:
        what = ev.backlog_note or "SLO missed at every rate"
    line = (
        f"trial {number:>3}  {ev.params.short():<52} {ev.verdict.value:<14} {what:<44} "
        f"{best_text}  {left / 60:4.1f} min left"
    )
    # where the launch's wall time went: its launch, warm-up, each level's parts, its stop
    if (seconds := ev.seconds_text()) is not None:
        line += f"\n{'':>9}time: {seconds}"
    # the levels its load generator could not keep up with are missing from the goodput
    return line if ev.client_note is None else f"{line}\n{'':>9}client: {ev.client_note}"


def did_not_serve(ev: Evaluation) -> str:
    """A trial that did not serve: its outcome, vLLM's own words for why and what the harness
    saw where the log does not say it (the startup timeout that fired, a dead /health)."""
    lead = {
        Verdict.SCREENED: "screened",
        Verdict.DIED: "died under load",
    }.get(ev.verdict, "did not start")
    seen = f" ({ev.note})" if ev.note else ""
    if ev.failure is not None:
        return f"{lead}: {ev.failure.describe()}{seen}"
    outcome = ev.outcome.value if ev.outcome is not None else ev.verdict.value
    if ev.note:
        return f"{lead}: {outcome}: {ev.note} (see {Path(ev.dir) / 'server.log'})"
    return f"{lead}: {outcome}, no cause in vLLM's log (see {Path(ev.dir) / 'server.log'})"


def twin_line(one: TrialFit) -> str:
    """The terminal's line on a fit: how far off the twin was on the trial's levels, and
    its goodput prediction for the trial's settings, before and after."""

    def pct(share: float | None) -> str:
        return "-" if share is None else f"{100 * share:+.0f}%"

    def off(share: float | None) -> str:
        return "-" if share is None else f"{100 * share:.0f}%"

    text = f"  twin: {off(one.error_before)} off trial {one.trial}'s measured percentiles, "
    if one.fitted:
        text += f"{off(one.error_after)} after fitting ({one.after.describe()})"
    else:
        why = one.kept_because or f"within {off(FIT_WITHIN_SHARE)}"
        text += f"{why}: not fitted ({one.after.describe()})"
    if one.measured_rate_per_s:
        before = TrialFit.share_off(one.predicted_rate_per_s, one.measured_rate_per_s)
        after = TrialFit.share_off(one.predicted_after_per_s, one.measured_rate_per_s)
        text += f"; its goodput prediction {pct(before)}"
        text += f" -> {pct(after)}" if one.fitted else ""
    if one.fitted and not one.adopted:
        text += ": not adopted, the twin keeps its factors"
    return text


def unit_of(value: object) -> GoodputUnit:
    """A recorded goodput unit (requests/s when recorded before units were)."""
    try:
        return GoodputUnit(str(value))
    except ValueError:
        return GoodputUnit.REQUESTS_PER_S

"""The tie-break: launches spent where the best trial and its rival might separate.

The best trial is the one with the highest goodput, but where another feasible trial's
capacity interval overlaps its own the measurement cannot rank the two
(``ties_with_best``). ``settle_ties`` decides which of them is recommended:

1. **The rival**: among the tied trials, the highest goodput, except that where the best
   changes the model's numerics (``--kv-cache-dtype fp8``) the best tied trial that keeps
   them is the rival: that is the choice that matters (a speed-up within the noise is
   not worth different answers); and where the best offloads KV to host memory
   (``--kv-offloading-size``) the best tied trial that does not (a speed-up within the
   noise is not worth tens of GiB of pinned memory on every node); and where the best's
   goodput is only a lower bound (no rate it was measured at broke: a trial the search's
   deadline cut short), the best tied trial whose goodput was bracketed.
2. **Measured again**, where the budget leaves the time after what the edge search and
   the confirmations need (``deadline_s``): the best and the rival, each launched once
   more on one new draw of the workload (the same draw for both: their difference is
   the settings', not the arrivals'), from the rate each held, up to ``AGAIN_LEVELS``
   rates. Each one's capacity interval is then pooled over its trial's levels and these
   (``capacity_interval``), per GPU where the tensor-parallel size is searched (as the
   trials are ranked).
3. **The choice**: where the pooled intervals no longer overlap, the one above serves
   more (``TieChoice.SERVES_MORE``). Still tied, or not measured again: the one that
   keeps the model's numerics where the other changes them (``MODEL_NUMERICS``), else
   the one that pins no host memory where the other does (``NO_HOST_MEMORY``), else the
   one whose capacity was bracketed where the other's is a lower bound (``BRACKETED``:
   a capacity review acts on a rate with both ends, and its confirmation pools the
   trial's levels, where a bound's measures a bracket of its own: the 10-minute tune
   whose last trial, cut to one level by the search's deadline, became the best at
   "at least 8.11" over 7.62 [7.66, 8.36] had no time left for the OOM edge), else the
   best as before (``HIGHEST_GOODPUT``).

    <run>/ties/<nnn>/   trial nnn's settings measured again (evaluation.json, levels)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from tuner.run.budget import LaunchKind
from tuner.run.evaluation import Evaluation, Verdict
from tuner.run.goodput import GoodputBound
from tuner.run.layout import RunLayout
from tuner.run.ties import TieBreak, TieChoice, TiedTrial, TieOutcome
from tuner.search.budget import TimeBudget
from tuner.search.capacity_interval import capacity_interval
from tuner.search.context import StudySetup, TuneContext
from tuner.search.evaluate import evaluate
from tuner.search.optuna_store import FrozenTrial, Study
from tuner.search.study import arrival_goodput, capacity_of, load_evaluation, ties_with_best
from tuner.serving.processes import ChildRegistry
from tuner.vllm.numerics import changes_numerics
from tuner.vllm.space import TrialParams

log = logging.getLogger(__name__)

AGAIN_LEVELS = 3  # rates each tied setting is measured at again, at most
# The new draw of the workload both are measured on: the study's seed plus this
TIE_SEED_OFFSET = 104_729

Progress = Callable[[str], None]


def rival_of(best: FrozenTrial, ties: list[FrozenTrial]) -> FrozenTrial | None:
    """The tied trial the best is compared with (module docstring, step 1)."""
    if not ties:
        return None
    best_ev = load_evaluation(best)
    ranked = sorted(ties, key=arrival_goodput, reverse=True)
    for costlier in (changes_numerics, _offloads_kv):
        if best_ev is not None and costlier(best_ev.params):
            for t in ranked:
                ev = load_evaluation(t)
                if ev is not None and not costlier(ev.params):
                    return t
    if _lower_bound(best):
        return next((t for t in ranked if not _lower_bound(t)), ranked[0])
    return ranked[0]


def _lower_bound(trial: FrozenTrial) -> bool:
    """The trial's goodput is only a lower bound: no rate it was measured at broke."""
    return trial.user_attrs.get("goodput_bound") == GoodputBound.LOWER_BOUND.value


def _offloads_kv(params: TrialParams) -> bool:
    return params.offloads_kv


def settle_ties(
    ctx: TuneContext,
    setup: StudySetup,
    study: Study,
    best: FrozenTrial,
    *,
    registry: ChildRegistry,
    progress: Progress,
    budget: TimeBudget | None = None,
    deadline_s: float | None = None,
    level_s: float = 0.0,
) -> tuple[FrozenTrial, TieBreak | None]:
    """The trial to recommend of ``best`` and those tied with it, and the tie-break (None
    where nothing ties). With ``budget``, the two measurements again run only where both
    end before ``deadline_s`` (monotonic), each as a launch and ``AGAIN_LEVELS`` levels
    of ``level_s``; otherwise the choice is made on the trials as measured."""
    ties = ties_with_best(study, best)
    rival = rival_of(best, ties)
    if rival is None:
        return best, None
    pair = [best, rival]
    evaluations = [load_evaluation(t) for t in pair]
    if evaluations[0] is None or evaluations[1] is None:
        return best, None
    evs: list[Evaluation] = [e for e in evaluations if e is not None]
    progress(
        f"ties        trial(s) {', '.join(str(t.number) for t in ties)} within the noise of "
        f"trial {best.number}; comparing trial {best.number} with trial {rival.number}"
    )
    again: list[Evaluation | None] = [None, None]
    reason = ""
    need_s = 0.0
    if budget is not None:
        need_s = 2 * (budget.launch_estimate_s() + AGAIN_LEVELS * level_s)
        skip = budget.fits(
            LaunchKind.TIE_BREAK, f"trials {best.number} and {rival.number} again", need_s,
            deadline_s=deadline_s, note="the edge search and the confirmations come first",
        )  # fmt: skip
        if skip is not None:
            reason = skip.reason
    if not reason:
        again = _measure_again(ctx, setup, pair, evs, registry=registry, budget=budget,
                               deadline_s=deadline_s)  # fmt: skip
        if any(a is None or a.verdict is Verdict.STARTUP_FAILED for a in again):
            reason = "a measurement again did not start"
    compared = [_tied(t, ev, a, pool=not reason) for t, ev, a in zip(pair, evs, again, strict=True)]
    outcome, choice, chosen = decide(compared, measured=not reason)
    tie = TieBreak(
        best=best.number, tied=[t.number for t in ties], unit=evs[0].stated_goodput.unit.label,
        compared=compared, outcome=outcome, chosen=chosen, choice=choice, reason=reason,
    )  # fmt: skip
    progress(f"ties        {tie.text()}")
    return (best if chosen == best.number else rival), tie


def _measure_again(
    ctx: TuneContext,
    setup: StudySetup,
    pair: list[FrozenTrial],
    evs: list[Evaluation],
    *,
    registry: ChildRegistry,
    budget: TimeBudget | None,
    deadline_s: float | None,
) -> list[Evaluation | None]:
    """Both settings measured once more, on one new draw of the workload, each from the
    rate its trial held."""
    drawn = replace(
        ctx, workload=ctx.workload.model_copy(update={"seed": ctx.workload.seed + TIE_SEED_OFFSET})
    )
    out: list[Evaluation | None] = []
    for trial, ev in zip(pair, evs, strict=True):
        out_dir = RunLayout(ctx.run_dir).tie_run_dir(trial.number)
        began = time.monotonic()
        ran = evaluate(
            drawn, setup, ev.params, out_dir=out_dir, registry=registry,
            start_rate_per_s=ev.rate_per_s, max_levels=AGAIN_LEVELS, start_held=True,
        )  # fmt: skip
        if budget is not None:
            budget.record_evaluation(
                LaunchKind.TIE_BREAK, f"trial {trial.number} again", ran, began_s=began,
                deadline_s=deadline_s,
            )  # fmt: skip
        out.append(ran)
    return out


def _tied(trial: FrozenTrial, ev: Evaluation, again: Evaluation | None, *, pool: bool) -> TiedTrial:
    """One of the two compared; ``pool``: both were measured again, so the interval is
    pooled over the trial's levels and those again."""
    pooled = capacity_interval([*ev.levels, *again.levels]) if pool and again is not None else None
    if pooled is not None:  # per GPU, as the trials are ranked where the TP size is searched
        pooled = pooled.per_gpu(int(trial.user_attrs.get("ranked_gpus") or 1))
    return TiedTrial(
        trial=trial.number,
        settings=ev.params.short(),
        changes_numerics=changes_numerics(ev.params),
        offloads_kv=ev.params.offloads_kv,
        lower_bound=_lower_bound(trial),
        goodput_per_s=arrival_goodput(trial),
        interval=capacity_of(trial),
        again_goodput_per_s=again.stated_goodput.arrival_rate_per_s if again is not None else None,
        pooled=pooled,
        dir=again.dir if again is not None else None,
    )


def decide(compared: list[TiedTrial], *, measured: bool) -> tuple[TieOutcome, TieChoice, int]:
    """The outcome, why, and the trial chosen (module docstring, step 3)."""
    best, rival = compared
    outcome = TieOutcome.NOT_MEASURED
    if measured and best.pooled is not None and rival.pooled is not None:
        if best.pooled.overlaps(rival.pooled):
            outcome = TieOutcome.STILL_TIED
        else:
            outcome = TieOutcome.SEPARATED
            above = best if best.pooled.low_per_s > _high(rival) else rival
            return outcome, TieChoice.SERVES_MORE, above.trial
    if best.changes_numerics and not rival.changes_numerics:
        return outcome, TieChoice.MODEL_NUMERICS, rival.trial
    if (
        best.offloads_kv
        and not rival.offloads_kv
        and rival.changes_numerics <= best.changes_numerics
    ):
        return outcome, TieChoice.NO_HOST_MEMORY, rival.trial
    if (
        _open(best)
        and not _open(rival)
        and rival.changes_numerics <= best.changes_numerics
        and rival.offloads_kv <= best.offloads_kv
    ):
        return outcome, TieChoice.BRACKETED, rival.trial
    return outcome, TieChoice.HIGHEST_GOODPUT, best.trial


def _open(t: TiedTrial) -> bool:
    """Its capacity has no upper end: its trial's goodput a lower bound, and where it was
    measured again, no rate of the pooled levels fell far enough either."""
    if t.pooled is not None:
        return t.pooled.high_per_s is None
    return t.lower_bound


def _high(t: TiedTrial) -> float:
    assert t.pooled is not None
    return t.pooled.high_per_s if t.pooled.high_per_s is not None else float("inf")

"""Settings within each other's noise: capacity intervals that overlap are a tie."""

from __future__ import annotations

import time
from typing import cast

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from tuner.run.budget import LaunchKind
from tuner.run.evaluation import Evaluation, Verdict
from tuner.run.goodput import CapacityInterval
from tuner.run.ties import TieBreak, TieChoice, TiedTrial, TieOutcome
from tuner.search.budget import TimeBudget
from tuner.search.context import StudySetup, TuneContext
from tuner.search.study.records import EVALUATION_ATTR, best_trial, ties_with_best
from tuner.search.ties import decide, settle_ties
from tuner.serving.processes import ChildRegistry
from tuner.vllm.space import TrialParams


def test_intervals_overlap_unless_one_ends_below_the_other() -> None:
    a = CapacityInterval(low_per_s=8.0, high_per_s=10.0)
    assert a.overlaps(CapacityInterval(low_per_s=9.5, high_per_s=12.0))
    assert a.overlaps(CapacityInterval(low_per_s=10.0, high_per_s=None))  # touching
    assert not a.overlaps(CapacityInterval(low_per_s=10.5, high_per_s=12.0))
    assert not a.overlaps(CapacityInterval(low_per_s=5.0, high_per_s=7.9))
    # no upper end: open upwards, so anything above its low end overlaps it
    assert CapacityInterval(low_per_s=4.0, high_per_s=None).overlaps(a)
    assert a.per_gpu(2) == CapacityInterval(low_per_s=4.0, high_per_s=5.0)


def _trial(seqs: int, goodput: float, low: float | None, high: float | None, *, tp: int = 1):
    return create_trial(
        params={"max-num-seqs": seqs},
        distributions={"max-num-seqs": IntDistribution(16, 512, log=True)},
        value=goodput,
        user_attrs={
            "verdict": "met", "goodput": goodput * 3, "goodput_arrival_rate_per_s": goodput,
            "throughput": goodput * 900, "ranked_gpus": tp, "goodput_bound": "bracketed",
            "capacity_low_per_s": low, "capacity_high_per_s": high,
        },
        state=TrialState.COMPLETE,
    )  # fmt: skip


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_a_setting_within_the_noise_of_the_best_is_a_tie() -> None:
    study = optuna.create_study(direction="maximize")
    for t in (
        _trial(256, 10.0, 10.2, 11.5),  # the best
        _trial(128, 9.6, 9.7, 10.6),  # its interval reaches into the best's: a tie
        _trial(64, 7.0, 7.1, 8.0),  # wholly below: the best is measurably better
        _trial(32, 9.0, None, None),  # recorded before intervals: not judged
        _trial(512, 20.0, 19.6, 21.6, tp=2),  # per GPU [9.8, 10.8]: a tie
    ):
        study.add_trial(t)
    best = best_trial(study)
    assert best is not None and best.number == 0
    assert [t.number for t in ties_with_best(study, best)] == [1, 4]
    assert ties_with_best(study, None) == []


# -- the tie-break: which of the tied settings is recommended ------------------------------------


def _gated_trial(goodput: float, low: float, high: float, *, kv: str) -> FrozenTrial:
    """A feasible trial whose evaluation is in the study (KV cache dtype ``kv``)."""
    params = TrialParams(max_num_seqs=64, kv_cache_dtype=kv)
    ev = Evaluation(dir="/nonexistent", params=params, flags={}, verdict=Verdict.MET, outcome=None)
    return create_trial(
        params={"max-num-seqs": 64},
        distributions={"max-num-seqs": IntDistribution(16, 512, log=True)},
        value=goodput,
        user_attrs={
            "verdict": "met", "goodput": goodput, "goodput_arrival_rate_per_s": goodput,
            "throughput": goodput * 300, "goodput_bound": "bracketed",
            "capacity_low_per_s": low, "capacity_high_per_s": high,
            EVALUATION_ATTR: ev.model_dump(mode="json"),
        },
        state=TrialState.COMPLETE,
    )  # fmt: skip


def _settle(study: optuna.Study) -> tuple[int, TieBreak | None, TimeBudget]:
    """The tie-break with no time left to measure again (nothing is launched)."""
    best = best_trial(study)
    assert best is not None
    budget = TimeBudget(began_s=time.monotonic(), budget_s=1.0, launch_prior_s=60.0)
    lines: list[str] = []
    chosen, tie = settle_ties(
        cast(TuneContext, None), StudySetup(), study, best,
        registry=cast(ChildRegistry, None), progress=lines.append, budget=budget, level_s=10.0,
    )  # fmt: skip
    return chosen.number, tie, budget


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_fp8_within_the_noise_of_the_models_own_dtype_is_not_recommended() -> None:
    """The best changes numerics and a trial keeping them ties with it: the one keeping
    them is recommended, said why; with no time to measure the two again, said so."""
    study = optuna.create_study(direction="maximize")
    study.add_trial(_gated_trial(6.0, 5.6, 6.5, kv="auto"))  # 0: keeps the numerics
    study.add_trial(_gated_trial(6.3, 5.9, 6.8, kv="fp8"))  # 1: the best, a tie with 0
    study.add_trial(_gated_trial(6.2, 5.8, 6.7, kv="fp8"))  # 2: a tie, but changes them too
    chosen, tie, budget = _settle(study)
    assert chosen == 0 and tie is not None
    assert (tie.best, tie.tied, tie.outcome) == (1, [0, 2], TieOutcome.NOT_MEASURED)
    assert tie.choice is TieChoice.MODEL_NUMERICS
    assert [t.trial for t in tie.compared] == [1, 0]  # the rival: the one keeping them
    assert [s.kind for s in budget.skipped] == [LaunchKind.TIE_BREAK]
    assert tie.text().startswith("trials 1 and 0 tie within the noise; not measured again: ")
    assert tie.text().endswith(
        "recommended trial 0: it keeps the model's own numerics at no measurable loss"
    )


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_a_tie_of_like_numerics_keeps_the_best_and_no_tie_decides_nothing() -> None:
    study = optuna.create_study(direction="maximize")
    study.add_trial(_gated_trial(6.0, 5.6, 6.5, kv="auto"))
    study.add_trial(_gated_trial(6.3, 5.9, 6.8, kv="auto"))  # the best
    chosen, tie, _ = _settle(study)
    assert chosen == 1 and tie is not None and tie.choice is TieChoice.HIGHEST_GOODPUT
    apart = optuna.create_study(direction="maximize")
    apart.add_trial(_gated_trial(6.0, 5.6, 6.1, kv="auto"))
    apart.add_trial(_gated_trial(7.3, 6.9, 7.8, kv="fp8"))  # measurably better: no tie
    chosen, tie, budget = _settle(apart)
    assert chosen == 1 and tie is None and budget.skipped == []


@pytest.mark.parametrize(
    ("best", "rival", "outcome", "choice", "chosen"),
    [
        # measured again, apart: the one above serves more, whatever its numerics
        ((7.0, 7.6), (6.0, 6.8), TieOutcome.SEPARATED, TieChoice.SERVES_MORE, 1),
        ((6.0, 6.8), (7.0, 7.6), TieOutcome.SEPARATED, TieChoice.SERVES_MORE, 2),
        # still within each other's noise: the numerics decide
        ((6.4, 7.2), (6.0, 6.8), TieOutcome.STILL_TIED, TieChoice.MODEL_NUMERICS, 2),
    ],
)
def test_measured_again_the_pooled_intervals_decide(
    best: tuple[float, float],
    rival: tuple[float, float],
    outcome: TieOutcome,
    choice: TieChoice,
    chosen: int,
) -> None:
    def tied(trial: int, pooled: tuple[float, float], *, fp8: bool) -> TiedTrial:
        low, high = pooled
        return TiedTrial(
            trial=trial, settings="", changes_numerics=fp8, goodput_per_s=low,
            interval=None, pooled=CapacityInterval(low_per_s=low, high_per_s=high),
        )  # fmt: skip

    compared = [tied(1, best, fp8=True), tied(2, rival, fp8=False)]
    assert decide(compared, measured=True) == (outcome, choice, chosen)
    # not measured again: the pooled intervals are not there to decide
    assert decide(compared, measured=False)[:2] == (
        TieOutcome.NOT_MEASURED,
        TieChoice.MODEL_NUMERICS,
    )


def _offloading_trial(goodput: float, low: float, high: float, *, gib: float) -> FrozenTrial:
    """A feasible trial that keeps ``gib`` of KV in host memory (0: none)."""
    trial = _gated_trial(goodput, low, high, kv="auto")
    params = TrialParams(max_num_seqs=64, kv_offloading_size_gib=gib or None)
    ev = Evaluation(dir="/nonexistent", params=params, flags={}, verdict=Verdict.MET, outcome=None)
    trial.set_user_attr(EVALUATION_ATTR, ev.model_dump(mode="json"))
    return trial


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_offloading_within_the_noise_of_no_offloading_is_not_recommended() -> None:
    """A CPU tier of 64 GiB that wins within the noise is not worth pinning 64 GiB on every
    node: the tied setting without it is the rival, and recommended while still tied."""
    study = optuna.create_study(direction="maximize")
    study.add_trial(_offloading_trial(6.0, 5.6, 6.5, gib=0))  # 0: no host memory
    study.add_trial(_offloading_trial(6.4, 6.0, 6.9, gib=64))  # 1: the best, a tie with 0
    study.add_trial(_offloading_trial(6.3, 5.9, 6.8, gib=16))  # 2: a tie, offloads too
    chosen, tie, _ = _settle(study)
    assert chosen == 0 and tie is not None
    assert [t.trial for t in tie.compared] == [1, 0] and tie.compared[0].offloads_kv
    assert tie.choice is TieChoice.NO_HOST_MEMORY
    assert tie.text().endswith("it pins no host memory for KV offloading, at no measurable loss")
    # measured again and apart, the one above is recommended, offloading or not
    best, rival = tie.compared
    apart = [
        best.model_copy(update={"pooled": CapacityInterval(low_per_s=7.0, high_per_s=7.5)}),
        rival.model_copy(update={"pooled": CapacityInterval(low_per_s=6.0, high_per_s=6.5)}),
    ]
    assert decide(apart, measured=True) == (TieOutcome.SEPARATED, TieChoice.SERVES_MORE, 1)


def _bounded_trial(goodput: float, low: float, high: float | None) -> FrozenTrial:
    """A feasible fp8 trial; ``high`` None: no rate it was measured at broke (a lower bound)."""
    trial = _gated_trial(goodput, low, high or 0.0, kv="fp8")
    trial.set_user_attr("capacity_high_per_s", high)
    trial.set_user_attr("goodput_bound", "bracketed" if high is not None else "lower_bound")
    return trial


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_a_lower_bound_within_the_noise_of_a_bracketed_capacity_is_not_recommended() -> None:
    """The 10-minute tune's last trial, cut to one level by the search's deadline, held
    8.11 and nothing above it broke: "at least 8.11", the best, within the noise of 7.62
    [7.66, 8.36]. Not measured again, the bracketed one is recommended: a capacity review
    acts on a rate with both ends (and its confirmation pools its trial's levels)."""
    study = optuna.create_study(direction="maximize")
    study.add_trial(_bounded_trial(5.69, 5.71, 6.00))  # 0: below both, no tie
    study.add_trial(_bounded_trial(7.62, 7.66, 8.36))  # 1: bracketed
    study.add_trial(_bounded_trial(5.74, 5.75, 6.01))  # 2
    study.add_trial(_bounded_trial(8.11, 8.11, None))  # 3: the best, a lower bound
    chosen, tie, _ = _settle(study)
    assert tie is not None and (tie.best, tie.tied) == (3, [1])
    assert chosen == 1 and tie.choice is TieChoice.BRACKETED
    assert [t.lower_bound for t in tie.compared] == [True, False]
    assert "recommended trial 1: its capacity was bracketed" in tie.text()
    # two lower bounds, or two brackets: the highest goodput, as before
    both = optuna.create_study(direction="maximize")
    both.add_trial(_bounded_trial(7.9, 7.9, None))
    both.add_trial(_bounded_trial(8.11, 8.11, None))
    chosen, tie, _ = _settle(both)
    assert chosen == 1 and tie is not None and tie.choice is TieChoice.HIGHEST_GOODPUT
    # measured again, a pooled interval with an upper end is no longer a bound
    best, rival = (
        TiedTrial(trial=n, settings="", changes_numerics=True, goodput_per_s=g, interval=None,
                  lower_bound=n == 3, pooled=CapacityInterval(low_per_s=lo, high_per_s=hi))
        for n, g, lo, hi in ((3, 8.11, 7.9, 8.6), (1, 7.62, 7.7, 8.3))
    )  # fmt: skip
    assert decide([best, rival], measured=True)[1:] == (TieChoice.HIGHEST_GOODPUT, 3)
    still_open = best.model_copy(
        update={"pooled": CapacityInterval(low_per_s=7.9, high_per_s=None)}
    )
    assert decide([still_open, rival], measured=True)[1:] == (TieChoice.BRACKETED, 1)

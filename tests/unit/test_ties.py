"""Settings within each other's noise: capacity intervals that overlap are a tie."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from tuner.run.goodput import CapacityInterval
from tuner.search.study.records import best_trial, ties_with_best


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

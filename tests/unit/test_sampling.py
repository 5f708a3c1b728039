"""The tuner's samplers do not spend trials on settings already tried: neither when a study
is resumed with the same seed (a new process replays the sampler's draws) nor when the
space is small enough for TPE to propose a point it measured."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner.run.config import Objective
from tuner.search.sampling import make_sampler

DEFAULTS = {"gpu-memory-utilization": 0.92, "max-num-seqs": 8, "block-size": 16}


def _objective(trial: Any) -> Any:
    util = trial.suggest_float("gpu-memory-utilization", 0.85, 0.97, step=0.01)
    seqs = trial.suggest_int("max-num-seqs", 4, 32)
    block = trial.suggest_categorical("block-size", [16, 32])
    trial.set_constraint("slo", 0.0 if seqs < 28 else 1.0)
    if len(trial.study.directions) == 2:
        return util * seqs, float(block)
    return util * seqs


def _key(params: dict[str, Any]) -> tuple[Any, ...]:
    return (
        round(params["gpu-memory-utilization"] * 100),
        params["max-num-seqs"],
        params["block-size"],
    )


@pytest.mark.parametrize("objective", [Objective.GOODPUT, Objective.PARETO])
def test_a_resumed_study_with_the_same_seed_draws_new_settings(
    tmp_path: Path, objective: Objective
) -> None:
    """What `tuner tune --resume` does: a new sampler with the same --seed (here without the
    seed mixing of tuner.search.study.opening.sampler_seed, which alone does not prevent repeats)."""
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(
        study_name="s", storage=url, directions=objective.directions,
        sampler=make_sampler(objective, seed=7, n_trials=12),
    )  # fmt: skip
    study.enqueue_trial(DEFAULTS)
    study.optimize(_objective, n_trials=2)  # the defaults and one random draw
    for _ in range(5):  # five resumes of two trials each
        resumed = optuna.create_study(
            study_name="s", storage=url, directions=objective.directions,
            sampler=make_sampler(objective, seed=7, n_trials=12), load_if_exists=True,
        )  # fmt: skip
        resumed.optimize(_objective, n_trials=2)
    keys = [_key(t.params) for t in resumed.trials]
    assert len(keys) == 12
    assert len(set(keys)) == len(keys), f"repeated settings: {keys}"


def test_a_nearly_exhausted_space_still_runs() -> None:
    """With every point tried, the sampler settles for a repeat instead of looping."""
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        direction="maximize", sampler=make_sampler(Objective.GOODPUT, seed=1, n_trials=6)
    )

    def tiny(trial: Any) -> float:
        return float(trial.suggest_categorical("block-size", [16, 32]))

    study.optimize(tiny, n_trials=6)
    values = [t.params["block-size"] for t in study.trials]
    assert set(values[:2]) == {16, 32}  # both points before any repeat
    assert len(values) == 6

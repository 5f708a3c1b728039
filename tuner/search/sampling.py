"""How the tuning loop picks the next settings: Optuna samplers, objectives and constraints.

The objective itself (``Objective``) is a setting of the run: ``tuner.run.config``.

Every trial is COMPLETE with its values and Optuna constraints (``Trial.set_constraint``;
each > 0: violated): ``starts`` (the server came up), ``survives`` (the engine did
not die under load) and ``slo`` (the SLOs held at some measured rate). A trial that
failed to start, died, or broke the SLO at every rate has value 0 and a positive
constraint, so the sampler learns where the infeasible region is instead of the
study crashing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.run.config import Objective

if TYPE_CHECKING:
    from tuner.search.distinct_sampler import DistinctSampler
    from tuner.search.optuna_store import FrozenTrial

CONSTRAINTS = ("starts", "survives", "slo")


def is_feasible(frozen_trial: FrozenTrial) -> bool:
    constraints: dict[str, float] = frozen_trial.constraints
    return bool(constraints) and all(v <= 0 for v in constraints.values())


def make_sampler(objective: Objective, *, seed: int | None, n_trials: int) -> DistinctSampler:
    """TPE with constraints for one objective, NSGA-II for the Pareto front, each drawing
    only settings no trial of the study has (``DistinctSampler``).

    The first third of the trials (at least 3, at most 8) are random, so the model
    of the landscape starts from a spread of points; vLLM's defaults are enqueued
    before them by the study.
    """
    # Imported here, not above: these import Optuna, which a reader of the constraints
    # (``is_feasible``) does not need.
    from tuner.search.distinct_sampler import DistinctSampler
    from tuner.search.optuna_store import nsga2_sampler, tpe_sampler

    startup = max(3, min(8, n_trials // 3))
    if objective is Objective.PARETO:
        return DistinctSampler(nsga2_sampler(seed=seed, population_size=max(4, startup)))
    return DistinctSampler(tpe_sampler(seed=seed, n_startup_trials=startup))

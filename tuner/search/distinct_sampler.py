"""A sampler that does not spend a trial on settings the study has already tried.

A seeded sampler replays its draws when a study is resumed (a new process, the same
seed, the same first random draws) or shared by workers seeded alike, and TPE in a small
discrete space often proposes a point it has measured: each such trial spends one of a
short budget's launches to learn nothing. ``DistinctSampler`` wraps the study's sampler
(TPE, NSGA-II), draws each trial's settings at once and draws again while they repeat a
trial's. ``tuner.search.study.opening.sampler_seed`` also seeds a resumed sampler apart from the run
before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution
from optuna.samplers import BaseSampler
from optuna.search_space import IntersectionSearchSpace
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

MAX_DRAWS = 32  # draws before settling for settings already tried (a nearly exhausted space)

Point = tuple[tuple[str, Any], ...]


def point(params: dict[str, Any], space: dict[str, BaseDistribution]) -> Point | None:
    """Settings as the search space tells them apart (a stepped float by its step, so 0.92
    and 0.9199999999999999 are one point); None when ``params`` lacks a knob of ``space``."""
    out: list[tuple[str, Any]] = []
    for name, dist in sorted(space.items()):
        if name not in params:
            return None
        value = params[name]
        if isinstance(dist, FloatDistribution):
            x = float(value)
            key: Any = round((x - dist.low) / dist.step) if dist.step else float(f"{x:.12g}")
        elif isinstance(dist, IntDistribution):
            key = int(value)
        else:
            key = dist.to_internal_repr(value)
        out.append((name, key))
    return tuple(out)


def _on_step(value: Any, dist: BaseDistribution) -> Any:
    """A stepped float as its step writes it (0.87, not 0.8700000000000001), so the study,
    the report and the recommended command lines show the value the grid means."""
    if isinstance(dist, FloatDistribution) and dist.step:
        from tuner.vllm.space import on_step

        return on_step(float(value), dist.step)
    return value


class DistinctSampler(BaseSampler):
    """``base``, never suggesting settings a trial of the study has (complete, running on
    another worker, or failed and retried) while the space has others.

    Every knob of a trial is drawn in ``sample_relative``: the base sampler's joint draw
    (TPE's multivariate model, NSGA-II's crossover), the knobs it leaves to independent
    sampling (random while TPE starts up, NSGA-II's mutations) from its own independent
    draw; drawn again while the point repeats a trial's. Enqueued trials (vLLM's defaults,
    retries) keep their fixed settings: Optuna does not sample those.
    """

    def __init__(self, base: BaseSampler, *, max_draws: int = MAX_DRAWS) -> None:
        self.base = base
        self.max_draws = max_draws
        self._space = IntersectionSearchSpace()

    def __str__(self) -> str:
        return f"DistinctSampler({self.base})"

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return dict(self._space.calculate(study))

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        space = {n: d for n, d in search_space.items() if not d.single()}
        if not space:
            return {}
        tried = {
            point(t.params, space)
            for t in study.get_trials(deepcopy=False)
            if t.number != trial.number
        }
        params: dict[str, Any] = {}
        for _ in range(self.max_draws):
            drawn = self.base.sample_relative(
                study, trial, self.base.infer_relative_search_space(study, trial)
            )
            params = {n: v for n, v in drawn.items() if n in space}
            for name, dist in space.items():
                if name not in params:
                    params[name] = self.base.sample_independent(study, trial, name, dist)
            params = {n: _on_step(v, space[n]) for n, v in params.items()}
            if point(params, space) not in tried:
                break
        return params

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        value = self.base.sample_independent(study, trial, param_name, param_distribution)
        return _on_step(value, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()

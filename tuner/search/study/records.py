"""What a study records of each trial and reads back: the evaluation in user attributes
(``record``, ``load_evaluation``), the objective's values, the best and the default
trial, and the study's finalized mark that workers wait on.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

from tuner.run.config import Objective
from tuner.run.evaluation import Evaluation, Verdict
from tuner.run.goodput import CapacityInterval
from tuner.run.layout import evaluation_json
from tuner.search import optuna_store
from tuner.search.optuna_store import (
    FrozenTrial,
    Study,
    Trial,
    TrialState,
)
from tuner.vllm.space import per_gpu

OTHERS_POLL_S = 2.0  # how often a worker waiting for other workers' trials looks again

FINALIZED_ATTR = "finalized"  # study attribute set once the finalize is written

EVALUATION_ATTR = "evaluation"  # trial attribute: the Evaluation, for workers on other hosts


class TrialRole(StrEnum):
    """Why a trial is in the study (its ``role`` user attribute)."""

    DEFAULT = "vllm-default"  # vLLM's own defaults, enqueued before any other trial
    SEARCH = "search"  # drawn by the sampler
    TWIN = "twin-pick"  # the twin's most promising untried setting (tuner.twin.screen)


Progress = Callable[[str], None]


def mark_finalized(study: Study, run_dir: Path) -> None:
    """Tell the other workers the edge search, recommendation and report are written."""
    study.set_user_attr(
        FINALIZED_ATTR, {"host": socket.gethostname(), "run_dir": str(run_dir), "at": time.time()}
    )


def wait_finalized(study: Study, *, deadline_s: float, progress: Progress) -> bool:
    """Wait (until ``deadline_s``, monotonic) for the worker that claimed the finalize."""
    while FINALIZED_ATTR not in study.user_attrs:
        if time.monotonic() > deadline_s:
            progress("the finalizing worker did not finish in time; reporting what is here")
            return False
        time.sleep(OTHERS_POLL_S)
    where = study.user_attrs[FINALIZED_ATTR]
    progress(f"finalized by the worker on {where.get('host')} in {where.get('run_dir')}")
    return True


def objective_values(objective: Objective, ev: Evaluation) -> float | tuple[float, float]:
    """The trial's value(s) for the sampler, per GPU where the tensor-parallel size is
    searched (``per_gpu``)."""
    if objective is Objective.GOODPUT:  # in the workload's unit: the rate the search set
        return (
            per_gpu(ev.stated_goodput.arrival_rate_per_s, ev.params) if ev.verdict.feasible else 0.0
        )
    throughput = per_gpu(ev.output_tokens_per_s, ev.params) if ev.verdict.feasible else 0.0
    if objective is Objective.THROUGHPUT:
        return throughput
    p99 = ev.p99_ttft_ms if ev.verdict.feasible and ev.p99_ttft_ms is not None else 1e9
    return (throughput, p99)


def record(trial: Trial, ev: Evaluation, *, role: str) -> None:
    """User attributes (what the report and other workers read) and constraints."""
    starts = ev.verdict not in (Verdict.SCREENED, Verdict.STARTUP_FAILED)
    trial.set_constraint("starts", 0.0 if starts else 1.0)
    trial.set_constraint("survives", 1.0 if ev.verdict is Verdict.DIED else 0.0)
    trial.set_constraint("slo", 0.0 if ev.verdict.feasible else 1.0)
    best = ev.best.load if ev.best else None
    attrs: dict[str, Any] = {
        "role": role,
        "verdict": ev.verdict.value,
        "outcome": ev.outcome.value if ev.outcome else None,
        "dir": ev.dir,
        "flags": ev.flags,
        "goodput": ev.goodput_requests_per_s,
        "goodput_bound": ev.goodput_bound.value,
        "throughput": ev.output_tokens_per_s,
        # the goodput in the workload's own unit (conversations/s where it has sessions):
        # what the sampler and best_trial compare (a window's requests per conversation
        # vary with its few hundred requests; the conversations/s is the rate it was sent
        # at); "goodput" above stays requests/s
        "goodput_unit": ev.stated_goodput.unit.value,
        "goodput_arrival_rate_per_s": ev.stated_goodput.arrival_rate_per_s,
        "rate_per_s": ev.rate_per_s,
        # GPUs one server of the trial takes where the tensor-parallel size is searched
        # (1 where not): best_trial ranks the goodput per GPU
        "ranked_gpus": ev.params.gpus,
        "failure_kind": ev.failure.kind.value if ev.failure else None,
        "failure_message": ev.failure.message[:300] if ev.failure else None,
        "p99_ttft_ms": best.ttft_ms.p99 if best else None,
        "p99_itl_ms": best.itl_ms.p99 if best else None,
        "p99_e2e_ms": best.e2e_ms.p99 if best else None,
        "peak_used_bytes": ev.gpu.peak_used_bytes if ev.gpu else None,
        "total_bytes": ev.gpu.total_bytes if ev.gpu else None,
        "kv_cache_tokens": ev.startup.kv_cache_tokens if ev.startup else None,
        "levels": len(ev.levels),
        # the capacity interval in the workload's unit (tuner.search.capacity_interval):
        # what decides whether two trials tie within their noise (ties_with_best)
        "capacity_low_per_s": ev.capacity_interval.low_per_s if ev.capacity_interval else None,
        "capacity_high_per_s": ev.capacity_interval.high_per_s if ev.capacity_interval else None,
    }
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    # The whole evaluation too (~20 kB): a worker on another host finalizing the study
    # reads it from the storage when this run directory is not on its filesystem.
    trial.set_user_attr(EVALUATION_ATTR, ev.model_dump(mode="json"))


def arrival_goodput(trial: FrozenTrial) -> float:
    """The trial's goodput in the workload's unit as recorded (requests/s in a trial
    recorded before that unit was)."""
    attrs = trial.user_attrs
    return float(attrs.get("goodput_arrival_rate_per_s", attrs.get("goodput")) or 0.0)


def best_trial(
    study: Study,
    also: Sequence[FrozenTrial] = (),
    *,
    where: Callable[[FrozenTrial], bool] | None = None,
) -> FrozenTrial | None:
    """The feasible trial with the highest goodput in the workload's unit, per GPU where
    the tensor-parallel size is searched (ties: the higher throughput); among the complete
    ones and ``also`` (a trial recorded but not yet told); with ``where``, among those it
    accepts (the quality gate's fallback: the trials that keep the model's numerics)."""
    feasible = [
        t
        for t in [*optuna_store.trials_in(study, TrialState.COMPLETE), *also]
        if t.user_attrs.get("verdict") == Verdict.MET.value and (where is None or where(t))
    ]
    if not feasible:
        return None

    def key(t: FrozenTrial) -> tuple[float, float]:
        attrs = t.user_attrs
        gpus = attrs.get("ranked_gpus") or 1
        return (arrival_goodput(t) / gpus, attrs["throughput"] / gpus)

    return max(feasible, key=key)


def capacity_of(trial: FrozenTrial) -> CapacityInterval | None:
    """The trial's capacity interval as recorded, per GPU where the tensor-parallel size
    is searched (None: recorded before intervals were, or no rate measured)."""
    attrs = trial.user_attrs
    low = attrs.get("capacity_low_per_s")
    if low is None:
        return None
    high = attrs.get("capacity_high_per_s")
    interval = CapacityInterval(
        low_per_s=float(low), high_per_s=float(high) if high is not None else None
    )
    return interval.per_gpu(int(attrs.get("ranked_gpus") or 1))


def ties_with_best(
    study: Study, best: FrozenTrial | None, also: Sequence[FrozenTrial] = ()
) -> list[FrozenTrial]:
    """The feasible trials other than ``best`` whose capacity intervals overlap the best's
    (``CapacityInterval.overlaps``): within the measurement's noise of it, a tie. The best
    stays the one with the highest goodput; a tie says the measurement cannot rank the
    two. Trials without an interval are not judged."""
    best_interval = capacity_of(best) if best is not None else None
    if best is None or best_interval is None:
        return []
    ties: list[FrozenTrial] = []
    seen: set[int] = {best.number}
    for t in [*optuna_store.trials_in(study, TrialState.COMPLETE), *also]:
        if t.number in seen or t.user_attrs.get("verdict") != Verdict.MET.value:
            continue
        seen.add(t.number)
        interval = capacity_of(t)
        if interval is not None and interval.overlaps(best_interval):
            ties.append(t)
    return ties


def default_trial(study: Study) -> FrozenTrial | None:
    for t in optuna_store.trials_in(study, TrialState.COMPLETE):
        if t.user_attrs.get("role") == TrialRole.DEFAULT:
            return t
    return None


def load_evaluation(trial: FrozenTrial) -> Evaluation | None:
    """The trial's evaluation.json, else (run by a worker on another host) its copy in the
    study."""
    path = evaluation_json(str(trial.user_attrs.get("dir", "")))
    try:
        return Evaluation.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    try:
        return Evaluation.model_validate(trial.user_attrs[EVALUATION_ATTR])
    except (KeyError, ValueError):
        return None

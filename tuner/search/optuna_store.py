"""The tuner's one boundary with Optuna: its storage, studies, trials, samplers and logs.

A module of its own rather than a part of ``tuner.search.study``: that module is the
tuner's (the trial loop, the workers' claims, the settings a study is held to, the
storage URL without its secrets), this one is Optuna's API as the tuner uses it, each
use behind a function typed with Optuna's own classes (no ``Any``), so that a change in
Optuna is met in one file. Public API only: the study module keeps the ``RDBStorage`` it
opened (``OpenStudy.storage``) rather than reaching into ``Study._storage``, and a trial's
storage id, which ``FrozenTrial`` keeps private, is looked up by study and number
(``_trial_id``). The methods of what these functions return (``Study.optimize``,
``Study.set_user_attr``, ``Trial.set_constraint``, ``RDBStorage.engine``...) are called
where they are used, typed by Optuna's own annotations.

Importing this module imports Optuna (0.4 s): the tuning job imports it at its top;
``tuner.search.sampling``, which every command imports through the configuration, only
when it builds a sampler. The tuner's own sampler (``tuner.search.distinct_sampler``)
implements Optuna's ``BaseSampler`` interface and imports Optuna itself.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import Literal

import optuna
from optuna.exceptions import ExperimentalWarning, StorageInternalError
from optuna.samplers import BaseSampler, NSGAIISampler, TPESampler
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback, fail_stale_trials
from optuna.study import Study
from optuna.trial import FrozenTrial, Trial, TrialState

__all__ = [
    "BaseSampler",
    "Direction",
    "FrozenTrial",
    "RDBStorage",
    "StorageInternalError",
    "Study",
    "Trial",
    "TrialState",
    "all_study_names",
    "create_or_load_study",
    "fail_running",
    "fail_stale",
    "load_study",
    "nsga2_sampler",
    "quiet_logs",
    "rdb_storage",
    "route_logs",
    "tpe_sampler",
    "trial_counts",
    "trials_in",
]

Direction = Literal["maximize", "minimize"]


# --- logs --------------------------------------------------------------------------------


def quiet_logs() -> None:
    """Optuna's own records from warnings up only (not a line per trial)."""
    optuna.logging.set_verbosity(logging.WARNING)


def route_logs() -> None:
    """Optuna's records go where the tuner's go (through the root logger's handlers), not
    to a handler of its own printing tracebacks on the terminal."""
    optuna.logging.disable_default_handler()
    optuna.logging.enable_propagation()


# --- the storage ---------------------------------------------------------------------------


def rdb_storage(
    url: str,
    *,
    heartbeat_interval_s: int,
    grace_period_s: int,
    max_retry: int,
    sqlite_timeout_s: float | None = None,
) -> RDBStorage:
    """An RDB storage with heartbeats: a trial whose worker stops sending them for
    ``grace_period_s`` is failed and retried (up to ``max_retry`` times) with the same
    settings. ``sqlite_timeout_s``: how long SQLite waits for another writer's lock.

    Raises Optuna's and SQLAlchemy's own errors (the caller states them for the user)."""
    engine_kwargs = (
        {"connect_args": {"timeout": sqlite_timeout_s}} if sqlite_timeout_s is not None else None
    )
    with warnings.catch_warnings():  # heartbeats are stable in use, flagged experimental
        warnings.simplefilter("ignore", ExperimentalWarning)
        return RDBStorage(
            url,
            engine_kwargs=engine_kwargs,
            heartbeat_interval=heartbeat_interval_s,
            grace_period=grace_period_s,
            heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=max_retry),
        )


def all_study_names(storage: RDBStorage | str) -> list[str]:
    """The names of every study in a storage (an opened one or its URL)."""
    return optuna.get_all_study_names(storage=storage)


def trial_counts(storage: RDBStorage) -> dict[str, int]:
    """Each study's name and how many trials it has (of any state)."""
    return {s.study_name: s.n_trials for s in optuna.get_all_study_summaries(storage)}


# --- studies -------------------------------------------------------------------------------


def load_study(storage: RDBStorage, name: str) -> Study:
    """The study ``name`` as it is in the storage now (its attributes read afresh)."""
    return optuna.load_study(study_name=name, storage=storage)


def create_or_load_study(
    storage: RDBStorage, name: str, *, directions: Sequence[Direction], sampler: BaseSampler
) -> Study:
    return optuna.create_study(
        study_name=name,
        storage=storage,
        directions=list(directions),
        sampler=sampler,
        load_if_exists=True,
    )


def trials_in(study: Study, *states: TrialState) -> list[FrozenTrial]:
    """The study's trials in these states (every trial without any), oldest first; not
    copied, so not to be changed."""
    return list(study.get_trials(deepcopy=False, states=states or None))


def fail_stale(study: Study) -> None:
    """Fail the trials of workers whose heartbeat stopped (each is retried by the storage's
    callback); what Optuna does itself before each trial."""
    with warnings.catch_warnings():  # heartbeats are stable in use, flagged experimental
        warnings.simplefilter("ignore", ExperimentalWarning)
        fail_stale_trials(study)


def fail_running(storage: RDBStorage, study: Study, trial: FrozenTrial) -> bool:
    """Set a RUNNING trial FAIL (True once set; Optuna's ``UpdateFinishedTrialError`` when
    it had finished meanwhile). No callback runs: the caller retries it if it wants."""
    return storage.set_trial_state_values(_trial_id(storage, study, trial), state=TrialState.FAIL)


def _trial_id(storage: RDBStorage, study: Study, trial: FrozenTrial) -> int:
    """The storage's id of a trial. ``FrozenTrial`` keeps it in a private ``_trial_id``
    only; the storage's public lookup by study and trial number gives the same id."""
    study_id = storage.get_study_id_from_name(study.study_name)
    return storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)


# --- samplers ------------------------------------------------------------------------------


def tpe_sampler(*, seed: int | None, n_startup_trials: int) -> TPESampler:
    """Multivariate TPE over grouped parameters."""
    with warnings.catch_warnings():  # multivariate TPE is stable in use, flagged experimental
        warnings.simplefilter("ignore", ExperimentalWarning)
        return TPESampler(
            seed=seed,
            n_startup_trials=n_startup_trials,
            multivariate=True,
            group=True,
        )


def nsga2_sampler(*, seed: int | None, population_size: int) -> NSGAIISampler:
    return NSGAIISampler(seed=seed, population_size=population_size)

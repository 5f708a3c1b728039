"""A study opened for a tune: its run directory checked against the study's settings
(``check_run_dir``), the study created or resumed (``open_study``, ``OpenStudy``), the
sampler's seed per worker and resume, and the trials an interrupted worker left
running failed and retried with the same settings.
"""

from __future__ import annotations

import os
import socket
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError, RunFileError
from tuner.run.files import read_document
from tuner.run.layout import RunLayout
from tuner.search import optuna_store
from tuner.search.context import TuneContext
from tuner.search.optuna_store import (
    FrozenTrial,
    RDBStorage,
    Study,
    TrialState,
)
from tuner.search.sampling import make_sampler
from tuner.search.study.claims import Claims, study_names
from tuner.search.study.settings import (
    SETTINGS_ATTR,
    StudySettings,
    legacy_study_settings,
    recorded_settings,
    refuse_other_measurement,
    refuse_other_settings,
)
from tuner.search.study.storage import open_storage, redact_url, storage_url


def _trial_dirs(run_dir: Path) -> list[int]:
    """The trial numbers with evidence in ``run_dir/trials`` (a non-empty directory each)."""
    trials = RunLayout(run_dir).trials_dir
    if not trials.is_dir():
        return []
    found = []
    for path in trials.iterdir():
        if path.is_dir() and path.name.isdigit() and any(path.iterdir()):
            found.append(int(path.name))
    return sorted(found)


def check_run_dir(run_dir: Path, settings: StudySettings) -> None:
    """Refuse a run directory whose ``tune.json`` records another study or other settings,
    before anything is written into it."""
    path = RunLayout(run_dir).tune_json
    if not path.is_file():
        return
    try:
        doc = read_document(path)
    except RunFileError as exc:
        if exc.cause is None:  # JSON, but not an object
            raise ConfigError(
                f"run directory {run_dir}: its tune.json is not a tune run's record"
            ) from None
        raise ConfigError(
            f"run directory {run_dir} holds a tune.json that cannot be read ({exc.cause}), so "
            "which study it belongs to is unknown; accepted: another --run-dir"
        ) from None
    recorded = recorded_settings(doc)
    refuse_other_settings(
        f"run directory {run_dir}", str(recorded.get("study", "?")), recorded, settings.flat()
    )


def open_study(ctx: TuneContext) -> OpenStudy:
    """Create the study, or load it with ``--resume`` (an existing one without it is an error).

    Refused before anything is written: a run directory whose tune.json, study or trial
    evidence belongs to another study, and a study set up with other settings.
    """
    optuna_store.quiet_logs()
    config = ctx.config
    settings = StudySettings.of(ctx)
    check_run_dir(ctx.run_dir, settings)
    url = storage_url(ctx)
    local = config.storage is None
    name = ctx.study_name
    evidence = _trial_dirs(ctx.run_dir)  # listed before the study is read: see below
    if local and evidence and not RunLayout(ctx.run_dir).study_db.is_file():
        raise ConfigError(
            f"run directory {ctx.run_dir} holds trials (trials/{evidence[0]:03d}...) but no "
            "study.db: they belong to a study kept elsewhere or lost; accepted: another "
            "--run-dir, or --storage URL of their study"
        )
    if url.startswith("sqlite"):
        ctx.run_dir.mkdir(parents=True, exist_ok=True)
    storage = open_storage(url)
    existing = optuna_store.trial_counts(storage)
    names = study_names(storage)
    where = f"study.db in {ctx.run_dir}" if local else redact_url(url)
    others = [n for n in names if n != name]
    if local and others:
        raise ConfigError(
            f"run directory {ctx.run_dir} belongs to study {others[0]!r} (its study.db); given "
            f"--study {name!r}; accepted: --study {others[0]} (with --resume) to continue it, "
            "or another --run-dir for a new study"
        )
    n_trials = existing.get(name, 0)
    if name in existing:
        attrs = storage.get_study_user_attrs(storage.get_study_id_from_name(name))
        recorded = (
            StudySettings.model_validate(attrs[SETTINGS_ATTR]).flat()
            if SETTINGS_ATTR in attrs
            else legacy_study_settings(attrs)
        )
        refuse_other_settings(f"study {name!r} in {where}", name, recorded, settings.flat())
        refuse_other_measurement(f"study {name!r} in {where}", attrs, config)
    if n_trials > 0 and not config.resume:
        raise ConfigError(
            f"study {name!r} already has {n_trials} trials in {where}; accepted: --resume to "
            "continue it, or --study NEW for a new one"
        )
    # Trial n writes trials/<n>; a directory there numbered past the study's trials holds
    # another study's evidence, which its next trials would overwrite. (Listed first: a
    # trial is in the storage before its directory is made, so other workers' new trials
    # are counted.)
    foreign = [n for n in evidence if n >= n_trials]
    if foreign:
        raise ConfigError(
            f"run directory {ctx.run_dir} holds trials/{foreign[0]:03d}, which study {name!r} "
            f"in {where} did not write ({n_trials} trial(s)); accepted: another --run-dir"
        )
    study = optuna_store.create_or_load_study(
        storage,
        name,
        directions=config.objective.directions,
        sampler=make_sampler(
            config.objective,
            seed=sampler_seed(config.seed, trials_so_far=n_trials, shared=not local),
            n_trials=config.trials,
        ),
    )
    return OpenStudy(study=study, storage=storage, claims=Claims(storage, name), settings=settings)


@dataclass(frozen=True)
class OpenStudy:
    study: Study
    storage: RDBStorage  # the study's storage, as open_storage opened it
    claims: Claims
    settings: StudySettings


def sampler_seed(seed: int, *, trials_so_far: int, shared: bool) -> int:
    """The sampler's seed: ``--seed`` for a new study of one worker (repeatable), mixed with
    the trials the study already has, so a resumed sampler does not replay the draws of the
    run before it, and with the worker's host and pid in a shared study, so workers seeded
    alike do not suggest the same settings (a shared study is not repeatable anyway)."""
    if trials_so_far == 0 and not shared:
        return seed
    identity = f"{socket.gethostname()}:{os.getpid()}" if shared else ""
    return zlib.crc32(f"{seed}:{trials_so_far}:{identity}".encode())


def fail_interrupted(opened: OpenStudy, *, local: bool) -> int:
    """Trials left RUNNING by a crashed worker: failed (and retried by the storage's callback).

    With a local SQLite study no other worker can be running, so every RUNNING trial
    was cut off; elsewhere only those whose heartbeat stopped.
    """
    study = opened.study
    if not local:
        before = len(optuna_store.trials_in(study, TrialState.FAIL))
        optuna_store.fail_stale(study)
        return len(optuna_store.trials_in(study, TrialState.FAIL)) - before
    failed = 0
    for trial in optuna_store.trials_in(study, TrialState.RUNNING):
        if optuna_store.fail_running(opened.storage, study, trial):
            failed += 1
            retry_trial(study, trial)
    return failed


def retry_trial(study: Study, trial: FrozenTrial) -> None:
    """Enqueue a cut-off trial again with its settings and its role, so that a resumed
    study still measures what it was measuring (vLLM's defaults above all: the baseline
    every recommendation is compared with)."""
    attrs: dict[str, Any] = {"retried_from": trial.number}
    if "role" in trial.user_attrs:
        attrs["role"] = trial.user_attrs["role"]
    # An enqueued trial cut off before its first suggestion has its settings here only.
    params = trial.params or trial.system_attrs.get("fixed_params") or {}
    study.enqueue_trial(params, user_attrs=attrs)

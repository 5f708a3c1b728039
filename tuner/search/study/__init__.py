"""The Optuna study: each trial is one candidate launched, warmed up, loaded and scored.

Storage is SQLite in the run directory unless ``--storage`` gives any SQLAlchemy
URL (PostgreSQL for several workers on one study). Heartbeats mark a trial whose
worker died; such a trial is failed and retried with the same settings, by this
worker or another. The first trial of a new study is vLLM's own defaults, so
every run measures the baseline its recommendation is compared with.

Trials are COMPLETE whatever happened to the server: the verdict, failure class
and evidence go into user attributes and ``trials/<n>/evaluation.json``, and the
constraints (``tuner.search.sampling.CONSTRAINTS``) tell the sampler which were feasible.

Optuna itself is reached through ``tuner.search.optuna_store`` only.

Split by job (as Optuna's ``optuna/study/``): where the study is stored and its URL's
secrets (``storage``), who does a shared study's one-off jobs (``claims``), the settings
a study was set up with (``settings``), opening or resuming it (``opening``), the trial
loop (``trial_loop``, its terminal lines in ``trial_lines``, the twin's predictions for
each trial and its fits to what the trial measured in ``trial_twin``) and what it records of each
trial and reads back (``records``). This package exports what the rest of the tuner
and the reports use.
"""

from tuner.search.study.claims import Duty, study_names
from tuner.search.study.opening import OpenStudy, fail_interrupted, open_study
from tuner.search.study.records import (
    EVALUATION_ATTR,
    TrialRole,
    arrival_goodput,
    best_trial,
    capacity_of,
    default_trial,
    load_evaluation,
    mark_finalized,
    ties_with_best,
    wait_finalized,
)
from tuner.search.study.storage import (
    check_storage_url,
    foreign_message,
    redact_url,
    storage_location,
    storage_url,
)
from tuner.search.study.trial_loop import TrialLoop

__all__ = [
    "EVALUATION_ATTR",
    "Duty",
    "OpenStudy",
    "TrialLoop",
    "TrialRole",
    "arrival_goodput",
    "best_trial",
    "capacity_of",
    "check_storage_url",
    "default_trial",
    "fail_interrupted",
    "foreign_message",
    "load_evaluation",
    "mark_finalized",
    "open_study",
    "redact_url",
    "storage_location",
    "storage_url",
    "study_names",
    "ties_with_best",
    "wait_finalized",
]

"""The study's storage: URLs and driver messages without secrets, the study list, claims,
the settings a run directory's study was set up with."""

from __future__ import annotations

import threading
from pathlib import Path

import optuna
import pytest

from tuner.errors import ConfigError
from tuner.search import optuna_store
from tuner.search.study import (
    Duty,
    OpenStudy,
    TrialRole,
    check_storage_url,
    fail_interrupted,
    foreign_message,
    redact_url,
    storage_location,
    study_names,
)
from tuner.search.study.claims import Claims
from tuner.search.study.opening import sampler_seed
from tuner.search.study.settings import StudySettings, settings_differences
from tuner.search.study.storage import open_storage, redact_text

SECRET = "Zq7-s3cr"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://tuner:s3cret@db:5432/optuna", "postgresql://tuner:***@db:5432/optuna"),
        (
            f"postgresql+psycopg://u@db/x?password={SECRET}",
            "postgresql+psycopg://u@db/x?password=***",
        ),
        (
            f"postgresql://u@db/x?sslmode=require&sslpassword={SECRET}&PASSWD={SECRET}",
            "postgresql://u@db/x?sslmode=require&sslpassword=***&PASSWD=***",
        ),
        ("postgresql://u:ab%40cd%2Fe@db/x", "postgresql://u:***@db/x"),
        ("postgresql://u:ab@cd@db:5432/x", "postgresql://u:***@db:5432/x"),  # a raw '@'
        ("postgresql://user@corp:pw@db/x", "postgresql://user@corp:***@db/x"),  # '@' in the user
        ("postgresql://u:p/w?x@[::1]:5432/x", "postgresql://u:***@[::1]:5432/x"),
        ("postgresql://u@db/x?application_name=a@b", "postgresql://u@db/x?application_name=a@b"),
        ("sqlite:///runs/x/study.db", "sqlite:///runs/x/study.db"),
        ("postgresql://db:5432/x", "postgresql://db:5432/x"),
    ],
)
def test_every_url_form_is_redacted(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_storage_location_drops_the_user_too() -> None:
    assert storage_location(f"postgresql://u:{SECRET}@db:5432/x?password={SECRET}") == (
        "postgresql://db:5432/x?password=***"
    )


def test_a_drivers_message_shows_no_part_of_the_password() -> None:
    url = "postgresql+psycopg://tuner:half@other@db.internal:5432/optuna"
    # what psycopg says when SQLAlchemy sends "other@db.internal" as the host
    message = (
        "(psycopg.OperationalError) [Errno -2] could not translate host name "
        '"other@db.internal" to address\n'
        "(Background on this error at: https://sqlalche.me/e/20/e3q8)"
    )
    text = foreign_message(RuntimeError(message), url)
    assert "half" not in text and "other" not in text
    assert "Background on this error" not in text and "sqlalche.me" not in text
    assert "\n" not in text and '"***@db.internal"' in text
    encoded = f"postgresql://u@db/x?password={SECRET.replace('-', '%2D')}"
    assert SECRET not in redact_text(f"auth failed for {SECRET} at {encoded}", encoded)


def test_a_password_with_a_raw_at_is_refused_before_connecting() -> None:
    with pytest.raises(ConfigError) as err:
        check_storage_url("postgresql://u:ab@cd@127.0.0.1:1/x")
    message = str(err.value)
    assert "%40" in message and "ab@cd" not in message and "cd@" not in message
    check_storage_url("postgresql://u:ab%40cd@127.0.0.1:1/x")  # percent-encoded: accepted
    with pytest.raises(ConfigError, match="not a SQLAlchemy URL"):
        check_storage_url("not a url")


def test_markers_of_older_runs_are_not_studies_and_claims_are_taken_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage = open_storage(url)
    for name in ("a", "a.prepare", "a.finalize", "b", "release.finalize"):
        optuna.create_study(study_name=name, storage=storage)
    # "release.finalize" is a study of its own (there is no study "release")
    assert study_names(storage) == ["a", "b", "release.finalize"]
    assert not Claims(storage, "a").take(Duty.PREPARE)  # an older run's marker holds it
    results: list[bool] = []
    claims = [Claims(open_storage(url), "b") for _ in range(4)]
    threads = [
        threading.Thread(target=lambda c=c: results.append(c.take(Duty.FINALIZE))) for c in claims
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, False, False, True]
    assert Claims(storage, "b").take(Duty.PREPARE)  # another duty, another claim
    assert Claims(storage, "b").holder(Duty.FINALIZE) is not None
    assert study_names(storage) == ["a", "b", "release.finalize"]  # claims add no study


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # ask() here, not optimize()
def test_a_trial_a_local_run_left_running_is_failed_and_enqueued_again(tmp_path: Path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    study = optuna_store.create_or_load_study(
        storage,
        "s",
        directions=["maximize"],
        sampler=optuna_store.tpe_sampler(seed=1, n_startup_trials=3),
    )
    study.enqueue_trial({"x": 3}, user_attrs={"role": TrialRole.DEFAULT.value})
    cut_off = study.ask({"x": optuna.distributions.IntDistribution(1, 8)})  # left RUNNING
    opened = OpenStudy(
        study=study, storage=storage, claims=Claims(storage, "s"),
        settings=StudySettings.model_construct(),
    )  # fmt: skip
    assert fail_interrupted(opened, local=True) == 1
    (failed,) = optuna_store.trials_in(study, optuna_store.TrialState.FAIL)
    assert failed.number == cut_off.number
    (retry,) = optuna_store.trials_in(study, optuna_store.TrialState.WAITING)
    assert retry.user_attrs == {"retried_from": cut_off.number, "role": TrialRole.DEFAULT.value}
    assert retry.system_attrs["fixed_params"] == {"x": 3}


def test_settings_differences_name_the_leaf_and_skip_what_a_record_lacks() -> None:
    recorded = {"study": "s", "model": "m", "workload.name": "chat", "workload.slo.ttft.p99_ms": 2000.0,
                "space.max-num-seqs": "32..512"}  # fmt: skip
    given = {**recorded, "workload.slo.ttft.p99_ms": 500.0, "workload.new_field": True}
    assert settings_differences(recorded, given) == ["workload.slo.ttft.p99_ms"]
    given = {**recorded, "space.block-size": "16,32", "workload.name": "rag", "study": "t"}
    assert settings_differences(recorded, given) == ["workload.name", "space.block-size", "study"]
    # a document on one side, none on the other
    given = {**recorded, "workload.shared_prefix.tokens": 100}
    recorded_none = {**recorded, "workload.shared_prefix": None}
    assert settings_differences(recorded_none, given) == ["workload.shared_prefix"]


def test_a_resumed_or_shared_sampler_is_seeded_apart() -> None:
    assert sampler_seed(7, trials_so_far=0, shared=False) == 7  # a new study: repeatable
    resumed = {sampler_seed(7, trials_so_far=n, shared=False) for n in range(1, 20)}
    assert len(resumed) == 19 and 7 not in resumed
    assert sampler_seed(7, trials_so_far=0, shared=True) != 7


def test_a_storage_text_that_is_not_a_url_keeps_its_password_masked() -> None:
    with pytest.raises(ConfigError) as err:
        check_storage_url(f"postgresql:/u:{SECRET}@db/x")  # one slash short
    assert SECRET not in str(err.value) and "u:***@db" in str(err.value)

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
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, unquote, unquote_plus

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError, ProgrammingError

from tuner.errors import ConfigError, LogParseError, RunFileError
from tuner.run.files import read_document
from tuner.run.layout import RunLayout, evaluation_json
from tuner.search import optuna_store
from tuner.search.budget import RECENT_LAUNCHES, LaunchKind, TimeBudget
from tuner.search.compile_cache import CompileLaunches
from tuner.search.config import TuneConfig
from tuner.search.context import StudySetup, TuneContext, auto_stream_fraction, auto_time_scale
from tuner.search.evaluate import Evaluation, Verdict, evaluate
from tuner.search.optuna_store import (
    FrozenTrial,
    RDBStorage,
    StorageInternalError,
    Study,
    Trial,
    TrialState,
)
from tuner.search.predict import Setup, SustainedRate, sustained_rate
from tuner.search.rate_search import GoodputBound, GoodputUnit, level_workload, plan_level_schedule
from tuner.search.sampling import Objective, make_sampler
from tuner.search.space import Range, TrialParams, per_gpu, vllm_defaults
from tuner.search.twin_fit import (
    FITTED,
    MAX_LEVELS,
    MeasuredLevel,
    TrialFit,
    TwinRecord,
    fit,
    goodput_worse,
    read_level,
    read_twin,
)
from tuner.search.twin_search import TwinSearch
from tuner.serving.load import plan_schedule
from tuner.serving.processes import ChildRegistry
from tuner.serving.server import Backend, server_cache_root
from tuner.serving.window import MIN_WINDOW_S
from tuner.vllm.log import calibration_from_report
from tuner.vllm.memory import Calibration
from tuner.vllm.versions import VllmVersion, logged_disagreement, logged_version

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 15
HEARTBEAT_ENV = "TUNER_HEARTBEAT_S"  # seconds between heartbeats; the grace is 4 of them
PREPARE_WAIT_S = 600.0
OTHERS_POLL_S = 2.0  # how often a worker waiting for other workers' trials looks again
FINALIZED_ATTR = "finalized"  # study attribute set once the finalize is written
EVALUATION_ATTR = "evaluation"  # trial attribute: the Evaluation, for workers on other hosts


class TrialRole(StrEnum):
    """Why a trial is in the study (its ``role`` user attribute)."""

    DEFAULT = "vllm-default"  # vLLM's own defaults, enqueued before any other trial
    SEARCH = "search"  # drawn by the sampler
    TWIN = "twin-pick"  # the twin's most promising untried setting (tuner.search.twin_search)


Progress = Callable[[str], None]
T = TypeVar("T")


def storage_url(ctx: TuneContext) -> str:
    if ctx.config.storage:
        return ctx.config.storage
    return f"sqlite:///{(ctx.run_dir / 'study.db').resolve()}"


def check_storage_url(url: str, *, what: str = "the study storage") -> None:
    """A URL SQLAlchemy would read otherwise than its user meant: ConfigError, before any
    connection. SQLAlchemy ends the password at its first ``@``, so a password holding a
    raw ``@`` sends the rest of it to the driver as the host name."""
    try:
        host = make_url(url).host or ""
    except (ArgumentError, ValueError):
        raise ConfigError(
            f"{what} {redact_url(url)!r} is not a SQLAlchemy URL; accepted: e.g. "
            "sqlite:///runs/study.db or postgresql+psycopg://user:PASSWORD@host:5432/db"
        ) from None
    if "@" in host:
        raise ConfigError(
            f"{what} {redact_url(url)!r}: the password holds an '@', which SQLAlchemy reads as "
            "the end of the password; accepted: the password percent-encoded ('@' as %40)"
        )


def open_storage(url: str) -> RDBStorage:
    """The study storage at ``url``, with heartbeats (a trial whose worker died is failed
    and retried twice); every failure to open it is a ConfigError without its secrets."""
    check_storage_url(url)

    def attempt() -> RDBStorage:
        interval = int(os.environ.get(HEARTBEAT_ENV) or HEARTBEAT_INTERVAL_S)
        return optuna_store.rdb_storage(
            url,
            heartbeat_interval_s=interval,
            grace_period_s=max(4 * interval, 2),
            max_retry=2,
            sqlite_timeout_s=30 if url.startswith("sqlite") else None,
        )

    try:
        return _retry_schema_race(attempt)
    except (StorageInternalError, ImportError, ValueError) as exc:
        raise ConfigError(
            f"cannot open the study storage {redact_url(url)!r}: {foreign_message(exc, url)}; "
            "accepted: a SQLAlchemy URL such as sqlite:///runs/study.db or "
            "postgresql+psycopg://user@host/db"
        ) from None
    except Exception as exc:  # SQLAlchemy's errors: unreachable host, bad credentials
        raise ConfigError(
            f"cannot open the study storage {redact_url(url)!r}: {foreign_message(exc, url)}"
        ) from None


def _retry_schema_race(attempt: Callable[[], T], tries: int = 5) -> T:
    """Workers opening a new database at once all create its tables; all but one collide
    (duplicate type, table or version row; SQLite says "table ... already exists"). Once
    one has, opening again works."""
    for i in range(tries):
        try:
            return attempt()
        except (IntegrityError, ProgrammingError, OperationalError) as exc:
            schema_race = not isinstance(exc, OperationalError) or "already exists" in str(exc)
            if not schema_race or i == tries - 1:
                raise
            log.info("the study storage's tables were being created by another worker; again")
            time.sleep(0.5 + i)
    raise AssertionError("unreachable")


# --- storage URLs and the messages of drivers: no password is shown -----------------------

REDACTED = "***"
# Query parameters that carry a secret (libpq's password and sslpassword, MySQL's passwd,
# tokens); matched by name, in any case.
_SECRET_PARAM = re.compile(r"pass|pwd|secret|token", re.IGNORECASE)
# As SQLAlchemy reads it, the user name ends at the first ':' and may hold an '@'; here the
# userinfo ends at the first '@' followed by a host and then '/', '?', '#' or the end (a
# password may hold '@' and '/', a host neither), so a password with a raw '@' is found whole.
_USERINFO = re.compile(r"^(?P<user>[^:/]*?)(?::(?P<password>.*?))?@(?=[\w.%\[\]:-]*(?:[/?#]|$))")
_BACKGROUND = re.compile(r"\s*\(Background on this error at: [^)]*\)")


@dataclass(frozen=True)
class _UrlParts:
    scheme: str  # "postgresql+psycopg://"
    user: str | None  # None: no userinfo
    password: str | None  # as written (percent-encoded or not)
    location: str  # host, port and database
    query: list[tuple[str, str]]  # as written

    def secret_values(self) -> list[str]:
        found = [self.password] if self.password else []
        return found + [v for k, v in self.query if v and _SECRET_PARAM.search(unquote_plus(k))]


def _url_parts(url: str) -> _UrlParts | None:
    head, sep, tail = url.partition("://")
    if not sep:
        return None
    match = _USERINFO.match(tail)
    user: str | None = None
    password: str | None = None
    if match is not None:
        user, password, tail = match["user"], match["password"], tail[match.end() :]
    location, _, query = tail.partition("?")
    params: list[tuple[str, str]] = []
    for item in query.split("&") if query else []:
        key, _, value = item.partition("=")
        params.append((key, value))
    return _UrlParts(f"{head}://", user, password, location, params)


def redact_url(url: str) -> str:
    """The URL without its secrets: the password of its userinfo (also one holding an '@')
    and every query parameter that carries one (``password``, ``sslpassword``, ...)."""
    parts = _url_parts(url)
    if parts is None:  # not a URL (a typo such as "postgresql:/u:pw@host"): mask ":...@"
        return re.sub(r"(?<=:)[^:@]*(?=@)", REDACTED, url)
    if not parts.secret_values():
        return url
    userinfo = ""
    if parts.user is not None:
        userinfo = parts.user + (f":{REDACTED}" if parts.password is not None else "") + "@"
    query = "&".join(
        f"{k}={REDACTED}" if v and _SECRET_PARAM.search(unquote_plus(k)) else f"{k}={v}"
        for k, v in parts.query
    )
    return parts.scheme + userinfo + parts.location + (f"?{query}" if parts.query else "")


def storage_location(url: str) -> str:
    """Where a storage is, for records and messages: its URL without user name and secrets."""
    parts = _url_parts(redact_url(url))
    if parts is None or parts.user is None:
        return redact_url(url)
    query = "&".join(f"{k}={v}" for k, v in parts.query)
    return parts.scheme + parts.location + (f"?{query}" if parts.query else "")


def url_secrets(url: str) -> list[str]:
    """The secrets of a storage URL in every form a message may show them: as written,
    percent-decoded and percent-encoded; longest first."""
    parts = _url_parts(url)
    forms: set[str] = set()
    for secret in parts.secret_values() if parts is not None else []:
        forms |= {secret, unquote(secret), unquote_plus(secret), quote(unquote(secret), safe="")}
    return sorted((f for f in forms if f), key=len, reverse=True)


def redact_text(text: str, url: str) -> str:
    """``text`` (a driver's or SQLAlchemy's message) with the URL redacted and its secrets
    masked wherever they appear, also the part of a password after an '@' (SQLAlchemy
    sends it to the driver as the host name, which error messages show)."""
    text = text.replace(url, redact_url(url))
    for secret in url_secrets(url):
        if len(secret) >= 4:
            text = text.replace(secret, REDACTED)
        else:  # a short one only where it stands alone, not inside every word
            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", REDACTED, text)
        for i, ch in enumerate(secret):
            if ch == "@":  # ...@tail@host: the driver's host name starts with "tail@"
                tail = secret[i + 1 :]
                if tail:
                    text = text.replace(f"{tail}@", f"{REDACTED}@")
    return text


def foreign_message(exc: BaseException, url: str) -> str:
    """A third-party exception as one line for the user: its type and message, without the
    storage's secrets and without SQLAlchemy's "Background on this error" link."""
    text = _BACKGROUND.sub("", str(exc))
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return redact_text(text or type(exc).__name__, url)


# --- which studies a storage holds, and the claims of a study's workers --------------------


class Duty(StrEnum):
    """What exactly one worker of a study does."""

    PREPARE = "prepare"  # the set-up: time scale, streamed share, vLLM's defaults as trial 0
    FINALIZE = "finalize"  # the OOM edge, the confirmations and the recommendation


def _legacy_marker(name: str, names: set[str]) -> bool:
    """A ``<study>.prepare`` or ``<study>.finalize`` study older runs created as a claim."""
    base, dot, what = name.rpartition(".")
    return bool(dot) and what in {d.value for d in Duty} and base in names


def study_names(storage: RDBStorage | str) -> list[str]:
    """The studies of a storage (an RDBStorage or a URL), without the claim markers of older
    runs; what every reader of a storage lists (the tune, the report)."""
    names = set(optuna_store.all_study_names(storage))
    return sorted(n for n in names if not _legacy_marker(n, names))


CLAIMS_TABLE = "tuner_claims"


class Claims:
    """The duties of one study's workers, each taken by exactly one of them.

    A row per duty in a table of the tuner's own beside Optuna's (its primary key makes
    the second insert fail), so the study list (``optuna-dashboard``, ``tuner report``)
    shows only the study. Older runs claimed by creating marker studies; those still count.
    """

    def __init__(self, storage: RDBStorage, study_name: str) -> None:
        self.storage = storage
        self.study_name = study_name

    def _table(self) -> sa.Table:
        metadata = sa.MetaData()
        table = sa.Table(
            CLAIMS_TABLE, metadata,
            sa.Column("study_id", sa.Integer, primary_key=True),
            sa.Column("duty", sa.String(32), primary_key=True),
            sa.Column("study_name", sa.String(512), nullable=False),
            sa.Column("holder", sa.String(512), nullable=False),
            sa.Column("at_unix_s", sa.Float, nullable=False),
        )  # fmt: skip
        _retry_schema_race(lambda: metadata.create_all(self.storage.engine, checkfirst=True))
        return table

    def take(self, duty: Duty) -> bool:
        """True for exactly one caller per study and duty."""
        if f"{self.study_name}.{duty.value}" in _all_study_names(self.storage):
            return False  # claimed by an older run, as a marker study
        table = self._table()
        study_id = self.storage.get_study_id_from_name(self.study_name)
        row = {
            "study_id": study_id, "duty": duty.value, "study_name": self.study_name,
            "holder": f"{socket.gethostname()}:{os.getpid()}", "at_unix_s": time.time(),
        }  # fmt: skip
        try:
            with self.storage.engine.begin() as conn:
                conn.execute(table.insert().values(**row))
        except IntegrityError:
            return False
        return True

    def holder(self, duty: Duty) -> str | None:
        """Who took ``duty`` (host:pid), None when nobody has."""
        table = self._table()
        study_id = self.storage.get_study_id_from_name(self.study_name)
        with self.storage.engine.connect() as conn:
            found = conn.execute(
                sa.select(table.c.holder).where(
                    table.c.study_id == study_id, table.c.duty == duty.value
                )
            ).scalar()
        return str(found) if found is not None else None


def _all_study_names(storage: RDBStorage) -> set[str]:
    return set(optuna_store.all_study_names(storage))


# --- which study a run directory and a study belong to ------------------------------------


class StudySettings(BaseModel):
    """What a study's trials are measured under. A run directory belongs to one study and a
    study to one set of these: a trial measured under others would not compare, so
    continuing (``--resume``) with other settings is refused. What may change on resume:
    the trial count, the time budget, the seed, the edge search and the confirmations."""

    model_config = ConfigDict(frozen=True)

    study: str
    model: str
    gpu: str | None
    backend: str
    vllm_version: str
    workload: dict[str, Any]  # the resolved workload spec, SLO overrides applied
    objective: str
    space: dict[str, str]  # knob -> its range as --space writes it
    max_model_len: int | None
    kv_cache_memory_bytes: int | None
    tensor_parallel_size: int
    level_duration_s: float | None = None
    level_warmup_s: float | None = None
    level_max_duration_s: float | None = None
    max_levels: int
    chain_levels: bool = False

    @classmethod
    def of(cls, ctx: TuneContext) -> StudySettings:
        c = ctx.config
        return cls(
            study=ctx.study_name, model=ctx.model.name, gpu=ctx.gpu_name,
            backend=ctx.backend.value, vllm_version=str(ctx.version),
            workload=ctx.workload.model_dump(mode="json"), objective=c.objective.value,
            space={r.knob.value: r.describe() for r in ctx.space.ranges},
            max_model_len=c.max_model_len, kv_cache_memory_bytes=c.kv_cache_memory_bytes,
            tensor_parallel_size=c.tensor_parallel_size, level_duration_s=c.level_duration_s,
            level_warmup_s=c.level_warmup_s, level_max_duration_s=c.level_max_duration_s,
            max_levels=c.max_levels, chain_levels=c.chain_levels,
        )  # fmt: skip

    def flat(self) -> dict[str, Any]:
        return _flatten(self.model_dump(mode="json"))


SETTINGS_ATTR = "settings"  # study attribute: the StudySettings it was set up with


def _flatten(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested documents as dotted keys of their leaves (``workload.slo.ttft.p99_ms``)."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def recorded_settings(tune_json: dict[str, Any]) -> dict[str, Any]:
    """What a run's ``tune.json`` (``tuner.search.tune.describe``) says it was tuned with, flat;
    the fields an older or damaged file lacks are left out (not compared)."""
    found = tune_json.get("config")
    config: dict[str, Any] = found if isinstance(found, dict) else {}
    doc: dict[str, Any] = {
        k: tune_json[k]
        for k in ("study", "model", "gpu", "backend", "vllm_version")
        if k in tune_json
    }
    if isinstance(tune_json.get("workload"), dict):
        doc["workload"] = tune_json["workload"]
    if isinstance(tune_json.get("space"), list):
        try:
            ranges = [Range.model_validate(r) for r in tune_json["space"]]
            doc["space"] = {r.knob.value: r.describe() for r in ranges}
        except ValueError:
            pass
    for key in ("objective", "max_model_len", "kv_cache_memory_bytes", "tensor_parallel_size",
                "level_duration_s", "level_warmup_s", "level_max_duration_s", "max_levels",
                "chain_levels"):  # fmt: skip
        if key in config:
            doc[key] = config[key]
    return _flatten(doc)


def _legacy_study_settings(attrs: dict[str, Any]) -> dict[str, Any]:
    """What a study set up by an older tuner recorded of its settings (no SETTINGS_ATTR)."""
    doc: dict[str, Any] = {
        k: attrs[k] for k in ("model", "gpu", "backend", "vllm_version", "objective") if k in attrs
    }
    if isinstance(attrs.get("workload"), str):
        doc["workload.name"] = attrs["workload"]
    return doc


_LABELS = {
    "study": "--study", "model": "--model", "gpu": "--gpu", "backend": "--backend",
    "vllm_version": "vLLM (--vllm-version)", "objective": "--objective",
    "max_model_len": "--max-model-len",
    "kv_cache_memory_bytes": "--kv-cache-memory-bytes",
    "tensor_parallel_size": "--tensor-parallel-size", "level_duration_s": "--level-duration",
    "level_warmup_s": "--level-warmup", "max_levels": "--max-levels",
    "level_max_duration_s": "--level-max-duration",
    "chain_levels": "--chain-levels",
    "workload.name": "--workload",
    "workload.slo.ttft": "--slo-ttft-ms", "workload.slo.itl": "--slo-itl-ms",
}  # fmt: skip
_ORDER = ("model", "gpu", "backend", "vllm_version", "workload", "objective", "space")


def _label(key: str) -> str:
    if key in _LABELS:
        return _LABELS[key]
    for prefix in ("workload.slo.ttft", "workload.slo.itl"):
        if key.startswith(prefix + "."):
            return f"{_LABELS[prefix]} (the workload's {key.removeprefix('workload.')})"
    if key.startswith("space."):
        return f"--space {key.removeprefix('space.')}"
    if key.startswith("workload."):
        return f"the workload's {key.removeprefix('workload.')}"
    return key


def _ancestors(key: str) -> list[str]:
    parts = key.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _shown(flat: dict[str, Any], key: str) -> str:
    if key in flat:
        return "(none)" if flat[key] is None else repr(flat[key])
    if any(k.startswith(key + ".") for k in flat):
        return "(set)"
    return "(not searched)" if key.startswith("space.") else "(none)"


def settings_differences(recorded: dict[str, Any], given: dict[str, Any]) -> list[str]:
    """The flat keys whose values differ, most telling first. A key only one side has
    counts where the other side has a leaf above it (a document against none) and for
    the knobs of the space; otherwise it is a field one tuner version lacks (or an older
    record does not hold), not compared."""
    differing: list[str] = []
    for key in dict.fromkeys([*recorded, *given]):
        if key in recorded and key in given:
            if recorded[key] != given[key]:
                differing.append(key)
            continue
        other = given if key in recorded else recorded
        above = next((a for a in _ancestors(key) if a in other), None)
        if above is not None:
            differing.append(above)
        elif key.startswith("space.") and any(k.startswith("space.") for k in other):
            differing.append(key)

    def rank(key: str) -> tuple[int, int, str]:
        top = key.split(".", 1)[0]
        order = _ORDER.index(top) if top in _ORDER else len(_ORDER) + (top == "study")
        return order, 0 if key == "workload.name" else 1, key

    return sorted(dict.fromkeys(differing), key=rank)


def _refuse_other_settings(
    where: str, owner: str, recorded: dict[str, Any], given: dict[str, Any]
) -> None:
    differing = settings_differences(recorded, given)
    if not differing:
        return
    first = differing[0]
    also = f" (also {', '.join(_label(k) for k in differing[1:4])})" if differing[1:] else ""
    if first == "study":
        raise ConfigError(
            f"{where} belongs to study {recorded['study']!r}; given --study {given['study']!r}; "
            f"accepted: --study {recorded['study']} (with --resume) to continue it, or another "
            "--run-dir for a new study"
        )
    raise ConfigError(
        f"{where} belongs to study {owner!r}, measured with {_label(first)} "
        f"{_shown(recorded, first)}; given {_shown(given, first)}{also}; accepted: the "
        "study's own settings to continue it (--resume), or another --run-dir (or --study) "
        "for these"
    )


def _refuse_other_measurement(where: str, attrs: dict[str, Any], config: TuneConfig) -> None:
    """A study measures every trial alike: a resumed one keeps the simulated clock's scale
    and the streamed share it chose, and refuses other values given for them (rather than
    ignoring them)."""
    for key, flag, given in (
        ("time_scale", "--time-scale", config.time_scale),
        ("stream_fraction", "--stream-fraction", config.stream_fraction),
    ):
        if given is None or key not in attrs:
            continue
        chosen = float(attrs[key])
        if not math.isclose(chosen, float(given), rel_tol=1e-9):
            raise ConfigError(
                f"{where} measured every trial with {flag} {chosen:g}; given {flag} {given:g}; "
                f"accepted: {flag} {chosen:g} or none to continue it (--resume), or another "
                "--run-dir (or --study) for this value"
            )


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
    _refuse_other_settings(
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
            else _legacy_study_settings(attrs)
        )
        _refuse_other_settings(f"study {name!r} in {where}", name, recorded, settings.flat())
        _refuse_other_measurement(f"study {name!r} in {where}", attrs, config)
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


class TrialLoop:
    """Runs trials until the study has ``trials`` complete ones or the time is up."""

    def __init__(
        self,
        ctx: TuneContext,
        opened: OpenStudy,
        registry: ChildRegistry,
        *,
        deadline_s: float,
        progress: Progress,
        budget: TimeBudget | None = None,
        reserve_s: Callable[[], float] | None = None,
    ) -> None:
        """``deadline_s``: when the search stops starting trials (monotonic). With ``budget``
        (the tune's, which counts every launch) and ``reserve_s`` (what the edge search and
        the confirmations after it take, re-estimated from the launches measured), the
        search stops at the budget's end less the reserve, re-read before every trial."""
        self.ctx = ctx
        # How every trial is measured: the study's own once prepare() has read it, then
        # calibrated after the first real startup (each launch is given the one of now).
        self.setup = StudySetup()
        self.study = opened.study
        self.storage = opened.storage
        self.claims = opened.claims
        self.settings = opened.settings
        self.registry = registry
        self.deadline_s = deadline_s
        self.progress = progress
        self.budget = budget
        self.reserve_s = reserve_s
        self.trial_estimate_s = 0.0
        self.levels_estimate_s = 0.0  # what a trial measures once launched (wall seconds)
        self.last_evaluation: Evaluation | None = None  # this worker's last trial's
        self._launch_deadline_s = deadline_s  # what the next trial was checked against
        self._predicted: dict[str, SustainedRate] = {}
        self._current_trial: int | None = None
        self._version_checked = False  # the first vLLM startup's log against the version read
        self.twin = TwinSearch(ctx, progress)
        # What each new (block size, KV dtype) costs: its first launch compiles.
        self.compile_launches = CompileLaunches(server_cache_root(ctx.run_dir / "vllm-cache"))

    # -- set-up shared by every worker --------------------------------------------------------

    def prepare(self) -> StudySetup:
        """Time scale, streamed share, calibration and the baseline trial, decided once per
        study: the first worker claims the set-up (``Claims``), the others wait for it
        and adopt what it chose. Returns the set-up (also kept as ``self.setup``)."""
        attrs = self.study.user_attrs
        if "time_scale" not in attrs:
            if self.claims.take(Duty.PREPARE):
                time_scale, fraction = self._choose_measurement()
                for key, value in {
                    SETTINGS_ATTR: self.settings.model_dump(mode="json"),
                    "model": self.ctx.config.model,
                    "gpu": self.ctx.gpu_name,
                    "backend": self.ctx.backend.value,
                    "vllm_version": str(self.ctx.version),
                    "workload": self.ctx.workload.name,
                    "objective": self.ctx.config.objective.value,
                    "space": self.ctx.space.describe(),
                    "stream_fraction": fraction,
                }.items():
                    self.study.set_user_attr(key, value)
                if not self.study.trials:
                    defaults = vllm_defaults(
                        self.ctx.space, self.ctx.version, self.ctx.gpu_or_default
                    )
                    self.study.enqueue_trial(
                        self.ctx.space.to_optuna(defaults),
                        user_attrs={"role": TrialRole.DEFAULT.value},
                    )
                self.study.set_user_attr("time_scale", time_scale)  # last: set-up complete
            else:
                self.progress("another worker is setting this study up; waiting for it")
                deadline = time.monotonic() + PREPARE_WAIT_S
                while "time_scale" not in self.study.user_attrs:
                    if time.monotonic() > deadline:
                        raise ConfigError(
                            f"study {self.study.study_name!r}: the worker setting it up did not "
                            f"finish within {PREPARE_WAIT_S:.0f} s; accepted: start again with --resume"
                        )
                    time.sleep(1.0)
            attrs = optuna_store.load_study(self.storage, self.study.study_name).user_attrs
        calibration = self.setup.calibration
        if "calibration" in attrs and calibration is None:
            calibration = Calibration.model_validate(attrs["calibration"])
        self.setup = StudySetup(
            time_scale=float(attrs["time_scale"]),
            stream_fraction=float(attrs.get("stream_fraction", 1.0)),
            calibration=calibration,
            timing=self._twin_record().factors,
        )
        return self.setup

    def _twin_record(self) -> TwinRecord:
        """The twin's record so far: this run's (a resumed run goes on from its last fit),
        else the one ``--twin-from`` names, else the paper's factors."""
        own = RunLayout(self.ctx.run_dir).twin_json
        if own.is_file():
            return read_twin(self.ctx.run_dir)
        if self.ctx.config.twin_from is not None:
            started = read_twin(self.ctx.config.twin_from)
            return TwinRecord(factors=started.factors)
        return TwinRecord()

    def _choose_measurement(self) -> tuple[float, float]:
        """The simulator's time scale and the share of requests streamed, so the load
        generator keeps up with the busiest rate the search will offer."""
        ctx = self.ctx
        config = ctx.config
        fraction = config.stream_fraction
        if ctx.backend is not Backend.SIM and fraction is not None:
            return 1.0, fraction
        if ctx.gpu is None or ctx.workload.mean_rate_per_s is None:
            return config.time_scale or 1.0, fraction or 1.0
        defaults = vllm_defaults(ctx.space, ctx.version, ctx.gpu)
        rate = self.predicted_max_rate(defaults, config.rate or ctx.workload.mean_rate_per_s)
        if rate <= 0:
            return config.time_scale or 1.0, fraction or 1.0
        # What the busiest level offers: its schedule's requests and tokens per second.
        busiest_s = config.level_duration_s or MIN_WINDOW_S
        spec = level_workload(ctx.workload, rate * 1.3, busiest_s, window=(0.0, busiest_s))
        schedule = [r for r in plan_schedule(spec) if not r.warmup]
        requests_per_s = len(schedule) / busiest_s
        tokens_per_s = sum(r.max_tokens for r in schedule) / busiest_s
        if fraction is None:
            fraction = auto_stream_fraction(
                tokens_per_s, requests_per_s, config.max_events_per_s, config.min_stream_fraction
            )
        if ctx.backend is not Backend.SIM:
            scale = 1.0
        elif config.time_scale is not None:
            scale = config.time_scale
        else:
            scale = auto_time_scale(tokens_per_s, requests_per_s, config.max_events_per_s, fraction)
        self.progress(
            f"the busiest level offers ~{requests_per_s:,.0f} requests/s and "
            f"~{tokens_per_s:,.0f} tokens/s: streaming {fraction:.0%} of requests"
            + (
                f", the simulated GPU's clock {scale:g}x slower (results in its own time)"
                if scale != 1.0
                else ""
            )
        )
        return scale, fraction

    # -- the loop ---------------------------------------------------------------------------------

    def complete_trials(self) -> list[FrozenTrial]:
        return optuna_store.trials_in(self.study, TrialState.COMPLETE)

    def running_trials(self) -> list[FrozenTrial]:
        return optuna_store.trials_in(self.study, TrialState.RUNNING)

    def run(self) -> None:
        """``_run_trials``; the twin's screen, where one is still under way, is stopped."""
        try:
            self._run_trials()
        finally:
            self.twin.stop()

    def _run_trials(self) -> None:
        """Run trials until the study has ``trials`` complete ones and none running.

        Between its trials a worker runs none, so the RUNNING trials are other
        workers': it starts another only while complete and running trials together
        are fewer than wanted, and otherwise waits for them (until its deadline), so
        the finalize sees every trial. A worker that died mid-trial stops sending
        heartbeats: its trial is failed here and retried (the storage's callback
        enqueues it with the same settings), and a waiting worker runs the retry.
        """
        wanted = self.ctx.config.trials
        said_waiting = False
        while True:
            optuna_store.fail_stale(self.study)
            done = len(self.complete_trials())
            running = len(self.running_trials())
            self._update_deadline()
            left = self.deadline_s - time.monotonic()
            if done >= wanted and running == 0:
                return
            if done + running >= wanted:
                if left <= 0:
                    self.progress(
                        f"time budget spent: not waiting for the {running} trial(s) other "
                        "workers are running"
                    )
                    return
                if not said_waiting:
                    self.progress(
                        f"{done} trial(s) complete, {running} running on other workers: "
                        "waiting for them"
                    )
                    said_waiting = True
                time.sleep(OTHERS_POLL_S)
                continue
            said_waiting = False
            if not self._next_trial_fits(done, left):
                return
            began = time.monotonic()
            try:
                self._twin_turn()
                self.study.optimize(self._objective, n_trials=1, catch=())
            except KeyboardInterrupt:  # SIGINT or SIGTERM: Optuna has failed the trial
                self._retry_cut_off()
                raise
            took = time.monotonic() - began
            self.trial_estimate_s = (
                max(self.trial_estimate_s * 0.5, took) if self.trial_estimate_s else took
            )

    # -- the time budget ----------------------------------------------------------------------

    def _update_deadline(self) -> None:
        """The search's deadline: the budget's end less what the edge search and the
        confirmations are now estimated to take (launches measured so far)."""
        if self.budget is not None and self.reserve_s is not None:
            self.deadline_s = self.budget.deadline_s - self.reserve_s()

    def _next_trial_fits(self, done: int, left_s: float) -> bool:
        """Whether the next trial's launch is started: the first one (vLLM's defaults, the
        baseline) when its launch ends before the budget's end; the next ones when a whole
        trial (a launch as measured, and what trials measured once launched) ends before
        the search's deadline. Said when not."""
        budget = self.budget
        if budget is None:  # the trials' own wall time only
            if done > 0 and left_s < self.trial_estimate_s:
                self.progress(
                    f"time budget: {left_s:.0f} s left, a trial takes ~{self.trial_estimate_s:.0f} s; "
                    "stopping the search"
                )
                return False
            return True
        if done > 0 and self.levels_estimate_s == 0.0:
            self.levels_estimate_s = self._levels_measured_before()  # a resumed study's
        if done == 0 and self.levels_estimate_s == 0.0:
            self._launch_deadline_s = budget.deadline_s
            skip = budget.fits(LaunchKind.TRIAL, "the first trial", budget.launch_estimate_s())
        else:
            self._launch_deadline_s = self.deadline_s
            need = budget.launch_estimate_s() + self.levels_estimate_s
            reserve = max(0.0, budget.deadline_s - self.deadline_s)
            skip = budget.fits(
                LaunchKind.TRIAL, "the next trial", need, deadline_s=self.deadline_s,
                note=f"{reserve:.0f} s kept for the OOM edge and the confirmations",
            )  # fmt: skip
        if skip is None:
            return True
        self.progress(f"time budget: {skip.text()}; stopping the search")
        return False

    def _levels_measured_before(self) -> float:
        """What the study's last trials measured once launched (their levels), for a run
        that resumes a study: the longest of the last ``RECENT_LAUNCHES``; 0 where none."""
        measured = [
            ev.levels_s
            for trial in self.complete_trials()
            if (ev := load_evaluation(trial)) is not None and ev.levels_s
        ]
        return max(measured[-RECENT_LAUNCHES:], default=0.0)

    def _count_launch(self, number: int, ev: Evaluation) -> None:
        """The trial's launch in the budget, and what its levels took in the estimate."""
        self.last_evaluation = ev
        if ev.launch_s is None:
            return  # screened: nothing launched
        levels = ev.levels_s or 0.0
        self.levels_estimate_s = max(self.levels_estimate_s * 0.5, levels)
        if self.budget is not None:
            self.budget.record(
                LaunchKind.TRIAL, f"trial {number}",
                began_s=time.monotonic() - (ev.launch_s + levels + (ev.stop_s or 0.0)),
                launch_s=ev.launch_s, measure_s=ev.levels_s, stop_s=ev.stop_s,
                ready=ev.outcome is not None and ev.verdict is not Verdict.STARTUP_FAILED,
                deadline_s=self._launch_deadline_s,
            )  # fmt: skip
        self._update_deadline()  # the reserve, with this launch measured

    def _twin_turn(self) -> None:
        """The twin's part before a trial: its screen started beside the first one (vLLM's
        defaults, enqueued), and after that its best untried setting enqueued while it
        predicts one above the best measured (``tuner.search.twin_search``)."""
        ctx = self.ctx
        if not ctx.config.twin_search or self.twin.done:
            return
        if ctx.twin is None:
            self.twin.done = True
            return
        if self.twin.landscape is None and ctx.config.trials - len(self.complete_trials()) < 2:
            self.twin.done = True  # no trial after this one for the twin to choose
            return
        fallback = self.best_rate() or ctx.config.rate or ctx.workload.mean_rate_per_s
        defaults = vllm_defaults(ctx.space, ctx.version, ctx.gpu_or_default)
        self.twin.start(
            self.setup.timing, self.predicted_max_rate(defaults, fallback) or fallback or 1.0
        )
        if optuna_store.trials_in(self.study, TrialState.WAITING):
            return  # enqueued first: vLLM's defaults, or a retry
        trials = optuna_store.trials_in(self.study)
        tried = [
            ctx.space.from_optuna(t.params or t.system_attrs.get("fixed_params") or {})
            for t in trials
        ]
        best = best_trial(self.study)
        best_params = ctx.space.from_optuna(best.params) if best is not None else None
        pick = self.twin.pick(tried, best_params, self.setup.timing)
        if pick is None:
            return
        self.study.enqueue_trial(
            ctx.space.to_optuna(pick.params),
            user_attrs={
                "role": TrialRole.TWIN.value,
                "twin_rate_per_s": pick.predicted_rate_per_s,
                "landscape_rate_per_s": pick.landscape_rate_per_s,
            },
        )
        self.progress(
            f"twin: next {pick.params.short()} (predicted {pick.predicted_rate_per_s:.2f}/s)"
        )

    def _retry_cut_off(self) -> None:
        """The trial an interruption cut off runs again, with the same settings, on
        ``--resume``: an interrupted trial measured nothing."""
        number = self._current_trial
        if number is None:
            return
        trial = optuna_store.trials_in(self.study)[number]
        if trial.state is TrialState.FAIL:
            retry_trial(self.study, trial)
            log.info("trial %d was interrupted; --resume runs it again", number)

    def _objective(self, trial: Trial) -> float | tuple[float, float]:
        self._current_trial = trial.number
        ctx = self.ctx
        params = ctx.space.suggest(trial)
        role = trial.user_attrs.get("role", TrialRole.SEARCH.value)
        out_dir = RunLayout(ctx.run_dir).trial_dir(trial.number)
        if out_dir.is_dir() and any(out_dir.iterdir()):
            # Trial n of this study is the only writer of trials/<n>: what is there is
            # another study's evidence (open_study refuses such a run directory up front).
            raise ConfigError(
                f"{out_dir} already holds another trial's evidence, which trial "
                f"{trial.number} of study {self.study.study_name!r} would overwrite; "
                "accepted: another --run-dir"
            )
        start = self.start_rate(params)
        predicted = self.prediction(params)
        compiled_before = self.compile_launches.entries()
        evaluation = evaluate(
            ctx, self.setup, params, out_dir=out_dir, registry=self.registry, start_rate_per_s=start,
            predicted_rate_per_s=(predicted.rate_per_s or None) if predicted else None,
            predicted_answer_times=predicted.answer_times if predicted else None,
        )  # fmt: skip
        self._count_launch(trial.number, evaluation)
        self._calibrate(evaluation)
        self._cross_check_version(evaluation)
        self._learn(trial.number, params, evaluation, predicted)
        record(trial, evaluation, role=role)
        line = self._line(trial.number, evaluation)
        compiled = self.compile_launches.launched(
            params, evaluation.startup_s, before=compiled_before
        )
        self.progress(line if compiled is None else f"{line}\n{'':>9}{compiled}")
        return objective_values(ctx.config.objective, evaluation)

    def start_rate(self, params: TrialParams) -> float | None:
        """The first rate to measure: 10% below the simulator's prediction for these
        settings (so the first level usually holds and the next one brackets the edge),
        else the best goodput so far, else the workload's own rate."""
        ctx = self.ctx
        fallback = self.best_rate() or ctx.config.rate or ctx.workload.mean_rate_per_s
        if not self._twin_places():
            return fallback
        predicted = self.predicted_max_rate(params, fallback)
        return predicted * 0.9 if predicted > 0 else fallback

    def prediction(self, params: TrialParams) -> SustainedRate | None:
        """The twin's sustained rate for these settings and its answer times there, where
        it can place one (``_twin_places``)."""
        ctx = self.ctx
        if not self._twin_places():
            return None
        fallback = self.best_rate() or ctx.config.rate or ctx.workload.mean_rate_per_s
        return self._sustained(params, fallback)

    def _twin_places(self) -> bool:
        """Whether the twin places the first rates and plans the sessions: on a GPU
        profile from the start; on a device it has no published rates for (vLLM's CPU
        build) once it has learned its step costs from a trial (or ``--twin-from``)."""
        ctx = self.ctx
        if ctx.twin is None:
            return False
        return ctx.gpu is not None or self.setup.timing.source == FITTED

    def twin_setup(self, params: TrialParams) -> Setup:
        """The twin's server for ``params`` with its step costs now."""
        twin = self.ctx.twin
        assert twin is not None
        device, base = twin
        return Setup(
            self.ctx.model, device, self.ctx.version, params.serving(base), timing=self.setup.timing
        )

    def predicted_max_rate(self, params: TrialParams, start: float | None) -> float:
        """The simulator's highest arrival rate it sustains in the steady state, a level's
        warm-up and window long (``tuner.search.predict.sustained_rate``; cached per settings)."""
        return self._sustained(params, start).rate_per_s

    def _sustained(self, params: TrialParams, start: float | None) -> SustainedRate:
        ctx = self.ctx
        key = params.model_dump_json()
        if key not in self._predicted:
            setup = self.twin_setup(params)
            rate = start or ctx.workload.mean_rate_per_s
            _, plan, _ = plan_level_schedule(
                ctx.workload, rate, window_s=ctx.config.level_duration_s,
                warmup_s=ctx.config.level_warmup_s,
            )  # fmt: skip
            self._predicted[key] = sustained_rate(
                setup, ctx.workload, warmup_s=plan.warmup_max_s, window_s=plan.window_s,
                start_rate_per_s=start, precision=0.05, max_runs=10,
            )  # fmt: skip
        return self._predicted[key]

    def _learn(
        self, number: int, params: TrialParams, ev: Evaluation, predicted: SustainedRate | None
    ) -> None:
        """Fit the twin's step costs to the levels this trial measured
        (``tuner.search.twin_fit``); its predictions from then on use them, and
        ``twin.json`` records the fit with the twin's error before and after."""
        ctx = self.ctx
        if not ctx.config.twin_fit or ctx.twin is None:
            return
        levels = self._fit_levels(number, params, ev)
        if not levels:
            return
        result = fit(self.twin_setup(params), levels)
        kept = self.setup
        self.setup = self.setup.learned(result.after)
        self._predicted.clear()  # every prediction so far was made with the old factors
        measured = ev.stated_goodput.arrival_rate_per_s if ev.verdict is Verdict.MET else None
        after = self._sustained(params, measured or None).rate_per_s
        before = predicted.rate_per_s if predicted else None
        # Measurements decide: factors that fit the percentiles but put the goodput the
        # trial measured further off are not taken (the levels measured something the
        # step costs do not explain, e.g. a load generator that fell behind).
        adopted = not goodput_worse(
            before, after, measured, lower_bound=ev.goodput_bound is GoodputBound.LOWER_BOUND
        )
        if not adopted:
            self.setup = kept
            self._predicted.clear()
        one = TrialFit(
            trial=number, levels=[lv.name for lv in levels], before=result.before,
            after=result.after, error_before=result.error_before.median_share,
            error_after=result.error_after.median_share, evaluations=result.evaluations,
            measured_rate_per_s=measured, predicted_rate_per_s=before,
            predicted_after_per_s=after, adopted=adopted,
        )  # fmt: skip
        self._twin_record().with_fit(one).write(RunLayout(ctx.run_dir).twin_json)
        line = _twin_line(one)
        log.info(line.strip())
        self.progress(line)

    def _held_levels(self, number: int, params: TrialParams, ev: Evaluation) -> list[MeasuredLevel]:
        """A trial's levels that held, as the twin replays them (all of them where none
        held: a backlog's percentiles are its queue's, which the smallest error in a
        step's cost changes by seconds)."""
        trial_dir = RunLayout(self.ctx.run_dir).trial_dir(number)
        held = {Path(lv.dir).name for lv in ev.levels if lv.met}
        paths = sorted(trial_dir.glob("level-*"))
        paths = [p for p in paths if p.name in held] or paths
        twin = self.ctx.twin
        serving = params.serving(twin[1] if twin is not None else self.ctx.base)
        return [
            replace(level, params=serving)
            for path in paths
            if (level := read_level(path, time_scale=self.setup.time_scale)) is not None
        ]

    def _fit_levels(self, number: int, params: TrialParams, ev: Evaluation) -> list[MeasuredLevel]:
        """What a fit after trial ``number`` replays: the busiest held level of each of the
        latest earlier trials, and this trial's latest held levels, ``MAX_LEVELS`` in all."""
        earlier: list[MeasuredLevel] = []
        for t in reversed(self.complete_trials()):
            if len(earlier) >= MAX_LEVELS - 1:
                break
            if t.number == number or (done := load_evaluation(t)) is None:
                continue
            theirs = self._held_levels(t.number, self.ctx.space.from_optuna(t.params), done)
            if theirs:
                earlier.append(theirs[-1])
        own = self._held_levels(number, params, ev)
        return [*reversed(earlier), *own[-(MAX_LEVELS - len(earlier)) :]] if own else []

    def best_rate(self) -> float | None:
        rates = [
            float(t.user_attrs["rate_per_s"])
            for t in self.complete_trials()
            if t.user_attrs.get("verdict") == Verdict.MET and t.user_attrs.get("rate_per_s")
        ]
        return max(rates) if rates else None

    def _calibrate(self, evaluation: Evaluation) -> None:
        ctx = self.ctx
        if self.setup.calibration is not None or evaluation.startup is None or ctx.gpu is None:
            return
        try:
            calibration = calibration_from_report(
                evaluation.startup, source=str(Path(evaluation.dir) / "server.log")
            )
        except LogParseError as exc:  # say once why the first startup cannot calibrate
            if "calibration_skipped" not in self.study.user_attrs:
                self.study.set_user_attr("calibration_skipped", str(exc))
                self.progress(f"memory model not calibrated: {exc}")
            return
        except ConfigError:
            return
        except Exception:  # a log without the memory summary: keep the uncalibrated model
            log.info("no calibration from %s", evaluation.dir, exc_info=True)
            return
        self.setup = self.setup.calibrated(calibration)
        self.study.set_user_attr("calibration", calibration.model_dump(mode="json"))
        RunLayout(ctx.run_dir).calibration_json.write_text(
            calibration.model_dump_json(indent=2), encoding="utf-8"
        )
        self.progress(f"memory model calibrated from {calibration.source}")

    def _cross_check_version(self, evaluation: Evaluation) -> None:
        """After the first vLLM launch: one line when the release its startup log names is
        not the one read from its packages before launching (or assumed, unread)."""
        if self._version_checked or self.ctx.backend is not Backend.VLLM:
            return
        server_log = Path(evaluation.dir) / "server.log"
        if evaluation.outcome is None or not server_log.is_file():
            return  # screened, not launched
        self._version_checked = True
        logged = logged_version(server_log.read_text(encoding="utf-8", errors="replace"))
        installed = self.ctx.installed_version
        read = VllmVersion.read(installed) if installed else None
        line = logged_disagreement(read, self.ctx.version, logged)
        if line:
            self.progress(line)

    def _line(self, number: int, ev: Evaluation) -> str:
        # this trial is recorded but not yet complete: the best so far counts it too
        running = [t for t in optuna_store.trials_in(self.study, TrialState.RUNNING) if t.number == number]  # fmt: skip
        best = best_trial(self.study, also=running)
        best_text = "best -"
        if best is not None:
            at_least = best.user_attrs.get("goodput_bound") == GoodputBound.LOWER_BOUND
            arrivals = arrival_goodput(best)
            unit = _unit_of(best.user_attrs.get("goodput_unit"))
            gpus = int(best.user_attrs.get("ranked_gpus") or 1)
            per_gpu = f", {arrivals / gpus:.2f} per GPU" if gpus > 1 else ""
            best_text = (
                f"best {'>=' if at_least else ''}{arrivals:.2f} {unit.label} "
                f"(#{best.number}{per_gpu})"
            )
        left = max(0.0, self.deadline_s - time.monotonic())
        if ev.verdict is Verdict.MET:
            what = f"goodput {ev.stated_goodput.text()}"
            if ev.params.gpus > 1:  # the search ranks per GPU: say what this one holds
                what += f" ({ev.stated_goodput.arrival_rate_per_s / ev.params.gpus:.2f} per GPU)"
            what += f"  p99 TTFT {ev.p99_ttft_ms or 0:,.0f} ms"
        elif ev.failure is not None or ev.verdict in (Verdict.STARTUP_FAILED, Verdict.DIED):
            what = _did_not_serve(ev)
        else:
            what = ev.backlog_note or "SLO missed at every rate"
        return (
            f"trial {number:>3}  {ev.params.short():<52} {ev.verdict.value:<14} {what:<44} "
            f"{best_text}  {left / 60:4.1f} min left"
        )


def _did_not_serve(ev: Evaluation) -> str:
    """A trial that did not serve: its outcome, vLLM's own words for why and what the harness
    saw where the log does not say it (the startup timeout that fired, a dead /health)."""
    lead = {
        Verdict.SCREENED: "screened",
        Verdict.DIED: "died under load",
    }.get(ev.verdict, "did not start")
    seen = f" ({ev.note})" if ev.note else ""
    if ev.failure is not None:
        return f"{lead}: {ev.failure.describe()}{seen}"
    outcome = ev.outcome.value if ev.outcome is not None else ev.verdict.value
    if ev.note:
        return f"{lead}: {outcome}: {ev.note} (see {Path(ev.dir) / 'server.log'})"
    return f"{lead}: {outcome}, no cause in vLLM's log (see {Path(ev.dir) / 'server.log'})"


def _twin_line(one: TrialFit) -> str:
    """The terminal's line on a fit: how far off the twin was on the trial's levels, and
    its goodput prediction for the trial's settings, before and after."""

    def pct(share: float | None) -> str:
        return "-" if share is None else f"{100 * share:+.0f}%"

    def off(share: float | None) -> str:
        return "-" if share is None else f"{100 * share:.0f}%"

    text = (
        f"  twin: {off(one.error_before)} off trial {one.trial}'s measured percentiles, "
        f"{off(one.error_after)} after fitting ({one.after.describe()})"
    )
    if one.measured_rate_per_s:
        before = TrialFit.share_off(one.predicted_rate_per_s, one.measured_rate_per_s)
        after = TrialFit.share_off(one.predicted_after_per_s, one.measured_rate_per_s)
        text += f"; its goodput prediction {pct(before)} -> {pct(after)}"
    if not one.adopted:
        text += ": not adopted, the twin keeps its factors"
    return text


def _unit_of(value: object) -> GoodputUnit:
    """A recorded goodput unit (requests/s when recorded before units were)."""
    try:
        return GoodputUnit(str(value))
    except ValueError:
        return GoodputUnit.REQUESTS_PER_S


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
    throughput = per_gpu(ev.throughput, ev.params) if ev.verdict.feasible else 0.0
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
        "goodput": ev.goodput,
        "goodput_bound": ev.goodput_bound.value,
        "throughput": ev.throughput,
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


def best_trial(study: Study, also: Sequence[FrozenTrial] = ()) -> FrozenTrial | None:
    """The feasible trial with the highest goodput in the workload's unit, per GPU where
    the tensor-parallel size is searched (ties: the higher throughput); among the complete
    ones and ``also`` (a trial recorded but not yet told)."""
    feasible = [
        t
        for t in [*optuna_store.trials_in(study, TrialState.COMPLETE), *also]
        if t.user_attrs.get("verdict") == Verdict.MET.value
    ]
    if not feasible:
        return None

    def key(t: FrozenTrial) -> tuple[float, float]:
        attrs = t.user_attrs
        gpus = attrs.get("ranked_gpus") or 1
        return (arrival_goodput(t) / gpus, attrs["throughput"] / gpus)

    return max(feasible, key=key)


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

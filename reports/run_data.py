"""A finished (or partial) tune run read back from its directory, for the report.

Everything comes from what ``tuner tune`` left on disk (see ``tuner.search.tune`` for the
layout), loaded with the models that wrote it: ``tune.json`` (``TuneRecord`` below),
``summary.json`` (``TuneSummary``), ``study.db`` (the Optuna study: trial states,
roles), ``trials/<n>/evaluation.json`` (``Evaluation``), ``edge/edge.json``
(``EdgeResult``), ``confirm/<variant>/evaluation.json`` and
``recommendation/recommendation.json`` (``Recommendation``); per measured level, its
steady-state evidence (``level_evidence``: ``window.json``, ``backlog.json``,
``turn_mix.json``, ``prompt_lengths.json``, ``metrics.csv``). Paths recorded inside
those files are absolute paths of the machine that ran the tune; they are rebased onto
the run directory as it is now, so a copied or moved run still reports.

Only a directory without ``tune.json`` (or with one that does not parse) is an error
(``ReportError``); anything else that is missing is recorded in ``RunData.missing``
and the report says so.
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)

from tuner.errors import GpuTimelineError, ReportError
from tuner.rundir import BACKLOG_JSON, WINDOW_JSON, RunLayout, evaluation_json
from tuner.search.config import TuneConfig
from tuner.search.edge import EdgeResult
from tuner.search.evaluate import Evaluation, Verdict
from tuner.search.level_evidence import PROMPT_LENGTHS_FILE, PromptLengthMix
from tuner.search.recommend import Recommendation
from tuner.search.study import TrialRole
from tuner.search.tune import TuneSummary
from tuner.serving.backlog import BacklogCheck
from tuner.serving.gpu_sampler import GpuSample, read_timeline
from tuner.serving.prometheus_scrape import MetricsSample
from tuner.serving.server import Backend
from tuner.vllm.gpus import GpuSpec, recorded_gpu
from tuner.vllm.memory import Calibration
from tuner.vllm.space import LeftOut, Range
from workloads.schedule import read_records
from workloads.spec import WorkloadSpec
from workloads.stationary import TURN_MIX_FILE, TurnMix

log = logging.getLogger(__name__)

MIN_TRIALS_FOR_IMPORTANCE = 5

M = TypeVar("M", bound=BaseModel)


class TuneRecord(BaseModel):
    """``tune.json``: the resolved configuration of a run (``tuner.search.tune.describe``)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    study: str | None = None  # older runs: only in the study storage and summary.json
    config: TuneConfig
    backend: Backend
    model: str
    gpu: str | None
    # the whole profile planned with (runs written before it: None, the name's profile)
    gpu_profile: GpuSpec | None = None
    vllm_version: str
    vllm_cmd: list[str] = []
    workload: dict[str, Any]
    space: list[Range] = []
    left_out: list[LeftOut] = []
    notes: list[str] = []
    storage: str = ""
    time_scale: float = 1.0

    @property
    def simulated(self) -> bool:
        return self.backend is Backend.SIM

    @field_validator("gpu_profile", mode="wrap")
    @classmethod
    def _readable_profile(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            return None  # a profile this tuner cannot read: the name's profile stands

    def gpu_spec(self) -> GpuSpec | None:
        """The GPU profile the run planned with (None: vLLM's CPU build); UnknownGpuError
        where it recorded only a name this tuner has no profile of."""
        return recorded_gpu(self.gpu, self.gpu_profile) if self.gpu is not None else None


@dataclass
class TrialRow:
    """One trial of the study with its evidence (``evaluation`` None: none on disk)."""

    number: int
    dir: Path
    state: str  # Optuna's trial state, or "UNKNOWN" without the study
    role: TrialRole
    evaluation: Evaluation | None

    @property
    def verdict(self) -> Verdict | None:
        return self.evaluation.verdict if self.evaluation is not None else None

    @property
    def is_default(self) -> bool:
        return self.role is TrialRole.DEFAULT

    @property
    def best_load_dir(self) -> Path | None:
        """The measured level to show for this trial: its best, else its last one."""
        ev = self.evaluation
        if ev is None:
            return None
        level = ev.best or (ev.levels[-1] if ev.levels else None)
        return rebase(level.dir, self.dir) if level is not None else None


@dataclass
class Importances:
    values: dict[str, float] | None
    note: str


@dataclass
class RunData:
    run_dir: Path
    study_name: str
    tune: TuneRecord
    workload: WorkloadSpec | None
    workload_error: str | None
    summary: TuneSummary | None
    trials: list[TrialRow]
    edge: EdgeResult | None
    recommendation: Recommendation | None
    confirm: dict[str, Evaluation]
    calibration: Calibration | None
    importances: Importances
    study_note: str | None  # why the study could not be read, when it could not
    missing: list[str] = field(default_factory=list)

    @property
    def time_scale(self) -> float:
        return self.tune.time_scale or 1.0

    @property
    def default_trial(self) -> TrialRow | None:
        return next((t for t in self.trials if t.is_default), None)

    @property
    def best_trial(self) -> TrialRow | None:
        """The recommendation's best trial, else the feasible one with the highest goodput."""
        if self.recommendation is not None:
            wanted = self.recommendation.best_trial
            return next((t for t in self.trials if t.number == wanted), None)
        feasible = [t for t in self.trials if t.evaluation and t.evaluation.verdict.feasible]
        if not feasible:
            return None
        return max(
            feasible,
            key=lambda t: (
                (t.evaluation.goodput, t.evaluation.throughput) if t.evaluation else (0, 0)
            ),
        )


# --- reading ----------------------------------------------------------------------------


def rebase(recorded: str, parent: Path) -> Path:
    """A path recorded by the run, as it is now: its last component under ``parent``."""
    return parent / Path(recorded).name


def _read_model(path: Path, model: type[M]) -> M:
    try:
        return model.model_validate_json(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReportError(f"{path}: cannot be read ({exc.strerror})") from exc
    except ValidationError as exc:
        what = _WHAT.get(model.__name__, model.__name__)
        raise ReportError(f"{path}: not {what} ({_first_error(exc)})") from exc


_WHAT = {
    "TuneRecord": "the tune.json `tuner tune` writes",
    "TuneSummary": "a tune summary",
    "Evaluation": "a trial's evaluation",
    "EdgeResult": "an OOM-edge result",
    "Recommendation": "a recommendation",
    "Calibration": "a memory-model calibration",
}


def _optional(path: Path, model: type[M], missing: list[str], what: str) -> M | None:
    if not path.is_file():
        missing.append(f"{what}: {path.name} is not in {path.parent}")
        return None
    try:
        return _read_model(path, model)
    except ReportError as exc:
        missing.append(f"{what}: {exc}")
        return None


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    loc = ".".join(str(part) for part in error["loc"]) or "the document"
    return f"{loc}: {error['msg']}"


def load_run(run_dir: Path, storage: str | None = None) -> RunData:
    """Everything the run left; ``ReportError`` when ``run_dir`` is not a tune run.

    ``storage``: the SQLAlchemy URL of a study kept outside the run directory (a study
    shared by several workers); by default the run's own ``study.db``.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(
            f"{run_dir}: not a directory; accepted: a tune run directory (runs/<study>)"
        )
    layout = RunLayout(run_dir)
    tune_path = layout.tune_json
    if not tune_path.is_file():
        raise ReportError(
            f"{run_dir}: not a tune run: tune.json is missing (written by `tuner tune` "
            "when its search starts)"
        )
    tune = _read_model(tune_path, TuneRecord)
    missing: list[str] = []
    workload: WorkloadSpec | None = None
    workload_error: str | None = None
    try:
        workload = WorkloadSpec.model_validate(tune.workload)
    except ValidationError as exc:  # e.g. a trace file that is not on this machine
        workload_error = _first_error(exc)
    summary_path = layout.summary_json
    summary = _read_model(summary_path, TuneSummary) if summary_path.is_file() else None
    rec = _optional(
        layout.recommendation_json, Recommendation, missing,
        "recommendation",
    )  # fmt: skip
    edge_path = layout.edge_json
    edge = _optional(edge_path, EdgeResult, missing, "OOM edge") if tune.config.edge else None
    if edge is None and rec is not None and rec.edge is not None:
        edge = rec.edge
    if not tune.config.edge:
        missing.append("OOM edge: the run was started with --no-edge")
    confirm: dict[str, Evaluation] = {}
    confirm_dir = layout.confirm_dir
    if confirm_dir.is_dir():
        for sub in sorted(confirm_dir.iterdir()):
            path = evaluation_json(sub)
            if path.is_file():
                ev = _optional(path, Evaluation, missing, f"confirmation run {sub.name}")
                if ev is not None:
                    confirm[sub.name] = ev
    names = [
        n for n in (tune.study, summary.study if summary else None, rec.study if rec else None) if n
    ]
    study, study_note = _open_study(run_dir, tune, names[0] if names else None, storage)
    trials = _trials(run_dir, study, rec, missing)
    calibration = _calibration(run_dir, study, rec)
    importances = _importances(study, study_note)
    if not trials:
        missing.append("trials: no trial has finished (trials/ is empty)")
    return RunData(
        run_dir=run_dir,
        study_name=study.study_name if study is not None else (names[0] if names else run_dir.name),
        tune=tune, workload=workload, workload_error=workload_error,
        summary=summary, trials=trials, edge=edge, recommendation=rec, confirm=confirm,
        calibration=calibration, importances=importances, study_note=study_note,
        missing=missing,
    )  # fmt: skip


def _open_study(
    run_dir: Path, tune: TuneRecord, name: str | None, storage: str | None
) -> tuple[Any | None, str | None]:
    """The Optuna study from ``storage``, else from the run's own SQLite file.

    Its name is the one the run recorded, else the one study there. A ``storage`` given
    (``--storage``, ``$TUNER_STORAGE``) that cannot be read is a ``ReportError``: nothing is
    written. The run's own ``study.db`` unreadable (damaged, truncated) or absent: the
    report is built from the run's files and ``RunData.study_note`` says why.
    """
    from tuner.errors import ConfigError
    from tuner.search.study import check_storage_url, foreign_message, redact_url, study_names

    db = RunLayout(run_dir).study_db
    if storage:
        url, where = storage, redact_url(storage)
        try:
            check_storage_url(storage)
        except ConfigError as exc:
            raise ReportError(str(exc)) from None
        missing_file = _missing_sqlite_file(storage)
        if missing_file is not None:
            raise ReportError(
                f"--storage {where!r}: {missing_file} does not exist; accepted: the SQLAlchemy "
                "URL of the storage that holds the run's study"
            )
    elif db.is_file():
        url, where = f"sqlite:///{db}", str(db)
    else:
        shared = tune.storage or "another storage"
        return None, (
            f"the study is not in this directory (its storage: {shared}); "
            "`tuner report RUN_DIR --storage URL` reads it there"
        )
    try:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        names = study_names(url)
        if name not in names:  # not recorded, or the record is wrong: the one study there
            if len(names) != 1:
                note = (
                    f"{where} holds {len(names)} studies, none named as the run recorded ({name!r})"
                )
                if storage:
                    raise ReportError(f"{note}; accepted: --storage URL of the run's study")
                return None, note
            name = names[0]
        study = optuna.load_study(study_name=name, storage=url)
        study.get_trials(deepcopy=False)  # read now: a damaged file fails here, not later
        _ = study.user_attrs
    except ReportError:
        raise
    except Exception as exc:  # SQLAlchemy's and Optuna's errors: a damaged or foreign store
        note = f"the study in {where} could not be read ({type(exc).__name__}: "
        note += f"{foreign_message(exc, url)})"
        if storage:
            raise ReportError(
                f"{note}; accepted: --storage URL of a study storage this host can reach"
            ) from None
        return None, note
    return study, None


def _missing_sqlite_file(url: str) -> str | None:
    """The file a ``sqlite:///`` URL names when it does not exist (opening it would create
    an empty one), else None."""
    if not url.startswith("sqlite"):
        return None
    from sqlalchemy.engine import make_url

    database = make_url(url).database
    if not database or database == ":memory:" or Path(database).is_file():
        return None
    return database


def _trials(
    run_dir: Path, study: Any | None, rec: Recommendation | None, missing: list[str]
) -> list[TrialRow]:
    from tuner.search.study import EVALUATION_ATTR

    states: dict[int, str] = {}
    roles: dict[int, TrialRole] = {}
    copies: dict[int, Any] = {}  # the evaluation each trial also keeps in the study
    if study is not None:
        for t in study.get_trials(deepcopy=False):
            states[t.number] = t.state.name
            roles[t.number] = _role(t.user_attrs.get("role"))
            if EVALUATION_ATTR in t.user_attrs:
                copies[t.number] = t.user_attrs[EVALUATION_ATTR]
    numbers = set(states)
    trials_dir = RunLayout(run_dir).trials_dir
    if trials_dir.is_dir():
        numbers |= {int(p.name) for p in trials_dir.iterdir() if p.is_dir() and p.name.isdigit()}
    rows: list[TrialRow] = []
    for number in sorted(numbers):
        tdir = RunLayout(run_dir).trial_dir(number)
        path = evaluation_json(tdir)
        evaluation = (
            _optional(path, Evaluation, missing, f"trial {number}") if path.is_file() else None
        )
        state = states.get(number, "UNKNOWN")
        if evaluation is None and number in copies:
            try:
                evaluation = Evaluation.model_validate(copies[number])
            except ValidationError as exc:
                missing.append(
                    f"trial {number}: its copy in the study is not an evaluation ({_first_error(exc)})"
                )
            else:
                missing.append(
                    f"trial {number}: no evaluation.json in {tdir}; shown from the copy the "
                    "study keeps (the level files it names may be missing too)"
                )
        if evaluation is None and state == "COMPLETE":
            missing.append(f"trial {number}: no evaluation.json in {tdir}")
        rows.append(
            TrialRow(
                number=number, dir=tdir, state=state, role=roles.get(number, TrialRole.SEARCH),
                evaluation=evaluation,
            )
        )  # fmt: skip
    if study is None and rows:  # the first trial of a new study is vLLM's defaults
        default_dir = (
            Path(rec.default.measured.dir).name
            if rec and rec.default and rec.default.measured
            else None
        )
        default = next((r for r in rows if r.dir.name == default_dir), rows[0])
        default.role = TrialRole.DEFAULT
    return rows


def _role(value: object) -> TrialRole:
    """A trial's ``role`` attribute; a trial without one (or with a name no release wrote)
    was drawn by the sampler."""
    try:
        return TrialRole(str(value))
    except ValueError:
        return TrialRole.SEARCH


def _calibration(
    run_dir: Path, study: Any | None, rec: Recommendation | None
) -> Calibration | None:
    path = run_dir / "calibration.json"
    if path.is_file():
        try:
            return _read_model(path, Calibration)
        except ReportError:
            log.info("unreadable %s", path, exc_info=True)
    if study is not None and "calibration" in study.user_attrs:
        try:
            return Calibration.model_validate(study.user_attrs["calibration"])
        except ValidationError:
            log.info("unreadable calibration in the study", exc_info=True)
    return rec.calibration if rec is not None else None


def _importances(study: Any | None, study_note: str | None) -> Importances:
    if study is None:
        return Importances(None, f"not computed: {study_note or 'no study'}")
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < MIN_TRIALS_FOR_IMPORTANCE:
        return Importances(
            None,
            f"not computed: the study has {len(complete)} complete trial(s); importances "
            f"need at least {MIN_TRIALS_FOR_IMPORTANCE} to say more than noise",
        )
    import optuna
    from optuna.importance import FanovaImportanceEvaluator

    try:
        values = optuna.importance.get_param_importances(
            study,
            evaluator=FanovaImportanceEvaluator(seed=0),
            target=lambda t: float(t.user_attrs.get("goodput") or 0.0),
        )
    except (ValueError, RuntimeError) as exc:
        return Importances(None, f"not computed: Optuna says {exc}")
    except ImportError as exc:  # an install without scikit-learn, which fANOVA needs
        log.warning("parameter importances not computed: %s", exc)
        return Importances(
            None,
            f"not computed: {exc.name or 'a package'} is not installed (pip install scikit-learn)",
        )
    if not values:
        return Importances(None, "not computed: no parameter varied across the trials")
    return Importances(
        {str(k): float(v) for k, v in values.items()},
        f"fANOVA over {len(complete)} complete trials, target: goodput at the SLO",
    )


# --- per-run evidence -------------------------------------------------------------------


@dataclass(frozen=True)
class LatencySamples:
    """One measured level's latencies in milliseconds of the emulated GPU's time."""

    ttft_ms: list[float]
    itl_ms: list[float]
    e2e_ms: list[float]
    prompt_tokens: list[int]


def level_latencies(level_dir: Path, time_scale: float) -> LatencySamples | None:
    """TTFT, ITL and e2e of each measured request, as ``LoadResult`` defines them.

    On the simulator the wall times are divided by the run's time scale, exactly as
    ``LoadResult.in_virtual_time`` does, so they are in the emulated GPU's time.
    """
    path = level_dir / "requests.jsonl"
    if not path.is_file():
        return None
    k = 1000.0 / (time_scale or 1.0)
    ttft: list[float] = []
    itl: list[float] = []
    e2e: list[float] = []
    prompts: list[int] = []
    try:
        records = list(read_records(path))
    except (OSError, ValueError, TypeError):
        log.info("unreadable %s", path, exc_info=True)
        return None
    for r in records:
        if r.warmup or not r.ok or r.first_token_s is None:
            continue
        ttft.append((r.first_token_s - r.scheduled_s) * k)
        if r.end_s is not None:
            e2e.append((r.end_s - r.scheduled_s) * k)
        times = r.token_times_s
        itl.extend((b - a) * k for a, b in itertools.pairwise(times))
        prompts.append(r.prompt_tokens)
    return LatencySamples(ttft_ms=ttft, itl_ms=itl, e2e_ms=e2e, prompt_tokens=prompts)


def read_metrics(path: Path) -> list[MetricsSample]:
    """A level's ``metrics.csv`` (``KvUsageWatcher.write_csv``); empty when absent."""
    if not path.is_file():
        return []

    def num(text: str | None) -> float | None:
        if text is None or text == "":
            return None
        value = float(text)
        return value if math.isfinite(value) else None

    out: list[MetricsSample] = []
    try:
        with path.open(encoding="utf-8", newline="") as fh:
            for row in csv.DictReader(fh):
                unix_s, usage = num(row.get("unix_s")), num(row.get("kv_cache_usage"))
                if unix_s is None or usage is None:
                    continue
                out.append(
                    MetricsSample(
                        unix_s=unix_s, kv_cache_usage=usage, running=num(row.get("running")),
                        waiting=num(row.get("waiting")),
                        preemptions_total=num(row.get("preemptions_total")),
                    )
                )  # fmt: skip
    except (OSError, ValueError):
        log.info("unreadable %s", path, exc_info=True)
    return out


@dataclass(frozen=True)
class Timeline:
    """One launched server's memory and /metrics over time."""

    label: str
    gpu: list[GpuSample]  # t_s: seconds since the sampler started (wall clock)
    anchor_unix_s: float | None  # wall clock at gpu t_s = 0, when it could be placed
    levels: list[tuple[str, list[MetricsSample]]]  # (label, samples) per measured run
    note: str | None


def timeline(label: str, run_dir: Path, level_dirs: list[tuple[str, Path]]) -> Timeline:
    """The GPU timeline of ``run_dir`` (``gpu.csv``) and the /metrics of its levels.

    ``gpu.csv`` counts seconds from the sampler's start, ``metrics.csv`` has Unix
    times. The file is closed (so last written) when the sampler stops, so its
    modification time less its last ``t_s`` places it on the wall clock; the
    placement is used only when every /metrics sample falls inside the timeline.
    """
    path = run_dir / "gpu.csv"
    samples: list[GpuSample] = []
    note: str | None = None
    if path.is_file():
        try:
            samples = read_timeline(path)
        except GpuTimelineError as exc:
            note = str(exc)
    else:
        note = "no GPU timeline (gpu.csv) was recorded"
    levels = [(name, read_metrics(d / "metrics.csv")) for name, d in level_dirs]
    levels = [(name, rows) for name, rows in levels if rows]
    anchor: float | None = None
    if samples:
        anchor = path.stat().st_mtime - samples[-1].t_s
        end = anchor + samples[-1].t_s
        stamps = [s.unix_s for _, rows in levels for s in rows]
        if stamps and (min(stamps) < anchor - 2.0 or max(stamps) > end + 2.0):
            anchor = None
            note = (
                "the /metrics samples could not be placed on the GPU timeline's clock "
                "(gpu.csv was copied without its modification time?); shown from their own start"
            )
    return Timeline(label=label, gpu=samples, anchor_unix_s=anchor, levels=levels, note=note)


def json_text(value: object) -> str:
    """Pretty JSON of a loaded value for the report's raw-detail blocks."""
    return json.dumps(value, indent=2, default=str, sort_keys=True)


# --- a level's steady-state evidence ----------------------------------------------------

WINDOW_FILE = WINDOW_JSON  # tuner.serving.window.WindowOpening, read leniently (older runs: none)
BACKLOG_FILE = BACKLOG_JSON  # tuner.serving.backlog.BacklogCheck
NOT_RECORDED = "not recorded"

R = TypeVar("R", bound=BaseModel)
T = TypeVar("T")


class WindowSignalRecord(BaseModel):
    """One signal of the steadiness test at the window's opening (its numbers kept as extras)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    signal: str
    verdict: str

    def number(self, name: str) -> float | None:
        value = (self.model_extra or {}).get(name)
        return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


class WindowRecord(BaseModel):
    """``window.json``: when a level's measured window opened and whether the server was
    steady then (``tuner.serving.window.WindowOpening``, read as plain JSON: fields it may add
    later are ignored, those an older one lacks are None)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    warmup_min_s: float | None = None
    warmup_max_s: float | None = None
    opened_at_s: float  # emulated seconds from the level's start
    steady_at_open: bool
    test: str = ""
    signals: list[WindowSignalRecord] = []
    window_s: float
    requests: int | None = None
    needed_requests: int | None = None
    window_min_s: float | None = None
    window_max_s: float | None = None
    closed: str | None = None  # tuner.serving.window.WindowClose
    correlation_s: float | None = None
    correlation_floor_s: float | None = None
    correlations_wanted: float | None = None
    slo_share: float | None = None
    band: float | None = None
    carried_on: float | None = None  # chained on from the level before: the share it added
    trace_pass_s: float | None = (
        None  # a trace replay's pass: the window is it, or its busiest stretch
    )


@dataclass(frozen=True)
class Recorded(Generic[T]):
    """One part of a level's evidence: its value, or why there is none (``note``)."""

    value: T | None
    note: str | None = None  # "not recorded", or what is wrong with the file


@dataclass(frozen=True)
class LevelEvidence:
    """What shows that one measured level was in steady state (every part may be missing)."""

    index: int
    rate_per_s: float
    met: bool
    stopped_early: bool
    dir: Path
    window: Recorded[WindowRecord]
    backlog: Recorded[BacklogCheck]
    turn_mix: Recorded[TurnMix]
    prompt_lengths: Recorded[PromptLengthMix]
    metrics: list[MetricsSample]
    start_unix_s: float | None  # wall clock at the level's offset 0, when it could be placed


def _level_file(path: Path, model: type[R]) -> Recorded[R]:
    if not path.is_file():
        return Recorded(None, NOT_RECORDED)
    try:
        return Recorded(model.model_validate_json(path.read_text(encoding="utf-8")))
    except OSError as exc:
        return Recorded(None, f"{path.name} cannot be read ({exc.strerror})")
    except ValidationError as exc:
        return Recorded(None, f"{path.name} is not readable here ({_first_error(exc)})")


def level_start_unix(level_dir: Path) -> float | None:
    """Wall clock at a level's offset 0: a record's intended send time less its offset in
    the schedule as sent (``schedule.jsonl``, open-loop requests only: a later turn's
    intended time follows its answer); None when either file is missing."""
    offsets: dict[str, float] = {}
    try:
        with (level_dir / "schedule.jsonl").open(encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                if row.get("follows") is None:
                    offsets[str(row["request_id"])] = float(row["send_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    paths = [level_dir / "requests.jsonl", *sorted(level_dir.glob("records.jsonl.w*[0-9]"))]
    for path in paths:
        try:
            with path.open(encoding="utf-8") as fh:
                for line, _ in zip(fh, range(256), strict=False):
                    row = json.loads(line)
                    if row.get("request_id") in offsets:
                        return float(row["scheduled_s"]) - offsets[row["request_id"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def level_evidence(trial_dir: Path, ev: Evaluation) -> list[LevelEvidence]:
    """Each measured level's evidence of steady state, from its directory under
    ``trial_dir``; the backlog guard's verdict from the evaluation when ``backlog.json``
    is not there (runs from before it was written)."""
    out: list[LevelEvidence] = []
    for index, lv in enumerate(ev.levels):
        level_dir = rebase(lv.dir, trial_dir)
        backlog = _level_file(level_dir / BACKLOG_FILE, BacklogCheck)
        if backlog.value is None and lv.backlog is not None:
            backlog = Recorded(lv.backlog)
        out.append(
            LevelEvidence(
                index=index, rate_per_s=lv.rate_per_s, met=lv.met,
                stopped_early=lv.stopped_early, dir=level_dir,
                window=_level_file(level_dir / WINDOW_FILE, WindowRecord), backlog=backlog,
                turn_mix=_level_file(level_dir / TURN_MIX_FILE, TurnMix),
                prompt_lengths=_level_file(level_dir / PROMPT_LENGTHS_FILE, PromptLengthMix),
                metrics=read_metrics(level_dir / "metrics.csv"),
                start_unix_s=level_start_unix(level_dir),
            )
        )  # fmt: skip
    return out

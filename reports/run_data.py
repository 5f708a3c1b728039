"""The report's view of a finished (or partial) tune run, read through ``tuner.run``.

Everything comes from what ``tuner tune`` left on disk (``tuner.run.layout``), read by
``tuner.run.reader.RunReader`` with the models that wrote it: ``tune.json`` (``TuneRecord``),
``summary.json`` (``TuneSummary``), ``study.db`` (the Optuna study: trial states,
roles), ``trials/<n>/evaluation.json`` (``Evaluation``), ``edge/edge.json``
(``EdgeResult``), ``confirm/<variant>/evaluation.json`` and
``recommendation/recommendation.json`` (``Recommendation``), ``quality/quality.json``
(``QualityResult``, where a setting that changes numerics was gated); per measured level, its
steady-state evidence (``tuner.run.levels``: ``window.json``, ``backlog.json``,
``turn_mix.json``, ``prompt_lengths.json``, ``metrics.csv``). Paths recorded inside
those files are absolute paths of the machine that ran the tune; they are rebased onto
the run directory as it is now, so a copied or moved run still reports.

Only a directory without ``tune.json`` (or with one that does not parse) is an error
(``ReportError``); anything else that is missing is recorded in ``RunData.missing``
and the report says so.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from tuner.errors import ReportError, RunFileError
from tuner.run.edge import EdgeResult
from tuner.run.evaluation import Evaluation, Verdict
from tuner.run.files import first_error
from tuner.run.levels import rebase
from tuner.run.quality import QualityResult
from tuner.run.reader import RunReader
from tuner.run.recommendation import Recommendation
from tuner.run.records import TuneRecord
from tuner.run.summary import TuneSummary
from tuner.search.study import TrialRole
from tuner.vllm.memory import Calibration
from tuner.vllm.memory_boundary import MemoryBoundary
from workloads.spec import WorkloadSpec

log = logging.getLogger(__name__)

MIN_TRIALS_FOR_IMPORTANCE = 5

M = TypeVar("M", bound=BaseModel)


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
    # The memory model's start boundary as the tune recorded it (None: an older run, or
    # no GPU profile); the report draws it and does not run the memory model again.
    memory_boundary: MemoryBoundary | None = None
    # The quality gate's result (quality/quality.json; None: nothing was gated), which the
    # recommendation carries too where there is one
    quality: QualityResult | None = None

    @property
    def time_scale(self) -> float:
        return self.tune.time_scale or 1.0

    @property
    def default_trial(self) -> TrialRow | None:
        return next((t for t in self.trials if t.is_default), None)

    @property
    def ties_with_best(self) -> list[TrialRow]:
        """The feasible trials whose capacity intervals overlap the best trial's (per GPU
        where the tensor-parallel size is searched): within the noise of it, a tie."""
        best = self.best_trial
        if best is None or best.evaluation is None or best.evaluation.capacity_interval is None:
            return []
        own = best.evaluation.capacity_interval.per_gpu(best.evaluation.params.gpus)
        ties: list[TrialRow] = []
        for t in self.trials:
            ev = t.evaluation
            if t is best or ev is None or not ev.verdict.feasible or ev.capacity_interval is None:
                continue
            if ev.capacity_interval.per_gpu(ev.params.gpus).overlaps(own):
                ties.append(t)
        return ties

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
                (t.evaluation.goodput_requests_per_s, t.evaluation.output_tokens_per_s)
                if t.evaluation
                else (0, 0)
            ),
        )


# --- reading ----------------------------------------------------------------------------


def _read(read: Callable[[], M | None], model: type[M]) -> M | None:
    """One file through the run's reader, its failure as the report says it."""
    try:
        return read()
    except RunFileError as exc:
        if isinstance(exc.cause, ValidationError):
            what = _WHAT.get(model.__name__, model.__name__)
            raise ReportError(f"{exc.path}: not {what} ({exc.reason})") from exc
        raise ReportError(str(exc)) from exc


_WHAT = {
    "TuneRecord": "the tune.json `tuner tune` writes",
    "TuneSummary": "a tune summary",
    "Evaluation": "a trial's evaluation",
    "EdgeResult": "an OOM-edge result",
    "Recommendation": "a recommendation",
    "Calibration": "a memory-model calibration",
    "QualityResult": "a quality gate's result",
}


def _optional(
    read: Callable[[], M | None], model: type[M], path: Path, missing: list[str], what: str
) -> M | None:
    try:
        found = _read(read, model)
    except ReportError as exc:
        missing.append(f"{what}: {exc}")
        return None
    if found is None:
        missing.append(f"{what}: {path.name} is not in {path.parent}")
    return found


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
    reader = RunReader(run_dir)
    layout = reader.layout
    if not reader.is_run():
        raise ReportError(
            f"{run_dir}: not a tune run: tune.json is missing (written by `tuner tune` "
            "when its search starts)"
        )
    tune = _read(reader.tune, TuneRecord)
    assert tune is not None  # is_run: tune.json is there
    missing: list[str] = []
    workload: WorkloadSpec | None = None
    workload_error: str | None = None
    try:
        workload = WorkloadSpec.model_validate(tune.workload)
    except ValidationError as exc:  # e.g. a trace file that is not on this machine
        workload_error = first_error(exc)
    summary = _read(reader.summary, TuneSummary)
    rec = _optional(
        reader.recommendation, Recommendation, layout.recommendation_json, missing,
        "recommendation",
    )  # fmt: skip
    edge = (
        _optional(reader.edge, EdgeResult, layout.edge_json, missing, "OOM edge")
        if tune.config.edge
        else None
    )
    if edge is None and rec is not None and rec.edge is not None:
        edge = rec.edge
    if not tune.config.edge:
        missing.append("OOM edge: the run was started with --no-edge")
    confirm: dict[str, Evaluation] = {}
    for sub in reader.confirmation_dirs():
        if reader.has_evaluation(sub):
            ev = _optional(
                partial(reader.evaluation, sub), Evaluation, sub, missing,
                f"confirmation run {sub.name}",
            )  # fmt: skip
            if ev is not None:
                confirm[sub.name] = ev
    names = [
        n for n in (tune.study, summary.study if summary else None, rec.study if rec else None) if n
    ]
    study, study_note = _open_study(run_dir, tune, names[0] if names else None, storage)
    trials = _trials(reader, study, rec, missing)
    calibration = _calibration(reader, study, rec)
    try:  # absent from a run before it was recorded: the map says so, nothing is missing
        boundary = _read(reader.memory_boundary, MemoryBoundary)
    except ReportError as exc:
        missing.append(f"the memory model's boundary: {exc}")
        boundary = None
    try:  # absent where no setting that changes numerics was gated
        quality = _read(reader.quality, QualityResult)
    except ReportError as exc:
        missing.append(f"the quality gate: {exc}")
        quality = None
    importances = _importances(study, study_note)
    if not trials:
        missing.append("trials: no trial has finished (trials/ is empty)")
    return RunData(
        run_dir=run_dir,
        study_name=study.study_name if study is not None else (names[0] if names else run_dir.name),
        tune=tune, workload=workload, workload_error=workload_error,
        summary=summary, trials=trials, edge=edge, recommendation=rec, confirm=confirm,
        calibration=calibration, importances=importances, study_note=study_note,
        missing=missing, memory_boundary=boundary, quality=quality,
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

    db = RunReader(run_dir).layout.study_db
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
    reader: RunReader, study: Any | None, rec: Recommendation | None, missing: list[str]
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
    numbers = set(states) | set(reader.trial_numbers())
    rows: list[TrialRow] = []
    for number in sorted(numbers):
        tdir = reader.trial_dir(number)
        evaluation = (
            _optional(
                partial(reader.evaluation, tdir), Evaluation, tdir, missing,
                f"trial {number}",
            )
            if reader.has_evaluation(tdir)
            else None
        )  # fmt: skip
        state = states.get(number, "UNKNOWN")
        if evaluation is None and number in copies:
            try:
                evaluation = Evaluation.model_validate(copies[number])
            except ValidationError as exc:
                missing.append(
                    f"trial {number}: its copy in the study is not an evaluation ({first_error(exc)})"
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
    reader: RunReader, study: Any | None, rec: Recommendation | None
) -> Calibration | None:
    try:
        recorded = reader.calibration()
    except RunFileError:
        log.info("unreadable %s", reader.layout.calibration_json, exc_info=True)
    else:
        if recorded is not None:
            return recorded
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


def json_text(value: object) -> str:
    """Pretty JSON of a loaded value for the report's raw-detail blocks."""
    return json.dumps(value, indent=2, default=str, sort_keys=True)

"""Every file and folder name a run directory holds, for its writers and its readers.

A run directory (``runs/<study>`` by default) is the product's record: the tuning job
writes it, the report and the regression gate read it, and a later tuner must still
read what an older one wrote. ``RunLayout`` names each path once::

    <run>/study.db                      the Optuna study (SQLite; absent with --storage URL)
    <run>/tune.json                     what the run was tuned with (written when it starts)
    <run>/tune.log                      the job's log
    <run>/summary.json                  how it ended (written when it ends)
    <run>/report.html                   the report (``tuner report`` rebuilds it)
    <run>/trials/<nnn>/                 one trial: evaluation.json, startup and load evidence
    <run>/trials/<nnn>/level-<i>/       one measured rate: window.json, backlog.json, client.json, ...
    <run>/trials/<nnn>/level-<i>/lagged-<k>/  an attempt at it whose load generator lagged
    <run>/edge/edge.json                the out-of-memory edge search
    <run>/confirm/<variant>[-<k>]/      the confirmation runs of the recommended variants
    <run>/ties/<nnn>/                   trial nnn's settings measured again, where it tied with the best
    <run>/quality/quality.json          the quality gate of a setting that changes numerics
    <run>/quality/<role>/               each server it compared: server.log, answers.jsonl
    <run>/recommendation/               recommendation.json and the deployable configs
    <run>/twin.json                     the twin's timing factors, fitted to the measured levels
    <run>/budget.json                   the time budget: every launch's seconds, every launch skipped
    <run>/calibration.json              the memory model calibrated by the first launch's log
    <run>/memory_boundary.json          the memory model's predicted start boundary, for the report's map
    <run>/parallelism.json              each tensor-parallel size's best server, per GPU (where searched)

Pure: no I/O beyond ``Path`` arithmetic; imports nothing of the tuner. Nothing outside
``tuner.run`` spells one of these names (``tests/unit/test_run_names.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STUDY_DB = "study.db"
TUNE_JSON = "tune.json"
TUNE_LOG = "tune.log"
SUMMARY_JSON = "summary.json"
REPORT_HTML = "report.html"
TRIALS_DIR = "trials"
EVALUATION_JSON = "evaluation.json"  # in a trial's or a confirmation run's directory
EDGE_DIR = "edge"
EDGE_JSON = "edge.json"
CONFIRM_DIR = "confirm"
QUALITY_DIR = "quality"
TIES_DIR = "ties"
QUALITY_JSON = "quality.json"  # the quality gate's result
QUALITY_ANSWERS_JSONL = "answers.jsonl"  # in a quality server's directory: its answers, scored
RECOMMENDATION_DIR = "recommendation"
RECOMMENDATION_JSON = "recommendation.json"
WINDOW_JSON = "window.json"  # in a level's directory: when its window opened
BACKLOG_JSON = "backlog.json"  # in a level's directory: the backlog guard's verdict
CLIENT_JSON = "client.json"  # in a level's directory: its load generator's lag, every attempt
PROMPT_LENGTHS_FILE = "prompt_lengths.json"  # in a level's directory: against the stationary ones
TWIN_JSON = "twin.json"  # the twin's timing factors and every fit that led to them
LANDSCAPE_JSON = "landscape.json"  # the twin's goodput for every setting of the space
BUDGET_JSON = "budget.json"  # every launch's seconds and every launch skipped for time
CALIBRATION_JSON = "calibration.json"  # the memory model calibrated by the first launch's log
MEMORY_BOUNDARY_JSON = "memory_boundary.json"  # where the memory model says vLLM starts
PARALLELISM_JSON = "parallelism.json"  # each tensor-parallel size's best server, per GPU


def level_name(index: int) -> str:
    """A level's directory name inside its trial's: ``level-<i>``."""
    return f"level-{index}"


def lagged_attempt_name(attempt: int) -> str:
    """Inside a level's directory: attempt ``attempt`` at it, set aside because its load
    generator lagged (``lagged-<k>``)."""
    return f"lagged-{attempt}"


def confirm_name(variant: str, repeat: int | None = None) -> str:
    """A confirmation run's directory name: the variant, ``-<k>`` per repeat when repeated."""
    return variant if repeat is None else f"{variant}-{repeat}"


@dataclass(frozen=True)
class RunLayout:
    """The paths of one run directory."""

    root: Path

    @property
    def study_db(self) -> Path:
        return self.root / STUDY_DB

    @property
    def tune_json(self) -> Path:
        return self.root / TUNE_JSON

    @property
    def tune_log(self) -> Path:
        return self.root / TUNE_LOG

    @property
    def summary_json(self) -> Path:
        return self.root / SUMMARY_JSON

    @property
    def report_html(self) -> Path:
        return self.root / REPORT_HTML

    @property
    def twin_json(self) -> Path:
        return self.root / TWIN_JSON

    @property
    def landscape_json(self) -> Path:
        return self.root / LANDSCAPE_JSON

    @property
    def budget_json(self) -> Path:
        return self.root / BUDGET_JSON

    @property
    def calibration_json(self) -> Path:
        return self.root / CALIBRATION_JSON

    @property
    def memory_boundary_json(self) -> Path:
        return self.root / MEMORY_BOUNDARY_JSON

    @property
    def parallelism_json(self) -> Path:
        return self.root / PARALLELISM_JSON

    @property
    def trials_dir(self) -> Path:
        return self.root / TRIALS_DIR

    def trial_dir(self, number: int) -> Path:
        return self.trials_dir / f"{number:03d}"

    @property
    def edge_dir(self) -> Path:
        return self.root / EDGE_DIR

    @property
    def edge_json(self) -> Path:
        return self.edge_dir / EDGE_JSON

    @property
    def confirm_dir(self) -> Path:
        return self.root / CONFIRM_DIR

    def confirm_run_dir(self, variant: str, repeat: int | None = None) -> Path:
        return self.confirm_dir / confirm_name(variant, repeat)

    def tie_run_dir(self, trial: int) -> Path:
        """Trial ``trial``'s settings measured again by the tie-break (``tuner.search.ties``)."""
        return self.root / TIES_DIR / f"{trial:03d}"

    @property
    def quality_dir(self) -> Path:
        return self.root / QUALITY_DIR

    @property
    def quality_json(self) -> Path:
        return self.quality_dir / QUALITY_JSON

    def quality_server_dir(self, role: str) -> Path:
        """The directory of one server the quality gate compared (``reference``,
        ``candidate``)."""
        return self.quality_dir / role

    def quality_answers(self, role: str) -> Path:
        return self.quality_server_dir(role) / QUALITY_ANSWERS_JSONL

    @property
    def recommendation_dir(self) -> Path:
        return self.root / RECOMMENDATION_DIR

    @property
    def recommendation_json(self) -> Path:
        return self.recommendation_dir / RECOMMENDATION_JSON


def evaluation_json(run_or_trial_dir: Path | str) -> Path:
    """A trial's or a confirmation run's ``evaluation.json``."""
    return Path(run_or_trial_dir) / EVALUATION_JSON

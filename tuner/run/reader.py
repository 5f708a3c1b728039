"""One reader of a run directory: the report, ``tuner capacity --from`` and the regression
gate read a run through ``RunReader`` (the tuning loop resumes through ``tuner.run.files``).

Each file is read with the model that wrote it (``Evaluation``, ``EdgeResult``,
``Recommendation``, ``QualityResult``, ``TuneSummary``, ``BudgetRecord``, ``Calibration``,
``MemoryBoundary``) or, for
``tune.json``, with ``TuneRecord`` (``tuner.run.records``). A file that is not there
reads as None; one that cannot be read, or is not what its name says, is a
``RunFileError`` naming it: what a missing or damaged file means is the caller's to say.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.run.budget import BudgetRecord
from tuner.run.edge import EdgeResult
from tuner.run.evaluation import Evaluation
from tuner.run.files import read_document, read_model, read_optional
from tuner.run.layout import RunLayout, evaluation_json
from tuner.run.quality import QualityResult
from tuner.run.recommendation import Recommendation
from tuner.run.records import TuneRecord
from tuner.run.summary import TuneSummary
from tuner.vllm.memory import Calibration
from tuner.vllm.memory_boundary import MemoryBoundary


class RunReader:
    """The files of one run directory, typed."""

    def __init__(self, root: Path | str) -> None:
        self.layout = RunLayout(Path(root))

    @property
    def root(self) -> Path:
        return self.layout.root

    # -- the run ---------------------------------------------------------------------------

    def is_run(self) -> bool:
        """Whether the directory holds ``tune.json`` (written when a tune's search starts)."""
        return self.layout.tune_json.is_file()

    def tune_document(self) -> dict[str, Any]:
        """``tune.json`` as the document it is (for readers of fields a release may lack)."""
        return read_document(self.layout.tune_json)

    def tune(self) -> TuneRecord:
        return read_model(self.layout.tune_json, TuneRecord)

    def summary(self) -> TuneSummary | None:
        return read_optional(self.layout.summary_json, TuneSummary)

    def recommendation(self) -> Recommendation | None:
        return read_optional(self.layout.recommendation_json, Recommendation)

    def quality(self) -> QualityResult | None:
        """The quality gate's result (None: no setting that changes numerics was gated)."""
        return read_optional(self.layout.quality_json, QualityResult)

    def edge(self) -> EdgeResult | None:
        return read_optional(self.layout.edge_json, EdgeResult)

    def budget(self) -> BudgetRecord | None:
        return read_optional(self.layout.budget_json, BudgetRecord)

    def calibration(self) -> Calibration | None:
        return read_optional(self.layout.calibration_json, Calibration)

    def memory_boundary(self) -> MemoryBoundary | None:
        """The memory model's boundary the tune recorded (None: a run from before it was)."""
        return read_optional(self.layout.memory_boundary_json, MemoryBoundary)

    # -- trials and confirmation runs -------------------------------------------------------

    def trial_numbers(self) -> list[int]:
        """The trials with a directory under ``trials/``."""
        trials = self.layout.trials_dir
        if not trials.is_dir():
            return []
        return sorted(int(p.name) for p in trials.iterdir() if p.is_dir() and p.name.isdigit())

    def trial_dir(self, number: int) -> Path:
        return self.layout.trial_dir(number)

    def evaluation(self, run_dir: Path) -> Evaluation | None:
        """The ``evaluation.json`` of a trial's or a confirmation run's directory."""
        return read_optional(evaluation_json(run_dir), Evaluation)

    def has_evaluation(self, run_dir: Path) -> bool:
        return evaluation_json(run_dir).is_file()

    def confirmation_dirs(self) -> list[Path]:
        """Every confirmation run's directory (``confirm/<variant>[-<k>]``), by name."""
        confirm = self.layout.confirm_dir
        return sorted(p for p in confirm.iterdir() if p.is_dir()) if confirm.is_dir() else []

    def confirmation_dir(self, variant: str, repeat: int | None = None) -> Path:
        return self.layout.confirm_run_dir(variant, repeat)

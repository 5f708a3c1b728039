"""A run directory written before the layout by role (issue 18) still reads: the report
is rebuilt from its files and its study, and the run's layout finds every file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from reports.html import write_report_noting
from reports.run_data import load_run
from tuner.run.layout import RunLayout, evaluation_json

pytestmark = pytest.mark.integration

OLD_RUN = Path(__file__).parents[1] / "fixtures" / "old_runs" / "chat-before-layout"


def test_a_run_written_before_the_move_is_reported(tmp_path: Path) -> None:
    # `tuner tune --workload chat --trials 1 --no-edge --no-confirm` on the sim backend,
    # at commit 73eee8f (modules side by side in tuner/), its load records left out.
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    layout = RunLayout(run)
    for path in (layout.tune_json, layout.summary_json, layout.study_db,
                 layout.recommendation_json, evaluation_json(layout.trial_dir(0))):  # fmt: skip
        assert path.is_file(), path
    data = load_run(run)
    assert [t.number for t in data.trials] == [0]
    assert data.study_note is None  # its study.db opens
    written = write_report_noting(run)
    assert written.path == layout.report_html and written.study_note is None
    html = written.path.read_text(encoding="utf-8")
    goodput = json.loads(layout.summary_json.read_text())["best_goodput_figures"]
    assert f"{goodput['arrival_rate_per_s']:.2f} conversations/s" in html
    assert "Steady state of each measured rate" in html

"""The tie-break (issue 34): where a trial ties with the best within the noise and the
budget leaves the time, the two are measured again on one new draw of the workload, their
levels pooled, and the recommendation says which was chosen and why, in the command's
lines, recommendation.json, summary.json, budget.json and the report. On the twin's
virtual clock (tests/virtual.py): the decision, not the processes. With no time left for
the two launches: tests/unit/test_ties.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.virtual import virtual_tune
from tuner.run.budget import BudgetRecord, LaunchKind
from tuner.run.reader import RunReader
from tuner.run.ties import TieOutcome

pytestmark = pytest.mark.integration

# max-num-seqs 31 or 32 at the small tune's load: two settings that serve alike
NEAR = ("--space", "max-num-seqs=31..32", "--trials", "2", "--no-edge", "--no-confirm")


def test_tied_settings_are_measured_again_and_the_choice_is_said(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = virtual_tune(run_dir, *NEAR)
    summary = done.summary
    assert summary.ties_with_best == [1], done.output  # the premise: trial 1 ties with 0
    tie = summary.tie_break
    assert tie is not None and tie.best == summary.best_trial and tie.tied == [1]
    assert tie.outcome is not TieOutcome.NOT_MEASURED, tie.reason
    # each of the two measured again, on a draw of the workload its trial did not see
    for compared in tie.compared:
        assert compared.pooled is not None and compared.dir is not None
        reader = RunReader(run_dir)
        again = reader.evaluation(Path(compared.dir))
        trial = reader.evaluation(reader.trial_dir(compared.trial))
        assert again is not None and trial is not None and again.levels
        assert again.params == trial.params
        assert Path(compared.dir).parent == run_dir / "ties"
    budget = BudgetRecord.model_validate_json((run_dir / "budget.json").read_text())
    assert [r.kind for r in budget.launches].count(LaunchKind.TIE_BREAK) == 2
    rec = RunReader(run_dir).recommendation()
    assert rec is not None and rec.tie_break == tie and rec.best_trial == tie.chosen
    raw = json.loads((run_dir / "summary.json").read_text())
    assert raw["tie_break"]["chosen"] == tie.chosen
    said = [line for line in done.lines if line.startswith("ties        ")]
    assert said[-1] == f"ties        {tie.text()}", done.output
    assert f"  {tie.text()}" in done.lines  # under the recommendation
    html = (run_dir / "report.html").read_text()
    assert "measured again on a new draw of the workload" in html

"""A tune that searches KV offloading says whether it paid: the best trial with a CPU
tier against the best without, in recommendation.json, the printed summary and the
report (issue 35: "finds a setting at least as good as without them, or says ... that
offloading does not pay for that workload"), on the twin's virtual clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.virtual import virtual_tune
from tuner.run.offloading import OffloadingOutcome
from tuner.run.recommendation import Recommendation

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_the_recommendation_says_whether_offloading_paid(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = virtual_tune(
        run_dir, "--knobs", "max-num-seqs,kv-offloading-size,kv-offloading-policy",
        "--space", "max-num-seqs=16", "--space", "kv-offloading-size=0,16",
        "--trials", "4", "--no-edge",
    )  # fmt: skip
    rec = Recommendation.model_validate_json(
        (run_dir / "recommendation" / "recommendation.json").read_text()
    )
    verdict = rec.offloading
    assert verdict is not None, done.output
    assert verdict.sizes_gib == [16.0]
    assert verdict.outcome is not OffloadingOutcome.NOT_COMPARED, verdict.text()
    assert verdict.with_offloading is not None and verdict.without_offloading is not None
    assert "cpu-kv 16" in verdict.with_offloading.settings
    assert "cpu-kv" not in verdict.without_offloading.settings
    # the line names both trials' capacities
    assert verdict.text().count("capacity 90% in [") == 2, verdict.text()
    line = next(x for x in done.lines if x.strip().startswith("offloading"))
    assert line.strip() == verdict.text()
    report = (run_dir / "report.html").read_text()
    assert "offloading" in report.lower() and 'class="note offloading"' in report


def test_a_tune_without_the_knob_says_nothing_of_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = virtual_tune(run_dir, "--trials", "1", "--no-edge", "--no-confirm", report=False)
    rec = json.loads((run_dir / "recommendation" / "recommendation.json").read_text())
    assert rec["offloading"] is None
    assert not any(x.strip().startswith("offloading") for x in done.lines)

"""The report says when a goodput is only a lower bound (issue 16: "a bracket, or a bound").

Works on a copy of the session's small tune (``tuned_run``): each met trial's and the
recommendation's goodput marked as found with no breaking rate, and a target peak whose
replicas are then an upper bound; the report must say "at least" and "at most".
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from reports.html import write_report
from tuner.run.goodput import GoodputBound

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]  # the shared tune takes minutes


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("vllm-cache", "report.html"))
    return dst


def _trials_table(text: str) -> str:
    start = text.index('id="trials-table"')
    return text[start : text.index("</table>", start)]


def _mark(run: Path, bound: GoodputBound) -> int:
    """Every met trial's goodput marked ``bound``; how many there are."""
    met = 0
    for path in run.glob("trials/*/evaluation.json"):
        doc = json.loads(path.read_text())
        if doc["verdict"] == "met":
            doc["goodput_bound"] = bound.value
            met += 1
        path.write_text(json.dumps(doc))
    return met


def test_a_lower_bound_reads_at_least_and_its_replicas_at_most(
    tuned_run: Path, tmp_path: Path
) -> None:
    run = _copy(tuned_run, tmp_path / "run")
    met = _mark(run, GoodputBound.LOWER_BOUND)
    assert met > 0
    path = run / "recommendation" / "recommendation.json"
    rec = json.loads(path.read_text())
    measured = rec["recommended"]["measured"]
    measured["goodput_bound"] = GoodputBound.LOWER_BOUND.value
    goodput = measured["goodput"]
    rec["capacity"] = {
        "target_peak_rate": 100.0, "headroom": 0.2, "goodput_per_replica": goodput,
        "replicas": 7, "replicas_is_upper_bound": True,
    }  # fmt: skip
    path.write_text(json.dumps(rec))
    text = write_report(run).read_text(encoding="utf-8")
    assert _trials_table(text).count(">at least</small>") == met
    summary = text[text.index('id="summary"') : text.index('id="edge"')]
    assert f"at least {goodput:.2f} req/s" in summary  # the headline
    assert "no rate measured broke the SLO" in summary
    assert "At most 7 replica(s) serve the target peak of 100 req/s" in summary
    assert ">at most 7<" in summary  # the replicas figure


def test_a_bracketed_goodput_is_stated_plainly(tuned_run: Path, tmp_path: Path) -> None:
    run = _copy(tuned_run, tmp_path / "run")
    _mark(run, GoodputBound.BRACKETED)
    path = run / "recommendation" / "recommendation.json"
    rec = json.loads(path.read_text())
    for variant in [rec["recommended"], *rec["variants"], rec["default"]]:
        if variant and variant.get("measured"):
            variant["measured"]["goodput_bound"] = GoodputBound.BRACKETED.value
    path.write_text(json.dumps(rec))
    text = write_report(run).read_text(encoding="utf-8")
    assert ">at least</small>" not in _trials_table(text)
    summary = text[text.index('id="summary"') : text.index('id="edge"')]
    assert "at least" not in summary and "≥" not in summary

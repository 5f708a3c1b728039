"""The report states goodput in the workload's own unit (issue 16, "units everywhere").

Works on a copy of the session's small tune (``tuned_run``, a single-turn workload: its
unit is requests/s); a second copy is turned into a chat run (the chat workload in
tune.json, each goodput restated in conversations/s and a target peak in conversations/s)
to check that the headline, the tables and the capacity text say conversations/s and
still give requests/s and output tokens/s beside it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from reports.html import write_report
from tuner.run.goodput import GoodputUnit
from tuner.run.recommendation import Recommendation
from workloads.spec import load_workload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]  # the shared tune takes minutes

TURNS = 3.5  # requests per conversation in the restated run


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("vllm-cache", "report.html"))
    return dst


def _summary(text: str) -> str:
    return text[text.index('id="summary"') : text.index('id="edge"')]


def _trials_table(text: str) -> str:
    start = text.index('id="trials-table"')
    return text[start : text.index("</table>", start)]


def _as_conversations(figures: dict[str, object]) -> dict[str, object]:
    requests = float(str(figures["requests_per_s"]))
    return {
        **figures,
        "unit": GoodputUnit.CONVERSATIONS_PER_S.value,
        "arrival_rate_per_s": requests / TURNS,
    }


def test_a_single_turn_run_states_requests_and_tokens(tuned_run: Path, tmp_path: Path) -> None:
    run = _copy(tuned_run, tmp_path / "run")
    text = write_report(run).read_text(encoding="utf-8")
    rec = Recommendation.model_validate_json(
        (run / "recommendation" / "recommendation.json").read_text()
    )
    assert rec.recommended.measured is not None
    g = rec.recommended.measured.stated_goodput
    assert g.unit is GoodputUnit.REQUESTS_PER_S
    summary = _summary(text)
    assert f"{g.arrival_rate_per_s:.2f} req/s" in summary  # the headline, in its own unit
    assert f"{g.output_tokens_per_s:,.0f} output tok/s" in summary
    assert "conversations/s" not in text
    assert "Goodput<br>req/s" in _trials_table(text)
    # Issue 34: the gain over vLLM's defaults in each unit, in words, under the comparison
    default = rec.default.measured if rec.default is not None else None
    if default is not None and default.goodput > 0 and rec.recommended.measured.goodput > 0:
        assert "The same gain over vLLM&#39;s defaults in every unit" in summary


def test_a_chat_run_states_conversations_requests_and_tokens(
    tuned_run: Path, tmp_path: Path
) -> None:
    run = _copy(tuned_run, tmp_path / "chat")
    tune_json = json.loads((run / "tune.json").read_text())
    tune_json["workload"] = load_workload("chat").model_dump(mode="json")
    (run / "tune.json").write_text(json.dumps(tune_json))
    for path in run.glob("trials/*/evaluation.json"):
        doc = json.loads(path.read_text())
        if doc.get("goodput_figures"):
            doc["goodput_figures"] = _as_conversations(doc["goodput_figures"])
        path.write_text(json.dumps(doc))
    path = run / "recommendation" / "recommendation.json"
    rec = json.loads(path.read_text())
    for variant in [*rec["variants"], rec["recommended"], rec["default"]]:
        if variant and variant.get("measured") and variant["measured"].get("goodput_figures"):
            m = variant["measured"]
            m["goodput_figures"] = _as_conversations(m["goodput_figures"])
    figures = rec["recommended"]["measured"]["goodput_figures"]
    per_replica = float(figures["arrival_rate_per_s"])
    rec["capacity"] = {
        "target_peak_rate": 50.0, "headroom": 0.2, "goodput_per_replica": per_replica,
        "replicas": 9, "unit": GoodputUnit.CONVERSATIONS_PER_S.value, "goodput": figures,
        "peak_requests_per_s": 50.0 * TURNS,
    }  # fmt: skip
    path.write_text(json.dumps(rec))

    text = write_report(run).read_text(encoding="utf-8")
    summary = _summary(text)
    requests = float(figures["requests_per_s"])
    tokens = float(figures["output_tokens_per_s"])
    assert f"{per_replica:.2f} conversations/s" in summary  # the headline
    assert f"{requests:.2f} req/s" in summary and f"{tokens:,.0f} output tok/s" in summary
    assert "9 replica(s) serve the target peak of 50 conversations/s (about 175 req/s)" in summary
    assert "for a peak of 50 conversations/s" in summary  # the replicas figure
    assert "Goodput at the SLO (conversations/s)" in summary  # the comparison with defaults
    assert "Goodput<br>conversations/s" in summary  # the variants' table
    table = _trials_table(text)
    assert "Goodput<br>conversations/s" in table
    assert " req/s</small>" in table  # each trial's goodput also in requests/s

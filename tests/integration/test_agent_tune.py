"""A tune of the built-in ``agent`` workload on llama-3.1-8b / H100-80GB, on the twin's
virtual clock (tests/virtual.py): it measures a goodput above zero in agent sessions per
second, and states it in requests and output tokens too. The workload's shape is tested in
tests/unit/test_agent_workload.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.virtual import virtual_tune

pytestmark = pytest.mark.integration


def test_a_tune_of_agent_sessions_finds_a_goodput(tmp_path: Path) -> None:
    done = virtual_tune(
        tmp_path / "run", "--workload", "agent", "--gpu", "H100-80GB", "--rate", "0.5",
        "--trials", "1", "--no-edge", "--no-confirm", report=False,
    )  # fmt: skip
    summary = done.summary_json()
    assert summary["feasible"] == 1, done.output
    figures = summary["best_goodput_figures"]
    assert figures["arrival_rate_per_s"] > 0
    assert figures["requests_per_s"] > 3 * figures["arrival_rate_per_s"]  # rounds a session
    assert figures["output_tokens_per_s"] > 0
    assert "workload agent" in done.output and "trial   0" in done.output

"""`tuner tune` keeps its time budget with launches that take seconds, as real vLLM ones take
minutes: the simulated engine starts in 6 s (`sim_startup_delay_s`), every launch (trial,
edge probe, confirmation) is checked against the deadline before it starts, and the whole
run ends within 10% of its budget (it ran the edge and every confirmation past it)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.integration.tune_run import tune

pytestmark = pytest.mark.timeout(150)

BUDGET_S = 60.0
STARTUP_DELAY_S = 6.0


def test_a_tune_with_slow_launches_keeps_its_budget(tmp_path: Path) -> None:
    config = tmp_path / "slow-launches.yaml"
    config.write_text(f"sim_startup_delay_s: {STARTUP_DELAY_S}\n")
    run_dir = tmp_path / "run"
    began = time.monotonic()
    done = tune(run_dir, "--budget-min", f"{BUDGET_S / 60:g}", "--config", str(config))
    took = time.monotonic() - began
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["wall_s"] <= 1.1 * BUDGET_S, done.stdout
    assert took <= 1.1 * BUDGET_S + 15.0  # the interpreter's start and imports besides

    budget = json.loads((run_dir / "budget.json").read_text())
    launches = budget["launches"]
    assert launches and launches[0]["name"] == "trial 0"
    assert all(r["launch_s"] >= STARTUP_DELAY_S for r in launches if r["ready"])
    for launch in launches:  # none started past its deadline, none ended past the budget
        assert launch["began_s"] < launch["deadline_s"], launch
        ended = launch["began_s"] + launch["launch_s"] + launch["measure_s"] + launch["stop_s"]
        assert ended <= 1.1 * BUDGET_S, launch
    # what the budget did not allow is said, with why
    assert budget["skipped"], done.stdout
    for skip in budget["skipped"]:
        assert f"{skip['name']} not started" in done.stdout
        assert "s are left before" in skip["reason"]

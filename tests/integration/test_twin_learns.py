"""The twin learns an engine it has not measured (issue 17): a tune against a simulated
server whose step costs are not the twin's (``--sim-step-costs``) fits the twin's
factors after each trial, and the twin's error on the measured levels falls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.tune_run import tune

pytestmark = pytest.mark.integration

HIDDEN = "mfu=0.4,mbu=0.6,step_overhead_ms=3"
# Windows long enough for a median and a p90 to mean something, rates enough to hold one.
LONGER = ("--trials", "2", "--no-edge", "--no-confirm", "--level-duration", "8",
          "--level-warmup", "2", "--max-levels", "4")  # fmt: skip


def test_a_tune_fits_the_twin_to_an_engine_it_has_not_seen(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = tune(run_dir, "--trials", "2", "--no-edge", "--no-confirm", "--sim-step-costs", HIDDEN)
    assert done.returncode == 0, done.stdout + done.stderr
    twin = json.loads((run_dir / "twin.json").read_text())
    fits = twin["fits"]
    assert [f["trial"] for f in fits] == [0, 1]
    first, second = fits
    # The paper's factors are far from this engine; fitted, the twin replays its levels
    # closely, and the next trial starts from the fitted factors.
    assert first["before"]["source"] == "defaults"
    assert first["error_before"] > 0.15 > 0.08 > first["error_after"]
    assert second["before"] == first["after"]
    assert second["error_before"] < first["error_before"] / 2
    assert twin["factors"] == second["after"]
    assert "off trial 0's measured percentiles" in done.stdout
    assert "off trial 0's measured percentiles" in (run_dir / "tune.log").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [f["trial"] for f in summary["twin_fits"]] == [0, 1]

    # A new run starts from what this one learned, and says a bad --twin-from in one line.
    again = tmp_path / "again"
    done = tune(again, *LONGER, "--trials", "1", "--sim-step-costs", HIDDEN,
                "--twin-from", str(run_dir))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (fit,) = json.loads((again / "twin.json").read_text())["fits"]
    assert fit["before"] == twin["factors"]
    assert fit["error_before"] < first["error_before"] / 2
    bad = tune(tmp_path / "bad", "--twin-from", str(tmp_path / "nowhere"))
    assert bad.returncode == 2
    assert "--twin-from" in bad.stderr and "twin.json" in bad.stderr
    assert not (tmp_path / "bad" / "trials").exists()

"""The twin learns an engine it has not measured (issue 17): a tune against a simulated
server whose step costs are not the twin's (``--sim-step-costs``) fits the twin's
factors after each trial, and the twin's error on the measured levels falls.

The tunes run on the twin's virtual clock (tests/virtual.py): the "engine" is the simulated
engine with the hidden step costs (``--sim-step-costs`` reaches it as sim-serve's
``--step-costs``, parsed by sim-serve's own parser), so what the twin learns is the same;
the refusal and the capacity plans run the command line in this process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.tune_run import TINY_WORKLOAD
from tests.virtual import tune_cli, tuner_cli, virtual_tune
from tuner.capacity.calibration import PAPER_ERROR

pytestmark = pytest.mark.integration

HIDDEN = "mfu=0.4,mbu=0.6,step_overhead_ms=3"
# Windows long enough for a median and a p90 to mean something, rates enough to hold one.
LONGER = ("--trials", "2", "--no-edge", "--no-confirm", "--level-duration", "8",
          "--level-warmup", "2", "--max-levels", "4")  # fmt: skip


def test_a_tune_fits_the_twin_to_an_engine_it_has_not_seen(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # (LONGER here too: on the virtual clock a level is measured without noise, and from
    # one 3 s window at a rate of the tiny workload the fit from the paper's factors stops
    # at 14% in its 40 replays although the twin replays the level exactly at the hidden
    # costs; the 8 s windows give it the levels it needs to find them.)
    done = virtual_tune(run_dir, *LONGER, "--sim-step-costs", HIDDEN)
    assert done.summary.best_trial is not None, done.output  # `tuner tune` exits 0
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
    assert "off trial 0's measured percentiles" in done.output
    assert "off trial 0's measured percentiles" in (run_dir / "tune.log").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [f["trial"] for f in summary["twin_fits"]] == [0, 1]

    # A new run starts from what this one learned, and says a bad --twin-from in one line.
    again = tmp_path / "again"
    done = virtual_tune(again, *LONGER, "--trials", "1", "--sim-step-costs", HIDDEN,
                        "--twin-from", str(run_dir))  # fmt: skip
    assert done.summary.best_trial is not None, done.output  # `tuner tune` exits 0
    (fit,) = json.loads((again / "twin.json").read_text())["fits"]
    assert fit["before"] == twin["factors"]
    assert fit["error_before"] < first["error_before"] / 2
    bad = tune_cli(tmp_path / "bad", "--twin-from", str(tmp_path / "nowhere"))
    assert bad.returncode == 2
    assert "--twin-from" in bad.stderr and "twin.json" in bad.stderr
    assert not (tmp_path / "bad" / "trials").exists()

    # Issue 19: a capacity plan given this run narrows its own GPU type's range.
    paper, calibrated = (
        _capacity_options(tmp_path / name, *extra)
        for name, extra in (("paper", ()), ("calibrated", ("--from", str(run_dir))))
    )
    assert paper["L4-24GB"]["provenance"] == "paper"
    assert paper["L4-24GB"]["error"] == pytest.approx(PAPER_ERROR)
    assert calibrated["L4-24GB"]["provenance"] == "calibrated"
    assert calibrated["L4-24GB"]["source"] == str(run_dir)
    # as wide as the fitted twin's goodput prediction for trial 1 was off its measurement
    off = abs(fits[1]["predicted_rate_per_s"] / fits[1]["measured_rate_per_s"] - 1.0)
    assert calibrated["L4-24GB"]["error"] == pytest.approx(max(0.05, off))
    assert calibrated["L4-24GB"]["error"] < paper["L4-24GB"]["error"]
    low, high = calibrated["L4-24GB"]["goodput_low"], calibrated["L4-24GB"]["goodput_high"]
    assert high - low < paper["L4-24GB"]["goodput_high"] - paper["L4-24GB"]["goodput_low"]
    # another GPU type gets the host costs it learned, at the paper's width
    assert calibrated["A100-40GB"]["provenance"] == "transferred"
    assert calibrated["A100-40GB"]["error"] == pytest.approx(PAPER_ERROR)


def _capacity_options(out: Path, *extra: str) -> dict[str, dict[str, Any]]:
    done = tuner_cli("capacity", "--model", "llama-3.1-8b", "--workload", TINY_WORKLOAD,
                     "--peak", "20", "--gpus", "L4,A100-40GB", "--tensor-parallel-size", "1",
                     "--no-report", "--out", out, *extra)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    plan = json.loads((out / "capacity.json").read_text())
    return {o["gpu"]: o for o in plan["options"]}

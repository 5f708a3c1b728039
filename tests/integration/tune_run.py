"""A small, fast `tuner tune` on the simulated engine, shared by the tuning, report and check tests.

The tiny workload (tests/fixtures/workloads/tiny.yaml) sends short completions; the
search covers a narrow max-num-seqs range so trials differ; the simulator runs at
its own speed (``--time-scale 1``); the edge search may launch two probes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TINY_WORKLOAD = REPO / "tests" / "fixtures" / "workloads" / "tiny.yaml"

SMALL_TUNE_ARGS = (
    "--model", "llama-3.1-8b",
    "--gpu", "L4",
    "--workload", str(TINY_WORKLOAD),
    "--trials", "3",
    "--budget-min", "8",
    "--level-duration", "3",
    "--level-warmup", "1",
    "--max-levels", "2",
    "--max-edge-launches", "3",
    "--time-scale", "1",
    "--space", "max-num-seqs=4..32",
    "--rate", "4",
    "--seed", "7",
)  # fmt: skip

# The one real-time shared tune's flags over SMALL_TUNE_ARGS (the last of a flag wins;
# tests/integration/conftest.py's ``real_tuned_run``): every kind of launch (a trial, an
# edge probe, confirmations), one of each that a kind needs; its tests assert processes,
# the run directory's files and the trial count, not the tune's decisions (the virtual
# tunes do).
REAL_TUNE_TRIALS = 1
REAL_TUNE_ARGS = ("--trials", str(REAL_TUNE_TRIALS), "--max-edge-launches", "1")


def tune(
    run_dir: Path,
    *extra: str,
    timeout_s: float = 600,
    twin_search: bool = False,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`tuner tune` as a user runs it, in its own process (``env``: its environment, None:
    this one's); output captured. The twin's screen of the space is off unless
    ``twin_search`` (tests/integration/test_twin_search.py covers it; the rest would each
    pay for a screen they do not look at)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner.cli",
            "tune",
            *SMALL_TUNE_ARGS,
            *(() if twin_search else ("--no-twin-search",)),
            "--run-dir",
            str(run_dir),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=run_dir.parent,
        env=env,
    )


def small_tune(run_dir: Path, *extra: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run the small tune and return its summary.json; fails loudly with the output."""
    done = tune(run_dir, *extra, env=env)
    assert done.returncode == 0, (
        f"tuner tune failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    )
    summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return summary

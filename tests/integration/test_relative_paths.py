"""Relative paths on the command line: every path handed to a child process is absolute.

Locust runs in its own directory (away from the caller's locust.conf), so a relative
schedule path handed to it would name a file that is not there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.simserver import start_sim
from tests.integration.tune_run import TINY_WORKLOAD

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def tuner_in(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args],
        capture_output=True, text=True, timeout=300, cwd=cwd, env=env,
    )  # fmt: skip


def test_bench_with_a_relative_out_directory(tmp_path: Path) -> None:
    server = start_sim(("--model", "qwen2.5-7b", "--max-model-len", "4096"), tmp_path / "sim.log")
    try:
        done = tuner_in(
            tmp_path, "bench", "--url", server.url, "--workload", str(TINY_WORKLOAD),
            "--duration", "2", "--out", "runs/bench-1", "--json",
        )  # fmt: skip
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout)
    assert data["load"]["num_completed"] > 0
    assert Path(data["records"]).is_absolute()
    assert (tmp_path / "runs" / "bench-1" / "requests.jsonl").exists()


def test_trial_with_its_default_and_a_relative_out_directory(tmp_path: Path) -> None:
    common = ("trial", "--model", "qwen2.5-7b", "--max-model-len", "4096",
              "--workload", str(TINY_WORKLOAD), "--duration", "2",
              "--sim-startup-delay", "0.1", "--json")  # fmt: skip
    for out_args, out_dir in (((), tmp_path / "runs" / "trial"),
                              (("--out", "runs/trial-1"), tmp_path / "runs" / "trial-1")):  # fmt: skip
        done = tuner_in(tmp_path, *common, *out_args)
        assert done.returncode == 0, done.stderr[-3000:]
        data = json.loads(done.stdout)
        assert data["outcome"] == "ready" and data["load"]["num_completed"] > 0
        assert (out_dir / "load" / "requests.jsonl").exists()
        assert json.loads((out_dir / "children.json").read_text()) == []

"""SIGINT and SIGTERM of every long-running command: one line, 130 or 143, nothing left running.

Each command runs as a user runs it (its own process, real signals); the test waits until
it is doing its work (a server up, Locust sending, the simulator computing) before the
signal, then checks the exit status, that the terminal shows no traceback, that every
process group it recorded is gone, and that what it had recorded is still on disk.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.simserver import start_sim
from tests.integration.tune_run import SMALL_TUNE_ARGS, TINY_WORKLOAD
from tuner.serving.processes import group_alive

pytestmark = pytest.mark.integration

TINY = ("--workload", str(TINY_WORKLOAD))


def _start(args: list[str], cwd: Path) -> tuple[subprocess.Popen[str], Path, Path]:
    out, err = cwd / "stdout.txt", cwd / "stderr.txt"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.cli", *args],
            stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, text=True, cwd=cwd,
        )  # fmt: skip
    return proc, out, err


def _wait_for(proc: subprocess.Popen[str], ready: Callable[[], bool], what: str, err: Path) -> None:
    deadline = time.monotonic() + 120
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"exited ({proc.returncode}) before {what}:\n{err.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"not {what} after 120 s:\n{err.read_text()[-3000:]}")
        time.sleep(0.2)


def _children(run_dir: Path) -> list[int]:
    try:
        return [int(r["pgid"]) for r in json.loads((run_dir / "children.json").read_text())]
    except (OSError, ValueError):
        return []


def _has_server(run_dir: Path, pattern: str) -> Callable[[], bool]:
    def ready() -> bool:
        return any(
            "Application startup complete" in p.read_text(errors="replace")
            for p in run_dir.glob(pattern)
        ) and bool(_children(run_dir))

    return ready


def _interrupt(
    proc: subprocess.Popen[str], sig: signal.Signals, run_dir: Path | None, err: Path
) -> tuple[int, str, list[int]]:
    groups = _children(run_dir) if run_dir is not None else []
    proc.send_signal(sig)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"still running 60 s after {sig.name}:\n{err.read_text()[-3000:]}")
    return code, err.read_text(), groups


def _assert_one_line(code: int, stderr: str, sig: signal.Signals, groups: list[int]) -> None:
    assert code == 128 + sig, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("tuner: interrupted")]
    assert len(lines) == 1 and lines[0].startswith(f"tuner: interrupted by {sig.name}; "), stderr
    assert not any(
        line.startswith(("tuner: WARNING: Trial", "[W ")) for line in stderr.splitlines()
    )
    assert "no server or load generator left running" in lines[0]
    for pgid in groups:
        assert not group_alive(pgid), f"process group {pgid} outlived the harness"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_tune_interrupted(tmp_path: Path, sig: signal.Signals) -> None:
    run_dir = tmp_path / "run"
    proc, _, err = _start(["tune", *SMALL_TUNE_ARGS, "--run-dir", str(run_dir)], tmp_path)
    _wait_for(proc, _has_server(run_dir, "trials/*/server.log"), "serving a trial", err)
    code, stderr, groups = _interrupt(proc, sig, run_dir, err)
    _assert_one_line(code, stderr, sig, groups)
    assert groups
    line = next(line for line in stderr.splitlines() if line.startswith("tuner: interrupted"))
    assert str(run_dir) in line and "--resume" in line
    # What was recorded stays: the study, the trial's evidence, an empty child registry.
    assert (run_dir / "study.db").stat().st_size > 0
    assert list(run_dir.glob("trials/*/server.log"))
    assert _children(run_dir) == []
    # The cut-off trial (vLLM's defaults, the baseline) waits to run again on --resume.
    import optuna
    from optuna.trial import TrialState

    study = optuna.load_study(study_name=None, storage=f"sqlite:///{run_dir / 'study.db'}")
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    cut = study.trials[0]
    assert cut.state is TrialState.FAIL
    assert [(t.user_attrs.get("retried_from"), t.user_attrs.get("role")) for t in waiting] == [
        (0, "vllm-default")
    ]
    assert waiting[0].system_attrs["fixed_params"] == cut.params


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_trial_interrupted(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "trial"
    args = ["trial", "--model", "qwen2.5-7b", "--max-model-len", "4096", *TINY,
            "--duration", "60", "--sim-startup-delay", "0.1", "--out", str(out)]  # fmt: skip
    proc, _, err = _start(args, tmp_path)
    _wait_for(proc, lambda: (out / "load" / "locust.log").exists(), "loading the server", err)
    code, stderr, groups = _interrupt(proc, sig, out, err)
    _assert_one_line(code, stderr, sig, groups)
    assert len(groups) >= 2  # the server and Locust
    assert (out / "server.log").exists() and _children(out) == []


def test_bench_interrupted(tmp_path: Path) -> None:
    server = start_sim(("--model", "qwen2.5-7b", "--max-model-len", "4096"), tmp_path / "sim.log")
    out = tmp_path / "bench"
    try:
        args = ["bench", "--url", server.url, *TINY, "--duration", "60", "--out", str(out)]
        proc, _, err = _start(args, tmp_path)
        _wait_for(proc, lambda: (out / "locust.log").exists(), "loading the server", err)
        time.sleep(1.0)
        code, stderr, groups = _interrupt(proc, signal.SIGTERM, out, err)
    finally:
        server.stop()
    _assert_one_line(code, stderr, signal.SIGTERM, groups)
    assert len(groups) == 1


def test_serve_interrupted(tmp_path: Path) -> None:
    run_dir = tmp_path / "serve"
    args = ["serve", "--model", "qwen2.5-7b", "--max-model-len", "4096", "--hold",
            "--sim-startup-delay", "0.1", "--run-dir", str(run_dir)]  # fmt: skip
    proc, _, err = _start(args, tmp_path)
    _wait_for(proc, lambda: "serving at" in err.read_text(), "serving", err)
    code, stderr, groups = _interrupt(proc, signal.SIGINT, run_dir, err)
    _assert_one_line(code, stderr, signal.SIGINT, groups)
    assert len(groups) == 1 and (run_dir / "gpu.csv").exists()


def test_simulate_interrupted(tmp_path: Path) -> None:
    args = ["simulate", "--model", "qwen2.5-7b", "--rate", "50", "--duration", "100000"]
    proc, _, err = _start(args, tmp_path)
    time.sleep(4.0)
    assert proc.poll() is None, err.read_text()
    code, stderr, _ = _interrupt(proc, signal.SIGTERM, None, err)
    _assert_one_line(code, stderr, signal.SIGTERM, [])


def test_sim_serve_stops_as_vllm_does(tmp_path: Path) -> None:
    """The simulated engine shuts down as `vllm serve` does on SIGTERM: cleanly, status 0."""
    server = start_sim(("--model", "qwen2.5-7b", "--max-model-len", "4096"), tmp_path / "sim.log")
    os.kill(server.proc.pid, signal.SIGTERM)
    assert server.wait_exit() == 0
    assert "Traceback" not in server.log()

"""The twin's screen workers die with a tune killed with SIGKILL.

The screen runs in a spawned ``multiprocessing`` pool beside the first trial. Its workers
are not started through the child registry: killed, the tune would leave them waiting for
their next task for ever, and multiprocessing's resource tracker with them (what
tests/integration/test_distributed.py once saw of a killed worker: three children alive
15 s on). Each worker asks for the parent-death signal as it starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.tune_run import SMALL_TUNE_ARGS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sys.platform != "linux", reason="reads /proc"),
]


def _children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_tune_leaves_no_screen_worker(tmp_path: Path) -> None:
    out = tmp_path / "stdout.txt"
    with out.open("w") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.cli", "tune", *SMALL_TUNE_ARGS,
             "--run-dir", str(tmp_path / "run"), "--trials", "2",
             "--space", "max-num-seqs=4..512"],  # a screen of a minute or more
            stdout=stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while "twin: screening" not in out.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        workers: list[int] = []
        while len(workers) < 2 and time.monotonic() < deadline:  # both spawned
            time.sleep(0.2)
            workers = [p for p in _children_of(proc.pid) if "multiprocessing" in _cmdline(p)]
        assert len(workers) >= 2, "no screen workers to outlive the tune"
        time.sleep(1.0)  # past their start, computing
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    # The signal is immediate: a worker that finished its share of the screen first and
    # then read the end of its task queue would take longer than this.
    gone_by = time.monotonic() + 5
    while (alive := [p for p in workers if _running(p)]) and time.monotonic() < gone_by:
        time.sleep(0.2)
    described = [f"{p}: {_cmdline(p)}" for p in alive]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"left running: {described}"

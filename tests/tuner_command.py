"""The ``tuner`` command run two ways: as a user runs it (a process of its own) and, for the
many bad-input cases that only read its exit code and its one error line, in this process
(``tuner.cli.main.main``, what ``python -m tuner.cli`` calls), which spares each case the
seconds a new interpreter takes to import the tuner. Each command keeps at least one case
in a real process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tuner.cli.main import main


def tuner_process(
    args: Sequence[str], *, cwd: Path | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m tuner.cli ARGS`` in a process of its own; output captured."""
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args],
        capture_output=True, text=True, timeout=timeout_s, cwd=cwd,
    )  # fmt: skip


def tuner_in_process(
    args: Sequence[str], capsys: pytest.CaptureFixture[str]
) -> subprocess.CompletedProcess[str]:
    """``main(ARGS)`` here, its exit code (argparse's ``SystemExit`` too) and what it wrote
    to stdout and stderr, in the shape ``tuner_process`` returns."""
    capsys.readouterr()  # what the test printed before is not the command's
    try:
        code = main(list(args))
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["tuner", *args], code, out, err)

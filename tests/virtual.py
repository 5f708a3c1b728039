"""A tune run in this process on the twin's virtual clock (``tuner.twin.virtual_server``).

The same configuration as `tuner tune` with the same flags (``SMALL_TUNE_ARGS`` of
tests/integration/tune_run.py by default, parsed by the tuner's own parser into the
config the command would run), the same job (``run_tune``, the report writer the
command passes), with one difference: every launch is a ``VirtualServer``, the simulated
engine on its virtual clock, instead of a `tuner sim-serve` process loaded by Locust. A
level takes a fraction of a second, so a tune's decisions (its trials, edge, confirmations,
resume, refusals) are tested in seconds. What only a process can show (signals, sockets,
Locust, wall time) stays with the real-time tunes.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.tune_run import SMALL_TUNE_ARGS
from tuner.run.summary import TuneSummary


@dataclass(frozen=True)
class VirtualRun:
    """A finished virtual tune: its summary, what it printed, its run directory."""

    summary: TuneSummary
    lines: list[str]
    run_dir: Path

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def summary_json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.run_dir / "summary.json").read_text())
        return data


def tune_args(run_dir: Path, *extra: str, twin_search: bool = False) -> list[str]:
    """`tuner tune`'s arguments as tests/integration/tune_run.py's ``tune`` passes them."""
    return [
        "tune", *SMALL_TUNE_ARGS, *(() if twin_search else ("--no-twin-search",)),
        "--run-dir", str(run_dir), *extra,
    ]  # fmt: skip


def virtual_tune(
    run_dir: Path, *extra: str, twin_search: bool = False, report: bool = True
) -> VirtualRun:
    """The small tune (plus ``extra`` flags) on the virtual clock; ``report``: write the
    HTML report as the command does. A bad value raises the ``TunerError`` the command
    would print."""
    from reports.html import write_report_noting
    from tuner.cli.main import _absolute_paths, build_parser
    from tuner.cli.tune import overrides_of
    from tuner.search.config import load_config
    from tuner.search.tune import run_tune
    from tuner.twin.virtual_server import VirtualServer

    args = build_parser().parse_args(tune_args(run_dir, *extra, twin_search=twin_search))
    _absolute_paths(args)
    config = load_config(args.config, overrides_of(args))
    lines: list[str] = []
    summary = run_tune(
        config, lines.append, write_report_noting if report else None,
        server_factory=VirtualServer,
    )  # fmt: skip
    return VirtualRun(summary=summary, lines=lines, run_dir=run_dir)


@dataclass(frozen=True)
class Done:
    """A command's exit code and what it printed."""

    returncode: int
    stdout: str
    stderr: str


def tuner_cli(*args: str | Path) -> Done:
    """`tuner ARGS` in this process, through the command line's own entry point
    (``tuner.cli.main.main``): its exit code, stdout and stderr. For commands that refuse
    before anything is launched; one that goes on launches what the command would."""
    from tuner.cli.main import _TerminalFormatter, main

    out, err = io.StringIO(), io.StringIO()
    # What the command's own terminal handler would print (``_log_to_terminal``: pytest's
    # handlers on the root logger leave its ``basicConfig`` without effect here).
    terminal = logging.StreamHandler(err)
    terminal.setLevel(logging.WARNING)
    terminal.setFormatter(_TerminalFormatter("tuner: %(levelname)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(terminal)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    finally:
        root.removeHandler(terminal)
    return Done(code, out.getvalue(), err.getvalue())


def tune_cli(run_dir: Path, *extra: str) -> Done:
    """`tuner tune` with the small tune's arguments (``tune_args``), in this process."""
    return tuner_cli(*tune_args(run_dir, *extra))

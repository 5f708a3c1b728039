"""One trial of ``tuner tune`` on the twin's virtual clock, as the benchmarks that repeat
one setting over workload seeds run it (``repeatability.py``, ``units_agreement.py``):
one trial (vLLM's defaults, or the settings ``space`` pins), no edge, no confirmation,
no twin search, every launch a ``VirtualServer``, its output kept out of the terminal.
Its wall-clock budget is ``BUDGET_MIN``, not a tune's default 14 minutes: a repeat is
measured in full, not cut where a busy host runs the virtual clock slowly (the twin's
pick, seed 10, measured two of its four draws in 14 minutes at ``cef11b9``).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import yaml

from tuner.cli.main import _absolute_paths, build_parser
from tuner.cli.tune import overrides_of
from tuner.run.evaluation import Evaluation
from tuner.run.layout import RunLayout, evaluation_json
from tuner.search.config import load_config
from tuner.search.tune import run_tune
from tuner.twin.virtual_server import VirtualServer
from workloads.spec import load_workload

BUDGET_MIN = 120.0


def workload_file(name: str, seed: int, folder: Path) -> Path:
    """The workload with another seed, as a file: only the fields it sets (a default
    written out is a choice: ``sessions.start: empty`` would open every level on an
    empty server instead of the conversations under way)."""
    spec = load_workload(name).model_copy(update={"seed": seed})
    path = folder / f"{spec.name}-seed{seed}.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_unset=True)), "utf-8")
    return path


def one_trial(
    *,
    model: str,
    gpu: str,
    workload: Path,
    run_dir: Path,
    max_levels: int,
    space: list[str],
    edge_draws: int = 1,
    level_duration_s: float | None = None,
) -> Evaluation:
    """Trial 0 of a one-trial tune into ``run_dir``, as its ``evaluation.json`` says;
    ``edge_draws``: its bracket's ends measured with that many draws (``--trial-edge-draws``);
    ``level_duration_s``: every level's window fixed at that (``--level-duration``)."""
    argv = [
        "tune", "--model", model, "--gpu", gpu, "--workload", str(workload),
        "--trials", "1", "--no-edge", "--no-confirm", "--no-twin-search",
        "--budget-min", str(BUDGET_MIN),
        "--max-levels", str(max_levels), "--trial-edge-draws", str(edge_draws),
        "--run-dir", str(run_dir),
        *[a for pin in space for a in ("--space", pin)],
        *(["--level-duration", str(level_duration_s)] if level_duration_s else []),
    ]  # fmt: skip
    parsed = build_parser().parse_args(argv)
    _absolute_paths(parsed)
    config = load_config(parsed.config, overrides_of(parsed))
    lines: list[str] = []
    with contextlib.redirect_stderr(io.StringIO()):
        run_tune(config, lines.append, None, server_factory=VirtualServer)
    return Evaluation.model_validate_json(
        evaluation_json(RunLayout(run_dir).trial_dir(0)).read_text()
    )

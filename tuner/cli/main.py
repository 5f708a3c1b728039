"""The `tuner` command line: parses arguments and calls one entry point per command."""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner.cli import bench, capacity, check, fetch, k8s, load_worker, report, serve, tune
from tuner.cli.args import OneLineParser
from tuner.errors import TunerError
from tuner.serving.processes import Interrupted, interrupts_raised, raise_interrupted
from tuner.sim import serve_cli, simulate_cli
from tuner.vllm.flags import add_memory_flags, params_from_args

log = logging.getLogger(__name__)


def _add_plan_parser(sub: argparse._SubParsersAction[OneLineParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="predict vLLM's startup memory and KV cache without launching it",
        description="Predict whether vLLM starts with these settings and how many KV-cache "
        "tokens it will have, from vLLM's own startup accounting.",
    )
    p.add_argument(
        "--model", required=True, help="preset name, Hugging Face id, or model directory"
    )
    p.add_argument("--gpu", required=True, help="GPU profile, e.g. H100-80GB")
    add_memory_flags(p)
    p.add_argument("--calibrate-from", type=Path, metavar="LOG", help="a real vLLM startup log")
    p.add_argument("--sweep", metavar="KNOB", help="find the startup edge along one knob")
    p.add_argument(
        "--boot",
        default="warm",
        metavar="STATE",
        help="the compile cache at the start: warm (default: compiled graphs in "
        "VLLM_CACHE_ROOT) or cold (a new node: torch.compile's memory is charged in the "
        "memory profile and the KV cache is smaller)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_plan)


def _cmd_plan(args: argparse.Namespace) -> int:
    from tuner.cli.plan_text import format_plan, format_sweep
    from tuner.vllm.boot import BootState
    from tuner.vllm.gpus import get_gpu
    from tuner.vllm.log import calibration_from_log
    from tuner.vllm.memory import plan
    from tuner.vllm.models import resolve_model
    from tuner.vllm.startup_edge import SweepKnob, sweep
    from tuner.vllm.versions import VllmVersion

    params = params_from_args(args)
    boot = BootState.parse(args.boot, option="--boot")
    knob = SweepKnob.parse(args.sweep) if args.sweep else None
    version = VllmVersion.parse(args.vllm_version) if args.vllm_version else VllmVersion.current()
    gpu = get_gpu(args.gpu)
    model = resolve_model(args.model)
    calibration = calibration_from_log(args.calibrate_from) if args.calibrate_from else None
    if knob is not None:
        result = sweep(model, gpu, params, knob, version, calibration, boot=boot)
        if args.json:
            print(result.model_dump_json(indent=2))
        else:
            print(format_sweep(result))
        return 0
    result_plan = plan(model, gpu, params, version, calibration, boot=boot)
    if args.json:
        print(json.dumps(result_plan.model_dump(mode="json"), indent=2))
    else:
        print(format_plan(result_plan))
    return 0 if result_plan.fits else 1


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="tuner",
        description="Tune vLLM for the most traffic within a latency SLO, find its "
        "out-of-memory edge, and report it.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_plan_parser(sub)
    serve_cli.add_parser(sub)
    simulate_cli.add_parser(sub)
    serve.add_parser(sub)
    bench.add_parsers(sub)
    load_worker.add_parser(sub)
    tune.add_parser(sub)
    k8s.add_parser(sub)
    report.add_parser(sub)
    check.add_parser(sub)
    capacity.add_parser(sub)
    fetch.add_parser(sub)
    return parser


def _absolute_paths(args: argparse.Namespace) -> None:
    """Every path given on the command line (or by default) made absolute, here, once:
    child processes (Locust, the server) run in other working directories."""
    for name, value in vars(args).items():
        if isinstance(value, Path):
            setattr(args, name, value.absolute())


class _TerminalFormatter(logging.Formatter):
    """One plain line per record: tracebacks stay in the run's own log (and with -v)."""

    def formatException(self, ei: Any) -> str:
        return ""

    def formatStack(self, stack_info: str) -> str:
        return ""


class _NoInterruptNoise(logging.Filter):
    """Leaves out the records an interruption makes on its way out (Optuna's "trial N
    failed" pair with its traceback): the command line reports it in one line."""

    _TRIAL = re.compile(r"^Trial (\d+) failed with (?:parameters|value)")

    def __init__(self) -> None:
        super().__init__()
        self._interrupted_trials: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        match = self._TRIAL.match(record.getMessage())
        if record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt):
            if match:
                self._interrupted_trials.add(match.group(1))
            return False
        return not (match and match.group(1) in self._interrupted_trials)


def _log_to_terminal(*, verbose: bool) -> None:
    handler = logging.StreamHandler()
    handler.addFilter(_NoInterruptNoise())
    if verbose:
        # Timestamps and module names when debugging, with tracebacks.
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        # A plain line on the terminal (each run's own log file keeps the full format).
        handler.setFormatter(_TerminalFormatter("tuner: %(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, handlers=[handler])


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _absolute_paths(args)
    _log_to_terminal(verbose=args.verbose)
    try:
        with interrupts_raised(raise_interrupted):
            code: int = args.func(args)
    except TunerError as exc:
        print(f"tuner: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        interrupted = exc if isinstance(exc, Interrupted) else Interrupted(signal.SIGINT)
        print(f"tuner: {_interrupted_line(args.command, interrupted)}", file=sys.stderr)
        return interrupted.exit_code
    except OSError as exc:  # a disk, permission or descriptor failure outside what was checked
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"tuner: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    return code


# How to carry on after an interruption, by command.
_RESUME = {
    "tune": "run the same command with --resume to continue the study",
    "trial": "run the same command again to measure it again",
    "bench": "run the same command again to measure it again",
}


def _interrupted_line(command: str, exc: Interrupted) -> str:
    """One line: which signal, that nothing is left running, what was kept, how to go on."""
    parts = [f"interrupted by {exc.signal.name}", "no server or load generator left running"]
    if exc.run_dir is not None:
        parts.append(f"what was recorded is kept in {exc.run_dir}")
    if command in _RESUME and exc.run_dir is not None:
        parts.append(_RESUME[command])
    return "; ".join(parts)


if __name__ == "__main__":
    sys.exit(main())

"""The `tuner` command line: parses arguments and calls one entry point per command."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from tuner import (
    check_cmd,
    k8s_cmd,
    load_cmd,
    load_worker_cmd,
    report_cmd,
    serve_cmd,
    tune_cmd,
)
from tuner.errors import TunerError
from tuner.sim import serve_cli, simulate_cli
from tuner.vllm_flags import add_memory_flags, params_from_args

log = logging.getLogger(__name__)


class _Parser(argparse.ArgumentParser):
    """Argument errors as one line (no usage dump), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _add_plan_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
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
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_plan)


def _cmd_plan(args: argparse.Namespace) -> int:
    from tuner.gpus import get_gpu
    from tuner.memory import plan
    from tuner.models import resolve_model
    from tuner.plan_text import format_plan, format_sweep
    from tuner.startup_edge import SweepKnob, sweep
    from tuner.versions import VllmVersion
    from tuner.vllm_log import calibration_from_log

    params = params_from_args(args)
    knob = SweepKnob.parse(args.sweep) if args.sweep else None
    version = VllmVersion.parse(args.vllm_version) if args.vllm_version else VllmVersion.current()
    gpu = get_gpu(args.gpu)
    model = resolve_model(args.model)
    calibration = calibration_from_log(args.calibrate_from) if args.calibrate_from else None
    if knob is not None:
        result = sweep(model, gpu, params, knob, version, calibration)
        if args.json:
            print(result.model_dump_json(indent=2))
        else:
            print(format_sweep(result))
        return 0
    result_plan = plan(model, gpu, params, version, calibration)
    if args.json:
        print(json.dumps(result_plan.model_dump(mode="json"), indent=2))
    else:
        print(format_plan(result_plan))
    return 0 if result_plan.fits else 1


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tuner",
        description="Tune vLLM for the most traffic within a latency SLO, find its "
        "out-of-memory edge, and report it.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_plan_parser(sub)
    serve_cli.add_parser(sub)
    simulate_cli.add_parser(sub)
    serve_cmd.add_parser(sub)
    load_cmd.add_parsers(sub)
    load_worker_cmd.add_parser(sub)
    tune_cmd.add_parser(sub)
    k8s_cmd.add_parser(sub)
    report_cmd.add_parser(sub)
    check_cmd.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        # Timestamps and module names when debugging; a plain line on the terminal otherwise
        # (each run's own log file keeps the full format).
        format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        if args.verbose
        else "tuner: %(levelname)s: %(message)s",
    )
    try:
        code: int = args.func(args)
    except TunerError as exc:
        print(f"tuner: error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())

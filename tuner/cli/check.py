"""`tuner check`: the regression gate from the command line.

Exit codes: 0 when no metric regressed (or the baseline was written), 1 on a
regression, 2 for bad input (one line on stderr: a missing run or baseline, a
baseline of another model, GPU, workload or SLO).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from reports.gate_settings import DEFAULT_TOLERANCE_PCT, SUMMARY_ENV

EXIT_PASSED = 0
EXIT_REGRESSION = 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "check",
        help="compare a run's recommendation with a stored baseline; exit 1 on a regression",
        description="The regression gate: compare goodput at the SLO, p99 TTFT / ITL / e2e and "
        "peak GPU memory of a `tuner tune` run's recommendation with a baseline. A metric "
        "fails only when it is worse by more than the tolerance and by more than the "
        "run-to-run noise the confirmation repeats measured (tuner tune --repeats N). Prints "
        f"a table either way, and appends it to the GitHub job summary when ${SUMMARY_ENV} "
        "is set. Exit 0: passed; 1: regression; 2: bad input.",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a finished `tuner tune` run")
    p.add_argument("--baseline", type=Path, required=True, metavar="FILE", help="baseline JSON")
    p.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE_PCT,
        metavar="PCT",
        help=f"how much worse a metric may be, percent (default {DEFAULT_TOLERANCE_PCT:g})",
    )
    p.add_argument(
        "--update-baseline",
        action="store_true",
        help="write this run's figures as the baseline FILE (compared first when one is there)",
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=_cmd_check)


def _cmd_check(args: argparse.Namespace) -> int:
    from reports.gate import (
        Metric,
        check,
        format_markdown,
        format_table,
        load_baseline,
        load_run,
        markdown_escape,
        validate_tolerance,
        write_baseline,
    )
    from tuner.errors import ConfigError

    validate_tolerance(args.tolerance)
    run = load_run(args.run_dir)
    if args.update_baseline:
        summary: list[str] = []
        if args.baseline.exists():
            try:
                previous = check(
                    run,
                    load_baseline(args.baseline),
                    baseline_path=args.baseline,
                    tolerance_pct=args.tolerance,
                )
            except ConfigError as exc:
                print(f"replacing {args.baseline}: {exc}", file=sys.stderr)
            else:
                print(format_table(previous), file=sys.stderr)
                summary.append(format_markdown(previous))
        written = write_baseline(run, args.baseline)
        goodput = written.metrics.get(Metric.GOODPUT)
        line = (
            f"baseline written: {args.baseline} ({written.model} on {written.gpu}, workload "
            f"{written.workload}, {written.repeats} confirmation run(s)"
            + (f", goodput {goodput.value:.2f} req/s" if goodput is not None else "")
            + (", SIMULATED" if written.simulated else "")
            + ")"
        )
        if args.json:
            print(written.model_dump_json(indent=2))
        else:
            print(line)
        _job_summary("\n".join([*summary, f"**{markdown_escape(line)}**", ""]))
        return EXIT_PASSED

    result = check(
        run, load_baseline(args.baseline), baseline_path=args.baseline, tolerance_pct=args.tolerance
    )
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        print(format_table(result))
    _job_summary(format_markdown(result))
    return EXIT_PASSED if result.passed else EXIT_REGRESSION


def _job_summary(markdown: str) -> None:
    from reports.gate import write_job_summary

    try:
        write_job_summary(markdown)
    except OSError as exc:
        print(f"tuner: warning: job summary not written (${SUMMARY_ENV}): {exc}", file=sys.stderr)

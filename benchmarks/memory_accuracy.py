"""How well `tuner plan` predicts real vLLM startups: KV-cache tokens, predicted vs logged.

Reads every case in tests/fixtures/vllm_logs/index*.yaml (real startup logs from
public sources) and prints, per log, the uncalibrated prediction (specs only)
and the calibrated one (the log's own memory summary), each against the
``GPU KV cache size`` vLLM logged. Run: ``make bench`` or
``python benchmarks/memory_accuracy.py [--json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tuner.vllm.accuracy import LogOrigin, evaluate, load_cases, summary, transfer_rows

LOG_DIR = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm_logs"


def _tokens(value: int | None) -> str:
    return "n/a" if value is None else f"{value:,}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1%}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cases = [case for index in sorted(LOG_DIR.glob("index*.yaml")) for case in load_cases(index)]
    skipped = [case.file for case in cases if case.unified_memory]
    cases = [case for case in cases if not case.unified_memory]
    rows = [evaluate(case, LOG_DIR) for case in cases]
    transfers = [row for case in cases for row in transfer_rows(case, LOG_DIR)]
    stats = summary(rows)
    if args.json:
        print(
            json.dumps(
                {
                    "rows": [r.model_dump() for r in rows],
                    "transfers": [r.model_dump() | {"error": r.error} for r in transfers],
                    "summary": stats,
                },
                indent=2,
            )
        )
        return 0
    header = f"{'log':<52} {'version':>8} {'tp':>2} {'logged':>10} {'uncal.':>10} {'err':>7} {'calib.':>10} {'err':>7}"
    print(header)
    print("-" * len(header))
    for r in rows:
        mark = "*" if r.origin is LogOrigin.BUILT_FROM_FORMAT else " "
        print(
            f"{r.file[:51]:<51}{mark} {r.vllm_version:>8} {r.tp:>2} {r.logged_tokens:>10,} "
            f"{_tokens(r.predicted_tokens):>10} {_pct(r.error):>7} {r.calibrated_tokens:>10,} "
            f"{r.calibrated_error:>+7.2%}"
        )
    print()
    print("calibrated at other settings (expected: the log's KV memory moved by the budget change)")
    for t in transfers:
        mark = "*" if t.origin is LogOrigin.BUILT_FROM_FORMAT else " "
        print(
            f"{t.file[:51]:<51}{mark} {t.vllm_version[:8]:>8} {t.setting:<32} "
            f"{t.expected_tokens:>10,} {t.predicted_tokens:>10,} {t.error:>+7.2%}"
        )
    print()
    print("* built from vLLM's line format (no real log of that release found): not in the summary")
    if skipped:
        print(f"not scored (unified CPU/GPU memory): {', '.join(skipped)}")
    print(
        f"{stats['cases']} real logs ({stats['uncalibrated_cases']} with a known GPU); uncalibrated |error| median {stats['median_abs_error']:.1%}, "
        f"max {stats['max_abs_error']:.1%}; calibrated |error| median "
        f"{stats['median_abs_calibrated_error']:.2%}, max {stats['max_abs_calibrated_error']:.2%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

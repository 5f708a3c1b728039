"""`tuner report RUN_DIR`: rebuild a tune run's HTML report from what the run left on disk."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from tuner.tune_cmd import STORAGE_ENV


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="write RUN_DIR/report.html from a tune run's files (no server, no GPU)",
        description="Build the capacity-review report of a `tuner tune` run from its directory: "
        "the study, every trial's evidence, the OOM edge and the recommendation. Nothing is "
        "launched; a partial run reports what it has and says what is missing.",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run directory (runs/<study>)")
    p.add_argument(
        "--storage",
        metavar="URL",
        help="SQLAlchemy URL of a study kept outside the run directory (a study shared by "
        f"several workers); default ${STORAGE_ENV} if set, else RUN_DIR/study.db",
    )
    p.set_defaults(func=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    from reports.html import write_report

    storage = args.storage or os.environ.get(STORAGE_ENV) or None
    path = write_report(args.run_dir, storage)
    print(path)
    return 0

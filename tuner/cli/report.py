"""`tuner report RUN_DIR`: rebuild a tune run's HTML report from what the run left on disk."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

from tuner.cli.tune import STORAGE_ENV

log = logging.getLogger(__name__)


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
    """Exit 0: the report is written from the run and its study; 1: written, but without
    the study (damaged or kept elsewhere), said on stderr; 2: not written (a bad directory,
    or a --storage that cannot be read)."""
    from reports.html import write_report_noting

    storage = args.storage or os.environ.get(STORAGE_ENV) or None
    written = write_report_noting(args.run_dir, storage)
    print(written.path)
    if written.study_note is not None:
        log.warning("the report shows the run's files only: %s", written.study_note)
        return 1
    return 0

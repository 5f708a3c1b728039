"""How reliably `make tune` on the default meets its target: a series of runs, one host each.

Issue 34's target is `make tune` on the default in at most 10 minutes on the project's
2-core machine, with at least 4 measured trials and the recommendation's interval. One
run says little of "reliably": whether a level's load generator or simulated server lags
depends on what else the host runs. This script runs ``make_tune_wall.py`` once per host
named on the command line, one after another (never beside each other: each run's wall
time is the figure), and prints one row per run and how many met the target:

    .venv/bin/python benchmarks/make_tune_series.py quiet busy40@1 busy40@2 busy90@1

A host is ``quiet`` (nothing else running) or ``busy<S>@<N>`` (every core kept busy for
S seconds from trial N's first level, ``make_tune_wall.py --busy-s S --busy-trial N``).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TARGET_WALL_S = 600.0
TARGET_TRIALS = 4
HOST = re.compile(r"^(?:quiet|busy(?P<seconds>\d+(?:\.\d+)?)@(?P<trial>\d+))$")


@dataclass(frozen=True)
class Host:
    name: str
    busy_s: float
    busy_trial: int

    @classmethod
    def parse(cls, text: str) -> Host:
        match = HOST.match(text)
        if match is None:
            raise SystemExit(
                f"make_tune_series: host {text!r} is not one this script knows; "
                "use quiet or busy<seconds>@<trial>, for example busy40@1"
            )
        if match["seconds"] is None:
            return cls(text, 0.0, 1)
        return cls(text, float(match["seconds"]), int(match["trial"]))


def run_one(host: Host, run_dir: Path) -> dict[str, Any]:
    """One `make_tune_wall.py --json` run; its figures."""
    command = [sys.executable, str(HERE / "make_tune_wall.py"), "--keep", str(run_dir), "--json"]
    if host.busy_s > 0:
        command += ["--busy-s", f"{host.busy_s:g}", "--busy-trial", str(host.busy_trial)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    (run_dir.parent / f"{run_dir.name}.wall.txt").write_text(done.stdout + done.stderr)
    start = done.stdout.find("\n{")
    if start < 0:
        return {"exit": done.returncode, "error": (done.stderr or done.stdout)[-300:]}
    figures: dict[str, Any] = json.loads(done.stdout[start:])
    figures["exit"] = done.returncode
    return figures


def row(host: Host, figures: dict[str, Any]) -> tuple[str, bool]:
    if "wall_s" not in figures:
        return f"{host.name:<10} exit {figures['exit']}: {figures.get('error', '')}", False
    trials = figures["trials"]
    ran = figures["launches"]["ran"]
    rec = figures["recommendation"]
    lagged = sum(1 for t in trials if (t.get("time_scale") or 1) < max(
        (u.get("time_scale") or 1) for u in trials
    ))  # fmt: skip
    confirmed = rec.get("confirmed_goodput")
    low, high = rec.get("confirmed_interval") or rec.get("trial_interval") or (None, None)
    met = (
        figures["wall_s"] <= TARGET_WALL_S
        and len(trials) >= TARGET_TRIALS
        and rec.get("recommended", False)
        and low is not None
    )
    goodput = confirmed if confirmed is not None else rec.get("trial_goodput")
    interval = f"[{low:.2f}, {high:.2f}]" if low is not None and high is not None else "-"
    text = (
        f"{host.name:<10} {figures['wall_s']:>5.0f} s  {len(trials):>2} trials "
        f"({lagged} on a slower clock)  edge {'probed' if ran.get('oom_edge_probe') else 'no':<6}  "
        f"{'confirmed' if confirmed is not None else 'trial':<9} "
        f"{goodput if goodput is not None else float('nan'):.2f} {interval}  "
        f"{'met' if met else 'MISSED'}"
    )
    return text, bool(met)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("hosts", nargs="+", help="quiet or busy<seconds>@<trial>, one per run")
    parser.add_argument(
        "--keep", type=Path, required=True,
        help="a folder for the runs (run-<i>-<host> each, and its console)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    hosts = [Host.parse(text) for text in args.hosts]  # every name checked before any run
    args.keep.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, host in enumerate(hosts):
        figures = run_one(host, args.keep / f"run-{i}-{host.name.replace('@', '-')}")
        text, met = row(host, figures)
        print(text, flush=True)
        rows.append(met)
    print(
        f"target (<= {TARGET_WALL_S / 60:.0f} min, >= {TARGET_TRIALS} trials, an interval) "
        f"met in {sum(rows)} of {len(rows)} runs"
    )
    return 0 if all(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""How repeatable a trial's goodput is, and whether its capacity interval says so.

The same settings measured several times with different workload seeds (a different
draw of the same workload: arrivals, lengths, conversations) on the simulated engine's
virtual clock: one trial each (vLLM's defaults, or the settings ``--space`` pins), no
edge, no confirmation, ``tuner tune`` as the command runs it but with every launch a
``VirtualServer``. For each setting it prints every repeat's goodput (in the workload's
unit) and capacity interval, then:

* the spread of the goodputs, (max - min) / median (issue 34's target: <= 12%);
* the interval's half-width against its middle (target: <= 8%);
* coverage: of each repeat's interval, the share of the other repeats' capacity
  estimates (the middle of their intervals) it holds (target: >= 85%);
* what the edge draws cost: the levels measured again with another draw of the workload
  (``tuner.search.rate_search.EDGE_DRAWS``) and their emulated seconds (warm-up and
  window, from each level's ``window.json``) against the search's own.

Each repeat's levels read ``rate+`` (held) or ``rate-`` (broke), ``/k`` for draw k > 0.

Run (CPU only; about a minute a repeat for chat on an H100 profile)::

    .venv/bin/python benchmarks/repeatability.py
    .venv/bin/python benchmarks/repeatability.py --repeats 5 --space max-num-seqs=64..64
    .venv/bin/python benchmarks/repeatability.py --workload rag --gpu L40S-48GB

Each tune's output and run directory go to a temporary folder (``--keep DIR`` keeps them;
``--keep DIR --reread`` measures nothing and reports the kept runs again, their intervals
computed with the current ``capacity_interval``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tuner.run.evaluation import Evaluation
from tuner.run.layout import RunLayout, evaluation_json
from tuner.search.capacity_interval import capacity_interval
from tuner.search.rate_search import EDGE_DRAWS

try:  # the repository root is on the path (the editable install, python -m)
    from benchmarks.virtual_trial import one_trial, workload_file
except ModuleNotFoundError:  # run as a script: benchmarks/ is sys.path[0]
    from virtual_trial import one_trial, workload_file  # type: ignore[no-redef]


@dataclass(frozen=True)
class Repeat:
    seed: int
    goodput: float  # the workload's unit
    low: float | None
    high: float | None
    levels: int
    wall_s: float
    marks: str  # the levels in order: "4.26- 3.41+ 3.41+/1 ..."
    level_s: float  # emulated seconds of the search's own levels
    edge_s: float  # of the edge draws (every level from the first draw > 0 on)
    edge_levels: int

    @property
    def middle(self) -> float | None:
        if self.low is None:
            return None
        return self.low if self.high is None else (self.low + self.high) / 2


def _level_s(level_dir: str) -> float:
    """A level's emulated seconds: its warm-up and window (``window.json``), 0 without it."""
    path = Path(level_dir) / "window.json"
    if not path.exists():
        return 0.0
    window = json.loads(path.read_text())
    return float(window.get("opened_at_s") or 0.0) + float(window.get("window_s") or 0.0)


def _one(args: argparse.Namespace, seed: int, folder: Path) -> Repeat:
    began = time.monotonic()
    run_dir = folder / f"run-seed{seed}"
    if args.reread:
        evaluation = Evaluation.model_validate_json(
            evaluation_json(RunLayout(run_dir).trial_dir(0)).read_text()
        )
        counted = [lv for lv in evaluation.levels if not lv.unmeasurable]
        interval = capacity_interval(counted, evaluation.best) if counted else None
    else:
        evaluation = one_trial(
            model=args.model,
            gpu=args.gpu,
            workload=workload_file(args.workload, seed, folder),
            run_dir=run_dir,
            edge_draws=args.edge_draws,
            max_levels=args.max_levels,
            level_duration_s=args.level_duration,
            space=args.space or [],
        )
        interval = evaluation.capacity_interval
    first_edge = next(
        (i for i, lv in enumerate(evaluation.levels) if lv.draw > 0), len(evaluation.levels)
    )
    marks = " ".join(
        f"{lv.rate_per_s:.2f}{'+' if lv.met else '-'}" + (f"/{lv.draw}" if lv.draw else "")
        for lv in evaluation.levels
    )
    return Repeat(
        seed=seed,
        goodput=evaluation.stated_goodput.arrival_rate_per_s,
        low=interval.low_per_s if interval else None,
        high=interval.high_per_s if interval else None,
        levels=len(evaluation.levels),
        wall_s=time.monotonic() - began,
        marks=marks,
        level_s=sum(_level_s(lv.dir) for lv in evaluation.levels[:first_edge]),
        edge_s=sum(_level_s(lv.dir) for lv in evaluation.levels[first_edge:]),
        edge_levels=len(evaluation.levels) - first_edge,
    )


def _report(repeats: list[Repeat]) -> None:
    for r in repeats:
        high = f"{r.high:.3f}" if r.high is not None else "-"
        low = f"{r.low:.3f}" if r.low is not None else "-"
        print(
            f"  seed {r.seed:>3}: goodput {r.goodput:7.3f}  capacity 90% in [{low}, {high}]"
            f"  {r.levels} levels  {r.wall_s:5.1f} s"
        )
        print(f"      {r.marks}")
        print(f"      level-seconds: search {r.level_s:.0f}, edge draws {r.edge_s:.0f} "
              f"({r.edge_levels} levels)")  # fmt: skip
    goodputs = [r.goodput for r in repeats]
    median = statistics.median(goodputs)
    spread = (max(goodputs) - min(goodputs)) / median if median > 0 else float("nan")
    widths = [
        (r.high - r.low) / 2 / r.middle
        for r in repeats
        if r.low is not None and r.high is not None and r.middle
    ]
    held = total = 0
    for r in repeats:
        if r.low is None:
            continue
        for other in repeats:
            if other is r or other.middle is None:
                continue
            total += 1
            held += r.low <= other.middle and (r.high is None or other.middle <= r.high)
    print(f"  goodput spread (max - min) / median: {spread:.1%}  (target <= 12%)")
    if widths:
        print(
            f"  interval half-width / middle: median {statistics.median(widths):.1%}, "
            f"max {max(widths):.1%}  (target <= 8%)"
        )
    edge = [r.edge_s for r in repeats]
    print(
        f"  edge draws: {statistics.mean(r.edge_levels for r in repeats):.1f} levels and "
        f"{statistics.mean(edge):.0f} emulated s a trial on average (max {max(edge):.0f}), "
        f"against {statistics.mean(r.level_s for r in repeats):.0f} s of the search's own"
    )
    if total:
        print(f"  coverage of the other repeats' estimates: {held}/{total} = {held / total:.0%}"
              "  (target >= 85%)")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--gpu", default="H100-80GB")
    parser.add_argument("--workload", default="chat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--max-levels", type=int, default=4)
    parser.add_argument(
        "--level-duration",
        type=float,
        help="every level's window fixed at this many emulated seconds (default: sized for "
        "the SLO's percentiles, as a tune sizes it)",
    )
    parser.add_argument(
        "--edge-draws",
        type=int,
        default=EDGE_DRAWS,
        help=f"draws each trial's bracket ends are measured with (default {EDGE_DRAWS}: as "
        "the recommendation's confirmation measures the capacity it states where they fit; "
        "a tune's trials: 1)",
    )
    parser.add_argument(
        "--space", action="append", help="pin a knob (repeatable), e.g. max-num-seqs=64..64"
    )
    parser.add_argument("--keep", type=Path, help="keep the runs in this folder")
    parser.add_argument(
        "--reread",
        action="store_true",
        help="measure nothing: read the runs --keep kept, their intervals computed again",
    )
    args = parser.parse_args()
    if args.reread and args.keep is None:
        parser.error("--reread reads the runs --keep DIR kept")
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        what = ", ".join(args.space) if args.space else "vLLM's defaults"
        print(f"{args.model} on {args.gpu}, {args.workload}, {what}, {args.repeats} seeds:")
        repeats = [
            _one(args, seed, folder)
            for seed in range(args.first_seed, args.first_seed + args.repeats)
        ]
        _report(repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How well a several-draw capacity interval holds another trial's estimate, on simulated
trials (no engine): the estimator of ``tuner.search.edge_posterior`` alone.

Each simulated trial has ``--draws`` draws whose edges (log rate) are normal about one
capacity with spread ``tau``. Draw 0 brackets its edge on a grid of ``--step-min`` to
``--step-max`` (a rate search's last step), placed at random; the other draws are
measured at that bracket's two ends, and where one breaks the lower end the bracket
steps down (one middle, up to two steps of two grid steps), every draw measured there:
as ``tuner.search.rate_search.next_edge_draw`` measures the edge draws, each level held
or broken outright (a window's P(hold) is 0 or 1 in 176 of 183 levels of the
repeatability runs). For each ``tau`` it prints, over ``--rounds`` groups of
``--repeats`` trials (as ``benchmarks/repeatability.py`` groups its seeds):

* the interval's half-width against its middle, median (issue 34's target: <= 8%);
* coverage: of each trial's interval, the share of the other trials' estimates (the
  middle of their intervals) it holds (target: >= 85%), mean and lowest group;
* the goodput's spread, (max - min) / median, median and highest group (target: <= 12%).

Run (a few seconds a line)::

    .venv/bin/python benchmarks/interval_calibration.py
    .venv/bin/python benchmarks/interval_calibration.py --draws 2 --tau 0.03 --tau 0.06
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys

from tuner.run.evaluation import LevelRecord
from tuner.search.edge_posterior import edge_posterior
from workloads.load_result import LoadResult

_EMPTY = LoadResult.from_records([])


def _level(log_rate: float, held: bool, draw: int) -> LevelRecord:
    return LevelRecord(
        rate_per_s=math.exp(log_rate), met=held, stopped_early=False, dir="level",
        load=_EMPTY, violations=[], num_preemptions=None, max_kv_cache_usage=None,
        prefix_cache_hit_rate=None, hold_share=None, draw=draw,
    )  # fmt: skip


def simulated_trial(
    rng: random.Random, tau: float, draws: int, step: float
) -> tuple[float, list[LevelRecord]]:
    """One trial's goodput (log rate, the highest held by every draw) and its levels."""
    edges = [rng.gauss(0.0, tau) for _ in range(draws)]
    low = edges[0] - rng.uniform(0.0, step)
    measured: dict[float, list[bool]] = {
        low: [e > low for e in edges],
        low + step: [edges[0] > low + step, *(e > low + step for e in edges[1:])],
    }
    for _ in range(3):  # the bracket moved down: a step down or a middle, every draw
        held = [r for r, outcome in measured.items() if all(outcome)]
        broke = [r for r, outcome in measured.items() if not all(outcome)]
        if not held:
            rate = min(broke) - 2 * step
        elif max(held) == low:
            break
        else:
            above = min(r for r in broke if r > max(held))
            if above - max(held) <= step:
                break
            rate = (max(held) + above) / 2
        measured[rate] = [e > rate for e in edges]
    levels = [
        _level(rate, outcome[d], d) for rate, outcome in measured.items() for d in range(draws)
    ]
    held = [r for r, outcome in measured.items() if all(outcome)]
    return (max(held) if held else min(measured) - step), levels


def calibrate(
    tau: float, draws: int, repeats: int, rounds: int, steps: tuple[float, float], seed: int
) -> tuple[float, float, float, float, float]:
    """(median half-width, mean and lowest coverage, median and highest goodput spread)."""
    rng = random.Random(seed)
    halves: list[float] = []
    coverages: list[float] = []
    spreads: list[float] = []
    for _ in range(rounds):
        intervals: list[tuple[float, float]] = []
        goodputs: list[float] = []
        for _ in range(repeats):
            goodput, levels = simulated_trial(rng, tau, draws, rng.uniform(*steps))
            posterior = edge_posterior(levels)
            assert posterior is not None
            intervals.append((posterior.quantile_per_s(0.05), posterior.quantile_per_s(0.95)))
            goodputs.append(math.exp(goodput))
        middles = [(lo + hi) / 2 for lo, hi in intervals]
        halves += [(hi - lo) / 2 / m for (lo, hi), m in zip(intervals, middles, strict=True)]
        held = [
            lo <= middles[j] <= hi
            for i, (lo, hi) in enumerate(intervals)
            for j in range(repeats)
            if i != j
        ]
        coverages.append(sum(held) / len(held))
        spreads.append((max(goodputs) - min(goodputs)) / statistics.median(goodputs))
    return (
        statistics.median(halves), statistics.mean(coverages), min(coverages),
        statistics.median(spreads), max(spreads),
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--draws", type=int, action="append", help="draws a trial (default 2, 3, 4)"
    )
    parser.add_argument(
        "--tau", type=float, action="append", help="log-rate spread (default 0.03, 0.045, 0.06)"
    )
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--step-min", type=float, default=math.log(1.05))
    parser.add_argument("--step-max", type=float, default=math.log(1.10))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for draws in args.draws or [2, 3, 4]:
        for tau in args.tau or [0.03, 0.045, 0.06]:
            half, cover, lowest, spread, widest = calibrate(
                tau, draws, args.repeats, args.rounds, (args.step_min, args.step_max), args.seed
            )
            print(
                f"{draws} draws, tau {tau:.1%}: half-width {half:.1%} (<= 8%), coverage "
                f"{cover:.0%} (lowest {lowest:.0%}; >= 85%), goodput spread {spread:.1%} "
                f"(highest {widest:.1%}; <= 12%)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Turn mix of a multi-turn level: does an 8-second window hold what a server sees?

Issue 16: a level that opens on an empty server holds only first turns of the built-in
``chat`` workload (its conversations last about a minute). This builds the level's
schedule (``tuner.serving.level_schedule.level_workload``'s spec) both ways, ``sessions.start:
empty`` and ``stationary``, over several seeds, and prints the share of later turns in
the window and Pearson's chi-square goodness of fit of its turn counts to the
stationary mix ``P(N > k) / E[N]`` (``workloads.stationary.turn_mix``).

    .venv/bin/python benchmarks/turn_mix.py [--rate 30] [--window 8] [--seeds 10]
"""

from __future__ import annotations

import argparse
import statistics
import time

from tuner.serving.level_schedule import level_workload
from workloads.build import build_schedule
from workloads.spec import SessionStart, load_workload
from workloads.stationary import turn_mix


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="chat")
    parser.add_argument("--rate", type=float, default=30.0, help="conversations/s")
    parser.add_argument("--window", type=float, default=8.0, help="level window, s")
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()

    level = level_workload(load_workload(args.workload), args.rate, args.window)
    assert level.sessions is not None, "the workload has no sessions"
    print(f"{args.workload} at {args.rate:g} conversations/s, {args.window:g} s window")
    for start in (SessionStart.EMPTY, SessionStart.STATIONARY):
        sessions = level.sessions.model_copy(update={"start": start})
        mixes, build_s = [], []
        for seed in range(args.seeds):
            spec = level.model_copy(update={"sessions": sessions, "seed": seed})
            began = time.perf_counter()
            schedule = build_schedule(spec)
            build_s.append(time.perf_counter() - began)
            mixes.append(turn_mix(schedule, sessions))
        first = mixes[0]
        p_values = [m.p_value for m in mixes if m.p_value is not None]
        print(f"\nstart: {start.value}  (seed 0, then over {args.seeds} seeds)")
        print(
            f"  requests in window     {first.requests}  (mean {statistics.mean(m.requests for m in mixes):.0f})"
        )
        print(
            f"  later-turn share       {first.later_turn_share:.3f}  (mean "
            f"{statistics.mean(m.later_turn_share for m in mixes):.3f}; stationary "
            f"{first.stationary_later_turn_share:.3f})"
        )
        print("  turn shares            " + " ".join(f"{s:.3f}" for s in first.shares))
        print("  stationary shares      " + " ".join(f"{s:.3f}" for s in first.stationary_shares))
        print(
            f"  chi-square (dof {first.dof})      {first.chi_square:.1f}, p = {first.p_value:.3g}; "
            f"seeds with p < 0.01: {sum(p < 0.01 for p in p_values)}/{len(p_values)}"
        )
        print(f"  schedule build         {statistics.median(build_s):.2f} s (median)")


if __name__ == "__main__":
    main()

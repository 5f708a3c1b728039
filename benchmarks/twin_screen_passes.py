"""How long the twin's first pick waits for its screen: the first pass against the whole.

The twin screens the whole space before its first pick (``tuner.twin.landscape``), in
two worker processes beside trial 0. The pick's candidates are one setting per group of
settings that differ only in utilization (``candidates``), so the screen runs in two
passes (``ScreenRun``): each group's lowest and highest utilization first (and those
between where the two agree), then the middles where they disagree, and the first pick
is made from the first pass where the rest is still under way. This script screens the
default tune's space (``make tune``: llama-3.1-8b, ``chat``, the H100 profile, 504
settings) with the tune's two workers, nothing else running, and prints when each pass
was done, what each holds, and the six candidates each would hand the pick.

Run: ``.venv/bin/python benchmarks/twin_screen_passes.py`` (about 1.5 minutes; nothing
else running: the seconds are the figure).

Measured 2026-12-06 on the 2-core development VM (``10167f9``), nothing else running:
the first pass 37.5 s (296 settings, 56 computed), the whole 71.8 s (504, 112 computed;
72.5 s on ``5cce208``, one pass). The candidates agree on the groups and the rates
(fp8 KV at 512 and 1024 sequences, 9.74/s); the first pass offers 0.97 for the
1024-sequence groups, the whole 0.88 (the same rate at less memory). In a tune the
screen shares the CPU with trial 0: 197 to 236 s for the whole in the series of
``benchmarks/make_tune_wall.md``.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from tuner.run.config import TuneConfig
from tuner.search.context import resolve
from tuner.sim.timing import TimingFactors
from tuner.twin.landscape import Landscape, ScreenRun, candidates
from tuner.twin.screen import RERANK, SCREEN_JOBS, screen_job

BASE_RATE = 5.5  # the screen's base rate: the defaults' prediction (conversations/s)


def _candidates(landscape: Landscape) -> str:
    return "; ".join(
        f"{p.params.short()} {p.rate_per_s:.2f}/s" for p in candidates(landscape, [], count=RERANK)
    )


def main() -> int:
    with tempfile.TemporaryDirectory() as run_dir:
        ctx = resolve(
            TuneConfig(model="llama-3.1-8b", workload="chat", run_dir=Path(run_dir), dry_run=True)
        )
        job = screen_job(ctx, TimingFactors(), BASE_RATE)
        assert job is not None
        began = time.monotonic()
        run = ScreenRun(job, ctx.space, jobs=SCREEN_JOBS)
        try:
            first = run.first()
            first_s = time.monotonic() - began
            whole = run.result()
            whole_s = time.monotonic() - began
        finally:
            run.stop()
    print(
        f"first pass  {first_s:6.1f} s  {len(first.points):>3} settings, {first.computed} computed"
    )
    print(
        f"whole       {whole_s:6.1f} s  {len(whole.points):>3} settings, {whole.computed} computed"
    )
    print(f"candidates from the first pass: {_candidates(first)}")
    print(f"candidates from the whole:      {_candidates(whole)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

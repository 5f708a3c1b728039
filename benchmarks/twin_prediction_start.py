"""What a trial's twin prediction costs, from the rate its screen held or by doubling.

Before each trial the twin predicts the rate its settings sustain over a level's warm-up
and window (``tuner.search.study.trial_twin.TrialTwin.prediction``, a bracket of
``steady_run`` simulations to 5 %). A twin's pick was screened with the same step costs
just before (``twin_rate_per_s``: the highest of its screen's rungs that held), so its
prediction starts there and moves a rung first (``NEAR_FIRST_STEP``); without it, the
bracket starts from the best goodput so far and doubles. This script takes twelve
settings of the default tune's space (``make tune``: llama-3.1-8b, ``chat``, the H100
profile; utilization 0.9 and 0.97, 64 to 512 sequences, auto and fp8 KV), screens each
as the twin does (``screen_setting``, the paper's step costs), and predicts each both
ways, on one core. It prints per setting the screened rate and, each way, the predicted
rate, its simulations and its seconds, then the totals.

Run: ``.venv/bin/python benchmarks/twin_prediction_start.py`` (about 4 minutes; nothing
else running: the seconds are the figure).

Measured 2026-12-06 on the 2-core development VM (`a6dfe53`), nothing else running:

====================================  ================  ================
settings                              by doubling       from the screen
====================================  ================  ================
all twelve                            72 runs, 94.5 s   56 runs, 73.6 s
fp8 at 256 and 512 sequences (picks)  24 runs, 44.3 s   16 runs, 31.9 s
====================================  ================  ================

A second run gave the same rates and simulations in 99.6 s and 78.0 s (the VM's speed
drifts from one minute to the next).

Where the rate lies within the rung above the screen's (seven of the twelve), three runs
against six; where it lies further (the 64-sequence ones and fp8 at 0.9 and 512: their
screen, on a shorter window, held a rung or more lower), seven. The rate each way differs
by up to 15 % (5.77 and 6.78 for util 0.97 at 256 sequences, auto): near capacity the
twin's steady run is bistable, and the answer times a run is planned with decide which
side it lands on.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from pathlib import Path
from typing import Any

import tuner.twin.prediction as prediction
from tuner.run.config import TuneConfig
from tuner.search.context import resolve
from tuner.search.study.trial_twin import NEAR_FIRST_STEP
from tuner.serving.level_schedule import plan_level_schedule
from tuner.sim.build import offloading_options
from tuner.sim.timing import TimingFactors
from tuner.twin.landscape import screen_setting
from tuner.twin.prediction import Setup, sustained_rate
from tuner.twin.screen import screen_job
from tuner.vllm.space import TrialParams
from workloads.spec import WorkloadSpec

BEST_GOODPUT = 5.7  # vLLM's defaults' goodput on the default tune (conversations/s)
BASE_RATE = 5.5  # the screen's base rate: the defaults' prediction
STEADY_RUN = prediction.steady_run


RUNS: list[float] = []  # the rate of each steady run simulated


def _counted(
    setup: Setup, spec: WorkloadSpec, rate_per_s: float | None, **kwargs: Any
) -> prediction.Prediction:
    RUNS.append(rate_per_s or 0.0)
    return STEADY_RUN(setup, spec, rate_per_s, **kwargs)


def main() -> int:
    prediction.steady_run = _counted  # sustained_rate's runs, counted
    with tempfile.TemporaryDirectory() as run_dir:
        ctx = resolve(
            TuneConfig(model="llama-3.1-8b", workload="chat", run_dir=Path(run_dir), dry_run=True)
        )
        assert ctx.twin is not None
        device, base = ctx.twin
        spec = ctx.workload
        rate = spec.mean_rate_per_s
        _, plan, _ = plan_level_schedule(
            spec, rate, window_s=ctx.config.level_duration_s, warmup_s=ctx.config.level_warmup_s
        )
        job = screen_job(ctx, TimingFactors(), BASE_RATE)
        assert job is not None

        def predict(
            params: TrialParams, start: float, first_step: float | None
        ) -> tuple[float, int, float]:
            setup = Setup(
                ctx.model, device, ctx.version, params.serving(base),
                options=offloading_options(params), timing=TimingFactors(),
            )  # fmt: skip
            before = len(RUNS)
            began = time.perf_counter()
            best = sustained_rate(
                setup, spec, warmup_s=plan.warmup_max_s, window_s=plan.window_s,
                start_rate_per_s=start, precision=0.05, max_runs=10, first_step=first_step,
            ).rate_per_s  # fmt: skip
            runs = len(RUNS) - before
            return best, runs, time.perf_counter() - began

        print(f"{'setting':<36} {'screen':>7}  {'by doubling':>22}  {'from the screen':>22}")
        totals = [0, 0.0, 0, 0.0]
        for util, seqs, kv in itertools.product((0.9, 0.97), (64, 256, 512), ("auto", "fp8")):
            params = TrialParams(
                gpu_memory_utilization=util, max_num_seqs=seqs, block_size=16, kv_cache_dtype=kv
            )
            screened = screen_setting(job, params, 0).rate_per_s
            far = predict(params, BEST_GOODPUT, None)
            near = predict(params, screened, NEAR_FIRST_STEP)
            totals = [
                totals[0] + far[1],
                totals[1] + far[2],
                totals[2] + near[1],
                totals[3] + near[2],
            ]
            print(
                f"{params.short():<36} {screened:>7.2f}  "
                f"{far[0]:>6.2f} {far[1]:>3} runs {far[2]:>5.1f} s  "
                f"{near[0]:>6.2f} {near[1]:>3} runs {near[2]:>5.1f} s",
                flush=True,
            )
        print(
            f"{'total':<36} {'':>7}  {'':>6} {totals[0]:>3} runs {totals[1]:>5.1f} s  "
            f"{'':>6} {totals[2]:>3} runs {totals[3]:>5.1f} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

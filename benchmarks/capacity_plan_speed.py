"""How long `tuner capacity` takes: a plan over 6 GPU types x 4 tensor-parallel sizes for
an 8B and a 70B model, on one core (issue 19's target: at most 60 s each).

The process pins itself to one CPU (``os.sched_setaffinity``) and plans with the twin's
paper step costs (no ``--from``), as ``tuner capacity --model M --peak P`` does with its
default GPU types and sizes; each plan's wall time, twin runs and chosen option are
printed (its goodput per replica, in the workload's unit). ``--workload`` and ``--peak``
as the command takes them.

    python benchmarks/capacity_plan_speed.py [--workload chat] [--peak 50]
"""

from __future__ import annotations

import argparse
import os
import time

from tuner.capacity.option import OptionSpace
from tuner.capacity.plan import make_plan
from tuner.cli.capacity import DEFAULT_GPUS, DEFAULT_TENSOR_PARALLEL
from tuner.search.context import workload_context
from tuner.vllm.gpus import get_gpu
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion
from workloads.spec import load_workload

TARGET_S = 60.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="chat")
    parser.add_argument("--peak", type=float, default=50.0)
    parser.add_argument("--models", default="llama-3.1-8b,llama-3.1-70b")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    workload = load_workload(args.workload)
    gpus = [get_gpu(g) for g in DEFAULT_GPUS.split(",")]
    sizes = [int(s) for s in DEFAULT_TENSOR_PARALLEL.split(",")]
    print(f"{len(gpus)} GPU types x {len(sizes)} tensor-parallel sizes, workload "
          f"{workload.name}, peak {args.peak:g}, on {cores} core(s)")  # fmt: skip
    failed = False
    for name in args.models.split(","):
        model = resolve_model(name)
        space = OptionSpace(
            model=model, version=VllmVersion.current(), workload=workload, max_model_len=None,
            workload_context=workload_context(model, workload)[1], safety_margin=0.02,
        )  # fmt: skip
        began = time.monotonic()
        plan = make_plan(
            space=space, gpus=gpus, tensor_parallel_sizes=sizes, peak=args.peak,
            headroom=0.2, prices={}, runs=[],
        )  # fmt: skip
        wall = time.monotonic() - began
        serving = sum(1 for o in plan.options if o.replica is not None)
        chosen = plan.chosen
        verdict = "PASS" if wall <= TARGET_S else "FAIL"
        failed |= wall > TARGET_S
        print(
            f"{name:<16} {wall:6.1f} s ({verdict}, target {TARGET_S:.0f} s)  "
            f"{len(plan.options)} options, {serving} serve, {plan.twin_runs} twin runs; chosen "
            + (
                f"{chosen.fleet_low.replicas} x {chosen.label} "
                f"({chosen.params.kv_cache_dtype if chosen.params else '?'} KV cache, "
                f"{chosen.replica.goodput.arrival_rate_per_s:.2f} per replica)"
                if chosen and chosen.fleet_low and chosen.replica
                else "none"
            )
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

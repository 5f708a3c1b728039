"""How long a `chat` server holds a rate after a step up from its steady state.

A chained level (``tuner tune --chain-levels``) opens on the server's state at the rate
before it; a fresh one on an empty server with a cold prefix cache. Near capacity a
chat server is bistable, so what matters is how long the healthy state lasts after a
step. On the simulated engine's virtual clock (llama-3.1-8b on an H100-80GB, vLLM's
defaults) this runs ``chat`` at a low rate for ``--settle`` virtual seconds, then steps
to each rate by superposition (a Poisson population at r2 is one at r1 plus one at
r2 - r1: the second opens on its own stationary population at the step), and prints,
minute by minute, the peak KV-cache usage and waiting queue, and when the queue first
passed ``--queue`` requests (the tip), if it did within ``--minutes``.

Run (CPU only, about a minute per rate)::

    .venv/bin/python benchmarks/chained_step.py
    .venv/bin/python benchmarks/chained_step.py --rates 5.5,5.75,6.02,6.32 --from-rate 4
"""

from __future__ import annotations

import argparse
import dataclasses

from tuner.serving.level_schedule import level_workload
from tuner.twin.prediction import Setup, answer_times_of, simulate_schedule, steady_run
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion
from workloads.build import build_schedule
from workloads.schedule import ScheduledRequest
from workloads.spec import load_workload


def renamed(
    schedule: list[ScheduledRequest], prefix: str, shift_s: float
) -> list[ScheduledRequest]:
    return [
        dataclasses.replace(
            r,
            request_id=prefix + r.request_id,
            session_id=prefix + str(r.session_id),
            follows=None if r.follows is None else prefix + r.follows,
            send_s=r.send_s + shift_s,
        )
        for r in schedule
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rates", default="5.5,5.75,6.02,6.32", help="conversations/s after the step"
    )
    parser.add_argument("--from-rate", type=float, default=4.0)
    parser.add_argument("--settle", type=float, default=120.0, help="virtual s before the step")
    parser.add_argument("--minutes", type=float, default=10.0, help="virtual minutes after it")
    parser.add_argument("--queue", type=int, default=20, help="a waiting queue past this tipped")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    setup = Setup(
        resolve_model("llama-3.1-8b"), get_gpu("H100-80GB"), VllmVersion.current(), ServingParams()
    )
    spec = load_workload("chat").model_copy(update={"seed": args.seed})
    # The population is planned with the answer times of a rate that holds (as the live
    # search plans its levels' populations from the nearest level that held).
    times = answer_times_of(
        steady_run(setup, spec, args.from_rate, warmup_s=60, window_s=60).result
    )
    end_s = args.settle + 60.0 * args.minutes
    for rate in (float(r) for r in args.rates.split(",")):
        low = build_schedule(level_workload(spec, args.from_rate, end_s, times))
        extra_spec = spec.model_copy(update={"seed": args.seed + 100})
        extra = build_schedule(
            level_workload(extra_spec, rate - args.from_rate, end_s - args.settle, times)
        )
        schedule = sorted(low + renamed(extra, "B", args.settle), key=lambda r: r.send_s)
        _, result = simulate_schedule(
            setup, schedule, spec.slo, stop_at_s=end_s,
            measure_from_s=args.settle, measure_to_s=end_s, sample_every_s=1.0,
        )  # fmt: skip
        assert result is not None
        tipped = next(
            (s.t_s for s in result.samples if s.t_s >= args.settle and s.waiting > args.queue), None
        )
        minutes: dict[int, tuple[float, int]] = {}
        for s in result.samples:
            m = int((s.t_s - args.settle) // 60)
            kv, waiting = minutes.get(m, (0.0, 0))
            minutes[m] = (max(kv, s.kv_usage), max(waiting, s.waiting))
        when = f"tipped {(tipped - args.settle) / 60:.1f} min after the step" if tipped else "held"
        print(f"{args.from_rate:g} -> {rate:g} conversations/s: {when}; p99 TTFT after the step "
              f"{result.ttft_ms.p99:,.0f} ms")  # fmt: skip
        print("   minute: (peak KV usage, peak waiting) " + " ".join(
            f"{m}:({kv:.2f},{w})" for m, (kv, w) in sorted(minutes.items()) if m >= -2
        ))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

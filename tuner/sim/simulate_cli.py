"""`tuner simulate`: run a workload through the simulated engine on a virtual clock."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError, TraceReadError
from tuner.run.layout import RunLayout
from tuner.sim import flag_values as check
from tuner.sim.timing import TimingFactors
from tuner.vllm.flags import add_memory_flags, params_from_args

POISSON_DURATION_S = 60.0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="run a workload through the simulated vLLM engine on a virtual clock",
        description="Simulate vLLM serving a workload (a trace, a workload spec, or Poisson "
        "arrivals) on a "
        "virtual GPU, as fast as the CPU allows, and print the metrics a load test would.",
    )
    p.add_argument(
        "--model", required=True, help="preset name, Hugging Face id, or model directory"
    )
    p.add_argument("--gpu", default="H100-80GB", help="GPU profile (default H100-80GB)")
    add_memory_flags(p)
    p.add_argument("--swap-space", type=float, default=0.0, help="GiB of host swap (vLLM < 0.18)")
    p.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false")
    p.add_argument(
        "--prefix-cache-eviction",
        default="lru",
        help="lru and arc as vLLM runs them (the GPU prefix cache is LRU; with "
        "--kv-offloading-size the CPU tier evicts by lru or arc); lfu, fifo and tiered are "
        "what-ifs for the GPU prefix cache, not in vLLM",
    )
    p.add_argument(
        "--kv-offloading-size",
        type=float,
        default=0.0,
        metavar="GIB",
        help="vLLM's KV offloading to CPU memory, GiB (default 0: off; vLLM >= 0.11.1)",
    )
    p.add_argument("--compare-eviction", action="store_true", help="run once per eviction policy")
    p.add_argument(
        "--twin-from",
        type=Path,
        metavar="RUN_DIR",
        help="the step costs a tune fitted to what it measured (its twin.json) instead of the "
        "paper's",
    )
    source = p.add_argument_group("workload")
    source.add_argument(
        "--trace",
        help="Azure CSV, Mooncake, Qwen-Bailian or own JSONL trace file, or builtin:azure-code",
    )
    source.add_argument(
        "--workload",
        help="a built-in workload (agent, chat, code, rag, mixed-long-short) or a YAML file: "
        "its arrivals, sessions (think times on the virtual clock) and SLO",
    )
    source.add_argument(
        "--rate",
        type=float,
        help="requests/s: Poisson, or the trace scaled so that, looped, it averages this; "
        "with --workload its arrivals (sessions/s where it has sessions)",
    )
    source.add_argument(
        "--duration",
        type=float,
        help=f"seconds of arrivals (default {POISSON_DURATION_S:g} for Poisson; a trace: "
        "one pass of it, or as long as --max-requests takes)",
    )
    source.add_argument("--prompt-tokens", type=int, default=512)
    source.add_argument("--output-tokens", type=int, default=128)
    source.add_argument("--shared-prefix-tokens", type=int, default=0)
    source.add_argument("--shared-fraction", type=float, default=0.0)
    source.add_argument(
        "--max-requests", type=int, help="at most the first N requests of the replay"
    )
    p.add_argument(
        "--slo-ttft-ms", type=float, help="p99 TTFT limit (default 2000; --workload: its own)"
    )
    p.add_argument(
        "--slo-tpot-ms", type=float, help="p99 TPOT limit (default 100; --workload: its own)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_simulate)


def _check_values(args: argparse.Namespace) -> None:
    """Every number of the command, before anything runs (ConfigError naming the first bad one)."""
    check.positive_number("--rate", args.rate)
    check.positive_number("--duration", args.duration)
    check.integer_at_least("--max-requests", args.max_requests, 1)
    check.integer_at_least("--prompt-tokens", args.prompt_tokens, 1)
    check.integer_at_least("--output-tokens", args.output_tokens, 1)
    check.integer_at_least("--shared-prefix-tokens", args.shared_prefix_tokens, 0)
    if args.shared_prefix_tokens > args.prompt_tokens:
        raise ConfigError(
            f"--shared-prefix-tokens {args.shared_prefix_tokens} is more than --prompt-tokens "
            f"{args.prompt_tokens}; accepted: 0 to --prompt-tokens"
        )
    check.fraction("--shared-fraction", args.shared_fraction)
    check.positive_number("--slo-ttft-ms", args.slo_ttft_ms)
    check.positive_number("--slo-tpot-ms", args.slo_tpot_ms)
    check.non_negative_number("--swap-space", args.swap_space)
    check.non_negative_number("--cpu-offload-gb", args.cpu_offload_gb)
    check.non_negative_number("--kv-offloading-size", args.kv_offloading_size)
    check.integer_at_least("--seed", args.seed, 0)
    if args.trace is not None and args.workload is not None:
        raise ConfigError("give --trace FILE or --workload NAME, not both")
    if args.trace is None and args.workload is None and args.rate is None:
        raise ConfigError(
            "give --trace FILE, --workload NAME, or --rate R (> 0 requests/s) for Poisson arrivals"
        )
    if args.trace is None and args.max_requests is not None:
        raise ConfigError("--max-requests cuts a trace replay; give --trace FILE with it")


def _cmd_simulate(args: argparse.Namespace) -> int:
    from tuner.sim.build import build_engine
    from tuner.sim.eviction import eviction_choices
    from tuner.sim.simulate import run, synthetic_arrivals
    from tuner.sim.simulate_text import format_cpu_tier, format_result
    from tuner.sim.simulate_workload import (
        WorkloadRun,
        load_for_simulation,
        plan_workload_run,
        simulation_slo,
    )
    from tuner.vllm.gpus import get_gpu
    from tuner.vllm.models import resolve_model
    from tuner.vllm.versions import VllmVersion
    from workloads.arrivals import replay_trace
    from workloads.slo import Slo
    from workloads.traces import TraceError, load_trace, resolve_trace

    _check_values(args)
    factors = twin_factors(args.twin_from) if args.twin_from is not None else None
    params = params_from_args(args)
    version = VllmVersion.parse(args.vllm_version) if args.vllm_version else VllmVersion.current()
    evictions = eviction_choices(args.prefix_cache_eviction, args.kv_offloading_size, version)
    gpu = get_gpu(args.gpu)
    model = resolve_model(args.model)
    planned: WorkloadRun | None = None
    if args.workload is not None:
        spec = load_for_simulation(args.workload, rate_per_s=args.rate, duration_s=args.duration)
        planned = plan_workload_run(spec, vocab=model.vocab_size)
        records = planned.records
    elif args.trace is not None:
        try:
            trace = load_trace(resolve_trace(str(args.trace)))
        except TraceError as exc:
            raise TraceReadError(str(exc)) from exc
        # The one rule of every replay (bench, trial and tune too): scale, then cut.
        records = replay_trace(
            trace, rate_per_s=args.rate, duration_s=args.duration, max_requests=args.max_requests
        )
    else:
        records = synthetic_arrivals(
            rate_per_s=args.rate,
            duration_s=POISSON_DURATION_S if args.duration is None else args.duration,
            prompt_tokens=args.prompt_tokens,
            output_tokens=args.output_tokens,
            shared_prefix_tokens=args.shared_prefix_tokens,
            shared_fraction=args.shared_fraction,
            seed=args.seed,
        )
    chosen = evictions if args.compare_eviction else evictions[:1]
    if planned is not None:
        slo = simulation_slo(planned.spec, args.slo_ttft_ms, args.slo_tpot_ms)
    else:
        slo = Slo.p99(
            ttft_ms=2000.0 if args.slo_ttft_ms is None else args.slo_ttft_ms,
            tpot_ms=100.0 if args.slo_tpot_ms is None else args.slo_tpot_ms,
        )
    results = {}
    tiers = {}
    for eviction in chosen:
        options = eviction.options(
            enable_prefix_caching=args.enable_prefix_caching,
            swap_space_gib=args.swap_space,
            kv_offloading_size_gib=args.kv_offloading_size,
            seed=args.seed,
        )
        startup, engine = build_engine(model, gpu, params, version, options, factors)
        if engine is None:
            assert startup.failure is not None
            raise ConfigError(
                f"vLLM would not start with these settings: {startup.failure.error_type}: "
                f"{startup.failure.message}"
            )
        policy = eviction.name
        tiers[policy] = engine.cpu_tier
        if planned is not None:
            results[policy] = run(
                engine, records, slo=slo, vocab=model.vocab_size, seed=args.seed,
                max_model_len=startup.max_model_len, prompt_token_ids=planned.prompt_token_ids,
                follows=planned.follows, think_s=planned.think_s,
                measure_from_s=planned.measure_from_s, measure_to_s=planned.measure_to_s,
                stop_at_s=planned.stop_at_s,
            )  # fmt: skip
            continue
        results[policy] = run(
            engine,
            records,
            slo=slo,
            vocab=model.vocab_size,
            seed=args.seed,
            max_model_len=startup.max_model_len,
        )
    if args.json:
        payload = {k: v.model_dump(mode="json") for k, v in results.items()}
        print(json.dumps(payload if args.compare_eviction else payload[chosen[0].name], indent=2))
    else:
        for eviction in chosen:
            title = (
                f"{model.name} on {gpu.name} (simulated, vLLM {version}, eviction "
                f"{eviction.describe()})"
            )
            print(format_result(title, results[eviction.name]))
            tier = tiers[eviction.name]
            if tier is not None:
                print(format_cpu_tier(tier))
    return 0


def twin_factors(run_dir: Path) -> TimingFactors:
    """The step costs a tune fitted (``factors`` in its twin.json), as a ConfigError."""
    path = RunLayout(run_dir).twin_json
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return TimingFactors.model_validate(record["factors"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"--twin-from {str(run_dir)!r}: no readable {path.name} ({type(exc).__name__}); "
            "accepted: the run directory of a tune that fitted its twin"
        ) from exc

"""`tuner bench` (load a running server) and `tuner trial` (launch, load, measure, stop)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.cli.args import non_negative_float, positive_float
from tuner.errors import ConfigError
from tuner.vllm.flags import add_memory_flags, params_from_args

if TYPE_CHECKING:
    from tuner.serving.load import LoadGenerators


def _add_workload_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workload",
        default="chat",
        help="built-in (chat, code, rag, batch, mixed-long-short, agent) or a YAML file",
    )
    p.add_argument("--rate", type=positive_float, help="requests/s (default: the workload's)")
    p.add_argument(
        "--duration",
        type=positive_float,
        help="seconds of the measured window (default: the workload's)",
    )
    p.add_argument("--processes", type=int, default=1, help="Locust processes generating the load")
    add_remote_load_args(p, default_workers=0)
    p.add_argument(
        "--model-dir", type=Path, help="a local model directory whose tokenizer sizes the prompts"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def add_remote_load_args(p: Any, *, default_workers: int | None) -> None:
    """--load-workers and --load-master-bind (bench, trial and tune; tune's default None
    lets its YAML config decide)."""
    p.add_argument(
        "--load-workers", type=int, default=default_workers, metavar="K",
        help="Locust workers on load hosts (`tuner load-worker` there), on top of --processes",
    )  # fmt: skip
    p.add_argument(
        "--load-master-bind", metavar="HOST:PORT",
        help="where the Locust master listens for --load-workers (e.g. 0.0.0.0:5557)",
    )  # fmt: skip


def add_parsers(sub: Any) -> None:
    bench = sub.add_parser(
        "bench",
        help="one load run of a workload against a running server",
        description="Send a workload's open-loop schedule to a running OpenAI-compatible vLLM "
        "server with Locust and print the LoadResult.",
    )
    bench.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    bench.add_argument("--out", type=Path, default=Path("runs/bench"), help="default runs/bench")
    _add_workload_flags(bench)
    bench.set_defaults(func=_cmd_bench)

    trial = sub.add_parser(
        "trial",
        help="launch vLLM with given settings, warm up, load, measure, stop",
        description="One whole trial: launch through ServerProcess, sample GPU memory, warm "
        "up, run the workload, scrape /metrics, stop; writes the trial directory and prints "
        "the TrialResult.",
    )
    trial.add_argument("--backend", default="sim", help="sim (default) or vllm")
    trial.add_argument("--model", required=True)
    trial.add_argument("--gpu", default="H100-80GB", help="virtual GPU of the sim backend")
    trial.add_argument("--vllm-cmd", default="vllm serve")
    add_memory_flags(trial)
    trial.add_argument("--swap-space", type=non_negative_float)
    trial.add_argument(
        "--no-enable-prefix-caching", dest="prefix", action="store_false", default=None
    )
    trial.add_argument("--gpu-source", default="auto", help="nvml, sim, none, or auto")
    trial.add_argument("--sim-startup-delay", type=non_negative_float, default=1.0)
    trial.add_argument("--out", type=Path, default=Path("runs/trial"), help="the trial directory")
    _add_workload_flags(trial)
    trial.set_defaults(func=_cmd_trial)


def load_generators(args: argparse.Namespace) -> LoadGenerators:
    """The load generators the flags ask for (ConfigError for a bad combination)."""
    from tuner.serving.load import LoadGenerators

    return LoadGenerators(
        processes=args.processes,
        remote_workers=args.load_workers,
        master_bind=args.load_master_bind,
    )


def _cmd_bench(args: argparse.Namespace) -> int:
    from tuner.serving.load import plan_schedule, resolve_workload, run_schedule, served_model
    from tuner.serving.processes import ChildRegistry, writable_dir

    generators = load_generators(args)
    spec = resolve_workload(args.workload, rate_per_s=args.rate, duration_s=args.duration)
    model, max_len = served_model(args.url)
    schedule = plan_schedule(spec, max_model_len=max_len, model_dir=args.model_dir)
    registry = ChildRegistry(writable_dir(args.out, what="--out"))
    for note in registry.stop_leftovers():
        print(f"tuner: {note}", file=sys.stderr)
    with registry.guard():
        done = run_schedule(
            spec, schedule, base_url=args.url, model=model, out_dir=args.out, registry=registry,
            generators=generators,
        )  # fmt: skip
    payload = {
        "workload": spec.name,
        "load": done.result.model_dump(mode="json"),
        "slo": done.verdict.model_dump(mode="json"),
        "client_saturated": done.run.client_saturated,
        "client_saturation_reason": done.run.saturation_reason,
        "records": str(done.run.records_path),
    }
    print(json.dumps(payload, indent=2) if args.json else _text(payload))
    return 0


def _cmd_trial(args: argparse.Namespace) -> int:
    from tuner.serving.gpu_sampler import check_gpu_source
    from tuner.serving.live_server import run_trial
    from tuner.serving.load import resolve_workload
    from tuner.serving.processes import ChildRegistry, writable_dir
    from tuner.serving.server import Backend, LaunchSpec, TrialOutcome
    from tuner.serving.vllm_install import require_vllm
    from tuner.vllm.gpus import get_gpu

    generators = load_generators(args)
    backends = [b.value for b in Backend]
    if args.backend not in backends:
        raise ConfigError(
            f"--backend {args.backend!r} is not a backend; accepted: {', '.join(backends)}"
        )
    backend = Backend(args.backend)
    if backend is Backend.SIM:
        get_gpu(args.gpu)
    check_gpu_source(args.gpu_source)
    # vLLM found where `tuner tune` finds it (its own bin directory, PATH, pipx, uv tool)
    vllm_cmd = (
        require_vllm(args.vllm_cmd).command
        if backend is Backend.VLLM
        else tuple(shlex.split(args.vllm_cmd))
    )
    params = params_from_args(args)
    spec = resolve_workload(args.workload, rate_per_s=args.rate, duration_s=args.duration)
    launch = LaunchSpec(
        backend=backend,
        model=args.model,
        params=params,
        gpu=args.gpu if backend is Backend.SIM else None,
        vllm_version=args.vllm_version if backend is Backend.SIM else None,
        vllm_cmd=vllm_cmd,
        swap_space_gib=args.swap_space,
        enable_prefix_caching=args.prefix,
        cache_dir=args.out / "vllm-cache",
        sim_startup_delay_s=args.sim_startup_delay,
        host=generators.server_host,
    )
    registry = ChildRegistry(writable_dir(args.out, what="--out"))
    for note in registry.stop_leftovers():
        print(f"tuner: {note}", file=sys.stderr)
    with registry.guard():
        result = run_trial(
            launch, spec, trial_dir=args.out, registry=registry, gpu_source=args.gpu_source,
            model_dir=args.model_dir, generators=generators,
        )  # fmt: skip
    payload = result.model_dump(mode="json")
    print(json.dumps(payload, indent=2) if args.json else _text(payload))
    return 0 if result.outcome is TrialOutcome.READY else 1


def _text(payload: dict[str, Any]) -> str:
    """A short human summary of a bench or trial result."""
    lines = []
    if "outcome" in payload:
        lines.append(f"outcome            {payload['outcome']}")
        failure = (payload.get("startup") or {}).get("failure")
        if failure:
            lines.append(f"failure            {failure['kind']}: {failure['message']}")
    load = payload.get("load")
    if load:
        lines += [
            f"requests           {load['num_completed']} completed, {load['num_errors']} errors, of {load['num_requests']}",
            f"rate               offered {load['offered_rate'] or 0:.2f}/s, achieved {load['achieved_rate'] or 0:.2f}/s",
            f"throughput         {load['request_throughput']:.2f} req/s, {load['output_token_throughput']:.0f} output tok/s",
            f"goodput            {load['goodput']:.2f} req/s",
        ]
        for name in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            p = load[name]
            lines.append(
                f"{name[:-3].upper():<18} p50 {p['p50'] or 0:8.1f}  p90 {p['p90'] or 0:8.1f}  p99 {p['p99'] or 0:8.1f} ms"
            )
    slo = payload.get("slo")
    if slo:
        lines.append(
            "SLO                met"
            if slo["met"]
            else "SLO                missed: " + "; ".join(slo["violations"])
        )
    server = payload.get("server")
    if server:
        lines.append(
            f"server             {server['generation_tokens']} generated tokens, "
            f"{server['num_preemptions']} preemptions, peak KV {server['max_kv_cache_usage'] or 0:.0%}"
        )
    gpu = payload.get("gpu")
    if gpu and gpu.get("peak_used_bytes"):
        lines.append(
            f"GPU ({gpu['source']})          peak {gpu['peak_used_bytes'] / 2**30:.2f} of {gpu['total_bytes'] / 2**30:.2f} GiB"
        )
    if payload.get("client_saturated"):
        lines.append(
            f"UNRELIABLE         the load generator was saturated: {payload['client_saturation_reason']}"
        )
    return "\n".join(lines)

"""`tuner serve`: launch vLLM (real or simulated) through ServerProcess and report the startup."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.cli.args import non_negative_float, positive_float
from tuner.errors import ConfigError
from tuner.vllm.flags import add_memory_flags, params_from_args

if TYPE_CHECKING:
    from tuner.serving.gpu_sampler import GpuSourceKind


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="launch vLLM with given settings, report its startup, stop it (or --hold)",
        description="Launch vLLM (--backend vllm) or the simulated engine (--backend sim) "
        "with vLLM's flags, wait until it is ready or fails, print what happened, and "
        "stop it; with --hold keep serving until interrupted.",
    )
    p.add_argument("--backend", default="sim", help="sim (default) or vllm")
    p.add_argument("--model", required=True, help="preset, Hugging Face id, or model directory")
    p.add_argument("--gpu", default="H100-80GB", help="virtual GPU of the sim backend")
    p.add_argument(
        "--vllm-cmd",
        default="vllm serve",
        help="how to launch vLLM (default 'vllm serve'; e.g. "
        "'python -m vllm.entrypoints.openai.api_server')",
    )
    add_memory_flags(p)
    p.add_argument(
        "--swap-space", type=non_negative_float, help="GiB of CPU swap (vLLM < 0.18 only)"
    )
    p.add_argument("--enable-prefix-caching", dest="prefix", action="store_true", default=None)
    p.add_argument("--no-enable-prefix-caching", dest="prefix", action="store_false")
    p.add_argument("--served-model-name")
    p.add_argument("--port", type=int, default=0, help="default: a free port on 127.0.0.1")
    p.add_argument("--cuda-visible-devices", help="CUDA_VISIBLE_DEVICES for the server")
    p.add_argument("--run-dir", type=Path, default=Path("runs/serve"), help="default runs/serve")
    p.add_argument(
        "--startup-timeout",
        type=positive_float,
        help="overall cap in seconds (default 3600); a startup whose log is silent for "
        "600 s is given up on sooner",
    )
    p.add_argument("--sim-startup-delay", type=non_negative_float, default=1.0)
    p.add_argument(
        "--no-adapt",
        dest="adapt",
        action="store_false",
        help="pass every flag even if vLLM lacks it",
    )
    p.add_argument("--hold", action="store_true", help="keep serving until interrupted")
    p.add_argument(
        "--gpu-source",
        default="auto",
        help="GPU memory sampling while holding: nvml, sim, none, or auto (sim for the sim "
        "backend, nvml for vllm)",
    )
    p.add_argument("--gpu-sample-hz", type=positive_float, default=10.0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_serve)


def _cmd_serve(args: argparse.Namespace) -> int:
    from tuner.serving.gpu_sampler import GpuSourceKind, check_gpu_source, release_watch
    from tuner.serving.processes import ChildRegistry, writable_dir
    from tuner.serving.server import Backend, LaunchSpec, ServerProcess, TrialOutcome
    from tuner.serving.vllm_install import require_vllm
    from tuner.vllm.gpus import get_gpu
    from tuner.vllm.models import launch_name

    backends = [b.value for b in Backend]
    if args.backend not in backends:
        raise ConfigError(
            f"--backend {args.backend!r} is not a backend; accepted: {', '.join(backends)}"
        )
    backend = Backend(args.backend)
    params = params_from_args(args)
    if backend is Backend.SIM:
        get_gpu(args.gpu)  # a bad GPU name is an error before anything starts
    # vLLM found where `tuner tune` finds it (its own bin directory, PATH, pipx, uv tool)
    vllm_cmd = (
        require_vllm(args.vllm_cmd).command
        if backend is Backend.VLLM
        else tuple(shlex.split(args.vllm_cmd))
    )
    if args.gpu_sample_hz <= 0:
        raise ConfigError(f"--gpu-sample-hz {args.gpu_sample_hz} is out of range; accepted: > 0")
    check_gpu_source(args.gpu_source)
    if args.port and not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port} is out of range; accepted: 1 to 65535")
    spec = LaunchSpec(
        backend=backend,
        model=launch_name(args.model),  # a preset's Hugging Face id, a directory's path
        params=params,
        gpu=args.gpu if backend is Backend.SIM else None,
        vllm_version=args.vllm_version if backend is Backend.SIM else None,
        vllm_cmd=vllm_cmd,
        served_model_name=args.served_model_name,
        swap_space_gib=args.swap_space,
        enable_prefix_caching=args.prefix,
        port=args.port,
        cuda_visible_devices=args.cuda_visible_devices,
        cache_dir=args.run_dir / "vllm-cache",
        startup_timeout_s=args.startup_timeout,
        sim_startup_delay_s=args.sim_startup_delay,
    )
    registry = ChildRegistry(writable_dir(args.run_dir, what="--run-dir"))
    for note in registry.stop_leftovers():
        print(f"tuner: {note}", file=sys.stderr)
    with registry.guard():
        server = ServerProcess(
            spec, registry=registry, log_path=args.run_dir / "server.log", adapt=args.adapt,
            memory_source=release_watch(_gpu_source_kind(args), visible=spec.server_devices()),
        )  # fmt: skip
        if args.hold and _gpu_source_kind(args) is GpuSourceKind.NVML:
            from tuner.serving.gpu_sampler import make_source

            probe = make_source(GpuSourceKind.NVML, visible=spec.server_devices())
            probe.open()  # no NVIDIA driver: one clear line before anything is launched
            probe.close()
        for dropped in server.dropped:
            print(f"tuner: left out {dropped.flag}: {dropped.reason}", file=sys.stderr)
        result = server.wait_ready()
        _print(result, as_json=args.json)
        if result.outcome is TrialOutcome.READY and args.hold:
            return _hold(server, args)
        server.stop()
    return 0 if result.outcome is TrialOutcome.READY else 1


def _gpu_source_kind(args: argparse.Namespace) -> GpuSourceKind:
    from tuner.serving.gpu_sampler import GpuSourceKind
    from tuner.serving.server import Backend

    return GpuSourceKind.requested(args.gpu_source, simulated=args.backend == Backend.SIM)


def _hold(server: Any, args: argparse.Namespace) -> int:
    """Serve until interrupted or the engine dies, sampling GPU memory into gpu.csv."""
    from tuner.serving.gpu_sampler import GpuSampler, ProcessTree, make_source

    source = make_source(
        _gpu_source_kind(args), base_url=server.base_url, visible=server.spec.server_devices()
    )
    assert server.pid is not None
    timeline = args.run_dir / "gpu.csv"
    sampler = GpuSampler(
        source,
        interval_s=1.0 / args.gpu_sample_hz,
        timeline_path=timeline,
        pids=ProcessTree(server.pid),
    )
    sampler.start()
    print(
        f"serving at {server.base_url} until interrupted (Ctrl-C); GPU timeline in {timeline}",
        file=sys.stderr,
        flush=True,
    )
    code = 0
    try:
        while (died := server.engine_outcome()) is None:
            time.sleep(1.0)
        _print(died, as_json=args.json)
        code = 1
    finally:  # also on SIGINT or SIGTERM, which the command line reports in one line
        summary = sampler.stop()
        server.stop()
        print(f"GPU: {summary.model_dump_json()}", file=sys.stderr, flush=True)
    return code


def _print(result: Any, *, as_json: bool) -> None:
    report = result.report
    summary = {
        "outcome": result.outcome.value,
        "failure_kind": result.failure.kind.value if result.failure else None,
        "failure_message": result.failure.message if result.failure else None,
        "kv_cache_tokens": report.kv_cache_tokens if report else None,
        "max_concurrency": report.max_concurrency if report else None,
        "weights_bytes": report.weights_bytes if report else None,
        "available_kv_bytes": report.available_kv_bytes if report else None,
        "ready_s": round(result.ready_s, 3) if result.ready_s is not None else None,
        "exit_code": result.exit_code,
        "log_path": result.log_path,
        "base_url": result.base_url,
        "dropped_flags": result.dropped_flags,
        "command": result.command,
    }
    if as_json:
        print(json.dumps(summary, indent=2), flush=True)
        return
    lines = [f"outcome           {summary['outcome']}"]
    if result.failure:
        lines.append(f"failure           {summary['failure_kind']}: {summary['failure_message']}")
    if report:
        lines += [
            f"KV cache tokens   {report.kv_cache_tokens:,}"
            if report.kv_cache_tokens
            else "KV cache tokens   ?",
            f"max concurrency   {report.max_concurrency}x",
            f"weights           {(report.weights_bytes or 0) / (1 << 30):.2f} GiB",
            f"ready after       {summary['ready_s']} s",
        ]
    lines.append(f"server log        {result.log_path}")
    if result.failure and result.log_excerpt:
        lines.append("log excerpt:")
        lines += ["  " + line for line in result.log_excerpt.splitlines()[-12:]]
    print("\n".join(lines), flush=True)

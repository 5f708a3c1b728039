"""``tuner sim-serve``: the simulated engine behind the command line and log of ``vllm serve``.

Takes ``vllm serve``'s flags, rejects what the emulated release's argparse
rejects (exit 2, its message on stderr), prints that release's startup lines with
the numbers of ``tuner.vllm.memory.plan`` (so they match ``tuner plan``), fails with
vLLM's own message and exit code 1 when the plan does not fit, and otherwise
serves the OpenAI API until SIGTERM or SIGINT (exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import logging
import math
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import partial
from typing import Any

from tuner.errors import ConfigError, TunerError
from tuner.sim import flag_values as check
from tuner.sim.blocks import EvictionPolicy
from tuner.sim.build import SimOptions, build_engine
from tuner.sim.compile_cache import CompileCache
from tuner.sim.cpu_tier import OffloadPolicy
from tuner.sim.engine import SimEngine
from tuner.sim.residency import DEFAULT_SAMPLE_RATE
from tuner.sim.serve_log import (
    COMPILE_BACKBONE_DIR,
    Process,
    ServerIdentity,
    VllmLog,
    log_banner,
    log_engine_config,
    log_graph_capture,
    log_init_engine,
    log_kv_cache_size,
    log_model_config,
    log_model_loading,
    log_profile_result,
    log_server_start,
    log_server_stop,
    log_startup_failure,
    log_torch_compile,
)
from tuner.sim.startup_plan import StartupPlan
from tuner.sim.timing import TimingFactors
from tuner.vllm import messages as msg
from tuner.vllm.boot import BootState
from tuner.vllm.failures import StartupFailure, StartupFailureKind
from tuner.vllm.flags import FLAGS, FlagForm
from tuner.vllm.gpus import GpuSpec, get_gpu
from tuner.vllm.host_memory import GiB, host_plan, simulated_host_bytes
from tuner.vllm.memory import KV_CACHE_DTYPES, MemoryPlan, ServingParams
from tuner.vllm.models import ModelSpec, resolve_model
from tuner.vllm.versions import (
    KV_OFFLOAD_STORE_THRESHOLD,
    KV_OFFLOADING_NATIVE_DEFAULT,
    REQUEST_STREAM_INTERVAL,
    VllmVersion,
)

log = logging.getLogger(__name__)

API_KEY_ENV = "VLLM_API_KEY"  # vLLM's: the key when --api-key is not given
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
LOADING_SHARE = 0.6  # of --startup-delay spent loading weights; the rest profiling and graphs
COLD_COMPILE_SHARE = 0.5  # default --compile-delay: a cold torch.compile, of --startup-delay
WARM_COMPILE_SHARE = 0.1  # loading the compiled graphs from the cache, of --compile-delay
SHUTDOWN_GRACE_S = 0.5  # in-flight requests may finish this long after SIGTERM
LISTEN_BACKLOG = 2048
DEFAULT_GPU_COUNT = 8  # the virtual host: one node of eight GPUs

# vLLM flags whose value is printed in "non-default args" when given, in parser order.
_VLLM_FLAGS = (
    "host",
    "port",
    "model",
    "served_model_name",
    "max_model_len",
    "tensor_parallel_size",
    "block_size",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "swap_space",
    "kv_cache_dtype",
    "cpu_offload_gb",
    "enforce_eager",
    "max_num_batched_tokens",
    "max_num_seqs",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "seed",
    "kv_offloading_size",
    "kv_offloading_backend",
    "kv_transfer_config",
    "kv_cache_metrics",
    "kv_cache_metrics_sample",
)
KV_OFFLOADING_BACKENDS = ("native", "lmcache")  # vLLM's KVOffloadingBackend
OFFLOADING_CONNECTOR = "OffloadingConnector"  # what "native" configures


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    """Register ``sim-serve`` on the tuner's subcommands."""
    p = sub.add_parser(
        "sim-serve",
        help="serve a simulated vLLM engine with vllm serve's flags, log and HTTP API",
        description="Start a simulated vLLM OpenAI server on a virtual GPU. It takes vllm "
        "serve's flags, prints the emulated release's startup lines, fails as it would, and "
        "serves /v1/completions, /v1/chat/completions, /health and /metrics.",
    )
    p.add_argument(
        "--model", required=True, help="preset name, Hugging Face id, or model directory"
    )
    p.add_argument("--gpu", default="H100-80GB", help="virtual GPU profile (default: H100-80GB)")
    p.add_argument("--host", help=f"address to listen on (default: {DEFAULT_HOST})")
    p.add_argument("--port", type=int, help=f"port to listen on (default: {DEFAULT_PORT})")
    p.add_argument("--served-model-name", nargs="+", help="model name(s) in the API")
    p.add_argument("--gpu-memory-utilization", type=float)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--block-size", type=int)
    p.add_argument("--swap-space", metavar="GIB", help="host swap space, GiB (vLLM < 0.18 only)")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--tensor-parallel-size", type=int, default=None)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--kv-cache-memory-bytes", metavar="BYTES", help="e.g. 8589934592 or 8G")
    p.add_argument("--cpu-offload-gb", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--kv-offloading-size", default=None, metavar="GIB",
        help="KV offloading buffer in host memory, GiB over all ranks (vLLM >= 0.11.1)",
    )  # fmt: skip
    p.add_argument(
        "--kv-offloading-backend",
        help="native or lmcache (default native from vLLM 0.14); the simulator models native",
    )
    p.add_argument(
        "--kv-transfer-config",
        metavar="JSON",
        help='e.g. \'{"kv_connector_extra_config": {"eviction_policy": "arc", '
        '"store_threshold": 2}}\' beside --kv-offloading-size',
    )
    p.add_argument(
        "--kv-cache-metrics", action=argparse.BooleanOptionalAction, default=None,
        help="KV block residency histograms (lifetime, idle before eviction, reuse gap) "
        "on /metrics (vLLM >= 0.13)",
    )  # fmt: skip
    p.add_argument(
        "--kv-cache-metrics-sample", type=float, default=None, metavar="RATE",
        help=f"share of blocks sampled, (0, 1] (default {DEFAULT_SAMPLE_RATE:g})",
    )  # fmt: skip
    p.add_argument("--vllm-version", help="emulated vLLM version X.Y (default: current release)")
    p.add_argument("--disable-uvicorn-access-log", action="store_true")
    p.add_argument(
        "--api-key",
        nargs="+",
        metavar="KEY",
        help=f"require one of these keys on /v1 paths (default: ${API_KEY_ENV} when set)",
    )
    sim = p.add_argument_group("simulator")
    sim.add_argument(
        "--startup-delay",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds of weight loading and compilation before serving (default 1.0)",
    )
    sim.add_argument(
        "--compile-delay",
        type=float,
        default=None,
        metavar="S",
        help="seconds a cold torch.compile adds to the startup (default: "
        f"{COLD_COMPILE_SHARE:g} x --startup-delay); the compiled graphs are kept in "
        "$VLLM_CACHE_ROOT/torch_compile_cache/ as vLLM keeps them, and a later start with "
        "the same compile key (model, block size, KV-cache dtype, tensor-parallel size) "
        f"loads them in {WARM_COMPILE_SHARE:g} x that",
    )
    sim.add_argument(
        "--step-costs",
        metavar="FACTORS",
        help="the virtual GPU's own step costs, e.g. mfu=0.4,mbu=0.55,step_overhead_ms=4.5 "
        "(default: the twin's paper factors): an engine the twin has not measured",
    )
    sim.add_argument(
        "--gpu-count",
        type=int,
        default=DEFAULT_GPU_COUNT,
        metavar="N",
        help=f"GPUs of the virtual host (default {DEFAULT_GPU_COUNT}); a larger "
        "--tensor-parallel-size fails as vLLM does",
    )
    sim.add_argument(
        "--host-memory-gib",
        type=float,
        default=None,
        metavar="GIB",
        help="RAM of the virtual host, GiB (default 256 per GPU of --gpu-count); pinned "
        "host memory (--kv-offloading-size, --swap-space) beyond it fails the start",
    )
    sim.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="K",
        help="wall-clock seconds per virtual-GPU second (default 1.0; 0.1 runs 10x faster)",
    )
    sim.add_argument(
        "--prefix-cache-eviction",
        choices=[policy.value for policy in EvictionPolicy],
        default=EvictionPolicy.LRU.value,
        help="which cached GPU prefix block is evicted first: lru is vLLM's; lfu, fifo "
        "and tiered are what-ifs, not in vLLM",
    )
    p.set_defaults(func=run)


class _VllmArgumentError(Exception):
    """What vLLM's own argparse would reject: printed as vLLM prints it, exit code 2."""


class _VllmConfigError(Exception):
    """What vLLM's config checks reject after parsing (a ValueError): exit code 1."""


@dataclass(frozen=True)
class _Launch:
    """Everything resolved from the command line."""

    model: ModelSpec
    gpu: GpuSpec
    params: ServingParams
    options: SimOptions
    version: VllmVersion
    identity: ServerIdentity
    non_default_args: dict[str, object]
    startup_delay_s: float
    compile_delay_s: float  # a cold torch.compile
    time_scale: float
    step_costs: TimingFactors | None
    gpu_count: int  # GPUs of the virtual host
    access_log: bool
    api_keys: tuple[str, ...]  # required on /v1 paths; empty: no authentication


def run(args: argparse.Namespace) -> int:
    """The ``sim-serve`` command: exit 0 after a clean stop, 1 on a startup failure, 2 on bad flags."""
    version = VllmVersion.parse(args.vllm_version) if args.vllm_version else VllmVersion.current()
    try:
        launch = _resolve(args, version)
    except _VllmArgumentError as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return 2
    except _VllmConfigError as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return 1
    return asyncio.run(_serve(launch))


def parse_bytes(text: str) -> int:
    """vLLM's human-readable integers: ``8G`` is 8 GiB, ``8g`` 8e9, plain digits as they are."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)\s*", text)
    if match is None:
        raise ConfigError(
            f"--kv-cache-memory-bytes {text!r} is not a size; accepted: an integer, optionally "
            "with k/m/g/t (powers of 1000) or K/M/G/T (powers of 1024)"
        )
    number, unit = float(match[1]), match[2]
    power = "kmgt".find(unit.lower()) + 1 if unit else 0
    base = 1024 if unit.isupper() else 1000
    return int(number * base**power)


def _resolve(args: argparse.Namespace, version: VllmVersion) -> _Launch:
    for flag in FLAGS:  # what this release's parser does not know
        given = getattr(args, flag.name.replace("-", "_"), None)
        if given is None or flag.accepted_by(version):
            continue
        if flag.form is FlagForm.VALUE:
            raise _VllmArgumentError(f"vllm: error: unrecognized arguments: {flag.option} {given}")
        if flag.form is FlagForm.SWITCH and isinstance(given, bool):  # --x or --no-x
            spelled = flag.option if given else f"--no-{flag.name}"
            raise _VllmArgumentError(f"vllm: error: unrecognized arguments: {spelled}")
    choices = version.block_size_choices
    if args.block_size is not None and choices is not None and args.block_size not in choices:
        failure = msg.invalid_choice("--block-size", args.block_size, choices)
        raise _VllmArgumentError(f"vllm serve: error: {failure.message}")
    if args.kv_cache_dtype not in KV_CACHE_DTYPES:
        failure = msg.invalid_choice("--kv-cache-dtype", args.kv_cache_dtype, KV_CACHE_DTYPES)
        raise _VllmArgumentError(f"vllm serve: error: {failure.message}")
    swap_space_gib = 0.0
    if args.swap_space is not None:
        try:
            swap_space_gib = float(args.swap_space)
        except ValueError:
            raise _VllmArgumentError(
                f"vllm serve: error: argument --swap-space: invalid float value: {args.swap_space!r}"
            ) from None
    check.positive_number("--time-scale", args.time_scale)
    try:
        step_costs = TimingFactors.parse(args.step_costs) if args.step_costs else None
    except ValueError as exc:
        raise ConfigError(f"--step-costs: {exc}") from None
    check.non_negative_number("--startup-delay", args.startup_delay)
    check.non_negative_number("--compile-delay", args.compile_delay)
    check.non_negative_number("--swap-space", swap_space_gib)
    check.non_negative_number("--cpu-offload-gb", args.cpu_offload_gb)
    check.positive_number("--host-memory-gib", args.host_memory_gib)
    if args.gpu_count < 1:
        raise ConfigError(f"--gpu-count {args.gpu_count} is not accepted; accepted: 1 or more")
    if args.port is not None and not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port} is out of range; accepted: 0 to 65535")

    gpu = get_gpu(args.gpu)
    model = resolve_model(args.model)
    kv_bytes = parse_bytes(args.kv_cache_memory_bytes) if args.kv_cache_memory_bytes else None
    params = ServingParams(
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        kv_cache_dtype=args.kv_cache_dtype,
        max_model_len=args.max_model_len,
        tensor_parallel_size=args.tensor_parallel_size or 1,
        enforce_eager=args.enforce_eager,
        cpu_offload_gb=args.cpu_offload_gb or 0.0,
        kv_cache_memory_bytes=kv_bytes,
        enable_chunked_prefill=args.enable_chunked_prefill is not False,
    ).checked()
    prefix_caching = args.enable_prefix_caching is not False
    offload = _kv_offloading(args, version, swap_space_gib)
    sample = args.kv_cache_metrics_sample
    if sample is not None and not 0.0 < sample <= 1.0:
        # ObservabilityConfig.kv_cache_metrics_sample: Field(gt=0, le=1), pydantic's words
        bound, kind = (
            ("greater than 0", "greater_than")
            if sample <= 0
            else ("less than or equal to 1", "less_than_equal")
        )
        raise _VllmConfigError(
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for "
            f"ObservabilityConfig\nkv_cache_metrics_sample\n  Input should be {bound} "
            f"[type={kind}, input_value={sample}, input_type=float]"
        )
    metrics_sample = (sample or DEFAULT_SAMPLE_RATE) if args.kv_cache_metrics else None
    options = SimOptions(
        enable_prefix_caching=prefix_caching,
        swap_space_gib=swap_space_gib,
        eviction_policy=EvictionPolicy(args.prefix_cache_eviction),
        kv_offloading_size_gib=offload.size_gib,
        offload_policy=offload.policy,
        store_threshold=offload.store_threshold,
        kv_cache_metrics_sample=metrics_sample,
        seed=args.seed or 0,
    )
    given = {name: getattr(args, name) for name in _VLLM_FLAGS}
    given["swap_space"] = swap_space_gib if args.swap_space is not None else None
    given["kv_cache_memory_bytes"] = kv_bytes
    if given["kv_cache_dtype"] == "auto":
        given["kv_cache_dtype"] = None
    if not given["enforce_eager"]:
        given["enforce_eager"] = None
    non_default = {k: v for k, v in given.items() if v is not None}
    served = tuple(args.served_model_name or [args.model])
    identity = ServerIdentity(
        model=args.model,
        served_model_names=served,
        host=args.host or DEFAULT_HOST,
        port=DEFAULT_PORT if args.port is None else args.port,
        enable_prefix_caching=prefix_caching,
        enable_chunked_prefill=params.enable_chunked_prefill,
        seed=options.seed,
    )
    return _Launch(
        model=model,
        gpu=gpu,
        params=params,
        options=options,
        version=version,
        identity=identity,
        non_default_args=non_default,
        startup_delay_s=args.startup_delay,
        compile_delay_s=(
            args.startup_delay * COLD_COMPILE_SHARE
            if args.compile_delay is None
            else args.compile_delay
        ),
        time_scale=args.time_scale,
        step_costs=step_costs,
        gpu_count=args.gpu_count,
        access_log=not args.disable_uvicorn_access_log,
        # As vLLM: --api-key takes precedence over VLLM_API_KEY; empty keys do not count.
        api_keys=tuple(k for k in (args.api_key or [os.environ.get(API_KEY_ENV)]) if k),
    )


@dataclass(frozen=True)
class _Offloading:
    size_gib: float = 0.0
    policy: OffloadPolicy = OffloadPolicy.LRU
    store_threshold: int = 0


def _kv_offloading(
    args: argparse.Namespace, version: VllmVersion, swap_space_gib: float
) -> _Offloading:
    """``--kv-offloading-size``, its backend and the native connector's extra config, as
    vLLM checks them (``vllm/config/kv_offloading.py``); the host must pin the buffer."""
    backend = args.kv_offloading_backend
    if backend is not None and backend not in KV_OFFLOADING_BACKENDS:
        failure = msg.invalid_choice("--kv-offloading-backend", backend, KV_OFFLOADING_BACKENDS)
        raise _VllmArgumentError(f"vllm serve: error: {failure.message}")
    extra: dict[str, Any] = {}
    if args.kv_transfer_config is not None:
        try:
            config = json.loads(args.kv_transfer_config)
        except json.JSONDecodeError:
            config = None
        if not isinstance(config, dict):
            raise _VllmArgumentError(
                "vllm serve: error: argument --kv-transfer-config: Value "
                f"{args.kv_transfer_config} cannot be converted to KVTransferConfig."
            )
        connector = config.get("kv_connector")
        if connector not in (None, OFFLOADING_CONNECTOR):
            raise ConfigError(
                f"--kv-transfer-config kv_connector {connector!r} is not simulated; accepted: "
                f"{OFFLOADING_CONNECTOR} (vLLM's native KV offloading), or none"
            )
        extra = config.get("kv_connector_extra_config") or {}
    size_text = args.kv_offloading_size
    if size_text is None:
        if extra:
            raise ConfigError(
                "--kv-transfer-config without --kv-offloading-size: the simulated engine sizes "
                "its CPU tier from --kv-offloading-size; accepted: both together"
            )
        return _Offloading()
    try:
        size = float(size_text)
    except ValueError:
        raise _VllmArgumentError(
            f"vllm serve: error: argument --kv-offloading-size: invalid float value: {size_text!r}"
        ) from None
    if backend is None and not version.at_least(KV_OFFLOADING_NATIVE_DEFAULT):
        raise _VllmConfigError(
            "ValueError: kv_offloading_backend must be specified when kv_offloading_size is "
            "set. Available backends: " + ", ".join(KV_OFFLOADING_BACKENDS)
        )
    if not (size > 0 and math.isfinite(size)):
        raise _VllmConfigError(f"ValueError: kv_offloading_size must be positive, got {size}")
    if backend == "lmcache":
        raise ConfigError(
            "--kv-offloading-backend lmcache is not simulated; accepted: native (vLLM's own "
            "offloading connector)"
        )
    policy_name = str(extra.get("eviction_policy", OffloadPolicy.LRU.value))
    try:
        policy = OffloadPolicy(policy_name)
    except ValueError:
        raise ConfigError(
            f"--kv-transfer-config eviction_policy {policy_name!r} is not one of vLLM's; "
            "accepted: " + ", ".join(p.value for p in OffloadPolicy)
        ) from None
    threshold = extra.get("store_threshold", 0)
    if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 0:
        raise ConfigError(
            f"--kv-transfer-config store_threshold {threshold!r} is not accepted; accepted: "
            "an integer >= 0 (below 2: every block is stored)"
        )
    if not version.at_least(KV_OFFLOAD_STORE_THRESHOLD):
        threshold = 0  # older releases ignore the key
    host_bytes = (
        int(args.host_memory_gib * GiB)
        if args.host_memory_gib is not None
        else simulated_host_bytes(args.gpu_count)
    )
    pinned = host_plan(
        kv_offloading_size_gib=size,
        host_bytes=host_bytes,
        swap_space_gib=swap_space_gib if version.has_swap_space else 0.0,
        cpu_offload_gb=args.cpu_offload_gb or 0.0,
    )
    if not pinned.fits:
        # vLLM (vllm/v1/kv_offload/cpu/shared_offload_region.py) maps the buffer from
        # /dev/shm and checks its free space first (shm_broadcast.check_shm_free_space);
        # the virtual host's /dev/shm gives what a server may pin of its RAM.
        mib = 1 << 20
        free = max(pinned.pinnable_bytes - pinned.swap_space_bytes - pinned.cpu_offload_bytes, 0)
        raise _VllmConfigError(
            f"RuntimeError: Insufficient space in /dev/shm: "
            f"{pinned.kv_offloading_bytes / mib:.0f} MiB required, {free / mib:.0f} MiB free. "
            "Increase /dev/shm (e.g. --shm-size or --ipc=host)."
        )
    return _Offloading(size_gib=size, policy=policy, store_threshold=threshold)


# --- startup ----------------------------------------------------------------------------


class _Stage(IntEnum):
    """Where in vLLM's startup a failure surfaces."""

    CONFIG = 0  # the API server's config validation, before any engine process
    DEVICE = 1  # worker init: the free-memory check, attention backend selection
    LOADING = 2  # loading the weights
    PROFILING = 3  # after "Available KV cache memory", sizing the KV cache
    WARMUP = 4  # graph capture and sampler warm-up, with the KV cache allocated


def _failure_stage(failure: StartupFailure) -> _Stage:
    if failure.error_type.startswith("pydantic ") or failure.error_type == "argparse":
        return _Stage.CONFIG
    stages = {
        StartupFailureKind.WEIGHTS_DO_NOT_FIT: _Stage.LOADING,
        StartupFailureKind.NO_MEMORY_FOR_CACHE_BLOCKS: _Stage.PROFILING,
        StartupFailureKind.MAX_MODEL_LEN_DOES_NOT_FIT: _Stage.PROFILING,
        StartupFailureKind.BLOCK_SIZE_UNSUPPORTED: _Stage.PROFILING,
        StartupFailureKind.CUDA_OOM_WARMUP: _Stage.WARMUP,
    }
    return stages.get(failure.kind, _Stage.DEVICE)


class _Stopped(Exception):
    """SIGTERM or SIGINT arrived during startup."""


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    if seconds <= 0:
        return
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        return
    raise _Stopped


@dataclass(frozen=True)
class OfflineStart:
    """``sim-serve``'s startup without its pauses or its socket (``start_offline``)."""

    exit_code: int | None  # None: it would serve; else what sim-serve would exit with
    plan: MemoryPlan | None
    engine: SimEngine | None
    launch: _Launch | None  # None: its flags were refused


def start_offline(
    argv: Sequence[str], vllm_log: VllmLog, environ: Mapping[str, str] | None = None
) -> OfflineStart:
    """What ``tuner sim-serve argv`` prints up to serving, and its engine, with no pause
    (``--startup-delay``, ``--compile-delay`` as 0) and no socket: the same flags'
    refusals (exit 2), startup lines, failures (exit 1) and compile cache (in
    ``environ``'s ``VLLM_CACHE_ROOT``), for a server on the twin's virtual clock
    (``tuner.twin.virtual_server``). ``argv``: sim-serve's flags, without the command."""
    parser = argparse.ArgumentParser(prog="tuner")
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["sim-serve", *argv])
    version = VllmVersion.parse(args.vllm_version) if args.vllm_version else VllmVersion.current()
    try:
        launch = _resolve(args, version)
    except _VllmArgumentError as exc:
        vllm_log.emit(Process.API_SERVER, str(exc), stderr=True)
        return OfflineStart(exit_code=2, plan=None, engine=None, launch=None)
    except _VllmConfigError as exc:
        vllm_log.emit(Process.API_SERVER, str(exc), stderr=True)
        return OfflineStart(exit_code=1, plan=None, engine=None, launch=None)
    except TunerError as exc:  # as the tuner's command line says one (tuner.cli.main)
        vllm_log.emit(Process.API_SERVER, f"tuner: error: {exc}", stderr=True)
        return OfflineStart(exit_code=2, plan=None, engine=None, launch=None)
    launch = dataclasses.replace(launch, startup_delay_s=0.0, compile_delay_s=0.0)
    plan, engine = asyncio.run(_start_engine(launch, vllm_log, asyncio.Event(), environ))
    return OfflineStart(
        exit_code=None if engine is not None else 1, plan=plan, engine=engine, launch=launch
    )


async def _start_engine(
    launch: _Launch,
    vllm_log: VllmLog,
    stop: asyncio.Event,
    environ: Mapping[str, str] | None = None,
) -> tuple[MemoryPlan, SimEngine | None]:
    """Print vLLM's startup lines up to "init engine"; the engine, or None after a failure."""
    who = launch.identity
    cache = CompileCache.of(launch.identity.model, launch.params, launch.version, environ)
    backbone = launch.version.at_least(COMPILE_BACKBONE_DIR)
    warm = launch.params.enforce_eager or cache.warm(backbone=backbone)
    # A cold start compiles inside vLLM's memory profile: a smaller KV cache (tuner.vllm.boot).
    boot = BootState.WARM if warm else BootState.COLD
    params = launch.params
    startup_plan = StartupPlan.of(
        launch.identity.model, params, launch.version, launch.gpu,
        params.max_model_len or launch.model.max_position_embeddings, environ,
    )  # fmt: skip
    applied = None
    if startup_plan is not None and params.kv_cache_memory_bytes is None:
        # VLLM_ENABLE_STARTUP_PLAN: a recorded plan is applied as kv_cache_memory_bytes
        applied = startup_plan.load(launch.gpu.cuda_total_bytes - params.other_process_bytes)
        if applied is not None:
            params = params.model_copy(update={"kv_cache_memory_bytes": applied[0]})
    plan, engine = build_engine(
        launch.model, launch.gpu, params, launch.version, launch.options,
        launch.step_costs, boot=boot,
    )  # fmt: skip
    failure = plan.failure
    if launch.params.tensor_parallel_size > launch.gpu_count:  # vLLM's ParallelConfig check
        failure = msg.more_ranks_than_gpus(launch.params.tensor_parallel_size, launch.gpu_count)
    stage = _failure_stage(failure) if failure is not None else None
    log_banner(vllm_log, who, launch.non_default_args)
    if failure is not None and stage is _Stage.CONFIG:
        log_startup_failure(vllm_log, failure)
        return plan, None
    log_model_config(vllm_log, launch.model, plan)
    log_engine_config(vllm_log, who, launch.model, plan, launch.params.enforce_eager)
    started = time.monotonic()
    load_s = launch.startup_delay_s * LOADING_SHARE
    if failure is not None and stage is not None and stage <= _Stage.LOADING:
        await _pause(stop, load_s if stage is _Stage.LOADING else 0.0)
        log_startup_failure(vllm_log, failure)
        return plan, None
    await _pause(stop, load_s)
    log_model_loading(vllm_log, plan, time.monotonic() - started)
    compile_s = 0.0
    if not launch.params.enforce_eager:
        compile_s = await _torch_compile(launch, plan, vllm_log, stop, cache, warm=warm)
    await _pause(stop, launch.startup_delay_s - load_s)
    if startup_plan is not None and applied is not None:
        log_startup_plan_applied(vllm_log, startup_plan.fingerprint, applied, plan.free_bytes)
    log_profile_result(vllm_log, plan, params.kv_cache_memory_bytes)
    if failure is not None and stage is _Stage.PROFILING:
        log_startup_failure(vllm_log, failure)
        return plan, None
    log_kv_cache_size(vllm_log, plan)
    if failure is not None:
        log_startup_failure(vllm_log, failure)
        return plan, None
    if not launch.params.enforce_eager:
        log_graph_capture(vllm_log, plan, 0.0)
    if startup_plan is not None and params.kv_cache_memory_bytes is None:
        _save_startup_plan(startup_plan, plan, vllm_log)
    log_init_engine(vllm_log, time.monotonic() - started, compile_s)
    return plan, engine


def _save_startup_plan(startup_plan: StartupPlan, plan: MemoryPlan, vllm_log: VllmLog) -> None:
    """A profiled boot's KV-cache memory kept for the next (vLLM logs, never raises)."""
    try:
        startup_plan.save(plan.kv_cache_bytes, plan.free_bytes)
    except OSError as exc:
        vllm_log.log(
            Process.ENGINE_CORE, "WARNING", "startup_plan.py:189",
            f"Failed to save startup plan to {startup_plan.path}: {exc}",
        )  # fmt: skip
        return
    vllm_log.info(
        Process.ENGINE_CORE, "startup_plan.py:187", f"Saved startup plan to {startup_plan.path}"
    )


def log_startup_plan_applied(
    vllm_log: VllmLog, fingerprint: str, applied: tuple[int, int], free_bytes: int
) -> None:
    kv, baseline = applied
    vllm_log.info(
        Process.ENGINE_CORE,
        "startup_plan.py:158",
        f"Applying persisted startup plan (fingerprint {fingerprint}): "
        f"kv_cache_memory_bytes={kv} ({kv / GiB:.2f} GiB), recorded free-memory "
        f"baseline {baseline / GiB:.2f} GiB, current {free_bytes / GiB:.2f} GiB. Memory "
        "profiling will be skipped.",
    )


async def _torch_compile(
    launch: _Launch,
    plan: MemoryPlan,
    vllm_log: VllmLog,
    stop: asyncio.Event,
    cache: CompileCache,
    *,
    warm: bool,
) -> float:
    """vLLM's torch.compile: cold, it compiles for ``compile_delay_s`` and keeps the graphs
    in $VLLM_CACHE_ROOT/torch_compile_cache/<hash>/ (before the memory profile sizes the KV
    cache, so a start that then fails leaves them for the next); warm, it loads them. Its
    seconds."""
    backbone = launch.version.at_least(COMPILE_BACKBONE_DIR)
    share = WARM_COMPILE_SHARE if warm else 1.0
    began = time.monotonic()
    await _pause(stop, launch.compile_delay_s * share)
    compile_s = time.monotonic() - began
    if not warm:
        try:
            cache.store(backbone=backbone)
        except OSError as exc:  # vLLM goes on without a cache it cannot write
            vllm_log.log(
                Process.ENGINE_CORE,
                "WARNING",
                "backends.py:1089",
                f"compile cache not saved: {exc}",
            )
    log_torch_compile(
        vllm_log,
        str(cache.directory),
        warm=warm,
        compile_s=compile_s,
        max_num_batched_tokens=plan.max_num_batched_tokens,
    )
    return compile_s


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the engine starts as vLLM binds it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


async def _serve(launch: _Launch) -> int:
    # aiohttp is imported here so that `tuner plan` does not pay for it.
    from aiohttp import web

    from tuner.sim.api import ROUTES, ServeSettings, SimServer, access_logger_class

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    vllm_log = VllmLog(launch.version)
    who = launch.identity
    try:
        sock = _bind(who.host, who.port)
    except OSError as exc:
        vllm_log.emit(Process.API_SERVER, f"OSError: {exc}", stderr=True)
        return 1
    who = dataclasses.replace(who, port=sock.getsockname()[1])  # --port 0: the one chosen
    try:
        plan, engine = await _start_engine(launch, vllm_log, stop)
    except _Stopped:
        sock.close()
        return 0
    if engine is None:
        sock.close()
        return 1
    settings = ServeSettings(
        model=who.model,
        served_model_names=who.served_model_names,
        max_model_len=plan.max_model_len,
        vocab_size=launch.model.vocab_size,
        time_scale=launch.time_scale,
        enable_prefix_caching=who.enable_prefix_caching,
        api_keys=launch.api_keys,
        request_stream_interval=launch.version.at_least(REQUEST_STREAM_INTERVAL),
        kv_cache_memory_bytes=launch.params.kv_cache_memory_bytes,
    )
    server = SimServer(engine, plan, launch.gpu, settings, vllm_log)
    runner_options: dict[str, Any] = {"access_log": None}
    if launch.access_log:
        runner_options = {"access_log": log, "access_log_class": access_logger_class(vllm_log)}
    runner = web.AppRunner(
        server.app(),
        handle_signals=False,
        handler_cancellation=True,
        shutdown_timeout=SHUTDOWN_GRACE_S,
        **runner_options,
    )
    await runner.setup()
    assert runner.server is not None
    # Not web.SockSite: each connection's protocol is wrapped to stamp when requests are
    # read (the simulator's ground truth, /sim/requests).
    listener = await loop.create_server(
        partial(server.protocol_factory, runner.server), sock=sock, backlog=LISTEN_BACKLOG
    )
    try:
        # The engine's block pool (one object per KV block) and every module live as
        # long as the server: out of the collector's walks, a full collection pauses
        # the steps 25 ms rather than 50 to 70 (the load generator does the same).
        gc.freeze()
        log_server_start(vllm_log, who, ROUTES)
        await stop.wait()
    finally:
        listener.close()
        await runner.cleanup()  # closes the connections
        await listener.wait_closed()
    log_server_stop(vllm_log)
    return 0

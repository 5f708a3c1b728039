"""The lines ``vllm serve`` prints, worded and formatted as the emulated release prints them.

These go to stdout on purpose (vLLM's logger writes there), one flushed line at a
time, so a launcher reading the log of ``tuner sim-serve`` sees what it would see
from vLLM: ``(EngineCore pid=N) INFO MM-DD HH:MM:SS [file.py:line] message``.
Tracebacks of the exceptions vLLM does not catch go to stderr, as Python prints them.

Boundaries below were read in the public startup logs of tests/fixtures/vllm_logs
(a process name or wording seen in one release and not in an earlier one); where
two read releases bracket a change, the later one is given.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TextIO

from tuner.vllm.failures import StartupFailure
from tuner.vllm.gpus import GiB
from tuner.vllm.memory import MemoryPlan
from tuner.vllm.models import ModelSpec, Quantization
from tuner.vllm.versions import (
    COMBINED_KV_LOG_LINE,
    CUDAGRAPH_IN_BUDGET,
    FORMAT_GIB,
    STARTING_SERVER_LINE,
    VllmVersion,
)

PROCESS_PREFIXES = (0, 10)  # "(APIServer pid=N) " before every line (0.9 prints none)
ENGINE_CORE_DP0 = (0, 10, 2)  # "EngineCore_0" -> "EngineCore_DP0"
ENGINE_CORE_PLAIN = (0, 19)  # "EngineCore_DP0" -> "EngineCore" (0.16 still DP0)
BANNER_WITH_MODEL = (0, 15)  # "vLLM API server version X" -> the logo / "serving model M"
LOADING_SAYS_MEMORY = (0, 11, 2)  # "Model loading took X GiB memory and ..."
CUDAGRAPH_ESTIMATE_LOGGED = (0, 18)  # "Estimated CUDA graph memory: X GiB total"
STATS_PREEMPTIONS = (0, 11, 2)  # "Preemptions: N" in the periodic stats line
INIT_ENGINE_COMPILATION = (0, 29)  # "... took X s (compilation: Y s)"
V2_MODEL_RUNNER = (0, 29)  # model loading logged by model_runner.py
# torch.compile's lines, read in public logs (not in tests/fixtures/vllm_logs), so the
# boundaries are approximate: "rank_0_0 for vLLM's torch.compile" and "for general shape"
# in a 0.8 log (2025-05); ".../rank_0_0/backbone" in a 2025-10 development log; "for
# compile range (1, N)" in 2026-02 and 2026-06 logs.
COMPILE_BACKBONE_DIR = (0, 11)
COMPILE_RANGE_WORDING = (0, 13)

ENGINE_DEAD_TEXT = "EngineCore encountered an issue. See stack trace (above) for the root cause."
_SITE = "/usr/local/lib/python3.12/dist-packages/vllm"


class Process(StrEnum):
    API_SERVER = "APIServer"
    ENGINE_CORE = "EngineCore"


def format_gib(num_bytes: float, version: VllmVersion, fmt: str = ".2f") -> str:
    """GiB as the release prints them: ``%.2f`` before 0.14, ``round(x, 2)`` with ``%s`` after."""
    if version.at_least(FORMAT_GIB):
        return str(round(num_bytes / GiB, 2))
    return format(num_bytes / GiB, fmt)


class VllmLog:
    """Writes vLLM-format lines for the processes of one emulated vLLM server."""

    def __init__(
        self,
        version: VllmVersion,
        *,
        out: TextIO | None = None,
        err: TextIO | None = None,
        pid: int | None = None,
    ) -> None:
        self.version = version
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.pid = os.getpid() if pid is None else pid

    @property
    def engine_core_name(self) -> str:
        if self.version.at_least(ENGINE_CORE_PLAIN):
            return "EngineCore"
        if self.version.at_least(ENGINE_CORE_DP0):
            return "EngineCore_DP0"
        return "EngineCore_0"

    def prefix(self, process: Process) -> str:
        if not self.version.at_least(PROCESS_PREFIXES):
            return ""
        name = self.engine_core_name if process is Process.ENGINE_CORE else process.value
        return f"({name} pid={self.pid}) "

    def info(self, process: Process, where: str, message: str) -> None:
        self.log(process, "INFO", where, message)

    def log(self, process: Process, level: str, where: str, message: str) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        self.emit(process, f"{level} {stamp} [{where}] {message}")

    def emit(self, process: Process, text: str, *, stderr: bool = False) -> None:
        stream = self.err if stderr else self.out
        lines = "".join(self.prefix(process) + line + "\n" for line in text.splitlines() or [""])
        try:
            stream.write(lines)
            stream.flush()
        except (OSError, ValueError):
            # Whoever read the log went away (closed pipe or file); keep serving, as vLLM's
            # logging handlers do.
            pass


@dataclass(frozen=True)
class ServerIdentity:
    """What the startup lines name: the model as given, the served name, where it listens."""

    model: str
    served_model_names: tuple[str, ...]
    host: str
    port: int
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    seed: int


# --- startup ----------------------------------------------------------------------------


def log_banner(log: VllmLog, who: ServerIdentity, non_default_args: dict[str, object]) -> None:
    v = log.version
    if v.at_least(BANNER_WITH_MODEL):
        log.info(
            Process.API_SERVER,
            "api_utils.py:286",
            f"vLLM server version {v}, serving model {who.model}",
        )
    else:
        log.info(Process.API_SERVER, "api_server.py:1882", f"vLLM API server version {v}")
    log.info(Process.API_SERVER, "utils.py:253", f"non-default args: {non_default_args!r}")


def log_model_config(log: VllmLog, model: ModelSpec, plan: MemoryPlan) -> None:
    log.info(Process.API_SERVER, "model.py:631", f"Resolved architecture: {model.architecture}")
    log.info(Process.API_SERVER, "model.py:1745", f"Using max model len {plan.max_model_len}")
    log.info(
        Process.API_SERVER,
        "scheduler.py:216",
        f"Chunked prefill is enabled with max_num_batched_tokens={plan.max_num_batched_tokens}.",
    )


def log_engine_config(
    log: VllmLog, who: ServerIdentity, model: ModelSpec, plan: MemoryPlan, enforce_eager: bool
) -> None:
    quantization = None if model.quantization is Quantization.NONE else model.quantization.value
    fields = [
        f"model='{who.model}'",
        "speculative_config=None",
        f"tokenizer='{who.model}'",
        "skip_tokenizer_init=False",
        "tokenizer_mode=auto",
        "revision=None",
        "tokenizer_revision=None",
        "trust_remote_code=False",
        f"dtype=torch.{model.dtype}",
        f"max_seq_len={plan.max_model_len}",
        "download_dir=None",
        "load_format=auto",
        f"tensor_parallel_size={plan.tensor_parallel_size}",
        "pipeline_parallel_size=1",
        "data_parallel_size=1",
        "disable_custom_all_reduce=False",
        f"quantization={quantization}",
        f"enforce_eager={enforce_eager}",
        f"kv_cache_dtype={plan.kv_cache_dtype}",
        "device_config=cuda",
        f"seed={who.seed}",
        f"served_model_name={who.served_model_names[0]}",
        f"enable_prefix_caching={who.enable_prefix_caching}",
        f"chunked_prefill_enabled={who.enable_chunked_prefill}",
    ]
    log.info(
        Process.ENGINE_CORE,
        "core.py:93",
        f"Initializing a V1 LLM engine (v{log.version}) with config: " + ", ".join(fields),
    )


def log_model_loading(log: VllmLog, plan: MemoryPlan, load_s: float) -> None:
    v = log.version
    where = "model_runner.py:404" if v.at_least(V2_MODEL_RUNNER) else "gpu_model_runner.py:2653"
    size = format_gib(plan.weights_bytes, v, ".4f")
    memory = " memory" if v.at_least(LOADING_SAYS_MEMORY) else ""
    log.info(
        Process.ENGINE_CORE,
        where,
        f"Model loading took {size} GiB{memory} and {load_s:.6f} seconds",
    )


def log_torch_compile(
    log: VllmLog,
    cache_dir: str,
    *,
    warm: bool,
    compile_s: float,
    max_num_batched_tokens: int,
) -> None:
    """torch.compile's lines: a cold start compiles (and keeps the result in the cache
    directory), a warm one loads what an earlier start compiled."""
    v = log.version
    backbone = v.at_least(COMPILE_BACKBONE_DIR)
    where = f"{cache_dir}/rank_0_0" + ("/backbone" if backbone else "")
    log.info(
        Process.ENGINE_CORE,
        "backends.py:1089",
        f"Using cache directory: {where} for vLLM's torch.compile",
    )
    dynamo_s = compile_s * 0.3  # tracing the model's bytecode, cold or warm
    log.info(
        Process.ENGINE_CORE, "backends.py:1148", f"Dynamo bytecode transform time: {dynamo_s:.2f} s"
    )
    if v.at_least(COMPILE_RANGE_WORDING):
        shape = f"compile range (1, {max_num_batched_tokens})"
    else:
        shape = "dynamic shape" if backbone else "general shape"
    if warm:
        log.info(
            Process.ENGINE_CORE,
            "backends.py:292",
            f"Directly load the compiled graph(s) for {shape} from the cache, "
            f"took {compile_s - dynamo_s:.3f} s",
        )
    else:
        log.info(
            Process.ENGINE_CORE,
            "backends.py:393",
            f"Compiling a graph for {shape} takes {compile_s - dynamo_s:.2f} s",
        )
    log.info(
        Process.ENGINE_CORE, "monitor.py:34", f"torch.compile takes {compile_s:.2f} s in total"
    )


def log_profile_result(log: VllmLog, plan: MemoryPlan, kv_cache_memory_bytes: int | None) -> None:
    """What the memory profiling found: the CUDA-graph estimate and the KV cache memory."""
    v = log.version
    graphs_estimated = v.at_least(CUDAGRAPH_ESTIMATE_LOGGED) and plan.cudagraph_bytes > 0
    if graphs_estimated:
        log.info(
            Process.ENGINE_CORE,
            "gpu_model_runner.py:4703",
            f"Estimated CUDA graph memory: {plan.cudagraph_bytes / GiB:.2f} GiB total",
        )
    if kv_cache_memory_bytes is not None:
        log.info(
            Process.ENGINE_CORE,
            "gpu_worker.py:262",
            f"Initial free memory {format_gib(plan.free_bytes, v)} GiB, reserved "
            f"{format_gib(kv_cache_memory_bytes, v)} GiB memory for KV Cache as specified by "
            "kv_cache_memory_bytes config and skipped memory profiling. This does not respect "
            "the gpu_memory_utilization config. Only use kv_cache_memory_bytes config when you "
            "want manual control of KV cache memory size. If OOM'ed, check the difference of "
            "initial free memory between the current run and the previous run where "
            "kv_cache_memory_bytes is suggested and update it correspondingly.",
        )
        return
    log.info(
        Process.ENGINE_CORE,
        "gpu_worker.py:298",
        f"Available KV cache memory: {format_gib(plan.kv_cache_bytes, v)} GiB",
    )
    if graphs_estimated:
        log.info(Process.ENGINE_CORE, "gpu_worker.py:640", _cudagraph_note(plan, v))


def log_kv_cache_size(log: VllmLog, plan: MemoryPlan) -> None:
    """The KV cache size in tokens and the maximum concurrency (one line from 0.28)."""
    tokens = f"GPU KV cache size: {plan.kv_cache_tokens:,} tokens"
    concurrency = (
        f"Maximum concurrency for {plan.max_model_len:,} tokens per request: "
        f"{plan.max_concurrency:.2f}x"
    )
    if log.version.at_least(COMBINED_KV_LOG_LINE):
        log.info(Process.ENGINE_CORE, "kv_cache_utils.py:2032", f"{tokens}, {concurrency}")
    else:
        log.info(Process.ENGINE_CORE, "kv_cache_utils.py:1087", tokens)
        log.info(Process.ENGINE_CORE, "kv_cache_utils.py:1091", concurrency)


def _cudagraph_note(plan: MemoryPlan, v: VllmVersion) -> str:
    util = plan.gpu_memory_utilization
    share = plan.cudagraph_bytes / plan.total_bytes
    if v.at_least(CUDAGRAPH_IN_BUDGET):
        return (
            "CUDA graph memory profiling is enabled (default since v0.21.0). The current "
            f"--gpu-memory-utilization={util:.4f} is equivalent to "
            f"--gpu-memory-utilization={round(util - share, 4):.4f} without CUDA graph memory "
            "profiling. To maintain the same effective KV cache size as before, increase "
            f"--gpu-memory-utilization to {min(round(util + share, 4), 1.0):.4f}. To disable, "
            "set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0."
        )
    return (
        "In v0.19, CUDA graph memory profiling will be enabled by default "
        "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1), which more accurately accounts for CUDA "
        "graph memory during KV cache allocation. To try it now, set "
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 and increase --gpu-memory-utilization from "
        f"{util:.4f} to {min(round(util + share, 4), 1.0):.4f} to maintain the same effective KV "
        "cache size."
    )


def log_graph_capture(log: VllmLog, plan: MemoryPlan, capture_s: float) -> None:
    v = log.version
    where = "model_runner.py:960" if v.at_least(V2_MODEL_RUNNER) else "gpu_model_runner.py:3480"
    log.info(
        Process.ENGINE_CORE,
        where,
        f"Graph capturing finished in {capture_s:.0f} secs, took {plan.cudagraph_bytes / GiB:.2f} GiB",
    )


def log_init_engine(log: VllmLog, init_s: float, compile_s: float) -> None:
    text = "init engine (profile, create kv cache, warmup model) took "
    if log.version.at_least(INIT_ENGINE_COMPILATION):
        text += f"{init_s:.2f} s (compilation: {compile_s:.2f} s)"
    else:
        text += f"{init_s:.2f} seconds"
    log.info(Process.ENGINE_CORE, "core.py:210", text)


def log_server_start(log: VllmLog, who: ServerIdentity, routes: Sequence[tuple[str, str]]) -> None:
    """From "Starting vLLM ... server on" to uvicorn's "Application startup complete."."""
    url = f"http://{who.host}:{who.port}"
    if log.version.at_least(STARTING_SERVER_LINE):
        log.info(Process.API_SERVER, "api_server.py:2012", f"Starting vLLM server on {url}")
    else:
        log.info(Process.API_SERVER, "api_server.py:1971", f"Starting vLLM API server 0 on {url}")
    log.info(Process.API_SERVER, "launcher.py:36", "Available routes are:")
    for path, methods in routes:
        log.info(Process.API_SERVER, "launcher.py:44", f"Route: {path}, Methods: {methods}")
    log.emit(Process.API_SERVER, f"INFO:     Started server process [{log.pid}]")
    log.emit(Process.API_SERVER, "INFO:     Waiting for application startup.")
    log.emit(Process.API_SERVER, "INFO:     Application startup complete.")


def log_server_stop(log: VllmLog) -> None:
    log.emit(Process.API_SERVER, "INFO:     Shutting down")
    log.emit(Process.API_SERVER, "INFO:     Waiting for application shutdown.")
    log.emit(Process.API_SERVER, "INFO:     Application shutdown complete.")
    log.emit(Process.API_SERVER, f"INFO:     Finished server process [{log.pid}]")


def log_access(log: VllmLog, peer: str, method: str, path: str, status: int, reason: str) -> None:
    """uvicorn's access line."""
    log.emit(Process.API_SERVER, f'INFO:     {peer} - "{method} {path} HTTP/1.1" {status} {reason}')


# --- failures ---------------------------------------------------------------------------


def _traceback(frames: Sequence[tuple[str, int, str, str]], last: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for path, line, function, code in frames:
        lines.append(f'  File "{_SITE}/{path}", line {line}, in {function}')
        lines.append(f"    {code}")
    lines.append(last)
    return "\n".join(lines)


_ENGINE_INIT_FRAMES = (
    ("v1/engine/core.py", 699, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
    ("v1/engine/core.py", 498, "__init__", "super().__init__("),
    ("v1/engine/core.py", 92, "__init__", "self._initialize_kv_caches(vllm_config)"),
)
_API_INIT_FRAMES = (
    (
        "entrypoints/openai/api_server.py",
        1953,
        "run_server_worker",
        "async with build_async_engine_client(",
    ),
    (
        "v1/engine/core_client.py",
        448,
        "__init__",
        "with launch_core_engines(vllm_config, executor_class,",
    ),
    ("v1/engine/utils.py", 729, "launch_core_engines", "wait_for_engine_startup("),
)


def log_startup_failure(log: VllmLog, failure: StartupFailure) -> None:
    """vLLM's failure as it surfaces: a config error in the API server, else the engine core's."""
    error_type = failure.error_type
    if error_type.startswith("pydantic ValidationError for "):
        config_class = error_type.removeprefix("pydantic ValidationError for ")
        last = (
            f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {config_class}\n"
            f"  Value error, {failure.message} [type=value_error, input_value=ArgsKwargs((), "
            "{}), input_type=ArgsKwargs]\n"
            "    For further information visit https://errors.pydantic.dev/2.11/v/value_error"
        )
        frames = (("engine/arg_utils.py", 1331, "create_engine_config", "config = VllmConfig("),)
        log.emit(Process.API_SERVER, _traceback(frames, last), stderr=True)
        return
    where = "core.py:708"
    log.log(Process.ENGINE_CORE, "ERROR", where, "EngineCore failed to start.")
    for line in _traceback(_ENGINE_INIT_FRAMES, f"{error_type}: {failure.message}").splitlines():
        log.log(Process.ENGINE_CORE, "ERROR", where, line)
    log.emit(Process.ENGINE_CORE, "Process EngineCore:", stderr=True)
    log.emit(
        Process.ENGINE_CORE,
        _traceback(_ENGINE_INIT_FRAMES, f"{error_type}: {failure.message}"),
        stderr=True,
    )
    log.emit(
        Process.API_SERVER,
        _traceback(
            _API_INIT_FRAMES,
            "RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {}",
        ),
        stderr=True,
    )


def log_engine_dead(log: VllmLog, reason: str) -> None:
    """A fatal error in the running engine core, as the engine and the API server log it."""
    where = "core.py:710"
    log.log(Process.ENGINE_CORE, "ERROR", where, "EngineCore encountered a fatal error.")
    frames = (
        ("v1/engine/core.py", 701, "run_engine_core", "engine_core.run_busy_loop()"),
        ("v1/engine/core.py", 728, "run_busy_loop", "self._process_engine_step()"),
        (
            "v1/engine/core.py",
            754,
            "_process_engine_step",
            "outputs, model_executed = self.step_fn()",
        ),
    )
    for line in _traceback(frames, f"torch.OutOfMemoryError: {reason}").splitlines():
        log.log(Process.ENGINE_CORE, "ERROR", where, line)
    log.log(
        Process.API_SERVER,
        "ERROR",
        "core_client.py:564",
        f"Engine core proc {log.engine_core_name} died unexpectedly, shutting down client.",
    )
    log.log(Process.API_SERVER, "ERROR", "async_llm.py:480", "AsyncLLM output_handler failed.")
    log.log(
        Process.API_SERVER,
        "ERROR",
        "async_llm.py:480",
        f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD_TEXT}",
    )


# --- periodic stats ---------------------------------------------------------------------


@dataclass(frozen=True)
class IntervalStats:
    """One stats interval of the engine, as vLLM's LoggingStatLogger sums it."""

    prompt_throughput: float
    generation_throughput: float
    num_running: int
    num_waiting: int
    num_preemptions: int
    kv_cache_usage: float
    prefix_cache_hit_rate: float | None  # None: prefix caching off


def log_stats(log: VllmLog, stats: IntervalStats) -> None:
    parts = [
        f"Avg prompt throughput: {stats.prompt_throughput:.1f} tokens/s",
        f"Avg generation throughput: {stats.generation_throughput:.1f} tokens/s",
        f"Running: {stats.num_running} reqs",
        f"Waiting: {stats.num_waiting} reqs",
    ]
    if stats.num_preemptions and log.version.at_least(STATS_PREEMPTIONS):
        parts.append(f"Preemptions: {stats.num_preemptions}")
    parts.append(f"GPU KV cache usage: {stats.kv_cache_usage * 100:.1f}%")
    if stats.prefix_cache_hit_rate is not None:
        parts.append(f"Prefix cache hit rate: {stats.prefix_cache_hit_rate * 100:.1f}%")
    log.info(Process.API_SERVER, "loggers.py:123", "Engine 000: " + ", ".join(parts))

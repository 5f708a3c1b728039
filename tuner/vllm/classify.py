"""Read why vLLM failed, or what it is doing, from the lines it printed.

``classify_failure`` finds vLLM's own failure message in a server log and names its
kind; ``parse_stats_line`` reads the periodic ``Engine 000: ...`` stats line. Both
work on real vLLM (GPU and CPU builds, 0.10 to current) and on ``tuner sim-serve``,
which prints the same lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tuner.vllm.failures import StartupFailure, StartupFailureKind
from tuner.vllm.log import RE_ANSI

# Startup milestones, to tell in which phase a CUDA out-of-memory happened.
_WEIGHTS_LOADED = re.compile(r"Model loading took|Loading model weights took")
_KV_SIZED = re.compile(r"Available KV cache memory|KV cache size:")

_PATTERNS: tuple[tuple[re.Pattern[str], StartupFailureKind, str], ...] = (
    # The Hugging Face hub, as vLLM prints huggingface_hub's errors (and wraps them in its
    # own "Invalid repository ID ..." ValueError): a gated repo first, as its log holds the
    # wrapper too; within each kind the most telling line first, for the message.
    *(
        (re.compile(text), StartupFailureKind.MODEL_ACCESS_DENIED, "huggingface_hub")
        for text in (
            r"Cannot access gated repo|You are trying to access a gated repo",
            r"is restricted\. You must (?:have access to it and )?be authenticated",
            r"GatedRepoError",
        )
    ),
    *(
        (re.compile(text), StartupFailureKind.MODEL_NOT_FOUND, "huggingface_hub")
        for text in (
            r"Invalid repository ID or local directory specified",
            r"is not a local folder and is not a valid model identifier",
            r"Repository Not Found for url",
            r"RepositoryNotFoundError|HFValidationError: Repo id must",
        )
    ),
    (
        re.compile(r"Free memory on device.*is less than desired GPU memory utilization"),
        StartupFailureKind.BUDGET_ABOVE_FREE_MEMORY,
        "ValueError",
    ),
    (
        # vLLM's CPU build: --gpu-memory-utilization is the share of the NUMA node's memory.
        re.compile(
            r"Available memory on node \d+ \(.*\) on startup is less than desired CPU memory "
            r"utilization"
        ),
        StartupFailureKind.BUDGET_ABOVE_FREE_MEMORY,
        "ValueError",
    ),
    (
        re.compile(r"No available memory for the cache blocks"),
        StartupFailureKind.NO_MEMORY_FOR_CACHE_BLOCKS,
        "ValueError",
    ),
    (
        # The profile left a negative KV budget; vLLM's ValueError follows (0.10 on).
        re.compile(r"Available KV cache memory: -[0-9.]+ GiB"),
        StartupFailureKind.NO_MEMORY_FOR_CACHE_BLOCKS,
        "ValueError",
    ),
    (
        # CPU build, KV cache sized from the utilization: what the process already uses
        # leaves nothing (vLLM prints the remainder, zero or negative, first).
        re.compile(
            r"on kv cache allocation is less than requested memory for kv \((?:-[0-9.]+|0\.0+)/"
        ),
        StartupFailureKind.NO_MEMORY_FOR_CACHE_BLOCKS,
        "ValueError",
    ),
    (
        # CPU build: the KV cache asked for (--kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE
        # or the utilization's remainder) is more than the node has free.
        re.compile(r"on kv cache allocation is less than requested memory for kv"),
        StartupFailureKind.BUDGET_ABOVE_FREE_MEMORY,
        "ValueError",
    ),
    (
        re.compile(r"To serve at least one request with the models?'s? max seq len"),
        StartupFailureKind.MAX_MODEL_LEN_DOES_NOT_FIT,
        "ValueError",
    ),
    (
        re.compile(r"The model's max seq len \(\d+\) is larger than the maximum number of tokens"),
        StartupFailureKind.MAX_MODEL_LEN_DOES_NOT_FIT,
        "ValueError",
    ),
    (
        re.compile(r"error: unrecognized arguments:"),
        StartupFailureKind.FLAG_REJECTED,
        "argparse",
    ),
    (
        re.compile(r"error: argument --[\w-]+: invalid (?:choice|\w+ value)"),
        StartupFailureKind.FLAG_REJECTED,
        "argparse",
    ),
    (
        # The second form: no attention backend's kernel takes the block size (e.g. the CPU
        # build's attention needs a multiple of 32).
        re.compile(
            r"[Bb]lock size (?:must be a multiple of|\d+ is not supported)|No common block size for \d+"
        ),
        StartupFailureKind.BLOCK_SIZE_UNSUPPORTED,
        "ValueError",
    ),
    (
        re.compile(
            r"Invalid kv_cache_dtype|Unknown kv cache dtype|No attention backend supports "
            r"kv_cache_dtype|fp8 KV cache needs"
        ),
        StartupFailureKind.KV_CACHE_DTYPE_UNSUPPORTED,
        "ValueError",
    ),
    (
        re.compile(
            r"must be greater than or equal to max_num_seqs|is greater than the derived max_model_len"
            r"|must be divisible by tensor parallel size|is smaller than max_model_len"
            r"|cannot be larger than the number of available GPUs"
        ),
        StartupFailureKind.INVALID_CONFIGURATION,
        "ValueError",
    ),
)
# Every way CUDA, its libraries and torch say a device allocation failed: torch's
# OutOfMemoryError ("CUDA out of memory"), a CUDA runtime or driver error, cuBLAS/cuDNN
# failing to allocate a handle or workspace, NCCL's "Cuda failure 'out of memory'".
_CUDA_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA (?:driver )?error: out of memory"
    r"|Cuda failure '?out of memory|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED"
    r"|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY",
    re.IGNORECASE,
)
# torch's caching allocator, at WARNING: it flushes its cache and retries, and may then
# succeed; so it names the cause only of a process that failed and said nothing stronger.
_ALLOCATOR_OOM = re.compile(r"memory allocation failed with OOM on device")
_ENGINE_DEATH = re.compile(
    r"EngineCore encountered a fatal error|Engine core proc .* died unexpectedly|EngineDeadError"
    r"|EngineCore encountered an issue|AsyncLLM output_handler failed"
    r"|Worker proc \S+ died unexpectedly"
)
# Frames of a startup traceback that tell its phase, outermost first in a traceback.
_PHASE_FRAMES: tuple[tuple[re.Pattern[str], StartupFailureKind], ...] = (
    (
        re.compile(
            r"\b(?:compile_or_warm_up_model|capture_model)\b|torch\.cuda\.graph\(|capture_end"
        ),
        StartupFailureKind.CUDA_OOM_WARMUP,
    ),
    (
        re.compile(
            r"\b(?:determine_available_memory|determine_num_available_blocks|profile_run"
            r"|_dummy_sampler_run)\b"
        ),
        StartupFailureKind.CUDA_OOM_PROFILING,
    ),
    (
        re.compile(
            r"\b(?:load_model|load_weights|process_weights_after_loading|initialize_model)\b"
        ),
        StartupFailureKind.WEIGHTS_DO_NOT_FIT,
    ),
)
_SERVING = re.compile(r"Application startup complete")  # the API server is up
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
_STATS = re.compile(
    r"Avg prompt throughput: (?P<prompt>[\d.]+) tokens/s, Avg generation throughput: "
    r"(?P<gen>[\d.]+) tokens/s, Running: (?P<running>\d+) reqs, Waiting: (?P<waiting>\d+) reqs"
    r"(?:.*?Preemptions: (?P<preempt>\d+))?(?:.*?(?:GPU|CPU) KV cache usage: (?P<kv>[\d.]+)%)?"
    r"(?:.*?Prefix cache hit rate: (?P<hit>[\d.]+)%)?"
)


def _clean(line: str) -> str:
    return RE_ANSI.sub("", line).rstrip()


_LOG_PREFIX = re.compile(r"^.*?\[[\w./-]+:\d+\]\s*")
_PROCESS_PREFIX = re.compile(r"^.*?\([^()]*\bpid=\d+[^()]*\)\s*")
_EXCEPTION = re.compile(r"^(?:[\w.]*(?:Error|Exception): |Value error, )")


def _message(line: str) -> str:
    """vLLM's message without the log prefix or the exception class."""
    text, n = _LOG_PREFIX.subn("", _clean(line), count=1)
    if not n:  # a raw traceback line: only the process's "(EngineCore pid=N) " prefix
        text = _PROCESS_PREFIX.sub("", text, count=1)
    text = text.strip()
    return _EXCEPTION.sub("", text, count=1).strip()


def classify_failure(text: str) -> StartupFailure | None:
    """vLLM's failure in a server log, or None when the log shows none."""
    lines = [_clean(line) for line in text.splitlines()]
    for pattern, kind, error_type in _PATTERNS:
        for line in lines:
            if pattern.search(line):
                return StartupFailure(kind=kind, error_type=error_type, message=_message(line))
    index = _first(lines, _CUDA_OOM)
    if index is None:
        index = _first(lines, _ALLOCATOR_OOM)
    if index is None:
        return None
    served = any(_SERVING.search(line) for line in lines[:index])
    return StartupFailure(
        kind=StartupFailureKind.RUNTIME_OOM if served else _startup_oom_phase(lines, index),
        error_type="torch.OutOfMemoryError",
        message=_message(lines[index]),
    )


def _first(lines: list[str], pattern: re.Pattern[str]) -> int | None:
    return next((i for i, line in enumerate(lines) if pattern.search(line)), None)


def _startup_oom_phase(lines: list[str], index: int) -> StartupFailureKind:
    """In which startup phase the out-of-memory at ``lines[index]`` happened: from the
    frames of its traceback (the outermost that tells), else from the milestones before."""
    start = max(index - 400, 0)
    for i in range(index - 1, start - 1, -1):
        if _TRACEBACK.search(lines[i]):
            start = i
            break
    for line in lines[start:index]:
        for pattern, kind in _PHASE_FRAMES:
            if pattern.search(line):
                return kind
    before = lines[:index]
    if any(_KV_SIZED.search(b) for b in before):
        return StartupFailureKind.CUDA_OOM_WARMUP
    if any(_WEIGHTS_LOADED.search(b) for b in before):
        return StartupFailureKind.CUDA_OOM_PROFILING
    return StartupFailureKind.WEIGHTS_DO_NOT_FIT


def engine_death_failure(text: str) -> StartupFailure | None:
    """How the engine died while serving, if the log says it did: RUNTIME_OOM when any
    out-of-memory text is in the log (a V1 engine prints the death notice first and the
    traceback that ends in the OOM after it, or the other way round), else ENGINE_DIED
    with vLLM's death notice."""
    lines = [_clean(line) for line in text.splitlines()]
    death = _first(lines, _ENGINE_DEATH)
    if death is None:
        return None
    oom = _first(lines, _CUDA_OOM)
    if oom is None:
        oom = _first(lines, _ALLOCATOR_OOM)
    if oom is not None:
        return StartupFailure(
            kind=StartupFailureKind.RUNTIME_OOM,
            error_type="torch.OutOfMemoryError",
            message=_message(lines[oom]),
        )
    return StartupFailure(
        kind=StartupFailureKind.ENGINE_DIED,
        error_type="EngineDeadError",
        message=_message(lines[death]),
    )


def engine_death(text: str) -> str | None:
    """The line in which vLLM reports its engine died while serving (its root cause, an
    out-of-memory, where the log has one), if any."""
    failure = engine_death_failure(text)
    return failure.message if failure is not None else None


def log_excerpt(text: str, *, around: str | None = None, lines: int = 20) -> str:
    """The last lines of a log, or the lines around the first one containing ``around``."""
    all_lines = [_clean(line) for line in text.splitlines()]
    if around:
        for index, line in enumerate(all_lines):
            if around in line:
                return "\n".join(all_lines[max(index - lines // 2, 0) : index + lines // 2])
    return "\n".join(all_lines[-lines:])


@dataclass(frozen=True)
class RuntimeStats:
    """vLLM's periodic engine stats line."""

    prompt_throughput: float
    generation_throughput: float
    running: int
    waiting: int
    preemptions: int
    kv_cache_usage: float  # 0-1
    prefix_cache_hit_rate: float | None  # 0-1


def parse_stats_line(line: str) -> RuntimeStats | None:
    match = _STATS.search(_clean(line))
    if match is None:
        return None
    hit = match["hit"]
    return RuntimeStats(
        prompt_throughput=float(match["prompt"]),
        generation_throughput=float(match["gen"]),
        running=int(match["running"]),
        waiting=int(match["waiting"]),
        preemptions=int(match["preempt"] or 0),
        kv_cache_usage=float(match["kv"] or 0.0) / 100,
        prefix_cache_hit_rate=float(hit) / 100 if hit is not None else None,
    )

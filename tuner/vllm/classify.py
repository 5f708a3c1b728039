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
_CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError")
_ENGINE_DEATH = re.compile(
    r"EngineCore encountered a fatal error|Engine core proc .* died unexpectedly|EngineDeadError"
    r"|EngineCore encountered an issue"
)
_STATS = re.compile(
    r"Avg prompt throughput: (?P<prompt>[\d.]+) tokens/s, Avg generation throughput: "
    r"(?P<gen>[\d.]+) tokens/s, Running: (?P<running>\d+) reqs, Waiting: (?P<waiting>\d+) reqs"
    r"(?:.*?Preemptions: (?P<preempt>\d+))?(?:.*?(?:GPU|CPU) KV cache usage: (?P<kv>[\d.]+)%)?"
    r"(?:.*?Prefix cache hit rate: (?P<hit>[\d.]+)%)?"
)


def _clean(line: str) -> str:
    return RE_ANSI.sub("", line).rstrip()


_LOG_PREFIX = re.compile(r"^.*?\[[\w./-]+:\d+\]\s*")
_EXCEPTION = re.compile(r"^(?:[\w.]*(?:Error|Exception): |Value error, )")


def _message(line: str) -> str:
    """vLLM's message without the log prefix or the exception class."""
    text = _LOG_PREFIX.sub("", _clean(line), count=1).strip()
    return _EXCEPTION.sub("", text, count=1).strip()


def classify_failure(text: str) -> StartupFailure | None:
    """vLLM's failure in a server log, or None when the log shows none."""
    lines = [_clean(line) for line in text.splitlines()]
    for pattern, kind, error_type in _PATTERNS:
        for line in lines:
            if pattern.search(line):
                return StartupFailure(kind=kind, error_type=error_type, message=_message(line))
    for index, line in enumerate(lines):
        if _CUDA_OOM.search(line):
            before = lines[:index]
            if any(_KV_SIZED.search(b) for b in before):
                kind = StartupFailureKind.CUDA_OOM_WARMUP
            elif any(_WEIGHTS_LOADED.search(b) for b in before):
                kind = StartupFailureKind.CUDA_OOM_PROFILING
            else:
                kind = StartupFailureKind.WEIGHTS_DO_NOT_FIT
            return StartupFailure(
                kind=kind, error_type="torch.OutOfMemoryError", message=_message(line)
            )
    return None


def engine_death(text: str) -> str | None:
    """The line in which vLLM reports its engine died while serving, if any."""
    lines = [_clean(line) for line in text.splitlines()]
    for index, line in enumerate(lines):
        if _ENGINE_DEATH.search(line):
            # The root cause (often a CUDA OOM) is printed near the death notice.
            nearby = lines[max(index - 20, 0) : index + 20]
            for candidate in nearby:
                if _CUDA_OOM.search(candidate):
                    return _message(candidate)
            return _message(line)
    return None


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

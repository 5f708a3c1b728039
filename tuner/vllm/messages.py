"""vLLM's startup failure messages, worded as the emulated release words them.

The memory model predicts failures with these texts and the simulated engine
prints them, so a log reader cannot tell a simulated failure from a real one.
Each function returns a ``StartupFailure`` whose ``message`` is vLLM's text and
whose ``error_type`` is the exception vLLM raises it with.
"""

from __future__ import annotations

from tuner.vllm.failures import StartupFailure, StartupFailureKind
from tuner.vllm.gpus import GiB, MiB
from tuner.vllm.versions import (
    DOCS_LINK_IN_KV_ERRORS,
    FORMAT_GIB,
    MODEL_S_TYPO_FIXED,
    VllmVersion,
)

DOCS = "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."


def gib(value: float) -> str:
    """vLLM's rounding of byte counts in messages: ``str(round(x / GiB, 2))``."""
    return str(round(value / GiB, 2))


def budget_above_free(
    version: VllmVersion, free: int, total: int, utilization: float, requested: int
) -> StartupFailure:
    device = " cuda:0" if version.at_least(FORMAT_GIB) else ""
    return StartupFailure(
        kind=StartupFailureKind.BUDGET_ABOVE_FREE_MEMORY,
        error_type="ValueError",
        message=(
            f"Free memory on device{device} ({gib(free)}/{gib(total)} GiB) on startup is less "
            f"than desired GPU memory utilization ({utilization}, {gib(requested)} GiB). "
            "Decrease GPU memory utilization or reduce GPU memory used by other processes."
        ),
    )


def cuda_oom(total: int, free: int, wanted: int) -> StartupFailure:
    return StartupFailure(
        kind=StartupFailureKind.WEIGHTS_DO_NOT_FIT,
        error_type="torch.OutOfMemoryError",
        message=(
            f"CUDA out of memory. Tried to allocate {wanted / GiB:.2f} GiB. GPU 0 has a total "
            f"capacity of {total / GiB:.2f} GiB of which {max(free, 0) / GiB:.2f} GiB is free."
        ),
    )


def cuda_oom_after_kv_cache(total: int, free: int, wanted: int) -> StartupFailure:
    """Out of memory once the KV cache is allocated: graph capture or sampler warm-up."""
    return StartupFailure(
        kind=StartupFailureKind.CUDA_OOM_WARMUP,
        error_type="torch.OutOfMemoryError",
        message=(
            f"CUDA out of memory. Tried to allocate {wanted / MiB:.2f} MiB. GPU 0 has a total "
            f"capacity of {total / GiB:.2f} GiB of which {max(free, 0) / MiB:.2f} MiB is free."
        ),
    )


def no_cache_memory(version: VllmVersion) -> StartupFailure:
    text = (
        "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
        "when initializing the engine"
    )
    if version.at_least(MODEL_S_TYPO_FIXED):
        text += (
            " (this flag also controls CPU memory reservation on the CPU backend, despite its "
            f"name). {DOCS}"
        )
    elif version.at_least(DOCS_LINK_IN_KV_ERRORS):
        text += f". {DOCS}"
    else:
        text += "."
    return StartupFailure(
        kind=StartupFailureKind.NO_MEMORY_FOR_CACHE_BLOCKS, error_type="ValueError", message=text
    )


def max_model_len_too_large(
    version: VllmVersion, max_model_len: int, needed: int, available: int, estimated: int
) -> StartupFailure:
    if version.at_least(FORMAT_GIB):
        need_s, avail_s = gib(needed), gib(available)
        estimate = (
            f"Based on the available memory, the estimated maximum model length is {estimated}. "
            if estimated > 0
            else ""
        )
    else:
        need_s, avail_s = f"{needed / GiB:.2f}", f"{available / GiB:.2f}"
        estimate = (
            f"Based on the available memory, the estimated maximum model length is {estimated}."
            if estimated > 0
            else ""
        ) + " "
    whose = "model's" if version.at_least(MODEL_S_TYPO_FIXED) else "models's"
    advice = (
        "Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU "
        "backend) or decreasing `max_model_len` when initializing the engine."
        if version.at_least(MODEL_S_TYPO_FIXED)
        else "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine."
    )
    text = (
        f"To serve at least one request with the {whose} max seq len ({max_model_len}), "
        f"({need_s} GiB KV cache is needed, which is larger than the available KV cache memory "
        f"({avail_s} GiB). {estimate}{advice}"
    )
    if version.at_least(DOCS_LINK_IN_KV_ERRORS):
        text += f" {DOCS}"
    return StartupFailure(
        kind=StartupFailureKind.MAX_MODEL_LEN_DOES_NOT_FIT, error_type="ValueError", message=text
    )


def config_error(config_class: str, text: str) -> StartupFailure:
    """A config-time check; vLLM raises it inside a pydantic dataclass."""
    return StartupFailure(
        kind=StartupFailureKind.INVALID_CONFIGURATION,
        error_type=f"pydantic ValidationError for {config_class}",
        message=text,
    )


def heads_not_divisible(heads: int, tp: int) -> StartupFailure:
    return config_error(
        "VllmConfig",
        f"Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp}).",
    )


def more_ranks_than_gpus(tp: int, gpus: int) -> StartupFailure:
    return config_error(
        "ParallelConfig",
        f"Tensor parallel size ({tp}) cannot be larger than the number of available GPUs ({gpus}).",
    )


def max_model_len_above_derived(max_model_len: int, derived: int) -> StartupFailure:
    return config_error(
        "ModelConfig",
        f"User-specified max_model_len ({max_model_len}) is greater than the derived "
        f"max_model_len (max_position_embeddings={derived} or model_max_length=None in model's "
        "config.json). To allow overriding this maximum, set the env var "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme "
        "caution. If the model uses relative position encoding (RoPE), positions exceeding "
        "derived_max_model_len lead to nan. If the model uses absolute position encoding, "
        "positions exceeding derived_max_model_len will cause a CUDA array out-of-bounds error.",
    )


def batched_tokens_below_seqs(tokens: int, seqs: int) -> StartupFailure:
    return config_error(
        "SchedulerConfig",
        f"max_num_batched_tokens ({tokens}) must be greater than or equal to max_num_seqs ({seqs}).",
    )


def batched_tokens_below_model_len(tokens: int, max_model_len: int) -> StartupFailure:
    return config_error(
        "SchedulerConfig",
        f"max_num_batched_tokens ({tokens}) is smaller than max_model_len ({max_model_len}). "
        "This effectively limits the maximum sequence length to max_num_batched_tokens and makes "
        "vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease "
        "max_model_len.",
    )


def invalid_choice(flag: str, value: object, choices: tuple[object, ...]) -> StartupFailure:
    """argparse's rejection of a value outside a flag's choices (exit code 2)."""
    listed = ", ".join(repr(c) for c in choices)
    return StartupFailure(
        kind=StartupFailureKind.INVALID_CONFIGURATION,
        error_type="argparse",
        message=f"argument {flag}: invalid choice: {value!r} (choose from {listed})",
    )


def unrecognized_argument(flag: str) -> StartupFailure:
    return StartupFailure(
        kind=StartupFailureKind.INVALID_CONFIGURATION,
        error_type="argparse",
        message=f"unrecognized arguments: {flag}",
    )


def block_size_not_multiple_of_16() -> StartupFailure:
    return StartupFailure(
        kind=StartupFailureKind.BLOCK_SIZE_UNSUPPORTED,
        error_type="ValueError",
        message="Block size must be a multiple of 16.",
    )


def kv_dtype_unsupported(kv_cache_dtype: str, gpu_name: str, cc: tuple[int, int]) -> StartupFailure:
    return StartupFailure(
        kind=StartupFailureKind.KV_CACHE_DTYPE_UNSUPPORTED,
        error_type="ValueError",
        message=(
            f"No attention backend supports kv_cache_dtype={kv_cache_dtype} on {gpu_name} "
            f"(compute capability {cc[0]}.{cc[1]}): below compute capability 8.9 an fp8 KV "
            "cache needs vLLM 0.11 or newer (FlashInfer)."
        ),
    )

"""Why vLLM did not start, or stopped: one Enum shared by the memory model and the launcher."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class StartupFailureKind(StrEnum):
    """The ways a vLLM startup fails, each with the knob that cures it."""

    BUDGET_ABOVE_FREE_MEMORY = "budget_above_free_memory"
    WEIGHTS_DO_NOT_FIT = "weights_do_not_fit"
    NO_MEMORY_FOR_CACHE_BLOCKS = "no_memory_for_cache_blocks"
    MAX_MODEL_LEN_DOES_NOT_FIT = "max_model_len_does_not_fit"
    CUDA_OOM_PROFILING = "cuda_oom_in_profiling"
    CUDA_OOM_WARMUP = "cuda_oom_in_warmup_or_graph_capture"
    INVALID_CONFIGURATION = "invalid_configuration"
    FLAG_REJECTED = "flag_rejected"
    # While serving, after a successful startup.
    RUNTIME_OOM = "runtime_oom"
    ENGINE_DIED = "engine_died"
    BLOCK_SIZE_UNSUPPORTED = "block_size_unsupported"
    KV_CACHE_DTYPE_UNSUPPORTED = "kv_cache_dtype_unsupported"
    # The Hugging Face hub: no repository by that name (or no such local directory), or a
    # gated/private repository that this process has no token (or no access) for.
    MODEL_NOT_FOUND = "model_not_found"
    MODEL_ACCESS_DENIED = "model_access_denied"

    @property
    def is_out_of_memory(self) -> bool:
        return self in {
            StartupFailureKind.BUDGET_ABOVE_FREE_MEMORY,
            StartupFailureKind.WEIGHTS_DO_NOT_FIT,
            StartupFailureKind.NO_MEMORY_FOR_CACHE_BLOCKS,
            StartupFailureKind.MAX_MODEL_LEN_DOES_NOT_FIT,
            StartupFailureKind.CUDA_OOM_PROFILING,
            StartupFailureKind.CUDA_OOM_WARMUP,
            StartupFailureKind.RUNTIME_OOM,
        }

    @property
    def description(self) -> str:
        """The kind in a few words, for a trial's line."""
        return _DESCRIPTIONS[self]


_DESCRIPTIONS: dict[StartupFailureKind, str] = {
    StartupFailureKind.BUDGET_ABOVE_FREE_MEMORY: "the memory budget is above the GPU's free memory",
    StartupFailureKind.WEIGHTS_DO_NOT_FIT: "out of GPU memory loading the weights",
    StartupFailureKind.NO_MEMORY_FOR_CACHE_BLOCKS: "no GPU memory left for the KV cache",
    StartupFailureKind.MAX_MODEL_LEN_DOES_NOT_FIT: "the KV cache cannot hold one max-model-len request",
    StartupFailureKind.CUDA_OOM_PROFILING: "out of GPU memory in the memory profiling run",
    StartupFailureKind.CUDA_OOM_WARMUP: "out of GPU memory in warm-up or CUDA graph capture",
    StartupFailureKind.INVALID_CONFIGURATION: "vLLM rejected the configuration",
    StartupFailureKind.FLAG_REJECTED: "vLLM rejected a flag",
    StartupFailureKind.RUNTIME_OOM: "out of GPU memory while serving",
    StartupFailureKind.ENGINE_DIED: "the engine died",
    StartupFailureKind.BLOCK_SIZE_UNSUPPORTED: "the block size is not supported",
    StartupFailureKind.KV_CACHE_DTYPE_UNSUPPORTED: "the KV cache dtype is not supported",
    StartupFailureKind.MODEL_NOT_FOUND: "model not found on the Hugging Face hub",
    StartupFailureKind.MODEL_ACCESS_DENIED: "no access to the model on the Hugging Face hub (gated: set HF_TOKEN)",
}


class StartupFailure(BaseModel):
    """A startup failure with vLLM's own message text."""

    model_config = ConfigDict(frozen=True)

    kind: StartupFailureKind
    # The exception vLLM raises it with, e.g. "ValueError" or "argparse".
    error_type: str
    message: str

    def describe(self, *, max_chars: int = 160) -> str:
        """What failed and vLLM's own words, on one line."""
        words = " ".join(self.message.split())
        if len(words) > max_chars:
            words = words[: max_chars - 3] + "..."
        return f"{self.kind.description}: {words}"

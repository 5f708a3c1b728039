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

    @property
    def is_out_of_memory(self) -> bool:
        return self in {
            StartupFailureKind.BUDGET_ABOVE_FREE_MEMORY,
            StartupFailureKind.WEIGHTS_DO_NOT_FIT,
            StartupFailureKind.NO_MEMORY_FOR_CACHE_BLOCKS,
            StartupFailureKind.MAX_MODEL_LEN_DOES_NOT_FIT,
            StartupFailureKind.CUDA_OOM_PROFILING,
            StartupFailureKind.CUDA_OOM_WARMUP,
        }


class StartupFailure(BaseModel):
    """A startup failure with vLLM's own message text."""

    model_config = ConfigDict(frozen=True)

    kind: StartupFailureKind
    # The exception vLLM raises it with, e.g. "ValueError" or "argparse".
    error_type: str
    message: str

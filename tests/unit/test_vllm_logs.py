"""The log parser and the memory model against real vLLM startup logs from public sources."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from tuner.errors import LogParseError
from tuner.vllm.accuracy import LogCase, LogOrigin, evaluate, load_cases, transfer_rows
from tuner.vllm.gpus import GiB, get_gpu
from tuner.vllm.log import calibration_from_log, calibration_from_report, parse_startup_log
from tuner.vllm.memory import MemoryComponent, ServingParams, plan
from tuner.vllm.models import ModelSpec
from tuner.vllm.versions import VllmVersion

LOG_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_logs"
CASES: list[LogCase] = [
    case for index in sorted(LOG_DIR.glob("index*.yaml")) for case in load_cases(index)
]
SCORED = [case for case in CASES if not case.unified_memory]


def test_enough_real_logs_are_collected() -> None:
    assert len(CASES) >= 12
    real = [case for case in CASES if case.origin is LogOrigin.PUBLIC_FILE]
    assert all(case.source.startswith("https://") for case in real)
    built = [case for case in CASES if case.origin is LogOrigin.BUILT_FROM_FORMAT]
    assert built and all(
        "Built" in (case.note or "") or "shape" in (case.note or "") for case in built
    )
    assert len({case.model for case in CASES}) >= 5


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.file)
def test_parser_reads_the_logged_numbers(case: LogCase) -> None:
    report = parse_startup_log((LOG_DIR / case.file).read_text(encoding="utf-8"))
    logged = case.logged
    assert report.kv_cache_tokens == logged["kv_cache_tokens"]
    assert report.available_kv_bytes == pytest.approx(
        logged["available_kv_cache_gib"] * GiB, abs=0.006 * GiB
    )
    assert report.weights_bytes == pytest.approx(logged["weights_gib"] * GiB, abs=0.006 * GiB)
    if logged.get("max_concurrency") is not None:
        assert report.max_concurrency == pytest.approx(logged["max_concurrency"])


@pytest.mark.parametrize("case", SCORED, ids=lambda c: c.file)
def test_calibrated_prediction_is_within_half_a_percent(case: LogCase) -> None:
    row = evaluate(case, LOG_DIR)
    assert abs(row.calibrated_error) <= 0.005, row


def test_uncalibrated_median_error_is_within_five_percent() -> None:
    errors = [evaluate(case, LOG_DIR).error for case in SCORED]
    known = [abs(e) for e in errors if e is not None]
    assert len(known) >= 12
    assert statistics.median(known) <= 0.05


def test_every_release_to_the_current_one_has_a_log() -> None:
    minors = {VllmVersion.parse(case.vllm_version).minor for case in CASES}
    assert {29, 30, 31, 32, 33} <= minors


@pytest.mark.parametrize(
    "case",
    [c for c in SCORED if VllmVersion.parse(c.vllm_version).at_least((0, 21))],
    ids=lambda c: c.file,
)
def test_calibrated_prediction_at_other_settings_follows_vllms_budget(case: LogCase) -> None:
    """At another utilization the KV memory moves by exactly the change in budget, at another
    max_model_len it stays: the calibrated plan must agree to the block."""
    for row in transfer_rows(case, LOG_DIR):
        assert abs(row.error) <= 0.001, row


def test_the_032_budget_line_alone_calibrates_every_component() -> None:
    """vLLM 0.32 prints no 'Available KV cache memory' line: the budget line's measured activation
    is kept and the non-torch memory is solved from its KV memory."""
    log = LOG_DIR / "d02-qwen3-14b-l40s-tp1-v0.32.0.log"
    report = parse_startup_log(log.read_text(encoding="utf-8"))
    assert report.available_kv_bytes == round(11.06 * GiB)
    assert report.consumed_bytes == round(27.79 * GiB)
    assert report.activation_bytes == round(1.99 * GiB)
    calibration = calibration_from_log(log)
    case = next(c for c in CASES if c.file == log.name)
    row = evaluate(case, LOG_DIR)
    assert abs(row.calibrated_error) <= 0.0005, row
    gpu = get_gpu("L40S-48GB")
    spec = ModelSpec.from_hf_config(case.model_config_, name=case.model, source=case.file)
    result = plan(
        spec, gpu, ServingParams(max_model_len=40960), VllmVersion.parse("0.32"), calibration
    )
    assert result.calibration is not None
    assert MemoryComponent.ACTIVATION in result.calibration.measured
    assert MemoryComponent.NON_TORCH in result.calibration.derived
    assert result.activation_bytes == round(1.99 * GiB)
    assert result.kv_cache_bytes == pytest.approx(11.06 * GiB, abs=0.006 * GiB)


def test_kv_memory_printed_in_bytes_is_read_exactly() -> None:
    line = (
        "(EngineCore_DP0 pid=3021) INFO 09-23 18:12:39 [gpu_worker.py:391] Free memory on device "
        "(78.66/79.19 GiB) on startup. Desired GPU memory utilization is (0.9, 71.27 GiB). Actual "
        "usage is 14.08 GiB for weight, 1.97 GiB for peak activation, 0.07 GiB for non-torch memory, "
        "and 0.67 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with "
        "`--kv-cache-memory=58333988249` to fit into requested memory, or "
        "`--kv-cache-memory=66273897472` to fully utilize gpu memory. Current kv cache memory in use "
        "is 59212694937 bytes."
    )
    assert parse_startup_log(line).available_kv_bytes == 59212694937


def test_kv_cache_memory_bytes_line_is_parsed_and_cannot_calibrate() -> None:
    # --kv-cache-memory-bytes: vLLM reserves the size it was given and skips its profile.
    text = (LOG_DIR / "failures" / "f06-kv-cache-memory-bytes-startup-built.log").read_text()
    report = parse_startup_log(text)
    assert report.kv_cache_size_given
    assert report.available_kv_bytes == 8 * GiB  # the flag's exact value, printed as 8.00 GiB
    assert report.initial_free_bytes == round(78.66 * GiB)
    with pytest.raises(LogParseError, match="--kv-cache-memory-bytes"):
        calibration_from_report(report, source="server.log")
    profiled = parse_startup_log((LOG_DIR / CASES[0].file).read_text(encoding="utf-8"))
    assert not profiled.kv_cache_size_given

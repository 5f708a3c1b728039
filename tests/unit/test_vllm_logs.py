"""The log parser and the memory model against real vLLM startup logs from public sources."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml

from tuner.errors import LogParseError
from tuner.vllm.accuracy import LogCase, LogOrigin, evaluate, load_cases, transfer_rows
from tuner.vllm.gpus import GiB, get_gpu
from tuner.vllm.log import (
    calibration_from_log,
    calibration_from_report,
    calibration_skip_reason,
    parse_startup_log,
)
from tuner.vllm.memory import MemoryComponent, ServingParams, plan
from tuner.vllm.models import ModelSpec
from tuner.vllm.versions import VllmVersion, logged_version

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


BUDGET_DIR = LOG_DIR / "budget_lines"
BUDGET_CASES: list[dict[str, Any]] = yaml.safe_load(
    (BUDGET_DIR / "index.yaml").read_text(encoding="utf-8")
)


def test_budget_line_forms_are_real_lines_with_their_source() -> None:
    assert {c["file"] for c in BUDGET_CASES} == {p.name for p in BUDGET_DIR.glob("*.log")}
    real = [c for c in BUDGET_CASES if c["origin"] == "public_issue"]
    assert len(real) >= 5 and all(c["source"].startswith("https://github.com/") for c in real)
    built = [c for c in BUDGET_CASES if c["origin"] == "built_from_format"]
    assert all(c["file"].endswith("-built.log") and "Built" in c["note"] for c in built)


@pytest.mark.parametrize("case", BUDGET_CASES, ids=lambda c: c["file"])
def test_every_form_of_the_budget_lines_is_read(case: dict[str, Any]) -> None:
    report = parse_startup_log((BUDGET_DIR / case["file"]).read_text(encoding="utf-8"))
    for key, want in case["expected"].items():
        if key.endswith("_gib"):
            got = getattr(report, key.removesuffix("_gib") + "_bytes")
            assert got == pytest.approx(want * GiB, abs=0.006 * GiB), key
        else:
            assert getattr(report, key) == want, key
    reason = calibration_skip_reason(report)
    assert (reason is None) is case["calibrates"], reason
    for words in case.get("reason_has", []):
        assert reason is not None and words in reason


def test_a_refused_start_says_so_and_names_the_device_instead_of_blaming_debug_logging() -> None:
    """vLLM's refusal (free memory below the budget) names the device from 0.2x: the tune must
    say the GPU was busy, not that this release hides its memory summary at DEBUG."""
    text = (BUDGET_DIR / "p01-refused-device-named-cuda1.log").read_text(encoding="utf-8")
    report = parse_startup_log(text)
    assert report.budget_refused and report.budget_device == "cuda:1"
    with pytest.raises(LogParseError) as err:
        calibration_from_report(report, source="server.log")
    message = str(err.value)
    assert "refused to start" in message and "cuda:1" in message and "DEBUG" not in message
    assert len(message.splitlines()) == 1


def test_a_negative_cudagraph_size_keeps_the_rest_of_the_budget_line() -> None:
    # One signed field used to drop the whole line: total, utilization, consumed, activation, K.
    text = (BUDGET_DIR / "x01-negative-cudagraph-in-budget-built.log").read_text(encoding="utf-8")
    weights = "INFO 08-29 09:11:02 [gpu_model_runner.py:5515] Model loading took 74.9 GiB memory "
    report = parse_startup_log(weights + "and 61.2 seconds\n" + text)
    assert report.cudagraph_estimate_bytes == round(-0.19 * GiB)
    assert report.available_kv_bytes == round(18.9 * GiB)
    calibration = calibration_from_report(report, source="server.log")
    assert calibration.consumed_bytes == round(81.85 * GiB)
    assert calibration.total_bytes == round(121.69 * GiB)


def test_a_release_that_prints_its_budget_only_at_debug_still_calibrates_from_debug_lines() -> None:
    text = (BUDGET_DIR / "x03-debug-profile-consumed-v0.28-built.log").read_text(encoding="utf-8")
    calibration = calibration_from_report(parse_startup_log(text), source="server.log")
    assert calibration.consumed_bytes == round(15.26 * GiB)
    assert calibration.activation_bytes == round(16.7 * GiB) - round(15.26 * GiB)
    assert calibration.gpu_memory_utilization == 0.92


def test_the_graph_estimate_vllm_budgeted_joins_the_debug_profiles_activation() -> None:
    # With CUDA-graph profiling on (default since 0.21), the budget's peak activation is the
    # profile's transient peak plus the graph estimate.
    base = (BUDGET_DIR / "x03-debug-profile-consumed-v0.28-built.log").read_text(encoding="utf-8")
    estimate = (BUDGET_DIR / "p05-graph-estimate-tp2-v0.27.1.log").read_text(encoding="utf-8")
    report = parse_startup_log(base + estimate)
    assert report.activation_bytes == round(16.7 * GiB) - round(15.26 * GiB) + round(0.36 * GiB)


# A real 0.14+ banner line (tests/fixtures/vllm_logs/02-qwen3-8b-a100-40gb-tp1-v0.19.1.log):
# a startup that fails before the engine core logs its config names its release only here.
BANNER_0191 = (
    "(APIServer pid=3380144) INFO 06-25 17:21:29 [utils.py:299]  ▄▄ ▄█ █     █     █ ▀▄▀ █  "
    "version 0.19.1"
)


def test_the_startup_parser_reads_the_release_in_every_form_the_cross_check_does() -> None:
    """One pattern for a release in a log (versions.LOGGED_VERSION): the 0.14+ banner alone
    (the parser read only the API server's and the engine's lines), and on every fixture
    the parser's release is the cross-check's."""
    assert parse_startup_log(BANNER_0191).vllm_version == "0.19.1"
    for path in sorted(LOG_DIR.glob("*.log")):
        text = path.read_text(encoding="utf-8")
        named = logged_version(text)
        parsed = parse_startup_log(text).vllm_version
        assert (VllmVersion.read(parsed) if parsed else None) == named, path.name

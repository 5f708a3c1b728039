"""The log parser and the memory model against real vLLM startup logs from public sources."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from tuner.accuracy import LogCase, evaluate, load_cases
from tuner.gpus import GiB
from tuner.vllm_log import parse_startup_log

LOG_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_logs"
CASES: list[LogCase] = [
    case for index in sorted(LOG_DIR.glob("index*.yaml")) for case in load_cases(index)
]
SCORED = [case for case in CASES if not case.unified_memory]


def test_enough_real_logs_are_collected() -> None:
    assert len(CASES) >= 12
    assert all(case.source.startswith("https://") for case in CASES)
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

"""Every failure parser and classifier on real vLLM GPU logs from vLLM's issue threads
(tests/fixtures/vllm_logs/failures/index.yaml), and on the healthy startup logs beside them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tuner.vllm.classify import classify_failure, engine_death_failure
from tuner.vllm.gpus import GiB
from tuner.vllm.log import calibration_skip_reason, parse_startup_log

LOG_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_logs"
FAILURES = LOG_DIR / "failures"
CASES: list[dict[str, Any]] = yaml.safe_load((FAILURES / "index.yaml").read_text("utf-8"))
REAL = [c for c in CASES if c["origin"] == "public_issue"]
STARTUP_LOGS = sorted(LOG_DIR.glob("*.log"))


def _text(case: dict[str, Any]) -> str:
    return (FAILURES / case["file"]).read_text(encoding="utf-8")


def test_ten_real_logs_of_every_kind_with_their_source_and_release() -> None:
    assert len(REAL) >= 10
    assert all(c["source"].startswith("https://github.com/") for c in REAL)
    assert all(c["vllm_version"] and c.get("version_evidence") for c in REAL)
    kinds = {c["kind"] for c in REAL}
    for wanted in ("startup", "oom_under_load", "engine_death", "cuda_graph_capture_oom"):
        assert wanted in kinds
    assert any(k.startswith("oom_at_startup") for k in kinds)
    built = [c for c in CASES if c["origin"] != "public_issue"]
    assert all(c["origin"] == "built_from_format" for c in built)
    assert {c["file"] for c in CASES} == {p.name for p in FAILURES.glob("*.log")}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["file"])
def test_each_log_is_classified_as_its_index_says(case: dict[str, Any]) -> None:
    text = _text(case)
    expected = case["expected"]
    failure = classify_failure(text)
    assert (failure.kind.value if failure else None) == expected["failure"]
    if failure is not None:  # vLLM's own words, without the log prefix
        assert failure.message and "[core.py" not in failure.message
    death = engine_death_failure(text)
    assert (death.kind.value if death else None) == expected["death"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["file"])
def test_the_startup_parser_reads_each_log(case: dict[str, Any]) -> None:
    report = parse_startup_log(_text(case))
    expected = case["expected"]
    if "weights_gib" in expected:
        assert report.weights_bytes == pytest.approx(expected["weights_gib"] * GiB, abs=0.006 * GiB)
    if "total_gib" in expected:
        assert report.total_bytes == pytest.approx(expected["total_gib"] * GiB, abs=0.006 * GiB)
    if "gpu_memory_utilization" in expected:
        assert report.gpu_memory_utilization == expected["gpu_memory_utilization"]
    if "kv_cache_tokens" in expected:
        assert report.kv_cache_tokens == expected["kv_cache_tokens"]
    if "max_concurrency" in expected:
        assert report.max_concurrency == pytest.approx(expected["max_concurrency"])
    if "available_kv_bytes" in expected:
        assert report.available_kv_bytes == expected["available_kv_bytes"]
    assert report.kv_cache_size_given is bool(expected.get("kv_cache_size_given", False))


@pytest.mark.parametrize("path", STARTUP_LOGS, ids=lambda p: p.name)
def test_healthy_real_startups_are_no_failure(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert classify_failure(text) is None
    assert engine_death_failure(text) is None


def test_out_of_memory_kinds_are_oom_and_hub_kinds_are_not() -> None:
    kinds = {c["file"]: c["expected"] for c in CASES}
    for case in CASES:
        failure = classify_failure(_text(case))
        death = engine_death_failure(_text(case))
        if case["kind"].startswith(("oom", "cuda_graph")):
            assert (death or failure) is not None
            assert (death or failure).kind.is_out_of_memory  # type: ignore[union-attr]
        if case["kind"].startswith("model_"):
            assert failure is not None and not failure.kind.is_out_of_memory
    assert kinds


def test_a_given_kv_size_is_parsed_and_skips_calibration() -> None:
    (case,) = [c for c in CASES if c["kind"] == "startup_kv_given"]
    report = parse_startup_log(_text(case))
    assert report.kv_cache_size_given and report.initial_free_bytes == round(78.66 * GiB)
    reason = calibration_skip_reason(report)
    assert reason is not None and "--kv-cache-memory-bytes" in reason

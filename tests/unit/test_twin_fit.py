"""The twin learns an engine it has not seen (issue 17): levels measured on an engine
whose step costs differ from the twin's paper factors are replayed on the twin, and
the fitted factors bring its percentiles close to the measured ones."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from tuner.serving.level_schedule import plan_level_schedule
from tuner.sim.timing import TimingFactors
from tuner.twin.fit import MAX_EVALUATIONS, MeasuredLevel, fit, twin_accuracy
from tuner.twin.prediction import Setup, simulate_schedule
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion
from workloads.slo import Slo
from workloads.spec import load_workload

# An engine slower than the paper says: two thirds of the bandwidth, three times the overhead.
HIDDEN = TimingFactors(mbu=0.55, mfu=0.40, step_overhead_s=0.0045, source="hidden")


def _setup(timing: TimingFactors) -> Setup:
    return Setup(
        resolve_model("llama-3.1-8b"), get_gpu("H100-80GB"), VllmVersion.current(),
        ServingParams(max_model_len=16384), timing=timing,
    )  # fmt: skip


def _measured(rate: float, name: str) -> MeasuredLevel:
    """A level of rag at ``rate`` as the hidden engine serves it (what a live level
    measures on that engine: the same schedule, the window's percentiles)."""
    _, plan, schedule = plan_level_schedule(
        load_workload("rag"), rate, window_s=40.0, warmup_s=10.0
    )
    start, end = plan.warmup_min_s, plan.warmup_min_s + plan.window_s
    _, result = simulate_schedule(
        _setup(HIDDEN),
        schedule,
        Slo(),
        stop_at_s=end + 60.0,
        measure_from_s=start,
        measure_to_s=end,
    )
    assert result is not None
    return MeasuredLevel(
        name=name, schedule=schedule, opened_at_s=start, window_s=plan.window_s,
        measured={"ttft_ms": result.ttft_ms, "tpot_ms": result.tpot_ms},
    )  # fmt: skip


@pytest.fixture(scope="module")
def levels() -> list[MeasuredLevel]:
    return [_measured(1.0, "level-0"), _measured(3.0, "level-1")]


def test_the_paper_factors_are_far_from_an_engine_they_do_not_describe(
    levels: list[MeasuredLevel],
) -> None:
    paper = twin_accuracy(_setup(TimingFactors()), levels).median_share
    own = twin_accuracy(_setup(HIDDEN), levels).median_share
    assert paper is not None and paper > 0.2
    assert own is not None and own < 0.01  # the same engine replays the same schedule


def test_a_fit_finds_the_engines_step_costs(levels: list[MeasuredLevel]) -> None:
    began = time.monotonic()
    result = fit(_setup(TimingFactors()), levels)
    took = time.monotonic() - began
    before, after = result.error_before.median_share, result.error_after.median_share
    assert before is not None and after is not None
    assert after < 0.1 < before, (before, after, result.after)
    assert result.after.source == "fitted"
    # The decode-bound figures move the bandwidth share toward the engine's.
    assert abs(result.after.mbu - HIDDEN.mbu) < abs(TimingFactors().mbu - HIDDEN.mbu)
    assert result.evaluations <= MAX_EVALUATIONS + 1 and took < 120.0  # + the error before


def test_a_fit_out_of_time_keeps_the_best_factors_it_replayed(levels: list[MeasuredLevel]) -> None:
    """A short budget's fit stops once its first simplex is replayed (``max_seconds``) and
    keeps the best of what it replayed: never worse than where it started."""
    result = fit(_setup(TimingFactors()), levels, max_seconds=0.0)
    assert result.evaluations == 4 + 1 + 1  # four factors' simplex of five, and the error before
    before, after = result.error_before.median_share, result.error_after.median_share
    assert before is not None and after is not None and after <= before


def test_a_fit_that_finds_nothing_better_keeps_the_factors(levels: list[MeasuredLevel]) -> None:
    result = fit(_setup(HIDDEN), levels, max_evaluations=6)
    assert result.after == HIDDEN
    assert dataclasses.replace(_setup(HIDDEN)).timing == HIDDEN


def test_a_fit_that_puts_the_measured_goodput_further_off_is_not_taken() -> None:
    from tuner.twin.fit import goodput_worse

    assert goodput_worse(6.14, 5.3, 6.02, lower_bound=False)  # +2 % -> -12 %
    assert not goodput_worse(6.14, 6.3, 6.02, lower_bound=False)  # +2 % -> +5 %: within 5 %
    assert not goodput_worse(9.0, 6.1, 6.02, lower_bound=False)  # +50 % -> +1 %
    # A measured lower bound: a prediction above it is not an error.
    assert not goodput_worse(6.0, 8.0, 6.02, lower_bound=True)
    assert goodput_worse(6.0, 5.0, 6.02, lower_bound=True)
    assert not goodput_worse(None, 5.0, 6.02, lower_bound=False)


def test_a_twin_already_within_the_levels_noise_is_not_fitted(
    levels: list[MeasuredLevel],
) -> None:
    """Within ``within_share`` of every level no search runs and the factors stand; further
    off (the paper's factors here), the fit runs as before."""
    from tuner.twin.fit import FIT_WITHIN_SHARE

    close = HIDDEN.model_copy(update={"mbu": HIDDEN.mbu * 1.02})
    kept = fit(_setup(close), levels, within_share=FIT_WITHIN_SHARE)
    error = kept.error_before.median_share
    assert error is not None and 0.0 < error <= FIT_WITHIN_SHARE
    assert not kept.fitted and kept.evaluations == 1 and kept.after == close
    far = fit(_setup(TimingFactors()), levels, within_share=FIT_WITHIN_SHARE, max_seconds=0.0)
    assert far.fitted and far.evaluations > 1


def test_a_goodput_prediction_within_the_trials_interval_needs_no_fit() -> None:
    """After the first fit, a trial that cannot tell the twin's goodput from its own (the
    prediction inside its 90% capacity interval) is not fitted; outside it, it is; the
    terminal's line says which rule kept the factors."""
    from types import SimpleNamespace

    from tuner.run.goodput import CapacityInterval
    from tuner.run.twin_record import TrialFit
    from tuner.search.study.trial_lines import twin_line
    from tuner.search.study.trial_twin import predicted_within
    from tuner.twin.prediction import SustainedRate

    trial = SimpleNamespace(capacity_interval=CapacityInterval(low_per_s=8.59, high_per_s=8.98))
    assert predicted_within(SustainedRate(8.74), trial)  # type: ignore[arg-type]
    assert not predicted_within(SustainedRate(9.4), trial)  # type: ignore[arg-type]
    assert not predicted_within(SustainedRate(8.2), trial)  # type: ignore[arg-type]
    assert not predicted_within(None, trial)  # type: ignore[arg-type]
    open_above = SimpleNamespace(capacity_interval=CapacityInterval(low_per_s=8.0, high_per_s=None))
    assert predicted_within(SustainedRate(12.0), open_above)  # type: ignore[arg-type]
    assert not predicted_within(SustainedRate(8.0), SimpleNamespace(capacity_interval=None))  # type: ignore[arg-type]

    why = "its goodput prediction within trial 1's 90% capacity interval"
    kept = TrialFit(
        trial=1, levels=["level-0"], before=HIDDEN, after=HIDDEN, error_before=0.06,
        error_after=0.06, evaluations=1, measured_rate_per_s=8.57, predicted_rate_per_s=8.74,
        fitted=False, kept_because=why,
    )  # fmt: skip
    assert f"6% off trial 1's measured percentiles, {why}: not fitted" in twin_line(kept)
    older = kept.model_copy(update={"kept_because": None})  # a record from before the field
    assert "within 5%: not fitted" in twin_line(older)


def test_a_fit_takes_only_factors_closer_by_the_median_it_reports_too() -> None:
    """On noisy levels (vLLM's CPU build) the factors of least loss can leave the median
    error the run reports further off: such factors are not taken, the next closer ones
    by both are, and where none is the fit keeps what there was."""
    from tuner.twin.fit import LevelAccuracy, TwinAccuracy, closest

    def replayed(a: float, b: float, c: float) -> TwinAccuracy:
        measured = {"ttft_ms.p50": 100.0, "ttft_ms.p99": 100.0, "tpot_ms.p50": 100.0}
        predicted = dict(zip(measured, (a, b, c), strict=True))
        return TwinAccuracy(
            levels=[LevelAccuracy(level="l", measured=measured, predicted=predicted)]
        )

    before = replayed(150, 150, 150)  # 50% off each
    least_loss = replayed(160, 160, 100)  # less loss, but a median 60% off
    both = replayed(148, 148, 150)  # a little less loss, a median 48% off
    farther = replayed(140, 140, 200)  # more loss
    assert least_loss.loss < both.loss < before.loss < farther.loss
    assert (least_loss.median_share or 0) > (before.median_share or 0) > (both.median_share or 0)
    cache = {(0.0,): least_loss, (1.0,): both, (2.0,): farther}
    assert closest(cache, before) == (1.0,)
    assert closest({(0.0,): least_loss, (2.0,): farther}, before) is None


def test_a_fit_stops_once_the_twin_is_within_its_done_share(levels: list[MeasuredLevel]) -> None:
    """A fit that brings the twin within ``done_share`` of the levels stops there (a
    closer fit fits their noise): on the default tune's first fit the first replay was
    1.8% off, and the search went on for 30 s to 0.6%."""
    full = fit(_setup(TimingFactors()), levels)
    before = full.error_before.median_share
    assert before is not None
    done = fit(_setup(TimingFactors()), levels, done_share=0.9 * before)
    after = done.error_after.median_share
    assert after is not None and after <= 0.9 * before
    assert done.after != done.before  # fitted, and taken
    assert done.evaluations < full.evaluations
    never = fit(_setup(TimingFactors()), levels, done_share=0.0)
    assert never.evaluations == full.evaluations and never.after == full.after


def test_a_trial_with_no_level_to_replay_has_its_line_all_the_same() -> None:
    """A trial whose load generator lagged at every level (on a busy two-core host, vLLM's
    CPU build at the rate the twin placed) leaves the twin nothing to replay: twin.json
    still records it, says why, and takes nothing from it."""
    from types import SimpleNamespace

    from tuner.run.twin_record import TrialFit, TwinRecord
    from tuner.search.study.trial_lines import twin_line
    from tuner.search.study.trial_twin import no_levels_reason

    lagged = SimpleNamespace(levels=[SimpleNamespace(unmeasurable=True)] * 2)
    why = no_levels_reason(1, lagged)  # type: ignore[arg-type]
    assert why == "no level of trial 1 measured the server (its load generator lagged at each)"
    one_measured = SimpleNamespace(levels=[SimpleNamespace(unmeasurable=False)])
    assert no_levels_reason(2, one_measured) == "no level of trial 2 has a window to replay"  # type: ignore[arg-type]

    fitted = TimingFactors(mbu=0.6, mfu=0.4, step_overhead_s=0.002, source="fitted")
    record = TwinRecord(factors=fitted)
    none = TrialFit(
        trial=1, levels=[], before=fitted, after=fitted, error_before=None, error_after=None,
        evaluations=0, predicted_rate_per_s=44.9, predicted_after_per_s=44.9, adopted=False,
        fitted=False, kept_because=why,
    )  # fmt: skip
    line = twin_line(none)
    assert f"- off trial 1's measured percentiles, {why}: not fitted" in line
    assert "not adopted" not in line  # nothing was fitted to adopt
    after = record.with_fit(none)
    assert after.factors == fitted and [f.trial for f in after.fits] == [1]


def test_only_a_trial_that_measured_levels_has_a_line_without_a_fit(tmp_path: Path) -> None:
    """``TrialTwin.learn`` with no level to replay: a trial that measured levels, all of
    them lagging, is written to twin.json with why; one that measured none (it did not
    start: an OOM at launch) writes nothing and prints nothing."""
    from types import SimpleNamespace

    from tuner.run.evaluation import Verdict
    from tuner.search.study.trial_twin import TrialTwin
    from tuner.twin.fit import read_twin

    lines: list[str] = []
    ctx = SimpleNamespace(
        config=SimpleNamespace(twin_fit=True, twin_from=None, budget_min=10.0),
        twin=(None, None), run_dir=tmp_path, base=None,
    )  # fmt: skip
    twin = TrialTwin(ctx, lines.append)  # type: ignore[arg-type]
    setup = SimpleNamespace(timing=HIDDEN)
    params = SimpleNamespace(serving=lambda base: None)
    unstarted = SimpleNamespace(levels=[], verdict=Verdict.STARTUP_FAILED)
    kept = twin.learn(3, params, unstarted, None, setup=setup, complete=[])  # type: ignore[arg-type]
    assert kept is setup and lines == [] and not (tmp_path / "twin.json").exists()
    lagged = SimpleNamespace(
        levels=[SimpleNamespace(unmeasurable=True, met=False, dir=str(tmp_path / "x"))],
        verdict=Verdict.SLO_MISSED,
    )  # fmt: skip
    kept = twin.learn(4, params, lagged, None, setup=setup, complete=[])  # type: ignore[arg-type]
    assert kept is setup
    record = read_twin(tmp_path)
    assert [f.trial for f in record.fits] == [4] and record.factors == TimingFactors()
    assert "its load generator lagged at each" in (record.fits[0].kept_because or "")
    assert len(lines) == 1 and "trial 4" in lines[0]


def test_a_tune_read_for_capacity_counts_only_the_trials_the_twin_replayed(tmp_path: Path) -> None:
    """``tuner capacity --from``: a trial that left the twin no level to replay (its line
    in twin.json, first here) is no fit: the goodput error is the first real fit's own,
    and a run whose twin kept factors it started from (``--twin-from``) still counts them."""
    import json

    from tuner.capacity.calibration import read_run
    from tuner.run.twin_record import TrialFit, TwinRecord

    (tmp_path / "tune.json").write_text(
        json.dumps({"gpu": "H100-80GB", "model": "llama-3.1-8b", "backend": "sim"})
    )
    fitted = TimingFactors(mbu=0.6, mfu=0.4, step_overhead_s=0.002, source="fitted")
    lagged = TrialFit(
        trial=0, levels=[], before=fitted, after=fitted, error_before=None, error_after=None,
        evaluations=0, predicted_rate_per_s=9.0, predicted_after_per_s=9.0,
        measured_rate_per_s=6.0, adopted=False, fitted=False, kept_because="no level of trial 0",
    )  # fmt: skip
    kept = TrialFit(
        trial=1, levels=["001/level-0"], before=fitted, after=fitted, error_before=0.03,
        error_after=0.03, evaluations=1, predicted_rate_per_s=8.8, predicted_after_per_s=8.4,
        measured_rate_per_s=8.0, fitted=False, kept_because="within 5% of its levels",
    )  # fmt: skip
    TwinRecord(factors=fitted).with_fit(lagged).with_fit(kept).write(tmp_path / "twin.json")
    run = read_run(tmp_path)
    assert [f.trial for f in run.fits] == [1]
    assert run.factors == fitted  # the factors it kept count as the run's
    # the one fit's own (8.4 against 8.0), not a prediction made before any fit (8.8)
    assert run.goodput_error == pytest.approx(0.05)


def test_a_pick_is_predicted_from_the_rate_its_screen_held_in_fewer_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TrialTwin.prediction`` near a rate that held (the twin's screen of the pick with
    the step costs of now, ``twin_rate_per_s``) closes its bracket on the first runs:
    fewer simulations before the trial than bracketing from the best goodput by doubling,
    to the same rate within the precision of the search's bisection."""
    import tuner.twin.prediction as prediction
    from tuner.run.config import TuneConfig
    from tuner.search.context import StudySetup, resolve
    from tuner.search.study.trial_twin import TrialTwin
    from tuner.twin.landscape import screen_setting
    from tuner.twin.screen import screen_job
    from tuner.vllm.space import TrialParams

    ctx = resolve(
        TuneConfig(model="llama-3.1-8b", gpu="H100-80GB", workload="chat", run_dir=tmp_path,
                   dry_run=True, level_duration_s=20.0, level_warmup_s=10.0)
    )  # fmt: skip
    pick = TrialParams(
        gpu_memory_utilization=0.97, max_num_seqs=512, block_size=16, kv_cache_dtype="fp8"
    )
    job = screen_job(ctx, TimingFactors(), 5.5)
    assert job is not None
    screened = screen_setting(job, pick, 0).rate_per_s
    assert screened > 0.0
    runs: list[float] = []
    steady_run = prediction.steady_run

    def counted(*args: object, **kwargs: object) -> object:
        runs.append(float(args[2]))  # type: ignore[arg-type]
        return steady_run(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(prediction, "steady_run", counted)
    setup = StudySetup()
    far = TrialTwin(ctx, lambda _: None).prediction(pick, setup, 5.5)
    far_runs, runs[:] = list(runs), []
    near = TrialTwin(ctx, lambda _: None).prediction(pick, setup, 5.5, screened)
    assert far is not None and near is not None
    assert len(runs) <= 3 < len(far_runs), (runs, far_runs)
    assert runs[0] == screened  # the rate that held, the next planned with its answer times
    assert near.rate_per_s == pytest.approx(far.rate_per_s, rel=0.10)

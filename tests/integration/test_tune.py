"""`tuner tune` on the simulated engine: its study, trials, edge and recommendation.

The shared tune (``tuned_run``) and the resumed tunes run on the twin's virtual clock
(tests/virtual.py); the refusals run the command line in this process (nothing is
launched before them). What only processes show stays in real time: one whole `tuner
tune` on the simulated backend (``real_tuned_run``: sim-serve processes loaded by Locust,
none left behind), and the harness killed with SIGKILL in the middle of a trial.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from kubernetes_validate import validate
from kubernetes_validate.utils import latest_version

from tests.integration.tune_run import REAL_TUNE_TRIALS, SMALL_TUNE_ARGS
from tests.virtual import Done, tune_cli, tuner_cli, virtual_tune
from tuner.run.edge import EdgeResult
from tuner.run.evaluation import Evaluation, Verdict
from tuner.run.goodput import GoodputBound, GoodputUnit, UnitsBasis
from tuner.run.recommendation import Recommendation

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]  # the shared tune takes minutes


def _study(run_dir: Path) -> Any:
    summary = json.loads((run_dir / "summary.json").read_text())
    return optuna.load_study(
        study_name=summary["study"], storage=f"sqlite:///{run_dir / 'study.db'}"
    )


def test_tune_leaves_study_trials_edge_and_recommendation(tuned_run: Path) -> None:
    summary = json.loads((tuned_run / "summary.json").read_text())
    study = _study(tuned_run)
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(complete) == summary["trials"] == 3
    # vLLM's defaults are measured first, as the baseline.
    assert complete[0].user_attrs["role"] == "vllm-default"
    assert complete[0].params["gpu-memory-utilization"] == pytest.approx(0.92)
    for trial in complete:
        evaluation = Evaluation.model_validate_json(
            (Path(trial.user_attrs["dir"]) / "evaluation.json").read_text()
        )
        assert evaluation.verdict.value == trial.user_attrs["verdict"]
        # constraints say feasible exactly when the SLOs held
        feasible = all(v <= 0 for v in trial.constraints.values())
        assert feasible == (evaluation.verdict is Verdict.MET)
        # The goodput says whether a higher rate broke the SLOs, or is only a lower bound.
        assert trial.user_attrs["goodput_bound"] == evaluation.goodput_bound.value
        best_rate = evaluation.best.rate_per_s if evaluation.best else None
        broke_above = any(
            not lv.met and best_rate is not None and lv.rate_per_s > best_rate
            for lv in evaluation.levels
        )
        assert evaluation.goodput_bound is (
            GoodputBound.NONE
            if evaluation.best is None
            else (GoodputBound.BRACKETED if broke_above else GoodputBound.LOWER_BOUND)
        )
        if evaluation.verdict is Verdict.MET:
            assert (
                trial.values[0] == pytest.approx(evaluation.goodput_requests_per_s)
                and evaluation.goodput_requests_per_s > 0
            )
            assert evaluation.best is not None and evaluation.best.met
            # the best level's measured p99s are within the workload's SLOs (1000 / 100 ms)
            assert (evaluation.best.load.ttft_ms.p99 or 0) <= 1000
            assert (evaluation.best.load.tpot_ms.p99 or 0) <= 100
            assert (Path(evaluation.best.dir) / "requests.jsonl").stat().st_size > 0
            assert (Path(evaluation.dir) / "gpu.csv").stat().st_size > 0
        # Each level says how sure its verdict is (the share of resamples of its window
        # that hold), and the trial where its capacity lies (issue 34).
        for level in evaluation.levels:
            assert level.hold_share is not None and 0.0 <= level.hold_share <= 1.0
            if level.failed_by_backlog or level.stopped_early:
                continue
            if level.window_met and not level.met:  # the goodput's rule: P(hold) >= 0.9
                assert level.hold_probability < 0.9
                assert any(v.startswith("P(hold) ") for v in level.violations)
            elif not level.met:
                assert level.hold_probability <= 0.5
            else:
                assert level.hold_probability >= 0.9
        if evaluation.levels:
            interval = evaluation.capacity_interval
            assert interval is not None and interval.confidence == 0.9
            assert interval.low_per_s > 0
            if interval.high_per_s is not None:
                assert interval.low_per_s <= interval.high_per_s
                assert any(not lv.met for lv in evaluation.levels)  # something broke
    best = max(
        (t for t in complete if t.user_attrs["verdict"] == "met"),
        key=lambda t: t.user_attrs["goodput"],
    )
    assert summary["best_trial"] == best.number
    assert summary["best_goodput_bound"] == best.user_attrs["goodput_bound"] != "none"
    assert summary["best_goodput_is_lower_bound"] == (
        best.user_attrs["goodput_bound"] == GoodputBound.LOWER_BOUND.value
    )
    # Units (issue 16): the tiny workload is single-turn, so its own unit is requests/s;
    # evaluation.json, the trial's attributes and summary.json state the same three figures.
    best_eval = Evaluation.model_validate_json(
        (Path(best.user_attrs["dir"]) / "evaluation.json").read_text()
    )
    figures = best_eval.goodput_figures
    assert figures is not None and figures.unit is GoodputUnit.REQUESTS_PER_S
    assert figures.requests_per_s == pytest.approx(best_eval.goodput_requests_per_s)
    assert figures.requests_per_s > 0
    assert figures.arrival_rate_per_s == pytest.approx(figures.requests_per_s)
    assert figures.output_tokens_per_s == pytest.approx(best_eval.output_tokens_per_s)
    assert figures.output_tokens_per_s > 0
    # Issue 34: every unit the declared workload at the rate that held (its answers 8 to 24
    # tokens, uniform: 16 a request), whatever share of it the best window counted.
    assert figures.basis is UnitsBasis.DECLARED
    assert figures.output_tokens_per_request == pytest.approx(16.0)
    assert figures.bound is best_eval.goodput_bound
    assert best.user_attrs["goodput_unit"] == GoodputUnit.REQUESTS_PER_S.value
    assert best.user_attrs["goodput_arrival_rate_per_s"] == pytest.approx(
        figures.arrival_rate_per_s
    )
    # every figure's name says its unit
    assert "best_goodput" not in summary and "best_goodput_unit" not in summary
    assert summary["best_goodput_requests_per_s"] == pytest.approx(figures.requests_per_s)
    assert summary["best_goodput_arrival_rate_per_s"] == pytest.approx(figures.arrival_rate_per_s)
    assert summary["best_goodput_arrival_unit"] == "requests_per_s"
    assert summary["best_goodput_output_tokens_per_s"] == pytest.approx(figures.output_tokens_per_s)
    assert summary["best_goodput_figures"] == figures.model_dump(mode="json")
    assert summary["best_capacity_interval"] == (
        best_eval.capacity_interval.model_dump(mode="json")
        if best_eval.capacity_interval is not None
        else None
    )
    assert summary["best_capacity_interval"] is not None
    # Ties: the feasible trials whose intervals overlap the best's (issue 34)
    own = best_eval.capacity_interval
    assert own is not None
    tied = []
    for t in complete:
        if t.number == best.number or t.user_attrs["verdict"] != "met":
            continue
        other = Evaluation.model_validate_json(
            (Path(t.user_attrs["dir"]) / "evaluation.json").read_text()
        )
        if other.capacity_interval is not None and other.capacity_interval.overlaps(own):
            tied.append(t.number)
    assert summary["ties_with_best"] == tied


def test_edge_is_bracketed_to_the_resolution_within_four_launches(tuned_run: Path) -> None:
    edge = EdgeResult.model_validate_json((tuned_run / "edge" / "edge.json").read_text())
    util = edge.utilization
    assert util is not None
    assert util.launches <= 4
    assert util.highest_ok is not None and util.lowest_failed is not None
    assert util.lowest_failed - util.highest_ok == pytest.approx(0.01)
    probes = [p for p in edge.probes if p.knob.value == "gpu-memory-utilization"]
    assert len(probes) == util.launches
    held = [p for p in probes if p.survived]
    failed = [p for p in probes if not p.survived]
    assert max(p.value for p in held) == pytest.approx(util.highest_ok)
    assert min(p.value for p in failed) == pytest.approx(util.lowest_failed)
    for probe in failed:  # vLLM's own failure class, with its evidence
        assert probe.failure_kind and (Path(probe.dir) / "server.log").exists()
    for probe in held:
        assert probe.peak_used_bytes is not None and probe.total_bytes is not None
        assert probe.peak_used_bytes < probe.total_bytes


def test_recommendation_steps_back_from_the_edge_and_writes_configs(tuned_run: Path) -> None:
    out = tuned_run / "recommendation"
    rec = Recommendation.model_validate_json((out / "recommendation.json").read_text())
    assert rec.simulated and rec.backend == "sim"
    assert rec.edge is not None and rec.edge.utilization is not None
    edge_ok = rec.edge.utilization.highest_ok
    assert edge_ok is not None
    util = rec.recommended.params.gpu_memory_utilization
    assert util == pytest.approx(edge_ok - 0.02)
    assert rec.recommended.utilization_headroom == pytest.approx(0.02)
    names = [v.name for v in rec.variants]
    assert names == ["recommended", "conservative", "aggressive"]
    conservative, aggressive = rec.variants[1], rec.variants[2]
    assert (conservative.params.gpu_memory_utilization or 0) < util
    assert aggressive.params.gpu_memory_utilization == pytest.approx(edge_ok)
    for variant in rec.variants:
        assert variant.measured is not None  # each variant confirmed by its own run
        assert Path(variant.measured.dir, "evaluation.json").exists()
        # Units (issue 16): recommendation.json states the goodput as its run's evaluation.json
        # does (one run each here), in the workload's unit, requests/s and output tokens/s.
        ev = Evaluation.model_validate_json(
            Path(variant.measured.dir, "evaluation.json").read_text()
        )
        figures = variant.measured.goodput_figures
        assert figures is not None and figures == ev.goodput_figures
        assert figures.unit is GoodputUnit.REQUESTS_PER_S
        assert figures.requests_per_s == pytest.approx(variant.measured.goodput)
        assert figures.output_tokens_per_s == pytest.approx(variant.measured.throughput)
        assert figures.bound is variant.measured.goodput_bound
    # The other variants are measured once, under the load the recommendation held.
    assert rec.recommended.measured is not None and rec.recommended.measured.rate_per_s
    held = rec.recommended.measured.rate_per_s
    assert rec.recommended.measured.rates_per_s[-1] >= held
    for variant in (conservative, aggressive):
        assert variant.measured is not None
        assert variant.measured.rates_per_s == [pytest.approx(held)]
        # One rate, so no breaking rate above it: what it served is a lower bound.
        ev = Evaluation.model_validate_json(
            Path(variant.measured.dir, "evaluation.json").read_text()
        )
        assert variant.measured.goodput_bound is ev.goodput_bound
        assert ev.goodput_bound is (GoodputBound.LOWER_BOUND if ev.best else GoodputBound.NONE)
    assert rec.default is not None and rec.default.measured is not None
    # Issue 34: the gain over vLLM's defaults is the same in every unit, and it says why.
    if rec.default.measured.goodput > 0 and rec.recommended.measured.goodput > 0:
        units = rec.units_text()
        assert units is not None
        assert units.startswith("the same gain over vLLM's defaults in every unit"), units
    # The command line starts the settings it claims, and the hash follows the settings.
    args = (out / "vllm-args.txt").read_text()
    assert f"--gpu-memory-utilization {util:g}" in args.replace("\\\n", " ")
    assert rec.recommended.config_hash != conservative.config_hash
    config = yaml.safe_load((out / "vllm-config.yaml").read_text())
    assert float(config["gpu-memory-utilization"]) == pytest.approx(util)
    docs = [d for d in yaml.safe_load_all((out / "kubernetes.yaml").read_text()) if d]
    kinds = {d["kind"] for d in docs}
    assert {"ConfigMap", "Deployment", "Service"} <= kinds
    docs += [d for d in yaml.safe_load_all((out / "warmup-job.yaml").read_text()) if d]
    for doc in docs:
        validate(doc, latest_version(), strict=True)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert str(util) in " ".join(str(a) for a in container["args"])
    # The pods warm up with the tuned workload's requests (the standalone warmup.py is
    # the ConfigMap's program) and drain within a bound sized from its measured p99.
    scripts = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    assert scripts["warmup.py"] == (out / "warmup.py").read_text()
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert rec.recommended.measured is not None and rec.recommended.measured.e2e_ms is not None
    assert grace > (rec.recommended.measured.e2e_ms.p99 or 0) / 1000
    for name in ("conservative", "aggressive"):
        assert (out / name / "kubernetes.yaml").exists()
        assert (out / name / "warmup.py").exists()


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose environment or command line mentions ``text`` (a run directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            blob = (proc / "environ").read_bytes() + (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in blob:
            found.append(int(proc.name))
    return found


def test_no_server_or_load_generator_outlives_the_tune(real_tuned_run: Path) -> None:
    """The one real-time `tuner tune` on the simulated backend: sim-serve processes loaded by
    Locust, end to end (``real_tuned_run``)."""
    summary = json.loads((real_tuned_run / "summary.json").read_text())
    assert summary["trials"] == REAL_TUNE_TRIALS and summary["best_trial"] is not None
    assert (real_tuned_run / "recommendation" / "recommendation.json").exists()
    assert (real_tuned_run / "report.html").exists()
    # Every server got VLLM_CACHE_ROOT under the run directory (the simulated engine keeps
    # its compiled graphs there as vLLM does), every Locust its records path.
    assert any((real_tuned_run / "vllm-cache" / "torch_compile_cache").iterdir())
    assert _processes_mentioning(str(real_tuned_run)) == []


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (("--space", "max-num-seqs=64..8"), "max-num-seqs"),
        (("--space", "warp-factor=1..2"), "warp-factor"),
        (("--objective", "speed"), "speed"),
        (("--space", "gpu-memory-utilization=0.5..1.5"), "1.5"),
        (("--knobs", "block-size,colour"), "colour"),
        (("--backend", "tpu"), "tpu"),
    ],
)
def test_bad_input_is_one_line_before_any_launch(
    tmp_path: Path, extra: tuple[str, ...], expected: str
) -> None:
    run_dir = tmp_path / "run"
    done = tune_cli(run_dir, *extra)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tuner: error:") and expected in lines[0]
    assert not (run_dir / "trials").exists()


def test_existing_study_needs_resume_a_killed_trial_is_retried_and_no_draw_is_replayed(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    fast = ("--no-edge", "--no-confirm", "--trials", "2")
    cmd = [
        sys.executable,
        "-m",
        "tuner.cli",
        "tune",
        *SMALL_TUNE_ARGS,
        "--run-dir",
        str(run_dir),
        *fast,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    # Kill the harness with SIGKILL while trial 1 is being measured.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not list((run_dir / "trials").glob("001/level-0")):
        assert proc.poll() is None, "the tune ended before trial 1 was measured"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    time.sleep(1.0)  # the server and Locust die with their parent (PR_SET_PDEATHSIG)
    assert _processes_mentioning(str(run_dir)) == []
    study = _study_by_name(run_dir)
    running = study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
    assert [t.number for t in running] == [1]
    cut_params = running[0].params

    # What follows the kill is the tune's logic: refused without --resume, then resumed
    # (on the twin's virtual clock, tests/virtual.py).
    again = tune_cli(run_dir, *fast)
    assert again.returncode == 2 and "--resume" in again.stderr

    resumed = virtual_tune(run_dir, *fast, "--resume", report=False)
    assert resumed.summary.best_trial is not None, resumed.output  # `tuner tune` exits 0
    assert "marked failed and retried" in resumed.output
    study = _study_by_name(run_dir)
    failed = study.get_trials(states=(optuna.trial.TrialState.FAIL,))
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert [t.number for t in failed] == [1]
    assert len(complete) == 2
    assert complete[0].number == 0  # nothing already recorded is lost
    retried = [t for t in complete if t.user_attrs.get("retried_from") == 1]
    assert len(retried) == 1 and retried[0].params == cut_params

    # Resumed once more, the sampler (seeded alike, in a new process) draws new settings:
    # it does not replay the draw of trial 1 (the first random draw of the first run).
    more = virtual_tune(run_dir, *fast, "--trials", "3", "--resume", report=False)
    assert more.summary.best_trial is not None, more.output  # `tuner tune` exits 0
    trials = _study_by_name(run_dir).get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(trials) == 3
    assert trials[-1].params not in [t.params for t in trials[:-1]], [t.params for t in trials]


def _study_by_name(run_dir: Path) -> Any:
    storage = f"sqlite:///{run_dir / 'study.db'}"
    (name,) = optuna.get_all_study_names(storage)  # the study, and no claim marker beside it
    return optuna.load_study(study_name=name, storage=storage)


def _snapshot(run_dir: Path) -> dict[str, tuple[int, int]]:
    """Every file of a run directory with its size and modification time."""
    return {
        str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


def _one_error_line(done: Done | subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tuner: error:"), done.stderr
    return lines[0]


def test_a_run_directory_belongs_to_one_study(tuned_run: Path, tmp_path: Path) -> None:
    """Resuming a finished run with other settings, or into it as another study, is refused
    in one line naming the setting and both values, and leaves every file as it was."""
    run_dir = tmp_path / "run"
    shutil.copytree(tuned_run, run_dir, ignore=shutil.ignore_patterns("vllm-cache"))
    before = _snapshot(run_dir)
    line = _one_error_line(tune_cli(run_dir, "--workload", "rag", "--resume"))
    assert "--workload" in line and "'tiny'" in line and "'rag'" in line
    line = _one_error_line(tune_cli(run_dir, "--slo-ttft-ms", "250", "--resume"))
    assert "--slo-ttft-ms" in line and "1000.0" in line and "250.0" in line
    line = _one_error_line(tune_cli(run_dir, "--space", "block-size=8,16", "--resume"))
    assert "--space block-size" in line
    line = _one_error_line(tune_cli(run_dir, "--study", "another", "--resume"))
    assert "'another'" in line and "belongs to study" in line
    # Its trials were measured on one clock and streamed share: other values are refused.
    line = _one_error_line(tune_cli(run_dir, "--time-scale", "7.25", "--resume"))
    assert "--time-scale 7.25" in line and "measured every trial with --time-scale" in line
    line = _one_error_line(tune_cli(run_dir, "--stream-fraction", "0.33", "--resume"))
    assert "--stream-fraction 0.33" in line
    assert _snapshot(run_dir) == before

    # Without tune.json the study.db still tells whose directory it is.
    (run_dir / "tune.json").unlink()
    line = _one_error_line(tune_cli(run_dir, "--study", "another", "--resume"))
    assert "study.db" in line and "'another'" in line
    # Trials the study did not write (its study.db lost, or trials from elsewhere) are
    # never overwritten by new trials.
    shutil.copytree(run_dir / "trials" / "000", run_dir / "trials" / "007")
    line = _one_error_line(tune_cli(run_dir, "--resume"))
    assert "trials/007" in line
    shutil.rmtree(run_dir / "trials" / "007")
    (run_dir / "study.db").unlink()
    line = _one_error_line(tune_cli(run_dir, "--resume"))
    assert "no study.db" in line
    assert not (run_dir / "study.db").exists()


def test_a_study_name_is_a_name_not_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cwd = tmp_path / "a" / "b"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    for name in ("../../x", "x/y", ".hidden", "a b"):
        done = tuner_cli("tune", *SMALL_TUNE_ARGS, "--study", name)
        line = _one_error_line(done)
        assert repr(name) in line and "study name" in line
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b"]  # nothing was written


def test_a_storage_password_is_never_shown(tmp_path: Path) -> None:
    """In every URL form; the driver's message (unreachable host) passes through redacted,
    without SQLAlchemy's link line, before anything is launched or written."""
    secret = "Tn-s3cret-42"
    for url in (
        f"postgresql+psycopg://tuner@127.0.0.1:1/tuning?password={secret}",
        f"postgresql+psycopg://tuner@127.0.0.1:1/tuning?sslmode=disable&sslpassword={secret}",
        f"postgresql+psycopg://tuner:{secret}@127.0.0.1:1/tuning",
        f"postgresql+psycopg://tuner:{secret.replace('-', '%2D')}@127.0.0.1:1/tuning",
        f"postgresql+psycopg://tuner:{secret}@half@127.0.0.1:1/tuning",
    ):
        run_dir = tmp_path / "run"
        line = _one_error_line(tune_cli(run_dir, "--storage", url))
        assert secret not in line and secret.replace("-", "%2D") not in line, line
        assert "half" not in line and "Background on this error" not in line, line
        assert "127.0.0.1" in line
        assert not (run_dir / "trials").exists() and not (run_dir / "tune.json").exists()

"""`tuner check` on runs of the simulated engine: an unchanged run passes, a worse setting
fails, and noise within the spread the repeats measured does not fail it.

One finished small tune is shared with the other tests (``tuned_run``). The runs
compared here re-run only its recommendation's confirmation (``tuner.search.recommend.confirm``
with the tune's own context) and are laid out as `tuner tune` leaves a run, so `tuner
check` reads them as it reads any run. They start at 0.6 of the rate the tune confirmed
at: the tune confirms at the edge of the SLO, where one slow moment of this machine turns
a met SLO into a missed one (goodput 33 or 0 req/s between runs of the same settings);
here the SLO holds with room, so the figures compared move only with the machine's noise.

The gate's decisions are tested on the twin's virtual clock (``VirtualServer``, seconds
for a confirmation): four repeats of the unchanged settings are made at once and split
(repeats 0 and 1 the baseline, 2 and 3 the unchanged run, and single repeats the runs
without measured noise), and a worse setting. Noise needs real measurements (the virtual
clock measures the same settings alike every time): two repeats in real time, sim-serve
loaded by Locust, make the noisy baseline and its single runs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from unittest import mock

import pytest

from reports.gate import Metric, RowVerdict
from tuner.cli.main import main
from tuner.run.config import TuneConfig
from tuner.run.evaluation import Evaluation, Verdict
from tuner.run.recommendation import Recommendation, Variant
from tuner.search.context import StudySetup, resolve
from tuner.search.recommend import config_hash, confirm, make_variant, measured_of
from tuner.serving.live_server import ServerFactory
from tuner.serving.processes import ChildRegistry
from tuner.twin.virtual_server import VirtualServer
from tuner.vllm.memory import Calibration

pytestmark = pytest.mark.integration

RATE_FRACTION = 0.6


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str


def tuner_check(*args: str | Path, summary: Path | None = None) -> Done:
    """`tuner check ARGS` in this process (the command line's own entry point)."""
    out, err = io.StringIO(), io.StringIO()
    environ = {"GITHUB_STEP_SUMMARY": str(summary)} if summary is not None else {}
    with (
        mock.patch.dict(os.environ, environ),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        if summary is None:
            os.environ.pop("GITHUB_STEP_SUMMARY", None)
        code = main(["check", *map(str, args)])
    return Done(code, out.getvalue(), err.getvalue())


def rows_of(done: Done) -> dict[str, dict[str, object]]:
    return {row["metric"]: row for row in json.loads(done.stdout)["rows"]}


def recommendation(run_dir: Path) -> Recommendation:
    path = run_dir / "recommendation" / "recommendation.json"
    return Recommendation.model_validate_json(path.read_text())


def write_run(out: Path, rec: Recommendation, variant: Variant, version_hash: str) -> Path:
    """``rec`` with ``variant`` as its recommendation, where `tuner tune` writes it."""
    new = rec.model_copy(
        update={"recommended": variant, "variants": [variant], "version_hash": version_hash}
    )
    (out / "recommendation").mkdir(parents=True, exist_ok=True)
    (out / "recommendation" / "recommendation.json").write_text(new.model_dump_json(indent=2))
    return out


def reconfirm(
    tuned: Path,
    out: Path,
    *,
    repeats: int,
    rate_fraction: float,
    max_levels: int = 3,
    server_factory: ServerFactory | None = VirtualServer,
    **settings: object,
) -> Path:
    """A run directory whose recommendation is ``tuned``'s with ``settings`` changed,
    measured afresh by the confirmation alone, as `tuner tune --repeats N` measures it;
    on the twin's virtual clock unless ``server_factory`` is None (launched servers)."""
    described = json.loads((tuned / "tune.json").read_text())
    config = TuneConfig.model_validate(
        {**described["config"], "run_dir": str(out), "repeats": repeats}
    )
    ctx = replace(resolve(config), server_factory=server_factory)
    calibration = tuned / "calibration.json"
    setup = StudySetup(
        time_scale=float(described["time_scale"]),
        calibration=Calibration.model_validate_json(calibration.read_text())
        if calibration.exists()
        else None,
    )
    rec = recommendation(tuned)
    name = rec.recommended.name
    first = Evaluation.model_validate_json(
        (tuned / "confirm" / name / "evaluation.json").read_text()
    )
    params = rec.recommended.params.model_copy(update=settings)
    registry = ChildRegistry(out)
    with registry.guard():
        measured = confirm(
            ctx, setup, name, params, registry=registry,
            start_rate_per_s=first.levels[0].rate_per_s * rate_fraction, repeats=repeats,
            max_levels=max_levels,
        )  # fmt: skip
    variant = make_variant(ctx, name, params, measured, rec.edge)
    return write_run(out, rec, variant, config_hash(ctx, variant.flags))


def subset_run(multi: Path, indices: list[int], out: Path) -> Path:
    """Some of ``multi``'s confirmation repeats as a run of their own, laid out as
    `tuner tune --repeats len(indices)` leaves it: real runs of the same settings."""
    rec = recommendation(multi)
    name = rec.recommended.name
    targets = [name] if len(indices) == 1 else [f"{name}-{k}" for k in range(len(indices))]
    evaluations = []
    for index, target in zip(indices, targets, strict=True):
        shutil.copytree(multi / "confirm" / f"{name}-{index}", out / "confirm" / target)
        evaluations.append(
            Evaluation.model_validate_json(
                (out / "confirm" / target / "evaluation.json").read_text()
            )
        )
    variant = rec.recommended.model_copy(update={"measured": measured_of(evaluations)})
    return write_run(out, rec, variant, rec.version_hash)


# Session-scoped, as the tune they extend: the tests of the shared tune run in one
# xdist worker in whatever order its group arrives, and a module-scoped fixture would be
# built again each time that worker came back to this module (5 minutes each).
@pytest.fixture(scope="session")
def repeats(tuned_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tuned run's recommendation confirmed four more times, unchanged, on the twin's
    virtual clock (seconds)."""
    return reconfirm(
        tuned_run, tmp_path_factory.mktemp("repeats") / "run", repeats=4,
        rate_fraction=RATE_FRACTION,
    )  # fmt: skip


@pytest.fixture(scope="session")
def real_repeats(tuned_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tuned run's recommendation confirmed twice more, unchanged, on launched
    sim-serve processes loaded by Locust: what this machine's noise makes of the same
    settings (about 45 s). Two levels each: the noise is in every metric of the level
    that held, which a third level would not add to."""
    return reconfirm(
        tuned_run, tmp_path_factory.mktemp("real-repeats") / "run", repeats=2,
        rate_fraction=RATE_FRACTION, max_levels=2, server_factory=None,
    )  # fmt: skip


@pytest.fixture(scope="session")
def worse_run(tuned_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recommendation with max-num-seqs 4: far less concurrency than the rate needs.
    Two levels (the first breaks, the second steps down) are all the gate's test needs;
    a third one, at a rate this server barely holds, took two more minutes of `make test`."""
    return reconfirm(
        tuned_run, tmp_path_factory.mktemp("worse") / "run", repeats=1,
        rate_fraction=RATE_FRACTION, max_levels=2, max_num_seqs=4,
    )  # fmt: skip


@pytest.fixture(scope="session")
def split(repeats: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Baseline (repeats 0, 1), the unchanged run (2, 3) and each repeat alone."""
    root = tmp_path_factory.mktemp("split")
    runs = {
        "baseline": subset_run(repeats, [0, 1], root / "baseline"),
        "unchanged": subset_run(repeats, [2, 3], root / "unchanged"),
    }
    for i in range(4):
        runs[f"single-{i}"] = subset_run(repeats, [i], root / f"single-{i}")
    return runs


@pytest.fixture(scope="session")
def real_split(real_repeats: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The real-time repeats: both as the baseline, and each alone."""
    root = tmp_path_factory.mktemp("real-split")
    runs = {"baseline": subset_run(real_repeats, [0, 1], root / "baseline")}
    for i in range(2):
        runs[f"single-{i}"] = subset_run(real_repeats, [i], root / f"single-{i}")
    return runs


def write_baseline(run: Path, path: Path) -> Path:
    done = tuner_check(run, "--baseline", path, "--update-baseline")
    assert done.returncode == 0, done.stdout + done.stderr
    return path


@pytest.mark.timeout(900)
def test_update_baseline_records_the_run_and_the_run_passes_against_it(
    repeats: Path, tmp_path: Path
) -> None:
    baseline = write_baseline(repeats, tmp_path / "b.json")
    rec = recommendation(repeats)
    assert rec.recommended.measured is not None
    data = json.loads(baseline.read_text())
    assert (data["model"], data["gpu"], data["workload"]) == (rec.model, rec.gpu, rec.workload)
    assert (
        data["slo"] == rec.slo.texts() and data["simulated"] is True and "SIMULATED" in data["note"]
    )
    assert data["repeats"] == 4
    goodput = data["metrics"]["goodput"]
    assert goodput["runs"] == rec.recommended.measured.goodput_runs
    assert goodput["value"] == pytest.approx(rec.recommended.measured.goodput)
    # Latencies come from each repeat's evidence, not only the last repeat's.
    ttft = [
        Evaluation.model_validate_json(
            (repeats / "confirm" / f"recommended-{i}" / "evaluation.json").read_text()
        ).p99_ttft_ms
        for i in range(4)
    ]
    assert data["metrics"]["ttft_p99_ms"]["runs"] == pytest.approx(ttft)
    # The same run against its own baseline: every metric unchanged, exit 0, and the
    # table goes to the job summary.
    summary = tmp_path / "summary.md"
    done = tuner_check(repeats, "--baseline", baseline, summary=summary)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" +0.0% ") == len(Metric)
    assert done.stdout.strip().splitlines()[-1].startswith("PASS")
    assert "| goodput (req/s) |" in summary.read_text()


@pytest.mark.timeout(900)
def test_an_unchanged_run_passes(split: dict[str, Path], tmp_path: Path) -> None:
    baseline = write_baseline(split["baseline"], tmp_path / "b.json")
    done = tuner_check(split["unchanged"], "--baseline", baseline, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = rows_of(done)
    assert set(rows) == {m.value for m in Metric}
    assert not any(RowVerdict(str(row["verdict"])).failed for row in rows.values())
    # Same settings on the same virtual GPU: the same memory, whatever this machine does.
    assert rows["peak_used_bytes"]["change_pct"] == 0.0


@pytest.mark.timeout(900)
def test_a_worse_setting_fails(
    split: dict[str, Path], worse_run: Path, repeats: Path, tmp_path: Path
) -> None:
    measured = recommendation(repeats).recommended.measured
    assert measured is not None and max(measured.goodput_runs) > 0
    best = max(range(4), key=lambda i: measured.goodput_runs[i])
    baseline = write_baseline(split[f"single-{best}"], tmp_path / "b.json")
    done = tuner_check(worse_run, "--baseline", baseline)
    assert done.returncode == 1, done.stdout + done.stderr
    # A quarter of the concurrency: the search steps down from the rate that broke and
    # finds the little it holds, or nothing; either way most of the goodput is gone.
    lost = re.search(r"REGRESSION: goodput \(req/s\) -(\d+(?:\.\d+)?)%", done.stdout)
    assert lost is not None and float(lost.group(1)) >= 60, done.stdout
    worse = recommendation(worse_run).recommended.measured
    assert worse is not None and len(worse.rates_per_s) >= 2, worse
    if worse.verdict is Verdict.SLO_MISSED:
        # Its latencies are those of the rate it missed at, so the report shows by how much.
        assert worse.rate_per_s is None
    else:
        assert worse.rate_per_s is not None and worse.rate_per_s < worse.rates_per_s[0]
    assert worse.ttft_ms is not None and worse.e2e_ms is not None
    # Even a tolerance that forgives much does not forgive losing most of the goodput.
    assert tuner_check(worse_run, "--baseline", baseline, "--tolerance", "50").returncode == 1
    # As a user runs it: exit 1 for the regression, told apart from bad input (exit 2,
    # one line).
    for baseline_path, code in ((baseline, 1), (tmp_path / "absent.json", 2)):
        proc = subprocess.run(
            [sys.executable, "-m", "tuner.cli", "check", str(worse_run), "--baseline", str(baseline_path)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == code, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.timeout(900)
def test_noise_within_the_measured_spread_does_not_fail(
    real_split: dict[str, Path], tmp_path: Path
) -> None:
    split = real_split  # measured in real time: the virtual clock measures alike every time
    noisy = write_baseline(split["baseline"], tmp_path / "noisy.json")
    spreads = {m: f["spread_pct"] for m, f in json.loads(noisy.read_text())["metrics"].items()}
    assert any(s > 0 for s in spreads.values()), f"two runs measured exactly alike: {spreads}"
    # Each repeat alone against the two together, with no tolerance at all: whatever a
    # repeat differs by lies within the spread the two measured, so neither fails, and
    # for each metric that moved one of them is worse than the mean.
    verdicts: list[str] = []
    for single in (split["single-0"], split["single-1"]):
        done = tuner_check(single, "--baseline", noisy, "--tolerance", "0", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        verdicts += [str(row["verdict"]) for row in rows_of(done).values()]
    assert RowVerdict.NOISE.value in verdicts
    # Without measured noise (one repeat as the baseline of the other) the same
    # differences fail at no tolerance: it is the spread that let them pass.
    codes = []
    for base, current in (("single-0", "single-1"), ("single-1", "single-0")):
        path = write_baseline(split[base], tmp_path / f"{base}.json")
        codes.append(tuner_check(split[current], "--baseline", path, "--tolerance", "0").returncode)
    assert 1 in codes, codes


@pytest.mark.timeout(900)
def test_the_tunes_own_run_directory_is_checked(
    tuned_run: Path, split: dict[str, Path], tmp_path: Path
) -> None:
    # The tune confirmed at a higher rate than these runs, so its latencies differ; what
    # is checked here is that a run directory `tuner tune` wrote is read and compared.
    baseline = write_baseline(split["baseline"], tmp_path / "b.json")
    done = tuner_check(tuned_run, "--baseline", baseline, "--json")
    assert done.returncode in (0, 1), done.stderr
    rows = rows_of(done)
    measured = recommendation(tuned_run).recommended.measured
    assert measured is not None
    assert rows["goodput"]["current"] == pytest.approx(measured.goodput)

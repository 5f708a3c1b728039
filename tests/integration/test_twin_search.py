"""The twin-guided search (issue 17): the twin screens the whole space before the first
launch, the trial after vLLM's defaults goes to its best setting, the report shows the
landscape with the measured trials and the twin's error at each; ``--dry-run`` says
all that without launching; an interrupted screen leaves no process behind.

The screened tune runs on the twin's virtual clock (tests/virtual.py) and the dry run in
this process; the interrupted screen stays a real `tuner tune` process (it tests that
SIGINT leaves none of its screen workers running)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.tune_run import SMALL_TUNE_ARGS
from tests.virtual import tune_args, tune_cli, tuner_cli, virtual_tune
from tuner.run.config import TuneConfig
from tuner.run.layout import RunLayout
from tuner.search.context import TuneContext, resolve
from tuner.sim.timing import TimingFactors
from tuner.twin.landscape import (
    Landscape,
    ScreenedPoint,
    ScreenJob,
    ScreenMethod,
    ScreenRun,
    candidates,
    group_of,
    groups_of,
)
from tuner.twin.screen import RERANK, TwinSearch, screen_job
from tuner.vllm.space import TrialParams

pytestmark = pytest.mark.integration

# 2 block sizes x 2 KV dtypes x 4 max-num-seqs x 6 utilizations: 96 settings.
SPACE = ("--space", "gpu-memory-utilization=0.8..0.95/0.03")
TINY = Path(__file__).resolve().parents[1] / "fixtures" / "workloads" / "tiny.yaml"


def _first_pass(landscape: Landscape) -> Landscape:
    """What the first pass of ``landscape``'s screen held (``ScreenRun``; the second pass
    keeps it as it was): each group's ends, and the settings between them where the two
    agreed (then every one between is ``BETWEEN``; otherwise the second pass computed
    one at least)."""
    groups: dict[str, list[ScreenedPoint]] = {}
    for p in landscape.points:
        groups.setdefault(group_of(p.params), []).append(p)
    kept: list[ScreenedPoint] = []
    for group in groups.values():
        group.sort(key=lambda p: p.params.gpu_memory_utilization or 0.0)
        agreed = all(p.method is ScreenMethod.BETWEEN for p in group[1:-1])
        kept += group if agreed else [group[0], group[-1]]
    return landscape.model_copy(update={"points": kept})


def _keys(landscape: Landscape) -> set[str]:
    return {p.model_dump_json() for p in landscape.points}


def test_the_twin_screens_the_space_and_picks_the_next_trial(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = virtual_tune(
        run_dir, *SPACE, "--trials", "3", "--no-edge", "--no-confirm", twin_search=True
    )
    assert done.summary.best_trial is not None, done.output  # `tuner tune` exits 0
    landscape = Landscape.model_validate_json((run_dir / "landscape.json").read_text())
    assert len(landscape.points) == 96
    assert all(
        p.rate_per_s > 0 for p in landscape.points if p.method is not ScreenMethod.NOT_STARTING
    )
    assert "96 settings screened" in done.output
    assert "settings screened" in (run_dir / "tune.log").read_text()

    evaluations = [
        json.loads(p.read_text()) for p in sorted((run_dir / "trials").glob("*/evaluation.json"))
    ]
    defaults = TrialParams.model_validate(evaluations[0]["params"])
    second = TrialParams.model_validate(evaluations[1]["params"])
    # Trial 1 is the twin's: one of its most promising settings, or, where it predicts
    # none above vLLM's defaults as measured (this tiny workload saturates every
    # setting with the most sequences), the sampler's draw, and it says so.
    if "twin: next " in done.output:
        # (from the first pass, where the pick was made before the screen was whole)
        source = _first_pass(landscape) if "the first pass screened" in done.output else landscape
        top = candidates(source, [defaults], count=RERANK)
        assert second in [p.params for p in top], (second, [p.params for p in top])
        assert "twin: next " + second.short() in done.output
    else:
        assert "no untried setting predicted above the best measured" in done.output, done.output
    html = (run_dir / "report.html").read_text()
    table = html[html.index('id="twin-points"') :]
    assert "vLLM defaults" in table and ("twin&#39;s pick" in table) == (
        "twin: next " in done.output
    )
    assert html.count('<tr><td class="num">', html.index('id="twin-points"')) >= 2


def _small_context(tmp_path: Path, utilizations: str) -> TuneContext:
    return resolve(
        TuneConfig(
            model="llama-3.1-8b", gpu="L4", workload=str(TINY), level_duration_s=3,
            level_warmup_s=1, space={"max-num-seqs": "4,16,64", "gpu-memory-utilization": utilizations,
                                     "block-size": "16", "kv-cache-dtype": "auto"},
            run_dir=tmp_path / "run",
        )
    )  # fmt: skip


def test_the_screens_first_pass_holds_each_groups_ends_and_the_second_keeps_them(
    tmp_path: Path,
) -> None:
    """Two worker processes: the first pass (what the first pick is made from) has every
    group's lowest and highest utilization screened, and the whole landscape keeps those
    points as they were, with every setting between."""
    ctx = _small_context(tmp_path, "0.8..0.95/0.03")
    job = screen_job(ctx, TimingFactors(), 4.0)
    assert isinstance(job, ScreenJob)
    run = ScreenRun(job, ctx.space, jobs=2)
    try:
        first = run.first(timeout_s=120)
        whole = run.result(timeout_s=120)
        time.sleep(0.5)
        # the seconds each pass took, not when it was asked for
        assert run.result(timeout_s=1).wall_s == whole.wall_s
    finally:
        run.stop()
    assert len(whole.points) == 18
    ends = (ScreenMethod.COMPUTED, ScreenMethod.NOT_STARTING)
    for group in groups_of(ctx.space):
        for end in (group[0], group[-1]):
            point = first.point(end)
            assert point is not None and point.method in ends, (end.short(), point)
    for point in first.points:
        assert whole.point(point.params) == point
    assert _keys(_first_pass(whole)) == _keys(first)
    assert first.wall_s == run.first_wall_s and first.wall_s <= whole.wall_s == run.wall_s


def test_a_pick_made_from_the_first_pass_leaves_the_whole_landscape(tmp_path: Path) -> None:
    """The twin's first pick waits only for the first pass; at the tune's end
    (``finish``) the rest of the screen is waited for and landscape.json has every
    setting."""
    # (an L4: below about 0.75 the weights leave no room, so each group's lowest
    # utilization does not start where its highest does, and the second pass has the
    # settings between to screen)
    ctx = _small_context(tmp_path, "0.6..0.97/0.01")
    lines: list[str] = []
    search = TwinSearch(ctx, lines.append)
    search.start(TimingFactors(), 4.0)
    try:
        pick = search.pick([], None, TimingFactors())
        # the pick waited for the first pass only: the second has middles to compute
        # here (groups whose ends disagree), and only the next pick or the end waits
        assert search.landscape is None
        assert any("the first pass screened" in line for line in lines), lines
        whole = search.finish()
    finally:
        search.stop()
    assert pick is not None
    assert whole is not None and len(whole.points) == 3 * 38
    written = RunLayout(ctx.run_dir).landscape_json
    assert Landscape.model_validate_json(written.read_text()) == whole
    assert len(_first_pass(whole).points) < len(whole.points)
    assert pick.params in [p.params for p in candidates(_first_pass(whole), [], count=RERANK)]


def test_dry_run_plans_without_launching(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = tuner_cli(*tune_args(run_dir, *SPACE, "--dry-run", twin_search=True))
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "nothing is launched" in out
    assert "96 settings screened" in out
    assert "the twin's best" in out and "the trials it would launch (3)" in out
    assert "vLLM's defaults" in out and "the twin's pick" in out
    assert "estimated: ~" in out and "no GPU (simulated engine)" in out
    assert not run_dir.exists()
    bad = tune_cli(run_dir, "--dry-run", "--space", "max-num-seqs=0..4")
    assert bad.returncode == 2 and "max-num-seqs" in bad.stderr
    assert not run_dir.exists()


def _children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def _running(pid: int) -> bool:
    """Alive and not a zombie (one whose parent is gone waits for the reaper, not running)."""
    try:
        return (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _describe(pid: int) -> str:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return str(pid)
    return f"{pid}: {command}"


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_an_interrupted_screen_leaves_no_process(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    out = tmp_path / "stdout.txt"
    with out.open("w") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.cli", "tune", *SMALL_TUNE_ARGS, "--run-dir", str(run_dir),
             "--space", "gpu-memory-utilization=0.8..0.97/0.01", "--trials", "2"],
            stdout=stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
            cwd=tmp_path,
        )  # fmt: skip
    deadline = time.monotonic() + 120
    while "twin: screening" not in out.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
        time.sleep(0.2)
    time.sleep(2.0)  # the workers spawned and computing
    children = _children_of(proc.pid)
    assert len(children) >= 2, "no screen workers to interrupt"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130, out.read_text()
    deadline = time.monotonic() + 10
    while (alive := [pid for pid in children if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    described = [_describe(pid) for pid in alive]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"left running: {described}"
    assert "Traceback" not in out.read_text()

"""One study, several `tuner tune` workers, a real PostgreSQL server (tests/integration/postgres.py).

Two workers share one PostgreSQL-backed study and one run directory (as workers on
one host do); one is killed with SIGKILL in the middle of a trial. The survivor
finishes the study: nothing already complete is lost, the killed trial is failed by
its stopped heartbeat and retried with the same settings, the set-up and the
finalize run once, and nothing the killed worker started is left running. A third
worker joining afterwards finds the study finished and only writes the report.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from tests.integration.postgres import PASSWORD, postgres_url
from tests.integration.tune_run import SMALL_TUNE_ARGS
from tuner.run.evaluation import Evaluation
from tuner.search.study import load_evaluation
from tuner.search.study.claims import CLAIMS_TABLE
from tuner.serving.processes import REGISTRY_FILE, ChildRegistry, group_alive, process_id

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

__all__ = ["postgres_url"]  # the fixture (tests/integration/postgres.py), requested below

STUDY = "dist"
TRIALS = 3
WORKER_ARGS = (*SMALL_TUNE_ARGS, "--trials", str(TRIALS), "--budget-min", "12",
               "--no-edge", "--no-confirm", "--study", STUDY, "--resume", "--json")  # fmt: skip
LEVEL_DIR = re.compile(r"trials/(\d+)/level-\d+")


def _worker(run_dir: Path, url: str, log: Path) -> subprocess.Popen[bytes]:
    """A tuning worker; the storage URL (with its password) only in the environment."""
    env = {**os.environ, "TUNER_STORAGE": url, "TUNER_HEARTBEAT_S": "2"}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tuner.cli", "tune", *WORKER_ARGS, "--run-dir", str(run_dir)],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=run_dir.parent,
        )  # fmt: skip


def _children(pid: int) -> dict[int, str]:
    """Live child processes of ``pid``: their environment and command line."""
    found: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
            blob = (proc / "environ").read_bytes() + (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if re.search(rf"^PPid:\s+{pid}$", status, re.MULTILINE):
            found[int(proc.name)] = blob.decode(errors="replace")
    return found


def _measuring(pid: int) -> tuple[int, list[int]] | None:
    """The trial ``pid``'s load generator is measuring a level of, and its child pids."""
    children = _children(pid)
    for text in children.values():
        match = LEVEL_DIR.search(text)
        if match:
            return int(match.group(1)), list(children)
    return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def _summary(stdout: str) -> dict[str, Any]:
    """The --json summary at the end of a worker's output."""
    start = stdout.rindex("\n{\n") + 1
    summary: dict[str, Any] = json.loads(stdout[start:])
    return summary


@pytest.mark.timeout(1200)
@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_two_workers_one_killed_mid_trial_complete_the_study(
    tmp_path: Path, postgres_url: str
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    survivor = _worker(run_dir, postgres_url, logs[0])
    victim = _worker(run_dir, postgres_url, logs[1])
    try:
        # Kill the victim with SIGKILL once it measures a level of a trial.
        deadline = time.monotonic() + 400
        measuring = None
        while measuring is None:
            assert victim.poll() is None, f"worker B ended early:\n{_tail(logs[1])}"
            assert survivor.poll() is None, f"worker A ended early:\n{_tail(logs[0])}"
            assert time.monotonic() < deadline, "worker B never measured a trial"
            time.sleep(0.5)
            measuring = _measuring(victim.pid)
        killed_number, victim_children = measuring
        study = optuna.load_study(study_name=STUDY, storage=postgres_url)
        before = {t.number: t for t in study.get_trials()}
        assert before[killed_number].state is TrialState.RUNNING
        complete_before = {n for n, t in before.items() if t.state is TrialState.COMPLETE}
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)

        # Its server and load generator die with it (PR_SET_PDEATHSIG).
        gone_by = time.monotonic() + 15
        while any(_alive(pid) for pid in victim_children) and time.monotonic() < gone_by:
            time.sleep(0.2)
        assert not [pid for pid in victim_children if _alive(pid)]

        survivor.wait(timeout=900)
    finally:
        for proc in (survivor, victim):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out = logs[0].read_text(errors="replace")
    assert survivor.returncode == 0, out[-3000:]
    summary = _summary(out)
    assert summary["finalized_here"] and summary["trials"] == TRIALS

    study = optuna.load_study(study_name=STUDY, storage=postgres_url)
    trials = study.get_trials()
    complete = [t for t in trials if t.state is TrialState.COMPLETE]
    failed = [t for t in trials if t.state is TrialState.FAIL]
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert len(complete) == TRIALS
    # Nothing complete is lost, and every complete trial's evidence is in the run directory.
    assert complete_before <= {t.number for t in complete}
    for trial in complete:
        assert (Path(trial.user_attrs["dir"]) / "evaluation.json").is_file()
        assert Path(trial.user_attrs["dir"]).parent == run_dir / "trials"
    # The killed trial failed (its heartbeat stopped) and was retried with its settings.
    assert [t.number for t in failed] == [killed_number]
    retried = [
        t
        for t in complete
        if RetryHeartbeatStaleTrialCallback.retried_trial_number(t) == killed_number
    ]
    assert len(retried) == 1 and retried[0].params == before[killed_number].params
    # vLLM's defaults were enqueued once: one baseline trial.
    assert sum(t.user_attrs.get("role") == "vllm-default" for t in complete) == 1

    # Set-up and finalize ran once: one claim each (no marker study beside the study in
    # what optuna-dashboard lists), one recommendation.
    assert optuna.get_all_study_names(postgres_url) == [STUDY]
    engine = sqlalchemy.create_engine(postgres_url)
    with engine.connect() as conn:
        claims = conn.execute(sqlalchemy.text(f"SELECT duty FROM {CLAIMS_TABLE}")).scalars()
        assert sorted(claims) == ["finalize", "prepare"]
    engine.dispose()
    assert out.count("recommended for ") == 1
    assert "finalized" in study.user_attrs
    rec = json.loads((run_dir / "recommendation" / "recommendation.json").read_text())
    best = max(
        (t for t in complete if t.user_attrs["verdict"] == "met"),
        key=lambda t: (t.user_attrs["goodput"], t.user_attrs["throughput"]),
    )
    # the best, unless a trial tied with it was chosen by the tie-break (tuner.search.ties)
    tie = rec.get("tie_break")
    assert rec["best_trial"] == (tie["chosen"] if tie else best.number)
    if tie:
        assert tie["best"] == best.number and rec["best_trial"] in (best.number, *tie["tied"])
    assert (run_dir / "report.html").is_file()
    # A finalizing worker on another host reads the best trial's evaluation from the study.
    elsewhere = copy.deepcopy(best)
    elsewhere.user_attrs = {**best.user_attrs, "dir": str(tmp_path / "other-host" / "trials")}
    on_file = Evaluation.model_validate_json(
        (Path(best.user_attrs["dir"]) / "evaluation.json").read_text()
    )
    assert load_evaluation(elsewhere) == on_file

    # The killed worker's records in the shared registry do not outlive it.
    records = json.loads((run_dir / REGISTRY_FILE).read_text())
    assert records == []
    # The password reached no file of the run (nor any command line: it came by env).
    for path in run_dir.rglob("*"):
        if path.is_file() and path.stat().st_size < 50_000_000:
            assert PASSWORD.encode() not in path.read_bytes(), path

    # A worker joining the finished study runs nothing, waits for nothing, writes the report.
    (run_dir / "report.html").unlink()
    late = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "tune", *WORKER_ARGS, "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "TUNER_STORAGE": postgres_url, "TUNER_HEARTBEAT_S": "2"},
    )  # fmt: skip
    assert late.returncode == 0, late.stdout[-3000:] + late.stderr[-3000:]
    late_summary = _summary(late.stdout)
    assert not late_summary["finalized_here"] and late_summary["report"]
    assert "another worker of this study finalizes it" in late.stdout
    assert (run_dir / "report.html").is_file()
    assert len(optuna.load_study(study_name=STUDY, storage=postgres_url).trials) == len(trials)
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["finalized_here"]  # the finalizer's summary is not replaced
    # The workers' reports read the shared study; `tuner report` does with --storage (or
    # $TUNER_STORAGE), and without it says where the study is and how to read it.
    assert "the study is not in this directory" not in (run_dir / "report.html").read_text()
    bare_env = {k: v for k, v in os.environ.items() if k != "TUNER_STORAGE"}
    for extra, expect_note in (([], True), (["--storage", postgres_url], False)):
        rebuilt = subprocess.run(
            [sys.executable, "-m", "tuner.cli", "report", str(run_dir), *extra],
            capture_output=True, text=True, timeout=120, cwd=tmp_path, env=bare_env,
        )  # fmt: skip
        # without the study, the report shows the run's files and the terminal says so
        assert rebuilt.returncode == (1 if expect_note else 0), rebuilt.stderr[-2000:]
        assert ("the report shows the run's files only" in rebuilt.stderr) is expect_note
        html = (run_dir / "report.html").read_text()
        assert ("`tuner report RUN_DIR --storage URL` reads it there" in html) is expect_note
        assert PASSWORD not in html


def test_workers_sharing_a_run_directory_leave_each_others_children_alone(
    tmp_path: Path,
) -> None:
    """The child registry of a shared run directory: a live harness's children are not
    leftovers; a dead harness's are stopped by the next run."""
    harness = subprocess.Popen(["sleep", "120"])  # stands in for another live worker
    child = subprocess.Popen(["sleep", "120"], start_new_session=True)
    reaper = threading.Thread(target=child.wait, daemon=True)  # as its own harness would
    reaper.start()
    try:
        record = {
            "pgid": child.pid, "cmdline": "sleep 120", "started_at": time.time(),
            "role": "sim server", "owner": process_id(harness.pid),
        }  # fmt: skip
        (tmp_path / REGISTRY_FILE).write_text(json.dumps([record]))
        mine = ChildRegistry(tmp_path)
        assert mine.stop_leftovers() == []
        assert group_alive(child.pid)
        sleeper = mine.spawn(["sleep", "120"], role="sim server", stdout_path=tmp_path / "s.log")
        kept = json.loads((tmp_path / REGISTRY_FILE).read_text())
        assert {r["pgid"] for r in kept} == {child.pid, sleeper.pid}
        mine.stop(sleeper.pid)
        assert [r["pgid"] for r in json.loads((tmp_path / REGISTRY_FILE).read_text())] == [
            child.pid
        ]

        harness.kill()
        harness.wait()
        notes = ChildRegistry(tmp_path).stop_leftovers()
        reaper.join(timeout=10)
        assert len(notes) == 1 and "left running by an earlier run" in notes[0]
        assert json.loads((tmp_path / REGISTRY_FILE).read_text()) == []
    finally:
        for proc in (harness, child):
            if proc.poll() is None:
                proc.kill()
                proc.wait()

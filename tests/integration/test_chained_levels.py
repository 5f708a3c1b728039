"""A trial's levels chained on one load run (issue 16, cost): the server is not drained
between rates, the conversations under way carry on into the next rate (thinned when it
is lower), the earlier rate's new arrivals stop at the handoff, and what is in flight when
a level ends is measured as far as it got (workloads.chain, tuner.serving.live_server,
tuner.search.rate_search).

The server is `tuner sim-serve` (Llama 3.1 8B on an L4) behind ``LiveServer``, loaded by
Locust over real sockets.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.simserver import live_sim
from tuner.search.rate_search import search_rate
from tuner.serving.live_server import LiveServer
from tuner.serving.prometheus_scrape import read_metrics_csv
from tuner.serving.window import WindowOpening
from tuner.vllm.memory import ServingParams
from workloads.build import build_schedule
from workloads.chain import LoadChain
from workloads.load_errors import ABORTED, was_sent
from workloads.schedule import ScheduledRequest, read_records, write_schedule
from workloads.spec import WorkloadSpec, parse_workload

pytestmark = pytest.mark.integration

WORKLOAD = """
name: talk
api: chat
stream: true
arrival: {kind: poisson, rate_per_s: 3}
prompt_tokens: {kind: uniform, low: 32, high: 96}
output_tokens: {kind: uniform, low: 60, high: 120}
sessions:
  turns: {kind: uniform, low: 2, high: 4}
  think_time_s: 1
  expected_ttft_s: 0.1
  expected_tpot_s: 0.02
warmup: {duration_s: 0}
duration_s: 6
seed: 3
slo:
  ttft: {p99_ms: 3000}
"""
PARAMS = ServingParams(max_model_len=4096, max_num_seqs=64)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_sim(tmp_path_factory.mktemp("chain"), PARAMS) as server:
        yield server


def _spec() -> WorkloadSpec:
    return parse_workload(WORKLOAD, label="talk.yaml")


def _renamed(schedule: list[ScheduledRequest], prefix: str) -> list[ScheduledRequest]:
    """Another run's schedule with its ids (and what they follow) named apart."""
    return [
        dataclasses.replace(
            r,
            request_id=prefix + r.request_id,
            session_id=prefix + str(r.session_id),
            follows=None if r.follows is None else prefix + r.follows,
        )
        for r in schedule
    ]


def _sessions_after(records_dir: Path, ids: set[str], since_unix_s: float) -> int:
    """Requests of ``ids`` sent, intended at or after ``since_unix_s``."""
    return sum(
        1
        for path in records_dir.glob("records.jsonl.w*[0-9]")
        for r in read_records(path)
        if r.request_id in ids and r.scheduled_s >= since_unix_s and was_sent(r.error)
    )


def _handoff(live: LiveServer, out: Path, keep: float) -> tuple[int, int, int]:
    """A chained run of the workload, then a segment of new arrivals from 2 s in that keeps
    ``keep`` of the sessions under way: (the first schedule's requests recorded as intended
    after the handoff, its new arrivals among them, the segment's requests recorded)."""
    spec = _spec().with_duration(30.0)
    first = build_schedule(spec)
    second = _renamed(build_schedule(spec.model_copy(update={"seed": 9})), "S.")
    out.mkdir(parents=True)
    write_schedule(out / "first.jsonl", first)
    write_schedule(out / "second.jsonl", second)
    chain = live.chain(out)
    assert chain is not None
    with chain:
        start = chain.start(first, out / "first.jsonl")
        time.sleep(max(0.0, start + 6.0 - time.time()))
        offset = chain.offset_now_s() + 0.5
        chain.append(out / "second.jsonl", offset_s=offset, keep_under_way=keep, salt="t")
        time.sleep(6.0)
        snapshot = chain.snapshot()
        run = chain.close()
    assert run is not None and snapshot.workers
    assert all(r.error == ABORTED for r in snapshot.in_flight)
    handoff = start + offset
    first_ids = {r.request_id for r in first}
    arrivals = {r.request_id for r in first if r.turn == 0}
    assert sum(w.withdrawn for w in run.workers) > 0
    return (
        _sessions_after(out, first_ids, handoff + 0.05),
        _sessions_after(out, arrivals, handoff + 0.05),
        _sessions_after(out, {r.request_id for r in second}, 0.0),
    )


def test_a_segment_stops_the_earlier_arrivals_and_carries_the_sessions_on(
    live: LiveServer, tmp_path: Path
) -> None:
    carried, new_arrivals, segment = _handoff(live, tmp_path / "keep", keep=1.0)
    assert new_arrivals == 0  # the first schedule's new conversations stopped at the handoff
    assert carried > 5  # its conversations under way went on with their later turns
    assert segment > 10


def test_a_segment_that_keeps_none_withdraws_every_session_under_way(
    live: LiveServer, tmp_path: Path
) -> None:
    carried, _, segment = _handoff(live, tmp_path / "none", keep=0.0)
    assert carried == 0
    assert segment > 10


def test_a_chained_search_carries_each_level_on_from_the_last(
    live: LiveServer, tmp_path: Path
) -> None:
    search = search_rate(
        live, _spec(), start_rate_per_s=3.0, out_dir=tmp_path, max_levels=2,
        level_duration_s=5.0, warmup_s=2.0, chain=live.chain, edge_draws=1,
    )  # fmt: skip
    first, second = search.levels
    assert first.met and second.rate_per_s > first.rate_per_s
    assert len(list(tmp_path.glob("chain-*"))) == 1  # one run for both levels
    windows = [
        WindowOpening.model_validate_json((tmp_path / f"level-{i}" / "window.json").read_text())
        for i in range(2)
    ]
    assert windows[0].carried_on is None
    assert windows[1].carried_on == pytest.approx(1.0 - first.rate_per_s / second.rate_per_s)
    # Not drained: the second level's server is busy from its first samples on.
    samples = read_metrics_csv(tmp_path / "level-1" / "metrics.csv")
    early = [s.running for s in samples[:8] if s.running is not None]
    assert early and min(early) > 0
    # Its window measured the conversations carried on from the first level too.
    measured = {r.request_id for r in read_records(tmp_path / "level-1" / "requests.jsonl")}
    carried = {i for i in measured if not i.startswith("L1.")}
    assert carried and len(carried) < len(measured)
    # The first level's requests still in flight at its end were measured as far as they got.
    ended = list(read_records(tmp_path / "level-0" / "requests.jsonl"))
    assert any(r.error == ABORTED for r in ended)
    assert first.measurement.load.num_requests > 10


def test_two_processes_take_their_shares_of_each_segment(live: LiveServer, tmp_path: Path) -> None:
    """With ``--processes 2`` both Locust processes read each segment and send their own
    share of it (whole sessions), and each answers a snapshot."""
    spec = _spec().with_duration(20.0)
    first = build_schedule(spec)
    second = _renamed(build_schedule(spec.model_copy(update={"seed": 9})), "S.")
    write_schedule(tmp_path / "first.jsonl", first)
    write_schedule(tmp_path / "second.jsonl", second)
    with LoadChain(
        base_url=live.server.base_url, model=live.model, out_dir=tmp_path, processes=2
    ) as chain:
        start = chain.start(first, tmp_path / "first.jsonl")
        time.sleep(max(0.0, start + 3.0 - time.time()))
        chain.append(tmp_path / "second.jsonl", offset_s=chain.offset_now_s() + 0.5)
        time.sleep(6.0)
        snapshot = chain.snapshot()
        run = chain.close()
    assert run is not None and len(snapshot.workers) == 2
    by_worker: dict[str, int] = {}
    for r in read_records(run.records_path):
        if r.request_id.startswith("S.") and was_sent(r.error):
            by_worker[r.worker] = by_worker.get(r.worker, 0) + 1
    assert sorted(by_worker) == ["w0", "w1"] and min(by_worker.values()) > 2, by_worker


def test_tune_chains_its_levels_when_asked(tmp_path: Path) -> None:
    """``tuner tune --chain-levels``: a trial's levels go on one load run (recorded in
    tune.json and the study's settings). Without the flag each level is a run of its own:
    ``test_without_the_flag_each_level_is_a_run_of_its_own``, on the real-time tune."""
    workload = tmp_path / "talk.yaml"
    workload.write_text(WORKLOAD)
    run = tmp_path / "chained"
    cmd = [
        sys.executable, "-m", "tuner.cli", "tune", "--backend", "sim", "--model", "llama-3.1-8b",
        "--gpu", "L4", "--workload", str(workload), "--trials", "1", "--no-edge", "--no-confirm",
        "--level-duration", "4", "--level-warmup", "2", "--max-levels", "2", "--rate", "3",
        "--max-model-len", "4096", "--no-twin-search", "--run-dir", str(run), "--chain-levels",
        "--edge-draws", "1",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    # 1: no trial met the SLOs (a short level on a small GPU may build a backlog)
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads((run / "tune.json").read_text())["config"]["chain_levels"] is True
    (trial,) = run.glob("trials/000")
    levels = sorted(trial.glob("level-*"))
    assert len(levels) == 2
    carried = WindowOpening.model_validate_json((levels[1] / "window.json").read_text())
    clean = first_level_clean(levels[0])
    assert (carried.carried_on is not None) is clean
    # One run for both levels, or a fresh one after a level that queued.
    assert len(list(trial.glob("chain-*"))) == (1 if clean else 2)


def test_without_the_flag_each_level_is_a_run_of_its_own(real_tuned_run: Path) -> None:
    """The real-time tune (tests/integration/conftest.py), run without ``--chain-levels``:
    recorded so, no chained load run, no level carried on from the one before."""
    assert json.loads((real_tuned_run / "tune.json").read_text())["config"]["chain_levels"] is False
    trials = sorted(real_tuned_run.glob("trials/*"))
    assert trials
    for trial in trials:
        assert not list(trial.glob("chain-*")), trial
        levels = sorted(trial.glob("level-*"))
        assert levels, trial
        for level in levels:
            opened = WindowOpening.model_validate_json((level / "window.json").read_text())
            assert opened.carried_on is None, level


def first_level_clean(level_dir: Path) -> bool:
    """Whether a level ended clean (no backlog stop, no growing backlog): the next one then
    carries on from it."""
    if (level_dir / "backlog-stop.json").exists():
        return False
    backlog = json.loads((level_dir / "backlog.json").read_text())
    return bool(backlog.get("verdict") != "growing")

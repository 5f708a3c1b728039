"""Load from several hosts: `tuner load-worker` agents serve two `run_load` runs in a row.

The agents run as separate processes in their own directories with no TUNER_* variable,
as on a load host: their workers share no file with the master and get their share of
the schedule, and send their records back, over Locust's messages.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.simserver import SimServer
from tests.integration.test_locust_load import (
    MODEL,
    OUTPUT_TOKENS,
    check_run,
    offered_rate,
    poisson_schedule,
    sent_rate,
    start_sim,
)
from tuner.serving.processes import group_alive
from tuner.serving.server import free_port
from workloads.load_result import LoadResult
from workloads.runner import connected_workers_path, run_load

# The two runs' send lag runs with the timing tests, alone after the parallel part of make
# test; a missing worker's error line does not need the cores to itself.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

AGENTS = 2


@dataclass
class Agent:
    proc: subprocess.Popen[bytes]
    cwd: Path

    @property
    def log(self) -> str:
        return (self.cwd / "agent.log").read_text(errors="replace")

    def children(self) -> list[int]:
        """Process groups the agent has running (its registry's record)."""
        path = self.cwd / "runs" / "load-worker" / "children.json"
        return [int(child["pgid"]) for child in json.loads(path.read_text(encoding="utf-8"))]

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise


def start_agent(cwd: Path, port: int) -> Agent:
    cwd.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNER_", "LOCUST_"))}
    cmd = [sys.executable, "-m", "tuner.cli", "load-worker", "--master", f"127.0.0.1:{port}"]
    with (cwd / "agent.log").open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Agent(proc, cwd)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    server = start_sim(tmp_path_factory.mktemp("sim"))
    yield server
    server.stop()


@pytest.mark.timing
def test_remote_workers_serve_two_runs(sim: SimServer, tmp_path: Path) -> None:
    port = free_port()
    agents = [start_agent(tmp_path / f"host{i}", port) for i in range(AGENTS)]
    try:
        # First one local process and the two agents' workers; then only the agents'.
        for round_, processes in enumerate((1, 0)):
            total = processes + AGENTS
            schedule = poisson_schedule(60, rate=12.0, seed=20 + round_)
            run = run_load(
                base_url=sim.url,
                model=MODEL,
                schedule=schedule,
                out_dir=tmp_path / f"run{round_}",
                processes=processes,
                remote_workers=AGENTS,
                master_bind=f"127.0.0.1:{port}",
            )
            logs = "\n".join(agent.log for agent in agents)
            records = check_run(run, schedule)
            assert len({r.request_id for r in records}) == len(records)  # each exactly once
            assert (run.processes, run.remote_workers) == (processes, AGENTS)

            # Every worker (local or remote) with its share of the schedule and its stats.
            order = [s.request_id for s in schedule]
            share = len(schedule) // total
            assert sorted(s.worker for s in run.workers) == [f"w{i}" for i in range(total)], logs
            for stats in run.workers:
                mine = [r.request_id for r in records if r.worker == stats.worker]
                assert mine == order[stats.index :: total]
                assert (stats.count, stats.scheduled, stats.sent) == (total, share, share)
                assert stats.completed == share
                assert stats.token_events == share * OUTPUT_TOKENS
                assert stats.start_late_s <= 0.0, (stats, logs)
            assert connected_workers_path(run.out_dir / "records.jsonl").exists()

            result = LoadResult.from_file(run.records_path)
            assert result.achieved_rate == pytest.approx(result.offered_rate, rel=0.05)
            assert sent_rate(records) == pytest.approx(offered_rate(schedule), rel=0.05)
            # Sends on time: four Locust processes share two cores with the server here
            # (and with other tests under `make test`), so a single send of the 60 may
            # wait for a core; most must not.
            lag = result.send_lag_ms
            assert lag.p90 is not None and lag.p90 < 10.0, lag
            assert lag.p99 is not None and lag.p99 < 250.0, lag
            # The agents outlive the run: they serve the next one.
            assert all(agent.proc.poll() is None for agent in agents), logs
        # Each agent already runs the Locust worker for a next run, in its own group.
        waiting = [pgid for agent in agents for pgid in agent.children()]
        assert len(waiting) == AGENTS and all(group_alive(pgid) for pgid in waiting)
    finally:
        codes = [agent.stop() for agent in agents]
    # Stopped as a user stops it (SIGTERM here): the exit says so, 128 + 15.
    assert codes == [143] * AGENTS
    for pgid in [*waiting, *(agent.proc.pid for agent in agents)]:
        assert not group_alive(pgid)  # the agents and every Locust worker they started
    for agent in agents:
        lines = agent.log.splitlines()
        assert "tuner load-worker: stopped; served 2 run(s)" in lines, agent.log
        assert lines[-1].startswith("tuner: interrupted by SIGTERM; no server or load"), agent.log
        runs = [line for line in lines if line.startswith("run ") and " sent, " in line]
        assert len(runs) >= 2, agent.log  # one line per run it served


def test_a_missing_worker_is_named(sim: SimServer, tmp_path: Path) -> None:
    """No agent runs: the master gives up waiting and the error says how many connected."""
    from workloads.load_errors import LoadGeneratorError

    began = time.monotonic()
    with pytest.raises(
        LoadGeneratorError, match=r"only 1 of 2 Locust workers \(1 local, 1 remote\)"
    ):
        run_load(
            base_url=sim.url,
            model=MODEL,
            schedule=poisson_schedule(5, rate=10.0),
            out_dir=tmp_path,
            remote_workers=1,
            master_bind=f"127.0.0.1:{free_port()}",
            workers_wait_s=3.0,
        )
    assert time.monotonic() - began < 30.0

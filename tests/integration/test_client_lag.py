"""A level whose load generator lagged past its bounds does not count: it is measured again
on its own, with more load processes or, on the simulated engine, a slower clock, and its
record says so (tuner.serving.client_lag, tuner.search.client_retry).

The server is `tuner sim-serve` (Llama 3.1 8B on an L4) behind ``LiveServer``, loaded by
Locust over real sockets, one level of the rate search. The bounds are set below any lag a
real process has (a millionth of a millisecond), so every attempt lags: the first is set
aside, the second is measured with the remedy, and the level ends unmeasurable.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tests.integration.simserver import live_sim
from tuner.run.goodput import GoodputBound
from tuner.run.layout import CLIENT_JSON
from tuner.search.rate_search import search_rate
from tuner.serving.client_lag import ClientRemedy, ClientRule, LevelClient
from tuner.serving.load import LoadGenerators
from tuner.vllm.memory import ServingParams
from workloads.client_lag import ClientBounds, ClientVerdict
from workloads.schedule import read_records
from workloads.slo import Slo
from workloads.spec import parse_workload

pytestmark = pytest.mark.integration

WORKLOAD = parse_workload(
    """
name: lag
api: completions
stream: true
arrival: {kind: poisson, rate_per_s: 6}
prompt_tokens: {kind: uniform, low: 32, high: 96}
output_tokens: {kind: uniform, low: 8, high: 24}
warmup: {duration_s: 0}
duration_s: 6
seed: 5
slo:
  ttft: {p90_ms: 1}
""",
    label="lag.yaml",
)
PARAMS = ServingParams(max_model_len=2048, max_num_seqs=16)
RATE = 6.0
NEVER_KEPT_UP = ClientBounds(send_lag_p99_ms=1e-6, loop_delay_p99_ms=1e-6, slo_share=0.0)


def processes_working_in(folder: Path) -> list[int]:
    """Processes whose working directory is in ``folder`` (Locust runs in its run's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue
        if cwd == folder or folder in cwd.parents:
            found.append(int(entry.name))
    return found


def one_level(
    tmp_path: Path, rule: ClientRule, *, chained: bool
) -> tuple[LevelClient, Path, float, list[int]]:
    """One level that breaks its SLO (a TTFT p90 of 1 ms) on a fresh server whose client
    obeys ``rule``: the level's client record, its directory, the server's clock after
    it, and any process still working in it. (A level that held through a lagging client
    counts as held: ``test_a_level_that_held_through_a_lagging_client_counts``.)"""
    generators = LoadGenerators(processes=1, client_rule=rule)
    out = tmp_path / "search"
    with live_sim(tmp_path / "server", PARAMS, generators=generators) as live:
        search = search_rate(
            live, WORKLOAD, start_rate_per_s=RATE, out_dir=out, max_levels=1,
            level_duration_s=3.0, warmup_s=1.0, chain=live.chain if chained else None,
        )  # fmt: skip
        clock = httpx.get(f"{live.server.base_url}/sim/gpu", timeout=5).json()["time_scale"]
        assert live.time_scale == clock
        left = processes_working_in(out)  # the server still runs; no load generator does
    (only,) = search.levels
    assert only.unmeasurable and not only.met
    # neither a hold nor a break: the search found nothing
    assert search.best is None and search.broken_rate_per_s is None
    assert search.bound is GoodputBound.NONE
    client = only.measurement.client
    assert client is not None
    return client, out / "level-0", float(clock), left


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="more processes need a second core")
def test_a_lagging_level_is_measured_again_with_more_processes(tmp_path: Path) -> None:
    rule = ClientRule(bounds=NEVER_KEPT_UP, retries=1)
    client, level_dir, clock, left = one_level(tmp_path, rule, chained=False)
    assert left == []
    (attempt,) = client.attempts
    if attempt.lag.server_lagged:  # a loaded host: the simulated server fell behind too,
        # and more load processes would take its core (test_client_lag.py, unit)
        assert attempt.then.remedy is ClientRemedy.SLOWER_CLOCK
        pytest.skip(f"this host's simulated server lagged: {attempt.lag.reason}")
    assert attempt.then.remedy is ClientRemedy.MORE_PROCESSES
    assert attempt.setup.processes == 1 and client.setup.processes == 2
    assert clock == 1.0  # the clock is left alone while processes can be added
    # each attempt's processes measured themselves: lag against the schedule, the event
    # loop's delay, token events/s
    assert attempt.lag.verdict is ClientVerdict.LAGGED
    assert [p.worker for p in attempt.lag.processes] == ["w0"]
    assert [p.worker for p in client.lag.processes] == ["w0", "w1"]
    for process in (*attempt.lag.processes, *client.lag.processes):
        assert process.send_lag_p99_ms is not None and process.send_lag_p99_ms > 0
        assert process.loop_delay_p99_ms is not None and process.loop_delay_p99_ms > 0
        assert process.token_events_per_s > 0 and process.sent > 0
    assert "event-loop delay p99" in (client.lag.reason or "")
    assert client.summary().startswith("the client could not keep up: w0 send lag p99")
    # the lagged attempt's evidence set aside; the level's directory holds the last one
    aside = Path(attempt.dir)
    assert aside == level_dir / "lagged-0"
    assert (aside / "locust.log").is_file() and read_records(aside / "requests.jsonl")
    assert (level_dir / "records.jsonl.w1").is_file()
    assert LevelClient.model_validate_json((level_dir / CLIENT_JSON).read_text()) == client


def test_with_no_process_to_add_the_simulated_clock_slows(tmp_path: Path) -> None:
    """One process allowed: the remedy is the simulated engine's clock, twice slower, set
    on the running server; the level, chained at first, is measured again as a run of its
    own, and still reads in the emulated GPU's time."""
    rule = ClientRule(bounds=NEVER_KEPT_UP, retries=1, max_processes=1)
    client, level_dir, clock, left = one_level(tmp_path, rule, chained=True)
    assert left == []
    (attempt,) = client.attempts
    assert attempt.then.remedy is ClientRemedy.SLOWER_CLOCK
    assert attempt.setup.time_scale == 1.0 and client.setup.time_scale == 2.0 and clock == 2.0
    assert client.setup.processes == 1
    # each attempt, chained or not, recorded what other processes took of the host meanwhile
    for lag in (attempt.lag, client.lag):
        assert lag.host_others_share is not None and 0.0 <= lag.host_others_share <= 1.0
    # the first attempt went on the chained run; the second is a run of its own
    assert (level_dir.parent / "chain-0").is_dir()
    records = read_records(level_dir / "requests.jsonl")
    assert records and (level_dir / "records.jsonl.w0").is_file()
    # the slower clock sends the same emulated rate: its wall rate is half of it
    sent_s = sorted(r.scheduled_s for r in records)
    wall_rate = (len(sent_s) - 1) / (sent_s[-1] - sent_s[0])
    assert wall_rate == pytest.approx(RATE / 2, rel=0.4)


def test_a_level_that_held_through_a_lagging_client_counts(tmp_path: Path) -> None:
    """A client's lag only adds latency: a level that held its SLO (TTFT p90 5 s) through
    it holds, and is not measured again."""
    held = WORKLOAD.model_copy(update={"slo": Slo.model_validate({"ttft": {"p90_ms": 5000}})})
    generators = LoadGenerators(
        processes=1, client_rule=ClientRule(bounds=NEVER_KEPT_UP, retries=1)
    )
    with live_sim(tmp_path / "server", PARAMS, generators=generators) as live:
        search = search_rate(
            live, held, start_rate_per_s=RATE, out_dir=tmp_path / "search", max_levels=1,
            level_duration_s=3.0, warmup_s=1.0,
        )  # fmt: skip
    (only,) = search.levels
    client = only.measurement.client
    assert client is not None and client.lag.verdict is ClientVerdict.LAGGED
    assert client.held_anyway and not client.unmeasurable and not client.attempts
    assert only.met and search.best is only
    assert client.summary().startswith("held although the client lagged")

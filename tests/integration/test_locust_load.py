"""`run_load` against `tuner sim-serve`: Locust as a subprocess, open-loop, records merged."""

from __future__ import annotations

import contextlib
import random
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.simserver import SimServer
from tests.integration.simserver import start_sim as start_simserver
from workloads.load_errors import CAP_REACHED
from workloads.load_result import LoadResult
from workloads.runner import LoadRun, run_load
from workloads.schedule import Api, RequestRecord, ScheduledRequest, read_records

pytestmark = [pytest.mark.integration, pytest.mark.timing, pytest.mark.timeout(120)]

MODEL = "qwen2.5-7b"
OUTPUT_TOKENS = 32
PROMPT_WORDS = 100


def start_sim(log_dir: Path, *extra: str) -> SimServer:
    args = ("--model", MODEL, "--gpu", "H100-80GB", "--max-model-len", "4096", *extra)
    return start_simserver(args, log_dir / "sim-serve.log")


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    server = start_sim(tmp_path_factory.mktemp("sim"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def slow_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """A clock 20 times slower: a 32-token response takes about 4.5 s."""
    server = start_sim(tmp_path_factory.mktemp("slow-sim"), "--time-scale", "20")
    yield server
    server.stop()


def poisson_schedule(count: int, rate: float, *, seed: int = 7) -> list[ScheduledRequest]:
    """``count`` Poisson arrivals at ``rate``/s; every fourth request uses the chat API."""
    rng = random.Random(seed)
    words = " ".join(f"w{k}" for k in range(PROMPT_WORDS))
    schedule, send_s = [], 0.0
    for i in range(count):
        chat = i % 4 == 3
        schedule.append(
            ScheduledRequest(
                request_id=f"r{i:03d}",
                send_s=send_s,
                api=Api.CHAT if chat else Api.COMPLETIONS,
                prompt_tokens=PROMPT_WORDS,
                max_tokens=OUTPUT_TOKENS,
                prompt=None if chat else words,
                messages=[{"role": "user", "content": words}] if chat else None,
            )
        )
        send_s += rng.expovariate(rate)
    return schedule


def sent_rate(records: list[RequestRecord]) -> float:
    sent = sorted(r.sent_s for r in records)
    return (len(sent) - 1) / (sent[-1] - sent[0])


def offered_rate(schedule: list[ScheduledRequest]) -> float:
    return (len(schedule) - 1) / (schedule[-1].send_s - schedule[0].send_s)


def check_run(run: LoadRun, schedule: list[ScheduledRequest]) -> list[RequestRecord]:
    records = list(read_records(run.records_path))
    assert run.num_records == len(records) == len(schedule), run.log_path.read_text()[-3000:]
    assert run.num_missing == 0
    assert {r.request_id for r in records} == {s.request_id for s in schedule}
    assert all(r.ok for r in records), [r.error for r in records if not r.ok]
    assert run.exit_code == 0
    assert not run.killed
    return records


def test_one_process_measures_every_request(sim: SimServer, tmp_path: Path) -> None:
    schedule = poisson_schedule(60, rate=10.0)
    before = sim.counter("vllm:generation_tokens_total")
    run = run_load(base_url=sim.url, model=MODEL, schedule=schedule, out_dir=tmp_path)
    after = sim.counter("vllm:generation_tokens_total")
    records = check_run(run, schedule)

    assert [r.output_tokens for r in records] == [OUTPUT_TOKENS] * len(schedule)
    assert all(len(r.token_times_s) == OUTPUT_TOKENS for r in records)
    assert sum(r.output_tokens for r in records) == after - before
    # Completions count the prompt's words; chat adds one role-marker token.
    assert {r.prompt_tokens for r in records} <= {PROMPT_WORDS, PROMPT_WORDS + 1}

    result = LoadResult.from_file(run.records_path)
    assert result.ttft_ms.p50 is not None and 1.0 < result.ttft_ms.p50 < 500.0
    assert result.itl_ms.p50 is not None and 1.0 < result.itl_ms.p50 < 100.0
    assert result.achieved_rate == pytest.approx(result.offered_rate, rel=0.10)
    assert sent_rate(records) == pytest.approx(offered_rate(schedule), rel=0.10)
    assert result.send_lag_ms.p99 is not None and result.send_lag_ms.p99 < 50.0
    for record in records:  # token events in order, between the first token and the end
        assert record.first_token_s == record.token_times_s[0]
        assert record.token_times_s == sorted(record.token_times_s)
        assert record.scheduled_s <= record.sent_s < record.token_times_s[0] <= record.end_s  # type: ignore[operator]

    (stats,) = run.workers
    assert (stats.sent, stats.completed, stats.cap_hits) == (60, 60, 0)
    assert stats.send_lag_p99_ms is not None and stats.send_lag_p99_ms < 50.0
    assert 0.0 < stats.cpu_percent < 100.0
    assert stats.token_events == 60 * OUTPUT_TOKENS
    assert "TTFT" in run.log_path.read_text()  # Locust's summary shows the TTFT events

    # Against the simulator's ground truth: each request reached the server after the
    # client sent it, and the client's token times are the server's write times, give
    # or take loopback delivery (exactly so with the kernel's receive stamps).
    truth = {t["request_id"]: t for t in httpx.get(f"{sim.url}/sim/requests").json()["requests"]}
    assert all(truth[r.request_id]["received_s"] > r.sent_s - 0.001 for r in records)
    gaps_ms = sorted(
        1000 * abs(client - server)
        for r in records
        for client, server in zip(
            r.token_times_s, truth[r.request_id]["token_times_s"], strict=True
        )
    )
    if sys.platform == "linux":
        assert stats.kernel_timestamps and stats.read_delay_p50_ms is not None
        assert gaps_ms[len(gaps_ms) // 2] < 1.0
    assert gaps_ms[len(gaps_ms) // 2] < 5.0


def test_two_processes_split_the_schedule(sim: SimServer, tmp_path: Path) -> None:
    schedule = poisson_schedule(60, rate=10.0, seed=11)
    with contextlib.ExitStack() as stack:  # Locust's default master port taken (another run)
        with contextlib.suppress(OSError):
            taken = stack.enter_context(socket.socket())
            taken.bind(("127.0.0.1", 5557))
            taken.listen()
        run = run_load(
            base_url=sim.url, model=MODEL, schedule=schedule, out_dir=tmp_path, processes=2
        )
    records = check_run(run, schedule)

    by_worker = {w: [r for r in records if r.worker == w] for w in ("w0", "w1")}
    assert [len(v) for v in by_worker.values()] == [30, 30]
    order = [s.request_id for s in schedule]
    assert [r.request_id for r in by_worker["w0"]] == order[0::2]
    assert [r.request_id for r in by_worker["w1"]] == order[1::2]
    assert sorted(s.worker for s in run.workers) == ["w0", "w1"]
    assert all(s.sent == 30 for s in run.workers)

    result = LoadResult.from_file(run.records_path)
    assert sent_rate(records) == pytest.approx(offered_rate(schedule), rel=0.10)
    assert result.achieved_rate == pytest.approx(result.offered_rate, rel=0.10)
    assert result.send_lag_ms.p99 is not None and result.send_lag_ms.p99 < 50.0
    assert [r.output_tokens for r in records] == [OUTPUT_TOKENS] * len(schedule)


def test_slow_responses_do_not_delay_sends(slow_sim: SimServer, tmp_path: Path) -> None:
    """Open loop: 20 requests at 10/s are all sent on time while each takes seconds."""
    schedule = poisson_schedule(20, rate=10.0, seed=3)
    run = run_load(base_url=slow_sim.url, model=MODEL, schedule=schedule, out_dir=tmp_path)
    records = check_run(run, schedule)
    result = LoadResult.from_file(run.records_path)
    assert result.e2e_ms.p50 is not None and result.e2e_ms.p50 > 2000.0
    assert result.send_lag_ms.p99 is not None and result.send_lag_ms.p99 < 50.0
    assert sent_rate(records) == pytest.approx(offered_rate(schedule), rel=0.10)
    assert run.workers[0].peak_in_flight >= 15  # nothing waited for an earlier response


def test_in_flight_cap_and_timeout_are_recorded(slow_sim: SimServer, tmp_path: Path) -> None:
    schedule = poisson_schedule(20, rate=10.0, seed=5)
    run = run_load(
        base_url=slow_sim.url,
        model=MODEL,
        schedule=schedule,
        out_dir=tmp_path,
        max_in_flight=4,
        timeout_s=1.0,
    )
    records = list(read_records(run.records_path))
    assert len(records) == run.num_records == len(schedule)
    capped = [r for r in records if r.error == CAP_REACHED]
    timed_out = [r for r in records if r.error and r.error.startswith("timeout")]
    assert capped and timed_out
    assert len(capped) == run.cap_hits == run.workers[0].cap_hits
    assert len(capped) + len(timed_out) == len(schedule)  # each response takes ~4.5 s > 1 s
    assert all(r.status == 0 and r.first_token_s is None for r in capped)
    for record in timed_out:  # abandoned at its deadline, scheduled + 1 s
        assert record.end_s == pytest.approx(record.scheduled_s + 1.0, abs=0.05)
    result = LoadResult.from_file(run.records_path)
    assert result.num_not_sent == len(capped)
    assert result.num_completed == 0

"""Stream sampling: only a share of requests streams, the rest sent whole, same server work;
or every request streamed in chunks (vLLM's per-request ``stream_interval``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.simserver import SimServer
from tests.integration.test_locust_load import MODEL, OUTPUT_TOKENS, poisson_schedule, start_sim
from workloads.client_lag import SERVER_LAG_FLOOR_MS, ServerClockLag
from workloads.load_result import LoadResult
from workloads.runner import run_load
from workloads.schedule import read_records, request_body, sample_streams

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    server = start_sim(tmp_path_factory.mktemp("sim"))
    yield server
    server.stop()


def test_sampled_streams_time_a_share_and_count_every_token(sim: SimServer, tmp_path: Path) -> None:
    schedule = sample_streams(poisson_schedule(80, rate=10.0), 0.3)
    streamed_ids = {r.request_id for r in schedule if r.stream}
    assert 10 < len(streamed_ids) < 40  # about 30% of 80, chosen by a hash of the id
    assert streamed_ids == {r.request_id for r in sample_streams(schedule, 0.3) if r.stream}

    before = sim.counter("vllm:generation_tokens_total")
    run = run_load(base_url=sim.url, model=MODEL, schedule=schedule, out_dir=tmp_path)
    after = sim.counter("vllm:generation_tokens_total")
    records = list(read_records(run.records_path))
    assert len(records) == 80 and all(r.ok for r in records), [r.error for r in records]
    # Every request generated its tokens, streamed or not, and the usage says so.
    assert sum(r.output_tokens for r in records) == after - before == 80 * OUTPUT_TOKENS
    for record in records:
        assert record.streamed == (record.request_id in streamed_ids)
        assert bool(record.token_times_s) == record.streamed
        assert (record.first_token_s is not None) == record.streamed
        assert record.end_s is not None and record.end_s > record.sent_s
    (stats,) = run.workers
    assert stats.token_events == len(streamed_ids) * OUTPUT_TOKENS

    result = LoadResult.from_file(run.records_path)
    assert result.num_completed == 80 and result.num_streamed == len(streamed_ids)
    assert result.ttft_ms.count == len(streamed_ids)
    assert result.e2e_ms.count == 80
    assert result.output_tokens == 80 * OUTPUT_TOKENS


@pytest.mark.parametrize(("version", "events_each"), [("0.33", 1 + 31 // 8 + 1), ("0.26", 32)])
def test_chunked_streams_time_every_request_with_fewer_events(
    sim: SimServer, tmp_path: Path, version: str, events_each: int
) -> None:
    """Each request asks for 8 tokens an event: the first token alone, then 8 at a time,
    the rest at the end (32 tokens: 1 + 3 x 8 + 7 in 5 events). A release before the
    request field (0.26) ignores it and streams every token."""
    server = sim if version == "0.33" else start_sim(tmp_path, "--vllm-version", version)
    try:
        schedule = sample_streams(poisson_schedule(40, rate=10.0), 1.0, 8)
        run = run_load(base_url=server.url, model=MODEL, schedule=schedule, out_dir=tmp_path)
    finally:
        if server is not sim:
            server.stop()
    records = list(read_records(run.records_path))
    assert len(records) == 40 and all(r.ok and r.streamed for r in records)
    assert {len(r.token_times_s) for r in records} == {events_each}
    assert all(r.output_tokens == OUTPUT_TOKENS for r in records)  # from the usage
    (stats,) = run.workers
    assert stats.token_events == 40 * events_each
    result = LoadResult.from_file(run.records_path)
    assert result.ttft_ms.count == result.tpot_ms.count == 40
    # the ITL, per token, averages the TPOT whatever the chunking
    assert result.itl_ms.mean == pytest.approx(result.tpot_ms.mean, rel=0.05)


def test_fraction_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="accepted"):
        sample_streams(poisson_schedule(3, rate=1.0), 0.0)


def test_the_simulated_server_says_how_late_its_steps_started(tmp_path: Path) -> None:
    """``GET /sim/lag``: a server whose clock runs 200 times faster than the emulated GPU
    cannot keep to its timeline on one core, and says so; a span with no step says 0."""
    fast = start_sim(tmp_path, "--time-scale", "0.005")
    try:
        began = time.time()
        run = run_load(
            base_url=fast.url, model=MODEL, schedule=poisson_schedule(400, rate=2000.0),
            out_dir=tmp_path / "load",
        )  # fmt: skip
        assert run.records_path.is_file()
        lag = ServerClockLag.model_validate(
            httpx.get(f"{fast.url}/sim/lag", params={"since": began}, timeout=5).json()
        )
        none = httpx.get(f"{fast.url}/sim/lag", params={"until": began - 1}, timeout=5).json()
    finally:
        fast.stop()
    assert lag.steps > 10 and 0 < lag.p99_ms <= lag.max_ms
    assert lag.p99_ms > SERVER_LAG_FLOOR_MS  # a lag the level's judgement counts
    assert ServerClockLag.model_validate(none).steps == 0


def test_a_chunked_stream_says_its_tokens_so_far_in_every_chunk(sim: SimServer) -> None:
    """A chunked request asks for the usage in every chunk (``continuous_usage_stats``): a
    stream cut off at a level's end then counts the tokens it got, not its chunks."""
    (request,) = sample_streams(poisson_schedule(1, rate=1.0), 1.0, 8)
    body = json.loads(request_body(request, MODEL))
    assert body["stream_interval"] == 8
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    so_far = []
    with httpx.stream("POST", f"{sim.url}/v1/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line.removeprefix("data: "))
                if chunk.get("choices"):
                    so_far.append(chunk["usage"]["completion_tokens"])
    assert so_far == [1, 9, 17, 25, OUTPUT_TOKENS]  # the first alone, then 8 at a time

"""Stream sampling: only a share of requests streams; the rest are sent whole, same server work."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.simserver import SimServer
from tests.integration.test_locust_load import MODEL, OUTPUT_TOKENS, poisson_schedule, start_sim
from workloads.load_result import LoadResult
from workloads.runner import run_load
from workloads.schedule import read_records, sample_streams

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


def test_fraction_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="accepted"):
        sample_streams(poisson_schedule(3, rate=1.0), 0.0)

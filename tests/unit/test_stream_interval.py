"""Chunked streams (vLLM's per-request ``stream_interval``): what the load generator asks
for, and what the latencies of a chunked stream are."""

from __future__ import annotations

import pytest

from workloads.load_result import LoadResult
from workloads.schedule import RequestRecord, ScheduledRequest, sample_streams
from workloads.spec import Api


def scheduled(i: int, *, stream: bool = True) -> ScheduledRequest:
    return ScheduledRequest(
        request_id=f"r{i}", send_s=float(i), api=Api.COMPLETIONS, prompt_tokens=4,
        max_tokens=9, prompt="a b c d", stream=stream,
    )  # fmt: skip


def test_the_interval_is_asked_of_streamed_requests_and_keeps_each_ones_stream_flag() -> None:
    requests = [scheduled(0), scheduled(1, stream=False)]
    chunked = sample_streams(requests, 1.0, 8)
    assert [r.stream for r in chunked] == [True, False]  # a workload's own unstreamed stay so
    assert [r.stream_interval for r in chunked] == [8, 8]
    assert sample_streams(requests, 1.0) == requests
    assert ScheduledRequest.from_json(chunked[0].to_json()) == chunked[0]
    with pytest.raises(ValueError, match="stream interval 0"):
        sample_streams(requests, 1.0, 0)


def record(token_times: list[float], output_tokens: int) -> RequestRecord:
    return RequestRecord(
        request_id="r", scheduled_s=0.0, sent_s=0.0, prompt_tokens=4,
        output_tokens=output_tokens, status=200, first_token_s=token_times[0],
        end_s=token_times[-1], token_times_s=token_times,
    )  # fmt: skip


def test_a_chunked_stream_keeps_ttft_and_tpot_and_its_itl_is_per_token() -> None:
    # 9 tokens every 10 ms from 0.1 s: per token, events at 0.10, 0.11, ..., 0.18
    per_token = record([0.1 + 0.01 * i for i in range(9)], 9)
    # the same tokens 4 to an event: the first alone, then 4, then 4 (at the 5th, the 9th)
    chunked = record([0.1, 0.14, 0.18], 9)
    one, four = (LoadResult.from_records([r], window_s=1.0) for r in (per_token, chunked))
    assert four.ttft_ms.p50 == pytest.approx(one.ttft_ms.p50) == pytest.approx(100.0)
    assert four.tpot_ms.p50 == pytest.approx(one.tpot_ms.p50) == pytest.approx(10.0)
    assert four.itl_ms.p50 == pytest.approx(10.0)  # 40 ms a gap over 4 tokens each
    unchunked_reading = 40.0
    assert four.itl_ms.p99 < unchunked_reading

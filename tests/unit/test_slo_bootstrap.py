"""How sure a level's verdict is: resamples of its requests judged as the level was."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tuner.serving.load import slo_verdict
from workloads.load_errors import ABORTED, STOPPED_BEFORE_SEND
from workloads.load_result import LoadResult, request_latencies
from workloads.schedule import RequestRecord
from workloads.slo import Slo
from workloads.slo_bootstrap import _weighted_quantile, hold_share
from workloads.spec import load_workload

SLO = Slo.p99(ttft_ms=1000.0, itl_ms=100.0)


def _requests(
    ttft_ms: list[float], *, itl_ms: float = 20.0, tokens: int = 8
) -> list[RequestRecord]:
    records = []
    for i, ttft in enumerate(ttft_ms):
        start = 1000.0 + i * 0.1
        first = start + ttft / 1000
        times = [first + k * itl_ms / 1000 for k in range(tokens)]
        records.append(
            RequestRecord(
                request_id=f"r{i}",
                scheduled_s=start,
                sent_s=start,
                prompt_tokens=64,
                output_tokens=tokens,
                status=200,
                first_token_s=first,
                end_s=times[-1],
                token_times_s=times,
            )
        )
    return records


def test_a_resample_drawn_once_each_is_the_levels_own_percentile() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 250):
        values = np.sort(rng.lognormal(5, 1, n))
        for q in (0.5, 0.9, 0.99):
            ours = _weighted_quantile(values, np.ones(n, dtype=np.int64), q)
            assert ours == pytest.approx(float(pd.Series(values).quantile(q)))
    # weights are repeats: [1, 2, 2, 3] is the sample 1, 2, 2, 3
    weighted = _weighted_quantile(np.array([1.0, 2.0, 3.0]), np.array([1, 2, 1]), 0.5)
    assert weighted == pytest.approx(float(pd.Series([1.0, 2.0, 2.0, 3.0]).quantile(0.5)))


def test_the_latencies_are_the_ones_the_verdict_takes_its_percentiles_of() -> None:
    records = _requests([100.0 + 10 * i for i in range(50)], itl_ms=30.0)
    latencies = request_latencies(records)
    result = LoadResult.from_records(records)
    assert float(np.percentile(latencies.ttft_ms, 99)) == pytest.approx(result.ttft_ms.p99)
    assert float(np.percentile(latencies.itl_ms, 99)) == pytest.approx(result.itl_ms.p99)
    assert latencies.itl_request.max() == 49 and not latencies.failed.any()


def test_far_inside_the_slo_always_holds_and_far_outside_never() -> None:
    inside = _requests(list(np.linspace(100, 300, 200)))
    outside = _requests(list(np.linspace(1500, 3000, 200)))
    assert hold_share(inside, SLO) == 1.0
    assert hold_share(outside, SLO) == 0.0
    assert hold_share([], SLO) is None


def test_a_p99_at_its_limit_is_a_coin_toss_not_a_verdict() -> None:
    """A window whose p99 sits at the limit 'met' it by luck: about half of its resamples
    hold. The verdict says met; the share says how little that means."""
    ttft = [200.0] * 195 + [960.0, 980.0, 1000.0, 1020.0, 1040.0]
    records = _requests(ttft)
    spec = load_workload("chat").model_copy(update={"slo": SLO})
    verdict = slo_verdict(spec, LoadResult.from_records(records))
    share = hold_share(records, SLO)
    assert share is not None and 0.2 < share < 0.9, (verdict.met, share)
    # the same window, the same share: a seeded estimate, not a new draw each time
    assert hold_share(records, SLO) == share
    # a tail well below the limit holds in nearly every resample
    calm = _requests([200.0] * 195 + [500.0] * 5)
    assert hold_share(calm, SLO) == 1.0


def test_a_failed_request_breaks_every_resample_that_draws_it() -> None:
    records = _requests([200.0] * 99)
    failed = RequestRecord(
        request_id="x", scheduled_s=999.0, sent_s=999.0, prompt_tokens=64, output_tokens=0,
        status=500, error="HTTP 500",
    )  # fmt: skip
    share = hold_share([*records, failed], SLO)
    # P(one request of 100 is never drawn in 100 draws) = 0.99^100 = 0.37
    assert share is not None and 0.25 < share < 0.5


def test_the_limits_scale_with_a_slowed_clock() -> None:
    """On a clock slowed k times the records' latencies are k times the GPU's: the
    limits scale as the verdict scales them."""
    slow = _requests([1800.0] * 100, itl_ms=40.0)
    assert hold_share(slow, SLO) == 0.0
    assert hold_share(slow, SLO, time_scale=2.0) == 1.0


def test_requests_the_load_generators_stop_cut_off_are_not_called_the_servers_failures() -> None:
    """A level stopped early (its SLO already broken) leaves requests in flight and
    unsent; its verdict counts them apart from the ones the server failed."""
    served = _requests([200.0] * 90)

    def cut(i: int, error: str, status: int) -> RequestRecord:
        return RequestRecord(
            request_id=f"c{i}", scheduled_s=1010.0 + i, sent_s=1010.0 + i, prompt_tokens=64,
            output_tokens=0, status=status, error=error,
        )  # fmt: skip

    in_flight = [cut(i, ABORTED, 200) for i in range(6)]
    unsent = [cut(6 + i, STOPPED_BEFORE_SEND, 0) for i in range(3)]
    failed = [cut(9, "HTTP 500", 500)]
    spec = load_workload("chat").model_copy(update={"slo": SLO})
    result = LoadResult.from_records([*served, *in_flight, *unsent, *failed])
    assert (result.num_errors, result.num_cut_by_stop) == (10, 9)
    verdict = slo_verdict(spec, result)
    assert not verdict.met
    assert "1 of 100 requests failed" in verdict.violations
    assert "9 of 100 requests unanswered when the load generator stopped" in verdict.violations
    # only the cut ones: the level is still not met, and nothing is called a failure
    alone = slo_verdict(spec, LoadResult.from_records([*served, *in_flight]))
    assert not alone.met and not any("failed" in v for v in alone.violations)

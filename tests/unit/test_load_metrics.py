"""Records with known timings -> LoadResult; client saturation and run_load's input checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from workloads.load_errors import CAP_REACHED, TIMED_OUT, LoadConfigError, was_sent
from workloads.load_result import LoadResult, Percentiles
from workloads.runner import (
    WorkerStats,
    client_saturation,
    run_load,
    worker_records_path,
    worker_stats_path,
)
from workloads.schedule import Api, RequestRecord, ScheduledRequest
from workloads.slo import Slo

T0 = 1_700_000_000.0
MS = 1e-3


def ok_record(
    i: int,
    *,
    ttft_ms: float,
    itl_ms: float = 20.0,
    events: int = 5,
    output_tokens: int | None = None,
    prompt_tokens: int = 100,
    lag_ms: float = 1.0,
    warmup: bool = False,
    scheduled_s: float | None = None,
) -> RequestRecord:
    """Scheduled at T0 + i s; token events every ``itl_ms`` from the first; end 5 ms after the last."""
    scheduled = T0 + i if scheduled_s is None else scheduled_s
    first = scheduled + ttft_ms * MS
    times = [first + k * itl_ms * MS for k in range(events)]
    return RequestRecord(
        request_id=f"r{i}{'w' if warmup else ''}",
        scheduled_s=scheduled,
        sent_s=scheduled + lag_ms * MS,
        prompt_tokens=prompt_tokens,
        output_tokens=events if output_tokens is None else output_tokens,
        status=200,
        first_token_s=times[0] if times else None,
        end_s=(times[-1] if times else scheduled) + 5 * MS,
        token_times_s=times,
        warmup=warmup,
    )


def ten_requests() -> list[RequestRecord]:
    """TTFT 100, 200, ..., 1000 ms; ITL 20 ms; 5 tokens; scheduled at T0 + 0..9 s."""
    return [ok_record(i, ttft_ms=100.0 * (i + 1), lag_ms=i + 1) for i in range(10)]


def approx(value: float) -> object:
    """Milliseconds to within 1 µs: a float Unix time near 1.7e9 s resolves ~0.24 µs."""
    return pytest.approx(value, abs=1e-3)  # Unix-time floats carry ~0.4 µs


class TestPercentiles:
    def test_linear_interpolation_as_numpy(self) -> None:
        summary = Percentiles.from_values([float(v) for v in range(10, 101, 10)])
        assert summary.count == 10
        assert summary.mean == approx(55.0)
        assert summary.p50 == approx(55.0)
        assert summary.p90 == approx(91.0)
        assert summary.p99 == approx(99.1)

    def test_no_samples(self) -> None:
        assert Percentiles.from_values([]) == Percentiles(count=0)


class TestLatencies:
    def test_ttft_itl_tpot_e2e_and_lag(self) -> None:
        result = LoadResult.from_records(ten_requests())
        assert result.num_requests == result.num_completed == 10
        assert (result.ttft_ms.p50, result.ttft_ms.p90, result.ttft_ms.p99) == (
            approx(550.0),
            approx(910.0),
            approx(991.0),
        )
        # 4 gaps of 20 ms per request.
        assert result.itl_ms.count == 40
        assert (result.itl_ms.p50, result.itl_ms.p99) == (approx(20.0), approx(20.0))
        assert result.tpot_ms.count == 10
        assert result.tpot_ms.p50 == approx(20.0)
        # e2e = TTFT + 4 × 20 ms + 5 ms.
        assert result.e2e_ms.p50 == approx(550.0 + 85.0)
        assert result.e2e_ms.p99 == approx(991.0 + 85.0)
        assert result.send_lag_ms.p50 == approx(5.5)
        assert result.send_lag_ms.p99 == approx(9.91)

    def test_tpot_uses_usage_tokens_not_event_count(self) -> None:
        # 5 events spanning 80 ms but 9 output tokens (several tokens per event): 80 / 8 = 10 ms.
        result = LoadResult.from_records([ok_record(0, ttft_ms=50.0, output_tokens=9)])
        assert result.tpot_ms.p50 == approx(10.0)
        # each 20-ms gap carried 2 tokens: the ITL is per token, as the TPOT
        assert result.itl_ms.p50 == approx(10.0)
        assert result.output_tokens == 9

    def test_one_token_output_has_no_tpot_or_itl(self) -> None:
        result = LoadResult.from_records([ok_record(0, ttft_ms=50.0, events=1)])
        assert result.tpot_ms.count == 0
        assert result.itl_ms.count == 0
        assert result.ttft_ms.p50 == approx(50.0)


class TestRatesAndThroughput:
    def test_inferred_window_and_rates(self) -> None:
        result = LoadResult.from_records(ten_requests())
        # 10 requests 1 s apart: span 9 s × 10/9 = 10 s, 1 request/s offered and achieved.
        assert result.window_s == approx(10.0)
        assert result.offered_rate == approx(1.0)
        assert result.achieved_rate == approx(1.0)
        # Duration: first scheduled (T0) to the last end (T0 + 9 + 1.0 + 0.085).
        assert result.duration_s == approx(10.085)
        assert result.request_throughput == approx(10 / 10.085)
        assert result.output_tokens == 50
        assert result.prompt_tokens == 1000
        assert result.output_token_throughput == approx(50 / 10.085)

    def test_window_given_by_the_caller(self) -> None:
        result = LoadResult.from_records(ten_requests(), window_s=20.0)
        assert result.offered_rate == approx(0.5)
        assert result.achieved_rate == approx(0.5)

    def test_no_records(self) -> None:
        result = LoadResult.from_records([])
        assert result.num_requests == 0
        assert result.error_rate == 0.0
        assert result.offered_rate is None
        assert result.request_throughput == 0.0
        assert result.ttft_ms.count == 0


class TestGoodput:
    def test_ttft_slo(self) -> None:
        result = LoadResult.from_records(ten_requests(), slo=Slo.p99(ttft_ms=550.0))
        assert result.num_good == 5
        assert result.goodput == approx(5 / 10.085)

    def test_every_objective_must_hold(self) -> None:
        records = [
            *ten_requests(),
            ok_record(10, ttft_ms=100.0, itl_ms=50.0),  # TPOT 50 ms
        ]
        result = LoadResult.from_records(records, slo=Slo.p99(ttft_ms=350.0, tpot_ms=30.0))
        assert result.num_good == 3  # TTFT 100, 200, 300; the slow decoder misses TPOT
        result = LoadResult.from_records(records, slo=Slo.p99(e2e_ms=400.0))
        assert result.num_good == 4  # e2e 185, 285, 385 and the slow decoder's 305

    def test_one_token_output_meets_the_tpot_objective(self) -> None:
        result = LoadResult.from_records(
            [ok_record(0, ttft_ms=10.0, events=1)], slo=Slo.p99(tpot_ms=1.0)
        )
        assert result.num_good == 1

    def test_without_slo_every_completed_request_is_good(self) -> None:
        result = LoadResult.from_records(ten_requests())
        assert result.num_good == 10
        assert result.goodput == result.request_throughput

    def test_objectives_must_be_positive(self) -> None:
        with pytest.raises(ValidationError):
            Slo.p99(ttft_ms=0)


class TestWarmupAndErrors:
    def test_warmup_records_are_excluded(self) -> None:
        warm = [
            ok_record(i, ttft_ms=9000.0, warmup=True, scheduled_s=T0 - 30 + i) for i in range(3)
        ]
        with_warmup = LoadResult.from_records([*warm, *ten_requests()])
        assert with_warmup == LoadResult.from_records(ten_requests())

    def test_errors_count_but_do_not_measure(self) -> None:
        failed = RequestRecord(
            request_id="e500",
            scheduled_s=T0 + 2.5,
            sent_s=T0 + 2.5 + 0.002,
            prompt_tokens=100,
            output_tokens=0,
            status=500,
            end_s=T0 + 2.6,
            error="HTTP 500: engine dead",
        )
        timed_out = RequestRecord(
            request_id="late",
            scheduled_s=T0 + 3.5,
            sent_s=T0 + 3.5 + 0.003,
            prompt_tokens=100,
            output_tokens=3,
            status=200,
            first_token_s=T0 + 3.6,
            end_s=T0 + 13.5,
            token_times_s=[T0 + 3.6, T0 + 3.7, T0 + 3.8],
            error=TIMED_OUT.format(timeout_s=10),
        )
        capped = RequestRecord(
            request_id="capped",
            scheduled_s=T0 + 4.5,
            sent_s=T0 + 4.5,
            prompt_tokens=100,
            output_tokens=0,
            status=0,
            error=CAP_REACHED,
        )
        result = LoadResult.from_records([*ten_requests(), failed, timed_out, capped])
        assert result.num_requests == 13
        assert result.num_completed == 10
        assert result.num_errors == 3
        assert result.num_not_sent == 1
        assert result.error_rate == approx(3 / 13)
        # Latencies and tokens only from the ten successes.
        assert result.ttft_ms.count == 10
        assert result.itl_ms.count == 40
        assert result.output_tokens == 50
        # The lag counts every sent request (12), not the one never sent.
        assert result.send_lag_ms.count == 12
        # The timed-out request ends last: it defines the duration.
        assert result.duration_s == approx(13.5)
        assert result.achieved_rate == approx(10 / result.window_s)  # type: ignore[operator]

    def test_not_sent_errors(self) -> None:
        assert not was_sent(CAP_REACHED)
        assert was_sent(None)
        assert was_sent("HTTP 500: boom")


class TestPromptBuckets:
    def test_default_buckets(self) -> None:
        lengths = [100, 511, 512, 2047, 2048, 5000, 8192, 20000]
        records = [
            ok_record(i, ttft_ms=10.0 * (i + 1), prompt_tokens=n) for i, n in enumerate(lengths)
        ]
        records.append(
            RequestRecord(
                request_id="bad",
                scheduled_s=T0 + 20,
                sent_s=T0 + 20,
                prompt_tokens=3000,
                output_tokens=0,
                status=400,
                end_s=T0 + 20.01,
                error="HTTP 400: too long",
            )
        )
        buckets = LoadResult.from_records(records).prompt_buckets
        assert [b.label for b in buckets] == ["<512", "512-2k", "2k-4k", "4k-8k", ">=8k"]
        assert [b.count for b in buckets] == [2, 2, 2, 1, 2]
        assert [b.num_errors for b in buckets] == [0, 0, 1, 0, 0]
        assert buckets[0].ttft_ms.p50 == approx(15.0)  # 10 and 20 ms
        assert buckets[2].ttft_ms.count == 1
        assert buckets[2].ttft_ms.p99 == approx(50.0)
        assert buckets[4].e2e_ms.p50 == approx(75.0 + 85.0)  # TTFT 70, 80 ms + 85 ms
        assert buckets[4].max_prompt_tokens is None

    def test_custom_edges(self) -> None:
        records = [ok_record(i, ttft_ms=10.0, prompt_tokens=n) for i, n in enumerate([10, 1000])]
        buckets = LoadResult.from_records(records, prompt_buckets=(0, 100)).prompt_buckets
        assert [(b.label, b.count) for b in buckets] == [("<100", 1), (">=100", 1)]
        with pytest.raises(ValueError, match="increasing"):
            LoadResult.from_records(records, prompt_buckets=(100, 0))


class TestFromFile:
    def test_reads_a_records_file(self, tmp_path: Path) -> None:
        path = tmp_path / "requests.jsonl"
        path.write_text("".join(r.to_json() + "\n" for r in ten_requests()))
        assert LoadResult.from_file(path) == LoadResult.from_records(ten_requests())


def worker(**overrides: object) -> WorkerStats:
    values: dict[str, object] = {
        "worker": "w0",
        "index": 0,
        "count": 1,
        "scheduled": 10,
        "sent": 10,
        "cap_hits": 0,
        "completed": 10,
        "failed": 0,
        "not_sent_stopped": 0,
        "max_in_flight": 100,
        "peak_in_flight": 3,
        "start_late_s": -1.0,
        "wall_s": 10.0,
        "cpu_s": 1.0,
        "cpu_percent": 10.0,
        "send_lag_p50_ms": 1.0,
        "send_lag_p99_ms": 2.0,
        "send_lag_max_ms": 3.0,
        "stopped_early": False,
    }
    values.update(overrides)
    return WorkerStats.model_validate(values)


class TestClientSaturation:
    def test_idle_client(self) -> None:
        assert client_saturation([worker()]) == (False, None)

    def test_cpu_or_lag_saturates(self) -> None:
        saturated, reason = client_saturation(
            [worker(cpu_percent=80.0), worker(worker="w1", send_lag_p99_ms=12.5)]
        )
        assert saturated
        assert reason == "w0 used 80% of a core (> 75%); w1 send lag p99 12.5 ms (> 10 ms)"

    def test_worker_file_names(self, tmp_path: Path) -> None:
        base = tmp_path / "records.jsonl"
        assert worker_records_path(base, 1) == tmp_path / "records.jsonl.w1"
        assert worker_stats_path(base, 1) == tmp_path / "records.jsonl.w1.stats.json"


def scheduled(request_id: str = "a", **overrides: object) -> ScheduledRequest:
    values: dict[str, object] = {
        "request_id": request_id,
        "send_s": 0.0,
        "api": Api.COMPLETIONS,
        "prompt_tokens": 2,
        "max_tokens": 4,
        "prompt": "a b",
    }
    values.update(overrides)
    return ScheduledRequest(**values)  # type: ignore[arg-type]


class TestRunLoadInput:
    """Rejected before anything is written or started."""

    @pytest.mark.parametrize(
        ("schedule", "kwargs", "match"),
        [
            ([], {}, "schedule is empty"),
            ([scheduled()], {"processes": 0}, "processes=0"),
            ([scheduled()], {"processes": 2, "max_in_flight": 1}, "max_in_flight=1"),
            ([scheduled()], {"timeout_s": 0.0}, "timeout_s=0.0"),
            ([scheduled(), scheduled()], {}, "appears twice"),
            ([scheduled(prompt=None)], {}, "has no prompt"),
            ([scheduled(api=Api.CHAT, prompt=None)], {}, "has no messages"),
            ([scheduled(max_tokens=0)], {}, "max_tokens=0"),
            ([scheduled(send_s=-1.0)], {}, "send_s=-1.0"),
        ],
    )
    def test_rejected(
        self,
        tmp_path: Path,
        schedule: list[ScheduledRequest],
        kwargs: dict[str, object],
        match: str,
    ) -> None:
        with pytest.raises(LoadConfigError, match=match):
            run_load(
                base_url="http://127.0.0.1:9",
                model="m",
                schedule=schedule,
                out_dir=tmp_path / "out",
                **kwargs,  # type: ignore[arg-type]
            )
        assert not (tmp_path / "out").exists()


def test_runner_and_metrics_never_import_locust_or_gevent() -> None:
    """`import locust` monkey-patches the process: only the Locust subprocess may do it."""
    code = (
        "import sys, workloads.runner, workloads.load_result, workloads.load_errors; "
        "print(sorted(m for m in ('locust', 'gevent', 'geventhttpclient') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

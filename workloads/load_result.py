"""Request records -> `LoadResult`: throughput, latency percentiles, goodput at an SLO.

Definitions follow vLLM's serving benchmark (``vllm bench serve``), with one
difference that matters under overload: latencies start at the request's *scheduled*
time, not at the moment the client managed to send it, so a slow client or server
cannot hide queueing (no coordinated omission).

- TTFT = first token event - scheduled.
- ITL = every gap between consecutive token events of a request (pooled over requests).
- TPOT per request = (last token event - first token event) / (output tokens - 1),
  for requests with more than one output token.
- e2e = end of the response - scheduled.
- send lag = sent - scheduled, over requests that were sent.

Only successful requests (HTTP 200, no error) contribute latencies, tokens and
throughput; warm-up records are left out of everything. Percentiles interpolate
linearly between samples (numpy's and pandas' default, as vLLM's benchmark).

Rates: ``window_s`` is the measured schedule's span. Given by the caller when known
(the workload's duration less its warm-up), else inferred from the scheduled times
as ``(last - first) × N / (N - 1)`` (N requests evenly spaced at rate r give exactly
r). ``offered_rate`` = measured requests / window; ``achieved_rate`` = completed /
window. ``duration_s`` runs from the first scheduled time to the last response's end
(vLLM's benchmark duration): ``request_throughput``, ``output_token_throughput`` and
``goodput`` are per second of it. They are what one window counted: a run cut after its
window (``cut_short``) counts its requests still in flight with part of their output, so
``output_token_throughput`` is not offered requests x output tokens per request; a tune's
goodput states its units from the declared workload instead (``tuner.run.goodput``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, field_validator

from workloads.load_errors import ABORTED, STOPPED_BEFORE_SEND, was_sent
from workloads.schedule import RequestRecord, read_records
from workloads.slo import Slo, SloMetric, SloObjective

DEFAULT_PROMPT_BUCKETS: tuple[int, ...] = (0, 512, 2048, 4096, 8192)


class Percentiles(BaseModel):
    """Summary of one latency distribution, in milliseconds (None when there are no samples)."""

    model_config = ConfigDict(frozen=True)

    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None

    @classmethod
    def from_values(cls, values: Iterable[float] | pd.Series) -> Percentiles:
        series = pd.Series(values, dtype="float64").dropna()
        if series.empty:
            return cls()
        q = series.quantile([0.5, 0.9, 0.99])
        return cls(
            count=len(series),
            mean=float(series.mean()),
            p50=float(q[0.5]),
            p90=float(q[0.9]),
            p99=float(q[0.99]),
        )

    def scaled(self, factor: float) -> Percentiles:
        """Every latency multiplied by ``factor`` (the count unchanged)."""

        def mul(value: float | None) -> float | None:
            return None if value is None else value * factor

        return Percentiles(
            count=self.count,
            mean=mul(self.mean),
            p50=mul(self.p50),
            p90=mul(self.p90),
            p99=mul(self.p99),
        )


class BucketLatency(BaseModel):
    """Latency of the requests whose prompt length falls in [min_prompt_tokens, max_prompt_tokens)."""

    model_config = ConfigDict(frozen=True)

    label: str
    min_prompt_tokens: int
    max_prompt_tokens: int | None  # exclusive; None: no upper bound
    count: int  # measured requests in the bucket
    num_errors: int
    ttft_ms: Percentiles
    e2e_ms: Percentiles


class LoadResult(BaseModel):
    """What one load run achieved, from its records."""

    model_config = ConfigDict(frozen=True)

    num_requests: int  # measured (not warm-up) requests
    num_completed: int
    num_errors: int  # failed, timed out, aborted or not sent
    num_not_sent: int  # of the errors: never sent (in-flight cap, run stopped)
    # Of the errors: cut off by the load generator's own stop (a level stopped early, or
    # at its window's end): sent and still without an answer, or not yet sent. Not the
    # server's failures, though the server had not served them.
    num_cut_by_stop: int = 0
    error_rate: float
    window_s: float | None
    duration_s: float
    offered_rate: float | None
    achieved_rate: float | None
    request_throughput: float
    output_token_throughput: float
    output_tokens: int
    prompt_tokens: int
    slo: Slo | None  # what goodput counted requests against (its per-request limits)
    num_good: int  # completed requests that met every per-request limit of the SLO
    goodput: float
    ttft_ms: Percentiles
    itl_ms: Percentiles
    tpot_ms: Percentiles
    e2e_ms: Percentiles
    send_lag_ms: Percentiles
    prompt_buckets: tuple[BucketLatency, ...]
    # Completed requests with token timings; fewer than num_completed when only a
    # sample was streamed (TTFT/ITL/TPOT and goodput then come from that sample).
    num_streamed: int | None = None
    # Streamed requests cut off in flight when a run was stopped after its window
    # (``cut_short``): counted in the latencies with the timings they had.
    num_truncated: int = 0
    # The output tokens of the completed requests alone, whole answers (``output_tokens``
    # also counts what the truncated ones had so far); None in results written before.
    completed_output_tokens: int | None = None

    @property
    def output_tokens_per_completed(self) -> float | None:
        """Output tokens per completed request (None: none completed, or not recorded)."""
        if self.completed_output_tokens is None or not self.num_completed:
            return None
        return self.completed_output_tokens / self.num_completed

    def measured_ms(self, objective: SloObjective) -> float | None:
        """The run's value of the percentile ``objective`` limits (None: not measured)."""
        percentiles: Percentiles = getattr(self, f"{objective.metric.value}_ms")
        value: float | None = getattr(percentiles, f"p{objective.percentile}")
        return value

    @field_validator("slo", mode="before")
    @classmethod
    def _slo_recorded_before(cls, value: object) -> object:
        """A load result written before ``Slo`` was one type kept only the per-request
        limits goodput used (``{"ttft_ms": 2000, "tpot_ms": 100, "e2e_ms": null}``): read
        each as a p99 objective, the percentile every built-in workload and the
        ``--slo-*-ms`` flags set (which one it was is not recorded)."""
        legacy = {"ttft_ms", "tpot_ms", "e2e_ms"}
        if isinstance(value, dict) and value and set(value) <= legacy:
            return Slo.p99(**value)
        return value

    @classmethod
    def from_records(
        cls,
        records: Iterable[RequestRecord],
        *,
        slo: Slo | None = None,
        window_s: float | None = None,
        prompt_buckets: Sequence[int] = DEFAULT_PROMPT_BUCKETS,
        cut_short: bool = False,
    ) -> LoadResult:
        """``cut_short``: the run was stopped on purpose once its window was over, so a
        streamed request aborted in flight after its first token counts with the timings
        it has (TTFT, and ITL/TPOT over its tokens so far), not as an error; it adds to no
        throughput and has no e2e. One sent whole and cut off is not measured at all (nor
        an error); a streamed one still without its first token is an error."""
        frame = _frame([record for record in records if not record.warmup], cut_short=cut_short)
        done = frame[frame["ok"]]
        ok = frame[frame["ok"] | frame["truncated"]]
        num_requests = len(frame)
        num_completed = len(done)
        num_truncated = int(frame["truncated"].sum())
        # Token timings exist only for streamed requests (all of them unless sampled).
        timed = ok[ok["streamed"]]

        ttft_s = timed["first_token_s"] - timed["scheduled_s"]
        e2e_s = done["end_s"] - done["scheduled_s"]
        last_s = timed["last_token_s"].fillna(timed["end_s"])
        multi = timed["output_tokens"] > 1
        tpot_s = (last_s - timed["first_token_s"])[multi] / (timed["output_tokens"][multi] - 1)
        itl_s = _gaps(timed["token_times_s"], timed["output_tokens"])
        sent = frame[frame["sent"]]
        lag_s = sent["sent_s"] - sent["scheduled_s"]

        if window_s is None:
            window_s = _inferred_window_s(frame["scheduled_s"])
        duration_s = _duration_s(frame)
        good = timed["ok"].copy()
        if slo is not None:  # each request against the SLO's per-request limits
            ttft_limit = slo.request_limit_ms(SloMetric.TTFT)
            tpot_limit = slo.request_limit_ms(SloMetric.TPOT)
            e2e_limit = slo.request_limit_ms(SloMetric.E2E)
            if ttft_limit is not None:
                good &= (1000 * ttft_s) <= ttft_limit
            if tpot_limit is not None:  # one-token outputs have no TPOT: they meet it
                good &= (1000 * tpot_s).reindex(timed.index, fill_value=0.0) <= tpot_limit
            if e2e_limit is not None:
                good &= (1000 * e2e_s.reindex(timed.index)) <= e2e_limit
        num_good = int(good.sum())
        if len(timed) < len(ok):  # sampled streams: the sample's share of good ones
            num_good = round(num_good / len(timed) * num_completed) if len(timed) else 0
        else:
            num_good = min(num_good, num_completed)
        output_tokens = int(ok["output_tokens"].sum())

        return cls(
            num_requests=num_requests,
            num_completed=num_completed,
            num_errors=num_requests - num_completed - num_truncated,
            num_not_sent=int((~frame["sent"]).sum()),
            num_cut_by_stop=int((frame["stopped"] & ~frame["truncated"]).sum()),
            error_rate=(num_requests - num_completed - num_truncated) / num_requests
            if num_requests
            else 0.0,
            window_s=window_s,
            duration_s=duration_s,
            offered_rate=num_requests / window_s if window_s else None,
            achieved_rate=num_completed / window_s if window_s else None,
            request_throughput=_per_s(num_completed, duration_s),
            output_token_throughput=_per_s(output_tokens, duration_s),
            output_tokens=output_tokens,
            prompt_tokens=int(done["prompt_tokens"].sum()),
            slo=slo,
            num_good=num_good,
            goodput=_per_s(num_good, duration_s),
            ttft_ms=Percentiles.from_values(1000 * ttft_s),
            itl_ms=Percentiles.from_values(1000 * itl_s),
            tpot_ms=Percentiles.from_values(1000 * tpot_s),
            e2e_ms=Percentiles.from_values(1000 * e2e_s),
            send_lag_ms=Percentiles.from_values(1000 * lag_s),
            prompt_buckets=_buckets(frame, prompt_buckets),
            num_streamed=len(timed),
            num_truncated=num_truncated,
            completed_output_tokens=int(done["output_tokens"].sum()),
        )

    def in_virtual_time(self, time_scale: float) -> LoadResult:
        """The result on the simulator's virtual clock, for a run against ``--time-scale K``.

        A simulator running K times slower than real time stretches every latency by K
        and divides every rate by K; this undoes both. The send lag stays as measured:
        it is the load generator's own wall-clock delay.
        """
        if time_scale == 1.0:
            return self
        k = 1.0 / time_scale

        def rate(value: float | None) -> float | None:
            return None if value is None else value / k

        return self.model_copy(
            update={
                "window_s": None if self.window_s is None else self.window_s * k,
                "duration_s": self.duration_s * k,
                "offered_rate": rate(self.offered_rate),
                "achieved_rate": rate(self.achieved_rate),
                "request_throughput": self.request_throughput / k,
                "output_token_throughput": self.output_token_throughput / k,
                "goodput": self.goodput / k,
                "slo": None if self.slo is None else self.slo.scaled(k),
                "ttft_ms": self.ttft_ms.scaled(k),
                "itl_ms": self.itl_ms.scaled(k),
                "tpot_ms": self.tpot_ms.scaled(k),
                "e2e_ms": self.e2e_ms.scaled(k),
                "prompt_buckets": tuple(
                    b.model_copy(
                        update={"ttft_ms": b.ttft_ms.scaled(k), "e2e_ms": b.e2e_ms.scaled(k)}
                    )
                    for b in self.prompt_buckets
                ),
            }
        )

    @classmethod
    def from_file(
        cls,
        path: Path,
        *,
        slo: Slo | None = None,
        window_s: float | None = None,
        prompt_buckets: Sequence[int] = DEFAULT_PROMPT_BUCKETS,
        cut_short: bool = False,
    ) -> LoadResult:
        """From a records JSONL file (e.g. `LoadRun.records_path`)."""
        return cls.from_records(
            read_records(path), slo=slo, window_s=window_s, prompt_buckets=prompt_buckets,
            cut_short=cut_short,
        )  # fmt: skip


_COLUMNS = (
    "scheduled_s",
    "sent_s",
    "first_token_s",
    "last_token_s",
    "end_s",
    "prompt_tokens",
    "output_tokens",
    "token_times_s",
    "ok",
    "sent",
    "streamed",
    "truncated",
    "stopped",
)


@dataclass(frozen=True)
class RequestLatencies:
    """Each measured request's latencies, as ``LoadResult.from_records`` computes them, in
    ms of the records' own clock: one row per request (warm-up left out); NaN where a
    request has no such value (not streamed, one output token, cut short, failed)."""

    ttft_ms: np.ndarray[Any, np.dtype[np.float64]]
    tpot_ms: np.ndarray[Any, np.dtype[np.float64]]
    e2e_ms: np.ndarray[Any, np.dtype[np.float64]]
    itl_ms: np.ndarray[Any, np.dtype[np.float64]]  # every token gap, of every request
    itl_request: np.ndarray[Any, np.dtype[np.int64]]  # the row each gap belongs to
    failed: np.ndarray[Any, np.dtype[np.bool_]]  # counted as an error by from_records

    @property
    def count(self) -> int:
        return len(self.failed)

    def of(self, metric: SloMetric) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """A metric's values and the row each belongs to (NaN rows left out)."""
        if metric is SloMetric.ITL:
            return self.itl_ms, self.itl_request
        values = {
            SloMetric.TTFT: self.ttft_ms, SloMetric.TPOT: self.tpot_ms, SloMetric.E2E: self.e2e_ms,
        }[metric]  # fmt: skip
        rows = np.flatnonzero(~np.isnan(values))
        return values[rows], rows


def request_latencies(
    records: Iterable[RequestRecord], *, cut_short: bool = False
) -> RequestLatencies:
    """``records``' latencies per request, the same values ``LoadResult.from_records``
    takes its percentiles of (with the same ``cut_short``)."""
    frame = _frame([r for r in records if not r.warmup], cut_short=cut_short)
    frame = frame.reset_index(drop=True)
    n = len(frame)
    ok = frame["ok"] | frame["truncated"]
    timed = frame[ok & frame["streamed"]]
    nan = np.full(n, np.nan)
    ttft, tpot, e2e = nan.copy(), nan.copy(), nan.copy()
    ttft[timed.index] = 1000 * (timed["first_token_s"] - timed["scheduled_s"])
    last_s = timed["last_token_s"].fillna(timed["end_s"])
    multi = timed[timed["output_tokens"] > 1]
    tpot[multi.index] = (
        1000 * (last_s[multi.index] - multi["first_token_s"]) / (multi["output_tokens"] - 1)
    )
    done = frame[frame["ok"]]
    e2e[done.index] = 1000 * (done["end_s"] - done["scheduled_s"])
    gaps = _gaps(timed["token_times_s"], timed["output_tokens"])
    return RequestLatencies(
        ttft_ms=ttft,
        tpot_ms=tpot,
        e2e_ms=e2e,
        itl_ms=(1000 * gaps).to_numpy(dtype=np.float64),
        itl_request=gaps.index.to_numpy(dtype=np.int64),
        failed=(~frame["ok"] & ~frame["truncated"]).to_numpy(dtype=bool),
    )


def _frame(records: Sequence[RequestRecord], *, cut_short: bool = False) -> pd.DataFrame:
    frame = pd.DataFrame(
        {
            "scheduled_s": [r.scheduled_s for r in records],
            "sent_s": [r.sent_s for r in records],
            "first_token_s": [r.first_token_s for r in records],
            "last_token_s": [r.token_times_s[-1] if r.token_times_s else None for r in records],
            "end_s": [r.end_s for r in records],
            "prompt_tokens": [r.prompt_tokens for r in records],
            "output_tokens": [r.output_tokens for r in records],
            "token_times_s": [r.token_times_s for r in records],
            "ok": [r.ok for r in records],
            "sent": [was_sent(r.error) for r in records],
            "streamed": [r.streamed for r in records],
            # cut off in flight: a streamed request with its first token, or one sent whole
            "truncated": [
                cut_short and r.error == ABORTED and (r.first_token_s is not None or not r.streamed)
                for r in records
            ],
            "stopped": [r.error in (ABORTED, STOPPED_BEFORE_SEND) for r in records],
        },
        columns=list(_COLUMNS),
    )
    for column in ("scheduled_s", "sent_s", "first_token_s", "last_token_s", "end_s"):
        frame[column] = frame[column].astype("float64")
    for column in ("prompt_tokens", "output_tokens"):
        frame[column] = frame[column].astype("int64")
    for column in ("ok", "sent", "streamed", "truncated", "stopped"):
        frame[column] = frame[column].astype(bool)
    return frame


def _gaps(token_times: pd.Series, output_tokens: pd.Series) -> pd.Series:
    """Every gap between consecutive token events of each request, per token: a stream
    that batched several tokens into an event (vLLM's ``stream_interval``: fewer events
    than tokens) has each gap divided by its request's mean tokens per gap, so the gaps
    still average its TPOT; the spread of the tokens' times within an event is not seen."""
    if token_times.empty:
        return pd.Series(dtype="float64")
    times = token_times.explode().dropna().astype("float64")
    gaps = times.groupby(level=0).diff().dropna()
    events = token_times.map(len)
    per_gap = ((output_tokens - 1) / (events - 1)).where(events > 1, 1.0).clip(lower=1.0)
    return gaps / per_gap.reindex(gaps.index)


def _inferred_window_s(scheduled_s: pd.Series) -> float | None:
    count = len(scheduled_s)
    if count < 2:
        return None
    span = float(scheduled_s.max() - scheduled_s.min())
    return span * count / (count - 1) if span > 0 else None


def _duration_s(frame: pd.DataFrame) -> float:
    if frame.empty:
        return 0.0
    ends = frame["end_s"].fillna(frame["sent_s"])
    return max(float(ends.max() - frame["scheduled_s"].min()), 0.0)


def _per_s(count: float, duration_s: float) -> float:
    return count / duration_s if duration_s > 0 else 0.0


def _bucket_label(low: int, high: int | None) -> str:
    def short(tokens: int) -> str:
        return f"{tokens // 1024}k" if tokens >= 1024 and tokens % 1024 == 0 else str(tokens)

    if high is None:
        return f">={short(low)}"
    if low == 0:
        return f"<{short(high)}"
    return f"{short(low)}-{short(high)}"


def _buckets(frame: pd.DataFrame, edges: Sequence[int]) -> tuple[BucketLatency, ...]:
    if list(edges) != sorted(set(edges)) or not edges or edges[0] < 0:
        raise ValueError(f"prompt buckets {list(edges)} must be increasing edges from >= 0")
    bounds: list[tuple[int, int | None]] = [
        (low, high) for low, high in zip(edges, [*edges[1:], None], strict=True)
    ]
    buckets = []
    for low, high in bounds:
        inside = frame["prompt_tokens"] >= low
        if high is not None:
            inside &= frame["prompt_tokens"] < high
        rows = frame[inside]
        ok = rows[rows["ok"]]
        buckets.append(
            BucketLatency(
                label=_bucket_label(low, high),
                min_prompt_tokens=low,
                max_prompt_tokens=high,
                count=len(rows),
                num_errors=int((~rows["ok"]).sum()),
                ttft_ms=Percentiles.from_values(1000 * (ok["first_token_s"] - ok["scheduled_s"])),
                e2e_ms=Percentiles.from_values(1000 * (ok["end_s"] - ok["scheduled_s"])),
            )
        )
    return tuple(buckets)

"""`tuner simulate`: the simulated engine on a virtual clock, no sockets, as fast as the CPU allows.

An arrival schedule (a trace, or Poisson arrivals of fixed lengths) is fed to the
same ``SimEngine`` that ``tuner sim-serve`` runs; the clock jumps from one step's
end to the next, so an hour of traffic takes seconds. The result carries the
metrics a load test would report.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from pydantic import BaseModel, ConfigDict

from tuner.sim.engine import EngineDead, SimEngine, SimRequest
from tuner.sim.openai_format import EMPTY_PROMPT_MESSAGE, context_length_message
from workloads.traces import TraceRecord, prefix_free_digits


class Percentiles(BaseModel):
    model_config = ConfigDict(frozen=True)

    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        if not values:
            return cls(p50=0.0, p90=0.0, p99=0.0)
        ordered = sorted(values)

        def at(q: float) -> float:
            # Linear interpolation between closest ranks (numpy's default).
            pos = q * (len(ordered) - 1)
            lo = int(pos)
            hi = min(lo + 1, len(ordered) - 1)
            return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

        return cls(p50=at(0.50), p90=at(0.90), p99=at(0.99))


@dataclass(frozen=True)
class Slo:
    """Per-request latency objectives; a request that meets all of them counts for goodput."""

    ttft_s: float = 2.0
    tpot_s: float = 0.1


class FailureReason(StrEnum):
    """Why a simulated request did not finish."""

    PROMPT_TOO_LONG = "prompt_too_long"  # vLLM answers 400: the prompt fills max_model_len
    EMPTY_PROMPT = "empty_prompt"  # vLLM answers 400: an empty prompt
    NEVER_SCHEDULED = "never_scheduled"  # the KV cache cannot hold it even alone
    ENGINE_DIED = "engine_died"  # the engine died with it waiting or running


class FailedRequests(BaseModel):
    """The requests that failed for one reason, and what the server said of the first."""

    model_config = ConfigDict(frozen=True)

    reason: FailureReason
    count: int
    # vLLM's error message (the body of its HTTP 400 for a rejected request).
    message: str
    http_status: int | None = None  # what a client is answered; None: no answer (died, stuck)


class SimulationResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    num_requests: int
    num_finished: int
    num_failed: int
    duration_s: float
    request_throughput: float
    output_token_throughput: float
    goodput: float
    ttft_ms: Percentiles
    itl_ms: Percentiles
    tpot_ms: Percentiles
    e2e_ms: Percentiles
    num_preemptions: int
    peak_kv_cache_usage: float
    prefix_cache_hit_rate: float
    engine_steps: int
    engine_died: str | None = None
    failures: tuple[FailedRequests, ...] = ()  # num_failed, by reason


def synthetic_arrivals(
    *,
    rate_per_s: float,
    duration_s: float,
    prompt_tokens: int,
    output_tokens: int,
    shared_prefix_tokens: int = 0,
    shared_fraction: float = 0.0,
    seed: int = 0,
) -> list[TraceRecord]:
    """Poisson arrivals of fixed lengths; a fraction shares one system-prompt prefix."""
    rng = random.Random(seed)
    records: list[TraceRecord] = []
    t = rng.expovariate(rate_per_s)
    while t < duration_s:
        shared = shared_prefix_tokens > 0 and rng.random() < shared_fraction
        records.append(
            TraceRecord(
                arrival_s=t,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                prefix_block_ids=(0,) if shared else (),
                block_tokens=shared_prefix_tokens,
            )
        )
        t += rng.expovariate(rate_per_s)
    return records


@functools.lru_cache(maxsize=4096)
def block_token_ids(block_id: int, n_tokens: int, vocab: int, seed: int) -> tuple[int, ...]:
    """The tokens of a shared trace block: equal ids give equal tokens, distinct ids distinct ones.

    The block opens with its id written prefix-free in base ``vocab`` (the digit count,
    then the digits), so two distinct ids differ within their first few tokens and never
    share a KV block; the rest is drawn from a generator seeded by (seed, id).
    """
    if block_id < 0 or seed < 0 or vocab < 2:
        raise ValueError(f"block id {block_id}, seed {seed} or vocabulary {vocab} out of range")
    head = prefix_free_digits(block_id, vocab)
    tail = np.random.default_rng([seed, block_id]).integers(0, vocab, max(n_tokens - len(head), 0))
    return tuple([*head, *tail.tolist()][:n_tokens])


def prompt_ids(record: TraceRecord, index: int, vocab: int, seed: int) -> list[int]:
    """Token ids for a trace row: shared blocks from their ids, the rest unique to the request."""
    ids: list[int] = []
    for block in record.prefix_block_ids:
        if len(ids) >= record.prompt_tokens:
            break
        ids.extend(block_token_ids(block, record.block_tokens, vocab, seed))
    ids = ids[: record.prompt_tokens]
    rng = random.Random(seed * 7_919 + index)
    ids.extend(rng.randrange(vocab) for _ in range(record.prompt_tokens - len(ids)))
    return ids


def run(
    engine: SimEngine,
    records: Sequence[TraceRecord],
    *,
    slo: Slo,
    vocab: int,
    seed: int = 0,
    max_model_len: int | None = None,
    prompt_token_ids: Sequence[list[int]] | None = None,
    stop_at_s: float | None = None,
) -> SimulationResult:
    """Feed the arrivals to the engine on a virtual clock until every request is done.

    ``prompt_token_ids`` (one list per record): the prompts' own ids, e.g. a workload's
    text through the simulator's tokenizer, instead of ids made up from the record.
    ``stop_at_s``: stop there, as a load test cut after its window; requests still
    running count in TTFT/ITL/TPOT with the tokens they have (no e2e, no throughput).
    """
    now = 0.0
    nxt = 0
    steps = 0
    peak_usage = 0.0
    finished: list[SimRequest] = []
    failures = _Failures()
    died: str | None = None
    limit = max_model_len or 1 << 62
    while nxt < len(records) or engine.has_work:
        if stop_at_s is not None and now >= stop_at_s and nxt >= len(records):
            break
        while nxt < len(records) and records[nxt].arrival_s <= now:
            record = records[nxt]
            if record.prompt_tokens == 0:
                failures.add(FailureReason.EMPTY_PROMPT, EMPTY_PROMPT_MESSAGE, 400)
            elif record.prompt_tokens >= limit:
                # vLLM's 400: the prompt leaves no room for a single output token.
                message = context_length_message(limit, record.prompt_tokens)
                failures.add(FailureReason.PROMPT_TOO_LONG, message, 400)
            else:
                engine.add_request(
                    SimRequest(
                        request_id=f"sim-{nxt}",
                        prompt_token_ids=(
                            prompt_token_ids[nxt]
                            if prompt_token_ids is not None
                            else prompt_ids(record, nxt, vocab, seed)
                        ),
                        max_tokens=min(record.output_tokens, limit - record.prompt_tokens),
                        arrival_s=record.arrival_s,
                    )
                )
            nxt += 1
        if not engine.has_work:
            if nxt < len(records):
                now = records[nxt].arrival_s
            continue
        try:
            result = engine.step(now)
        except EngineDead as exc:
            died = str(exc)
            break
        steps += 1
        peak_usage = max(peak_usage, result.kv_usage)
        finished.extend(event.request for event in result.events if event.finished)
        if result.num_scheduled_tokens == 0:
            # Nothing fits even alone: jump to the next arrival or give up on the rest.
            if nxt < len(records):
                now = max(now, records[nxt].arrival_s)
                continue
            stuck = [*engine.waiting, *engine.running]
            longest = max(r.num_tokens for r in stuck)
            message = (
                f"the KV cache cannot hold a request of {longest} tokens even alone "
                "(more KV-cache memory, or a lower --max-model-len)"
            )
            failures.add(FailureReason.NEVER_SCHEDULED, message, None, count=len(stuck))
            break
        now += result.duration_s
    if died is not None:
        lost = len(records) - len(finished) - failures.total
        failures.add(FailureReason.ENGINE_DIED, died, None, count=lost)
    partial = (
        [r for r in engine.running if r.first_token_s is not None]
        if stop_at_s is not None and died is None
        else []
    )
    return _summarise(
        engine, records, finished, failures, now, steps, peak_usage, slo, died, partial
    )


class _Failures:
    """Failed requests counted by reason, with the first message of each."""

    def __init__(self) -> None:
        self.by_reason: dict[FailureReason, FailedRequests] = {}

    @property
    def total(self) -> int:
        return sum(f.count for f in self.by_reason.values())

    def add(
        self, reason: FailureReason, message: str, http_status: int | None, *, count: int = 1
    ) -> None:
        if count <= 0:
            return
        seen = self.by_reason.get(reason)
        if seen is None:
            self.by_reason[reason] = FailedRequests(
                reason=reason, count=count, message=message, http_status=http_status
            )
        else:
            self.by_reason[reason] = seen.model_copy(update={"count": seen.count + count})


def _summarise(
    engine: SimEngine,
    records: Sequence[TraceRecord],
    finished: list[SimRequest],
    failures: _Failures,
    end_s: float,
    steps: int,
    peak_usage: float,
    slo: Slo,
    died: str | None,
    partial: Sequence[SimRequest] = (),
) -> SimulationResult:
    ttft: list[float] = []
    itl: list[float] = []
    tpot: list[float] = []
    e2e: list[float] = []
    good = 0
    for request in finished:
        assert request.first_token_s is not None and request.finish_s is not None
        first = request.first_token_s - request.arrival_s
        ttft.append(first)
        e2e.append(request.finish_s - request.arrival_s)
        times = request.token_times_s
        itl.extend(b - a for a, b in itertools.pairwise(times))
        per_token = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
        tpot.append(per_token)
        if first <= slo.ttft_s and per_token <= slo.tpot_s:
            good += 1
    for request in partial:
        assert request.first_token_s is not None
        ttft.append(request.first_token_s - request.arrival_s)
        times = request.token_times_s
        itl.extend(b - a for a, b in itertools.pairwise(times))
        if len(times) > 1:
            tpot.append((times[-1] - times[0]) / (len(times) - 1))
    start = records[0].arrival_s if records else 0.0
    duration = max(end_s - start, 1e-9)
    output_tokens = sum(len(r.output_token_ids) for r in finished)
    queries = engine.prefix_queries_tokens
    ms = 1000.0
    return SimulationResult(
        num_requests=len(records),
        num_finished=len(finished),
        num_failed=failures.total,
        duration_s=duration,
        request_throughput=len(finished) / duration,
        output_token_throughput=output_tokens / duration,
        goodput=good / duration,
        ttft_ms=Percentiles.of([v * ms for v in ttft]),
        itl_ms=Percentiles.of([v * ms for v in itl]),
        tpot_ms=Percentiles.of([v * ms for v in tpot]),
        e2e_ms=Percentiles.of([v * ms for v in e2e]),
        num_preemptions=engine.num_preemptions,
        peak_kv_cache_usage=peak_usage,
        prefix_cache_hit_rate=engine.prefix_hits_tokens / queries if queries else 0.0,
        engine_steps=steps,
        engine_died=died,
        failures=tuple(failures.by_reason.values()),
    )

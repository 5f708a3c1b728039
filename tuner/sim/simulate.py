"""`tuner simulate`: the simulated engine on a virtual clock, no sockets, as fast as the CPU allows.

An arrival schedule (a trace, or Poisson arrivals of fixed lengths) is fed to the
same ``SimEngine`` that ``tuner sim-serve`` runs; the clock jumps from one step's
end to the next, so an hour of traffic takes seconds. The result carries the
metrics a load test would report.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from tuner.sim.engine import EngineDead, SimEngine, SimRequest
from workloads.traces import TraceRecord


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


def prompt_ids(record: TraceRecord, index: int, vocab: int, seed: int) -> list[int]:
    """Token ids for a trace row: shared blocks from their ids, the rest unique to the request."""
    ids: list[int] = []
    for block in record.prefix_block_ids:
        if len(ids) >= record.prompt_tokens:
            break
        base = (block * 1_000_003 + seed) % vocab
        ids.extend((base + j * 7) % vocab for j in range(record.block_tokens))
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
    failed = 0
    died: str | None = None
    limit = max_model_len or 1 << 62
    while nxt < len(records) or engine.has_work:
        if stop_at_s is not None and now >= stop_at_s and nxt >= len(records):
            break
        while nxt < len(records) and records[nxt].arrival_s <= now:
            record = records[nxt]
            if record.prompt_tokens + 1 > limit or record.prompt_tokens == 0:
                failed += 1  # vLLM answers 400: prompt longer than max_model_len
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
            failed += len(engine.waiting) + len(engine.running)
            break
        now += result.duration_s
    if died is not None:
        failed += len(records) - len(finished)
    partial = (
        [r for r in engine.running if r.first_token_s is not None]
        if stop_at_s is not None and died is None
        else []
    )
    return _summarise(engine, records, finished, failed, now, steps, peak_usage, slo, died, partial)


def _summarise(
    engine: SimEngine,
    records: Sequence[TraceRecord],
    finished: list[SimRequest],
    failed: int,
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
        num_failed=failed,
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
    )

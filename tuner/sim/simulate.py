"""`tuner simulate`: the simulated engine on a virtual clock, no sockets, as fast as the CPU allows.

An arrival schedule (a trace, or Poisson arrivals of fixed lengths) is fed to the
same ``SimEngine`` that ``tuner sim-serve`` runs; the clock jumps from one step's
end to the next, so an hour of traffic takes seconds. The result carries the
metrics a load test would report.
"""

from __future__ import annotations

import functools
import gc
import heapq
import itertools
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tuner.sim.deferred import DeferredStepper, StepOutcome
from tuner.sim.engine import EngineDead, SimEngine, SimRequest
from tuner.sim.openai_format import EMPTY_PROMPT_MESSAGE, context_length_message
from tuner.sim.residency import EvictionEvent
from workloads.load_result import Percentiles
from workloads.slo import Slo
from workloads.traces import TraceRecord, prefix_free_digits


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


@dataclass(frozen=True)
class RequestOutcome:
    """What became of one record of a run (``run(keep_requests=True)``), virtual seconds:
    answered (``finish_s``), still in flight where the run stopped (neither ``finish_s``
    nor ``failure``: the tokens it had), or failed (``failure``, with the server's words)."""

    index: int  # the record's position in the run's records
    arrival_s: float
    first_token_s: float | None
    finish_s: float | None
    token_times_s: tuple[float, ...]
    prompt_tokens: int
    output_tokens: int
    failure: FailureReason | None = None
    message: str | None = None
    http_status: int | None = None


@dataclass(frozen=True)
class EngineSample:
    """The engine's state at the start of one step (virtual seconds)."""

    t_s: float
    waiting: int
    running: int
    kv_usage: float  # fraction of the KV cache in use
    # The engine's counters so far, as /metrics has them (vllm:num_preemptions_total,
    # vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total).
    preemptions_total: int = 0
    prefix_queries_tokens: int = 0
    prefix_hits_tokens: int = 0
    # The simulator's own truth so far (tuner.sim.lost_history; its tuner_sim: series):
    # admitted later turns, those whose history was evicted, the tokens later turns
    # missed and, of those, their own history evicted while under way.
    continuing_requests: int = 0
    history_evicted_requests: int = 0
    continuing_miss_tokens: int = 0
    evicted_under_way_tokens: int = 0


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
    # Of the requests counted, those sent that had no first token when the run was cut
    # (still queued or in their prefill): their TTFT is past the cut, which no percentile
    # of the timed ones shows (``tuner.twin.prediction.slo_met``).
    num_without_first_token: int = 0
    # Of the prompt tokens later turns missed over the run, the share that was their own
    # conversation's history evicted while under way (tuner.sim.lost_history; None: no
    # later turn missed, or prefix caching off).
    evicted_under_way_share: float | None = None
    # --kv-cache-metrics: the sampled evictions of the run (engine seconds; not dumped;
    # None: the engine ran without it).
    evictions: tuple[EvictionEvent, ...] | None = Field(default=None, exclude=True)
    # The arrival each record was given (a later turn: its answer's time plus think time;
    # None: never sent), and the engine's state over the run (``run(sample_every_s=)``).
    # Left out of ``model_dump``: the JSON a run prints is its summary.
    arrivals_s: tuple[float | None, ...] = Field(default=(), exclude=True)
    samples: tuple[EngineSample, ...] = Field(default=(), exclude=True)
    # Every record that arrived, as it ended (``run(keep_requests=True)``), in record order
    # (left out of ``model_dump``).
    requests: tuple[RequestOutcome, ...] = Field(default=(), exclude=True)


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


class _Arrivals:
    """Who arrives next: the open-loop records in their order, and the later turns of a
    conversation once the answer they follow is in (``release``), think time after it.

    Without ``follows`` every record is open-loop and they arrive in their order, as the
    plain loop over ``records`` always did.
    """

    def __init__(
        self,
        records: Sequence[TraceRecord],
        follows: Sequence[int | None] | None,
        think_s: Sequence[float] | None,
    ) -> None:
        n = len(records)
        if follows is not None and len(follows) != n:
            raise ValueError(f"follows has {len(follows)} entries for {n} records")
        if think_s is not None and len(think_s) != n:
            raise ValueError(f"think_s has {len(think_s)} entries for {n} records")
        self.records = records
        self.think_s = think_s
        self.open = [j for j in range(n) if follows is None or follows[j] is None]
        self.pos = 0
        self.released: list[tuple[float, int]] = []  # a heap of (arrival, index)
        self.children: dict[int, list[int]] = {}
        for j, i in enumerate(follows or ()):
            if i is not None:
                if not 0 <= i < n or i == j:
                    raise ValueError(f"record {j} follows {i}, not another record")
                self.children.setdefault(i, []).append(j)
        self.at: list[float | None] = [None] * n  # the arrival used, once it arrived

    def _next(self) -> tuple[float, int] | None:
        head = self.released[0] if self.released else None
        if self.pos < len(self.open):
            j = self.open[self.pos]
            planned = (self.records[j].arrival_s, j)
            if head is None or planned <= head:
                return planned
        return head

    def next_s(self) -> float | None:
        nxt = self._next()
        return None if nxt is None else nxt[0]

    def pending(self) -> bool:
        return self.pos < len(self.open) or bool(self.released)

    def due_before(self, stop_s: float) -> bool:
        """Whether anything still arrives before ``stop_s`` (open-loop records: any left)."""
        return self.pos < len(self.open) or (bool(self.released) and self.released[0][0] < stop_s)

    def pop(self, now_s: float, delay_s: float = 0.0) -> int | None:
        """The next record to arrive by ``now_s`` (its arrival noted), or None; with
        ``delay_s``, the next to have arrived that long before ``now_s``."""
        nxt = self._next()
        if nxt is None or nxt[0] + delay_s > now_s:
            return None
        if self.pos < len(self.open) and nxt[1] == self.open[self.pos]:
            self.pos += 1
        else:
            heapq.heappop(self.released)
        self.at[nxt[1]] = nxt[0]
        return nxt[1]

    def release(self, index: int, done_s: float) -> None:
        """Record ``index`` was answered (or refused) at ``done_s``: its next turns arrive."""
        for j in self.children.get(index, ()):
            think = self.think_s[j] if self.think_s is not None else 0.0
            heapq.heappush(self.released, (done_s + think, j))


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a simulation, back as it was after.

    A simulation makes no reference cycles (reference counting frees all it drops), yet
    its millions of allocations trigger full collections, and each one walks every
    prompt's token list: ten minutes of ``chat`` hold 17 million prompt ids, and those
    walks were a tenth of the run."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@gc_paused()
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
    follows: Sequence[int | None] | None = None,
    think_s: Sequence[float] | None = None,
    measure_from_s: float | None = None,
    measure_to_s: float | None = None,
    sample_every_s: float | None = None,
    step_by_step: bool = False,
    keep_requests: bool = False,
) -> SimulationResult:
    """Feed the arrivals to the engine on a virtual clock until every request is done.

    ``prompt_token_ids`` (one list per record): the prompts' own ids, e.g. a workload's
    text through the simulator's tokenizer, instead of ids made up from the record.
    ``stop_at_s``: stop there, as a load test cut after its window; requests still
    running count in TTFT/ITL/TPOT with the tokens they have (no e2e, no throughput).

    ``follows`` (one entry per record): a later turn of a conversation, the index of the
    record whose answer it extends; it arrives ``think_s`` (per record, default 0) after
    that record finished, failed or was refused on the virtual clock, not at its own
    ``arrival_s``, as a user sends the next turn once the answer is in. None: at
    ``arrival_s``. A follower due at or after ``stop_at_s`` is never sent; one whose
    predecessor never finished (cut, stuck, the engine died) neither.

    ``measure_from_s`` / ``measure_to_s``: the summary (counts, percentiles, throughput,
    goodput) counts only the requests arriving in ``[measure_from_s, measure_to_s)``
    (default: from the first arrival, to the end); rates are over that span, ending
    where the run ended when ``measure_to_s`` is not given. A request never sent counts
    at its planned ``arrival_s``. ``sample_every_s``: keep the engine's state at one
    step in every so many virtual seconds (``SimulationResult.samples``).

    ``keep_requests``: keep what became of each record that arrived
    (``SimulationResult.requests``: its timings and tokens, or its failure), for a caller
    that turns the run into a load generator's records (``tuner.twin.virtual_server``).

    The engine's plain decodes are written down late (``tuner.sim.deferred``), which
    gives the same run as ``step_by_step`` (``SimEngine.step`` for every step, each
    token written as it is made, as ``tuner sim-serve`` runs it) many times faster.
    """
    stepper = None if step_by_step else DeferredStepper(engine)
    # A request reaches the scheduler this long after it arrived (the API server's
    # own work: parsing, tokenizing, handing it to the engine); its TTFT counts it.
    admit_s = engine.timer.factors.request_overhead_s
    now = 0.0
    steps = 0
    peak_usage = 0.0
    finished: list[SimRequest] = []
    failures = _Failures()
    died: str | None = None
    limit = max_model_len or 1 << 62
    arrivals = _Arrivals(records, follows, think_s)
    index_of: dict[str, int] = {}
    samples: list[EngineSample] = []
    next_sample_s = -math.inf
    while arrivals.pending() or engine.has_work:
        if stop_at_s is not None and now >= stop_at_s and not arrivals.due_before(stop_at_s):
            break
        while (j := arrivals.pop(now, admit_s)) is not None:
            record = records[j]
            if record.prompt_tokens == 0:
                failures.add(FailureReason.EMPTY_PROMPT, EMPTY_PROMPT_MESSAGE, 400, (j,))
                arrivals.release(j, arrivals.at[j] or 0.0)
            elif record.prompt_tokens >= limit:
                # vLLM's 400: the prompt leaves no room for a single output token.
                message = context_length_message(limit, record.prompt_tokens)
                failures.add(FailureReason.PROMPT_TOO_LONG, message, 400, (j,))
                arrivals.release(j, arrivals.at[j] or 0.0)
            else:
                request_id = f"sim-{j}"
                index_of[request_id] = j
                engine.add_request(
                    SimRequest(
                        request_id=request_id,
                        prompt_token_ids=(
                            prompt_token_ids[j]
                            if prompt_token_ids is not None
                            else prompt_ids(record, j, vocab, seed)
                        ),
                        max_tokens=min(record.output_tokens, limit - record.prompt_tokens),
                        arrival_s=arrivals.at[j] or 0.0,
                    )
                )
        if not engine.has_work:
            upcoming = arrivals.next_s()
            if upcoming is not None:
                now = max(now, upcoming + admit_s)
            continue
        try:
            result = StepOutcome.of(engine.step(now)) if stepper is None else stepper.step(now)
        except EngineDead as exc:
            died = str(exc)
            break
        steps += 1
        peak_usage = max(peak_usage, result.kv_usage)
        if sample_every_s is not None and now >= next_sample_s:
            history = engine.pool.history
            sample = EngineSample(
                now, result.num_waiting, result.num_running, result.kv_usage,
                engine.num_preemptions, engine.prefix_queries_tokens, engine.prefix_hits_tokens,
                *(history.counts() if history is not None else (0, 0, 0, 0)),
            )  # fmt: skip
            samples.append(sample)
            next_sample_s = now + sample_every_s
        for request in result.finished:
            finished.append(request)
            done = request.finish_s
            arrivals.release(index_of[request.request_id], done if done is not None else now)
        if result.num_scheduled_tokens == 0:
            # Nothing fits even alone: jump to the next arrival or give up on the rest.
            upcoming = arrivals.next_s()
            if upcoming is not None:
                now = max(now, upcoming)
                continue
            if stepper is not None:
                stepper.settle()
            stuck = [*engine.waiting, *engine.running]
            longest = max(r.num_tokens for r in stuck)
            message = (
                f"the KV cache cannot hold a request of {longest} tokens even alone "
                "(more KV-cache memory, or a lower --max-model-len)"
            )
            lost = [index_of[r.request_id] for r in stuck]
            failures.add(FailureReason.NEVER_SCHEDULED, message, None, lost)
            break
        now += result.duration_s
    if stepper is not None:
        stepper.settle()  # the running requests' tokens so far, for the summary
    if died is not None:
        done_ids = {index_of[r.request_id] for r in finished} | failures.indices
        lost = [j for j in range(len(records)) if j not in done_ids]
        failures.add(FailureReason.ENGINE_DIED, died, None, lost)
    partial = (
        [r for r in engine.running if r.first_token_s is not None]
        if stop_at_s is not None and died is None
        else []
    )
    window: tuple[float, float] | None = None
    if measure_from_s is not None or measure_to_s is not None:
        window = (
            measure_from_s if measure_from_s is not None else -math.inf,
            measure_to_s if measure_to_s is not None else math.inf,
        )
    summary = _summarise(
        engine, records, finished, failures, now, steps, peak_usage, slo, died, partial,
        arrivals=arrivals.at, window=window, samples=samples,
    )  # fmt: skip
    if not keep_requests:
        return summary
    in_flight = [*engine.running, *engine.waiting] if died is None else []
    kept = _outcomes(records, [*finished, *in_flight], index_of, failures, arrivals.at)
    return summary.model_copy(update={"requests": kept})


def _outcomes(
    records: Sequence[TraceRecord],
    served: Sequence[SimRequest],
    index_of: dict[str, int],
    failures: _Failures,
    arrivals: Sequence[float | None],
) -> tuple[RequestOutcome, ...]:
    """What became of every record that arrived (``run``'s ``keep_requests``), in record order."""
    first = failures.first
    kept: dict[int, RequestOutcome] = {}
    for request in served:
        j = index_of[request.request_id]
        kept[j] = RequestOutcome(
            index=j, arrival_s=request.arrival_s, first_token_s=request.first_token_s,
            finish_s=request.finish_s, token_times_s=tuple(request.token_times_s),
            prompt_tokens=records[j].prompt_tokens, output_tokens=len(request.output_token_ids),
        )  # fmt: skip
    for j, reason in failures.by_index.items():
        at = arrivals[j] if j < len(arrivals) else None
        message, status = first[reason]
        kept[j] = RequestOutcome(
            index=j, arrival_s=records[j].arrival_s if at is None else at, first_token_s=None,
            finish_s=None, token_times_s=(), prompt_tokens=records[j].prompt_tokens,
            output_tokens=0, failure=reason, message=message, http_status=status,
        )  # fmt: skip
    return tuple(kept[j] for j in sorted(kept))


class _Failures:
    """Failed requests counted by reason, with the first message of each."""

    def __init__(self) -> None:
        self.first: dict[FailureReason, tuple[str, int | None]] = {}
        self.by_index: dict[int, FailureReason] = {}

    @property
    def indices(self) -> set[int]:
        return set(self.by_index)

    def add(
        self,
        reason: FailureReason,
        message: str,
        http_status: int | None,
        indices: Iterable[int],
    ) -> None:
        chosen = list(indices)
        if not chosen:
            return
        self.first.setdefault(reason, (message, http_status))
        for j in chosen:
            self.by_index[j] = reason

    def summary(self, counted: Callable[[int], bool]) -> tuple[FailedRequests, ...]:
        """The failures among the records ``counted`` says count, by reason, in the order
        each reason first happened."""
        counts: dict[FailureReason, int] = {}
        for j, reason in self.by_index.items():
            if counted(j):
                counts[reason] = counts.get(reason, 0) + 1
        return tuple(
            FailedRequests(reason=reason, count=counts[reason], message=message, http_status=status)
            for reason, (message, status) in self.first.items()
            if counts.get(reason)
        )


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
    *,
    arrivals: Sequence[float | None] = (),
    window: tuple[float, float] | None = None,
    samples: Sequence[EngineSample] = (),
) -> SimulationResult:
    def arrived(j: int) -> float:
        at = arrivals[j] if j < len(arrivals) else None
        return records[j].arrival_s if at is None else at

    def counted(j: int) -> bool:
        return window is None or window[0] <= arrived(j) < window[1]

    def counted_request(request: SimRequest) -> bool:
        return window is None or window[0] <= request.arrival_s < window[1]

    finished = [r for r in finished if counted_request(r)]
    partial = [r for r in partial if counted_request(r)]
    ttft: list[float] = []
    tpot: list[float] = []
    e2e: list[float] = []
    good = 0
    for request in finished:
        assert request.first_token_s is not None and request.finish_s is not None
        first = request.first_token_s - request.arrival_s
        ttft.append(first)
        e2e.append(request.finish_s - request.arrival_s)
        times = request.token_times_s
        per_token = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
        tpot.append(per_token)
        if slo.met_by(ttft_ms=first * 1000.0, tpot_ms=per_token * 1000.0, e2e_ms=e2e[-1] * 1000.0):
            good += 1
    for request in partial:
        assert request.first_token_s is not None
        ttft.append(request.first_token_s - request.arrival_s)
        times = request.token_times_s
        if len(times) > 1:
            tpot.append((times[-1] - times[0]) / (len(times) - 1))
    if window is None:
        start = records[0].arrival_s if records else 0.0
        end = end_s
    else:
        start = (
            window[0] if math.isfinite(window[0]) else (records[0].arrival_s if records else 0.0)
        )
        end = window[1] if math.isfinite(window[1]) else end_s
    duration = max(end - start, 1e-9)
    output_tokens = sum(len(r.output_token_ids) for r in finished)
    queries = engine.prefix_queries_tokens
    failed = failures.summary(counted)
    sent = sum(
        1
        for j in range(len(records))
        if counted(j) and (j >= len(arrivals) or arrivals[j] is not None)
    )
    num_failed = sum(f.count for f in failed)
    without_first = max(0, sent - len(finished) - len(partial) - num_failed)
    ms = 1000.0
    return SimulationResult(
        num_requests=sum(1 for j in range(len(records)) if counted(j)),
        num_finished=len(finished),
        num_failed=num_failed,
        duration_s=duration,
        request_throughput=len(finished) / duration,
        output_token_throughput=output_tokens / duration,
        goodput=good / duration,
        ttft_ms=Percentiles.from_values([v * ms for v in ttft]),
        itl_ms=Percentiles.from_values(
            _gaps([r.token_times_s for r in [*finished, *partial]]) * ms
        ),
        tpot_ms=Percentiles.from_values([v * ms for v in tpot]),
        e2e_ms=Percentiles.from_values([v * ms for v in e2e]),
        num_preemptions=engine.num_preemptions,
        peak_kv_cache_usage=peak_usage,
        prefix_cache_hit_rate=engine.prefix_hits_tokens / queries if queries else 0.0,
        engine_steps=steps,
        engine_died=died,
        evicted_under_way_share=(
            engine.pool.history.evicted_under_way_share if engine.pool.history else None
        ),
        evictions=tuple(engine.pool.residency.drain()) if engine.pool.residency else None,
        failures=failed,
        num_without_first_token=without_first,
        arrivals_s=tuple(arrivals),
        samples=tuple(samples),
    )


def _gaps(series: Sequence[list[float]]) -> np.ndarray:
    """Each list's consecutive differences (its inter-token latencies), all lists in order.

    The same values as ``b - a`` over ``itertools.pairwise`` of each, in one pass over
    millions of token times."""
    series = [times for times in series if times]
    flat = np.fromiter(itertools.chain.from_iterable(series), dtype=np.float64)
    if flat.size < 2:
        return np.empty(0)
    ends = np.cumsum([len(times) for times in series])
    keep = np.ones(flat.size - 1, dtype=bool)
    keep[ends[:-1] - 1] = False  # a list's last time to the next list's first
    gaps: np.ndarray = np.diff(flat)[keep]
    return gaps

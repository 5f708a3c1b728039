"""The simulated engine's steps on a virtual clock, its plain decodes written down late.

``tuner simulate`` (``tuner.sim.simulate.run``) steps a ``SimEngine`` thousands of times
with hundreds of requests in each batch, nearly all of them decoding one token per
step. ``SimEngine.step`` does every one of those tokens' bookkeeping in every step
(block growth, block hashes, the token, its time, the finish check): that was most
of a simulation's time. Nothing outside the engine looks at a request's tokens before
it finishes, so ``DeferredStepper`` runs the same steps and does a decode's work only
in the steps where something happens to it:

* a request decoding (all of its tokens computed but the last) at the front of the
  running list is *deferred*: each later step schedules it with one token, as
  ``SimEngine.step`` would, and notes only the step's end time;
* the steps where a deferred request touches the KV cache are known from its computed
  tokens modulo the block size: where its next token starts a block it takes a block
  from the pool, and one step after its last token filled a block that block is
  hashed and cached. Those steps (about two in every block of tokens) are done in
  running order, as the engine's loop would do them, so blocks are handed out,
  evicted and cached in the same order; a block's tokens come from the request id
  (``tuner.sim.engine.TOKEN_STRIDE``), as the engine makes them;
* its finish (``max_tokens``, ``max_model_len`` or its sampled stop) is known when it
  is deferred; then, or when it is preempted, its tokens and their times are written
  into the request (``_settle``) and the engine's own code finishes or preempts it;
* the step's duration comes from the same ``StepWork`` sums: the deferred requests'
  context is a running total, so a step costs what its events cost, not its batch.

Everything else (requests prefilling, admission, preemption, finishing) is
``SimEngine``'s own code, so a run is the same run as step by step, bit for bit: the
same step durations, token times, blocks, cache hits and preemptions. ``settle`` writes
every deferred token into its request: call it before reading the running requests.
The live server (``tuner sim-serve``) keeps calling ``SimEngine.step``: it streams each
token as it is made.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from tuner.sim.engine import (
    TOKEN_STRIDE,
    EngineDead,
    RequestStatus,
    SimEngine,
    SimRequest,
    StepResult,
    _extend_block_hashes,
    token_seed,
)
from tuner.sim.timing import StepWork


@dataclass(frozen=True)
class StepOutcome:
    """One step as a virtual-clock driver needs it: what finished, and the engine's state."""

    duration_s: float
    finished: list[SimRequest]  # in the order the engine finished them
    num_scheduled_tokens: int
    num_running: int
    num_waiting: int
    num_preemptions: int
    kv_usage: float

    @classmethod
    def of(cls, result: StepResult) -> StepOutcome:
        """A ``SimEngine.step`` result, its finished requests taken from its events."""
        return cls(
            duration_s=result.duration_s,
            finished=[event.request for event in result.events if event.finished],
            num_scheduled_tokens=result.num_scheduled_tokens,
            num_running=result.num_running,
            num_waiting=result.num_waiting,
            num_preemptions=result.num_preemptions,
            kv_usage=result.kv_usage,
        )


@dataclass(eq=False, slots=True)
class _Deferred:
    """A decoding request whose tokens since ``from_step`` are not yet written into it.

    In step ``s`` (``s >= from_step``) it has ``request.num_computed_tokens + s -
    from_step`` tokens computed and is scheduled with one more."""

    request: SimRequest
    order: int  # its place in the running list (deferred requests are its front)
    from_step: int
    finish_step: int  # the step at whose end it finishes
    outputs_from: int  # the request's output tokens when it was deferred
    outputs: tuple[int, ...]  # its output tokens from there on, to its finish
    outputs_at: int  # where they start in its sequence (prompt and output)


_ORDER = attrgetter("order")


class DeferredStepper:
    """Steps ``engine`` as ``SimEngine.step`` does, its plain decodes deferred (module doc).

    The engine's ``running`` list starts with the deferred requests, in order; what
    follows them (requests prefilling, or behind one) is scheduled by the engine's own
    loop. Use one stepper per engine, and no ``SimEngine.step`` beside it."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        config = engine.config
        self.block_size = config.block_size
        self.caching = config.enable_prefix_caching
        self.vocab_modulus = max(config.vocab_size - 1, 1)
        self.step_index = 0  # the next step's number
        self.step_ends_s: list[float] = []  # each step's end, by number
        self.deferred: dict[SimRequest, _Deferred] = {}
        # Deferred requests by (computed tokens - step) modulo the block size, in running
        # order: in step s, class -s needs blocks, class -s - 1 caches the block it filled.
        self.by_phase: list[list[_Deferred]] = [[] for _ in range(self.block_size)]
        self.finishing: dict[int, list[_Deferred]] = {}  # by finish step (stale entries skipped)
        self.context_offset = 0  # sum of (computed tokens - from_step) over the deferred
        self.logprob_rows = 0  # deferred requests that asked for logprobs
        self._order = itertools.count()

    # -- stepping ---------------------------------------------------------------------------

    def step(self, now_s: float) -> StepOutcome:
        """Schedule and run one batch starting at now_s (``SimEngine.step``'s batch)."""
        engine = self.engine
        if engine.dead:
            raise EngineDead(engine.dead)
        if len(self.deferred) > engine.config.max_num_batched_tokens:
            return self._plain_step(now_s)  # not every decode fits: the engine's own step
        s = self.step_index
        preempted_before = engine.num_preemptions
        extra_s, preempted, cut = self._schedule_deferred(s, now_s)
        num_deferred = len(self.deferred)
        budget = engine.config.max_num_batched_tokens - num_deferred
        scheduled: list[tuple[SimRequest, int]] = []
        if not cut:
            budget, swap_out_s, preempted_tail = engine._schedule_running(
                num_deferred, budget, now_s, scheduled
            )
            extra_s += swap_out_s
            preempted = preempted or preempted_tail
        if not preempted:
            budget, swap_in_s = engine._admit_waiting(budget, now_s, scheduled)
            extra_s += swap_in_s
        work = self._work(s, num_deferred, scheduled)
        engine._check_runtime_memory(
            self.logprob_rows + sum(1 for request, _ in scheduled if request.logprobs)
        )
        duration = engine.timer.step_s(work) + extra_s if work.num_seqs else extra_s
        if not work.num_seqs:
            duration = max(duration, engine.idle_until_s(now_s) - now_s)
        end_s = now_s + duration
        self.step_ends_s.append(end_s)
        self.step_index = s + 1
        finished = self._finish_deferred(s, end_s)
        finished += [event.request for event in engine._advance(scheduled, end_s) if event.finished]
        self._defer_decodes()
        return StepOutcome(
            duration_s=duration,
            finished=finished,
            num_scheduled_tokens=work.num_tokens,
            num_running=len(engine.running),
            num_waiting=len(engine.waiting),
            num_preemptions=engine.num_preemptions - preempted_before,
            kv_usage=engine.pool.usage,
        )

    def settle(self) -> None:
        """Write every deferred token into its request (they stay deferred)."""
        for entry in self.deferred.values():
            self._settle(entry, self.step_index)

    # -- the deferred requests' events --------------------------------------------------------

    def _schedule_deferred(self, s: int, now_s: float) -> tuple[float, bool, bool]:
        """The deferred requests' block allocations and caching in step s, in running order.

        Returns the swap-out time of any preempted, whether one was, and whether the
        schedule was cut (a request preempted itself: nothing after it runs)."""
        size = self.block_size
        events = self.by_phase[-s % size]
        if self.caching and size > 1:
            filled = self.by_phase[(-s - 1) % size]
            if filled:
                events = sorted(events + filled, key=_ORDER) if events else filled
        extra_s = 0.0
        preempted = False
        deferred = self.deferred
        allocate_one = self.engine.pool.allocate_one
        caching = self.caching
        for entry in list(events):  # a copy: preemption takes entries out of the classes
            request = entry.request
            if preempted and deferred.get(request) is not entry:
                continue  # preempted earlier in this step
            computed = request.num_computed_tokens + s - entry.from_step
            block_ids = request.block_ids
            if computed >= len(block_ids) * size:  # its next token starts a block
                block_id = allocate_one(now_s) if computed == len(block_ids) * size else None
                if block_id is not None:
                    block_ids.append(block_id)
                else:  # none free (or more than one wanted): preempt as the engine does
                    swap_out_s, preempted_here, fitted = self._grow(entry, s, computed, now_s)
                    extra_s += swap_out_s
                    preempted = preempted or preempted_here
                    if not fitted:
                        return extra_s, True, True
            if caching and (computed + 1) % size == 0:
                self._cache_filled_block(entry, s, computed + 1, now_s)
        return extra_s, preempted, False

    def _cache_filled_block(self, entry: _Deferred, s: int, tokens: int, now_s: float) -> None:
        """The block that the request's token of step s - 1 filled (``tokens`` long now):
        hashed, as ``SimEngine._advance`` hashes it at the end of that step, and cached, as
        ``SimEngine._cache_full_blocks`` caches it when step s schedules the request."""
        request = entry.request
        hashes = request.block_hashes
        size = self.block_size
        full = tokens // size
        if s > entry.from_step and len(hashes) == full - 1:
            start = tokens - size - entry.outputs_at
            chunk = (  # _chain_hash's tuple: deferred outputs alone, nearly always
                entry.outputs[start : start + size]
                if start >= 0
                else tuple(self._tokens(entry, tokens - size, tokens))
            )
            hashes.append(hash((hashes[-1] if hashes else 0, chunk)))
        full = min(full, len(hashes))
        cached = request.num_cached_blocks
        if full == cached + 1:
            self.engine.pool.cache_block(request.block_ids[cached], hashes[cached], cached, now_s)
        elif full > cached:
            self.engine.pool.cache_blocks(request.block_ids, hashes, cached, full, now_s)
        request.num_cached_blocks = max(full, cached)
        self.engine.offer_to_cpu(request, full, now_s)

    def _tokens(self, entry: _Deferred, start: int, end: int) -> list[int]:
        """Tokens ``start .. end - 1`` of the request's prompt and output, deferred ones too."""
        request = entry.request
        prompt = len(request.prompt_token_ids)
        head = request.prompt_token_ids[start:end] if start < prompt else []
        first, last = max(start - prompt, 0), end - prompt  # as output indices
        if last <= 0:
            return head
        written = request.output_token_ids[first : min(last, entry.outputs_from)]
        later = entry.outputs[max(first - entry.outputs_from, 0) : last - entry.outputs_from]
        return [*head, *written, *later]

    def _grow(
        self, entry: _Deferred, s: int, computed: int, now_s: float
    ) -> tuple[float, bool, bool]:
        """A deferred request's blocks for its next token when no single free block would
        do: preempt the newest running requests until they fit (``SimEngine._grow`` in
        ``SimEngine._schedule_running``'s loop). Returns the swap-out time, whether any
        request was preempted and whether this one is still scheduled."""
        engine = self.engine
        request = entry.request
        need = -(-(computed + 1) // self.block_size) - len(request.block_ids)
        blocks = engine.pool.allocate(need, now_s)
        if blocks is not None:
            request.block_ids.extend(blocks)
            return 0.0, False, True
        self._settle(entry, s)
        extra_s = 0.0
        while blocks is None:
            victim = engine.running.pop()
            victim_entry = self.deferred.get(victim)
            if victim_entry is not None:
                self._settle(victim_entry, s)
                self._forget(victim_entry)
            extra_s += engine._preempt(victim, now_s)
            if victim is request:
                return extra_s, True, False
            blocks = engine.pool.allocate(need, now_s)
        request.block_ids.extend(blocks)
        return extra_s, True, True

    def _finish_deferred(self, s: int, end_s: float) -> list[SimRequest]:
        """The deferred requests whose last token came at the end of step s, finished."""
        due = self.finishing.pop(s, None)
        if not due:
            return []
        finished: list[SimRequest] = []
        for entry in sorted(due, key=_ORDER):
            request = entry.request
            if self.deferred.get(request) is not entry:
                continue  # preempted since it was deferred
            self._settle(entry, s + 1)
            reason = self.engine._finish_reason(request)
            assert reason is not None, f"{request.request_id} was due to finish in step {s}"
            self._forget(entry)
            self.engine._finish(request, reason, end_s)
            finished.append(request)
        return finished

    # -- deferring and settling ---------------------------------------------------------------

    def _defer_decodes(self) -> None:
        """Defer the decoding requests that now follow the deferred ones in ``running``."""
        running = self.engine.running
        while len(self.deferred) < len(running):
            request = running[len(self.deferred)]
            if not self._deferrable(request):
                break
            self._defer(request, self.step_index)

    def _deferrable(self, request: SimRequest) -> bool:
        """Decoding, with the blocks and cache state a plain decode has after a step."""
        computed = request.num_computed_tokens
        tokens = len(request.prompt_token_ids) + len(request.output_token_ids)
        if request.status is not RequestStatus.RUNNING or request.first_token_s is None:
            return False
        if computed != tokens - 1 or len(request.block_ids) * self.block_size < computed:
            return False
        # Caching waits for a block boundary (what the phase classes assume).
        pending = min((computed + 1) // self.block_size, len(request.block_hashes))
        return (
            not self.caching
            or (computed + 1) % self.block_size == 0
            or (pending <= request.num_cached_blocks)
        )

    def _defer(self, request: SimRequest, s: int) -> None:
        computed = request.num_computed_tokens
        produced = len(request.output_token_ids)
        # The step at whose end _finish_reason first holds, as SimEngine._advance checks it.
        steps_left = [
            request.max_tokens - produced - 1,
            self.engine.config.max_model_len - computed - 2,
        ]
        if request.stop_after is not None:
            steps_left.append(max(request.stop_after, request.min_tokens) - produced - 1)
        finish_step = s + max(min(steps_left), 0)
        entry = _Deferred(
            request=request,
            order=next(self._order),
            from_step=s,
            finish_step=finish_step,
            outputs_from=produced,
            outputs=self._output_tokens(request, produced, finish_step - s + 1),
            outputs_at=computed + 1,
        )
        self.deferred[request] = entry
        self.by_phase[(computed - s) % self.block_size].append(entry)
        self.finishing.setdefault(entry.finish_step, []).append(entry)
        self.context_offset += computed - s
        self.logprob_rows += 1 if request.logprobs else 0

    def _output_tokens(self, request: SimRequest, first: int, count: int) -> tuple[int, ...]:
        """The request's output tokens ``first .. first + count - 1``, as
        ``SimEngine._next_token`` makes them one by one."""
        seed = token_seed(request.request_id)
        indices = np.arange(first, first + count, dtype=np.int64)
        tokens: list[int] = ((seed + indices * TOKEN_STRIDE) % self.vocab_modulus).tolist()
        return tuple(tokens)

    def _forget(self, entry: _Deferred) -> None:
        """No longer deferred (settled first): finished or preempted."""
        request = entry.request
        del self.deferred[request]
        phase = (request.num_computed_tokens - entry.from_step) % self.block_size
        self.by_phase[phase].remove(entry)
        self.context_offset -= request.num_computed_tokens - entry.from_step
        self.logprob_rows -= 1 if request.logprobs else 0

    def _settle(self, entry: _Deferred, upto: int) -> None:
        """Write the request's tokens of steps ``from_step .. upto - 1`` into it, as
        ``SimEngine._advance`` would have step by step."""
        count = upto - entry.from_step
        if count <= 0:
            return
        request = entry.request
        first = len(request.output_token_ids) - entry.outputs_from
        request.output_token_ids.extend(entry.outputs[first : first + count])
        request.token_times_s.extend(self.step_ends_s[entry.from_step : upto])
        request.num_computed_tokens += count
        request.last_token_s = self.step_ends_s[upto - 1]
        self.engine.generation_tokens_total += count
        if self.caching:
            _extend_block_hashes(request, self.block_size)
        entry.from_step = upto

    # -- the rest -----------------------------------------------------------------------------

    def _work(self, s: int, num_deferred: int, scheduled: list[tuple[SimRequest, int]]) -> StepWork:
        """``SimEngine._work`` over the deferred requests (one token each) then ``scheduled``.

        The deferred requests' context is ``context_offset + num_deferred * s``; their
        attention pairs (computed + 1/2 each) and every partial sum are multiples of 1/2,
        exact in a float, so the sum is the step-by-step one bit for bit."""
        computed = self.context_offset + num_deferred * s
        tokens = num_deferred
        context = computed + num_deferred
        pairs = computed + num_deferred / 2
        for request, n in scheduled:
            tokens += n
            context += request.num_computed_tokens + n
            pairs += n * (request.num_computed_tokens + n / 2)
        return StepWork(
            num_tokens=tokens,
            num_seqs=num_deferred + len(scheduled),
            context_tokens=context,
            attention_pairs=pairs,
        )

    def _plain_step(self, now_s: float) -> StepOutcome:
        """Settle everything and take ``SimEngine.step``: for more decodes than the token
        budget, where the engine schedules only the first ones (its admission never lets
        that happen; this keeps the run exact if it does)."""
        self.settle()
        self.deferred.clear()
        for phase in self.by_phase:
            phase.clear()
        self.finishing.clear()
        self.context_offset = 0
        self.logprob_rows = 0
        outcome = StepOutcome.of(self.engine.step(now_s))
        self.step_ends_s.append(now_s + outcome.duration_s)
        self.step_index += 1
        self._defer_decodes()
        return outcome

"""The simulated engine: vLLM V1's scheduler over a virtual GPU, independent of any clock.

``SimEngine.step(now_s)`` schedules one batch the way vLLM V1 does and returns
what it produced and how long it took on the virtual GPU; whoever drives it (the
HTTP server on the wall clock, ``tuner simulate`` on a virtual clock) decides
when ``now_s`` is. Scheduling follows ``vllm/v1/core/sched/scheduler.py``:

* running requests first (a decode token each, or their next prefill chunk),
  then waiting ones, within ``max_num_batched_tokens`` and ``max_num_seqs``;
* prompts longer than the budget are prefilled in chunks (chunked prefill);
* KV blocks of ``block_size`` tokens are allocated as tokens are scheduled; when
  none is free the newest running request is preempted and recomputed later
  (or, under an emulated version with ``--swap-space``, swapped to host memory
  at PCIe speed while the host pool has room);
* from 0.19 a waiting request is admitted only when its whole sequence fits in the
  free blocks (``scheduler_reserve_full_isl``), not just its first prefill chunk;
* full blocks (prompt and output) are cached by chained hash when they are
  scheduled, so a request admitted later in the same step already reuses them,
  and a preempted request resumes from its own cached blocks;
* with KV offloading (``--kv-offloading-size``, ``tuner.sim.cpu_tier``) the same blocks
  are written through to the CPU tier as they fill; a new request's blocks past its GPU
  prefix hit are looked up there, and those found are loaded over the host link while
  the request waits (the rest of the batch runs on), then its prefill goes on from them.
"""

from __future__ import annotations

import random
import zlib
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from tuner.sim.blocks import BlockPool, EvictionPolicy
from tuner.sim.cpu_tier import CpuTier, CpuTierConfig
from tuner.sim.lost_history import LostHistory
from tuner.sim.residency import ResidencyRecorder
from tuner.sim.timing import StepTimer, StepWork


class RequestStatus(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SWAPPED = "swapped"
    FINISHED = "finished"
    ABORTED = "aborted"


class FinishReason(StrEnum):
    LENGTH = "length"
    STOP = "stop"
    ABORT = "abort"
    ERROR = "error"


@dataclass(eq=False)
class SimRequest:
    """One request inside the engine, with its timings for metrics."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    arrival_s: float
    min_tokens: int = 0
    ignore_eos: bool = True
    logprobs: int = 0
    stop_after: int | None = None  # sampled EOS position when ignore_eos is false
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    token_times_s: list[float] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0
    num_preemptions: int = 0
    cached_prompt_tokens: int = 0
    num_offered_blocks: int = 0  # blocks offered to the CPU tier (its store index)
    load_done_s: float = 0.0  # its blocks from the CPU tier are on the GPU from then
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_s: float | None = None
    finish_reason: FinishReason | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


@dataclass(frozen=True)
class TokenEvent:
    """A token a request produced in a step (``token_id`` None when it only finished)."""

    request: SimRequest
    token_id: int | None
    finished: bool


@dataclass(frozen=True)
class StepResult:
    duration_s: float
    events: list[TokenEvent]
    num_scheduled_tokens: int
    num_running: int
    num_waiting: int
    num_preemptions: int
    kv_usage: float


@dataclass(frozen=True)
class EngineConfig:
    """The scheduler's settings, as vLLM resolves them."""

    num_gpu_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    vocab_size: int
    enable_prefix_caching: bool = True
    eviction_policy: EvictionPolicy = EvictionPolicy.LRU
    swap_blocks: int = 0  # host blocks for swapped-out requests (0: recompute)
    pcie_bytes_per_s: float = 25e9
    runtime_headroom_bytes: int = 1 << 62  # device memory left while running
    reserve_full_sequence: bool = True  # admit only if the whole sequence fits (vLLM >= 0.19)
    cpu_tier: CpuTierConfig | None = None  # KV offloading to host memory (None: off)
    kv_cache_metrics_sample: float | None = None  # --kv-cache-metrics' sample rate (None: off)
    seed: int = 0


class EngineDead(Exception):
    """The engine hit an unrecoverable error (a CUDA out-of-memory under load)."""


# A request's output token k is (token_seed + k * TOKEN_STRIDE) % (vocab_size - 1): made up
# from its id alone, so a preempted request recomputes the same tokens and finds its own
# cached blocks (SimEngine._next_token; tuner.sim.deferred makes a request's in bulk).
TOKEN_STRIDE = 7919
# A load from the CPU tier counts as done this close to its end: a clock that adds step
# times to a large wall-clock reading cannot land on the end itself.
LOAD_DONE_SLACK_S = 1e-6


def token_seed(request_id: str) -> int:
    """The seed of a request's made-up output tokens."""
    return zlib.crc32(request_id.encode())


def _chain_hash(parent: int, chunk: list[int]) -> int:
    """A full block's key: its parent block's hash chained with its token ids (0: no parent)."""
    return hash((parent, tuple(chunk)))


def block_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of a token sequence, as vLLM's prefix cache keys them."""
    hashes: list[int] = []
    parent = 0
    # zip over one iterator, block_size times: the full blocks as tuples, the tail left out.
    for chunk in zip(*[iter(token_ids)] * block_size, strict=False):
        parent = hash((parent, chunk))  # _chain_hash, without the copy to a tuple
        hashes.append(parent)
    return hashes


def _extend_block_hashes(request: SimRequest, block_size: int) -> None:
    """Hash the block an output token just filled, as vLLM hashes a request's blocks as it grows."""
    if (
        request.num_tokens % block_size
        or len(request.block_hashes) != request.num_tokens // block_size - 1
    ):
        return
    outputs = request.output_token_ids
    if len(outputs) >= block_size:
        chunk = outputs[-block_size:]
    else:
        chunk = request.prompt_token_ids[len(outputs) - block_size :] + outputs
    parent = request.block_hashes[-1] if request.block_hashes else 0
    request.block_hashes.append(_chain_hash(parent, chunk))


class SimEngine:
    """Continuous batching over a pool of KV blocks; one ``step`` is one model forward."""

    def __init__(self, config: EngineConfig, timer: StepTimer) -> None:
        self.config = config
        self.timer = timer
        self.pool = BlockPool(config.num_gpu_blocks, config.eviction_policy)
        if config.enable_prefix_caching:
            self.pool.history = LostHistory(config.block_size)
        if config.kv_cache_metrics_sample is not None:
            self.pool.residency = ResidencyRecorder(
                config.kv_cache_metrics_sample,
                prefix_caching=config.enable_prefix_caching,
                seed=config.seed,
            )
        self.cpu_tier = CpuTier(config.cpu_tier) if config.cpu_tier is not None else None
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.requests: dict[str, SimRequest] = {}
        self.rng = random.Random(config.seed)
        self.swap_used_blocks = 0
        self.num_preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.prefix_queries_tokens = 0
        self.prefix_hits_tokens = 0
        self.dead: str | None = None

    # -- requests ---------------------------------------------------------------------------

    def add_request(self, request: SimRequest) -> None:
        if self.dead:
            raise EngineDead(self.dead)
        if not request.ignore_eos and request.stop_after is None:
            low = max(request.min_tokens, 1)
            request.stop_after = self.rng.randint(low, max(low, request.max_tokens))
        if self.config.enable_prefix_caching:
            request.block_hashes = block_hashes(request.prompt_token_ids, self.config.block_size)
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort(self, request_id: str, now_s: float) -> None:
        request = self.requests.pop(request_id, None)
        if request is None or request.status in (RequestStatus.FINISHED, RequestStatus.ABORTED):
            return
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._release(request, now_s)
        request.status = RequestStatus.ABORTED
        request.finish_reason = FinishReason.ABORT
        request.finish_s = now_s

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ---------------------------------------------------------------------------

    def step(self, now_s: float) -> StepResult:
        """Schedule and run one batch starting at now_s."""
        if self.dead:
            raise EngineDead(self.dead)
        preempted_before = self.num_preemptions
        scheduled: list[tuple[SimRequest, int]] = []
        budget, extra_s, preempted = self._schedule_running(
            0, self.config.max_num_batched_tokens, now_s, scheduled
        )
        if not preempted:
            budget, swap_in_s = self._admit_waiting(budget, now_s, scheduled)
            extra_s += swap_in_s

        work = self._work(scheduled)
        self._check_runtime_memory(sum(1 for request, _ in scheduled if request.logprobs))
        duration = self.timer.step_s(work) + extra_s if scheduled else extra_s
        if not scheduled:
            duration = max(duration, self.idle_until_s(now_s) - now_s)
        end_s = now_s + duration
        events = self._advance(scheduled, end_s)
        return StepResult(
            duration_s=duration,
            events=events,
            num_scheduled_tokens=work.num_tokens,
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_preemptions=self.num_preemptions - preempted_before,
            kv_usage=self.pool.usage,
        )

    def _schedule_running(
        self, start: int, budget: int, now_s: float, scheduled: list[tuple[SimRequest, int]]
    ) -> tuple[int, float, bool]:
        """Schedule ``running[start:]`` in order within ``budget`` (a decode token each, or
        their next prefill chunk), preempting the newest when blocks run out.

        Appends to ``scheduled``; returns the budget left, the swap-out time of the
        preempted and whether any request was preempted."""
        extra_s = 0.0
        preempted = False
        i = start
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            if request.load_done_s > now_s + LOAD_DONE_SLACK_S:  # blocks still on their way
                i += 1
                continue
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            while not self._grow(request, n, now_s):
                victim = self.running.pop()
                extra_s += self._preempt(victim, now_s)
                preempted = True
                if victim is request:
                    n = 0
                    break
            if n == 0:
                break
            self._cache_full_blocks(request, request.num_computed_tokens + n, now_s)
            scheduled.append((request, n))
            budget -= n
            i += 1
        return budget, extra_s, preempted

    def _admit_waiting(
        self, budget: int, now_s: float, scheduled: list[tuple[SimRequest, int]]
    ) -> tuple[int, float]:
        """Admit waiting requests in order while the budget, ``max_num_seqs`` and the KV
        cache allow; appends them to ``scheduled``, returns the budget left and the
        swap-in time."""
        extra_s = 0.0
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            admitted = self._admit(request, budget, now_s)
            if admitted is None:
                break
            n, swap_in_s = admitted
            extra_s += swap_in_s
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            if request.first_scheduled_s is None:
                request.first_scheduled_s = now_s
            self.running.append(request)
            if n:  # else it waits for its blocks from the CPU tier
                scheduled.append((request, n))
            budget -= n
        return budget, extra_s

    def idle_until_s(self, now_s: float) -> float:
        """When a step with nothing to schedule should end: the first load from the CPU tier
        still under way (``now_s`` when none is)."""
        pending = [r.load_done_s for r in self.running if r.load_done_s > now_s + LOAD_DONE_SLACK_S]
        return min(pending) if pending else now_s

    # -- internals --------------------------------------------------------------------------

    def _blocks_needed(self, request: SimRequest, num_new: int) -> int:
        size = self.config.block_size
        total = -(-(request.num_computed_tokens + num_new) // size)
        return max(total - len(request.block_ids), 0)

    def _grow(self, request: SimRequest, num_new: int, now_s: float) -> bool:
        need = self._blocks_needed(request, num_new)
        if need == 0:
            return True
        blocks = self.pool.allocate(need, now_s)
        if blocks is None:
            return False
        request.block_ids.extend(blocks)
        return True

    def _admit(self, request: SimRequest, budget: int, now_s: float) -> tuple[int, float] | None:
        """Take a waiting request in: prefix-cache hits, blocks for its first chunk."""
        swap_in_s = 0.0
        hit_tokens: int | None = None
        usable = 0
        if request.status is RequestStatus.SWAPPED:
            swapped = request.num_computed_tokens
            need = -(-swapped // self.config.block_size)
            blocks = self.pool.allocate(need, now_s)
            if blocks is None:
                return None
            request.block_ids = blocks
            self.swap_used_blocks -= need
            swap_in_s = self.timer.swap_s(swapped, self.config.pcie_bytes_per_s)
        elif request.num_computed_tokens == 0 and self.config.enable_prefix_caching:
            # At least the last token is always computed, so its logits exist.
            usable = (request.num_tokens - 1) // self.config.block_size
            hits = self.pool.lookup(request.block_hashes[:usable], now_s)
            request.block_ids = hits
            request.num_cached_blocks = len(hits)
            request.num_computed_tokens = len(hits) * self.config.block_size
            hit_tokens = request.num_computed_tokens
            if self.cpu_tier is not None:
                loading = self._admit_from_cpu(request, hit_tokens, usable, now_s)
                if loading is not None:  # it waits for its blocks, or has no room for them
                    return (0, 0.0) if loading else None
        n = min(request.num_tokens - request.num_computed_tokens, budget)
        whole_fits = (
            not self.config.reserve_full_sequence
            or request.status is RequestStatus.SWAPPED
            or self._blocks_needed(request, request.num_tokens - request.num_computed_tokens)
            <= self.pool.num_free
        )
        if not whole_fits or not self._grow(request, n, now_s):
            if request.status is RequestStatus.SWAPPED:
                self.swap_used_blocks += len(request.block_ids)
            self.pool.free(request.block_ids, now_s)
            request.block_ids = []
            if request.status is not RequestStatus.SWAPPED:
                request.num_computed_tokens = 0
                request.num_cached_blocks = 0
            return None
        if hit_tokens is not None and request.num_preemptions == 0:
            # vLLM records a lookup at admission (0.32), over the request's tokens.
            self.prefix_queries_tokens += request.num_tokens
            self.prefix_hits_tokens += hit_tokens
            request.cached_prompt_tokens = hit_tokens
            if self.cpu_tier is not None:  # the connector's lookup found nothing
                self.cpu_tier.external_queries_tokens += request.num_tokens
            self._sort_misses(request, usable, hit_tokens // self.config.block_size)
        self._cache_full_blocks(request, request.num_computed_tokens + n, now_s)
        return n, swap_in_s

    def _admit_from_cpu(
        self, request: SimRequest, hit_tokens: int, usable: int, now_s: float
    ) -> bool | None:
        """The blocks after the GPU prefix hit that the CPU tier holds: GPU blocks for them
        and their load queued, the request waiting for it (True); None when the tier has
        none of them (admission goes on as without it); False, the admission taken back
        as a refused one is, when the GPU has no room for them."""
        tier = self.cpu_tier
        assert tier is not None
        size = self.config.block_size
        first = hit_tokens // size
        tier.touch(request.block_hashes[: request.num_tokens // size])
        found = tier.lookup(request.block_hashes[first:usable]) if usable > first else 0
        if found == 0:
            return None
        request.num_computed_tokens = (first + found) * size
        need = self._blocks_needed(request, 0)
        whole = self._blocks_needed(request, request.num_tokens - request.num_computed_tokens)
        fits = need <= self.pool.num_free and (
            not self.config.reserve_full_sequence or whole <= self.pool.num_free
        )
        if not fits or not self._grow(request, 0, now_s):
            self.pool.free(request.block_ids, now_s)
            request.block_ids = []
            request.num_computed_tokens = 0
            request.num_cached_blocks = 0
            return False
        if request.num_preemptions == 0:
            self.prefix_queries_tokens += request.num_tokens
            self.prefix_hits_tokens += hit_tokens
            request.cached_prompt_tokens = request.num_computed_tokens
            tier.external_queries_tokens += request.num_tokens
            tier.external_hits_tokens += found * size
            self._sort_misses(request, usable, first + found)
        request.num_offered_blocks = first + found  # loaded blocks are not stored again
        request.load_done_s = tier.load(found, now_s)
        self._cache_full_blocks(request, request.num_computed_tokens, now_s)
        return True

    def _sort_misses(self, request: SimRequest, usable: int, hit_blocks: int) -> None:
        """The simulator's ground truth of why the prompt's other blocks missed
        (``tuner.sim.lost_history``); the prompt is a turn a later request may continue."""
        history = self.pool.history
        if history is None:
            return
        history.admitted(request.block_hashes, usable, hit_blocks)
        history.turn_ended(request.block_hashes, request.num_tokens // self.config.block_size)

    def _cache_full_blocks(self, request: SimRequest, num_tokens: int, now_s: float) -> None:
        """Cache the blocks the first num_tokens fill, at scheduling as vLLM's allocate_slots
        does (and offer them to the CPU tier, as the offloading connector stores them)."""
        if not self.config.enable_prefix_caching:
            return
        full = min(num_tokens // self.config.block_size, len(request.block_hashes))
        if full > request.num_cached_blocks:
            self.pool.cache_blocks(
                request.block_ids, request.block_hashes, request.num_cached_blocks, full, now_s
            )
            request.num_cached_blocks = full
        self.offer_to_cpu(request, full, now_s)

    def offer_to_cpu(self, request: SimRequest, full: int, now_s: float) -> None:
        """Write the request's blocks up to ``full`` through to the CPU tier (once each)."""
        if self.cpu_tier is None or full <= request.num_offered_blocks:
            return
        self.cpu_tier.offer(request.block_hashes[request.num_offered_blocks : full], now_s)
        request.num_offered_blocks = full

    def _preempt(self, request: SimRequest, now_s: float) -> float:
        """Preempt: swap out if the host pool has room, else free and recompute later."""
        request.num_preemptions += 1
        self.num_preemptions += 1
        held = len(request.block_ids)
        cost_s = 0.0
        if self.config.swap_blocks and self.swap_used_blocks + held <= self.config.swap_blocks:
            self.swap_used_blocks += held
            cost_s = self.timer.swap_s(request.num_computed_tokens, self.config.pcie_bytes_per_s)
            self.pool.free(request.block_ids, now_s)
            request.block_ids = []
            request.status = RequestStatus.SWAPPED
        else:
            self._release(request, now_s)
            request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)
        return cost_s

    def _release(self, request: SimRequest, now_s: float) -> None:
        self.pool.free(request.block_ids, now_s)
        request.block_ids = []
        request.num_computed_tokens = 0
        request.num_cached_blocks = 0
        request.load_done_s = 0.0

    def _work(self, scheduled: list[tuple[SimRequest, int]]) -> StepWork:
        tokens = context = 0
        pairs = 0.0
        for request, n in scheduled:
            tokens += n
            context += request.num_computed_tokens + n
            pairs += n * (request.num_computed_tokens + n / 2)
        return StepWork(
            num_tokens=tokens,
            num_seqs=len(scheduled),
            context_tokens=context,
            attention_pairs=pairs,
        )

    def _check_runtime_memory(self, rows: int) -> None:
        """Logprobs materialise fp32 rows of the vocabulary that the profile run never saw
        (``rows``: the scheduled requests that asked for logprobs)."""
        transient = rows * self.config.vocab_size * 4 * 2
        if transient > self.config.runtime_headroom_bytes:
            self.dead = (
                f"CUDA out of memory. Tried to allocate {transient / (1 << 20):.2f} MiB while "
                f"sampling {rows} requests with logprobs; "
                f"{max(self.config.runtime_headroom_bytes, 0) / (1 << 20):.2f} MiB free."
            )
            raise EngineDead(self.dead)

    def _advance(self, scheduled: list[tuple[SimRequest, int]], end_s: float) -> list[TokenEvent]:
        size = self.config.block_size
        events: list[TokenEvent] = []
        for request, n in scheduled:
            request.num_computed_tokens += n
            if request.num_computed_tokens < request.num_tokens:
                continue  # a prefill chunk that has not reached the end of the prompt
            token = self._next_token(request)
            request.output_token_ids.append(token)
            if self.config.enable_prefix_caching:
                _extend_block_hashes(request, size)
            request.token_times_s.append(end_s)
            self.generation_tokens_total += 1
            if request.first_token_s is None:
                # vLLM counts a request's prompt once, when it yields its first token.
                request.first_token_s = end_s
                self.prompt_tokens_total += request.num_prompt_tokens
            request.last_token_s = end_s
            reason = self._finish_reason(request)
            if reason is not None:
                self._finish(request, reason, end_s)
            events.append(TokenEvent(request=request, token_id=token, finished=reason is not None))
        return events

    def _finish(self, request: SimRequest, reason: FinishReason, end_s: float) -> None:
        """The request is done at end_s: out of the batch, its blocks back to the pool."""
        self.running.remove(request)
        self.pool.free(request.block_ids, end_s)
        if self.pool.history is not None:  # prompt and answer: a turn a later one continues
            self.pool.history.turn_ended(request.block_hashes, len(request.block_hashes))
        request.block_ids = []
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.finish_s = end_s
        self.requests.pop(request.request_id, None)

    def _next_token(self, request: SimRequest) -> int:
        """The request's next output token (see TOKEN_STRIDE; token_seed inline: it runs
        once a token)."""
        seed = zlib.crc32(request.request_id.encode())
        index = len(request.output_token_ids)
        return (seed + index * TOKEN_STRIDE) % max(self.config.vocab_size - 1, 1)

    def _finish_reason(self, request: SimRequest) -> FinishReason | None:
        produced = len(request.output_token_ids)
        if produced >= request.max_tokens or request.num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH
        if request.stop_after is not None and produced >= max(
            request.stop_after, request.min_tokens
        ):
            return FinishReason.STOP
        return None

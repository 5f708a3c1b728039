"""From a WorkloadSpec to the open-loop schedule of one run.

``build_schedule`` plans every request up front: its send offset (warm-up first,
then the measured window), its lengths, its text (shared system prompt, Mooncake
blocks, session history) and whether it is warm-up. The same spec and seed give
the same schedule, byte for byte.

How a request's text is made:

* completions: ``[system prompt] [shared trace blocks] new text``, one string;
* chat: an optional ``system`` message with the system prompt, then the user
  message ``[shared trace blocks] new text``;
* a shared trace block (a Mooncake hash id, an own ``prefix_id``) opens with its id
  written as words (``block_id_words``), so equal ids give equal text and distinct
  ids distinct text, whatever their seeds;
* a session's turn n: completions extend turn n-1's prompt with its answer and
  the new text; chat appends turn n-1's answer as an ``assistant`` message and the
  new ``user`` message. Answers are placeholder text of turn n-1's ``max_tokens``
  (the real answer is unknown when the plan is made; the history's shape is what
  loads the server).

``ScheduledRequest.prompt_tokens`` is the exact count under the prompt builder, as
the server counts it (the word rule by default: words, plus one per chat message; a
model's tokenizer: a completion's text and the BOS its tokenizer adds, a chat request's
contents and what its chat template adds around them).

With ``sessions.start: stationary`` the schedule also holds the later turns of the
sessions already under way at offset 0 (``workloads.stationary``): planned like any
session from their own random streams, ids ``<name>-lead-<n>-<turn>``, only their
turns from offset 0 on sent. The arrivals of the run itself are unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from workloads.arrivals import ArrivalPlan, plan_arrivals, poisson_arrivals
from workloads.lengths import (
    IntArray,
    TraceColumn,
    lengths_for_rows,
    sample_lengths,
)
from workloads.prompts import VOCABULARY, PromptBuilder, WordPromptBuilder, text_of
from workloads.schedule import Api, ScheduledRequest
from workloads.spec import SessionStart, TraceArrival, WorkloadError, WorkloadSpec, read_trace_ref
from workloads.stationary import lead_rate_per_s, lookback_s
from workloads.think import FloatArray, sample_think_s
from workloads.traces import TraceRecord, prefix_free_digits

# Independent random streams of one spec's seed (changing one aspect keeps the others).
_ARRIVALS, _PROMPT_LEN, _OUTPUT_LEN, _PREFIX, _TURNS, _THINK = 1, 10, 11, 12, 13, 14
_SYSTEM_TEXT, _BLOCK_TEXT, _REQUEST_TEXT, _ANSWER_TEXT = 20, 21, 22, 23
# The sessions under way at offset 0 (sessions.start: stationary): streams of their own.
_LEAD_ARRIVALS, _LEAD_TURNS, _LEAD_PROMPT_LEN, _LEAD_OUTPUT_LEN, _LEAD_PREFIX = 30, 31, 32, 33, 34
_LEAD_TEXT, _LEAD_ANSWER, _LEAD_THINK = 35, 36, 37


@functools.lru_cache(maxsize=1 << 16)  # a pure function: one per session turn, for every run
def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])


Message = dict[str, str]


@dataclass
class _Texts:
    """Cached shared texts: system prompts and trace blocks are built once per run."""

    spec: WorkloadSpec
    builder: PromptBuilder
    system: dict[int, str]
    blocks: dict[tuple[int, int], str]

    def system_prompt(self, which: int) -> str:
        if which not in self.system:
            assert self.spec.shared_prefix is not None
            self.system[which] = text_of(
                self.builder,
                self.spec.shared_prefix.system_prompt_tokens,
                seed=_seed(self.spec.seed, _SYSTEM_TEXT, which),
            )
        return self.system[which]

    def shared_blocks(self, row: TraceRecord | None, prompt_tokens: int) -> tuple[str, int]:
        """A trace row's shared blocks (identical text for equal ids), cut to the prompt."""
        if row is None or not row.prefix_block_ids:
            return "", 0
        parts: list[str] = []
        used = 0
        for block in row.prefix_block_ids:
            if used >= prompt_tokens:
                break
            size = min(row.block_tokens, prompt_tokens - used)
            key = (block, size)
            if key not in self.blocks:
                self.blocks[key] = block_text(
                    self.builder, block, size, seed=_seed(self.spec.seed, _BLOCK_TEXT, block)
                )
            parts.append(self.blocks[key])
            used += size
        return " ".join(parts), used


def block_id_words(block_id: int) -> list[str]:
    """A block id as words, prefix-free: its digit count, then its digits in base len(VOCABULARY).

    Distinct ids give word sequences of which neither starts the other, so the texts
    they begin differ whatever follows.
    """
    if block_id < 0:
        raise WorkloadError(f"block id {block_id} is negative; accepted: an integer >= 0")
    return [VOCABULARY[d] for d in prefix_free_digits(block_id, len(VOCABULARY))]


def block_text(builder: PromptBuilder, block_id: int, n_tokens: int, *, seed: int) -> str:
    """A shared trace block of exactly n_tokens: equal ids give equal text, distinct ids
    distinct text (the id's words open it; only a block too short for them is seeded text
    alone)."""
    head = " ".join(block_id_words(block_id))
    head_tokens = builder.count(head)
    if head_tokens > n_tokens:
        return text_of(builder, n_tokens, seed=seed)
    return builder.extend(head, n_tokens - head_tokens, seed=seed)


def _content_tokens(builder: PromptBuilder, messages: Sequence[Message]) -> int:
    return sum(builder.count(m["content"]) for m in messages)


def _chat_request_tokens(
    builder: PromptBuilder, messages: Sequence[Message], content_tokens: int
) -> int:
    """A chat request's prompt as the server counts it: its contents' tokens (summed as the
    conversation grows) and what the chat template adds around them."""
    return content_tokens + builder.chat_overhead_tokens([m["role"] for m in messages])


def build_schedule(
    spec: WorkloadSpec, *, prompt_builder: PromptBuilder | None = None
) -> list[ScheduledRequest]:
    """Every request of one run, sorted by send offset; deterministic for spec.seed."""
    builder = prompt_builder if prompt_builder is not None else WordPromptBuilder()
    trace: tuple[TraceRecord, ...] | None = None
    if isinstance(spec.arrival, TraceArrival):
        trace = read_trace_ref(spec.arrival.path)
    plan = plan_arrivals(
        spec.arrival,
        duration_s=spec.duration_s,
        warmup=spec.warmup,
        seed=_seed(spec.seed, _ARRIVALS),
        trace=trace,
    )
    rows: list[TraceRecord] | None = None
    if plan.trace_rows is not None and trace is not None:
        rows = [trace[i] for i in plan.trace_rows]
    n = len(plan)

    turns = np.ones(n, dtype=np.int64)
    if spec.sessions is not None:
        turns = sample_lengths(
            spec.sessions.turns, n, np.random.default_rng(_seed(spec.seed, _TURNS))
        )
    total = int(turns.sum())
    prompt_rng = np.random.default_rng(_seed(spec.seed, _PROMPT_LEN))
    output_rng = np.random.default_rng(_seed(spec.seed, _OUTPUT_LEN))
    if rows is not None and spec.sessions is None:
        prompt_len = lengths_for_rows(
            spec.prompt_tokens, rows, prompt_rng, column=TraceColumn.PROMPT
        )
        output_len = lengths_for_rows(
            spec.output_tokens, rows, output_rng, column=TraceColumn.OUTPUT
        )
    else:
        prompt_len = sample_lengths(
            spec.prompt_tokens, total, prompt_rng, column=TraceColumn.PROMPT
        )
        output_len = sample_lengths(
            spec.output_tokens, total, output_rng, column=TraceColumn.OUTPUT
        )

    think = (
        sample_think_s(spec.sessions, total, np.random.default_rng(_seed(spec.seed, _THINK)))
        if spec.sessions is not None
        else np.zeros(total, dtype=np.float64)
    )
    prefix_rng = np.random.default_rng(_seed(spec.seed, _PREFIX))
    if spec.shared_prefix is not None:
        has_prefix = prefix_rng.random(n) < spec.shared_prefix.fraction
        which_prefix = prefix_rng.integers(0, spec.shared_prefix.distinct_prompts, size=n)
    else:
        has_prefix = np.zeros(n, dtype=bool)
        which_prefix = np.zeros(n, dtype=np.int64)

    texts = _Texts(spec=spec, builder=builder, system={}, blocks={})
    requests: list[ScheduledRequest] = []
    first_turn = np.concatenate([[0], np.cumsum(turns)[:-1]]).astype(np.int64)
    for i in range(n):
        system = texts.system_prompt(int(which_prefix[i])) if has_prefix[i] else ""
        requests.extend(
            _arrival_requests(
                spec,
                plan,
                builder,
                texts,
                index=i,
                base_id=f"{spec.name}-{i:06d}",
                system=system,
                row=rows[i] if rows is not None else None,
                prompt_len=prompt_len[first_turn[i] : first_turn[i] + turns[i]],
                output_len=output_len[first_turn[i] : first_turn[i] + turns[i]],
                think_s=think[first_turn[i] : first_turn[i] + turns[i]],
            )
        )
    if spec.sessions is not None and spec.sessions.start is SessionStart.STATIONARY:
        requests.extend(_lead_requests(spec, plan, builder, texts, trace))
    return sorted(requests, key=lambda r: r.send_s)


def _lead_requests(
    spec: WorkloadSpec,
    plan: ArrivalPlan,
    builder: PromptBuilder,
    texts: _Texts,
    trace: Sequence[TraceRecord] | None,
) -> list[ScheduledRequest]:
    """The turns from offset 0 on of the sessions that arrived before it (Poisson at the
    rate in effect at 0, over ``lookback_s``); sessions over by then are not planned."""
    sessions = spec.sessions
    assert sessions is not None
    rate = lead_rate_per_s(spec, trace)
    horizon = lookback_s(spec)
    if plan.measured_end_s is None or rate <= 0 or horizon <= 0:
        return []
    # Seconds since each session's first turn, most recent first.
    ages = poisson_arrivals(
        rate_per_s=rate, duration_s=horizon, seed=_seed(spec.seed, _LEAD_ARRIVALS)
    )
    n = len(ages)
    turns = sample_lengths(sessions.turns, n, np.random.default_rng(_seed(spec.seed, _LEAD_TURNS)))
    total = int(turns.sum())
    prompt_len = sample_lengths(
        spec.prompt_tokens,
        total,
        np.random.default_rng(_seed(spec.seed, _LEAD_PROMPT_LEN)),
        column=TraceColumn.PROMPT,
    )
    output_len = sample_lengths(
        spec.output_tokens,
        total,
        np.random.default_rng(_seed(spec.seed, _LEAD_OUTPUT_LEN)),
        column=TraceColumn.OUTPUT,
    )
    think = sample_think_s(sessions, total, np.random.default_rng(_seed(spec.seed, _LEAD_THINK)))
    prefix_rng = np.random.default_rng(_seed(spec.seed, _LEAD_PREFIX))
    if spec.shared_prefix is not None:
        has_prefix = prefix_rng.random(n) < spec.shared_prefix.fraction
        which_prefix = prefix_rng.integers(0, spec.shared_prefix.distinct_prompts, size=n)
    else:
        has_prefix = np.zeros(n, dtype=bool)
        which_prefix = np.zeros(n, dtype=np.int64)
    first_turn = np.concatenate([[0], np.cumsum(turns)[:-1]]).astype(np.int64)
    # Planned offset of each session's last turn (the builder's spacing): kept when >= 0.
    # The gap after turn j is its answer and the think time before turn j + 1 (the roll
    # carries one session's first think time onto the one before's last turn, never summed).
    step_s = sessions.expected_ttft_s + output_len * sessions.expected_tpot_s + np.roll(think, -1)
    gaps = np.concatenate([[0.0], np.cumsum(step_s)])
    last_send = -ages + gaps[first_turn + turns - 1] - gaps[first_turn]
    alive = np.flatnonzero(last_send >= -1e-9)
    lead = ArrivalPlan(
        send_s=-ages[alive],
        warmup=np.zeros(len(alive), dtype=bool),
        measured_start_s=plan.measured_start_s,
        measured_end_s=plan.measured_end_s,
    )
    out: list[ScheduledRequest] = []
    for j, i in enumerate(alive.tolist()):
        system = texts.system_prompt(int(which_prefix[i])) if has_prefix[i] else ""
        planned = _arrival_requests(
            spec,
            lead,
            builder,
            texts,
            index=j,
            base_id=f"{spec.name}-lead-{i:06d}",
            system=system,
            row=None,
            prompt_len=prompt_len[first_turn[i] : first_turn[i] + turns[i]],
            output_len=output_len[first_turn[i] : first_turn[i] + turns[i]],
            think_s=think[first_turn[i] : first_turn[i] + turns[i]],
            seeds=(_LEAD_TEXT, _LEAD_ANSWER, i),
        )
        kept = [r for r in planned if r.send_s >= 0.0]  # earlier turns: history only
        if kept and kept[0].follows is not None:  # its answer was never asked for: at send_s
            kept[0] = replace(kept[0], follows=None)
        out.extend(kept)
    return out


def _arrival_requests(
    spec: WorkloadSpec,
    plan: ArrivalPlan,
    builder: PromptBuilder,
    texts: _Texts,
    *,
    index: int,
    base_id: str,
    system: str,
    row: TraceRecord | None,
    prompt_len: IntArray,
    output_len: IntArray,
    think_s: FloatArray,
    seeds: tuple[int, int, int] | None = None,
) -> list[ScheduledRequest]:
    """One arrival's requests: a single request, or the turns of one session.

    ``think_s[t]``: the think time before turn t (its ``think_time_s``; turn 0 is sent at
    its arrival whatever it says).

    ``seeds`` (text stream, answer stream, key) seed its texts; by default the run's
    own streams keyed by ``index``, the arrival's place in ``plan``."""
    sessions = spec.sessions
    text_stream, answer_stream, key = (
        seeds if seeds is not None else (_REQUEST_TEXT, _ANSWER_TEXT, index)
    )
    send_s = float(plan.send_s[index])
    out: list[ScheduledRequest] = []
    context = system  # completions: the text so far
    history: list[Message] = [{"role": "system", "content": system}] if system else []
    history_tokens = _content_tokens(builder, history)  # chat: its contents' tokens
    for turn, (new_tokens, max_tokens) in enumerate(
        zip(prompt_len.tolist(), output_len.tolist(), strict=True)
    ):
        seed = _seed(spec.seed, text_stream, key, turn)
        blocks, used = texts.shared_blocks(row, new_tokens) if turn == 0 else ("", 0)
        prompt: str | None = None
        messages: list[Message] | None = None
        if spec.api is Api.COMPLETIONS:
            prompt = builder.extend(_join(context, blocks), new_tokens - used, seed=seed)
            content_tokens = builder.count(prompt)
            tokens = content_tokens + builder.completion_overhead_tokens  # the BOS it adds
        else:
            user = builder.extend(blocks, new_tokens - used, seed=seed)
            messages = [dict(m) for m in history] + [{"role": "user", "content": user}]
            content_tokens = history_tokens + _content_tokens(builder, messages[-1:])
            tokens = _chat_request_tokens(builder, messages, content_tokens)
        if (
            turn > 0
            and sessions is not None
            and sessions.max_context_tokens is not None
            and tokens + max_tokens > sessions.max_context_tokens
        ):
            break  # the conversation outgrew the context a real client would keep
        warmup = (bool(plan.warmup[index]) and turn == 0) or send_s < plan.measured_start_s
        out.append(
            ScheduledRequest(
                request_id=base_id if sessions is None else f"{base_id}-{turn}",
                send_s=send_s,
                api=spec.api,
                prompt_tokens=tokens,
                max_tokens=max_tokens,
                prompt=prompt,
                messages=messages,
                warmup=warmup,
                session_id=base_id if sessions is not None else None,
                turn=turn,
                follows=f"{base_id}-{turn - 1}" if turn > 0 else None,
                think_time_s=float(think_s[turn]) if sessions is not None else 0.0,
            )
        )
        if sessions is None:
            break
        answer_seed = _seed(spec.seed, answer_stream, key, turn)
        if prompt is not None:
            context = builder.extend(prompt, max_tokens, seed=answer_seed)
        if messages is not None:
            answer = text_of(builder, max_tokens, seed=answer_seed)
            history = [*messages, {"role": "assistant", "content": answer}]
            history_tokens = content_tokens + _content_tokens(builder, history[-1:])
        next_think_s = float(think_s[turn + 1]) if turn + 1 < len(think_s) else 0.0
        send_s += sessions.expected_ttft_s + max_tokens * sessions.expected_tpot_s + next_think_s
        if plan.measured_end_s is not None and send_s >= plan.measured_end_s:
            break
    return out


def _join(prefix: str, text: str) -> str:
    return f"{prefix} {text}" if prefix and text else prefix or text

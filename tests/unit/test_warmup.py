"""The warm-up plan: the workload's own lengths at its quantiles, its prefixes in its share."""

from __future__ import annotations

import ast
import json
import sys
from typing import Any

import numpy as np
import pytest

from tests.programs import top_level_imports
from tuner.errors import ConfigError
from tuner.warmup import QUANTILES, WarmupPlan, warmup_plan, warmup_script
from workloads.build import build_schedule
from workloads.lengths import TraceColumn, sample_lengths, trace_column
from workloads.spec import LengthSpec, WorkloadSpec, load_workload, parse_workload, read_trace_ref

COMPLETIONS = """
name: lengths
api: completions
arrival: {kind: poisson, rate_per_s: 10}
prompt_tokens: {kind: lognormal, median: 400, sigma: 0.8, low: 16, high: 4000}
output_tokens: {kind: uniform, low: 20, high: 300}
seed: 7
"""

CHAT = """
name: tenants
api: chat
arrival: {kind: poisson, rate_per_s: 5}
prompt_tokens: {kind: uniform, low: 50, high: 500}
output_tokens: {kind: fixed, value: 64}
shared_prefix: {system_prompt_tokens: 300, fraction: 0.8}
seed: 3
"""


def spec_of(text: str, **changes: Any) -> WorkloadSpec:
    spec = parse_workload(text, label="test.yaml")
    return spec.model_copy(update=changes) if changes else spec


def quantiles_of(length: LengthSpec) -> list[float]:
    """The distribution's own quantiles (a large sample of it)."""
    values = sample_lengths(length, 200_000, np.random.default_rng(0))
    return [float(q) for q in np.quantile(values, QUANTILES)]


def test_lengths_are_the_workload_quantiles() -> None:
    spec = spec_of(COMPLETIONS)
    plan = warmup_plan(spec, "model")
    assert len(plan.requests) == len(QUANTILES) == 10
    assert plan.api == "completions" and plan.prefixes == []
    prompts = sorted(r.prompt_tokens for r in plan.requests)
    outputs = sorted(r.output_tokens for r in plan.requests)
    assert prompts == pytest.approx(quantiles_of(spec.prompt_tokens), rel=0.15)
    assert outputs == pytest.approx(quantiles_of(spec.output_tokens), rel=0.15)


def test_short_and_long_prompts_alternate_with_outputs_half_a_distribution_away() -> None:
    plan = warmup_plan(spec_of(COMPLETIONS), "model")
    prompts = [r.prompt_tokens for r in plan.requests]
    outputs = sorted(r.output_tokens for r in plan.requests)
    assert prompts[0] == min(prompts) and prompts[1] == max(prompts)  # both in the first two
    assert prompts[:4] == [sorted(prompts)[i] for i in (0, 9, 1, 8)]
    shortest, longest = plan.requests[0], plan.requests[1]
    assert shortest.output_tokens == outputs[5] and longest.output_tokens == outputs[4]


def test_prefixes_are_in_the_workload_fraction() -> None:
    spec = spec_of(CHAT)
    plan = warmup_plan(spec, "model")
    assert plan.api == "chat" and plan.prefixes == [300]
    carried = [r for r in plan.requests if r.prefix is not None]
    assert len(carried) / len(plan.requests) == pytest.approx(0.8)
    # The same requests without the prefix: a prefixed prompt is its own text, the system
    # prompt and that message's role token (the word rule the tuner's schedules follow).
    bare = warmup_plan(spec.model_copy(update={"shared_prefix": None}), "model")
    assert bare.prefixes == [] and all(r.prefix is None for r in bare.requests)
    for with_prefix, without in zip(plan.requests, bare.requests, strict=True):
        extra = 301 if with_prefix.prefix is not None else 0
        assert with_prefix.prompt_tokens == without.prompt_tokens + extra
        assert with_prefix.output_tokens == without.output_tokens == 64
    assert sorted(r.prompt_tokens for r in bare.requests) == pytest.approx(
        [q + 1 for q in quantiles_of(spec.prompt_tokens)],
        rel=0.1,  # + the user message's role
    )


def test_every_tenant_prompt_is_warmed_in_the_workload_fraction() -> None:
    base = spec_of(CHAT)
    assert base.shared_prefix is not None
    shared = base.shared_prefix.model_copy(update={"distinct_prompts": 12, "fraction": 0.5})
    tenants = base.model_copy(update={"shared_prefix": shared})
    plan = warmup_plan(tenants, "model")
    assert plan.prefixes == [300] * 12
    assert len(plan.requests) == 30  # three passes: five prefixed requests each
    assert {r.prefix for r in plan.requests if r.prefix is not None} == set(range(12))
    assert sum(r.prefix is not None for r in plan.requests) == 15
    # No more passes than max_requests can send.
    assert len(warmup_plan(tenants, "model", max_requests=10).requests) == 10


def test_multi_turn_chat_sends_the_history_the_schedule_sends() -> None:
    spec = load_workload("chat")  # 1-6 turns, each carrying the conversation so far
    plan = warmup_plan(spec, "model")
    own = [r.prompt_tokens - (301 if r.prefix is not None else 0) for r in plan.requests]
    bare = spec.model_copy(update={"shared_prefix": None}).with_duration(600)
    sent = [r.prompt_tokens for r in build_schedule(bare)]
    assert np.median(own) == pytest.approx(np.median(sent), rel=0.15)
    assert max(own) == pytest.approx(np.quantile(sent, 0.95), rel=0.2)
    # The history counts: far above the new text of a turn (median 200).
    assert np.median(own) > 1.5 * np.median(quantiles_of(spec.prompt_tokens))
    assert 0.7 <= sum(r.prefix is not None for r in plan.requests) / len(plan.requests) <= 0.9


def test_closed_and_trace_workloads() -> None:
    batch = warmup_plan(load_workload("batch"), "model")  # closed: every request at once
    assert {r.output_tokens for r in batch.requests} == {1000}
    assert all(32 <= r.prompt_tokens <= 2048 for r in batch.requests)
    code = load_workload("code")  # lengths from the trace's own rows
    plan = warmup_plan(code, "model")
    rows = read_trace_ref("builtin:azure-code")
    prompts = trace_column(rows, TraceColumn.PROMPT)
    assert all(prompts.min() <= r.prompt_tokens <= prompts.max() for r in plan.requests)
    own = np.median([r.prompt_tokens for r in plan.requests])
    assert own == pytest.approx(np.median(prompts), rel=0.3)


def test_targets_are_the_ones_given() -> None:
    plan = warmup_plan(
        spec_of(COMPLETIONS), "served", max_requests=7, kv_cache_fill=0.6, concurrency=3
    )
    assert (plan.served_model, plan.max_requests, plan.kv_cache_fill, plan.concurrency) == (
        "served",
        7,
        0.6,
        3,
    )
    assert warmup_plan(spec_of(COMPLETIONS), "served").kv_cache_fill is None


@pytest.mark.parametrize(
    ("changes", "named", "accepted"),
    [
        ({"max_requests": 0}, "max_requests 0", "an integer >= 1"),
        ({"max_requests": 2.5}, "max_requests 2.5", "an integer >= 1"),
        ({"concurrency": -1}, "concurrency -1", "an integer >= 1"),
        ({"kv_cache_fill": 0.0}, "kv_cache_fill 0.0", "a fraction in (0, 1]"),
        ({"kv_cache_fill": 1.5}, "kv_cache_fill 1.5", "a fraction in (0, 1]"),
        ({"kv_cache_fill": float("nan")}, "kv_cache_fill nan", "a fraction in (0, 1]"),
        ({"kv_cache_fill": "full"}, "kv_cache_fill 'full'", "a fraction in (0, 1]"),
    ],
)
def test_bad_values_are_one_config_error(
    changes: dict[str, Any], named: str, accepted: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        warmup_plan(spec_of(COMPLETIONS), "model", **changes)
    message = str(caught.value)
    assert named in message and f"accepted: {accepted}" in message
    assert "\n" not in message


def test_an_empty_served_model_is_one_config_error() -> None:
    with pytest.raises(ConfigError, match="served_model '' is not accepted; accepted: the model"):
        warmup_plan(spec_of(COMPLETIONS), "")


def test_the_script_is_stdlib_only_and_carries_the_plan() -> None:
    odd = 'team\'s "model"\\v1'  # quotes and a backslash survive the embedding
    plan = warmup_plan(spec_of(CHAT), odd, kv_cache_fill=0.5)
    source = warmup_script(plan)
    tree = ast.parse(source)
    imported = top_level_imports(tree)
    assert imported and imported <= sys.stdlib_module_names
    (literal,) = [
        node.value.args[0]
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id == "PLAN"
        and isinstance(node.value, ast.Call)
    ]
    assert isinstance(literal, ast.Constant)
    embedded = WarmupPlan.model_validate(json.loads(literal.value))
    assert embedded == plan and embedded.served_model == odd
    compile(source, "warmup.py", "exec")

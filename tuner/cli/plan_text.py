"""Plain-text rendering of a MemoryPlan and a sweep, for the terminal."""

from __future__ import annotations

from tuner.vllm.gpus import GiB
from tuner.vllm.memory import MemoryPlan
from tuner.vllm.startup_edge import SweepResult


def _gib(value: int) -> str:
    return f"{value / GiB:8.2f} GiB"


def _prediction(p: MemoryPlan) -> str:
    cal = p.calibration
    if cal is None:
        return "uncalibrated estimate"
    parts = [f"calibrated from {cal.source}"]
    for label, components in (
        ("measured", cal.measured),
        ("derived", cal.derived),
        ("estimated", cal.estimated),
    ):
        if components:
            parts.append(f"{label}: {', '.join(c.value for c in components)}")
    return "; ".join(parts)


def format_plan(p: MemoryPlan) -> str:
    status = "starts" if p.fits else f"FAILS ({p.failure.kind.value})" if p.failure else "FAILS"
    graphs_note = "" if p.cudagraph_bytes == 0 else "  (outside the KV budget before 0.20)"
    lines = [
        f"model            {p.model}",
        f"gpu              {p.gpu}   vLLM {p.vllm_version}   tensor-parallel {p.tensor_parallel_size}",
        f"settings         max-model-len {p.max_model_len}  max-num-seqs {p.max_num_seqs}  "
        f"max-num-batched-tokens {p.max_num_batched_tokens}  block-size {p.block_size}  "
        f"kv-cache-dtype {p.kv_cache_dtype}",
        f"prediction       {_prediction(p)}",
        f"boot             {p.boot_state.describe()}",
        "",
        f"  device total        {_gib(p.total_bytes)}",
        f"  requested budget    {_gib(p.requested_bytes)}",
        f"  weights (per rank)  {_gib(p.weights_bytes)}",
        f"  peak activation     {_gib(p.activation_bytes)}{_compile_note(p)}",
        f"  non-torch           {_gib(p.non_torch_bytes)}",
        f"  CUDA graphs         {_gib(p.cudagraph_bytes)}{graphs_note}",
        f"  KV cache            {_gib(p.kv_cache_bytes)}",
        "",
        f"  KV cache blocks     {p.num_gpu_blocks:,}  ({p.page_size_bytes:,} bytes per layer per block,"
        f" {p.num_kv_cache_groups} group(s))",
        f"  KV cache tokens     {p.kv_cache_tokens:,}",
        f"  max concurrency     {p.max_concurrency:.2f}x at {p.max_model_len:,} tokens per request",
        "",
        f"result           {status}",
    ]
    if p.failure is not None:
        lines.append(f"vLLM would say    {p.failure.error_type}: {p.failure.message}")
    return "\n".join(lines)


def _compile_note(p: MemoryPlan) -> str:
    if p.compile_bytes <= 0:
        return ""
    return f"  (of which torch.compile's, cold: {_gib(p.compile_bytes)})"


def format_sweep(result: SweepResult) -> str:
    lines = [
        f"{'--' + result.knob.value:>26}  {'starts':>6}  {'KV tokens':>12}  {'concurrency':>11}  failure"
    ]
    for point in result.points:
        mark = " <- edge" if point.value in (result.edge, result.upper_edge) else ""
        lines.append(
            f"{point.value:>26g}  {'yes' if point.fits else 'no':>6}  {point.kv_cache_tokens:>12,}  "
            f"{point.max_concurrency:>10.2f}x  {point.failure_kind or ''}{mark}"
        )
    lines.append("")
    lines.append(result.note)
    return "\n".join(lines)

"""Plain-text rendering of a simulation result."""

from __future__ import annotations

from tuner.sim.cpu_tier import CpuTier, TransferType
from tuner.sim.simulate import FailedRequests, SimulationResult
from workloads.load_result import Percentiles


def _ms(value: float | None) -> str:
    return f"{value:9.1f}" if value is not None else f"{'-':>9}"


def _row(name: str, p: Percentiles) -> str:
    return f"  {name:<6} p50 {_ms(p.p50)}   p90 {_ms(p.p90)}   p99 {_ms(p.p99)}  ms"


def _failed(f: FailedRequests) -> str:
    """Why some requests failed: what the server answers the first of them."""
    answer = f"vLLM answers {f.http_status}: " if f.http_status is not None else ""
    return f"    {f.count} failed ({f.reason.value.replace('_', ' ')}): {answer}{f.message}"


def format_result(title: str, r: SimulationResult) -> str:
    lines = [
        title,
        f"  requests          {r.num_finished} finished, {r.num_failed} failed, of {r.num_requests}",
        *(_failed(f) for f in r.failures),
        f"  duration          {r.duration_s:.1f} s (simulated), {r.engine_steps} engine steps",
        f"  throughput        {r.request_throughput:.2f} req/s, {r.output_token_throughput:.0f} output tok/s",
        f"  goodput at SLO    {r.goodput:.2f} req/s",
        _row("TTFT", r.ttft_ms),
        _row("ITL", r.itl_ms),
        _row("TPOT", r.tpot_ms),
        _row("e2e", r.e2e_ms),
        f"  preemptions       {r.num_preemptions}",
        f"  peak KV usage     {r.peak_kv_cache_usage:.1%}",
        f"  prefix hit rate   {r.prefix_cache_hit_rate:.1%}",
    ]
    if r.engine_died:
        lines.append(f"  ENGINE DIED       {r.engine_died}")
    return "\n".join(lines)


def format_cpu_tier(tier: CpuTier) -> str:
    """The CPU tier's share of a simulation (``--kv-offloading-size``)."""
    loads = tier.transfers[TransferType.LOAD]
    stores = tier.transfers[TransferType.STORE]
    gib = float(1 << 30)
    return "\n".join(
        [
            f"  CPU tier          {tier.config.num_blocks} blocks ({tier.config.policy.value}), "
            f"{tier.usage:.1%} used, {tier.evictions} evicted",
            f"  CPU hits          {tier.external_hits_tokens} tokens loaded instead of "
            f"recomputed ({loads.bytes / gib:.2f} GiB in {loads.time_s:.2f} s)",
            f"  stored to CPU     {stores.bytes / gib:.2f} GiB in {stores.time_s:.2f} s"
            + (f", {tier.stores_skipped} blocks below store_threshold" if tier.counts else ""),
        ]
    )

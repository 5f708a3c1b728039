"""The twin's time to first token on a CPU hit against vLLM's published offloading figures.

vLLM's post on its offloading connector ("Inside vLLM's New KV Offloading Connector:
Smarter Memory Transfer for Maximizing Inference Throughput", January 2026,
https://blog.vllm.ai/2026/01/08/kv-offloading-connector.html) measured Llama-3.1-8B on
an H100 and reports 2-22x lower TTFT when a prompt's KV cache is loaded from CPU memory
instead of recomputed. For each prefix length this runs the simulated engine (the
twin's, with its default step costs) on Llama-3.1-8B on a virtual H100 with a CPU tier:

* ``recompute``: the prompt's first run, nothing cached;
* ``gpu hit``: the same prompt again while its blocks are still on the GPU;
* ``cpu hit``: the same prompt after another as long evicted it from a GPU cache of one
  prompt: every block but the last comes back from host memory over the H100's host
  link (PCIe Gen5 x16, ``GpuSpec.pcie_bandwidth_bytes_per_s``), the last is computed.

It prints the three TTFTs and the speedup (recompute / cpu hit) per length, and the
twin's range of speedups against the published 2-22x. The published range is over the
post's prompt lengths, which the summaries read here do not list per length, so the
comparison is of the ranges' ends, and the lengths here are the range a chat or agent
prompt spans (512 to 64K tokens).

Run: ``python benchmarks/offload_ttft.py`` (seconds); ``--json`` prints the rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

from tuner.sim.build import SimOptions, build_engine
from tuner.sim.cpu_tier import TransferType
from tuner.sim.engine import SimEngine, SimRequest
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion

PUBLISHED_SPEEDUP = (2.0, 22.0)  # vLLM's post: TTFT recompute / CPU hit, Llama-3.1-8B, H100
PREFIX_TOKENS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
OFFLOAD_GIB = 32.0


@dataclass(frozen=True)
class Row:
    prefix_tokens: int
    recompute_ms: float
    gpu_hit_ms: float
    cpu_hit_ms: float
    loaded_gib: float

    @property
    def speedup(self) -> float:
        return self.recompute_ms / self.cpu_hit_ms


def _ttft_s(engine: SimEngine, request_id: str, tokens: list[int], start_s: float) -> float:
    request = SimRequest(request_id, tokens, max_tokens=1, arrival_s=start_s)
    engine.add_request(request)
    now = start_s
    while engine.has_work:
        now += engine.step(now).duration_s
    assert request.first_token_s is not None
    return request.first_token_s - start_s


def measure(prefix_tokens: int) -> Row:
    model = resolve_model("llama-3.1-8b")
    gpu = get_gpu("H100-80GB")
    length = prefix_tokens + 16
    bytes_per_token = 2 * model.num_kv_heads * model.head_dim * 2 * model.num_layers
    params = ServingParams(
        max_model_len=length, kv_cache_memory_bytes=(length + 32) * bytes_per_token
    )
    plan, engine = build_engine(
        model, gpu, params, VllmVersion.current(), SimOptions(kv_offloading_size_gib=OFFLOAD_GIB)
    )
    assert engine is not None and engine.cpu_tier is not None, plan.failure
    first = [(7 * i) % 100_000 + 1 for i in range(prefix_tokens)]
    other = [(11 * i) % 100_000 + 2 for i in range(prefix_tokens)]
    recompute = _ttft_s(engine, "a", [*first, 5], 0.0)
    gpu_hit = _ttft_s(engine, "b", [*first, 6], 100.0)
    _ttft_s(engine, "c", [*other, 7], 200.0)  # evicts the first prompt from the GPU
    cpu_hit = _ttft_s(engine, "d", [*first, 8], 300.0)
    loaded = engine.cpu_tier.transfers[TransferType.LOAD].bytes / float(1 << 30)
    return Row(prefix_tokens, 1e3 * recompute, 1e3 * gpu_hit, 1e3 * cpu_hit, loaded)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    rows = [measure(n) for n in PREFIX_TOKENS]
    if args.json:
        print(json.dumps([{**asdict(r), "speedup": r.speedup} for r in rows], indent=2))
        return 0
    print(
        f"{'prefix':>7} {'recompute':>10} {'gpu hit':>8} {'cpu hit':>8} {'loaded':>8} {'speedup':>8}"
    )
    for r in rows:
        print(
            f"{r.prefix_tokens:>7} {r.recompute_ms:>8.1f}ms {r.gpu_hit_ms:>6.1f}ms "
            f"{r.cpu_hit_ms:>6.1f}ms {r.loaded_gib:>6.2f}GiB {r.speedup:>7.1f}x"
        )
    low, high = min(r.speedup for r in rows), max(r.speedup for r in rows)
    published_low, published_high = PUBLISHED_SPEEDUP
    print(
        f"twin: {low:.1f}x to {high:.1f}x lower TTFT on a CPU hit; published {published_low:g}x "
        f"to {published_high:g}x; error at the ends {100 * (low / published_low - 1):+.0f}% "
        f"and {100 * (high / published_high - 1):+.0f}%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

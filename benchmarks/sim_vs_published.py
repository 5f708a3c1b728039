"""The simulator's throughput against published vLLM results for a preset model and GPU.

Published figure: Red Hat's MLPerf Inference v5.1 submission, Llama-3.1-8B-Instruct
with FP8 weights on vLLM 0.10.0, Offline scenario: 5777 output tokens/s on one
H100 and 1642 on one L40S (Red Hat Developer blog, "Efficient and reproducible LLM
inference: Red Hat MLPerf Inference v5.1 results", 2025).

Workload as simulated (an assumption, stated because the blog does not give it):
MLPerf's CNN/DailyMail summarisation set, about 778 prompt tokens and 73 output
tokens per request on average; Offline means every request is queued at once.
Run: ``python benchmarks/sim_vs_published.py``.
"""

from __future__ import annotations

import random

from tuner.sim.build import build_engine
from tuner.sim.simulate import run
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import Quantization, resolve_model
from tuner.vllm.versions import VllmVersion
from workloads.slo import Slo
from workloads.traces import TraceRecord

PUBLISHED = {"H100-80GB": 5777.0, "L40S-48GB": 1642.0}
PROMPT_MEAN, OUTPUT_MEAN, REQUESTS = 778, 73, 3000

DEFAULT_SLO = Slo.p99(ttft_ms=2000.0, tpot_ms=100.0)  # the simulator's own defaults (2 s, 100 ms)


def offline_records(seed: int = 0) -> list[TraceRecord]:
    rng = random.Random(seed)
    return [
        TraceRecord(
            arrival_s=0.0,
            prompt_tokens=max(16, int(rng.lognormvariate(0, 0.4) * PROMPT_MEAN / 1.08)),
            output_tokens=max(1, min(128, int(rng.lognormvariate(0, 0.4) * OUTPUT_MEAN / 1.08))),
        )
        for _ in range(REQUESTS)
    ]


def main() -> None:
    model = resolve_model("llama-3.1-8b").model_copy(update={"quantization": Quantization.FP8})
    print(f"{'GPU':<12} {'published tok/s':>16} {'simulated tok/s':>16} {'error':>8}")
    for gpu_name, published in PUBLISHED.items():
        startup, engine = build_engine(
            model, get_gpu(gpu_name), ServingParams(max_model_len=2668), VllmVersion.parse("0.10.0")
        )
        assert engine is not None, startup.failure
        result = run(
            engine, offline_records(), slo=DEFAULT_SLO, vocab=model.vocab_size, max_model_len=2668
        )
        simulated = result.output_token_throughput
        print(
            f"{gpu_name:<12} {published:>16.0f} {simulated:>16.0f} {simulated / published - 1:>+8.1%}"
        )


if __name__ == "__main__":
    main()

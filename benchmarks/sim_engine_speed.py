"""How fast the simulated engine runs on a virtual clock (issue: "a one-minute workload on an
H100 profile must simulate in well under a minute on one core").

Runs a one-minute Poisson workload (Llama-3.1-8B on H100-80GB, 20 req/s, 1000 prompt and
200 output tokens) through ``tuner.sim.simulate.run`` and prints wall time, simulated
time, engine steps per second and token events per second. Also replays the first
2000 requests of the Azure code trace if ../shared/traces is present.
Run: ``python benchmarks/sim_engine_speed.py`` (``make bench`` runs it too).
"""

from __future__ import annotations

import time
from pathlib import Path

from tuner.sim.build import build_engine
from tuner.sim.simulate import run, synthetic_arrivals
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion
from workloads.metrics import Slo
from workloads.traces import TraceRecord, read_trace

AZURE = (
    Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure-llm-inference-2023-code.csv"
)

DEFAULT_SLO = Slo(ttft_ms=2000.0, tpot_ms=100.0)  # the simulator's own defaults (2 s, 100 ms)


def measure(label: str, records: list[TraceRecord]) -> None:
    model = resolve_model("llama-3.1-8b")
    startup, engine = build_engine(
        model, get_gpu("H100-80GB"), ServingParams(max_model_len=16384), VllmVersion.current()
    )
    assert engine is not None, startup.failure
    t0 = time.perf_counter()
    result = run(
        engine,
        records,
        slo=DEFAULT_SLO,
        vocab=model.vocab_size,
        max_model_len=startup.max_model_len,
    )
    wall = time.perf_counter() - t0
    tokens = engine.generation_tokens_total
    print(
        f"{label:<34} simulated {result.duration_s:7.1f} s in {wall:5.2f} s wall "
        f"({result.duration_s / wall:6.1f}x real time); {result.engine_steps / wall:8.0f} steps/s, "
        f"{tokens / wall:9.0f} token events/s; {result.num_finished} requests"
    )


def main() -> None:
    measure(
        "poisson 20 req/s, 60 s, 1000->200",
        synthetic_arrivals(rate_per_s=20, duration_s=60, prompt_tokens=1000, output_tokens=200),
    )
    if AZURE.exists():
        measure("azure code trace, first 2000 req", read_trace(AZURE)[:2000])


if __name__ == "__main__":
    main()

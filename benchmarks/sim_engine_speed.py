"""How fast the simulated engine runs on a virtual clock (issue: "a one-minute workload on an
H100 profile must simulate in well under a minute on one core"; then: ten minutes of ``chat``
at its steady state, the reference run of a rate search, in at most 6 s, 100x real time).

Runs, through ``tuner.sim.simulate.run`` (Llama-3.1-8B on H100-80GB, vLLM's defaults):

* a one-minute Poisson workload (20 req/s, 1000 prompt and 200 output tokens);
* the first 2000 requests of the Azure code trace, if ../shared/traces is present;
* ten virtual minutes of ``chat`` at 5.75 conversations/s, as the steady-state search
  runs it (``tuner.twin.prediction.steady_run``: schedule, tokenization, engine, summary;
  about 12,000 requests, 9,000 engine steps, 2.9 million tokens);

and prints wall time, simulated time, its ratio to real time, engine steps per second
and token events per second. ``--step-by-step``: the engine's own step, one at a time,
every token written as it is made (``run(step_by_step=True)``, as ``tuner sim-serve``
steps it) instead of the deferred decodes of ``tuner.sim.deferred``.
Run: ``python benchmarks/sim_engine_speed.py`` (``make bench`` runs it too).

Measured on the 2-core development VM, one core, best of three interleaved rounds (the
VM's speed drifts by up to 40 % from one minute to the next, so compare within a column
set, not with figures taken at another time):

==================================  ===================  ==================  ==================
case                                before (step by      step by step, now   deferred (default)
                                    step, original)
==================================  ===================  ==================  ==================
poisson 20 req/s, 60 s, 1000->200   1.63 s (38x real)    1.40 s (45x)        0.62 s (101x)
azure code trace, first 2000 req    2.18 s (391x)        1.90 s (450x)       1.60 s (534x)
chat 5.75/s, 600 s steady_run       20.0 s (30x)         18.2 s (33x)        6.1 s (98x)
==================================  ===================  ==================  ==================

In the VM's fastest minutes the chat run took 17.8 s before and 5.3 s (113x) deferred; in
its slowest, 26 s and 7.6 s. Of the deferred chat run's time, about 30 % is building the
schedule (``workloads.build``), 15 % tokenizing it, and the rest the engine and summary
(a quarter of what the engine took step by step). "step by step, now" keeps the
changes both paths share: the block pool's bulk operations, per-message tokenization of
a conversation's history, the summary's inter-token gaps in numpy, the cyclic garbage
collector paused during a simulation. Both paths give the same run, bit for bit
(``tests/unit/test_sim_fast_path.py``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tuner.sim.build import build_engine
from tuner.sim.engine import SimEngine
from tuner.sim.simulate import SimulationResult, run, synthetic_arrivals
from tuner.twin import prediction as predict
from tuner.twin.prediction import Setup, steady_run
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion
from workloads.slo import Slo
from workloads.spec import load_workload
from workloads.traces import TraceRecord, read_trace

AZURE = (
    Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure-llm-inference-2023-code.csv"
)

DEFAULT_SLO = Slo.p99(ttft_ms=2000.0, tpot_ms=100.0)  # the simulator's own defaults (2 s, 100 ms)
CHAT_RATE = 5.75  # conversations/s: near what llama-3.1-8b on an H100 sustains
CHAT_WINDOW_S = 600.0


def report(label: str, virtual_s: float, wall: float, steps: int, tokens: int, done: int) -> None:
    print(
        f"{label:<34} simulated {virtual_s:7.1f} s in {wall:5.2f} s wall "
        f"({virtual_s / wall:6.1f}x real time); {steps / wall:8.0f} steps/s, "
        f"{tokens / wall:9.0f} token events/s; {done} requests"
    )


def measure(label: str, records: list[TraceRecord], step_by_step: bool) -> None:
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
        step_by_step=step_by_step,
    )
    wall = time.perf_counter() - t0
    tokens = engine.generation_tokens_total
    report(label, result.duration_s, wall, result.engine_steps, tokens, result.num_finished)


@contextmanager
def engine_runs() -> Iterator[list[SimEngine]]:
    """The engines of ``tuner.twin.prediction``'s calls of ``run`` (for the tokens they made)."""
    plain = predict.run
    engines: list[SimEngine] = []

    def recording(engine: SimEngine, *args: Any, **kwargs: Any) -> SimulationResult:
        engines.append(engine)
        return plain(engine, *args, **kwargs)

    predict.run = recording
    try:
        yield engines
    finally:
        predict.run = plain


def measure_chat(step_by_step: bool) -> None:
    """Ten virtual minutes of chat from its steady state, as ``steady_run`` simulates them."""
    setup = Setup(
        resolve_model("llama-3.1-8b"), get_gpu("H100-80GB"), VllmVersion.current(), ServingParams()
    )
    spec = load_workload("chat")
    with engine_runs() as engines:
        t0 = time.perf_counter()
        prediction = steady_run(
            setup, spec, CHAT_RATE, warmup_s=0.0, window_s=CHAT_WINDOW_S, step_by_step=step_by_step
        )
        wall = time.perf_counter() - t0
    result = prediction.result
    assert result is not None
    tokens = engines[0].generation_tokens_total
    label = f"chat {CHAT_RATE}/s, {CHAT_WINDOW_S:.0f} s steady_run"
    report(label, result.duration_s, wall, result.engine_steps, tokens, result.num_finished)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-by-step", action="store_true", help="the engine's own step")
    args = parser.parse_args()
    measure(
        "poisson 20 req/s, 60 s, 1000->200",
        synthetic_arrivals(rate_per_s=20, duration_s=60, prompt_tokens=1000, output_tokens=200),
        args.step_by_step,
    )
    if AZURE.exists():
        measure("azure code trace, first 2000 req", read_trace(AZURE)[:2000], args.step_by_step)
    measure_chat(args.step_by_step)


if __name__ == "__main__":
    main()

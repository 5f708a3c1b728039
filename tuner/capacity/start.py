"""Where an option's goodput search starts: a little under its goodput as estimated from
the options of the plan already screened, so that the bracket closes in few twin runs.

The estimate only places the search; the goodput is still bracketed on the twin to the
screen's precision (``tuner.capacity.option``). The estimate:

* the same GPU type at another tensor-parallel size: its goodput, times the ratio
  between the two sizes on the screened GPU type nearest on paper (``paper_ratio``),
  else ``(k / k0) ** TP_EXPONENT``;
* another GPU type: the one nearest on paper (at the same size where one was screened
  there), times the paper ratio of the two, times the size ratio;
* nothing screened yet: the workload's own rate, not an estimate.

The search starts ``UNDERSHOOT`` under the estimate: its first run is planned with the
workload's expected answer times (no run of its own has held yet), and near capacity a
chat server is bistable (``tuner.twin.prediction.reference_rate``): planned so, a rate
above the goodput breaks where the server's own population might hold, and the search
then walks down on that pessimistic plan. A first run that holds plans the next ones
with the server's own answer times, as a search from below does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.vllm.gpus import GpuSpec

# Goodput against tensor-parallel size where no GPU type was screened at both sizes:
# x1.6 to x1.9 per doubling for llama-3.1-8b and -70b chat on H100, H200 and B200.
TP_EXPONENT = 0.8
UNDERSHOOT = 1.25  # the search starts at the estimate / this (one step of the search)


@dataclass(frozen=True)
class ScreenedRate:
    """One screened option's goodput (the workload's unit per second)."""

    gpu: GpuSpec
    tensor_parallel_size: int
    rate_per_s: float


@dataclass(frozen=True)
class Start:
    """Where a search starts, and whether that is scaled from screened options."""

    rate_per_s: float
    estimated: bool


def paper_ratio(gpu: GpuSpec, other: GpuSpec) -> float:
    """How much more ``gpu`` serves than ``other`` on paper: the ratio of their dense bf16
    compute (on the twin's paper costs a chat screen's goodput followed it within 10 % for
    llama-3.1-8b from A100 to H100 and B200; HBM bandwidth missed by 40 %)."""
    return gpu.bf16_dense_flops / other.bf16_dense_flops


def size_ratio(done: list[ScreenedRate], gpu: GpuSpec, from_size: int, to_size: int) -> float:
    """Goodput at ``to_size`` over goodput at ``from_size`` for ``gpu``: as screened on the
    other GPU type nearest to it on paper that has both, else by ``TP_EXPONENT``."""
    if from_size == to_size:
        return 1.0
    by_gpu: dict[str, dict[int, ScreenedRate]] = {}
    for d in done:
        if d.gpu.name != gpu.name:
            by_gpu.setdefault(d.gpu.name, {})[d.tensor_parallel_size] = d
    both = [(r[from_size], r[to_size]) for r in by_gpu.values() if from_size in r and to_size in r]
    if not both:
        return float((to_size / from_size) ** TP_EXPONENT)
    low, high = min(both, key=lambda pair: abs(math.log(paper_ratio(gpu, pair[0].gpu))))
    return high.rate_per_s / low.rate_per_s


def estimate(done: list[ScreenedRate], gpu: GpuSpec, tensor_parallel_size: int) -> float | None:
    """The goodput of ``gpu`` at ``tensor_parallel_size`` (the module's docstring); None
    with nothing screened."""
    tp = tensor_parallel_size
    same = [d for d in done if d.gpu.name == gpu.name]
    if same:
        near = min(same, key=lambda d: abs(math.log(d.tensor_parallel_size / tp)))
        return near.rate_per_s * size_ratio(done, gpu, near.tensor_parallel_size, tp)
    if not done:
        return None
    at_size = [d for d in done if d.tensor_parallel_size == tp] or done
    near = min(at_size, key=lambda d: abs(math.log(paper_ratio(gpu, d.gpu))))
    scaled = near.rate_per_s * paper_ratio(gpu, near.gpu)
    return scaled * size_ratio(done, near.gpu, near.tensor_parallel_size, tp)


def start_for(
    done: list[ScreenedRate], gpu: GpuSpec, tensor_parallel_size: int, default: float
) -> Start:
    """Where the search of ``gpu`` at ``tensor_parallel_size`` starts: ``UNDERSHOOT``
    under its estimate; ``default`` (not an estimate) with nothing screened."""
    rate = estimate(done, gpu, tensor_parallel_size)
    if rate is None:
        return Start(default, estimated=False)
    return Start(rate / UNDERSHOOT, estimated=True)

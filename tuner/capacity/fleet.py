"""A fleet for a peak: replicas, GPUs, cost, and the options ranked. Arithmetic only.

One option is a GPU type and a tensor-parallel size with its memory settings; one
replica of it is one vLLM server over ``tensor_parallel_size`` GPUs. For a peak of
``P`` (in the workload's unit) at a goodput of ``g`` per replica with a headroom
``h`` (the share of each replica kept free for bursts and failures):

    replicas = ceil(P / (g x (1 - h)))
    GPUs     = replicas x tensor_parallel_size
    USD/hour = GPUs x the GPU's price per hour
    USD per million output tokens = USD/hour / (output tokens/s at the peak x 3600) x 1e6

The output tokens/s at the peak is the peak times the output tokens one unit of the
workload makes (a conversation's answers, or a request's), measured or predicted at
the goodput. Each figure is given twice: at the goodput the twin predicts (or a run
measured) and at the low end of its range, and the options are ranked on the low
end: a plan holds the peak even if the prediction is as far off as the twin has been
measured to be, so a measured option is not outbid by a guess.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from tuner.errors import ConfigError

SECONDS_PER_HOUR = 3600.0
TOKENS_PER_MILLION = 1e6


class FleetSize(BaseModel):
    """Replicas and GPUs for a peak at one goodput per replica, and what they cost."""

    model_config = ConfigDict(frozen=True)

    replicas: int
    gpus: int
    usd_per_hour: float | None  # None: no price given for the GPU
    usd_per_million_output_tokens: float | None


def replicas_for(peak: float, goodput_per_replica: float, headroom: float) -> int:
    """``ceil(peak / (goodput x (1 - headroom)))``, at least 1."""
    if peak <= 0 or goodput_per_replica <= 0:
        raise ValueError("a fleet needs a positive peak and goodput")
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom {headroom} is outside [0, 1)")
    usable = goodput_per_replica * (1.0 - headroom)
    # A ratio a hair above an integer from rounding (3.0000000001) is that integer.
    return max(1, math.ceil(peak / usable - 1e-9))


def fleet_size(
    *,
    peak: float,
    goodput_per_replica: float,
    headroom: float,
    tensor_parallel_size: int,
    usd_per_gpu_hour: float | None,
    output_tokens_per_unit: float,
) -> FleetSize:
    """The fleet for ``peak`` (module docstring). ``output_tokens_per_unit``: output tokens
    one unit of the peak makes (per conversation, or per request)."""
    replicas = replicas_for(peak, goodput_per_replica, headroom)
    gpus = replicas * tensor_parallel_size
    usd_per_hour = gpus * usd_per_gpu_hour if usd_per_gpu_hour is not None else None
    tokens_per_hour = peak * output_tokens_per_unit * SECONDS_PER_HOUR
    per_million = (
        usd_per_hour / tokens_per_hour * TOKENS_PER_MILLION
        if usd_per_hour is not None and tokens_per_hour > 0
        else None
    )
    return FleetSize(
        replicas=replicas, gpus=gpus, usd_per_hour=usd_per_hour,
        usd_per_million_output_tokens=per_million,
    )  # fmt: skip


def parse_prices(texts: Sequence[str], canonical: dict[str, str]) -> dict[str, float]:
    """``--price GPU=USD_PER_HOUR`` values by the GPU's canonical name. ``canonical``: every
    name or alias the plan accepts (lower case) -> the canonical name of a GPU in the plan.
    ConfigError naming the first bad value."""
    prices: dict[str, float] = {}
    planned = sorted(set(canonical.values()))
    for text in texts:
        name, sep, raw = text.partition("=")
        try:
            usd = float(raw) if sep else math.nan
        except ValueError:
            usd = math.nan
        if not math.isfinite(usd) or usd < 0:
            raise ConfigError(
                f"--price {text!r} is not accepted; accepted: GPU=USD_PER_HOUR, a price of 0 "
                "or more per GPU per hour (e.g. H100-80GB=2.49)"
            )
        gpu = canonical.get(name.strip().lower().replace("_", "-"))
        if gpu is None:
            raise ConfigError(
                f"--price {text!r} names a GPU that is not in the plan; accepted: "
                + ", ".join(planned)
            )
        prices[gpu] = usd
    if prices and len(prices) < len(planned):
        missing = [g for g in planned if g not in prices]
        raise ConfigError(
            f"no --price for {', '.join(missing)}; accepted: a price for every GPU in the plan "
            f"({', '.join(planned)}) or for none (then options rank by GPUs, not cost)"
        )
    return prices


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """The indexes of the points no other point beats on both axes (both larger is better):
    output tokens/s per GPU against output tokens/s per user. Ties keep both."""
    front: list[int] = []
    for i, (x, y) in enumerate(points):
        dominated = any(
            (ox >= x and oy >= y) and (ox > x or oy > y)
            for j, (ox, oy) in enumerate(points)
            if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])

"""Where the startup edge lies along one knob, found on the memory model alone.

``tuner plan --sweep KNOB`` answers questions such as "what is the lowest
gpu-memory-utilization that starts?" or "what is the largest max-model-len that
fits?" without launching anything. The edge is found by bisection to the knob's
resolution; a coarse table of points shows the trend around it.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from tuner.errors import ConfigError
from tuner.vllm.boot import BootState
from tuner.vllm.gpus import GpuSpec
from tuner.vllm.memory import Calibration, MemoryPlan, ServingParams, plan
from tuner.vllm.models import ModelSpec
from tuner.vllm.versions import VllmVersion


class SweepKnob(StrEnum):
    GPU_MEMORY_UTILIZATION = "gpu-memory-utilization"
    MAX_MODEL_LEN = "max-model-len"
    MAX_NUM_SEQS = "max-num-seqs"
    MAX_NUM_BATCHED_TOKENS = "max-num-batched-tokens"

    @classmethod
    def parse(cls, text: str) -> SweepKnob:
        name = text.strip().lstrip("-").replace("_", "-")
        for knob in cls:
            if knob.value == name:
                return knob
        raise ConfigError(
            f"--sweep {text!r} is not a knob that can be swept; accepted: "
            + ", ".join(k.value for k in cls)
        )

    @property
    def field(self) -> str:
        return self.value.replace("-", "_")

    @property
    def edge_is_lowest(self) -> bool:
        """Utilization has a lower edge (too little fails); the others an upper one."""
        return self is SweepKnob.GPU_MEMORY_UTILIZATION


class SweepPoint(BaseModel):
    model_config = ConfigDict(frozen=True)

    value: float
    fits: bool
    failure_kind: str | None
    kv_cache_tokens: int
    max_concurrency: float


class SweepResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    knob: SweepKnob
    edge: float | None
    # Utilization also has an upper edge: too much leaves no room for CUDA graphs.
    upper_edge: float | None = None
    edge_plan: MemoryPlan | None
    points: list[SweepPoint]
    note: str


def _range(knob: SweepKnob, model: ModelSpec) -> tuple[float, float, float]:
    """(low, high, resolution) searched for each knob."""
    if knob is SweepKnob.GPU_MEMORY_UTILIZATION:
        return 0.01, 1.0, 0.01
    if knob is SweepKnob.MAX_MODEL_LEN:
        return 1, model.max_position_embeddings, 1
    if knob is SweepKnob.MAX_NUM_SEQS:
        return 1, 65536, 1
    return 1, 1 << 20, 1


def sweep(
    model: ModelSpec,
    gpu: GpuSpec,
    params: ServingParams,
    knob: SweepKnob,
    version: VllmVersion | None = None,
    calibration: Calibration | None = None,
    points: int = 12,
    *,
    boot: BootState = BootState.WARM,
) -> SweepResult:
    """Find the knob's startup edge, with the other settings held as given, on a ``boot``
    with the compile cache warm or cold (``tuner.vllm.boot``)."""
    low, high, step = _range(knob, model)
    is_int = step >= 1

    def at(value: float) -> MemoryPlan:
        v: float | int = int(value) if is_int else round(value, 2)
        update: dict[str, float | int] = {knob.field: v}
        if knob is SweepKnob.MAX_NUM_SEQS and params.max_num_batched_tokens is None:
            # Keep vLLM's rule max_num_batched_tokens >= max_num_seqs out of the way.
            default_tokens = plan(model, gpu, params, version, calibration).max_num_batched_tokens
            update["max_num_batched_tokens"] = max(int(v), default_tokens)
        return plan(model, gpu, params.model_copy(update=update), version, calibration, boot=boot)

    upper: float | None = None
    if knob.edge_is_lowest:
        # Utilization fails at both ends; a scan at the resolution finds both edges.
        grid = [round(low + i * step, 6) for i in range(round((high - low) / step) + 1)]
        starting = [v for v in grid if at(v).fits]
        edge = starting[0] if starting else None
        upper = starting[-1] if starting else None
    else:
        edge = _bisect(at, low, high, step)
    edge_plan = at(edge) if edge is not None else None
    samples = _sample_values(low, high, edge, points, is_int)
    if upper is not None:
        samples = sorted({*samples, upper, min(high, round(upper + step, 6))})
    rows = [
        SweepPoint(
            value=v,
            fits=p.fits,
            failure_kind=p.failure.kind.value if p.failure else None,
            kv_cache_tokens=p.kv_cache_tokens,
            max_concurrency=p.max_concurrency,
        )
        for v, p in ((v, at(v)) for v in samples)
    ]
    if edge is None:
        note = f"no value of --{knob.value} in [{low}, {high}] starts with the other settings"
    elif knob.edge_is_lowest:
        note = f"lowest --{knob.value} that starts: {edge:g}; highest: {upper:g}"
    else:
        note = f"largest --{knob.value} that starts: {edge:g}"
    return SweepResult(
        knob=knob, edge=edge, upper_edge=upper, edge_plan=edge_plan, points=rows, note=note
    )


def _bisect(
    fits_at: Callable[[float], MemoryPlan], low: float, high: float, step: float
) -> float | None:
    """The largest value that starts, to the step's resolution (starting is monotone)."""
    n = round((high - low) / step)

    def ok(i: int) -> bool:
        return fits_at(low + i * step).fits

    if not ok(0):
        return None
    lo, hi = 0, n
    if ok(hi):
        return high
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return round(low + lo * step, 6)


def _sample_values(
    low: float, high: float, edge: float | None, points: int, is_int: bool
) -> list[float]:
    span_low, span_high = low, high
    if edge is not None:
        # Centre the table on the edge: half its width either side.
        width = max((high - low) / 4, 1 if is_int else 0.05)
        span_low, span_high = max(low, edge - width), min(high, edge + width)
    values = {span_low + (span_high - span_low) * i / (points - 1) for i in range(points)}
    if edge is not None:
        values.add(edge)
    out = sorted({int(v) if is_int else round(v, 2) for v in values})
    return [float(v) for v in out]

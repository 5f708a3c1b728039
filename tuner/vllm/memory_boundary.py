"""The memory model's boundary over the map a run's report draws: for each KV-cache dtype
and each ``--max-num-seqs`` of a grid, the lowest and the highest
``--gpu-memory-utilization`` (0.01 apart) at which vLLM is predicted to start, and the
lowest on a cold boot (an empty compile cache, ``tuner.vllm.boot``).

The tune computes it once it has measured (with the calibration its first startup
gave the memory model, and the other settings of its best trial held) and records it in
the run (``memory_boundary.json``), beside each trial's own prediction; the report draws
what was recorded and does not run the memory model again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict

from tuner.errors import TunerError
from tuner.vllm.boot import BootState
from tuner.vllm.gpus import GpuSpec
from tuner.vllm.memory import Calibration, ServingParams, plan
from tuner.vllm.models import ModelSpec
from tuner.vllm.space import TrialParams
from tuner.vllm.versions import VllmVersion

UTILIZATION_STEP = 0.01
GRID_POINTS = 28  # --max-num-seqs values, evenly spaced in log
GRID_REACH = 4  # the grid reaches this many times below and above the values measured


class BoundaryRow(BaseModel):
    """At one ``--max-num-seqs``: the utilizations at which vLLM is predicted to start."""

    model_config = ConfigDict(frozen=True)

    max_num_seqs: int
    lowest_utilization: float
    highest_utilization: float
    # The lowest on a cold boot (an empty compile cache: a smaller KV cache,
    # tuner.vllm.boot); None: none starts cold, or recorded before cold boots were.
    lowest_utilization_cold: float | None = None


class MemoryBoundary(BaseModel):
    """The predicted boundary per KV-cache dtype (a dtype at which nothing starts: no rows)."""

    model_config = ConfigDict(frozen=True)

    rows_by_dtype: dict[str, tuple[BoundaryRow, ...]]
    calibrated: bool  # with the calibration a real startup's log gave the memory model
    reference: TrialParams  # the other settings held while the map varies these


def seqs_grid(measured_seqs: Iterable[int]) -> list[int]:
    """``GRID_POINTS`` values of ``--max-num-seqs`` in log steps, ``GRID_REACH`` times
    below the lowest and above the highest value measured."""
    values = list(measured_seqs) or [1]
    low = max(1, min(values) // GRID_REACH)
    high = max(max(values) * GRID_REACH, low + 1)
    ratio = (high / low) ** (1 / (GRID_POINTS - 1))
    return sorted({max(1, round(low * ratio**i)) for i in range(GRID_POINTS)})


def memory_boundary(
    model: ModelSpec,
    gpu: GpuSpec,
    version: VllmVersion,
    base: ServingParams,
    reference: TrialParams,
    calibration: Calibration | None,
    dtypes: Sequence[str],
    seqs_values: Sequence[int],
) -> MemoryBoundary:
    """The boundary of ``reference`` varied in utilization and max-num-seqs, per dtype."""
    utils = [round(u * UTILIZATION_STEP, 2) for u in range(5, 101)]
    rows_by_dtype: dict[str, tuple[BoundaryRow, ...]] = {}
    for dtype in dtypes:
        rows: list[BoundaryRow] = []
        for seqs in seqs_values:
            params = reference.model_copy(update={"max_num_seqs": seqs, "kv_cache_dtype": dtype})
            if params.max_num_batched_tokens is not None and params.max_num_batched_tokens < seqs:
                params = params.model_copy(update={"max_num_batched_tokens": seqs})

            def fits(
                u: float, params: TrialParams = params, boot: BootState = BootState.WARM
            ) -> bool:
                at = params.model_copy(update={"gpu_memory_utilization": u})
                try:
                    return plan(model, gpu, at.serving(base), version, calibration, boot=boot).fits
                except TunerError:
                    return False

            low = next((u for u in utils if fits(u)), None)
            if low is None:
                continue
            high = next(u for u in reversed(utils) if u >= low and (u == low or fits(u)))
            cold = next((u for u in utils if u >= low and fits(u, boot=BootState.COLD)), None)
            rows.append(
                BoundaryRow(
                    max_num_seqs=seqs,
                    lowest_utilization=low,
                    highest_utilization=high,
                    lowest_utilization_cold=cold,
                )
            )
        rows_by_dtype[dtype] = tuple(rows)
    return MemoryBoundary(
        rows_by_dtype=rows_by_dtype, calibrated=calibration is not None, reference=reference
    )

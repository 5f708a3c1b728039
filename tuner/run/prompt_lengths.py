"""``prompt_lengths.json`` of a level: its measured prompt lengths against the stationary ones.

``tuner.search.level_evidence`` compares them (quantiles, a two-sample
Kolmogorov-Smirnov test) and writes the ``PromptLengthMix`` (its file's name:
``tuner.run.layout.PROMPT_LENGTHS_FILE``); the report reads it back (``tuner.run.levels``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict


class PromptQuantiles(BaseModel):
    """Quantiles of a set of prompt lengths (tokens, the whole prompt with its history)."""

    model_config = ConfigDict(frozen=True)

    p10: float
    p50: float
    p90: float
    p99: float
    mean: float

    @classmethod
    def of(cls, values: Sequence[int] | np.ndarray[Any, Any]) -> PromptQuantiles:
        a = np.asarray(values, dtype=float)
        p10, p50, p90, p99 = (float(q) for q in np.percentile(a, [10, 50, 90, 99]))
        return cls(p10=p10, p50=p50, p90=p90, p99=p99, mean=float(a.mean()))


class PromptLengthMix(BaseModel):
    """The prompt lengths of a window's measured requests against the workload's stationary
    ones (``stationary``: a long stationary schedule of the same spec, see the module).

    ``p_value`` is the two-sample Kolmogorov-Smirnov test's, with the measured side
    counted as ``effective_requests``; None when the window measured nothing."""

    model_config = ConfigDict(frozen=True)

    requests: int
    effective_requests: int  # independent samples: conversations with sessions, else requests
    measured: PromptQuantiles | None
    stationary: PromptQuantiles
    reference_requests: int
    reference_duration_s: float
    reference_seed: int
    test: str = "two-sample Kolmogorov-Smirnov"
    ks_statistic: float | None
    p_value: float | None

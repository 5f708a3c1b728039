"""Typed models of a run's files that the tuning loop writes as plain documents.

``tune.json`` is written by ``tuner.search.tune.describe`` as a document; ``TuneRecord``
reads it back (fields an older run lacks take their defaults, those a newer one adds are
ignored). The files the loop writes from a model are read with that model (``Evaluation``,
``EdgeResult``, ``Recommendation``, ``TuneSummary``, ``BudgetRecord``, each in its own
module of ``tuner.run``: ``tuner.run.reader``).
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)

from tuner.run.config import TuneConfig
from tuner.serving.server import Backend
from tuner.vllm.gpus import GpuSpec, recorded_gpu
from tuner.vllm.space import LeftOut, Range


class TuneRecord(BaseModel):
    """``tune.json``: the resolved configuration of a run (``tuner.search.tune.describe``)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    study: str | None = None  # older runs: only in the study storage and summary.json
    config: TuneConfig
    backend: Backend
    model: str
    gpu: str | None
    # the whole profile planned with (runs written before it: None, the name's profile)
    gpu_profile: GpuSpec | None = None
    vllm_version: str
    vllm_cmd: list[str] = []
    workload: dict[str, Any]
    space: list[Range] = []
    left_out: list[LeftOut] = []
    notes: list[str] = []
    storage: str = ""
    time_scale: float = 1.0

    @property
    def simulated(self) -> bool:
        return self.backend is Backend.SIM

    @field_validator("gpu_profile", mode="wrap")
    @classmethod
    def _readable_profile(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            return None  # a profile this tuner cannot read: the name's profile stands

    def gpu_spec(self) -> GpuSpec | None:
        """The GPU profile the run planned with (None: vLLM's CPU build); UnknownGpuError
        where it recorded only a name this tuner has no profile of."""
        return recorded_gpu(self.gpu, self.gpu_profile) if self.gpu is not None else None

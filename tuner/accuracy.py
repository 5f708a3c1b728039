"""How well the memory model predicts real vLLM startups.

A *case* is a real vLLM startup log with what is known of its setting (model
config, GPU, flags, version). For each, the model predicts the KV-cache tokens
uncalibrated (from the specs alone) and calibrated (from the log's own summary
lines), and both are compared with the ``GPU KV cache size: N tokens`` vLLM logged.
The case list lives in ``tests/fixtures/vllm_logs/index.yaml``.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from tuner.errors import ConfigError, UnknownGpuError
from tuner.gpus import GiB, GpuSpec, get_gpu
from tuner.memory import MemoryPlan, ServingParams, plan
from tuner.models import ModelSpec, Quantization
from tuner.versions import VllmVersion
from tuner.vllm_log import calibration_from_report, parse_startup_log


class LogCase(BaseModel):
    """One real startup log and its setting, as listed in the fixture index."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    file: str
    source: str
    vllm_version: str
    model: str
    gpu: str | None = None
    gpu_total_gib: float | None = None
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_dtype: str = "auto"
    block_size: int | None = None
    enforce_eager: bool = False
    # Weights quantized by vLLM at load time (``--quantization fp8``), if any.
    quantization: str | None = None
    logged: dict[str, Any]
    model_config_: dict[str, Any]
    note: str | None = None
    # Integrated GPUs share memory with the CPU: their budget is not a GPU's.
    unified_memory: bool = False


class AccuracyRow(BaseModel):
    model_config = ConfigDict(frozen=True)

    file: str
    model: str
    gpu: str
    tp: int
    vllm_version: str
    logged_tokens: int
    # None when the log does not say which GPU it ran on: only calibration can tell.
    predicted_tokens: int | None
    calibrated_tokens: int

    @property
    def error(self) -> float | None:
        if self.predicted_tokens is None:
            return None
        return (self.predicted_tokens - self.logged_tokens) / self.logged_tokens

    @property
    def calibrated_error(self) -> float:
        return (self.calibrated_tokens - self.logged_tokens) / self.logged_tokens


def load_cases(index: Path) -> list[LogCase]:
    entries = yaml.safe_load(index.read_text(encoding="utf-8")) or []
    cases = []
    for entry in entries:
        entry = dict(entry)
        entry["model_config_"] = entry.pop("model_config")
        entry["vllm_version"] = str(entry["vllm_version"])
        cases.append(LogCase(**entry))
    return cases


def _gpu_for(case: LogCase, *, calibrated: bool) -> GpuSpec:
    """The GPU profile of the case; its logged total memory wins where it has one.

    A calibrated prediction does not depend on the device total (the log's own
    budget fixes the KV memory), so an unnamed GPU is taken as a stand-in there.
    """
    try:
        gpu = get_gpu(case.gpu or "")
    except UnknownGpuError:
        if case.gpu_total_gib is None and not calibrated:
            raise ConfigError(
                f"{case.file}: GPU {case.gpu!r} is not a known profile and no total memory is given"
            ) from None
        gpu = get_gpu("H100-80GB").model_copy(update={"name": case.gpu or "unknown"})
    if case.gpu_total_gib is not None:
        total = int(case.gpu_total_gib * GiB)
        gpu = gpu.model_copy(update={"cuda_total_bytes": total})
    return gpu


def _params(case: LogCase) -> ServingParams:
    return ServingParams(
        gpu_memory_utilization=case.gpu_memory_utilization,
        max_num_seqs=case.max_num_seqs,
        max_num_batched_tokens=case.max_num_batched_tokens,
        block_size=case.block_size,
        kv_cache_dtype=case.kv_cache_dtype,
        max_model_len=case.max_model_len,
        tensor_parallel_size=case.tensor_parallel_size,
        enforce_eager=case.enforce_eager,
    )


def predict(case: LogCase, log_dir: Path, *, calibrated: bool) -> MemoryPlan:
    model = ModelSpec.from_hf_config(case.model_config_, name=case.model, source=case.file)
    if case.quantization and Quantization.from_method(case.quantization) is not Quantization.NONE:
        model = model.model_copy(
            update={"quantization": Quantization.from_method(case.quantization)}
        )
    version = VllmVersion.parse(case.vllm_version)
    calibration = None
    if calibrated:
        report = parse_startup_log((log_dir / case.file).read_text(encoding="utf-8"))
        calibration = calibration_from_report(
            report, source=case.file, cudagraph_in_budget=version.cudagraph_in_budget
        ).model_copy(update={"gpu_memory_utilization": case.gpu_memory_utilization})
    return plan(model, _gpu_for(case, calibrated=calibrated), _params(case), version, calibration)


def _gpu_known(case: LogCase) -> bool:
    try:
        get_gpu(case.gpu or "")
    except UnknownGpuError:
        return case.gpu_total_gib is not None
    return True


def evaluate(case: LogCase, log_dir: Path) -> AccuracyRow:
    return AccuracyRow(
        file=case.file,
        model=case.model,
        gpu=case.gpu or "?",
        tp=case.tensor_parallel_size,
        vllm_version=case.vllm_version,
        logged_tokens=int(case.logged["kv_cache_tokens"]),
        predicted_tokens=(
            predict(case, log_dir, calibrated=False).kv_cache_tokens if _gpu_known(case) else None
        ),
        calibrated_tokens=predict(case, log_dir, calibrated=True).kv_cache_tokens,
    )


def summary(rows: list[AccuracyRow]) -> dict[str, float]:
    errors = [abs(r.error) for r in rows if r.error is not None]
    calibrated = [abs(r.calibrated_error) for r in rows]
    return {
        "cases": len(rows),
        "uncalibrated_cases": len(errors),
        "median_abs_error": statistics.median(errors),
        "max_abs_error": max(errors),
        "median_abs_calibrated_error": statistics.median(calibrated),
        "max_abs_calibrated_error": max(calibrated),
    }

"""How well the memory model predicts real vLLM startups.

A *case* is a real vLLM startup log with what is known of its setting (model
config, GPU, flags, version). For each, the model predicts the KV-cache tokens
uncalibrated (from the specs alone) and calibrated (from the log's own summary
lines), and both are compared with the ``GPU KV cache size: N tokens`` vLLM logged.
The case list lives in ``tests/fixtures/vllm_logs/index.yaml``.
"""

from __future__ import annotations

import statistics
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from tuner.errors import ConfigError, UnknownGpuError
from tuner.vllm.gpus import GiB, GpuSpec, get_gpu
from tuner.vllm.log import calibration_from_report, parse_startup_log
from tuner.vllm.memory import MemoryPlan, ServingParams, plan
from tuner.vllm.models import ModelSpec, Quantization
from tuner.vllm.versions import VllmVersion


class LogOrigin(StrEnum):
    """How much of a fixture log is a real vLLM run."""

    # Lines copied from a public file, `source` links to it.
    PUBLIC_FILE = "public_file"
    # Lines copied from a real public log whose repository the code index did not report.
    PUBLIC_UNLOCATED = "public_unlocated"
    # Not a run: real lines of the same format with the numbers changed (see the fixture's note).
    BUILT_FROM_FORMAT = "built_from_format"


class LogCase(BaseModel):
    """One real startup log and its setting, as listed in the fixture index."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    file: str
    source: str
    origin: LogOrigin = LogOrigin.PUBLIC_FILE
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
    origin: LogOrigin
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
    if calibrated:
        return predict_at(case, log_dir, {})
    version = VllmVersion.parse(case.vllm_version)
    return plan(model, _gpu_for(case, calibrated=False), _params(case), version)


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
        origin=case.origin,
        logged_tokens=int(case.logged["kv_cache_tokens"]),
        predicted_tokens=(
            predict(case, log_dir, calibrated=False).kv_cache_tokens if _gpu_known(case) else None
        ),
        calibrated_tokens=predict(case, log_dir, calibrated=True).kv_cache_tokens,
    )


def summary(rows: list[AccuracyRow]) -> dict[str, float]:
    """Error statistics over the real logs (built ones are checks of the parser, not evidence)."""
    rows = [r for r in rows if r.origin is not LogOrigin.BUILT_FROM_FORMAT]
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


class TransferRow(BaseModel):
    """A calibrated prediction at settings other than the log's, against vLLM's own arithmetic."""

    model_config = ConfigDict(frozen=True)

    file: str
    vllm_version: str
    origin: LogOrigin
    setting: str
    expected_tokens: int
    predicted_tokens: int

    @property
    def error(self) -> float:
        return (self.predicted_tokens - self.expected_tokens) / self.expected_tokens


def _plain_layout(case: LogCase) -> tuple[int, int] | None:
    """(bytes of one block over all layers on one rank, block size) for a model whose layers all
    hold full attention with one KV head layout; None for anything else (sliding, MLA, hybrid)."""
    cfg = case.model_config_
    if any(k in cfg for k in ("layer_types", "sliding_window", "kv_lora_rank")):
        return None
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    kv_heads = max(1, int(cfg.get("num_key_value_heads", heads)) // case.tensor_parallel_size)
    dtype_bytes = 1 if case.kv_cache_dtype.startswith("fp8") else 2
    block = case.block_size or 16
    return 2 * block * kv_heads * head_dim * dtype_bytes * int(cfg["num_hidden_layers"]), block


def transfer_rows(case: LogCase, log_dir: Path) -> list[TransferRow]:
    """The calibrated prediction at another utilization and another max_model_len.

    What vLLM would size there follows from the log alone: the KV memory moves by the
    change in budget (utilization x device total: nothing else in the budget depends on
    it), and the tokens follow from the blocks. Only logs that print the device total and
    the utilization, of models with one plain attention layout (the check's own layout
    code covers no more), and from releases that size tokens by concurrency (0.21 on).
    """
    layout = _plain_layout(case)
    report = parse_startup_log((log_dir / case.file).read_text(encoding="utf-8"))
    version = VllmVersion.parse(case.vllm_version)
    if (
        layout is None
        or report.total_bytes is None
        or report.gpu_memory_utilization is None
        or report.available_kv_bytes is None
        or case.max_model_len is None
        or not version.at_least((0, 21))
    ):
        return []
    block_bytes, block_size = layout

    def expected(kv_bytes: float, max_model_len: int) -> int:
        blocks = int(kv_bytes) // block_bytes
        per_request = -(-max_model_len // block_size)
        return int(blocks / per_request * max_model_len)

    util = report.gpu_memory_utilization
    rows = []
    for other_util in (round(util - 0.05, 2), round(min(util + 0.05, 0.99), 2)):
        kv = report.available_kv_bytes + (other_util - util) * report.total_bytes
        got = predict_at(case, log_dir, {"gpu_memory_utilization": other_util})
        rows.append(
            TransferRow(
                file=case.file,
                vllm_version=case.vllm_version,
                origin=case.origin,
                setting=f"--gpu-memory-utilization {other_util}",
                expected_tokens=expected(kv, case.max_model_len),
                predicted_tokens=got.kv_cache_tokens,
            )
        )
    half = case.max_model_len // 2
    got = predict_at(case, log_dir, {"max_model_len": half})
    rows.append(
        TransferRow(
            file=case.file,
            vllm_version=case.vllm_version,
            origin=case.origin,
            setting=f"--max-model-len {half}",
            expected_tokens=expected(report.available_kv_bytes, half),
            predicted_tokens=got.kv_cache_tokens,
        )
    )
    return rows


def predict_at(case: LogCase, log_dir: Path, update: dict[str, Any]) -> MemoryPlan:
    """The calibrated prediction for the case's setting with some flags changed."""
    report = parse_startup_log((log_dir / case.file).read_text(encoding="utf-8"))
    # The batch limit the log's engine resolved is its setting (offline LLM() runs
    # default to other limits than the server).
    resolved = {
        "max_num_batched_tokens": case.max_num_batched_tokens or report.max_num_batched_tokens,
        "max_num_seqs": case.max_num_seqs or report.max_num_seqs,
    }
    changed = case.model_copy(update=resolved | update)
    model = ModelSpec.from_hf_config(case.model_config_, name=case.model, source=case.file)
    if case.quantization and Quantization.from_method(case.quantization) is not Quantization.NONE:
        model = model.model_copy(
            update={"quantization": Quantization.from_method(case.quantization)}
        )
    version = VllmVersion.parse(case.vllm_version)
    calibration = calibration_from_report(
        report, source=case.file, cudagraph_in_budget=version.cudagraph_in_budget
    ).model_copy(update={"gpu_memory_utilization": case.gpu_memory_utilization})
    return plan(model, _gpu_for(changed, calibrated=True), _params(changed), version, calibration)

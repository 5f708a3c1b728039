"""Parsers for the lines vLLM prints at startup, for calibration and failure reports.

Covers the V1 engine's lines from 0.8 to the current release, including the
``Memory profiling takes ...`` block some versions print and the per-worker
prefixes of tensor-parallel runs (``(VllmWorker TP0 pid=...)``), of which the
first rank's values are taken.

vLLM's CPU build prints its own KV-cache lines: ``CPU KV cache size: N tokens``
instead of ``GPU KV cache size``, and instead of the memory profile one of
``Explicitly set (X/Y) GiB for KV cache on node N.`` (``--kv-cache-memory-bytes``
or ``VLLM_CPU_KVCACHE_SPACE``) or ``Auto set (X/Y) GiB for KV cache on node N, with
R GiB requested memory for the worker. C GiB memory was consumed by non-kv
usages.`` (``--gpu-memory-utilization`` of the node's memory). It prints no
weights size, only ``Loading weights took S seconds``.

From 0.28 the memory summary is one budget line, ``Free memory on device (F/T GiB)
... Actual usage is C GiB for consumed memory (weights + non-torch), A GiB for peak
activation, and G GiB for CUDAGraph memory ... Current kv cache memory in use is K
GiB.`` (K = requested - C - A); from 0.32 it is the only place K is printed (no
``Available KV cache memory`` line). Some releases print it only at DEBUG (its
source's ``logger.debug(msg)``), as every release prints the memory profile's summary
(``Memory profiling takes ... total consumed (from mem_get_info): X GiB`` from 0.28)
and ``Initial free memory: F GiB; Requested memory: U (util), R GiB``. The parts of
the budget line are read one by one, with signed numbers (a graph pool can come out
negative: ``took -4.58 GiB``), and with or without the device vLLM's refusal to start
names from 0.2x (``Free memory on device cuda:1 (19.77/22.05 GiB) on startup is less
than desired GPU memory utilization (0.9, 19.84 GiB)``): such a startup is reported
as refused (``budget_refused``), not as a release that hid its budget. From 0.2x the
capture also prints ``CUDA graph pool memory: A GiB (actual), E GiB (estimated)``.

Given ``--kv-cache-memory-bytes`` (0.11 on), vLLM skips the memory profile and prints
``Initial free memory F GiB, reserved K GiB memory for KV Cache as specified by
kv_cache_memory_bytes config and skipped memory profiling. ...`` instead: the KV size
was given, not measured, so such a startup cannot calibrate the memory model.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from tuner.errors import LogParseError
from tuner.vllm.boot import BootState, boot_state_of_log
from tuner.vllm.gpus import GiB
from tuner.vllm.memory import Calibration
from tuner.vllm.versions import logged_version_text

_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_SNUM = r"(-?[0-9]+(?:\.[0-9]+)?)"

RE_WEIGHTS = re.compile(rf"(?:Model loading took|Loading model weights took)\s+{_NUM}\s*(GiB|GB)")
RE_WEIGHTS_LOAD_TIME = re.compile(
    rf"(?:Model loading took .*? and|Loading weights took)\s+{_NUM} seconds"
)
# Signed: vLLM prints what it measured, and a measurement can come out negative (a KV budget
# that does not fit, a CUDA-graph pool that freed more than it took on a unified-memory part).
RE_AVAILABLE_KV = re.compile(rf"Available KV cache memory:\s*{_SNUM}\s*GiB")
RE_KV_TOKENS = re.compile(r"\b(GPU|CPU|XPU|TPU) KV cache size:\s*([0-9,]+)\s*tokens")
RE_CPU_KV_SET = re.compile(rf"(Explicitly|Auto) set \({_NUM}/{_NUM}\) GiB for KV cache on node")
RE_MAX_CONCURRENCY = re.compile(
    rf"Maximum concurrency for\s*([0-9,]+)\s*tokens per request:\s*{_NUM}x"
)
RE_GRAPH = re.compile(rf"Graph capturing finished in\s*{_NUM}\s*secs?, took\s*{_SNUM}\s*GiB")
# 0.2x on, after the capture: what the graphs took beside what the profile estimated for them.
RE_GRAPH_POOL = re.compile(
    rf"CUDA graph pool memory:\s*{_SNUM}\s*GiB \(actual\),\s*{_SNUM}\s*GiB \(estimated\)"
)
# The estimate is in the budget (the default since 0.21) unless VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.
RE_GRAPH_ESTIMATE_APPLIED = re.compile(r"CUDA graph memory profiling is enabled")
RE_GRAPH_ESTIMATE = re.compile(
    rf"(?:Estimated CUDA graph memory|CUDA graph memory profiling[^:]*|cudagraph memory[^:]*):\s*"
    rf"{_NUM}\s*GiB",
    re.IGNORECASE,
)
RE_PROFILE_TOTAL = re.compile(
    rf"total_gpu_memory \({_NUM}\s*GiB\) x gpu_memory_utilization \({_NUM}\)"
)
RE_PROFILE_PARTS = re.compile(
    rf"model weights take {_NUM}\s*GiB; non_torch_memory takes {_NUM}\s*GiB; "
    rf"PyTorch activation peak memory takes {_NUM}\s*GiB; "
    rf"the rest of the memory reserved for KV Cache is {_NUM}\s*GiB"
)
# The budget line, read in parts so that a release that rewords one part keeps the others:
#   Free memory on device (F/T GiB) on startup. Desired GPU memory utilization is (U, R GiB).
#   Actual usage is ... Current kv cache memory in use is K GiB.
# and vLLM's refusal to start, which from 0.2x names the device (``cuda:1``):
#   Free memory on device cuda:1 (F/T GiB) on startup is less than desired GPU memory
#   utilization (U, R GiB). Decrease GPU memory utilization or reduce GPU memory used by ...
# The device is optional in both, so that either release's wording of either line is read.
RE_BUDGET_FREE = re.compile(
    rf"Free memory on device(?: ([^\s(]+))? \({_NUM}/{_NUM}\s*GiB\) on startup"
    r"(\.| is less than desired)"
)
RE_BUDGET_DESIRED = re.compile(
    rf"(?:Desired GPU memory utilization is|is less than desired GPU memory utilization) "
    rf"\({_NUM},\s*{_NUM}\s*GiB\)"
)
RE_USAGE_DETAIL = re.compile(
    rf"Actual usage is {_SNUM}\s*GiB for weight, {_SNUM}\s*GiB for peak activation, "
    rf"{_SNUM}\s*GiB for non-torch memory, and {_SNUM}\s*GiB for CUDAGraph memory"
)
RE_CONSUMED_DETAIL = re.compile(
    rf"Actual usage is {_SNUM}\s*GiB for consumed memory \(weights \+ non-torch\), "
    rf"{_SNUM}\s*GiB for peak activation, and {_SNUM}\s*GiB for CUDAGraph memory"
)
# The KV memory vLLM sized, in the budget line (from 0.32 the only place it is printed).
RE_CURRENT_KV = re.compile(rf"Current kv cache memory in use is {_SNUM}\s*(GiB|bytes)")
# --kv-cache-memory-bytes: vLLM reserved what it was given and did not profile.
RE_KV_RESERVED = re.compile(
    rf"(?:Initial free memory {_NUM}\s*GiB, )?reserved {_NUM}\s*GiB memory for KV Cache as "
    r"specified by kv_cache_memory_bytes"
)
# DEBUG only (VLLM_LOGGING_LEVEL=DEBUG): the budget before the profile, as 0.10 on words it
# and as 0.9 worded it ("Initial free memory: F GiB, free memory: A GiB, requested GPU memory:
# R GiB", without the utilization).
RE_INITIAL_FREE = re.compile(
    rf"Initial free memory:\s*{_NUM}\s*GiB; Requested memory:\s*{_NUM} \(util\),\s*{_NUM}\s*GiB"
)
RE_INITIAL_FREE_09 = re.compile(
    rf"Initial free memory:\s*{_NUM}\s*GiB, free memory:\s*{_NUM}\s*GiB, requested GPU memory:"
    rf"\s*{_NUM}\s*GiB"
)
# The memory profile's summary (DEBUG from 0.1x): before 0.28 with the non-torch increase,
# from 0.28 with the memory consumed since startup (weights + non-torch, from mem_get_info).
RE_PROFILE_RESULT = re.compile(
    rf"Total non KV cache memory: {_NUM}\s*GiB; torch peak memory increase: {_NUM}\s*GiB; "
    rf"non-torch forward increase memory: {_NUM}\s*GiB; weights memory: {_NUM}\s*GiB"
)
RE_PROFILE_CONSUMED = re.compile(
    rf"Total non KV cache memory: {_NUM}\s*GiB; torch peak memory increase: {_NUM}\s*GiB; "
    rf"total consumed \(from mem_get_info\): {_NUM}\s*GiB; weights memory: {_NUM}\s*GiB"
)
RE_CHUNKED_PREFILL = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=([0-9]+)")
RE_ANSI = re.compile(r"\x1b\[[0-9;]*m")
RE_NON_DEFAULT_ARGS = re.compile(r"non-default args:\s*(\{.*\})\s*$")
RE_ENGINE_CONFIG = re.compile(r"with config:\s*(.*)$")
RE_READY = re.compile(r"Application startup complete\.|Starting vLLM API server")


class StartupReport(BaseModel):
    """What a vLLM startup log says about memory and settings (None: not in the log)."""

    model_config = ConfigDict(frozen=True)

    vllm_version: str | None = None
    weights_bytes: int | None = None
    weights_load_s: float | None = None
    total_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    activation_bytes: int | None = None
    non_torch_bytes: int | None = None
    # Weights plus non-torch memory (and the CUDA-graph estimate within the budget), as
    # the budget line of 0.28 on measures it: the KV memory is requested - consumed - activation.
    consumed_bytes: int | None = None
    cudagraph_bytes: int | None = None
    cudagraph_estimate_bytes: int | None = None
    available_kv_bytes: int | None = None
    kv_cache_tokens: int | None = None
    # Where the KV cache lives: "gpu", or "cpu" for vLLM's CPU build.
    kv_cache_device: str | None = None
    # --kv-cache-memory-bytes as given (vLLM's CPU build: the KV cache's exact size).
    kv_cache_memory_bytes: int | None = None
    # The KV cache size was given (--kv-cache-memory-bytes) and vLLM skipped its memory
    # profile: the log's KV size is not a measurement.
    kv_cache_size_given: bool = False
    initial_free_bytes: int | None = None  # free device memory vLLM saw before loading
    # The device the budget line names (from 0.2x its refusal says e.g. "cuda:1").
    budget_device: str | None = None
    # vLLM refused to start: the free memory on its device was below the requested budget.
    budget_refused: bool = False
    requested_bytes: int | None = None  # total x --gpu-memory-utilization, as vLLM printed it
    block_size: int | None = None
    max_concurrency: float | None = None
    max_concurrency_tokens: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    tensor_parallel_size: int | None = None
    kv_cache_dtype: str | None = None
    enforce_eager: bool | None = None
    ready: bool = False
    # The compile cache's state at this boot, from torch.compile's lines (tuner.vllm.boot);
    # None where the log shows no compilation (--enforce-eager, or cut short before it).
    boot_state: BootState | None = None


def _gib_bytes(text: str) -> int:
    return round(float(text) * GiB)


def _engine_config_fields(text: str) -> dict[str, str]:
    """``key=value, key=value`` of the engine config line; values may contain commas in braces."""
    fields: dict[str, str] = {}
    depth, start = 0, 0
    parts: list[str] = []
    for i, ch in enumerate(text):
        if ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    for part in parts:
        key, sep, value = part.strip().partition("=")
        if sep:
            fields[key.strip()] = value.strip().strip("'\"")
    return fields


def _literal_dict(text: str) -> dict[str, Any]:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return {}
    return value if isinstance(value, dict) else {}


def parse_startup_log(text: str) -> StartupReport:
    """Read every startup line vLLM printed.

    Most values are taken from their first occurrence (rank 0). The KV-cache size is
    printed once per tensor-parallel rank in older releases and vLLM keeps the
    smallest, so for those the minimum over ranks is taken.
    """
    found: dict[str, Any] = {}

    def once(key: str, value: Any) -> None:
        if key not in found and value is not None:
            found[key] = value

    def smallest(key: str, value: Any) -> None:
        found[key] = value if key not in found else min(found[key], value)

    for raw in text.splitlines():
        line = RE_ANSI.sub("", raw)
        once("vllm_version", logged_version_text(line))  # versions.LOGGED_VERSION's forms
        if m := RE_WEIGHTS.search(line):
            # Older releases print "GB" for what is computed in GiB.
            once("weights_bytes", _gib_bytes(m[1]))
        if m := RE_WEIGHTS_LOAD_TIME.search(line):
            once("weights_load_s", float(m[1]))
        if m := RE_AVAILABLE_KV.search(line):
            smallest("available_kv_bytes", _gib_bytes(m[1]))
        if m := RE_KV_TOKENS.search(line):
            once("kv_cache_device", m[1].lower())
            smallest("kv_cache_tokens", int(m[2].replace(",", "")))
        if m := RE_CPU_KV_SET.search(line):
            # Printed to 0.01 GiB; an explicit size is made exact from the arguments below.
            once("cpu_kv_explicit", m[1] == "Explicitly")
            smallest("available_kv_bytes", _gib_bytes(m[2]))
            once("total_bytes", _gib_bytes(m[3]))
        if m := RE_MAX_CONCURRENCY.search(line):
            once("max_concurrency_tokens", int(m[1].replace(",", "")))
            smallest("max_concurrency", float(m[2]))
        if m := RE_GRAPH.search(line):
            once("cudagraph_bytes", _gib_bytes(m[2]))
        if m := RE_GRAPH_POOL.search(line):
            once("cudagraph_bytes", _gib_bytes(m[1]))
            once("cudagraph_estimate_bytes", _gib_bytes(m[2]))
        if RE_GRAPH_ESTIMATE_APPLIED.search(line):
            found["graph_estimate_applied"] = True
        if m := RE_GRAPH_ESTIMATE.search(line):
            once("cudagraph_estimate_bytes", _gib_bytes(m[1]))
        if m := RE_PROFILE_TOTAL.search(line):
            once("total_bytes", _gib_bytes(m[1]))
            once("gpu_memory_utilization", float(m[2]))
        if m := RE_PROFILE_PARTS.search(line):
            once("weights_bytes", _gib_bytes(m[1]))
            once("non_torch_bytes", _gib_bytes(m[2]))
            once("activation_bytes", _gib_bytes(m[3]))
        if m := RE_BUDGET_FREE.search(line):
            once("budget_device", m[1])
            once("initial_free_bytes", _gib_bytes(m[2]))
            once("total_bytes", _gib_bytes(m[3]))
            if m[4] != ".":
                found["budget_refused"] = True
        if m := RE_BUDGET_DESIRED.search(line):
            once("gpu_memory_utilization", float(m[1]))
            once("requested_bytes", _gib_bytes(m[2]))
        if m := RE_INITIAL_FREE.search(line):
            once("initial_free_bytes", _gib_bytes(m[1]))
            once("gpu_memory_utilization", float(m[2]))
            once("requested_bytes", _gib_bytes(m[3]))
        if m := RE_INITIAL_FREE_09.search(line):
            once("initial_free_bytes", _gib_bytes(m[1]))
            once("requested_bytes", _gib_bytes(m[3]))
        if m := RE_USAGE_DETAIL.search(line):
            once("weights_bytes", _gib_bytes(m[1]))
            once("activation_bytes", _gib_bytes(m[2]))
            once("non_torch_bytes", _gib_bytes(m[3]))
            once("cudagraph_estimate_bytes", _gib_bytes(m[4]))
        if m := RE_CONSUMED_DETAIL.search(line):
            once("consumed_bytes", _gib_bytes(m[1]))
            once("activation_bytes", _gib_bytes(m[2]))
            once("cudagraph_estimate_bytes", _gib_bytes(m[3]))
        if m := RE_CURRENT_KV.search(line):
            # The same figure as "Available KV cache memory" (per rank; vLLM keeps the smallest).
            kv_now = int(m[1]) if m[2] == "bytes" else _gib_bytes(m[1])
            smallest("current_kv_bytes", kv_now)
        if m := RE_KV_RESERVED.search(line):
            found["kv_cache_size_given"] = True
            if m[1] is not None:
                once("initial_free_bytes", _gib_bytes(m[1]))
            smallest("reserved_kv_bytes", _gib_bytes(m[2]))
        if m := RE_PROFILE_RESULT.search(line):
            once("activation_bytes", _gib_bytes(m[2]))
            once("non_torch_bytes", _gib_bytes(m[3]))
            once("weights_bytes", _gib_bytes(m[4]))
        if m := RE_PROFILE_CONSUMED.search(line):
            # 0.28 on: non-KV = consumed + the activation's transient peak over what it kept.
            once("consumed_bytes", _gib_bytes(m[3]))
            once("weights_bytes", _gib_bytes(m[4]))
            once("profile_activation_bytes", _gib_bytes(m[1]) - _gib_bytes(m[3]))
        if m := RE_NON_DEFAULT_ARGS.search(line):
            args = _literal_dict(m[1])
            for key in (
                "gpu_memory_utilization",
                "max_num_seqs",
                "max_num_batched_tokens",
                "max_model_len",
                "tensor_parallel_size",
                "kv_cache_dtype",
                "enforce_eager",
                "block_size",
            ):
                once(key, args.get(key))
            if isinstance(size := args.get("kv_cache_memory_bytes"), int):
                once("kv_cache_memory_bytes", size)
        if m := RE_ENGINE_CONFIG.search(line):
            cfg = _engine_config_fields(m[1])
            if cfg.get("max_seq_len", "").isdigit():
                once("max_model_len", int(cfg["max_seq_len"]))
            if cfg.get("tensor_parallel_size", "").isdigit():
                once("tensor_parallel_size", int(cfg["tensor_parallel_size"]))
            once("kv_cache_dtype", cfg.get("kv_cache_dtype"))
            if "enforce_eager" in cfg:
                once("enforce_eager", cfg["enforce_eager"] == "True")
        if m := RE_CHUNKED_PREFILL.search(line):
            # The batch limit the engine resolved, defaults included.
            once("max_num_batched_tokens", int(m[1]))
        if RE_READY.search(line):
            found["ready"] = True
    once("boot_state", boot_state_of_log(RE_ANSI.sub("", text)))
    transient = found.pop("profile_activation_bytes", None)
    if found.pop("graph_estimate_applied", False) and transient is not None:
        # The budget line's peak activation holds the CUDA-graph estimate vLLM budgeted.
        transient += found.get("cudagraph_estimate_bytes") or 0
    if transient is not None and "activation_bytes" not in found:
        found["activation_bytes"] = transient
    current = found.pop("current_kv_bytes", None)
    if current is not None and "available_kv_bytes" not in found:
        found["available_kv_bytes"] = current
    reserved = found.pop("reserved_kv_bytes", None)
    if reserved is not None and "available_kv_bytes" not in found:
        given = found.get("kv_cache_memory_bytes")
        # Printed to 0.01 GiB: the flag's value where the two agree.
        close = given is not None and abs(given - reserved) <= 0.005 * GiB
        found["available_kv_bytes"] = given if close else reserved
    if found.pop("cpu_kv_explicit", False):
        _exact_cpu_kv_size(found)
    return StartupReport(**found)


def _exact_cpu_kv_size(found: dict[str, Any]) -> None:
    """An explicitly sized CPU KV cache is --kv-cache-memory-bytes, unless VLLM_CPU_KVCACHE_SPACE
    (whole GiB, which overrides the flag) set another size: the logged size tells which."""
    given = found.get("kv_cache_memory_bytes")
    logged = found.get("available_kv_bytes")
    if given is not None and logged is not None and abs(given - logged) <= 0.005 * GiB:
        found["available_kv_bytes"] = given


def calibration_from_log(path: Path, *, cudagraph_in_budget: bool | None = None) -> Calibration:
    """A Calibration from a real vLLM startup log file."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise LogParseError(f"cannot read vLLM log {str(path)!r}: {exc.strerror}") from exc
    report = parse_startup_log(text)
    return calibration_from_report(
        report, source=str(path), cudagraph_in_budget=cudagraph_in_budget
    )


def _gib_text(value: int | None) -> str:
    return "?" if value is None else f"{value / GiB:.2f}"


def calibration_skip_reason(report: StartupReport) -> str | None:
    """Why this startup cannot calibrate the memory model, in one clause; None if it can."""
    if report.budget_refused:
        device = f" {report.budget_device}" if report.budget_device else ""
        return (
            f"vLLM refused to start: free memory on device{device} "
            f"({_gib_text(report.initial_free_bytes)} of {_gib_text(report.total_bytes)} GiB) "
            f"is less than its budget (--gpu-memory-utilization {report.gpu_memory_utilization}, "
            f"{_gib_text(report.requested_bytes)} GiB); another process holds memory on that GPU"
        )
    if report.kv_cache_size_given:
        return (
            "vLLM was given the KV cache size (--kv-cache-memory-bytes) and skipped its "
            "memory profile, so its log measures no budget"
        )
    if report.available_kv_bytes is None and report.activation_bytes is None:
        found = "no vLLM memory summary found ('Available KV cache memory', 'Free memory on "
        found += "device ... Current kv cache memory in use' or 'Memory profiling takes')"
        if report.kv_cache_tokens is None and not report.ready:
            return f"{found}: the startup ended before vLLM sized its KV cache"
        return f"{found}; this release may print it only at DEBUG (VLLM_LOGGING_LEVEL=DEBUG)"
    if report.weights_bytes is None:
        return "vLLM's log has no 'Model loading took X GiB' line"
    return None


def calibration_from_report(
    report: StartupReport, *, source: str, cudagraph_in_budget: bool | None = None
) -> Calibration:
    if (reason := calibration_skip_reason(report)) is not None:
        raise LogParseError(f"{source}: {reason}")
    assert report.weights_bytes is not None  # calibration_skip_reason said so
    return Calibration(
        source=source,
        weights_bytes=report.weights_bytes,
        activation_bytes=report.activation_bytes,
        non_torch_bytes=report.non_torch_bytes,
        consumed_bytes=report.consumed_bytes,
        cudagraph_bytes=report.cudagraph_estimate_bytes or report.cudagraph_bytes,
        available_kv_bytes=report.available_kv_bytes,
        total_bytes=report.total_bytes,
        gpu_memory_utilization=report.gpu_memory_utilization,
        max_num_batched_tokens=report.max_num_batched_tokens,
        max_num_seqs=report.max_num_seqs,
        cudagraph_in_budget=cudagraph_in_budget,
        boot_state=report.boot_state,
    )

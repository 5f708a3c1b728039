"""The GPU's real cost of a preset model's prefill and decode steps against the twin's roofline.

What it measures, on one NVIDIA GPU with PyTorch (CUDA) and nothing else (no vLLM):

* the linear layers of ONE transformer layer of each preset model that fits the GPU in
  bf16 (fused q/k/v projection with grouped-query attention, o projection, fused
  gate/up projection, SiLU-and-mul, down projection, as vLLM's Llama layer runs them)
  for a decode step of 1, 8, 32, 128 and 256 sequences (tokens = batch) and a prefill
  step of 512 to 8192 tokens;
* that layer's attention with ``torch.nn.functional.scaled_dot_product_attention``:
  decode (one query per sequence against a KV cache of 1k, 4k and 16k tokens, batch 1
  to 256 where the whole model's KV cache would fit beside its weights in 90% of the
  GPU, as vLLM's default ``--gpu-memory-utilization`` allows) and causal prefill over
  512 to 8192 tokens;
* a step: the linear and attention times added.

Each point is timed with CUDA events: warm-up calls, then the median of several repeats
(each repeat a run of back-to-back calls, so short kernels are not measured as their
launch). One layer's time is multiplied by the model's layer count to give a step's.
The same step is then costed as the twin does (``tuner/sim/timing.py``,
``StepTimer.step_s``): compute ``2 x layer parameters x tokens`` plus attention's
``4 x layers x heads x head_dim x query-key pairs`` FLOPs at the GPU's dense bf16 peak
times MFU, memory the layers' weights once plus the KV cache read at HBM bandwidth
times MBU, the larger of the two; the printed ratio is measured / assumed at the
twin's defaults (MFU 0.50, MBU 0.80). The efficiency factors are then fitted to the
measured steps: MFU from the compute-bound ones (prefill), MBU from the memory-bound
ones (small-batch decode, where the weights are read once; long-context decode, where
the KV cache is read), each the geometric mean of what the points imply (least squares
of the log ratio), the split into compute- and memory-bound redone with the fitted
factors until it is stable. Points under 50 µs a layer at the paper rates are reported
but not fitted (launch latency and the L2 cache dominate them).

Assumptions, stated because they differ from a served vLLM:

* the KV cache is a dense tensor, not vLLM's paged blocks, and attention is PyTorch's
  SDPA (its fused kernels only: a point none of them takes is skipped, not timed on the
  math kernel), not vLLM's attention backend; decode folds the query heads that share a
  KV head into the query length, so K and V are read once per KV head, as a GQA kernel
  does; causal prefill uses SDPA's ``enable_gqa``, or K and V expanded beforehand;
* one layer stands for all of them (the embedding, the LM head, norms, rotary embedding
  and residual adds are not timed; the twin's side leaves the embedding and LM head out
  too); gemma-2's sliding-window layers are timed as full attention, as the twin counts
  them; MoE and MLA presets are not timed (their layers need expert routing and MLA
  kernels), and a preset whose layers another one already has (mistral-7b-v0.3's are
  llama-3.1-8b's) is timed once;
* no CUDA graphs and no per-step overhead: the scheduler, sampler, input preparation
  and graph replay that the twin's ``step_overhead_ms`` stands for are not measured
  here, so this script cannot fit it.

The twin's GPU and model presets are read from the repository (``tuner.vllm``) when it
imports; where it does not (no pydantic on the GPU host), copies of them below are used
(their source files are named beside them) and the output says so.

Without a CUDA GPU it exits with status 2 and one line; ``--dry-run`` runs the same
code on the CPU with a tiny model and tiny sizes (CPU timings: the ratios and fitted
factors it prints are meaningless; it is a smoke test).

Run: ``python benchmarks/gpu_step_costs.py [--out FILE]`` (from the repository root;
``--help`` for the GPU preset, the model selection and the time budget).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
NO_GPU_LINE = (
    "no CUDA GPU{why}: this benchmark times the GPU's kernels; run it on a GPU host "
    "(or pass --dry-run for a CPU smoke test)"
)

# The twin's defaults, copied from tuner/sim/timing.py (MFU, MBU, STEP_OVERHEAD_S).
MFU_DEFAULT = 0.50
MBU_DEFAULT = 0.80
STEP_OVERHEAD_S_DEFAULT = 0.0015

GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of the GPU for weights + KV cache
MIN_FIT_LAYER_S = 50e-6  # points quicker than this a layer at the paper rates are not fitted
TARGET_SAMPLE_S = 2e-3  # one timed repeat runs back-to-back calls for about this long
MAX_INNER_CALLS = 100

DECODE_BATCHES = (1, 8, 32, 128, 256)
DECODE_CONTEXTS = (1024, 4096, 16384)
PREFILL_TOKENS = (512, 1024, 2048, 4096, 8192)

DRY_DECODE_BATCHES = (1, 4)
DRY_DECODE_CONTEXTS = (64, 256)
DRY_PREFILL_TOKENS = (32, 128)
DRY_RUN_GPU = "H100-80GB"  # whose figures the dry run's arithmetic uses


@dataclass(frozen=True)
class Gpu:
    """What the roofline needs of a GPU preset."""

    name: str
    aliases: tuple[str, ...]
    bf16_dense_flops: float
    hbm_bandwidth_bytes_per_s: float
    cuda_total_bytes: int


# Copied from tuner/vllm/gpus.py (_PRESETS: name, aliases, bf16_dense_flops,
# hbm_bandwidth_bytes_per_s, cuda_total_bytes); used only where tuner does not import.
_MiB = 1024**2
_GiB = 1024**3
EMBEDDED_GPUS: tuple[Gpu, ...] = (
    Gpu(
        "A100-40GB",
        (
            "a100",
            "a100-sxm4-40gb",
            "nvidia a100-sxm4-40gb",
            "a100-40g",
            "nvidia a100 40gb",
            "nvidia a100 sxm4 40gb",
        ),
        312e12,
        1.555e12,
        int(39.39 * _GiB),
    ),
    Gpu(
        "A100-80GB",
        (
            "a100-sxm4-80gb",
            "nvidia a100-sxm4-80gb",
            "a100-80g",
            "a100-pcie-80gb",
            "nvidia a100 80gb",
            "nvidia a100 80gb pcie",
        ),
        312e12,
        2.039e12,
        int(79.15 * _GiB),
    ),
    Gpu(
        "H100-80GB",
        ("h100", "h100-sxm", "h100-80gb-hbm3", "nvidia h100 80gb hbm3", "h100-sxm5-80gb"),
        989e12,
        3.35e12,
        int(79.19 * _GiB),
    ),
    Gpu(
        "H100-PCIe-80GB",
        ("h100-pcie", "nvidia h100 pcie", "h100 pcie"),
        756e12,
        2.0e12,
        int(79.19 * _GiB),
    ),
    Gpu(
        "H200-141GB",
        ("h200", "nvidia h200", "h200-sxm", "h200-141gb-hbm3e"),
        989e12,
        4.8e12,
        143771 * _MiB - 600 * _MiB,
    ),
    Gpu("L4-24GB", ("l4", "nvidia l4"), 121e12, 300e9, int(21.96 * _GiB)),
    Gpu("L40S-48GB", ("l40s", "nvidia l40s"), 362e12, 864e9, int(44.39 * _GiB)),
    Gpu(
        "RTX-6000-Ada-48GB",
        ("rtx6000ada", "rtx-6000-ada", "nvidia rtx 6000 ada generation"),
        364e12,
        960e9,
        int(47.4 * _GiB),
    ),
    Gpu(
        "RTX-3090-24GB",
        ("rtx3090", "rtx-3090", "nvidia geforce rtx 3090"),
        71e12,
        936e9,
        int(23.58 * _GiB),
    ),
    Gpu(
        "RTX-4090-24GB",
        ("rtx4090", "rtx-4090", "nvidia geforce rtx 4090"),
        165e12,
        1008e9,
        int(23.65 * _GiB),
    ),
    Gpu(
        "RTX-A5000-24GB",
        ("rtxa5000", "rtx-a5000", "nvidia rtx a5000"),
        111e12,
        768e9,
        int(23.68 * _GiB),
    ),
    Gpu("B200-180GB", ("b200", "nvidia b200"), 2250e12, 8.0e12, 183359 * _MiB - 700 * _MiB),
)


@dataclass(frozen=True)
class Shape:
    """One model's shape as the twin sees it (``tuner.vllm.models.ModelSpec``)."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie_embeddings: bool = False
    attention_bias: bool = False
    kind: str = "dense"  # "dense", "moe" or "mla" (only dense ones are timed)
    dtype_bytes: float = 2.0

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """One layer's linear weights, as tuner/vllm/memory.py counts them with
        tensor parallelism 1 (``_attention_params`` + ``_mlp_params``)."""
        h = self.hidden
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.attention_bias else 0
        return 2 * h * self.q_dim + 2 * h * self.kv_dim + bias + 3 * h * self.intermediate

    @property
    def whole_params(self) -> int:
        """The whole model (tuner/vllm/memory.py ``parameter_count``)."""
        h = self.hidden
        embed = self.vocab * h * (1 if self.tie_embeddings else 2)
        return embed + self.layers * (self.layer_params + 2 * h) + h

    @property
    def weights_bytes(self) -> float:
        return self.whole_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        """All layers' K and V of one token (the twin's ``page_size_bytes x layers /
        block_size`` for a full-attention model)."""
        return 2 * self.kv_dim * self.dtype_bytes * self.layers

    def layer_key(self) -> tuple[int, ...]:
        return (
            self.hidden,
            self.intermediate,
            self.layers,
            self.heads,
            self.kv_heads,
            self.head_dim,
            int(self.attention_bias),
        )


# Copied from tuner/presets/models.json as tuner/vllm/models.py reads it (head_dim is
# hidden / heads where the config has none; attention_bias defaults to True for qwen2);
# used only where tuner does not import.
EMBEDDED_MODELS: tuple[Shape, ...] = (
    Shape("llama-3.1-8b", 4096, 14336, 32, 32, 8, 128, 128256),
    Shape("llama-3.1-70b", 8192, 28672, 80, 64, 8, 128, 128256),
    Shape("qwen2.5-7b", 3584, 18944, 28, 28, 4, 128, 152064, attention_bias=True),
    Shape("qwen2.5-72b", 8192, 29568, 80, 64, 8, 128, 152064, attention_bias=True),
    Shape("mistral-7b-v0.3", 4096, 14336, 32, 32, 8, 128, 32768),
    Shape("mixtral-8x7b", 4096, 14336, 32, 32, 8, 128, 32000, kind="moe"),
    Shape("qwen3-30b-a3b", 2048, 6144, 48, 32, 4, 128, 151936, kind="moe"),
    Shape("deepseek-v2-lite", 2048, 10944, 27, 16, 16, 128, 102400, kind="mla"),
    Shape("gemma-2-9b", 3584, 14336, 42, 16, 8, 256, 256000, tie_embeddings=True),
)

DRY_RUN_MODEL = Shape("tiny-dry-run", 128, 256, 2, 4, 2, 32, 512)


# --- output ----------------------------------------------------------------------------


class Out:
    """Prints a line and keeps it for the JSON file."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.extend(text.splitlines() or [""])


# --- the twin's presets and formulas -----------------------------------------------------


@dataclass
class Twin:
    gpus: tuple[Gpu, ...]
    models: tuple[Shape, ...]
    mfu: float
    mbu: float
    step_overhead_s: float
    source: str
    parse_step_costs: Callable[[str], str] | None = None  # TimingFactors.parse, spelled back
    drift: list[str] = field(default_factory=list)


def load_twin() -> Twin:
    """The presets and defaults from the repository, or the copies above."""
    if (REPO_ROOT / "tuner").is_dir() and str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    try:
        from tuner.sim.timing import MBU, MFU, STEP_OVERHEAD_S, TimingFactors
        from tuner.vllm.gpus import known_gpus
        from tuner.vllm.memory import parameter_count
        from tuner.vllm.models import preset_names, resolve_model
    except Exception as exc:  # no pydantic on the GPU host, or no repository around
        return Twin(
            EMBEDDED_GPUS,
            EMBEDDED_MODELS,
            MFU_DEFAULT,
            MBU_DEFAULT,
            STEP_OVERHEAD_S_DEFAULT,
            f"copies in this script (tuner does not import: {type(exc).__name__}: {exc})",
        )
    gpus = tuple(
        Gpu(
            g.name,
            tuple(g.aliases),
            g.bf16_dense_flops,
            g.hbm_bandwidth_bytes_per_s,
            g.cuda_total_bytes,
        )
        for g in known_gpus()
    )
    models: list[Shape] = []
    drift: list[str] = []
    for short in preset_names():
        spec = resolve_model(short)
        shape = Shape(
            short,
            spec.hidden_size,
            spec.intermediate_size,
            spec.num_layers,
            spec.num_attention_heads,
            spec.num_kv_heads,
            spec.head_dim,
            spec.vocab_size,
            tie_embeddings=spec.tie_word_embeddings,
            attention_bias=spec.attention_bias,
            kind="mla" if spec.is_mla else "moe" if spec.is_moe else "dense",
            dtype_bytes=spec.dtype_bytes,
        )
        models.append(shape)
        if shape.kind == "dense" and shape.whole_params != parameter_count(spec):
            drift.append(
                f"{short}: this script counts {shape.whole_params} parameters, "
                f"tuner.vllm.memory.parameter_count {parameter_count(spec)}"
            )

    def parse(text: str) -> str:
        return TimingFactors.parse(text).spelled()

    twin = Twin(
        gpus,
        tuple(models),
        MFU,
        MBU,
        STEP_OVERHEAD_S,
        "the repository (tuner.vllm.gpus, tuner.vllm.models, tuner.sim.timing)",
        parse,
        drift,
    )
    # The copies above must follow the repository; say where they no longer do.
    for copy, real in ((EMBEDDED_GPUS, gpus), (EMBEDDED_MODELS, tuple(models))):
        real_by_name: dict[str, Any] = {item.name: item for item in real}
        for item in copy:
            if real_by_name.get(item.name) != item:
                twin.drift.append(f"the copy of {item.name} in this script differs from tuner's")
        for name in real_by_name.keys() - {item.name for item in copy}:
            twin.drift.append(f"tuner has a preset {name} that this script has no copy of")
    if (MFU, MBU, STEP_OVERHEAD_S) != (MFU_DEFAULT, MBU_DEFAULT, STEP_OVERHEAD_S_DEFAULT):
        twin.drift.append("this script's copy of the twin's default factors differs")
    return twin


def _key(name: str) -> str:
    """As tuner/vllm/gpus.py's get_gpu compares names."""
    return name.strip().lower().replace("_", "-")


def _squeezed(name: str) -> str:
    return "".join(ch for ch in name.lower().replace("nvidia", "") if ch.isalnum())


def match_gpu(device_name: str, gpus: Sequence[Gpu]) -> tuple[Gpu | None, str]:
    """The preset for a CUDA/NVML device name, and how it was found."""
    wanted = _key(device_name)
    for gpu in gpus:
        if wanted == _key(gpu.name) or wanted in {_key(a) for a in gpu.aliases}:
            return gpu, "exact match (as tuner.vllm.gpus.get_gpu finds it)"
    # A variant the presets do not name (e.g. "NVIDIA H100 80GB HBM3e"): the preset
    # with the longest name or alias contained in the device's name.
    squeezed = _squeezed(device_name)
    best: tuple[int, Gpu] | None = None
    for gpu in gpus:
        for alias in (gpu.name, *gpu.aliases):
            token = _squeezed(alias)
            if token and token in squeezed and (best is None or len(token) > best[0]):
                best = (len(token), gpu)
    if best is not None:
        return best[1], "loose match on the device name: check that its figures are this GPU's"
    if "h200" in squeezed:
        h100 = next((g for g in gpus if g.name == "H100-80GB"), None)
        if h100 is not None:
            return (
                h100,
                "no H200 preset: the H100-80GB's figures are used (same FLOP/s, less bandwidth)",
            )
    return None, "no preset"


@dataclass(frozen=True)
class Work:
    """What a step (all layers) computes and reads, in the twin's terms."""

    flops: float
    bytes: float


def linear_work(shape: Shape, tokens: int) -> Work:
    """tuner/sim/timing.py: ``2 x params x tokens`` FLOPs; the weights read once."""
    params = shape.layer_params * shape.layers
    return Work(2.0 * params * tokens, params * shape.dtype_bytes)


def attention_work(shape: Shape, phase: str, batch: int, context: int) -> Work:
    """tuner/sim/timing.py: ``4 x layers x heads x head_dim x pairs`` FLOPs, the KV cache of
    the scheduled tokens read; pairs and context as tuner/sim/engine.py's ``_work`` counts
    them (a decode token after context - 1 computed ones; a prefill from nothing)."""
    if phase == "decode":
        pairs = batch * ((context - 1) + 1 / 2)
        kv_tokens = batch * context
    else:
        pairs = batch * context * (context / 2)
        kv_tokens = batch * context
    return Work(
        4.0 * shape.layers * shape.q_dim * pairs,
        kv_tokens * shape.kv_bytes_per_token,
    )


def roofline_s(work: Work, gpu: Gpu, mfu: float, mbu: float) -> tuple[float, float]:
    """The twin's compute and memory times (tuner/sim/timing.py ``StepTimer.step_s``,
    without its per-step and per-sequence overheads); the step takes the larger."""
    return (
        work.flops / (gpu.bf16_dense_flops * mfu),
        work.bytes / (gpu.hbm_bandwidth_bytes_per_s * mbu),
    )


# --- points ----------------------------------------------------------------------------


@dataclass
class Point:
    model: str
    kind: str  # "linear", "attention" or "step" (linear + attention)
    phase: str  # "decode" or "prefill"
    batch: int
    context: int  # decode: KV tokens per sequence; prefill: the prompt's tokens
    tokens: int  # tokens the step computes
    flops: float
    bytes: float
    layers: int
    measured_s: float | None = None  # one step: one layer's time x layers
    skipped: str | None = None

    def work(self) -> Work:
        return Work(self.flops, self.bytes)

    def label(self) -> str:
        if self.phase == "prefill":
            return f"{self.kind:<9} prefill T={self.tokens}"
        if self.kind == "linear":
            return f"{self.kind:<9} decode  B={self.batch}"
        return f"{self.kind:<9} decode  B={self.batch:<4} ctx={self.context}"


@dataclass
class Fit:
    mfu: float
    mbu: float
    mfu_points: int
    mbu_points: int
    notes: list[str]

    def step_costs(self) -> str:
        parts = []
        if self.mfu_points:
            parts.append(f"mfu={self.mfu:.3g}")
        if self.mbu_points:
            parts.append(f"mbu={self.mbu:.3g}")
        return ",".join(parts)


def fittable(point: Point, gpu: Gpu, min_layer_s: float) -> bool:
    if point.measured_s is None or point.measured_s <= 0:
        return False
    compute, memory = roofline_s(point.work(), gpu, 1.0, 1.0)
    return max(compute, memory) / point.layers >= min_layer_s


def fit_factors(
    points: Sequence[Point], gpu: Gpu, twin: Twin, min_layer_s: float
) -> tuple[Fit, list[bool]]:
    """MFU from the compute-bound points, MBU from the memory-bound ones, each the
    geometric mean of the factor every point implies; the split redone with the fitted
    factors until it no longer changes. Returns the fit and each point's split (True:
    compute-bound)."""
    usable = [p for p in points if fittable(p, gpu, min_layer_s)]
    mfu, mbu = twin.mfu, twin.mbu
    notes: list[str] = []
    split: list[bool] = []
    for _ in range(20):
        new_split = [
            roofline_s(p.work(), gpu, mfu, mbu)[0] >= roofline_s(p.work(), gpu, mfu, mbu)[1]
            for p in usable
        ]
        if new_split == split:
            break
        split = new_split
        compute = [p for p, c in zip(usable, split, strict=True) if c]
        memory = [p for p, c in zip(usable, split, strict=True) if not c]
        if compute:
            mfu = statistics.geometric_mean(
                p.flops / (gpu.bf16_dense_flops * (p.measured_s or math.inf)) for p in compute
            )
        if memory:
            mbu = statistics.geometric_mean(
                p.bytes / (gpu.hbm_bandwidth_bytes_per_s * (p.measured_s or math.inf))
                for p in memory
            )
        mfu, mbu = min(mfu, 1.0), min(mbu, 1.0)
    n_compute = sum(split)
    n_memory = len(split) - n_compute
    if not any(p.measured_s for p in points):
        notes.append("no point was measured")
    elif not usable:
        notes.append("no measured point is long enough to fit (all are launch-latency bound)")
    if not n_compute:
        notes.append(f"MFU not fitted (no compute-bound point): the twin's {twin.mfu:g} stays")
    if not n_memory:
        notes.append(f"MBU not fitted (no memory-bound point): the twin's {twin.mbu:g} stays")
    for name, value, n in (("MFU", mfu, n_compute), ("MBU", mbu, n_memory)):
        if n and value >= 1.0:
            notes.append(
                f"{name} came out at the cap of 1.0: the GPU beat the preset's paper figure "
                "(check the preset, or L2-cache effects)"
            )
    flags = {id(p): c for p, c in zip(usable, split, strict=True)}
    return Fit(mfu, mbu, n_compute, n_memory, notes), [flags.get(id(p), False) for p in points]


# --- timing on the device --------------------------------------------------------------


class Bench:
    """Builds one layer on the device and times its pieces."""

    def __init__(
        self,
        torch: Any,
        *,
        cuda: bool,
        repeats: int,
        warmup: int,
        deadline: float,
        out: Out,
    ) -> None:
        self.torch = torch
        self.f = torch.nn.functional
        self.cuda = cuda
        self.device = torch.device("cuda" if cuda else "cpu")
        self.dtype = torch.bfloat16
        self.repeats = repeats
        self.warmup = warmup
        self.deadline = deadline
        self.out = out
        oom = getattr(torch.cuda, "OutOfMemoryError", None)
        self.oom: tuple[type[BaseException], ...] = (
            (oom, MemoryError) if isinstance(oom, type) else (MemoryError,)
        )
        self.gqa_mode: str | None = None  # how causal prefill handles grouped KV heads
        # SDPA's fused kernels only: a silent fallback to the math kernel would time
        # a kernel no server runs (a point none of them takes is skipped, saying why).
        self.sdpa_kernels = "any SDPA kernel (this PyTorch cannot restrict them)"
        self._sdpa_context: Callable[[], Any] = contextlib.nullcontext
        try:
            attention = importlib.import_module("torch.nn.attention")
            names = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
            backends = [
                getattr(attention.SDPBackend, n) for n in names if hasattr(attention.SDPBackend, n)
            ]
            self._sdpa_context = lambda: attention.sdpa_kernel(backends)
            self.sdpa_kernels = "fused SDPA kernels only (flash, memory-efficient, cuDNN; no math)"
        except (ImportError, AttributeError):
            pass

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def randn(self, *size: int) -> Any:
        return self.torch.randn(*size, device=self.device, dtype=self.dtype).mul_(0.02)

    def time_s(self, fn: Callable[[], Any]) -> float:
        """Median seconds of one call: warm-up, then repeats of back-to-back calls."""
        for _ in range(self.warmup):
            fn()
        self.sync()
        started = time.perf_counter()
        fn()
        self.sync()
        estimate = max(time.perf_counter() - started, 1e-7)
        inner = max(1, min(MAX_INNER_CALLS, int(TARGET_SAMPLE_S / estimate)))
        samples: list[float] = []
        for _ in range(self.repeats):
            if self.cuda:
                start = self.torch.cuda.Event(enable_timing=True)
                end = self.torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(inner):
                    fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / 1000.0 / inner)
            else:
                started = time.perf_counter()
                for _ in range(inner):
                    fn()
                samples.append((time.perf_counter() - started) / inner)
        return statistics.median(samples)

    def room(self, needed_bytes: float) -> str | None:
        """Why a point cannot be tried, or None."""
        if time.monotonic() > self.deadline:
            return "skipped: over the --budget-s time budget"
        if self.cuda:
            free, _total = self.torch.cuda.mem_get_info()
            if needed_bytes > 0.95 * free:
                return f"skipped: needs {needed_bytes / _GiB:.1f} GiB, {free / _GiB:.1f} GiB free"
        return None

    def guarded(
        self, needed_bytes: float, run: Callable[[], float]
    ) -> tuple[float | None, str | None]:
        reason = self.room(needed_bytes)
        if reason is not None:
            return None, reason
        try:
            return run(), None
        except self.oom:
            return None, "skipped: out of memory"
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return None, f"skipped: {first[:160]}"
        finally:
            if self.cuda:
                self.torch.cuda.empty_cache()

    # The layer's linear part -------------------------------------------------------------

    def linear_layer(
        self, shape: Shape, tokens: Sequence[int]
    ) -> dict[int, tuple[float | None, str | None]]:
        """Per-layer seconds of the linear part at each token count."""
        results: dict[int, tuple[float | None, str | None]] = {}
        weights_bytes = shape.layer_params * 2
        reason = self.room(weights_bytes * 1.1)
        if reason is not None:
            return dict.fromkeys(tokens, (None, reason))
        h, q, kv, inter = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
        weights: dict[str, Any] = {}
        try:
            # vLLM's fused projections: QKVParallelLinear and MergedColumnParallelLinear.
            weights["qkv"] = self.randn(q + 2 * kv, h)
            weights["qkv_bias"] = self.randn(q + 2 * kv) if shape.attention_bias else None
            weights["o"] = self.randn(h, q)
            weights["gate_up"] = self.randn(2 * inter, h)
            weights["down"] = self.randn(h, inter)
        except self.oom:
            weights.clear()
            return dict.fromkeys(tokens, (None, "skipped: out of memory for the layer's weights"))
        f = self.f

        for n in tokens:

            def run(n: int = n) -> float:
                x = self.randn(n, h)
                attn = self.randn(n, q)  # stands for the attention's output

                def step() -> Any:
                    f.linear(x, weights["qkv"], weights["qkv_bias"])
                    f.linear(attn, weights["o"])
                    gate_up = f.linear(x, weights["gate_up"])
                    act = f.silu(gate_up[:, :inter]) * gate_up[:, inter:]
                    return f.linear(act, weights["down"])

                return self.time_s(step)

            activations = n * (2 * h + 2 * q + 2 * kv + 5 * inter) * 2
            results[n] = self.guarded(activations, run)
        weights.clear()
        if self.cuda:
            self.torch.cuda.empty_cache()
        return results

    # The layer's attention ---------------------------------------------------------------

    def attention_decode(
        self, shape: Shape, batch: int, context: int
    ) -> tuple[float | None, str | None]:
        """One query per sequence against a dense KV cache; the query heads that share a
        KV head are folded into the query length (exact for a single decode query)."""
        group = shape.heads // shape.kv_heads
        d = shape.head_dim

        def run() -> float:
            query = self.randn(batch, shape.kv_heads, group, d)
            key = self.randn(batch, shape.kv_heads, context, d)
            value = self.randn(batch, shape.kv_heads, context, d)
            with self._sdpa_context():
                return self.time_s(lambda: self.f.scaled_dot_product_attention(query, key, value))

        needed = 2 * batch * context * shape.kv_dim * 2 * 1.05
        return self.guarded(needed, run)

    def attention_prefill(self, shape: Shape, tokens: int) -> tuple[float | None, str | None]:
        """Causal self-attention over the prompt; grouped KV heads through SDPA's
        ``enable_gqa`` where this PyTorch has it, else K and V expanded beforehand."""
        group = shape.heads // shape.kv_heads
        d = shape.head_dim
        sdpa = self.f.scaled_dot_product_attention

        def run() -> float:
            query = self.randn(1, shape.heads, tokens, d)
            key = self.randn(1, shape.kv_heads, tokens, d)
            value = self.randn(1, shape.kv_heads, tokens, d)
            with self._sdpa_context():
                if group == 1:
                    return self.time_s(lambda: sdpa(query, key, value, is_causal=True))
                if self.gqa_mode != "expanded K/V":
                    try:
                        sdpa(query, key, value, is_causal=True, enable_gqa=True)
                        self.gqa_mode = "enable_gqa"
                        return self.time_s(
                            lambda: sdpa(query, key, value, is_causal=True, enable_gqa=True)
                        )
                    except (TypeError, RuntimeError) as exc:
                        if isinstance(exc, self.oom):
                            raise
                        self.gqa_mode = "expanded K/V"
                key = key.repeat_interleave(group, dim=1)
                value = value.repeat_interleave(group, dim=1)
                return self.time_s(lambda: sdpa(query, key, value, is_causal=True))

        needed = tokens * (2 * shape.q_dim + 2 * shape.heads * d) * 2 * 1.2
        return self.guarded(needed, run)


# --- the run ---------------------------------------------------------------------------


def kv_fits(shape: Shape, gpu_bytes: float, batch: int, context: int) -> bool:
    """Whether vLLM could hold this decode step's KV cache beside the model's weights."""
    budget = GPU_MEMORY_UTILIZATION * gpu_bytes - shape.weights_bytes
    return batch * context * shape.kv_bytes_per_token <= budget


def choose_models(
    twin: Twin, gpu_bytes: float, wanted: Sequence[str] | None, out: Out
) -> list[Shape]:
    chosen: list[Shape] = []
    seen: dict[tuple[int, ...], str] = {}
    for shape in twin.models:
        if wanted is not None and shape.name not in wanted:
            continue
        why = None
        if shape.kind != "dense":
            why = {
                "moe": "MoE layers: expert routing is not timed here",
                "mla": "MLA layers: latent attention is not timed here",
            }.get(shape.kind, f"{shape.kind} layers are not timed here")
        elif shape.weights_bytes > GPU_MEMORY_UTILIZATION * gpu_bytes:
            why = (
                f"its bf16 weights ({shape.weights_bytes / _GiB:.1f} GiB) do not fit in "
                f"{GPU_MEMORY_UTILIZATION:.0%} of the GPU ({gpu_bytes / _GiB:.1f} GiB)"
            )
        elif shape.layer_key() in seen:
            why = f"same layers as {seen[shape.layer_key()]}: its figures are those"
        if why is not None:
            out(f"  {shape.name}: not timed ({why})")
            continue
        seen[shape.layer_key()] = shape.name
        chosen.append(shape)
    if wanted is not None:
        unknown = set(wanted) - {s.name for s in twin.models}
        for name in sorted(unknown):
            out(f"  {name}: not a preset (known: {', '.join(s.name for s in twin.models)})")
    return chosen


def measure_model(
    bench: Bench,
    shape: Shape,
    gpu_bytes: float,
    batches: Sequence[int],
    contexts: Sequence[int],
    prefills: Sequence[int],
) -> list[Point]:
    layers = shape.layers

    def point(kind: str, phase: str, batch: int, context: int, tokens: int, work: Work) -> Point:
        return Point(
            shape.name, kind, phase, batch, context, tokens, work.flops, work.bytes, layers
        )

    linear_tokens = sorted({*batches, *prefills})
    linear = bench.linear_layer(shape, linear_tokens)
    points: list[Point] = []

    def settle(p: Point, result: tuple[float | None, str | None]) -> Point:
        layer_s, why = result
        p.measured_s = None if layer_s is None else layer_s * layers
        p.skipped = why
        return p

    for b in batches:
        points.append(settle(point("linear", "decode", b, 0, b, linear_work(shape, b)), linear[b]))
    for t in prefills:
        points.append(settle(point("linear", "prefill", 1, t, t, linear_work(shape, t)), linear[t]))
    attention: dict[tuple[str, int, int], Point] = {}
    for c in contexts:
        for b in batches:
            p = point("attention", "decode", b, c, b, attention_work(shape, "decode", b, c))
            if kv_fits(shape, gpu_bytes, b, c):
                settle(p, bench.attention_decode(shape, b, c))
            else:
                p.skipped = (
                    f"skipped: {b * c} tokens of KV ({b * c * shape.kv_bytes_per_token / _GiB:.0f} "
                    f"GiB) do not fit beside the weights in {GPU_MEMORY_UTILIZATION:.0%} of the GPU"
                )
            attention["decode", b, c] = p
            points.append(p)
    for t in prefills:
        p = point("attention", "prefill", 1, t, t, attention_work(shape, "prefill", 1, t))
        settle(p, bench.attention_prefill(shape, t))
        attention["prefill", 1, t] = p
        points.append(p)
    linear_points = {(p.phase, p.tokens): p for p in points if p.kind == "linear"}
    for (phase, b, c), attn in attention.items():
        lin = linear_points[phase, b if phase == "decode" else c]
        work = Work(lin.flops + attn.flops, lin.bytes + attn.bytes)
        step = point("step", phase, b, c, lin.tokens, work)
        if lin.measured_s is not None and attn.measured_s is not None:
            step.measured_s = lin.measured_s + attn.measured_s
        else:
            step.skipped = attn.skipped or lin.skipped
        points.append(step)
    return points


def describe_point(p: Point, gpu: Gpu, mfu: float, mbu: float) -> dict[str, Any]:
    compute, memory = roofline_s(p.work(), gpu, mfu, mbu)
    assumed = max(compute, memory)
    row: dict[str, Any] = asdict(p)
    row.update(
        assumed_s=assumed,
        bound="compute" if compute >= memory else "memory",
        ratio=None if p.measured_s is None else p.measured_s / assumed,
        implied_mfu=None
        if p.measured_s is None
        else p.flops / (gpu.bf16_dense_flops * p.measured_s),
        implied_mbu=None
        if p.measured_s is None
        else p.bytes / (gpu.hbm_bandwidth_bytes_per_s * p.measured_s),
    )
    return row


def print_rows(rows: Sequence[dict[str, Any]], points: Sequence[Point], out: Out) -> None:
    out(
        f"  {'point':<38} {'measured ms':>12} {'twin ms':>10} {'ratio':>6}  "
        f"{'twin bound':<10} implied"
    )
    for p, row in zip(points, rows, strict=True):
        assumed_ms = 1000 * row["assumed_s"]
        if p.measured_s is None:
            out(f"  {p.label():<38} {'-':>12} {assumed_ms:>10.4g} {'-':>6}  {p.skipped}")
            continue
        implied = (
            f"MFU {row['implied_mfu']:.3g}"
            if row["bound"] == "compute"
            else f"MBU {row['implied_mbu']:.3g}"
        )
        out(
            f"  {p.label():<38} {1000 * p.measured_s:>12.4g} {assumed_ms:>10.4g} "
            f"{row['ratio']:>6.3g}  {row['bound']:<10} {implied}"
        )


def ratio_spread(points: Sequence[Point], gpu: Gpu, mfu: float, mbu: float) -> str:
    ratios = [
        p.measured_s / max(roofline_s(p.work(), gpu, mfu, mbu))
        for p in points
        if p.measured_s is not None and p.measured_s > 0
    ]
    if not ratios:
        return "no measured point"
    return (
        f"measured/assumed geometric mean {statistics.geometric_mean(ratios):.2f}, "
        f"range {min(ratios):.2f} to {max(ratios):.2f} over {len(ratios)} steps"
    )


def component_factors(
    points: Sequence[Point], gpu: Gpu, fit: Fit, min_layer_s: float
) -> dict[str, dict[str, Any]]:
    """What each kind of point implies on its own, split with the fitted factors."""
    result: dict[str, dict[str, Any]] = {}
    for kind in ("linear", "attention"):
        for phase in ("prefill", "decode"):
            group = [
                p
                for p in points
                if p.kind == kind and p.phase == phase and fittable(p, gpu, min_layer_s)
            ]
            compute: list[float] = []
            memory: list[float] = []
            for p in group:
                c, m = roofline_s(p.work(), gpu, fit.mfu, fit.mbu)
                seconds = p.measured_s or math.inf
                if c >= m:
                    compute.append(p.flops / (gpu.bf16_dense_flops * seconds))
                else:
                    memory.append(p.bytes / (gpu.hbm_bandwidth_bytes_per_s * seconds))
            result[f"{kind} {phase}"] = {
                "mfu": statistics.geometric_mean(compute) if compute else None,
                "mfu_points": len(compute),
                "mbu": statistics.geometric_mean(memory) if memory else None,
                "mbu_points": len(memory),
            }
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        epilog="Run: python benchmarks/gpu_step_costs.py [--out FILE]",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("gpu_step_costs.json"),
        help="the JSON file to write (default: gpu_step_costs.json here)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="run on the CPU with a tiny model and tiny sizes (a smoke test; ratios meaningless)",
    )
    parser.add_argument(
        "--gpu",
        default=None,
        help="the twin's GPU preset to compare with (default: matched from the device's name)",
    )
    parser.add_argument(
        "--models",
        default=None,
        help="comma-separated presets to time (default: every dense preset that fits the GPU)",
    )
    parser.add_argument("--repeats", type=int, default=10, help="timed repeats per point")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per point")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help="points not started after this many seconds are skipped (default 420)",
    )
    return parser.parse_args(argv)


def import_torch() -> Any | None:
    try:
        return importlib.import_module("torch")
    except ImportError:
        return None


@dataclass(frozen=True)
class Sizes:
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    prefills: tuple[int, ...]
    min_fit_layer_s: float


def describe_device(torch: Any, cuda: bool, device_name: str, gpu_bytes: float) -> dict[str, Any]:
    return {
        "name": device_name,
        "count": int(torch.cuda.device_count()) if cuda else 0,
        "memory_bytes": gpu_bytes,
        "torch": str(torch.__version__),
        "cuda": str(torch.version.cuda) if cuda else None,
        "capability": list(torch.cuda.get_device_capability(0)) if cuda else None,
    }


def print_header(out: Out, twin: Twin, gpu: Gpu, how: str, device: dict[str, Any]) -> None:
    several = f" (device 0 of {device['count']})" if device["count"] > 1 else ""
    cuda = f", CUDA {device['cuda']}" if device["cuda"] else ""
    out(
        f"device: {device['name']}{several}, {device['memory_bytes'] / _GiB:.1f} GiB, "
        f"torch {device['torch']}{cuda}"
    )
    out(
        f"twin's preset: {gpu.name} ({how}): bf16 dense {gpu.bf16_dense_flops / 1e12:g} TFLOP/s, "
        f"HBM {gpu.hbm_bandwidth_bytes_per_s / 1e12:g} TB/s"
    )
    out(f"presets and defaults from {twin.source}")
    for line in twin.drift:
        out(f"  note: {line}")
    out(
        f"twin's defaults: MFU {twin.mfu:.2f}, MBU {twin.mbu:.2f}, "
        f"step overhead {1000 * twin.step_overhead_s:g} ms (not measured here)"
    )
    out(
        "assumptions: dense KV tensors instead of vLLM's paged blocks, PyTorch SDPA instead of "
        "vLLM's attention backend, one layer timed and scaled by the layer count, no CUDA "
        "graphs, no per-step overhead; times below are for a whole step (all layers)"
    )


def time_models(
    bench: Bench, models: Sequence[Shape], gpu: Gpu, gpu_bytes: float, twin: Twin, sizes: Sizes
) -> tuple[list[Point], list[dict[str, Any]]]:
    """Times every model, prints its table, and returns the points and the JSON rows."""
    out = bench.out
    all_points: list[Point] = []
    per_model: list[dict[str, Any]] = []
    for shape in models:
        model_started = time.monotonic()
        points = measure_model(
            bench, shape, gpu_bytes, sizes.batches, sizes.contexts, sizes.prefills
        )
        all_points.extend(points)
        out()
        out(
            f"{shape.name}: {shape.layers} layers, hidden {shape.hidden}, intermediate "
            f"{shape.intermediate}, {shape.heads} heads / {shape.kv_heads} KV heads x "
            f"{shape.head_dim}; {shape.layer_params / 1e6:.4g} M linear parameters a layer "
            f"(timed in {time.monotonic() - model_started:.1f} s; ratio = measured / twin at "
            "its defaults)"
        )
        rows = [describe_point(p, gpu, twin.mfu, twin.mbu) for p in points]
        print_rows(rows, points, out)
        fit, _ = fit_factors(
            [p for p in points if p.kind == "step"], gpu, twin, sizes.min_fit_layer_s
        )
        out(
            f"  fitted to {shape.name}'s steps alone: MFU {fit.mfu:.3g} "
            f"({fit.mfu_points} points), MBU {fit.mbu:.3g} ({fit.mbu_points} points)"
        )
        per_model.append(
            {
                "shape": asdict(shape),
                "layer_params": shape.layer_params,
                "whole_params": shape.whole_params,
                "kv_bytes_per_token": shape.kv_bytes_per_token,
                "points": rows,
                "fit": asdict(fit),
            }
        )
    out(f"attention ran with {bench.sdpa_kernels}")
    if bench.gqa_mode is not None:
        out(f"causal prefill with grouped KV heads ran with SDPA's {bench.gqa_mode}")
    return all_points, per_model


def summarize(
    out: Out, points: Sequence[Point], gpu: Gpu, twin: Twin, min_layer_s: float
) -> dict[str, Any]:
    """Fits the factors over every model's steps, prints them, returns them for the JSON."""
    steps = [p for p in points if p.kind == "step"]
    fit, _ = fit_factors(steps, gpu, twin, min_layer_s)
    components = component_factors(points, gpu, fit, min_layer_s)
    out()
    out(f"fitted over every timed model's steps (points over {1e6 * min_layer_s:g} µs a layer):")
    out(f"  {'':<22} {'fitted':>8} {'twin':>8} {'points':>7}")
    out(f"  {'MFU (compute-bound)':<22} {fit.mfu:>8.3g} {twin.mfu:>8.2f} {fit.mfu_points:>7}")
    out(f"  {'MBU (memory-bound)':<22} {fit.mbu:>8.3g} {twin.mbu:>8.2f} {fit.mbu_points:>7}")
    for note in fit.notes:
        out(f"  note: {note}")
    out("  each kind of point on its own (geometric mean, split by the fitted factors):")
    for name, values in components.items():
        mfu = "-" if values["mfu"] is None else f"{values['mfu']:.3g} ({values['mfu_points']})"
        mbu = "-" if values["mbu"] is None else f"{values['mbu']:.3g} ({values['mbu_points']})"
        out(f"    {name:<18} MFU {mfu:<12} MBU {mbu}")
    out("  steps against the twin:")
    out(f"    at its defaults:       {ratio_spread(steps, gpu, twin.mfu, twin.mbu)}")
    out(f"    at the fitted factors: {ratio_spread(steps, gpu, fit.mfu, fit.mbu)}")
    step_costs = fit.step_costs()
    accepted = False
    if step_costs:
        if twin.parse_step_costs is not None:
            try:
                twin.parse_step_costs(step_costs)
                accepted = True
            except ValueError as exc:
                first = str(exc).strip().splitlines()[0]
                out(f"  note: tuner's TimingFactors.parse refuses it: {first}")
        out(f"--step-costs {step_costs}")
        out(
            f"  (for `tuner sim-serve --gpu {gpu.name} --step-costs {step_costs}`"
            + ("; TimingFactors.parse accepts it" if accepted else "")
            + ")"
        )
    else:
        out("no --step-costs string: nothing was fitted")
    out(
        "  per-step overhead is not measurable this way (kernel times only: no scheduler, "
        "sampler, input preparation or CUDA-graph replay); keep the twin's "
        f"step_overhead_ms={1000 * twin.step_overhead_s:g} or fit it to a served engine"
    )
    return {**asdict(fit), "step_costs": step_costs, "components": components}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    dry_run: bool = args.dry_run
    torch = import_torch()
    if torch is None:
        if dry_run:
            print("--dry-run needs PyTorch (a CPU build is enough): not installed", file=sys.stderr)
        else:
            print(NO_GPU_LINE.format(why=" (PyTorch is not installed here)"), file=sys.stderr)
        return 2
    cuda = not dry_run and bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    if not cuda and not dry_run:
        print(NO_GPU_LINE.format(why=""), file=sys.stderr)
        return 2

    started = time.monotonic()
    twin = load_twin()
    device_name = "cpu (dry run)" if dry_run else str(torch.cuda.get_device_name(0))
    gpu, how = match_gpu(args.gpu or (DRY_RUN_GPU if dry_run else device_name), twin.gpus)
    if gpu is None:
        known = ", ".join(g.name for g in twin.gpus)
        print(
            f"the twin has no preset for {args.gpu or device_name!r}; pass --gpu with one of: "
            f"{known}",
            file=sys.stderr,
        )
        return 2
    out = Out()
    out("GPU step costs: one layer's matrix products and attention against the twin's roofline")
    if dry_run:
        out(
            "DRY RUN on the CPU with a tiny model: CPU timings against a GPU's figures, so every "
            "ratio and fitted factor below is meaningless (a smoke test of the code path)"
        )
        torch.set_num_threads(1)
        gpu_bytes = float(gpu.cuda_total_bytes)
        how = f"the dry run's stand-in; {how}"
    else:
        gpu_bytes = float(torch.cuda.get_device_properties(0).total_memory)
    device = describe_device(torch, cuda, device_name, gpu_bytes)
    print_header(out, twin, gpu, how, device)

    if dry_run:
        out(f"models a GPU run would time on a {gpu.name}:")
        choose_models(twin, gpu_bytes, None, out)
        models = [DRY_RUN_MODEL]
        sizes = Sizes(DRY_DECODE_BATCHES, DRY_DECODE_CONTEXTS, DRY_PREFILL_TOKENS, 0.0)
    else:
        wanted = None
        if args.models is not None:
            wanted = [m.strip() for m in args.models.split(",") if m.strip()]
        out("models:")
        models = choose_models(twin, gpu_bytes, wanted, out)
        sizes = Sizes(DECODE_BATCHES, DECODE_CONTEXTS, PREFILL_TOKENS, MIN_FIT_LAYER_S)
    out("  timed: " + (", ".join(m.name for m in models) or "none"))
    if not models:
        out("nothing to time")
        return 2

    torch.manual_seed(0)
    bench = Bench(
        torch,
        cuda=cuda,
        repeats=max(1, args.repeats),
        warmup=max(0, args.warmup),
        deadline=started + args.budget_s,
        out=out,
    )
    points, per_model = time_models(bench, models, gpu, gpu_bytes, twin, sizes)
    fit = summarize(out, points, gpu, twin, sizes.min_fit_layer_s)
    if dry_run:
        out("DRY RUN: the figures above are CPU timings; they say nothing about any GPU")
    elapsed = time.monotonic() - started
    out(f"done in {elapsed:.1f} s; JSON: {args.out}")

    report = {
        "benchmark": "gpu_step_costs",
        "dry_run": dry_run,
        "device": device,
        "gpu_preset": asdict(gpu),
        "gpu_preset_match": how,
        "presets_from": twin.source,
        "preset_drift": twin.drift,
        "twin_defaults": {
            "mfu": twin.mfu,
            "mbu": twin.mbu,
            "step_overhead_s": twin.step_overhead_s,
        },
        "settings": {
            **asdict(sizes),
            "repeats": bench.repeats,
            "warmup": bench.warmup,
            "budget_s": args.budget_s,
            "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
            "prefill_gqa": bench.gqa_mode,
            "sdpa_kernels": bench.sdpa_kernels,
            "attention": "torch.nn.functional.scaled_dot_product_attention, dense KV tensors",
        },
        "models": per_model,
        "fit": fit,
        "step_overhead": "not measured: kernel times only",
        "elapsed_s": elapsed,
        "printed": out.lines,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

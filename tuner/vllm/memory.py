"""vLLM's startup memory accounting, reproduced: settings in, MemoryPlan out.

vLLM (V1 engine) sizes its KV cache at startup like this
(``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``,
``vllm/v1/core/kv_cache_utils.py``):

1. ``requested = total_memory x gpu_memory_utilization``; startup fails when the
   device's free memory is below it.
2. The weights are loaded, then a profile run pushes ``max_num_batched_tokens``
   tokens through the model and samples ``max_num_seqs`` rows of logits. The
   torch peak increase is the *activation* memory; memory allocated outside torch
   (NCCL, CUDA context growth) is the *non-torch* memory.
3. ``available_kv = requested - (weights + activation + non_torch)``; from 0.20 on
   the CUDA-graph memory is estimated before this and subtracted too (before,
   graphs were captured after the KV cache was allocated, out of the headroom).
4. Each attention layer needs a page of ``2 x block_size x kv_heads_per_rank x
   head_size x dtype_bytes`` per block (MLA: one latent vector of
   ``kv_lora_rank + qk_rope_head_dim`` per token); layers are grouped as vLLM
   groups them; ``num_blocks = available // (page x layers_per_group)``.
5. ``Maximum concurrency = num_blocks / blocks one max-length request needs`` and
   ``GPU KV cache size`` = ``num_blocks // groups x block_size`` tokens (up to
   0.20) or ``int(max_concurrency x max_model_len)`` (0.21 on).

The components the model cannot know exactly (activation, non-torch, CUDA-graph
memory) are estimated by the formulas below; a real startup log replaces them
with measured values (``Calibration``), after which predictions for the same
model and GPU are exact.
"""

from __future__ import annotations

import math
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from tuner.errors import ConfigError
from tuner.vllm import messages as msg
from tuner.vllm.boot import BootState, cold_compile_bytes, warm_activation_of
from tuner.vllm.failures import StartupFailure
from tuner.vllm.gpus import GiB, GpuSpec, MiB
from tuner.vllm.models import AttentionKind, ModelSpec
from tuner.vllm.versions import (
    BIG_GPU_TIER,
    SLIDING_WINDOW_IN_FLIGHT,
    TOKENS_FROM_CONCURRENCY,
    VllmVersion,
)

KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
VOCAB_PADDING = 64

# Estimation constants, in one place. Sources: fitted on the public startup logs in
# tests/fixtures/vllm_logs (see benchmarks/memory_accuracy.py for the fit's error).
SAMPLER_FP32_COPIES = 3.0  # logits, probabilities and sampling noise, fp32, max_num_seqs rows
HIDDEN_COPIES = 3.0  # residual, hidden states and norm output during the forward pass
NON_TORCH_TP1_BYTES = int(0.20 * GiB)  # CUDA context growth, cuBLAS workspaces
NON_TORCH_PER_EXTRA_RANK_BYTES = int(0.05 * GiB)  # NCCL and custom all-reduce buffers
NON_TORCH_TP_BASE_BYTES = int(0.35 * GiB)
CUDAGRAPH_BASE_BYTES = int(0.25 * GiB)
CUDAGRAPH_PER_LAYER_BYTES = 6 * MiB
# What must still be free once the KV cache is allocated: vLLM's own 150 MiB
# allowance for allocator slack, sampler warm-up and graph-pool growth.
RUNTIME_RESERVE_BYTES = 150 * MiB


class ServingParams(BaseModel):
    """The vLLM flags that shape startup memory; None means vLLM's default."""

    model_config = ConfigDict(frozen=True)

    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    cpu_offload_gb: float = 0.0
    kv_cache_memory_bytes: int | None = None
    enable_chunked_prefill: bool = True
    # Memory other processes hold on the device (bytes); 0 on a dedicated GPU.
    other_process_bytes: int = 0

    def checked(self) -> ServingParams:
        """Raise ConfigError naming the first value no vLLM would take."""
        util = self.gpu_memory_utilization
        if util is not None and not (0.0 < util <= 1.0):
            raise ConfigError(
                f"--gpu-memory-utilization {util} is out of range; accepted: 0 < value <= 1"
            )
        positive = {
            "--max-num-seqs": self.max_num_seqs,
            "--max-num-batched-tokens": self.max_num_batched_tokens,
            "--max-model-len": self.max_model_len,
            "--tensor-parallel-size": self.tensor_parallel_size,
            "--block-size": self.block_size,
            "--kv-cache-memory-bytes": self.kv_cache_memory_bytes,
        }
        for flag, value in positive.items():
            if value is not None and value < 1:
                raise ConfigError(f"{flag} {value} is out of range; accepted: an integer >= 1")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"--kv-cache-dtype {self.kv_cache_dtype!r} is not accepted; accepted: "
                + ", ".join(KV_CACHE_DTYPES)
            )
        if not (math.isfinite(self.cpu_offload_gb) and self.cpu_offload_gb >= 0):
            raise ConfigError(
                f"--cpu-offload-gb {self.cpu_offload_gb} is not accepted; accepted: a finite "
                "number of GiB >= 0"
            )
        if self.other_process_bytes < 0:
            raise ConfigError(
                f"memory used by other processes {self.other_process_bytes} is negative"
            )
        return self


class Calibration(BaseModel):
    """Components measured by a real vLLM startup; None where the log did not say."""

    model_config = ConfigDict(frozen=True)

    source: str
    weights_bytes: int | None = None
    activation_bytes: int | None = None
    non_torch_bytes: int | None = None
    # Weights + non-torch (+ the CUDA-graph estimate within the budget), 0.28 on.
    consumed_bytes: int | None = None
    cudagraph_bytes: int | None = None
    available_kv_bytes: int | None = None
    total_bytes: int | None = None
    # The settings of the calibrating run, so other settings can be predicted.
    gpu_memory_utilization: float | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    cudagraph_in_budget: bool | None = None
    # The boot the log measured (tuner.vllm.boot): a cold one's activation holds the compile
    # memory, taken off to predict warm boots (None: not recorded, taken as it is).
    boot_state: BootState | None = None
    # Cold compile memory as a share of the warm activation, measured by a cold and a warm
    # boot of the same run (None: the model's COLD_COMPILE_FACTOR).
    compile_factor: float | None = None
    # The boot production pods start in, which the tune's predictions state (--production-boot).
    production_boot: BootState | None = None
    # How the calibration was converted to the production boot, in words.
    boot_note: str | None = None


class MemoryComponent(StrEnum):
    """A part of vLLM's startup budget."""

    WEIGHTS = "weights"
    ACTIVATION = "activation"
    NON_TORCH = "non_torch"
    CUDAGRAPH = "cudagraph"


class AppliedCalibration(BaseModel):
    """Which components of a plan came from a real log, and how."""

    model_config = ConfigDict(frozen=True)

    source: str
    # Printed by vLLM in the log (activation shifted to other batch limits by the model).
    measured: list[MemoryComponent]
    # Solved from the log's budget (what the KV memory it printed leaves for them).
    derived: list[MemoryComponent]
    # Still the model's estimate.
    estimated: list[MemoryComponent]


class MemoryPlan(BaseModel):
    """What vLLM will do at startup with these settings, predicted."""

    model_config = ConfigDict(frozen=True)

    model: str
    gpu: str
    vllm_version: str
    fits: bool
    failure: StartupFailure | None
    calibrated: bool
    # What the calibration supplied (None: uncalibrated).
    calibration: AppliedCalibration | None = None
    total_bytes: int
    free_bytes: int
    requested_bytes: int
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    cudagraph_bytes: int
    kv_cache_bytes: int
    page_size_bytes: int
    num_kv_cache_groups: int
    num_gpu_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    kv_cache_dtype: str
    tensor_parallel_size: int
    gpu_memory_utilization: float
    estimated_max_model_len: int | None = None
    # The boot predicted: a cold one's activation holds compile_bytes of torch.compile's
    # memory, which its KV cache does not get (tuner.vllm.boot).
    boot_state: BootState = BootState.WARM
    compile_bytes: int = 0

    @property
    def headroom_bytes(self) -> int:
        """Device memory left beyond vLLM's budget once it is running."""
        return self.free_bytes - self.requested_bytes


# --- defaults ---------------------------------------------------------------------------


def default_limits(gpu: GpuSpec, version: VllmVersion) -> tuple[int, int]:
    """vLLM's OpenAI-server defaults (max_num_seqs, max_num_batched_tokens) for a GPU.

    vLLM uses larger defaults on GPUs with at least 70 GiB that are not A100s, and
    (from 0.28) 16384 batched tokens on GPUs with at least 160 GiB.
    """
    if gpu.cuda_total_bytes >= 160 * GiB and version.at_least(BIG_GPU_TIER):
        return 1024, 16384
    if gpu.cuda_total_bytes >= 70 * GiB and "a100" not in gpu.name.lower():
        return 1024, 8192
    return 256, 2048


def default_block_size(model: ModelSpec, gpu: GpuSpec, requested: int | None) -> int:
    """The block size vLLM uses: MLA backends force theirs (FlashMLA 64, CUTLASS MLA 128)."""
    if model.is_mla and gpu.compute_capability[0] >= 10:
        return 128
    if model.is_mla and gpu.compute_capability[0] == 9:
        return 64
    return requested or 16


def kv_dtype_bytes(kv_cache_dtype: str, model: ModelSpec) -> float:
    if kv_cache_dtype.startswith("fp8"):
        return 1.0
    return model.dtype_bytes


# --- the components ---------------------------------------------------------------------


def _pad(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def weights_bytes(model: ModelSpec, tp: int, cpu_offload_gb: float = 0.0) -> int:
    """Weights one tensor-parallel rank holds on the GPU, as vLLM's loader reports it."""
    dt = model.dtype_bytes
    h = model.hidden_size
    vocab = _pad(model.vocab_size, VOCAB_PADDING)
    embed = vocab * h * (1 if model.tie_word_embeddings else 2)
    linear = 0.0
    for layer in range(model.num_layers):
        linear += _attention_params(model, tp) + _mlp_params(model, layer) / tp
    norms = model.num_layers * 2 * h + h
    if model.architecture.startswith("Gemma2"):
        norms = model.num_layers * 4 * h + h
    linear_bytes = model.quantization.linear_bytes_per_param or dt
    if model.checkpoint_bytes is not None:
        on_gpu = model.checkpoint_bytes / tp
    else:
        on_gpu = embed * dt / tp + linear * linear_bytes + norms * dt
    rotary = model.max_position_embeddings * max(model.rotary_dim, 0) * dt
    total = on_gpu + rotary - cpu_offload_gb * 1e9
    return max(int(total), 0)


def parameter_count(model: ModelSpec) -> int:
    """Parameters of the whole model (embeddings, attention, MLP/experts, norms)."""
    h = model.hidden_size
    embed = model.vocab_size * h * (1 if model.tie_word_embeddings else 2)
    layers = sum(
        _attention_params(model, 1) + _mlp_params(model, i) for i in range(model.num_layers)
    )
    return int(embed + layers + model.num_layers * 2 * h + h)


def _attention_params(model: ModelSpec, tp: int) -> float:
    """Attention weights of one layer on one rank (KV heads replicate when fewer than ranks)."""
    h = model.hidden_size
    heads = model.num_attention_heads
    if model.is_mla:
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        q = (
            h * model.q_lora_rank + model.q_lora_rank * heads * qk
            if model.q_lora_rank
            else h * heads * qk
        )
        kv_a = h * (model.kv_lora_rank + model.qk_rope_head_dim)
        kv_b = model.kv_lora_rank * heads * (model.qk_nope_head_dim + model.v_head_dim)
        o = heads * model.v_head_dim * h
        return (q + kv_b + o) / tp + kv_a
    hd = model.head_dim
    kv_per_rank = max(1, model.num_kv_heads // tp) if model.num_kv_heads >= tp else 1
    q_o = 2 * h * heads * hd / tp
    kv = 2 * h * kv_per_rank * hd
    bias = ((heads / tp) + 2 * kv_per_rank) * hd if model.attention_bias else 0.0
    return q_o + kv + bias


def _mlp_params(model: ModelSpec, layer: int) -> float:
    h = model.hidden_size
    if not model.is_moe or layer < model.num_dense_layers:
        return 3 * h * model.intermediate_size
    experts = model.num_experts * 3 * h * model.moe_intermediate_size
    shared = 3 * h * model.shared_expert_intermediate_size
    router = h * model.num_experts
    return experts + shared + router


def activation_bytes(
    model: ModelSpec, tp: int, max_num_batched_tokens: int, max_num_seqs: int
) -> int:
    """Torch peak increase of vLLM's profile run on one rank.

    The profile run is one forward pass of ``max_num_batched_tokens`` tokens, then
    a sampler pass over ``max_num_seqs`` rows of logits in fp32.
    """
    dt = model.dtype_bytes
    tokens = max_num_batched_tokens
    seqs = min(max_num_seqs, tokens)
    h = model.hidden_size
    hidden = HIDDEN_COPIES * tokens * h * dt
    if model.is_mla:
        heads = model.num_attention_heads / tp
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        attention = tokens * heads * (2 * qk + model.v_head_dim) * dt
    else:
        heads = model.num_attention_heads / tp
        kv = max(1, model.num_kv_heads // tp)
        attention = tokens * (2 * heads + 2 * kv) * model.head_dim * dt
    if model.is_moe:
        topk = max(model.num_experts_per_tok, 1)
        inter = model.moe_intermediate_size / tp
        mlp = tokens * topk * (3 * inter + h) * dt + tokens * model.num_experts * 4
        if model.shared_expert_intermediate_size:
            mlp += tokens * 3 * model.shared_expert_intermediate_size / tp * dt
    else:
        mlp = tokens * 3 * (model.intermediate_size / tp) * dt
    forward = hidden + max(attention, mlp)
    vocab = _pad(model.vocab_size, VOCAB_PADDING)
    sampler = tokens * h * dt + seqs * vocab * dt + SAMPLER_FP32_COPIES * seqs * vocab * 4
    return int(max(forward, sampler))


def non_torch_bytes(tp: int) -> int:
    if tp == 1:
        return NON_TORCH_TP1_BYTES
    return NON_TORCH_TP_BASE_BYTES + NON_TORCH_PER_EXTRA_RANK_BYTES * (tp - 1)


def cudagraph_bytes(model: ModelSpec, enforce_eager: bool) -> int:
    if enforce_eager:
        return 0
    return CUDAGRAPH_BASE_BYTES + CUDAGRAPH_PER_LAYER_BYTES * model.num_layers


# --- KV cache layout --------------------------------------------------------------------


class _Group(BaseModel):
    kind: AttentionKind
    num_layers: int


def page_size_bytes(model: ModelSpec, block_size: int, kv_cache_dtype: str, tp: int) -> int:
    """Bytes one layer needs for one block on one rank."""
    dt = kv_dtype_bytes(kv_cache_dtype, model)
    if model.is_mla:
        return int(block_size * (model.kv_lora_rank + model.qk_rope_head_dim) * dt)
    kv_heads = max(1, model.num_kv_heads // tp)
    return int(2 * block_size * kv_heads * model.head_dim * dt)


def kv_cache_groups(model: ModelSpec) -> list[_Group]:
    """Layers grouped as vLLM's hybrid KV-cache manager groups them.

    One attention type: one group of every layer. Several types with one page
    size: groups of ``min(layers per type)`` layers, each group holding one type.
    """
    counts: dict[AttentionKind, int] = {}
    for kind in model.layer_attention:
        counts[kind] = counts.get(kind, 0) + 1
    if len(counts) == 1:
        ((kind, n),) = counts.items()
        return [_Group(kind=kind, num_layers=n)]
    group_size = min(counts.values())
    groups: list[_Group] = []
    for kind, n in counts.items():
        for _ in range(math.ceil(n / group_size)):
            groups.append(_Group(kind=kind, num_layers=group_size))
    return groups


def _group_blocks(
    model: ModelSpec, kind: AttentionKind, max_model_len: int, block_size: int, in_flight: int
) -> int:
    """Blocks one max-length request needs in one group (vLLM's max_memory_usage_bytes / page)."""
    if kind is AttentionKind.SLIDING and model.sliding_window:
        tokens = min(model.sliding_window - 1 + in_flight, max_model_len)
        return -(-tokens // block_size) + 1
    return -(-max_model_len // block_size)


def _blocks_per_request(
    model: ModelSpec, groups: list[_Group], max_model_len: int, block_size: int, in_flight: int
) -> int:
    """Blocks of the shared pool one max-length request needs, summed over groups."""
    return sum(_group_blocks(model, g.kind, max_model_len, block_size, in_flight) for g in groups)


def _request_bytes(
    groups: list[_Group],
    page: int,
    model: ModelSpec,
    max_model_len: int,
    block_size: int,
    in_flight: int,
) -> int:
    """KV bytes one request of max_model_len tokens needs, over every layer."""
    return sum(
        _group_blocks(model, g.kind, max_model_len, block_size, in_flight) * page * g.num_layers
        for g in groups
    )


def _estimate_max_model_len(
    model: ModelSpec,
    groups: list[_Group],
    page: int,
    block_size: int,
    kv_bytes: int,
    upper: int,
    in_flight: int,
) -> int:
    """Largest max_model_len whose one request fits (0 if none), by binary search as vLLM does."""
    lo, hi, best = 1, upper, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if _request_bytes(groups, page, model, mid, block_size, in_flight) <= kv_bytes:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


# --- the plan ---------------------------------------------------------------------------


def plan(
    model: ModelSpec,
    gpu: GpuSpec,
    params: ServingParams,
    version: VllmVersion | None = None,
    calibration: Calibration | None = None,
    *,
    boot: BootState = BootState.WARM,
) -> MemoryPlan:
    """Predict vLLM's startup for these settings: fits or which failure, and the KV cache,
    on a ``boot`` with the compile cache warm (default) or cold (``tuner.vllm.boot``)."""
    params = params.checked()
    version = version or VllmVersion.current()
    tp = params.tensor_parallel_size
    utilization = params.gpu_memory_utilization or version.default_gpu_memory_utilization
    default_seqs, default_tokens = default_limits(gpu, version)
    max_model_len = params.max_model_len or model.max_position_embeddings
    max_num_batched_tokens = params.max_num_batched_tokens or (
        default_tokens if params.enable_chunked_prefill else max(max_model_len, default_tokens)
    )
    # A defaulted max_num_seqs is capped at max_num_batched_tokens.
    max_num_seqs = params.max_num_seqs or min(default_seqs, max_num_batched_tokens)
    block_size = default_block_size(model, gpu, params.block_size)
    total = (
        calibration.total_bytes if calibration and calibration.total_bytes else gpu.cuda_total_bytes
    )
    free = total - params.other_process_bytes
    requested = math.ceil(total * utilization)

    weights = weights_bytes(model, tp, params.cpu_offload_gb)
    activation = activation_bytes(model, tp, max_num_batched_tokens, max_num_seqs)
    non_torch = non_torch_bytes(tp)
    graphs = cudagraph_bytes(model, params.enforce_eager)
    applied = None
    if calibration is not None:
        (weights, activation, non_torch, graphs), applied = _apply_calibration(
            calibration,
            model,
            tp,
            params.cpu_offload_gb,
            utilization,
            total,
            max_num_batched_tokens,
            max_num_seqs,
            (weights, activation, non_torch, graphs),
            version,
            (default_seqs, default_tokens),
        )
    compiled = 0
    if boot is BootState.COLD and params.kv_cache_memory_bytes is None:
        # Given --kv-cache-memory-bytes, vLLM skips the profile the compile inflates.
        factor = calibration.compile_factor if calibration is not None else None
        compiled = cold_compile_bytes(activation, enforce_eager=params.enforce_eager, factor=factor)
        activation += compiled
    graphs_in_budget = graphs if version.cudagraph_in_budget else 0
    if params.kv_cache_memory_bytes is not None:
        kv_bytes = params.kv_cache_memory_bytes
    else:
        kv_bytes = requested - weights - activation - non_torch - graphs_in_budget

    groups = kv_cache_groups(model)
    page = page_size_bytes(model, block_size, params.kv_cache_dtype, tp)
    layers_per_group = max(g.num_layers for g in groups)
    num_blocks = int(kv_bytes // page // layers_per_group) if kv_bytes > 0 else 0
    in_flight = max_num_batched_tokens * (2 if version.at_least(SLIDING_WINDOW_IN_FLIGHT) else 1)
    per_request = _blocks_per_request(model, groups, max_model_len, block_size, in_flight)
    concurrency = num_blocks / per_request
    if version.at_least(TOKENS_FROM_CONCURRENCY):
        tokens = int(concurrency * max_model_len)
    else:
        tokens = num_blocks // len(groups) * block_size

    sized = MemoryPlan(
        fits=True,
        failure=None,
        model=model.name,
        gpu=gpu.name,
        vllm_version=str(version),
        calibrated=calibration is not None,
        calibration=applied,
        total_bytes=total,
        free_bytes=free,
        requested_bytes=requested,
        weights_bytes=weights,
        activation_bytes=activation,
        non_torch_bytes=non_torch,
        cudagraph_bytes=graphs,
        kv_cache_bytes=int(kv_bytes),
        page_size_bytes=page,
        num_kv_cache_groups=len(groups),
        num_gpu_blocks=num_blocks,
        kv_cache_tokens=tokens,
        max_concurrency=round(concurrency, 2),
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        kv_cache_dtype=params.kv_cache_dtype,
        tensor_parallel_size=tp,
        gpu_memory_utilization=utilization,
        boot_state=boot,
        compile_bytes=compiled,
    )
    failure = _invalid_configuration(model, gpu, params, version, sized)
    estimated = None
    if failure is None:
        failure, estimated = _memory_failure(model, version, sized, groups, in_flight)
    if failure is None:
        return sized
    return sized.model_copy(
        update={"fits": False, "failure": failure, "estimated_max_model_len": estimated}
    )


def _apply_calibration(
    cal: Calibration,
    model: ModelSpec,
    tp: int,
    cpu_offload_gb: float,
    utilization: float,
    total: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    predicted: tuple[int, int, int, int],
    version: VllmVersion,
    default_limits_: tuple[int, int],
) -> tuple[tuple[int, int, int, int], AppliedCalibration]:
    """Replace predicted (weights, activation, non-torch, graphs) by measured ones.

    A log that gives every component replaces each. Otherwise what the log's KV
    memory leaves of its budget (or, without a KV line, its consumed memory) fixes
    what the log does not give: non-torch memory when the activation is measured,
    else activation plus non-torch (split as the model splits it). So the KV
    memory at the log's own settings is the one it printed. Activation measured at
    other batch limits is shifted by the model's predicted difference (a log that does
    not print its batch limits ran with vLLM's defaults for the GPU and release).
    """
    weights, activation, non_torch, graphs = predicted
    measured: list[MemoryComponent] = []
    derived: list[MemoryComponent] = []
    if cal.weights_bytes is not None:
        weights = max(cal.weights_bytes - int(cpu_offload_gb * 1e9), 0)
        measured.append(MemoryComponent.WEIGHTS)
    if cal.cudagraph_bytes is not None:
        graphs = cal.cudagraph_bytes
        measured.append(MemoryComponent.CUDAGRAPH)
    log_tokens = cal.max_num_batched_tokens or default_limits_[1]
    log_seqs = cal.max_num_seqs or min(default_limits_[0], log_tokens)
    shift = activation - activation_bytes(model, tp, log_tokens, log_seqs)
    in_budget = (
        cal.cudagraph_in_budget
        if cal.cudagraph_in_budget is not None
        else version.cudagraph_in_budget
    )
    graphs_in_budget = graphs if in_budget else 0
    # activation + non-torch at the log's settings, from its budget; None if it cannot say.
    rest: float | None = None
    if cal.weights_bytes is not None and cal.available_kv_bytes is not None:
        cal_requested = (cal.total_bytes or total) * (cal.gpu_memory_utilization or utilization)
        rest = cal_requested - cal.available_kv_bytes - cal.weights_bytes - graphs_in_budget
    elif (
        cal.weights_bytes is not None
        and cal.consumed_bytes is not None
        and cal.activation_bytes is not None
    ):
        rest = cal.consumed_bytes - cal.weights_bytes - graphs_in_budget + cal.activation_bytes

    if cal.activation_bytes is not None and cal.non_torch_bytes is not None:
        activation, non_torch = cal.activation_bytes + shift, cal.non_torch_bytes
        measured += [MemoryComponent.ACTIVATION, MemoryComponent.NON_TORCH]
    elif cal.activation_bytes is not None and rest is not None:
        non_torch = int(rest - cal.activation_bytes)
        if non_torch < 0 and in_budget:
            # vLLM's consumed figure can hold less than the graph estimate: keep the sum.
            moved = min(-non_torch, graphs)
            graphs, non_torch = graphs - moved, non_torch + moved
        activation = cal.activation_bytes + shift
        measured.append(MemoryComponent.ACTIVATION)
        derived.append(MemoryComponent.NON_TORCH)
    elif rest is not None:
        activation = int(rest - non_torch) + shift
        derived.append(MemoryComponent.ACTIVATION)
    elif cal.activation_bytes is not None:
        activation = cal.activation_bytes + shift
        measured.append(MemoryComponent.ACTIVATION)
    else:
        activation = activation + shift
    if cal.boot_state is BootState.COLD and (
        MemoryComponent.ACTIVATION in measured or MemoryComponent.ACTIVATION in derived
    ):
        # A cold boot's activation holds torch.compile's memory: the warm one's is less
        # (a log that shows a cold boot compiled: it was not --enforce-eager).
        at_log = activation - shift
        activation = warm_activation_of(at_log, enforce_eager=False, factor=cal.compile_factor)
        activation += shift
    known = set(measured) | set(derived)
    applied = AppliedCalibration(
        source=cal.source,
        measured=measured,
        derived=derived,
        estimated=[c for c in MemoryComponent if c not in known],
    )
    return (weights, activation, non_torch, graphs), applied


def scheduler_config_failure(
    max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int, enable_chunked_prefill: bool
) -> StartupFailure | None:
    """vLLM's SchedulerConfig check (``verify_max_model_len``), in its order.

    It runs on the values vLLM resolved, defaults included: ``--max-num-seqs 10000``
    alone is refused against the default batch limit, as vLLM refuses it. The plan,
    the simulated engine's startup and the tuner's pre-launch screening all come here.
    """
    if max_num_batched_tokens < max_model_len and not enable_chunked_prefill:
        return msg.batched_tokens_below_model_len(max_num_batched_tokens, max_model_len)
    if max_num_batched_tokens < max_num_seqs:
        return msg.batched_tokens_below_seqs(max_num_batched_tokens, max_num_seqs)
    return None


def _invalid_configuration(
    model: ModelSpec, gpu: GpuSpec, params: ServingParams, version: VllmVersion, p: MemoryPlan
) -> StartupFailure | None:
    """Checks vLLM makes on its flags and config before touching the GPU, in its order."""
    choices = version.block_size_choices
    if params.block_size is not None and choices is not None and params.block_size not in choices:
        return msg.invalid_choice("--block-size", params.block_size, choices)
    tp = params.tensor_parallel_size
    if params.max_model_len is not None and p.max_model_len > model.max_position_embeddings:
        return msg.max_model_len_above_derived(p.max_model_len, model.max_position_embeddings)
    scheduler = scheduler_config_failure(
        p.max_num_batched_tokens, p.max_num_seqs, p.max_model_len, params.enable_chunked_prefill
    )
    if scheduler is not None:
        return scheduler
    if model.num_attention_heads % tp:
        return msg.heads_not_divisible(model.num_attention_heads, tp)
    fp8 = params.kv_cache_dtype.startswith("fp8")
    if fp8 and params.kv_cache_dtype not in gpu.kv_cache_dtypes_in(version):
        return msg.kv_dtype_unsupported(params.kv_cache_dtype, gpu.name, gpu.compute_capability)
    if not model.is_mla and p.block_size % 16:
        return msg.block_size_not_multiple_of_16()
    return None


def _memory_failure(
    model: ModelSpec, version: VllmVersion, p: MemoryPlan, groups: list[_Group], in_flight: int
) -> tuple[StartupFailure | None, int | None]:
    """The first memory failure vLLM would hit at startup, in the order it checks."""
    if p.free_bytes < p.requested_bytes:
        return msg.budget_above_free(
            version, p.free_bytes, p.total_bytes, p.gpu_memory_utilization, p.requested_bytes
        ), None
    if p.weights_bytes > p.free_bytes:
        return msg.cuda_oom(p.total_bytes, p.free_bytes, p.weights_bytes - p.free_bytes), None
    if p.kv_cache_bytes <= 0:
        return msg.no_cache_memory(version), None
    need = _request_bytes(
        groups, p.page_size_bytes, model, p.max_model_len, p.block_size, in_flight
    )
    if need > p.kv_cache_bytes:
        estimated = _estimate_max_model_len(
            model,
            groups,
            p.page_size_bytes,
            p.block_size,
            p.kv_cache_bytes,
            p.max_model_len,
            in_flight,
        )
        return msg.max_model_len_too_large(
            version, p.max_model_len, need, p.kv_cache_bytes, estimated
        ), estimated
    left = runtime_headroom_bytes(p)
    if left < RUNTIME_RESERVE_BYTES:
        graphs_after = 0 if version.cudagraph_in_budget else p.cudagraph_bytes
        wanted = graphs_after + RUNTIME_RESERVE_BYTES
        return msg.cuda_oom_after_kv_cache(p.total_bytes, left + graphs_after, wanted), None
    return None, None


def runtime_headroom_bytes(p: MemoryPlan) -> int:
    """Device memory left once the engine is up: KV cache allocated, CUDA graphs captured.

    From 0.20 the graphs come out of the budget, so this is the memory beyond it;
    before, the graphs were captured on top of the budget and eat into it.
    """
    used = p.weights_bytes + p.activation_bytes + p.non_torch_bytes + p.kv_cache_bytes
    return p.free_bytes - used - p.cudagraph_bytes

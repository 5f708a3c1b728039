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
3. ``available_kv = requested - (weights + activation + non_torch)``; from 0.12 on
   the CUDA-graph memory is estimated before this and subtracted too (0.10 and
   0.11 captured graphs after allocating the KV cache, out of the headroom).
4. Each attention layer needs a page of ``2 x block_size x kv_heads_per_rank x
   head_size x dtype_bytes`` per block (MLA: one latent vector of
   ``kv_lora_rank + qk_rope_head_dim`` per token); layers are grouped as vLLM
   groups them; ``num_blocks = available // (page x layers_per_group)``.
5. ``GPU KV cache size: num_blocks // groups x block_size tokens`` and
   ``Maximum concurrency = num_blocks / blocks one max-length request needs``.

The components the model cannot know exactly (activation, non-torch, CUDA-graph
memory) are estimated by the formulas below; a real startup log replaces them
with measured values (``Calibration``), after which predictions for the same
model and GPU are exact.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict

from tuner.errors import ConfigError
from tuner.failures import StartupFailure, StartupFailureKind
from tuner.gpus import GiB, GpuSpec, MiB
from tuner.models import AttentionKind, ModelSpec
from tuner.versions import VllmVersion

KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
VOCAB_PADDING = 64

# Estimation constants, in one place. Sources: fitted on the public startup logs in
# tests/fixtures/vllm_logs (see benchmarks/memory_accuracy.py for the fit's error).
SAMPLER_FP32_COPIES = 3.0  # logits, probabilities and sampling noise, fp32, max_num_seqs rows
HIDDEN_COPIES = 3.0  # residual, hidden states and norm output during the forward pass
NON_TORCH_TP1_BYTES = int(0.20 * GiB)  # CUDA context growth, cuBLAS workspaces
NON_TORCH_PER_EXTRA_RANK_BYTES = int(0.25 * GiB)  # NCCL and custom all-reduce buffers
NON_TORCH_TP_BASE_BYTES = int(0.80 * GiB)
CUDAGRAPH_BASE_BYTES = int(0.15 * GiB)
CUDAGRAPH_PER_LAYER_BYTES = 6 * MiB


class ServingParams(BaseModel):
    """The vLLM flags that shape startup memory; None means vLLM's default."""

    model_config = ConfigDict(frozen=True)

    gpu_memory_utilization: float = 0.9
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
        if not (0.0 < util <= 1.0):
            raise ConfigError(
                f"--gpu-memory-utilization {util} is out of range; accepted: 0 < value <= 1"
            )
        positive = {
            "--max-num-seqs": self.max_num_seqs,
            "--max-num-batched-tokens": self.max_num_batched_tokens,
            "--max-model-len": self.max_model_len,
            "--tensor-parallel-size": self.tensor_parallel_size,
            "--kv-cache-memory-bytes": self.kv_cache_memory_bytes,
        }
        for flag, value in positive.items():
            if value is not None and value < 1:
                raise ConfigError(f"{flag} {value} is out of range; accepted: an integer >= 1")
        if self.block_size is not None and self.block_size not in BLOCK_SIZES:
            raise ConfigError(
                f"--block-size {self.block_size} is not accepted; accepted: "
                + ", ".join(str(b) for b in BLOCK_SIZES)
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"--kv-cache-dtype {self.kv_cache_dtype!r} is not accepted; accepted: "
                + ", ".join(KV_CACHE_DTYPES)
            )
        if self.cpu_offload_gb < 0:
            raise ConfigError(f"--cpu-offload-gb {self.cpu_offload_gb} is negative; accepted: >= 0")
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
    cudagraph_bytes: int | None = None
    available_kv_bytes: int | None = None
    total_bytes: int | None = None
    # The settings of the calibrating run, so other settings can be predicted.
    gpu_memory_utilization: float | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    cudagraph_in_budget: bool | None = None


class MemoryPlan(BaseModel):
    """What vLLM will do at startup with these settings, predicted."""

    model_config = ConfigDict(frozen=True)

    model: str
    gpu: str
    vllm_version: str
    fits: bool
    failure: StartupFailure | None
    calibrated: bool
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
    estimated_max_model_len: int | None = None

    @property
    def headroom_bytes(self) -> int:
        """Device memory left beyond vLLM's budget once it is running."""
        return self.free_bytes - self.requested_bytes


# --- defaults ---------------------------------------------------------------------------


def default_limits(gpu: GpuSpec) -> tuple[int, int]:
    """vLLM's OpenAI-server defaults (max_num_seqs, max_num_batched_tokens) for a GPU.

    vLLM uses larger defaults on GPUs with at least 70 GiB that are not A100s.
    """
    big = gpu.cuda_total_bytes >= 70 * GiB and not gpu.name.startswith("A100")
    return (1024, 8192) if big else (256, 2048)


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


def _blocks_per_request(
    model: ModelSpec,
    group: _Group,
    max_model_len: int,
    block_size: int,
    max_num_batched_tokens: int,
) -> int:
    if group.kind is AttentionKind.SLIDING and model.sliding_window:
        tokens = min(model.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        return -(-tokens // block_size) + 1
    return -(-max_model_len // block_size)


def _max_concurrency(
    model: ModelSpec,
    groups: list[_Group],
    num_blocks: int,
    max_model_len: int,
    block_size: int,
    max_num_batched_tokens: int,
) -> float:
    """vLLM's get_max_concurrency_for_kv_cache_config, in blocks of one group."""
    layers_per_group = max(g.num_layers for g in groups)
    kinds = {g.kind for g in groups}
    per_request = 0
    for kind in kinds:
        per_request += _blocks_per_request(
            model,
            _Group(kind=kind, num_layers=layers_per_group),
            max_model_len,
            block_size,
            max_num_batched_tokens,
        )
    return num_blocks / per_request if per_request else 0.0


def _request_bytes(
    model: ModelSpec,
    groups: list[_Group],
    page: int,
    max_model_len: int,
    block_size: int,
    max_num_batched_tokens: int,
) -> int:
    """KV bytes one request of max_model_len tokens needs (vLLM's max_memory_usage_bytes)."""
    total = 0
    for group in groups:
        blocks = _blocks_per_request(
            model, group, max_model_len, block_size, max_num_batched_tokens
        )
        total += blocks * page * group.num_layers
    return total


def _estimate_max_model_len(
    model: ModelSpec,
    groups: list[_Group],
    page: int,
    block_size: int,
    kv_bytes: int,
    upper: int,
    max_num_batched_tokens: int,
) -> int:
    """Largest max_model_len whose one request fits, by binary search as vLLM does."""
    lo, hi, best = 1, upper, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        need = _request_bytes(model, groups, page, mid, block_size, max_num_batched_tokens)
        if need <= kv_bytes:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


# --- the plan ---------------------------------------------------------------------------


def _gib(value: float) -> float:
    return round(value / GiB, 2)


def plan(
    model: ModelSpec,
    gpu: GpuSpec,
    params: ServingParams,
    version: VllmVersion | None = None,
    calibration: Calibration | None = None,
) -> MemoryPlan:
    """Predict vLLM's startup for these settings: fits or which failure, and the KV cache."""
    params = params.checked()
    version = version or VllmVersion.current()
    tp = params.tensor_parallel_size
    default_seqs, default_tokens = default_limits(gpu)
    derived_len = model.max_position_embeddings
    max_model_len = params.max_model_len or derived_len
    max_num_seqs = params.max_num_seqs or default_seqs
    max_num_batched_tokens = params.max_num_batched_tokens or (
        default_tokens if params.enable_chunked_prefill else max(max_model_len, default_tokens)
    )
    block_size = params.block_size or (64 if model.is_mla else 16)
    total = (
        calibration.total_bytes if calibration and calibration.total_bytes else gpu.cuda_total_bytes
    )
    free = total - params.other_process_bytes
    requested = math.ceil(total * params.gpu_memory_utilization)

    weights = weights_bytes(model, tp, params.cpu_offload_gb)
    activation = activation_bytes(model, tp, max_num_batched_tokens, max_num_seqs)
    non_torch = non_torch_bytes(tp)
    graphs = cudagraph_bytes(model, params.enforce_eager)
    if calibration is not None:
        weights, activation, non_torch, graphs = _apply_calibration(
            calibration,
            model,
            tp,
            params,
            requested,
            max_num_batched_tokens,
            max_num_seqs,
            weights,
            activation,
            non_torch,
            graphs,
            version,
        )
    graphs_in_budget = graphs if version.cudagraph_in_budget else 0
    if params.kv_cache_memory_bytes is not None:
        kv_bytes = params.kv_cache_memory_bytes
    else:
        kv_bytes = requested - weights - activation - non_torch - graphs_in_budget

    groups = kv_cache_groups(model)
    page = page_size_bytes(model, block_size, params.kv_cache_dtype, tp)
    layers_per_group = max(g.num_layers for g in groups)
    num_blocks = max(int(kv_bytes // page // layers_per_group), 0) if kv_bytes > 0 else 0
    tokens = num_blocks // len(groups) * block_size
    concurrency = _max_concurrency(
        model, groups, num_blocks, max_model_len, block_size, max_num_batched_tokens
    )

    sized = MemoryPlan(
        fits=True,
        failure=None,
        model=model.name,
        gpu=gpu.name,
        vllm_version=str(version),
        calibrated=calibration is not None,
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
    )
    failure, estimated = _first_failure(model, gpu, params, version, sized, groups, derived_len)
    if failure is None:
        return sized
    return sized.model_copy(
        update={"fits": False, "failure": failure, "estimated_max_model_len": estimated}
    )


def _apply_calibration(
    cal: Calibration,
    model: ModelSpec,
    tp: int,
    params: ServingParams,
    requested: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    weights: int,
    activation: int,
    non_torch: int,
    graphs: int,
    version: VllmVersion,
) -> tuple[int, int, int, int]:
    """Replace predicted components by measured ones.

    A log that gives the components (weights, activation, non-torch) replaces each.
    A log that gives only the weights and the KV memory fixes their sum: the rest of
    the budget (activation plus non-torch, and CUDA graphs where counted) is
    taken as measured. Activation measured at other batch limits is shifted by the
    model's predicted difference.
    """
    if cal.weights_bytes is not None:
        offloaded = int(params.cpu_offload_gb * 1e9)
        weights = max(cal.weights_bytes - offloaded, 0)
    if cal.cudagraph_bytes is not None:
        graphs = cal.cudagraph_bytes
    shift = 0
    if cal.max_num_batched_tokens and cal.max_num_seqs:
        shift = activation - activation_bytes(
            model, tp, cal.max_num_batched_tokens, cal.max_num_seqs
        )
    if cal.activation_bytes is not None and cal.non_torch_bytes is not None:
        return weights, cal.activation_bytes + shift, cal.non_torch_bytes, graphs
    if cal.available_kv_bytes is not None and cal.weights_bytes is not None:
        util = cal.gpu_memory_utilization or params.gpu_memory_utilization
        total = cal.total_bytes or int(requested / params.gpu_memory_utilization)
        cal_requested = total * util
        in_budget = (
            cal.cudagraph_in_budget
            if cal.cudagraph_in_budget is not None
            else (version.cudagraph_in_budget)
        )
        graph_part = graphs if in_budget else 0
        measured = cal_requested - cal.available_kv_bytes - cal.weights_bytes - graph_part
        # Keep the model's split between activation and non-torch; the sum is measured.
        return weights, int(measured - non_torch) + shift, non_torch, graphs
    return weights, activation + shift, non_torch, graphs


def _first_failure(
    model: ModelSpec,
    gpu: GpuSpec,
    params: ServingParams,
    version: VllmVersion,
    p: MemoryPlan,
    groups: list[_Group],
    derived_len: int,
) -> tuple[StartupFailure | None, int | None]:
    """The first failure vLLM would hit, in the order vLLM checks, with its message."""
    invalid = _invalid_configuration(model, gpu, params, version, p, derived_len)
    if invalid is not None:
        return invalid, None
    total, free, requested = p.total_bytes, p.free_bytes, p.requested_bytes
    weights, kv_bytes = p.weights_bytes, p.kv_cache_bytes
    if free < requested:
        return StartupFailure(
            kind=StartupFailureKind.BUDGET_ABOVE_FREE_MEMORY,
            message=(
                f"ValueError: Free memory on device ({_gib(free)}/{_gib(total)} GiB) on startup "
                f"is less than desired GPU memory utilization "
                f"({params.gpu_memory_utilization}, {_gib(requested)} GiB). Decrease GPU memory "
                "utilization or reduce GPU memory used by other processes."
            ),
        ), None
    if weights > free:
        return StartupFailure(
            kind=StartupFailureKind.WEIGHTS_DO_NOT_FIT,
            message=(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                f"{_gib(weights - free) * 1024:.2f} MiB. GPU 0 has a total capacity of "
                f"{_gib(total)} GiB of which {_gib(max(free - weights, 0))} GiB is free."
            ),
        ), None
    if kv_bytes <= 0:
        return StartupFailure(
            kind=StartupFailureKind.NO_MEMORY_FOR_CACHE_BLOCKS,
            message=(
                "ValueError: No available memory for the cache blocks. Try increasing "
                "`gpu_memory_utilization` when initializing the engine."
            ),
        ), None
    max_model_len, block_size = p.max_model_len, p.block_size
    page, tokens = p.page_size_bytes, p.max_num_batched_tokens
    need = _request_bytes(model, groups, page, max_model_len, block_size, tokens)
    if need > kv_bytes:
        estimated = _estimate_max_model_len(
            model, groups, page, block_size, kv_bytes, max_model_len, tokens
        )
        return StartupFailure(
            kind=StartupFailureKind.MAX_MODEL_LEN_DOES_NOT_FIT,
            message=(
                f"ValueError: To serve at least one request with the models's max seq len "
                f"({max_model_len}), ({_gib(need)} GiB KV cache is needed, which is larger than "
                f"the available KV cache memory ({_gib(kv_bytes)} GiB). Based on the available "
                f"memory, the estimated maximum model length is {estimated}. Try increasing "
                "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
                "engine."
            ),
        ), estimated
    return None, None


def _invalid_configuration(
    model: ModelSpec,
    gpu: GpuSpec,
    params: ServingParams,
    version: VllmVersion,
    p: MemoryPlan,
    derived_len: int,
) -> StartupFailure | None:
    max_num_seqs, tokens = p.max_num_seqs, p.max_num_batched_tokens
    max_model_len, block_size = p.max_model_len, p.block_size
    tp = params.tensor_parallel_size
    invalid = StartupFailureKind.INVALID_CONFIGURATION
    if model.num_attention_heads % tp:
        return StartupFailure(
            kind=invalid,
            message=(
                f"ValueError: Total number of attention heads ({model.num_attention_heads}) must "
                f"be divisible by tensor parallel size ({tp})."
            ),
        )
    if params.max_model_len is not None and max_model_len > derived_len:
        return StartupFailure(
            kind=invalid,
            message=(
                f"ValueError: User-specified max_model_len ({max_model_len}) is greater than the "
                f"derived max_model_len (max_position_embeddings={derived_len} or model_max_length"
                f"=None in model's config.json). To allow overriding this maximum, set the env var "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with "
                "extreme caution. If the model uses relative position encoding (RoPE), positions "
                "exceeding derived_max_model_len lead to nan. If the model uses absolute position "
                "encoding, positions exceeding derived_max_model_len will cause a CUDA array "
                "out-of-bounds error."
            ),
        )
    if tokens < max_num_seqs:
        return StartupFailure(
            kind=invalid,
            message=(
                f"ValueError: max_num_batched_tokens ({tokens}) must be greater than or equal to "
                f"max_num_seqs ({max_num_seqs})."
            ),
        )
    if not params.enable_chunked_prefill and tokens < max_model_len:
        return StartupFailure(
            kind=invalid,
            message=(
                f"ValueError: max_num_batched_tokens ({tokens}) is smaller than max_model_len "
                f"({max_model_len}). This effectively limits the maximum sequence length to "
                "max_num_batched_tokens and makes vLLM reject longer sequences. Please increase "
                "max_num_batched_tokens or decrease max_model_len."
            ),
        )
    if model.is_mla and block_size != 64 and version.key >= (0, 10):
        return StartupFailure(
            kind=StartupFailureKind.BLOCK_SIZE_UNSUPPORTED,
            message=(
                f"ValueError: Block size {block_size} is not supported by the MLA attention "
                "backend on this GPU (FlashMLA requires block size 64)."
            ),
        )
    if params.kv_cache_dtype not in gpu.kv_cache_dtypes and params.kv_cache_dtype != "bfloat16":
        return StartupFailure(
            kind=StartupFailureKind.KV_CACHE_DTYPE_UNSUPPORTED,
            message=(
                f"ValueError: kv_cache_dtype {params.kv_cache_dtype!r} is not supported on "
                f"{gpu.name} (compute capability {gpu.compute_capability[0]}."
                f"{gpu.compute_capability[1]}); supported: {', '.join(gpu.kv_cache_dtypes)}."
            ),
        )
    return None

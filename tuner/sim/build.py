"""Build a simulated engine from the same inputs vLLM gets: model, GPU, flags, version.

The memory model decides whether it starts and how many KV blocks it has, so the
simulator's startup and the `tuner plan` prediction can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tuner.sim.blocks import EvictionPolicy
from tuner.sim.cpu_tier import CpuTierConfig, OffloadPolicy
from tuner.sim.engine import EngineConfig, SimEngine
from tuner.sim.timing import StepTimer, TimingFactors
from tuner.vllm.boot import BootState
from tuner.vllm.gpus import GiB, GpuSpec
from tuner.vllm.memory import MemoryPlan, ServingParams, plan, runtime_headroom_bytes
from tuner.vllm.models import ModelSpec
from tuner.vllm.space import TrialParams
from tuner.vllm.versions import VllmVersion


@dataclass(frozen=True)
class SimOptions:
    """Engine options beyond the memory flags (names as in ``vllm serve`` where vLLM has them)."""

    enable_prefix_caching: bool = True
    swap_space_gib: float = 0.0
    eviction_policy: EvictionPolicy = EvictionPolicy.LRU
    kv_offloading_size_gib: float = 0.0  # --kv-offloading-size (0: no CPU tier)
    offload_policy: OffloadPolicy = OffloadPolicy.LRU  # its eviction_policy
    store_threshold: int = 0  # its store_threshold (< 2: every block)
    kv_cache_metrics_sample: float | None = None  # --kv-cache-metrics' sample (None: off)
    seed: int = 0


def build_engine(
    model: ModelSpec,
    gpu: GpuSpec,
    params: ServingParams,
    version: VllmVersion,
    options: SimOptions | None = None,
    factors: TimingFactors | None = None,
    *,
    boot: BootState = BootState.WARM,
) -> tuple[MemoryPlan, SimEngine | None]:
    """The startup plan, and the engine when the plan says vLLM would start; its steps
    timed with ``factors`` (default: the paper's, ``TimingFactors()``). ``boot``: the
    compile cache's state, cold when this start compiles (a smaller KV cache, as vLLM
    sizes it: ``tuner.vllm.boot``)."""
    options = options or SimOptions()
    startup = plan(model, gpu, params, version, boot=boot)
    if not startup.fits:
        return startup, None
    bytes_per_block = startup.page_size_bytes * model.num_layers
    swap_blocks = 0
    if version.has_swap_space and options.swap_space_gib > 0:
        swap_blocks = int(options.swap_space_gib * GiB // bytes_per_block)
    config = EngineConfig(
        num_gpu_blocks=startup.num_gpu_blocks,
        block_size=startup.block_size,
        max_num_seqs=startup.max_num_seqs,
        max_num_batched_tokens=startup.max_num_batched_tokens,
        max_model_len=startup.max_model_len,
        vocab_size=model.vocab_size,
        enable_prefix_caching=options.enable_prefix_caching,
        eviction_policy=options.eviction_policy,
        swap_blocks=swap_blocks,
        pcie_bytes_per_s=gpu.pcie_bandwidth_bytes_per_s,
        runtime_headroom_bytes=runtime_headroom_bytes(startup),
        reserve_full_sequence=version.reserves_full_sequence,
        cpu_tier=cpu_tier_config(options, gpu, bytes_per_block, startup.tensor_parallel_size),
        kv_cache_metrics_sample=options.kv_cache_metrics_sample,
        seed=options.seed,
    )
    timer = StepTimer(
        model,
        gpu,
        startup,
        enforce_eager=params.enforce_eager,
        cpu_offload_bytes=int(params.cpu_offload_gb * 1e9),
        factors=factors,
    )
    return startup, SimEngine(config, timer)


def offloading_options(params: TrialParams, options: SimOptions | None = None) -> SimOptions:
    """``options`` (default: vLLM's) with a setting's KV offloading: the simulated server a
    launch of ``params`` would run, for the twin's predictions of it."""
    options = options or SimOptions()
    if not params.offloads_kv:
        return options
    assert params.kv_offloading_size_gib is not None
    return replace(
        options,
        kv_offloading_size_gib=params.kv_offloading_size_gib,
        offload_policy=OffloadPolicy(params.kv_offloading_policy or OffloadPolicy.LRU.value),
    )


def cpu_tier_config(
    options: SimOptions, gpu: GpuSpec, bytes_per_block: int, tensor_parallel_size: int
) -> CpuTierConfig | None:
    """The CPU tier of ``--kv-offloading-size``: the size is the total over the ranks
    (vLLM gives each ``size / (tp x pp)``), each rank's blocks cross its own host link."""
    if options.kv_offloading_size_gib <= 0:
        return None
    return CpuTierConfig.sized(
        options.kv_offloading_size_gib / tensor_parallel_size,
        bytes_per_block,
        gpu.pcie_bandwidth_bytes_per_s,
        options.offload_policy,
        options.store_threshold,
    )

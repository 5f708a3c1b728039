"""How long one engine step takes on the virtual GPU: a roofline.

A step runs the model once over every scheduled token. Its time is the larger of

* compute: ``2 x active parameters x tokens`` plus attention's
  ``4 x layers x heads x head_dim x (query tokens x context)`` FLOPs, at the GPU's
  dense bf16 (or fp8 for fp8 weights) rate times ``MFU``;
* memory: the weights once, plus the KV cache of every scheduled request, read
  from HBM at the GPU's bandwidth times ``MBU`` (an fp8 KV cache halves its bytes);

plus a fixed per-step overhead (scheduling, sampling, kernel launches; larger in
eager mode), tensor-parallel all-reduces, and weights offloaded with
``--cpu-offload-gb`` crossing PCIe every step.

With ``--tensor-parallel-size k`` every layer ends its attention and its MLP with an
all-reduce of the step's activations (``tokens x hidden`` values). A ring all-reduce
sends and receives ``2 (k - 1) / k`` of that per GPU, over NVLink where the GPU has it
and over PCIe where it has not (``GpuSpec.nvlink_bytes_per_s``), at the share of the
link's rate below, plus a fixed latency per all-reduce.

Efficiency factors are stated here and nowhere else (``TimingFactors``; its defaults
are typical of published vLLM measurements on Hopper: decode of an 8B model in bf16
on one H100 runs at about 6-7 ms per step at small batch, 80% of HBM bandwidth, and
large prefills reach about half of peak FLOP/s). A twin that has measured an engine
carries factors fitted to it instead (``tuner.twin.fit``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from tuner.vllm.gpus import GpuSpec
from tuner.vllm.memory import MemoryPlan, kv_dtype_bytes, parameter_count
from tuner.vllm.models import ModelSpec, Quantization

MFU = 0.50  # achieved fraction of dense peak FLOP/s
MBU = 0.80  # achieved fraction of HBM bandwidth
STEP_OVERHEAD_S = 0.0015  # scheduler, sampler, input preparation, CUDA-graph replay
EAGER_OVERHEAD_PER_LAYER_S = 0.00004  # kernel launches without CUDA graphs
PER_SEQ_OVERHEAD_S = 0.000004  # per scheduled request: detokenize, output processing
ALLREDUCE_LATENCY_S = 0.000008  # per all-reduce; two per layer with tensor parallelism
# Achieved share of the link's per-direction rate by a step's all-reduces. NVLink: a
# third, which keeps the twin's TP=2 H100 results where the published ones are
# (benchmarks/twin_tensor_parallel.py). PCIe: half of Gen4 x16's 25 GB/s, within the
# 10-28 GB/s ring all-reduce bus bandwidth reported for 8-GPU PCIe hosts (NVIDIA/nccl
# issues 1530 and 1639, NVIDIA/nccl-tests issue 269); no published vLLM result over
# PCIe checks it.
NVLINK_ALLREDUCE_EFFICIENCY = 1 / 3
PCIE_ALLREDUCE_EFFICIENCY = 0.5


class TimingFactors(BaseModel):
    """The roofline's efficiency factors: what share of the GPU's paper rates a step
    achieves, and what a step costs besides its arithmetic and memory traffic."""

    model_config = ConfigDict(frozen=True)

    mfu: float = Field(default=MFU, gt=0, le=1)  # of dense peak FLOP/s
    mbu: float = Field(default=MBU, gt=0, le=1)  # of HBM bandwidth
    step_overhead_s: float = Field(default=STEP_OVERHEAD_S, ge=0)
    per_seq_overhead_s: float = Field(default=PER_SEQ_OVERHEAD_S, ge=0)
    # From a request's arrival to the scheduler seeing it (the API server's parsing,
    # tokenizing and hand-off), in every TTFT: none on paper; a fit learns it (vLLM's
    # CPU build on two cores: tens of ms). ``tuner sim-serve`` does not apply it.
    request_overhead_s: float = Field(default=0.0, ge=0)
    source: str = "defaults"  # "defaults", or where they were fitted

    @classmethod
    def parse(cls, text: str) -> TimingFactors:
        """``mfu=0.4,mbu=0.55,step_overhead_ms=4.5`` (any of them; the rest the paper's),
        as ``tuner sim-serve --step-costs`` takes them."""
        keys = {"mfu": "mfu", "mbu": "mbu", "step_overhead_ms": "step_overhead_s"}
        values: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, _, raw = part.partition("=")
            key = keys.get(name.strip())
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
            if key is None or not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"step cost {part!r} is not accepted; accepted: "
                    "mfu=(0,1], mbu=(0,1], step_overhead_ms>=0, comma-separated"
                )
            values[key] = value / 1000.0 if name.strip() == "step_overhead_ms" else value
        try:
            return cls(**values, source=f"given: {text}")
        except ValueError as exc:
            raise ValueError(f"step costs {text!r} are not accepted: {exc}") from None

    def spelled(self) -> str:
        """What ``parse`` reads back."""
        return f"mfu={self.mfu:g},mbu={self.mbu:g},step_overhead_ms={1000 * self.step_overhead_s:g}"

    def describe(self) -> str:
        request = (
            f", {1000 * self.request_overhead_s:.1f} ms a request"
            if self.request_overhead_s >= 0.0005
            else ""
        )
        return (
            f"MFU {self.mfu:.2f}, MBU {self.mbu:.2f}, "
            f"{1000 * self.step_overhead_s:.2f} ms a step{request} ({self.source})"
        )


@dataclass(frozen=True)
class StepWork:
    """What one step computes: query tokens and KV context tokens over all requests."""

    num_tokens: int
    num_seqs: int
    context_tokens: int  # KV tokens read (sum over requests of their context)
    attention_pairs: float  # query x key pairs (for attention FLOPs)


class StepTimer:
    """Step duration for a model on a GPU with given settings."""

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        plan: MemoryPlan,
        *,
        enforce_eager: bool,
        cpu_offload_bytes: int = 0,
        factors: TimingFactors | None = None,
    ) -> None:
        factors = factors or TimingFactors()
        self.factors = factors
        tp = plan.tensor_parallel_size
        self.tp = tp
        self.layers = model.num_layers
        self.hidden = model.hidden_size
        active = parameter_count(model)
        if model.is_moe:
            expert = 3 * model.hidden_size * model.moe_intermediate_size
            moe_layers = model.num_layers - model.num_dense_layers
            idle = (model.num_experts - model.num_experts_per_tok) * expert * moe_layers
            active -= idle
        self.active_params = active
        fp8 = model.quantization is Quantization.FP8 and gpu.fp8_dense_flops is not None
        self.flops = (
            gpu.fp8_dense_flops if fp8 and gpu.fp8_dense_flops else gpu.bf16_dense_flops
        ) * factors.mfu
        self.bandwidth = gpu.hbm_bandwidth_bytes_per_s * factors.mbu
        self.weights_bytes = plan.weights_bytes  # per rank
        heads_dim = model.num_attention_heads * (
            model.qk_nope_head_dim + model.qk_rope_head_dim if model.is_mla else model.head_dim
        )
        self.attn_dim = heads_dim
        self.kv_bytes_per_token = plan.page_size_bytes * model.num_layers / plan.block_size
        self.per_seq_s = factors.per_seq_overhead_s
        self.overhead_s = factors.step_overhead_s + (
            EAGER_OVERHEAD_PER_LAYER_S * model.num_layers if enforce_eager else 0.0
        )
        self.offload_s = cpu_offload_bytes / gpu.pcie_bandwidth_bytes_per_s
        # the link the ranks' all-reduces cross, at the rate they achieve on it
        self.peer_bytes_per_s = (
            gpu.nvlink_bytes_per_s * NVLINK_ALLREDUCE_EFFICIENCY
            if gpu.nvlink_bytes_per_s
            else gpu.pcie_bandwidth_bytes_per_s * PCIE_ALLREDUCE_EFFICIENCY
        )
        self.dtype_bytes = model.dtype_bytes
        self.kv_dtype_bytes = kv_dtype_bytes(plan.kv_cache_dtype, model)

    def step_s(self, work: StepWork) -> float:
        if work.num_tokens == 0:
            return 0.0
        linear = 2.0 * self.active_params * work.num_tokens / self.tp
        attention = 4.0 * self.layers * self.attn_dim * work.attention_pairs / self.tp
        compute_s = (linear + attention) / self.flops
        memory_s = (
            self.weights_bytes + work.context_tokens * self.kv_bytes_per_token
        ) / self.bandwidth
        step = max(compute_s, memory_s) + self.overhead_s + self.per_seq_s * work.num_seqs
        return step + self.allreduce_s(work.num_tokens) + self.offload_s

    def allreduce_s(self, num_tokens: int) -> float:
        """A step's tensor-parallel all-reduces: two per layer, each a ring over the
        ranks of ``num_tokens x hidden`` activations; nothing with one rank."""
        if self.tp == 1:
            return 0.0
        message_bytes = num_tokens * self.hidden * self.dtype_bytes
        ring_bytes = 2 * (self.tp - 1) / self.tp * message_bytes
        return 2 * self.layers * (ALLREDUCE_LATENCY_S + ring_bytes / self.peer_bytes_per_s)

    def swap_s(self, num_tokens: int, pcie_bytes_per_s: float) -> float:
        """Time to move num_tokens of KV cache between GPU and host memory."""
        return num_tokens * self.kv_bytes_per_token / pcie_bytes_per_s

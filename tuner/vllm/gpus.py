"""GPU profiles: memory as the driver reports it, bandwidth, FLOP/s, KV-cache dtypes.

Two totals are kept because they differ and both matter:

* ``nvml_total_bytes`` is what NVML (and ``nvidia-smi``) reports; the GPU sampler
  compares peaks against it.
* ``cuda_total_bytes`` is what ``cudaMemGetInfo`` reports (slightly less: the
  driver reserves some memory). vLLM sizes its budget from this one:
  ``requested = total x gpu_memory_utilization``.

Figures are vendor datasheet values (dense, no sparsity) for bandwidth and FLOP/s;
``cuda_total_bytes`` is taken from vLLM startup logs where one showed it
(``total_gpu_memory (79.19GiB)`` on H100 SXM) and otherwise estimated as NVML's
total less the driver's usual reservation; ``source`` says which.
``nvlink_bytes_per_s`` is the datasheet's NVLink rate per direction (half the
bidirectional figure: A100 600 GB/s, H100 and H200 900, B200 1.8 TB/s) on the SXM parts;
PCIe cards are planned without it (NVLink bridges are optional), so their
tensor-parallel all-reduces cross PCIe. The A100-80GB preset also answers for the PCIe
card's names and assumes the SXM part's NVLink.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from tuner.errors import UnknownGpuError

MiB = 1024**2
GiB = 1024**3


class GpuSpec(BaseModel):
    """One GPU model, as the tuner plans for it."""

    model_config = ConfigDict(frozen=True)

    name: str
    aliases: tuple[str, ...] = ()
    nvml_total_bytes: int
    cuda_total_bytes: int
    hbm_bandwidth_bytes_per_s: float
    bf16_dense_flops: float
    fp8_dense_flops: float | None
    compute_capability: tuple[int, int]
    kv_cache_dtypes: tuple[str, ...]
    pcie_bandwidth_bytes_per_s: float
    tdp_watts: float
    source: str
    # NVLink between the GPUs of one server, per GPU and per direction (datasheet), or
    # None where the GPU has none (or only an optional bridge): tensor-parallel ranks
    # then exchange their all-reduces over PCIe.
    nvlink_bytes_per_s: float | None = None

    @property
    def supports_fp8(self) -> bool:
        return self.fp8_dense_flops is not None


_FP8_KV = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
_NO_FP8_KV = ("auto",)

_PRESETS: tuple[GpuSpec, ...] = (
    GpuSpec(
        name="A100-40GB",
        aliases=(
            "a100",
            "a100-sxm4-40gb",
            "nvidia a100-sxm4-40gb",
            "a100-40g",
            "nvidia a100 40gb",
            "nvidia a100 sxm4 40gb",
        ),
        nvml_total_bytes=40960 * MiB,
        cuda_total_bytes=int(39.39 * GiB),
        hbm_bandwidth_bytes_per_s=1.555e12,
        bf16_dense_flops=312e12,
        fp8_dense_flops=None,
        compute_capability=(8, 0),
        kv_cache_dtypes=_NO_FP8_KV,
        pcie_bandwidth_bytes_per_s=25e9,
        tdp_watts=400,
        source="datasheet; cuda total from vLLM logs (39.39 GiB)",
        nvlink_bytes_per_s=300e9,
    ),
    GpuSpec(
        name="A100-80GB",
        aliases=(
            "a100-sxm4-80gb",
            "nvidia a100-sxm4-80gb",
            "a100-80g",
            "a100-pcie-80gb",
            "nvidia a100 80gb",
            "nvidia a100 80gb pcie",
        ),
        nvml_total_bytes=81920 * MiB,
        cuda_total_bytes=int(79.15 * GiB),
        hbm_bandwidth_bytes_per_s=2.039e12,
        bf16_dense_flops=312e12,
        fp8_dense_flops=None,
        compute_capability=(8, 0),
        kv_cache_dtypes=_NO_FP8_KV,
        pcie_bandwidth_bytes_per_s=25e9,
        tdp_watts=400,
        source="datasheet; cuda total from vLLM logs (79.15 GiB)",
        nvlink_bytes_per_s=300e9,
    ),
    GpuSpec(
        name="H100-80GB",
        aliases=("h100", "h100-sxm", "h100-80gb-hbm3", "nvidia h100 80gb hbm3", "h100-sxm5-80gb"),
        nvml_total_bytes=81559 * MiB,
        cuda_total_bytes=int(79.19 * GiB),
        hbm_bandwidth_bytes_per_s=3.35e12,
        bf16_dense_flops=989e12,
        fp8_dense_flops=1979e12,
        compute_capability=(9, 0),
        kv_cache_dtypes=_FP8_KV,
        pcie_bandwidth_bytes_per_s=50e9,
        tdp_watts=700,
        source="datasheet; cuda total from vLLM logs (79.19 GiB)",
        nvlink_bytes_per_s=450e9,
    ),
    GpuSpec(
        name="H100-PCIe-80GB",
        aliases=("h100-pcie", "nvidia h100 pcie", "h100 pcie"),
        nvml_total_bytes=81559 * MiB,
        cuda_total_bytes=int(79.19 * GiB),
        hbm_bandwidth_bytes_per_s=2.0e12,
        bf16_dense_flops=756e12,
        fp8_dense_flops=1513e12,
        compute_capability=(9, 0),
        kv_cache_dtypes=_FP8_KV,
        pcie_bandwidth_bytes_per_s=50e9,
        tdp_watts=350,
        source="datasheet; cuda total from a vLLM log (79.19 GiB)",
    ),
    GpuSpec(
        name="H200-141GB",
        aliases=("h200", "nvidia h200", "h200-sxm", "h200-141gb-hbm3e"),
        nvml_total_bytes=143771 * MiB,
        cuda_total_bytes=143771 * MiB - 600 * MiB,
        hbm_bandwidth_bytes_per_s=4.8e12,
        bf16_dense_flops=989e12,
        fp8_dense_flops=1979e12,
        compute_capability=(9, 0),
        kv_cache_dtypes=_FP8_KV,
        pcie_bandwidth_bytes_per_s=50e9,
        tdp_watts=700,
        source="datasheet; NVML total seen on an H200 (143771 MiB); cuda total estimated",
        nvlink_bytes_per_s=450e9,
    ),
    GpuSpec(
        name="L4-24GB",
        aliases=("l4", "nvidia l4"),
        nvml_total_bytes=23034 * MiB,
        cuda_total_bytes=int(21.96 * GiB),
        hbm_bandwidth_bytes_per_s=300e9,
        bf16_dense_flops=121e12,
        fp8_dense_flops=242e12,
        compute_capability=(8, 9),
        kv_cache_dtypes=_FP8_KV,
        pcie_bandwidth_bytes_per_s=25e9,
        tdp_watts=72,
        source="datasheet; cuda total estimated",
    ),
    GpuSpec(
        name="L40S-48GB",
        aliases=("l40s", "nvidia l40s"),
        nvml_total_bytes=46068 * MiB,
        cuda_total_bytes=int(44.39 * GiB),
        hbm_bandwidth_bytes_per_s=864e9,
        bf16_dense_flops=362e12,
        fp8_dense_flops=733e12,
        compute_capability=(8, 9),
        kv_cache_dtypes=_FP8_KV,
        pcie_bandwidth_bytes_per_s=25e9,
        tdp_watts=350,
        source="datasheet; cuda total estimated",
    ),
    GpuSpec(
        name="RTX-6000-Ada-48GB",
        aliases=("rtx6000ada", "rtx-6000-ada", "nvidia rtx 6000 ada generation"),
        nvml_total_bytes=49140 * MiB,
        cuda_total_bytes=int(47.4 * GiB),
        hbm_bandwidth_bytes_per_s=960e9,
        bf16_dense_flops=364e12,
        fp8_dense_flops=728e12,
        compute_capability=(8, 9),
        kv_cache_dtypes=_FP8_KV,
        pcie_bandwidth_bytes_per_s=25e9,
        tdp_watts=300,
        source="datasheet; cuda total estimated",
    ),
    GpuSpec(
        name="RTX-3090-24GB",
        aliases=("rtx3090", "rtx-3090", "nvidia geforce rtx 3090"),
        nvml_total_bytes=24576 * MiB,
        cuda_total_bytes=int(23.58 * GiB),
        hbm_bandwidth_bytes_per_s=936e9,
        bf16_dense_flops=71e12,
        fp8_dense_flops=None,
        compute_capability=(8, 6),
        kv_cache_dtypes=_NO_FP8_KV,
        pcie_bandwidth_bytes_per_s=25e9,
        tdp_watts=350,
        source="datasheet; cuda total from a vLLM log (23.58 GiB)",
    ),
    GpuSpec(
        name="RTX-4090-24GB",
        aliases=("rtx4090", "rtx-4090", "nvidia geforce rtx 4090"),
        nvml_total_bytes=24564 * MiB,
        cuda_total_bytes=int(23.65 * GiB),
        hbm_bandwidth_bytes_per_s=1008e9,
        bf16_dense_flops=165e12,
        fp8_dense_flops=330e12,
        compute_capability=(8, 9),
        kv_cache_dtypes=_FP8_KV,
        pcie_bandwidth_bytes_per_s=25e9,
        tdp_watts=450,
        source="datasheet; cuda total estimated",
    ),
    GpuSpec(
        name="RTX-A5000-24GB",
        aliases=("rtxa5000", "rtx-a5000", "nvidia rtx a5000"),
        nvml_total_bytes=24564 * MiB,
        cuda_total_bytes=int(23.68 * GiB),
        hbm_bandwidth_bytes_per_s=768e9,
        bf16_dense_flops=111e12,
        fp8_dense_flops=None,
        compute_capability=(8, 6),
        kv_cache_dtypes=_NO_FP8_KV,
        pcie_bandwidth_bytes_per_s=25e9,
        tdp_watts=230,
        source="datasheet; cuda total estimated",
    ),
    GpuSpec(
        name="B200-180GB",
        aliases=("b200", "nvidia b200"),
        nvml_total_bytes=183359 * MiB,
        cuda_total_bytes=183359 * MiB - 700 * MiB,
        hbm_bandwidth_bytes_per_s=8.0e12,
        bf16_dense_flops=2250e12,
        fp8_dense_flops=4500e12,
        compute_capability=(10, 0),
        kv_cache_dtypes=_FP8_KV,
        pcie_bandwidth_bytes_per_s=100e9,
        tdp_watts=1000,
        source="datasheet; NVML and cuda totals estimated",
        nvlink_bytes_per_s=900e9,
    ),
)


CPU_DEVICE_NAME = "CPU"


def cpu_device(host_bytes: int) -> GpuSpec:
    """The twin's profile of vLLM's CPU build on this host: a device it has no published
    rates for. Its paper figures are a generic two-core x86 server's (a few hundred
    GFLOP/s in bf16, tens of GB/s of memory bandwidth); the twin learns this engine's
    own step costs from the trials it measures (``tuner.search.twin_fit``)."""
    return GpuSpec(
        name=CPU_DEVICE_NAME,
        nvml_total_bytes=host_bytes,
        cuda_total_bytes=host_bytes,
        hbm_bandwidth_bytes_per_s=20e9,
        bf16_dense_flops=200e9,
        fp8_dense_flops=None,
        compute_capability=(0, 0),
        kv_cache_dtypes=_NO_FP8_KV,
        pcie_bandwidth_bytes_per_s=20e9,
        tdp_watts=65,
        source="paper figures of a generic host CPU; its costs are learned from the trials",
    )


# The ``nvidia.com/gpu.product`` label NVIDIA's GPU feature discovery puts on a node: the
# product name the driver reports, spaces as dashes (SXM parts; a PCIe part says PCIe).
_NODE_PRODUCTS = {
    "A100-40GB": "NVIDIA-A100-SXM4-40GB",
    "A100-80GB": "NVIDIA-A100-SXM4-80GB",
    "H100-80GB": "NVIDIA-H100-80GB-HBM3",
    "H100-PCIe-80GB": "NVIDIA-H100-PCIe",
    "H200-141GB": "NVIDIA-H200",
    "L4-24GB": "NVIDIA-L4",
    "L40S-48GB": "NVIDIA-L40S",
    "RTX-6000-Ada-48GB": "NVIDIA-RTX-6000-Ada-Generation",
    "RTX-3090-24GB": "NVIDIA-GeForce-RTX-3090",
    "RTX-4090-24GB": "NVIDIA-GeForce-RTX-4090",
    "RTX-A5000-24GB": "NVIDIA-RTX-A5000",
    "B200-180GB": "NVIDIA-B200",
}


def node_product_label(gpu: GpuSpec) -> str | None:
    """The ``nvidia.com/gpu.product`` node label of ``gpu`` (None: not known)."""
    return _NODE_PRODUCTS.get(gpu.name)


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def known_gpus() -> tuple[GpuSpec, ...]:
    return _PRESETS


def get_gpu(name: str) -> GpuSpec:
    """Look a GPU profile up by name or alias, case-insensitively."""
    wanted = _key(name)
    for spec in _PRESETS:
        if wanted == _key(spec.name) or wanted in {_key(a) for a in spec.aliases}:
            return spec
    known = ", ".join(spec.name for spec in _PRESETS)
    raise UnknownGpuError(f"unknown GPU {name!r}; known GPUs: {known}")

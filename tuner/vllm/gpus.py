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

A GPU read from NVML (``gpu_from_nvml``) resolves to a preset where its name is one
(``preset_for_nvml_name``: NVML's names by pattern, e.g. ``NVIDIA A100-PCIE-40GB``);
any other part is planned from NVML's own readings, its total memory and compute
capability, with the rates of the preset of its family (``FAMILY_BY_COMPUTE_CAPABILITY``),
and said in one line. A MIG slice is planned as its share of the parent: NVML's memory
of the slice; bandwidth scaled by its share of the parent's memory (MIG partitions the
memory controllers with the memory slices); FLOP/s and power by its share of the
parent's streaming multiprocessors where NVML reports them, else by the memory share; no
NVLink (a MIG device has no peer-to-peer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, ValidationError

from tuner.errors import UnknownGpuError
from tuner.vllm.versions import VllmVersion

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

    def kv_cache_dtypes_in(self, version: VllmVersion) -> tuple[str, ...]:
        """The ``--kv-cache-dtype`` values vLLM ``version`` takes on this GPU
        (``kv_cache_dtypes`` are the newest release's)."""
        taken = kv_cache_dtypes_for(self.compute_capability, version)
        return tuple(d for d in self.kv_cache_dtypes if d in taken)


_FP8_KV = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
_NO_FP8_KV = ("auto",)

# The KV-cache dtypes vLLM's V1 engine takes, per compute capability, read in vLLM's source:
# * 8.9 and newer: fp8, fp8_e4m3 and fp8_e5m2 in every emulated release (FlashAttention 3 on
#   9.0, vllm/attention/utils/fa_utils.py flash_attn_supports_fp8; FlashInfer and Triton on
#   8.9, 10.x and 12.x, vllm/v1/attention/backends/{flashinfer,triton_attn}.py
#   supported_kv_cache_dtypes).
# * 8.0 to 8.8 (A100, A10G, A40, RTX 30xx): none up to 0.10. vllm/platforms/cuda.py
#   is_kv_cache_dtype_supported answered False for every "fp8*" dtype (the test is
#   kv_cache_dtype.startswith("fp8"), so e5m2 too) on the default FLASH_ATTN backend
#   (FlashAttention 2 has no fp8 KV cache) and on TRITON_ATTN below 8.9 (supports_fp8), and
#   the V1 engine refused it (vllm/engine/arg_utils.py _raise_or_fallback: "VLLM_USE_V1=1 is
#   not supported with --kv-cache-dtype", else a fall back to the V0 engine). vLLM PR #24577
#   ("Enable FP8 KV cache for FlashInfer and Triton backend on non-sm100 GPUs", merged
#   2025-09-11) made it answer True on FLASHINFER, whose FlashAttention-2 kernels read fp8
#   on sm80; its first release without the V0 fallback is 0.11.0, taken as the boundary.
#   From there fp8, fp8_e4m3 and fp8_e5m2 start through FlashInfer (its
#   supported_kv_cache_dtypes; supports_compute_capability from 7.5). Triton still takes no
#   fp8 below 8.9 (its kernels store float8e4nv, which has no lowering before sm89; refused
#   up front since vLLM PR #43914), so it is FlashInfer that serves them.
# * below 8.0: no V1 engine at all ("Compute Capability < 8.0"); not planned here.
FP8_KV_BELOW_SM89 = (0, 11)  # first release with an fp8 KV cache on compute capability 8.x < 8.9


def kv_cache_dtypes_for(
    compute_capability: tuple[int, int], version: VllmVersion | None = None
) -> tuple[str, ...]:
    """The ``--kv-cache-dtype`` values vLLM ``version`` (default: the newest emulated) takes
    on a GPU of ``compute_capability`` (the rule and its sources are in the comment above)."""
    if compute_capability >= (8, 9):
        return _FP8_KV
    if compute_capability >= (8, 0):
        newest = version is None or version.at_least(FP8_KV_BELOW_SM89)
        return _FP8_KV if newest else _NO_FP8_KV
    return _NO_FP8_KV


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
            "a100-pcie-40gb",
            "nvidia a100-pcie-40gb",
        ),
        nvml_total_bytes=40960 * MiB,
        cuda_total_bytes=int(39.39 * GiB),
        hbm_bandwidth_bytes_per_s=1.555e12,
        bf16_dense_flops=312e12,
        fp8_dense_flops=None,
        compute_capability=(8, 0),
        kv_cache_dtypes=kv_cache_dtypes_for((8, 0)),
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
        kv_cache_dtypes=kv_cache_dtypes_for((8, 0)),
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
        # A PCIe card: an H100 die with 94 GB of HBM3 (NVML: 95830 MiB), sold for NVLink
        # bridges in pairs (600 GB/s). Planned without NVLink, as the other PCIe cards: a
        # server's tensor-parallel ranks are only sure of PCIe Gen5 between them.
        name="H100-NVL-94GB",
        aliases=("h100-nvl", "h100 nvl", "nvidia h100 nvl"),
        nvml_total_bytes=95830 * MiB,
        cuda_total_bytes=95830 * MiB - 600 * MiB,
        hbm_bandwidth_bytes_per_s=3.9e12,
        bf16_dense_flops=835e12,
        fp8_dense_flops=1671e12,
        compute_capability=(9, 0),
        kv_cache_dtypes=_FP8_KV,
        pcie_bandwidth_bytes_per_s=50e9,
        tdp_watts=400,
        source="datasheet (half the sparse figures); NVML total seen on H100 NVL hosts "
        "(95830 MiB); cuda total estimated; NVLink bridge pairs not assumed",
    ),
    GpuSpec(
        # The PCIe (NVL) H200: the H200's 141 GB and 4.8 TB/s at up to 600 W; NVLink bridges
        # (2- or 4-way) not assumed, as for the H100 NVL.
        name="H200-NVL-141GB",
        aliases=("h200-nvl", "h200 nvl", "nvidia h200 nvl"),
        nvml_total_bytes=143771 * MiB,
        cuda_total_bytes=143771 * MiB - 600 * MiB,
        hbm_bandwidth_bytes_per_s=4.8e12,
        bf16_dense_flops=835e12,
        fp8_dense_flops=1671e12,
        compute_capability=(9, 0),
        kv_cache_dtypes=_FP8_KV,
        pcie_bandwidth_bytes_per_s=50e9,
        tdp_watts=600,
        source="datasheet (half the sparse figures); NVML total as the H200's (143771 MiB); "
        "cuda total estimated; NVLink bridges not assumed",
    ),
    GpuSpec(
        # Grace Hopper with 96 GB of HBM3 (NVML: 97871 MiB); the host link is NVLink-C2C
        # (900 GB/s both ways), not PCIe; one GPU per superchip, no GPU-to-GPU NVLink assumed.
        name="GH200-96GB",
        aliases=("gh200", "gh200-480gb", "nvidia gh200 480gb"),
        nvml_total_bytes=97871 * MiB,
        cuda_total_bytes=97871 * MiB - 600 * MiB,
        hbm_bandwidth_bytes_per_s=4.0e12,
        bf16_dense_flops=989e12,
        fp8_dense_flops=1979e12,
        compute_capability=(9, 0),
        kv_cache_dtypes=_FP8_KV,
        pcie_bandwidth_bytes_per_s=450e9,
        tdp_watts=700,
        source="datasheet; NVML total seen on GH200 480GB hosts (97871 MiB); cuda total "
        "estimated; host link NVLink-C2C (450 GB/s a direction)",
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
        kv_cache_dtypes=kv_cache_dtypes_for((8, 6)),
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
        kv_cache_dtypes=kv_cache_dtypes_for((8, 6)),
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
    own step costs from the trials it measures (``tuner.twin.fit``)."""
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
    "H100-NVL-94GB": "NVIDIA-H100-NVL",
    "H200-141GB": "NVIDIA-H200",
    "H200-NVL-141GB": "NVIDIA-H200-NVL",
    "GH200-96GB": "NVIDIA-GH200-480GB",
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


def _known() -> str:
    return ", ".join(spec.name for spec in _PRESETS)


def get_gpu(name: str) -> GpuSpec:
    """Look a GPU profile up by name or alias, case-insensitively, or by the name NVML
    gives the part (``preset_for_nvml_name``); an unknown name is UnknownGpuError."""
    wanted = _key(name)
    for spec in _PRESETS:
        if wanted == _key(spec.name) or wanted in {_key(a) for a in spec.aliases}:
            return spec
    preset = preset_for_nvml_name(name)
    if preset is not None:
        return preset
    raise UnknownGpuError(f"unknown GPU {name!r}; known GPUs: {_known()}")


def recorded_gpu(name: str, profile: object = None) -> GpuSpec:
    """The GPU profile a run planned with, as its ``tune.json`` records it: ``profile``
    (the whole GpuSpec, ``gpu_profile`` in ``tuner.search.tune.describe``) where it is
    there and reads, else the profile ``name`` names (``get_gpu``: runs written before the
    profile was recorded, or a profile this tuner cannot read). A profile derived from NVML
    (``gpu_from_nvml``: a part no preset describes, a MIG slice) has a name ``get_gpu``
    does not know; only its record rebuilds it."""
    if profile is not None:
        try:
            return GpuSpec.model_validate(profile)
        except ValidationError:
            pass  # the name's profile, where there is one
    return get_gpu(name)


# NVML's names of the preset parts, by pattern over ``_nvml_key`` (lower case, "nvidia"
# dropped, spaces, dashes and underscores as one dash), as drivers name them:
# "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB",
# "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200",
# "NVIDIA H200 NVL", "NVIDIA GH200 480GB", "NVIDIA L40S", "NVIDIA RTX 6000 Ada Generation".
# A part of a preset's family that is none of these (an L40, an A10G, a GH200 144G) is
# planned from NVML's readings instead (``gpu_from_nvml``). The first pattern that matches
# wins: the NVL and PCIe H100s before the SXM part.
_NVML_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"a100(-sxm4?|-pcie)?-40gb(-pcie)?", "A100-40GB"),
    (r"a100(-sxm4?|-pcie)?-80gb(-pcie)?", "A100-80GB"),
    (r"h100-nvl", "H100-NVL-94GB"),
    (r"h100(-80gb)?-pcie(-80gb)?", "H100-PCIe-80GB"),
    (r"h100(-sxm5?)?(-80gb)?(-hbm3)?", "H100-80GB"),
    (r"h200-nvl", "H200-NVL-141GB"),
    (r"h200(-sxm)?(-141gb)?(-hbm3e)?", "H200-141GB"),
    (r"gh200-480gb", "GH200-96GB"),
    (r"l4", "L4-24GB"),
    (r"l40s", "L40S-48GB"),
    (r"rtx-6000-ada(-generation)?", "RTX-6000-Ada-48GB"),
    (r"(geforce-)?rtx-3090", "RTX-3090-24GB"),
    (r"(geforce-)?rtx-4090", "RTX-4090-24GB"),
    (r"rtx-a5000", "RTX-A5000-24GB"),
    (r"b200", "B200-180GB"),
)


def _nvml_key(name: str) -> str:
    key = re.sub(r"[\s_\-]+", "-", name.strip().lower())
    return re.sub(r"^nvidia-", "", key)


def _preset(name: str) -> GpuSpec:
    return next(spec for spec in _PRESETS if spec.name == name)


def preset_for_nvml_name(name: str) -> GpuSpec | None:
    """The preset NVML's ``name`` of a part is (by pattern), or None: not a preset part."""
    key = _nvml_key(name)
    for pattern, preset in _NVML_PATTERNS:
        if re.fullmatch(pattern, key):
            return _preset(preset)
    return None


# The preset whose rates (bandwidth, FLOP/s, host link, power) an unknown part of a compute
# capability is planned with: its own generation's data-center part where there is one. The
# workstation and consumer Blackwell parts (12.x: RTX PRO 6000, RTX 50xx) take the RTX 6000
# Ada's, their predecessor with GDDR memory, not the B200's HBM rates. A capability not
# listed takes its major version's entry of the highest minor below it; below 8.0 none
# (vLLM's V1 engine needs 8.0).
FAMILY_BY_COMPUTE_CAPABILITY: dict[tuple[int, int], str] = {
    (8, 0): "A100-80GB",
    (8, 6): "RTX-A5000-24GB",
    (8, 9): "L40S-48GB",
    (9, 0): "H100-80GB",
    (10, 0): "B200-180GB",
    (12, 0): "RTX-6000-Ada-48GB",
}
DRIVER_RESERVED_BYTES = 600 * MiB  # NVML's total less cudaMemGetInfo's, as estimated above


def family_of(compute_capability: tuple[int, int]) -> GpuSpec | None:
    """The preset whose rates a part of ``compute_capability`` takes (None: no family)."""
    major, minor = compute_capability
    below = [cc for cc in FAMILY_BY_COMPUTE_CAPABILITY if cc[0] == major and cc[1] <= minor]
    return _preset(FAMILY_BY_COMPUTE_CAPABILITY[max(below)]) if below else None


@dataclass(frozen=True, kw_only=True)
class MigShare:
    """What NVML says of a MIG slice beside its parent GPU (``total_bytes`` is the slice's).
    Multiprocessor counts are None where NVML does not report them."""

    profile: str  # "3g.40gb", from the MIG device's name; "" where it names none
    total_bytes: int
    parent_total_bytes: int
    multiprocessors: int | None = None
    parent_multiprocessors: int | None = None


@dataclass(frozen=True)
class ResolvedGpu:
    """A GPU profile from NVML's readings, and the one line that says how it was planned
    (None: a preset part, planned as the preset)."""

    spec: GpuSpec
    note: str | None = None


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def _cc(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


def _derived_name(nvml_name: str) -> str:
    name = re.sub(r"^nvidia\s+", "", nvml_name.strip(), flags=re.IGNORECASE)
    return re.sub(r"\s+", "-", name) or "GPU"


def gpu_from_nvml(
    name: str,
    *,
    total_bytes: int | None,
    compute_capability: tuple[int, int] | None,
    mig: MigShare | None = None,
) -> ResolvedGpu:
    """The profile of a GPU as NVML reads it: ``name``, its total memory and compute
    capability (None: NVML could not read it). A preset part is the preset; any other is
    planned from the readings with its family's rates, said in the note. With ``mig`` the
    GPU is the parent and the profile is the slice's (rule in the module docstring).
    UnknownGpuError (one line) where neither gives a profile."""
    preset = preset_for_nvml_name(name)
    if preset is not None:
        spec, note = preset, None
    else:
        spec, note = _unknown_part(name, total_bytes, compute_capability)
    if mig is None:
        return ResolvedGpu(spec, note)
    return _mig_slice(name, spec, mig)


def _unknown_part(
    name: str, total_bytes: int | None, compute_capability: tuple[int, int] | None
) -> tuple[GpuSpec, str]:
    accepted = f"accepted: --gpu with a known profile ({_known()}) to plan it as one"
    if not total_bytes or total_bytes <= 0:
        raise UnknownGpuError(
            f"GPU {name!r} is not a known profile and NVML reports no memory for it; {accepted}"
        )
    if compute_capability is None:
        raise UnknownGpuError(
            f"GPU {name!r} is not a known profile and NVML reports no compute capability "
            f"for it; {accepted}"
        )
    family = family_of(compute_capability)
    if family is None:
        raise UnknownGpuError(
            f"GPU {name!r} (compute capability {_cc(compute_capability)}) is not a known "
            f"profile and no known family has its compute capability (8.0 and newer); {accepted}"
        )
    spec = family.model_copy(
        update={
            "name": _derived_name(name),
            "aliases": (),
            "nvml_total_bytes": total_bytes,
            "cuda_total_bytes": max(total_bytes - DRIVER_RESERVED_BYTES, total_bytes // 2),
            "compute_capability": compute_capability,
            "kv_cache_dtypes": kv_cache_dtypes_for(compute_capability),
            "fp8_dense_flops": family.fp8_dense_flops if compute_capability >= (8, 9) else None,
            "nvlink_bytes_per_s": None,
            "source": f"NVML's total and compute capability; the {family.name} family's rates",
        }
    )
    note = (
        f"GPU {name!r} is not a known profile: planned as {spec.name} from NVML's "
        f"{_gib(total_bytes)} and compute capability {_cc(compute_capability)} with the "
        f"{family.name} family's rates ({family.hbm_bandwidth_bytes_per_s / 1e12:.2f} TB/s, "
        f"{family.bf16_dense_flops / 1e12:.0f} TFLOP/s bf16; no NVLink assumed)"
    )
    return spec, note


def _mig_slice(name: str, parent: GpuSpec, mig: MigShare) -> ResolvedGpu:
    memory_share = min(mig.total_bytes / mig.parent_total_bytes, 1.0)
    if mig.multiprocessors and mig.parent_multiprocessors:
        compute_share = min(mig.multiprocessors / mig.parent_multiprocessors, 1.0)
        compute_why = f"{mig.multiprocessors} of {mig.parent_multiprocessors} SMs"
    else:
        compute_share = memory_share
        compute_why = "its memory share: NVML reports no SM counts"
    profile = mig.profile or _gib(mig.total_bytes)
    fp8 = parent.fp8_dense_flops
    spec = parent.model_copy(
        update={
            "name": f"{parent.name}-MIG-{profile}",
            "aliases": (),
            "nvml_total_bytes": mig.total_bytes,
            "cuda_total_bytes": max(mig.total_bytes - DRIVER_RESERVED_BYTES, mig.total_bytes // 2),
            "hbm_bandwidth_bytes_per_s": parent.hbm_bandwidth_bytes_per_s * memory_share,
            "bf16_dense_flops": parent.bf16_dense_flops * compute_share,
            "fp8_dense_flops": None if fp8 is None else fp8 * compute_share,
            "tdp_watts": parent.tdp_watts * compute_share,
            "nvlink_bytes_per_s": None,
            "source": f"a MIG slice of the {parent.name}: NVML's memory, the parent's rates "
            "scaled by the slice's share",
        }
    )
    note = (
        f"GPU {name!r} is a MIG slice ({profile}): planned as {spec.name} from NVML's "
        f"{_gib(mig.total_bytes)} with the {parent.name}'s rates, bandwidth x {memory_share:.2f} "
        f"(its memory share) and FLOP/s x {compute_share:.2f} ({compute_why}); one GPU, no NVLink"
    )
    return ResolvedGpu(spec, note)

from __future__ import annotations

import pytest

from tuner.errors import UnknownGpuError
from tuner.vllm.gpus import (
    GiB,
    MiB,
    MigShare,
    get_gpu,
    gpu_from_nvml,
    known_gpus,
    kv_cache_dtypes_for,
    preset_for_nvml_name,
)
from tuner.vllm.versions import VllmVersion

REQUIRED = [
    "A100-40GB",
    "A100-80GB",
    "H100-80GB",
    "H200-141GB",
    "L4-24GB",
    "L40S-48GB",
    "B200-180GB",
]


@pytest.mark.parametrize("name", REQUIRED)
def test_required_presets_exist_and_are_consistent(name: str) -> None:
    gpu = get_gpu(name)
    assert gpu.cuda_total_bytes < gpu.nvml_total_bytes
    assert gpu.hbm_bandwidth_bytes_per_s > 1e11 and gpu.bf16_dense_flops > 1e13
    assert "auto" in gpu.kv_cache_dtypes
    assert gpu.kv_cache_dtypes == kv_cache_dtypes_for(gpu.compute_capability)


def test_names_are_case_insensitive_with_aliases() -> None:
    assert get_gpu("h100").name == "H100-80GB"
    assert get_gpu("NVIDIA H100 80GB HBM3").name == "H100-80GB"
    assert get_gpu("a100_80gb").name == "A100-80GB"


def test_unknown_gpu_lists_the_known_ones() -> None:
    with pytest.raises(UnknownGpuError) as err:
        get_gpu("V100")
    message = str(err.value)
    assert "'V100'" in message
    for gpu in known_gpus():
        assert gpu.name in message


def test_h100_total_as_vllm_sees_it() -> None:
    assert round(get_gpu("H100-80GB").cuda_total_bytes / GiB, 2) == 79.19


# --- GPUs as NVML names them -------------------------------------------------------------

NVML_NAMES = [
    # (NVML's name, its memory in MiB, compute capability, the profile planned)
    ("NVIDIA H100 NVL", 95830, (9, 0), "H100-NVL-94GB"),
    ("NVIDIA H200 NVL", 143771, (9, 0), "H200-NVL-141GB"),
    ("NVIDIA GH200 480GB", 97871, (9, 0), "GH200-96GB"),
    ("NVIDIA A100-PCIE-40GB", 40960, (8, 0), "A100-40GB"),
    ("NVIDIA A100 80GB PCIe", 81920, (8, 0), "A100-80GB"),
    ("NVIDIA A100-SXM4-80GB", 81920, (8, 0), "A100-80GB"),
    ("NVIDIA H100 80GB HBM3", 81559, (9, 0), "H100-80GB"),
    ("NVIDIA H100 PCIe", 81559, (9, 0), "H100-PCIe-80GB"),
    ("NVIDIA H200", 143771, (9, 0), "H200-141GB"),
    ("NVIDIA L40S", 46068, (8, 9), "L40S-48GB"),
    ("NVIDIA RTX 6000 Ada Generation", 49140, (8, 9), "RTX-6000-Ada-48GB"),
    ("NVIDIA GeForce RTX 4090", 24564, (8, 9), "RTX-4090-24GB"),
    ("NVIDIA A10G", 23028, (8, 6), "A10G"),
    ("NVIDIA L40", 46068, (8, 9), "L40"),
    ("NVIDIA GH200 144G HBM3e", 146831, (9, 0), "GH200-144G-HBM3e"),
]


@pytest.mark.parametrize(("name", "mib", "cc", "planned"), NVML_NAMES)
def test_nvml_names_of_common_gpus_resolve(
    name: str, mib: int, cc: tuple[int, int], planned: str
) -> None:
    resolved = gpu_from_nvml(name, total_bytes=mib * MiB, compute_capability=cc)
    assert resolved.spec.name == planned
    assert resolved.spec.compute_capability == cc
    assert (resolved.note is None) == (preset_for_nvml_name(name) is not None)
    if resolved.note is None:
        assert get_gpu(name) is resolved.spec  # --gpu may name the part as NVML does


def test_an_unknown_part_is_planned_from_nvml_and_said_in_one_line() -> None:
    resolved = gpu_from_nvml("NVIDIA L40", total_bytes=46068 * MiB, compute_capability=(8, 9))
    assert resolved.note == (
        "GPU 'NVIDIA L40' is not a known profile: planned as L40 from NVML's 45.0 GiB and "
        "compute capability 8.9 with the L40S-48GB family's rates (0.86 TB/s, 362 TFLOP/s "
        "bf16; no NVLink assumed)"
    )
    spec, l40s = resolved.spec, get_gpu("L40S")
    assert spec.nvml_total_bytes == 46068 * MiB and spec.cuda_total_bytes < spec.nvml_total_bytes
    assert spec.hbm_bandwidth_bytes_per_s == l40s.hbm_bandwidth_bytes_per_s
    assert spec.nvlink_bytes_per_s is None and spec.supports_fp8
    blackwell = gpu_from_nvml(
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        total_bytes=97887 * MiB,
        compute_capability=(12, 0),
    )
    assert blackwell.spec.name == "RTX-PRO-6000-Blackwell-Server-Edition"
    assert blackwell.note is not None and "RTX-6000-Ada-48GB family" in blackwell.note


@pytest.mark.parametrize(
    ("total", "cc", "said"),
    [
        (None, (12, 0), "NVML reports no memory"),
        (0, (12, 0), "NVML reports no memory"),
        (90 * GiB, None, "no compute capability"),
        (16 * GiB, (7, 0), "compute capability 7.0"),
    ],
)
def test_an_unknown_part_nvml_cannot_describe_is_one_line(
    total: int | None, cc: tuple[int, int] | None, said: str
) -> None:
    with pytest.raises(UnknownGpuError) as err:
        gpu_from_nvml("NVIDIA Mystery", total_bytes=total, compute_capability=cc)
    message = str(err.value)
    assert "\n" not in message and "'NVIDIA Mystery'" in message and said in message
    assert "--gpu" in message and "H100-80GB" in message


def test_a_typed_unknown_name_stays_an_error() -> None:
    with pytest.raises(UnknownGpuError, match="unknown GPU 'NVIDIA L40'"):
        get_gpu("NVIDIA L40")


def test_a_mig_slice_takes_its_share_of_the_parent() -> None:
    share = MigShare(
        profile="1g.10gb",
        total_bytes=9728 * MiB,
        parent_total_bytes=81559 * MiB,
        multiprocessors=None,
        parent_multiprocessors=None,
    )
    resolved = gpu_from_nvml(
        "NVIDIA H100 80GB HBM3", total_bytes=81559 * MiB, compute_capability=(9, 0), mig=share
    )
    h100 = get_gpu("H100-80GB")
    ratio = 9728 / 81559
    assert resolved.spec.name == "H100-80GB-MIG-1g.10gb"
    assert resolved.spec.bf16_dense_flops == pytest.approx(h100.bf16_dense_flops * ratio)
    assert resolved.spec.hbm_bandwidth_bytes_per_s == pytest.approx(
        h100.hbm_bandwidth_bytes_per_s * ratio
    )
    assert resolved.note is not None and "no SM counts" in resolved.note


# --- fp8 KV cache per compute capability and release (vLLM's source, see gpus.py) --------


@pytest.mark.parametrize(
    ("cc", "release", "fp8"),
    [
        ((8, 0), "0.10", False),  # V1 refused it: FlashAttention 2 has none, no V0 left to fall to
        ((8, 0), "0.11", True),  # FlashInfer takes it (vLLM PR #24577)
        ((8, 6), "0.33", True),
        ((8, 9), "0.9", True),
        ((9, 0), "0.9", True),
        ((7, 5), "0.33", False),
    ],
)
def test_fp8_kv_cache_where_vllm_takes_it(cc: tuple[int, int], release: str, fp8: bool) -> None:
    dtypes = kv_cache_dtypes_for(cc, VllmVersion.parse(release))
    assert ({"fp8", "fp8_e4m3", "fp8_e5m2"} <= set(dtypes)) == fp8
    assert "auto" in dtypes


def test_fp8_kv_cache_on_an_a100() -> None:
    a100 = get_gpu("A100-80GB")
    assert "fp8" in a100.kv_cache_dtypes_in(VllmVersion.parse("0.33"))
    assert a100.kv_cache_dtypes_in(VllmVersion.parse("0.10")) == ("auto",)

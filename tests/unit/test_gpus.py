from __future__ import annotations

import pytest

from tuner.errors import UnknownGpuError
from tuner.vllm.gpus import GiB, get_gpu, known_gpus

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
    assert ("fp8" in gpu.kv_cache_dtypes) == gpu.supports_fp8


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

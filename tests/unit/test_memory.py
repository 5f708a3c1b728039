from __future__ import annotations

import pytest

from tuner.errors import ConfigError
from tuner.vllm.failures import StartupFailureKind
from tuner.vllm.gpus import GiB, get_gpu
from tuner.vllm.memory import (
    Calibration,
    ServingParams,
    activation_bytes,
    kv_cache_groups,
    page_size_bytes,
    plan,
    weights_bytes,
)
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion

LLAMA = resolve_model("llama-3.1-8b")
H100 = get_gpu("H100-80GB")
V10 = VllmVersion.parse("0.10.1")


def test_page_size_is_two_times_block_heads_headdim_dtype() -> None:
    # 2 (K and V) x 16 tokens x 8 KV heads x 128 x 2 bytes
    assert page_size_bytes(LLAMA, 16, "auto", 1) == 2 * 16 * 8 * 128 * 2
    assert page_size_bytes(LLAMA, 16, "fp8", 1) == 2 * 16 * 8 * 128
    # Tensor parallel shards KV heads; fewer heads than ranks replicate one head per rank.
    assert page_size_bytes(LLAMA, 16, "auto", 4) == 2 * 16 * 2 * 128 * 2
    assert page_size_bytes(LLAMA, 16, "auto", 16) == 2 * 16 * 1 * 128 * 2


def test_mla_page_holds_one_latent_vector_per_token() -> None:
    ds = resolve_model("deepseek-v2-lite")
    assert page_size_bytes(ds, 64, "auto", 1) == 64 * (512 + 64) * 2
    # The latent is not sharded across ranks.
    assert page_size_bytes(ds, 64, "auto", 2) == page_size_bytes(ds, 64, "auto", 1)


def test_blocks_and_tokens_follow_from_the_kv_budget() -> None:
    p = plan(LLAMA, H100, ServingParams(), V10)
    assert p.fits and p.failure is None
    assert p.num_gpu_blocks == p.kv_cache_bytes // (p.page_size_bytes * 32)
    assert p.kv_cache_tokens == p.num_gpu_blocks * 16
    assert p.max_concurrency == pytest.approx(p.num_gpu_blocks / (131072 // 16), abs=0.006)
    assert p.requested_bytes == pytest.approx(0.9 * H100.cuda_total_bytes, abs=1)
    expected_kv = p.requested_bytes - p.weights_bytes - p.activation_bytes - p.non_torch_bytes
    assert p.kv_cache_bytes == expected_kv  # 0.10 does not subtract CUDA graphs


def test_cudagraph_memory_is_in_the_budget_from_0_20() -> None:
    same = ServingParams(gpu_memory_utilization=0.9)
    old = plan(LLAMA, H100, same, VllmVersion.parse("0.19"))
    new = plan(LLAMA, H100, same, VllmVersion.parse("0.20"))
    assert new.cudagraph_bytes > 0
    assert old.kv_cache_bytes - new.kv_cache_bytes == new.cudagraph_bytes
    eager = plan(
        LLAMA, H100, same.model_copy(update={"enforce_eager": True}), VllmVersion.parse("0.20")
    )
    assert eager.cudagraph_bytes == 0 and eager.kv_cache_bytes > new.kv_cache_bytes


def test_fp8_kv_cache_doubles_tokens() -> None:
    auto = plan(LLAMA, H100, ServingParams(), V10)
    fp8 = plan(LLAMA, H100, ServingParams(kv_cache_dtype="fp8"), V10)
    assert fp8.kv_cache_tokens == pytest.approx(2 * auto.kv_cache_tokens, abs=16)


def test_more_utilization_never_means_fewer_tokens() -> None:
    tokens = [
        plan(LLAMA, H100, ServingParams(gpu_memory_utilization=u / 100), V10).kv_cache_tokens
        for u in range(30, 101, 5)
    ]
    assert tokens == sorted(tokens)
    assert tokens[-1] > tokens[0]


def test_activation_grows_with_batched_tokens_and_sequences() -> None:
    small = activation_bytes(LLAMA, 1, 2048, 256)
    assert activation_bytes(LLAMA, 1, 16384, 256) > small
    assert activation_bytes(LLAMA, 1, 2048, 1024) > small


def test_gemma2_hybrid_groups_and_sliding_window_concurrency() -> None:
    gemma = resolve_model("gemma-2-9b")
    groups = kv_cache_groups(gemma)
    assert [g.num_layers for g in groups] == [21, 21]
    p = plan(gemma, H100, ServingParams(), V10)
    # Two groups share the pool: tokens count one group's blocks.
    assert p.kv_cache_tokens == p.num_gpu_blocks // 2 * 16
    # A max-length request needs full blocks in the global group, and only the window
    # plus one batch in the sliding group.
    per_request = 8192 // 16 + min(4096 - 1 + p.max_num_batched_tokens, 8192) // 16 + 1
    assert p.max_concurrency == pytest.approx(p.num_gpu_blocks / per_request, abs=0.006)


def test_weights_shard_across_tensor_parallel_ranks() -> None:
    one = weights_bytes(resolve_model("llama-3.1-70b"), 1)
    four = weights_bytes(resolve_model("llama-3.1-70b"), 4)
    assert one / 4 < four < one / 4 * 1.01


def test_budget_above_free_memory_fails_with_vllms_message() -> None:
    p = plan(LLAMA, H100, ServingParams(other_process_bytes=20 * GiB), V10)
    assert not p.fits and p.failure is not None
    assert p.failure.kind is StartupFailureKind.BUDGET_ABOVE_FREE_MEMORY
    assert p.failure.error_type == "ValueError"
    assert p.failure.message.startswith("Free memory on device (59.19/79.19 GiB) on startup")
    assert "desired GPU memory utilization (0.9, 71.27 GiB)" in p.failure.message
    # From 0.14 vLLM names the device; 0.20 raised the default utilization to 0.92.
    current = plan(LLAMA, H100, ServingParams(other_process_bytes=20 * GiB))
    assert current.failure is not None
    assert current.failure.message.startswith("Free memory on device cuda:0 (59.19/79.19 GiB)")
    assert "(0.92, 72.85 GiB)" in current.failure.message


def test_weights_that_do_not_fit_the_device() -> None:
    p = plan(resolve_model("mixtral-8x7b"), get_gpu("L4-24GB"), ServingParams(), V10)
    assert p.failure is not None and p.failure.kind is StartupFailureKind.WEIGHTS_DO_NOT_FIT
    assert "CUDA out of memory" in p.failure.message


def test_no_memory_for_cache_blocks() -> None:
    p = plan(LLAMA, H100, ServingParams(gpu_memory_utilization=0.2), V10)
    assert p.failure is not None
    assert p.failure.kind is StartupFailureKind.NO_MEMORY_FOR_CACHE_BLOCKS
    assert "No available memory for the cache blocks" in p.failure.message


def test_max_model_len_that_does_not_fit_gives_the_estimated_maximum() -> None:
    p = plan(LLAMA, H100, ServingParams(gpu_memory_utilization=0.3), V10)
    assert p.failure is not None
    assert p.failure.kind is StartupFailureKind.MAX_MODEL_LEN_DOES_NOT_FIT
    assert p.estimated_max_model_len is not None and 0 < p.estimated_max_model_len < 131072
    assert f"estimated maximum model length is {p.estimated_max_model_len}" in p.failure.message
    # And that estimate does start.
    ok = plan(
        LLAMA,
        H100,
        ServingParams(gpu_memory_utilization=0.3, max_model_len=p.estimated_max_model_len),
        V10,
    )
    assert ok.fits
    too_long = plan(
        LLAMA,
        H100,
        ServingParams(gpu_memory_utilization=0.3, max_model_len=p.estimated_max_model_len + 16),
        V10,
    )
    assert not too_long.fits


@pytest.mark.parametrize(
    ("params", "model", "gpu", "kind"),
    [
        (
            ServingParams(max_num_seqs=512, max_num_batched_tokens=256),
            "llama-3.1-8b",
            "H100-80GB",
            StartupFailureKind.INVALID_CONFIGURATION,
        ),
        (
            ServingParams(max_model_len=200000),
            "llama-3.1-8b",
            "H100-80GB",
            StartupFailureKind.INVALID_CONFIGURATION,
        ),
        (
            ServingParams(tensor_parallel_size=3),
            "llama-3.1-8b",
            "H100-80GB",
            StartupFailureKind.INVALID_CONFIGURATION,
        ),
        (
            ServingParams(kv_cache_dtype="fp8"),
            "llama-3.1-8b",
            "A100-80GB",
            StartupFailureKind.KV_CACHE_DTYPE_UNSUPPORTED,
        ),
    ],
)
def test_invalid_configurations_are_named(
    params: ServingParams, model: str, gpu: str, kind: StartupFailureKind
) -> None:
    p = plan(resolve_model(model), get_gpu(gpu), params, V10)
    assert p.failure is not None and p.failure.kind is kind
    assert p.failure.message and p.failure.error_type


def test_block_size_rules_follow_the_release() -> None:
    odd = ServingParams(block_size=24)
    old = plan(LLAMA, H100, odd, V10).failure
    assert old is not None and old.error_type == "argparse"
    assert old.message == (
        "argument --block-size: invalid choice: 24 (choose from 1, 8, 16, 32, 64, 128)"
    )
    new = plan(LLAMA, H100, odd).failure
    assert new is not None and new.kind is StartupFailureKind.BLOCK_SIZE_UNSUPPORTED
    assert new.message == "Block size must be a multiple of 16."
    assert plan(LLAMA, H100, ServingParams(block_size=48)).fits


def test_mla_backends_force_their_block_size() -> None:
    ds = resolve_model("deepseek-v2-lite")
    assert plan(ds, H100, ServingParams(block_size=16)).block_size == 64
    assert plan(ds, get_gpu("B200-180GB"), ServingParams(block_size=16)).block_size == 128


@pytest.mark.parametrize(
    ("params", "flag"),
    [
        (ServingParams(gpu_memory_utilization=0.0), "--gpu-memory-utilization 0.0"),
        (ServingParams(gpu_memory_utilization=1.01), "--gpu-memory-utilization 1.01"),
        (ServingParams(max_num_seqs=-1), "--max-num-seqs -1"),
        (ServingParams(block_size=0), "--block-size 0"),
        (ServingParams(kv_cache_dtype="int3"), "--kv-cache-dtype 'int3'"),
        (ServingParams(cpu_offload_gb=-2), "--cpu-offload-gb -2"),
        (ServingParams(cpu_offload_gb=float("nan")), "--cpu-offload-gb nan"),
        (ServingParams(cpu_offload_gb=float("inf")), "--cpu-offload-gb inf"),
        (ServingParams(gpu_memory_utilization=float("nan")), "--gpu-memory-utilization nan"),
    ],
)
def test_out_of_range_values_are_config_errors(params: ServingParams, flag: str) -> None:
    with pytest.raises(ConfigError, match="accepted"):
        plan(LLAMA, H100, params, V10)
    with pytest.raises(ConfigError) as err:
        params.checked()
    assert flag in str(err.value)


def test_calibration_with_components_makes_the_budget_exact() -> None:
    cal = Calibration(
        source="test",
        weights_bytes=int(14.99 * GiB),
        activation_bytes=int(1.19 * GiB),
        non_torch_bytes=int(0.31 * GiB),
        total_bytes=int(79.19 * GiB),
    )
    p = plan(LLAMA, H100, ServingParams(), V10, cal)
    assert p.calibrated
    assert p.kv_cache_bytes == p.requested_bytes - int(14.99 * GiB) - int(1.19 * GiB) - int(
        0.31 * GiB
    )


def test_calibration_from_available_kv_reproduces_the_logged_budget() -> None:
    cal = Calibration(
        source="test",
        weights_bytes=int(14.99 * GiB),
        available_kv_bytes=int(54.00 * GiB),
        gpu_memory_utilization=0.9,
        total_bytes=int(79.19 * GiB),
    )
    same = plan(LLAMA, H100, ServingParams(), V10, cal)
    assert same.kv_cache_bytes == pytest.approx(54.00 * GiB, abs=2)
    # At a higher utilization the extra budget goes to the KV cache one for one.
    higher = plan(LLAMA, H100, ServingParams(gpu_memory_utilization=0.95), V10, cal)
    assert higher.kv_cache_bytes - same.kv_cache_bytes == pytest.approx(0.05 * 79.19 * GiB, abs=8)


def test_utilization_too_high_leaves_no_room_after_the_kv_cache() -> None:
    # 0.11 captures CUDA graphs after allocating the KV cache: 1.0 cannot start.
    full = plan(LLAMA, H100, ServingParams(gpu_memory_utilization=1.0), VllmVersion.parse("0.11"))
    assert full.failure is not None
    assert full.failure.kind is StartupFailureKind.CUDA_OOM_WARMUP
    assert full.failure.error_type == "torch.OutOfMemoryError"
    near = plan(LLAMA, H100, ServingParams(gpu_memory_utilization=0.97), VllmVersion.parse("0.11"))
    assert near.fits

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tuner.errors import ModelConfigError, UnknownModelError
from tuner.vllm.memory import parameter_count
from tuner.vllm.models import AttentionKind, Quantization, checkpoint_bytes, resolve_model

# Published parameter counts (model cards / safetensors totals).
PUBLISHED = {
    "llama-3.1-8b": 8.030e9,
    "llama-3.1-70b": 70.55e9,
    "qwen2.5-7b": 7.616e9,
    "qwen2.5-72b": 72.71e9,
    "mistral-7b-v0.3": 7.248e9,
    "mixtral-8x7b": 46.70e9,
    "qwen3-30b-a3b": 30.53e9,
    "deepseek-v2-lite": 15.71e9,
    "gemma-2-9b": 9.242e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_count_matches_published(name: str) -> None:
    count = parameter_count(resolve_model(name))
    assert count == pytest.approx(PUBLISHED[name], rel=0.002)


@pytest.mark.parametrize(
    "alias",
    ["meta-llama/Llama-3.1-8B-Instruct", "LLAMA-3.1-8B", "Llama-3.1-8B-Instruct", "llama-3.1-8b"],
)
def test_presets_resolve_by_short_name_and_hf_id(alias: str) -> None:
    spec = resolve_model(alias)
    assert spec.num_layers == 32 and spec.num_kv_heads == 8 and spec.head_dim == 128


def test_unknown_model_lists_presets() -> None:
    with pytest.raises(UnknownModelError, match=r"unknown model 'nope-13b'.*llama-3\.1-8b"):
        resolve_model("nope-13b")


def test_gemma2_alternates_sliding_and_global_layers() -> None:
    spec = resolve_model("gemma-2-9b")
    assert spec.sliding_window == 4096
    assert spec.layer_attention[:4] == (
        AttentionKind.SLIDING,
        AttentionKind.FULL,
        AttentionKind.SLIDING,
        AttentionKind.FULL,
    )
    assert spec.layer_attention.count(AttentionKind.FULL) == 21


def test_deepseek_v2_lite_is_mla_moe() -> None:
    spec = resolve_model("deepseek-v2-lite")
    assert spec.is_mla and spec.is_moe
    assert set(spec.layer_attention) == {AttentionKind.MLA}
    assert spec.kv_lora_rank == 512 and spec.qk_rope_head_dim == 64


def test_qwen2_sliding_window_disabled_is_full_attention() -> None:
    spec = resolve_model("qwen2.5-7b")
    assert spec.sliding_window is None
    assert set(spec.layer_attention) == {AttentionKind.FULL}


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> int:
    """A valid safetensors file whose data section is zeros; returns its data bytes."""
    sizes = {"BF16": 2, "F32": 4, "F8_E4M3": 1}
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    return offset


def test_local_directory_reads_exact_bytes_from_safetensors_headers(tmp_path: Path) -> None:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 100,
        "max_position_embeddings": 256,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    a = _write_safetensors(
        tmp_path / "model-00001-of-00002.safetensors", {"a": ("BF16", [100, 64])}
    )
    b = _write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"b": ("F32", [7, 3])})
    spec = resolve_model(str(tmp_path))
    assert spec.checkpoint_bytes == a + b == 100 * 64 * 2 + 7 * 3 * 4
    assert spec.num_kv_heads == 2 and spec.head_dim == 16


def test_index_total_size_used_without_shards(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 123456}, "weight_map": {}})
    )
    assert checkpoint_bytes(tmp_path) == 123456


def test_directory_without_config_json_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match=r"has no config\.json"):
        resolve_model(str(tmp_path))


def test_corrupt_safetensors_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    (tmp_path / "x.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ModelConfigError):
        resolve_model(str(tmp_path))


def test_quantization_read_from_config(tmp_path: Path) -> None:
    config = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 100,
        "quantization_config": {"quant_method": "awq", "bits": 4},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert resolve_model(str(tmp_path)).quantization is Quantization.AWQ

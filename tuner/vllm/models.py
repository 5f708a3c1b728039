"""ModelSpec: the shape of a model as vLLM's memory accounting sees it.

A spec comes from a Hugging Face ``config.json``: either a local model directory
(its safetensors headers give the exact weight bytes; tensors are never loaded)
or a preset shipped in ``tuner/presets/models/``. Preset names are matched
case-insensitively against a short name (``llama-3.1-8b``) and Hugging Face ids
(``meta-llama/Llama-3.1-8B-Instruct``).
"""

from __future__ import annotations

import json
import struct
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from tuner.errors import ModelConfigError, UnknownModelError

DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}

SAFETENSORS_DTYPE_BYTES: dict[str, float] = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


class AttentionKind(StrEnum):
    """How a model's layers store their KV cache."""

    FULL = "full"
    SLIDING = "sliding"
    MLA = "mla"


class Quantization(StrEnum):
    NONE = "none"
    FP8 = "fp8"
    AWQ = "awq"
    GPTQ = "gptq"
    MXFP4 = "mxfp4"

    @classmethod
    def from_method(cls, method: str) -> Quantization:
        """vLLM's ``--quantization`` / ``quant_method`` names, kernels variants included."""
        name = method.strip().lower()
        if name in {"fp8", "fbgemm_fp8", "modelopt", "ptpc_fp8"}:
            return cls.FP8
        if name in {"awq", "awq_marlin"}:
            return cls.AWQ
        if name in {"gptq", "gptq_marlin"}:
            return cls.GPTQ
        if name == "mxfp4":
            return cls.MXFP4
        return cls.NONE

    @property
    def linear_bytes_per_param(self) -> float | None:
        """Bytes per weight of a quantized linear layer (None: the model dtype)."""
        if self is Quantization.FP8:
            return 1.0
        if self in (Quantization.AWQ, Quantization.GPTQ):
            # 4-bit weights plus one fp16 scale and one 4-bit zero per group of 128.
            return 0.5 + 2.5 / 128
        if self is Quantization.MXFP4:
            # 4-bit values with one 8-bit shared exponent per block of 32.
            return 0.5 + 1 / 32
        return None


class ModelSpec(BaseModel):
    """What the tuner needs to know about a model; every size is per whole model."""

    model_config = ConfigDict(frozen=True)

    name: str
    architecture: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    max_position_embeddings: int
    dtype: str = "bfloat16"
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    # Per layer, in order; sliding layers use ``sliding_window`` tokens.
    layer_attention: tuple[AttentionKind, ...]
    sliding_window: int | None = None
    # Mixture of experts (0 experts: dense).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    num_dense_layers: int = 0
    # Multi-head latent attention (DeepSeek).
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    rotary_dim: int = 0
    quantization: Quantization = Quantization.NONE
    # Exact bytes of the checkpoint's tensors, when read from safetensors.
    checkpoint_bytes: int | None = None
    source: str = "preset"

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def dtype_bytes(self) -> float:
        return DTYPE_BYTES[self.dtype]

    @classmethod
    def from_hf_config(
        cls, config: dict[str, Any], *, name: str, source: str, checkpoint_bytes: int | None = None
    ) -> ModelSpec:
        return _spec_from_config(
            config, name=name, source=source, checkpoint_bytes=checkpoint_bytes
        )


def _first(config: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        value = config.get(key)
        if value is not None:
            return value
    return default


def _layer_kinds(
    config: dict[str, Any], num_layers: int, model_type: str
) -> tuple[tuple[AttentionKind, ...], int | None]:
    """Which layers use sliding-window attention, as vLLM's model code decides it."""
    window = config.get("sliding_window")
    if config.get("use_sliding_window") is False:
        window = None
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) == num_layers and window:
        kinds = tuple(
            AttentionKind.SLIDING if str(t).startswith("sliding") else AttentionKind.FULL
            for t in layer_types
        )
        return kinds, int(window)
    if window and model_type == "gemma2":
        # Gemma 2 alternates: even layers use the sliding window, odd ones are global.
        return (
            tuple(
                AttentionKind.SLIDING if i % 2 == 0 else AttentionKind.FULL
                for i in range(num_layers)
            ),
            int(window),
        )
    pattern = config.get("sliding_window_pattern")
    if window and isinstance(pattern, int) and pattern > 1:
        # Gemma 3 style: every pattern-th layer is global, the others slide.
        return (
            tuple(
                AttentionKind.FULL if (i + 1) % pattern == 0 else AttentionKind.SLIDING
                for i in range(num_layers)
            ),
            int(window),
        )
    if window and model_type in {"mistral", "mixtral", "qwen2", "starcoder2"}:
        if int(window) >= int(_first(config, "max_position_embeddings", default=0) or 0):
            return tuple(AttentionKind.FULL for _ in range(num_layers)), None
        return tuple(AttentionKind.SLIDING for _ in range(num_layers)), int(window)
    return tuple(AttentionKind.FULL for _ in range(num_layers)), None


def _quantization(config: dict[str, Any]) -> Quantization:
    qcfg = config.get("quantization_config")
    if not isinstance(qcfg, dict):
        return Quantization.NONE
    method = str(qcfg.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        text = json.dumps(qcfg).lower()
        if '"num_bits": 4' in text or qcfg.get("bits") == 4:
            return Quantization.GPTQ
        if ('"num_bits": 8' in text and '"type": "float"' in text) or qcfg.get("bits") == 8:
            return Quantization.FP8
        return Quantization.NONE
    return Quantization.from_method(method)


def _spec_from_config(
    raw: dict[str, Any], *, name: str, source: str, checkpoint_bytes: int | None
) -> ModelSpec:
    config = dict(raw)
    if isinstance(config.get("text_config"), dict):
        # Multimodal wrappers keep the language model's shape in text_config.
        config = {**config, **config["text_config"]}
    try:
        hidden = int(_first(config, "hidden_size", "n_embd", "d_model"))
        layers = int(_first(config, "num_hidden_layers", "n_layer", "num_layers"))
        heads = int(_first(config, "num_attention_heads", "n_head"))
        vocab = int(config["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelConfigError(
            f"config.json of {name!r} lacks a usable {exc} "
            "(needs hidden_size, num_hidden_layers, num_attention_heads, vocab_size)"
        ) from exc
    kv_heads = int(_first(config, "num_key_value_heads", "num_kv_heads", default=heads))
    head_dim = int(_first(config, "head_dim", default=hidden // heads))
    model_type = str(config.get("model_type", "")).lower()
    architectures = config.get("architectures") or [model_type or "unknown"]
    kinds, window = _layer_kinds(config, layers, model_type)
    kv_lora_rank = int(config.get("kv_lora_rank") or 0)
    if kv_lora_rank:
        kinds = tuple(AttentionKind.MLA for _ in range(layers))
        window = None
    num_experts = int(
        _first(config, "num_local_experts", "num_experts", "n_routed_experts", default=0)
    )
    intermediate = int(_first(config, "intermediate_size", "ffn_dim", default=4 * hidden))
    moe_intermediate = int(
        _first(config, "moe_intermediate_size", default=intermediate if num_experts else 0)
    )
    shared = int(config.get("shared_expert_intermediate_size") or 0)
    if not shared and config.get("n_shared_experts"):
        shared = int(config["n_shared_experts"]) * moe_intermediate
    dense_layers = int(config.get("first_k_dense_replace") or 0)
    dtype = str(_first(config, "torch_dtype", "dtype", default="bfloat16")).replace("torch.", "")
    if dtype not in DTYPE_BYTES or DTYPE_BYTES[dtype] < 2:
        dtype = "bfloat16"
    if dtype == "float32":
        # vLLM serves fp32 checkpoints in bf16 unless told otherwise.
        dtype = "bfloat16"
    rope_dim = int(config.get("qk_rope_head_dim") or 0)
    partial = float(config.get("partial_rotary_factor") or 1.0)
    rotary_dim = rope_dim if kv_lora_rank else int(head_dim * partial)
    return ModelSpec(
        name=name,
        architecture=str(architectures[0]),
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        intermediate_size=intermediate,
        max_position_embeddings=int(
            _first(config, "max_position_embeddings", "n_positions", "max_seq_len", default=2048)
        ),
        dtype=dtype,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(config.get("attention_bias", model_type in {"qwen2", "qwen2_moe"})),
        layer_attention=kinds,
        sliding_window=window,
        num_experts=num_experts,
        num_experts_per_tok=int(config.get("num_experts_per_tok") or 0),
        moe_intermediate_size=moe_intermediate,
        shared_expert_intermediate_size=shared,
        num_dense_layers=dense_layers,
        kv_lora_rank=kv_lora_rank,
        q_lora_rank=int(config.get("q_lora_rank") or 0),
        qk_rope_head_dim=rope_dim,
        qk_nope_head_dim=int(config.get("qk_nope_head_dim") or 0),
        v_head_dim=int(config.get("v_head_dim") or 0),
        rotary_dim=rotary_dim,
        quantization=_quantization(config),
        checkpoint_bytes=checkpoint_bytes,
        source=source,
    )


# --- presets ---------------------------------------------------------------------------


def _preset_index() -> dict[str, Any]:
    text = resources.files("tuner").joinpath("presets/models.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def _norm(name: str) -> str:
    return name.strip().lower()


def preset_names() -> list[str]:
    return sorted(_preset_index())


def _find_preset(name: str) -> tuple[str, dict[str, Any]] | None:
    wanted = _norm(name)
    for short, entry in _preset_index().items():
        names = {_norm(short), *(_norm(hf_id) for hf_id in entry["hf_ids"])}
        names |= {n.split("/", 1)[1] for n in list(names) if "/" in n}
        if wanted in names:
            return short, entry
    return None


def hf_id_of(name: str) -> str | None:
    """The Hugging Face id of a preset's name: a short name's first id, the id itself where
    one is given (a bare repository name gets its organisation); None for no preset."""
    found = _find_preset(name)
    if found is None:
        return None
    short, entry = found
    hf_ids: list[str] = entry["hf_ids"]
    wanted = _norm(name)
    if wanted == _norm(short):  # the short name first: llama-3.1-8b is also an id's tail
        return hf_ids[0]
    for hf_id in hf_ids:
        if wanted in (_norm(hf_id), _norm(hf_id.split("/", 1)[-1])):
            return name if "/" in name else hf_id
    return hf_ids[0]


def launch_name(name: str) -> str:
    """What ``vllm serve`` is given for a model name: a local directory's absolute path, a
    preset's Hugging Face id (a short name such as ``llama-3.1-8b`` is no repository on the
    hub), else the name as given (a Hugging Face id)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path.absolute())
    return hf_id_of(name) or name


# --- local directories -----------------------------------------------------------------


def _safetensors_header(path: Path) -> dict[str, Any]:
    """Read a safetensors file's JSON header without touching its tensors."""
    try:
        with path.open("rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            if length > 100 * 1024 * 1024:
                raise ModelConfigError(
                    f"{path}: safetensors header of {length} bytes is not plausible"
                )
            header: dict[str, Any] = json.loads(fh.read(length))
    except (OSError, struct.error, json.JSONDecodeError) as exc:
        raise ModelConfigError(f"{path}: not a readable safetensors file ({exc})") from exc
    return header


def checkpoint_bytes(model_dir: Path) -> int | None:
    """Exact tensor bytes of a checkpoint from its safetensors headers (or index)."""
    files = sorted(model_dir.glob("*.safetensors"))
    if files:
        total = 0
        for file in files:
            for key, meta in _safetensors_header(file).items():
                if key == "__metadata__":
                    continue
                start, end = meta["data_offsets"]
                total += int(end) - int(start)
        return total
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            meta = json.loads(index.read_text(encoding="utf-8")).get("metadata", {})
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelConfigError(f"{index}: not readable JSON ({exc})") from exc
        size = meta.get("total_size")
        return int(size) if size is not None else None
    return None


def load_model_dir(model_dir: Path) -> ModelSpec:
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelConfigError(
            f"model directory {str(model_dir)!r} has no config.json; "
            "give a Hugging Face model directory or a preset name"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelConfigError(f"{config_path}: not readable JSON ({exc})") from exc
    return ModelSpec.from_hf_config(
        config,
        name=str(model_dir),
        source=f"directory {model_dir}",
        checkpoint_bytes=checkpoint_bytes(model_dir),
    )


def resolve_model(name: str) -> ModelSpec:
    """A local model directory, or a preset by short name or Hugging Face id."""
    path = Path(name).expanduser()
    if path.is_dir():
        return load_model_dir(path.absolute())  # the name vLLM is launched with
    found = _find_preset(name)
    if found is None:
        if name.startswith((".", "/", "~")) or path.suffix:
            raise UnknownModelError(
                f"model directory {name!r} does not exist; known presets: {', '.join(preset_names())}"
            )
        raise UnknownModelError(
            f"unknown model {name!r}: not a directory with a config.json nor a preset; "
            f"known presets: {', '.join(preset_names())}"
        )
    short, entry = found
    display = hf_id_of(name) or entry["hf_ids"][0]
    return ModelSpec.from_hf_config(entry["config"], name=display, source=f"preset {short}")

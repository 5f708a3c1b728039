"""A small Llama-shaped model directory for tests that resolve a model from disk: its
config.json (the shape vLLM's memory accounting reads) and, where given, a tokenizer.json.
No weights: nothing here is loaded by an engine."""

from __future__ import annotations

import json
from pathlib import Path

SMALL_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}  # fmt: skip


def small_llama_dir(path: Path, *, tokenizer: bytes | None = None) -> Path:
    """``path`` made a model directory: the small config, and ``tokenizer`` as its
    tokenizer.json where given (none: a model whose prompts cannot be tokenized)."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps(SMALL_LLAMA_CONFIG))
    if tokenizer is not None:
        (path / "tokenizer.json").write_bytes(tokenizer)
    return path

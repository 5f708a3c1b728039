"""Generate a tiny Llama model directory for vLLM's CPU build (nothing is downloaded).

Random weights, a byte-level BPE tokenizer trained with the ``tokenizers`` library
on a few sentences, and a Llama config that vLLM's CPU attention accepts (head_dim
64, two layers). The directory holds what ``vllm serve`` reads from a Hugging Face
model: ``config.json``, ``generation_config.json``, ``model.safetensors``,
``tokenizer.json`` and ``tokenizer_config.json`` (with a chat template, so chat
completions work).

Run with a Python that has torch, safetensors and tokenizers (the vLLM CPU build's
virtual environment): ``python tools/tiny_model.py .cache/tiny-llama``. The same seed
gives the same model. The directory is written under a temporary name and renamed,
so an interrupted run never leaves a half-written model behind.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HIDDEN_SIZE = 256
HEAD_DIM = 64  # the smallest head size every CPU attention path takes
NUM_LAYERS = 2
MAX_POSITIONS = 4096
VOCAB_SIZE = 1024  # the BPE trainer's ceiling; a few sentences teach it fewer tokens
DTYPE = "bfloat16"  # what vLLM would run a float32 checkpoint in anyway

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

SENTENCES = (
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "A capacity review asks how much traffic one replica holds within the latency objective.",
    "Time to first token and inter-token latency are measured from the intended send time.",
    "The scheduler batches running requests and preempts the newest one when blocks run out.",
    "Prefix caching reuses the key and value blocks of a shared system prompt.",
    "She said that the people of this city have been working on the new house for years.",
    "We could not find the water in the old school, so they went back home before night.",
    "There is one thing that all of them should know: the world is large and life is long.",
    "Numbers such as 0 1 2 3 4 5 6 7 8 9 and 10 20 100 1000 appear in logs and reports.",
    "His government set a system for public business; her group gave the president a hand.",
    "Every second of the day, a young family may look for something better in another country.",
    "Hello, how are you today? I am fine, thank you. What would you like to talk about?",
)


def train_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(SENTENCES), trainer=trainer)
    return tokenizer


@dataclass(frozen=True)
class Shape:
    """The model's size: ``hidden_size`` a multiple of 128 (heads of 64, half as many KV
    heads), the MLP twice as wide."""

    hidden_size: int = HIDDEN_SIZE
    num_layers: int = NUM_LAYERS

    @property
    def num_heads(self) -> int:
        return self.hidden_size // HEAD_DIM

    @property
    def num_kv_heads(self) -> int:
        return max(1, self.num_heads // 2)

    @property
    def intermediate_size(self) -> int:
        return 2 * self.hidden_size


def llama_weights(vocab_size: int, seed: int, shape: Shape) -> dict[str, Any]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    hidden, head_dim, inner = shape.hidden_size, HEAD_DIM, shape.intermediate_size
    heads, kv_heads = shape.num_heads, shape.num_kv_heads

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * 0.02).contiguous()

    tensors: dict[str, torch.Tensor] = {"model.embed_tokens.weight": normal(vocab_size, hidden)}
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "self_attn.q_proj.weight": normal(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": normal(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": normal(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": normal(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": normal(inner, hidden),
            p + "mlp.up_proj.weight": normal(inner, hidden),
            p + "mlp.down_proj.weight": normal(hidden, inner),
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
        }
    tensors["model.norm.weight"] = torch.ones(hidden)
    tensors["lm_head.weight"] = normal(vocab_size, hidden)
    dtype = getattr(torch, DTYPE)
    return {name: t.to(dtype) for name, t in tensors.items()}


def write_model(out: Path, seed: int, shape: Shape) -> None:
    from safetensors.torch import save_file

    tokenizer = train_tokenizer(VOCAB_SIZE)
    vocab_size = tokenizer.get_vocab_size()  # the model's vocabulary: every id decodes
    bos_id, eos_id = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    out.mkdir(parents=True)
    tokenizer.save(str(out / "tokenizer.json"))
    weights = llama_weights(vocab_size, seed, shape)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": vocab_size,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": DTYPE,
        "dtype": DTYPE,
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }
    generation_config = {"bos_token_id": bos_id, "eos_token_id": eos_id, "do_sample": False}
    for name, content in (
        ("config.json", config),
        ("tokenizer_config.json", tokenizer_config),
        ("special_tokens_map.json", {"bos_token": BOS, "eos_token": EOS, "pad_token": EOS}),
        ("generation_config.json", generation_config),
    ):
        (out / name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path, help="model directory to create, e.g. .cache/tiny-llama")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="replace an existing directory")
    parser.add_argument("--hidden-size", type=int, default=HIDDEN_SIZE, help="a multiple of 128")
    parser.add_argument("--layers", type=int, default=NUM_LAYERS)
    args = parser.parse_args(argv)
    if args.hidden_size <= 0 or args.hidden_size % (2 * HEAD_DIM) or args.layers <= 0:
        parser.error(
            f"--hidden-size {args.hidden_size} --layers {args.layers}: accepted: a positive "
            f"multiple of {2 * HEAD_DIM} and a positive layer count"
        )
    shape = Shape(args.hidden_size, args.layers)
    out: Path = args.out
    if (out / "config.json").is_file() and not args.force:
        print(f"{out}: already there (--force to regenerate)")
        return 0
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    write_model(tmp, args.seed, shape)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(
        f"{out}: Llama of random weights ({shape.num_layers} layers, hidden size "
        f"{shape.hidden_size}, head_dim {HEAD_DIM}), {size / 1e6:.1f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Prompt text of exact token counts: the simulator's word rule and a real tokenizer."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tuner.sim.tokenizer import encode, encode_chat
from workloads.prompts import (
    VOCABULARY,
    TokenizerPromptBuilder,
    WordPromptBuilder,
    prompt_builder_for,
    text_of,
)
from workloads.spec import WorkloadError

HAS_TOKENIZERS = importlib.util.find_spec("tokenizers") is not None


class TestWordRule:
    builder = WordPromptBuilder()

    @pytest.mark.parametrize("n", [0, 1, 7, 512, 8192])
    def test_exact_word_counts_match_the_simulator(self, n: int) -> None:
        text = text_of(self.builder, n, seed=3)
        assert self.builder.count(text) == n == len(encode(text, 32_000))
        assert set(text.split()) <= set(VOCABULARY)

    def test_same_seed_same_text_other_seed_other_text(self) -> None:
        assert text_of(self.builder, 50, seed=1) == text_of(self.builder, 50, seed=1)
        assert text_of(self.builder, 50, seed=1) != text_of(self.builder, 50, seed=2)

    def test_extend_keeps_the_prefix_word_for_word(self) -> None:
        prefix = text_of(self.builder, 300, seed=9)
        a = self.builder.extend(prefix, 40, seed=1)
        b = self.builder.extend(prefix, 60, seed=2)
        assert a.split()[:300] == b.split()[:300] == prefix.split()
        assert self.builder.count(a) == 340 and self.builder.count(b) == 360
        assert self.builder.extend(prefix, 0, seed=1) == prefix

    def test_chat_counts_one_token_per_message_role(self) -> None:
        messages = [
            {"role": "system", "content": text_of(self.builder, 30, seed=1)},
            {"role": "user", "content": text_of(self.builder, 12, seed=2)},
        ]
        counted = sum(
            self.builder.count(m["content"]) + self.builder.message_overhead_tokens
            for m in messages
        )
        assert counted == 44 == len(encode_chat(messages, 32_000))

    def test_negative_counts_are_refused(self) -> None:
        with pytest.raises(WorkloadError, match="token count -1 is not accepted"):
            self.builder.extend("", -1, seed=0)

    def test_the_default_builder_is_the_word_rule(self) -> None:
        assert isinstance(prompt_builder_for(None), WordPromptBuilder)


def test_missing_tokenizers_package_is_a_workload_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import now raises ImportError
    with pytest.raises(
        WorkloadError, match="need the 'tokenizers' package, which is not installed"
    ):
        prompt_builder_for(tmp_path)


def test_a_model_dir_without_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=r"has no tokenizer\.json"):
        prompt_builder_for(tmp_path)


@pytest.fixture(scope="module")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer trained here on a little text: merges cross word parts,
    so counts are not one per word and the builder has to search."""
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<s>"],
    )
    corpus = [" ".join(VOCABULARY[i : i + 12]) for i in range(0, len(VOCABULARY), 3)] * 4
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    directory = tmp_path_factory.mktemp("tiny-model")
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


@pytest.mark.skipif(
    not HAS_TOKENIZERS, reason="the 'tokenizers' package is not installed (optional)"
)
class TestTokenizer:
    @pytest.mark.parametrize("n", [1, 2, 5, 50, 333])
    def test_exact_counts(self, tiny_tokenizer_dir: Path, n: int) -> None:
        builder = prompt_builder_for(tiny_tokenizer_dir)
        assert isinstance(builder, TokenizerPromptBuilder)
        text = text_of(builder, n, seed=n)
        assert builder.count(text) == n
        assert text_of(builder, n, seed=n) == text  # deterministic

    def test_counts_are_the_tokenizers_own(self, tiny_tokenizer_dir: Path) -> None:
        tokenizers = pytest.importorskip("tokenizers")
        raw = tokenizers.Tokenizer.from_file(str(tiny_tokenizer_dir / "tokenizer.json"))
        builder = prompt_builder_for(tiny_tokenizer_dir)
        text = text_of(builder, 120, seed=4)
        assert len(raw.encode(text, add_special_tokens=False).ids) == 120
        assert len(text.split()) != 120  # words are not tokens here

    def test_extend_after_a_prefix(self, tiny_tokenizer_dir: Path) -> None:
        builder = prompt_builder_for(tiny_tokenizer_dir)
        prefix = text_of(builder, 100, seed=1)
        for n in (1, 17, 200):
            text = builder.extend(prefix, n, seed=n)
            assert text.startswith(prefix)
            assert builder.count(text) == builder.count(prefix) + n

    def test_an_unreadable_tokenizer_file(self, tmp_path: Path) -> None:
        (tmp_path / "tokenizer.json").write_text("not json")
        with pytest.raises(WorkloadError, match="cannot be read"):
            prompt_builder_for(tmp_path)

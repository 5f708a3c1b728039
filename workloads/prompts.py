"""Prompt text with an exact token count, counted as the server counts it.

A ``PromptBuilder`` appends new text of exactly N tokens to a prefix, counts tokens, and
says what the server adds around the text: per chat conversation (the chat template's
role headers, default system block, generation prompt) and per completion (the BOS
token the tokenizer adds). Two builders:

* ``WordPromptBuilder``: the simulator's rule (``tuner sim-serve`` counts a text's
  whitespace-separated words, plus one token per chat message for its role). The
  text is N words from a fixed vocabulary, chosen by a seed: the same seed gives
  the same words, so a shared prefix is an identical word sequence and prefix
  caching hits on it.
* ``TokenizerPromptBuilder``: a Hugging Face ``tokenizer.json`` (from a local model
  directory) through the ``tokenizers`` library, imported only when used. It grows
  or trims words until ``len(encode(text, add_special_tokens=False).ids)`` is
  exactly the target (a binary search over the words of a seeded stream, then
  filler words for the last tokens). A chat request counts what vLLM's chat endpoint
  tokenizes: the model's chat template rendered (``workloads.chat_template``) and
  tokenized without added special tokens; a completion counts what its tokenizer adds
  (``add_special_tokens=True`` on vLLM's completions endpoint). A model without a chat
  template counts a chat request's contents alone (vLLM refuses such requests unless
  the server is given a template).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from workloads.chat_template import (
    NO_TEMPLATE_ERROR,
    TEMPLATE_FILES,
    ChatTemplate,
    read_json,
    template_source,
    token_text,
)
from workloads.spec import WorkloadError

# Common English words: one token each under the word rule, and nearly always one
# token (after a space) under BPE tokenizers of real models.
_WORDS = """
    the of and to in is that for it as was with be by on not he this are or his from at
    which but have an they you were her she there one all we their has been if more when
    will would who so no out up into do than time some can could other only new these two
    may first then any like now my such make over our even most after also did many before
    must through years where much your way well down should because each just those people
    how too little state good very world still own see men work long here get both between
    life being under never day same another know while last might us great old year off come
    since against go came right used take three states himself few house use during without
    again place around however home small found thought went say part once general high upon
    school every does got united left number course war until always away something fact
    though water less public put think almost hand enough far took head yet government system
    better set told nothing night end why called later find point city business give group
    toward young let room president side social given present order national second possible
    rather big among often early things looked large feel next knew within hard open country
    service days best development need light real face power best field money church family
    form change interest
"""
VOCABULARY: tuple[str, ...] = tuple(dict.fromkeys(_WORDS.split()))
# Words that may end a text to land on an exact count under a real tokenizer.
FILLERS: tuple[str, ...] = VOCABULARY + tuple("abcdefghijklmnopqrstuvwxyz0123456789")
_VOCABULARY_ARRAY = np.array(VOCABULARY, dtype=object)  # indexed by a draw at C speed


class PromptBuilder(Protocol):
    """Builds text of exact token counts for one tokenization."""

    # Tokens the server adds to a completion's prompt (the tokenizer's BOS); 0 for words.
    completion_overhead_tokens: int

    def count(self, text: str) -> int:
        """Tokens of a text."""
        ...

    def chat_overhead_tokens(self, roles: Sequence[str]) -> int:
        """Tokens the server adds to the contents of a chat request whose messages have
        these roles, in order (role markers, the template's own text, the generation
        prompt): the request counts the sum of its contents' tokens plus this."""
        ...

    def extend(self, prefix: str, n_tokens: int, *, seed: int) -> str:
        """``prefix`` followed by new text, count(result) == count(prefix) + n_tokens.

        The new text is a function of the seed (and of n_tokens): equal seeds and
        lengths give equal text."""
        ...


def text_of(builder: PromptBuilder, n_tokens: int, *, seed: int) -> str:
    """Text of exactly n_tokens on its own."""
    return builder.extend("", n_tokens, seed=seed)


def completion_text(builder: PromptBuilder, n_tokens: int, *, seed: int) -> str:
    """A completion's prompt that the server counts as n_tokens, what its tokenizer adds
    (a BOS token) included."""
    return text_of(builder, max(0, n_tokens - builder.completion_overhead_tokens), seed=seed)


def _words(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    words: list[str] = _VOCABULARY_ARRAY[rng.integers(0, len(VOCABULARY), size=n)].tolist()
    return words


def _join(prefix: str, text: str) -> str:
    if not prefix:
        return text
    if not text:
        return prefix
    return f"{prefix} {text}"


class WordPromptBuilder:
    """The simulator's tokenization: one token per whitespace-separated word."""

    message_overhead_tokens = 1  # a role marker per chat message
    completion_overhead_tokens = 0

    def count(self, text: str) -> int:
        return len(text.split())

    def chat_overhead_tokens(self, roles: Sequence[str]) -> int:
        return self.message_overhead_tokens * len(roles)

    def extend(self, prefix: str, n_tokens: int, *, seed: int) -> str:
        if n_tokens < 0:
            raise WorkloadError(f"token count {n_tokens} is not accepted; accepted: >= 0")
        return _join(prefix, " ".join(_words(n_tokens, seed)))


class RememberingWordPromptBuilder(WordPromptBuilder):
    """The word rule, remembering each new text it made (by length and seed) and its count.

    Many schedules of one workload (a rate search's runs: the same sessions at other
    rates and answer times) make the same texts over and over; the text is a function of
    its length and seed, so a remembered one is the one that would be made. Only texts
    made on their own (no prefix) are kept, not every prompt grown from them: a capacity
    plan's 162 runs of ``chat`` up to 40 conversations/s kept 14 000 texts, 22 MB."""

    def __init__(self) -> None:
        self._texts: dict[tuple[int, int], str] = {}
        self._counts: dict[str, int] = {}

    def count(self, text: str) -> int:
        known = self._counts.get(text)  # a kept text keeps its hash: one lookup
        return known if known is not None else len(text.split())

    def extend(self, prefix: str, n_tokens: int, *, seed: int) -> str:
        text = self._texts.get((n_tokens, seed))
        if text is None:
            text = super().extend("", n_tokens, seed=seed)
            self._texts[(n_tokens, seed)] = text
            self._counts[text] = n_tokens
        return _join(prefix, text)


class TokenizerPromptBuilder:
    """Exact token counts under a Hugging Face tokenizer (``tokenizer.json``), with the
    model's chat template where it has one."""

    def __init__(
        self,
        tokenizer: Any,  # a tokenizers.Tokenizer
        *,
        chat_template: ChatTemplate | None = None,
        completion_overhead_tokens: int | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self.chat_template = chat_template
        self.completion_overhead_tokens = (
            _post_processor_tokens(tokenizer)
            if completion_overhead_tokens is None
            else completion_overhead_tokens
        )
        self._costs: list[tuple[str, int]] | None = None
        self._overheads: dict[tuple[str, ...], int] = {}

    @classmethod
    def from_file(cls, path: Path) -> TokenizerPromptBuilder:
        """The tokenizer alone: no chat template, its post-processor's special tokens."""
        return cls(_load_tokenizer(path))

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> TokenizerPromptBuilder:
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise WorkloadError(
                f"model directory {str(model_dir)!r} has no tokenizer.json; accepted: a local "
                "Hugging Face model directory with tokenizer.json"
            )
        tokenizer = _load_tokenizer(path)
        config = read_json(model_dir / "tokenizer_config.json")
        return cls(
            tokenizer,
            chat_template=ChatTemplate.from_model_dir(model_dir),
            completion_overhead_tokens=_added_special_tokens(tokenizer, config),
        )

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def chat_tokens(self, messages: Sequence[Mapping[str, str]]) -> int:
        """Tokens of a chat request as vLLM's chat endpoint counts them: the rendered
        template, without added special tokens (the template writes its BOS); the
        contents alone where the model has no template."""
        if self.chat_template is None:
            return sum(self.count(m["content"]) for m in messages)
        text = self.chat_template.render(messages)
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def chat_overhead_tokens(self, roles: Sequence[str]) -> int:
        """The template's tokens around the contents, measured on probe conversations of
        these roles (the rendered count less the contents' own). Contents meet the
        template's text at token boundaries (special tokens, newlines), so the overhead
        does not depend on the words; where two probes disagree the larger is kept."""
        key = tuple(roles)
        known = self._overheads.get(key)
        if known is not None:
            return known
        overhead = 0
        if self.chat_template is not None and key:
            for probe in _PROBES:
                messages = [{"role": role, "content": probe} for role in key]
                measured = self.chat_tokens(messages) - len(key) * self.count(probe)
                overhead = max(overhead, measured)
        self._overheads[key] = overhead
        return overhead

    def extend(self, prefix: str, n_tokens: int, *, seed: int) -> str:
        if n_tokens < 0:
            raise WorkloadError(f"token count {n_tokens} is not accepted; accepted: >= 0")
        if n_tokens == 0:
            return prefix
        target = self.count(prefix) + n_tokens
        # Every word is at least one token, so n words reach the target. Find the most
        # words of the seeded stream that stay within it (the count grows with the
        # words: pre-tokenization splits at spaces), then fill the rest exactly.
        pool = _words(n_tokens + 1, seed)
        lo, hi = 0, len(pool)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.count(_join(prefix, " ".join(pool[:mid]))) <= target:
                lo = mid
            else:
                hi = mid - 1
        for k in range(lo, max(lo - 4, -1), -1):
            text = self._fill(_join(prefix, " ".join(pool[:k])), target)
            if text is not None:
                return text
        raise WorkloadError(
            f"cannot build text of exactly {n_tokens} tokens with this tokenizer "
            "(no word of the vocabulary fills the last tokens)"
        )

    def _fill(self, text: str, target: int) -> str | None:
        """Append filler words until the count is exactly target; None when stuck."""
        got = self.count(text)
        while got < target:
            need = target - got
            costs = self._filler_costs()
            exact = [w for w, c in costs if c == need]
            smaller = [w for w, c in sorted(costs, key=lambda wc: -wc[1]) if c < need]
            for word in (exact + smaller)[:16]:
                longer = _join(text, word)
                count = self.count(longer)
                if got < count <= target:
                    text, got = longer, count
                    break
            else:
                return None
        return text if got == target else None

    def _filler_costs(self) -> list[tuple[str, int]]:
        """Tokens each filler word adds after a space (estimated in a short context)."""
        if self._costs is None:
            base = self.count("the")
            self._costs = [(w, self.count(f"the {w}") - base) for w in FILLERS]
        return self._costs


# Probe contents for the chat template's overhead: words as the builder writes them,
# opening and closing on different words.
_PROBES = (" ".join(VOCABULARY[:6]), " ".join(VOCABULARY[-6:]))
# transformers' tokenizer classes that rebuild the post-processor from tokenizer_config's
# add_bos_token (default true) and add_eos_token (default false) when they load
_BOS_FROM_CONFIG = frozenset(
    f"{name}{fast}"
    for name in ("LlamaTokenizer", "CodeLlamaTokenizer", "GemmaTokenizer")
    for fast in ("", "Fast")
)


def _load_tokenizer(path: Path) -> Any:
    tokenizers = _import_tokenizers()
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises plain Exception subclasses
        raise WorkloadError(f"tokenizer {str(path)!r} cannot be read: {exc}") from exc


def _post_processor_tokens(tokenizer: Any) -> int:
    """Special tokens the tokenizer's post-processor adds to one sequence (Llama 3's BOS)."""
    probe = VOCABULARY[0]
    return len(tokenizer.encode(probe, add_special_tokens=True).ids) - len(
        tokenizer.encode(probe, add_special_tokens=False).ids
    )


def _added_special_tokens(tokenizer: Any, config: Mapping[str, Any]) -> int:
    """Tokens vLLM's completions endpoint adds to a prompt (``add_special_tokens=True``)
    through transformers: a Llama or Gemma tokenizer class follows tokenizer_config's
    add_bos_token / add_eos_token; any other, tokenizer.json's post-processor."""
    if config.get("tokenizer_class") in _BOS_FROM_CONFIG:
        bos = token_text(config.get("bos_token")) is not None
        eos = token_text(config.get("eos_token")) is not None
        return int(bos and bool(config.get("add_bos_token", True))) + int(
            eos and bool(config.get("add_eos_token", False))
        )
    return _post_processor_tokens(tokenizer)


def _import_tokenizers() -> Any:
    try:
        return importlib.import_module("tokenizers")
    except ImportError as exc:
        raise WorkloadError(
            "prompts for a model's tokenizer need the 'tokenizers' package, which is not "
            "installed; install it (pip install tokenizers) or use the word rule (no model dir)"
        ) from exc


def prompt_builder_for(model_dir: Path | None) -> PromptBuilder:
    """The builder for a model: its tokenizer.json and chat template when a directory is
    given, else words. One builder per directory and version of its files (a real
    tokenizer.json takes a second to load; the builder keeps what it measured)."""
    if model_dir is None:
        return _remembered_words()
    return _builder_of(str(model_dir.absolute()), _files_stamp(model_dir))


@functools.lru_cache(maxsize=1)
def _remembered_words() -> RememberingWordPromptBuilder:
    """The process's one word builder: a tune plans every level's schedule (twice: a
    provisional one, then the level's own) from the same sessions at other rates, so the
    texts of one plan are the next one's; made anew, a ``chat`` level's planning took 9.6 s
    on two busy cores, most of it drawing and splitting the same words again."""
    return RememberingWordPromptBuilder()


def chat_template_note(model_dir: Path) -> str | None:
    """One line where a model directory has no chat template (its chat requests are then
    counted by their contents alone); None where it has one."""
    if template_source(model_dir) is not None:
        return None
    return (
        f"{str(model_dir)!r} has no chat template (no chat_template in tokenizer_config.json, "
        "no chat_template.jinja or chat_template.json): vLLM answers every chat request 400 "
        f"({NO_TEMPLATE_ERROR!r}) unless the server is given one with --chat-template; chat "
        "prompts are counted by their contents alone"
    )


def _files_stamp(model_dir: Path) -> tuple[tuple[str, int, int], ...]:
    stamp = []
    for name in ("tokenizer.json", *TEMPLATE_FILES):
        try:
            st = (model_dir / name).stat()
        except OSError:
            continue
        stamp.append((name, st.st_mtime_ns, st.st_size))
    return tuple(stamp)


@functools.lru_cache(maxsize=8)
def _builder_of(model_dir: str, stamp: tuple[tuple[str, int, int], ...]) -> TokenizerPromptBuilder:
    del stamp  # part of the key only: a changed file is another builder
    return TokenizerPromptBuilder.from_model_dir(Path(model_dir))

"""The simulator's tokenizer: deterministic, and one token per word.

A prompt's tokens are its whitespace-separated words, each mapped to
``crc32(word) % vocab_size``; a chat message adds one token for its role marker.
So a workload that sends N words is charged N prompt tokens, and the same text
always gives the same ids (which the prefix cache depends on). An output token
id detokenizes to the word ``t<id>`` preceded by a space.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping


class _WordIds(dict[str, int]):
    """Each word's id in one vocabulary, computed once (a workload's prompts reuse a few
    thousand words millions of times)."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size

    def __missing__(self, word: str) -> int:
        token = zlib.crc32(word.encode()) % self.vocab_size
        if len(self) < _MAX_WORDS:
            self[word] = token
        return token


_MAX_WORDS = 1 << 20
_VOCABS: dict[int, _WordIds] = {}


def encode(text: str, vocab_size: int) -> list[int]:
    """Token ids of a text: one per whitespace-separated word."""
    ids = _VOCABS.get(vocab_size)
    if ids is None:
        ids = _VOCABS.setdefault(vocab_size, _WordIds(vocab_size))
    return list(map(ids.__getitem__, text.split()))


def role_token(role: str, vocab_size: int) -> int:
    return zlib.crc32(f"<|{role}|>".encode()) % vocab_size


def message_text(content: object) -> str:
    """A chat message's text: a string, or the text parts of a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type", "text") == "text"
        ]
        return " ".join(texts)
    raise ValueError(f"message content must be a string or a list of parts, not {content!r}")


def encode_chat(messages: Iterable[Mapping[str, object]], vocab_size: int) -> list[int]:
    """Token ids of a conversation: per message, its role marker, then its content's words."""
    ids: list[int] = []
    for message in messages:
        ids.append(role_token(str(message.get("role", "user")), vocab_size))
        ids.extend(encode(message_text(message.get("content")), vocab_size))
    return ids


class ChatEncoder:
    """``encode_chat`` over many conversations, each message's ids computed once.

    A conversation's later turns resend its whole history, so a schedule of multi-turn
    chats encodes the same messages over and over (ten minutes of ``chat`` at its steady
    state: 17.6 million prompt tokens, 5.9 million of them in distinct messages).
    Messages are remembered by role and text; a string keeps its hash once computed, so
    a history message costs a lookup and a copy of its ids."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._messages: dict[tuple[str, str], list[int]] = {}

    def encode_chat(self, messages: Iterable[Mapping[str, object]]) -> list[int]:
        """``encode_chat(messages, vocab_size)``."""
        ids: list[int] = []
        for message in messages:
            key = (str(message.get("role", "user")), message_text(message.get("content")))
            part = self._messages.get(key)
            if part is None:
                part = [role_token(key[0], self.vocab_size), *encode(key[1], self.vocab_size)]
                self._messages[key] = part
            ids += part
        return ids


def decode_token(token_id: int) -> str:
    """The text of one output token."""
    return f" t{token_id}"

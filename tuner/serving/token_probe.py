"""Greedy answers and the log-probs of given tokens, asked of a live server through vLLM's
OpenAI API: what the quality gate (``tuner.search.quality_gate``) compares.

Two requests per prompt, one at a time (a batch of one: what is compared is the setting,
not how requests happened to be batched together):

- ``greedy``: the prompt through the workload's own API (``/v1/completions`` or
  ``/v1/chat/completions``) at temperature 0, with ``return_token_ids`` (a vLLM extra):
  the prompt's token ids as the server tokenized them (the chat template applied) and
  the answer's;
- ``score``: the prompt's token ids followed by the tokens to score, as one prompt to
  ``/v1/completions`` with ``prompt_logprobs: 1`` (a vLLM extra sampling parameter) and
  ``max_tokens: 1``: the server's log-prob of each given token and its own greedy token
  at each position, with the same text before it. vLLM does not read the prefix cache for
  a request that asks for prompt log-probs, so every position is computed by this
  request; its attention reads keys and values back from the KV cache in the cache's
  dtype (vLLM's v1 attention backends, the CPU build's included), as decoding does.

A server that answers an error status, or without the token ids or log-probs asked for
(the simulated engine has neither), raises ``QualityProbeError`` with what it answered.
"""

from __future__ import annotations

import json
import logging
import math
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from tuner.errors import QualityProbeError

log = logging.getLogger(__name__)

API_KEY_ENV = "VLLM_API_KEY"
REQUEST_TIMEOUT_S = 300.0  # one request at a time; a long prompt on a slow server is minutes
# vLLM writes a log-prob that underflowed as this (its OpenAI server's floor)
LOGPROB_FLOOR = -9999.0
COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class ProbePrompt:
    """One prompt of the gate: a completions prompt or chat messages, and its answer's cap."""

    prompt_id: str
    max_tokens: int
    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content) in order

    def body(self, model: str) -> tuple[str, dict[str, Any]]:
        """(path, JSON body) of the greedy request."""
        common: dict[str, Any] = {
            "model": model,
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
            "n": 1,
            "stream": False,
            "return_token_ids": True,
        }
        if self.messages is not None:
            messages = [{"role": role, "content": content} for role, content in self.messages]
            return CHAT_PATH, {**common, "messages": messages}
        return COMPLETIONS_PATH, {**common, "prompt": self.prompt or ""}


class GreedyAnswer(BaseModel):
    """A prompt's answer at temperature 0: its token ids as the server tokenized them."""

    model_config = ConfigDict(frozen=True)

    prompt_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    finish_reason: str | None = None


class TokenScores(BaseModel):
    """Given tokens scored after a prompt: each one's log-prob and the server's own greedy
    (top-1) token at its position."""

    model_config = ConfigDict(frozen=True)

    prompt_id: str
    token_ids: list[int]
    logprobs: list[float]
    top_token_ids: list[int]


class ServerAnswers(BaseModel):
    """One server's greedy answers to the gate's prompts and its scores of the reference's
    answers (its own, on the reference server), in the prompts' order: one line each of
    ``quality/<role>/answers.jsonl``."""

    model_config = ConfigDict(frozen=True)

    answers: list[GreedyAnswer]
    scores: list[TokenScores]

    def jsonl(self) -> str:
        lines = [
            json.dumps({"answer": a.model_dump(mode="json"), "scores": s.model_dump(mode="json")})
            for a, s in zip(self.answers, self.scores, strict=True)
        ]
        return "".join(line + "\n" for line in lines)


class TokenProbe:
    """Greedy answers and scores from the server at ``base_url`` serving ``model``."""

    def __init__(self, base_url: str, model: str, *, timeout_s: float = REQUEST_TIMEOUT_S):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s

    def greedy(self, prompt: ProbePrompt) -> GreedyAnswer:
        path, body = prompt.body(self.model)
        return greedy_answer_of(self._post(path, body), prompt.prompt_id)

    def score(
        self, prompt_id: str, prompt_token_ids: list[int], token_ids: list[int]
    ) -> TokenScores:
        """``token_ids`` scored after ``prompt_token_ids`` (none: nothing to score)."""
        if not token_ids:
            return TokenScores(prompt_id=prompt_id, token_ids=[], logprobs=[], top_token_ids=[])
        body = {
            "model": self.model,
            "prompt": [*prompt_token_ids, *token_ids],
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 1,
        }
        return token_scores_of(
            self._post(COMPLETIONS_PATH, body), prompt_id, len(prompt_token_ids), token_ids
        )

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.base_url + path
        request = urllib.request.Request(
            url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        key = os.environ.get(API_KEY_ENV)
        if key:
            request.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                text = response.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            said = exc.read().decode("utf-8", errors="replace")
            raise QualityProbeError(f"POST {url} answered {exc.code}: {_one_line(said)}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise QualityProbeError(f"POST {url} failed: {reason}") from exc
        try:
            parsed = json.loads(text)
        except ValueError as exc:
            raise QualityProbeError(f"POST {url} answered no JSON: {_one_line(text)}") from exc
        if not isinstance(parsed, dict):
            raise QualityProbeError(f"POST {url} answered {_one_line(text)}")
        return parsed


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _choice(body: dict[str, Any]) -> dict[str, Any]:
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise QualityProbeError(f"the answer has no choices: {_one_line(json.dumps(body))}")
    return choices[0]


def _ids(value: object) -> list[int] | None:
    if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
        return None
    return list(value)


def greedy_answer_of(body: dict[str, Any], prompt_id: str) -> GreedyAnswer:
    """A greedy request's answer: the prompt's token ids (the choice's in completions, the
    response's in chat completions) and the answer's."""
    choice = _choice(body)
    prompt_ids = _ids(choice.get("prompt_token_ids"))
    if prompt_ids is None:
        prompt_ids = _ids(body.get("prompt_token_ids"))
    token_ids = _ids(choice.get("token_ids"))
    if prompt_ids is None or token_ids is None:
        raise QualityProbeError(
            "the server answered without token ids (vLLM's return_token_ids): "
            + _one_line(json.dumps(body))
        )
    reason = choice.get("finish_reason")
    return GreedyAnswer(
        prompt_id=prompt_id,
        prompt_token_ids=prompt_ids,
        token_ids=token_ids,
        finish_reason=reason if isinstance(reason, str) else None,
    )


def token_scores_of(
    body: dict[str, Any], prompt_id: str, prompt_len: int, token_ids: list[int]
) -> TokenScores:
    """The log-probs of ``token_ids`` (the prompt's positions from ``prompt_len`` on) and
    the top-1 token at each, from a ``prompt_logprobs`` answer: one entry per prompt token
    (the first None), each mapping token ids (as text) to ``{"logprob", "rank"}``."""
    entries = _choice(body).get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != prompt_len + len(token_ids):
        got = len(entries) if isinstance(entries, list) else entries
        raise QualityProbeError(
            f"the server's prompt_logprobs do not cover the {prompt_len + len(token_ids)} "
            f"tokens scored (got {got})"
        )
    logprobs: list[float] = []
    top: list[int] = []
    for offset, token in enumerate(token_ids):
        entry = entries[prompt_len + offset]
        if not isinstance(entry, dict) or str(token) not in entry:
            raise QualityProbeError(
                f"prompt_logprobs at position {prompt_len + offset} lack token {token}: "
                + _one_line(json.dumps(entry))
            )
        logprobs.append(_logprob(entry[str(token)]))
        top.append(_top_token(entry, token))
    return TokenScores(
        prompt_id=prompt_id, token_ids=token_ids, logprobs=logprobs, top_token_ids=top
    )


def _logprob(item: object) -> float:
    value = item.get("logprob") if isinstance(item, dict) else None
    if not isinstance(value, int | float):
        raise QualityProbeError(f"a prompt log-prob without a number: {item!r}")
    return float(value) if math.isfinite(value) else LOGPROB_FLOOR


def _top_token(entry: dict[str, Any], token: int) -> int:
    """The token vLLM ranks first at a position (``rank`` 1); the scored token itself where
    it holds the first rank or no entry says (ties: the lowest id, as argmax returns)."""
    ranked = [
        int(key)
        for key, item in entry.items()
        if isinstance(item, dict) and item.get("rank") == 1 and key.lstrip("-").isdigit()
    ]
    if token in ranked or not ranked:
        return token
    return min(ranked)

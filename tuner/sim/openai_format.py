"""OpenAI request parsing and response shapes, as vLLM's OpenAI server writes them.

``parse_generation`` validates a ``/v1/completions`` or ``/v1/chat/completions``
body with vLLM's rules and messages (prompt length against ``max_model_len``,
``max_tokens`` default and limits, logprobs limits) and raises ``ApiError`` with
the HTTP status vLLM answers. The other functions build the JSON objects of a
full response, of each streamed chunk and of the final usage chunk.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tuner.sim.engine import FinishReason
from tuner.sim.tokenizer import decode_token, encode, encode_chat

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest default (OpenAI's legacy one)

JsonObject = dict[str, Any]
EMPTY_PROMPT_MESSAGE = "The decoder prompt cannot be empty"


def context_length_message(max_model_len: int, prompt_tokens: int) -> str:
    """vLLM's 400 for a prompt that leaves no room for an output token (prompt >= max_model_len)."""
    return (
        f"This model's maximum context length is {max_model_len} tokens. However, your "
        f"request has {prompt_tokens} input tokens. Please reduce the length of the input messages."
    )


class Endpoint(StrEnum):
    COMPLETIONS = "completions"
    CHAT = "chat"


class ApiError(Exception):
    """A request vLLM would answer with an error status."""

    def __init__(self, status: int, message: str, error_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type

    def body(self) -> JsonObject:
        return error_body(self.status, self.message, self.error_type)


def error_body(status: int, message: str, error_type: str) -> JsonObject:
    return {"error": {"message": message, "type": error_type, "param": None, "code": status}}


@dataclass(frozen=True)
class GenerationRequest:
    """A validated generation request."""

    endpoint: Endpoint
    request_id: str
    created: int
    model: str
    prompt_token_ids: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool
    logprobs: int | None  # top alternatives per token; None: no logprobs
    # Tokens batched into each streamed chunk (vLLM's per-request ``stream_interval``):
    # the first token alone, then every this many, the last at once.
    stream_interval: int = 1

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


# --- parsing ----------------------------------------------------------------------------


def _int(body: Mapping[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{name} must be an integer, got {value!r}.")
    if value < minimum:
        raise ApiError(400, f"{name} must be at least {minimum}, got {value}.")
    return value


def _bool(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be a boolean, got {value!r}.")
    return value


def _prompt_ids(prompt: object, vocab_size: int) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return encode(prompt, vocab_size)
    if isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        for token in prompt:
            if not 0 <= token < vocab_size:
                raise ApiError(400, f"Token id {token} is out of vocabulary")
        return list(prompt)
    raise ApiError(400, "prompt must be a string, a list of token ids, or a list of one of those.")


def _chat_ids(messages: object, vocab_size: int) -> list[int]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list of messages.")
    if not all(isinstance(m, Mapping) for m in messages):
        raise ApiError(400, "each message must be an object with a role and content.")
    try:
        return encode_chat(messages, vocab_size)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from exc


def parse_generation(
    endpoint: Endpoint,
    body: Mapping[str, Any],
    *,
    served_model_names: Sequence[str],
    max_model_len: int,
    vocab_size: int,
    request_stream_interval: bool = True,
) -> GenerationRequest:
    """Validate a generation request the way vLLM's OpenAI server does;
    ``request_stream_interval``: the emulated release reads a request's own
    ``stream_interval`` (``tuner.vllm.versions.REQUEST_STREAM_INTERVAL``; an older one
    ignores the field, as vLLM ignores fields it does not know)."""
    model = body.get("model")
    if model is not None and model not in served_model_names:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
    n = _int(body, "n", 1)
    if n not in (None, 1):
        raise ApiError(400, "n > 1 is not supported by the simulated engine.")
    if endpoint is Endpoint.COMPLETIONS:
        if "prompt" not in body:
            raise ApiError(400, "Field required: prompt")
        ids = _prompt_ids(body["prompt"], vocab_size)
        max_tokens = _int(body, "max_tokens", 1)
        if max_tokens is None and "max_tokens" not in body:
            max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
        logprobs = _int(body, "logprobs", 0)
        prefix = "cmpl"
    else:
        ids = _chat_ids(body.get("messages"), vocab_size)
        max_tokens = _int(body, "max_completion_tokens", 1) or _int(body, "max_tokens", 1)
        top = _int(body, "top_logprobs", 0)
        logprobs = (top or 0) if _bool(body, "logprobs") else None
        if top is not None and logprobs is None:
            raise ApiError(400, "when using `top_logprobs`, `logprobs` must be set to true.")
        prefix = "chatcmpl"
    if logprobs is not None and logprobs > MAX_LOGPROBS:
        raise ApiError(
            400,
            f"Requested sample logprobs of {logprobs}, which is greater than max allowed: "
            f"{MAX_LOGPROBS}",
        )
    if not ids:
        raise ApiError(400, EMPTY_PROMPT_MESSAGE)
    n_prompt = len(ids)
    if n_prompt >= max_model_len:
        raise ApiError(400, context_length_message(max_model_len, n_prompt))
    if max_tokens is None:
        max_tokens = max_model_len - n_prompt
    elif n_prompt + max_tokens > max_model_len:
        raise ApiError(
            400,
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
            f"maximum context length is {max_model_len} tokens and your request has {n_prompt} "
            f"input tokens ({max_tokens} > {max_model_len} - {n_prompt}).",
        )
    stream = _bool(body, "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, Mapping):
        raise ApiError(400, "stream_options must be an object.")
    if options and not stream:
        raise ApiError(400, "Stream options can only be defined when `stream=True`.")
    interval = (_int(body, "stream_interval", 1) if request_stream_interval else None) or 1
    min_tokens = _int(body, "min_tokens", 0) or 0
    if min_tokens > max_tokens:
        raise ApiError(
            400,
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.",
        )
    return GenerationRequest(
        endpoint=endpoint,
        request_id=f"{prefix}-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=served_model_names[0],
        prompt_token_ids=ids,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=_bool(body, "ignore_eos"),
        stream=stream,
        include_usage=bool(options.get("include_usage", False)),
        continuous_usage=bool(options.get("continuous_usage_stats", False)),
        logprobs=logprobs,
        stream_interval=interval,
    )


# --- responses --------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int) -> JsonObject:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def _logprob(token_id: int, rank: int) -> float:
    """A deterministic log-probability for a token at a rank (0: the sampled one)."""
    return -round(0.05 + (token_id % 97) / 100 + rank * 0.75, 4)


def _alternatives(token_id: int, count: int) -> list[tuple[str, float]]:
    out = [(decode_token(token_id), _logprob(token_id, 0))]
    for rank in range(1, count):
        other = (token_id + rank * 7919) % 1_000_003
        out.append((decode_token(other), _logprob(other, rank)))
    return out[:count] if count else []


def _chat_logprob_entry(token_id: int, top: int) -> JsonObject:
    text = decode_token(token_id)
    return {
        "token": text,
        "logprob": _logprob(token_id, 0),
        "bytes": list(text.encode()),
        "top_logprobs": [
            {"token": t, "logprob": lp, "bytes": list(t.encode())}
            for t, lp in _alternatives(token_id, top)
        ],
    }


def _completion_logprobs(token_ids: Sequence[int], top: int, offset: int) -> JsonObject:
    texts = [decode_token(t) for t in token_ids]
    offsets: list[int] = []
    for text in texts:
        offsets.append(offset)
        offset += len(text)
    return {
        "text_offset": offsets,
        "token_logprobs": [_logprob(t, 0) for t in token_ids],
        "tokens": texts,
        "top_logprobs": [dict(_alternatives(t, max(top, 1))) for t in token_ids],
    }


def _logprobs(req: GenerationRequest, token_ids: Sequence[int], offset: int) -> JsonObject | None:
    if req.logprobs is None:
        return None
    if req.endpoint is Endpoint.COMPLETIONS:
        return _completion_logprobs(token_ids, req.logprobs, offset)
    return {"content": [_chat_logprob_entry(t, req.logprobs) for t in token_ids]}


def full_response(
    req: GenerationRequest, token_ids: Sequence[int], finish_reason: FinishReason | None
) -> JsonObject:
    """The non-streaming response body."""
    text = "".join(decode_token(t) for t in token_ids)
    reason = finish_reason.value if finish_reason else None
    logprobs = _logprobs(req, token_ids, 0)
    if req.endpoint is Endpoint.COMPLETIONS:
        choice: JsonObject = {
            "index": 0,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": reason,
            "stop_reason": None,
            "prompt_logprobs": None,
        }
        obj = "text_completion"
    else:
        choice = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "tool_calls": [],
                "reasoning_content": None,
            },
            "logprobs": logprobs,
            "finish_reason": reason,
            "stop_reason": None,
        }
        obj = "chat.completion"
    return {
        "id": req.request_id,
        "object": obj,
        "created": req.created,
        "model": req.model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(req.num_prompt_tokens, len(token_ids)),
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }


def _chunk(req: GenerationRequest, choices: list[JsonObject]) -> JsonObject:
    obj = "text_completion" if req.endpoint is Endpoint.COMPLETIONS else "chat.completion.chunk"
    return {
        "id": req.request_id,
        "object": obj,
        "created": req.created,
        "model": req.model,
        "choices": choices,
    }


def role_chunk(req: GenerationRequest) -> JsonObject:
    """The first chunk of a chat stream: the assistant role, no content yet."""
    choice = {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    return _chunk(req, [choice])


def token_chunk(
    req: GenerationRequest,
    token_id: int,
    finish_reason: FinishReason | None,
    *,
    text_offset: int,
    completion_tokens: int,
) -> JsonObject:
    """One streamed token (its finish reason set on the last)."""
    logprobs = _logprobs(req, [token_id], text_offset)
    return _text_chunk(req, decode_token(token_id), finish_reason, logprobs, completion_tokens)


def _text_chunk(
    req: GenerationRequest,
    text: str,
    finish_reason: FinishReason | None,
    logprobs: JsonObject | None,
    completion_tokens: int,
) -> JsonObject:
    reason = finish_reason.value if finish_reason else None
    if req.endpoint is Endpoint.COMPLETIONS:
        choice: JsonObject = {
            "index": 0,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": reason,
            "stop_reason": None,
        }
    else:
        choice = {
            "index": 0,
            "delta": {"content": text},
            "logprobs": logprobs,
            "finish_reason": reason,
        }
        if reason is not None:
            choice["stop_reason"] = None
    chunk = _chunk(req, [choice])
    if req.include_usage and req.continuous_usage:
        chunk["usage"] = usage(req.num_prompt_tokens, completion_tokens)
    return chunk


def usage_chunk(req: GenerationRequest, completion_tokens: int) -> JsonObject:
    """The last chunk when ``stream_options.include_usage`` is true: no choices, the usage."""
    chunk = _chunk(req, [])
    chunk["usage"] = usage(req.num_prompt_tokens, completion_tokens)
    return chunk


# --- server-sent events -----------------------------------------------------------------

DONE_EVENT = b"data: [DONE]\n\n"
_TEXT_MARKER = "\x00"  # JSON renders it as "\u0000", which no other part of a chunk contains


def sse_event(obj: JsonObject) -> bytes:
    """One server-sent event: ``data: <compact JSON>`` and a blank line."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class StreamEvents:
    """The server-sent events of one streamed response, as bytes.

    Most events of a stream are plain tokens (not the last, no logprobs, no per-token
    usage); those are rendered from a template made once per request, byte for byte
    what ``sse_event(token_chunk(...))`` gives, at a fraction of the cost (a server
    that streams thousands of tokens a second spends its core on this).
    """

    def __init__(self, req: GenerationRequest) -> None:
        self.req = req
        self.completion_tokens = 0
        self._text_offset = 0
        self._plain: tuple[bytes, bytes] | None = None
        self._pending: list[int] = []  # tokens made but not yet streamed (push)
        if req.logprobs is None and not (req.include_usage and req.continuous_usage):
            marker = json.dumps(_TEXT_MARKER).encode()
            template = sse_event(_text_chunk(req, _TEXT_MARKER, None, None, 0))
            head, tail = template.split(marker)
            self._plain = (head, tail)

    def role(self) -> bytes:
        return sse_event(role_chunk(self.req))

    def push(self, token_id: int, finish_reason: FinishReason | None) -> list[int] | None:
        """The next token as the request's ``stream_interval`` streams it (vLLM's output
        processor: a chunk goes out on the first token, once ``stream_interval`` tokens
        wait, and on the last): the tokens of the chunk due now, or None while it waits."""
        self._pending.append(token_id)
        due = (
            finish_reason is not None
            or self.completion_tokens == 0
            or len(self._pending) >= self.req.stream_interval
        )
        if not due:
            return None
        chunk, self._pending = self._pending, []
        return chunk

    def chunk(self, token_ids: list[int], finish_reason: FinishReason | None) -> bytes:
        """The event of a chunk of tokens (``push``; one token where streamed one by one);
        counts them."""
        self.completion_tokens += len(token_ids)
        text = "".join(decode_token(t) for t in token_ids)
        offset = self._text_offset
        self._text_offset += len(text)
        if self._plain is not None and finish_reason is None:
            head, tail = self._plain
            return head + json.dumps(text).encode() + tail
        return sse_event(
            _text_chunk(
                self.req,
                text,
                finish_reason,
                _logprobs(self.req, token_ids, offset),
                self.completion_tokens,
            )
        )

    def usage(self) -> bytes:
        return sse_event(usage_chunk(self.req, self.completion_tokens))

"""The simulator's streaming path without sockets: event bytes, direct writes, read stamps."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tuner.sim.api import ReadStampingProtocol, _DirectWriter
from tuner.sim.driver import RequestStream, Token
from tuner.sim.engine import FinishReason, SimRequest
from tuner.sim.openai_format import (
    ApiError,
    Endpoint,
    StreamEvents,
    parse_generation,
    sse_event,
    token_chunk,
    usage_chunk,
)
from tuner.sim.tokenizer import decode_token

TOKENS = [5, 1234, 99_999, 7, 42]


def generation(endpoint: Endpoint, **extra: Any) -> Any:
    body: dict[str, Any] = {"model": "m", "max_tokens": len(TOKENS), "stream": True, **extra}
    if endpoint is Endpoint.COMPLETIONS:
        body.setdefault("prompt", "a b c")
    else:
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return parse_generation(
        endpoint, body, served_model_names=["m"], max_model_len=100, vocab_size=150_000
    )


OPTIONS = [
    {},
    {"stream_options": {"include_usage": True}},
    {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
]


@pytest.mark.parametrize("endpoint", list(Endpoint))
@pytest.mark.parametrize("options", [*OPTIONS, "logprobs"])
def test_events_are_the_chunks_byte_for_byte(endpoint: Endpoint, options: Any) -> None:
    if options == "logprobs":
        chat = endpoint is Endpoint.CHAT
        options = {"logprobs": True, "top_logprobs": 2} if chat else {"logprobs": 2}
    gen = generation(endpoint, **options)
    events = StreamEvents(gen)
    offset = 0
    for i, token_id in enumerate(TOKENS):
        reason = FinishReason.LENGTH if i == len(TOKENS) - 1 else None
        expected = sse_event(
            token_chunk(gen, token_id, reason, text_offset=offset, completion_tokens=i + 1)
        )
        offset += len(decode_token(token_id))
        assert events.chunk([token_id], reason) == expected
    assert events.usage() == sse_event(usage_chunk(gen, len(TOKENS)))


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.buffered = 0
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def is_closing(self) -> bool:
        return self.closing


class FakeDriver:
    def __init__(self) -> None:
        self.now = 10.0

    def wall_s(self) -> float:
        self.now += 0.001
        return self.now


def direct_writer() -> tuple[_DirectWriter, FakeTransport, RequestStream]:
    async def make() -> RequestStream:  # the stream's queue wants a running loop
        request = SimRequest(request_id="r", prompt_token_ids=[1], max_tokens=9, arrival_s=0.0)
        return RequestStream(request=request, arrival_s=0.0, received_s=0.0)

    stream = asyncio.run(make())
    transport = FakeTransport()
    gen = generation(Endpoint.COMPLETIONS)
    writer = _DirectWriter(transport, stream, StreamEvents(gen), FakeDriver())  # type: ignore[arg-type]
    stream.deliver = writer.deliver
    return writer, transport, stream


def test_direct_writes_are_http_chunks_stamped_when_written() -> None:
    writer, transport, stream = direct_writer()
    assert writer.deliver(Token(5, None))
    (frame,) = transport.written
    size, _, rest = frame.partition(b"\r\n")
    assert int(size, 16) == len(rest) - 2 and rest.endswith(b"\n\n\r\n")
    assert rest.startswith(b'data: {"id":"cmpl-')
    assert stream.written_s == [pytest.approx(10.001)]
    assert stream.deliver is not None


@pytest.mark.parametrize("case", ["last token", "back-pressure", "closing"])
def test_direct_writes_hand_over_to_the_queue(case: str) -> None:
    writer, transport, stream = direct_writer()
    token = Token(5, FinishReason.LENGTH if case == "last token" else None)
    transport.buffered = 1 if case == "back-pressure" else 0
    transport.closing = case == "closing"
    assert not writer.deliver(token)  # the driver queues it for the handler
    assert transport.written == [] and stream.written_s == []
    assert stream.deliver is None  # and every later token, so they stay in order


class Inner(asyncio.Protocol):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.calls.append("made")

    def data_received(self, data: bytes) -> None:
        self.calls.append(data.decode())

    def connection_lost(self, exc: Exception | None) -> None:
        self.calls.append("lost")


def test_read_stamping_protocol_stamps_each_read_and_forgets_the_connection() -> None:
    inner, stamps, clock = Inner(), dict[object, float](), iter([1.0, 2.0])
    protocol = ReadStampingProtocol(inner, lambda: next(clock), stamps)
    protocol.connection_made(FakeTransport())
    protocol.data_received(b"GET")
    assert stamps == {inner: 1.0}
    protocol.data_received(b" /")
    assert stamps == {inner: 2.0}
    protocol.connection_lost(None)
    assert stamps == {} and inner.calls == ["made", "GET", " /", "lost"]


def _text(event: bytes, endpoint: Endpoint) -> str:
    chunk = json.loads(event.removeprefix(b"data: ").strip())
    choice = chunk["choices"][0]
    return str(choice["text"] if endpoint is Endpoint.COMPLETIONS else choice["delta"]["content"])


@pytest.mark.parametrize("endpoint", list(Endpoint))
@pytest.mark.parametrize("interval", [1, 2, 3, 16])
def test_a_stream_interval_sends_the_first_token_alone_then_chunks_and_the_last_at_once(
    endpoint: Endpoint, interval: int
) -> None:
    gen = generation(endpoint, stream_interval=interval)
    assert gen.stream_interval == interval
    events = StreamEvents(gen)
    chunks: list[list[int]] = []
    texts: list[str] = []
    for i, token_id in enumerate(TOKENS):
        reason = FinishReason.LENGTH if i == len(TOKENS) - 1 else None
        if (chunk := events.push(token_id, reason)) is not None:
            chunks.append(chunk)
            texts.append(_text(events.chunk(chunk, reason), endpoint))
    # vLLM's output processor: the first token, every `interval` waiting, the last
    expected = [TOKENS[:1]] + [TOKENS[i : i + interval] for i in range(1, len(TOKENS), interval)]
    assert chunks == expected
    assert texts == ["".join(decode_token(t) for t in c) for c in expected]
    assert json.loads(events.usage().removeprefix(b"data: "))["usage"]["completion_tokens"] == 5


def test_a_release_before_the_request_field_streams_every_token() -> None:
    body = {"model": "m", "prompt": "a", "max_tokens": 5, "stream": True, "stream_interval": 4}
    kept = parse_generation(
        Endpoint.COMPLETIONS, body, served_model_names=["m"], max_model_len=100,
        vocab_size=150_000, request_stream_interval=False,
    )  # fmt: skip
    assert kept.stream_interval == 1
    with pytest.raises(ApiError, match="stream_interval must be at least 1"):
        generation(Endpoint.COMPLETIONS, stream_interval=0)


def test_direct_writes_wait_for_the_rest_of_a_chunk() -> None:
    async def make() -> RequestStream:
        request = SimRequest(request_id="r", prompt_token_ids=[1], max_tokens=9, arrival_s=0.0)
        return RequestStream(request=request, arrival_s=0.0, received_s=0.0)

    stream = asyncio.run(make())
    transport = FakeTransport()
    events = StreamEvents(generation(Endpoint.COMPLETIONS, stream_interval=3))
    writer = _DirectWriter(transport, stream, events, FakeDriver())  # type: ignore[arg-type]
    assert all(writer.deliver(Token(t, None)) for t in (5, 6, 7))
    assert len(transport.written) == 1  # the first token; 6 and 7 wait for a third
    assert writer.deliver(Token(8, None))
    assert len(transport.written) == 2 and len(stream.written_s) == 4  # one stamp per token

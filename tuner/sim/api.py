"""The simulated engine's HTTP server: vLLM's OpenAI endpoints, ``/health``, ``/metrics``.

One ``SimServer`` wraps one SimEngine. Its aiohttp application answers what
``vllm serve`` answers (``/health``, ``/tokenize``, ``/version``, ``/v1/models``,
``/v1/completions``, ``/v1/chat/completions``, ``/metrics``) plus ``/sim/gpu``,
what NVML would report for the virtual device. The engine runs on the wall clock
(``driver.EngineDriver``); every response carries ``x-sim-time-scale`` so a client
can convert what it measured to the virtual GPU's seconds, and ``POST /sim/time-scale``
slows (or speeds) that clock while the server runs, for a load generator that could
not keep up with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.typedefs import Handler, Middleware
from aiohttp.web_request import BaseRequest
from pydantic import BaseModel, ConfigDict

from tuner.sim.cache_info import cache_config_labels, register_cache_config_info
from tuner.sim.driver import EngineDriver, EngineFailure, RequestStream, Token
from tuner.sim.engine import EngineDead, SimEngine, SimRequest
from tuner.sim.openai_format import (
    DONE_EVENT,
    ApiError,
    Endpoint,
    GenerationRequest,
    JsonObject,
    StreamEvents,
    error_body,
    full_response,
    parse_generation,
    sse_event,
)
from tuner.sim.prometheus import CONTENT_TYPE as METRICS_CONTENT_TYPE
from tuner.sim.prometheus import ServerMetrics
from tuner.sim.serve_log import (
    ENGINE_DEAD_TEXT,
    IntervalStats,
    VllmLog,
    log_access,
    log_engine_dead,
    log_stats,
)
from tuner.sim.tokenizer import encode, encode_chat
from tuner.vllm.gpus import GpuSpec, MiB
from tuner.vllm.memory import MemoryPlan

log = logging.getLogger(__name__)

TIME_SCALE_HEADER = "x-sim-time-scale"
CUDA_CONTEXT_BYTES = 512 * MiB  # the CUDA context NVML counts for the process
IDLE_POWER_WATTS = 70.0
STATS_INTERVAL_S = 10.0  # vLLM's VLLM_LOG_STATS_INTERVAL

ROUTES: tuple[tuple[str, str], ...] = (
    ("/health", "GET"),
    ("/tokenize", "POST"),
    ("/version", "GET"),
    ("/v1/models", "GET"),
    ("/v1/completions", "POST"),
    ("/v1/chat/completions", "POST"),
    ("/metrics", "GET"),
    ("/sim/gpu", "GET"),
    ("/sim/lag", "GET"),
    ("/sim/requests", "GET"),
    ("/sim/stall", "POST"),
    ("/sim/time-scale", "POST"),
)
MAX_TIME_SCALE = 1000.0


@dataclass(frozen=True)
class ServeSettings:
    """What the HTTP layer needs beyond the engine."""

    model: str  # as given on the command line (the model's "root")
    served_model_names: tuple[str, ...]  # the first one names the model in responses
    max_model_len: int
    vocab_size: int
    time_scale: float
    enable_prefix_caching: bool
    stats_interval_s: float = STATS_INTERVAL_S
    # vLLM's --api-key / VLLM_API_KEY: one of them is required on every /v1 path.
    api_keys: tuple[str, ...] = ()
    kv_cache_memory_bytes: int | None = None  # --kv-cache-memory-bytes, as given
    # The emulated release reads a request's own ``stream_interval``
    # (``tuner.vllm.versions.REQUEST_STREAM_INTERVAL``).
    request_stream_interval: bool = True


class GpuReport(BaseModel):
    """What NVML would report for the virtual device and the server's process."""

    model_config = ConfigDict(frozen=True)

    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    utilization_percent: float
    power_watts: float
    process_pid: int
    process_used_bytes: int
    kv_cache_usage: float
    time_scale: float
    # How far the virtual GPU's clock has fallen behind the wall clock: above a few
    # milliseconds this machine cannot stream the scenario; raise --time-scale.
    clock_lag_s: float


def process_used_bytes(plan: MemoryPlan) -> int:
    """Device memory the server holds once running: vLLM's components plus the CUDA context."""
    return (
        plan.weights_bytes
        + plan.activation_bytes
        + plan.non_torch_bytes
        + plan.kv_cache_bytes
        + plan.cudagraph_bytes
        + CUDA_CONTEXT_BYTES
    )


def power_watts(gpu: GpuSpec, utilization: float) -> float:
    idle = min(IDLE_POWER_WATTS, 0.25 * gpu.tdp_watts)
    return round(idle + (gpu.tdp_watts - idle) * utilization, 1)


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.json_response(obj, status=status, dumps=_compact)


async def _json_object(request: web.Request) -> dict[str, Any]:
    """The request's body, a JSON object; ApiError 400 (vLLM's message) for anything else."""
    try:
        body = await request.json()
    except ValueError as exc:
        raise ApiError(400, f"Invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    return body


def _engine_dead_response() -> web.Response:
    return _json(error_body(500, ENGINE_DEAD_TEXT, "InternalServerError"), status=500)


def access_logger_class(vllm_log: VllmLog) -> type[AbstractAccessLogger]:
    """uvicorn's access lines, written through the server's vLLM-format log."""

    class UvicornAccessLogger(AbstractAccessLogger):
        def log(self, request: BaseRequest, response: web.StreamResponse, time: float) -> None:
            peer = request.transport.get_extra_info("peername") if request.transport else None
            where = f"{peer[0]}:{peer[1]}" if peer else "-"
            log_access(
                vllm_log, where, request.method, request.path_qs, response.status, response.reason
            )

    return UvicornAccessLogger


class ReadStampingProtocol(asyncio.Protocol):
    """aiohttp's protocol for one connection, noting when the server last read bytes from it.

    A request's ground-truth arrival is when the server read it off the socket. aiohttp
    starts the handler two event-loop iterations later (the connection's task wakes,
    then the handler's task starts), and on a busy single-core server each iteration
    can hold a few milliseconds of token writes: that wait is the server's, so it
    belongs in the server's time to first token, not in a client's measurement error.
    """

    def __init__(
        self, inner: asyncio.Protocol, clock: Callable[[], float], stamps: dict[object, float]
    ) -> None:
        self.inner = inner
        self.clock = clock
        self.stamps = stamps  # inner protocol (``request.protocol``) -> last read time

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.stamps[self.inner] = self.clock()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.stamps.pop(self.inner, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class SimServer:
    """The HTTP application around one simulated engine."""

    def __init__(
        self,
        engine: SimEngine,
        plan: MemoryPlan,
        gpu: GpuSpec,
        settings: ServeSettings,
        vllm_log: VllmLog,
    ) -> None:
        self.engine = engine
        self.plan = plan
        self.gpu = gpu
        self.settings = settings
        self.vllm_log = vllm_log
        self.metrics = ServerMetrics(settings.served_model_names[0])
        register_cache_config_info(
            self.metrics.registry,
            cache_config_labels(
                plan, enable_prefix_caching=settings.enable_prefix_caching,
                kv_cache_memory_bytes=settings.kv_cache_memory_bytes,
            ),
        )  # fmt: skip
        self._driver: EngineDriver | None = None
        self._read_stamps: dict[object, float] = {}

    @property
    def driver(self) -> EngineDriver:
        if self._driver is None:
            raise RuntimeError("the engine driver starts with the application")
        return self._driver

    def protocol_factory(self, server: Callable[[], asyncio.Protocol]) -> asyncio.Protocol:
        """A connection's protocol: ``server()`` (aiohttp's) wrapped to stamp its reads.

        For ``loop.create_server(partial(sim.protocol_factory, runner.server), ...)``;
        without it a request's arrival is when its handler started.
        """
        loop = asyncio.get_running_loop()
        return ReadStampingProtocol(server(), loop.time, self._read_stamps)

    def app(self) -> web.Application:
        middlewares: list[Middleware] = [_fastapi_errors]
        if self.settings.api_keys:
            middlewares.insert(0, _authentication(self.settings.api_keys))
        app = web.Application(middlewares=middlewares)
        app.on_response_prepare.append(self._add_headers)
        app.cleanup_ctx.append(self._lifecycle)
        handlers: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]] = {
            "/health": self.health,
            "/tokenize": self.tokenize,
            "/version": self.version,
            "/v1/models": self.models,
            "/v1/completions": partial(self.generate, Endpoint.COMPLETIONS),
            "/v1/chat/completions": partial(self.generate, Endpoint.CHAT),
            "/metrics": self.prometheus,
            "/sim/gpu": self.sim_gpu,
            "/sim/lag": self.sim_lag,
            "/sim/requests": self.sim_requests,
            "/sim/stall": self.sim_stall,
            "/sim/time-scale": self.sim_time_scale,
        }
        for path, method in ROUTES:
            app.router.add_route(method, path, handlers[path])
        return app

    # -- lifecycle --------------------------------------------------------------------------

    async def _lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        self._driver = EngineDriver(
            self.engine,
            self.metrics,
            time_scale=self.settings.time_scale,
            on_dead=partial(log_engine_dead, self.vllm_log),
        )
        tasks = [
            asyncio.create_task(self._driver.run(), name="sim-engine"),
            asyncio.create_task(self._log_stats(), name="sim-stats"),
        ]
        for task in tasks:
            task.add_done_callback(_report_crash)
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _add_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[TIME_SCALE_HEADER] = repr(self.time_scale)
        response.headers["server"] = "uvicorn"

    async def _log_stats(self) -> None:
        """vLLM's periodic "Engine 000: ..." line while there is activity."""
        interval = self.settings.stats_interval_s
        last = self.driver.snapshot()
        last_s = self.driver.wall_s()
        last_throughput = (0.0, 0.0)
        while True:
            await asyncio.sleep(interval)
            now = self.driver.snapshot()
            now_s = self.driver.wall_s()
            elapsed = max(now_s - last_s, 1e-9)
            throughput = (
                (now.prompt_tokens - last.prompt_tokens) / elapsed,
                (now.generation_tokens - last.generation_tokens) / elapsed,
            )
            if any((*throughput, *last_throughput)):
                hit_rate = None
                if self.settings.enable_prefix_caching:
                    queries = now.prefix_cache_queries
                    hit_rate = now.prefix_cache_hits / queries if queries else 0.0
                log_stats(
                    self.vllm_log,
                    IntervalStats(
                        prompt_throughput=throughput[0],
                        generation_throughput=throughput[1],
                        num_running=now.num_running,
                        num_waiting=now.num_waiting,
                        num_preemptions=now.num_preemptions - last.num_preemptions,
                        kv_cache_usage=now.kv_cache_usage,
                        prefix_cache_hit_rate=hit_rate,
                    ),
                )
            last, last_s, last_throughput = now, now_s, throughput

    # -- small endpoints --------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.driver.dead else 200)

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``POST /tokenize``: a completions-style ``prompt`` or chat-style ``messages``,
        counted as the generation endpoints count them (``add_special_tokens`` and
        ``add_generation_prompt`` add nothing here: the simulator has no special tokens)."""
        try:
            ids = self._tokenize(await _json_object(request))
        except ApiError as exc:
            return _json(exc.body(), status=exc.status)
        return _json(
            {
                "count": len(ids),
                "max_model_len": self.settings.max_model_len,
                "tokens": ids,
                "token_strs": None,
            }
        )

    def _tokenize(self, body: dict[str, Any]) -> list[int]:
        model = body.get("model")
        if model is not None and model not in self.settings.served_model_names:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
        prompt, messages = body.get("prompt"), body.get("messages")
        if isinstance(prompt, str):
            return encode(prompt, self.settings.vocab_size)
        if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages):
            try:
                return encode_chat(messages, self.settings.vocab_size)
            except ValueError as exc:  # a message's content is neither text nor parts
                raise ApiError(400, str(exc)) from None
        raise ApiError(400, "Field required: prompt (a string) or messages (a list)")

    async def version(self, request: web.Request) -> web.Response:
        return _json({"version": str(self.vllm_log.version)})

    async def models(self, request: web.Request) -> web.Response:
        cards = [self._model_card(name) for name in self.settings.served_model_names]
        return _json({"object": "list", "data": cards})

    def _model_card(self, name: str) -> JsonObject:
        created = int(self.metrics.created_s)
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": self.settings.model,
            "parent": None,
            "max_model_len": self.settings.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{os.getpid():x}{created:x}",
                    "object": "model_permission",
                    "created": created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }

    async def prometheus(self, request: web.Request) -> web.Response:
        text = self.metrics.render(self.driver.snapshot())
        return web.Response(body=text.encode(), headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def sim_requests(self, request: web.Request) -> web.Response:
        """Ground truth for measuring clients: each finished request's server-side timings.

        Unix seconds (`ServerTiming`): when the server read the request, when it entered
        the engine, when each token was made and when it was written to the socket, and
        its prompt tokens as the server counted them. A client's ``X-Request-Id`` header
        names the request.
        """
        return _json({"requests": [timing.as_json() for timing in self.driver.timings]})

    async def sim_lag(self, request: web.Request) -> web.Response:
        """How late the steps between ``since`` and ``until`` (Unix seconds; default: all)
        started against the wall clock: ``{"steps", "p99_ms", "max_ms"}``. A level's
        measurement on this server holds only where its steps kept to their timeline."""
        try:
            since = float(request.query.get("since", "-inf"))
            until = float(request.query.get("until", "inf"))
        except ValueError:
            return _json({"error": "since and until are Unix seconds"}, status=400)
        return _json(dataclasses.asdict(self.driver.clock_lag(since, until)))

    async def sim_stall(self, request: web.Request) -> web.Response:
        """Freeze the virtual GPU for ``seconds`` (a server stall a load test must survive)."""
        try:
            seconds = float((await request.json()).get("seconds", 0))
        except (ValueError, AttributeError):
            seconds = -1.0
        if not 0 < seconds <= 600:
            return _json(ApiError(400, "seconds must be in (0, 600]").body(), status=400)
        self.driver.stall(seconds)
        return _json({"stalled_s": seconds})

    @property
    def time_scale(self) -> float:
        """The clock's scale now: ``--time-scale``, or what ``/sim/time-scale`` set since."""
        return self._driver.time_scale if self._driver is not None else self.settings.time_scale

    async def sim_time_scale(self, request: web.Request) -> web.Response:
        """Run the clock ``time_scale`` times slower than the virtual GPU from now on
        (``EngineDriver.set_time_scale``: the engine's time goes on from where it is)."""
        try:
            scale = float((await request.json()).get("time_scale", 0))
        except (ValueError, TypeError, AttributeError):
            scale = -1.0
        if not 0 < scale <= MAX_TIME_SCALE:
            return _json(
                ApiError(400, f"time_scale must be in (0, {MAX_TIME_SCALE:g}]").body(), status=400
            )
        before = self.driver.time_scale
        self.driver.set_time_scale(scale)
        log.info("sim: clock time scale %g -> %g", before, scale)
        return _json({"time_scale": scale, "was": before})

    async def sim_gpu(self, request: web.Request) -> web.Response:
        return _json(self.gpu_report().model_dump())

    def gpu_report(self) -> GpuReport:
        total = self.gpu.nvml_total_bytes
        used = process_used_bytes(self.plan)
        utilization = self.driver.busy.fraction(self.driver.wall_s())
        return GpuReport(
            name=self.gpu.name,
            total_bytes=total,
            used_bytes=used,
            free_bytes=max(total - used, 0),
            utilization_percent=round(utilization * 100, 1),
            power_watts=power_watts(self.gpu, utilization),
            process_pid=os.getpid(),
            process_used_bytes=used,
            kv_cache_usage=self.engine.pool.usage,
            time_scale=self.time_scale,
            clock_lag_s=round(self.driver.lag_s, 4),
        )

    # -- generation -------------------------------------------------------------------------

    async def generate(self, endpoint: Endpoint, request: web.Request) -> web.StreamResponse:
        now = self.driver.wall_s()
        # When the server read the request's last bytes (``protocol_factory``).
        received_s = min(self._read_stamps.get(request.protocol, now), now)
        try:
            gen = parse_generation(
                endpoint,
                await _json_object(request),
                served_model_names=self.settings.served_model_names,
                max_model_len=self.settings.max_model_len,
                vocab_size=self.settings.vocab_size,
                request_stream_interval=self.settings.request_stream_interval,
            )
        except ApiError as exc:
            return _json(exc.body(), status=exc.status)
        client_id = request.headers.get("X-Request-Id")
        if client_id:  # vLLM takes the client's request id from this header too
            gen = dataclasses.replace(gen, request_id=client_id)
        engine_request = SimRequest(
            request_id=gen.request_id,
            prompt_token_ids=gen.prompt_token_ids,
            max_tokens=gen.max_tokens,
            arrival_s=self.driver.engine_now_s(),
            min_tokens=gen.min_tokens,
            ignore_eos=gen.ignore_eos,
            logprobs=0 if gen.logprobs is None else max(gen.logprobs, 1),
        )
        try:
            stream = self.driver.submit(engine_request, received_s=received_s)
        except EngineDead:
            return _engine_dead_response()
        try:
            if gen.stream:
                return await self._stream(request, gen, stream)
            return await self._collect(request, gen, stream)
        finally:
            # A no-op once the request finished; otherwise the client went away.
            self.driver.abort(gen.request_id)
            self.driver.record_timing(stream)

    async def _collect(
        self, request: web.Request, gen: GenerationRequest, stream: RequestStream
    ) -> web.StreamResponse:
        token_ids: list[int] = []
        while True:
            item = await stream.queue.get()
            if isinstance(item, EngineFailure):
                return _engine_dead_response()
            token_ids.append(item.token_id)
            if item.finish_reason is not None:
                break
        response = _json(full_response(gen, token_ids, item.finish_reason))
        # Written here rather than by aiohttp after the handler returns, so that the
        # tokens' ground-truth time is when their bytes went out.
        await response.prepare(request)
        stream.written_s.extend([self.driver.wall_s()] * len(token_ids))
        await response.write_eof()
        return response

    async def _stream(
        self, request: web.Request, gen: GenerationRequest, stream: RequestStream
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            }
        )
        events = StreamEvents(gen)
        try:
            await response.prepare(request)  # sends the headers
            if gen.endpoint is Endpoint.CHAT:
                await response.write(events.role())
            direct = _DirectWriter.for_response(request, response, stream, events, self.driver)
            while True:
                if direct is not None and stream.queue.empty():
                    stream.deliver = direct.deliver  # the next tokens skip this task
                item = await stream.queue.get()
                if isinstance(item, EngineFailure):
                    error = error_body(500, ENGINE_DEAD_TEXT, "InternalServerError")
                    await response.write(sse_event(error))
                    break
                chunk = events.push(item.token_id, item.finish_reason)
                if chunk is not None:
                    data = events.chunk(chunk, item.finish_reason)
                    # as it goes to the kernel
                    stream.written_s.extend([self.driver.wall_s()] * len(chunk))
                    await response.write(data)
                if item.finish_reason is not None:
                    if gen.include_usage:
                        await response.write(events.usage())
                    break
            await response.write(DONE_EVENT)
            await response.write_eof()
        except ConnectionResetError:
            log.debug("client of %s went away", gen.request_id)
        finally:
            stream.deliver = None
        return response


class _DirectWriter:
    """Writes a stream's tokens from the engine driver's own callback, as they are made.

    Handing each token to the request's handler task through its queue costs a task
    switch and a few coroutine frames per token, which a single-core server streaming
    thousands of tokens a second cannot afford: the backlog delays every write and the
    reading of new requests. So while the connection takes data (nothing waiting in
    the transport's buffer), a token other than the last is framed as an HTTP/1.1
    chunk and written to the transport there and then; the last token, an engine
    failure or back-pressure go through the queue and the handler's ordinary writes.
    Only for chunked responses (HTTP/1.1), whose framing this writer reproduces.
    """

    def __init__(
        self,
        transport: asyncio.Transport,
        stream: RequestStream,
        events: StreamEvents,
        driver: EngineDriver,
    ) -> None:
        self.transport = transport
        self.stream = stream
        self.events = events
        self.driver = driver

    @classmethod
    def for_response(
        cls,
        request: web.Request,
        response: web.StreamResponse,
        stream: RequestStream,
        events: StreamEvents,
        driver: EngineDriver,
    ) -> _DirectWriter | None:
        transport = request.transport
        if response.headers.get("Transfer-Encoding") != "chunked" or transport is None:
            return None
        return cls(transport, stream, events, driver)

    def deliver(self, token: Token) -> bool:
        transport = self.transport
        if (
            token.finish_reason is not None
            or transport.is_closing()
            or transport.get_write_buffer_size()
        ):
            self.stream.deliver = None  # this token and the rest through the queue, in order
            return False
        chunk = self.events.push(token.token_id, None)
        if chunk is None:  # waits for the rest of its chunk (the request's stream_interval)
            return True
        event = self.events.chunk(chunk, None)
        data = b"%x\r\n%b\r\n" % (len(event), event)
        self.stream.written_s.extend([self.driver.wall_s()] * len(chunk))
        transport.write(data)
        return True


@web.middleware
async def _fastapi_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Unknown paths and methods answered as FastAPI answers them."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return _json({"detail": "Not Found"}, status=404)
    except web.HTTPMethodNotAllowed:
        return _json({"detail": "Method Not Allowed"}, status=405)


def _authentication(keys: tuple[str, ...]) -> Middleware:
    """vLLM's AuthenticationMiddleware: a /v1 path (any method but OPTIONS) needs
    ``Authorization: Bearer <one of the keys>``, else 401 ``{"error": "Unauthorized"}``;
    other paths (/health, /metrics, /version, /sim/...) are open."""
    digests = [hashlib.sha256(key.encode()).digest() for key in keys]

    def authorized(header: str | None) -> bool:
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(token.encode()).digest()
        return any([secrets.compare_digest(digest, known) for known in digests])

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            request.method != "OPTIONS"
            and request.path.startswith("/v1")
            and not authorized(request.headers.get("Authorization"))
        ):
            return _json({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return authenticate


def _report_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s stopped", task.get_name(), exc_info=task.exception())

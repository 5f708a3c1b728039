"""Runs a SimEngine on the wall clock and hands each request its tokens as they are made.

One asyncio task steps the engine: it runs ``engine.step(now)``, sleeps until the
step's virtual duration (times ``time_scale``) has passed on the wall clock, then
delivers the step's tokens at that moment: written to the client there and then
through the stream's ``deliver`` hook when the HTTP layer set one, else put in the
request's queue for its handler. So what a client measures (time to first token,
inter-token gaps) is what the virtual GPU would take, scaled. With no work the task
waits on an event set by ``submit``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tuner.sim.engine import EngineDead, FinishReason, SimEngine, SimRequest
from tuner.sim.prometheus import (
    EngineSnapshot,
    FinishedRequest,
    LostHistorySnapshot,
    OffloadSnapshot,
    ServerMetrics,
)

log = logging.getLogger(__name__)

BUSY_WINDOW_S = 1.0
IDLE_RETRY_S = 0.001  # when a step scheduled nothing (nothing fits yet), wait this long
TIMINGS_KEPT = 100_000  # finished requests whose server-side timings /sim/requests returns
STEP_LAGS_KEPT = 500_000  # steps whose lag /sim/lag reads (about 40 minutes at 200 a second)


@dataclass(frozen=True)
class Token:
    """One output token of a request (``finish_reason`` set on its last)."""

    token_id: int
    finish_reason: FinishReason | None


@dataclass(frozen=True)
class EngineFailure:
    """The engine died while the request was in flight."""

    reason: str


StreamItem = Token | EngineFailure


@dataclass(frozen=True)
class ServerTiming:
    """A finished request as the server saw it, in Unix seconds: ground truth for clients.

    ``received_s``: the server read the request's last bytes off the socket (when the
    HTTP server stamps reads; else when its handler started). ``arrival_s``: the
    request entered the engine (body read and validated; vLLM's ``arrival_time``, where
    the engine's TTFT histogram starts). ``token_times_s``: each token's chunk was
    written to the socket (taken as the write begins, as a client takes its send time;
    what a client can see, and when). ``generated_s``: the virtual GPU handed each
    token over (where vLLM's histograms take their token times). A client's TTFT is
    comparable with ``token_times_s[0] - received_s``; ``token_times_s - generated_s``
    is the server's own delivery delay. ``prompt_tokens``: the prompt as the server
    counted it.
    """

    request_id: str
    received_s: float
    arrival_s: float
    token_times_s: tuple[float, ...]
    generated_s: tuple[float, ...]
    prompt_tokens: int

    def as_json(self) -> dict[str, object]:
        return {
            "request_id": self.request_id,
            "received_s": self.received_s,
            "arrival_s": self.arrival_s,
            "token_times_s": list(self.token_times_s),
            "generated_s": list(self.generated_s),
            "prompt_tokens": self.prompt_tokens,
        }


@dataclass(eq=False)
class RequestStream:
    """A request in flight: its queue of tokens and its wall-clock (``loop.time()``) timings."""

    request: SimRequest
    arrival_s: float
    received_s: float
    queue: asyncio.Queue[StreamItem] = field(default_factory=asyncio.Queue)
    token_times_s: list[float] = field(default_factory=list)  # handed over by the engine
    written_s: list[float] = field(default_factory=list)  # written to the client, per token
    # Set by the HTTP layer while it can write a token the moment it is made (True: done),
    # so that a token costs no task switch; an item it declines goes to ``queue``.
    deliver: Callable[[Token], bool] | None = None


class BusyTracker:
    """Intervals the virtual GPU was computing, for a utilization over the last second."""

    def __init__(self, window_s: float = BUSY_WINDOW_S) -> None:
        self.window_s = window_s
        self._intervals: deque[tuple[float, float]] = deque()

    def add(self, start_s: float, end_s: float) -> None:
        if end_s > start_s:
            self._intervals.append((start_s, end_s))

    def fraction(self, now_s: float) -> float:
        since = now_s - self.window_s
        while self._intervals and self._intervals[0][1] <= since:
            self._intervals.popleft()
        busy = sum(max(0.0, min(end, now_s) - max(start, since)) for start, end in self._intervals)
        return min(busy / self.window_s, 1.0)


@dataclass(frozen=True)
class ClockLag:
    """How late a span's steps started against the wall clock (``EngineDriver.clock_lag``):
    a core that cannot keep up with the virtual GPU delays its tokens by this much."""

    steps: int
    p99_ms: float
    max_ms: float


class EngineDriver:
    """The only caller of the engine once the server runs (all on one event loop)."""

    def __init__(
        self,
        engine: SimEngine,
        metrics: ServerMetrics,
        *,
        time_scale: float,
        on_dead: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        if engine.pool.residency is not None:
            metrics.enable_residency()
        self.time_scale = time_scale
        self.on_dead = on_dead
        self.busy = BusyTracker()
        self.streams: dict[str, RequestStream] = {}
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._timeline_s = self._t0
        self._unix_offset_s = time.time() - self._t0
        self._stall_until_s = 0.0
        self.timings: deque[ServerTiming] = deque(maxlen=TIMINGS_KEPT)
        # Each step's (Unix start on its timeline, seconds it started late): /sim/lag.
        self.step_lags: deque[tuple[float, float]] = deque(maxlen=STEP_LAGS_KEPT)

    # -- clocks -----------------------------------------------------------------------------

    def wall_s(self) -> float:
        return self._loop.time()

    @property
    def lag_s(self) -> float:
        """How far the virtual GPU's timeline has fallen behind the wall clock."""
        return max(self.wall_s() - self._timeline_s, 0.0) if self.engine.has_work else 0.0

    def engine_now_s(self) -> float:
        """The engine's clock: virtual seconds since the server started."""
        return (self._loop.time() - self._t0) / self.time_scale

    def set_time_scale(self, time_scale: float) -> None:
        """Run the clock ``time_scale`` times slower than the virtual GPU from now on. The
        engine's time goes on from where it is (no jump), and a timeline that had fallen
        behind the wall clock starts again from now: steps already made keep their times."""
        now = self.wall_s()
        self._timeline_s = max(self._timeline_s, now)
        self._t0 = now - (now - self._t0) * time_scale / self.time_scale
        self.time_scale = time_scale

    @property
    def dead(self) -> str | None:
        return self.engine.dead

    # -- requests ---------------------------------------------------------------------------

    def submit(self, request: SimRequest, *, received_s: float | None = None) -> RequestStream:
        """Queue a request in the engine; raises EngineDead once the engine has died.

        ``received_s`` (``wall_s()`` when the server read the request) defaults to now.
        """
        self.engine.add_request(request)
        now = self.wall_s()
        stream = RequestStream(
            request=request, arrival_s=now, received_s=now if received_s is None else received_s
        )
        self.streams[request.request_id] = stream
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        """The client went away: free the request's blocks and count it as aborted."""
        stream = self.streams.pop(request_id, None)
        if stream is None:
            return
        if not self.engine.dead:
            self.engine.abort(request_id, self.engine_now_s())
        self._finish(stream, FinishReason.ABORT)

    def snapshot(self) -> EngineSnapshot:
        engine = self.engine
        if engine.pool.residency is not None:  # vLLM drains them each stats interval
            self.metrics.observe_evictions(engine.pool.residency.drain(), self.time_scale)
        return EngineSnapshot(
            num_running=len(engine.running),
            num_waiting=len(engine.waiting),
            kv_cache_usage=engine.pool.usage,
            num_preemptions=engine.num_preemptions,
            prompt_tokens=engine.prompt_tokens_total,
            generation_tokens=engine.generation_tokens_total,
            prefix_cache_queries=engine.prefix_queries_tokens,
            prefix_cache_hits=engine.prefix_hits_tokens,
            offload=OffloadSnapshot.of(engine.cpu_tier) if engine.cpu_tier is not None else None,
            lost_history=(
                LostHistorySnapshot.of(engine.pool.history)
                if engine.pool.history is not None
                else None
            ),
        )

    # -- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Step the engine until it dies or the task is cancelled."""
        while True:
            if not self.engine.has_work:
                self._wake.clear()
                await self._wake.wait()
                self._timeline_s = max(self._timeline_s, self.wall_s())
                continue
            # While there is work, steps follow each other on the virtual GPU's own
            # timeline: the time spent delivering tokens and the sleep's overshoot
            # delay a delivery but not the next step. If the core cannot keep up, the
            # timeline falls behind the wall clock (``lag_s``) and deliveries run late.
            if self.wall_s() < self._stall_until_s:
                await asyncio.sleep(self._stall_until_s - self.wall_s())
                self._timeline_s = max(self._timeline_s, self.wall_s())
            start = self._timeline_s
            self.step_lags.append((start + self._unix_offset_s, max(self.wall_s() - start, 0.0)))
            try:
                result = self.engine.step((start - self._t0) / self.time_scale)
            except EngineDead as exc:
                self._die(str(exc))
                return
            end = start + result.duration_s * self.time_scale
            self._timeline_s = end
            self.busy.add(start, end)
            if not result.events and result.duration_s == 0:
                await asyncio.sleep(IDLE_RETRY_S)
                continue
            await asyncio.sleep(max(end - self.wall_s(), 0.0))
            now = self.wall_s()
            for event in result.events:
                stream = self.streams.get(event.request.request_id)
                if stream is None or event.token_id is None:
                    continue
                stream.token_times_s.append(now)
                reason = event.request.finish_reason if event.finished else None
                token = Token(event.token_id, reason)
                deliver = stream.deliver
                if deliver is None or not deliver(token):
                    stream.queue.put_nowait(token)
                if reason is not None:
                    self.streams.pop(event.request.request_id, None)
                    self._finish(stream, reason)

    def clock_lag(self, since_unix_s: float, until_unix_s: float) -> ClockLag:
        """How late the steps that started between two Unix times (on the virtual GPU's
        timeline) began against the wall clock: a late step delays every token it makes."""
        lags = sorted(lag for at, lag in self.step_lags if since_unix_s <= at < until_unix_s)
        if not lags:
            return ClockLag(steps=0, p99_ms=0.0, max_ms=0.0)
        p99 = lags[min(len(lags) - 1, math.ceil(0.99 * len(lags)) - 1)]
        return ClockLag(steps=len(lags), p99_ms=1000.0 * p99, max_ms=1000.0 * lags[-1])

    def stall(self, seconds: float) -> None:
        """Freeze the virtual GPU: no step starts for ``seconds`` of wall time."""
        self._stall_until_s = max(self._stall_until_s, self.wall_s() + seconds)
        self._wake.set()

    def record_timing(self, stream: RequestStream) -> None:
        """The HTTP layer has written everything of ``stream``: keep its ground truth."""
        offset = self._unix_offset_s
        self.timings.append(
            ServerTiming(
                request_id=stream.request.request_id,
                received_s=stream.received_s + offset,
                arrival_s=stream.arrival_s + offset,
                token_times_s=tuple(t + offset for t in stream.written_s),
                generated_s=tuple(t + offset for t in stream.token_times_s),
                prompt_tokens=stream.request.num_prompt_tokens,
            )
        )

    def _finish(self, stream: RequestStream, reason: FinishReason) -> None:
        self.metrics.observe_finished(
            FinishedRequest(
                arrival_s=stream.arrival_s,
                token_times_s=tuple(stream.token_times_s),
                finish_s=self.wall_s(),
                finish_reason=reason,
            )
        )

    def _die(self, reason: str) -> None:
        log.debug("simulated engine died: %s", reason)
        if self.on_dead is not None:
            self.on_dead(reason)
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            stream.queue.put_nowait(EngineFailure(reason))
            self._finish(stream, FinishReason.ERROR)

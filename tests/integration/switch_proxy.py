"""A reverse proxy for switch-over tests: backends join and leave while the load runs.

It stands for a Service in front of a Deployment's pods, balanced per request as an
L7 proxy or gateway does (kube-proxy balances connections; a client's kept-alive
connection would otherwise stay on one pod):

    proxy = SwitchProxy()          listens on a free loopback port (proxy.url) in a thread
    proxy.add("new", url)          a ready backend: it takes requests, round robin
    proxy.remove("old")            no new request goes there; its requests in flight
                                   run to their end, streams included
    proxy.forwarded                every request forwarded: to which backend, when it was
                                   chosen and ended, its status, whether it came back whole

Used as a context manager it is started and stopped (its requests in flight cut).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import dataclass
from types import TracebackType

import aiohttp
from aiohttp import web

# Headers of one hop only (RFC 9110 7.6.1), and those aiohttp writes itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
BACKEND_HEADER = "x-switch-backend"  # on every response: the backend that answered


@dataclass
class Forwarded:
    """One request the proxy forwarded. Times are ``time.time()`` (Unix seconds)."""

    backend: str
    method: str
    path: str
    request_id: str | None  # the client's X-Request-Id
    chosen_s: float  # when the backend was chosen for it
    status: int | None = None  # the backend's status; None if it never answered
    ended_s: float | None = None  # when the proxy finished with it (whole or not)
    complete: bool = False  # the whole response went back to the client
    error: str | None = None

    @property
    def in_flight(self) -> bool:
        return self.ended_s is None


class SwitchProxy:
    """Round robin over the ready backends; see the module's docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[str, str] = {}  # name -> base URL, in the order they were added
        self._turn = 0
        self.forwarded: list[Forwarded] = []
        self.removed_s: dict[str, float] = {}  # name -> when it stopped taking requests
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        assert self._sock is not None, "the proxy is not started"
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    # -- the backends --------------------------------------------------------------------

    def add(self, name: str, url: str) -> None:
        with self._lock:
            assert name not in self._ready, f"{name} is already a backend"
            self._ready[name] = url.rstrip("/")
            self.removed_s.pop(name, None)

    def remove(self, name: str) -> float:
        """Stop sending ``name`` requests; when that was (``time.time()``)."""
        with self._lock:
            del self._ready[name]
            self.removed_s[name] = time.time()
            return self.removed_s[name]

    def _choose(self, request: web.Request) -> tuple[Forwarded, str] | None:
        """The next ready backend for ``request`` (recorded as forwarded there) and its URL."""
        with self._lock:
            names = list(self._ready)
            if not names:
                return None
            name = names[self._turn % len(names)]
            self._turn += 1
            record = Forwarded(
                backend=name,
                method=request.method,
                path=request.path,
                request_id=request.headers.get("X-Request-Id"),
                chosen_s=time.time(),
            )
            self.forwarded.append(record)
            return record, self._ready[name]

    def records(self, backend: str | None = None) -> list[Forwarded]:
        with self._lock:
            return [r for r in self.forwarded if backend is None or r.backend == backend]

    def in_flight(self, backend: str) -> int:
        return sum(r.in_flight for r in self.records(backend))

    def completed(self, backend: str) -> int:
        return sum(r.complete for r in self.records(backend))

    # -- the server, in a thread of its own ----------------------------------------------

    def start(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._thread = threading.Thread(target=self._run, name="switch-proxy", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout=10):
            raise RuntimeError("the switch proxy did not start in 10 s")
        if self._failure is not None:
            raise RuntimeError("the switch proxy failed to start") from self._failure

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=10)
            assert not self._thread.is_alive(), "the switch proxy did not stop in 10 s"
        if self._sock is not None:
            self._sock.close()

    def __enter__(self) -> SwitchProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported by start() or seen as a dead thread
            self._failure = exc
            self._started.set()

    async def _serve(self) -> None:
        assert self._sock is not None
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        connector = aiohttp.TCPConnector(limit=0)  # as many connections as requests in flight
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False
        ) as session:
            self._session = session
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._forward)
            runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1)
            await runner.setup()
            await web.SockSite(runner, self._sock).start()
            self._started.set()
            try:
                await self._stop.wait()
            finally:
                await runner.cleanup()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        chosen = self._choose(request)
        if chosen is None:
            return web.Response(status=503, text="no ready backend\n")
        record, base = chosen
        session = self._session
        assert session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        response: web.StreamResponse | None = None
        try:
            body = await request.read()
            async with session.request(
                request.method, base + request.rel_url.path_qs, headers=headers, data=body
            ) as upstream:
                record.status = upstream.status
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for key, value in upstream.headers.items():
                    if key.lower() not in HOP_BY_HOP:
                        response.headers.add(key, value)
                response.headers[BACKEND_HEADER] = record.backend
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            record.complete = True
            return response
        except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
            record.error = repr(exc)
            if response is None:
                return web.Response(status=502, text=f"{record.backend}: {exc!r}\n")
            raise  # the response was under way: the client sees it cut off
        finally:
            record.ended_s = time.time()

"""The streaming token-event rate the Locust load generator consumes on one core before its
measurements degrade, with one and with several Locust processes (``--processes``), side by
side with a plain asyncio + aiohttp client, in the same run.

Starts `tuner sim-serve` pinned to CPU 0 (Qwen2.5-7B on H100-80GB) and, for each number N
of concurrent streams (16-word prompts, 600 output tokens, ignore_eos, sent 2 ms apart),
reads the same streams with each client, all pinned to CPU 1:

- ``aiohttp``: this process, asyncio + aiohttp, ``async for line in response.content``,
  each data line JSON-parsed, times taken when the line is read (the way vLLM's own
  benchmark client reads streams);
- ``locust xP``: `workloads.runner.run_load` with ``processes=P`` (P Locust processes,
  all on CPU 1; with P > 1 Locust adds a master process);
- ``locust rR`` (``--remote R``): ``run_load(processes=0, remote_workers=R)``: R
  ``tuner load-worker`` agents on loopback, as load hosts would run them (no shared
  files: shares and records travel in Locust messages), their workers on CPU 1 too.

Each request carries an ``X-Request-Id``, so every measured request is compared with the
simulator's ground truth (``/sim/requests``: when the server read the request and when it
wrote each token). Per client and N it prints the token events per second received while
every stream was decoding and its ratio to what the virtual GPU produces at that batch
(``ideal``); the client's CPU (percent of one core, all its processes) and CPU per token
event; the TTFT error (client: first token - request sent; server: first token written -
request read) and ITL error (every gap, client against server) at p50 / p99; Locust's own
health figures (send lag p99, coalesced token events, read delay p99 - see
`workloads.runner.WorkerStats`); and the load average. A client keeps up at N while its
event rate is at least 0.9 of the ideal and its TTFT and ITL errors are within the
issue's targets (2 ms p50, 5 ms p99). The last lines name the highest event rate each
client kept up at and its CPU cost per event.

This machine has 2 cores and the server needs one: P Locust processes share the one
client core, so ``--processes 2`` shows what a second process costs there, not what it
gains on a machine with a core to spare for it. Other work on the machine shows in the
load average and in the errors' p99.

Run: ``python benchmarks/locust_event_rate.py [--streams 16,32,64] [--processes 1,2]
[--remote 2]``
(Linux, 2+ cores).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from sim_serve_event_rate import GPU, MAX_LEN, MODEL, OUTPUT, PROMPT, ideal_rate

from tuner.serving.server import free_port
from workloads.runner import run_load
from workloads.schedule import Api, RequestRecord, ScheduledRequest, read_records

SERVER_CPU, CLIENT_CPU = 0, 1
SEND_GAP_S = 0.002
STREAMS = (16, 32, 64, 96, 128, 192, 256)
RATE_RATIO = 0.9
ERROR_P50_MS, ERROR_P99_MS = 2.0, 5.0  # the accuracy targets, TTFT and ITL


@dataclass(frozen=True)
class Stream:
    request_id: str
    sent_s: float
    token_times_s: list[float]


@dataclass(frozen=True)
class Row:
    client: str
    streams: int
    events_per_s: float
    ideal_per_s: float
    client_cpu_percent: float  # of one core, every process of the client
    cpu_us_per_event: float
    ttft_error_p50_ms: float
    ttft_error_p99_ms: float
    itl_error_p50_ms: float
    itl_error_p99_ms: float
    send_lag_p99_ms: float | None  # Locust's own figures; None for aiohttp
    coalesced_percent: float | None
    read_delay_p99_ms: float | None
    flagged_saturated: bool | None  # the harness's verdict on its own client
    load_average: float  # 1-minute, when the row was measured

    @property
    def ratio(self) -> float:
        return self.events_per_s / self.ideal_per_s

    @property
    def keeps_up(self) -> bool:
        return (
            self.ratio >= RATE_RATIO
            and self.ttft_error_p50_ms <= ERROR_P50_MS
            and self.ttft_error_p99_ms <= ERROR_P99_MS
            and self.itl_error_p50_ms <= ERROR_P50_MS
            and self.itl_error_p99_ms <= ERROR_P99_MS
        )


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def decoding_rate(streams: Sequence[Stream]) -> float:
    """Events per second while every stream is decoding (after the last first token)."""
    start = max(s.token_times_s[0] for s in streams)
    end = min(s.token_times_s[-1] for s in streams)
    if end <= start:
        start = min(s.token_times_s[0] for s in streams)
        end = max(s.token_times_s[-1] for s in streams)
    events = sum(1 for s in streams for t in s.token_times_s if start < t <= end)
    return events / (end - start)


def errors_ms(
    streams: Sequence[Stream], truth: dict[str, dict[str, Any]]
) -> tuple[list[float], list[float]]:
    """|TTFT error| per request and |ITL error| per gap, against the server's timings."""
    ttft, itl = [], []
    for s in streams:
        server = truth[s.request_id]
        written = server["token_times_s"]
        client_ttft = s.token_times_s[0] - s.sent_s
        ttft.append(1000 * abs(client_ttft - (written[0] - server["received_s"])))
        client_gaps = [b - a for a, b in itertools.pairwise(s.token_times_s)]
        server_gaps = [b - a for a, b in itertools.pairwise(written)]
        itl += [1000 * abs(c - g) for c, g in zip(client_gaps, server_gaps, strict=True)]
    return ttft, itl


def schedule(streams: int, tag: str) -> list[ScheduledRequest]:
    prompt = " ".join(["w"] * PROMPT)
    return [
        ScheduledRequest(
            request_id=f"{tag}-{i}",
            send_s=i * SEND_GAP_S,
            api=Api.COMPLETIONS,
            prompt_tokens=PROMPT,
            max_tokens=OUTPUT,
            prompt=prompt,
        )
        for i in range(streams)
    ]


def pinned_spawn(cpu: int) -> Callable[[list[str], Path, dict[str, str]], subprocess.Popen[bytes]]:
    def spawn(cmd: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with log_path.open("ab") as out:
            return subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=log_path.parent,
                start_new_session=True,
                preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
            )

    return spawn


@dataclass(frozen=True)
class ClientRun:
    streams: list[Stream]
    cpu_s: float
    wall_s: float
    locust: dict[str, Any] | None = None  # Locust's own health figures


def run_locust(
    url: str,
    requests: list[ScheduledRequest],
    processes: int,
    out: Path,
    remote: int = 0,
    master_bind: str | None = None,
) -> ClientRun:
    run = run_load(
        base_url=url,
        model=MODEL,
        schedule=requests,
        out_dir=out,
        processes=processes,
        remote_workers=remote,
        master_bind=master_bind,
        timeout_s=300,
        spawn=pinned_spawn(CLIENT_CPU),
    )
    records: list[RequestRecord] = list(read_records(run.records_path))
    bad = [r.error for r in records if not r.ok]
    if bad or len(records) != len(requests) or len(run.workers) != processes + remote:
        raise RuntimeError(f"locust: {len(records)} records, errors {bad[:3]} (log {run.log_path})")
    events = sum(w.token_events for w in run.workers)
    delays = [w.read_delay_p99_ms for w in run.workers if w.read_delay_p99_ms is not None]
    locust = {
        "send_lag_p99_ms": max(w.send_lag_p99_ms or 0.0 for w in run.workers),
        "coalesced_percent": 100 * sum(w.coalesced_events for w in run.workers) / max(events, 1),
        "read_delay_p99_ms": max(delays) if delays else None,
        "saturated": run.client_saturated,
    }
    return ClientRun(
        streams=[Stream(r.request_id, r.sent_s, r.token_times_s) for r in records],
        cpu_s=sum(w.cpu_s for w in run.workers),
        wall_s=max(w.wall_s for w in run.workers),
        locust=locust,
    )


async def aiohttp_stream(
    session: aiohttp.ClientSession, url: str, request: ScheduledRequest, start_s: float
) -> Stream:
    body = {
        "model": MODEL,
        "prompt": request.prompt,
        "max_tokens": request.max_tokens,
        "min_tokens": request.max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"X-Request-Id": request.request_id}
    await asyncio.sleep(max(start_s + request.send_s - time.time(), 0))
    sent_s = time.time()
    times: list[float] = []
    async with session.post(f"{url}/v1/completions", json=body, headers=headers) as response:
        async for line in response.content:
            now = time.time()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                continue
            chunk = json.loads(payload)
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                times.append(now)
    return Stream(request.request_id, sent_s, times)


async def aiohttp_all(url: str, requests: list[ScheduledRequest]) -> list[Stream]:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start_s = time.time() + 0.1
        return await asyncio.gather(*(aiohttp_stream(session, url, r, start_s) for r in requests))


def run_aiohttp(url: str, requests: list[ScheduledRequest]) -> ClientRun:
    cpu0, wall0 = time.process_time(), time.time()
    streams = asyncio.run(aiohttp_all(url, requests))
    return ClientRun(streams, time.process_time() - cpu0, time.time() - wall0)


def measure(
    client: str, n: int, got: ClientRun, truth: dict[str, dict[str, Any]], load: float
) -> Row:
    ttft, itl = errors_ms(got.streams, truth)
    events = sum(len(s.token_times_s) for s in got.streams)
    locust = got.locust or {}
    return Row(
        client=client,
        streams=n,
        events_per_s=decoding_rate(got.streams),
        ideal_per_s=ideal_rate(n),
        client_cpu_percent=100 * got.cpu_s / got.wall_s,
        cpu_us_per_event=1e6 * got.cpu_s / events,
        ttft_error_p50_ms=pct(ttft, 0.5),
        ttft_error_p99_ms=pct(ttft, 0.99),
        itl_error_p50_ms=pct(itl, 0.5),
        itl_error_p99_ms=pct(itl, 0.99),
        send_lag_p99_ms=locust.get("send_lag_p99_ms"),
        coalesced_percent=locust.get("coalesced_percent"),
        read_delay_p99_ms=locust.get("read_delay_p99_ms"),
        flagged_saturated=locust.get("saturated"),
        load_average=load,
    )


def show(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default=",".join(map(str, STREAMS)), help="comma-separated N")
    parser.add_argument(
        "--processes", default="1,2", help="Locust process counts to run, comma-separated"
    )
    parser.add_argument(
        "--remote", type=int, default=0, help="also R remote-style workers (tuner load-worker)"
    )
    parser.add_argument("--no-aiohttp", action="store_true", help="skip the aiohttp client")
    args = parser.parse_args()
    levels = [int(n) for n in args.streams.split(",")]
    clients = [] if args.no_aiohttp else ["aiohttp"]
    clients += [f"locust x{int(p)}" for p in args.processes.split(",") if p]
    if args.remote:
        clients.append(f"locust r{args.remote}")

    work = Path(tempfile.mkdtemp(prefix="locust-event-rate-"))
    port = free_port()
    cmd = [
        sys.executable, "-m", "tuner.cli", "sim-serve", "--model", MODEL, "--gpu", GPU,
        "--max-model-len", str(MAX_LEN), "--port", str(port), "--startup-delay", "0",
        "--disable-uvicorn-access-log",
    ]  # fmt: skip
    with (work / "sim-serve.log").open("wb") as out:
        server = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: os.sched_setaffinity(0, {SERVER_CPU}),
        )
    os.sched_setaffinity(0, {CLIENT_CPU})
    url = f"http://127.0.0.1:{port}"
    rows: list[Row] = []
    master_port = free_port()
    agents = [start_agent(work / f"agent{i}", master_port) for i in range(args.remote)]
    try:
        for _ in range(400):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        run_aiohttp(url, schedule(4, "warm-up"))
        print(f"work dir {work}; server CPU {SERVER_CPU}, clients CPU {CLIENT_CPU}")
        print(
            f"{'client':>10} {'N':>4} {'events/s':>8} {'ideal':>6} {'ratio':>5} {'cpu%':>5} "
            f"{'us/ev':>5} {'TTFTerr p50':>11} {'p99':>6} {'ITLerr p50':>10} {'p99':>6} "
            f"{'lag p99':>7} {'coal%':>5} {'rdly99':>6} {'load':>5} kept up"
        )
        for n in levels:
            for client in clients:
                tag = f"{client.replace(' ', '')}-{n}"
                requests = schedule(n, tag)
                load = os.getloadavg()[0]
                if client == "aiohttp":
                    got = run_aiohttp(url, requests)
                elif client.startswith("locust r"):
                    bind = f"127.0.0.1:{master_port}"
                    got = run_locust(url, requests, 0, work / tag, args.remote, bind)
                else:
                    processes = int(client.rpartition("x")[2])
                    got = run_locust(url, requests, processes, work / tag)
                timings = httpx.get(f"{url}/sim/requests", timeout=30).json()["requests"]
                truth = {t["request_id"]: t for t in timings if t["request_id"].startswith(tag)}
                row = measure(client, n, got, truth, load)
                rows.append(row)
                print(
                    f"{client:>10} {n:>4} {row.events_per_s:>8.0f} {row.ideal_per_s:>6.0f} "
                    f"{row.ratio:>5.2f} {row.client_cpu_percent:>5.0f} "
                    f"{row.cpu_us_per_event:>5.0f} {row.ttft_error_p50_ms:>11.2f} "
                    f"{row.ttft_error_p99_ms:>6.2f} {row.itl_error_p50_ms:>10.2f} "
                    f"{row.itl_error_p99_ms:>6.2f} {show(row.send_lag_p99_ms, '.1f'):>7} "
                    f"{show(row.coalesced_percent, '.1f'):>5} "
                    f"{show(row.read_delay_p99_ms, '.1f'):>6} {load:>5.2f} "
                    f"{'yes' if row.keeps_up else 'NO'}"
                    + (" (flagged saturated)" if row.flagged_saturated else ""),
                    flush=True,
                )
        summary = {}
        for client in clients:
            mine = [r for r in rows if r.client == client]
            kept = [r.events_per_s for r in mine if r.keeps_up]
            cost = sorted(r.cpu_us_per_event for r in mine)[len(mine) // 2]
            summary[client] = {"kept_up_events_per_s": max(kept, default=0.0), "us_per_event": cost}
        print(
            "highest event rate kept up with: "
            + "; ".join(
                f"{c} {v['kept_up_events_per_s']:.0f}/s (median {v['us_per_event']:.0f} us CPU "
                "per event)"
                for c, v in summary.items()
            )
        )
        print(json.dumps({"rows": [asdict(r) for r in rows], "summary": summary}))
    finally:
        for agent in agents:  # the agent stops the Locust worker it runs
            os.killpg(agent.pid, signal.SIGTERM)
            agent.wait(timeout=30)
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=10)
    return 0


def start_agent(cwd: Path, master_port: int) -> subprocess.Popen[bytes]:
    """``tuner load-worker`` on CPU 1, as on a load host: its own directory, no TUNER_*."""
    cwd.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNER_", "LOCUST_"))}
    cmd = [sys.executable, "-m", "tuner.cli", "load-worker", "--master", f"127.0.0.1:{master_port}"]
    with (cwd / "agent.log").open("wb") as out:
        return subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: os.sched_setaffinity(0, {CLIENT_CPU}),
        )


if __name__ == "__main__":
    sys.exit(main())

"""The streaming token-event rate the Locust load generator consumes on one core before its
measurements degrade, side by side with a plain asyncio + aiohttp client.

Starts `tuner sim-serve` pinned to CPU 0 (Qwen2.5-7B on H100-80GB) and, for each
number N of concurrent streams (16 output words of prompt, 600 output tokens, ignore_eos,
sends 2 ms apart), reads the same streams with three clients pinned to CPU 1:

- ``locust``: `workloads.runner.run_load`, one Locust process;
- ``locust x2``: the same with ``processes=2`` (both processes share CPU 1);
- ``aiohttp``: this process, asyncio + aiohttp, ``async for line in response.content``,
  each data line JSON-parsed as the locustfile does.

For each it prints the token events per second received while every stream was
decoding, the ratio to what the virtual GPU produces at that batch (``ideal``), the
client's CPU (percent of a core), its mean TTFT (from the send) against the
simulator's own (``vllm:time_to_first_token_seconds``, ``_sum / _count`` over the run),
the excess of that error over the aiohttp client's at the same N (the server's HTTP
handling on its one core adds a few ms that every client sees), and its mean and p99
inter-token gap against the simulator's mean ITL (``vllm:inter_token_latency_seconds``).
A client keeps up while its event rate is at least 0.9 of the ideal, its mean ITL
within 5% of the server's and its TTFT excess at most 5 ms; the last line names the
highest event rate each client kept up at. When the aiohttp client falls behind too,
the single-core server is the limit (about 11,700 events/s,
``benchmarks/sim_serve_event_rate.py``).

Run: ``python benchmarks/locust_event_rate.py [--streams 16,32,64]`` (Linux, 2+ cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import httpx
from sim_serve_event_rate import GPU, MAX_LEN, MODEL, OUTPUT, PROMPT, ideal_rate

from workloads.runner import run_load
from workloads.schedule import Api, RequestRecord, ScheduledRequest, read_records

SERVER_CPU, CLIENT_CPU = 0, 1
SEND_GAP_S = 0.002
STREAMS = (16, 32, 64, 96, 128, 192, 256)
TTFT_EXCESS_MS = 5.0


@dataclass(frozen=True)
class Row:
    client: str
    streams: int
    events_per_s: float
    ideal_per_s: float
    client_cpu_percent: float
    ttft_ms: float  # client mean, from the send
    server_ttft_ms: float
    ttft_excess_ms: float  # client TTFT error minus the aiohttp client's at the same N
    itl_ms: float  # client mean
    server_itl_ms: float
    itl_p99_ms: float  # client; the server's histogram has no exact percentile
    send_lag_p99_ms: float | None

    @property
    def ratio(self) -> float:
        return self.events_per_s / self.ideal_per_s

    @property
    def keeps_up(self) -> bool:
        itl_ok = abs(self.itl_ms - self.server_itl_ms) <= 0.05 * self.server_itl_ms
        return self.ratio >= 0.9 and itl_ok and self.ttft_excess_ms <= TTFT_EXCESS_MS


@dataclass(frozen=True)
class Stream:
    sent_s: float
    token_times_s: list[float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def histogram_means_ms(url: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of the TTFT and ITL histograms in the server's /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out = {}
    for name in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"):
        total = re.search(rf"^{name}_sum\S* (\S+)$", text, re.MULTILINE)
        count = re.search(rf"^{name}_count\S* (\S+)$", text, re.MULTILINE)
        assert total and count, f"{name} missing from /metrics"
        out[name] = (float(total.group(1)), float(count.group(1)))
    return out


def server_delta_ms(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], name: str
) -> float:
    total = after[name][0] - before[name][0]
    count = after[name][1] - before[name][1]
    return 1000 * total / count if count else float("nan")


def decoding_rate(streams: Sequence[Stream]) -> float:
    """Events per second while every stream is decoding (after the last first token)."""
    start = max(s.token_times_s[0] for s in streams)
    end = min(s.token_times_s[-1] for s in streams)
    if end <= start:
        start = min(s.token_times_s[0] for s in streams)
        end = max(s.token_times_s[-1] for s in streams)
    events = sum(1 for s in streams for t in s.token_times_s if start < t <= end)
    return events / (end - start)


def latencies_ms(streams: Sequence[Stream]) -> tuple[float, float, float]:
    """Mean TTFT (from the send), mean and p99 of every inter-token gap."""
    ttft = [s.token_times_s[0] - s.sent_s for s in streams]
    gaps = sorted(
        b - a for s in streams for a, b in zip(s.token_times_s, s.token_times_s[1:], strict=False)
    )
    p99 = gaps[min(len(gaps) - 1, round(0.99 * (len(gaps) - 1)))]
    return 1000 * sum(ttft) / len(ttft), 1000 * sum(gaps) / len(gaps), 1000 * p99


def schedule(streams: int) -> list[ScheduledRequest]:
    prompt = " ".join(["w"] * PROMPT)
    return [
        ScheduledRequest(
            request_id=f"b{i}",
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


def run_locust(
    url: str, streams: int, processes: int, out_dir: Path
) -> tuple[list[Stream], float, float | None]:
    run = run_load(
        base_url=url,
        model=MODEL,
        schedule=schedule(streams),
        out_dir=out_dir,
        processes=processes,
        timeout_s=300,
        spawn=pinned_spawn(CLIENT_CPU),
    )
    records: list[RequestRecord] = list(read_records(run.records_path))
    bad = [r.error for r in records if not r.ok]
    if bad or len(records) != streams:
        raise RuntimeError(f"locust: {len(records)} records, errors {bad[:3]} (log {run.log_path})")
    cpu = sum(w.cpu_s for w in run.workers) / max(w.wall_s for w in run.workers) * 100
    lag = max((w.send_lag_p99_ms or 0.0) for w in run.workers)
    return [Stream(r.sent_s, r.token_times_s) for r in records], cpu, lag


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
    await asyncio.sleep(max(start_s + request.send_s - time.time(), 0))
    sent_s = time.time()
    times: list[float] = []
    async with session.post(f"{url}/v1/completions", json=body) as response:
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
    return Stream(sent_s, times)


async def aiohttp_all(url: str, streams: int) -> list[Stream]:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start_s = time.time() + 0.1
        return await asyncio.gather(
            *(aiohttp_stream(session, url, r, start_s) for r in schedule(streams))
        )


def run_aiohttp(url: str, streams: int) -> tuple[list[Stream], float, float | None]:
    cpu0, wall0 = time.process_time(), time.time()
    result = asyncio.run(aiohttp_all(url, streams))
    cpu = 100 * (time.process_time() - cpu0) / (time.time() - wall0)
    return result, cpu, None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default=",".join(map(str, STREAMS)), help="comma-separated N")
    parser.add_argument("--clients", default="aiohttp,locust,locust x2")
    args = parser.parse_args()
    levels = [int(n) for n in args.streams.split(",")]
    clients = [c.strip() for c in args.clients.split(",")]

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
    try:
        for _ in range(400):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        run_aiohttp(url, 4)  # warm up the server
        print(f"work dir {work}; server CPU {SERVER_CPU}, clients CPU {CLIENT_CPU}")
        header = (
            f"{'client':>10} {'streams':>7} {'events/s':>9} {'ideal':>7} {'ratio':>5} "
            f"{'cpu%':>5} {'TTFT ms':>8} {'server':>7} {'excess':>6} {'ITL ms':>7} "
            f"{'server':>7} {'ITLp99':>7} {'lag p99':>7} kept up"
        )
        print(header)
        for streams in levels:
            ideal = ideal_rate(streams)
            reference_error_ms: float | None = None
            for client in clients:
                before = histogram_means_ms(url)
                if client == "aiohttp":
                    got, cpu, lag = run_aiohttp(url, streams)
                else:
                    processes = 2 if client.endswith("x2") else 1
                    out_dir = work / f"{client.replace(' ', '')}-{streams}"
                    got, cpu, lag = run_locust(url, streams, processes, out_dir)
                after = histogram_means_ms(url)
                ttft, itl, itl_p99 = latencies_ms(got)
                server_ttft = server_delta_ms(before, after, "vllm:time_to_first_token_seconds")
                if reference_error_ms is None:  # the first client (aiohttp) is the reference
                    reference_error_ms = ttft - server_ttft
                row = Row(
                    client=client,
                    streams=streams,
                    events_per_s=decoding_rate(got),
                    ideal_per_s=ideal,
                    client_cpu_percent=cpu,
                    ttft_ms=ttft,
                    server_ttft_ms=server_ttft,
                    ttft_excess_ms=ttft - server_ttft - reference_error_ms,
                    itl_ms=itl,
                    server_itl_ms=server_delta_ms(
                        before, after, "vllm:inter_token_latency_seconds"
                    ),
                    itl_p99_ms=itl_p99,
                    send_lag_p99_ms=lag,
                )
                rows.append(row)
                print(
                    f"{client:>10} {streams:>7} {row.events_per_s:>9.0f} {ideal:>7.0f} "
                    f"{row.ratio:>5.2f} {cpu:>5.0f} {row.ttft_ms:>8.1f} {server_ttft:>7.1f} "
                    f"{row.ttft_excess_ms:>6.1f} {row.itl_ms:>7.2f} {row.server_itl_ms:>7.2f} "
                    f"{itl_p99:>7.2f} {'-' if lag is None else f'{lag:.1f}':>7} "
                    f"{'yes' if row.keeps_up else 'NO'}",
                    flush=True,
                )
        summary = {}
        for client in clients:
            kept = [r.events_per_s for r in rows if r.client == client and r.keeps_up]
            summary[client] = max(kept, default=0.0)
        print(
            "highest event rate kept up with (events/s): "
            + ", ".join(f"{c} {v:.0f}" for c, v in summary.items())
        )
        print(json.dumps({"rows": [asdict(r) for r in rows], "kept_up_events_per_s": summary}))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())

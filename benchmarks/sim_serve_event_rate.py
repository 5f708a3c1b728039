"""The largest streaming token-event rate `tuner sim-serve` sustains on one core.

Starts `tuner sim-serve` pinned to CPU 0 (Qwen2.5-7B on H100-80GB, decode steps of
a few milliseconds) and drives it from this process, pinned to CPU 1, with N
concurrent streaming requests of 200 output tokens (ignore_eos). For each N it
prints the token events per second the client received and the ratio to what the
virtual GPU would produce (N / step time at that batch): where the ratio falls
below 0.9 the server's single core can no longer keep the clock.
Run: ``python benchmarks/sim_serve_event_rate.py`` (Linux; uses os.sched_setaffinity).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from tuner.sim.build import build_engine
from tuner.sim.engine import SimRequest
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion

MODEL, GPU, MAX_LEN, OUTPUT, PROMPT = "qwen2.5-7b", "H100-80GB", 4096, 600, 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ideal_rate(concurrency: int) -> float:
    """Events/s of the same requests on the engine's virtual clock (no server, no client)."""
    model, gpu = resolve_model(MODEL), get_gpu(GPU)
    _, engine = build_engine(
        model, gpu, ServingParams(max_model_len=MAX_LEN), VllmVersion.current()
    )
    assert engine is not None
    for i in range(concurrency):
        engine.add_request(
            SimRequest(
                request_id=f"b{i}", prompt_token_ids=[7] * PROMPT, max_tokens=OUTPUT, arrival_s=0.0
            )
        )
    now, first_tokens_done, counted, start = 0.0, False, 0, 0.0
    while engine.has_work:
        result = engine.step(now)
        now += result.duration_s
        if first_tokens_done and len(result.events) == concurrency:
            counted += concurrency
        elif not first_tokens_done and all(r.first_token_s for r in engine.running):
            first_tokens_done, start = True, now
    return counted / (now - start)


async def one_stream(session: aiohttp.ClientSession, url: str) -> list[float]:
    body = {
        "model": MODEL,
        "prompt": " ".join(["w"] * PROMPT),
        "max_tokens": OUTPUT,
        "ignore_eos": True,
        "stream": True,
    }
    times: list[float] = []
    async with session.post(url, json=body) as response:
        async for line in response.content:
            if line.startswith(b"data: {"):
                times.append(time.perf_counter())
    return times


async def drive(url: str, concurrency: int) -> float:
    """Events per second while every stream is decoding (after the last first token)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        streams = await asyncio.gather(*(one_stream(session, url) for _ in range(concurrency)))
    start = max(times[0] for times in streams)
    end = min(times[-1] for times in streams)
    if end <= start:  # streams did not all overlap: fall back to the whole span
        start = min(times[0] for times in streams)
        end = max(times[-1] for times in streams)
    events = sum(1 for times in streams for t in times if start < t <= end)
    return events / (end - start)


def main() -> int:
    port = free_port()
    log = Path(tempfile.mkdtemp()) / "sim-serve.log"
    cmd = [
        sys.executable,
        "-m",
        "tuner.cli",
        "sim-serve",
        "--model",
        MODEL,
        "--gpu",
        GPU,
        "--max-model-len",
        str(MAX_LEN),
        "--port",
        str(port),
        "--startup-delay",
        "0",
        "--disable-uvicorn-access-log",
    ]
    with log.open("w") as out:
        server = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: os.sched_setaffinity(0, {0}),
        )
    os.sched_setaffinity(0, {1})
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.05)
        asyncio.run(drive(f"{base}/v1/completions", 4))  # warm up
        rows = []
        print(f"{'streams':>8} {'events/s':>10} {'virtual GPU events/s':>21} {'ratio':>6}")
        for concurrency in (8, 16, 32, 48, 64, 96, 128, 256):
            got = asyncio.run(drive(f"{base}/v1/completions", concurrency))
            ideal = ideal_rate(concurrency)
            rows.append({"streams": concurrency, "events_per_s": got, "ideal": ideal})
            print(f"{concurrency:>8} {got:>10.0f} {ideal:>21.0f} {got / ideal:>6.2f}")
        kept = [r for r in rows if r["events_per_s"] >= 0.9 * r["ideal"]]
        best = max((r["events_per_s"] for r in kept), default=0.0)
        print(f"largest sustained event rate on one core (ratio >= 0.9): {best:.0f} events/s")
        print(json.dumps({"rows": rows, "sustained_events_per_s": best}))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())

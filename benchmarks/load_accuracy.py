"""How accurately the Locust load generator measures, against the simulator's ground truth.

1. Accuracy at 32 concurrent streams: `tuner sim-serve` (CPU 0) records when each
   request arrived and when each token was handed to its stream (`/sim/requests`);
   Locust (CPU 1) measures the same requests. Compared per request: TTFT (client:
   first token − sent; server: first token − arrival) and every inter-token gap.
   Target: within 2 ms at p50 and 5 ms at p99; achieved request rate within 2% of
   the offered rate.
2. A 10 s server stall (`POST /sim/stall`) in the middle of a Poisson run: the
   offered load must not drop (requests keep leaving on schedule).

Run: ``python benchmarks/load_accuracy.py`` (Linux; pins CPUs with sched_setaffinity).
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from workloads.metrics import LoadResult
from workloads.runner import run_load
from workloads.schedule import Api, RequestRecord, ScheduledRequest, read_records

MODEL = "qwen2.5-7b"


def start_server(port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tuner.cli", "sim-serve", "--model", MODEL, "--gpu", "H100-80GB",
           "--max-model-len", "4096", "--port", str(port), "--startup-delay", "0",
           "--disable-uvicorn-access-log"]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: os.sched_setaffinity(0, {0}))  # fmt: skip
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"sim-serve did not start; see {log}")


def poisson(
    rate: float, duration_s: float, output_tokens: int, seed: int
) -> list[ScheduledRequest]:
    rng = random.Random(seed)
    t, out = rng.expovariate(rate), []
    while t < duration_s:
        out.append(ScheduledRequest(request_id=f"r{seed}-{len(out)}", send_s=t, api=Api.COMPLETIONS,
                                    prompt_tokens=64, max_tokens=output_tokens,
                                    prompt=" ".join(["w"] * 64)))  # fmt: skip
        t += rng.expovariate(rate)
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


def accuracy(base: str, out_dir: Path) -> None:
    # 200 tokens at ~7.5 ms a step is ~1.5 s per request: 21 req/s keeps ~32 streams open.
    schedule = poisson(21.0, 20.0, 200, seed=1)
    run = run_load(base_url=base, model=MODEL, schedule=schedule, out_dir=out_dir)
    truth = {
        t["request_id"]: t
        for t in json.loads(urllib.request.urlopen(base + "/sim/requests").read())["requests"]
    }
    ttft_err, itl_err, concurrency = [], [], []
    to_server, delivery = [], []
    records: list[RequestRecord] = list(read_records(run.records_path))
    for r in records:
        server = truth.get(r.request_id)
        if server is None or not r.token_times_s or not r.ok:
            continue
        client_ttft = r.token_times_s[0] - r.sent_s
        server_ttft = server["token_times_s"][0] - server["arrival_s"]
        ttft_err.append(abs(client_ttft - server_ttft) * 1000)
        to_server.append((server["arrival_s"] - r.sent_s) * 1000)
        delivery.append((r.token_times_s[0] - server["token_times_s"][0]) * 1000)
        cg = [b - a for a, b in zip(r.token_times_s, r.token_times_s[1:], strict=False)]
        sg = [
            b - a
            for a, b in zip(server["token_times_s"], server["token_times_s"][1:], strict=False)
        ]
        itl_err += [abs(c - s) * 1000 for c, s in zip(cg, sg, strict=False)]
    starts = sorted((r.sent_s, 1) for r in records) + sorted(
        (r.end_s or r.sent_s, -1) for r in records
    )
    level = 0
    for _, step in sorted(starts):
        level += step
        concurrency.append(level)
    result = LoadResult.from_records(records, window_s=20.0)
    print(
        f"[accuracy] {len(ttft_err)} requests matched, mean concurrency {statistics.fmean(concurrency):.1f}"
    )
    print(
        f"  TTFT |client - server|  p50 {pct(ttft_err, 0.5):.2f} ms  p99 {pct(ttft_err, 0.99):.2f} ms  (target 2 / 5 ms)"
    )
    print(
        f"    of which: sent -> server arrival p50 {pct(to_server, 0.5):.2f} ms p99 {pct(to_server, 0.99):.2f} ms; "
        f"first token handed over -> seen by client p50 {pct(delivery, 0.5):.2f} ms p99 {pct(delivery, 0.99):.2f} ms"
    )
    print(
        f"  ITL  |client - server|  p50 {pct(itl_err, 0.5):.2f} ms  p99 {pct(itl_err, 0.99):.2f} ms  (target 2 / 5 ms)"
    )
    offered, achieved = result.offered_rate or 0.0, result.achieved_rate or 0.0
    print(
        f"  rate offered {offered:.2f}/s, achieved {achieved:.2f}/s ({achieved / offered - 1:+.1%}; target within 2%)"
    )
    print(f"  client saturated: {run.client_saturated} {run.saturation_reason or ''}")


def stall(base: str, out_dir: Path) -> None:
    schedule = poisson(10.0, 30.0, 32, seed=2)

    def freeze() -> None:
        time.sleep(3.5 + 10.0)  # Locust's start lead is ~3.5 s; stall from t = 10 s to 20 s
        body = json.dumps({"seconds": 10}).encode()
        urllib.request.urlopen(
            urllib.request.Request(base + "/sim/stall", data=body, method="POST")
        )

    threading.Thread(target=freeze, daemon=True).start()
    run = run_load(base_url=base, model=MODEL, schedule=schedule, out_dir=out_dir)
    records = list(read_records(run.records_path))
    origin = run.start_at_s

    def sent_rate(lo: float, hi: float) -> float:
        return sum(1 for r in records if lo <= r.sent_s - origin < hi) / (hi - lo)

    lags = [
        (r.sent_s - r.scheduled_s) * 1000 for r in records if 10.5 <= r.scheduled_s - origin < 19.5
    ]
    planned = sum(1 for s in schedule if 10.5 <= s.send_s < 19.5) / 9.0
    print("[stall] server frozen 10 s from t=10 s; requests sent per second:")
    print(
        f"  before {sent_rate(0, 10):.2f}/s, during {sent_rate(10.5, 19.5):.2f}/s (planned {planned:.2f}/s), after {sent_rate(20, 30):.2f}/s"
    )
    print(
        f"  send lag during the stall: p50 {pct(lags, 0.5):.2f} ms, p99 {pct(lags, 0.99):.2f} ms, max {max(lags):.2f} ms"
    )


def main() -> int:
    from tuner.server import free_port

    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="load-accuracy-"))
    server = start_server(port, tmp / "sim.log")
    os.sched_setaffinity(0, {1})
    base = f"http://127.0.0.1:{port}"
    try:
        accuracy(base, tmp / "accuracy")
        stall(base, tmp / "stall")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())

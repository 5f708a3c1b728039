"""A switch-over rehearsal on the simulated engine: from one version to the next, no request lost.

The steps of a Kubernetes rollout, in order, with `SwitchProxy` as the Service:

    old serves the load            sim-serve behind the proxy; the product's load path
                                   (Locust, open loop, streaming) runs for the whole test
    new starts, becomes ready      another sim-serve with other settings; /health answers
    new joins the endpoints        proxy.add: both versions answer
    old leaves the endpoints       proxy.remove: its requests in flight carry on
    old drains (preStop)           the drain program (tuner.drain) against old's /metrics
    old gets SIGTERM               only once the drain returned
    the load goes on               on new alone
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.integration.simserver import SimServer, start_sim
from tests.integration.switch_proxy import SwitchProxy
from tuner.drain import drain_script
from workloads.runner import run_load
from workloads.schedule import Api, ScheduledRequest, read_records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

MODEL = "qwen2.5-7b"
# 10 times slower than the virtual GPU: a 24-token answer streams for about 1.7 s, so
# several requests are in flight on the old version when it leaves.
SIM = ("--model", MODEL, "--gpu", "H100-80GB", "--max-model-len", "4096", "--time-scale", "10")
RATE_PER_S = 5.0
LOAD_S = 24.0
OUTPUT_TOKENS = 24
PROMPT_WORDS = 40


def steady_schedule() -> list[ScheduledRequest]:
    """Evenly spaced streaming requests, completions and chat in turn."""
    words = " ".join(f"w{k}" for k in range(PROMPT_WORDS))
    schedule = []
    for i in range(int(LOAD_S * RATE_PER_S)):
        chat = i % 2 == 1
        schedule.append(
            ScheduledRequest(
                request_id=f"r{i:03d}",
                send_s=i / RATE_PER_S,
                api=Api.CHAT if chat else Api.COMPLETIONS,
                prompt_tokens=PROMPT_WORDS,
                max_tokens=OUTPUT_TOKENS,
                prompt=None if chat else words,
                messages=[{"role": "user", "content": words}] if chat else None,
            )
        )
    return schedule


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {timeout_s} s")
        time.sleep(0.05)


def test_switch_over_drops_no_request(tmp_path: Path) -> None:
    script = tmp_path / "drain.py"
    script.write_text(drain_script())
    drain_log = tmp_path / "drain.log"
    schedule = steady_schedule()
    servers: list[SimServer] = []
    try:
        old = start_sim((*SIM, "--max-num-seqs", "64"), tmp_path / "old.log")
        servers.append(old)
        with SwitchProxy() as proxy, ThreadPoolExecutor(max_workers=1) as pool:
            proxy.add("old", old.url)
            load = pool.submit(
                run_load,
                base_url=proxy.url,
                model=MODEL,
                schedule=schedule,
                out_dir=tmp_path / "load",
                timeout_s=60.0,
            )
            wait_for(lambda: proxy.completed("old") >= 3, "the load reaches old", 40.0)

            new = start_sim((*SIM, "--max-num-seqs", "32"), tmp_path / "new.log")
            servers.append(new)
            proxy.add("new", new.url)
            wait_for(lambda: proxy.completed("new") >= 3, "new answers", 20.0)

            removed_s = proxy.remove("old")
            in_flight_at_removal = proxy.in_flight("old")
            drain = subprocess.run(
                [sys.executable, "-I", "-S", str(script), "--url", old.url,
                 "--settle-s", "1", "--poll-s", "0.2", "--bound-s", "30", "--log", str(drain_log)],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            drained_s = time.time()
            truth = httpx.get(f"{old.url}/sim/requests", timeout=5.0).json()["requests"]
            old.stop()
            stopped_s = time.time()
            run = load.result(timeout=120)
    finally:
        for server in servers:
            server.stop()

    # Every request sent got its whole answer: none failed, none missing.
    records = list(read_records(run.records_path))
    assert (run.exit_code, run.killed, run.num_missing) == (0, False, 0), run.log_path
    assert sorted(r.request_id for r in records) == [s.request_id for s in schedule]
    assert [r for r in records if not r.ok] == []
    assert {r.output_tokens for r in records} == {OUTPUT_TOKENS}
    # ... and went through the proxy once, answered whole there too.
    assert all(f.complete and f.status == 200 and f.error is None for f in proxy.forwarded)
    sent = [f for f in proxy.forwarded if f.method == "POST"]
    assert sorted(f.request_id or "" for f in sent) == [s.request_id for s in schedule]

    # Both versions answered; the load went on over new alone after old stopped.
    on_old = [f for f in sent if f.backend == "old"]
    assert on_old and any(f.backend == "new" for f in sent)
    after = [f for f in sent if f.chosen_s > stopped_s]
    assert len(after) >= 10 and {f.backend for f in after} == {"new"}

    # Old received nothing after it left the endpoints: what it served (its own record)
    # is exactly what the proxy sent it before the removal.
    assert all(f.chosen_s < removed_s for f in on_old)
    assert {t["request_id"] for t in truth} == {f.request_id for f in on_old}

    # The drain had requests to wait for, and returned only once they had all ended.
    assert drain.returncode == 0 and drain.stdout == drain.stderr == "", drain.stderr
    lines = drain_log.read_text().splitlines()
    first = re.search(r"preStop drain: (\d+) running, (\d+) waiting;", lines[0])
    assert first and int(first[1]) + int(first[2]) > 0, lines[0]
    assert "preStop drain: drained: 0 running, 0 waiting after " in lines[-1]
    assert in_flight_at_removal > 0
    assert any(f.ended_s is not None and f.ended_s > removed_s for f in on_old)
    assert all(f.ended_s is not None and f.ended_s <= drained_s for f in on_old)

"""The preStop drain program against `tuner sim-serve`: it waits for what is in flight.

The program runs as the pod runs it: its own file, a fresh interpreter without site
packages (``-I -S``: the standard library only), its lines in a log file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.integration.simserver import SimServer, spawn_sim
from tuner.drain import drain_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# A clock 20 times slower than the virtual GPU's: about 0.14 s a token.
SIM = ("--model", "qwen2.5-7b", "--gpu", "H100-80GB", "--max-model-len", "4096")
SLOW = ("--time-scale", "20")
SLACK_S = 2.0  # interpreter start and one last read past the bound


@dataclass(frozen=True)
class DrainRun:
    """One run of the program: when it was started and seen to exit (time.monotonic()),
    and the lines it wrote."""

    started_s: float
    exited_s: float
    lines: list[str]

    @property
    def took_s(self) -> float:
        return self.exited_s - self.started_s


RunDrain = Callable[..., DrainRun]


@dataclass
class Streamed:
    """One streaming completion sent from a thread: what came back, and when it ended."""

    max_tokens: int
    tokens: int = 0
    done: bool = False  # the whole stream, [DONE] included
    error: str | None = None
    ended_s: float | None = None  # time.monotonic()


def stream_completion(url: str, streamed: Streamed) -> None:
    body = {
        "model": "qwen2.5-7b",
        "prompt": "drain " * 20,
        "max_tokens": streamed.max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60.0) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    streamed.done = True
                elif line.startswith("data: "):
                    streamed.tokens += len(json.loads(line[6:])["choices"])
    except (httpx.HTTPError, ValueError) as exc:
        streamed.error = repr(exc)
    finally:
        streamed.ended_s = time.monotonic()


def send_in_background(
    url: str, max_tokens: tuple[int, ...]
) -> list[tuple[Streamed, threading.Thread]]:
    sent = []
    for n in max_tokens:
        streamed = Streamed(n)
        thread = threading.Thread(target=stream_completion, args=(url, streamed), daemon=True)
        thread.start()
        sent.append((streamed, thread))
    return sent


def gauges(server: SimServer) -> tuple[int, int]:
    running = server.counter("vllm:num_requests_running")
    waiting = server.counter("vllm:num_requests_waiting")
    return int(running), int(waiting)


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {timeout_s} s")
        time.sleep(0.05)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SimServer]:
    """A slow simulated engine that runs two requests at a time."""
    sim = spawn_sim((*SIM, *SLOW, "--max-num-seqs", "2"), tmp_path / "sim-serve.log")
    try:
        sim.wait_healthy()
        yield sim
    finally:
        sim.stop()


@pytest.fixture
def run_drain(tmp_path: Path) -> RunDrain:
    """Run the program (from its own file) on a server's URL, its lines to a log file."""
    script = tmp_path / "drain.py"
    script.write_text(drain_script())

    def run(url: str, *args: str) -> DrainRun:
        log = tmp_path / "drain.log"
        started_s = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-I", "-S", str(script), "--url", url, "--log", str(log), *args],
            capture_output=True,
            text=True,
            timeout=45,
        )
        exited_s = time.monotonic()
        assert done.returncode == 0, done.stderr
        assert done.stdout == "" and done.stderr == ""  # everything went to --log
        return DrainRun(started_s, exited_s, log.read_text().splitlines())

    return run


def test_returns_once_every_request_in_flight_finished(
    server: SimServer, run_drain: RunDrain
) -> None:
    # Two run at a time: the third waits for the first to finish. Sent one at a time, each
    # seen by the server before the next, so that they arrive in this order: the 20-token
    # one ends first (~2.8 s), the 12-token one takes its place, and two run for ~1.7 s (a
    # 0.2 s poll sees it) until the 12-token one ends, ~1 s before the 40-token one.
    sent = []
    for max_tokens, seen in ((20, (1, 0)), (40, (2, 0)), (12, (2, 1))):
        sent += send_in_background(server.url, (max_tokens,))
        wait_for(lambda seen=seen: gauges(server) == seen, f"{seen[0]} running, {seen[1]} waiting")
    drain = run_drain(server.url, "--settle-s", "0.5", "--poll-s", "0.2", "--bound-s", "30")

    for streamed, thread in sent:
        thread.join(timeout=5)
        assert streamed.done and streamed.error is None, streamed
        assert streamed.tokens == streamed.max_tokens
        assert streamed.ended_s is not None and streamed.ended_s < drain.exited_s
    # It had something to wait for: the longest request ended well after the settle.
    assert max(s.ended_s or 0 for s, _ in sent) > drain.started_s + 1.5

    lines = drain.lines
    assert "preStop drain: 2 running, 1 waiting; waiting 0.5 s" in lines[0]
    assert lines[-1].startswith("INFO ")
    assert "[drain.py] preStop drain: drained: 0 running, 0 waiting after " in lines[-1]
    said = "\n".join(lines[1:-1])
    assert "2 running, 0 waiting after" in said  # the third one started
    assert "1 running, 0 waiting after" in said
    assert gauges(server) == (0, 0)


def test_returns_at_its_bound_when_the_engine_is_stalled(
    server: SimServer, run_drain: RunDrain
) -> None:
    sent = send_in_background(server.url, (40, 40))
    wait_for(lambda: gauges(server) == (2, 0), "2 running")
    httpx.post(f"{server.url}/sim/stall", json={"seconds": 60}, timeout=5).raise_for_status()
    drain = run_drain(server.url, "--settle-s", "0.5", "--poll-s", "0.2", "--bound-s", "3")

    assert 3.0 <= drain.took_s < 3.0 + SLACK_S
    assert all(not streamed.done for streamed, _ in sent)
    lines = drain.lines
    assert lines[0].endswith(
        "preStop drain: 2 running, 0 waiting; waiting 0.5 s for the endpoints to drop this "
        "pod, then until none is left (at most 3 s in all)"
    )
    assert lines[-1].startswith("WARNING ")
    assert lines[-1].endswith(
        "[drain.py] preStop drain: bound of 3 s reached with 2 running, 0 waiting: "
        "leaving them to SIGTERM"
    )
    assert len(lines) == 2  # nothing changed between
    server.stop()  # the streams end with the server, before the threads are left
    for _, thread in sent:
        thread.join(timeout=10)
        assert not thread.is_alive()

"""The twin's share of later turns' prefix misses that were evictions of a conversation
still under way, against a real `tuner sim-serve` on the same schedule (sent by the load
generator, later turns at their answers plus the think time).

Tolerance: the two run the same engine, but the server's steps follow the wall clock and
the load generator's sends land a few milliseconds late, so which blocks a short request
evicts first can differ; over a few hundred missed blocks the shares agree within
``TOLERANCE`` (0.15 absolute)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.simserver import SimServer, start_sim
from tuner.sim.build import SimOptions
from tuner.twin.prediction import Setup, simulate_schedule
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion
from workloads.runner import run_load
from workloads.schedule import Api, ScheduledRequest, read_records
from workloads.slo import Slo

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MODEL = "qwen2.5-7b"
MAX_MODEL_LEN = 1024
BLOCK_BYTES = 917504  # one 16-token block of qwen2.5-7b
TOLERANCE = 0.15


def words(stem: str, n: int) -> str:
    return " ".join(f"{stem}{k}" for k in range(n))


def conversations_and_singles() -> list[ScheduledRequest]:
    """Four conversations of three turns (a 200-word opening, 80 words a later turn, the
    planned answers in the history) and, between their turns, 40 one-off requests of 150
    words."""
    schedule: list[ScheduledRequest] = []
    for c in range(4):
        history: list[dict[str, str]] = []
        for turn in range(3):
            user = words(f"c{c}t{turn}w", 200 if turn == 0 else 80)
            messages = [*history, {"role": "user", "content": user}]
            schedule.append(
                ScheduledRequest(
                    request_id=f"c{c}-{turn}", send_s=0.1 * c + 2.0 * turn, api=Api.CHAT,
                    prompt_tokens=sum(len(m["content"].split()) for m in messages),
                    max_tokens=16, messages=messages, session_id=f"c{c}", turn=turn,
                    follows=f"c{c}-{turn - 1}" if turn else None, think_time_s=1.5,
                )
            )  # fmt: skip
            history = [*messages, {"role": "assistant", "content": words(f"c{c}t{turn}a", 16)}]
    for i in range(40):
        schedule.append(
            ScheduledRequest(
                request_id=f"s{i}", send_s=0.5 + 0.1 * i, api=Api.COMPLETIONS,
                prompt_tokens=150, max_tokens=8, prompt=words(f"s{i}w", 150),
            )
        )  # fmt: skip
    return sorted(schedule, key=lambda r: r.send_s)


def share_of(metrics: str) -> float | None:
    """The share from sim-serve's tuner_sim: series: of the tokens later turns missed,
    their own history evicted while under way."""
    by_cause: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith("tuner_sim:prefix_cache_miss_tokens_total{"):
            labels, _, value = line.rpartition(" ")
            if 'request="continuing"' in labels:
                cause = re.search(r'cause="([a-z_]+)"', labels)
                assert cause
                by_cause[cause.group(1)] = float(value)
    assert set(by_cause) == {"evicted_under_way", "evicted", "new"}, metrics
    total = sum(by_cause.values())
    return by_cause["evicted_under_way"] / total if total else None


@pytest.fixture(params=[80, 2000], ids=["small-cache", "roomy-cache"])
def blocks(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
def sim(blocks: int, tmp_path: Path) -> Iterator[SimServer]:
    server = start_sim(
        (
            "--model", MODEL, "--max-model-len", str(MAX_MODEL_LEN),
            "--kv-cache-memory-bytes", str(blocks * BLOCK_BYTES), "--kv-cache-metrics",
        ),
        tmp_path / "sim-serve.log",
    )  # fmt: skip
    yield server
    server.stop()


def test_the_twins_share_is_the_simulated_servers(
    sim: SimServer, blocks: int, tmp_path: Path
) -> None:
    schedule = conversations_and_singles()
    run = run_load(base_url=sim.url, model=MODEL, schedule=schedule, out_dir=tmp_path / "load")
    records = list(read_records(run.records_path))
    assert len(records) == len(schedule) and all(r.ok for r in records), run.log_path.read_text()
    measured = share_of(sim.metrics())
    setup = Setup(
        resolve_model(MODEL), get_gpu("H100-80GB"), VllmVersion.current(),
        ServingParams(max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=blocks * BLOCK_BYTES),
        options=SimOptions(),
    )  # fmt: skip
    _, result = simulate_schedule(setup, schedule, Slo())
    assert result is not None
    twin = result.evicted_under_way_share
    assert measured is not None and twin is not None
    if blocks == 80:  # the conversations' history is lost to the one-off requests
        assert measured > 0.5 and twin > 0.5
    else:  # every later turn finds its history: only its new message misses
        assert measured == 0.0 and twin == 0.0
    assert abs(twin - measured) <= TOLERANCE, (twin, measured)

"""Multi-turn sessions against `tuner sim-serve`: a later turn goes out when the answer it
extends has arrived, plus the think time, whatever its planned send time said."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.simserver import SimServer
from tests.integration.test_locust_load import MODEL, start_sim
from workloads.load_errors import STOPPED_BEFORE_SEND
from workloads.runner import LoadRun, run_load, startup_lead_s
from workloads.schedule import (
    Api,
    RequestRecord,
    ScheduledRequest,
    read_records,
    read_schedule,
    share_of,
)

# Only the test that bounds how late a send is runs with the timing tests, alone after the
# parallel part of make test; the others check what is recorded, with bounds of seconds.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PROMPT_WORDS = 60
SEND_SLACK_S = 0.002  # clock reads around the send
LATE_SEND_S = 0.05  # a due turn goes out within this (loaded 2-core CI machine)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    server = start_sim(tmp_path_factory.mktemp("sim"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def slow_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """A clock 20 times slower and two sequences at a time: answers take seconds."""
    server = start_sim(
        tmp_path_factory.mktemp("slow-sim"), "--time-scale", "20", "--max-num-seqs", "2"
    )
    yield server
    server.stop()


def session(
    name: str,
    first_s: float,
    *,
    turns: int,
    step_s: float,
    think_s: float | list[float],
    max_tokens: int = 16,
) -> list[ScheduledRequest]:
    """A chat session planned ``step_s`` apart; turn n > 0 follows turn n - 1."""
    thinks = think_s if isinstance(think_s, list) else [think_s] * turns
    words = " ".join(f"{name}{k}" for k in range(PROMPT_WORDS))
    return [
        ScheduledRequest(
            request_id=f"{name}-{turn}",
            send_s=first_s + turn * step_s,
            api=Api.CHAT,
            prompt_tokens=PROMPT_WORDS + 1,
            max_tokens=max_tokens,
            messages=[{"role": "user", "content": words}],
            session_id=name,
            turn=turn,
            follows=f"{name}-{turn - 1}" if turn else None,
            think_time_s=thinks[turn],
        )
        for turn in range(turns)
    ]


def single(request_id: str, send_s: float, max_tokens: int = 16) -> ScheduledRequest:
    words = " ".join(f"{request_id}{k}" for k in range(PROMPT_WORDS))
    return ScheduledRequest(
        request_id=request_id, send_s=send_s, api=Api.COMPLETIONS,
        prompt_tokens=PROMPT_WORDS, max_tokens=max_tokens, prompt=words,
    )  # fmt: skip


def records_of(run: LoadRun) -> dict[str, RequestRecord]:
    records = {r.request_id: r for r in read_records(run.records_path)}
    assert run.exit_code == 0 and not run.killed, run.log_path.read_text()[-3000:]
    assert run.num_missing == 0
    return records


def check_follower(
    record: RequestRecord, before: RequestRecord, think_s: float, late_s: float = LATE_SEND_S
) -> None:
    """Due at the answer it extends plus the think time, and sent then."""
    assert before.end_s is not None
    assert record.answer_s == pytest.approx(before.end_s, abs=1e-6)
    assert record.scheduled_s == pytest.approx(before.end_s + think_s, abs=1e-6)
    assert record.sent_s >= before.end_s + think_s - SEND_SLACK_S
    assert record.sent_s - record.scheduled_s < late_s


@pytest.mark.timing
def test_slow_answers_delay_the_next_turn(slow_sim: SimServer, tmp_path: Path) -> None:
    """The plan spaces turns 0.3 s apart; each answer takes seconds, and the next turn
    waits for it. Single requests and first turns still go out on time."""
    schedule = sorted(
        [
            *session("a", 0.0, turns=3, step_s=0.3, think_s=0.2),
            *session("b", 0.1, turns=2, step_s=0.3, think_s=0.4),
            single("s0", 0.05),
            single("s1", 0.5),
        ],
        key=lambda r: r.send_s,
    )
    run = run_load(base_url=slow_sim.url, model=MODEL, schedule=schedule, out_dir=tmp_path)
    records = records_of(run)
    assert set(records) == {r.request_id for r in schedule}
    assert all(r.ok for r in records.values()), [r.error for r in records.values()]
    for request in schedule:
        record = records[request.request_id]
        planned_s = run.start_at_s + request.send_s
        if request.follows is None:  # open loop: at its send time, whatever the server does
            assert record.answer_s is None
            assert record.scheduled_s == pytest.approx(planned_s, abs=1e-6)
            assert 0.0 <= record.sent_s - planned_s < LATE_SEND_S
            continue
        before = records[request.follows]
        assert before.end_s is not None and before.end_s - before.sent_s > 1.0  # a slow answer
        check_follower(record, before, request.think_time_s)
        assert record.sent_s > planned_s + 0.5  # far later than its plan
        assert record.end_s is not None and record.end_s - record.scheduled_s < 10.0


def test_fast_answers_bring_the_next_turn_forward(sim: SimServer, tmp_path: Path) -> None:
    """The plan expects 3 s per turn; the answers take a fraction of that."""
    schedule = session("fast", 0.0, turns=3, step_s=3.0, think_s=0.3)
    run = run_load(base_url=sim.url, model=MODEL, schedule=schedule, out_dir=tmp_path)
    records = records_of(run)
    assert len(records) == 3 and all(r.ok for r in records.values())
    for request in schedule[1:]:
        record = records[request.request_id]
        assert request.follows is not None
        check_follower(record, records[request.follows], request.think_time_s)
        assert record.sent_s < run.start_at_s + request.send_s - 1.0  # earlier than planned
    (stats,) = run.workers
    assert (stats.scheduled, stats.sent, stats.turns_after_window) == (3, 3, 0)
    assert run.wall_s < 20.0  # the run ended with the last answer, not at the plan's pace


def test_two_processes_keep_each_session_on_one(sim: SimServer, tmp_path: Path) -> None:
    """Units in send order c0 c1 s0 c2 c3 s1: each process gets two sessions and a single."""
    schedule = sorted(
        [
            *(
                r
                for k in range(4)
                for r in session(
                    f"c{k}", 0.1 * k + 0.05 * (k // 2), turns=3, step_s=1.0, think_s=0.2
                )
            ),
            single("s0", 0.12),
            single("s1", 0.4),
        ],
        key=lambda r: r.send_s,
    )
    run = run_load(base_url=sim.url, model=MODEL, schedule=schedule, out_dir=tmp_path, processes=2)
    records = records_of(run)
    assert set(records) == {r.request_id for r in schedule}
    assert all(r.ok for r in records.values()), [r.error for r in records.values()]
    for k in range(4):
        workers = {records[f"c{k}-{turn}"].worker for turn in range(3)}
        assert len(workers) == 1, (k, workers)
    for index in range(2):  # every process sent exactly the share the other agrees it has
        mine = {r.request_id for r in records.values() if r.worker == f"w{index}"}
        assert mine == {r.request_id for r in share_of(schedule, index, 2)}
        assert len(mine) == 7
    for request in schedule:
        if request.follows is not None:
            # Three Locust processes and the server on two cores: a send may wait for one.
            check_follower(
                records[request.request_id],
                records[request.follows],
                request.think_time_s,
                late_s=0.25,
            )


def test_turns_after_the_window_are_not_sent(sim: SimServer, tmp_path: Path) -> None:
    """Turn 2 would follow its answer by 5 s, past the window's end at 3 s: neither it
    nor turn 3 after it is sent or recorded; they are counted."""
    schedule = session("w", 0.0, turns=4, step_s=0.5, think_s=[0.0, 0.2, 5.0, 0.2])
    run = run_load(
        base_url=sim.url, model=MODEL, schedule=schedule, out_dir=tmp_path, turns_until_s=3.0
    )
    records = records_of(run)
    assert set(records) == {"w-0", "w-1"}
    assert all(r.ok for r in records.values())
    check_follower(records["w-1"], records["w-0"], 0.2)
    (stats,) = run.workers
    assert (stats.scheduled, stats.sent, stats.turns_after_window) == (4, 2, 2)
    assert run.turns_after_window == 2 and run.num_records == 2
    truth = httpx.get(f"{sim.url}/sim/requests").json()["requests"]
    assert not {t["request_id"] for t in truth} & {"w-2", "w-3"}
    # Done once the chain is: not held until turn 2's time or the plan's end.
    assert run.wall_s < 20.0


def test_a_stop_records_the_turns_still_to_come(sim: SimServer, tmp_path: Path) -> None:
    """Stopped while turn 1 thinks: it is recorded not sent at the time it was due (after
    turn 0's answer), and turn 2, whose answer to extend never came, at the stop (its
    plan was earlier, but without that answer it was never due)."""
    schedule = session("t", 0.0, turns=3, step_s=0.5, think_s=[0.0, 30.0, 0.2])
    stop_at = time.time() + startup_lead_s(1) + 2.0
    run = run_load(
        base_url=sim.url,
        model=MODEL,
        schedule=schedule,
        out_dir=tmp_path,
        stop_when=lambda: time.time() > stop_at,
    )
    records = {r.request_id: r for r in read_records(run.records_path)}
    assert set(records) == {"t-0", "t-1", "t-2"}, run.log_path.read_text()[-3000:]
    first, waiting, later = records["t-0"], records["t-1"], records["t-2"]
    assert first.ok and first.end_s is not None
    assert waiting.error == later.error == STOPPED_BEFORE_SEND
    assert waiting.answer_s == pytest.approx(first.end_s, abs=1e-6)
    assert waiting.scheduled_s == pytest.approx(first.end_s + 30.0, abs=1e-6)
    assert later.answer_s is None
    assert later.scheduled_s > run.start_at_s + 1.5  # not its plan (offset 1.0)
    assert later.scheduled_s == pytest.approx(later.sent_s, abs=0.5)  # the stop
    (stats,) = run.workers
    assert (stats.sent, stats.not_sent_stopped, stats.stopped_early) == (1, 2, True)
    # the schedule kept is what the run sent: the two turns never sent are not in it
    assert [r.request_id for r in read_schedule(run.schedule_path)] == ["t-0"]

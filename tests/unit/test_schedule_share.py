"""Shares by session, later-turn bounds and the records' answer time, without processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workloads.load_errors import LoadConfigError
from workloads.remote import Share
from workloads.runner import _locust_env, _validate, latest_send_s
from workloads.schedule import Api, RequestRecord, ScheduledRequest, share_of


def request(
    request_id: str,
    send_s: float,
    *,
    session: str | None = None,
    follows: str | None = None,
    think_s: float = 0.0,
) -> ScheduledRequest:
    return ScheduledRequest(
        request_id=request_id, send_s=send_s, api=Api.COMPLETIONS, prompt_tokens=1,
        max_tokens=1, prompt="a", session_id=session, follows=follows, think_time_s=think_s,
    )  # fmt: skip


def ids(requests: list[ScheduledRequest]) -> list[str]:
    return [r.request_id for r in requests]


def test_without_sessions_request_i_goes_to_i_mod_count() -> None:
    schedule = [request(f"r{i}", 0.1 * i) for i in range(10)]
    for count in (1, 2, 3):
        for index in range(count):
            assert share_of(schedule, index, count) == schedule[index::count]


def test_a_session_goes_whole_to_the_process_of_its_first_turn() -> None:
    # Units in send order: a (0.0), s0 (0.1), b (0.2), s1 (0.3), c (0.5).
    schedule = [
        request("a-0", 0.0, session="a"),
        request("s0", 0.1),
        request("b-0", 0.2, session="b"),
        request("s1", 0.3),
        request("a-1", 0.4, session="a", follows="a-0"),
        request("c-0", 0.5, session="c"),
        request("b-1", 0.6, session="b", follows="b-0"),
        request("a-2", 0.7, session="a", follows="a-1"),
    ]
    assert ids(share_of(schedule, 0, 2)) == ["a-0", "b-0", "a-1", "c-0", "b-1", "a-2"]
    assert ids(share_of(schedule, 1, 2)) == ["s0", "s1"]
    assert ids(share_of(schedule, 0, 3)) == ["a-0", "s1", "a-1", "a-2"]
    assert ids(share_of(schedule, 1, 3)) == ["s0", "c-0"]
    assert ids(share_of(schedule, 2, 3)) == ["b-0", "b-1"]
    # Every request in exactly one share, each share in send order.
    for count in (1, 2, 3, 5):
        shares = [share_of(schedule, index, count) for index in range(count)]
        assert sorted(r for share in shares for r in ids(share)) == sorted(ids(schedule))
        assert all(s == sorted(s, key=lambda r: r.send_s) for s in shares)


def test_shares_follow_send_order_not_file_order() -> None:
    schedule = [request("late", 1.0), request("early", 0.0)]
    assert ids(share_of(schedule, 0, 2)) == ["early"]
    assert ids(share_of(schedule, 1, 2)) == ["late"]


@pytest.mark.parametrize(("index", "count"), [(0, 0), (2, 2), (-1, 2)])
def test_a_share_out_of_range_is_refused(index: int, count: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        share_of([request("r", 0.0)], index, count)


def test_records_without_an_answer_time_still_read() -> None:
    old = {
        "request_id": "r1", "scheduled_s": 1.0, "sent_s": 1.001, "prompt_tokens": 3,
        "output_tokens": 2, "status": 200, "first_token_s": 1.1, "end_s": 1.2,
        "token_times_s": [1.1, 1.2], "error": None, "warmup": False, "worker": "w0",
        "streamed": True,
    }  # fmt: skip
    record = RequestRecord.from_json(json.dumps(old))
    assert record.answer_s is None
    later = RequestRecord(
        request_id="r2", scheduled_s=3.5, sent_s=3.5, prompt_tokens=5, output_tokens=0,
        status=0, answer_s=1.2,
    )  # fmt: skip
    assert RequestRecord.from_json(later.to_json()) == later


def test_latest_send_bounds_the_chains_of_turns() -> None:
    schedule = [
        request("a-0", 0.0, session="a"),
        request("a-1", 0.5, session="a", follows="a-0", think_s=2.0),
        request("a-2", 1.0, session="a", follows="a-1", think_s=3.0),
        request("s", 4.0),
        # Its turn before was a warm-up's, not in this schedule: sent at its plan.
        request("w-5", 2.0, session="w", follows="w-4", think_s=1.0),
    ]
    # a-2: a-0's answer within 10 s, think 2; a-1's within 10 s, think 3.
    assert latest_send_s(schedule, 10.0, None) == pytest.approx(25.0)
    assert latest_send_s(schedule, 10.0, 9.0) == pytest.approx(9.0)
    assert latest_send_s(schedule, 10.0, 1.0) == pytest.approx(4.0)  # the open loop's last
    assert latest_send_s(schedule[3:], 10.0, None) == pytest.approx(4.0)


def test_turns_until_reaches_locust_and_remote_workers(tmp_path: Path) -> None:
    env = _locust_env(
        schedule_path=tmp_path / "s.jsonl", records_path=tmp_path / "r.jsonl", model="m",
        max_in_flight=8, processes=1, start_at_s=1.0, request_timeout_s=5.0, turns_until_s=30.0,
    )  # fmt: skip
    assert float(env["TUNER_TURNS_UNTIL_S"]) == 30.0
    unset = _locust_env(
        schedule_path=tmp_path / "s.jsonl", records_path=tmp_path / "r.jsonl", model="m",
        max_in_flight=8, processes=1, start_at_s=1.0, request_timeout_s=5.0,
    )  # fmt: skip
    assert "TUNER_TURNS_UNTIL_S" not in unset
    share = Share(
        index=0, count=1, host="http://h:1", model="m", start_at_s=1.0, request_timeout_s=5.0,
        max_in_flight=8, turns_until_s=30.0,
    )  # fmt: skip
    assert Share.from_data(share.to_data()).turns_until_s == 30.0
    assert Share.from_data({**share.to_data(), "turns_until_s": None}).turns_until_s is None


@pytest.mark.parametrize("until_s", [-1.0, float("nan"), float("inf")])
def test_a_bad_turns_until_is_refused(until_s: float) -> None:
    with pytest.raises(LoadConfigError, match="turns_until_s"):
        _validate(
            [request("r", 0.0)], processes=1, remote_workers=0, master_bind=None,
            max_in_flight=None, timeout_s=None, turns_until_s=until_s,
        )  # fmt: skip

"""Levels of a multi-turn workload open on the conversations already under way."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.search.rate_search import search_rate
from tuner.serving.level_schedule import level_workload
from workloads.build import build_schedule
from workloads.schedule import ScheduledRequest
from workloads.spec import (
    FixedLength,
    LognormalLength,
    SessionStart,
    UniformLength,
    WarmupSpec,
    WorkloadSpec,
    load_workload,
    validate_workload,
)
from workloads.stationary import (
    TURN_MIX_FILE,
    AnswerTimes,
    TurnMix,
    chi2_sf,
    lookback_s,
    stationary_turn_mix,
    turn_mix,
    turns_pmf,
)

RATE_PER_S, WINDOW_S = 30.0, 8.0


def _chat(start: SessionStart, seed: int = 1) -> WorkloadSpec:
    spec = load_workload("chat").with_rate(RATE_PER_S).with_duration(WINDOW_S)
    assert spec.sessions is not None
    sessions = spec.sessions.model_copy(update={"start": start})
    return spec.model_copy(update={"warmup": WarmupSpec(), "sessions": sessions, "seed": seed})


def _measured(schedule: list[ScheduledRequest]) -> list[ScheduledRequest]:
    return [r for r in schedule if not r.warmup]


class TestStationaryMix:
    def test_uniform_one_to_six(self) -> None:
        # P(N > k) / E[N] with N uniform on 1..6: (6 - k) / 21.
        mix = stationary_turn_mix(UniformLength(kind="uniform", low=1, high=6))
        assert mix == pytest.approx([(6 - k) / 21 for k in range(6)])

    def test_fixed(self) -> None:
        assert stationary_turn_mix(FixedLength(kind="fixed", value=4)) == pytest.approx([0.25] * 4)

    def test_lognormal_pmf_sums_to_one(self) -> None:
        pmf = turns_pmf(LognormalLength(kind="lognormal", median=3, sigma=0.5, low=1, high=10))
        assert sum(pmf) == pytest.approx(1.0)
        assert len(pmf) == 10 and min(pmf) >= 0

    def test_chi2_sf_matches_scipy(self) -> None:
        stats = pytest.importorskip("scipy.stats")
        for x, dof in [(0.3, 1), (3.2, 1), (9.9, 5), (0.5, 2), (20.0, 7), (4.0, 4), (60.0, 3)]:
            assert chi2_sf(x, dof) == pytest.approx(float(stats.chi2.sf(x, dof)), rel=1e-9)

    def test_lookback_covers_the_longest_chat(self) -> None:
        # 6 turns, each after at most 0.5 + 1024 x 0.03 + 5 s.
        assert lookback_s(_chat(SessionStart.STATIONARY)) == pytest.approx(5 * 36.22)


class TestChatLevel:
    def test_empty_start_holds_first_turns_only(self) -> None:
        spec = _chat(SessionStart.EMPTY)
        assert spec.sessions is not None
        mix = turn_mix(build_schedule(spec), spec.sessions)
        assert mix.later_turn_share < 0.02  # only sessions whose turns are under 8 s apart
        assert mix.p_value is not None and mix.p_value < 1e-6

    def test_stationary_start_has_the_stationary_mix(self) -> None:
        spec = _chat(SessionStart.STATIONARY)
        assert spec.sessions is not None
        schedule = build_schedule(spec)
        mix = turn_mix(schedule, spec.sessions)
        # ~840 requests: the later-turn share's standard error is about 0.016.
        assert mix.later_turn_share == pytest.approx(mix.stationary_later_turn_share, abs=0.05)
        assert mix.stationary_later_turn_share == pytest.approx(15 / 21)
        assert mix.p_value is not None and mix.p_value > 0.01
        # The window is stationary from its first second, not after a minute.
        first_two = [r for r in _measured(schedule) if r.send_s < 2.0]
        later = sum(r.turn > 0 for r in first_two) / len(first_two)
        assert later == pytest.approx(15 / 21, abs=0.1)

    def test_later_turns_carry_their_history(self) -> None:
        spec = _chat(SessionStart.STATIONARY)
        schedule = _measured(build_schedule(spec))
        by_turn: dict[int, list[int]] = {}
        for r in schedule:
            by_turn.setdefault(r.turn, []).append(r.prompt_tokens)
        means = [sum(v) / len(v) for _, v in sorted(by_turn.items())]
        assert means == sorted(means) and means[-1] > 3 * means[0]
        for r in schedule:
            assert r.messages is not None
            assert sum(m["role"] == "user" for m in r.messages) == r.turn + 1
            assert sum(m["role"] == "assistant" for m in r.messages) == r.turn

    def test_sessions_under_way_are_new_ids_and_start_at_zero(self) -> None:
        schedule = build_schedule(_chat(SessionStart.STATIONARY))
        ids = [r.request_id for r in schedule]
        assert len(set(ids)) == len(ids)
        assert min(r.send_s for r in schedule) >= 0.0
        assert max(r.send_s for r in schedule) < WINDOW_S
        lead = [r for r in schedule if "-lead-" in r.request_id]
        assert lead and all(r.turn > 0 or r.send_s >= 0 for r in lead)
        assert all(r.request_id == f"{r.session_id}-{r.turn}" for r in lead)

    def test_the_window_s_own_arrivals_are_unchanged(self) -> None:
        empty = build_schedule(_chat(SessionStart.EMPTY))
        stationary = build_schedule(_chat(SessionStart.STATIONARY))
        assert [r for r in stationary if "-lead-" not in r.request_id] == empty

    def test_deterministic_for_a_seed(self) -> None:
        a = build_schedule(_chat(SessionStart.STATIONARY, seed=3))
        b = build_schedule(_chat(SessionStart.STATIONARY, seed=3))
        c = build_schedule(_chat(SessionStart.STATIONARY, seed=4))
        assert [r.to_json() for r in a] == [r.to_json() for r in b]
        assert [r.to_json() for r in a] != [r.to_json() for r in c]


class TestLevels:
    def test_levels_of_a_session_workload_start_stationary(self) -> None:
        level = level_workload(load_workload("chat"), RATE_PER_S, WINDOW_S)
        assert level.sessions is not None and level.sessions.start is SessionStart.STATIONARY
        mix = turn_mix(build_schedule(level), level.sessions)
        assert mix.later_turn_share > 0.6

    def test_a_spec_that_sets_start_keeps_it(self) -> None:
        spec = validate_workload(
            {
                "name": "t",
                "arrival": {"kind": "poisson", "rate_per_s": 2},
                "prompt_tokens": {"kind": "fixed", "value": 10},
                "output_tokens": {"kind": "fixed", "value": 10},
                "sessions": {"turns": {"kind": "fixed", "value": 3}, "start": "empty"},
            }
        )
        level = level_workload(spec, 5.0, WINDOW_S)
        assert level.sessions is not None and level.sessions.start is SessionStart.EMPTY

    def test_single_turn_workloads_are_unchanged(self) -> None:
        spec = load_workload("chat")
        single = spec.model_copy(update={"sessions": None})
        level = level_workload(single, RATE_PER_S, WINDOW_S)
        assert level.sessions is None
        plain = single.with_rate(RATE_PER_S).model_copy(
            update={"duration_s": WINDOW_S, "warmup": WarmupSpec()}
        )
        assert build_schedule(level) == build_schedule(plain)

    def test_a_faster_server_opens_on_fewer_conversations_under_way(self) -> None:
        # Little's law: sessions under way = arrival rate x session length, and a session's
        # length is its turns' answers and think times. Planned at the declared 0.5 s +
        # 30 ms a token, a server that answers in a fifth of that would open on a surplus.
        # A level as long as a session (warm-up and window): every session under way at
        # its start sends a turn in it.
        level_s = 90.0
        slow = level_workload(load_workload("chat"), RATE_PER_S, level_s)
        fast = level_workload(
            load_workload("chat"), RATE_PER_S, level_s, AnswerTimes(ttft_s=0.1, tpot_s=0.006)
        )
        assert fast.sessions is not None and fast.sessions.expected_tpot_s == 0.006
        assert fast.sessions.start is SessionStart.STATIONARY

        def under_way(spec: WorkloadSpec) -> int:
            return len({r.session_id for r in build_schedule(spec) if "-lead-" in r.request_id})

        # chat's mean answer is ~300 tokens: a turn gap of ~14.5 s planned, ~6.9 s fast.
        assert under_way(fast) == pytest.approx(0.48 * under_way(slow), rel=0.15)
        assert fast.sessions is not None
        mix = turn_mix(build_schedule(fast), fast.sessions)
        assert mix.planned_ttft_s == 0.1 and mix.planned_tpot_s == 0.006
        assert mix.later_turn_share == pytest.approx(mix.stationary_later_turn_share, abs=0.06)

    def test_answer_times_need_both_means(self) -> None:
        assert AnswerTimes.of_means(250.0, 12.0) == AnswerTimes(ttft_s=0.25, tpot_s=0.012)
        assert AnswerTimes.of_means(None, 12.0) is None
        assert AnswerTimes.of_means(250.0, 0.0) is None

    def test_single_turn_sessions_add_nothing(self) -> None:
        spec = _chat(SessionStart.STATIONARY)
        assert spec.sessions is not None
        one = spec.sessions.model_copy(update={"turns": FixedLength(kind="fixed", value=1)})
        stationary = build_schedule(spec.model_copy(update={"sessions": one}))
        assert all("-lead-" not in r.request_id for r in stationary)


def test_each_level_writes_its_turn_mix(tmp_path: Path) -> None:
    from tests.unit.test_tune_parts import _KnownCapacity

    search_rate(
        _KnownCapacity(capacity_per_s=40.0), load_workload("chat"), start_rate_per_s=30.0,
        out_dir=tmp_path, level_duration_s=WINDOW_S, max_levels=2,
    )  # fmt: skip
    for index in range(2):
        mix = TurnMix.model_validate_json((tmp_path / f"level-{index}" / TURN_MIX_FILE).read_text())
        assert mix.requests > 500
        assert mix.later_turn_share == pytest.approx(mix.stationary_later_turn_share, abs=0.06)
        assert mix.test == "chi-square goodness of fit" and mix.dof == 5

"""The simulated engine's clock: faster than the emulated GPU where the load generator has
room, chosen again after each trial from what its load generator did (tuner.search.clock);
the streamed share that fits the load generator's budget without slowing the clock; and
where each level's wall time went (tuner.run.evaluation.LevelSeconds)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tuner.run.evaluation import Evaluation, LevelRecord, LevelSeconds, Verdict
from tuner.search.clock import (
    client_events_per_s,
    clock_text,
    host_busy_lag,
    measured_time_scale,
    server_lag_scale,
)
from tuner.search.context import (
    MAX_STREAM_INTERVAL,
    REQUEST_COST_EVENTS,
    StudySetup,
    auto_stream_fraction,
    auto_stream_interval,
    auto_time_scale,
    clock_scale,
)
from tuner.search.context import planned_events_per_s as load_events_per_s
from tuner.serving.client_lag import (
    ClientAttempt,
    ClientChange,
    ClientRemedy,
    ClientSetup,
    LevelClient,
)
from tuner.serving.server import TrialOutcome
from tuner.serving.window import WindowOpening
from tuner.vllm.space import TrialParams
from workloads.client_lag import (
    ClientBounds,
    ClientLag,
    ClientVerdict,
    ProcessLag,
    ServerClockLag,
)
from workloads.load_result import LoadResult, Percentiles


def test_the_streamed_share_is_rounded_down_so_the_clock_need_not_slow() -> None:
    """The default chat tune's busiest level: 9,075 tokens/s and 30 requests/s against a
    budget of 5,000 events/s. A share rounded up (0.52) asked 5,019 events/s and slowed
    the clock 1.5x for every level of the run."""
    fraction = auto_stream_fraction(9075.0, 30.0, 5000.0, 0.25)
    assert fraction == pytest.approx(0.51)
    assert fraction * 9075.0 + REQUEST_COST_EVENTS * 30.0 <= 5000.0
    assert auto_time_scale(9075.0, 30.0, 5000.0, fraction) == 1.0
    assert auto_stream_fraction(9075.0, 30.0, 1000.0, 0.25) == 0.25  # never below its floor
    assert auto_stream_fraction(1000.0, 10.0, 5000.0, 0.25) == 1.0  # all fit: all streamed


def test_chunked_streams_stream_every_request_and_let_the_clock_run_faster() -> None:
    """The same busiest level with vLLM's per-request stream_interval: every request
    streamed, its first token alone and the rest in chunks, as few tokens an event as let
    the load generator keep up at the fastest clock."""
    assert load_events_per_s(9075.0, 30.0, 1.0, 1) == 9075.0 + REQUEST_COST_EVENTS * 30.0
    assert load_events_per_s(9075.0, 30.0, 1.0, 5) == 30.0 + 9045.0 / 5 + REQUEST_COST_EVENTS * 30
    interval = auto_stream_interval(9075.0, 30.0, 5000.0, fastest=0.5)
    assert interval == 5  # 4 tokens an event ask 2,591 events/s of the 2,500 at 2x; 5: 2,139
    assert load_events_per_s(9075.0, 30.0, 1.0, interval) <= 2500.0
    assert load_events_per_s(9075.0, 30.0, 1.0, interval - 1) > 2500.0
    assert auto_time_scale(9075.0, 30.0, 5000.0, 1.0, fastest=0.5, stream_interval=interval) == 0.5
    assert auto_stream_interval(1000.0, 10.0, 5000.0, fastest=1.0) == 1  # every token fits
    assert auto_stream_interval(1e6, 10.0, 5000.0, fastest=0.25) == MAX_STREAM_INTERVAL


def test_the_clock_runs_faster_only_where_the_load_leaves_room_and_never_past_its_floor() -> None:
    assert clock_scale(12_600.0, 5000.0) == 3.0  # no room: slower, in steps of a half
    assert clock_scale(2600.0, 5000.0) == 1.0  # room, but never faster unless allowed
    assert clock_scale(2600.0, 5000.0, fastest=0.5) == pytest.approx(0.55)  # 52 % -> 0.55
    assert clock_scale(3500.0, 5000.0, fastest=0.5) == pytest.approx(0.7)
    assert clock_scale(500.0, 5000.0, fastest=0.5) == 0.5  # a tenth of the budget: the floor
    assert clock_scale(5000.0, 5000.0, fastest=0.5) == 1.0
    for load in (700.0, 2600.0, 3333.0, 4999.0):
        scale = clock_scale(load, 5000.0, fastest=0.25)
        assert load / scale <= 5000.0 + 1e-6  # within the budget on the wall clock
        assert load / (scale - 0.05) > 5000.0 or scale == 0.25  # and no slower than needed
    assert auto_time_scale(1000.0, 10.0, 5000.0, fastest=0.5) == 0.5
    assert clock_text(1.5) == "1.5x slower" and clock_text(0.7) == "1.4x faster"


def _level(
    rate: float,
    *,
    events_per_s: float,
    sent: int,
    wall_s: float,
    scale: float,
    lagged: bool = False,
) -> LevelRecord:
    process = ProcessLag(
        worker="w0", sent=sent, wall_s=wall_s, send_lag_p50_ms=0.2, send_lag_p99_ms=4.7,
        send_lag_max_ms=8.0, loop_delay_p50_ms=0.5, loop_delay_p99_ms=11.0 if lagged else 4.3,
        loop_delay_max_ms=12.0, token_events=int(events_per_s * wall_s),
        token_events_per_s=events_per_s, coalesced_percent=0.0, cpu_percent=5.0,
    )  # fmt: skip
    lag = ClientLag(
        verdict=ClientVerdict.LAGGED if lagged else ClientVerdict.KEPT_UP,
        reason="w0 event-loop delay p99 11.0 ms (> 10 ms)" if lagged else None,
        bounds=ClientBounds(), processes=(process,),
    )  # fmt: skip
    load = LoadResult(
        num_requests=100, num_completed=100, num_errors=0, num_not_sent=0, error_rate=0.0,
        window_s=10.0, duration_s=10.0, offered_rate=rate, achieved_rate=rate,
        request_throughput=rate, output_token_throughput=100 * rate, output_tokens=1000,
        prompt_tokens=1000, slo=None, num_good=100, goodput=rate,
        ttft_ms=Percentiles(count=100, p99=100.0), itl_ms=Percentiles(),
        tpot_ms=Percentiles(count=100, p99=20.0), e2e_ms=Percentiles(),
        send_lag_ms=Percentiles(), prompt_buckets=(),
    )  # fmt: skip
    return LevelRecord(
        rate_per_s=rate, met=True, stopped_early=False, dir="level", load=load, violations=[],
        num_preemptions=None, max_kv_cache_usage=None, prefix_cache_hit_rate=None,
        client=LevelClient(lag=lag, setup=ClientSetup(processes=1, time_scale=scale)),
    )  # fmt: skip


def test_after_a_trial_the_clock_runs_as_fast_as_its_client_had_room_for() -> None:
    """The default chat tune's first trial at 1.5x slower: its busiest level (6.32
    conversations/s) asked 1,630 token events and 12.3 requests per wall second of its
    load generator, 2,630 events per emulated second."""
    levels = [
        _level(6.02, events_per_s=1616.0, sent=769, wall_s=59.6, scale=1.5),
        _level(6.32, events_per_s=1630.0, sent=2000, wall_s=162.7, scale=1.5),
    ]
    busiest = client_events_per_s(levels[1])
    assert busiest == pytest.approx((1630.0 + REQUEST_COST_EVENTS * 2000 / 162.7) * 1.5)
    scale = measured_time_scale(levels, max_events_per_s=5000.0, fastest=0.5)
    # 2,630 events per emulated second, 1.3 times over: 3,420 of a 5,000 budget
    assert scale == pytest.approx(0.7)
    assert busiest * 1.3 / scale <= 5000.0
    assert measured_time_scale(levels, max_events_per_s=5000.0, fastest=0.8) == 0.8


def test_a_client_that_kept_up_with_more_than_its_budget_has_that_much_room() -> None:
    """The twin's pick on the default chat tune, 1.4x faster: its busiest level held at
    8.31 conversations/s while its one load process took 5,547 token events and 40
    requests per wall second, its event-loop delay p99 4.6 ms (bound 10). The next trial
    may ask 1.3 times that: within what it kept up with, 0.95; by the 5,000-event budget
    alone it would have run 1.5x slower."""
    levels = [
        _level(9.88, events_per_s=2534.0, sent=1161, wall_s=34.0, scale=0.7),
        _level(8.31, events_per_s=5547.0, sent=1194, wall_s=30.0, scale=0.7),
    ]
    assert measured_time_scale(levels, max_events_per_s=5000.0, fastest=0.5) == pytest.approx(0.95)
    asked = max(e for lv in levels if (e := client_events_per_s(lv)) is not None)
    assert asked * 1.3 / 5000.0 > 1.0  # past the stated budget on the emulated clock


def test_a_trial_whose_client_lagged_keeps_its_clock_and_one_without_records_says_nothing() -> None:
    lagged = [
        _level(6.02, events_per_s=4614.0, sent=756, wall_s=20.4, scale=0.5, lagged=True),
        _level(6.32, events_per_s=2400.0, sent=1000, wall_s=80.0, scale=1.0),
    ]
    assert measured_time_scale(lagged, max_events_per_s=5000.0, fastest=0.5) == 1.0
    bare = _level(6.0, events_per_s=1.0, sent=1, wall_s=1.0, scale=1.0)
    bare = bare.model_copy(update={"client": None})
    assert measured_time_scale([bare], max_events_per_s=5000.0, fastest=0.5) is None


def test_a_levels_wall_time_is_split_into_its_parts() -> None:
    """Trial 0's second level on the default chat tune, 1.5x slower: opened 21.4 emulated
    seconds in, a 25-s shortest window held on to 87.8 s, cut a drain after it."""
    window = WindowOpening(
        warmup_min_s=13.4, warmup_max_s=80.4, opened_at_s=21.4, steady_at_open=True,
        test="", window_s=87.8, needed_requests=200, window_min_s=25.2,
    )  # fmt: skip
    seconds = LevelSeconds.of(171.0, window, run_wall_s=169.0, time_scale=1.5)
    assert seconds.warmup_s == pytest.approx(32.1)
    assert seconds.window_s == pytest.approx(37.8)
    assert seconds.hold_on_s == pytest.approx(93.9)
    assert seconds.drain_s == pytest.approx(169.0 - 32.1 - 37.8 - 93.9)
    assert seconds.other_s == pytest.approx(2.0)
    assert seconds.text() == "171 s (warm-up 32, window 38, hold-on 94, drain 5, other 2)"
    bare = LevelSeconds.of(12.0, None, None, 1.0)
    assert bare.warmup_s is None and bare.text() == "12 s"
    ev = Evaluation(
        dir="t", params=TrialParams(), flags={}, verdict=Verdict.MET,
        outcome=TrialOutcome.READY, launch_s=1.9, levels_s=240.0, stop_s=0.2, warmup_s=8.4,
        levels=[_level(6.3, events_per_s=1.0, sent=1, wall_s=1.0, scale=1.5).model_copy(
            update={"seconds": seconds}
        )],
    )  # fmt: skip
    assert ev.seconds_text() == (
        "launch 2 s, warm-up 8 s, levels 171 s (warm-up 32, window 38, hold-on 94, drain 5, "
        "other 2), stop 0 s, clock 1.5"
    )
    screened = ev.model_copy(update={"launch_s": None})
    assert screened.seconds_text() is None


def test_a_busier_trial_keeps_the_clock_where_its_chunks_can_carry_more_tokens() -> None:
    """A 10-minute default tune's twin pick (wall-h): its busiest level held 8.84
    conversations/s at 4x, 10 tokens an event, while its one load process took 3,498
    token events and 120 requests per wall second. 1.3 times that slowed the next
    launches' clock to 2.9x; with 14 tokens an event the next trial asks no more than
    the budget at 4x, and its TTFT and TPOT read the same (a request's first token is an
    event of its own and its last ends a chunk)."""
    from tuner.search.clock import measured_clock

    levels = [
        _level(7.48, events_per_s=3287.0, sent=2739, wall_s=24.4, scale=0.25),
        _level(8.84, events_per_s=3498.0, sent=4883, wall_s=40.6, scale=0.25),
    ]
    fixed = measured_clock(levels, max_events_per_s=5000.0, fastest=0.25, stream_interval=10)
    assert fixed is not None and (fixed.time_scale, fixed.stream_interval) == (0.35, 10)
    assert fixed.time_scale == measured_time_scale(levels, max_events_per_s=5000.0, fastest=0.25)
    chunked = measured_clock(
        levels, max_events_per_s=5000.0, fastest=0.25, stream_interval=10,
        max_stream_interval=MAX_STREAM_INTERVAL,
    )  # fmt: skip
    assert chunked is not None and (chunked.time_scale, chunked.stream_interval) == (0.25, 14)
    # 14 tokens an event: the busiest level's token events after the first token, 10/14
    requests = 4883 / 40.6
    asked = (requests + (3498.0 - requests) * 10 / 14 + REQUEST_COST_EVENTS * requests) * 0.25
    assert asked * 1.3 / 0.25 <= 5000.0
    # never fewer tokens an event than the levels ran with, where fewer would do
    quiet = [_level(2.0, events_per_s=200.0, sent=100, wall_s=20.0, scale=0.25)]
    kept = measured_clock(
        quiet, max_events_per_s=5000.0, fastest=0.25, stream_interval=10,
        max_stream_interval=MAX_STREAM_INTERVAL,
    )  # fmt: skip
    assert kept is not None and (kept.time_scale, kept.stream_interval) == (0.25, 10)


def _attempt_at_4x(lag: ClientLag, wall_s: float) -> ClientAttempt:
    """An attempt at 4x set aside with ``lag``, the level measured again at 2x."""
    change = ClientChange(
        remedy=ClientRemedy.SLOWER_CLOCK, before=ClientSetup(processes=1, time_scale=0.25),
        after=ClientSetup(processes=1, time_scale=0.5),
    )  # fmt: skip
    return ClientAttempt(
        dir="level-0/lagged-0", setup=change.before, lag=lag, then=change, wall_s=wall_s
    )


def test_settings_whose_server_fell_behind_launch_again_on_the_clock_they_needed() -> None:
    """wall-p (issue 34): the twin's pick's first level lagged at 4x (its simulated
    server's steps 26.6 ms late at p99, bound 25) and was measured again at 2x; the later
    trials of other settings went back to 4x, and the pick's confirmation, launched at 4x,
    lagged again and spent 99 s on one level. Now the settings keep the clock their
    server needed; other settings and a load generator's own lag do not."""
    server = ServerClockLag(steps=4000, p99_ms=26.6, max_ms=80.0)
    fell_behind = ClientLag(
        verdict=ClientVerdict.LAGGED, reason="server", bounds=ClientBounds(), processes=(),
        server=server,
    )  # fmt: skip
    first = _level(9.34, events_per_s=1100.0, sent=900, wall_s=30.0, scale=0.5)
    assert first.client is not None
    attempt = _attempt_at_4x(fell_behind, 22.0)
    lagged = first.model_copy(
        update={"client": first.client.model_copy(update={"attempts": (attempt,)})}
    )
    second = _level(8.48, events_per_s=1000.0, sent=900, wall_s=30.0, scale=0.5)
    assert server_lag_scale([lagged, second]) == 0.5
    ev = Evaluation(
        dir="t", params=TrialParams(), flags={}, verdict=Verdict.MET,
        outcome=TrialOutcome.READY, levels=[lagged, second],
    )  # fmt: skip
    assert ev.client_note == (
        "measured again as its simulated server fell behind at 9.34/s (now 1 load process, "
        "time scale 0.5)"
    )
    assert server_lag_scale([second]) is None
    # a load process's own lag (no server lag) is not the settings'
    own = attempt.model_copy(update={"lag": fell_behind.model_copy(update={"server": None})})
    by_client = first.model_copy(
        update={"client": first.client.model_copy(update={"attempts": (own,)})}
    )
    assert server_lag_scale([by_client]) is None
    pick = TrialParams(gpu_memory_utilization=0.97, max_num_seqs=1024, kv_cache_dtype="fp8")
    other = TrialParams(gpu_memory_utilization=0.9, max_num_seqs=232)
    setup = StudySetup(time_scale=0.25).with_slower_clock(pick, 0.5)
    assert setup.time_scale_for(pick) == 0.5 and setup.time_scale_for(other) == 0.25
    assert setup.with_slower_clock(pick, 1.0).time_scale_for(pick) == 1.0
    assert len(setup.with_slower_clock(pick, 1.0).slower_clocks) == 1
    # a study clock slower than the settings' own: the study's
    assert replace(setup, time_scale=2.0).time_scale_for(pick) == 2.0


def _server_fell_behind(level: LevelRecord) -> LevelRecord:
    """``level`` as one that held although its simulated server's steps started late
    (every load process kept up)."""
    assert level.client is not None
    lag = level.client.lag.model_copy(
        update={
            "verdict": ClientVerdict.LAGGED,
            "reason": "the simulated server's steps started 26.6 ms late at p99",
            "server": ServerClockLag(steps=4000, p99_ms=26.6, max_ms=80.0),
        }
    )
    client = level.client.model_copy(update={"lag": lag, "held_anyway": True})
    return level.model_copy(update={"client": client})


def test_a_server_that_fell_behind_slows_only_its_own_settings_clock() -> None:
    """The twin's pick measured again at 2x after its server fell behind at 4x, its
    second level held at 2x although its server's steps started late again: the load
    generator kept up throughout, so the next trials (other settings) run the clock their
    load allows, not the pick's (``server_lag_scale`` keeps the pick's own)."""
    levels = [
        _level(9.34, events_per_s=800.0, sent=900, wall_s=60.0, scale=0.5),
        _server_fell_behind(_level(8.48, events_per_s=700.0, sent=900, wall_s=60.0, scale=0.5)),
    ]
    assert levels[1].client is not None and levels[1].client.lag.lagged
    assert not levels[1].client.lag.generator_lagged
    scale = measured_time_scale(levels, max_events_per_s=5000.0, fastest=0.25)
    assert scale is not None and scale < 0.5
    # a load process's own lag at 2x keeps the next trials at 2x at the fastest
    own = _level(8.48, events_per_s=700.0, sent=900, wall_s=60.0, scale=0.5, lagged=True)
    assert measured_time_scale([levels[0], own], max_events_per_s=5000.0, fastest=0.25) == 0.5


def test_a_trials_levels_count_on_their_own_clocks_without_their_attempts_set_aside() -> None:
    """A 10-minute default tune (cef11b9): the twin's pick's first level lagged at 4x
    (a 40-s attempt set aside) and was measured again at 2x, which the trial's second
    level kept: its levels took 138 s. The next trial, back at 4x, was counted to take
    them all again on the clock it would run (a third trial of ~144 s did not fit): each
    level counts on its own clock, without the attempt set aside."""
    first = _level(9.34, events_per_s=800.0, sent=900, wall_s=60.0, scale=0.5)
    assert first.client is not None
    attempt = _attempt_at_4x(first.client.lag, 40.0)
    first = first.model_copy(
        update={
            "client": first.client.model_copy(update={"attempts": (attempt,)}),
            "seconds": LevelSeconds(wall_s=40.0 + 50.0, time_scale=0.5),
        }
    )
    second = _level(8.48, events_per_s=700.0, sent=900, wall_s=40.0, scale=0.5).model_copy(
        update={"seconds": LevelSeconds(wall_s=40.0, time_scale=0.5)}
    )
    ev = Evaluation(
        dir="t", params=TrialParams(), flags={}, verdict=Verdict.MET,
        outcome=TrialOutcome.READY, launch_s=1.8, levels_s=138.0, stop_s=0.1, warmup_s=8.0,
        levels=[first, second], time_scale=0.5,
    )  # fmt: skip
    # 8 s before the levels at 2x, 50 + 40 s of levels at 2x: at 4x half of it
    assert ev.levels_s_at(0.25) == pytest.approx((8.0 + 50.0 + 40.0) / 2)
    assert ev.levels_s_at(0.5) == pytest.approx(8.0 + 50.0 + 40.0)
    # levels measured on the launch's own clock throughout: as before, scaled whole
    steady = ev.model_copy(
        update={
            "levels": [second, second.model_copy(update={"seconds": None})],
            "levels_s": 100.0,
        }
    )
    assert steady.levels_s_at(0.25) == pytest.approx(50.0)


def test_a_lag_while_other_processes_took_the_host_says_nothing_of_the_next_clock() -> None:
    """A 10-minute default tune with every core kept busy for 40 s from the twin's pick's
    first level (make_tune_series.py busy40@1): the pick's server fell behind at 4x, was
    measured again at 2x, and its confirmation then ran at 2x too (the least kept for it
    doubled): three trials. Where other processes took the host's CPU meanwhile, the lag
    is the host's: the level is measured again as before, and the settings' later launches
    keep the study's clock; the trial's line says why it was measured again."""
    busy = ClientLag(
        verdict=ClientVerdict.LAGGED, reason="server", bounds=ClientBounds(), processes=(),
        server=ServerClockLag(steps=4000, p99_ms=51.5, max_ms=120.0), host_others_share=0.48,
    )  # fmt: skip
    assert busy.host_busy and busy.server_lagged
    first = _level(9.34, events_per_s=1100.0, sent=900, wall_s=30.0, scale=0.5)
    assert first.client is not None
    lagged = first.model_copy(
        update={
            "client": first.client.model_copy(update={"attempts": (_attempt_at_4x(busy, 25.0),)})
        }
    )
    assert server_lag_scale([lagged]) is None
    assert host_busy_lag([lagged]) == pytest.approx(0.48)
    ev = Evaluation(
        dir="t", params=TrialParams(), flags={}, verdict=Verdict.MET,
        outcome=TrialOutcome.READY, levels=[lagged],
    )  # fmt: skip
    assert ev.client_note == (
        "measured again as its simulated server fell behind at 9.34/s while other processes "
        "took 48% of the host's CPU (now 1 load process, time scale 0.5)"
    )
    # a quiet host (others took 5%): the settings' own lag, kept as before
    quiet = busy.model_copy(update={"host_others_share": 0.05})
    assert not quiet.host_busy
    own = lagged.model_copy(
        update={
            "client": first.client.model_copy(update={"attempts": (_attempt_at_4x(quiet, 25.0),)})
        }
    )
    assert server_lag_scale([own]) == 0.5 and host_busy_lag([own]) is None
    # not measured (an older record, or no /proc): as before
    unknown = busy.model_copy(update={"host_others_share": None})
    assert not unknown.host_busy
    # a load process that lagged while the host was busy keeps no slower clock for the
    # next trials either
    slow = _level(8.48, events_per_s=700.0, sent=900, wall_s=60.0, scale=0.5, lagged=True)
    assert measured_time_scale([slow], max_events_per_s=5000.0, fastest=0.25) == 0.5
    assert slow.client is not None
    on_busy_host = slow.model_copy(
        update={
            "client": slow.client.model_copy(
                update={"lag": slow.client.lag.model_copy(update={"host_others_share": 0.5})}
            )
        }
    )
    scale = measured_time_scale([on_busy_host], max_events_per_s=5000.0, fastest=0.25)
    assert scale is not None and scale < 0.5

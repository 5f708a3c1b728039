"""The honest client's rule: a level whose load generator lagged past the stated bounds does
not count; it is measured again with more processes or a slower clock, and a level still
lagging is unmeasurable, neither a hold nor a break (workloads.client_lag,
tuner.serving.client_lag, tuner.search.client_retry, tuner.search.rate_search)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from reports.html import _level_verdict
from tuner.run.evaluation import Evaluation, LevelRecord, Verdict
from tuner.run.goodput import GoodputBound
from tuner.run.layout import CLIENT_JSON
from tuner.search.client_retry import measure_with_honest_client
from tuner.search.config import load_config
from tuner.search.rate_search import RateLevel, bracket, search_rate
from tuner.serving.client_lag import (
    ClientChange,
    ClientRemedy,
    ClientRule,
    ClientScaling,
    ClientSetup,
    LevelClient,
    plan_remedy,
)
from tuner.serving.live_server import LoadMeasurement
from tuner.serving.load import SloVerdict
from tuner.serving.server import TrialOutcome
from tuner.vllm.space import TrialParams
from workloads.client_lag import (
    ClientBounds,
    ClientLag,
    ClientVerdict,
    ServerClockLag,
    judge_client,
)
from workloads.load_result import LoadResult, Percentiles
from workloads.runner import WorkerStats, client_saturation
from workloads.schedule import ScheduledRequest
from workloads.spec import WorkloadSpec, load_workload


def stats(worker: str = "w0", **overrides: object) -> WorkerStats:
    values: dict[str, object] = {
        "worker": worker, "index": int(worker[1:]), "count": 1, "scheduled": 100, "sent": 100,
        "cap_hits": 0, "completed": 100, "failed": 0, "not_sent_stopped": 0,
        "max_in_flight": 100, "peak_in_flight": 3, "start_late_s": -1.0, "wall_s": 10.0,
        "cpu_s": 1.0, "cpu_percent": 10.0, "send_lag_p50_ms": 0.2, "send_lag_p99_ms": 2.0,
        "send_lag_max_ms": 3.0, "stopped_early": False, "token_events": 5000,
        "coalesced_events": 0, "loop_delay_p50_ms": 0.5, "loop_delay_p99_ms": 1.2,
        "loop_delay_max_ms": 2.0,
    }  # fmt: skip
    values.update(overrides)
    return WorkerStats.model_validate(values)


# --- the verdict ---------------------------------------------------------------------------


def test_a_client_within_every_bound_kept_up() -> None:
    lag = judge_client([stats(), stats("w1")])
    assert lag.verdict is ClientVerdict.KEPT_UP and lag.reason is None
    w0, _ = lag.processes
    assert w0.token_events_per_s == pytest.approx(500.0)
    assert lag.token_events_per_s == pytest.approx(1000.0)
    assert w0.loop_delay_p99_ms == 1.2 and w0.send_lag_max_ms == 3.0
    assert client_saturation([stats()]) == (False, None)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"send_lag_p99_ms": 12.5}, "w1 send lag p99 12.5 ms (> 10 ms)"),
        ({"loop_delay_p99_ms": 31.0}, "w1 event-loop delay p99 31.0 ms (> 10 ms)"),
        ({"coalesced_events": 100}, "w1 read 2.0% of token events a whole token late (> 1%)"),
        ({"cpu_percent": 80.0}, "w1 used 80% of a core (> 75%)"),
    ],
)
def test_any_process_past_any_bound_lagged(overrides: dict[str, object], reason: str) -> None:
    lag = judge_client([stats(), stats("w1", **overrides)])
    assert lag.verdict is ClientVerdict.LAGGED
    assert lag.reason == reason
    assert client_saturation([stats(), stats("w1", **overrides)]) == (True, reason)


def test_the_bounds_are_the_callers() -> None:
    tight = ClientBounds(send_lag_p99_ms=1.0, loop_delay_p99_ms=1.0)
    lag = judge_client([stats()], tight)
    assert lag.lagged and lag.bounds == tight
    assert lag.reason == (
        "w0 send lag p99 2.0 ms (> 1 ms); w0 event-loop delay p99 1.2 ms (> 1 ms)"
    )


def test_a_process_that_measured_nothing_is_judged_on_what_it_has() -> None:
    idle = stats(send_lag_p99_ms=None, loop_delay_p99_ms=None, token_events=0, sent=0)
    assert not judge_client([idle]).lagged


# --- the remedies ---------------------------------------------------------------------------

RULE = ClientRule()


def test_more_processes_first_doubled_up_to_the_cores() -> None:
    change = plan_remedy(RULE, ClientSetup(processes=1), simulated=True, cores=16)
    assert change is not None and change.remedy is ClientRemedy.MORE_PROCESSES
    assert change.after == ClientSetup(processes=2)
    three = plan_remedy(RULE, ClientSetup(processes=2), simulated=False, cores=3)
    assert three is not None and three.after.processes == 3  # the host's cores
    capped = ClientRule(max_processes=4)
    assert plan_remedy(capped, ClientSetup(processes=4), simulated=False, cores=16) is None


def test_then_on_the_simulated_engine_a_slower_clock() -> None:
    setup = ClientSetup(processes=2, time_scale=1.5)
    change = plan_remedy(RULE, setup, simulated=True, cores=2)
    assert change is not None and change.remedy is ClientRemedy.SLOWER_CLOCK
    assert change.after == ClientSetup(processes=2, time_scale=3.0)
    assert change.describe() == "the simulated clock 2x slower (time scale 3)"
    assert plan_remedy(RULE, setup, simulated=False, cores=2) is None  # vLLM: nothing left


def test_a_simulated_server_behind_its_clock_lagged_and_slows_its_clock_at_once() -> None:
    """The simulated server is part of the measurement: steps that start late delay their
    tokens as a late client reads them late. More load processes would take its core."""
    behind = ServerClockLag(steps=2000, p99_ms=35.0, max_ms=80.0)
    lag = judge_client([stats()], server=behind)
    assert lag.lagged and lag.server_lagged
    assert lag.reason is not None and "simulated server's steps started 35.0 ms late" in lag.reason
    assert lag.who == "the simulated server"  # its load generator kept up
    both = judge_client([stats(send_lag_p99_ms=12.5)], server=behind)
    assert both.who == "the load generator and the simulated server"
    assert judge_client([stats(send_lag_p99_ms=12.5)]).who == "the load generator"
    kept = judge_client([stats()], server=ServerClockLag(steps=2000, p99_ms=3.0, max_ms=9.0))
    assert not kept.lagged and not kept.server_lagged
    wide = judge_client([stats()], ClientBounds(server_lag_p99_ms=50.0), server=behind)
    assert not wide.lagged  # within the bound the SLO allows
    change = plan_remedy(
        RULE, ClientSetup(processes=1), simulated=True, cores=16, server_lagged=True
    )
    assert change is not None and change.remedy is ClientRemedy.SLOWER_CLOCK


def test_remote_workers_are_not_multiplied_here() -> None:
    setup = ClientSetup(processes=1, remote_workers=4)
    change = plan_remedy(RULE, setup, simulated=True, cores=16)
    assert change is not None and change.remedy is ClientRemedy.SLOWER_CLOCK
    assert plan_remedy(RULE, setup, simulated=False, cores=16) is None


# --- a level measured again -----------------------------------------------------------------


def _load(rate: float) -> LoadResult:
    return LoadResult(
        num_requests=100, num_completed=100, num_errors=0, num_not_sent=0, error_rate=0.0,
        window_s=10.0, duration_s=10.0, offered_rate=rate, achieved_rate=rate,
        request_throughput=rate, output_token_throughput=100 * rate, output_tokens=1000,
        prompt_tokens=1000, slo=None, num_good=100, goodput=rate,
        ttft_ms=Percentiles(count=100, p99=100.0), itl_ms=Percentiles(),
        tpot_ms=Percentiles(count=100, p99=20.0), e2e_ms=Percentiles(),
        send_lag_ms=Percentiles(), prompt_buckets=(),
    )  # fmt: skip


class _Server:
    """A stand-in for ``LiveServer`` with a client: the SLO holds up to ``capacity_per_s``
    and its load generator keeps up while the rate per process, on the wall clock, is at
    most ``client_per_s``; each measurement leaves a file in its directory."""

    def __init__(
        self, *, capacity_per_s: float, client_per_s: float, rule: ClientRule = RULE,
        simulated: bool = True, cores: int = 2,
    ) -> None:  # fmt: skip
        self.capacity_per_s = capacity_per_s
        self.client_per_s = client_per_s
        self.rule, self.simulated, self.cores = rule, simulated, cores
        self.launch = SimpleNamespace(params=SimpleNamespace(max_model_len=None))
        self.time_scale = 1.0
        self.processes = 1
        self.measured: list[tuple[float, int, float, bool]] = []  # rate, processes, scale, chained

    @property
    def client_rule(self) -> ClientRule:
        return self.rule

    def setup(self) -> ClientSetup:
        return ClientSetup(processes=self.processes, time_scale=self.time_scale)

    def client_remedy(self) -> ClientChange | None:
        return plan_remedy(self.rule, self.setup(), simulated=self.simulated, cores=self.cores)

    def apply_client_change(self, change: ClientChange) -> None:
        self.processes, self.time_scale = change.after.processes, change.after.time_scale

    def measure(
        self, workload: WorkloadSpec, schedule: list[ScheduledRequest], *, out_dir: Path,
        chain: object = None, **_: object,
    ) -> LoadMeasurement:  # fmt: skip
        rate = workload.mean_rate_per_s
        assert rate is not None
        self.measured.append((rate, self.processes, self.time_scale, chain is not None))
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "requests.jsonl").write_text(f"{rate} {self.processes}\n")
        wall_rate = rate / self.processes / self.time_scale
        lag_ms = 2.0 if wall_rate <= self.client_per_s else 40.0
        lag = judge_client([stats(send_lag_p99_ms=lag_ms)], self.rule.bounds)
        # a lagging client adds its lag to the latencies: here enough to break the SLO (a
        # level that held through it would count: tuner.search.client_retry.held_anyway)
        met = rate <= self.capacity_per_s and not lag.lagged
        return LoadMeasurement(
            out_dir=str(out_dir), outcome=TrialOutcome.READY, load=_load(rate),
            slo=SloVerdict(met=met, violations=[] if met else ["ttft p99 past 2000 ms"]),
            client_saturated=lag.lagged, client_saturation_reason=lag.reason,
            client=LevelClient(lag=lag, setup=self.setup()),
        )  # fmt: skip


def test_the_server_stand_in_is_a_client_scaling_server() -> None:
    assert isinstance(_Server(capacity_per_s=1.0, client_per_s=1.0), ClientScaling)


def _measure_once(server: _Server, rate: float, level_dir: Path) -> LoadMeasurement:
    spec = load_workload("chat").with_rate(rate)
    return measure_with_honest_client(
        server, lambda again: server.measure(spec, [], out_dir=level_dir), level_dir
    )


def test_a_level_whose_client_lagged_is_measured_again_with_more_processes(
    tmp_path: Path,
) -> None:
    server = _Server(capacity_per_s=100.0, client_per_s=6.0, cores=4)
    level_dir = tmp_path / "level-0"
    m = _measure_once(server, 10.0, level_dir)
    assert [p for _, p, _, _ in server.measured] == [1, 2]
    assert m.client is not None and not m.client.unmeasurable and m.client.remeasured
    (attempt,) = m.client.attempts
    assert attempt.lag.verdict is ClientVerdict.LAGGED
    assert attempt.then.remedy is ClientRemedy.MORE_PROCESSES
    assert attempt.dir == str(level_dir / "lagged-0")
    # the lagged attempt's evidence is set aside; the level's directory is the one that counts
    assert (level_dir / "lagged-0" / "requests.jsonl").read_text() == "10.0 1\n"
    assert (level_dir / "requests.jsonl").read_text() == "10.0 2\n"
    saved = LevelClient.model_validate_json((level_dir / CLIENT_JSON).read_text())
    assert saved == m.client
    assert m.client.summary().startswith("measured again with 2 load processes instead of 1")


def test_then_a_slower_clock_and_past_the_retries_unmeasurable(tmp_path: Path) -> None:
    server = _Server(capacity_per_s=100.0, client_per_s=2.0, cores=2)
    m = _measure_once(server, 10.0, tmp_path / "level-0")
    # 1 process, 2 processes (the cores), then the clock 2x slower: still 2.5/s per process
    assert [(p, k) for _, p, k, _ in server.measured] == [(1, 1.0), (2, 1.0), (2, 2.0)]
    assert m.client is not None and m.client.unmeasurable
    assert [a.then.remedy for a in m.client.attempts] == [
        ClientRemedy.MORE_PROCESSES,
        ClientRemedy.SLOWER_CLOCK,
    ]
    assert m.client.summary() == (
        "the client could not keep up: w0 send lag p99 40.0 ms (> 10 ms) "
        "(with 2 load processes, time scale 2, after 2 more attempts)"
    )
    assert sorted(p.name for p in (tmp_path / "level-0").iterdir()) == [
        "client.json", "lagged-0", "lagged-1", "requests.jsonl",
    ]  # fmt: skip


def test_no_retries_or_no_remedy_left_measures_once(tmp_path: Path) -> None:
    server = _Server(capacity_per_s=100.0, client_per_s=2.0, rule=ClientRule(retries=0))
    m = _measure_once(server, 10.0, tmp_path / "a")
    assert len(server.measured) == 1 and m.client is not None and m.client.unmeasurable
    vllm = _Server(capacity_per_s=100.0, client_per_s=2.0, simulated=False, cores=1)
    m = _measure_once(vllm, 10.0, tmp_path / "b")
    assert len(vllm.measured) == 1 and m.client is not None and not m.client.attempts


def test_a_server_without_a_client_is_measured_once(tmp_path: Path) -> None:
    server = _Server(capacity_per_s=100.0, client_per_s=2.0)
    spec = load_workload("chat").with_rate(10.0)
    calls: list[bool] = []

    def measure(again: bool) -> LoadMeasurement:
        calls.append(again)
        return server.measure(spec, [], out_dir=tmp_path)

    measure_with_honest_client(object(), measure, tmp_path)
    assert calls == [False]


# --- the search treats an unmeasurable level as missing ------------------------------------


def test_the_search_measures_below_the_rate_its_client_could_not_follow(tmp_path: Path) -> None:
    """vLLM (no clock to slow) on 2 cores, capacity 4/s, a client that follows at most
    0.6/s per process: 0.1, 0.2, 0.4 hold on one process; 0.8 lagged on one and holds on
    two; 1.6 lags on two with nothing left: unmeasurable. The search stops below it, at a
    lower bound: 1.6 is neither a hold nor a break."""
    server = _Server(capacity_per_s=4.0, client_per_s=0.6, cores=2, simulated=False)
    result = search_rate(
        server, load_workload("chat"), start_rate_per_s=0.1, out_dir=tmp_path,
        level_duration_s=2.0, warmup_s=1.0, max_levels=8, precision=0.05,
    )  # fmt: skip
    rates = [lv.rate_per_s for lv in result.levels]
    assert rates == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6])
    last = result.levels[-1]
    assert last.unmeasurable and not last.met
    assert [lv.met for lv in result.levels[:-1]] == [True] * 4
    assert result.best is not None and result.best.rate_per_s == pytest.approx(0.8)
    assert result.bound is GoodputBound.LOWER_BOUND
    assert result.broken_rate_per_s is None
    assert [(p, chained) for rate, p, _, chained in server.measured if rate > 0.5] == [
        (1, False), (2, False), (2, False),
    ]  # fmt: skip


def test_with_no_level_counted_the_search_steps_down(tmp_path: Path) -> None:
    server = _Server(capacity_per_s=4.0, client_per_s=0.3, rule=ClientRule(retries=0))
    result = search_rate(
        server, load_workload("chat"), start_rate_per_s=0.8, out_dir=tmp_path,
        level_duration_s=2.0, warmup_s=1.0, max_levels=3, precision=0.05,
    )  # fmt: skip
    assert [lv.rate_per_s for lv in result.levels] == pytest.approx([0.8, 0.4, 0.2])
    assert [lv.unmeasurable for lv in result.levels] == [True, True, False]
    assert result.best is not None and result.best.rate_per_s == pytest.approx(0.2)


def test_a_bracket_leaves_unmeasurable_levels_out() -> None:
    def level(rate: float, met: bool, lagged: bool) -> RateLevel:
        lag = ClientLag(
            verdict=ClientVerdict.LAGGED if lagged else ClientVerdict.KEPT_UP,
            reason="w0 send lag p99 40.0 ms (> 10 ms)" if lagged else None,
            bounds=ClientBounds(), processes=(),
        )  # fmt: skip
        m = LoadMeasurement(
            out_dir="x", outcome=TrialOutcome.READY, load=_load(rate),
            slo=SloVerdict(met=met, violations=[]),
            client=LevelClient(lag=lag, setup=ClientSetup(processes=1)),
        )  # fmt: skip
        return RateLevel(index=0, rate_per_s=rate, met=met and not lagged, measurement=m)

    low, high = bracket(
        [level(4.0, True, False), level(6.0, False, True), level(8.0, False, False)]
    )
    assert low is not None and low.rate_per_s == 4.0
    assert high is not None and high.rate_per_s == 8.0


# --- what is recorded -----------------------------------------------------------------------


def test_the_level_record_says_so(tmp_path: Path) -> None:
    server = _Server(capacity_per_s=100.0, client_per_s=2.0, rule=ClientRule(retries=1))
    m = _measure_once(server, 10.0, tmp_path / "level-0")
    record = LevelRecord(
        rate_per_s=10.0, met=False, stopped_early=False, dir=m.out_dir, load=m.load,
        violations=[], num_preemptions=None, max_kv_cache_usage=None,
        prefix_cache_hit_rate=None, client=m.client,
    )  # fmt: skip
    back = LevelRecord.model_validate(json.loads(record.model_dump_json()))
    assert back.unmeasurable and back.time_scale == 1.0
    assert back.client is not None and back.client.attempts[0].then.after.processes == 2


def _record(m: LoadMeasurement, rate: float) -> LevelRecord:
    return LevelRecord(
        rate_per_s=rate, met=False, stopped_early=False, dir=m.out_dir, load=m.load,
        violations=[], num_preemptions=None, max_kv_cache_usage=None,
        prefix_cache_hit_rate=None, client=m.client,
    )  # fmt: skip


def test_the_trial_says_which_levels_were_measured_again_or_are_missing(tmp_path: Path) -> None:
    server = _Server(capacity_per_s=100.0, client_per_s=6.0, cores=2, simulated=False)
    again = _record(_measure_once(server, 10.0, tmp_path / "level-0"), 10.0)
    lost = _record(_measure_once(server, 20.0, tmp_path / "level-1"), 20.0)
    ev = Evaluation(
        dir=str(tmp_path), params=TrialParams(), flags={}, verdict=Verdict.MET,
        outcome=TrialOutcome.READY, levels=[again],
    )  # fmt: skip
    assert ev.client_note == (
        "measured again as the client lagged at 10.00/s (now 2 load processes)"
    )
    ev = ev.model_copy(update={"levels": [again, lost]})
    assert ev.client_note == (
        "unmeasurable at 20.00/s: the client could not keep up: w0 send lag p99 40.0 ms (> 10 ms)"
    )
    verdict, _ = _level_verdict(lost)
    assert verdict.startswith("unmeasurable: the client could not keep up")


def test_the_config_sets_the_rule() -> None:
    config = load_config(None, {"client_lag_ms": 0.5, "client_retries": 3})
    rule = config.load_generators().client_rule
    assert rule.retries == 3
    assert rule.bounds.send_lag_p99_ms == 0.5 and rule.bounds.loop_delay_p99_ms == 0.5
    assert rule.bounds.server_lag_p99_ms == 10.0  # the simulated server's floor
    wide = load_config(None, {"client_lag_ms": 50.0}).load_generators().client_rule
    assert wide.bounds.server_lag_p99_ms == 50.0  # widened with the client's, as before


def test_the_lag_bounds_widen_to_a_share_of_the_slo_limits_they_add_to() -> None:
    from workloads.client_lag import SLO_SHARE
    from workloads.slo import Slo

    chat = Slo.p99(ttft_ms=2000.0, itl_ms=100.0)
    bounds = ClientBounds().for_slo(chat)
    assert bounds.send_lag_p99_ms == pytest.approx(SLO_SHARE * 2000.0)  # 100 ms
    assert bounds.loop_delay_p99_ms == pytest.approx(10.0)  # 5% of 100 ms is below 10 ms
    slow = ClientBounds().for_slo(chat, time_scale=4.0)  # 4x slower: limits 4x longer
    assert slow.send_lag_p99_ms == pytest.approx(400.0)
    assert slow.loop_delay_p99_ms == pytest.approx(20.0)
    # The simulated server's step lag adds to TTFT, gaps and e2e, not to a TPOT
    assert bounds.server_lag_p99_ms == pytest.approx(10.0)  # 5% of the 100-ms ITL
    tpot_only = Slo.p99(ttft_ms=2000.0, tpot_ms=100.0)
    fast = ClientBounds().for_slo(tpot_only, time_scale=0.25)  # 4x faster: limits 4x shorter
    assert fast.server_lag_p99_ms == pytest.approx(25.0)  # 5% of 2 s, in wall time
    assert fast.loop_delay_p99_ms == pytest.approx(10.0)  # the client's reads: TPOT counts
    assert ClientBounds().for_slo(Slo.p99(tpot_ms=100.0)).server_lag_p99_ms == 10.0
    assert ClientBounds(slo_share=0.0).for_slo(chat) == ClientBounds(slo_share=0.0)
    assert ClientBounds().for_slo(Slo()) == ClientBounds()  # no limits: as stated


def _broken_level(ttft_p99_ms: float, *, server_max_ms: float, client_lag_ms: float = 2.0,
                  time_scale: float = 0.25) -> LoadMeasurement:  # fmt: skip
    """A level that broke its TTFT limit (2 s) while the simulated server's steps started
    up to ``server_max_ms`` late (p99 30 ms, past its 10-ms floor)."""
    from tuner.search.client_retry import broke_anyway
    from workloads.slo import Slo

    server = ServerClockLag(steps=2000, p99_ms=30.0, max_ms=server_max_ms)
    lag = judge_client([stats(send_lag_p99_ms=client_lag_ms)], ClientBounds(), server=server)
    load = _load(6.0).model_copy(
        update={"slo": Slo.p99(ttft_ms=2000.0), "ttft_ms": Percentiles(count=100, p99=ttft_p99_ms)}
    )
    m = LoadMeasurement(
        out_dir="level-0", outcome=TrialOutcome.READY, load=load,
        slo=SloVerdict(met=False, violations=[f"ttft p99 {ttft_p99_ms} ms > 2000 ms"]),
        client_saturated=True, client_saturation_reason=lag.reason,
        client=LevelClient(lag=lag, setup=ClientSetup(processes=1, time_scale=time_scale)),
    )  # fmt: skip
    assert lag.server_lagged
    return m.model_copy(
        update={"client": m.client.model_copy(update={"broke_anyway": broke_anyway(m)})}
    )  # type: ignore[union-attr]


def test_a_level_that_broke_by_more_than_the_simulated_servers_lag_counts() -> None:
    """The server's largest step lag, 58 ms at a 4x clock, moves any latency by at most
    232 ms of the emulated GPU's: a TTFT p99 of 3.6 s against 2 s broke whatever it was;
    one of 2.1 s may be the lag's, and is measured again, as is any level whose load
    generator lagged too."""
    clear = _broken_level(3648.0, server_max_ms=58.0)
    assert clear.client is not None and clear.client.broke_anyway
    assert not clear.client.unmeasurable
    assert clear.client.summary().startswith("broke by more than the simulated server's lag")
    close = _broken_level(2100.0, server_max_ms=58.0)
    assert close.client is not None and not close.client.broke_anyway and close.client.unmeasurable
    slower = _broken_level(2100.0, server_max_ms=58.0, time_scale=1.0)  # 58 ms of the GPU's
    assert slower.client is not None and slower.client.broke_anyway
    both = _broken_level(3648.0, server_max_ms=58.0, client_lag_ms=40.0)
    assert both.client is not None and not both.client.broke_anyway


def test_a_level_stopped_before_its_window_answered_broke_by_how_long_it_had_waited(
    tmp_path: Path,
) -> None:
    """A quiet host's default tune (make_tune_series.py, 4eff461): the twin's pick at
    9.34/s stopped early at 4x, 1.4 s of the emulated GPU's into its window, so its
    window had no answer and no TTFT percentile; its simulated server's steps had started
    up to 46 ms late (184 ms of the emulated GPU's), and its earlier requests waited
    seconds for their first token. It was set aside and measured again at 2x, where it
    broke the same way, and the pick's later launches kept 2x. How long its requests had
    waited, counting those still waiting at the stop, is past what the lag can move."""
    from tuner.search.client_retry import broke_anyway
    from workloads.load_errors import ABORTED, STOPPED_BEFORE_SEND
    from workloads.schedule import RequestRecord, write_records
    from workloads.slo import Slo

    def level(answered_wall_s: float, in_flight: int, *, stopped: bool) -> LoadMeasurement:
        records = []
        stop = 1000.0 + 20.0
        for i in range(300):  # 15 requests a wall second for 20 s
            at = 1000.0 + i / 15
            if i < 300 - in_flight:
                first = min(at + answered_wall_s, stop)
                records.append(
                    RequestRecord(
                        request_id=f"r{i}", scheduled_s=at, sent_s=at, prompt_tokens=64,
                        output_tokens=8, status=200, first_token_s=first, end_s=first + 0.1,
                        token_times_s=[first],
                    )
                )  # fmt: skip
            else:
                records.append(
                    RequestRecord(
                        request_id=f"r{i}", scheduled_s=at, sent_s=at, prompt_tokens=64,
                        output_tokens=0, status=200, end_s=stop, error=ABORTED,
                    )
                )  # fmt: skip
        records.append(
            RequestRecord(
                request_id="later", scheduled_s=stop + 5, sent_s=stop + 5, prompt_tokens=64,
                output_tokens=0, status=0, error=STOPPED_BEFORE_SEND,
            )
        )  # fmt: skip
        out = tmp_path / f"level-{answered_wall_s}-{in_flight}-{stopped}"
        out.mkdir()
        write_records(out / "requests.jsonl", records)
        server = ServerClockLag(steps=411, p99_ms=28.2, max_ms=46.0)
        lag = judge_client([stats()], ClientBounds(), server=server)
        window = _load(9.34).model_copy(
            update={"slo": Slo.p99(ttft_ms=2000.0), "ttft_ms": Percentiles()}
        )  # no answer in the window: no percentile
        m = LoadMeasurement(
            out_dir=str(out), outcome=TrialOutcome.READY, load=window,
            slo=SloVerdict(met=False, violations=["stopped early"]), client_saturated=True,
            client=LevelClient(lag=lag, setup=ClientSetup(processes=1, time_scale=0.25)),
            stopped_early=stopped,
        )  # fmt: skip
        assert (
            lag.server_lagged and m.load.measured_ms(Slo.p99(ttft_ms=1.0).objectives()[0]) is None
        )
        return m

    # TTFT 2.1 s of the emulated GPU's answered (0.525 s wall at 4x), a third still waiting
    assert broke_anyway(level(0.525, 100, stopped=True))
    # every answer within the limit and the lag's 184 ms, none waiting: the lag's to make
    assert not broke_anyway(level(0.54, 0, stopped=True))
    # not stopped early: the window's percentiles judge it, and it has none
    assert not broke_anyway(level(0.525, 100, stopped=False))


def test_no_level_starts_that_would_end_past_the_searchs_deadline(tmp_path: Path) -> None:
    """A confirmation's level count is planned from the levels' expected seconds, which a
    slower clock after a lag outgrows: past its deadline no further level starts (the
    first always does), edge draws included; without one the same search runs on."""
    import time

    def run(deadline: float | None, out: Path) -> list[float]:
        server = _Server(capacity_per_s=4.0, client_per_s=100.0)
        result = search_rate(
            server, load_workload("chat"), start_rate_per_s=1.0, out_dir=out,
            level_duration_s=2.0, warmup_s=1.0, max_levels=4, precision=0.05,
            deadline=deadline,
        )  # fmt: skip
        return [lv.rate_per_s for lv in result.levels]

    free = run(None, tmp_path / "free")
    assert len(free) >= 4  # four levels and the edge draws
    assert run(time.monotonic() + 3600.0, tmp_path / "later") == pytest.approx(free)
    assert run(time.monotonic() - 1.0, tmp_path / "passed") == pytest.approx(free[:1])

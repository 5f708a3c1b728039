"""Steady-state predictions: later turns follow their answers on the virtual clock, and
a rate is sustained only if a window after a warm-up holds its SLOs without a backlog."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.serving.level_schedule import level_workload
from tuner.sim.build import build_engine
from tuner.sim.simulate import SimulationResult, run
from tuner.twin.prediction import (
    Setup,
    predict,
    simulate_schedule,
    slo_met,
    steady_run,
    sustained_max_rate,
)
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion
from workloads.load_result import Percentiles
from workloads.schedule import Api, ScheduledRequest
from workloads.slo import Slo
from workloads.spec import SessionStart, WorkloadSpec, load_workload
from workloads.traces import TraceRecord

LLAMA = resolve_model("llama-3.1-8b")
SLO = Slo.p99(ttft_ms=60_000.0, tpot_ms=1000.0)


def _setup(gpu: str = "H100-80GB", **params: Any) -> Setup:
    return Setup(LLAMA, get_gpu(gpu), VllmVersion.current(), ServingParams(**params))


def _records(outputs: list[int], send_s: list[float]) -> list[TraceRecord]:
    return [
        TraceRecord(arrival_s=s, prompt_tokens=200, output_tokens=n)
        for s, n in zip(send_s, outputs, strict=True)
    ]


def _run(records: list[TraceRecord], **kwargs: Any) -> SimulationResult:
    setup = _setup("L4-24GB", max_model_len=4096)
    _, engine = build_engine(setup.model, setup.gpu, setup.params, setup.version, setup.options)
    assert engine is not None
    return run(engine, records, slo=SLO, vocab=LLAMA.vocab_size, max_model_len=4096, **kwargs)


def test_a_follower_arrives_its_think_time_after_the_answer_not_at_its_plan() -> None:
    # The answer takes seconds on an L4; the next turn was planned 0.1 s after the first.
    alone = _run(_records([400], [0.0]))
    answer_s = alone.e2e_ms.p50 / 1000.0
    assert answer_s > 1.0
    result = _run(_records([400, 16], [0.0, 0.1]), follows=[None, 0], think_s=[0.0, 2.5])
    assert result.arrivals_s[0] == 0.0
    assert result.arrivals_s[1] == pytest.approx(answer_s + 2.5)
    assert result.num_finished == 2
    # Without follows the plan holds: the second request arrives at 0.1 s, as before.
    planned = _run(_records([400, 16], [0.0, 0.1]))
    assert planned.arrivals_s == (0.0, 0.1)
    assert (
        planned.model_dump()
        == _run(_records([400, 16], [0.0, 0.1]), follows=[None, None]).model_dump()
    )


def test_a_refused_turn_releases_its_follower_at_once() -> None:
    records = [
        TraceRecord(arrival_s=1.0, prompt_tokens=0, output_tokens=8),  # empty: refused
        TraceRecord(arrival_s=1.5, prompt_tokens=100, output_tokens=8),
    ]
    result = _run(records, follows=[None, 0], think_s=[0.0, 0.5])
    assert result.arrivals_s == (1.0, 1.5)
    assert result.num_failed == 1 and result.num_finished == 1


def test_the_schedules_follows_map_to_their_predecessor() -> None:
    def turn(i: int, send_s: float, follows: str | None) -> ScheduledRequest:
        return ScheduledRequest(
            request_id=f"s-{i}", send_s=send_s, api=Api.COMPLETIONS, prompt_tokens=50,
            max_tokens=300, prompt="hello " * 50, follows=follows, think_time_s=1.0,
        )  # fmt: skip

    schedule = [turn(0, 0.0, None), turn(1, 0.2, "s-0"), turn(2, 0.3, "gone")]
    setup = _setup("L4-24GB", max_model_len=4096)
    _, followed = simulate_schedule(setup, schedule, SLO)
    _, planned = simulate_schedule(setup, schedule, SLO, follow_answers=False)
    assert followed is not None and planned is not None
    assert planned.arrivals_s == (0.0, 0.2, 0.3)
    assert followed.arrivals_s[1] is not None and followed.arrivals_s[1] > 1.0  # after the answer
    assert followed.arrivals_s[2] == 0.3  # its predecessor is not in the schedule: at send_s


def test_the_measured_window_counts_only_its_arrivals() -> None:
    records = _records([32] * 10, [float(i) for i in range(10)])
    whole = _run(records)
    window = _run(records, measure_from_s=4.0, measure_to_s=8.0, sample_every_s=0.25)
    assert whole.num_requests == 10
    assert window.num_requests == window.num_finished == 4
    assert window.duration_s == pytest.approx(4.0)
    assert window.request_throughput == pytest.approx(1.0)
    assert window.samples and all(
        b.t_s - a.t_s >= 0.25 for a, b in zip(window.samples, window.samples[1:], strict=False)
    )


def test_requests_cut_before_their_first_token_break_a_ttft_objective() -> None:
    """A run cut while its window's requests still wait for their first token has no TTFT
    samples of them: their TTFT is past the cut, so a TTFT objective breaks (before, a run
    so far past capacity that none got one passed, and the twin's prediction after a fit
    climbed to 22,743 sessions/s)."""
    many = [
        TraceRecord(arrival_s=0.01 * i, prompt_tokens=3000, output_tokens=64) for i in range(400)
    ]
    cut = _run(many, stop_at_s=4.0, measure_from_s=0.0, measure_to_s=4.0)
    assert cut.num_requests == 400 and cut.num_failed == 0
    assert cut.num_without_first_token > 4  # more than 1% of the window's requests
    spec = _single_turn()  # TTFT p99 <= 1 s
    assert cut.ttft_ms.count + cut.num_without_first_token == 400
    assert not slo_met(spec, cut)
    # the timed requests alone within the limits: only those left waiting break it
    fast = {"ttft_ms": Percentiles.from_values([100.0] * 50), "tpot_ms": Percentiles()}
    assert not slo_met(spec, cut.model_copy(update=fast))
    assert slo_met(spec, cut.model_copy(update={**fast, "num_without_first_token": 0}))
    # no more left waiting than the p99 allows (1 of 151): as the timed ones say
    many_fast = {"ttft_ms": Percentiles.from_values([100.0] * 150), "tpot_ms": Percentiles()}
    assert slo_met(spec, cut.model_copy(update={**many_fast, "num_without_first_token": 1}))
    assert not slo_met(spec, cut.model_copy(update={**fast, "num_without_first_token": 1}))
    # a run that served every request in time has none waiting
    light = _run(_records([32] * 10, [float(i) for i in range(10)]))
    assert light.num_without_first_token == 0


CHAT = load_workload("chat")


def test_steady_run_holds_well_below_capacity() -> None:
    p = steady_run(_setup(), CHAT, 3.0, warmup_s=15.0, window_s=30.0)
    assert p.met and not p.backlog
    assert p.result is not None and p.result.num_requests > 200
    assert {t.signal.value for t in p.trends} == {"waiting", "kv_usage"}


def test_above_capacity_the_queue_grows_where_an_8s_cold_window_still_meets_the_slos() -> None:
    # chat on an H100 sustains about 5-7 conversations/s; at 8/s the 8-s window from an
    # empty server (what levels measured before) still holds, the steady state does not.
    cold = level_workload(CHAT, None, 8.0)
    assert cold.sessions is not None
    cold = cold.model_copy(
        update={"sessions": cold.sessions.model_copy(update={"start": SessionStart.EMPTY})}
    )
    assert predict(_setup(), cold, 8.0).met
    p = steady_run(_setup(), CHAT, 8.0, warmup_s=20.0, window_s=90.0)
    assert not p.met
    assert p.backlog


def _single_turn() -> WorkloadSpec:
    return WorkloadSpec.model_validate(
        {
            "name": "unit",
            "api": "completions",
            "arrival": {"kind": "poisson", "rate_per_s": 4.0},
            "prompt_tokens": {"kind": "uniform", "low": 200, "high": 600},
            "output_tokens": {"kind": "fixed", "value": 128},
            "duration_s": 10,
            "seed": 3,
            "slo": {"ttft": {"p99_ms": 1000}, "tpot": {"p99_ms": 100}},
        }
    )


def test_sustained_max_rate_brackets_the_steady_state() -> None:
    spec = _single_turn()
    setup = _setup("L4-24GB", max_model_len=4096)
    rate = sustained_max_rate(setup, spec, warmup_s=5.0, window_s=15.0, precision=0.1)
    assert rate > 0.0
    assert steady_run(setup, spec, rate, warmup_s=5.0, window_s=15.0).met
    assert not steady_run(setup, spec, 2.0 * rate, warmup_s=5.0, window_s=15.0).met


def test_closed_workloads_have_no_rate_to_search() -> None:
    batch = load_workload("batch")
    assert sustained_max_rate(_setup(), batch, warmup_s=5.0, window_s=10.0) == 0.0

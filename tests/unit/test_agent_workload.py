"""The built-in ``agent`` workload: sessions of tool-call rounds that resend one shared
system-and-tools prefix and the growing transcript, a think time (the tool's run) drawn
per round, and a goodput the twin measures on llama-3.1-8b / H100-80GB."""

from __future__ import annotations

import itertools
import json
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from tests.virtual import tuner_cli
from tuner.serving.level_schedule import plan_level_schedule
from tuner.serving.load import resolve_workload
from tuner.serving.processes import ChildRegistry
from tuner.serving.server import Backend, LaunchSpec
from tuner.twin.virtual_server import VirtualServer
from tuner.vllm.memory import ServingParams
from workloads.build import build_schedule
from workloads.schedule import ScheduledRequest
from workloads.spec import (
    LognormalThinkTime,
    SessionSpec,
    SessionStart,
    WorkloadError,
    WorkloadSpec,
    load_workload,
    validate_workload,
)
from workloads.stationary import lookback_s, turn_gap_s
from workloads.think import longest_think_s, mean_think_s, sample_think_s


def _agent(duration_s: float = 120.0) -> WorkloadSpec:
    """``agent`` in its steady state (the sessions already under way at offset 0)."""
    spec = load_workload("agent")
    assert spec.sessions is not None
    sessions = spec.sessions.model_copy(update={"start": SessionStart.STATIONARY})
    return spec.model_copy(update={"sessions": sessions, "duration_s": duration_s})


@pytest.fixture(scope="module")
def schedule() -> list[ScheduledRequest]:
    return build_schedule(_agent())


def _sessions(schedule: list[ScheduledRequest]) -> dict[str, list[ScheduledRequest]]:
    by_session: dict[str, list[ScheduledRequest]] = defaultdict(list)
    for request in schedule:
        assert request.session_id is not None
        by_session[request.session_id].append(request)
    return {k: sorted(v, key=lambda r: r.turn) for k, v in by_session.items()}


def test_the_agent_workload_declares_its_shape() -> None:
    spec = load_workload("agent")
    assert spec.sessions is not None and spec.shared_prefix is not None
    assert spec.shared_prefix.system_prompt_tokens >= 2048 and spec.shared_prefix.fraction >= 0.9
    assert isinstance(spec.sessions.think_time_s, LognormalThinkTime)
    assert spec.slo.objectives(), "an agent workload states its SLO"


def test_at_least_90_percent_of_calls_share_the_tools_prefix(
    schedule: list[ScheduledRequest],
) -> None:
    spec = load_workload("agent")
    assert spec.shared_prefix is not None
    systems = [
        r.messages[0]["content"]
        for r in schedule
        if r.messages and r.messages[0]["role"] == "system"
    ]
    most_common = statistics.mode(systems)
    share = sum(s == most_common for s in systems) / len(schedule)
    assert share >= 0.9
    # a prefix of the declared size: its words are what the simulator counts
    assert len(most_common.split()) == spec.shared_prefix.system_prompt_tokens


def test_the_transcript_grows_every_round(schedule: list[ScheduledRequest]) -> None:
    grown = 0
    for turns in _sessions(schedule).values():
        for before, after in itertools.pairwise(turns):
            assert before.messages is not None and after.messages is not None
            if after.turn != before.turn + 1:
                continue  # a turn not in the schedule (a session under way at offset 0)
            # the whole earlier call, its answer (the tool call), then the tool's result
            assert after.messages[: len(before.messages)] == before.messages
            assert [m["role"] for m in after.messages[len(before.messages) :]] == [
                "assistant",
                "user",
            ]
            assert after.prompt_tokens > before.prompt_tokens + before.max_tokens
            assert after.follows == before.request_id
            grown += 1
    assert grown > 100


def test_calls_are_as_long_as_the_stated_source_says(schedule: list[ScheduledRequest]) -> None:
    """Mooncake's toolagent trace: 8,596 input and 182 output tokens a call on average;
    the declared lengths give about that in the steady state."""
    measured = [r for r in schedule if not r.warmup]
    assert statistics.mean(r.prompt_tokens for r in measured) == pytest.approx(8596, rel=0.15)
    assert statistics.mean(r.max_tokens for r in measured) == pytest.approx(182, rel=0.15)
    assert max(r.turn for r in measured) >= 15  # many rounds a session


def test_think_times_are_the_declared_lognormal(schedule: list[ScheduledRequest]) -> None:
    spec = load_workload("agent")
    assert spec.sessions is not None
    think = spec.sessions.think_time_s
    assert isinstance(think, LognormalThinkTime)
    later = [r.think_time_s for r in schedule if r.turn > 0]
    assert len(later) > 500
    assert all(think.low_s <= t <= (think.high_s or np.inf) for t in later)
    assert statistics.median(later) == pytest.approx(think.median_s, rel=0.15)
    assert statistics.mean(later) == pytest.approx(mean_think_s(spec.sessions), rel=0.15)
    assert mean_think_s(spec.sessions) == pytest.approx(5.0, abs=0.1)  # the source's mean
    # turns are planned one answer and that turn's own think time apart
    for turns in _sessions(schedule).values():
        for before, after in itertools.pairwise(turns):
            if after.turn == before.turn + 1 and before.send_s >= 0:
                gap = after.send_s - before.send_s
                assert gap == pytest.approx(
                    turn_gap_s(spec.sessions, before.max_tokens, think_s=after.think_time_s)
                )


def test_a_constant_think_time_is_the_same_schedule_as_before() -> None:
    """A number of seconds draws nothing: every turn carries it, as it always has."""
    chat = build_schedule(load_workload("chat"))
    assert {r.think_time_s for r in chat} == {5.0}


@pytest.mark.parametrize(
    ("think", "expected_mean"),
    [
        ({"kind": "uniform", "low_s": 1.0, "high_s": 3.0}, 2.0),
        ({"kind": "lognormal", "median_s": 2.0, "sigma": 0.0}, 2.0),
        ({"kind": "lognormal", "median_s": 2.0, "sigma": 1.0}, 2.0 * np.exp(0.5)),
        ({"kind": "lognormal", "median_s": 2.0, "sigma": 1.55, "low_s": 0.1, "high_s": 30.0}, None),
        (4.0, 4.0),
    ],
)
def test_mean_think_time_is_what_draws_average(
    think: float | dict[str, object], expected_mean: float | None
) -> None:
    sessions = SessionSpec.model_validate(
        {"turns": {"kind": "fixed", "value": 2}, "think_time_s": think}
    )
    draws = sample_think_s(sessions, 200_000, np.random.default_rng(3))
    assert float(draws.mean()) == pytest.approx(mean_think_s(sessions), rel=0.02)
    if expected_mean is not None:
        assert mean_think_s(sessions) == pytest.approx(expected_mean, rel=1e-6)
    assert float(draws.max()) <= longest_think_s(sessions) + 1e-9


def test_the_look_back_holds_the_longest_think_times() -> None:
    spec = _agent()
    assert spec.sessions is not None
    longest_gap = turn_gap_s(spec.sessions, 768, think_s=30.0)
    assert lookback_s(spec) == pytest.approx(19 * longest_gap)


@pytest.mark.parametrize(
    ("think", "message"),
    [
        ({"kind": "gamma", "mean_s": 2}, "sessions.think_time_s.kind 'gamma' is not accepted; "
         "accepted: lognormal, uniform (or a number of seconds)"),
        ({"kind": "lognormal", "median_s": 0, "sigma": 1},
         "sessions.think_time_s.median_s 0 is not accepted; accepted: greater than 0"),
        ({"kind": "uniform", "low_s": 5, "high_s": 1},
         "sessions.think_time_s: low_s 5.0 is above high_s 1.0"),
        ({"kind": "lognormal", "median_s": 2, "sigma": 1, "mean_s": 5},
         "sessions.think_time_s.mean_s is not a field here; accepted: high_s, kind, low_s, "
         "median_s, sigma"),
        (-1, "sessions.think_time_s -1 is not accepted; accepted: greater than or equal to 0"),
        ([1, 2], "sessions.think_time_s is not accepted; accepted: a number of seconds or a "
         "mapping with kind lognormal or uniform"),
    ],
)  # fmt: skip
def test_a_bad_think_time_is_one_line(think: object, message: str) -> None:
    data = load_workload("agent").model_dump(mode="json")
    data["sessions"]["think_time_s"] = think
    with pytest.raises(WorkloadError) as err:
        validate_workload(data, label="agent.yaml")
    assert str(err.value) == f"workload agent.yaml: {message}"


def test_the_twin_measures_a_goodput_for_agents_on_an_h100(tmp_path: Path) -> None:
    """One level of ``agent`` on llama-3.1-8b / H100-80GB on the twin's virtual clock: its
    calls meet the SLO and count towards a goodput above zero."""
    launch = LaunchSpec(
        backend=Backend.SIM, model="llama-3.1-8b", gpu="H100-80GB",
        params=ServingParams(max_model_len=32768), cache_dir=tmp_path / "vllm-cache",
    )  # fmt: skip
    spec = resolve_workload("agent", rate_per_s=None, duration_s=None)
    level_spec, level_plan, level = plan_level_schedule(
        spec, 0.3, window_s=20.0, warmup_s=10.0, max_model_len=32768
    )
    server = VirtualServer(launch, trial_dir=tmp_path / "t", registry=ChildRegistry(tmp_path))
    with server:
        assert server.ready
        m = server.measure(
            level_spec, level, out_dir=tmp_path / "level", drain_s=4.0, level=level_plan
        )
    assert m.load.num_requests > 20
    assert m.load.goodput > 0 and m.slo.met
    assert m.server is not None and m.server.prefix_cache_hit_rate is not None
    assert m.server.prefix_cache_hit_rate > 0.5  # the tools prefix and transcripts come back


def test_tuner_simulate_runs_the_agent_workload() -> None:
    """`tuner simulate --workload agent`: its sessions on the virtual clock, its own SLO."""
    done = tuner_cli(
        "simulate", "--model", "llama-3.1-8b", "--gpu", "H100-80GB", "--workload", "agent",
        "--duration", "30", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["num_finished"] > 50 and result["num_failed"] == 0
    assert result["goodput"] > 0
    assert result["prefix_cache_hit_rate"] > 0.5  # the tools prefix and the transcripts


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--workload", "agent", "--trace", "builtin:azure-code"),
         "give --trace FILE or --workload NAME, not both"),
        (("--workload", "batch"), "--workload 'batch' is a closed batch; accepted: "),
        (("--workload", "agentt"), "workload 'agentt' is not built in; built-in workloads: agent,"),
    ],
)  # fmt: skip
def test_tuner_simulate_refuses_a_bad_workload_in_one_line(
    extra: tuple[str, ...], message: str
) -> None:
    done = tuner_cli("simulate", "--model", "llama-3.1-8b", *extra)
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1

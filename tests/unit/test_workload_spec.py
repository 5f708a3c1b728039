"""WorkloadSpec: built-ins load, bad specs are one-line WorkloadErrors, with_rate, SLOs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from workloads.build import build_schedule
from workloads.schedule import Api
from workloads.slo import SloMetric, SloObjective
from workloads.spec import (
    ClosedArrival,
    DiurnalArrival,
    PoissonArrival,
    RampArrival,
    TraceArrival,
    WorkloadError,
    WorkloadSpec,
    builtin_workloads,
    load_workload,
    parse_workload,
    validate_workload,
)

BUILTINS = ["agent", "batch", "chat", "code", "mixed-long-short", "rag"]


def minimal(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "t",
        "api": "completions",
        "arrival": {"kind": "poisson", "rate_per_s": 5},
        "prompt_tokens": {"kind": "fixed", "value": 10},
        "output_tokens": {"kind": "fixed", "value": 5},
        "duration_s": 10,
        "seed": 7,
    }
    spec.update(overrides)
    return spec


def write_yaml(tmp_path: Path, data: dict[str, Any], name: str = "chat.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def error_of(tmp_path: Path, data: dict[str, Any]) -> str:
    path = write_yaml(tmp_path, data)
    with pytest.raises(WorkloadError) as err:
        load_workload(path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"workload {path}: ")
    return message.removeprefix(f"workload {path}: ")


def test_the_builtins_are_the_documented_ones() -> None:
    assert builtin_workloads() == BUILTINS


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_loads_and_builds_a_schedule(name: str) -> None:
    spec = load_workload(name)
    assert spec.name == name
    assert spec.duration_s == 60
    assert spec.warmup.duration_s == 5 and spec.warmup.requests == 10
    assert spec.slo.objectives()
    schedule = build_schedule(spec)
    assert len(schedule) > 50
    assert [r.send_s for r in schedule] == sorted(r.send_s for r in schedule)
    assert len({r.request_id for r in schedule}) == len(schedule)
    assert schedule[0].warmup and not all(r.warmup for r in schedule)
    for request in schedule:
        assert request.api is spec.api and request.max_tokens >= 1
        if request.api is Api.COMPLETIONS:
            assert request.prompt is not None and request.messages is None
            assert request.prompt_tokens == len(request.prompt.split())
        else:
            assert request.messages is not None and request.prompt is None
            words = sum(len(m["content"].split()) + 1 for m in request.messages)
            assert request.prompt_tokens == words


def test_builtin_shapes() -> None:
    chat = load_workload("chat")
    assert chat.sessions is not None and chat.shared_prefix is not None
    assert chat.shared_prefix.system_prompt_tokens == 300 and chat.shared_prefix.fraction == 0.8
    assert isinstance(chat.arrival, PoissonArrival)
    assert chat.slo.objectives() == [
        SloObjective(metric=SloMetric.TTFT, percentile=99, limit_ms=2000),
        SloObjective(metric=SloMetric.TPOT, percentile=99, limit_ms=100),
    ]
    code = load_workload("code")
    assert code.api is Api.COMPLETIONS
    assert isinstance(code.arrival, TraceArrival) and code.arrival.path == "builtin:azure-code"
    batch = load_workload("batch")
    assert isinstance(batch.arrival, ClosedArrival) and batch.ignore_eos
    assert {r.max_tokens for r in build_schedule(batch)} == {1000}
    rag = build_schedule(load_workload("rag"))
    assert all(3000 <= r.prompt_tokens - 150 - 2 <= 6000 for r in rag)  # system 150 + 2 roles
    mixed = build_schedule(load_workload("mixed-long-short"))
    assert any(r.prompt_tokens >= 4096 for r in mixed)
    assert sum(r.prompt_tokens <= 300 for r in mixed) > 0.85 * len(mixed)


def test_names_are_case_insensitive() -> None:
    assert load_workload("CHAT").name == "chat"
    assert load_workload(" Mixed-Long-Short ").name == "mixed-long-short"


def test_unknown_name_lists_the_builtins() -> None:
    with pytest.raises(WorkloadError) as err:
        load_workload("chatt")
    assert str(err.value) == (
        "workload 'chatt' is not built in; built-in workloads: agent, batch, chat, code, "
        "mixed-long-short, rag"
    )


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(
        WorkloadError, match="does not exist; or use a built-in workload: agent, batch"
    ):
        load_workload(tmp_path / "nope.yaml")


def test_a_trace_replayed_as_recorded_has_its_own_rate_not_none(tmp_path: Path) -> None:
    """Without ``rate_per_s`` a trace keeps its recorded pace; its rate is that pace (a
    workload with no rate is a closed batch to the tuner, which has no peak to plan)."""
    from workloads.arrivals import trace_pass_s
    from workloads.traces import load_trace, resolve_trace

    spec = load_workload(
        write_yaml(tmp_path, minimal(arrival={"kind": "trace", "path": "builtin:azure-code"}))
    )
    records = load_trace(resolve_trace("builtin:azure-code"))
    assert spec.mean_rate_per_s == pytest.approx(len(records) / trace_pass_s(records, None))
    assert spec.with_rate(2.0).mean_rate_per_s == 2.0


def test_a_trace_given_as_the_workload_says_how_to_replay_it() -> None:
    trace = Path(__file__).parents[2] / "workloads" / "data"
    path = next(trace.glob("*.csv"))
    with pytest.raises(WorkloadError) as err:
        load_workload(str(path))
    message = str(err.value)
    assert "\n" not in message
    assert f"workload {str(path)!r} is a trace, not a workload" in message
    assert f"arrival: {{kind: trace, path: {path.resolve()}}}" in message


def test_a_trace_is_known_by_its_content_not_its_name(tmp_path: Path) -> None:
    """As ``workloads.traces`` reads it: a JSONL trace saved as .txt is still a trace."""
    path = tmp_path / "traffic.txt"
    path.write_text('{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 3}\n')
    with pytest.raises(WorkloadError, match="is a trace, not a workload; accepted: a built-in"):
        load_workload(str(path))


def test_bad_arrival_kind_names_the_value_and_the_accepted_kinds(tmp_path: Path) -> None:
    message = error_of(tmp_path, minimal(arrival={"kind": "poison", "rate_per_s": 1}))
    assert message == (
        "arrival.kind 'poison' is not accepted; "
        "accepted: poisson, gamma, ramp, diurnal, trace, closed"
    )


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"duration_s": -1}, "duration_s -1 is not accepted; accepted: greater than 0"),
        ({"api": "embeddings"}, "api 'embeddings' is not accepted; accepted: completions, chat"),
        (
            {"rate": 3},
            "rate is not a field here; accepted: api, arrival, description, duration_s,",
        ),
        ({"arrival": {"kind": "poisson"}}, "arrival.rate_per_s is missing"),
        ({"arrival": {"rate_per_s": 1}}, "arrival.kind is missing; accepted: poisson, gamma"),
        (
            {"arrival": {"kind": "gamma", "rate_per_s": 1, "burstiness": 0}},
            "arrival.burstiness 0 is not accepted; accepted: greater than 0",
        ),
        (
            {"arrival": {"kind": "poisson", "rate_per_s": 1, "burst": 2}},
            "arrival.burst is not a field here; accepted: kind, rate_per_s",
        ),
        (
            {"arrival": {"kind": "ramp", "start_rate_per_s": 0, "end_rate_per_s": 0}},
            "arrival: start_rate_per_s and end_rate_per_s are both 0",
        ),
        (
            {"arrival": {"kind": "diurnal", "peak_rate_per_s": 1, "trough_rate_per_s": 2}},
            "arrival: trough_rate_per_s 2.0 is above peak_rate_per_s 1.0",
        ),
        (
            {"prompt_tokens": {"kind": "uniform", "low": 10, "high": 5}},
            "prompt_tokens: low 10 is above high 5",
        ),
        (
            {"prompt_tokens": {"kind": "lognormal", "median": "big", "sigma": 1}},
            "prompt_tokens.median 'big' is not accepted; accepted: a valid number",
        ),
        (
            {"output_tokens": {"kind": "zipf"}},
            "output_tokens.kind 'zipf' is not accepted; accepted: fixed, uniform, lognormal, "
            "trace, mixture",
        ),
        (
            {
                "prompt_tokens": {
                    "kind": "mixture",
                    "components": [{"weight": 1, "length": {"kind": "fixed", "value": 0}}],
                }
            },
            "prompt_tokens.components[0].length.value 0 is not accepted; accepted: greater than 0",
        ),
        (
            {"shared_prefix": {"system_prompt_tokens": 100, "fraction": 1.5}},
            "shared_prefix.fraction 1.5 is not accepted; accepted: less than or equal to 1",
        ),
        ({"slo": {"ttft": {}}}, "slo.ttft: give at least one of p50_ms, p90_ms, p99_ms"),
        (
            {"slo": {"ttft": {"p95_ms": 10}}},
            "slo.ttft.p95_ms is not a field here; accepted: p50_ms, p90_ms, p99_ms",
        ),
        (
            {"arrival": {"kind": "trace", "path": "builtin:azure-chat"}},
            "arrival.path: trace 'builtin:azure-chat' is not shipped; built-in traces: "
            "builtin:azure-code",
        ),
        (
            {"arrival": {"kind": "trace", "path": "nowhere.csv"}},
            "arrival.path: trace 'nowhere.csv' is not a file",
        ),
        (
            {"prompt_tokens": {"kind": "trace"}},
            "prompt_tokens kind 'trace' without a path takes each request's length from its "
            "trace row, which needs arrival.kind 'trace'",
        ),
    ],
)
def test_bad_fields_are_one_line_naming_the_value(
    tmp_path: Path, overrides: dict[str, Any], expected: str
) -> None:
    assert error_of(tmp_path, minimal(**overrides)).startswith(expected)


def test_trace_lengths_from_rows_do_not_combine_with_sessions(tmp_path: Path) -> None:
    data = minimal(
        arrival={"kind": "trace", "path": "builtin:azure-code"},
        prompt_tokens={"kind": "trace"},
        sessions={"turns": {"kind": "fixed", "value": 2}},
    )
    assert "cannot be combined with sessions" in error_of(tmp_path, data)


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\narrival: {kind: poisson\n")
    with pytest.raises(WorkloadError) as err:
        load_workload(path)
    assert str(err.value).startswith(f"workload {path}: line ")
    assert "\n" not in str(err.value)


def test_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(WorkloadError, match="expected a mapping of fields"):
        load_workload(path)


def test_name_defaults_to_the_file_stem(tmp_path: Path) -> None:
    data = minimal()
    del data["name"]
    assert load_workload(write_yaml(tmp_path, data, "my-load.yml")).name == "my-load"


def test_relative_trace_path_is_relative_to_the_yaml(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    trace = tmp_path / "traces" / "t.jsonl"
    trace.write_text(
        '{"arrival_s": 0, "prompt_tokens": 30, "output_tokens": 4}\n'
        '{"arrival_s": 1, "prompt_tokens": 40, "output_tokens": 5}\n'
    )
    data = minimal(
        arrival={"kind": "trace", "path": "traces/t.jsonl"},
        prompt_tokens={"kind": "trace"},
        output_tokens={"kind": "trace"},
        duration_s=1.5,
    )
    spec = load_workload(write_yaml(tmp_path, data))
    assert isinstance(spec.arrival, TraceArrival)
    assert spec.arrival.path == str(trace.resolve())
    assert [(r.prompt_tokens, r.max_tokens) for r in build_schedule(spec)] == [(30, 4), (40, 5)]


def test_specs_are_frozen_and_forbid_extras() -> None:
    spec = validate_workload(minimal())
    with pytest.raises(ValueError, match="frozen"):
        spec.seed = 3  # type: ignore[misc]
    with pytest.raises(WorkloadError, match="colour is not a field here"):
        validate_workload(minimal(colour="red"))


class TestWithRate:
    def test_poisson(self) -> None:
        spec = validate_workload(minimal()).with_rate(12.5)
        assert isinstance(spec.arrival, PoissonArrival) and spec.arrival.rate_per_s == 12.5
        assert spec.mean_rate_per_s == 12.5

    def test_ramp_and_diurnal_keep_their_shape(self) -> None:
        ramp = validate_workload(
            minimal(arrival={"kind": "ramp", "start_rate_per_s": 1, "end_rate_per_s": 3})
        ).with_rate(4)
        assert isinstance(ramp.arrival, RampArrival)
        assert (ramp.arrival.start_rate_per_s, ramp.arrival.end_rate_per_s) == (2, 6)
        day = validate_workload(
            minimal(
                arrival={"kind": "diurnal", "peak_rate_per_s": 9, "trough_rate_per_s": 1},
            )
        ).with_rate(10)
        assert isinstance(day.arrival, DiurnalArrival)
        assert (day.arrival.peak_rate_per_s, day.arrival.trough_rate_per_s) == (18, 2)

    def test_trace(self) -> None:
        spec = load_workload("code").with_rate(9)
        assert isinstance(spec.arrival, TraceArrival) and spec.arrival.rate_per_s == 9

    def test_the_original_is_unchanged(self) -> None:
        spec = validate_workload(minimal())
        spec.with_rate(99)
        assert spec.mean_rate_per_s == 5

    def test_closed_has_no_rate(self) -> None:
        with pytest.raises(WorkloadError, match=r"closed .* has no rate"):
            load_workload("batch").with_rate(3)

    @pytest.mark.parametrize("rate", [0, -1.0, float("nan"), float("inf")])
    def test_rate_must_be_positive(self, rate: float) -> None:
        with pytest.raises(WorkloadError, match="is not accepted; accepted: a finite number > 0"):
            validate_workload(minimal()).with_rate(rate)


@pytest.mark.parametrize("duration", [0, -5.0, float("nan"), float("inf")])
def test_a_duration_override_must_be_a_finite_positive_number(duration: float) -> None:
    with pytest.raises(WorkloadError, match=f"duration {duration!r} is not accepted"):
        validate_workload(minimal()).with_duration(duration)
    assert validate_workload(minimal()).with_duration(12).duration_s == 12.0


@pytest.mark.parametrize(
    ("path", "value", "where"),
    [
        (("arrival", "rate_per_s"), ".inf", "arrival.rate_per_s"),
        (("arrival", "rate_per_s"), ".nan", "arrival.rate_per_s"),
        (("duration_s",), ".inf", "duration_s"),
        (("warmup", "duration_s"), ".inf", "warmup.duration_s"),
        (("prompt_tokens", "median"), ".inf", "prompt_tokens.median"),
        (("sessions", "think_time_s"), ".nan", "sessions.think_time_s"),
    ],
)
def test_nan_and_infinity_in_a_spec_are_one_line(
    path: tuple[str, ...], value: str, where: str
) -> None:
    """YAML's .inf and .nan are floats: no rate, duration or length can be one."""
    data = minimal(prompt_tokens={"kind": "lognormal", "median": 100, "sigma": 0.5})
    data.setdefault("sessions", {"turns": {"kind": "fixed", "value": 2}})
    data.setdefault("warmup", {})
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = yaml.safe_load(value)
    with pytest.raises(WorkloadError) as err:
        parse_workload(yaml.safe_dump(data), label="w.yaml")
    message = str(err.value)
    assert message.startswith(f"workload w.yaml: {where} ") and "finite number" in message
    assert "\n" not in message


def test_slo_objectives_are_typed() -> None:
    spec = validate_workload(
        minimal(slo={"ttft": {"p50_ms": 300, "p99_ms": 2000}, "e2e": {"p90_ms": 9000}})
    )
    assert spec.slo.objectives() == [
        SloObjective(metric=SloMetric.TTFT, percentile=50, limit_ms=300),
        SloObjective(metric=SloMetric.TTFT, percentile=99, limit_ms=2000),
        SloObjective(metric=SloMetric.E2E, percentile=90, limit_ms=9000),
    ]


def test_defaults() -> None:
    spec = WorkloadSpec.model_validate(minimal())
    assert spec.stream and spec.ignore_eos
    assert spec.warmup.duration_s == 0 and spec.warmup.requests == 0
    assert spec.slo.objectives() == []

"""The drain of a replica: its timing, and the preStop program's parser and waiting loop.

The program is imported from the file it is written to, as the pod runs it.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import ValidationError

from tests.programs import top_level_imports
from tuner.drain import (
    DEFAULT_BOUND_S,
    DEFAULT_POLL_S,
    DEFAULT_SETTLE_S,
    MAX_BOUND_S,
    MIN_BOUND_S,
    DrainTiming,
    drain_script,
    drain_timing,
)
from tuner.errors import ConfigError
from tuner.serving.prometheus_scrape import parse_prometheus
from tuner.serving.server import free_port
from tuner.sim.prometheus import EngineSnapshot, ServerMetrics

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    path = tmp_path_factory.mktemp("drain") / "drain.py"
    path.write_text(drain_script())
    spec = importlib.util.spec_from_file_location("drain_program", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- timing ---------------------------------------------------------------------------------


def test_bound_grows_with_the_measured_p99() -> None:
    bounds = [drain_timing(p99).bound_s for p99 in (10_000, 20_000, 60_000, 300_000)]
    assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds)
    # settle 5 + ceil(2 x 12.3 s) 25 + margin 5
    assert drain_timing(12_300).bound_s == 35
    assert drain_timing(60_000, settle_s=2).bound_s == 2 + 120 + 5


def test_bound_has_a_floor_a_ceiling_and_a_default() -> None:
    assert drain_timing(0).bound_s == MIN_BOUND_S == 30
    assert drain_timing(800).bound_s == MIN_BOUND_S
    assert drain_timing(5 * 3600 * 1000).bound_s == MAX_BOUND_S == 3600
    assert drain_timing(None).bound_s == DEFAULT_BOUND_S


def test_grace_period_is_settle_bound_and_shutdown_in_whole_seconds() -> None:
    timing = drain_timing(40_000, settle_s=4.2, shutdown_s=29.5)
    assert (timing.settle_s, timing.shutdown_s) == (5, 30)  # rounded up
    assert timing.bound_s == 5 + 80 + 5
    assert timing.grace_period_s == 5 + 90 + 30
    assert all(type(v) is int for v in (timing.settle_s, timing.bound_s, timing.grace_period_s))
    assert timing.script_args() == ("--settle-s", "5", "--bound-s", "90")
    assert drain_timing(None, settle_s=0, shutdown_s=0).grace_period_s == DEFAULT_BOUND_S


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"p99_e2e_ms": -1.0}, "p99_e2e_ms -1.0"),
        ({"p99_e2e_ms": math.nan}, "p99_e2e_ms nan"),
        ({"p99_e2e_ms": math.inf}, "p99_e2e_ms inf"),
        ({"p99_e2e_ms": 1000.0, "settle_s": -1}, "settle_s -1"),
        ({"p99_e2e_ms": 1000.0, "settle_s": 29.5}, "settle_s 29.5"),
        ({"p99_e2e_ms": 1000.0, "shutdown_s": math.nan}, "shutdown_s nan"),
    ],
)
def test_bad_input_is_one_line_naming_it(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=f"^{named} is not accepted; accepted: ") as caught:
        drain_timing(**kwargs)
    assert "\n" not in str(caught.value)


def test_timing_is_frozen_and_its_settle_is_within_its_bound() -> None:
    timing = DrainTiming(settle_s=5, bound_s=40, shutdown_s=30)
    with pytest.raises(ValidationError):
        timing.bound_s = 50  # type: ignore[misc]
    with pytest.raises(ValidationError, match="settle_s 40 is not below bound_s 40"):
        DrainTiming(settle_s=40, bound_s=40, shutdown_s=30)


# --- the program ----------------------------------------------------------------------------


def test_program_imports_the_standard_library_only() -> None:
    tree = ast.parse(drain_script(), feature_version=(3, 8))  # the oldest python3 it meets
    imported = top_level_imports(tree)
    assert imported and imported <= set(sys.stdlib_module_names), imported


def test_program_defaults_are_the_modules(program: ModuleType) -> None:
    args = program.arguments().parse_args([])
    assert (args.url, args.bound_s, args.settle_s, args.poll_s, args.log) == (
        "http://127.0.0.1:8000", DEFAULT_BOUND_S, DEFAULT_SETTLE_S, DEFAULT_POLL_S, None
    )  # fmt: skip
    with pytest.raises(SystemExit):
        program.arguments().parse_args(["--bound-s", "0"])
    with pytest.raises(SystemExit):
        program.arguments().parse_args(["--settle-s", "nan"])


VLLM_EXPOSITION = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="say \\"hi\\" } 9, ok"} 1.0 1733040000000
vllm:num_requests_waiting{engine="1",model_name="m"} 2
# HELP vllm:num_requests_waiting_by_reason Requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 7.0
vllm:num_requests_running_total{engine="0"} 99.0
vllm:num_requests_running{engine="2",model_name="m"} NaN
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 8.0
"""


def test_parser_sums_vllm_gauges_over_label_sets(program: ModuleType) -> None:
    gauges = program.parse_gauges(VLLM_EXPOSITION)
    # Both engines; a quote, brace and comma inside a label value; a timestamp; neither a longer name nor a NaN sample counted.
    assert gauges == {RUNNING: 7.0, WAITING: 3.0}
    # The same numbers as prometheus_client's parser, which the tuner itself uses.
    library = parse_prometheus(VLLM_EXPOSITION.replace("NaN", "0.0"))
    assert (library[RUNNING], library[WAITING]) == (7.0, 3.0)


def test_parser_reads_the_simulators_exposition(program: ModuleType) -> None:
    metrics = ServerMetrics('llama "3" 8b, {test}')
    snapshot = EngineSnapshot(
        num_running=5, num_waiting=2, kv_cache_usage=0.5, num_preemptions=1,
        prompt_tokens=900, generation_tokens=400, prefix_cache_queries=0, prefix_cache_hits=0,
    )  # fmt: skip
    text = metrics.render(snapshot)
    assert program.parse_gauges(text) == {RUNNING: 5.0, WAITING: 2.0}
    everything = program.parse_gauges(text, names=tuple(parse_prometheus(text)))
    assert everything == pytest.approx(parse_prometheus(text))  # every sample, as the library


def test_parser_ignores_what_is_not_a_sample(program: ModuleType) -> None:
    assert program.parse_gauges("") == {}
    cut = 'vllm:num_requests_running{engine="0",model_name="m} 3\nvllm:num_requests_waiting 1\n'
    assert program.parse_gauges(cut) == {WAITING: 1.0}
    assert (
        program.parse_gauges("vllm:num_requests_running{} x\n# vllm:num_requests_waiting 4") == {}
    )


# --- the waiting loop, on a clock of its own ------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now_s += seconds


def run_drain(
    program: ModuleType, reads: list[tuple[int, int] | str], **kwargs: float
) -> tuple[Any, list[tuple[str, str]], list[float]]:
    """drain() with reads given in turn (a string: unreadable for that reason; the last one
    repeats); the outcome, the lines it said and when (from its start) it read."""
    clock = Clock()
    start_s = clock.now_s
    lines: list[tuple[str, str]] = []
    read_at: list[float] = []

    def read(timeout_s: float) -> tuple[int, int]:
        assert timeout_s > 0
        read_at.append(clock.now_s - start_s)
        value = reads[min(len(read_at), len(reads)) - 1]
        if isinstance(value, str):
            raise program.Unreadable(value)
        return value

    def say(level: str, text: str) -> None:
        lines.append((level, text))

    settings = {"bound_s": 60.0, "settle_s": 5.0, "poll_s": 1.0, **kwargs}
    outcome = program.drain(read, say=say, clock=clock, sleep=clock.sleep, **settings)
    return outcome, lines, read_at


def test_waits_the_settle_then_for_two_empty_polls_in_a_row(program: ModuleType) -> None:
    reads: list[tuple[int, int] | str] = [(2, 1), (2, 0), (0, 0), (1, 0), (0, 0), (0, 0)]
    outcome, lines, read_at = run_drain(program, reads)
    # One look at the start, the settle, then a poll a second: a lone 0 is not enough.
    assert read_at == [0.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    assert outcome == program.Outcome(True, 0, 0, 9.0)
    assert [text for _, text in lines] == [
        "preStop drain: 2 running, 1 waiting; waiting 5 s for the endpoints to drop this pod, "
        "then until none is left (at most 60 s in all)",
        "preStop drain: 2 running, 0 waiting after 5.0 s",
        "preStop drain: 0 running, 0 waiting after 6.0 s",
        "preStop drain: 1 running, 0 waiting after 7.0 s",
        "preStop drain: 0 running, 0 waiting after 8.0 s",
        "preStop drain: drained: 0 running, 0 waiting after 9.0 s",
    ]
    assert {level for level, _ in lines} == {"INFO"}


def test_nothing_in_flight_still_waits_the_settle(program: ModuleType) -> None:
    outcome, lines, read_at = run_drain(program, [(0, 0)], settle_s=3.0, poll_s=0.5)
    assert read_at == [0.0, 3.0, 3.5]
    assert outcome.drained and outcome.elapsed_s == 3.5
    assert len(lines) == 2  # the start, and drained (no change between)


def test_returns_at_its_bound_leaving_the_rest_to_sigterm(program: ModuleType) -> None:
    outcome, lines, read_at = run_drain(program, [(3, 1)], bound_s=12.0, poll_s=2.5)
    assert read_at[-1] == 12.0 and max(read_at) <= 12.0
    assert outcome == program.Outcome(False, 3, 1, 12.0)
    assert len(lines) == 2
    assert lines[-1] == (
        "WARNING",
        "preStop drain: bound of 12 s reached with 3 running, 1 waiting: leaving them to SIGTERM",
    )


def test_a_bound_shorter_than_the_settle_cuts_the_settle(program: ModuleType) -> None:
    outcome, _, read_at = run_drain(program, [(1, 0)], bound_s=2.0, settle_s=5.0)
    assert read_at == [0.0, 2.0] and not outcome.drained


def test_unreadable_metrics_are_said_and_retried_until_the_bound(program: ModuleType) -> None:
    outcome, lines, read_at = run_drain(program, ["refused"], bound_s=8.0, settle_s=1.0)
    assert read_at == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert outcome == program.Outcome(False, None, None, 8.0)
    assert [level for level, _ in lines] == ["WARNING", "WARNING"]
    assert "cannot read the requests in flight (refused)" in lines[0][1]
    assert lines[1][1] == (
        "preStop drain: bound of 8 s reached without reading the requests in flight "
        "(refused): leaving them to SIGTERM"
    )


def test_metrics_that_come_back_end_the_drain(program: ModuleType) -> None:
    reads: list[tuple[int, int] | str] = [(1, 0), "timed out", (0, 0), (0, 0)]
    outcome, lines, _ = run_drain(program, reads)
    assert outcome.drained
    assert "cannot read the requests in flight after 5.0 s (timed out)" in lines[1][1]
    assert lines[2][1] == "preStop drain: 0 running, 0 waiting after 6.0 s"


def test_main_with_no_server_says_so_and_exits_0(program: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "drain.log"
    url = f"http://127.0.0.1:{free_port()}"
    argv = ["--url", url, "--bound-s", "0.6", "--settle-s", "0.1", "--poll-s", "0.1"]
    assert program.main([*argv, "--log", str(log)]) == 0
    lines = log.read_text().splitlines()
    assert lines[0].startswith("WARNING ") and "[drain.py] preStop drain: cannot read" in lines[0]
    assert f"{url}/metrics" in lines[0]
    assert "bound of 0.6 s reached without reading the requests in flight" in lines[-1]


def test_main_writes_to_stdout_when_asked(
    program: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert program.main(["--url", url, "--bound-s", "0.2", "--settle-s", "0", "--log", "-"]) == 0
    assert "bound of 0.2 s reached" in capsys.readouterr().out

"""The OOM edge's probes: only an out-of-memory outcome brackets the edge; anything else is
launched once more (its memory released first) and then inconclusive; a probe with failed
requests did not survive; the worst case is held until the KV cache has peaked.

The live server is a stand-in (``StandIn``, the ``ProbeServer`` a real ``LiveServer``
is wrapped in): it starts, fails or dies as a launch on a GPU reports it, which cannot
happen here. The hold's rule reads real files as a load run writes them."""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import pytest

from tuner.run.edge import EdgeProbe, KnobEdge, ProbeVerdict
from tuner.search.config import load_config
from tuner.search.context import StudySetup, TuneContext, resolve
from tuner.search.edge import EdgeSearch
from tuner.serving.live_server import LoadMeasurement, StopFactory
from tuner.serving.load import LOCAL_LOAD, SloVerdict
from tuner.serving.processes import ChildRegistry
from tuner.serving.prometheus_scrape import MetricsSample
from tuner.serving.server import StartupResult, TrialOutcome
from tuner.serving.worst_case_hold import HoldEnd, WorstCaseHold, kv_peaked
from tuner.vllm.failures import StartupFailure, StartupFailureKind
from tuner.vllm.space import Knob, TrialParams
from workloads.load_result import LoadResult, Percentiles
from workloads.schedule import RequestRecord, ScheduledRequest
from workloads.spec import WorkloadSpec

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "workloads" / "tiny.yaml"


def _failure(kind: StartupFailureKind, message: str) -> StartupFailure:
    return StartupFailure(kind=kind, error_type="Error", message=message)


OOM_PROFILING = _failure(
    StartupFailureKind.CUDA_OOM_PROFILING,
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
)
RUNTIME_OOM = _failure(StartupFailureKind.RUNTIME_OOM, "CUDA out of memory while serving")
HUB_401 = _failure(
    StartupFailureKind.MODEL_ACCESS_DENIED,
    "401 Client Error: Unauthorized for url: https://huggingface.co/meta-llama/...",
)


@dataclass
class Behaviour:
    """How one launch goes: its startup, a death under the worst case, failed requests."""

    startup: TrialOutcome = TrialOutcome.READY
    failure: StartupFailure | None = None
    death: StartupFailure | None = None
    request_errors: int = 0
    released: bool | None = None  # what the stop saw of the device memory


HELD = Behaviour()
STARTUP_OOM = Behaviour(TrialOutcome.STARTUP_OOM, OOM_PROFILING)
TIMEOUT = Behaviour(TrialOutcome.STARTUP_TIMEOUT)
CRASH = Behaviour(TrialOutcome.CRASHED)


def _load(requests: int, errors: int) -> LoadResult:
    return LoadResult(
        num_requests=requests, num_completed=requests - errors, num_errors=errors,
        num_not_sent=0, error_rate=errors / requests, window_s=None, duration_s=5.0,
        offered_rate=None, achieved_rate=None, request_throughput=1.0,
        output_token_throughput=10.0, output_tokens=100, prompt_tokens=100, slo=None,
        num_good=requests - errors, goodput=1.0, ttft_ms=Percentiles(), itl_ms=Percentiles(),
        tpot_ms=Percentiles(), e2e_ms=Percentiles(), send_lag_ms=Percentiles(),
        prompt_buckets=(),
    )  # fmt: skip


@dataclass
class StandIn:
    """One probe's server, as ``tuner.search.edge.LiveProbeServer`` presents a real one."""

    behaviour: Behaviour
    out_dir: Path
    events: list[str]
    time_scale: float = 1.0
    generators: object = LOCAL_LOAD
    startup: StartupResult | None = None
    gpu: None = None

    @property
    def ready(self) -> bool:
        return self.startup is not None and self.startup.outcome is TrialOutcome.READY

    def __enter__(self) -> StandIn:
        self.events.append(f"launch {self.out_dir.name}")
        b = self.behaviour
        self.startup = StartupResult(
            outcome=b.startup, failure=b.failure, log_path=str(self.out_dir / "server.log"),
            log_excerpt="(no log)", command=["vllm", "serve"], base_url="http://127.0.0.1:9",
        )  # fmt: skip
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.events.append(f"stop {self.out_dir.name}")

    def measure(
        self,
        workload: WorkloadSpec,
        schedule: list[ScheduledRequest],
        *,
        out_dir: Path,
        stop_when: StopFactory | None = None,
    ) -> LoadMeasurement:
        b = self.behaviour
        death = None
        if b.death is not None:
            death = StartupResult(
                outcome=TrialOutcome.ENGINE_DIED, failure=b.death, log_path="server.log",
                command=[], base_url="http://127.0.0.1:9",
            )  # fmt: skip
        return LoadMeasurement(
            out_dir=str(out_dir),
            outcome=TrialOutcome.ENGINE_DIED if death else TrialOutcome.READY,
            load=_load(len(schedule), b.request_errors),
            slo=SloVerdict(met=True, violations=[]),
            death=death,
        )

    def memory_released(self) -> bool | None:
        return self.behaviour.released

    def await_release(self, timeout_s: float) -> bool:
        self.events.append("await release")
        return True


@dataclass
class Script:
    """The launches of a search: ``plan(value, attempt)`` says how each goes."""

    plan: Callable[[float, int], Behaviour]
    knob: Knob = Knob.GPU_MEMORY_UTILIZATION
    events: list[str] = field(default_factory=list)
    attempts: dict[float, int] = field(default_factory=dict)

    def __call__(self, params: TrialParams, out_dir: Path) -> StandIn:
        value = float(getattr(params, self.knob.field))
        self.attempts[value] = self.attempts.get(value, 0) + 1
        return StandIn(self.plan(value, self.attempts[value]), out_dir, self.events)


@pytest.fixture
def ctx(tmp_path: Path) -> TuneContext:
    config = load_config(
        None,
        {
            "backend": "sim", "gpu": "L4", "model": "llama-3.1-8b", "workload": str(TINY),
            "max_model_len": 256, "run_dir": tmp_path / "run",
        },
    )  # fmt: skip
    return resolve(config)


def _search(ctx: TuneContext, script: Script, tmp_path: Path) -> EdgeSearch:
    search = EdgeSearch(ctx, StudySetup(), ChildRegistry(tmp_path / "run"), None, launcher=script)
    return search


def _params(util: float = 0.9) -> TrialParams:
    return TrialParams(gpu_memory_utilization=util, max_num_seqs=8)


def _probe(ctx: TuneContext, tmp_path: Path, *plan: Behaviour) -> tuple[EdgeProbe, Script]:
    script = Script(lambda value, attempt: plan[min(attempt, len(plan)) - 1])
    found = _search(ctx, script, tmp_path).probe(Knob.GPU_MEMORY_UTILIZATION, _params())
    assert found is not None
    return found, script


# --- one probe's verdict -----------------------------------------------------------------------


def test_a_startup_oom_is_out_of_memory_at_the_first_launch(
    ctx: TuneContext, tmp_path: Path
) -> None:
    found, script = _probe(ctx, tmp_path, STARTUP_OOM)
    assert found.verdict is ProbeVerdict.OUT_OF_MEMORY
    assert not found.survived
    assert script.attempts == {0.9: 1}


def test_a_death_by_runtime_oom_under_the_worst_case_is_out_of_memory(
    ctx: TuneContext, tmp_path: Path
) -> None:
    found, _ = _probe(ctx, tmp_path, Behaviour(death=RUNTIME_OOM))
    assert found.verdict is ProbeVerdict.OUT_OF_MEMORY
    assert found.hold_end is HoldEnd.ENGINE_DIED
    assert found.failure_kind == StartupFailureKind.RUNTIME_OOM.value


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (TIMEOUT, CRASH),
        (CRASH, CRASH),
        (Behaviour(TrialOutcome.INVALID_CONFIG, HUB_401), Behaviour(TrialOutcome.INVALID_CONFIG, HUB_401)),
        (Behaviour(death=_failure(StartupFailureKind.ENGINE_DIED, "EngineDeadError")), TIMEOUT),
    ],
    ids=["timeout-then-crash", "crash-twice", "hub-401-twice", "engine-died-then-timeout"],
)  # fmt: skip
def test_a_failure_not_by_memory_is_launched_once_more_then_inconclusive(
    ctx: TuneContext, tmp_path: Path, first: Behaviour, second: Behaviour
) -> None:
    found, script = _probe(ctx, tmp_path, first, second)
    assert script.attempts == {0.9: 2}
    assert found.verdict is ProbeVerdict.INCONCLUSIVE
    assert found.attempt == 2
    if second.startup is not TrialOutcome.READY:
        assert found.outcome is second.startup
    assert "inconclusive" in found.said()


def test_a_retry_that_runs_out_of_memory_is_out_of_memory(ctx: TuneContext, tmp_path: Path) -> None:
    found, script = _probe(ctx, tmp_path, TIMEOUT, STARTUP_OOM)
    assert script.attempts == {0.9: 2}
    assert found.verdict is ProbeVerdict.OUT_OF_MEMORY
    assert found.failure_message is not None and "CUDA out of memory" in found.failure_message


def test_the_retry_waits_for_the_first_launchs_memory(ctx: TuneContext, tmp_path: Path) -> None:
    unreleased = Behaviour(TrialOutcome.CRASHED, released=False)
    _, script = _probe(ctx, tmp_path, unreleased, HELD)
    events = script.events
    assert events.index("await release") < events.index("launch gpu-memory-utilization-0.9-try2")


def test_a_probe_with_failed_requests_did_not_survive(ctx: TuneContext, tmp_path: Path) -> None:
    found, script = _probe(ctx, tmp_path, Behaviour(request_errors=3))
    assert not found.survived
    assert found.verdict is ProbeVerdict.INCONCLUSIVE  # the engine lived: not memory
    assert found.request_errors == 3
    assert script.attempts == {0.9: 2}


# --- the bracket -------------------------------------------------------------------------------


def _bisect(ctx: TuneContext, tmp_path: Path, script: Script, start: float) -> KnobEdge:
    search = _search(ctx, script, tmp_path)
    search._predicted_edge = lambda *a, **k: None  # type: ignore[method-assign]
    return search.utilization(_params(start), max_launches=6)


def test_only_out_of_memory_outcomes_move_the_bracket(ctx: TuneContext, tmp_path: Path) -> None:
    """Held up to 0.91, startup timeouts and crashes from 0.92, out of memory from 0.96:
    the edge is not placed at a timeout."""

    def plan(value: float, attempt: int) -> Behaviour:
        if value <= 0.91:
            return HELD
        if value < 0.96:
            return TIMEOUT if attempt == 1 else CRASH
        return STARTUP_OOM

    script = Script(plan)
    edge = _bisect(ctx, tmp_path, script, 0.90)
    assert edge.highest_ok == 0.91
    assert edge.lowest_failed is None
    assert edge.inconclusive == [0.93]
    assert "inconclusive" in edge.note
    assert not edge.bracketed


def test_a_transient_failure_retried_into_an_oom_brackets(ctx: TuneContext, tmp_path: Path) -> None:
    def plan(value: float, attempt: int) -> Behaviour:
        if value <= 0.91:
            return HELD
        return TIMEOUT if attempt == 1 else STARTUP_OOM

    edge = _bisect(ctx, tmp_path, Script(plan), 0.90)
    assert edge.highest_ok == 0.91
    assert edge.lowest_failed == 0.92
    assert edge.bracketed


def test_an_older_edge_json_reads_with_its_failures_as_out_of_memory() -> None:
    old = {
        "knob": "gpu-memory-utilization", "value": 0.99, "flags": {}, "predicted_fits": True,
        "outcome": "startup_oom", "survived": False, "dir": "edge/x", "wall_s": 3.0,
    }  # fmt: skip
    assert EdgeProbe.model_validate(old).verdict is ProbeVerdict.OUT_OF_MEMORY
    assert EdgeProbe.model_validate({**old, "survived": True}).verdict is ProbeVerdict.HELD


# --- the hold --------------------------------------------------------------------------------


def test_the_kv_cache_has_peaked_when_full_for_a_while_or_falling_from_its_peak() -> None:
    rising = [(float(t), 0.1 * t) for t in range(6)]
    assert not kv_peaked(rising)
    assert kv_peaked([*rising, (6.0, 0.3)])  # fell from 0.5
    assert not kv_peaked([*rising, (6.0, 0.49)])  # a reading's jitter is no fall
    full = [(0.0, 0.5), (1.0, 1.0), (2.0, 1.0)]
    assert not kv_peaked(full)
    assert kv_peaked([*full, (3.5, 1.0)])
    assert not kv_peaked([(0.0, 0.0), (1.0, 0.0)])  # nothing admitted yet


def _metrics(path: Path, usages: list[float]) -> None:
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(MetricsSample.COLUMNS)
        for i, usage in enumerate(usages):
            writer.writerow(MetricsSample(1000.0 + i, usage, 8, 0, 0).row())


def _record(i: int, *, ok: bool) -> str:
    return RequestRecord(
        request_id=f"worst-{i}", scheduled_s=1.0, sent_s=1.0, prompt_tokens=10,
        output_tokens=5 if ok else 0, status=200 if ok else 500, end_s=2.0,
        error=None if ok else "Internal Server Error",
    ).to_json()  # fmt: skip


def test_the_hold_stops_once_the_kv_cache_peaked_and_counts_the_failures_before(
    tmp_path: Path,
) -> None:
    rule = WorstCaseHold(cap_s=600.0, deadline_s=None)
    check = rule.bind(tmp_path)
    _metrics(tmp_path / "metrics.csv", [0.1, 0.4, 0.7])
    (tmp_path / "records.jsonl.w0").write_text(_record(0, ok=False) + "\n")
    assert not check()
    check._last_check = 0.0
    _metrics(tmp_path / "metrics.csv", [0.1, 0.4, 0.7, 0.5])
    assert check()
    assert check.ended is HoldEnd.KV_PEAKED
    assert check.errors == 1
    assert check.peak_usage == pytest.approx(0.7)


def test_a_hold_cut_by_its_cap_before_the_peak_is_a_startup_edge_only(tmp_path: Path) -> None:
    rule = WorstCaseHold(cap_s=0.0, deadline_s=None)
    check = rule.bind(tmp_path)
    _metrics(tmp_path / "metrics.csv", [0.1, 0.2])
    assert check()
    assert check.ended is HoldEnd.CAP and check.ended.startup_only
    deadline = WorstCaseHold(cap_s=600.0, deadline_s=0.0).bind(tmp_path)
    assert deadline() and deadline.ended is HoldEnd.DEADLINE

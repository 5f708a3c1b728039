"""``VirtualServer`` (tuner.twin.virtual_server): the simulated engine as a tune's server on the
twin's virtual clock starts and fails as sim-serve does, says it was not launched, and
measures a level alike every time in well under a second."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from tests.integration.tune_run import TINY_WORKLOAD
from tuner.serving.level_schedule import plan_level_schedule
from tuner.serving.live_server import LoadMeasurement
from tuner.serving.load import resolve_workload
from tuner.serving.processes import ChildRegistry
from tuner.serving.server import Backend, LaunchSpec, TrialOutcome
from tuner.sim.timing import TimingFactors
from tuner.twin.fit import read_level, twin_accuracy
from tuner.twin.prediction import Setup
from tuner.twin.virtual_server import MEASURED_ON, VirtualServer
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams, plan
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion


def _launch(tmp_path: Path, **params: object) -> LaunchSpec:
    return LaunchSpec(
        backend=Backend.SIM, model="llama-3.1-8b", gpu="L4",
        params=ServingParams(max_model_len=256, **params),
        cache_dir=tmp_path / "vllm-cache",
    )  # fmt: skip


def test_a_plan_that_does_not_fit_fails_as_the_memory_model_says(tmp_path: Path) -> None:
    launch = _launch(tmp_path, gpu_memory_utilization=0.5)
    predicted = plan(
        resolve_model("llama-3.1-8b"), get_gpu("L4"), launch.params, VllmVersion.current()
    )
    assert not predicted.fits and predicted.failure is not None
    server = VirtualServer(launch, trial_dir=tmp_path / "t", registry=ChildRegistry(tmp_path))
    with server:
        assert not server.ready
    startup = server.startup
    assert startup is not None and startup.failure is not None
    # vLLM's words in the log, classified as a launched server's are
    assert startup.failure.kind is predicted.failure.kind
    assert startup.outcome is TrialOutcome.of_failure(predicted.failure)
    assert startup.exit_code == 1 and startup.report is None
    log = (tmp_path / "t" / "server.log").read_text()
    assert (
        log.splitlines()[0].startswith("# tuner: not launched")
        and "sim-serve" in log.splitlines()[0]
    )
    assert MEASURED_ON in (startup.note or "")
    assert server.gpu is None  # as a launch that never got ready: no timeline


def _level(server: VirtualServer, out: Path) -> tuple[LoadMeasurement, float]:
    spec = resolve_workload(str(TINY_WORKLOAD), rate_per_s=None, duration_s=None)
    level_spec, level_plan, schedule = plan_level_schedule(
        spec, 4.0, window_s=3.0, warmup_s=1.0, max_model_len=256
    )
    began = time.monotonic()
    m = server.measure(level_spec, schedule, out_dir=out, drain_s=4.0, level=level_plan)
    return m, time.monotonic() - began


def test_a_level_is_measured_alike_every_time_in_well_under_a_second(tmp_path: Path) -> None:
    results = []
    for i in range(2):
        server = VirtualServer(
            _launch(tmp_path), trial_dir=tmp_path / f"t{i}", registry=ChildRegistry(tmp_path)
        )
        with server:
            assert server.ready and server.startup is not None
            assert server.startup.report is not None and server.startup.report.kv_cache_tokens
            assert server.chain(tmp_path) is None  # every level a run of its own
            m, took_s = _level(server, tmp_path / f"t{i}" / "level-0")
        assert took_s < 1.0
        results.append(m)
        out = tmp_path / f"t{i}" / "level-0"
        for name in (
            "schedule.jsonl",
            "requests.jsonl",
            "metrics.csv",
            "window.json",
            "backlog.json",
        ):
            assert (out / name).stat().st_size > 0, name
        assert server.gpu is not None and server.gpu.peak_used_bytes and server.gpu.total_bytes
        assert server.gpu.peak_used_bytes < server.gpu.total_bytes
        assert (tmp_path / f"t{i}" / "gpu.csv").stat().st_size > 0
        # the compile cache goes where a launched server's would (VLLM_CACHE_ROOT)
        assert any((tmp_path / "vllm-cache" / "torch_compile_cache").iterdir())
    first, second = results
    assert first.load.num_requests > 0 and first.slo.met
    assert first.load == second.load and first.slo == second.slo
    assert first.window is not None and first.window == second.window


def _twin(tmp_path: Path, step_costs: str) -> Setup:
    """The twin of ``_launch``'s server at ``step_costs``."""
    return Setup(
        resolve_model("llama-3.1-8b"), get_gpu("L4"), VllmVersion.current(),
        _launch(tmp_path).params, timing=TimingFactors.parse(step_costs),
    )  # fmt: skip


def test_the_engine_runs_at_the_step_costs_sim_serve_is_given(tmp_path: Path) -> None:
    """``--sim-step-costs`` (sim-serve's ``--step-costs``) makes the engine one the twin has
    not seen, as it does a launched sim-serve: the level is slower than at the paper's step
    costs, and the twin at the hidden costs replays it exactly."""
    hidden = "mfu=0.4,mbu=0.6,step_overhead_ms=3"
    measured = {}
    for name, costs in (("paper", None), ("hidden", hidden)):
        launch = dataclasses.replace(_launch(tmp_path), sim_step_costs=costs)
        server = VirtualServer(launch, trial_dir=tmp_path / name, registry=ChildRegistry(tmp_path))
        with server:
            assert server.ready
            m, _ = _level(server, tmp_path / name / "level-0")
        log = (tmp_path / name / "server.log").read_text().splitlines()[0]
        assert ("--step-costs " + hidden in log) == (costs is not None)
        measured[name] = m
    paper_tpot = measured["paper"].load.tpot_ms.p50
    hidden_tpot = measured["hidden"].load.tpot_ms.p50
    assert paper_tpot is not None and hidden_tpot is not None and hidden_tpot > paper_tpot * 1.1
    level = read_level(tmp_path / "hidden" / "level-0")
    assert level is not None
    setup = _twin(tmp_path, hidden)
    at_hidden = twin_accuracy(setup, [level]).median_share
    assert at_hidden is not None and at_hidden < 1e-3
    paper = dataclasses.replace(setup, timing=TimingFactors())
    at_paper = twin_accuracy(paper, [level]).median_share
    assert at_paper is not None and at_paper > 0.05


@pytest.mark.parametrize("time_scale", [0.25, 2.0])
def test_a_level_on_another_clock_is_replayed_in_the_emulated_gpus_time(
    tmp_path: Path, time_scale: float
) -> None:
    """A level's ``schedule.jsonl`` is what its load generator sent, on the level's clock
    (4x faster: every offset a quarter); the twin replays it in the emulated GPU's seconds,
    exactly at the engine's own step costs. Read as if emulated, a 4x clock's schedule
    arrived four times as dense and the twin was 263x off a default tune's levels."""
    hidden = "mfu=0.4,mbu=0.6,step_overhead_ms=3"
    launch = dataclasses.replace(
        _launch(tmp_path), sim_step_costs=hidden, sim_time_scale=time_scale
    )
    server = VirtualServer(launch, trial_dir=tmp_path / "t", registry=ChildRegistry(tmp_path))
    with server:
        assert server.ready
        _level(server, tmp_path / "t" / "level-0")
    level = read_level(tmp_path / "t" / "level-0", time_scale=time_scale)
    assert level is not None
    setup = _twin(tmp_path, hidden)
    off = twin_accuracy(setup, [level]).median_share
    assert off is not None and off < 1e-3

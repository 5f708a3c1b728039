"""The tune's time budget: launches counted as measured (a stated prior before any), the
reserve for the edge, the confirmations and the quality gate growing with them, and a launch that would not
end before its deadline not started, with why."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from tuner.run.budget import LaunchKind
from tuner.search.budget import (
    SIM_LAUNCH_OVERHEAD_S,
    VLLM_LAUNCH_PRIOR_S,
    TimeBudget,
    launch_prior_s,
)
from tuner.search.config import load_config
from tuner.search.context import StudySetup, TuneContext, resolve
from tuner.search.quality_gate import gate_need_s, may_gate
from tuner.search.tune import confirm_reserve_s, edge_deadline_s, reserve_s
from tuner.serving.server import Backend
from tuner.vllm.space import Knob, Range

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "workloads" / "tiny.yaml"


@pytest.fixture
def ctx(tmp_path: Path) -> TuneContext:
    config = load_config(
        None,
        {
            "backend": "sim", "gpu": "L4", "model": "llama-3.1-8b", "workload": str(TINY),
            "max_model_len": 256, "run_dir": tmp_path / "run", "sim_startup_delay_s": 4.0,
            "budget_min": 10.0,
        },
    )  # fmt: skip
    return resolve(config)


def _budget(ctx: TuneContext, path: Path | None = None) -> TimeBudget:
    return TimeBudget.of(ctx, time.monotonic(), path)


def _launch(budget: TimeBudget, seconds: float, *, ready: bool = True) -> None:
    budget.record(
        LaunchKind.TRIAL, "trial", began_s=time.monotonic(), launch_s=seconds, measure_s=20.0,
        stop_s=1.0, ready=ready,
    )  # fmt: skip


def test_a_launch_is_the_stated_prior_until_one_is_measured(ctx: TuneContext) -> None:
    budget = _budget(ctx)
    assert launch_prior_s(ctx) == 4.0 + SIM_LAUNCH_OVERHEAD_S
    assert budget.launch_estimate_s() == launch_prior_s(ctx)
    _launch(budget, 150.0)
    assert budget.launch_estimate_s() == pytest.approx(151.0)  # to ready, and the stop
    _launch(budget, 2.0, ready=False)  # a launch that failed fast says nothing of one that starts
    assert budget.launch_estimate_s() == pytest.approx(151.0)


def test_vllm_launches_are_estimated_in_minutes_before_any_is_measured(ctx: TuneContext) -> None:
    real = dataclasses.replace(ctx, backend=Backend.VLLM)
    assert launch_prior_s(real) == VLLM_LAUNCH_PRIOR_S >= 60.0


def test_the_reserve_grows_with_the_launches_measured(ctx: TuneContext) -> None:
    setup = StudySetup()
    budget = _budget(ctx)
    before = reserve_s(ctx, setup, budget)
    for _ in range(3):
        _launch(budget, 180.0)  # real vLLM launches: minutes
    after = reserve_s(ctx, setup, budget)
    # three edge probes and three confirmation launches at ~181 s each, a quarter more
    assert after - before == pytest.approx(1.25 * 6 * (181.0 - launch_prior_s(ctx)))


def test_a_launch_that_would_not_end_before_the_deadline_is_not_started(
    ctx: TuneContext, tmp_path: Path
) -> None:
    path = tmp_path / "budget.json"
    budget = TimeBudget(began_s=time.monotonic(), budget_s=100.0, launch_prior_s=60.0, path=path)
    assert budget.fits(LaunchKind.EDGE_PROBE, "edge probe 0.95", 50.0) is None
    skip = budget.fits(LaunchKind.EDGE_PROBE, "edge probe 0.96", 150.0)
    assert skip is not None
    assert "edge probe 0.96 not started" in skip.text()
    assert "150 s" in skip.reason and "before the end of the budget" in skip.reason
    written = json.loads(path.read_text())
    assert [s["name"] for s in written["skipped"]] == ["edge probe 0.96"]
    early = budget.fits(
        LaunchKind.CONFIRMATION, "confirmation", 50.0, deadline_s=time.monotonic() + 10.0
    )
    assert early is not None and "its deadline" in early.reason


def test_the_edge_yields_only_to_the_recommendations_own_confirmation(ctx: TuneContext) -> None:
    """The OOM edge is one of the tune's answers; the conservative and aggressive variants'
    confirmations run in what it leaves (a 4-minute tune on the GPU-host rehearsal skipped
    every edge probe for them and left a minute unused)."""
    budget = _budget(ctx)
    _launch(budget, 60.0)
    setup = StudySetup()
    end_s = 1000.0
    own = confirm_reserve_s(ctx, setup, budget, variants=False)
    every = confirm_reserve_s(ctx, setup, budget)
    assert own > 0 and every - own >= 2 * 61.0  # two variants, a measured launch each
    assert edge_deadline_s(ctx, setup, budget, None, end_s) == pytest.approx(end_s - 1.25 * own)


def test_a_resumed_run_estimates_its_launches_from_those_the_study_measured(
    ctx: TuneContext, tmp_path: Path
) -> None:
    """The GPU-host walk: a tune interrupted after trial 0 (a 25-s launch measured) and
    resumed estimated every launch at the 180-s prior again, and skipped its whole edge."""
    path = tmp_path / "budget.json"
    first = TimeBudget.of(ctx, time.monotonic(), path)
    _launch(first, 150.0)
    resumed = TimeBudget.of(ctx, time.monotonic(), path)
    assert resumed.measured and resumed.launch_estimate_s() == pytest.approx(151.0)
    _launch(resumed, 60.0)
    kept = json.loads(path.read_text())
    assert [r["launch_s"] for r in kept["earlier"]] == [150.0]
    assert [r["launch_s"] for r in kept["launches"]] == [60.0]
    again = TimeBudget.of(ctx, time.monotonic(), path)  # a third run sees both
    assert [r.launch_s for r in again.earlier] == [150.0, 60.0]


def test_the_reserve_keeps_the_quality_gates_two_launches_where_it_may_run(
    ctx: TuneContext,
) -> None:
    setup = StudySetup()
    budget = _budget(ctx)
    for _ in range(3):
        _launch(budget, 180.0)
    kv = ctx.space.range_of(Knob.KV_CACHE_DTYPE)
    assert kv is not None and "fp8" in kv.values()  # L4: fp8 KV is in the space
    assert not may_gate(ctx)  # the simulated engine: nothing to measure, nothing kept
    real = dataclasses.replace(ctx, backend=Backend.VLLM)
    assert may_gate(real)
    # two launches at ~181 s, each asked 32 prompts of up to 32 tokens at a batch of one
    need = gate_need_s(real, budget)
    assert need == pytest.approx(2 * (181.0 + 32 * (2 * 0.5 + 32 * 0.05)))
    assert reserve_s(real, setup, budget) - reserve_s(ctx, setup, budget) == pytest.approx(
        1.25 * need
    )
    off = dataclasses.replace(real, config=real.config.model_copy(update={"quality_gate": False}))
    assert not may_gate(off)
    auto_only = dataclasses.replace(
        real,
        space=real.space.model_copy(
            update={
                "ranges": tuple(
                    r
                    if r.knob is not Knob.KV_CACHE_DTYPE
                    else Range(knob=r.knob, choices=("auto",))
                    for r in real.space.ranges
                )
            }
        ),
    )
    assert not may_gate(auto_only)  # no value in the space changes numerics

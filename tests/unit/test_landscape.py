"""The twin's landscape: the ladder search, the utilizations bounded between computed
ones, the candidates it hands the tune, and a real screen of a small space."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.run.config import TuneConfig
from tuner.search.context import resolve
from tuner.sim.timing import TimingFactors
from tuner.twin.landscape import (
    LOWEST_RUNG,
    Landscape,
    ScreenedPoint,
    ScreenJob,
    ScreenMethod,
    candidates,
    ladder_search,
    read_landscape,
    screen,
    screen_setting,
)
from tuner.twin.screen import screen_job
from tuner.vllm.space import TrialParams

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "workloads" / "tiny.yaml"


@pytest.mark.parametrize("edge", [-40, -3, 0, 1, 7, 25])
@pytest.mark.parametrize("hint", [-5, 0, 4])
def test_ladder_search_finds_the_highest_rung_met(edge: int, hint: int) -> None:
    asked: list[int] = []

    def met(rung: int) -> bool:
        asked.append(rung)
        return rung <= edge

    assert ladder_search(met, hint, max_runs=20) == edge
    assert len(asked) == len(set(asked)), "a rung was run twice"


def test_ladder_search_from_the_right_rung_costs_two_runs() -> None:
    asked: list[int] = []

    def met(rung: int) -> bool:
        asked.append(rung)
        return rung <= 3

    assert ladder_search(met, 3) == 3
    assert asked == [3, 4]


def test_ladder_search_where_nothing_holds() -> None:
    assert ladder_search(lambda r: False, 0, max_runs=40) == LOWEST_RUNG


def _point(
    util: float, seqs: int, rate: float, method: ScreenMethod = ScreenMethod.COMPUTED
) -> ScreenedPoint:
    return ScreenedPoint(
        params=TrialParams(gpu_memory_utilization=util, max_num_seqs=seqs), rate_per_s=rate,
        method=method,
    )  # fmt: skip


def _landscape(points: list[ScreenedPoint]) -> Landscape:
    return Landscape(
        factors=TimingFactors(), warmup_s=1, window_s=3, base_rate_per_s=1.0, ladder_step=1.1,
        wall_s=0.0, points=points,
    )  # fmt: skip


def test_candidates_take_one_setting_per_group_best_first() -> None:
    landscape = _landscape(
        [
            _point(0.8, 64, 5.0), _point(0.9, 64, 5.0), _point(0.8, 128, 7.0),
            _point(0.9, 128, 7.5), _point(0.8, 256, 6.0), _point(0.9, 256, 0.0),
        ]
    )  # fmt: skip
    picks = candidates(landscape, [], count=5)
    assert [(p.params.max_num_seqs, p.params.gpu_memory_utilization) for p in picks] == [
        (128, 0.9),
        (256, 0.8),
        (64, 0.8),  # equal goodput: the one that holds less memory
    ]


def test_candidates_skip_what_was_measured_unless_the_twin_puts_it_a_rung_higher() -> None:
    landscape = _landscape([_point(0.8, 128, 7.0), _point(0.9, 128, 7.5), _point(0.95, 128, 8.0)])
    tried = [TrialParams(gpu_memory_utilization=0.8, max_num_seqs=128)]
    picks = candidates(landscape, tried, count=3)
    # 7.5 is within a rung (10 %) of the measured 7.0; 8.0 is above it.
    assert [p.params.gpu_memory_utilization for p in picks] == [0.95]
    assert candidates(landscape, [*tried, picks[0].params], count=3) == []


def test_a_setting_the_first_pass_left_out_is_bounded_by_its_group_below() -> None:
    """A first pass screens each group's ends: vLLM's defaults (utilization 0.9) may not
    be in it. Measured, their group is not proposed again unless an end is a rung above
    what the twin puts below 0.9 (goodput does not fall with utilization)."""
    landscape = _landscape(
        [_point(0.8, 128, 7.0), _point(0.97, 128, 7.5), _point(0.8, 256, 6.0),
         _point(0.97, 256, 6.2)]
    )  # fmt: skip
    defaults = TrialParams(gpu_memory_utilization=0.9, max_num_seqs=128)
    assert landscape.rate_at_least_per_s(defaults) == 7.0
    assert landscape.rate_at_least_per_s(TrialParams(gpu_memory_utilization=0.7)) == 0.0
    picks = candidates(landscape, [defaults], count=3)
    # 7.5 is within a rung (10 %) of the 7.0 below the defaults: the other group first.
    assert [p.params.max_num_seqs for p in picks] == [256]


def test_a_small_space_screened_on_the_twin(tmp_path: Path) -> None:
    """The tiny workload on an L4 over a few settings: every setting has a goodput, the
    utilizations between two computed ones on the same rung are bounded by them, more
    sequences never predict less here, and landscape.json reads back."""
    ctx = resolve(
        TuneConfig(
            model="llama-3.1-8b", gpu="L4", workload=str(TINY), level_duration_s=3,
            level_warmup_s=1, space={"max-num-seqs": "4,16", "gpu-memory-utilization": "0.8..0.9/0.02",
                                     "block-size": "16", "kv-cache-dtype": "auto"},
            run_dir=tmp_path / "run",
        )
    )  # fmt: skip
    job = screen_job(ctx, TimingFactors(), 4.0)
    assert isinstance(job, ScreenJob)
    landscape = screen(job, ctx.space, jobs=1)
    assert len(landscape.points) == 12
    by_seqs = {
        seqs: [p for p in landscape.points if p.params.max_num_seqs == seqs] for seqs in (4, 16)
    }
    for group in by_seqs.values():
        assert (
            group[0].method is ScreenMethod.COMPUTED and group[-1].method is ScreenMethod.COMPUTED
        )
        for p in group:
            assert p.rate_per_s > 0
            if p.method is ScreenMethod.BETWEEN:
                assert p.rate_high_per_s is not None and p.rate_high_per_s >= p.rate_per_s
    assert min(p.rate_per_s for p in by_seqs[16]) > max(p.rate_per_s for p in by_seqs[4])
    # A computed setting is its own rate search: the same as screening it alone.
    alone = screen_setting(job, by_seqs[4][0].params, hint=job.rung_of(by_seqs[4][0].rate_per_s))
    assert alone.rate_per_s == pytest.approx(by_seqs[4][0].rate_per_s)
    path = tmp_path / "landscape.json"
    landscape.write(path)
    assert read_landscape(path) == landscape

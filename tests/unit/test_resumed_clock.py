"""A resumed run goes on on the clock the run before had adapted to (issue 34's walk: a
resumed default tune started again on the study's first clock and tokens an event, and
forgot which settings' simulated server had needed a slower one)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from tuner.search.config import load_config
from tuner.search.context import StudySetup, TuneContext, resolve
from tuner.search.study import open_study
from tuner.search.study.trial_loop import CLOCK_ATTR, TrialLoop
from tuner.serving.processes import ChildRegistry
from tuner.vllm.space import TrialParams

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "workloads" / "tiny.yaml"


def _ctx(run_dir: Path, **more: object) -> TuneContext:
    config = load_config(
        None,
        {
            "backend": "sim", "gpu": "L4", "model": "llama-3.1-8b", "workload": str(TINY),
            "max_model_len": 256, "run_dir": run_dir, "budget_min": 10.0, **more,
        },
    )  # fmt: skip
    return resolve(config)


def _loop(ctx: TuneContext) -> TrialLoop:
    return TrialLoop(
        ctx, open_study(ctx), ChildRegistry(ctx.run_dir), deadline_s=time.monotonic() + 600.0,
        progress=lambda _line: None,
    )  # fmt: skip


def test_the_clock_record_round_trips() -> None:
    pick = TrialParams(max_num_seqs=512)
    setup = replace(StudySetup(time_scale=0.25, stream_interval=14), stream_fraction=0.5)
    setup = setup.with_slower_clock(pick, 0.5)
    back = StudySetup(time_scale=1.0, stream_fraction=0.5).with_clock_record(setup.clock_record())
    assert back == setup
    assert back.time_scale_for(pick) == 0.5 and back.time_scale_for(TrialParams()) == 0.25


def test_a_resumed_run_starts_on_the_clock_the_run_before_left(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = _loop(_ctx(run_dir))
    chosen = first.prepare()
    assert CLOCK_ATTR not in first.study.user_attrs  # nothing adapted yet
    # what a trial's clock adaptation and a lagging server leave (TrialLoop._adapt_clock,
    # _keep_slower_clock), recorded where it changed
    before = first.setup.clock_record()
    pick = TrialParams(max_num_seqs=512)
    first.setup = replace(
        first.setup, time_scale=chosen.time_scale / 2, stream_interval=chosen.stream_interval + 4
    ).with_slower_clock(pick, chosen.time_scale)
    first._record_clock(before)
    assert first.study.user_attrs[CLOCK_ATTR] == first.setup.clock_record()

    resumed = _loop(_ctx(run_dir, resume=True)).prepare()
    assert resumed.time_scale == chosen.time_scale / 2
    assert resumed.stream_interval == chosen.stream_interval + 4
    assert resumed.time_scale_for(pick) == chosen.time_scale
    # the study's own time scale is still the one it chose first (--time-scale is checked
    # against it on resume)
    assert float(first.study.user_attrs["time_scale"]) == chosen.time_scale

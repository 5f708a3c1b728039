"""The twin-guided search: the twin's landscape decides what the tune launches next.

Before the first launch the twin screens the whole space (``tuner.twin.landscape``),
in worker processes at the lowest CPU priority while vLLM's defaults are measured.
Its first pass (every group's ends) is all the first pick needs: where the rest is
still under way then, that pick is made from the first pass, and the rest is waited
for at the next pick or the tune's end. Before each trial: the most promising untried
settings of the landscape (one per group of settings that differ only in utilization,
``landscape.candidates``) are screened again with the twin's step costs as fitted so
far, and the best of them is launched when the twin puts it above the best setting
measured, screened the same way (both predicted: a twin that is off by a constant
share ranks the same).
When no untried setting beats it, the sampler draws the rest, with every measured
trial of the twin's choosing in its history.

The tune's context reaches this module as ``ScreenContext``, the part of
``tuner.search.context.TuneContext`` that the screen reads (the twin sits below the
search and never imports it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from tuner.run.layout import RunLayout
from tuner.serving.level_schedule import plan_level_schedule
from tuner.sim.timing import TimingFactors
from tuner.twin.landscape import (
    Landscape,
    ScreenJob,
    ScreenRun,
    candidates,
    read_landscape,
    screen_setting,
)
from tuner.vllm.gpus import GpuSpec
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import ModelSpec
from tuner.vllm.space import SearchSpace, TrialParams, per_gpu
from tuner.vllm.versions import VllmVersion
from workloads.spec import WorkloadSpec

log = logging.getLogger(__name__)

SCREEN_WARMUP_S = 20.0  # the screen's runs: this warm-up (at most a level's) ...
SCREEN_WINDOW_S = 30.0  # ... and this window (at most a level's), virtual seconds
SCREEN_LADDER_STEP = 1.1  # the screen's rungs: 10 % apart (the re-ranking is finer)
SCREEN_JOBS = 2  # worker processes
RERANK = 6  # untried settings (one per group) screened again before each trial


class LevelDurations(Protocol):
    """What the screen reads of the tune's configuration: a level's window and warm-up
    (seconds; None: planned from the workload)."""

    @property
    def level_duration_s(self) -> float | None: ...

    @property
    def level_warmup_s(self) -> float | None: ...


class ScreenContext(Protocol):
    """What the screen reads of the tune's context (``tuner.search.context.TuneContext``)."""

    @property
    def config(self) -> LevelDurations: ...

    @property
    def model(self) -> ModelSpec: ...

    @property
    def version(self) -> VllmVersion: ...

    @property
    def workload(self) -> WorkloadSpec: ...

    @property
    def space(self) -> SearchSpace: ...

    @property
    def run_dir(self) -> Path: ...

    @property
    def twin(self) -> tuple[GpuSpec, ServingParams] | None: ...


def screen_job(
    ctx: ScreenContext, factors: TimingFactors, base_rate_per_s: float
) -> ScreenJob | None:
    """The screen of ``ctx``'s space (None: no twin, or no arrival rate to search)."""
    if ctx.twin is None:
        return None
    device, base = ctx.twin
    _, plan, _ = plan_level_schedule(
        ctx.workload, base_rate_per_s, window_s=ctx.config.level_duration_s,
        warmup_s=ctx.config.level_warmup_s,
    )  # fmt: skip
    return ScreenJob(
        model=ctx.model, gpu=device, version=ctx.version, base=base, workload=ctx.workload,
        factors=factors, warmup_s=min(plan.warmup_max_s, SCREEN_WARMUP_S),
        window_s=min(plan.window_s, SCREEN_WINDOW_S), base_rate_per_s=base_rate_per_s,
        ladder_step=SCREEN_LADDER_STEP,
    )  # fmt: skip


@dataclass(frozen=True)
class TwinPick:
    params: TrialParams
    predicted_rate_per_s: float  # screened again with the twin's factors now
    landscape_rate_per_s: float  # the screen's


class TwinSearch:
    """The landscape of one tune and the picks it makes (see the module's docstring)."""

    def __init__(self, ctx: ScreenContext, progress: Callable[[str], None]) -> None:
        self.ctx = ctx
        self.progress = progress
        self.path = RunLayout(ctx.run_dir).landscape_json
        self.landscape: Landscape | None = read_landscape(self.path)  # a resumed run's
        self._running: ScreenRun | None = None
        self.done = False  # the twin has nothing better to offer: the sampler's turn
        # a setting's rate screened again, per setting and step costs: a pick screens the
        # same candidates before each trial, again only after a fit changed the costs
        self._rescreened: dict[tuple[str, str], float] = {}
        self._picked_from_first = False  # a pick was made before the screen was whole

    @property
    def started(self) -> bool:
        """The screen is running or done (or the run directory had its landscape)."""
        return self.landscape is not None or self._running is not None

    def start(self, factors: TimingFactors, base_rate_per_s: float) -> None:
        """Start the screen (once; not when the run directory has its landscape)."""
        if self.started:
            return
        job = screen_job(self.ctx, factors, base_rate_per_s)
        if job is None:
            self.done = True
            return
        self._running = ScreenRun(job, self.ctx.space, jobs=SCREEN_JOBS)
        self.progress(
            f"twin: screening all {len(self.ctx.space.grid())} settings of the space beside "
            "the first trial"
        )

    def wait(self) -> Landscape | None:
        """The landscape, waiting for the screen to finish."""
        if self._running is None:
            return self.landscape
        if not self._running.ready():
            self.progress("twin: waiting for the screen to finish")
        landscape = self._running.result()
        self._running = None
        landscape.write(self.path)
        self.landscape = landscape
        best = landscape.ranked()[0] if landscape.points else None
        line = (
            f"twin: {len(landscape.points)} settings screened in {landscape.wall_s:.0f} s "
            f"({landscape.computed} computed, the rest between computed utilizations)"
            + (f"; best predicted {best.params.short()} at {best.rate_per_s:.2f}/s" if best else "")
        )
        log.info(line)
        self.progress(line)
        return landscape

    def _for_pick(self) -> Landscape | None:
        """The landscape a pick is made from: the whole one where the screen is done,
        else its first pass (waited for)."""
        running = self._running
        if running is None:
            return self.landscape
        if not running.first_ready():
            self.progress("twin: waiting for the screen's first pass")
        first = running.first()
        if running.ready():  # nothing left for the second pass, or done by now
            return self.wait()
        if not self._picked_from_first:
            self._picked_from_first = True
            line = (
                f"twin: the first pass screened {len(first.points)} settings in "
                f"{first.wall_s:.0f} s (each group's lowest and highest "
                "utilization, and those between where the two agree); the pick is made from "
                "it while the rest is screened"
            )
            log.info(line)
            self.progress(line)
        return first

    def finish(self) -> Landscape | None:
        """At the tune's end: where a pick was made from the first pass, the rest waited
        for (the report draws the whole landscape; a resumed run starts from it)."""
        if self._running is not None and self._picked_from_first:
            return self.wait()
        return self.landscape

    def _job(self, landscape: Landscape, factors: TimingFactors) -> ScreenJob:
        """The landscape's screen with ``factors``."""
        job = screen_job(self.ctx, factors, landscape.base_rate_per_s)
        assert job is not None  # a landscape was screened for this context
        return replace(
            job, warmup_s=landscape.warmup_s, window_s=landscape.window_s,
            ladder_step=landscape.ladder_step,
        )  # fmt: skip

    def stop(self) -> None:
        if self._running is not None:
            self._running.stop()
            self._running = None

    def pick(
        self,
        tried: Sequence[TrialParams],
        best_measured: TrialParams | None,
        factors: TimingFactors,
    ) -> TwinPick | None:
        """The next setting to launch, or None (and ``done``) when the twin, with
        ``factors`` (its step costs now), predicts none untried above the best measured."""
        if self.done:
            return None
        landscape = self._for_pick()
        if landscape is None:
            self.done = True
            return None
        job = self._job(landscape, factors)

        def predict(params: TrialParams) -> float:
            key = (params.model_dump_json(), factors.model_dump_json())
            if key not in self._rescreened:
                rate = landscape.rate_at_least_per_s(params)
                hint = job.rung_of(rate) if rate else 0
                self._rescreened[key] = screen_setting(job, params, hint).rate_per_s
            return self._rescreened[key]

        picks = candidates(landscape, tried, count=RERANK)
        scored = [(predict(p.params), p) for p in picks]
        scored = [(rate, p) for rate, p in scored if rate > 0]
        if not scored:
            self.done = True
            return None
        rate, point = max(scored, key=lambda s: per_gpu(s[0], s[1].params))
        bar = predict(best_measured) if best_measured is not None else 0.0
        if best_measured is not None and per_gpu(rate, point.params) <= per_gpu(bar, best_measured):
            self.done = True
            self.progress(
                f"twin: no untried setting predicted above the best measured "
                f"({_predicted(best_measured, bar)}; best untried "
                f"{_predicted(point.params, rate)}); the sampler draws the rest"
            )
            return None
        return TwinPick(point.params, rate, point.rate_per_s)


def _predicted(params: TrialParams, rate_per_s: float) -> str:
    """A setting and the twin's goodput for it, per GPU too where it takes several (the
    rankings compare per GPU)."""
    share = f", {per_gpu(rate_per_s, params):.2f} per GPU" if params.gpus > 1 else ""
    return f"{params.short()}: the twin predicts {rate_per_s:.2f}/s{share}"

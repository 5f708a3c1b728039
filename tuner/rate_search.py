"""Goodput of one server: the highest request rate at which the workload's SLOs hold.

On a live server (``trial.LiveServer``) the workload is sent at a first rate, then
at higher rates while the SLOs hold or lower ones once they break (bracketing by
``growth``), then at the geometric middle of the bracket until it is narrower than
``precision`` or the level budget is spent. A level whose SLO is already clearly
broken stops early (``trial.StopRule``). Every level keeps its own directory with
the load run's evidence.

Rates are the workload's arrival rate (requests/s, or sessions/s for a multi-turn
workload); ``goodput`` is the request rate the best level offered, as measured.
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tuner.load import plan_schedule, split_warmup
from tuner.server import TrialOutcome
from tuner.trial import LiveServer, Measurement, StopRule
from workloads.spec import SloMetric, WarmupSpec, WorkloadSpec


class Level(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    rate_per_s: float  # the workload's arrival rate at this level
    met: bool
    measurement: Measurement


class RateSearch(BaseModel):
    """The levels measured on one server, and what they come to."""

    model_config = ConfigDict(frozen=True)

    levels: tuple[Level, ...]
    best: Level | None  # the highest rate whose SLOs held
    broken_rate_per_s: float | None  # the lowest rate whose SLOs broke
    died: bool  # the engine died under load

    @property
    def goodput(self) -> float:
        """Requests/s the best level offered (0 when no level met the SLOs)."""
        if self.best is None:
            return 0.0
        load = self.best.measurement.load
        return load.offered_rate or load.request_throughput

    @property
    def throughput(self) -> float:
        return 0.0 if self.best is None else self.best.measurement.load.output_token_throughput


def level_workload(spec: WorkloadSpec, rate_per_s: float | None, duration_s: float) -> WorkloadSpec:
    """The workload at one level: its shape at ``rate_per_s``, a window of ``duration_s``, no warm-up."""
    level = spec if rate_per_s is None else spec.with_rate(rate_per_s)
    return level.model_copy(update={"duration_s": duration_s, "warmup": WarmupSpec()})


def stop_rule(spec: WorkloadSpec, expected_requests: int, time_scale: float) -> StopRule | None:
    """Stop a level once more requests missed the TTFT objective than twice its allowance."""
    ttft = [o for o in spec.slo.objectives() if o.metric is SloMetric.TTFT]
    if not ttft:
        return None
    tightest = min(ttft, key=lambda o: o.limit_ms)
    allowance = (100 - tightest.percentile) / 100.0
    max_bad = math.ceil(2 * allowance * expected_requests) + 2
    return StopRule(tightest.limit_ms, time_scale=time_scale, max_bad=max_bad)


def drain_s(spec: WorkloadSpec) -> float:
    """How long a level waits after its last send before cutting off what is still in
    flight (measured as far as it got): long enough for any request within the TTFT
    objective to have its first token, at least 4 emulated seconds."""
    ttft = [o.limit_ms for o in spec.slo.objectives() if o.metric is SloMetric.TTFT]
    return max(4.0, 1.5 * max(ttft, default=0.0) / 1000.0)


def search_rate(
    live: LiveServer,
    spec: WorkloadSpec,
    *,
    start_rate_per_s: float | None,
    out_dir: Path,
    level_duration_s: float,
    max_levels: int = 3,
    growth: float = 1.15,
    precision: float = 0.15,
    model_dir: Path | None = None,
) -> RateSearch:
    """Measure levels on a READY server until the goodput is bracketed to ``precision``."""
    levels: list[Level] = []
    low: Level | None = None
    high: float | None = None
    closed = spec.mean_rate_per_s is None
    rate: float | None = None if closed else (start_rate_per_s or spec.mean_rate_per_s)
    died = False
    for index in range(1 if closed else max_levels):
        level_spec = level_workload(spec, rate, level_duration_s)
        _, schedule = split_warmup(
            plan_schedule(
                level_spec, max_model_len=live.launch.params.max_model_len, model_dir=model_dir
            )
        )
        rule = stop_rule(level_spec, len(schedule), live.time_scale)
        m = live.measure(
            level_spec, schedule, out_dir=out_dir / f"level-{index}", stop_when=rule,
            drain_s=drain_s(level_spec),
        )  # fmt: skip
        met = m.slo.met and not m.stopped_early and m.outcome is TrialOutcome.READY
        level = Level(index=index, rate_per_s=rate or 0.0, met=met, measurement=m)
        levels.append(level)
        if m.outcome is not TrialOutcome.READY:
            died = True
            break
        if rate is None:
            low = level if met else None
            break
        if met:
            low = level if low is None or rate > low.rate_per_s else low
        else:
            high = rate if high is None else min(high, rate)
        if high is None:
            rate *= growth
        elif low is None:
            rate /= growth
        elif high / low.rate_per_s <= 1.0 + precision:
            break
        else:
            rate = math.sqrt(low.rate_per_s * high)
    return RateSearch(levels=tuple(levels), best=low, broken_rate_per_s=high, died=died)

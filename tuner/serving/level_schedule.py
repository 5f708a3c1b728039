"""A level's workload and schedule, as the live rate search and the twin plan it.

``level_workload``: the workload at one rate (stationary sessions, a trace on its busiest
stretch); ``plan_level_schedule``: its warm-up and window (``tuner.serving.window``) and the
schedule that carries them, on a chained run carrying on from the level before
(``CarryOn``); ``drain_s``: how long a level waits for what is in flight after its last send.
Pure: no process, no clock. Used by ``tuner.search.rate_search`` (live levels) and
``tuner.twin`` (the same levels on the virtual clock).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tuner.serving.load import plan_schedule, split_warmup
from tuner.serving.window import LevelPlan, plan_level
from workloads.replay import on_busiest_stretch, pass_s
from workloads.schedule import ScheduledRequest, carries_on
from workloads.slo import SloMetric
from workloads.spec import SessionStart, WarmupSpec, WorkloadSpec
from workloads.stationary import AnswerTimes

PROVISIONAL_S = 30.0  # a level's first schedule, to read its request rate from


def level_workload(
    spec: WorkloadSpec,
    rate_per_s: float | None,
    duration_s: float,
    answer_times: AnswerTimes | None = None,
    *,
    window: tuple[float, float] | None = None,
) -> WorkloadSpec:
    """The workload at one level: its shape at ``rate_per_s``, a window of ``duration_s``, no
    warm-up; with sessions, opening on the conversations already under way at that rate
    (``sessions.start: stationary``, unless the spec sets ``start`` itself), their turns
    planned at ``answer_times`` when given (``workloads.stationary.AnswerTimes``).
    ``window``: (opens at, lasts) seconds; a trace replay is started so that it falls on
    the trace's busiest stretch (``workloads.replay.on_busiest_stretch``)."""
    level = spec if rate_per_s is None else spec.with_rate(rate_per_s)
    if window is not None:
        level = on_busiest_stretch(level, *window)
    update: dict[str, object] = {"duration_s": duration_s, "warmup": WarmupSpec()}
    sessions = level.sessions
    if sessions is not None:
        if "start" not in sessions.model_fields_set:
            sessions = sessions.model_copy(update={"start": SessionStart.STATIONARY})
        if answer_times is not None:
            sessions = answer_times.applied(sessions)
        update["sessions"] = sessions
    return level.model_copy(update=update)


def drain_s(spec: WorkloadSpec) -> float:
    """How long a level waits after its last send before cutting off what is still in
    flight (measured as far as it got): long enough for any request within the TTFT
    objective to have its first token, at least 4 emulated seconds."""
    ttft = [o.limit_ms for o in spec.slo.objectives() if o.metric is SloMetric.TTFT]
    return max(4.0, 1.5 * max(ttft, default=0.0) / 1000.0)


@dataclasses.dataclass(frozen=True)
class CarryOn:
    """A level that carries on from the one before it on a chained run (``workloads.chain``):
    the conversations under way at ``from_rate_per_s`` go on into it, so of the population
    its own rate has under way it adds only what a higher rate has on top, and it names
    its requests apart (``id_prefix``)."""

    from_rate_per_s: float
    id_prefix: str

    def new_share(self, rate_per_s: float) -> float:
        """The share of the level's conversations under way that it adds: the rest carry
        on from the rate before (a Poisson population at r2 is one at r1 and one at r2 - r1)."""
        return max(0.0, 1.0 - self.from_rate_per_s / rate_per_s) if rate_per_s > 0 else 0.0

    def keep_under_way(self, rate_per_s: float) -> float:
        """The share of the conversations under way that carry on into a level at
        ``rate_per_s`` (a lower rate thins them)."""
        return min(1.0, rate_per_s / self.from_rate_per_s) if self.from_rate_per_s > 0 else 1.0

    def applied(
        self, schedule: list[ScheduledRequest], rate_per_s: float
    ) -> list[ScheduledRequest]:
        """The level's schedule as it joins the run: of its conversations already under way
        (a first request with a later turn number) only its new share, every id prefixed."""
        keep = self.new_share(rate_per_s)
        leads = {r.session_id for r in schedule if r.follows is None and r.turn > 0}
        out = []
        p = self.id_prefix
        for r in schedule:
            if r.session_id in leads and not carries_on(r.session_id, keep, p):
                continue
            out.append(
                dataclasses.replace(
                    r,
                    request_id=p + r.request_id,
                    session_id=None if r.session_id is None else p + r.session_id,
                    follows=None if r.follows is None else p + r.follows,
                )
            )
        return out


def plan_level_schedule(
    spec: WorkloadSpec,
    rate_per_s: float | None,
    *,
    window_s: float | None = None,
    warmup_s: float | None = None,
    max_model_len: int | None = None,
    model_dir: Path | None = None,
    answer_times: AnswerTimes | None = None,
    window_max_s: float | None = None,
    correlation_floor_s: float | None = None,
    carry_on: CarryOn | None = None,
    bridge_s: float = 0.0,
) -> tuple[WorkloadSpec, LevelPlan, list[ScheduledRequest]]:
    """One level at ``rate_per_s``: its spec (warm-up and window in one schedule), its
    plan (``tuner.serving.window.plan_level``) and its schedule (the spec's own warm-up left out);
    ``answer_times``: see ``level_workload``; ``carry_on``: the level follows the one
    before it on a chained run (``CarryOn``: its schedule as it joins, a shorter warm-up);
    ``bridge_s``: the schedule goes on that long past the plan (a chained run's
    ``BRIDGE_S``: no measured window uses it)."""

    def build(
        duration_s: float, window: tuple[float, float] | None = None
    ) -> tuple[WorkloadSpec, list[ScheduledRequest]]:
        level_spec = level_workload(spec, rate_per_s, duration_s, answer_times, window=window)
        _, schedule = split_warmup(
            plan_schedule(level_spec, max_model_len=max_model_len, model_dir=model_dir)
        )
        return level_spec, schedule

    provisional_s = window_s or PROVISIONAL_S
    level_spec, schedule = build(provisional_s)
    new_share = None if carry_on is None or not rate_per_s else carry_on.new_share(rate_per_s)
    plan = plan_level(
        level_spec, schedule, window_s=window_s, warmup_s=warmup_s, window_max_s=window_max_s,
        correlation_floor_s=correlation_floor_s, carried_on=new_share,
    )  # fmt: skip
    placed = (plan.warmup_min_s, plan.window_s) if pass_s(level_spec) is not None else None
    if placed is not None or abs(plan.total_s + bridge_s - provisional_s) > 1e-9:
        level_spec, schedule = build(plan.total_s + bridge_s, placed)
    if carry_on is not None and rate_per_s:
        schedule = carry_on.applied(schedule, rate_per_s)
    return level_spec, plan, schedule

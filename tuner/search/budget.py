"""The time budget of a tune: what each launch costs, measured, and whether the next one fits.

Every launch of a tune (a trial, an OOM-edge probe, a confirmation run) costs its
startup and its stop on top of what it measures, and on a GPU host the startup is
most of it: vLLM takes one to four minutes to load weights, profile memory and
capture CUDA graphs (the first launch also compiles). The budget therefore counts
launches as they are measured:

- before any launch, a launch is estimated by a stated prior (``launch_prior_s``:
  ``VLLM_LAUNCH_PRIOR_S`` for vLLM, the simulator's ``--startup-delay`` plus
  ``SIM_LAUNCH_OVERHEAD_S`` for the simulated engine);
- after it, by what the last ``RECENT_LAUNCHES`` launches that started took, start to
  ready plus stop and memory release (``launch_estimate_s``);
- before every launch the caller asks ``fits``: a launch that would not finish before
  its deadline is not started, and the budget keeps why (``skipped``).

``budget.json`` in the run directory (``tuner.run.budget.BudgetRecord``) holds every
launch (what, when, its seconds to ready, of measurement and of stop) and every launch
skipped with its reason, for the report and for scripts.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from tuner.run.budget import BudgetRecord, LaunchKind, LaunchRecord, SkippedLaunch
from tuner.run.evaluation import Evaluation, Verdict
from tuner.search.context import TuneContext
from tuner.serving.server import Backend

log = logging.getLogger(__name__)

# A real vLLM launch before any was measured: 1-4 minutes on a GPU (v1 logs: engine init
# alone 100-250 s for small models, more with the first torch.compile), and its stop.
VLLM_LAUNCH_PRIOR_S = 180.0
# The simulated engine's launch beyond its --startup-delay: the interpreter, its
# readiness, and its stop.
SIM_LAUNCH_OVERHEAD_S = 5.0
RECENT_LAUNCHES = 3  # the launch estimate: the longest of the last few that started
# After the last launch: the parallelism comparison, the configs and the report.
FINISH_S = 15.0


def launch_prior_s(ctx: TuneContext) -> float:
    """A launch before any was measured (see the module's docstring)."""
    if ctx.backend is Backend.SIM:
        return ctx.config.sim_startup_delay_s + SIM_LAUNCH_OVERHEAD_S
    return VLLM_LAUNCH_PRIOR_S


class TimeBudget:
    """The tune's wall-clock budget from ``began_s`` (monotonic), its launches so far and
    what the next one is estimated to take."""

    def __init__(
        self,
        *,
        began_s: float,
        budget_s: float,
        launch_prior_s: float,
        path: Path | None = None,
    ) -> None:
        self.began_s = began_s
        self.budget_s = budget_s
        self.launch_prior_s = launch_prior_s
        self.path = path
        self.launches: list[LaunchRecord] = []
        self.skipped: list[SkippedLaunch] = []
        self.earlier: list[LaunchRecord] = []

    @classmethod
    def of(cls, ctx: TuneContext, began_s: float, path: Path | None) -> TimeBudget:
        """The budget of a run; where ``path`` holds an earlier run's record (a resumed
        study), its launches count as measured (a resumed run estimated its launches by the
        prior again: 180 s where the first run had measured 25 s, and skipped its edge)."""
        budget = cls(
            began_s=began_s,
            budget_s=ctx.config.budget_min * 60.0,
            launch_prior_s=launch_prior_s(ctx),
            path=path,
        )
        budget.earlier = _earlier_launches(path)
        return budget

    @property
    def deadline_s(self) -> float:
        """The end of the budget (monotonic)."""
        return self.began_s + self.budget_s

    def now_s(self) -> float:
        return time.monotonic()

    def left_s(self, deadline_s: float | None = None) -> float:
        return (self.deadline_s if deadline_s is None else deadline_s) - self.now_s()

    @property
    def measured(self) -> bool:
        return any(r.ready for r in [*self.earlier, *self.launches])

    def launch_estimate_s(self) -> float:
        """A launch's startup and stop: the longest of the last ``RECENT_LAUNCHES`` that
        became ready (earlier runs' of the study first, then this run's), else the prior (a
        launch that failed fast says little of one that starts; one that failed slowly, a
        timeout, counts)."""
        every = [*self.earlier, *self.launches]
        started = [r.overhead_s for r in every if r.ready]
        slow_failures = [r.overhead_s for r in every if not r.ready]
        if not started:
            return max([self.launch_prior_s, *slow_failures])
        return max(started[-RECENT_LAUNCHES:])

    def fits(
        self,
        kind: LaunchKind,
        name: str,
        need_s: float,
        *,
        deadline_s: float | None = None,
        note: str = "",
    ) -> SkippedLaunch | None:
        """None when a launch of ``need_s`` seconds ends before ``deadline_s`` (default the
        end of the budget); else the skip (its reason, then ``note``), kept and written to
        ``budget.json``."""
        deadline = self.deadline_s if deadline_s is None else deadline_s
        left = deadline - self.now_s()
        if need_s <= left:
            return None
        until = "the end of the budget" if deadline >= self.deadline_s else "its deadline"
        skip = SkippedLaunch(
            kind=kind,
            name=name,
            at_s=self.now_s() - self.began_s,
            need_s=need_s,
            left_s=max(0.0, left),
            reason=(
                f"it takes ~{need_s:.0f} s ({self._basis()}) and {max(0.0, left):.0f} s are left "
                f"before {until}" + (f" ({note})" if note else "")
            ),
        )
        self.skipped.append(skip)
        log.info("%s", skip.text())
        self.write()
        return skip

    def _basis(self) -> str:
        if self.measured:
            return f"launches measured at ~{self.launch_estimate_s():.0f} s"
        return f"a launch estimated at {self.launch_prior_s:.0f} s before any was measured"

    def record(
        self,
        kind: LaunchKind,
        name: str,
        *,
        began_s: float,
        launch_s: float | None,
        measure_s: float | None,
        stop_s: float | None,
        ready: bool,
        deadline_s: float | None = None,
    ) -> LaunchRecord:
        """A launch that ran (``began_s`` monotonic)."""
        record = LaunchRecord(
            kind=kind,
            name=name,
            began_s=began_s - self.began_s,
            launch_s=launch_s,
            measure_s=measure_s,
            stop_s=stop_s,
            ready=ready,
            deadline_s=(self.deadline_s if deadline_s is None else deadline_s) - self.began_s,
        )
        self.launches.append(record)
        self.write()
        return record

    def record_evaluation(
        self,
        kind: LaunchKind,
        name: str,
        ev: Evaluation,
        *,
        began_s: float,
        deadline_s: float | None = None,
    ) -> LaunchRecord | None:
        """The launch an evaluation measured (a trial, a confirmation, a tied setting
        again), from its own seconds; None where nothing was launched (screened)."""
        if ev.launch_s is None:
            return None
        return self.record(
            kind, name, began_s=began_s, launch_s=ev.launch_s, measure_s=ev.levels_s,
            stop_s=ev.stop_s, ready=ev.outcome is not None and ev.verdict is not Verdict.STARTUP_FAILED,
            deadline_s=deadline_s,
        )  # fmt: skip

    def snapshot(self) -> BudgetRecord:
        return BudgetRecord(
            budget_s=self.budget_s,
            launch_prior_s=self.launch_prior_s,
            launches=list(self.launches),
            skipped=list(self.skipped),
            earlier=list(self.earlier),
        )

    def write(self) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(self.snapshot().model_dump_json(indent=2), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            log.warning("%s not written", self.path, exc_info=True)


def _earlier_launches(path: Path | None) -> list[LaunchRecord]:
    """The launches an earlier run of the study recorded at ``path`` (none: no such file,
    or one this release cannot read, said in the log)."""
    if path is None or not path.is_file():
        return []
    try:
        record = BudgetRecord.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("earlier launches in %s not read: %s", path, exc)
        return []
    return [*record.earlier, *record.launches]

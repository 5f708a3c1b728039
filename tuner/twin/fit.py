"""The twin learns the engine: its timing factors fitted to what the levels measured.

The simulated engine's step time is a roofline with a few factors
(``tuner.sim.timing.TimingFactors``: the share of peak FLOP/s a step achieves, the
share of HBM bandwidth, the fixed overhead per step and per scheduled request). A
real engine (a GPU the presets describe only on paper, vLLM's CPU build, a release
with new kernels) has its own. After a trial, each level it measured is replayed on
the twin exactly as it was sent (``schedule.jsonl`` from offset 0, later turns their
think time after the answer they extend) and the twin's percentiles over the same
window are compared with the measured ones: TTFT and TPOT at p50 and p90, as the
log of their ratio (a twin twice too slow is as wrong as one twice too fast). The
factors that make that error smallest (Nelder-Mead in log space, from the current
ones) are the twin's from then on. A fit pools the levels of several trials (the
busiest level that held in each of the latest ones beside this trial's): the factors
of one setting's levels alone fit that setting and mispredict the others.

The fit uses medians and p90s, not p99s: a p99 over a window of a few hundred
requests is two or three requests, and the twin's job in the search is to rank
settings and to place rates, which the body of the distribution decides.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tuner.errors import ConfigError
from tuner.run.layout import WINDOW_JSON, RunLayout
from tuner.run.twin_record import TwinRecord
from tuner.serving.load import scaled_schedule
from tuner.serving.window import WindowOpening
from tuner.sim.timing import TimingFactors
from tuner.twin.prediction import Setup, simulate_schedule
from tuner.vllm.memory import ServingParams
from workloads.load_result import LoadResult, Percentiles
from workloads.schedule import ScheduledRequest, read_records, read_schedule
from workloads.slo import Slo

FIT_QUANTILES = ("p50", "p90")
FIT_METRICS = ("ttft_ms", "tpot_ms")
FITTED = "fitted"  # TimingFactors.source of factors a fit found
MAX_EVALUATIONS = 40  # twin replays of every level: a fit costs about this many
MAX_LEVELS = 3  # the most recent levels a fit replays (the cost grows with them)
DRAIN_S = 30.0  # a replay runs on this long after the window, for the answers in flight
# The factors stay where a real engine can be: a third of the paper's rates to all of
# them, an overhead from none to 100 ms.
BOUNDS = {
    "mfu": (0.05, 1.0),
    "mbu": (0.05, 1.0),
    "step_overhead_s": (1e-5, 0.1),
    "request_overhead_s": (1e-4, 1.0),
}
# Where a fit starts a factor the paper leaves at 0 (log space has no 0).
LOG_FLOOR = {"request_overhead_s": 1e-3}


@dataclass(frozen=True)
class MeasuredLevel:
    """One measured level, as the twin replays it."""

    name: str  # trials/<n>/level-<i>
    schedule: list[ScheduledRequest]
    opened_at_s: float  # the window, from the schedule's offset 0
    window_s: float
    measured: dict[str, Percentiles]  # ttft_ms and tpot_ms over the window (emulated ms)
    # The settings the level's server ran with (None: the setup's that replays it); a fit
    # pools the levels of several trials, each replayed with its own.
    params: ServingParams | None = None

    @property
    def end_s(self) -> float:
        return self.opened_at_s + self.window_s

    @property
    def sent(self) -> list[ScheduledRequest]:
        """What the level sent: its schedule up to the window's close (the rest of a
        schedule planned to the longest window was never sent)."""
        return [r for r in self.schedule if r.send_s < self.end_s]


class LevelAccuracy(BaseModel):
    """How close the twin came on one level: its percentiles beside the measured ones
    (a record, not an exception)."""

    model_config = ConfigDict(frozen=True)

    level: str
    measured: dict[str, float]  # "ttft_ms.p50": value
    predicted: dict[str, float]

    @property
    def log_errors(self) -> list[float]:
        return [
            math.log(self.predicted[k] / self.measured[k])
            for k in self.measured
            if self.measured[k] > 0 and self.predicted.get(k, 0.0) > 0
        ]


class TwinAccuracy(BaseModel):
    """How far the twin is from what was measured: per level, and as one figure (the
    median absolute error of its percentiles, as a share: 0.1 is 10 % off). A record,
    not an exception."""

    model_config = ConfigDict(frozen=True)

    levels: list[LevelAccuracy]

    @property
    def median_share(self) -> float | None:
        errors = [abs(math.expm1(e)) for lv in self.levels for e in lv.log_errors]
        return statistics.median(errors) if errors else None

    @property
    def loss(self) -> float:
        errors = [e for lv in self.levels for e in lv.log_errors]
        # A level the twin could not run at all (its server would not start) is far off.
        missing = sum(1 for lv in self.levels if not lv.predicted)
        return (sum(e * e for e in errors) / len(errors) if errors else 0.0) + 10.0 * missing


class TwinFit(BaseModel):
    """One fit: the factors before and after, and the twin's accuracy with each
    (``error_before``, ``error_after``: the names ``TrialFit`` records them under)."""

    model_config = ConfigDict(frozen=True)

    before: TimingFactors
    after: TimingFactors
    error_before: TwinAccuracy
    error_after: TwinAccuracy
    evaluations: int
    fitted: bool = True  # False: the twin was already within ``within_share``; no search ran


def read_level(level_dir: Path, *, time_scale: float = 1.0) -> MeasuredLevel | None:
    """A level's schedule, window and measured percentiles (emulated time), or None where
    any of them is missing or unreadable (a level that stopped before its window opened)."""
    paths = [level_dir / n for n in ("schedule.jsonl", WINDOW_JSON, "requests.jsonl")]
    window = WindowOpening.read(level_dir)
    if window is None or not all(p.is_file() for p in paths):
        return None
    try:
        # written as the load generator sent it, on the level's clock: back to the
        # emulated GPU's seconds, which the twin replays and the window counts in
        schedule = scaled_schedule(read_schedule(paths[0]), 1.0 / time_scale)
        records = list(read_records(paths[2]))
    except (OSError, ValueError):  # a half-written or foreign file: not a sample
        return None
    planned = {r.request_id: r for r in schedule}
    # Offset 0 in Unix time: an open-loop request was due exactly at it plus its send_s.
    zero = next(
        (
            rec.scheduled_s - planned[rec.request_id].send_s * time_scale
            for rec in records
            if rec.request_id in planned and planned[rec.request_id].follows is None
        ),
        None,
    )
    if zero is None:
        return None
    start, end = window.opened_at_s, window.opened_at_s + window.window_s
    inside = [
        rec for rec in records
        if not rec.warmup and start <= (rec.scheduled_s - zero) / time_scale < end
    ]  # fmt: skip
    load = LoadResult.from_records(inside, slo=None)
    if time_scale != 1.0:
        load = load.in_virtual_time(time_scale)
    if not load.ttft_ms.count:
        return None
    return MeasuredLevel(
        name=f"{level_dir.parent.name}/{level_dir.name}",
        schedule=schedule,
        opened_at_s=start,
        window_s=window.window_s,
        measured={"ttft_ms": load.ttft_ms, "tpot_ms": load.tpot_ms},
    )


def twin_accuracy(setup: Setup, levels: Sequence[MeasuredLevel]) -> TwinAccuracy:
    """The twin (``setup``, its timing factors included) replaying each level."""
    out: list[LevelAccuracy] = []
    for level in levels:
        measured = _figures(level.measured)
        own = setup if level.params is None else replace(setup, params=level.params)
        _, result = simulate_schedule(
            own, level.sent, Slo(), stop_at_s=level.end_s + DRAIN_S,
            measure_from_s=level.opened_at_s, measure_to_s=level.end_s,
        )  # fmt: skip
        predicted = (
            {}
            if result is None
            else _figures({"ttft_ms": result.ttft_ms, "tpot_ms": result.tpot_ms})
        )
        out.append(LevelAccuracy(level=level.name, measured=measured, predicted=predicted))
    return TwinAccuracy(levels=out)


def _figures(percentiles: dict[str, Percentiles]) -> dict[str, float]:
    out: dict[str, float] = {}
    for metric in FIT_METRICS:
        p = percentiles.get(metric)
        for q in FIT_QUANTILES:
            value = getattr(p, q) if p is not None else None
            if value is not None and value > 0:
                out[f"{metric}.{q}"] = float(value)
    return out


class _OutOfTime(Exception):
    """A fit's seconds are spent, or it is close enough (``done_share``): it keeps the
    best factors it replayed."""


def fit(
    setup: Setup,
    levels: Sequence[MeasuredLevel],
    *,
    max_evaluations: int = MAX_EVALUATIONS,
    max_seconds: float | None = None,
    within_share: float | None = None,
    done_share: float | None = None,
) -> TwinFit:
    """The timing factors that bring the twin closest to ``levels`` (the most recent
    ``MAX_LEVELS``), starting from ``setup``'s; ``max_seconds``: the search stops there
    (once its first simplex is replayed) with the best factors it replayed, so a short
    budget's tune does not spend a trial's time on a fit. ``within_share``: where the
    twin replays every level and its median error is already within it, no search runs
    (``fitted`` False) and ``setup``'s factors stand. ``done_share``: the search stops
    once factors it replayed bring the twin that close (``closest`` of them taken): a
    closer fit fits the levels' noise."""
    from scipy.optimize import minimize  # a second of import: only when a fit runs

    levels = list(levels)[-MAX_LEVELS:]
    start = setup.timing
    names = tuple(BOUNDS)
    cache: dict[tuple[float, ...], TwinAccuracy] = {}

    def factors_at(x: Sequence[float]) -> TimingFactors:
        values = {
            n: min(max(math.exp(v), BOUNDS[n][0]), BOUNDS[n][1])
            for n, v in zip(names, x, strict=True)
        }
        return start.model_copy(update={**values, "source": FITTED})

    began = time.monotonic()

    def accuracy_at(x: Sequence[float]) -> TwinAccuracy:
        key = tuple(round(v, 6) for v in x)
        if key not in cache:
            spent = time.monotonic() - began
            if max_seconds is not None and spent > max_seconds and len(cache) > len(names):
                raise _OutOfTime
            cache[key] = twin_accuracy(replace(setup, timing=factors_at(x)), levels)
            if done_share is not None and _done(cache[key], before, done_share):
                raise _OutOfTime
        return cache[key]

    before = twin_accuracy(setup, levels)
    error = before.median_share
    if (
        within_share is not None
        and error is not None
        and error <= within_share
        and all(lv.predicted for lv in before.levels)
    ):
        return TwinFit(
            before=start, after=start, error_before=before, error_after=before,
            evaluations=1, fitted=False,
        )  # fmt: skip
    first = {n: getattr(start, n) for n in names}
    # The request overhead starts from the median gap between the measured and the
    # twin's TTFT p50 (what no step cost explains), where the twin is the faster.
    gaps = [
        lv.measured["ttft_ms.p50"] - lv.predicted["ttft_ms.p50"]
        for lv in before.levels
        if "ttft_ms.p50" in lv.measured and "ttft_ms.p50" in lv.predicted
    ]
    if gaps and first["request_overhead_s"] < LOG_FLOOR["request_overhead_s"]:
        first["request_overhead_s"] = max(statistics.median(gaps) / 1000.0, 0.0)
    x0 = [math.log(max(first[n], LOG_FLOOR.get(n, BOUNDS[n][0]))) for n in names]
    try:
        result = minimize(
            lambda x: accuracy_at(x).loss, x0, method="Nelder-Mead",
            options={"maxfev": max_evaluations, "xatol": 0.01, "fatol": 1e-4, "initial_simplex": _simplex(x0)},
        )  # fmt: skip
        accuracy_at(list(result.x))
    except _OutOfTime:
        pass
    best = closest(cache, before)
    if best is None:  # nothing closer found: keep what there was
        return TwinFit(
            before=start, after=start, error_before=before, error_after=before,
            evaluations=len(cache) + 1,
        )  # fmt: skip
    return TwinFit(
        before=start, after=factors_at(best), error_before=before, error_after=cache[best],
        evaluations=len(cache) + 1,
    )  # fmt: skip


def _done(accuracy: TwinAccuracy, before: TwinAccuracy, done_share: float) -> bool:
    """Whether replayed factors end a fit: every level replayed, within ``done_share``,
    and closer than ``before`` (``closest``)."""
    error = accuracy.median_share
    return (
        error is not None
        and error <= done_share
        and all(lv.predicted for lv in accuracy.levels)
        and _closer(accuracy, before)
    )


def _closer(accuracy: TwinAccuracy, before: TwinAccuracy) -> bool:
    """Replayed factors closer than ``before`` by the loss and no further off by the
    median error (``closest``)."""
    median, after = before.median_share, accuracy.median_share
    return accuracy.loss < before.loss and (
        median is None or (after is not None and after <= median)
    )


def closest(
    replayed: Mapping[tuple[float, ...], TwinAccuracy], before: TwinAccuracy
) -> tuple[float, ...] | None:
    """Of the factors a fit replayed, those of least loss among the ones closer than
    ``before`` both by that loss and by the median error the run reports (None: none
    is). The loss (squared log errors) weighs the far-off percentiles, the median the
    typical one: on noisy levels (vLLM's CPU build) the least loss alone can leave the
    median further off, and a fit shown as "48% off, 53% after fitting" is no fit."""
    found = [(accuracy.loss, x) for x, accuracy in replayed.items() if _closer(accuracy, before)]
    return min(found)[1] if found else None


def _simplex(x0: Sequence[float]) -> list[list[float]]:
    """A first simplex wide enough to find factors off by a third or more (log steps of
    0.4: x1.5)."""
    points = [list(x0)]
    for i in range(len(x0)):
        p = list(x0)
        p[i] += 0.4
        points.append(p)
    return points


GOODPUT_TOLERANCE = 0.05  # the precision a trial's goodput is measured to
# A fit after a trial runs only where the twin is further off the trial's levels than
# this (median share of the percentiles): no fit of the default tune's trials brought it
# below 1 to 7%, and measured percentiles of one setting differ by as much between
# levels, so a fit within it spends a trial's time fitting noise.
FIT_WITHIN_SHARE = 0.05
# A fit stops once it brings the twin within half that (``fit``'s ``done_share``): the
# first fit of the default tune reached 1.8% in 12 s and 0.6% in 30 s, and both factor
# sets predict the same goodputs for trial 0's settings and trial 1's (5.46 and 8.90
# conversations/s); half, so that the next trial's levels, off by their own noise again,
# still find the twin within it.
FIT_DONE_SHARE = FIT_WITHIN_SHARE / 2


def goodput_worse(
    before: float | None, after: float | None, measured: float | None, *, lower_bound: bool
) -> bool:
    """Whether the goodput predicted after a fit is further from the measured one than
    the prediction before it, by more than the measurement's precision. A measured lower
    bound ("at least"): a prediction above it is no error."""
    if not before or not after or not measured:
        return False
    error_before = before / measured - 1.0
    error_after = after / measured - 1.0
    if lower_bound:
        error_before, error_after = min(error_before, 0.0), min(error_after, 0.0)
    return abs(error_after) > abs(error_before) + GOODPUT_TOLERANCE


def read_twin(run_dir: Path) -> TwinRecord:
    """A run's ``twin.json`` (``--twin-from``), as a ConfigError naming what is wrong."""
    path = RunLayout(run_dir).twin_json
    if not path.is_file():
        raise ConfigError(
            f"--twin-from {str(run_dir)!r} has no {path.name}; accepted: the run directory "
            "of a tune that measured at least one level"
        )
    try:
        return TwinRecord.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(f"--twin-from {str(path)!r} is not a twin record: {first}") from exc

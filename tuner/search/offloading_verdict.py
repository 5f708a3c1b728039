"""The offloading verdict of a tune (``tuner.run.offloading``) from its trials' evaluations."""

from __future__ import annotations

from collections.abc import Iterable

from tuner.run.evaluation import Evaluation
from tuner.run.offloading import (
    OffloadingOutcome,
    OffloadingSide,
    OffloadingVerdict,
    TwinOffloading,
)
from tuner.search.capacity_interval import capacity_gain
from tuner.twin.landscape import Landscape, ScreenedPoint
from tuner.vllm.space import Knob, SearchSpace


def offloading_verdict(
    space: SearchSpace,
    evaluations: Iterable[Evaluation],
    landscape: Landscape | None = None,
    unit: str = "req/s",
) -> OffloadingVerdict | None:
    """The best trial with a CPU tier against the best without (by goodput), where the
    tune searched ``kv-offloading-size``, with the twin's screen of both where it ran
    (``landscape``); None where the size was not searched."""
    size_range = next((r for r in space.ranges if r.knob is Knob.KV_OFFLOADING_SIZE), None)
    if size_range is None:
        return None
    measured = [e for e in evaluations if e.outcome is not None]
    searched = {float(v) for v in size_range.choices or () if isinstance(v, int | float)}
    tried = {float(e.params.kv_offloading_size_gib or 0.0) for e in measured}
    sizes = sorted((searched | tried) - {0.0})
    twin = _twin(landscape)
    served = [e for e in measured if e.goodput_requests_per_s > 0]
    with_it = max((e for e in served if e.params.offloads_kv), key=_goodput, default=None)
    without = max((e for e in served if not e.params.offloads_kv), key=_goodput, default=None)
    if with_it is None or without is None:
        offloads = with_it is None
        missing = "with a CPU tier" if offloads else "without a CPU tier"
        ran = any(e.params.offloads_kv is offloads for e in measured)
        note = f"no trial {missing} " + ("met the SLOs" if ran else "was measured")
        return OffloadingVerdict(
            outcome=OffloadingOutcome.NOT_COMPARED, sizes_gib=sizes,
            with_offloading=_side(with_it), without_offloading=_side(without), note=note,
            twin=twin, unit=unit,
        )  # fmt: skip
    gain = capacity_gain(with_it.capacity_interval, without.capacity_interval)
    if gain is None or not gain.measurable:
        outcome = OffloadingOutcome.NO_GAIN
    else:
        outcome = OffloadingOutcome.PAYS if gain.low_ratio > 1.0 else OffloadingOutcome.COSTS
    return OffloadingVerdict(
        outcome=outcome, sizes_gib=sizes, with_offloading=_side(with_it),
        without_offloading=_side(without), gain=gain, twin=twin, unit=unit,
    )  # fmt: skip


def _twin(landscape: Landscape | None) -> TwinOffloading | None:
    """The twin's best screened goodput with a CPU tier and without (None: no screen, or
    one side not screened)."""
    if landscape is None:
        return None
    started = [p for p in landscape.points if p.failure is None]
    with_it = max((p for p in started if p.params.offloads_kv), key=_rate, default=None)
    without = max((p for p in started if not p.params.offloads_kv), key=_rate, default=None)
    if with_it is None or without is None:
        return None
    return TwinOffloading(
        with_per_s=with_it.rate_per_s, with_settings=with_it.params.short(),
        without_per_s=without.rate_per_s, without_settings=without.params.short(),
        ladder_step=landscape.ladder_step,
    )  # fmt: skip


def _rate(p: ScreenedPoint) -> float:
    return p.rate_per_s


def _goodput(e: Evaluation) -> float:
    return e.goodput_requests_per_s


def _side(e: Evaluation | None) -> OffloadingSide | None:
    if e is None:
        return None
    return OffloadingSide(
        trial=_trial_number(e), settings=e.params.short(), goodput=e.stated_goodput,
        capacity_interval=e.capacity_interval,
    )  # fmt: skip


def _trial_number(e: Evaluation) -> int:
    """The trial's number, from its directory (``trials/007``)."""
    name = e.dir.rstrip("/").rsplit("/", 1)[-1]
    return int(name) if name.isdigit() else -1

"""The offloading verdict of a tune (``tuner.run.offloading``) from its trials' evaluations."""

from __future__ import annotations

from collections.abc import Iterable

from tuner.run.evaluation import Evaluation
from tuner.run.offloading import OffloadingOutcome, OffloadingSide, OffloadingVerdict
from tuner.search.capacity_interval import capacity_gain
from tuner.vllm.space import Knob, SearchSpace


def offloading_verdict(
    space: SearchSpace, evaluations: Iterable[Evaluation]
) -> OffloadingVerdict | None:
    """The best trial with a CPU tier against the best without (by goodput), where the
    tune searched ``kv-offloading-size``; None where it did not."""
    if not any(r.knob is Knob.KV_OFFLOADING_SIZE for r in space.ranges):
        return None
    measured = [e for e in evaluations if e.outcome is not None]
    sizes = sorted({float(e.params.kv_offloading_size_gib or 0.0) for e in measured} - {0.0})
    served = [e for e in measured if e.goodput > 0]
    with_it = max((e for e in served if e.params.offloads_kv), key=_goodput, default=None)
    without = max((e for e in served if not e.params.offloads_kv), key=_goodput, default=None)
    if with_it is None or without is None:
        missing = "with a CPU tier" if with_it is None else "without a CPU tier"
        return OffloadingVerdict(
            outcome=OffloadingOutcome.NOT_COMPARED, sizes_gib=sizes,
            with_offloading=_side(with_it), without_offloading=_side(without),
            note=f"no trial {missing} met the SLOs",
        )  # fmt: skip
    gain = capacity_gain(with_it.capacity_interval, without.capacity_interval)
    if gain is None or not gain.measurable:
        outcome = OffloadingOutcome.NO_GAIN
    else:
        outcome = OffloadingOutcome.PAYS if gain.low_ratio > 1.0 else OffloadingOutcome.COSTS
    return OffloadingVerdict(
        outcome=outcome, sizes_gib=sizes, with_offloading=_side(with_it),
        without_offloading=_side(without), gain=gain,
    )  # fmt: skip


def _goodput(e: Evaluation) -> float:
    return e.goodput


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

"""``twin.json``: the twin's timing factors now and every fit of them after a trial.

``tuner.twin.fit`` fits the factors and ``tuner.search.study.trial_twin`` records each fit
(``TrialFit``) in the ``TwinRecord``; ``summary.json`` repeats the fits, ``--twin-from``
and the report read them back (``tuner.twin.fit.read_twin``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tuner.sim.timing import TimingFactors


class TrialFit(BaseModel):
    """One trial's fit as ``twin.json`` records it: the twin's error on the trial's levels
    before and after, and its goodput prediction for the trial's settings against what
    was measured."""

    model_config = ConfigDict(frozen=True)

    trial: int
    levels: list[str]
    before: TimingFactors
    after: TimingFactors
    error_before: float | None  # median share off the measured percentiles
    error_after: float | None
    evaluations: int
    measured_rate_per_s: float | None = None  # the trial's goodput, the workload's unit
    predicted_rate_per_s: float | None = None  # the twin's for its settings, before the trial
    predicted_after_per_s: float | None = None  # ... with the factors fitted after it
    # False: the fitted factors put the trial's measured goodput further off than the
    # ones before (``tuner.twin.fit.goodput_worse``): the twin kept those.
    adopted: bool = True
    # False: no fit ran and the factors stand: the twin was already within
    # ``tuner.twin.fit.FIT_WITHIN_SHARE`` of the levels (``error_before``), or its goodput
    # prediction within the trial's own capacity interval, or the trial left no level to
    # replay (no ``levels``; ``adopted`` False: nothing was taken from it);
    # ``kept_because`` says which (None in records from before it was kept: the first).
    fitted: bool = True
    kept_because: str | None = None

    @staticmethod
    def share_off(predicted: float | None, measured: float | None) -> float | None:
        if not predicted or not measured:
            return None
        return predicted / measured - 1.0


class TwinRecord(BaseModel):
    """``twin.json``: the twin's timing factors now and every fit that led there."""

    model_config = ConfigDict(frozen=True)

    factors: TimingFactors = TimingFactors()
    fits: list[TrialFit] = []

    def with_fit(self, one: TrialFit) -> TwinRecord:
        return TwinRecord(
            factors=one.after if one.adopted else self.factors, fits=[*self.fits, one]
        )

    def write(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)

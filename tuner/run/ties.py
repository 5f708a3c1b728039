"""The tie-break: which of the settings tied with the best trial is recommended, and why.

Two feasible trials whose capacity intervals overlap are a tie: the measurement cannot
rank them (``tuner.search.study.records.ties_with_best``). Before the recommendation is
built, ``tuner.search.ties.settle_ties`` measures the best trial's settings and its
strongest rival again, on one new draw of the workload each, where the budget leaves the
time, and pools each one's levels; then it recommends the one that serves more beyond the
noise, or, still tied, the one that risks less (the model's own numerics before a
setting that changes them), or the highest goodput. ``recommendation.json`` and
``summary.json`` keep it as ``tie_break``.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from tuner.run.goodput import CapacityInterval


class TieOutcome(StrEnum):
    """What measuring the tied settings again came to."""

    SEPARATED = "separated"  # measured again: one serves more beyond the noise
    STILL_TIED = "still_tied"  # measured again: still within the noise of each other
    NOT_MEASURED = "not_measured"  # not measured again (the reason says why)


class TieChoice(StrEnum):
    """Why the recommended one of the tied settings was chosen."""

    SERVES_MORE = "serves_more"  # its pooled capacity lies above the other's
    MODEL_NUMERICS = "model_numerics"  # tied, and it keeps the model's own numerics
    NO_HOST_MEMORY = "no_host_memory"  # tied, and it keeps no KV cache in host memory
    BRACKETED = "bracketed"  # tied, and a rate above its goodput broke: the other's is a bound
    HIGHEST_GOODPUT = "highest_goodput"  # tied: the highest goodput measured, as before


class TiedTrial(BaseModel):
    """One of the two settings compared: its trial's goodput and interval, and with its
    measurement again, the pooled interval over both."""

    model_config = ConfigDict(frozen=True)

    trial: int
    settings: str  # its flags, short
    changes_numerics: bool
    offloads_kv: bool = False  # keeps KV blocks in pinned host memory (--kv-offloading-size)
    lower_bound: bool = False  # no measured rate broke: its goodput is only a lower bound
    goodput_per_s: float  # the trial's, in the workload's unit
    interval: CapacityInterval | None  # the trial's own
    again_goodput_per_s: float | None = None  # measured again (None: not)
    pooled: CapacityInterval | None = None  # over the trial's levels and those again
    dir: str | None = None  # the measurement again's evidence


class TieBreak(BaseModel):
    """The tie-break of one tune: the trials tied with the best, the two compared, the one
    recommended and why."""

    model_config = ConfigDict(frozen=True)

    best: int  # the trial with the highest goodput
    tied: list[int]  # the trials within its noise
    unit: str  # the workload's unit, e.g. "conversations/s"
    compared: list[TiedTrial]  # the best and its strongest rival
    outcome: TieOutcome
    chosen: int
    choice: TieChoice
    reason: str = ""  # why not measured again, where it was not

    def text(self) -> str:
        """In words, e.g. "trials 3 and 1 tie within the noise; measured again on a new draw
        of the workload: still tied (3: capacity 90% in [7.50, 8.40], 1: capacity 90% in
        [7.30, 8.10]); recommended trial 1: it keeps the model's own numerics at no
        measurable loss"."""
        others = [t.trial for t in self.compared if t.trial != self.best] or self.tied[:1]
        pair = f"trials {self.best} and {others[0]}" if others else f"trial {self.best}"
        head = f"{pair} tie within the noise"
        if self.outcome is TieOutcome.NOT_MEASURED:
            head += f"; not measured again: {self.reason}" if self.reason else ""
        else:
            said = "; ".join(
                f"{t.trial}: {t.pooled.bracket()}" for t in self.compared if t.pooled is not None
            )
            verdict = "one serves more" if self.outcome is TieOutcome.SEPARATED else "still tied"
            head += f"; measured again on a new draw of the workload: {verdict} ({said})"
        why = {
            TieChoice.SERVES_MORE: "it serves more beyond the noise",
            TieChoice.MODEL_NUMERICS: "it keeps the model's own numerics at no measurable loss",
            TieChoice.NO_HOST_MEMORY: (
                "it pins no host memory for KV offloading, at no measurable loss"
            ),
            TieChoice.BRACKETED: (
                "its capacity was bracketed (a higher rate broke), where the other's is only "
                "bounded from below, and the noise cannot rank them"
            ),
            TieChoice.HIGHEST_GOODPUT: "the highest goodput measured; the noise cannot rank them",
        }[self.choice]
        return f"{head}; recommended trial {self.chosen}: {why}"

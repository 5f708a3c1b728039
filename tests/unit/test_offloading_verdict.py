"""The offloading verdict's line (tuner.run.offloading): pays, ties, costs, not compared."""

from __future__ import annotations

import pytest

from tuner.run.goodput import CapacityGain, CapacityInterval, Goodput
from tuner.run.offloading import (
    OffloadingOutcome,
    OffloadingSide,
    OffloadingVerdict,
    TwinOffloading,
)


def _side(trial: int, settings: str, rate: float, low: float, high: float) -> OffloadingSide:
    return OffloadingSide(
        trial=trial, settings=settings,
        goodput=Goodput(arrival_rate_per_s=rate, requests_per_s=rate),
        capacity_interval=CapacityInterval(low_per_s=low, high_per_s=high),
    )  # fmt: skip


WITH = _side(2, "seqs 16 cpu-kv 64 evict arc", 15.0, 14.0, 16.0)
WITHOUT = _side(0, "seqs 16", 10.0, 9.0, 11.0)


@pytest.mark.parametrize(
    ("outcome", "gain", "starts"),
    [
        (OffloadingOutcome.PAYS, CapacityGain(ratio=1.5, low_ratio=1.27, high_ratio=1.78, measurable=True), "offloading pays: capacity +50% [+27%, +78%] at 16/64 GiB"),
        (OffloadingOutcome.NO_GAIN, CapacityGain(ratio=1.05, low_ratio=0.9, high_ratio=1.2, measurable=False), "offloading: no measurable gain at 16/64 GiB, it does not pay for this workload: capacity +5% [-10%, +20%], the intervals overlap"),
        (OffloadingOutcome.COSTS, CapacityGain(ratio=0.7, low_ratio=0.6, high_ratio=0.8, measurable=True), "offloading costs capacity: capacity -30% [-40%, -20%]"),
    ],
)  # fmt: skip
def test_the_line_names_the_gain_and_both_trials(
    outcome: OffloadingOutcome, gain: CapacityGain, starts: str
) -> None:
    verdict = OffloadingVerdict(
        outcome=outcome, sizes_gib=[16.0, 64.0], with_offloading=WITH,
        without_offloading=WITHOUT, gain=gain,
    )  # fmt: skip
    text = verdict.text()
    assert text.startswith(starts), text
    assert "best with it trial 2 (seqs 16 cpu-kv 64 evict arc) 15.00 req/s" in text
    assert "best without it trial 0 (seqs 16) 10.00 req/s" in text
    assert "capacity 90% in [9.00, 11.00]" in text


def test_not_compared_says_which_side_is_missing() -> None:
    verdict = OffloadingVerdict(
        outcome=OffloadingOutcome.NOT_COMPARED, sizes_gib=[16.0], with_offloading=WITH,
        without_offloading=None, note="no trial without a CPU tier met the SLOs",
    )  # fmt: skip
    assert verdict.text() == (
        "offloading: not compared at 16 GiB: no trial without a CPU tier met the SLOs"
    )


TWIN_FLAT = TwinOffloading(
    with_per_s=6.02, with_settings="cpu-kv 64 evict arc", without_per_s=6.02,
    without_settings="seqs 256", ladder_step=1.05,
)  # fmt: skip


def test_the_twins_screen_answers_where_no_trial_with_a_cpu_tier_was_measured() -> None:
    verdict = OffloadingVerdict(
        outcome=OffloadingOutcome.NOT_COMPARED, sizes_gib=[16.0, 64.0], with_offloading=None,
        without_offloading=WITHOUT, note="no trial with a CPU tier was measured",
        twin=TWIN_FLAT, unit="conversations/s",
    )  # fmt: skip
    assert not TWIN_FLAT.gains
    assert verdict.text() == (
        "offloading: no gain the twin can see, not measured: no trial with a CPU tier was "
        "measured; twin: best with it 6.02 conversations/s (cpu-kv 64 evict arc), without it "
        "6.02 conversations/s (seqs 256), its rungs 5% apart"
    )
    rung_up = TWIN_FLAT.model_copy(update={"with_per_s": 6.02 * 1.05})
    assert rung_up.gains
    assert (
        verdict.model_copy(update={"twin": rung_up})
        .text()
        .startswith("offloading: pays on the twin, not measured")
    )

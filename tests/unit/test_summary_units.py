"""``summary.json``: every goodput figure named with its unit; runs written before still read."""

from __future__ import annotations

import json

import pytest

from tuner.run.goodput import Goodput, GoodputBound, GoodputUnit
from tuner.run.summary import TuneSummary

FIGURES = Goodput(
    arrival_rate_per_s=6.02,
    unit=GoodputUnit.CONVERSATIONS_PER_S,
    requests_per_s=19.42,
    output_tokens_per_s=3097.0,
    bound=GoodputBound.BRACKETED,
)
COMMON = {
    "study": "s", "run_dir": "runs/s", "backend": "sim", "trials": 2, "feasible": 2,
    "best_trial": 0, "finalized_here": True, "recommendation": None, "report": None,
    "wall_s": 1.0, "best_goodput_figures": FIGURES.model_dump(mode="json"),
}  # fmt: skip


def test_a_summary_names_each_figure_with_its_unit() -> None:
    summary = TuneSummary.model_validate(
        {
            **COMMON,
            "best_goodput_requests_per_s": 19.42,
            "best_goodput_arrival_rate_per_s": 6.02,
            "best_goodput_arrival_unit": "conversations_per_s",
            "best_goodput_output_tokens_per_s": 3097.0,
        }
    )
    written = json.loads(summary.model_dump_json())
    assert written["best_goodput_requests_per_s"] == 19.42
    assert written["best_goodput_arrival_rate_per_s"] == 6.02
    assert written["best_goodput_arrival_unit"] == "conversations_per_s"
    # no figure whose name leaves its unit to another field
    assert "best_goodput" not in written and "best_goodput_unit" not in written


def test_a_summary_written_before_the_units_were_named_still_reads() -> None:
    old = {**COMMON, "best_goodput": 19.42, "best_goodput_unit": "conversations_per_s"}
    summary = TuneSummary.model_validate_json(json.dumps(old))
    assert summary.best_goodput_requests_per_s == pytest.approx(19.42)
    assert summary.best_goodput_arrival_unit is GoodputUnit.CONVERSATIONS_PER_S
    assert summary.best_goodput_arrival_rate_per_s is None  # not recorded then

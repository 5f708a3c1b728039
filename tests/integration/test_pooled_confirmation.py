"""The recommendation's confirmation pools its trial's levels (issue 34): where the
recommendation is its best trial's own settings (here no OOM edge moves its utilization)
and that trial bracketed its goodput, the confirmation measures the workload's other draws
at the trial's bracket's two ends on a launch of its own, and states what the draws say
pooled, rather than bracketing on its own and then measuring its edge draws. On the
virtual clock (tests/virtual.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.virtual import virtual_tune
from tuner.run.evaluation import Evaluation
from tuner.run.levels import rebase
from tuner.run.recommendation import Recommendation
from tuner.search.capacity_interval import capacity_interval

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_the_confirmation_measures_the_other_draw_at_its_trials_bracket(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = virtual_tune(run_dir, "--no-edge", "--max-levels", "4")
    rec = Recommendation.model_validate_json(
        (run_dir / "recommendation" / "recommendation.json").read_text()
    )
    best = Evaluation.model_validate_json(
        (run_dir / "trials" / f"{rec.best_trial:03d}" / "evaluation.json").read_text()
    )
    confirm_dir = run_dir / "confirm" / "recommended"
    confirmed = Evaluation.model_validate_json((confirm_dir / "evaluation.json").read_text())
    assert confirmed.params == best.params
    held = best.rate_per_s
    assert held is not None
    broke = min(lv.rate_per_s for lv in best.levels if not lv.met and lv.rate_per_s > held)
    # the trial's levels first, as recorded, then the confirmation's own: the other draw at
    # the trial's bracket's ends, the held one first, numbered from level-0 in its directory
    prior = confirmed.levels[: len(best.levels)]
    assert prior == best.levels
    own = confirmed.levels[len(best.levels) :]
    assert [(lv.rate_per_s, lv.draw) for lv in own[:2]] == [(held, 1), (broke, 1)]
    assert [Path(lv.dir).name for lv in own] == [f"level-{i}" for i in range(len(own))]
    assert all(Path(lv.dir).parent == confirm_dir for lv in own)
    # the other draws (four in all by default), each at both ends before the next
    assert {lv.draw for lv in own} >= {1, 2, 3}
    if all(lv.met for lv in own if lv.rate_per_s == held):  # all held where the trial did
        assert [(lv.rate_per_s, lv.draw) for lv in own] == [
            (rate, draw) for draw in (1, 2, 3) for rate in (held, broke)
        ]
        assert confirmed.rate_per_s == held
    else:  # the bracket moved down, measured with every draw on the confirmation's launch
        assert confirmed.rate_per_s is None or confirmed.rate_per_s < held
        below = [lv for lv in own if lv.rate_per_s < held]
        assert below and {lv.draw for lv in below} >= {1, 2, 3}
    # the stated interval pools both draws
    measured = rec.recommended.measured
    assert measured is not None and measured.capacity_interval is not None
    assert measured.capacity_interval == capacity_interval(confirmed.levels)
    # every level's evidence is found where it lies, the trial's under the trial
    for lv in confirmed.levels:
        assert rebase(lv.dir, confirm_dir).is_dir(), lv.dir
    assert "recommended (confirmation)" in (run_dir / "report.html").read_text()
    assert done.summary is not None

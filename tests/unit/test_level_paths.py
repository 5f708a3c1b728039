"""Where a run's recorded level directories are now (``tuner.run.levels.rebase``): a run
directory may move, and a confirmation that pools its trial's levels records them under
that trial's directory, not its own."""

from __future__ import annotations

from pathlib import Path

from tuner.run.levels import rebase


def test_a_level_recorded_under_its_own_directory_is_found_under_its_new_place() -> None:
    moved = Path("/new/run/trials/001")
    assert rebase("/old/run/trials/001/level-2", moved) == moved / "level-2"
    confirm = Path("/new/run/confirm/recommended")
    assert rebase("/old/run/confirm/recommended/level-0", confirm) == confirm / "level-0"


def test_a_trials_level_pooled_by_a_confirmation_is_found_under_the_trial() -> None:
    confirm = Path("/new/run/confirm/recommended")
    assert rebase("/old/run/trials/001/level-1", confirm) == Path("/new/run/trials/001/level-1")
    # a parent too shallow to hold a run: the last component under it, as before
    assert rebase("/old/run/trials/001/level-1", Path("here")) == Path("here/level-1")

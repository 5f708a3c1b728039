"""Fixtures for the integration tests: one finished small tune shared by a session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.tune_run import small_tune


@pytest.fixture(scope="session")
def tuned_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory left by a complete `tuner tune` on the simulated engine (about 2 min)."""
    run_dir = tmp_path_factory.mktemp("tuned") / "run"
    small_tune(run_dir)
    return run_dir

"""Fixtures for the integration tests: one finished small tune shared by a session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.tune_run import small_tune


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test``: ``-n 2 --dist loadgroup``) every test of the
    shared tune runs in one worker, so that the tune runs once."""
    for item in items:
        if "tuned_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("tuned_run"))


@pytest.fixture(scope="session")
def tuned_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory left by a complete `tuner tune` on the simulated engine (about 2 min)."""
    run_dir = tmp_path_factory.mktemp("tuned") / "run"
    small_tune(run_dir)
    return run_dir

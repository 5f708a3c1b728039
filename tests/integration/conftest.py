"""Fixtures for the integration tests: one finished small tune shared by a session (on the
twin's virtual clock, tests/virtual.py), and one real-time `tuner tune` for the tests of
what only processes show."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.tune_run import REAL_TUNE_ARGS, small_tune
from tests.virtual import virtual_tune

# Session fixtures too slow to build in each xdist worker: every test using one runs in one
# worker (the shared virtual tune, ``tuned_run``, takes seconds and is built where needed).
REAL_TIME_FIXTURES = frozenset({"real_tuned_run"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test``: ``-n 2 --dist loadgroup``) every test of a
    real-time shared tune runs in one worker, so that the tune runs once. First of the
    hooks: xdist's own reads the group marks into the test ids, and after it a mark is
    ignored."""
    for item in items:
        for name in sorted(REAL_TIME_FIXTURES & set(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.xdist_group(name))


def pytest_collection_finish(session: pytest.Session) -> None:
    """A group that xdist did not write into the test ids is ignored without a word, and
    each worker would then build the shared tune (minutes each): say so and stop."""
    if not session.config.getoption("loadgroup", default=False):
        return
    lost = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid
    ]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist did not group {len(lost)} tests (first: {lost[0]}); this pytest "
            "and pytest-xdist do not agree on test ids: install the versions pyproject.toml names"
        )


@pytest.fixture(scope="session")
def tuned_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory left by the small tune (tests/integration/tune_run.py's
    ``SMALL_TUNE_ARGS``) run whole, report included, on the twin's virtual clock
    (tests/virtual.py: seconds, not minutes). Tests of what a launched process does use
    ``real_tuned_run``."""
    run_dir = tmp_path_factory.mktemp("tuned") / "run"
    done = virtual_tune(run_dir)
    assert done.summary.best_trial is not None, done.output  # as `tuner tune` exits 0
    return run_dir


@pytest.fixture(scope="session")
def real_tuned_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory left by a complete `tuner tune` on the simulated engine in real time:
    sim-serve processes loaded by Locust (``REAL_TUNE_ARGS``: about two minutes)."""
    run_dir = tmp_path_factory.mktemp("real-tuned") / "run"
    small_tune(run_dir, *REAL_TUNE_ARGS)
    return run_dir

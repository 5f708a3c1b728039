"""Fixtures for the integration tests: one finished small tune shared by a session (on the
twin's virtual clock, tests/virtual.py), one real-time `tuner tune` for the tests of
what only processes show, and ``launch``: sim-serve subprocesses stopped after a test."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.simserver import Launch, SimServer, spawn_sim
from tests.integration.tune_run import REAL_TUNE_ARGS, small_tune
from tests.runtime_only import runtime_only_env
from tests.virtual import virtual_tune

# Session fixtures too slow to build in each xdist worker: every test using one runs in one
# worker (the shared virtual tune, ``tuned_run``, is built once for all workers instead).
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


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launch]:
    """Start sim-serve subprocesses (own process group, log in tmp_path); all stopped after."""
    started: list[SimServer] = []

    def start(*args: str, healthy: bool = True) -> SimServer:
        server = spawn_sim(args, tmp_path / f"sim-serve-{len(started)}.log")
        started.append(server)
        if healthy:
            server.wait_healthy()
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def tuned_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory left by the small tune (tests/integration/tune_run.py's
    ``SMALL_TUNE_ARGS``) run whole, report included, on the twin's virtual clock
    (tests/virtual.py: seconds, not minutes). Built once for the whole session: under
    pytest-xdist the first worker to ask builds it in the workers' common temporary folder
    while the others wait on its lock. Read-only to every test: a test that changes a run
    changes a copy (``copy_run``). Tests of what a launched process does use
    ``real_tuned_run``."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    home = shared / "tuned-shared"
    home.mkdir(exist_ok=True)
    run_dir, built = home / "run", home / "built"
    with (home / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not built.exists():
            shutil.rmtree(run_dir, ignore_errors=True)  # a build that failed in another worker
            done = virtual_tune(run_dir)
            assert done.summary.best_trial is not None, done.output  # as `tuner tune` exits 0
            built.touch()
    return run_dir


@pytest.fixture(scope="session")
def real_tuned_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory left by a complete `tuner tune` on the simulated engine in real time:
    sim-serve processes loaded by Locust (``REAL_TUNE_ARGS``: about two minutes), run as on
    an install without the dev extra (tests/runtime_only.py: the tune and every process it
    starts; what they tried to import is logged beside the run directory)."""
    run_dir = tmp_path_factory.mktemp("real-tuned") / "run"
    small_tune(run_dir, *REAL_TUNE_ARGS, env=runtime_only_env(run_dir.parent))
    return run_dir

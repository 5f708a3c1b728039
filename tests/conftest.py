"""Shared fixtures: paths to the shipped data and to ../shared."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
SHARED = REPO.parent / "shared"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES

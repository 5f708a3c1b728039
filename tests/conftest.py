"""Shared fixtures: paths to the shipped data and to ../shared."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
SHARED = REPO.parent / "shared"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def standin_nvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., ModuleType]:
    """``standin_nvml(host, visible=None)``: this process on a stand-in GPU host (the
    stand-in NVML of tests/gpuhost, ``host`` from tests/gpuhost/hosts.py,
    CUDA_VISIBLE_DEVICES=visible) until the test ends; returns the stand-in ``pynvml``."""
    from tests.gpuhost.standin import use_standin_nvml

    def use(host: dict[str, Any], visible: str | None = None) -> ModuleType:
        return use_standin_nvml(monkeypatch, host, tmp_path / "nvml-host.json", visible=visible)

    return use

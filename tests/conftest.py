"""Shared fixtures: paths to the shipped data and to ../shared; the session's cache home."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session", autouse=True)
def session_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``XDG_CACHE_HOME`` in a temporary directory for the whole session (restored after),
    so what the processes the tests start cache by default stays out of the user's
    ``~/.cache``: the simulated engine keeps vLLM's compile cache in
    ``$XDG_CACHE_HOME/vllm`` where no ``VLLM_CACHE_ROOT`` is set
    (``tuner.sim.compile_cache.cache_root``). Not ``VLLM_CACHE_ROOT`` itself: the tuner
    passes that one on to its servers, and tests check what it passes."""
    home = tmp_path_factory.mktemp("xdg-cache-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(home))
        yield home


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

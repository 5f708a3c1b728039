"""The suite's servers cache in a temporary directory, not in the user's ~/.cache: a
`tuner sim-serve` started without a cache directory keeps vLLM's compile cache where
vLLM would (``$XDG_CACHE_HOME/vllm``), and the session's ``XDG_CACHE_HOME`` is its own
(tests/conftest.py ``session_cache_home``). Before, every such test wrote compile-cache
entries into ~/.cache/vllm."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.simserver import start_sim

pytestmark = pytest.mark.integration


def _listing(root: Path) -> dict[str, int]:
    """Every file and folder under ``root`` with its modification time (empty: none)."""
    if not root.exists():
        return {}
    return {str(p): p.stat().st_mtime_ns for p in (root, *root.rglob("*"))}


def test_a_sim_serve_caches_in_the_session_cache_home(
    tmp_path: Path, session_cache_home: Path
) -> None:
    users = Path("~/.cache/vllm").expanduser()
    before = _listing(users)
    assert os.environ["XDG_CACHE_HOME"] == str(session_cache_home)
    args = ("--model", "qwen2.5-7b", "--gpu", "H100-80GB", "--max-model-len", "4096")
    server = start_sim(args, tmp_path / "sim-serve.log")
    try:
        log = server.log_path.read_text(encoding="utf-8")
    finally:
        server.stop()
    compiled = session_cache_home / "vllm" / "torch_compile_cache"
    assert compiled.is_dir() and any(compiled.iterdir()), log
    assert str(compiled) in log  # the directory vLLM's compile line names
    assert _listing(users) == before

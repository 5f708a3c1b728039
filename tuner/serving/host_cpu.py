"""What other processes took of the host's CPU while a level ran.

On the simulated engine the load generator and the simulated server are the measuring
apparatus, and on a small host they share its cores with whatever else runs there (a
test suite, a build, another tune). A level whose simulated server fell behind its
clock is measured again on a slower clock (``tuner.serving.client_lag``); whether its
settings need that slower clock again depends on why it fell behind: its own steps
(a large batch a core cannot run at that pace) or the host's other work, which may be
gone by their next launch. This module tells the two apart.

A sample (``host_cpu_sample``) reads the host's busy CPU seconds (``/proc/stat``: every
state but idle and iowait) and the CPU seconds of this process and every process below
it (``/proc/<pid>/stat``: their own and their waited-for children's; ``os.times`` for
this process and the children it waited for). Between two samples, the busy seconds
that are not this process tree's are the other processes' (``others_share``), as a share
of the host's CPU over the span (1.0: every core). Linux only; elsewhere None.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
# (the share past which a lag is the host's: ``workloads.client_lag.HOST_BUSY_SHARE``)


@dataclass(frozen=True)
class HostCpuSample:
    """The host's busy CPU seconds and this process tree's, at ``monotonic_s``."""

    monotonic_s: float
    host_busy_s: float
    tree_s: float
    cpus: int


def _ticks() -> float:
    return float(os.sysconf("SC_CLK_TCK"))


def _host_busy_s(proc: Path) -> float | None:
    """Every CPU's seconds in any state but idle and iowait (``/proc/stat``'s first line;
    guest time is in user already)."""
    try:
        first = (proc / "stat").read_text(encoding="ascii").splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[0] != "cpu" or len(first) < 5:
        return None
    values = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values) - idle) / _ticks()


def _stat_fields(proc: Path, pid: str) -> list[str] | None:
    """A process's ``/proc/<pid>/stat`` fields after its command (state, ppid, ...)."""
    try:
        text = (proc / pid / "stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    close = text.rfind(")")
    return text[close + 2 :].split() if close >= 0 else None


def _tree_s(proc: Path, root: int) -> float:
    """CPU seconds of ``root`` (``os.times``: its own and its waited-for children's) and of
    every live process below it (their own and their waited-for children's)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(proc, entry.name)
        if fields is None or len(fields) < 15:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        cpu[pid] = sum(int(v) for v in fields[11:15]) / _ticks()  # utime stime cutime cstime
    below: set[int] = set()
    frontier = [root]
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in below and child != root:
                below.add(child)
                frontier.append(child)
    own = os.times()
    mine = own.user + own.system + own.children_user + own.children_system
    return mine + sum(cpu[pid] for pid in below)


def host_cpu_sample(proc: Path = PROC) -> HostCpuSample | None:
    """Now's sample (the module's docstring); None where ``/proc`` cannot say."""
    busy = _host_busy_s(proc)
    if busy is None:
        return None
    return HostCpuSample(
        monotonic_s=time.monotonic(), host_busy_s=busy, tree_s=_tree_s(proc, os.getpid()),
        cpus=os.cpu_count() or 1,
    )  # fmt: skip


def others_share(before: HostCpuSample | None, after: HostCpuSample | None) -> float | None:
    """The share of the host's CPU (1.0: every core) that processes outside this tree took
    between the two samples; None without both or over no time."""
    if before is None or after is None:
        return None
    wall_s = after.monotonic_s - before.monotonic_s
    if wall_s <= 0:
        return None
    others_s = (after.host_busy_s - before.host_busy_s) - (after.tree_s - before.tree_s)
    return min(1.0, max(0.0, others_s / (wall_s * after.cpus)))

"""The stop rule of an OOM-edge probe's worst case on a live run: hold the load until vLLM's
KV cache has peaked (from the /metrics timeline the run's watcher appends to
``metrics.csv``), every answer finished, or a cap (or the tune's deadline) came first.

A stop rule like the others of ``tuner.serving.live_server`` (a ``StopFactory``); the
edge search (``tuner.search.edge``) sets it, the live server and the twin's virtual
server (``tuner.twin.virtual_server``) apply it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path

from tuner.serving.live_server import LevelPhase, RecordTail
from tuner.serving.prometheus_scrape import read_metrics_csv

# The KV cache has peaked once it reads full and stays so this long (wall seconds: the
# biggest batch's steps run, the GPU sampler sees them), or once it has fallen from its
# peak by DRAIN_SHARE of it (at least DRAIN_MIN_USAGE) as the first answers finish.
FULL_KV_USAGE = 0.99
FULL_HOLD_S = 2.0
DRAIN_SHARE = 0.1
DRAIN_MIN_USAGE = 0.02
HOLD_CHECK_EVERY_S = 0.5


class HoldEnd(StrEnum):
    """How a probe's worst-case load ended."""

    OUTPUTS_FINISHED = "outputs_finished"
    KV_PEAKED = "kv_peaked"
    CAP = "cap"  # edge_load_s passed before the KV cache peaked
    DEADLINE = "deadline"  # the time budget's deadline came before the KV cache peaked
    ENGINE_DIED = "engine_died"

    @property
    def startup_only(self) -> bool:
        """Cut short before the KV cache peaked: the probe measured a startup edge only."""
        return self in (HoldEnd.CAP, HoldEnd.DEADLINE)


def kv_peaked(readings: Sequence[tuple[float, float]]) -> bool:
    """Whether the KV cache has peaked, from (unix seconds, usage) readings: it read full
    and stayed so ``FULL_HOLD_S``, or it has fallen from its peak (see the constants)."""
    if not readings:
        return False
    peak_at, peak = max(readings, key=lambda r: (r[1], -r[0]))
    if peak <= 0.0:
        return False
    if peak >= FULL_KV_USAGE:
        return readings[-1][0] - peak_at >= FULL_HOLD_S
    return readings[-1][1] <= peak - max(DRAIN_MIN_USAGE, DRAIN_SHARE * peak)


class WorstCaseHold:
    """The stop rule of a probe's worst case (a ``StopFactory``): stops the run once the KV
    cache has peaked (from the /metrics timeline the run's watcher appends to
    ``metrics.csv``), or at ``until_s`` (monotonic: the cap, or the deadline when sooner);
    counts the requests that failed before it stopped. A run that ends by itself ended
    with every output finished."""

    reason = "hold"

    def __init__(self, *, cap_s: float, deadline_s: float | None) -> None:
        self.cap_s = cap_s  # wall seconds from the bind, the load generator's lead included
        self.deadline_s = deadline_s
        self.bound: BoundHold | None = None

    def bind(
        self, out_dir: Path, *, since_unix_s: float | None = None, phase: LevelPhase | None = None
    ) -> BoundHold:
        cap_at = time.monotonic() + self.cap_s
        if self.deadline_s is not None and self.deadline_s < cap_at:
            until, end = self.deadline_s, HoldEnd.DEADLINE
        else:
            until, end = cap_at, HoldEnd.CAP
        self.bound = BoundHold(out_dir, until_s=until, cut=end)
        return self.bound


class BoundHold:
    reason = "hold"

    def __init__(self, out_dir: Path, *, until_s: float, cut: HoldEnd) -> None:
        self.out_dir = out_dir
        self.until_s = until_s
        self.cut = cut
        self.tail = RecordTail(out_dir)
        self.ended: HoldEnd | None = None
        self.errors = 0
        self.peak_usage: float | None = None
        self._last_check = 0.0

    def __call__(self) -> bool:
        now = time.monotonic()
        if self.ended is not None:
            return True
        if now >= self.until_s:
            self._count()
            self.ended = self.cut
            return True
        if now - self._last_check < HOLD_CHECK_EVERY_S:
            return False
        self._last_check = now
        try:
            samples = read_metrics_csv(self.out_dir / "metrics.csv")
        except (OSError, ValueError, KeyError, TypeError):
            return False  # not written yet, or a row being written
        readings = [(s.unix_s, s.kv_cache_usage) for s in samples]
        if readings:
            self.peak_usage = max(u for _, u in readings)
        if kv_peaked(readings):
            self._count()
            self.ended = HoldEnd.KV_PEAKED
            return True
        return False

    def _count(self) -> None:
        """The requests that failed before the stop (those it cuts off are not counted)."""
        self.errors += sum(1 for r in self.tail.read() if not r.ok)

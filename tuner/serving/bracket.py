"""The rate bracket: which rates held, which broke, and the next rate to try.

One rule for every search of a sustained rate, live (``tuner.search.rate_search``,
with steps its evidence allows) or on the twin (``tuner.twin.prediction``, fixed
steps): up from the best rate that held while none above it broke, down from the
lowest that broke while none held, then the geometric middle of the bracket until
its ends are within ``precision`` of each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

FLOOR_PER_S = 1e-3  # the lowest rate a search tries, by default
# A search still one-sided after its second run squares its move each run, up to this
# factor: a start 10x off the capacity is bracketed in a few runs, not dozens.
MAX_MOVE = 4.0

# A bracket's ends within ``precision`` (relative) of each other, up to rounding.
_CLOSE = 1.0001


@dataclass
class RateBracket:
    """The rates tried so far, each held or broken (per second)."""

    precision: float
    tried: list[tuple[float, bool]] = field(default_factory=list)

    def record(self, rate_per_s: float, held: bool) -> None:
        self.tried.append((rate_per_s, held))

    @property
    def low(self) -> float | None:
        """The best rate that held."""
        return max((r for r, held in self.tried if held), default=None)

    @property
    def high(self) -> float | None:
        """The lowest rate above ``low`` that broke (with none held, the lowest broken)."""
        low = self.low
        broke = (r for r, held in self.tried if not held and (low is None or r > low))
        return min(broke, default=None)

    @property
    def closed(self) -> bool:
        low, high = self.low, self.high
        return low is not None and high is not None and high / low <= 1.0 + self.precision * _CLOSE

    def next_rate(self, *, up: float, down: float) -> float | None:
        """The next rate: ``low * up`` while nothing above it broke, ``high / down`` while
        nothing held, the bracket's geometric middle while it is open; None once closed."""
        low, high = self.low, self.high
        if high is None:
            assert low is not None, "no rate tried yet"
            return low * up
        if low is None:
            return high / down
        if self.closed:
            return None
        return math.sqrt(low * high)


def search(
    held: Callable[[float], bool],
    rate_per_s: float,
    *,
    precision: float,
    max_runs: int,
    step: float,
    floor_per_s: float = FLOOR_PER_S,
    first_step: float | None = None,
) -> float:
    """The highest rate ``held`` says holds, bracketed from ``rate_per_s`` by ``step`` up
    or down and bisected to ``precision``; 0 when none held (or the descent passed
    ``floor_per_s``). At most ``max_runs`` calls; the best held so far when they run out.

    ``first_step``: the first move from ``rate_per_s`` (default ``step``). Where the start
    is a good estimate, ``1 + precision`` closes the bracket on the first two calls when
    the rate is within it; the second move takes ``step``, and each later one while the
    bracket is still one-sided the square of the one before, up to ``MAX_MOVE``."""
    bracket = RateBracket(precision)
    rate: float | None = rate_per_s
    move = first_step or step
    gallop = step  # the next one-sided move after the first
    for run in range(max_runs):
        if rate is None or rate < floor_per_s:
            break
        bracket.record(rate, held(rate))
        if run > 0:
            move = gallop
            gallop = min(gallop * gallop, max(step, MAX_MOVE))
        rate = bracket.next_rate(up=move, down=move)
    return bracket.low or 0.0

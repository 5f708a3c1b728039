"""Think times of sessions: the seconds from an answer to the next turn.

``SessionSpec.think_time_s`` is a constant (a user reading an answer for about as long
each time) or a distribution drawn once per turn (``lognormal``, ``uniform``: an
agent's next round waits for its tool to run, short for most calls, long for a few).
``sample_think_s`` draws them, deterministic for a generator; ``mean_think_s`` is
what the plan spaces an average turn by; ``longest_think_s`` bounds how long a session
can last (the look-back of the sessions under way when a schedule opens).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from workloads.spec import LognormalThinkTime, SessionSpec, UniformThinkTime

FloatArray = npt.NDArray[np.float64]
_TAIL_Z = 6.0  # an unclipped lognormal is taken to end here (P(beyond) ~ 1e-9)


def sample_think_s(sessions: SessionSpec, n: int, rng: np.random.Generator) -> FloatArray:
    """``n`` think times in seconds; a constant draws nothing from ``rng``."""
    think = sessions.think_time_s
    if isinstance(think, LognormalThinkTime):
        raw = rng.lognormal(math.log(think.median_s), think.sigma, size=n)
        high = think.high_s if think.high_s is not None else math.inf
        return np.clip(raw, think.low_s, high).astype(np.float64)
    if isinstance(think, UniformThinkTime):
        return rng.uniform(think.low_s, think.high_s, size=n).astype(np.float64)
    return np.full(n, float(think), dtype=np.float64)


def mean_think_s(sessions: SessionSpec) -> float:
    """The expected think time (a lognormal's clipped mean, exact)."""
    think = sessions.think_time_s
    if isinstance(think, LognormalThinkTime):
        return _clipped_lognormal_mean(think)
    if isinstance(think, UniformThinkTime):
        return (think.low_s + think.high_s) / 2.0
    return float(think)


def longest_think_s(sessions: SessionSpec) -> float:
    """The longest think time a draw gives (an unclipped lognormal: its 1 - 1e-9 quantile)."""
    think = sessions.think_time_s
    if isinstance(think, LognormalThinkTime):
        if think.high_s is not None:
            return think.high_s
        return max(think.low_s, think.median_s * math.exp(_TAIL_Z * think.sigma))
    if isinstance(think, UniformThinkTime):
        return think.high_s
    return float(think)


def _normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def _clipped_lognormal_mean(think: LognormalThinkTime) -> float:
    """E[clip(X, low, high)] for X = exp(Normal(ln median, sigma))."""
    mu, sigma = math.log(think.median_s), think.sigma
    low, high = think.low_s, think.high_s if think.high_s is not None else math.inf
    if sigma == 0:
        return min(max(think.median_s, low), high)
    mean_x = math.exp(mu + sigma * sigma / 2.0)

    def above(x: float) -> float:  # E[X; X >= x]
        if x <= 0:
            return mean_x
        if math.isinf(x):
            return 0.0
        return mean_x * _normal_cdf((mu + sigma * sigma - math.log(x)) / sigma)

    def p_below(x: float) -> float:
        if x <= 0:
            return 0.0
        if math.isinf(x):
            return 1.0
        return _normal_cdf((math.log(x) - mu) / sigma)

    middle = above(low) - above(high)
    tail_high = 0.0 if math.isinf(high) else high * (1.0 - p_below(high))
    return low * p_below(low) + middle + tail_high

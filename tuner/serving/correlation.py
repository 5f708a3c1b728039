"""How long a server's state remembers itself: the correlation time of a sampled signal.

A window's percentiles are as good as the number of independent stretches of the
server's state it holds, not the number of its requests: near capacity the running
batch swings through excursions tens of seconds long (a cluster of long prefills
stalls decoding, answers slow, more requests are under way at once, which slows them
further), and every request inside one excursion sees the same slow steps. A window a
few request lifetimes long then holds one excursion, or none, and its p99 says which.

``correlation_time_s`` is the integrated autocorrelation time of a signal sampled
against time, in the convention of a continuous process, ``integral_0^inf rho(t) dt``
(an exponential autocorrelation ``exp(-t / T)`` gives ``T``; white noise sampled every
``dt`` gives ``dt / 2``). The variance of the signal's mean over a window ``W`` long is
then about ``2 * T * var / W``: a window of ``n * T`` holds ``n / 2`` independent
stretches. The sum over lags is Geyer's initial positive sequence: pairs of adjacent
lags, ``rho(2k) + rho(2k + 1)``, summed up to the first that is not positive. A sum cut
at a window of its own estimate (Sokal's) reads a stretch shorter than the correlation
time as quick to forget (its negative lags cancel the positive ones); the positive
sequence reads it as remembering about its whole length, which is what it shows.

Irregular sampling (a scrape that took longer) is resampled onto an even grid at the
median interval, holding the last value. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MIN_POINTS = 16


def correlation_time_s(points: Sequence[tuple[float, float]]) -> float | None:
    """The integrated autocorrelation time (seconds) of ``(t_s, value)`` points in time
    order; None with fewer than ``MIN_POINTS`` points or no spread in time. A constant
    signal has none to speak of: 0."""
    if len(points) < MIN_POINTS:
        return None
    t = np.asarray([p[0] for p in points], dtype=float)
    v = np.asarray([p[1] for p in points], dtype=float)
    steps = np.diff(t)
    steps = steps[steps > 0]
    if steps.size == 0:
        return None
    dt = float(np.median(steps))
    grid = np.arange(t[0], t[-1] + dt / 2, dt)
    index = np.clip(np.searchsorted(t, grid, side="right") - 1, 0, len(v) - 1)
    x = v[index] - v[index].mean()
    n = x.size
    variance = float(np.dot(x, x))
    if n < MIN_POINTS or variance <= 0.0:
        return 0.0
    spectrum = np.fft.rfft(x, 2 * n)
    acf = np.fft.irfft(spectrum * np.conj(spectrum))[:n] / variance
    pairs = acf[: n - n % 2].reshape(-1, 2).sum(axis=1)  # rho(2k) + rho(2k + 1)
    positive = np.flatnonzero(pairs <= 0.0)
    kept = pairs[: positive[0]] if positive.size else pairs
    return max(0.5, float(kept.sum()) - 0.5) * dt

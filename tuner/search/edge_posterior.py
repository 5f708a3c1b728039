"""Where the capacity of a setting lies over the draws of its workload, and how far it
moves between them, from the levels each draw measured (issue 34).

Each draw ``d`` of the workload (``LevelRecord.draw``: its arrivals, its conversations'
lengths) has an edge ``e_d``, the log of the rate up to which it holds the SLO; the edges
of a setting's draws are taken as normal, ``e_d ~ N(mu, tau^2)``. A draw's levels say
where its edge lies: a level at rate ``x`` that held says ``e_d > x``, one that broke says
``e_d < x``, each as surely as its P(hold) (``LevelRecord.hold_probability``, kept within
``CLIP`` of 0 and 1: a window's verdict near its edge is itself a coin toss now and then,
and a draw that held a rate above one it broke is read, not discarded). ``mu`` is flat;
``log tau`` has the prior ``N(log TAU_PRIOR, TAU_PRIOR_SD^2)``.

**Why a prior on tau.** A trial measures two to four draws; their edges are censored by the
search's ~5% rate steps, and 176 of 183 levels of the repeatability runs had a P(hold) of
0 or 1. So a trial's own draws say little of ``tau``: two that agree within a bracket are
as likely from a ``tau`` of 1% as of 5%. The prior is centred on the spreads measured
over twenty draws each of three settings of the default chat workload on the twin
(vLLM's defaults 3.5%, the twin's pick 2.9%, 64 sequences 6.1%:
``benchmarks/repeatability.md``), above their geometric mean (4.0%): on simulated
trials (``benchmarks/interval_calibration.py``) a prior at the mean leaves the intervals
of a setting whose edge moves by 6% holding 85% of the other trials' estimates at best,
and one at 5% holds 87 to 94% for spreads of 3 to 6%, 5.8 to 7.6% wide each side with
four draws. A trial's draws move it (a setting whose draws broke rates another held far
below is read as one whose edge moves more).

**The interval** holds, with the confidence, where another trial of the same settings
with as many draws places its estimate (the mean of its draws' edges): over the
posterior, ``mu`` (this trial's uncertainty about it) plus ``tau / sqrt(n)`` (the other
trial's). It is the capacity interval of a trial measured with several draws
(``tuner.search.capacity_interval``); the goodput is still the highest rate held over
the draws (``tuner.search.rate_search.pooled_verdicts``), which lies near the lowest
draw's edge.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

from tuner.run.evaluation import LevelRecord

TAU_PRIOR = 0.05  # log rate: the draw-to-draw spread of chat's edges on the twin
TAU_PRIOR_SD = 0.5  # log tau: 3.0 to 8.2% within one standard deviation
CLIP = 0.001  # a level's P(hold) read as at least 0.1% unsure
_TAUS = np.exp(np.linspace(math.log(0.002), math.log(0.5), 90))
_MU_STEP = 0.002  # the grid of mu, log rate
_MU_MARGIN = 0.3  # the grid reaches this far (log rate) past the rates measured


@dataclass(frozen=True)
class EdgePosterior:
    """Where another trial with as many draws places its estimate of the edge: its
    quantiles as rates (``quantile_per_s``)."""

    _log_cdf_grid: tuple[tuple[float, float], ...]

    def quantile_per_s(self, q: float) -> float:
        """The rate below which another trial's estimate lies with probability ``q``."""
        grid = self._log_cdf_grid
        for (x0, c0), (x1, c1) in itertools.pairwise(grid):
            if c1 >= q:
                fraction = (q - c0) / (c1 - c0) if c1 > c0 else 0.0
                return math.exp(x0 + fraction * (x1 - x0))
        return math.exp(grid[-1][0])


def edge_posterior(levels: Sequence[LevelRecord]) -> EdgePosterior | None:
    """The posterior of ``levels`` measured with two draws or more (the module's
    docstring); None with fewer, or where no draw held a rate or none broke one (the edge
    is then not bounded on that side: the caller's one-draw reading says so)."""
    by_draw: dict[int, list[tuple[float, float]]] = {}
    for level in levels:
        if level.rate_per_s > 0 and not level.unmeasurable:
            p = min(1.0 - CLIP, max(CLIP, level.hold_probability))
            by_draw.setdefault(level.draw, []).append((math.log(level.rate_per_s), p))
    if len(by_draw) < 2:
        return None
    points = [point for draw in by_draw.values() for point in draw]
    if not any(p > 0.5 for _, p in points) or not any(p < 0.5 for _, p in points):
        return None
    xs = [x for x, _ in points]
    mus = np.arange(min(xs) - _MU_MARGIN, max(xs) + _MU_MARGIN + _MU_STEP, _MU_STEP)
    log_post = np.zeros((len(mus), len(_TAUS)))
    for draw in by_draw.values():
        log_post += np.log(np.maximum(_draw_likelihood(draw, mus), 1e-300))
    log_post += -0.5 * ((np.log(_TAUS) - math.log(TAU_PRIOR)) / TAU_PRIOR_SD) ** 2
    post = np.exp(log_post - log_post.max())
    post /= post.sum()
    n = len(by_draw)
    # another trial's estimate: for each tau, mu's conditional mean and variance plus its
    # own draws' tau^2 / n; a mixture over tau of those normals
    weight = post.sum(axis=0)
    keep = weight > 1e-12
    weight, taus, post = weight[keep], _TAUS[keep], post[:, keep]
    mean = (post * mus[:, None]).sum(axis=0) / weight
    var = (post * (mus[:, None] - mean) ** 2).sum(axis=0) / weight
    sd = np.sqrt(var + taus**2 / n)
    mu = float((weight * mean).sum())
    spread = float(np.sqrt((weight * (sd**2 + (mean - mu) ** 2)).sum()))  # the mixture's
    grid = np.linspace(mu - 6 * spread, mu + 6 * spread, 1201)
    cdf = (weight[None, :] * ndtr((grid[:, None] - mean[None, :]) / sd[None, :])).sum(axis=1)
    return EdgePosterior(tuple(zip(grid.tolist(), cdf.tolist(), strict=True)))


def _draw_likelihood(draw: list[tuple[float, float]], mus: np.ndarray) -> np.ndarray:
    """P(this draw's levels | mu, tau) over the grid (mus x taus): the edge in each segment
    between its measured rates, times the levels' P(hold) below it and P(break) above."""
    draw = sorted(draw)
    cuts = [-math.inf, *(x for x, _ in draw), math.inf]
    total = np.zeros((len(mus), len(_TAUS)))
    for j in range(len(draw) + 1):  # the edge above the first j rates, below the rest
        outcome = math.prod(p for _, p in draw[:j]) * math.prod(1.0 - p for _, p in draw[j:])
        lower = ndtr((cuts[j] - mus[:, None]) / _TAUS[None, :])
        upper = ndtr((cuts[j + 1] - mus[:, None]) / _TAUS[None, :])
        total += outcome * (upper - lower)
    return total

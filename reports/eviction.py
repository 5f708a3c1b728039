"""Eviction evidence in the report: ``--kv-cache-metrics``' histograms per level, and for
the recommendation and vLLM's defaults the share of later turns' prefix misses that were
evictions of a conversation still under way, measured beside the twin's.

The share's denominator is the prompt tokens that later turns of a conversation missed
in the prefix cache; its numerator, those that were the conversation's own history,
cached by an earlier turn and evicted before this one came (``tuner.sim.lost_history``).
Only the simulated engine knows it: vLLM's histograms count sampled blocks as they are
evicted without the conversation that held them, so on real vLLM the report says it is
not measurable and shows the idle-before-eviction histogram as the closest evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.run.evaluation import LevelRecord
from tuner.run.recommendation import ConfirmationResult
from tuner.serving.eviction_scrape import EvictionEvidence, ResidencyHistogram

NOT_MEASURABLE = "not measurable on vLLM"
SHARE_LABEL = "Later turns' prefix misses: own history evicted while under way"
SHARE_NOTE = (
    "Later turns' prefix misses: of the prompt tokens that later turns of a conversation "
    "missed in the prefix cache, the share that was the conversation's own history, "
    "cached by an earlier turn and evicted before this one came (long conversations losing "
    "their KV to other requests). The simulated engine counts it; vLLM cannot (its "
    "--kv-cache-metrics histograms do not say which conversation an evicted block held). "
    "The twin's share is on the same schedule, warm-up included."
)
_NAMES = (
    ("idle before eviction", "idle_before_evict"),
    ("lifetime", "lifetime"),
    ("reuse gap", "reuse_gap"),
)


@dataclass(frozen=True)
class EvictionLines:
    """A level's eviction evidence as one line, its tone and its details."""

    text: str
    tone: str  # "good", "bad", "missing" or ""
    details: list[str]


def _pct(share: float | None) -> str:
    return "–" if share is None else f"{share:.0%}"


def _seconds(value: float) -> str:
    return f"{value:g} s"


def histogram_line(label: str, h: ResidencyHistogram) -> str:
    """One histogram as a compact table in a line: count, median and p90 (bucket bounds),
    and the non-empty buckets."""
    if not h.count:
        return f"{label} ({h.metric}): no sampled eviction in the window"
    median, p90 = h.quantile_s(0.5), h.quantile_s(0.9)
    cells = []
    for bound, n in zip((*h.bounds_s, None), h.bucket_counts, strict=True):
        if n:
            cells.append(f"{'≤ ' + _seconds(bound) if bound is not None else '> 1800 s'}: {n}")
    return (
        f"{label} ({h.metric}): {h.count} sampled, median ≤ {_seconds(median or 0)}, "
        f"p90 ≤ {_seconds(p90 or 0)}; " + " · ".join(cells)
    )


def level_lines(level: LevelRecord, *, simulated: bool) -> EvictionLines | None:
    """A level's eviction evidence (None: the level has none to show, e.g. a run
    written before it was read)."""
    ev: EvictionEvidence | None = level.eviction
    if ev is None:
        return None
    details = [
        histogram_line(label, h) for label, attr in _NAMES if (h := getattr(ev, attr)) is not None
    ]
    lost = ev.lost_history
    if lost is not None:
        share = lost.evicted_under_way_share
        text = (
            f"{lost.history_evicted_requests} of {lost.continuing_requests} later turns lost "
            f"history to eviction; {_pct(share)} of their missed prompt tokens were their own "
            "history evicted while the conversation was under way"
        )
        tone = "bad" if share is not None and share >= 0.5 else ""
    elif simulated:
        text, tone = "no later turn in this window", ""
    else:
        text, tone = f"conversation evictions {NOT_MEASURABLE}", ""
    if not details:
        details.append("no --kv-cache-metrics histograms (the server did not export them)")
    return EvictionLines(text=text, tone=tone, details=details)


def share_cell(m: ConfirmationResult | None, *, simulated: bool) -> str:
    """The measured share beside the twin's, for the recommendation or the defaults."""
    if m is None:
        return "–"
    ev = m.eviction
    if ev is not None and ev.lost_history is not None:
        measured = _pct(ev.evicted_under_way_share)
    elif simulated:
        measured = "–"
    else:
        measured = NOT_MEASURABLE
    return f"{measured} (twin {_pct(m.twin_evicted_under_way_share)})"


def idle_cell(m: ConfirmationResult | None) -> str:
    """Median idle time before eviction at the decided level (vLLM's histogram)."""
    h = m.eviction.idle_before_evict if m is not None and m.eviction is not None else None
    if h is None:
        return "–"
    median = h.quantile_s(0.5)
    return f"≤ {_seconds(median)} ({h.count} sampled)" if median is not None else "no eviction"

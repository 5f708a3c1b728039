"""What a level's measured requests were, against the workload's stationary ones.

A level is a steady-state measurement only if the requests it measured are the ones the
workload sends once it has run for hours: the same turn mix (``workloads.stationary``)
and the same prompt lengths (a multi-turn window that opens on an empty server sends
first turns only, whose prompts carry no history). Beside its schedule, records and
/metrics, each level's directory keeps:

* ``turn_mix.json`` (``workloads.stationary.TurnMix``), with sessions: the measured
  requests' share per turn number against the stationary mix, chi-square test;
* ``prompt_lengths.json`` (``tuner.run.prompt_lengths.PromptLengthMix``): the prompt tokens of the measured
  requests against a long stationary schedule of the same workload, their
  quantiles and a two-sample Kolmogorov-Smirnov test.

**The reference.** ``workloads.build.build_schedule`` of the level's own spec with
another seed, no warm-up, ``sessions.start: stationary`` when it has sessions, ramp and
diurnal arrivals made constant (stationary), ``REFERENCE_S`` long at the rate that
sends ``REFERENCE_REQUESTS`` in it: the same reference for every level of a workload,
whatever its rate, built once per process.

**The test.** The KS statistic D is the largest gap between the two empirical CDFs;
its p-value is the asymptotic Kolmogorov distribution at
``(sqrt(ne) + 0.12 + 0.11 / sqrt(ne)) * D`` with ``ne = n m / (n + m)`` (closed form, no
scipy). Prompt lengths are integers: ties make the test conservative. The turns of one
conversation are not independent (each carries the history of the one before), so a
window that holds several turns of each conversation has fewer independent samples
than requests; the measured side counts as its number of conversations
(``effective_requests``, the requests where there are no sessions): a conservative
count, so that a long stationary window is not rejected for its correlated turns.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tuner.run.layout import PROMPT_LENGTHS_FILE
from tuner.run.prompt_lengths import PromptLengthMix, PromptQuantiles
from workloads.build import build_schedule
from workloads.prompts import PromptBuilder, WordPromptBuilder
from workloads.schedule import ScheduledRequest
from workloads.spec import (
    ClosedArrival,
    DiurnalArrival,
    PoissonArrival,
    RampArrival,
    SessionStart,
    WarmupSpec,
    WorkloadError,
    WorkloadSpec,
)
from workloads.stationary import TURN_MIX_FILE, stationary_turn_mix, turn_mix, write_turn_mix
from workloads.traces import TraceError

__all__ = [
    "TURN_MIX_FILE",
    "ks_sf",
    "ks_two_sample",
    "prompt_lengths",
    "reference_spec",
    "write_level_evidence",
]

log = logging.getLogger(__name__)

REFERENCE_S = 300.0  # the reference lasts this long (emulated seconds) ...
REFERENCE_REQUESTS = 4000  # ... and holds about this many requests (~1 s to build for chat)
REFERENCE_SEED_OFFSET = 7919  # the reference's seed: the level's plus this


def ks_sf(x: float) -> float:
    """P(K > x) for K Kolmogorov-distributed: ``2 sum (-1)^(k-1) exp(-2 k^2 x^2)``."""
    if x < 0.2:  # the series converges slowly here; the tail is 1 to 15 digits
        return 1.0
    total = 0.0
    for k in range(1, 101):
        term = 2.0 * (-1) ** (k - 1) * math.exp(-2.0 * k * k * x * x)
        total += term
        if abs(term) < 1e-12:
            break
    return min(1.0, max(0.0, total))


def ks_two_sample(
    a: Sequence[float] | np.ndarray[Any, Any],
    b: Sequence[float] | np.ndarray[Any, Any],
    *,
    effective_a: int | None = None,
) -> tuple[float, float]:
    """The two-sample KS statistic of ``a`` against ``b`` and its asymptotic p-value;
    ``effective_a``: the independent samples ``a`` holds, when fewer than its size."""
    xa = np.sort(np.asarray(a, dtype=float))
    xb = np.sort(np.asarray(b, dtype=float))
    if xa.size == 0 or xb.size == 0:
        raise ValueError("the KS test needs two non-empty samples")
    grid = np.concatenate([xa, xb])
    cdf_a = np.searchsorted(xa, grid, side="right") / xa.size
    cdf_b = np.searchsorted(xb, grid, side="right") / xb.size
    statistic = float(np.max(np.abs(cdf_a - cdf_b)))
    n = min(xa.size, effective_a) if effective_a else xa.size
    ne = n * xb.size / (n + xb.size)
    root = math.sqrt(ne)
    return statistic, ks_sf((root + 0.12 + 0.11 / root) * statistic)


def _requests_per_arrival(spec: WorkloadSpec) -> float:
    """Requests per arrival: the mean number of turns with sessions (1/share of first turns)."""
    if spec.sessions is None:
        return 1.0
    return 1.0 / stationary_turn_mix(spec.sessions.turns)[0]


def reference_spec(spec: WorkloadSpec) -> WorkloadSpec:
    """The long stationary schedule's spec a level's prompt lengths are compared with.

    The same for every level of a workload, whatever the level's rate, window and planned
    answer times: the prompt lengths of a stationary schedule depend on none of them. So
    one reference serves all the levels of a tune (`_reference_lengths` keeps it), where
    building it for each level cost a second or more with a model's tokenizer."""
    per_arrival = _requests_per_arrival(spec)
    update: dict[str, Any] = {
        "warmup": WarmupSpec(),
        "seed": spec.seed + REFERENCE_SEED_OFFSET,
    }
    arrival = spec.arrival
    if isinstance(arrival, ClosedArrival):
        update["arrival"] = arrival.model_copy(
            update={"requests": max(1, round(REFERENCE_REQUESTS / per_arrival))}
        )
    else:
        rate = REFERENCE_REQUESTS / (REFERENCE_S * per_arrival)
        if isinstance(arrival, RampArrival | DiurnalArrival):
            update["arrival"] = PoissonArrival(kind="poisson", rate_per_s=rate)
        else:
            update["arrival"] = spec.with_rate(rate).arrival
        update["duration_s"] = REFERENCE_S
    if spec.sessions is not None:
        planned = type(spec.sessions).model_fields
        update["sessions"] = spec.sessions.model_copy(
            update={
                "start": SessionStart.STATIONARY,
                # when the later turns go, not what they hold
                "expected_ttft_s": planned["expected_ttft_s"].default,
                "expected_tpot_s": planned["expected_tpot_s"].default,
            }
        )
    return spec.model_copy(update=update)


# The references built so far: (the spec's JSON, the builder's identity or None for words)
# -> (the builder, kept alive so that its identity is not reused; the prompt lengths).
_REFERENCES: dict[tuple[str, int | None], tuple[PromptBuilder | None, list[int]]] = {}
_REFERENCES_KEPT = 8


def _reference_lengths(ref: WorkloadSpec, builder: PromptBuilder | None) -> list[int]:
    """The prompt tokens of ``ref``'s schedule under ``builder``, built once per process."""
    words = builder is None or type(builder) is WordPromptBuilder  # stateless: all alike
    key = (ref.model_dump_json(), None if words else id(builder))
    kept = _REFERENCES.get(key)
    if kept is not None and (words or kept[0] is builder):
        return kept[1]
    lengths = [r.prompt_tokens for r in build_schedule(ref, prompt_builder=builder)]
    if len(_REFERENCES) >= _REFERENCES_KEPT:
        _REFERENCES.pop(next(iter(_REFERENCES)))  # the oldest
    _REFERENCES[key] = (builder, lengths)
    return lengths


def prompt_lengths(
    measured: Sequence[ScheduledRequest],
    spec: WorkloadSpec,
    *,
    prompt_builder: PromptBuilder | None = None,
) -> PromptLengthMix:
    """The prompt-token distribution of ``measured`` (warm-up left out) against ``spec``'s
    stationary one. ``prompt_builder``: the one the level's schedule was built with
    (words by default), so that both count tokens alike.

    Raises ``WorkloadError`` or ``TraceError`` when the reference cannot be built (what
    building the level's own schedule would have raised)."""
    ref = reference_spec(spec)
    reference = _reference_lengths(ref, prompt_builder)
    if not reference:
        raise WorkloadError(f"workload {spec.name!r}: its stationary schedule holds no request")
    window = [r for r in measured if not r.warmup]
    values = [r.prompt_tokens for r in window]
    if spec.sessions is not None:
        effective = len({r.session_id or r.request_id for r in window})
    else:
        effective = len(values)
    statistic: float | None = None
    p_value: float | None = None
    if values:
        statistic, p_value = ks_two_sample(values, reference, effective_a=effective)
    return PromptLengthMix(
        requests=len(values),
        effective_requests=effective,
        measured=PromptQuantiles.of(values) if values else None,
        stationary=PromptQuantiles.of(reference),
        reference_requests=len(reference),
        reference_duration_s=ref.duration_s,
        reference_seed=ref.seed,
        ks_statistic=statistic,
        p_value=p_value,
    )


def write_prompt_lengths(path: Path, mix: PromptLengthMix) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(mix.model_dump_json(indent=2) + "\n", encoding="utf-8")


def write_level_evidence(
    level_dir: Path,
    measured: Sequence[ScheduledRequest],
    spec: WorkloadSpec,
    *,
    prompt_builder: PromptBuilder | None = None,
) -> None:
    """Write ``prompt_lengths.json`` and, with sessions, ``turn_mix.json`` into
    ``level_dir`` for the level's measured requests under its spec (the level's own:
    its rate, window and ``sessions.start``). A reference that cannot be built is
    logged and its file left out: the level's measurement stands without it."""
    if spec.sessions is not None:
        write_turn_mix(level_dir / TURN_MIX_FILE, turn_mix(measured, spec.sessions))
    try:
        mix = prompt_lengths(measured, spec, prompt_builder=prompt_builder)
    except (WorkloadError, TraceError) as exc:
        log.warning("%s: prompt lengths not compared with the stationary ones: %s", level_dir, exc)
        return
    write_prompt_lengths(level_dir / PROMPT_LENGTHS_FILE, mix)

"""Where a measured window lies in a trace replay.

A replayed trace's steady state is the trace itself, looped: its bursts and quiet
stretches come round once a pass (``workloads.arrivals.trace_arrivals``: n requests in n /
rate seconds). A window that holds a whole pass measures all of it; a shorter one
measures the part it happens to fall on, so where it falls decides the verdict. A
window shorter than a pass is therefore placed on the pass's **busiest stretch** of its
length (``busiest_start_share``): the stretch that decides whether the trace's SLOs
hold, as a rolling SLO window judges a service by its worst stretch. Every measurement
of a replay places its window by this one rule (a live level, the twin's long
reference run, the time-scale probe), so they measure the same requests.
"""

from __future__ import annotations

from workloads.arrivals import busiest_start_share, trace_pass_s
from workloads.spec import TraceArrival, WorkloadSpec, read_trace_ref


def pass_s(spec: WorkloadSpec) -> float | None:
    """One pass of the spec's trace replay at its rate (None: not a trace replay)."""
    arrival = spec.arrival
    if not isinstance(arrival, TraceArrival):
        return None
    return trace_pass_s(read_trace_ref(arrival.path), arrival.rate_per_s)


def window_in_pass_s(spec: WorkloadSpec, longest_s: float) -> float | None:
    """A trace replay's window: one whole pass, at most ``longest_s`` (then on its
    busiest stretch); None for any other arrival process."""
    one = pass_s(spec)
    return None if one is None else min(one, longest_s)


def on_busiest_stretch(spec: WorkloadSpec, opens_at_s: float, window_s: float) -> WorkloadSpec:
    """The spec with its trace replay started so that ``[opens_at_s, opens_at_s +
    window_s)`` falls on the busiest stretch of that length (what comes before it is the
    trace's own run-up); unchanged for any other arrival process, or a window that holds
    a whole pass (every stretch of a pass is in it)."""
    arrival = spec.arrival
    one = pass_s(spec)
    if not isinstance(arrival, TraceArrival) or one is None or window_s >= one:
        return spec
    share = busiest_start_share(
        read_trace_ref(arrival.path), rate_per_s=arrival.rate_per_s, length_s=window_s,
        lead_s=opens_at_s,
    )  # fmt: skip
    return spec.model_copy(update={"arrival": arrival.model_copy(update={"start_share": share})})

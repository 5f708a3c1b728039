"""Errors of load generation, and the error texts a request record can carry.

    ValueError
     └── LoadConfigError        bad input to run_load (schedule, processes, cap), before anything starts
    RuntimeError
     └── LoadGeneratorError     the Locust subprocess failed: it produced no measurements

`workloads` knows nothing of `tuner`: the tuner wraps these into its own `TunerError`
where it calls the runner.

A record whose request was never sent has ``status == 0`` and an ``error`` beginning
with ``NOT_SENT``; metrics leave such records out of the send lag and count them as
errors (the server never saw them).
"""

from __future__ import annotations

NOT_SENT = "not sent: "
CAP_REACHED = NOT_SENT + "in-flight cap reached"
STOPPED_BEFORE_SEND = NOT_SENT + "load generator stopped before its send time"
ABORTED = "aborted: load generator stopped while the request was in flight"
TIMED_OUT = "timeout: not finished {timeout_s:g} s after its scheduled time"


def was_sent(error: str | None) -> bool:
    """Whether a record's request reached the wire (its error, if any, came later)."""
    return error is None or not error.startswith(NOT_SENT)


class LoadConfigError(ValueError):
    """The load run cannot start as asked; the message names the bad value and what is accepted."""


class LoadGeneratorError(RuntimeError):
    """The Locust subprocess failed before measuring anything; the message ends with its log tail."""

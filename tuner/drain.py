"""The drain of a vLLM replica that is going away: its preStop program and its timing.

A pod that Kubernetes deletes is taken out of its Service's endpoints and sent the
preStop hook at about the same time; SIGTERM follows when the hook returns. A fixed
``sleep`` there either cuts off long requests or holds every rollout up for nothing.
This hook waits for what is really in flight:

    drain_script()              the hook: a standalone, stdlib-only Python 3 program
    drain_timing(p99_e2e_ms)    its bound from the workload's measured p99 E2E latency,
                                and the pod's terminationGracePeriodSeconds around it

The program (run as ``python3 drain.py [--url URL] [--bound-s S] [--settle-s S]
[--poll-s S] [--log PATH]``, or ``python3 -c SOURCE ARGS...``) waits ``--settle-s``
for the endpoints controller to drop the pod (no new requests after that), then polls
``/metrics`` until vLLM's ``vllm:num_requests_running`` and ``vllm:num_requests_waiting``
(gauges labelled ``model_name`` and ``engine``, summed over their label sets: vLLM's
``vllm/v1/metrics/loggers.py``, and ``tuner/sim/prometheus.py`` for the simulator) are
both 0 on two polls in a row, or ``--bound-s`` seconds after it started. It says what
it waited for in the pod's log (``/proc/1/fd/1``: a hook's own output is not in
``kubectl logs``) and exits 0 either way.

What it cannot see: a request still being read or tokenized by the API server (the
two polls in a row cover that), and clients that hold a keep-alive connection to the
pod across the endpoint change (kube-proxy balances connections, not requests).
vLLM's gauges are refreshed by engine steps, so after every request in flight was
aborted at once they can stay stale (vllm-project/vllm#22545): the bound ends that.

    timing = drain_timing(p99_e2e_ms=12_300)   # settle 5 s, bound 35 s, shutdown 30 s
    timing.script_args()                       # ("--settle-s", "5", "--bound-s", "35")
    timing.grace_period_s                      # 70: terminationGracePeriodSeconds
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, NonNegativeInt, PositiveInt, model_validator

from tuner.errors import ConfigError

__all__ = [
    "BOUND_MARGIN_S",
    "DEFAULT_BOUND_S",
    "MAX_BOUND_S",
    "MIN_BOUND_S",
    "DrainTiming",
    "drain_script",
    "drain_timing",
]

MIN_BOUND_S = 30
MAX_BOUND_S = 3600
DEFAULT_BOUND_S = 120  # no measured latency: a few thousand tokens of output at 30 ms each
BOUND_MARGIN_S = 5  # two polls in a row, a slow scrape, a late SIGTERM
P99_FACTOR = 2  # p99 is not the maximum, and a replica slows down while it empties
DEFAULT_SETTLE_S = 5
DEFAULT_SHUTDOWN_S = 30
DEFAULT_POLL_S = 1


class DrainTiming(BaseModel):
    """How long a replica drains, in whole seconds (Kubernetes takes integers).

    ``settle_s``: the hook waits this long for the endpoints to drop the pod before it
    looks at what is in flight. ``bound_s``: the hook returns at most this long after it
    started (the settle included). ``shutdown_s``: vLLM's own exit after SIGTERM.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    settle_s: NonNegativeInt
    bound_s: PositiveInt
    shutdown_s: NonNegativeInt

    @model_validator(mode="after")
    def _settle_within_bound(self) -> DrainTiming:
        if self.settle_s >= self.bound_s:
            raise ValueError(
                f"settle_s {self.settle_s} is not below bound_s {self.bound_s}; the settle is "
                "part of the bound, so the hook would never look at what is in flight"
            )
        return self

    @property
    def grace_period_s(self) -> int:
        """``terminationGracePeriodSeconds``: the hook's settle and bound, then the shutdown.

        The bound already counts the settle, so the settle counted again here is headroom
        for starting the hook; the kubelet never kills a hook that kept to its bound.
        """
        return self.settle_s + self.bound_s + self.shutdown_s

    def script_args(self) -> tuple[str, ...]:
        """The drain program's arguments for this timing (``--url`` left at its default)."""
        return ("--settle-s", str(self.settle_s), "--bound-s", str(self.bound_s))


def drain_timing(
    p99_e2e_ms: float | None,
    *,
    settle_s: float = DEFAULT_SETTLE_S,
    shutdown_s: float = DEFAULT_SHUTDOWN_S,
) -> DrainTiming:
    """The drain of a replica serving a workload whose measured p99 E2E latency is ``p99_e2e_ms``.

    A request that arrives just before the endpoints drop the pod (at the end of the
    settle) needs about the p99 E2E latency to finish, so the bound is
    ``settle + ceil(2 x p99) + 5`` seconds, at least 30 s and at most an hour;
    ``DEFAULT_BOUND_S`` (120 s) when nothing was measured. ``settle_s`` and
    ``shutdown_s`` are rounded up to whole seconds. ConfigError for a latency that is
    negative or not finite, or a settle or shutdown out of range.
    """
    settle = _whole_seconds("settle_s", settle_s, below=MIN_BOUND_S)
    shutdown = _whole_seconds("shutdown_s", shutdown_s, below=MAX_BOUND_S + 1)
    if p99_e2e_ms is None:
        bound = DEFAULT_BOUND_S
    elif not (math.isfinite(p99_e2e_ms) and p99_e2e_ms >= 0):
        raise ConfigError(
            f"p99_e2e_ms {p99_e2e_ms!r} is not accepted; accepted: a measured latency in "
            "milliseconds (finite, 0 or more), or None when nothing was measured"
        )
    else:
        wanted = settle + math.ceil(P99_FACTOR * p99_e2e_ms / 1000) + BOUND_MARGIN_S
        bound = min(max(wanted, MIN_BOUND_S), MAX_BOUND_S)
    return DrainTiming(settle_s=settle, bound_s=bound, shutdown_s=shutdown)


def _whole_seconds(name: str, value: float, *, below: int) -> int:
    if not (math.isfinite(value) and 0 <= value <= below - 1):
        raise ConfigError(
            f"{name} {value!r} is not accepted; accepted: seconds from 0 to {below - 1}"
        )
    return math.ceil(value)


def drain_script() -> str:
    """The preStop program's source: Python 3 (3.8 or later), standard library only.

    Its defaults (settle 5 s, bound 120 s, poll 1 s, ``http://127.0.0.1:8000``) are this
    module's; ``DrainTiming.script_args()`` gives the arguments for a measured workload.
    """
    return _PROGRAM


# The program itself. It runs in the vllm/vllm-openai image, not here: no imports from
# the tuner, nothing newer than Python 3.8. Tests import it from a file (tests/unit/
# test_drain.py) and run it against the simulator (tests/integration/test_drain_script.py).
_PROGRAM = r'''#!/usr/bin/env python3
"""Drain this vLLM replica before SIGTERM: a Kubernetes preStop hook (vllm-capacity-tuner).

    python3 drain.py [--url URL] [--bound-s S] [--settle-s S] [--poll-s S] [--log PATH]

1. Waits --settle-s seconds: the endpoints controller takes the pod out of its Service,
   and no new request arrives after that.
2. Polls URL/metrics until vllm:num_requests_running and vllm:num_requests_waiting
   (summed over their label sets) are both 0 on two polls in a row, or until --bound-s
   seconds have passed since it started (the settle included).
3. Exits 0 either way (a failed preStop hook only adds an event); what is still in
   flight at the bound is left to vLLM's SIGTERM handling.

What it waited for goes to the pod's log: PID 1's stdout (/proc/1/fd/1, since a hook's
own output is not in kubectl logs), or this program's stdout where that cannot be
opened; --log PATH writes there instead (- for stdout; with shareProcessNamespace,
PID 1 is the pod's pause process, so give --log). Standard library only.
"""

import argparse
import collections
import http.client
import sys
import time
import urllib.error
import urllib.request

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
POD_LOG = "/proc/1/fd/1"
READ_TIMEOUT_S = 5.0
MIN_READ_TIMEOUT_S = 0.2

Outcome = collections.namedtuple("Outcome", "drained running waiting elapsed_s")


class Unreadable(Exception):
    """The gauges could not be read; the message says why."""


def parse_gauges(text, names=(RUNNING, WAITING)):
    """Each name's samples in Prometheus text exposition, summed over their label sets.

    A name with no sample (or only NaN ones) is left out of the result.
    """
    totals = {}
    for line in text.splitlines():
        name, value = sample(line.strip())
        if name in names and value is not None and value == value:
            totals[name] = totals.get(name, 0.0) + value
    return totals


def sample(line):
    """(metric name, value) of one exposition line; (None, None) for a comment or blank."""
    if not line or line.startswith("#"):
        return None, None
    end = 0
    while end < len(line) and (line[end].isalnum() or line[end] in "_:"):
        end += 1
    name, rest = line[:end], line[end:].lstrip()
    if rest.startswith("{"):
        close = labels_end(rest)
        if close < 0:
            return name, None
        rest = rest[close + 1 :]
    fields = rest.split()  # the value, then an optional timestamp
    try:
        return name, float(fields[0])
    except (IndexError, ValueError):
        return name, None


def labels_end(text):
    """Index of the brace that closes the label set text starts with; -1 if none does."""
    quoted = escaped = False
    for index, char in enumerate(text):
        if escaped:
            escaped = False
        elif quoted:
            if char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char == "}":
            return index
    return -1


class Reader:
    """Reads (running, waiting) from a vLLM server's /metrics."""

    def __init__(self, url):
        self.url = url.rstrip("/") + "/metrics"
        # No proxy: an HTTP_PROXY in the pod's environment must not catch this request.
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def __call__(self, timeout_s):
        try:
            with self.opener.open(self.url, timeout=timeout_s) as response:
                text = response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            raise Unreadable("HTTP %d from %s" % (exc.code, self.url)) from None
        except urllib.error.URLError as exc:
            raise Unreadable("%s: %s" % (self.url, exc.reason)) from None
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise Unreadable("%s: %s" % (self.url, str(exc) or type(exc).__name__)) from None
        gauges = parse_gauges(text)
        missing = [name for name in (RUNNING, WAITING) if name not in gauges]
        if missing:
            raise Unreadable(
                "no %s in %s (vLLM started with --disable-log-stats?)"
                % (" or ".join(missing), self.url)
            )
        return int(round(gauges[RUNNING])), int(round(gauges[WAITING]))


def counts_text(counts):
    return "%d running, %d waiting" % counts


def drain(read, bound_s, settle_s, poll_s, say, clock=time.monotonic, sleep=time.sleep):
    """Wait as the module says, saying so; the Outcome it ended with.

    read(timeout_s) returns (running, waiting) or raises Unreadable; say(level, text)
    writes one line of the log.
    """
    start = clock()
    deadline = start + bound_s

    def look():
        timeout_s = max(MIN_READ_TIMEOUT_S, min(READ_TIMEOUT_S, deadline - clock()))
        try:
            return read(timeout_s), None
        except Unreadable as exc:
            return None, str(exc)

    counts, reason = look()
    then = "waiting %g s for the endpoints to drop this pod, then " % settle_s
    if counts is not None:
        say("INFO", "preStop drain: %s; %suntil none is left (at most %g s in all)"
            % (counts_text(counts), then, bound_s))
    else:
        say("WARNING", "preStop drain: cannot read the requests in flight (%s); "
            "%sretrying until %g s have passed" % (reason, then, bound_s))
    sleep(max(0.0, min(settle_s, deadline - clock())))
    zeros = 0
    while True:
        now_counts, now_reason = look()
        elapsed_s = clock() - start
        if now_counts is not None and now_counts != counts:
            say("INFO", "preStop drain: %s after %.1f s" % (counts_text(now_counts), elapsed_s))
        elif now_counts is None and now_reason != reason:
            say("WARNING", "preStop drain: cannot read the requests in flight after %.1f s "
                "(%s); retrying until %g s" % (elapsed_s, now_reason, bound_s))
        counts, reason = now_counts, now_reason
        zeros = zeros + 1 if counts == (0, 0) else 0
        if zeros >= 2:
            say("INFO", "preStop drain: drained: 0 running, 0 waiting after %.1f s" % elapsed_s)
            return Outcome(True, 0, 0, elapsed_s)
        left_s = deadline - clock()
        if left_s <= 0:
            break
        sleep(min(poll_s, left_s))
    if counts is None:
        say("WARNING", "preStop drain: bound of %g s reached without reading the requests in "
            "flight (%s): leaving them to SIGTERM" % (bound_s, reason))
        return Outcome(False, None, None, elapsed_s)
    say("WARNING", "preStop drain: bound of %g s reached with %s: leaving them to SIGTERM"
        % (bound_s, counts_text(counts)))
    return Outcome(False, counts[0], counts[1], elapsed_s)


def open_log(path):
    """The stream the lines go to: path, else PID 1's stdout, else ours ("-": ours)."""
    target = path or POD_LOG
    if target == "-":
        return sys.stdout
    try:
        return open(target, "a", buffering=1, encoding="utf-8")
    except OSError:
        return sys.stdout


def seconds(minimum):
    def parse(text):
        value = float(text)
        if not value >= minimum:  # also rejects NaN
            raise argparse.ArgumentTypeError("%s is below %g" % (text, minimum))
        return value

    return parse


def arguments():
    parser = argparse.ArgumentParser(
        prog="drain.py", description="Wait for a vLLM server's requests in flight (preStop)."
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    parser.add_argument("--bound-s", type=seconds(0.001), default=120.0,
                        help="return at the latest this long after starting (default 120)")
    parser.add_argument("--settle-s", type=seconds(0.0), default=5.0,
                        help="first wait this long for the endpoints to drop the pod (default 5)")
    parser.add_argument("--poll-s", type=seconds(0.01), default=1.0,
                        help="read /metrics this often (default 1)")
    parser.add_argument("--log", help="write the lines here (default: /proc/1/fd/1, else stdout)")
    return parser


def main(argv=None):
    args = arguments().parse_args(argv)
    out = open_log(args.log)

    def say(level, text):
        stamp = time.strftime("%m-%d %H:%M:%S", time.localtime())
        out.write("%s %s [drain.py] %s\n" % (level, stamp, text))
        out.flush()

    try:
        drain(Reader(args.url), args.bound_s, args.settle_s, args.poll_s, say)
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''

"""The simulated engine's clock between trials: as fast as its load generator has room for.

Before the first trial the clock's scale K (the engine's clock runs K times slower than
the emulated GPU's; K < 1 runs it faster) is chosen from the twin's prediction of the
busiest level a trial will offer (``TrialLoop._choose_measurement``,
``tuner.search.context.auto_time_scale``): every token its schedule plans, at 1.3 times
the twin's predicted capacity. On the default chat tune the load generator then
handled about half of that (its token events, in ``client.json``). So after each trial
the next launches' clock is chosen again from what the trial's load generator did
(``measured_time_scale``): the most events per emulated second any of its levels asked
of it, ``BUSIEST_MARGIN`` times over (a later trial's settings may hold more), within
the load generator's budget (``TuneConfig.max_events_per_s``, or the most events per
wall second it kept up with where that is more: on the default tune one process kept up
with 5,900 with an event-loop delay p99 of 4.6 ms, against a 10-ms bound), never faster
than ``TuneConfig.fastest_time_scale``. Where the tokens a streamed event carries are
the harness's to choose (vLLM's per-request ``stream_interval``, no ITL objective), a
busier trial raises them instead of slowing the clock (``measured_clock``).

Every figure a level records is converted to the emulated GPU's seconds whatever its
clock (``tuner.serving.load``), and each level records its own clock
(``client.json``: ``ClientSetup.time_scale``). What a faster clock costs: the load
generator's own lag (a send or a token read late, in wall milliseconds) is divided by
K like everything else, so at K = 0.7 a 7 ms event-loop delay reads as 10 ms of the
emulated GPU's; the client's bounds (``workloads.client_lag.ClientBounds``) are in wall
milliseconds and a level whose client lagged past them is measured again with a
slower clock (``tuner.search.client_retry``). A trial whose load generator lagged
keeps its clock for the next one (no faster). One whose simulated server fell behind
(``server_lag_scale``) says nothing of the load generator: its settings' later launches
keep the clock it needed, and the next trials' clock is chosen as before. A lag while
other processes took the host's CPU (``ClientLag.host_busy``, ``tuner.serving.host_cpu``)
says nothing of either: the level is measured again on a slower clock as any lagging
one, and the next launches are not slowed for it (a 10-minute tune on a host busy for
40 s kept the twin's pick at half the pace for its confirmation, and measured three
trials where a quiet host measures four or five).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuner.run.evaluation import LevelRecord
from tuner.search.context import REQUEST_COST_EVENTS, clock_scale

# The next trial's busiest level over this one's: as the first trial's clock is chosen
# for 1.3 times the twin's predicted capacity.
BUSIEST_MARGIN = 1.3


def client_events_per_s(level: LevelRecord, chunks: float = 1.0) -> float | None:
    """What a level asked of its load generator, in events per second of the emulated GPU's
    clock: its processes' token events and ``REQUEST_COST_EVENTS`` per request sent, per
    wall second, times the level's clock scale (``chunks``: see
    ``client_wall_events_per_s``). None: not recorded."""
    wall = client_wall_events_per_s(level, chunks)
    return None if wall is None or level.client is None else wall * level.client.setup.time_scale


def client_wall_events_per_s(level: LevelRecord, chunks: float = 1.0) -> float | None:
    """What a level's load generator handled per wall second: its processes' token events
    and ``REQUEST_COST_EVENTS`` per request sent. ``chunks``: its token events after each
    request's first (an event of its own) that many times over (the tokens an event it
    ran with over another interval's). None: not recorded."""
    client = level.client
    if client is None or not client.lag.processes:
        return None
    wall = 0.0
    for p in client.lag.processes:
        if p.wall_s <= 0:
            continue
        requests = p.sent / p.wall_s
        first = min(requests, p.token_events_per_s)
        wall += first + (p.token_events_per_s - first) * chunks + REQUEST_COST_EVENTS * requests
    return wall


def measured_time_scale(
    levels: Sequence[LevelRecord], *, max_events_per_s: float, fastest: float
) -> float | None:
    """The next launches' clock scale from a trial's ``levels`` (the module's docstring):
    the most any level asked of the load generator, ``BUSIEST_MARGIN`` times over, within
    its budget: ``max_events_per_s``, or more where a level's client kept up with more per
    wall second (its bounds are what room means; ``clock_scale``). Where a level's client
    lagged, no faster than the slowest clock the trial's levels ran at. None: no level
    recorded its client."""
    clock = measured_clock(levels, max_events_per_s=max_events_per_s, fastest=fastest)
    return None if clock is None else clock.time_scale


@dataclass(frozen=True)
class NextClock:
    """The next launches' clock scale, and the tokens each streamed event carries."""

    time_scale: float
    stream_interval: int


def measured_clock(
    levels: Sequence[LevelRecord],
    *,
    max_events_per_s: float,
    fastest: float,
    stream_interval: int = 1,
    max_stream_interval: int | None = None,
) -> NextClock | None:
    """``measured_time_scale``, where the tokens a streamed event carries may also change
    (vLLM's per-request ``stream_interval``; the levels ran with ``stream_interval``):
    the fastest clock any interval up to ``max_stream_interval`` allows, with the fewest
    tokens an event that allow it, never fewer than now. A request's first token is an
    event of its own and its last ends a chunk, so its TTFT and TPOT read the same at any
    interval: a busier trial need not slow the clock where chunks can carry more.
    ``max_stream_interval`` None: the interval stays."""
    if not any(client_events_per_s(lv) is not None for lv in levels):
        return None
    kept_up = [
        wall
        for lv in levels
        if lv.client is not None
        and not lv.client.lag.generator_lagged
        and (wall := client_wall_events_per_s(lv)) is not None
    ]
    budget = max([max_events_per_s, *kept_up])
    # (a level where only the simulated server fell behind says nothing of the load
    # generator: those settings keep their slower clock, ``server_lag_scale``)
    lagged = [
        lv.client.setup.time_scale
        for lv in levels
        if lv.client and lv.client.lag.generator_lagged and not lv.client.lag.host_busy
    ]
    ran = [lv.client.setup.time_scale for lv in levels if lv.client is not None]
    top = max(stream_interval, max_stream_interval or stream_interval)
    best: NextClock | None = None
    for interval in range(stream_interval, top + 1):
        asked = max(
            events
            for lv in levels
            if (events := client_events_per_s(lv, stream_interval / interval)) is not None
        )
        scale = clock_scale(asked * BUSIEST_MARGIN, budget, fastest)
        if lagged:
            scale = max(scale, *ran)
        if best is None or scale < best.time_scale:
            best = NextClock(scale, interval)
    return best


def server_lag_scale(levels: Sequence[LevelRecord]) -> float | None:
    """The clock a trial's simulated server was measured on after it fell behind a faster
    one (an attempt set aside because the server's own steps started late: more load
    processes cannot help it), the slowest such level's; None where it kept up. The
    settings' later launches start there (``StudySetup.slower_clocks``): a confirmation
    of the twin's pick at the clock its trial lagged on spent 99 s on one level, a set-aside
    attempt and the level again at half the pace. Attempts that lagged while the host was
    busy with other processes (``ClientLag.host_busy``) do not count: the host's lag, not
    the settings' (``host_busy_lag``)."""
    scales = [
        lv.client.setup.time_scale
        for lv in levels
        if lv.client is not None
        and any(a.lag.server_lagged and not a.lag.host_busy for a in lv.client.attempts)
    ]
    return max(scales, default=None)


def host_busy_lag(levels: Sequence[LevelRecord]) -> float | None:
    """The largest share of the host's CPU other processes took over an attempt set aside
    because its simulated server fell behind while the host was busy; None where none did."""
    shares = [
        a.lag.host_others_share
        for lv in levels
        if lv.client is not None
        for a in lv.client.attempts
        if a.lag.server_lagged and a.lag.host_busy and a.lag.host_others_share is not None
    ]
    return max(shares, default=None)


def clock_text(scale: float) -> str:
    """The clock as a line says it: "1.5x slower", "1.4x faster", "at the emulated GPU's pace"."""
    if scale > 1.0:
        return f"{scale:g}x slower"
    if scale < 1.0:
        return f"{1.0 / scale:.2g}x faster"
    return "at the emulated GPU's pace"

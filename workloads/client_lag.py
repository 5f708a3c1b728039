"""Whether the load generator kept up with its schedule: its lag, process by process.

The client is part of every measurement: latency counts from each request's intended
send time, so a request the client sent late, or a token it read late, carries the
client's own delay into the server's figures. Each Locust process measures itself
(`workloads.runner.WorkerStats`, read here as `SelfMeasured`); `judge_client` sums that
up as a `ClientLag`: per process its send lag against the schedule, its event loop's
delay (a periodic timer's lateness), its token events/s, the share of token events it
read a whole token late and its CPU; and the verdict against `ClientBounds`: KEPT_UP, or
LAGGED with the reason. The stated bounds, each per process:

    send lag p99          > 10 ms    requests went out late (TTFT carries it)
    event-loop delay p99  > 10 ms    streams were read late (TTFT and ITL carry it)

(each of the two at least 5 % of the tightest limit it is added to: send lag of the
TTFT limit, loop delay of the TTFT and token-gap limits; ``ClientBounds.for_slo``)
    coalesced events      > 1 %      token gaps read as 0 (ITL's percentiles carry it)
    CPU                   > 75 %     of one core: the process has no room left

This module never imports Locust or gevent (the runner and the tuner import it).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from workloads.slo import Slo, SloMetric

# The stated bounds, per Locust process (the module's docstring says why each).
MAX_SEND_LAG_P99_MS = 10.0
MAX_LOOP_DELAY_P99_MS = 10.0
MAX_COALESCED_PERCENT = 1.0  # of token events, whose gaps read as 0
MAX_CPU_PERCENT = 75.0  # of one core
# The lag bounds are at least this share of the SLO limits the lag is added to
# (``ClientBounds.for_slo``): 100 ms against a TTFT limit of 2 s.
SLO_SHARE = 0.05
# The simulated server's steps start late by a sleep's overshoot, the previous step's
# token deliveries and the requests it parses in between, even where its core keeps up
# (5 to 11 ms at p99 on a 2-core host under the default workload's levels, as many wall
# milliseconds at 1x as at 2x): its lag counts past this, or past ``slo_share`` of the
# limits it adds to (``ClientBounds.for_slo``).
SERVER_LAG_FLOOR_MS = 10.0
# A lag while processes outside the harness took at least this share of the host's CPU
# (a quarter: half a core of a 2-core host) is the host's, not the settings' or the load
# generator's: it says nothing of the clock their next launches need.
HOST_BUSY_SHARE = 0.25


class SelfMeasured(Protocol):
    """What one load process measured about itself and the rule reads
    (``workloads.runner.WorkerStats``, which imports this module)."""

    @property
    def worker(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def sent(self) -> int: ...
    @property
    def wall_s(self) -> float: ...
    @property
    def cpu_percent(self) -> float: ...
    @property
    def send_lag_p50_ms(self) -> float | None: ...
    @property
    def send_lag_p99_ms(self) -> float | None: ...
    @property
    def send_lag_max_ms(self) -> float | None: ...
    @property
    def loop_delay_p50_ms(self) -> float | None: ...
    @property
    def loop_delay_p99_ms(self) -> float | None: ...
    @property
    def loop_delay_max_ms(self) -> float | None: ...
    @property
    def token_events(self) -> int: ...
    @property
    def coalesced_events(self) -> int: ...


class ClientVerdict(StrEnum):
    """Whether the load generator kept to its schedule within ``ClientBounds``."""

    KEPT_UP = "kept_up"
    LAGGED = "lagged"


class ClientBounds(BaseModel):
    """The client's lag past which a measurement carries it (each per Locust process)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    send_lag_p99_ms: float = Field(default=MAX_SEND_LAG_P99_MS, gt=0)
    loop_delay_p99_ms: float = Field(default=MAX_LOOP_DELAY_P99_MS, gt=0)
    coalesced_percent: float = Field(default=MAX_COALESCED_PERCENT, ge=0)
    cpu_percent: float = Field(default=MAX_CPU_PERCENT, gt=0)
    # the simulated server's step lag (``ServerClockLag``); wall-clock ms
    server_lag_p99_ms: float = Field(default=SERVER_LAG_FLOOR_MS, gt=0)
    # ``for_slo`` widens the lag bounds to this share of the SLO limits (0: never)
    slo_share: float = Field(default=SLO_SHARE, ge=0, lt=1)
    # the host was busy: other processes took this share of its CPU (1.0: every core)
    host_busy_share: float = Field(default=HOST_BUSY_SHARE, gt=0, le=1)

    def for_slo(self, slo: Slo, *, time_scale: float = 1.0) -> ClientBounds:
        """These bounds, widened to ``slo_share`` of the limits the lag would be added to
        where that is more: a request sent late adds its lag to its TTFT, a loop running
        late to its TTFT and token gaps. A lag of 11 ms is immaterial to a TTFT limit of
        2 s, and judging it by a fixed 10 ms would measure a level again for nothing.
        ``time_scale`` K: the simulator runs K times slower, so its limits are K times
        longer in wall-clock time."""
        objectives = slo.objectives()
        share = self.slo_share
        ttft = [o.limit_ms for o in objectives if o.metric is SloMetric.TTFT]
        gaps = [o.limit_ms for o in objectives if o.metric in (SloMetric.ITL, SloMetric.TPOT)]
        send = self.send_lag_p99_ms
        if ttft:
            send = max(send, share * min(ttft) * time_scale)
        loop = self.loop_delay_p99_ms
        if ttft or gaps:
            loop = max(loop, share * min([*ttft, *gaps]) * time_scale)
        # A simulated step that starts late delays all its tokens alike: it adds its lag
        # to a TTFT, a token gap and an end-to-end latency, but to a TPOT only the change
        # of lag between a request's first and last token, spread over its tokens (a p99
        # of 25 ms moves a 16-token TPOT by under 2 ms): TPOT limits do not bound it.
        late = [
            o.limit_ms
            for o in objectives
            if o.metric in (SloMetric.TTFT, SloMetric.ITL, SloMetric.E2E)
        ]
        server = self.server_lag_p99_ms
        if late:
            server = max(server, share * min(late) * time_scale)
        return self.model_copy(
            update={"send_lag_p99_ms": send, "loop_delay_p99_ms": loop, "server_lag_p99_ms": server}
        )

    def describe(self) -> str:
        """The bounds as one line, e.g. for a record's reason."""
        return (
            f"send lag p99 <= {self.send_lag_p99_ms:g} ms, event-loop delay p99 <= "
            f"{self.loop_delay_p99_ms:g} ms, coalesced token events <= "
            f"{self.coalesced_percent:g}%, CPU <= {self.cpu_percent:g}% of a core"
        )


class ProcessLag(BaseModel):
    """One Locust process's lag over its run (None: nothing to measure it by)."""

    model_config = ConfigDict(frozen=True)

    worker: str  # "w<index>"
    sent: int
    wall_s: float
    send_lag_p50_ms: float | None
    send_lag_p99_ms: float | None
    send_lag_max_ms: float | None
    loop_delay_p50_ms: float | None
    loop_delay_p99_ms: float | None
    loop_delay_max_ms: float | None
    token_events: int
    token_events_per_s: float
    coalesced_percent: float  # of its token events, read a whole token late
    cpu_percent: float  # of one core

    @classmethod
    def of(cls, stats: SelfMeasured) -> ProcessLag:
        wall_s = max(stats.wall_s, 1e-9)
        return cls(
            worker=stats.worker,
            sent=stats.sent,
            wall_s=stats.wall_s,
            send_lag_p50_ms=stats.send_lag_p50_ms,
            send_lag_p99_ms=stats.send_lag_p99_ms,
            send_lag_max_ms=stats.send_lag_max_ms,
            loop_delay_p50_ms=stats.loop_delay_p50_ms,
            loop_delay_p99_ms=stats.loop_delay_p99_ms,
            loop_delay_max_ms=stats.loop_delay_max_ms,
            token_events=stats.token_events,
            token_events_per_s=stats.token_events / wall_s,
            coalesced_percent=100 * stats.coalesced_events / max(stats.token_events, 1),
            cpu_percent=stats.cpu_percent,
        )

    def past(self, bounds: ClientBounds) -> list[str]:
        """What of this process's lag is past ``bounds``, one phrase each."""
        out: list[str] = []
        name = self.worker
        if self.send_lag_p99_ms is not None and self.send_lag_p99_ms > bounds.send_lag_p99_ms:
            out.append(
                f"{name} send lag p99 {self.send_lag_p99_ms:.1f} ms "
                f"(> {bounds.send_lag_p99_ms:g} ms)"
            )
        if self.loop_delay_p99_ms is not None and self.loop_delay_p99_ms > bounds.loop_delay_p99_ms:
            out.append(
                f"{name} event-loop delay p99 {self.loop_delay_p99_ms:.1f} ms "
                f"(> {bounds.loop_delay_p99_ms:g} ms)"
            )
        if self.coalesced_percent > bounds.coalesced_percent:
            out.append(
                f"{name} read {self.coalesced_percent:.1f}% of token events a whole token late "
                f"(> {bounds.coalesced_percent:g}%)"
            )
        if self.cpu_percent > bounds.cpu_percent:
            out.append(f"{name} used {self.cpu_percent:.0f}% of a core (> {bounds.cpu_percent:g}%)")
        return out


class ServerClockLag(BaseModel):
    """The simulated server's own lag over one run (``GET /sim/lag``): how late its steps
    started against the wall clock. Its engine is the measuring apparatus too: a core
    that cannot keep up with the virtual GPU's clock delays every token of a step."""

    model_config = ConfigDict(frozen=True)

    steps: int
    p99_ms: float
    max_ms: float

    def past(self, bounds: ClientBounds) -> list[str]:
        """Its lag past ``bounds.server_lag_p99_ms``, one phrase; empty when it kept up."""
        bound = bounds.server_lag_p99_ms
        if self.p99_ms <= bound:
            return []
        return [
            f"the simulated server's steps started {self.p99_ms:.1f} ms late at p99 "
            f"(> {bound:g} ms; its core could not keep up with the clock)"
        ]


class ClientLag(BaseModel):
    """The load generator's lag over one run, per process, and its verdict; on the
    simulated engine also its server's (``server``)."""

    model_config = ConfigDict(frozen=True)

    verdict: ClientVerdict
    reason: str | None  # what was past the bounds; None when it kept up
    bounds: ClientBounds
    processes: tuple[ProcessLag, ...]
    server: ServerClockLag | None = None
    # The share of the host's CPU (1.0: every core) that processes outside the harness
    # took over the run (``tuner.serving.host_cpu``); None: not measured.
    host_others_share: float | None = None

    @property
    def lagged(self) -> bool:
        return self.verdict is ClientVerdict.LAGGED

    @property
    def host_busy(self) -> bool:
        """Other processes took at least ``bounds.host_busy_share`` of the host's CPU over
        the run: a lag then is the host's, and says nothing of the next launches' clock."""
        share = self.host_others_share
        return share is not None and host_busy(share, self.bounds)

    @property
    def generator_lagged(self) -> bool:
        """A load process went past the bounds (the simulated server's own lag aside)."""
        return any(p.past(self.bounds) for p in self.processes)

    @property
    def server_lagged(self) -> bool:
        """The simulated server fell behind its clock (more load processes cannot help)."""
        return self.server is not None and bool(self.server.past(self.bounds))

    @property
    def who(self) -> str:
        """What lagged, for a line: the load generator, the simulated server, or both."""
        if self.server_lagged and not self.generator_lagged:
            return "the simulated server"
        if self.server_lagged:
            return "the load generator and the simulated server"
        return "the load generator"

    @property
    def token_events_per_s(self) -> float:
        """Token events/s of every process together."""
        return sum(p.token_events_per_s for p in self.processes)


def host_busy(host_others_share: float, bounds: ClientBounds) -> bool:
    """Other processes took at least ``bounds.host_busy_share`` of the host's CPU."""
    return host_others_share >= bounds.host_busy_share


def judge_client(
    workers: Sequence[SelfMeasured],
    bounds: ClientBounds | None = None,
    server: ServerClockLag | None = None,
    host_others_share: float | None = None,
) -> ClientLag:
    """Every process's lag against ``bounds`` (default: the stated ones), and the simulated
    server's where given; LAGGED when any went past any bound. ``host_others_share``: what
    processes outside the harness took of the host's CPU meanwhile, said beside a lag."""
    bounds = bounds or ClientBounds()
    processes = tuple(ProcessLag.of(w) for w in sorted(workers, key=lambda w: w.index))
    reasons = [phrase for p in processes for phrase in p.past(bounds)]
    if server is not None:
        reasons += server.past(bounds)
    if reasons and host_others_share is not None and host_busy(host_others_share, bounds):
        reasons.append(f"other processes took {100 * host_others_share:.0f}% of the host's CPU")
    return ClientLag(
        verdict=ClientVerdict.LAGGED if reasons else ClientVerdict.KEPT_UP,
        reason="; ".join(reasons) or None,
        bounds=bounds,
        processes=processes,
        server=server,
        host_others_share=host_others_share,
    )

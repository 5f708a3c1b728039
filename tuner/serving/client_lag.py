"""A level's load generator: its lag as the level records it, and the remedy when it lagged.

The client is part of every measurement (``workloads.client_lag``: latency counts from
each request's intended send time, so a client's own delay is in the server's figures).
A level whose client lagged past the stated bounds does not count; it is measured again,
on its own, with a client that has more room (``plan_remedy``):

* more load processes, doubled, up to the host's cores and ``ClientRule.max_processes``,
  where the processes are on this host (no remote workers);
* else, on the simulated engine, its clock twice slower (``/sim/time-scale``): the same
  emulated load at half the events per wall second (at once where the simulated server's
  own steps fell behind its clock, ``workloads.client_lag.ServerClockLag``);
* else nothing more can be done.

At most ``ClientRule.retries`` times; a level still lagging after them is unmeasurable
(``LevelClient.unmeasurable``): neither a hold nor a break for the goodput. The remedy
stays for the rest of the trial's levels (a higher rate needs it more).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from workloads.client_lag import ClientBounds, ClientLag, ClientVerdict

DEFAULT_RETRIES = 2
DEFAULT_MAX_PROCESSES = 8
SLOWER_CLOCK_FACTOR = 2.0


class ClientRule(BaseModel):
    """The stated bounds on a level's client, and how far the harness goes to meet them."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    bounds: ClientBounds = ClientBounds()
    retries: int = Field(default=DEFAULT_RETRIES, ge=0)  # measurements again of one level
    max_processes: int = Field(default=DEFAULT_MAX_PROCESSES, ge=1)  # local Locust processes

    def process_cap(self, cores: int | None) -> int:
        """The most local load processes: ``max_processes``, and no more than the cores."""
        return max(1, min(self.max_processes, cores or 1))


class ClientRemedy(StrEnum):
    """What was changed about the client before a level was measured again."""

    MORE_PROCESSES = "more_processes"
    SLOWER_CLOCK = "slower_clock"


class ClientSetup(BaseModel):
    """How a level's load was generated: local processes, remote workers, the clock."""

    model_config = ConfigDict(frozen=True)

    processes: int
    remote_workers: int = 0
    time_scale: float = 1.0  # the simulated engine's clock, this many times slower

    def describe(self) -> str:
        text = f"{self.processes} load process{'es' if self.processes != 1 else ''}"
        if self.remote_workers:
            text += f" and {self.remote_workers} remote"
        if self.time_scale != 1.0:
            text += f", time scale {self.time_scale:g}"
        return text


class ClientChange(BaseModel):
    """One remedy: the client before and after it."""

    model_config = ConfigDict(frozen=True)

    remedy: ClientRemedy
    before: ClientSetup
    after: ClientSetup

    def describe(self) -> str:
        if self.remedy is ClientRemedy.MORE_PROCESSES:
            return f"{self.after.processes} load processes instead of {self.before.processes}"
        return (
            f"the simulated clock {self.after.time_scale / self.before.time_scale:g}x slower "
            f"(time scale {self.after.time_scale:g})"
        )


def plan_remedy(
    rule: ClientRule,
    setup: ClientSetup,
    *,
    simulated: bool,
    cores: int | None,
    server_lagged: bool = False,
) -> ClientChange | None:
    """The next remedy for a client that lagged (the module's docstring), or None; where
    the simulated server itself fell behind its clock (``server_lagged``), a slower clock
    at once: more load processes would take its core."""
    cap = rule.process_cap(cores)
    if not server_lagged and not setup.remote_workers and setup.processes < cap:
        after = setup.model_copy(update={"processes": min(2 * setup.processes, cap)})
        return ClientChange(remedy=ClientRemedy.MORE_PROCESSES, before=setup, after=after)
    if simulated:
        slower = setup.time_scale * SLOWER_CLOCK_FACTOR
        after = setup.model_copy(update={"time_scale": slower})
        return ClientChange(remedy=ClientRemedy.SLOWER_CLOCK, before=setup, after=after)
    return None


class ClientAttempt(BaseModel):
    """An attempt at a level set aside because its client lagged, and what changed next."""

    model_config = ConfigDict(frozen=True)

    dir: str  # where its evidence went (``level-<i>/lagged-<k>``)
    setup: ClientSetup
    lag: ClientLag
    then: ClientChange  # what was changed before the next attempt
    wall_s: float | None = None  # its wall seconds (None: records from before they were kept)


class LevelClient(BaseModel):
    """A level's client (``client.json``): the lag of the attempt that counts (the last one),
    how its load was generated, and the earlier attempts set aside because theirs lagged."""

    model_config = ConfigDict(frozen=True)

    lag: ClientLag
    setup: ClientSetup
    attempts: tuple[ClientAttempt, ...] = ()
    # The level held its SLO although its client lagged: a client's lag only adds to
    # the latencies measured (they count from each request's intended send time, and
    # a token read late reads later), so a level that held through it holds; only one
    # that broke cannot tell the server's fault from the client's.
    held_anyway: bool = False
    # The level broke although the simulated server's steps started late, by more than
    # that lag can move a latency (``tuner.search.client_retry.broke_anyway``): its load
    # generator kept up, and every step started at most ``lag.server.max_ms`` late.
    broke_anyway: bool = False

    @property
    def verdict(self) -> ClientVerdict:
        return self.lag.verdict

    @property
    def set_aside_s(self) -> float:
        """The wall seconds of the attempts set aside (0 where none, or not recorded)."""
        return sum(a.wall_s or 0.0 for a in self.attempts)

    @property
    def unmeasurable(self) -> bool:
        """The client lagged in the attempt that counts and the level's verdict may be
        the lag's: it broke, and not by more than the lag can explain (``held_anyway``,
        ``broke_anyway``)."""
        return self.lag.lagged and not self.held_anyway and not self.broke_anyway

    @property
    def remeasured(self) -> bool:
        return bool(self.attempts)

    def summary(self) -> str:
        """One line: kept up, measured again (and why), or why it could not be measured."""
        tries = len(self.attempts)
        if self.lag.lagged and self.held_anyway:
            return f"held although the client lagged (its lag only adds latency): {self.lag.reason}"
        if self.lag.lagged and self.broke_anyway:
            return (
                "broke by more than the simulated server's lag can move a latency: "
                f"{self.lag.reason}"
            )
        if self.unmeasurable:
            text = f"the client could not keep up: {self.lag.reason}"
            if tries:
                text += f" (with {self.setup.describe()}, after {tries} more attempt"
                text += "s)" if tries > 1 else ")"
            return text
        if not tries:
            return "the client kept up"
        changes = ", then ".join(a.then.describe() for a in self.attempts)
        return (
            f"measured again with {changes}: the client lagged before "
            f"({self.attempts[0].lag.reason})"
        )


@runtime_checkable
class ClientScaling(Protocol):
    """A server whose load generator can be given more room (``LiveServer``): what a rate
    search asks of it to measure a level again. A stand-in without a client (the twin's
    virtual clock) has no such methods, and its levels are never measured again."""

    @property
    def client_rule(self) -> ClientRule: ...

    def client_remedy(self) -> ClientChange | None:
        """The next remedy for this server's client (``plan_remedy``), not yet applied."""
        ...

    def apply_client_change(self, change: ClientChange) -> None:
        """Generate the following loads as ``change.after`` says."""
        ...

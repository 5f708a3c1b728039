"""A level whose load generator lagged does not count: it is measured again, on its own.

The rule and its remedies are ``tuner.serving.client_lag``'s. Here one level of a rate
search is measured, and while its client lagged past the bounds and a remedy is left
(at most ``ClientRule.retries`` times): the attempt's evidence is set aside in
``level-<i>/lagged-<k>/``, the server's client gets more room (more load processes, or
the simulated engine's clock slower) and the level is measured again as a run of its
own, from an empty server. ``level-<i>/`` then holds the attempt that counts, and its
``client.json`` (``LevelClient``) every attempt's lag and what changed after it. A level
still lagging after the last attempt is unmeasurable: the search treats it as missing.
A level that held although its client lagged is not measured again and counts
(``held_anyway``): the client's lag only adds to the latencies it measured. Nor is one
that broke by more than the simulated server's own lag can explain while its load
generator kept up (``broke_anyway``).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from tuner.run.layout import CLIENT_JSON, lagged_attempt_name
from tuner.serving.client_lag import ClientAttempt, ClientScaling, LevelClient
from tuner.serving.live_server import LoadMeasurement
from tuner.serving.server import TrialOutcome
from workloads.load_errors import ABORTED, STOPPED_BEFORE_SEND
from workloads.schedule import read_records
from workloads.slo import SloMetric, SloObjective

log = logging.getLogger(__name__)

LAGGED_PREFIX = lagged_attempt_name(0).removesuffix("0")


def measure_with_honest_client(
    server: object, measure: Callable[[bool], LoadMeasurement], level_dir: Path
) -> LoadMeasurement:
    """Measure a level with ``measure(again)`` into ``level_dir``, again while its client
    lagged (the module's docstring); ``again``: the level must be a run of its own this
    time (not carried on from the level before). ``server``: the search's server; one
    without a client to scale (``ClientScaling``: the twin's virtual clock, a stand-in)
    measures once. The measurement that counts, with every attempt in its ``client``."""
    began = time.monotonic()
    m = measure(False)
    attempts: list[ClientAttempt] = []
    if isinstance(server, ClientScaling):
        rule = server.client_rule
        while (
            m.client is not None
            and m.client.unmeasurable
            and not held_anyway(m)
            and not broke_anyway(m)
            and m.outcome is TrialOutcome.READY
            and len(attempts) < rule.retries
        ):
            change = server.client_remedy()
            if change is None:
                log.warning(
                    "%s: %s lagged and nothing is left to give it room: %s",
                    level_dir, m.client.lag.who, m.client.lag.reason,
                )  # fmt: skip
                break
            log.info(
                "%s: %s lagged (%s); measuring the level again with %s",
                level_dir, m.client.lag.who, m.client.lag.reason, change.describe(),
            )  # fmt: skip
            aside = set_aside(level_dir, len(attempts))
            attempts.append(
                ClientAttempt(
                    dir=str(aside),
                    setup=m.client.setup,
                    lag=m.client.lag,
                    then=change,
                    wall_s=time.monotonic() - began,
                )
            )
            server.apply_client_change(change)
            began = time.monotonic()
            m = measure(True)
    if m.client is None:
        return m
    client = m.client.model_copy(
        update={
            "attempts": tuple(attempts),
            "held_anyway": m.client.lag.lagged and held_anyway(m),
            "broke_anyway": m.client.lag.lagged and broke_anyway(m),
        }
    )
    m = m.model_copy(update={"client": client})
    write_level_client(level_dir, client)
    return m


def held_anyway(m: LoadMeasurement) -> bool:
    """The level held although its client lagged: its SLO met over the window, no backlog
    built, not stopped early, the engine alive. A client's lag only adds latency, so
    that verdict stands; one that broke is measured again."""
    growing = m.backlog is not None and m.backlog.growing
    return (
        m.slo.met and not growing and not m.stopped_early and not m.stopped_by_backlog
        and m.outcome is TrialOutcome.READY
    )  # fmt: skip


def broke_anyway(m: LoadMeasurement) -> bool:
    """The level broke although the simulated server's steps started late, by more than
    that lag can explain: only the server lagged (every load process kept up), and an
    objective's percentile is past its limit by more than the server's largest step lag
    in the emulated GPU's time. The engine runs on the virtual GPU's timeline, and a step
    that starts late delays its tokens, and stamps the requests that arrive meanwhile,
    by at most that: no latency, so no percentile, moves by more. A verdict the lag could
    have made is measured again."""
    client = m.client
    if client is None or m.outcome is not TrialOutcome.READY or m.load.slo is None:
        return False
    lag = client.lag
    if lag.server is None or not lag.server_lagged:
        return False
    if lag.generator_lagged:
        return False  # the load generator lagged too: more room for it first
    shift_ms = lag.server.max_ms / client.setup.time_scale
    return any(
        (
            (value := m.load.measured_ms(objective)) is not None
            and value - shift_ms > objective.limit_ms
        )
        or waited_past(m, objective, shift_ms)
        for objective in m.load.slo.objectives()
    )


def waited_past(m: LoadMeasurement, objective: SloObjective, shift_ms: float) -> bool:
    """A level stopped early whose requests waited for their first token past a TTFT
    limit by more than ``shift_ms``, more of them than the objective's tail allows (of
    those sent at least that long before the stop; one still waiting at the stop counts
    by how long it had waited): the lag cannot have made its verdict. A level stopped
    once its SLO broke may have no answer in its window yet: the default tune's pick at
    9.34/s stopped 1.4 s of the emulated GPU's into its window, while 557 of its earlier
    requests had a TTFT p50 of 2.1 s and p99 of 6.2 s and 791 more were still waiting."""
    if objective.metric is not SloMetric.TTFT or m.client is None:
        return False
    if not (m.stopped_early or m.stopped_by_backlog):
        return False
    path = Path(m.out_dir) / "requests.jsonl"
    records = [r for r in read_records(path) if not r.warmup] if path.is_file() else []
    sent = [r for r in records if r.error != STOPPED_BEFORE_SEND]
    if not sent:
        return False
    stop_s = max(r.end_s if r.end_s is not None else r.sent_s for r in sent)
    # (wall seconds on the level's clock: the emulated GPU's times its scale)
    bound_s = (objective.limit_ms + shift_ms) / 1000.0 * m.client.setup.time_scale
    due = [r for r in sent if r.scheduled_s <= stop_s - bound_s]
    tail = 1.0 - objective.percentile / 100.0
    if not due or len(due) * tail < 1.0:
        return False  # too few to place the percentile
    late = 0
    for r in due:
        if r.first_token_s is not None:
            late += r.first_token_s - r.scheduled_s > bound_s
        elif r.error == ABORTED:  # in flight at the stop, still without its first token
            late += 1
    return late > tail * len(due)


def set_aside(level_dir: Path, attempt: int) -> Path:
    """Move what an attempt left in ``level_dir`` into ``level_dir/lagged-<attempt>``
    (earlier attempts set aside stay where they are)."""
    aside = level_dir / lagged_attempt_name(attempt)
    aside.mkdir(parents=True, exist_ok=False)
    for entry in list(level_dir.iterdir()):
        if entry == aside or (entry.is_dir() and entry.name.startswith(LAGGED_PREFIX)):
            continue
        shutil.move(str(entry), str(aside / entry.name))
    return aside


def write_level_client(level_dir: Path, client: LevelClient) -> None:
    """The level's ``client.json``."""
    level_dir.mkdir(parents=True, exist_ok=True)
    (level_dir / CLIENT_JSON).write_text(client.model_dump_json(indent=2) + "\n", "utf-8")

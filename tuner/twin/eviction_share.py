"""The twin's share of later turns' prefix misses that were evictions of a conversation
still under way, on the schedule a measured level sent (``tuner.sim.lost_history``).

The twin replays the level's schedule (later turns at their answers' times plus think
time, as the load generator sent them) on the simulated engine of the same settings
and reads the engine's own count: over the whole replay, warm-up included, where the
measured figure is the level's window. A replay the twin cannot run (its server would
not start, the level's files are missing) gives None.
"""

from __future__ import annotations

from pathlib import Path

from tuner.twin.fit import DRAIN_S, read_level
from tuner.twin.prediction import Setup, simulate_schedule
from workloads.slo import Slo


def twin_evicted_under_way_share(
    setup: Setup, level_dir: Path, *, time_scale: float = 1.0
) -> float | None:
    """The twin's share on the level in ``level_dir`` (None: not replayable, or no later
    turn missed anything)."""
    level = read_level(level_dir, time_scale=time_scale)
    if level is None:
        return None
    _, result = simulate_schedule(setup, level.sent, Slo(), stop_at_s=level.end_s + DRAIN_S)
    return result.evicted_under_way_share if result is not None else None

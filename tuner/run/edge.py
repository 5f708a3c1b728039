"""``edge/edge.json``: the OOM edge of the best settings, every probe that found it.

``tuner.search.edge`` launches the probes; each is kept (``EdgeProbe``: its settings,
verdict, outcome, how its worst-case hold ended); per knob, the highest value that held
and the lowest that ran out of memory (``KnobEdge``); all of it, ``EdgeResult``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from tuner.serving.server import TrialOutcome
from tuner.serving.worst_case_hold import HoldEnd
from tuner.vllm.space import Knob


class ProbeVerdict(StrEnum):
    """What one probe says of the edge."""

    HELD = "held"  # started and survived the worst case
    OUT_OF_MEMORY = "out_of_memory"  # failed to start, or died, for memory: brackets the edge
    INCONCLUSIVE = "inconclusive"  # failed not by memory (twice): the bracket does not move


class WorstCase(BaseModel):
    model_config = ConfigDict(frozen=True)

    prompt_tokens: int
    output_tokens: int
    concurrency: int  # max-num-seqs of the probe
    # The longest the worst case is held (emulated seconds): it ends earlier once the KV
    # cache has peaked or every output finished.
    load_s: float


class EdgeProbe(BaseModel):
    model_config = ConfigDict(frozen=True)

    knob: Knob
    value: float
    flags: dict[str, object]
    predicted_fits: bool | None
    outcome: TrialOutcome
    verdict: ProbeVerdict
    survived: bool  # verdict HELD (kept for readers of older runs)
    attempt: int = 1  # 2: the retry of an attempt that failed not by memory
    failure_kind: str | None = None
    failure_message: str | None = None
    peak_used_bytes: int | None = None
    total_bytes: int | None = None
    headroom_bytes: int | None = None
    kv_cache_tokens: int | None = None
    num_preemptions: int | None = None
    hold_end: HoldEnd | None = None  # None: not served (did not start)
    hold_s: float | None = None  # emulated seconds the worst case was held
    peak_kv_cache_usage: float | None = None
    requests: int | None = None
    request_errors: int | None = None
    dir: str
    wall_s: float
    launch_s: float | None = None  # wall seconds to ready (or to the failure)
    # The simulated clock it ran on (tuner.search.clock); None: the run's (tune.json), or
    # written before it was recorded.
    time_scale: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _verdict_of_older_runs(cls, data: Any) -> Any:
        """An edge.json written before verdicts: every failure counted as out of memory."""
        if isinstance(data, dict) and "verdict" not in data:
            held = bool(data.get("survived"))
            data = {
                **data,
                "verdict": ProbeVerdict.HELD if held else ProbeVerdict.OUT_OF_MEMORY,
            }
        return data

    @property
    def startup_edge_only(self) -> bool:
        return self.verdict is ProbeVerdict.HELD and (
            self.hold_end is not None and self.hold_end.startup_only
        )

    def said(self) -> str:
        """The verdict in words, e.g. ``out of memory (cuda_oom_in_profiling)``."""
        if self.verdict is ProbeVerdict.HELD:
            return (
                "held (startup edge only: cut short before the KV cache peaked)"
                if (self.startup_edge_only)
                else "held"
            )
        why = self.failure_kind or self.outcome.value
        if self.verdict is ProbeVerdict.OUT_OF_MEMORY:
            return f"out of memory ({why})"
        return f"inconclusive ({why}: not an out-of-memory outcome)"


class KnobEdge(BaseModel):
    """One knob's edge: the highest value that held, the lowest that ran out of memory."""

    model_config = ConfigDict(frozen=True)

    knob: Knob
    start: float  # the recommended settings' value
    predicted: float | None  # the memory model's highest value that starts
    highest_ok: float | None
    lowest_failed: float | None  # the lowest value that ran out of memory
    resolution: float
    launches: int
    note: str = ""
    inconclusive: list[float] = []  # values whose probes failed not by memory, twice
    # highest_ok's probe was cut short before the KV cache peaked: a startup edge only
    highest_ok_startup_only: bool = False

    @property
    def bracketed(self) -> bool:
        return (
            self.highest_ok is not None
            and self.lowest_failed is not None
            and self.lowest_failed - self.highest_ok <= self.resolution * 1.0001
        )


class EdgeResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    worst_case: WorstCase | None
    utilization: KnobEdge | None
    max_num_seqs: KnobEdge | None
    probes: list[EdgeProbe]
    skipped: str | None = None

"""``evaluation.json``: everything one candidate came to (a trial or a confirmation run).

``tuner.search.evaluate`` screens, launches and measures a candidate and writes its
``Evaluation`` beside the server's log, the GPU timeline and one directory per measured
rate (``LevelRecord``); the report and the study read it back.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from tuner.run.goodput import CapacityInterval, Goodput, GoodputBound, GoodputUnit
from tuner.run.layout import evaluation_json
from tuner.serving.backlog import BacklogCheck
from tuner.serving.client_lag import LevelClient
from tuner.serving.eviction_scrape import EvictionEvidence
from tuner.serving.gpu_sampler import GpuSummary
from tuner.serving.live_server import KvFill
from tuner.serving.server import TrialOutcome
from tuner.serving.window import WindowOpening
from tuner.vllm.failures import StartupFailure
from tuner.vllm.log import StartupReport
from tuner.vllm.memory import MemoryPlan
from tuner.vllm.space import TrialParams
from workloads.load_result import LoadResult


class Verdict(StrEnum):
    """How a candidate came out, as the study and the report show it."""

    MET = "met"  # the SLOs held at some measured rate
    SLO_MISSED = "slo_missed"  # served, but the SLOs broke at every measured rate
    SCREENED = "screened"  # the memory model says it cannot start; not launched
    STARTUP_FAILED = "startup_failed"
    DIED = "died"  # the engine died under load

    @property
    def feasible(self) -> bool:
        return self is Verdict.MET


class LevelSeconds(BaseModel):
    """Where a level's wall time went, in wall seconds (the simulated engine's clock may
    run slower or faster than the emulated GPU's: ``time_scale``): the warm-up until its
    window opened, the window's shortest length, what it was held on past it, the drain
    after it, and the rest (planning the schedule, starting the load generator, writing
    the evidence, attempts set aside because the client lagged). The parts are None where
    the level opened no window (the engine died, a stand-in server)."""

    model_config = ConfigDict(frozen=True)

    wall_s: float  # the whole level, from planning it to its evidence written
    warmup_s: float | None = None
    window_s: float | None = None  # the shortest window (less where it stopped sooner)
    hold_on_s: float | None = None  # held on past the shortest window
    drain_s: float | None = None  # after the window, until the run was cut
    other_s: float | None = None
    time_scale: float = 1.0  # the clock it ran on (its wall seconds per emulated second)

    @classmethod
    def of(
        cls,
        wall_s: float,
        window: WindowOpening | None,
        run_wall_s: float | None,
        time_scale: float,
    ) -> LevelSeconds:
        """A level's seconds from its window (``WindowOpening``, emulated seconds) and its load
        run's wall seconds (offset 0 to its stop; None: not recorded)."""
        if window is None or run_wall_s is None:
            return cls(wall_s=wall_s, time_scale=time_scale)
        k = time_scale
        shortest = window.window_min_s if window.window_min_s is not None else window.window_s
        warmup = window.opened_at_s * k
        measured = min(window.window_s, shortest) * k
        hold_on = max(0.0, window.window_s - shortest) * k
        return cls(
            wall_s=wall_s,
            warmup_s=warmup,
            window_s=measured,
            hold_on_s=hold_on,
            drain_s=max(0.0, run_wall_s - warmup - measured - hold_on),
            other_s=max(0.0, wall_s - run_wall_s),
            time_scale=time_scale,
        )

    def text(self) -> str:
        """E.g. ``166 s (warm-up 32, window 38, hold-on 90, drain 5, other 1)``."""
        named = (
            ("warm-up", self.warmup_s),
            ("window", self.window_s),
            ("hold-on", self.hold_on_s),
            ("drain", self.drain_s),
            ("other", self.other_s),
        )
        parts = [(name, value) for name, value in named if value is not None]
        inner = ", ".join(f"{name} {value:.0f}" for name, value in parts)
        return f"{self.wall_s:.0f} s" + (f" ({inner})" if inner else "")


class LevelRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    rate_per_s: float
    met: bool
    stopped_early: bool
    dir: str
    load: LoadResult
    violations: list[str]
    num_preemptions: int | None
    max_kv_cache_usage: float | None
    prefix_cache_hit_rate: float | None
    # The level's load generator: its lag per process and the verdict against the bounds,
    # how the load was generated, the attempts set aside because it lagged
    # (tuner.serving.client_lag; also the level's client.json). None: written before it was.
    client: LevelClient | None = None
    backlog: BacklogCheck | None = None  # the backlog guard's trends (tuner.serving.backlog)
    stopped_by_backlog: bool = False
    # The share of resamples of the window's requests that meet the SLO
    # (workloads.slo_bootstrap): how sure ``met`` is. None: written before it was.
    hold_share: float | None = None
    # Where the level's wall time went (None: written before it was recorded).
    seconds: LevelSeconds | None = None
    # The window's own percentiles met the SLO, whatever the hold rule (P(hold) at least
    # 0.9) and the backlog guard say. None: written before it was recorded.
    window_met: bool | None = None
    # Which draw of the workload the level measured: 0 the search's own, k > 0 the k-th
    # draw measured again at a rate of the bracket's ends (tuner.search.rate_search's edge
    # draws), with the workload's seed it was planned with (None: written before draws
    # were recorded; one draw, the workload's own seed).
    draw: int = 0
    seed: int | None = None
    # What the window shows of KV evictions: --kv-cache-metrics' histograms where the
    # server exported them, and on the simulated engine (and the twin) the share of later
    # turns' missed tokens that were their history evicted while under way. None: neither
    # was exported, or written before they were read.
    eviction: EvictionEvidence | None = None

    @property
    def hold_probability(self) -> float:
        """The estimated probability that this rate holds (``level_hold_probability``)."""
        return level_hold_probability(
            met=self.met, window_met=self.window_met, stopped_early=self.stopped_early,
            stopped_by_backlog=self.stopped_by_backlog, backlog=self.backlog,
            hold_share=self.hold_share,
        )  # fmt: skip

    @property
    def unmeasurable(self) -> bool:
        """Its client lagged in every attempt: neither a hold nor a break."""
        return self.client is not None and self.client.unmeasurable

    @property
    def time_scale(self) -> float | None:
        """The simulated clock's scale this level was measured at (None: not recorded; the
        run's, ``Evaluation.time_scale``). A level measured again may have a slower one."""
        return None if self.client is None else self.client.setup.time_scale

    @property
    def failed_by_backlog(self) -> bool:
        return self.stopped_by_backlog or (self.backlog is not None and self.backlog.growing)


def level_hold_probability(
    *,
    met: bool,
    window_met: bool | None,
    stopped_early: bool,
    stopped_by_backlog: bool,
    backlog: BacklogCheck | None,
    hold_share: float | None,
) -> float:
    """The estimated probability that a level's rate holds: nothing holds where the queue
    or TTFT grew; otherwise the share of the window's resamples that met the SLO times the
    probability that KV usage does not fill the cache within its horizon
    (``BacklogCheck.kv_stays``). A window that broke the SLO counts at most as a coin toss
    whatever its resamples say (it may have broken for a reason they do not see: a stop
    rule, the engine); a level without the share (written before it was recorded) counts
    as its verdict. The rate search pools it over a rate's draws (``LevelRecord.draw``)."""
    if stopped_by_backlog or (backlog is not None and backlog.growing_queue):
        return 0.0
    if hold_share is None:
        failed_by_backlog = backlog is not None and backlog.growing
        return 1.0 if met and not failed_by_backlog else 0.0
    kv = backlog.kv_stays if backlog is not None else 1.0
    if met or (window_met and not stopped_early):
        return hold_share * kv
    return min(hold_share, 0.5) * kv


class Evaluation(BaseModel):
    """Everything one candidate came to. (``goodput_requests_per_s`` and
    ``output_tokens_per_s`` were ``goodput`` and ``throughput`` in an evaluation.json
    written before their names said their units: read under either.)"""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    dir: str
    params: TrialParams
    flags: dict[str, object]
    verdict: Verdict
    outcome: TrialOutcome | None  # None: screened, not launched
    failure: StartupFailure | None = None
    log_excerpt: str = ""
    # What the harness saw where vLLM's log does not say it (``StartupResult.note``): which
    # startup timeout fired and after which line, why a serving engine counts as dead.
    note: str | None = None
    predicted: MemoryPlan | None = None
    startup: StartupReport | None = None
    startup_s: float | None = None
    dropped_flags: list[str] = []
    goodput_requests_per_s: float = Field(  # at the best level meeting the SLOs
        default=0.0, validation_alias=AliasChoices("goodput_requests_per_s", "goodput")
    )
    # BRACKETED: a higher rate broke; LOWER_BOUND: none did, the server holds at least this
    goodput_bound: GoodputBound = GoodputBound.NONE
    rate_per_s: float | None = None  # the workload's arrival rate at that level
    output_tokens_per_s: float = Field(  # at that level
        default=0.0, validation_alias=AliasChoices("output_tokens_per_s", "throughput")
    )
    # The same goodput stated whole: in the workload's unit, requests/s, output tokens/s
    # (None in an evaluation.json written before it was: ``stated_goodput`` rebuilds it)
    goodput_figures: Goodput | None = None
    # Where the capacity lies, from the levels' own statistics (tuner.search.capacity_interval),
    # in the workload's unit; None: no level measured, or written before it was.
    capacity_interval: CapacityInterval | None = None
    best: LevelRecord | None = None
    levels: list[LevelRecord] = []
    gpu: GpuSummary | None = None
    kv_fill: KvFill | None = None
    client_saturated: bool = False  # a level's client lagged in every attempt (unmeasurable)
    # The simulated clock's scale when the launch ended: a level whose client lagged may
    # have slowed it for the levels after it (each level records its own: LevelRecord).
    time_scale: float = 1.0
    # Wall seconds of the launch (spawn to ready, or to its failure), of what was measured
    # on it (KV fill, warm-up, levels) and of its stop (with the device memory's release):
    # the tune's time budget counts launches by them (tuner.search.budget). None: screened,
    # or written before they were recorded.
    launch_s: float | None = None
    levels_s: float | None = None
    stop_s: float | None = None
    # Of ``levels_s``, the wall seconds before the first level: the KV-cache fill and the
    # workload's own warm-up (each level's own are in ``LevelRecord.seconds``).
    warmup_s: float | None = None

    def levels_s_at(self, time_scale: float) -> float | None:
        """``levels_s`` on a simulated clock of ``time_scale`` (wall seconds scale with it:
        a later launch may run faster or slower than this one did); None: not recorded.
        Each level counts on the clock it was measured on (``LevelSeconds.time_scale``: one
        whose client lagged slows the clock for the levels after it), without its attempts
        set aside (``LevelClient.attempts``): a later launch starts on the clock those
        attempts led to: counted whole, the twin's pick's trial in a 10-minute tune (an
        attempt set aside at 4x, its levels at 2x: 138 s) kept a third trial from starting."""
        if self.levels_s is None:
            return None
        ran = self.time_scale or 1.0
        between = self.levels_s  # the warm-up, and what lies between levels
        counted = 0.0
        for level in self.levels:
            seconds = level.seconds
            if seconds is None:
                continue
            between -= seconds.wall_s
            aside = level.client.set_aside_s if level.client is not None else 0.0
            own = max(0.0, seconds.wall_s - aside)
            counted += own * time_scale / (seconds.time_scale or ran)
        return max(0.0, between) * time_scale / ran + counted

    @property
    def stated_goodput(self) -> Goodput:
        """The goodput in the workload's unit and in requests/s and output tokens/s."""
        if self.goodput_figures is not None:
            return self.goodput_figures
        return Goodput(
            arrival_rate_per_s=self.goodput_requests_per_s, unit=GoodputUnit.REQUESTS_PER_S,
            requests_per_s=self.goodput_requests_per_s, output_tokens_per_s=self.output_tokens_per_s,
            bound=self.goodput_bound,
        )  # fmt: skip

    @property
    def p99_ttft_ms(self) -> float | None:
        return None if self.best is None else self.best.load.ttft_ms.p99

    @property
    def backlog_note(self) -> str | None:
        """The lowest rate that failed by backlog, e.g. ``backlog: waiting +35 over 8 s at
        6.00/s`` (None when none did)."""
        failed = [s for s in self.levels if s.failed_by_backlog and s.backlog is not None]
        if not failed:
            return None
        level = min(failed, key=lambda s: s.rate_per_s)
        assert level.backlog is not None
        return f"{level.backlog.summary()} at {level.rate_per_s:.2f}/s"

    @property
    def client_note(self) -> str | None:
        """What the load generator did to the levels: those it could not keep up with,
        e.g. ``unmeasurable at 8.00/s: the client could not keep up: ...``, else how many
        were measured again, and whether the client lagged or the simulated server fell
        behind (None when it kept up everywhere the first time)."""
        lost = [lv for lv in self.levels if lv.unmeasurable and lv.client is not None]
        if lost:
            return "; ".join(
                f"unmeasurable at {lv.rate_per_s:.2f}/s: {lv.client.summary()}"
                for lv in lost
                if lv.client is not None
            )
        again = [lv for lv in self.levels if lv.client is not None and lv.client.remeasured]
        if not again:
            return None
        last = again[-1].client
        assert last is not None
        rates = ", ".join(f"{lv.rate_per_s:.2f}/s" for lv in again)
        attempts = [a for lv in again if lv.client is not None for a in lv.client.attempts]
        server = all(a.lag.server_lagged and not a.lag.generator_lagged for a in attempts)
        cause = "its simulated server fell behind" if server else "the client lagged"
        shares = [a.lag.host_others_share for a in attempts if a.lag.host_busy]
        busy = (
            f" while other processes took {100 * max(s for s in shares if s is not None):.0f}% "
            "of the host's CPU"
            if shares
            else ""
        )
        return f"measured again as {cause} at {rates}{busy} (now {last.setup.describe()})"

    def seconds_text(self) -> str | None:
        """Where the launch's wall time went, as a trial's line says it, e.g. ``launch 2 s,
        warm-up 8 s, levels 61 s (...) + 166 s (...), stop 0 s``; None: nothing launched."""
        if self.launch_s is None:
            return None
        parts = [f"launch {self.launch_s:.0f} s"]
        if self.warmup_s is not None:
            parts.append(f"warm-up {self.warmup_s:.0f} s")
        timed = [lv.seconds for lv in self.levels if lv.seconds is not None]
        if timed:
            parts.append("levels " + " + ".join(t.text() for t in timed))
        elif self.levels_s is not None:
            parts.append(f"levels {self.levels_s:.0f} s")
        if self.stop_s is not None:
            parts.append(f"stop {self.stop_s:.0f} s")
        scales = {t.time_scale for t in timed} or {self.time_scale}
        if scales != {1.0}:
            parts.append("clock " + "/".join(f"{k:g}" for k in sorted(scales)))
        return ", ".join(parts)

    def write(self) -> None:
        evaluation_json(self.dir).write_text(self.model_dump_json(indent=2), "utf-8")

"""Serving predicted on the simulator's virtual clock: a workload under given settings, in CPU seconds.

The tuning loop uses this to place its first probes (the first request rate a
trial measures, the first utilization the OOM-edge search launches), and the
search-efficiency benchmark to compute a whole landscape. The prompts are the
workload's own text through the simulator's tokenizer, so prefix sharing (system
prompts, multi-turn history) is what ``tuner sim-serve`` would see.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.serving.backlog import (
    WAITING_MIN_REQUESTS,
    WAITING_RUNNING_FRACTION,
    BacklogVerdict,
    Signal,
    SignalTrend,
    kv_trend,
    trend,
)
from tuner.serving.bracket import search
from tuner.serving.window import needed_requests
from tuner.sim.build import SimOptions, build_engine
from tuner.sim.simulate import SimulationResult, gc_paused, run
from tuner.sim.timing import TimingFactors
from tuner.sim.tokenizer import ChatEncoder, encode
from tuner.vllm.gpus import GpuSpec
from tuner.vllm.memory import MemoryPlan, ServingParams
from tuner.vllm.models import ModelSpec
from tuner.vllm.versions import VllmVersion
from workloads.build import build_schedule
from workloads.prompts import RememberingWordPromptBuilder
from workloads.replay import window_in_pass_s
from workloads.schedule import ScheduledRequest
from workloads.slo import Slo, SloMetric
from workloads.spec import WorkloadSpec
from workloads.stationary import AnswerTimes, expected_turns, lookback_s, nearest_in_rate
from workloads.traces import TraceRecord


@dataclass(frozen=True)
class Setup:
    """What the simulated server would be launched with."""

    model: ModelSpec
    gpu: GpuSpec
    version: VllmVersion
    params: ServingParams
    options: SimOptions = field(default_factory=SimOptions)
    timing: TimingFactors = field(default_factory=TimingFactors)  # the twin's step costs


@dataclass(frozen=True)
class Prediction:
    rate_per_s: float  # the workload's arrival rate
    plan: MemoryPlan
    result: SimulationResult | None  # None: the server would not start
    met: bool
    # steady_run: the queue's and the KV cache's trends through the window (tuner.serving.backlog).
    trends: tuple[SignalTrend, ...] = ()

    @property
    def backlog(self) -> bool:
        """A signal grew through the window: the rate is not sustained, whatever the SLOs."""
        return any(t.verdict is BacklogVerdict.GROWING for t in self.trends)


@dataclass
class RunTexts:
    """What many runs of one workload share (``steady_run``'s ``texts``): the prompt texts
    (``RememberingWordPromptBuilder``) and each chat message's token ids, per vocabulary
    (``ChatEncoder``). Both are functions of their keys, so a run's schedule and token ids
    are the same with them as without; a rate search's runs plan the same sessions again
    (at 7 conversations/s, about 40 % of a ``chat`` run's CPU time was making them anew)."""

    builder: RememberingWordPromptBuilder = field(default_factory=RememberingWordPromptBuilder)
    encoders: dict[int, ChatEncoder] = field(default_factory=dict)

    def encoder(self, vocab_size: int) -> ChatEncoder:
        if vocab_size not in self.encoders:
            self.encoders[vocab_size] = ChatEncoder(vocab_size)
        return self.encoders[vocab_size]


@gc_paused()  # millions of token ids, no reference cycles (see gc_paused)
def simulate_schedule(
    setup: Setup,
    schedule: list[ScheduledRequest],
    slo: Slo,
    stop_at_s: float | None = None,
    *,
    follow_answers: bool = True,
    measure_from_s: float | None = None,
    measure_to_s: float | None = None,
    sample_every_s: float | None = None,
    step_by_step: bool = False,
    chats: ChatEncoder | None = None,
) -> tuple[MemoryPlan, SimulationResult | None]:
    """The schedule on the simulated server's virtual clock.

    ``follow_answers``: a later turn (``ScheduledRequest.follows``) is sent its
    ``think_time_s`` after the answer it follows, as the load generator sends it, not at
    its planned ``send_s`` (a turn whose predecessor is not in ``schedule``: at
    ``send_s``). False: every request at ``send_s``, as ``predict`` has always run.
    The rest go to ``tuner.sim.simulate.run`` (``step_by_step``: the engine's step one at
    a time, every token written as it is made; the same run, slower). ``chats``: the
    encoder of the chat messages (one shared by many runs: ``RunTexts``), else a new one.
    """
    plan, engine = build_engine(
        setup.model, setup.gpu, setup.params, setup.version, setup.options, setup.timing
    )
    if engine is None:
        return plan, None
    vocab = setup.model.vocab_size
    records = [
        TraceRecord(arrival_s=r.send_s, prompt_tokens=r.prompt_tokens, output_tokens=r.max_tokens)
        for r in schedule
    ]
    if chats is None:  # later turns resend their history: each message once
        chats = ChatEncoder(vocab)
    ids = [
        chats.encode_chat(r.messages) if r.messages is not None else encode(r.prompt or "", vocab)
        for r in schedule
    ]
    follows: list[int | None] | None = None
    think: list[float] | None = None
    if follow_answers and any(r.follows is not None for r in schedule):
        index = {r.request_id: i for i, r in enumerate(schedule)}
        follows = [index.get(r.follows) if r.follows is not None else None for r in schedule]
        think = [r.think_time_s for r in schedule]
    result = run(
        engine, records, slo=slo, vocab=vocab, max_model_len=plan.max_model_len,
        prompt_token_ids=ids, stop_at_s=stop_at_s, follows=follows, think_s=think,
        measure_from_s=measure_from_s, measure_to_s=measure_to_s, sample_every_s=sample_every_s,
        step_by_step=step_by_step,
    )  # fmt: skip
    return plan, result


def slo_met(spec: WorkloadSpec, result: SimulationResult) -> bool:
    """The workload's objectives against a simulated run (any failed request breaks it).

    A request sent that had no first token when the run was cut waited past it: a run is
    cut a drain after its window (``tuner.serving.level_schedule.drain_s``: 1.5 times the
    TTFT limit at least), so its TTFT is past every TTFT limit. A TTFT objective breaks
    where more of the requests than its percentile allows are such, whatever the timed
    ones' percentile says (a server so far past capacity that none of its window's
    requests got a first token had no TTFT samples, and passed: the twin's prediction
    after a fit once climbed to 22,743 sessions/s, each run building a larger schedule)."""
    if result.num_failed or result.engine_died:
        return False
    fields = {
        SloMetric.TTFT: result.ttft_ms,
        SloMetric.ITL: result.itl_ms,
        SloMetric.TPOT: result.tpot_ms,
        SloMetric.E2E: result.e2e_ms,
    }
    waited = result.num_without_first_token
    for objective in spec.slo.objectives():
        percentiles = fields[objective.metric]
        late = waited / (percentiles.count + waited) if waited else 0.0
        if objective.metric is SloMetric.TTFT and late > 1.0 - objective.percentile / 100.0:
            return False
        value = getattr(percentiles, f"p{objective.percentile}")
        if value is not None and value > objective.limit_ms:  # None: no samples
            return False
    return True


def predict(setup: Setup, spec: WorkloadSpec, rate_per_s: float | None = None) -> Prediction:
    """One simulated run of the workload's measured window (warm-up left out)."""
    if rate_per_s is not None:
        spec = spec.with_rate(rate_per_s)
    schedule = [r for r in build_schedule(spec) if not r.warmup]
    origin = min((r.send_s for r in schedule), default=0.0)
    schedule = [_shift(r, origin) for r in schedule]
    limits = {o.metric: o.limit_ms for o in spec.slo.objectives()}
    slo = spec.slo
    # Cut where a measured level is cut (tuner.serving.level_schedule.drain_s), not at the last answer.
    drain = max(4.0, 1.5 * limits.get(SloMetric.TTFT, 0.0) / 1000.0)
    plan, result = simulate_schedule(
        setup, schedule, slo, stop_at_s=spec.duration_s + drain, follow_answers=False
    )
    rate = rate_per_s if rate_per_s is not None else (spec.mean_rate_per_s or 0.0)
    met = result is not None and slo_met(spec, result)
    return Prediction(rate_per_s=rate, plan=plan, result=result, met=met)


def max_rate(
    setup: Setup,
    spec: WorkloadSpec,
    *,
    start_rate_per_s: float | None = None,
    precision: float = 0.05,
    max_runs: int = 12,
) -> float:
    """The highest arrival rate whose simulated run meets the SLO (0: none does).

    Brackets from ``start_rate_per_s`` (default: the workload's) by doubling or
    halving, then bisects to ``precision`` (relative).
    """
    rate = start_rate_per_s or spec.mean_rate_per_s
    if rate is None:  # closed: no rate to search
        return 0.0
    return search(
        lambda r: predict(setup, spec, r).met, rate, precision=precision, max_runs=max_runs,
        step=2.0,
    )  # fmt: skip


SAMPLE_EVERY_S = 0.25  # steady_run's engine samples, virtual seconds
REFERENCE_WINDOW_S = 600.0
REFERENCE_WARMUP_S = 120.0


def steady_run(
    setup: Setup,
    spec: WorkloadSpec,
    rate_per_s: float | None,
    *,
    warmup_s: float,
    window_s: float,
    answer_times: AnswerTimes | None = None,
    step_by_step: bool = False,
    texts: RunTexts | None = None,
) -> Prediction:
    """The workload at ``rate_per_s`` in its steady state, judged over a window.

    The run opens on the stationary population of sessions at that rate
    (``tuner.serving.level_schedule.level_workload`` over ``warmup_s + window_s``: stationary start,
    the spec's own warm-up removed), sends each later turn its think time after the answer
    it follows, measures the requests arriving in ``[warmup_s, warmup_s + window_s)`` and
    cuts what is still in flight a drain after the window (``tuner.serving.level_schedule.drain_s``).
    A closed workload (``rate_per_s`` None with closed arrivals) runs its batch whole.
    ``answer_times``: what the session population is planned with (``level_workload``).
    ``step_by_step``: see ``simulate_schedule`` (the same run, slower). ``texts``: what
    this run shares with the others of a search (the same run, faster).

    ``met``: the SLOs hold over the window (``slo_met``) and no backlog builds, by
    ``tuner.serving.backlog.trend`` on the engine's state every ``SAMPLE_EVERY_S`` through the
    window with the live guard's margins: the waiting queue over the whole window
    (``max(2, 25 % of the mean running batch)``), KV usage (10 points, and full within
    a conversation's length: ``tuner.serving.backlog.kv_trend``) from one median request
    lifetime after the run started (from the window's start when the warm-up is longer),
    as ``tuner.serving.backlog.check_backlog`` judges a live level.
    """
    from tuner.serving.level_schedule import drain_s, level_workload

    level = level_workload(
        spec, rate_per_s, warmup_s + window_s, answer_times, window=(warmup_s, window_s)
    )
    closed = level.mean_rate_per_s is None
    schedule = build_schedule(level, prompt_builder=texts.builder if texts else None)
    if closed:
        origin = min((r.send_s for r in schedule), default=0.0)
        schedule = [_shift(r, origin) for r in schedule]
    start, end = (None, None) if closed else (warmup_s, warmup_s + window_s)
    plan, result = simulate_schedule(
        setup, schedule, level.slo,
        stop_at_s=None if closed else warmup_s + window_s + drain_s(level),
        measure_from_s=start, measure_to_s=end, sample_every_s=SAMPLE_EVERY_S,
        step_by_step=step_by_step,
        chats=texts.encoder(setup.model.vocab_size) if texts else None,
    )  # fmt: skip
    rate = rate_per_s if rate_per_s is not None else (level.mean_rate_per_s or 0.0)
    if result is None:
        return Prediction(rate_per_s=rate, plan=plan, result=None, met=False)
    trends = () if closed else _trends(result, warmup_s, warmup_s + window_s, lookback_s(spec))
    met = slo_met(level, result) and not any(t.verdict is BacklogVerdict.GROWING for t in trends)
    return Prediction(rate_per_s=rate, plan=plan, result=result, met=met, trends=trends)


def _trends(
    result: SimulationResult, start_s: float, end_s: float, kv_horizon_s: float
) -> tuple[SignalTrend, ...]:
    inside = [s for s in result.samples if start_s <= s.t_s <= end_s]
    mean_running = sum(s.running for s in inside) / len(inside) if inside else 0.0
    margin = max(WAITING_MIN_REQUESTS, WAITING_RUNNING_FRACTION * mean_running)
    lifetime_s = max(0.0, ((result.e2e_ms.p50 or 0.0) - (result.ttft_ms.p50 or 0.0)) / 1000.0)
    settled_s = max(start_s, lifetime_s)
    waiting = [(s.t_s - start_s, float(s.waiting)) for s in inside]
    kv = [(s.t_s - start_s, s.kv_usage) for s in inside if s.t_s >= settled_s]
    return (
        trend(Signal.WAITING, waiting, margin=margin),
        kv_trend(kv, kv_horizon_s),
    )


def answer_times_of(result: SimulationResult | None) -> AnswerTimes | None:
    """A simulated run's mean TTFT and TPOT (None when nothing was streamed)."""
    if result is None:
        return None
    return AnswerTimes.of_means(result.ttft_ms.mean, result.tpot_ms.mean)


@dataclass(frozen=True)
class SustainedRate:
    """``sustained_rate``'s answer: the rate, and the answer times the run at it
    measured (None: no rate held), to plan a live level's session population with."""

    rate_per_s: float
    answer_times: AnswerTimes | None = None


def sustained_rate(
    setup: Setup,
    spec: WorkloadSpec,
    *,
    warmup_s: float,
    window_s: float,
    start_rate_per_s: float | None = None,
    precision: float = 0.05,
    max_runs: int = 10,
    step: float = 2.0,
    first_step: float | None = None,
) -> SustainedRate:
    """The highest arrival rate ``steady_run`` says is sustained (0: none is; closed: 0).

    Brackets from ``start_rate_per_s`` (default: the workload's) by multiplying or
    dividing by ``step`` (the first move by ``first_step`` where given: a start known to
    be near the rate closes the bracket in two runs, ``tuner.serving.bracket.search``),
    then bisects to ``precision`` (relative); at most ``max_runs`` runs, the best rate met
    so far when they run out. Each run's session population is
    planned with the answer times of the run that held nearest in rate so far (the
    spec's expected ones until one has held), as a live search plans its levels
    (``tuner.search.rate_search.nearest_answer_times``).
    """
    rate = start_rate_per_s or spec.mean_rate_per_s
    if rate is None:
        return SustainedRate(0.0)
    held: dict[float, AnswerTimes] = {}

    def met(r: float) -> bool:
        times = nearest_in_rate(held, r)
        run = steady_run(setup, spec, r, warmup_s=warmup_s, window_s=window_s, answer_times=times)
        measured = answer_times_of(run.result)
        if run.met and measured is not None:
            held[r] = measured
        return run.met

    best = search(
        met, rate, precision=precision, max_runs=max_runs, step=step, first_step=first_step
    )
    return SustainedRate(best, held.get(best))


def sustained_max_rate(
    setup: Setup,
    spec: WorkloadSpec,
    *,
    warmup_s: float,
    window_s: float,
    start_rate_per_s: float | None = None,
    precision: float = 0.05,
    max_runs: int = 10,
    step: float = 2.0,
) -> float:
    """``sustained_rate``'s rate alone."""
    return sustained_rate(
        setup, spec, warmup_s=warmup_s, window_s=window_s, start_rate_per_s=start_rate_per_s,
        precision=precision, max_runs=max_runs, step=step,
    ).rate_per_s  # fmt: skip


def reference_warmup_s(spec: WorkloadSpec) -> float:
    """The reference run's warm-up: ``REFERENCE_WARMUP_S``, or the longest session's
    planned length (``workloads.stationary.lookback_s``) when that is longer."""
    return max(REFERENCE_WARMUP_S, lookback_s(spec))


def reference_window_s(spec: WorkloadSpec, rate_per_s: float) -> float:
    """``REFERENCE_WINDOW_S``, or longer where that holds fewer requests than the SLO's
    tightest percentile needs (``tuner.serving.window.needed_requests``: 200 for a p99);
    for a trace replay, one pass of the trace, at most ``REFERENCE_WINDOW_S`` (then on its
    busiest stretch, ``workloads.replay``), as a live level's window."""
    in_pass = window_in_pass_s(spec.with_rate(rate_per_s), REFERENCE_WINDOW_S)
    if in_pass is not None:
        return in_pass
    requests_per_s = rate_per_s * expected_turns(spec)
    if requests_per_s <= 0.0:
        return REFERENCE_WINDOW_S
    return max(REFERENCE_WINDOW_S, needed_requests(spec) / requests_per_s)


def reference_rate(
    setup: Setup,
    spec: WorkloadSpec,
    *,
    precision: float = 0.02,
    start_rate_per_s: float | None = None,
    max_runs: int = 12,
) -> float:
    """The rate the server sustains in the steady state of the workload: the highest
    rate whose ``steady_run`` over ``REFERENCE_WINDOW_S`` (10 virtual minutes) after
    ``reference_warmup_s`` is met, every turn of every conversation sent, to
    ``precision`` (longer where 10 minutes hold too few requests for the SLO's
    percentiles: ``reference_window_s``). Each run costs a 10-minute simulation, so the search starts from
    ``start_rate_per_s`` when given (a ``sustained_max_rate`` of short windows, close
    to it) with steps of 25 %, else from a short ``sustained_rate`` itself. Closed
    workloads: 0 (no rate; see ``steady_run``).

    Each run opens on the session population of this server: planned with the answer
    times of the run that held nearest in rate (the short search's, to begin with), as
    ``sustained_rate`` and the live search plan theirs. Near capacity a chat server is
    bistable (a cache that fills slows every answer, which keeps more conversations
    under way, which fills the cache): planned with the spec's expected answer times,
    several times slower than this server's, the run opens with too many conversations
    under way and tips into the full state at a rate it sustains from its own
    population (llama-3.1-8b on an H100, ``chat``: 5.8 conversations/s fills the cache
    and queues from that start, holds 300 s with KV usage flat at 0.4 from its own)."""
    if spec.mean_rate_per_s is None:
        return 0.0
    held: dict[float, AnswerTimes] = {}
    start = start_rate_per_s
    if not start:
        short = sustained_rate(setup, spec, warmup_s=15.0, window_s=30.0)
        start = short.rate_per_s
        if short.answer_times is not None:
            held[start] = short.answer_times
    if start <= 0.0:
        start = spec.mean_rate_per_s
    warmup = reference_warmup_s(spec)

    def met(r: float) -> bool:
        run = steady_run(
            setup, spec, r, warmup_s=warmup, window_s=reference_window_s(spec, r),
            answer_times=nearest_in_rate(held, r),
        )  # fmt: skip
        measured = answer_times_of(run.result)
        if run.met and measured is not None:
            held[r] = measured
        return run.met

    return search(met, start, precision=precision, max_runs=max_runs, step=1.25)


def _shift(request: ScheduledRequest, origin: float) -> ScheduledRequest:
    from dataclasses import replace

    return replace(request, send_s=request.send_s - origin)

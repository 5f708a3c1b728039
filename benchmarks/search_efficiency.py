"""Search efficiency: trials the tuning loop needs against grid search and vLLM's auto_tune.sh.

Issue 6, "Search efficiency, measured": on the simulated engine (virtual clock), compute
the goodput of every point of a realistic grid for a model/GPU/workload case (the
landscape), then replay the ways of searching it and count the trials each needs to reach
within 2% of the grid's best goodput. Target: the loop under 20% of the grid's trials
(median over 10 seeds).

Goodput of a setting: the highest arrival rate of the workload (chat: new conversations
per second) whose simulated window meets the workload's SLOs, on a ladder of rates 1%
apart (rate = 1.01**k), found by galloping from a warm start (the same settings at the
next utilization up, else the defaults' goodput) and bisecting; like
``tuner.twin.prediction.max_rate``, it takes the SLO verdict as monotone in the rate. Each run is
``tuner.twin.prediction.predict``'s (the workload's own prompts through the simulator's tokenizer,
warm-up left out); the script checks that it gives ``predict``'s verdicts before using it.
The window is the workload's own 60 s: multi-turn chat needs it (its later turns carry
the whole conversation, so a 15-20 s window measures a cold start, with goodput several
times higher and a flatter landscape).

Two ways the runs are made affordable without changing a verdict:

* utilization only changes the number of KV-cache blocks; a run whose block pool never
  evicted a cached block nor refused an allocation, and used only blocks below H, is the
  same run for every pool of at least H blocks (free blocks are handed out lowest id
  first), so its verdict is reused for the other utilizations;
* a run stops as soon as its verdict is settled: once enough requests are known to exceed
  a latency limit (finished over it, or still without a first token past the TTFT limit)
  that the percentile must exceed it whatever the others do.

The methods replayed on the landscape:

* the tuning loop (``tuner.search.study``'s way): an Optuna study with ``make_sampler``
  (multivariate TPE, ``n_trials`` = 20% of the grid), vLLM's defaults enqueued first,
  each point drawn by ``SearchSpace.suggest`` (max-num-seqs, a log-scale integer, is
  evaluated at the nearest grid value), value the landscape's goodput; a setting that
  does not start or meets the SLO at no rate is COMPLETE with value 0 and positive
  ``starts``/``slo`` constraints. Also without the defaults enqueued, to show the sampler
  apart from its head start;
* grid search, in the grid's own order and in random orders (seeded shuffles; the
  expectation is (G+1)/(M+1) trials for M good points among G);
* vLLM's ``benchmarks/auto_tune/auto_tune.sh``: ``--gpu-memory-utilization`` stepped down
  from 0.98 by 0.01 while >= 0.9, one server launch per step, with the last (largest)
  entries of its max-num-seqs and max-num-batched-tokens lists, until a server starts
  (``tuner.vllm.memory.plan`` decides here; nothing starting: the script exits); then, at that
  utilization, one launch and measurement per (max-num-seqs, max-num-batched-tokens) of
  its lists, max-num-seqs outer, with vLLM's default block size and KV-cache dtype. Its
  own measurement (``vllm bench serve`` at rate inf, then int(throughput)+1 stepped down
  by 1 req/s until the p99 E2E latency limit holds) is replaced by the goodput every
  other method gets, so only its choice of settings is compared; the utilization launches
  count as trials. Its lists: the script's defaults (128 256 x 512 1024 2048 4096) and, in
  the full run, wide lists covering the grid's max-num-seqs.

The landscape is cached as JSON in benchmarks/results/ (git-ignored), keyed by the case,
the grid and a hash of the simulator's and workloads' sources; a stale cache is recomputed
(``--accept-stale`` uses it anyway, saying so), ``--recompute`` ignores the cache.
Computing the full landscapes takes hours of CPU; ``--quick`` is a smaller grid and 20 s
windows, a smoke run whose numbers are not the measurement.

Run: ``python benchmarks/search_efficiency.py [--quick] [--jobs N] [--case NAME ...]``.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tuner.run.config import Objective
from tuner.search.sampling import make_sampler
from tuner.sim.blocks import BlockPool, EvictionPolicy
from tuner.sim.build import build_engine
from tuner.sim.engine import EngineDead, SimEngine, StepResult
from tuner.sim.simulate import run
from tuner.sim.tokenizer import encode, encode_chat
from tuner.twin.prediction import Setup, predict, slo_met
from tuner.vllm.gpus import GpuSpec, get_gpu
from tuner.vllm.memory import ServingParams, plan
from tuner.vllm.models import ModelSpec, resolve_model
from tuner.vllm.space import Knob, SearchSpace, TrialParams, build_space, parse_range
from tuner.vllm.space import vllm_defaults as space_defaults
from tuner.vllm.versions import VllmVersion
from workloads.build import build_schedule
from workloads.slo import Slo, SloMetric
from workloads.spec import WorkloadSpec, load_workload
from workloads.traces import TraceRecord

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CACHE_FORMAT = 2  # bump when the landscape's meaning changes

RATE_STEP = 1.01  # the rate ladder: rung k is RATE_STEP**k per second
MIN_RATE_PER_S = 0.05  # below this the SLO counts as met at no rate
# First step of the bracket search (then doubled): from a neighbour's goodput (the same
# settings at the next utilization up), and from a farther guess (the defaults' goodput).
GALLOP_NEAR_RUNGS = 1
GALLOP_FAR_RUNGS = 4
WITHIN = 0.02  # "within 2% of the best"
TARGET_SHARE = 0.20  # the target: under 20% of the grid's trials
SEEDS = tuple(range(10))

Grid = tuple[tuple[Knob, str], ...]  # knob and range, as `--space KNOB=RANGE` takes it

# auto_tune.sh's own defaults: NUM_SEQS_LIST="128 256", NUM_BATCHED_TOKENS_LIST="512 1024 2048 4096"
AUTOTUNE_DEFAULT_LISTS = ((128, 256), (512, 1024, 2048, 4096))


@dataclass(frozen=True)
class Case:
    """A model, GPU and workload, and the grid an engineer would sweep by hand for them."""

    name: str
    model: str
    gpu: str
    workload: str
    grid: Grid
    quick_grid: Grid
    window_s: float  # the simulated measured window of each run (the workloads' own: 60 s)
    quick_window_s: float
    # auto_tune.sh with lists covering the grid: the grid's max-num-seqs x these
    autotune_wide_batched: tuple[int, ...]

    def window(self, quick: bool) -> float:
        return self.quick_window_s if quick else self.window_s

    def grid_of(self, quick: bool) -> Grid:
        return self.quick_grid if quick else self.grid


U, S, B, K, T = (
    Knob.GPU_MEMORY_UTILIZATION,
    Knob.MAX_NUM_SEQS,  # a log-scale range: the grid takes the powers of two
    Knob.BLOCK_SIZE,
    Knob.KV_CACHE_DTYPE,
    Knob.MAX_NUM_BATCHED_TOKENS,
)
CASES = {
    c.name: c
    for c in (
        # Decode-heavy multi-turn chat: the five default knobs.
        Case(
            "llama-h100-chat", "llama-3.1-8b", "H100-80GB", "chat",
            grid=((U, "0.80..0.96/0.02"), (S, "16..1024"), (B, "16,32"), (K, "auto,fp8")),
            quick_grid=((U, "0.92..0.96/0.04"), (S, "256..1024"), (B, "16,32"), (K, "auto,fp8")),
            window_s=60.0, quick_window_s=20.0,
            autotune_wide_batched=(1024, 2048, 4096, 8192),
        ),
        # Prefill-heavy RAG: the prefill chunk (max-num-batched-tokens) joins the space.
        Case(
            "qwen-l40s-rag", "qwen2.5-7b", "L40S-48GB", "rag",
            grid=((U, "0.84..0.96/0.04"), (S, "16..256"), (B, "16,32"), (K, "auto,fp8"),
                  (T, "512,1024,2048,4096,8192")),
            quick_grid=((U, "0.88..0.96/0.04"), (S, "64..256"), (B, "16,32"), (K, "auto,fp8"),
                        (T, "512,2048,8192")),
            window_s=60.0, quick_window_s=20.0,
            autotune_wide_batched=(512, 1024, 2048, 4096, 8192),
        ),
        Case(
            "qwen-a100-rag", "qwen2.5-7b", "A100-40GB", "rag",
            grid=((U, "0.84..0.96/0.04"), (S, "16..256"), (B, "16,32"),
                  (T, "512,1024,2048,4096,8192")),
            quick_grid=((U, "0.88..0.96/0.04"), (S, "64..256"), (B, "16,32"),
                        (T, "512,2048,8192")),
            window_s=60.0, quick_window_s=20.0,
            autotune_wide_batched=(512, 1024, 2048, 4096, 8192),
        ),
    )
}  # fmt: skip
DEFAULT_CASES = ("llama-h100-chat", "qwen-l40s-rag")

# Sources whose change changes a landscape: a cache made before is stale.
SOURCES = (
    "tuner/sim/engine.py",
    "tuner/sim/blocks.py",
    "tuner/sim/timing.py",
    "tuner/sim/simulate.py",
    "tuner/sim/build.py",
    "tuner/sim/tokenizer.py",
    "tuner/vllm/memory.py",
    "tuner/vllm/models.py",
    "tuner/vllm/gpus.py",
    "tuner/vllm/versions.py",
    "tuner/twin/prediction.py",
    "workloads/spec.py",
    "workloads/build.py",
    "workloads/arrivals.py",
    "workloads/lengths.py",
    "workloads/prompts.py",
    "workloads/traces.py",
    "workloads/schedule.py",
)


# -- results ------------------------------------------------------------------------------


class PointResult(BaseModel):
    """One setting's goodput on the landscape."""

    model_config = ConfigDict(frozen=True)

    params: TrialParams
    starts: bool
    failure: str | None = None
    num_gpu_blocks: int = 0
    rung: int | None = None  # the highest rung that met the SLO; None: none did (or no start)
    goodput_per_s: float = 0.0
    simulations: int = 0  # runs simulated for this point (verdicts reused are not counted)
    reused: int = 0  # verdicts taken from a run with another utilization, exactly
    cpu_s: float = 0.0


class AutotuneRun(BaseModel):
    """auto_tune.sh with one pair of lists: its utilization search, then its settings."""

    num_seqs_list: list[int]
    num_batched_tokens_list: list[int]
    utilization: float | None  # None: nothing started at 0.90 or above (the script exits)
    utilization_launches: int
    points: list[PointResult]  # max-num-seqs outer, max-num-batched-tokens inner


class Landscape(BaseModel):
    fingerprint: str
    case: str
    quick: bool
    window_s: float
    grid: list[str]
    left_out: list[str]
    grid_size: int
    points: list[PointResult]
    autotune: dict[str, AutotuneRun]  # by list variant
    wall_s: float
    cpu_s: float
    jobs: int


# -- the simulated runs -------------------------------------------------------------------


def rung_rate(rung: int) -> float:
    return float(RATE_STEP**rung)


def rate_rung(rate_per_s: float) -> int:
    return round(math.log(rate_per_s) / math.log(RATE_STEP))


MIN_RUNG = math.ceil(math.log(MIN_RATE_PER_S) / math.log(RATE_STEP))


class _TrackingPool(BlockPool):
    """The engine's block pool, noting whether the run ever ran short of blocks."""

    def __init__(self, num_blocks: int, policy: EvictionPolicy) -> None:
        super().__init__(num_blocks, policy)
        self.high_water = 0  # blocks 0..high_water-1 were used; the rest never
        self.constrained = False  # a cached block was evicted or an allocation refused

    def allocate(self, n: int, now_s: float) -> list[int] | None:
        out = super().allocate(n, now_s)
        if out is None:
            self.constrained = True
        elif out:
            self.high_water = max(self.high_water, max(out) + 1)
        return out

    def _evict(self) -> int:
        self.constrained = True
        return super()._evict()


@dataclass(frozen=True)
class _Load:
    spec: WorkloadSpec
    records: list[TraceRecord]
    prompt_ids: list[list[int]]
    slo: Slo


@dataclass(frozen=True)
class _Context:
    model: ModelSpec
    gpu: GpuSpec
    version: VllmVersion
    spec: WorkloadSpec


@functools.lru_cache(maxsize=4)
def _context(case: Case, window_s: float) -> _Context:
    spec = load_workload(case.workload).model_copy(update={"duration_s": window_s})
    return _Context(resolve_model(case.model), get_gpu(case.gpu), VllmVersion.current(), spec)


@functools.lru_cache(maxsize=12)
def _load(case: Case, window_s: float, rung: int) -> _Load:
    """The measured window of the workload at one rate, as ``predict`` builds it."""
    ctx = _context(case, window_s)
    spec = ctx.spec.with_rate(rung_rate(rung))
    schedule = [r for r in build_schedule(spec) if not r.warmup]
    origin = min((r.send_s for r in schedule), default=0.0)
    vocab = ctx.model.vocab_size
    records = [
        TraceRecord(
            arrival_s=r.send_s - origin, prompt_tokens=r.prompt_tokens, output_tokens=r.max_tokens
        )
        for r in schedule
    ]
    ids = [
        encode_chat(r.messages, vocab) if r.messages is not None else encode(r.prompt or "", vocab)
        for r in schedule
    ]
    slo = spec.slo
    return _Load(spec, records, ids, slo)


class _SloBroken(EngineDead):
    """Raised into ``run`` once enough requests are late that the verdict cannot change."""


class _SloWatch:
    """Ends a run as soon as its SLO verdict is settled: for a p-th percentile over n
    requests (``Percentiles.from_values``: at least ``ordered[int(p (n-1))]``), once n - int(p (n-1))
    requests are known to exceed the limit, the percentile does whatever the rest do. A
    request waiting for its first token past the TTFT (or E2E) limit is known late. The
    verdict is the full run's (``run`` counts the stop as a dead engine, which fails the
    SLO too), so stopping changes no result, only the time spent on a broken run."""

    CHECK_EVERY = 16

    def __init__(self, engine: SimEngine, spec: WorkloadSpec, num_requests: int) -> None:
        self.engine = engine
        self.inner = engine.step
        n = num_requests
        # One entry per objective: (metric, limit in ms, requests over it that settle it).
        self.objectives = [
            (o.metric, o.limit_ms, n - int(o.percentile / 100 * (n - 1)))
            for o in spec.slo.objectives()
            if o.metric in (SloMetric.TTFT, SloMetric.TPOT, SloMetric.E2E)
        ]
        self.late = [0] * len(self.objectives)  # requests known to exceed each objective
        self.on_first = [(i, o[1]) for i, o in enumerate(self.objectives) if o[0] is SloMetric.TTFT]
        self.on_tpot = [(i, o[1]) for i, o in enumerate(self.objectives) if o[0] is SloMetric.TPOT]
        self.on_e2e = [(i, o[1]) for i, o in enumerate(self.objectives) if o[0] is SloMetric.E2E]
        self.steps = 0
        engine.step = self.step  # type: ignore[method-assign]

    def step(self, now_s: float) -> StepResult:
        result = self.inner(now_s)
        ms = 1000.0
        late = self.late
        for event in result.events:
            r = event.request
            # The event that carries a request's first token (once: token times only grow).
            if self.on_first and event.token_id is not None and len(r.token_times_s) == 1:
                assert r.first_token_s is not None
                value = (r.first_token_s - r.arrival_s) * ms
                for i, limit_ms in self.on_first:
                    late[i] += value > limit_ms
            if event.finished:
                assert r.finish_s is not None
                for i, limit_ms in self.on_e2e:
                    late[i] += (r.finish_s - r.arrival_s) * ms > limit_ms
                times = r.token_times_s
                if self.on_tpot and len(times) > 1:
                    value = (times[-1] - times[0]) / (len(times) - 1) * ms
                    for i, limit_ms in self.on_tpot:
                        late[i] += value > limit_ms
        self.steps += 1
        if self.steps % self.CHECK_EVERY == 0:
            self._check(now_s + result.duration_s)
        return result

    def _check(self, now_s: float) -> None:
        ms = 1000.0
        for (metric, limit_ms, need), late in zip(self.objectives, self.late, strict=True):
            if late < need and metric is not SloMetric.TPOT:
                # Requests still without a first token (TTFT) or unfinished (E2E) past the limit.
                late += sum(
                    1
                    for r in self.engine.requests.values()
                    if (metric is SloMetric.E2E or r.first_token_s is None)
                    and (now_s - r.arrival_s) * ms > limit_ms
                )
            if late >= need:
                raise _SloBroken(f"{metric.value} objective broken by {late} requests")


@dataclass(frozen=True)
class _Verdict:
    num_blocks: int
    high_water: int
    constrained: bool
    met: bool


class _Evaluator:
    """SLO verdicts of one setting family at rungs of the ladder, reused across pool sizes."""

    def __init__(self, case: Case, window_s: float, *, early_stop: bool = True) -> None:
        self.case = case
        self.early_stop = early_stop
        self.window_s = window_s
        self.ctx = _context(case, window_s)
        self.memo: dict[tuple[str, int], list[_Verdict]] = {}
        self.simulations = 0
        self.reused = 0

    def met(self, params: ServingParams, rung: int) -> bool:
        ctx = self.ctx
        startup, engine = build_engine(ctx.model, ctx.gpu, params, ctx.version)
        assert engine is not None, startup.failure
        n = engine.config.num_gpu_blocks
        key = repr(
            (replace(engine.config, num_gpu_blocks=0, runtime_headroom_bytes=0), startup.weights_bytes,
             startup.page_size_bytes, startup.kv_cache_dtype, startup.tensor_parallel_size)
        )  # fmt: skip
        seen = self.memo.setdefault((key, rung), [])
        for v in seen:
            if v.num_blocks == n or (not v.constrained and v.high_water <= n):
                self.reused += v.num_blocks != n
                return v.met
        engine.pool = pool = _TrackingPool(n, engine.config.eviction_policy)
        load = _load(self.case, self.window_s, rung)
        if self.early_stop:
            _SloWatch(engine, load.spec, len(load.records))
        result = run(
            engine, load.records, slo=load.slo, vocab=ctx.model.vocab_size,
            max_model_len=startup.max_model_len, prompt_token_ids=load.prompt_ids,
        )  # fmt: skip
        self.simulations += 1
        verdict = _Verdict(n, pool.high_water, pool.constrained, slo_met(load.spec, result))
        seen.append(verdict)
        return verdict.met


def search_rung(met: Callable[[int], bool], start: int, step: int) -> int | None:
    """The highest rung that meets the SLO: gallop from ``start`` to a bracket, then bisect."""
    lo: int | None = None
    hi: int | None = None
    if met(start):
        lo = start
        while hi is None:
            k = lo + step
            if met(k):
                lo = k
                step *= 2
            else:
                hi = k
    else:
        hi = start
        while lo is None:
            k = max(hi - step, MIN_RUNG)
            if met(k):
                lo = k
            elif k == MIN_RUNG:
                return None
            else:
                hi = k
                step *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if met(mid):
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class _Task:
    case: Case
    window_s: float
    points: tuple[TrialParams, ...]  # one family, utilization from high to low
    start_rung: int


def _evaluate_family(task: _Task) -> list[PointResult]:
    """Goodput of each point of a family that differs only in utilization (high to low)."""
    evaluator = _Evaluator(task.case, task.window_s)
    ctx = evaluator.ctx
    out: list[PointResult] = []
    start, step = task.start_rung, GALLOP_FAR_RUNGS
    for point in task.points:
        t0 = time.process_time()
        sims, reused = evaluator.simulations, evaluator.reused
        params = point.serving(ServingParams())
        startup = plan(ctx.model, ctx.gpu, params, ctx.version)
        if not startup.fits:
            failure = startup.failure.kind.value if startup.failure is not None else "fails"
            out.append(PointResult(params=point, starts=False, failure=failure))
            continue
        rung = search_rung(functools.partial(evaluator.met, params), start, step)
        if rung is not None:
            start, step = rung, GALLOP_NEAR_RUNGS
        out.append(
            PointResult(
                params=point,
                starts=True,
                num_gpu_blocks=startup.num_gpu_blocks,
                rung=rung,
                goodput_per_s=rung_rate(rung) if rung is not None else 0.0,
                simulations=evaluator.simulations - sims,
                reused=evaluator.reused - reused,
                cpu_s=time.process_time() - t0,
            )
        )
    return out


# -- the landscape ------------------------------------------------------------------------


PointKey = tuple[float, int | None, int | None, str, int | None]


def point_key(p: TrialParams) -> PointKey:
    util = round(p.gpu_memory_utilization, 4) if p.gpu_memory_utilization is not None else -1.0
    return (util, p.max_num_seqs, p.block_size, p.kv_cache_dtype, p.max_num_batched_tokens)


def families(points: Iterable[TrialParams]) -> list[tuple[TrialParams, ...]]:
    """Points grouped by everything but utilization, each group from high to low utilization."""
    groups: dict[tuple[object, ...], list[TrialParams]] = {}
    for p in points:
        groups.setdefault(point_key(p)[1:], []).append(p)
    return [
        tuple(sorted(g, key=lambda p: -(p.gpu_memory_utilization or 0.0))) for g in groups.values()
    ]


def make_space(case: Case, quick: bool) -> SearchSpace:
    ctx = _context(case, case.window(quick))
    overrides = {knob: parse_range(knob, text) for knob, text in case.grid_of(quick)}
    return build_space(
        model=ctx.model, gpu=ctx.gpu, version=ctx.version, accepted_flags=None, overrides=overrides
    )


def snap(space: SearchSpace, point: TrialParams) -> TrialParams:
    """The nearest grid point (log scale for log ranges)."""
    update: dict[str, object] = {}
    for r in space.ranges:
        value = getattr(point, r.knob.field)
        if r.choices is not None:
            continue
        values = r.values()
        if r.log:
            best = min(values, key=lambda v: abs(math.log(float(v)) - math.log(float(value))))
        else:
            best = min(values, key=lambda v: abs(float(v) - float(value)))
        update[r.knob.field] = best
    return point.model_copy(update=update)


def autotune_utilization(
    case: Case, quick: bool, seqs: int, batched: int
) -> tuple[float | None, int]:
    """auto_tune.sh's first phase: 0.98 stepped down by 0.01 (not below 0.9) until vLLM starts."""
    ctx = _context(case, case.window(quick))
    launches = 0
    for step in range(9):  # 0.98 .. 0.90
        util = round(0.98 - 0.01 * step, 2)
        launches += 1
        params = ServingParams(
            gpu_memory_utilization=util, max_num_seqs=seqs, max_num_batched_tokens=batched
        )
        if plan(ctx.model, ctx.gpu, params, ctx.version).fits:
            return util, launches
    return None, launches


def autotune_lists(
    case: Case, space: SearchSpace, quick: bool
) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    lists: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
        "default lists": AUTOTUNE_DEFAULT_LISTS
    }
    if not quick:
        seqs_range = space.range_of(Knob.MAX_NUM_SEQS)
        assert seqs_range is not None
        seqs = tuple(int(v) for v in seqs_range.values())
        lists["wide lists"] = (seqs, case.autotune_wide_batched)
    return lists


def fingerprint(case: Case, quick: bool, space: SearchSpace) -> str:
    h = hashlib.sha256()
    # The search's own parameters too: where the SLO verdict is not monotone in the rate,
    # the rung a search lands on depends on the rungs it tried.
    search = (RATE_STEP, MIN_RATE_PER_S, GALLOP_NEAR_RUNGS, GALLOP_FAR_RUNGS)
    h.update(repr((CACHE_FORMAT, case, quick, search)).encode())
    h.update(repr((space.describe(), AUTOTUNE_DEFAULT_LISTS)).encode())
    for name in SOURCES:
        h.update((ROOT / name).read_bytes())
    ctx = _context(case, case.window(quick))
    h.update(ctx.spec.model_dump_json().encode())
    return h.hexdigest()[:16]


def check_against_predict(
    case: Case, quick: bool, point: TrialParams, rungs: Iterable[int]
) -> None:
    """This script's runs (early stop included) give ``predict``'s verdicts."""
    ctx = _context(case, case.window(quick))
    params = point.serving(ServingParams())
    evaluator = _Evaluator(case, case.window(quick))
    setup = Setup(ctx.model, ctx.gpu, ctx.version, params)
    for rung in rungs:
        theirs = predict(setup, ctx.spec, rung_rate(rung)).met
        if evaluator.met(params, rung) != theirs:
            sys.exit(
                f"the benchmark's run disagrees with tuner.twin.prediction at {point.short()}, "
                f"rate {rung_rate(rung):.2f}/s"
            )


def compute_landscape(case: Case, quick: bool, jobs: int, log: Callable[[str], None]) -> Landscape:
    space = make_space(case, quick)
    stamp = fingerprint(case, quick, space)  # the sources as the runs read them
    ctx = _context(case, case.window(quick))
    window = case.window(quick)
    grid = space.grid()
    defaults = snap(space, space_defaults(space, ctx.version, ctx.gpu))
    t0 = time.perf_counter()

    # The defaults' family first, from the workload's own rate; its goodput warm-starts the rest.
    fams = families(grid)
    first = next(f for f in fams if any(point_key(p) == point_key(defaults) for p in f))
    start = rate_rung(ctx.spec.mean_rate_per_s or 1.0)
    results = _evaluate_family(_Task(case, window, first, start))
    done = {point_key(p.params): p for p in results}
    found = [p.rung for p in results if p.rung is not None]
    start = max(found) if found else start
    check_against_predict(case, quick, defaults, (start, start + 1, start + 12))
    log(
        f"  defaults' family done ({time.perf_counter() - t0:.0f} s); warm start {rung_rate(start):.2f}/s"
    )

    tasks = [_Task(case, window, f, start) for f in fams if f is not first]
    lists = autotune_lists(case, space, quick)
    autotune_utils: dict[str, tuple[float | None, int]] = {}
    autotune_points: dict[str, list[TrialParams]] = {}
    for name, (seqs_list, batched_list) in lists.items():
        u, n = autotune_utilization(case, quick, seqs_list[-1], batched_list[-1])
        autotune_utils[name] = (u, n)
        autotune_points[name] = [
            TrialParams(gpu_memory_utilization=u, max_num_seqs=s, max_num_batched_tokens=b)
            for s in seqs_list
            for b in batched_list
            if u is not None
        ]
    extra = {point_key(p): p for pts in autotune_points.values() for p in pts}
    tasks += [_Task(case, window, f, start) for f in families(extra.values())]

    evaluated: list[PointResult] = list(results)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(_evaluate_family, task) for task in tasks]
        for i, future in enumerate(as_completed(futures), 1):
            evaluated.extend(future.result())  # kept by point, so the order does not matter
            if i % max(1, len(tasks) // 10) == 0 or i == len(tasks):
                log(f"  {i}/{len(tasks)} families ({time.perf_counter() - t0:.0f} s)")
    cpu = sum(p.cpu_s for p in evaluated)
    done = {point_key(p.params): p for p in evaluated}
    return Landscape(
        fingerprint=stamp,
        case=case.name,
        quick=quick,
        window_s=window,
        grid=space.describe(),
        left_out=[f"{o.knob.flag}: {o.reason}" for o in space.left_out],
        grid_size=len(grid),
        points=[done[point_key(p)] for p in grid],
        autotune={
            name: AutotuneRun(
                num_seqs_list=list(lists[name][0]),
                num_batched_tokens_list=list(lists[name][1]),
                utilization=autotune_utils[name][0],
                utilization_launches=autotune_utils[name][1],
                points=[done[point_key(p)] for p in pts],
            )
            for name, pts in autotune_points.items()
        },
        wall_s=time.perf_counter() - t0,
        cpu_s=cpu,
        jobs=jobs,
    )


def landscape_for(
    case: Case,
    quick: bool,
    jobs: int,
    *,
    recompute: bool,
    accept_stale: bool,
    log: Callable[[str], None],
) -> tuple[Landscape, str]:
    """The cached landscape when it is current (or stale but accepted), else a new one."""
    space = make_space(case, quick)
    path = RESULTS / f"search_efficiency_{case.name}{'_quick' if quick else ''}.json"
    want = fingerprint(case, quick, space)
    if path.exists() and not recompute:
        text = path.read_text()
        stamp = json.loads(text).get("fingerprint")
        if stamp == want:
            return Landscape.model_validate_json(text), f"read from {path.relative_to(ROOT)}"
        if accept_stale:
            try:
                landscape = Landscape.model_validate_json(text)
            except ValueError:
                log(f"  cache {path.relative_to(ROOT)} is of an older format; recomputing")
            else:
                log(
                    f"  cache {path.relative_to(ROOT)} is STALE (the simulator changed); used anyway"
                )
                return (
                    landscape,
                    f"read from {path.relative_to(ROOT)}, STALE: simulator changed since",
                )
        else:
            log(f"  cache {path.relative_to(ROOT)} is stale (the simulator or the grid changed)")
    log(f"  computing the landscape of {case.name} ({jobs} job{'s' if jobs > 1 else ''})")
    landscape = compute_landscape(case, quick, jobs, log)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(landscape.model_dump_json(indent=1))
    return landscape, f"computed now, cached in {path.relative_to(ROOT)}"


# -- the replays --------------------------------------------------------------------------


@dataclass(frozen=True)
class Replay:
    method: str
    trials_to_target: list[int | None]  # per seed (one entry for deterministic methods)
    best_found: list[float]  # per seed, at the method's budget
    trials_run: int
    note: str = ""


def first_reaching(values: Sequence[float], threshold: float) -> int | None:
    return next((i + 1 for i, v in enumerate(values) if v >= threshold), None)


def replay_loop(
    space: SearchSpace,
    table: dict[PointKey, PointResult],
    defaults: TrialParams,
    threshold: float,
    budget: int,
    seed: int,
    *,
    enqueue_defaults: bool = True,
) -> tuple[int | None, float]:
    """The loop's trials until within 2% of the grid's best (None: not in the whole grid's
    count of trials), and the best goodput found within ``budget`` trials."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    n_trials = len(table)
    sampler = make_sampler(Objective.GOODPUT, seed=seed, n_trials=n_trials)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    if enqueue_defaults:
        study.enqueue_trial(space.to_optuna(defaults))
    values: list[float] = []
    reached: int | None = None
    for i in range(1, n_trials + 1):
        trial = study.ask()
        result = table[point_key(snap(space, space.suggest(trial)))]
        trial.set_constraint("starts", 0.0 if result.starts else 1.0)
        trial.set_constraint("survives", 0.0)
        trial.set_constraint("slo", 0.0 if result.goodput_per_s > 0 else 1.0)
        study.tell(trial, result.goodput_per_s)
        values.append(result.goodput_per_s)
        if reached is None and result.goodput_per_s >= threshold:
            reached = i
        if reached is not None and i >= budget:
            break
    return reached, max(values[:budget])


def replays(landscape: Landscape, case: Case) -> tuple[list[Replay], float, PointResult]:
    quick = landscape.quick
    space = make_space(case, quick)
    ctx = _context(case, case.window(quick))
    table = {point_key(p.params): p for p in landscape.points}
    best = max(landscape.points, key=lambda p: p.goodput_per_s)
    threshold = best.goodput_per_s * (1 - WITHIN) - 1e-9
    size = landscape.grid_size
    budget = math.ceil(TARGET_SHARE * size)
    defaults = snap(space, space_defaults(space, ctx.version, ctx.gpu))
    out: list[Replay] = []

    loop = [replay_loop(space, table, defaults, threshold, budget, s) for s in SEEDS]
    out.append(
        Replay(
            "tuning loop (TPE, defaults first)",
            [r for r, _ in loop],
            [b for _, b in loop],
            budget,
            f"best found: median over seeds at {budget} trials ({TARGET_SHARE:.0%})",
        )
    )
    bare = [
        replay_loop(space, table, defaults, threshold, budget, s, enqueue_defaults=False)
        for s in SEEDS
    ]
    out.append(
        Replay(
            "tuning loop, defaults not enqueued",
            [r for r, _ in bare],
            [b for _, b in bare],
            budget,
            "the sampler alone, to show the search apart from the head start",
        )
    )

    values = [p.goodput_per_s for p in landscape.points]
    out.append(
        Replay("grid, fixed order", [first_reaching(values, threshold)], [max(values)], size)
    )
    good = sum(v >= threshold for v in values)
    shuffled: list[int | None] = []
    for s in SEEDS:
        order = list(range(size))
        random.Random(s).shuffle(order)
        shuffled.append(first_reaching([values[i] for i in order], threshold))
    out.append(
        Replay(
            "grid, random order",
            shuffled,
            [max(values)],
            size,
            f"expected (G+1)/(M+1) = {(size + 1) / (good + 1):.1f} for M={good} of G={size}",
        )
    )

    for name, at in landscape.autotune.items():
        launches = at.utilization_launches
        lists = f"{' '.join(map(str, at.num_seqs_list))} x {' '.join(map(str, at.num_batched_tokens_list))}"
        if at.utilization is None:
            note = f"{lists}: nothing starts at 0.90 or above ({launches} launches); it exits"
            out.append(Replay(f"auto_tune.sh ({name})", [None], [0.0], launches, note))
            continue
        # Its utilization launches measure nothing; then one trial per pair of its lists.
        seq = [0.0] * launches + [p.goodput_per_s for p in at.points]
        own = max(seq)
        own_at = first_reaching(seq, own * (1 - WITHIN) - 1e-9)
        out.append(
            Replay(
                f"auto_tune.sh ({name})",
                [first_reaching(seq, threshold)],
                [own],
                len(seq),
                f"{lists}; util {at.utilization:.2f} after {launches} launch"
                f"{'es' if launches > 1 else ''}; within 2% of its own best after {own_at} "
                f"of its {len(seq)} trials",
            )
        )
    return out, best.goodput_per_s, best


# -- output -------------------------------------------------------------------------------


def _median_trials(values: list[int | None], size: int) -> tuple[float | None, str]:
    """Median with 'not reached' counted as more than the grid; and the range over seeds."""
    keyed = [v if v is not None else size + 1 for v in values]
    med = statistics.median(keyed)
    if len(values) == 1:
        return (None if values[0] is None else med), ""
    lo, hi = min(keyed), max(keyed)
    span = f" [{lo}-{hi if hi <= size else 'never'}]"
    return (None if med > size else med), span


def print_case(case: Case, landscape: Landscape, source: str) -> None:
    rows, best, best_point = replays(landscape, case)
    size = landscape.grid_size
    points = landscape.points
    ctx = _context(case, landscape.window_s)
    space = make_space(case, landscape.quick)
    defaults = snap(space, space_defaults(space, ctx.version, ctx.gpu))
    default_result = next(p for p in points if point_key(p.params) == point_key(defaults))
    good = sum(p.goodput_per_s >= best * (1 - WITHIN) - 1e-9 for p in points)
    unit = "conversations/s" if ctx.spec.sessions is not None else "req/s"
    sims = sum(p.simulations for p in points) + sum(
        p.simulations for at in landscape.autotune.values() for p in at.points
    )
    reused = sum(p.reused for p in points)

    print(
        f"\n== {case.name}: {case.model} on {case.gpu}, workload {case.workload!r}, vLLM {ctx.version}"
    )
    print(f"grid ({size} points): " + "; ".join(" ".join(line.split()) for line in landscape.grid))
    for line in landscape.left_out:
        print(f"  left out {line}")
    print(
        f"goodput: highest arrival rate ({unit}) meeting the SLO in a {landscape.window_s:g} s "
        f"simulated window, rates {RATE_STEP - 1:.0%} apart"
    )
    print(
        f"landscape: {sims} simulated runs ({reused} verdicts reused across utilizations), "
        f"{landscape.cpu_s:.0f} s CPU, {landscape.wall_s:.0f} s wall with {landscape.jobs} job(s)"
        + f" ({source})"
    )
    print(
        f"grid best {best:.2f} at {best_point.params.short()}; {good} point(s) within 2%; "
        f"vLLM defaults ({defaults.short()}) {default_result.goodput_per_s:.2f} "
        f"({default_result.goodput_per_s / best:.0%} of best); "
        f"{sum(not p.starts for p in points)} point(s) do not start, "
        f"{sum(p.starts and p.goodput_per_s == 0 for p in points)} meet the SLO at no rate"
    )
    _print_matrix(landscape, best_point)
    header = f"{'method':<34} {'trials to within 2%':>24} {'share of grid':>14} {'best found':>11}"
    print()
    print(header)
    print("-" * len(header))
    for r in rows:
        med, span = _median_trials(r.trials_to_target, size)
        trials = "never" if med is None else f"{med:g}"
        share = "-" if med is None else f"{med / size:.1%}"
        found = statistics.median(r.best_found)
        print(f"{r.method:<34} {trials + span:>24} {share:>14} {found:>7.2f} {found / best:>4.0%}")
        if r.note:
            print(f"{'':<36}{r.note}")
    loop = rows[0]
    med, _ = _median_trials(loop.trials_to_target, size)
    verdict = med is not None and med < TARGET_SHARE * size
    print(
        f"target (loop under {TARGET_SHARE:.0%} of the grid's {size} trials): "
        + ("met" if verdict else "NOT met")
        + ("" if med is None else f" ({med:g} trials, {med / size:.1%})")
    )


def _print_matrix(landscape: Landscape, best: PointResult) -> None:
    """Goodput over max-num-seqs x (max-num-batched-tokens if searched, else utilization),
    the other knobs held at the best point's values; then the best per value of each knob."""
    points = landscape.points
    fields = [f for f in TrialParams.model_fields if getattr(best.params, f) is not None]
    by_field = {f: sorted({getattr(p.params, f) for p in points}) for f in fields}
    rows_f = "max_num_seqs"
    cols_f = (
        "max_num_batched_tokens" if "max_num_batched_tokens" in fields else "gpu_memory_utilization"
    )
    held = [f for f in fields if f not in (rows_f, cols_f) and len(by_field[f]) > 1]
    sel = [p for p in points if all(getattr(p.params, f) == getattr(best.params, f) for f in held)]
    cell = {(getattr(p.params, rows_f), getattr(p.params, cols_f)): p for p in sel}
    fixed = ", ".join(f"{f.replace('_', '-')} {getattr(best.params, f)}" for f in held)
    print(
        f"goodput by {rows_f.replace('_', '-')} (rows) and {cols_f.replace('_', '-')} (columns); {fixed}:"
    )
    print("      " + "".join(f"{c:>8g}" for c in by_field[cols_f]))
    for r in by_field[rows_f]:
        row = [cell.get((r, c)) for c in by_field[cols_f]]
        print(
            f"{r:>6}"
            + "".join(
                f"{'--':>8}" if p is None or not p.starts else f"{p.goodput_per_s:>8.2f}"
                for p in row
            )
        )
    parts = []
    for f in fields:
        if len(by_field[f]) < 2:
            continue
        best_of = {
            v: max(p.goodput_per_s for p in points if getattr(p.params, f) == v)
            for v in by_field[f]
        }
        values = " ".join(
            f"{v:g}:{g:.2f}" if not isinstance(v, str) else f"{v}:{g:.2f}"
            for v, g in best_of.items()
        )
        parts.append(f"  {f.replace('_', '-')}: {values}")
    print("best goodput for each value of a knob (the others free):")
    print("\n".join(parts))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller grid and shorter windows")
    parser.add_argument(
        "--case", action="append", choices=sorted(CASES), help=f"default: {' '.join(DEFAULT_CASES)}"
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="processes for the landscape"
    )
    parser.add_argument("--recompute", action="store_true", help="ignore a cached landscape")
    parser.add_argument(
        "--accept-stale",
        action="store_true",
        help="use a cached landscape even if the simulator's sources changed since",
    )
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    for name in args.case or DEFAULT_CASES:
        case = CASES[name]
        landscape, source = landscape_for(
            case, args.quick, max(1, args.jobs), recompute=args.recompute,
            accept_stale=args.accept_stale, log=log,
        )  # fmt: skip
        print_case(case, landscape, source)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

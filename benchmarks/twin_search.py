"""Search efficiency of the twin-guided search on simulated landscapes whose engine the
twin has not seen (issue 17).

Each case hides step costs from the twin (``TimingFactors``: MFU, MBU and the
overhead per step up to 30 % off the paper's). Its "measured" landscape is every
setting of the grid screened on the simulated engine with the hidden costs, each
setting by its own rate search (no setting inferred). The twin sees only its own
paper factors and what the launches measure. Replayed on that landscape, each
method's launches until one comes within 2 % of the grid's best goodput:

* twin-guided, as the tune does it (``tuner.twin.screen``): vLLM's defaults
  first; then the twin's landscape (screened with its own factors, utilizations
  between computed ones bounded) hands its best untried settings, one per group, each
  screened again with the factors fitted so far, and the best is launched while the
  twin puts it above the best measured; after each launch the twin's factors are
  fitted (``tuner.twin.fit.fit``) to a level simulated with the hidden costs at
  the launched setting's goodput (pooled with the latest two launches' levels, as the
  tune pools). When the twin has nothing better, TPE goes on from those trials (seeded);
* the same without the fits (the landscape's order alone);
* TPE alone (the tune's sampler, vLLM's defaults enqueued first), seeded;
* the grid in random order, seeded;
* vLLM's ``auto_tune.sh``: ``--gpu-memory-utilization`` stepped down from 0.98 by 0.01
  until the server starts (each a launch), then one launch per max-num-seqs of its
  default list (128, 256) with vLLM's default block size and KV dtype (its
  max-num-batched-tokens list is not in this space); its utilization is evaluated at
  the grid's nearest.

Target: the twin-guided search needs at most a third of TPE's launches (median over
seeds). The landscapes are cached in benchmarks/results/ (git-ignored).

Run: ``python benchmarks/twin_search.py [--quick] [--case NAME ...] [--seeds N]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import TypeAdapter

from tuner.run.config import Objective, TuneConfig
from tuner.run.goodput import GoodputUnit
from tuner.search.context import TuneContext, resolve
from tuner.search.sampling import make_sampler
from tuner.serving.level_schedule import drain_s, level_workload
from tuner.sim.timing import TimingFactors
from tuner.twin.fit import MAX_LEVELS, MeasuredLevel, fit
from tuner.twin.landscape import (
    Landscape,
    ScreenedPoint,
    ScreenJob,
    candidates,
    groups_of,
    screen,
    screen_setting,
)
from tuner.twin.prediction import Setup, simulate_schedule
from tuner.twin.screen import RERANK, screen_job
from tuner.vllm.space import Knob, SearchSpace, TrialParams, clamp, vllm_defaults
from workloads.build import build_schedule

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
CPU_FIXTURE = REPO / "benchmarks" / "fixtures" / "cpu-landscape.json"
CPU_GRID = {"max-num-seqs": "2..12/2", "block-size": "32,64"}  # as benchmarks/cpu_landscape.py
WITHIN = 0.02
PAPER = TimingFactors()
CASES = {
    "as-modelled": PAPER,
    "slower-30": PAPER.model_copy(
        update={
            "mfu": PAPER.mfu * 0.7,
            "mbu": PAPER.mbu * 0.7,
            "step_overhead_s": PAPER.step_overhead_s * 1.3,
        }
    ),
    "faster-30": PAPER.model_copy(
        update={
            "mfu": min(1.0, PAPER.mfu * 1.3),
            "mbu": min(1.0, PAPER.mbu * 1.2),
            "step_overhead_s": PAPER.step_overhead_s * 0.7,
        }
    ),
    "mixed-30": PAPER.model_copy(
        update={
            "mfu": PAPER.mfu * 0.7,
            "mbu": min(1.0, PAPER.mbu * 1.2),
            "step_overhead_s": PAPER.step_overhead_s * 1.3,
        }
    ),
}
GRID = {  # chat, llama-3.1-8b on an H100 (make tune's default), utilization every 0.03
    "gpu-memory-utilization": "0.8..0.95/0.03",
    "max-num-seqs": "16..1024",
    "block-size": "16,32",
    "kv-cache-dtype": "auto,fp8",
}
QUICK_GRID = {
    "gpu-memory-utilization": "0.8,0.9",
    "max-num-seqs": "32..512",
    "block-size": "16",
    "kv-cache-dtype": "auto,fp8",
}
AUTOTUNE_SEQS = (128, 256)


def context(quick: bool) -> TuneContext:
    return resolve(
        TuneConfig(model="llama-3.1-8b", gpu="H100-80GB", workload="chat",
                   space=QUICK_GRID if quick else GRID, run_dir=RESULTS / "twin-search-run",
                   dry_run=True)
    )  # fmt: skip


# -- the measured landscape: every setting computed with the hidden costs ---------------


def _truth_groups(args: tuple[ScreenJob, list[list[TrialParams]]]) -> list[ScreenedPoint]:
    job, groups = args
    out: list[ScreenedPoint] = []
    hint = 0
    for group in groups:
        for params in reversed(group):  # highest utilization first, each from the last rung
            point = screen_setting(job, params, hint)
            if point.rate_per_s > 0:
                hint = job.rung_of(point.rate_per_s)
            out.append(point)
    return out


def truth(job: ScreenJob, space: SearchSpace, jobs: int) -> dict[str, float]:
    groups = groups_of(space)
    chunks = [groups[i::jobs] for i in range(jobs)]
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        points = [p for out in pool.map(_truth_groups, [(job, c) for c in chunks]) for p in out]
    return {p.params.model_dump_json(): p.rate_per_s for p in points}


def cached(name: str, key: str, compute: object) -> object:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"twin-search-{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.json"
    if path.is_file():
        return json.loads(path.read_text())
    value = compute() if callable(compute) else compute
    path.write_text(json.dumps(value))
    return value


# -- the methods ---------------------------------------------------------------------------


def first_reaching(values: Sequence[float], threshold: float) -> int | None:
    return next((i + 1 for i, v in enumerate(values) if v >= threshold), None)


def snap(space: SearchSpace, point: TrialParams) -> TrialParams:
    update: dict[str, object] = {}
    for r in space.ranges:
        if r.choices is not None:
            continue
        value = float(getattr(point, r.knob.field))
        values = r.values()
        if r.log:
            best = min(values, key=lambda v: abs(math.log(float(v)) - math.log(value)))
        else:
            best = min(values, key=lambda v: abs(float(v) - value))
        update[r.knob.field] = best
    return point.model_copy(update=update)


def tpe_launches(
    space: SearchSpace, table: dict[str, float], history: list[TrialParams], seed: int, limit: int
) -> list[float]:
    """TPE's values, going on from ``history`` (its trials so far), ``limit`` launches in all."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        direction="maximize",
        sampler=make_sampler(Objective.GOODPUT, seed=seed, n_trials=len(table)),
    )
    values: list[float] = []
    for params in history:
        study.enqueue_trial(space.to_optuna(params))
    while len(values) < limit:
        trial = study.ask()
        params = snap(space, space.suggest(trial))
        value = table[params.model_dump_json()]
        trial.set_constraint("starts", 0.0)
        trial.set_constraint("survives", 0.0)
        trial.set_constraint("slo", 0.0 if value > 0 else 1.0)
        study.tell(trial, value)
        values.append(value)
    return values


def measured_level(
    job: ScreenJob, hidden: TimingFactors, params: TrialParams, rate: float, name: str
) -> MeasuredLevel | None:
    """A level at ``rate`` on the engine with the hidden costs, as a tune measures it."""
    spec = job.workload
    level = level_workload(
        spec, rate, job.warmup_s + job.window_s, window=(job.warmup_s, job.window_s)
    )
    schedule = build_schedule(level)
    setup = Setup(job.model, job.gpu, job.version, params.serving(job.base), timing=hidden)
    _, result = simulate_schedule(
        setup, schedule, level.slo, stop_at_s=job.warmup_s + job.window_s + drain_s(level),
        measure_from_s=job.warmup_s, measure_to_s=job.warmup_s + job.window_s,
    )  # fmt: skip
    if result is None or not result.ttft_ms.count:
        return None
    return MeasuredLevel(
        name=name, schedule=schedule, opened_at_s=job.warmup_s, window_s=job.window_s,
        measured={"ttft_ms": result.ttft_ms, "tpot_ms": result.tpot_ms},
        params=params.serving(job.base),
    )  # fmt: skip


@dataclass
class TwinRun:
    launched: list[TrialParams]
    values: list[float]
    handed_over: int  # launches when the twin had nothing better
    factors: TimingFactors
    fit_s: float


Measure = Callable[[TrialParams, float, str], "MeasuredLevel | None"]


def twin_guided(
    job: ScreenJob, landscape: Landscape, table: dict[str, float], defaults: TrialParams,
    measure: Measure | None, limit: int,
) -> TwinRun:  # fmt: skip
    """The tune's twin-guided launches until the twin has nothing better. ``measure``
    gives the level a launch measured at its goodput (the one its factors are fitted
    to); None: no fits, the landscape's own factors throughout."""
    factors = landscape.factors
    launched = [defaults]
    values = [table[defaults.model_dump_json()]]
    levels: list[MeasuredLevel] = []
    fit_s = 0.0
    while len(launched) < limit:
        if measure is not None:
            began = time.monotonic()
            last = launched[-1]
            level = measure(last, values[-1], f"launch {len(launched)}")
            if level is not None:
                levels = [*levels, level][-MAX_LEVELS:]
                setup = Setup(
                    job.model, job.gpu, job.version, last.serving(job.base), timing=factors
                )
                factors = fit(setup, levels).after
            fit_s += time.monotonic() - began
        now = replace(job, factors=factors)

        def predict(params: TrialParams, now: ScreenJob = now) -> float:
            point = landscape.point(params)
            hint = now.rung_of(point.rate_per_s) if point is not None and point.rate_per_s else 0
            return screen_setting(now, params, hint).rate_per_s

        picks = candidates(landscape, launched, count=RERANK)
        scored = [(predict(p.params), p.params) for p in picks]
        scored = [s for s in scored if s[0] > 0]
        if not scored:
            break
        rate, pick = max(scored, key=lambda s: s[0])
        best = launched[max(range(len(values)), key=values.__getitem__)]
        if rate <= predict(best):
            break
        launched.append(pick)
        values.append(table[pick.model_dump_json()])
    return TwinRun(launched, values, len(launched), factors, fit_s)


def autotune(ctx: TuneContext, space: SearchSpace, table: dict[str, float]) -> list[float]:
    from tuner.vllm.memory import plan

    values: list[float] = []
    util: float | None = None
    for step in range(9):
        u = round(0.98 - 0.01 * step, 2)
        values.append(0.0)  # a launch that measures nothing
        if space.range_of(Knob.GPU_MEMORY_UTILIZATION) is None:
            break  # vLLM's CPU build: no device memory to step down; the first launch starts
        params = TrialParams(
            gpu_memory_utilization=u, max_num_seqs=max(AUTOTUNE_SEQS), block_size=16
        )
        if plan(ctx.model, ctx.gpu_or_default, params.serving(ctx.base), ctx.version).fits:
            util = u
            break
    else:
        return values
    for seqs in AUTOTUNE_SEQS:
        point = snap(
            space, TrialParams(gpu_memory_utilization=util, max_num_seqs=seqs, block_size=16)
        )
        # Only the space's knobs; vLLM's default block size where the space has it, else
        # its first (as vLLM's defaults are placed in the space).
        point = space.from_optuna(
            {r.knob.value: clamp(r, getattr(point, r.knob.field)) for r in space.ranges}
        )
        values.append(table.get(point.model_dump_json(), 0.0))
    return values


def median_launches(values: list[int | None], size: int) -> str:
    keyed = sorted(v if v is not None else size + 1 for v in values)
    med = statistics.median(keyed)
    text = f"{med:g}" if med <= size else f">{size}"
    if len(keyed) > 1:
        lo, hi = keyed[0], keyed[-1]
        text += (
            f" ({lo if lo <= size else '>' + str(size)}-{hi if hi <= size else '>' + str(size)})"
        )
    return text


@dataclass
class Case:
    """A landscape to search: its settings' goodput (the truth), the twin's screen of it,
    and how a launch of a setting measures (for the twin's fits)."""

    name: str
    heading: str
    ctx: TuneContext
    job: ScreenJob  # the twin's, with its own factors
    landscape: Landscape
    table: dict[str, float]
    measure: Measure
    truth_s: float
    screen_s: float


def simulated_case(name: str, hidden: TimingFactors, quick: bool, jobs: int) -> Case:
    ctx = context(quick)
    space = ctx.space
    base = 6.0  # rung 0 of the ladder: about the defaults' goodput
    job = screen_job(ctx, PAPER, base)
    assert job is not None
    grid = QUICK_GRID if quick else GRID
    key = json.dumps([name, hidden.model_dump(mode="json"), grid, quick])
    hidden_job = replace(job, factors=hidden)
    began = time.monotonic()
    table: dict[str, float] = cached(f"truth-{name}", key, lambda: truth(hidden_job, space, jobs))  # type: ignore[assignment]
    truth_s = time.monotonic() - began
    began = time.monotonic()
    landscape = Landscape.model_validate(
        cached(
            "twin",
            json.dumps([grid, quick]),
            lambda: screen(job, space, jobs=jobs).model_dump(mode="json"),
        )
    )
    screen_s = time.monotonic() - began

    def measure(params: TrialParams, rate: float, name: str) -> MeasuredLevel | None:
        return measured_level(job, hidden, params, rate, name)

    heading = f"hidden step costs {hidden.model_copy(update={'source': 'hidden'}).describe()}"
    return Case(name, heading, ctx, job, landscape, table, measure, truth_s, screen_s)


def cpu_case(jobs: int) -> Case:
    """The landscape measured on vLLM's CPU build (``benchmarks/cpu_landscape.py``): the
    twin runs on the CPU profile it has no rates for, and fits its step costs to the
    levels each launch measured there."""
    fixture = json.loads(CPU_FIXTURE.read_text())
    RESULTS.mkdir(parents=True, exist_ok=True)
    workload = RESULTS / "cpu-landscape-workload.yaml"
    workload.write_text(fixture["workload"])
    # The model and launch command the landscape was measured with.
    from cpu_landscape import MODEL, VLLM_CMD, ensure_model  # a sibling script

    ensure_model()
    ctx = resolve(
        TuneConfig(
            model=str(MODEL), backend="vllm", workload=str(workload), vllm_cmd=VLLM_CMD,
            max_model_len=fixture["max_model_len"],
            kv_cache_memory_bytes=fixture["kv_cache_memory_bytes"], space=CPU_GRID,
            level_duration_s=fixture["level_duration_s"], level_warmup_s=fixture["level_warmup_s"],
            run_dir=RESULTS / "cpu-landscape-run", dry_run=True,
        )
    )  # fmt: skip
    assert ctx.workload.mean_rate_per_s is not None and ctx.twin is not None
    job = screen_job(ctx, TimingFactors(), ctx.workload.mean_rate_per_s)
    assert job is not None
    space = ctx.space
    table: dict[str, float] = {}
    held: dict[str, MeasuredLevel] = {}
    for point in fixture["points"]:
        params = space.from_optuna(
            {"max-num-seqs": point["max_num_seqs"], "block-size": point["block_size"]}
        )
        key = params.model_dump_json()
        table[key] = point["goodput_per_s"]
        if point["held_levels"]:  # the busiest held level: the one a fit replays first
            level = TypeAdapter(MeasuredLevel).validate_python(point["held_levels"][-1]["level"])
            held[key] = replace(level, params=params.serving(ctx.twin[1]))
    missing = [p.short() for g in groups_of(space) for p in g if p.model_dump_json() not in table]
    if missing:
        raise SystemExit(f"the fixture lacks {', '.join(missing)}: run benchmarks/cpu_landscape.py")
    began = time.monotonic()
    landscape = screen(job, space, jobs=jobs)
    screen_s = time.monotonic() - began

    def measure(params: TrialParams, rate: float, name: str) -> MeasuredLevel | None:
        return held.get(params.model_dump_json())

    heading = (f"measured on vLLM's CPU build ({fixture['measured_at']}, "
               f"benchmarks/fixtures/{CPU_FIXTURE.name}); the twin starts from a generic CPU's paper costs")  # fmt: skip
    return Case("cpu-build", heading, ctx, job, landscape, table, measure, 0.0, screen_s)


def run_case(case: Case, seeds: int) -> dict[str, object]:
    ctx, job, landscape, table = case.ctx, case.job, case.landscape, case.table
    space = ctx.space
    defaults = vllm_defaults(space, ctx.version, ctx.twin[0] if ctx.twin else ctx.gpu_or_default)
    size = len(table)
    best = max(table.values())
    threshold = best * (1 - WITHIN) - 1e-9
    rows: dict[str, list[int | None]] = {}

    learned = twin_guided(job, landscape, table, defaults, case.measure, size)
    plain = twin_guided(job, landscape, table, defaults, None, size)
    for label, run in (("twin-guided, learning", learned), ("twin-guided, no fits", plain)):
        reached = first_reaching(run.values, threshold)
        out: list[int | None] = []
        for s in range(seeds):
            if reached is not None:
                out.append(reached)
                continue
            more = tpe_launches(space, table, run.launched, s, size)
            out.append(first_reaching(more, threshold))
        rows[label] = out
    rows["TPE alone (defaults first)"] = [
        first_reaching(tpe_launches(space, table, [defaults], s, size), threshold)
        for s in range(seeds)
    ]
    values = list(table.values())
    order_runs: list[int | None] = []
    for s in range(seeds):
        order = list(range(size))
        random.Random(s).shuffle(order)
        order_runs.append(first_reaching([values[i] for i in order], threshold))
    rows["random order"] = order_runs
    rows["auto_tune.sh (default lists)"] = [first_reaching(autotune(ctx, space, table), threshold)]

    print(f"\n== {case.name}: {case.heading} ==")
    print(f"grid {size} settings; best {best:.2f} {GoodputUnit.of(ctx.workload).label} at "
          f"{TrialParams.model_validate_json(max(table, key=table.__getitem__)).short()}; "
          f"within 2 %: {sum(v >= threshold for v in values)} settings, within 10 %: "
          f"{sum(v >= best * 0.9 for v in values)}")  # fmt: skip
    print(f"measured landscape {case.truth_s:.0f} s (cached after the first run); twin's screen "
          f"{landscape.wall_s:.0f} s, {landscape.computed} of {size} computed")  # fmt: skip
    print(f"twin learned {learned.factors.describe()} (fits {learned.fit_s:.0f} s); launched "
          + ", ".join(f"{p.short()} {v:.2f}" for p, v in zip(learned.launched, learned.values, strict=True)))  # fmt: skip
    print(f"{'method':<34} {'launches to within 2 % (median, range over seeds)':>52}")
    for label, out in rows.items():
        print(f"{label:<34} {median_launches(out, size):>52}")
    tpe = statistics.median(
        v if v is not None else size + 1 for v in rows["TPE alone (defaults first)"]
    )
    twin = statistics.median(
        v if v is not None else size + 1 for v in rows["twin-guided, learning"]
    )
    print(f"twin-guided / TPE: {twin / tpe:.2f} (target <= 0.33)")
    return {
        "case": case.name,
        "size": size,
        "rows": rows,
        "ratio": twin / tpe,
        "screen_s": case.screen_s,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 20-setting grid (a smoke run)")
    parser.add_argument(
        "--case", action="append", choices=[*sorted(CASES), "cpu-build"],
        help="default: all (cpu-build: the landscape measured on vLLM's CPU build)",
    )  # fmt: skip
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    results = [
        run_case(
            cpu_case(args.jobs) if name == "cpu-build"
            else simulated_case(name, CASES[name], args.quick, args.jobs),
            args.seeds,
        )
        for name in (args.case or [*CASES, "cpu-build"])
    ]  # fmt: skip
    ratios = [r["ratio"] for r in results]
    print(f"\ntwin-guided / TPE launches, per case: {', '.join(f'{x:.2f}' for x in ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

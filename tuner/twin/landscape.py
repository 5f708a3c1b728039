"""The twin's landscape: the steady-state goodput of every setting of the space, predicted
on the virtual clock before anything is launched.

Each setting's goodput is ``tuner.twin.prediction.steady_run``'s: the highest rate whose
run (a level's warm-up and window, the session population of that rate, the backlog
guard) holds, on a ladder of rates ``LADDER_STEP`` apart (5 %: the precision the
live search states), galloped to from a neighbour's rung and bisected. A ladder makes
two settings that behave alike land on the same rung, which is what lets the screen
skip work without guessing:

* along ``--gpu-memory-utilization`` (more KV-cache blocks, nothing else changes) the
  goodput does not fall, so where the lowest and the highest utilization of a group
  (every other knob equal) land on the same rung, every utilization between them is on
  it too (``ScreenMethod.BETWEEN``); otherwise the middle one is computed and each half
  judged the same way. ``benchmarks/twin_screen.py`` computes whole grids to check it.
* a setting whose server would not start (``tuner.vllm.memory.plan``) costs nothing.

The landscape is written to the run directory (``landscape.json``), drawn in the
report with the measured trials on it, and ranks what the tune launches
(``tuner.search.study``).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from multiprocessing.pool import AsyncResult
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tuner.errors import ConfigError
from tuner.serving.processes import set_parent_death_signal
from tuner.sim.build import offloading_options
from tuner.sim.timing import TimingFactors
from tuner.twin.prediction import Setup, answer_times_of, steady_run
from tuner.vllm.gpus import GpuSpec
from tuner.vllm.memory import ServingParams, plan
from tuner.vllm.models import ModelSpec
from tuner.vllm.space import Knob, SearchSpace, TrialParams, per_gpu
from tuner.vllm.versions import VllmVersion
from workloads.spec import WorkloadSpec
from workloads.stationary import AnswerTimes, nearest_in_rate

LADDER_STEP = 1.05  # one rung: 5 % in rate
LOWEST_RUNG = -90  # 1.05**-90: 1/80 of the first rung; below it the setting sustains nothing
MAX_RUNS = 12  # runs for one setting's rung
# Two utilizations whose rungs are at most this far apart bound the ones between them:
# a rung is the twin's own resolution (a run's population is planned with the answer
# times of the runs before it, so one setting's rung can move by one with the path).
NEIGHBOUR_RUNGS = 1


class ScreenMethod(StrEnum):
    COMPUTED = "computed"  # its own rate search on the twin
    BETWEEN = "between"  # between two computed utilizations on the same rung
    NOT_STARTING = "does-not-start"  # the memory plan refuses it: no rate


class ScreenedPoint(BaseModel):
    """One setting of the landscape."""

    model_config = ConfigDict(frozen=True)

    params: TrialParams
    rate_per_s: float  # the twin's steady-state goodput (0: none); BETWEEN: the lower bound
    method: ScreenMethod
    rate_high_per_s: float | None = None  # BETWEEN: the upper bound (its neighbours' higher)
    runs: int = 0  # twin runs its rate search made (0: not computed)
    failure: str | None = None  # why its server would not start
    ttft_ms_mean: float | None = None  # the answer times of its run at that rate
    tpot_ms_mean: float | None = None

    @property
    def answer_times(self) -> AnswerTimes | None:
        if self.ttft_ms_mean is None or self.tpot_ms_mean is None:
            return None
        return AnswerTimes.of_means(self.ttft_ms_mean, self.tpot_ms_mean)


class Landscape(BaseModel):
    """``landscape.json``: every setting of the space with the twin's goodput."""

    model_config = ConfigDict(frozen=True)

    factors: TimingFactors
    warmup_s: float
    window_s: float
    base_rate_per_s: float  # rung 0 of the ladder
    ladder_step: float = LADDER_STEP  # one rung's ratio
    wall_s: float
    points: list[ScreenedPoint]

    @property
    def computed(self) -> int:
        return sum(1 for p in self.points if p.method is ScreenMethod.COMPUTED)

    @property
    def best_rate_per_s(self) -> float:
        return max((p.rate_per_s for p in self.points), default=0.0)

    def ranked(self) -> list[ScreenedPoint]:
        """Highest goodput (per GPU where the tensor-parallel size is searched) first;
        among equals, the setting that holds least memory (lowest utilization), then the
        grid's order."""
        order = {p.params.model_dump_json(): i for i, p in enumerate(self.points)}
        return sorted(
            self.points,
            key=lambda p: (
                -per_gpu(p.rate_per_s, p.params),
                p.params.gpu_memory_utilization or 0.0,
                order[p.params.model_dump_json()],
            ),
        )

    def point(self, params: TrialParams) -> ScreenedPoint | None:
        key = params.model_dump_json()
        return next((p for p in self.points if p.params.model_dump_json() == key), None)

    def rate_at_least_per_s(self, params: TrialParams) -> float:
        """The twin's goodput for ``params``; where it was not screened (a first pass's
        landscape has the ends of each group), the highest of its group's at a lower
        utilization (along utilization the goodput does not fall); 0 without either."""
        point = self.point(params)
        if point is not None:
            return point.rate_per_s
        key, util = group_of(params), params.gpu_memory_utilization or 0.0
        below = [
            p.rate_per_s
            for p in self.points
            if group_of(p.params) == key and (p.params.gpu_memory_utilization or 0.0) <= util
        ]
        return max(below, default=0.0)

    def with_points(self, points: Sequence[ScreenedPoint]) -> Landscape:
        """The landscape with ``points`` replacing the settings they name."""
        new = {p.params.model_dump_json(): p for p in points}
        return self.model_copy(
            update={"points": [new.get(p.params.model_dump_json(), p) for p in self.points]}
        )

    def write(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.model_dump_json(indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)


def read_landscape(path: Path) -> Landscape | None:
    """A run's ``landscape.json``; None where there is none (a run without a screen)."""
    if not path.is_file():
        return None
    try:
        return Landscape.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(f"{str(path)!r} is not a landscape: {first}") from exc


@dataclass(frozen=True)
class ScreenJob:
    """What the screen needs, picklable for its worker processes."""

    model: ModelSpec
    gpu: GpuSpec
    version: VllmVersion
    base: ServingParams
    workload: WorkloadSpec
    factors: TimingFactors
    warmup_s: float
    window_s: float
    base_rate_per_s: float
    ladder_step: float = LADDER_STEP

    def setup(self, params: TrialParams) -> Setup:
        return Setup(
            self.model, self.gpu, self.version, params.serving(self.base),
            options=offloading_options(params), timing=self.factors,
        )  # fmt: skip

    def rate(self, rung: int) -> float:
        return self.base_rate_per_s * self.ladder_step**rung

    def rung_of(self, rate_per_s: float) -> int:
        """The ladder's rung at or below ``rate_per_s``."""
        if rate_per_s <= 0 or self.base_rate_per_s <= 0:
            return LOWEST_RUNG
        ratio = math.log(rate_per_s / self.base_rate_per_s) / math.log(self.ladder_step)
        return math.floor(ratio + 1e-9)


def screen_setting(job: ScreenJob, params: TrialParams, hint: int = 0) -> ScreenedPoint:
    """One setting's rung: galloped to from ``hint`` (a neighbour's rung), then bisected."""
    setup = job.setup(params)
    startup = plan(job.model, job.gpu, setup.params, job.version)
    if not startup.fits:
        failure = startup.failure.kind.value if startup.failure is not None else "does not start"
        return ScreenedPoint(
            params=params, rate_per_s=0.0, method=ScreenMethod.NOT_STARTING, failure=failure
        )
    held: dict[float, AnswerTimes] = {}
    verdicts: dict[int, bool] = {}

    def met(rung: int) -> bool:
        if rung not in verdicts:
            rate = job.rate(rung)
            run = steady_run(
                setup, job.workload, rate, warmup_s=job.warmup_s, window_s=job.window_s,
                answer_times=nearest_in_rate(held, rate),
            )  # fmt: skip
            measured = answer_times_of(run.result)
            if run.met and measured is not None:
                held[rate] = measured
            verdicts[rung] = run.met
        return verdicts[rung]

    best = ladder_search(met, hint, max_runs=MAX_RUNS)
    times = held.get(job.rate(best)) if best > LOWEST_RUNG else None
    return ScreenedPoint(
        params=params,
        rate_per_s=job.rate(best) if best > LOWEST_RUNG else 0.0,
        method=ScreenMethod.COMPUTED,
        runs=len(verdicts),
        ttft_ms_mean=times.ttft_s * 1000.0 if times is not None else None,
        tpot_ms_mean=times.tpot_s * 1000.0 if times is not None else None,
    )


def ladder_search(met: Callable[[int], bool], hint: int, *, max_runs: int = MAX_RUNS) -> int:
    """The highest rung that ``met`` (taken as monotone: true up to a rung, false above),
    from ``hint``: up or down by 1, 2, 4, ... rungs until the verdict turns, then
    bisected. ``LOWEST_RUNG`` where none is met; after ``max_runs`` the best met so far."""
    runs = 0

    def check(rung: int) -> bool:
        nonlocal runs
        runs += 1
        return met(rung)

    if check(hint):
        low, step = hint, 1
        high = hint + step
        while runs < max_runs and check(high):
            low, step = high, step * 2
            high = low + step
    else:
        high, step = hint, 1
        low = max(hint - step, LOWEST_RUNG)
        while runs < max_runs and low > LOWEST_RUNG and not check(low):
            high, step = low, step * 2
            low = max(high - step, LOWEST_RUNG)
        if low == LOWEST_RUNG and (runs >= max_runs or not check(low)):
            return LOWEST_RUNG
    while high - low > 1 and runs < max_runs:
        middle = (low + high) // 2
        if check(middle):
            low = middle
        else:
            high = middle
    return low


def group_of(params: TrialParams) -> str:
    """The settings ``params`` shares everything but its utilization with."""
    return params.model_copy(update={"gpu_memory_utilization": None}).model_dump_json()


def screen_group(
    job: ScreenJob,
    group: Sequence[TrialParams],
    hint: int,
    *,
    known: Sequence[ScreenedPoint] = (),
    middles: bool = True,
) -> list[ScreenedPoint]:
    """A group of settings that differ only in utilization (lowest first): the ends
    computed, a middle one wherever the ends disagree, the rest ``BETWEEN``.

    ``middles=False`` is a first pass: the ends, and the settings between them only where
    the ends agree (the settings a later pass would not compute); ``known``: points of
    the group screened before (a first pass's), kept as they are."""
    index = {p.model_dump_json(): i for i, p in enumerate(group)}
    out: dict[int, ScreenedPoint] = {index[p.params.model_dump_json()]: p for p in known}

    def compute(i: int, near: int) -> ScreenedPoint:
        if i not in out:
            out[i] = screen_setting(job, group[i], near)
        return out[i]

    def rung(p: ScreenedPoint) -> int:
        return job.rung_of(p.rate_per_s) if p.rate_per_s > 0 else LOWEST_RUNG

    def fill(lo: int, hi: int) -> None:
        if hi - lo < 2:
            return
        a, b = out[lo], out[hi]
        if abs(rung(a) - rung(b)) <= NEIGHBOUR_RUNGS and a.method is b.method:
            low, high = sorted((a, b), key=lambda p: p.rate_per_s)
            for i in range(lo + 1, hi):
                out[i] = ScreenedPoint(
                    params=group[i], rate_per_s=low.rate_per_s, method=ScreenMethod.BETWEEN,
                    rate_high_per_s=high.rate_per_s, ttft_ms_mean=low.ttft_ms_mean,
                    tpot_ms_mean=low.tpot_ms_mean,
                )  # fmt: skip
            return
        if not middles:
            return
        middle = (lo + hi) // 2
        compute(middle, hint)
        fill(lo, middle)
        fill(middle, hi)

    # Every setting of the group from the same rung: two that run alike take the same
    # path (a run's population is planned with the answer times of the runs before it).
    top = compute(len(group) - 1, hint)
    hint = rung(top) if top.rate_per_s > 0 else hint
    compute(0, hint)
    fill(0, len(group) - 1)
    return [out[i] for i in sorted(out)]


def groups_of(space: SearchSpace) -> list[list[TrialParams]]:
    """The grid in groups that differ only in utilization, each lowest first (one
    setting a group when utilization is not searched)."""
    grid = space.grid()
    if space.range_of(Knob.GPU_MEMORY_UTILIZATION) is None:
        return [[p] for p in grid]
    groups: dict[str, list[TrialParams]] = defaultdict(list)
    for p in grid:
        groups[group_of(p)].append(p)
    return [sorted(g, key=lambda p: p.gpu_memory_utilization or 0.0) for g in groups.values()]


def screen_groups(
    job: ScreenJob,
    groups: Sequence[Sequence[TrialParams]],
    hint: int = 0,
    *,
    known: Sequence[ScreenedPoint] = (),
    middles: bool = True,
) -> list[ScreenedPoint]:
    """Groups in order, each started from the rung its predecessor's top reached (the
    grid's neighbouring groups differ in one knob); ``known`` and ``middles`` as in
    ``screen_group``."""
    by_group: dict[str, list[ScreenedPoint]] = defaultdict(list)
    for p in known:
        by_group[group_of(p.params)].append(p)
    points: list[ScreenedPoint] = []
    for group in groups:
        out = screen_group(
            job, group, hint, known=by_group.get(group_of(group[0]), []), middles=middles
        )
        top = max(out, key=lambda p: p.rate_per_s)
        if top.rate_per_s > 0:
            hint = job.rung_of(top.rate_per_s)
        points += out
    return points


def _runs_of(groups: Sequence[list[TrialParams]]) -> list[list[list[TrialParams]]]:
    """Consecutive groups with the same max-num-seqs together, the largest batches first
    (they cost most to run: handed out first, they keep the workers' shares even)."""
    runs: list[list[list[TrialParams]]] = []
    for group in groups:
        if runs and runs[-1][0][0].max_num_seqs == group[0].max_num_seqs:
            runs[-1].append(group)
        else:
            runs.append([group])
    return sorted(runs, key=lambda run: -(run[0][0].max_num_seqs or 0))


ScreenTask = tuple[ScreenJob, list[list[TrialParams]], list[ScreenedPoint], bool]


def _screen_groups_job(task: ScreenTask) -> list[ScreenedPoint]:
    job, groups, known, middles = task
    return screen_groups(job, groups, known=known, middles=middles)


def _screen_worker(tune_pid: int) -> None:
    """A screen worker's start: it dies with the tune, even a tune killed with SIGKILL (a
    pool worker waits for its next task forever otherwise, and multiprocessing's resource
    tracker with it), and beside a trial being measured it takes only what is idle."""
    set_parent_death_signal()
    if os.getppid() != tune_pid:  # the tune died before the signal was asked for
        os._exit(0)
    if os.name == "posix":
        os.nice(19)


def _landscape(
    job: ScreenJob, space: SearchSpace, points: list[ScreenedPoint], wall_s: float
) -> Landscape:
    """The screened points in the grid's order, as ``landscape.json`` holds them."""
    order = {p.model_dump_json(): i for i, p in enumerate(space.grid())}
    points = sorted(points, key=lambda p: order.get(p.params.model_dump_json(), 0))
    return Landscape(
        factors=job.factors, warmup_s=job.warmup_s, window_s=job.window_s,
        base_rate_per_s=job.base_rate_per_s, ladder_step=job.ladder_step,
        wall_s=wall_s, points=points,
    )  # fmt: skip


class ScreenRun:
    """A screen under way in worker processes (spawned, lowest CPU priority), so the
    first trial is measured meanwhile; ``stop`` ends them, and they die with the tune if it
    is killed (no process outlives the tune).

    It screens in two passes: first the ends of every group (and the settings between
    them where the ends agree: ``first``), then the middles where they disagree. The
    twin's first pick needs only the first (``candidates``: one setting per group, the
    utilization is the OOM-edge search's to place), so it is not kept waiting for the
    second. Each pass hands out one run of groups (one max-num-seqs) at a time, the
    costliest first, to whichever worker is free."""

    def __init__(self, job: ScreenJob, space: SearchSpace, *, jobs: int = 1) -> None:
        self.job = job
        self.space = space
        self.began = time.monotonic()
        # each pass's seconds from the start, once it is done (not when it is asked for)
        self.first_wall_s: float | None = None
        self.wall_s: float | None = None
        self._runs = _runs_of(groups_of(space))
        self._second: AsyncResult[list[list[ScreenedPoint]]] | None = None
        self._second_error: BaseException | None = None
        self._second_started = threading.Event()
        context = multiprocessing.get_context("spawn")  # the tune's threads stay out of it
        workers = max(1, min(jobs, len(self._runs)))
        self._pool = context.Pool(workers, initializer=_screen_worker, initargs=(os.getpid(),))
        tasks: list[ScreenTask] = [(job, run, [], False) for run in self._runs]
        self._first = self._pool.map_async(
            _screen_groups_job, tasks, chunksize=1, callback=self._start_second,
            error_callback=lambda _: self._second_started.set(),
        )  # fmt: skip

    def _start_second(self, chunks: list[list[ScreenedPoint]]) -> None:
        """The first pass's callback (the pool's result thread): the second pass, over
        the runs with a group whose ends disagree."""
        self.first_wall_s = time.monotonic() - self.began
        tasks: list[ScreenTask] = []
        for run, known in zip(self._runs, chunks, strict=True):
            screened = Counter(group_of(p.params) for p in known)
            open_groups = [g for g in run if screened[group_of(g[0])] < len(g)]
            if open_groups:
                tasks.append((self.job, open_groups, known, True))
        try:
            if tasks:
                self._second = self._pool.map_async(
                    _screen_groups_job, tasks, chunksize=1, callback=self._second_done
                )
            else:  # every group's ends agreed: the first pass was the whole
                self.wall_s = self.first_wall_s
            self._pool.close()
        except Exception as exc:  # the pool was stopped meanwhile
            self._second_error = exc
        finally:
            self._second_started.set()

    def _second_done(self, _: list[list[ScreenedPoint]]) -> None:
        self.wall_s = time.monotonic() - self.began

    def first_ready(self) -> bool:
        return self._first.ready()

    def ready(self) -> bool:
        return self._second_started.is_set() and (
            self._second is None or self._second.ready()
        )  # fmt: skip

    def first(self, timeout_s: float | None = None) -> Landscape:
        """The first pass's landscape: every group's ends, and the settings between them
        where the ends agree (waits up to ``timeout_s``; ``multiprocessing.TimeoutError``
        after)."""
        points = self._get(self._first, timeout_s)
        assert self.first_wall_s is not None  # set by the pass's callback before it is ready
        return _landscape(self.job, self.space, points, self.first_wall_s)

    def result(self, timeout_s: float | None = None) -> Landscape:
        """The whole landscape (waits up to ``timeout_s`` for each pass;
        ``multiprocessing.TimeoutError`` after)."""
        first = self._get(self._first, timeout_s)
        if not self._second_started.wait(timeout_s):
            raise multiprocessing.TimeoutError
        if self._second_error is not None:
            raise self._second_error
        second = self._get(self._second, timeout_s) if self._second is not None else []
        self._pool.join()
        points = {p.params.model_dump_json(): p for p in first}
        points.update({p.params.model_dump_json(): p for p in second})
        assert self.wall_s is not None  # set by the pass's callback before it is ready
        return _landscape(self.job, self.space, list(points.values()), self.wall_s)

    def _get(
        self, result: AsyncResult[list[list[ScreenedPoint]]], timeout_s: float | None
    ) -> list[ScreenedPoint]:
        try:
            chunks = result.get(timeout_s)
        except multiprocessing.TimeoutError:
            raise  # still under way: the caller may wait again
        except BaseException:
            self.stop()
            raise
        return [p for c in chunks for p in c]

    def stop(self) -> None:
        self._pool.terminate()
        self._pool.join()


def screen(job: ScreenJob, space: SearchSpace, *, jobs: int = 1) -> Landscape:
    """Every setting of ``space`` on the twin, in ``jobs`` processes (``ScreenRun``),
    waited for."""
    if jobs <= 1:
        began = time.monotonic()
        points = screen_groups(job, groups_of(space))
        return _landscape(job, space, points, time.monotonic() - began)
    run = ScreenRun(job, space, jobs=jobs)
    try:
        return run.result()
    finally:
        run.stop()


def candidates(
    landscape: Landscape, tried: Sequence[TrialParams], *, count: int
) -> list[ScreenedPoint]:
    """The twin's most promising untried settings, one per group (the utilization is the
    OOM-edge search's to place), best first: a group already measured only where the
    twin puts one of its settings at least a rung above the one measured."""
    tried_keys = {p.model_dump_json() for p in tried}
    measured: dict[str, float] = {}
    for p in tried:
        rate = landscape.rate_at_least_per_s(p)
        measured[group_of(p)] = max(measured.get(group_of(p), 0.0), rate)
    out: list[ScreenedPoint] = []
    taken: set[str] = set()
    for point in landscape.ranked():
        if len(out) >= count or point.rate_per_s <= 0:
            break
        key = group_of(point.params)
        if point.params.model_dump_json() in tried_keys or key in taken:
            continue
        if key in measured and point.rate_per_s < measured[key] * landscape.ladder_step:
            continue
        taken.add(key)
        out.append(point)
    return out

"""The recommendation must start on a cold boot on a new node (``tuner.run.cold_boot``).

The OOM edge is probed on servers whose compile cache the trials filled: warm boots. A pod
on a new node boots cold, with a smaller KV cache (``tuner.vllm.boot``). The calibrated
memory model predicts the recommended settings on such a boot; where they would not start
cold, or start within the margin of the cold edge, the recommended
``--gpu-memory-utilization`` is raised to the lowest that starts cold plus the margin
(``--safety-margin``), never above the highest that held the worst case (the edge); where
that is not possible, the check says so, with what to do.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from tuner.run.budget import LaunchKind
from tuner.run.cold_boot import ColdBootCheck, ColdBootProbe
from tuner.run.layout import RunLayout
from tuner.search.budget import TimeBudget
from tuner.search.context import StudySetup, TuneContext
from tuner.search.evaluate import launch_spec
from tuner.serving.live_server import LiveServer, ServerFactory
from tuner.serving.processes import ChildRegistry
from tuner.serving.server import CACHE_ROOT_ENV, TrialOutcome
from tuner.vllm.boot import COLD_COMPILE_FACTOR, COLD_COMPILE_SOURCE, BootState
from tuner.vllm.gpus import GpuSpec
from tuner.vllm.memory import Calibration, MemoryPlan, ServingParams, plan
from tuner.vllm.models import ModelSpec
from tuner.vllm.space import TrialParams
from tuner.vllm.versions import VllmVersion

UTILIZATION_STEP = 0.01
COLD_PROBE_DIR = "cold-boot"  # under the run's edge/
# A cold launch compiles: it is budgeted as this many warm launches.
COLD_LAUNCH_FACTOR = 2.0


def lowest_starting_utilization(fits: Callable[[float], bool]) -> float | None:
    """The lowest utilization (0.01 apart, 0.05 to 1) at which ``fits``."""
    for i in range(5, 101):
        u = round(i * UTILIZATION_STEP, 2)
        if fits(u):
            return u
    return None


def check_cold_boot(
    params: TrialParams,
    *,
    model: ModelSpec,
    gpu: GpuSpec,
    version: VllmVersion,
    base: ServingParams,
    calibration: Calibration | None,
    production: BootState,
    margin: float,
    ceiling: float | None,
) -> tuple[TrialParams, ColdBootCheck]:
    """The settings to recommend (``params``, or with the utilization raised to start cold
    with ``margin``, at most ``ceiling``: the edge's highest that held) and the check."""

    def at(util: float | None, boot: BootState) -> MemoryPlan:
        p = params.model_copy(update={"gpu_memory_utilization": util})
        return plan(model, gpu, p.serving(base), version, calibration, boot=boot)

    util = params.gpu_memory_utilization or version.default_gpu_memory_utilization
    warm, cold = at(util, BootState.WARM), at(util, BootState.COLD)
    low_cold = lowest_starting_utilization(lambda u: at(u, BootState.COLD).fits)
    low_warm = lowest_starting_utilization(lambda u: at(u, BootState.WARM).fits)
    raised_from: float | None = None
    raise_to: float | None = None
    if low_cold is not None and util < round(low_cold + margin, 4):
        wanted = round(low_cold + margin, 4)
        top = min(ceiling if ceiling is not None else 1.0, 1.0)
        if wanted <= top:
            raise_to = wanted
        elif cold.fits is False and low_cold <= top:
            raise_to = top  # no room for the whole margin: at least start cold
    if raise_to is not None:
        raised_from, util = util, raise_to
        params = params.model_copy(update={"gpu_memory_utilization": util})
        warm, cold = at(util, BootState.WARM), at(util, BootState.COLD)
    measured = calibration is not None and calibration.compile_factor is not None
    factor = (
        calibration.compile_factor
        if calibration is not None and calibration.compile_factor is not None
        else COLD_COMPILE_FACTOR
    )
    failure = cold.failure
    check = ColdBootCheck(
        production_boot=production,
        calibrated=calibration is not None,
        compile_factor=factor,
        factor_source="measured by this run's cold and warm boots"
        if measured
        else COLD_COMPILE_SOURCE,
        compile_bytes=cold.compile_bytes,
        warm_kv_cache_tokens=warm.kv_cache_tokens,
        cold_kv_cache_tokens=cold.kv_cache_tokens if cold.fits else None,
        starts_cold=cold.fits,
        cold_failure=failure,
        lowest_utilization_cold=low_cold,
        lowest_utilization_warm=low_warm,
        margin=margin,
        utilization=util,
        raised_from=raised_from,
    )
    return params, check


def probe_cold_boot(
    ctx: TuneContext,
    setup: StudySetup,
    params: TrialParams,
    registry: ChildRegistry,
    progress: Callable[[str], None],
    *,
    budget: TimeBudget | None = None,
    deadline_s: float | None = None,
) -> ColdBootProbe | None:
    """Launch ``params`` once with an empty compile cache of its own (``VLLM_CACHE_ROOT``
    under ``edge/cold-boot/``), as a pod on a new node boots, up to ready or its failure;
    None where the time budget has no room for it (said)."""
    out = RunLayout(ctx.run_dir).edge_dir / COLD_PROBE_DIR
    name = "cold boot probe"
    if budget is not None:
        need = budget.launch_estimate_s() * COLD_LAUNCH_FACTOR
        skip = budget.fits(LaunchKind.EDGE_PROBE, name, need, deadline_s=deadline_s)
        if skip is not None:
            progress(f"cold boot   {skip.text()}")
            return None
    spec = launch_spec(ctx, setup, params)
    empty = out / "vllm-cache"  # a new node's: nothing compiled
    spec = dataclasses.replace(spec, env=(*spec.env, (CACHE_ROOT_ENV, str(empty))))
    make: ServerFactory = ctx.server_factory or LiveServer
    began = time.monotonic()
    server = make(
        spec, trial_dir=out, registry=registry, gpu_source=ctx.gpu_source,
        generators=ctx.config.load_generators(), stream_fraction=setup.stream_fraction,
    )  # fmt: skip
    with server:
        ready_at = time.monotonic()
        startup = server.startup
    stopped_at = time.monotonic()
    assert startup is not None
    ready = startup.outcome is TrialOutcome.READY
    if budget is not None:
        budget.record(
            LaunchKind.EDGE_PROBE, name, began_s=began, launch_s=ready_at - began,
            measure_s=0.0, stop_s=stopped_at - ready_at, ready=ready, deadline_s=deadline_s,
        )  # fmt: skip
    report = startup.report
    failure = startup.failure
    probe = ColdBootProbe(
        started=ready,
        boot_state=report.boot_state if report is not None else None,
        kv_cache_tokens=report.kv_cache_tokens if report is not None else None,
        failure=failure,
        dir=str(out),
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(probe.model_dump_json(indent=2), encoding="utf-8")
    return probe

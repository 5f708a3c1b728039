"""The recommendation: the best settings stepped back from the OOM edge, confirmed, written to deploy.

Three variants are measured beside each other so a reviewer sees what headroom
costs: ``recommended`` (the best trial's settings at the edge less the safety
margin), ``conservative`` (more headroom, 3/4 of max-num-seqs) and ``aggressive``
(the highest utilization that held). The recommended one is measured again on a launch
of its own: where it is its best trial's own settings and that trial bracketed its
goodput, with the workload's draws the trial lacks at the trial's bracket, pooled with
the trial's levels (``pools_with_trial``); otherwise over a bracket of its own and then its edge
draws. Each gets its own deployable configs; the recommended one's sit directly in
``recommendation/``:

    vllm-args.txt        a ready `vllm serve` command line
    vllm-config.yaml     for `vllm serve --config`
    kubernetes.yaml      the serving objects of --rollout (rolling: a Deployment and its
                         Service; blue-green: this version's StatefulSet and Service), the
                         warm-up, drain and model-fetch programs (a ConfigMap), the shared
                         cache claims; the model fetched by an init container before vLLM
                         starts offline (--model-source, --model-cache, --model-secret)
    kubernetes-switch.yaml  blue-green: the Service, switched to this version
    warmup.py            the warm-up the pods run, from the measured workload, standalone
    warmup-job.yaml      the same warm-up as a Kubernetes Job, through the Service
    recommendation.json  settings, measurements, edge, headroom, capacity, version hash
                         (``tuner.run.recommendation.Recommendation``)
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, cast

from tuner.deploy import (
    DeploymentConfig,
    LocalSource,
    PvcCache,
    Rollout,
    kubernetes_manifests,
    kubernetes_switch,
    model_cache_size,
    vllm_args,
    vllm_config_yaml,
    warmup_job_manifests,
    warmup_plan_of,
)
from tuner.drain import drain_timing
from tuner.run.budget import LaunchKind
from tuner.run.cold_boot import ColdBootCheck
from tuner.run.edge import EdgeResult
from tuner.run.evaluation import Evaluation, LevelRecord
from tuner.run.goodput import Goodput, GoodputBound
from tuner.run.layout import RECOMMENDATION_JSON, RunLayout
from tuner.run.offloading import OffloadingVerdict
from tuner.run.quality import QualityRejection, QualityResult
from tuner.run.recommendation import Capacity, ConfirmationResult, Recommendation, Variant
from tuner.run.ties import TieBreak
from tuner.search.budget import TimeBudget
from tuner.search.capacity_interval import capacity_gain, capacity_interval
from tuner.search.cold_boot import check_cold_boot, probe_cold_boot
from tuner.search.config import deploy_model_fields
from tuner.search.context import StudySetup, TuneContext
from tuner.search.evaluate import evaluate
from tuner.search.rate_search import edge_levels
from tuner.serving.processes import ChildRegistry
from tuner.serving.server import Backend
from tuner.sim.build import offloading_options
from tuner.twin.eviction_share import twin_evicted_under_way_share
from tuner.twin.prediction import Setup
from tuner.vllm.memory import weights_bytes
from tuner.vllm.space import Knob, TrialParams, clamp
from tuner.warmup import DEFAULT_MAX_REQUESTS, WarmupPlan, warmup_plan, warmup_script
from workloads.load_result import Percentiles
from workloads.replay import pass_s
from workloads.spec import WorkloadSpec

log = logging.getLogger(__name__)

HARNESS_VERSION = "0.1.0"
WARMUP_MAX_REQUESTS_TO_FILL = 1000  # a warm-up to a KV-cache fill stops at the fill first


def config_hash(
    ctx: TuneContext, flags: dict[str, object], tensor_parallel_size: int | None = None
) -> str:
    """A hash of everything the settings were chosen for, so a fleet can tell whether its
    running config is the recommended one (16 hex digits, a valid Kubernetes label);
    ``tensor_parallel_size`` None: the run's own."""
    return settings_hash(
        flags, model=ctx.model.name, gpu=ctx.gpu_name, vllm_version=str(ctx.version),
        workload=ctx.workload, max_model_len=ctx.base.max_model_len,
        tensor_parallel_size=tensor_parallel_size or ctx.base.tensor_parallel_size,
    )  # fmt: skip


def settings_hash(
    flags: dict[str, object],
    *,
    model: str,
    gpu: str | None,
    vllm_version: str,
    workload: WorkloadSpec,
    max_model_len: int | None,
    tensor_parallel_size: int,
) -> str:
    """``config_hash`` of settings chosen outside a tune (a capacity plan's options)."""
    payload = {
        "flags": flags,
        "model": model,
        "gpu": gpu,
        "vllm_version": vllm_version,
        "workload": workload.model_dump(mode="json"),
        "max_model_len": max_model_len,
        "tensor_parallel_size": tensor_parallel_size,
    }
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def deploy_flags(ctx: TuneContext, params: TrialParams) -> dict[str, object]:
    """The settings' vLLM flags (the tensor-parallel size is the deployment's own field)."""
    flags: dict[str, object] = dict(params.flags())
    flags.pop(Knob.TENSOR_PARALLEL_SIZE.value, None)
    if ctx.base.max_model_len:
        flags["max-model-len"] = ctx.base.max_model_len
    return flags


def deployment(
    ctx: TuneContext,
    params: TrialParams,
    *,
    p99_e2e_ms: float | None = None,
    replicas: int = 1,
) -> DeploymentConfig:
    """What the recommendation deploys: its flags, the warm-up of the tuned workload, a
    drain sized from the measured p99 end-to-end latency, ``replicas`` servers."""
    flags = deploy_flags(ctx, params)
    return DeploymentConfig.build(
        model=ctx.model.name,
        vllm_version=ctx.release,  # the image of the release measured, where it was read
        config_hash=config_hash(ctx, flags, ctx.gpus_of(params)),
        tensor_parallel_size=ctx.gpus_of(params),
        cache_volume=ctx.config.cache_volume,
        rollout=Rollout.parse(ctx.config.rollout),
        warmup=_warmup(ctx, params),
        drain=drain_timing(p99_e2e_ms),
        replicas=replicas,
        flags=flags,
        labels={"app.kubernetes.io/managed-by": "vllm-capacity-tuner"},
        **_model_fields(ctx),
    )


def _model_fields(ctx: TuneContext) -> dict[str, Any]:
    """The model before vLLM starts (--model-source, --model-cache, --model-secret); a
    fetched model's claim, unless given, sized from the model's weights."""
    fields = deploy_model_fields(ctx.config, ctx.model.name)
    source = fields.get("model_source")
    fetched = source is None or not isinstance(source, LocalSource)
    if ctx.config.model_cache is None and fetched:
        weights = ctx.model.checkpoint_bytes or weights_bytes(ctx.model, 1)
        fields["model_cache"] = PvcCache(size=model_cache_size(weights))
    return fields


def _warmup(ctx: TuneContext, params: TrialParams) -> WarmupPlan:
    """The tuned workload's warm-up, as many requests at once as the server batches (up to
    64), until the workload's own warm-up KV-cache fill where it states one."""
    fill = ctx.workload.warmup.kv_cache_fill
    return warmup_plan(
        ctx.workload, ctx.model.name,
        max_requests=WARMUP_MAX_REQUESTS_TO_FILL if fill is not None else DEFAULT_MAX_REQUESTS,
        kv_cache_fill=fill, concurrency=max(1, min(params.max_num_seqs or 8, 64)),
    )  # fmt: skip


def variant_params(
    ctx: TuneContext, best: TrialParams, edge: EdgeResult | None
) -> dict[str, TrialParams]:
    """recommended / conservative / aggressive from the best trial and the utilization edge."""
    margin = ctx.config.safety_margin
    util_range = ctx.space.range_of(Knob.GPU_MEMORY_UTILIZATION)
    edge_ok = edge.utilization.highest_ok if edge and edge.utilization else None
    seqs = best.max_num_seqs
    if util_range is None or edge_ok is None or best.gpu_memory_utilization is None:
        conservative_seqs = max(1, math.floor(seqs * 0.75)) if seqs else None
        return {
            "recommended": best,
            "conservative": best.model_copy(update={"max_num_seqs": conservative_seqs}),
            "aggressive": best,
        }

    def util(value: float) -> float:
        return round(max(0.05, min(value, edge_ok)), 4)

    return {
        "recommended": best.model_copy(update={"gpu_memory_utilization": util(edge_ok - margin)}),
        "conservative": best.model_copy(
            update={
                "gpu_memory_utilization": util(edge_ok - max(3 * margin, 0.05)),
                "max_num_seqs": max(1, math.floor(seqs * 0.75)) if seqs else None,
            }
        ),
        "aggressive": best.model_copy(update={"gpu_memory_utilization": util(edge_ok)}),
    }


def measured_of(runs: list[Evaluation]) -> ConfirmationResult:
    """The confirmation runs of one variant; latencies at the rate goodput was measured at,
    or, when no rate met the SLOs, at the last rate measured (how far it missed)."""
    last = runs[-1]
    decided = last.best or (last.levels[-1] if last.levels else None)
    best = decided.load if decided else None

    def lat(name: str) -> Percentiles | None:
        return None if best is None else cast(Percentiles, getattr(best, name))

    goodputs = [r.goodput_requests_per_s for r in runs]
    return ConfirmationResult(
        goodput_figures=Goodput.mean([r.stated_goodput for r in runs]),
        verdict=last.verdict,
        goodput=statistics.fmean(goodputs),
        goodput_runs=goodputs,
        goodput_bound=combined_bound([r.goodput_bound for r in runs]),
        rate_per_s=last.rate_per_s,
        rates_per_s=[level.rate_per_s for level in last.levels],
        throughput=statistics.fmean(r.output_tokens_per_s for r in runs),
        ttft_ms=lat("ttft_ms"),
        itl_ms=lat("itl_ms"),
        tpot_ms=lat("tpot_ms"),
        e2e_ms=lat("e2e_ms"),
        peak_used_bytes=last.gpu.peak_used_bytes if last.gpu else None,
        total_bytes=last.gpu.total_bytes if last.gpu else None,
        kv_cache_tokens=last.startup.kv_cache_tokens if last.startup else None,
        dir=last.dir,
        capacity_interval=capacity_interval([level for run in runs for level in run.levels]),
        eviction=decided.eviction if decided else None,
    )


def with_twin_eviction_share(
    ctx: TuneContext, setup: StudySetup, params: TrialParams, result: ConfirmationResult,
    level_dir: Path | None, time_scale: float | None,
) -> ConfirmationResult:  # fmt: skip
    """``result`` with the twin's share of later turns' misses that were evictions of a
    conversation under way, replaying the decided level's schedule (where the twin can)."""
    twin = ctx.twin
    if twin is None or level_dir is None:
        return result
    device, base = twin
    twin_setup = Setup(
        ctx.model, device, ctx.version, params.serving(base),
        options=offloading_options(params), timing=setup.timing,
    )  # fmt: skip
    share = twin_evicted_under_way_share(twin_setup, level_dir, time_scale=time_scale or 1.0)
    return result.model_copy(update={"twin_evicted_under_way_share": share})


def combined_bound(bounds: list[GoodputBound]) -> GoodputBound:
    """What a mean over repeats is: a lower bound when any run's goodput was one."""
    for bound in (GoodputBound.LOWER_BOUND, GoodputBound.BRACKETED):
        if bound in bounds:
            return bound
    return GoodputBound.NONE


def confirm(
    ctx: TuneContext,
    setup: StudySetup,
    name: str,
    params: TrialParams,
    *,
    registry: ChildRegistry,
    start_rate_per_s: float | None,
    repeats: int,
    max_levels: int = 3,
    start_held: bool = False,
    bracket_middle_per_s: float | None = None,
    budget: TimeBudget | None = None,
    deadline_s: float | None = None,
    level_s: float = 0.0,
    skipped: list[str] | None = None,
    prior: Sequence[LevelRecord] = (),
) -> ConfirmationResult | None:
    """``repeats`` runs of ``params`` from ``start_rate_per_s``; ``start_held``: a trial of
    these settings held there or above (``search_rate``). ``bracket_middle_per_s``: the
    middle of that trial's bracket (``trial_bracket_middle``): the first two levels then
    straddle it, as they straddle the twin's rate in a trial, rather than the second
    climbing by what the first allows (a climb of x1.42 from 8.62 to 12.24 conversations/s,
    where the trial had broken at 9.34, spent one of its three levels). With ``budget``, a run is
    launched only when its launch (as measured) and ``LEAST_LEVELS`` levels of
    ``level_s`` (or ``max_levels``, where fewer) end before ``deadline_s``, and measures as
    many of its ``max_levels`` levels as end before it (``levels_that_fit``); what was not
    run is added to ``skipped``; no level starts that would end past the deadline
    (``search_rate``'s, as long as the longest so far). ``prior``: the levels of the trial
    the run pools with (``pools_with_trial``; one run): it measures the draws of the
    workload that trial did not (``--edge-draws`` in all, as many as fit before the
    deadline, one at the least) at that trial's bracket's ends on its own launch
    (``prior_draw_levels``, more where a draw breaks the rate the trial held), and states
    what the draws pooled say. A confirmation of its own measures as many edge draws as
    fit too. None: no run was."""
    runs: list[Evaluation] = []
    least = min(max_levels, LEAST_LEVELS)
    for i in range(repeats):
        out_dir = RunLayout(ctx.run_dir).confirm_run_dir(name, None if repeats == 1 else i)
        levels = max_levels
        # the capacity a review acts on: the bracket's ends with several draws, where they fit
        draws = ctx.config.edge_draws if max_levels > 1 else 1
        if prior:  # the draws the trial did not measure, at its bracket's ends: one at least
            draws, trial_draws = pooled_draws(draws, prior)
            levels_of = partial(prior_draw_levels, trial_draws=trial_draws)
            levels = levels_of(draws)
        if budget is not None:
            label = f"confirmation of {name}" + (f" (run {i + 1})" if repeats > 1 else "")
            launch_s = budget.launch_estimate_s()
            left_s = budget.left_s(deadline_s)
            if prior:  # as many draws as fit, one more than the trial's at the least
                draws = draws_that_fit(
                    draws, trial_draws + 1, left_s - launch_s, level_s, levels_of
                )
                levels = levels_of(draws)
            else:
                levels = levels_that_fit(budget, max_levels, level_s, deadline_s)
                draws = draws_that_fit(
                    draws, 1, left_s - launch_s, level_s, partial(_with_edge_levels, levels)
                )
            if draws < ctx.config.edge_draws and max_levels > 1:
                log.info(
                    "%s: %d of its %d draws fit before its deadline",
                    label, draws, ctx.config.edge_draws,
                )  # fmt: skip
            skip = budget.fits(
                LaunchKind.CONFIRMATION, label,
                launch_s + max(levels, least) * level_s,
                deadline_s=deadline_s,
                note=f"{least} of {max_levels} rate(s) at the least" if levels < least else "",
            )  # fmt: skip
            if skip is not None:
                if skipped is not None:
                    skipped.append(skip.text())
                break
            if levels < max_levels and not prior:
                log.info("%s: %d of %d rates fit before its deadline", label, levels, max_levels)
        began = time.monotonic()
        runs.append(
            evaluate(
                ctx,
                setup,
                params,
                out_dir=out_dir,
                registry=registry,
                start_rate_per_s=start_rate_per_s,
                max_levels=max(levels, 1),
                start_held=start_held,
                predicted_rate_per_s=bracket_middle_per_s,
                edge_draws=draws,
                # its levels may outgrow the plan's (a slower clock after a lag)
                deadline=None if budget is None else began + budget.left_s(deadline_s),
                prior=prior,
            )
        )
        ran = runs[-1]
        if budget is not None:
            budget.record_evaluation(
                LaunchKind.CONFIRMATION, f"confirmation {out_dir.name}", ran, began_s=began,
                deadline_s=deadline_s,
            )  # fmt: skip
    return confirmed_of(ctx, setup, params, runs) if runs else None


def confirmed_of(
    ctx: TuneContext, setup: StudySetup, params: TrialParams, runs: list[Evaluation]
) -> ConfirmationResult:
    """``measured_of(runs)`` with the twin's eviction share on the decided level."""
    last = runs[-1]
    decided = last.best or (last.levels[-1] if last.levels else None)
    return with_twin_eviction_share(
        ctx, setup, params, measured_of(runs),
        Path(decided.dir) if decided else None,
        (decided.time_scale or last.time_scale) if decided else None,
    )  # fmt: skip


def trial_bracket_middle(best: Evaluation) -> float | None:
    """The geometric middle of a trial's bracket: the rate of its goodput and the lowest
    rate above it that broke (None: none broke, or no goodput)."""
    held = best.rate_per_s
    if held is None:
        return None
    broke = [lv.rate_per_s for lv in best.levels if not lv.met and lv.rate_per_s > held]
    return math.sqrt(held * min(broke)) if broke else None


def level_estimate_s(setup: StudySetup, best: Evaluation) -> float | None:
    """A confirmation's level (wall seconds) as the best trial's levels took on average,
    on the clock of now for its settings (``tuner.search.clock``: a later launch may run it
    faster than the trial did; ``StudySetup.time_scale_for``); None: the trial measured no
    level."""
    levels_s = best.levels_s_at(setup.time_scale_for(best.params))
    if levels_s is None or not best.levels:
        return None
    return levels_s / len(best.levels)


# A confirmation that pools its trial's levels measures each draw its trial did not at that
# trial's bracket's two ends (and more rates only where one breaks the rate the trial held).
PRIOR_DRAW_LEVELS = 2


def pooled_draws(asked: int, prior: Sequence[LevelRecord]) -> tuple[int, int]:
    """A confirmation that pools ``prior`` (its trial's levels): the draws it measures up
    to in all (``asked``, one more than the trial's at the least) and the trial's own."""
    trial_draws = max(level.draw for level in prior) + 1
    return max(asked, trial_draws + 1), trial_draws


def prior_draw_levels(draws: int, trial_draws: int = 1) -> int:
    """The levels a confirmation that pools its trial's levels usually measures: the
    bracket's two ends with each of the ``draws`` (in all) its trial's ``trial_draws`` lack."""
    return PRIOR_DRAW_LEVELS * max(1, draws - trial_draws)


def pools_with_trial(ctx: TuneContext, best: Evaluation) -> bool:
    """Whether the recommendation's confirmation pools ``best``'s levels (the trial of its
    settings) with the draw it measures, rather than measuring a bracket of its own and
    then its edge draws: one run (no ``--repeats``), edge draws asked for (``--edge-draws``
    above 1), an open workload that is not a trace's replay (whose draws are all the
    trace's), and a trial that bracketed its goodput (a rate held, a higher one broke).
    The settings must be the trial's own: the caller checks (the edge's utilization may
    change them)."""
    c = ctx.config
    spec = ctx.workload
    return (
        c.repeats == 1 and c.edge_draws > 1 and spec.mean_rate_per_s is not None
        and pass_s(spec) is None and trial_bracket_middle(best) is not None
    )  # fmt: skip


# A confirmation of several rates runs only where two fit: one that breaks where its trial
# held (a first level on a fresh server, its prefix cache cold) steps down to where it
# holds; a single level that broke said "goodput 0" of settings that held 8.31/s.
LEAST_LEVELS = 2


def cold_boot_variants(
    ctx: TuneContext,
    setup: StudySetup,
    points: dict[str, TrialParams],
    edge: EdgeResult | None,
) -> tuple[dict[str, TrialParams], ColdBootCheck | None]:
    """Each variant as it must be to start on a cold boot on a new node, with the safety
    margin (``tuner.search.cold_boot``), and the recommended one's check (None: no GPU)."""
    if ctx.gpu is None:
        return points, None
    ceiling = edge.utilization.highest_ok if edge and edge.utilization else None
    out: dict[str, TrialParams] = {}
    check: ColdBootCheck | None = None
    for name, params in points.items():
        kept, found = check_cold_boot(
            params, model=ctx.model, gpu=ctx.gpu, version=ctx.version, base=ctx.base,
            calibration=setup.calibration, production=ctx.config.production_boot_state,
            margin=ctx.config.safety_margin, ceiling=ceiling,
        )  # fmt: skip
        out[name] = kept
        if name == "recommended":
            check = found
    return out, check


def draws_that_fit(
    asked: int, least: int, left_s: float, level_s: float, levels_of: Callable[[int], int]
) -> int:
    """The most draws, from ``asked`` down to ``least``, whose confirmation's levels
    (``levels_of(draws)``, each ``level_s`` wall seconds) end within ``left_s`` (after its
    launch); ``least`` where none does (whether it runs at all is the budget's to say)."""
    draws = asked
    while draws > least and levels_of(draws) * level_s > left_s:
        draws -= 1
    return draws


def _with_edge_levels(own: int, draws: int) -> int:
    """A confirmation's ``own`` levels and those its ``draws`` add (``edge_levels``)."""
    return own + edge_levels(draws, own)


def levels_that_fit(
    budget: TimeBudget, max_levels: int, level_s: float, deadline_s: float | None
) -> int:
    """How many of a confirmation's ``max_levels`` levels of ``level_s`` (wall seconds) end,
    after its launch (as measured), before ``deadline_s`` (default the budget's end):
    ``max_levels`` where they all do, 0 where not even one does."""
    if level_s <= 0:
        return max_levels
    left = budget.left_s(deadline_s) - budget.launch_estimate_s()
    return max(0, min(max_levels, math.floor(left / level_s)))


def make_variant(
    ctx: TuneContext,
    name: str,
    params: TrialParams,
    measured: ConfirmationResult | None,
    edge: EdgeResult | None,
) -> Variant:
    cfg = deployment(ctx, params)
    edge_ok = edge.utilization.highest_ok if edge and edge.utilization else None
    util = params.gpu_memory_utilization
    return Variant(
        name=name,
        flags=deploy_flags(ctx, params),
        params=params,
        utilization_headroom=round(edge_ok - util, 4)
        if edge_ok is not None and util is not None
        else None,
        measured=measured,
        command=vllm_args(cfg),
        config_hash=cfg.config_hash,
    )


def capacity(ctx: TuneContext, goodput: Goodput, *, gpus_per_replica: int = 1) -> Capacity | None:
    """Replicas for the configured peak (in the workload's unit, as ``goodput``'s arrival
    rate) at ``goodput`` per replica less the headroom (an upper bound on replicas when
    goodput is a lower bound), each of ``gpus_per_replica`` GPUs."""
    target = ctx.config.target_peak_rate
    per_replica = goodput.arrival_rate_per_s
    if target is None or per_replica <= 0:
        return None
    usable = per_replica * (1.0 - ctx.config.capacity_headroom)
    return Capacity(
        target_peak_rate=target,
        headroom=ctx.config.capacity_headroom,
        goodput_per_replica=per_replica,
        replicas=max(1, math.ceil(target / usable)),
        gpus_per_replica=gpus_per_replica,
        replicas_is_upper_bound=goodput.bound.is_lower_bound,
        unit=goodput.unit,
        goodput=goodput,
        peak_requests_per_s=target * goodput.requests_per_s / per_replica,
    )


def write_configs(
    ctx: TuneContext, variant: Variant, out_dir: Path, *, best: Evaluation, replicas: int
) -> None:
    """Every deployable config of ``variant`` (see the module's docstring) in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    p99 = variant.measured.e2e_ms if variant.measured is not None else None
    if p99 is None and best.best is not None:
        p99 = best.best.load.e2e_ms  # not confirmed: the best trial's held level
    cfg = deployment(
        ctx, variant.params, p99_e2e_ms=p99.p99 if p99 is not None else None, replicas=replicas
    )
    (out_dir / "vllm-args.txt").write_text(vllm_args(cfg), encoding="utf-8")
    (out_dir / "vllm-config.yaml").write_text(vllm_config_yaml(cfg), encoding="utf-8")
    (out_dir / "kubernetes.yaml").write_text(kubernetes_manifests(cfg), encoding="utf-8")
    switch = kubernetes_switch(cfg)
    if switch is not None:
        (out_dir / "kubernetes-switch.yaml").write_text(switch, encoding="utf-8")
    (out_dir / "warmup.py").write_text(warmup_script(warmup_plan_of(cfg)), encoding="utf-8")
    (out_dir / "warmup-job.yaml").write_text(warmup_job_manifests(cfg), encoding="utf-8")


def recommend(
    ctx: TuneContext,
    setup: StudySetup,
    *,
    best_number: int,
    best: Evaluation,
    default: Evaluation | None,
    edge: EdgeResult | None,
    registry: ChildRegistry,
    progress: Any,
    start_rate: Callable[[TrialParams], float | None] | None = None,
    budget: TimeBudget | None = None,
    deadline_s: float | None = None,
    quality: QualityResult | None = None,
    quality_rejected: QualityRejection | None = None,
    tie_break: TieBreak | None = None,
    offloading: OffloadingVerdict | None = None,
) -> Recommendation:
    """Confirm the variants (when configured), write every config, return the recommendation.
    With ``budget``, no confirmation is launched that would not end before ``deadline_s``
    (monotonic; default the budget's end): it is said, and kept in ``skipped``.
    ``quality``: the quality gate's result for ``best``'s settings where they change the
    model's numerics; ``quality_rejected``: the better trial passed over for its result
    (``tuner.search.quality_gate.gate_best``); ``tie_break``: how ``best`` was chosen of
    the trials tied with it (``tuner.search.ties``); ``offloading``: whether a CPU tier
    paid (``tuner.search.offloading_verdict``)."""
    points = variant_params(ctx, best.params, edge)
    points, cold_boot = cold_boot_variants(ctx, setup, points, edge)
    if cold_boot is not None and ctx.config.edge:
        # the recommendation launched as a pod on a new node boots: an empty compile cache
        cold_probe = probe_cold_boot(
            ctx, setup, points["recommended"], registry, progress, budget=budget,
            deadline_s=deadline_s,
        )  # fmt: skip
        cold_boot = cold_boot.model_copy(update={"measured": cold_probe})
    if cold_boot is not None:
        for line in cold_boot.lines():
            progress(f"cold boot   {line}")
    variants: list[Variant] = []
    skipped: list[str] = []
    # a level as long as the best trial's took (its warm-up included), on the clock of now
    level_s = level_estimate_s(setup, best) or 0.0
    held_rate: float | None = None  # the rate the recommendation held, for the other variants
    confirmed = False  # the recommendation's own confirmation ran
    for name, params in points.items():
        for r in ctx.space.ranges:  # stay inside what the search allowed
            value = getattr(params, r.knob.field)
            if value is not None and r.knob is not Knob.GPU_MEMORY_UTILIZATION:
                params = params.model_copy(update={r.knob.field: clamp(r, value)})
        measured: ConfirmationResult | None = None
        if ctx.config.confirm and name != "recommended" and not confirmed:
            # measured at the rate the recommendation held, they compare what headroom
            # costs: without its own confirmation there is nothing to compare them with
            line = (
                f"confirmation of {name} not started: the recommendation's own confirmation "
                "did not run"
            )
            skipped.append(line)
            progress(f"confirm     {line}")
        elif ctx.config.confirm:
            repeats = ctx.config.repeats if name == "recommended" else 1
            # The recommendation starts where the best trial held (or lower, if the
            # prediction for it says so) and climbs up to three rates. The other variants
            # are measured at the one rate the recommendation held, so the table compares
            # them under the same load: what headroom costs, not each one's own maximum.
            if name == "recommended" or held_rate is None:
                first = start_rate(params) if start_rate is not None else None
                rates = [r for r in (first, best.rate_per_s) if r]
                start = min(rates) if rates else None
            else:
                start = held_rate
            # The best trial held these settings (the recommendation's, with the edge's
            # utilization) at its rate: a confirmation that breaks there first steps down
            # gently, not by a collapse's failure share (which halved 8.31 to 4.15 once).
            held_before = (
                name == "recommended" and start is not None
                and best.rate_per_s is not None and start <= best.rate_per_s
            )  # fmt: skip
            # The recommendation with its trial's own settings: other draws on its own
            # launch at the trial's bracket, pooled with the trial's levels
            pooled = held_before and params == best.params and pools_with_trial(ctx, best)
            before = len(skipped)
            measured = confirm(
                ctx, setup, name, params, registry=registry, start_rate_per_s=start,
                repeats=repeats, max_levels=3 if name == "recommended" else 1,
                start_held=held_before, budget=budget, deadline_s=deadline_s, level_s=level_s,
                skipped=skipped,
                bracket_middle_per_s=trial_bracket_middle(best) if held_before else None,
                prior=best.levels if pooled else (),
            )  # fmt: skip
            for line in skipped[before:]:
                progress(f"confirm     {line}")
            if measured is None:
                variants.append(make_variant(ctx, name, params, None, edge))
                continue
            if name == "recommended":
                held_rate = measured.rate_per_s
                confirmed = True
            at = measured.offered_rate_per_s
            unit = measured.stated_goodput.unit.label
            interval = measured.capacity_interval
            progress(
                f"confirm     {name:<13} {params.short():<52} {measured.verdict.value:<12} "
                f"goodput {measured.stated_goodput.text()}"
                + (f" at {at:.2f} {unit} offered" if at else "")
                + (f", {interval.bracket()}" if interval is not None else "")
            )
        variants.append(make_variant(ctx, name, params, measured, edge))
    default_variant = (
        make_variant(
            ctx,
            "vllm-default",
            default.params,
            confirmed_of(ctx, setup, default.params, [default]),
            edge,
        )
        if default is not None
        else None
    )
    recommended = variants[0]
    gain = capacity_gain(
        recommended.measured.capacity_interval if recommended.measured else None,
        default_variant.measured.capacity_interval
        if default_variant is not None and default_variant.measured
        else None,
    )
    if gain is not None:
        progress(f"confirm     {gain.text()}")
    goodput = (
        recommended.measured.stated_goodput
        if recommended.measured and recommended.measured.goodput > 0
        else best.stated_goodput
    )
    flags_hash = config_hash(ctx, recommended.flags, ctx.gpus_of(recommended.params))
    rec = Recommendation(
        study=ctx.study_name,
        model=ctx.model.name,
        gpu=ctx.gpu_name,
        backend=ctx.backend,
        simulated=ctx.backend is Backend.SIM,
        vllm_version=ctx.release,  # the release measured (installed), for the gate
        workload=ctx.workload.name,
        slo=ctx.workload.slo,
        objective=ctx.config.objective.value,
        best_trial=best_number,
        recommended=recommended,
        variants=variants,
        default=default_variant,
        edge=edge,
        skipped=skipped,
        calibration=setup.calibration,
        cold_boot=cold_boot,
        capacity=capacity(ctx, goodput, gpus_per_replica=ctx.gpus_of(recommended.params)),
        capacity_gain=gain,
        quality=quality,
        quality_rejected=quality_rejected,
        tie_break=tie_break,
        offloading=offloading,
        time_scale=setup.time_scale,
        harness_version=HARNESS_VERSION,
        version_hash=flags_hash,
    )
    out = RunLayout(ctx.run_dir).recommendation_dir
    replicas = rec.capacity.replicas if rec.capacity is not None else 1
    write_configs(ctx, recommended, out, best=best, replicas=replicas)
    for variant in variants[1:]:
        write_configs(ctx, variant, out / variant.name, best=best, replicas=replicas)
    (out / RECOMMENDATION_JSON).write_text(rec.model_dump_json(indent=2), encoding="utf-8")
    return rec

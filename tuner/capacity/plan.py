"""The capacity plan: every GPU type and tensor-parallel size screened on the twin, the
fleet each needs for the peak, ranked, with the configs of the chosen and the runner-up.

``tuner capacity`` calls ``make_plan`` and ``write_plan``. An option's goodput is
measured where a ``--from`` run confirmed it (``tuner.capacity.calibration``), else
predicted by the twin with the step costs the runs taught it, and carries a range as
wide as the twin has been measured to be off. Options rank on their fleet at the low
end of that range (``tuner.capacity.fleet``): cost per hour where prices are given,
else GPUs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from tuner.capacity.calibration import CalibrationRun, Provenance, TwinFor, twin_for
from tuner.capacity.fleet import FleetSize, fleet_size, pareto_front
from tuner.capacity.option import (
    FINAL_PRECISION,
    SCREEN_PRECISION,
    OptionSpace,
    OptionStatus,
    ReplicaRun,
    Screened,
    screen_option,
)
from tuner.capacity.start import ScreenedRate, Start, start_for
from tuner.deploy import (
    DeploymentConfig,
    kubernetes_manifests,
    parse_cache_volume,
    vllm_args,
    vllm_config_yaml,
)
from tuner.drain import drain_timing
from tuner.run.goodput import GoodputUnit
from tuner.search.recommend import settings_hash
from tuner.vllm.gpus import GpuSpec, node_product_label
from tuner.vllm.space import TrialParams
from tuner.warmup import warmup_plan, warmup_script
from workloads.slo import SloAsTexts
from workloads.spec import WorkloadSpec

CAPACITY_JSON = "capacity.json"
CAPACITY_HTML = "capacity.html"
CONFIG_DIRS = ("chosen", "runner-up")


class PlanOption(BaseModel):
    """One GPU type at one tensor-parallel size, and the fleet it needs."""

    model_config = ConfigDict(frozen=True)

    gpu: str
    tensor_parallel_size: int
    status: OptionStatus
    failure: str | None = None
    params: TrialParams | None = None
    max_model_len: int | None = None
    provenance: Provenance
    source: str  # the run that measured or calibrated it, or "paper"
    simulated_measurement: bool = False  # measured on the simulated engine, not a GPU
    error: float  # the range's half-width, as a share of the goodput
    replica: ReplicaRun | None = None  # what the plan uses: measured, else predicted
    predicted: ReplicaRun | None = None  # the twin's, beside a measured one
    prediction_error: float | None = None  # predicted / measured - 1
    goodput_low: float | None = None  # per replica, the workload's unit
    goodput_high: float | None = None
    fleet: FleetSize | None = None  # at the goodput
    fleet_low: FleetSize | None = None  # at the range's low end: what the plan deploys
    fleet_high: FleetSize | None = None  # at the range's high end
    rank: int | None = None
    on_frontier: bool = False
    usd_per_gpu_hour: float | None = None

    @property
    def label(self) -> str:
        return f"{self.gpu} x{self.tensor_parallel_size}"

    @property
    def output_tokens_per_s_per_gpu(self) -> float | None:
        if self.replica is None:
            return None
        return self.replica.goodput.output_tokens_per_s / self.tensor_parallel_size

    def how_known(self) -> str:
        """ "measured [on the simulated engine]", or "predicted by the twin (calibrated,
        +-11%)"."""
        if not self.provenance.predicted:
            return "measured" + (" on the simulated engine" if self.simulated_measurement else "")
        return f"predicted by the twin ({self.provenance.value}, +-{self.error:.0%})"

    def flags(self) -> dict[str, object]:
        flags: dict[str, object] = dict(self.params.flags()) if self.params else {}
        if self.max_model_len:
            flags["max-model-len"] = self.max_model_len
        if self.tensor_parallel_size > 1:
            flags["tensor-parallel-size"] = self.tensor_parallel_size
        return flags


class CapacityPlan(BaseModel):
    """``capacity.json``."""

    model_config = ConfigDict(frozen=True)

    model: str
    workload: str
    slo: SloAsTexts  # recorded as its objectives' texts, e.g. "ttft p99 <= 2000 ms"
    unit: str
    peak: float
    headroom: float
    vllm_version: str
    prices_given: bool
    runs: list[str] = Field(default_factory=list)  # the --from run directories
    options: list[PlanOption]
    chosen: PlanOption | None
    runner_up: PlanOption | None
    notes: list[str] = Field(default_factory=list)
    wall_s: float = 0.0
    twin_runs: int = 0


def _ranges(replica: ReplicaRun | None, error: float) -> tuple[float | None, float | None]:
    if replica is None:
        return None, None
    mid = replica.goodput.arrival_rate_per_s
    return mid * (1.0 - error), mid * (1.0 + error)


def _fleets(
    option: PlanOption, peak: float, headroom: float
) -> tuple[FleetSize | None, FleetSize | None, FleetSize | None]:
    replica = option.replica
    if replica is None or option.goodput_low is None or option.goodput_high is None:
        return None, None, None

    def at(goodput: float) -> FleetSize | None:
        if goodput <= 0:
            return None
        return fleet_size(
            peak=peak, goodput_per_replica=goodput, headroom=headroom,
            tensor_parallel_size=option.tensor_parallel_size,
            usd_per_gpu_hour=option.usd_per_gpu_hour,
            output_tokens_per_unit=replica.output_tokens_per_unit,
        )  # fmt: skip

    return at(replica.goodput.arrival_rate_per_s), at(option.goodput_low), at(option.goodput_high)


def _rank_key(option: PlanOption) -> tuple[float, float, float]:
    low = option.fleet_low
    assert low is not None
    cost = low.usd_per_hour if low.usd_per_hour is not None else float(low.gpus)
    per_gpu = option.output_tokens_per_s_per_gpu or 0.0
    return cost, float(low.gpus), -per_gpu


def _measured_replica(run: CalibrationRun) -> tuple[TrialParams, ReplicaRun] | None:
    rec = run.recommendation
    if rec is None or rec.recommended.measured is None:
        return None
    m = rec.recommended.measured
    if m.goodput <= 0:
        return None
    return rec.recommended.params, ReplicaRun(
        goodput=m.stated_goodput, ttft_ms_p99=m.ttft_ms.p99 if m.ttft_ms else None,
        tpot_ms_mean=m.tpot_ms.mean if m.tpot_ms else None,
        tpot_ms_p99=m.tpot_ms.p99 if m.tpot_ms else None,
        e2e_ms_p99=m.e2e_ms.p99 if m.e2e_ms else None, kv_cache_tokens=m.kv_cache_tokens,
    )  # fmt: skip


def _option(
    space: OptionSpace,
    gpu: GpuSpec,
    tp: int,
    twin: TwinFor,
    start: Start,
    price: float | None,
    measured: tuple[TrialParams, ReplicaRun] | None,
    source: CalibrationRun | None,
) -> tuple[PlanOption, int]:
    """One option screened (the measured settings where a run confirmed them)."""
    screened: Screened = screen_option(
        space, gpu, tp, twin.factors, start_rate_per_s=start.rate_per_s,
        params=measured[0] if measured else None,
        first_step=1.0 + SCREEN_PRECISION if start.estimated else None,
    )  # fmt: skip
    provenance, error = twin.provenance, twin.error_at(tp)
    replica = screened.replica
    predicted: ReplicaRun | None = None
    prediction_error: float | None = None
    if measured is not None:
        provenance, predicted, replica = Provenance.MEASURED, screened.replica, measured[1]
        error = FINAL_PRECISION
        if predicted is not None:
            measured_rate = replica.goodput.arrival_rate_per_s
            prediction_error = predicted.goodput.arrival_rate_per_s / measured_rate - 1.0
    low, high = _ranges(replica, error)
    status = OptionStatus.SERVES if replica is not None else screened.status
    option = PlanOption(
        gpu=gpu.name, tensor_parallel_size=tp, status=status, failure=screened.failure,
        params=screened.params, max_model_len=screened.max_model_len, provenance=provenance,
        source=twin.source if source is None else str(source.run_dir),
        simulated_measurement=bool(source and source.simulated and measured),
        error=error, replica=replica, predicted=predicted, prediction_error=prediction_error,
        goodput_low=low, goodput_high=high, usd_per_gpu_hour=price,
    )  # fmt: skip
    return option, screened.runs


def _twin_pick_note(
    space: OptionSpace, gpu: GpuSpec, tp: int, twin: TwinFor, option: PlanOption
) -> tuple[str | None, int]:
    """Beside a measured option (the settings its tune measured, over that tune's space):
    the twin's own settings for the GPU type, where they predict more than the measured
    goodput beyond the twin's range. The plan keeps the measured figure; the note says a
    tune over the twin's settings may find more. The note (or None) and the twin runs."""
    assert option.replica is not None
    measured = option.replica.goodput.arrival_rate_per_s
    screened = screen_option(space, gpu, tp, twin.factors, start_rate_per_s=measured)
    pick = screened.replica
    error = twin.error_at(tp)
    if pick is None or screened.params is None:
        return None, screened.runs
    predicted = pick.goodput.arrival_rate_per_s
    if predicted * (1.0 - error) <= measured:
        return None, screened.runs
    flags = " ".join(f"--{k} {v}" for k, v in screened.params.flags().items())
    return (
        f"{option.label}: the twin's own settings ({flags}) predict {predicted:.2f} per "
        f"replica (+-{error:.0%}) against the {measured:.2f} measured with the tune's; the "
        f"plan keeps the measurement; a tune whose space holds them may find more "
        f"(tuner tune --gpu {gpu.name} ...)",
        screened.runs,
    )


def make_plan(
    *,
    space: OptionSpace,
    gpus: list[GpuSpec],
    tensor_parallel_sizes: list[int],
    peak: float,
    headroom: float,
    prices: dict[str, float],
    runs: list[CalibrationRun],
    progress: Callable[[str], None] = lambda _: None,
) -> CapacityPlan:
    """Screen every option, size its fleet, rank (the module's docstring)."""
    began = time.monotonic()
    notes: list[str] = []
    heads = space.model.num_attention_heads
    options: list[PlanOption] = []
    done: list[ScreenedRate] = []
    twin_runs = 0
    default_start = space.workload.mean_rate_per_s or 1.0
    for gpu in gpus:
        twin = twin_for(gpu, runs)
        for tp in tensor_parallel_sizes:
            if heads % tp:
                notes.append(f"tensor-parallel {tp} left out: {space.model.name}'s {heads} "
                             f"attention heads do not divide by it")  # fmt: skip
                continue
            own = twin.run
            measured = None
            if (
                own is not None
                and own.tensor_parallel_size == tp
                and own.matches(space.model.name, space.workload)
            ):
                measured = _measured_replica(own)
            option, n = _option(
                space, gpu, tp, twin, start_for(done, gpu, tp, default_start),
                prices.get(gpu.name), measured, own if measured else None,
            )  # fmt: skip
            twin_runs += n
            if measured is not None and option.replica is not None:
                note, n = _twin_pick_note(space, gpu, tp, twin, option)
                twin_runs += n
                notes += [note] if note else []
            if option.replica is not None:
                done.append(ScreenedRate(gpu, tp, option.replica.goodput.arrival_rate_per_s))
            fleet, fleet_low, fleet_high = _fleets(option, peak, headroom)
            option = option.model_copy(
                update={"fleet": fleet, "fleet_low": fleet_low, "fleet_high": fleet_high}
            )
            options.append(option)
            progress(_progress_line(option))
    ranked = sorted((o for o in options if o.fleet_low is not None), key=_rank_key)
    # The top two again, to the final precision (their screen's bracket was coarser).
    refined: list[PlanOption] = []
    for option in ranked[:2]:
        if option.provenance is Provenance.MEASURED or option.replica is None:
            refined.append(option)
            continue
        gpu = next(g for g in gpus if g.name == option.gpu)
        twin = twin_for(gpu, runs)
        screened = screen_option(
            space, gpu, option.tensor_parallel_size, twin.factors,
            start_rate_per_s=option.replica.goodput.arrival_rate_per_s, params=option.params,
            # from the screen's goodput, which held: the edge is most likely just above it
            precision=FINAL_PRECISION, first_step=1.0 + FINAL_PRECISION,
        )  # fmt: skip
        twin_runs += screened.runs
        if screened.replica is None:
            refined.append(option)
            continue
        low, high = _ranges(screened.replica, option.error)
        option = option.model_copy(
            update={"replica": screened.replica, "goodput_low": low, "goodput_high": high}
        )
        fleet, fleet_low, fleet_high = _fleets(option, peak, headroom)
        refined.append(option.model_copy(
            update={"fleet": fleet, "fleet_low": fleet_low, "fleet_high": fleet_high}
        ))  # fmt: skip
    ranked = sorted([*refined, *ranked[2:]], key=_rank_key)
    serving = [o for o in ranked if o.replica is not None]
    points = [
        (o.output_tokens_per_s_per_gpu or 0.0, o.replica.output_tokens_per_s_per_user or 0.0)
        for o in serving
        if o.replica is not None
    ]
    front = set(pareto_front(points))
    final = [
        o.model_copy(update={"rank": i + 1, "on_frontier": i in front})
        for i, o in enumerate(serving)
    ]
    rest = [o for o in options if o.replica is None]
    pcie = [g.name for g in gpus if g.nvlink_bytes_per_s is None and any(
        o.gpu == g.name and o.tensor_parallel_size > 1 for o in final)]  # fmt: skip
    if pcie:
        notes.append(
            f"{', '.join(pcie)} {'have' if len(pcie) > 1 else 'has'} no NVLink: "
            "tensor-parallel options there exchange "
            "all-reduces over PCIe, at PCIe's rate in the twin; no published result checks "
            "the twin there, so measure one before buying on it"
        )
    if not final:
        notes.append("no option holds the SLO at any rate: loosen the SLO or add GPU types")
    unit = GoodputUnit.of(space.workload).label  # the peak's unit, whether or not any option serves
    return CapacityPlan(
        model=space.model.name, workload=space.workload.name,
        slo=space.workload.slo,
        unit=unit, peak=peak, headroom=headroom,
        vllm_version=str(space.version), prices_given=bool(prices),
        runs=[str(r.run_dir) for r in runs], options=[*final, *rest],
        chosen=final[0] if final else None, runner_up=final[1] if len(final) > 1 else None,
        notes=notes, wall_s=time.monotonic() - began, twin_runs=twin_runs,
    )  # fmt: skip


def _progress_line(option: PlanOption) -> str:
    if option.replica is None:
        return f"screen  {option.label:<22} {option.status.value}: {option.failure or ''}"
    return (
        f"screen  {option.label:<22} {option.params.short() if option.params else '':<36} "
        f"{option.replica.goodput.arrival_rate_per_s:8.2f} per replica ({option.provenance.value})"
    )


def deployment_of(
    plan: CapacityPlan, option: PlanOption, workload: WorkloadSpec, *, cache_volume: str = "pvc"
) -> DeploymentConfig:
    """The option deployed: its flags, the replicas of its fleet at the range's low end,
    pods pinned to its GPU type."""
    from tuner.vllm.gpus import get_gpu

    flags = option.flags()
    flags.pop("tensor-parallel-size", None)  # the config's own field
    product = node_product_label(get_gpu(option.gpu))
    replica = option.replica
    seqs = option.params.max_num_seqs if option.params else None
    return DeploymentConfig.build(
        model=plan.model, vllm_version=plan.vllm_version,
        config_hash=settings_hash(
            flags, model=plan.model, gpu=option.gpu, vllm_version=plan.vllm_version,
            workload=workload, max_model_len=option.max_model_len,
            tensor_parallel_size=option.tensor_parallel_size,
        ),
        tensor_parallel_size=option.tensor_parallel_size,
        cache_volume=parse_cache_volume(cache_volume),
        warmup=warmup_plan(workload, plan.model, concurrency=max(1, min(seqs or 8, 64))),
        drain=drain_timing(replica.e2e_ms_p99 if replica else None),
        replicas=option.fleet_low.replicas if option.fleet_low else 1,
        flags=flags, node_selector={"nvidia.com/gpu.product": product} if product else {},
        labels={"app.kubernetes.io/managed-by": "vllm-capacity-tuner"},
    )  # fmt: skip


def write_plan(plan: CapacityPlan, workload: WorkloadSpec, out_dir: Path) -> list[Path]:
    """``capacity.json`` and the configs of the chosen option and the runner-up."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / CAPACITY_JSON]
    written[0].write_text(plan.model_dump_json(indent=2) + "\n", encoding="utf-8")
    for name, option in zip(CONFIG_DIRS, (plan.chosen, plan.runner_up), strict=True):
        if option is None:
            continue
        cfg = deployment_of(plan, option, workload)
        folder = out_dir / name
        folder.mkdir(exist_ok=True)
        files = {
            "vllm-args.txt": vllm_args(cfg),
            "vllm-config.yaml": vllm_config_yaml(cfg),
            "kubernetes.yaml": kubernetes_manifests(cfg),
            "warmup.py": warmup_script(cfg.warmup) if cfg.warmup else "",
        }
        for file, text in files.items():
            (folder / file).write_text(text, encoding="utf-8")
            written.append(folder / file)
    return written

"""What the ``--from`` runs teach the plan: the twin's step costs per GPU type, how far
off its goodput predictions were, and the goodputs a run measured itself.

A tune's run directory (``tuner tune``) keeps the twin's timing factors fitted to its
measured levels (``twin.json``) and, once confirmed, the recommendation measured at
its goodput (``recommendation/recommendation.json``). For a GPU type in the plan:

* **measured**: a run of this model, workload and SLO on this GPU type at this
  tensor-parallel size confirmed a recommendation: its settings and goodput are the
  option's, measured (on the simulated engine where the run was simulated; said so);
* **calibrated**: a run on this GPU type fitted the twin: its factors, and a range
  as wide as the fitted twin's goodput predictions were off that run's measurements;
* **transferred**: no run on this GPU type, but one on another: the host-side costs
  (a step's scheduling, a request's API handling) carry over to every GPU, the
  efficiencies (MFU, MBU) only within an architecture (the compute capability's
  major version); the range is the paper twin's, as the transfer is not measured;
* **paper**: the twin's datasheet factors; the range from its published-results error.

A tensor-parallel size other than the one a run measured adds the twin's measured
multi-GPU error to the range (its all-reduces are not what that run calibrated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError, RunFileError
from tuner.run.reader import RunReader
from tuner.run.recommendation import Recommendation
from tuner.run.twin_record import TrialFit
from tuner.sim.timing import TimingFactors
from tuner.twin.fit import GOODPUT_TOLERANCE, read_twin
from tuner.vllm.gpus import GpuSpec, recorded_gpu
from workloads.spec import WorkloadSpec

# The paper twin's goodput error: the larger of its median throughput error against 12
# published vLLM results (8.8 %, ``benchmarks/twin_fidelity.py``) and its median TTFT error
# (40.5 %), which decides goodput where a TTFT objective binds. A range of +-40 % is wide;
# a calibrating run narrows it to what that run measured.
PAPER_ERROR = 0.40
# Tensor-parallel predictions off a calibrated single setting: the all-reduces and the
# split of the weights are not what a run at another size calibrated. The twin's median
# throughput error against 8 published tensor-parallel vLLM results is 5.9 %
# (``benchmarks/twin_tensor_parallel.py``: 1.9 % at TP 2; 16-43 % at TP 4 and 8, where
# all four cases are one MoE model on H100s). None of them ran over PCIe.
TENSOR_PARALLEL_ERROR = 0.06
HOST_FACTORS = ("step_overhead_s", "per_seq_overhead_s", "request_overhead_s")
DEVICE_FACTORS = ("mfu", "mbu")


class Provenance(StrEnum):
    MEASURED = "measured"
    CALIBRATED = "calibrated"
    TRANSFERRED = "transferred"
    PAPER = "paper"

    @property
    def predicted(self) -> bool:
        return self is not Provenance.MEASURED


@dataclass(frozen=True)
class CalibrationRun:
    """One ``--from`` run, as the plan uses it."""

    run_dir: Path
    model: str
    gpu: GpuSpec
    simulated: bool
    tensor_parallel_size: int
    workload: dict[str, Any]  # the resolved workload it was tuned on
    factors: TimingFactors | None  # the twin fitted to it (None: it fitted nothing)
    fits: tuple[TrialFit, ...]
    recommendation: Recommendation | None

    @property
    def goodput_error(self) -> float | None:
        """How far the fitted twin's goodput predictions were off this run's measurements:
        the largest share over the trials predicted with fitted factors (each trial's
        prediction before it was measured, from the fits of the trials before), at least
        the measurement's own precision; with one fit, that fit's own. None: no trial
        has both a prediction and a measurement."""
        shares = [
            TrialFit.share_off(f.predicted_rate_per_s, f.measured_rate_per_s) for f in self.fits[1:]
        ]
        found = [abs(s) for s in shares if s is not None]
        if not found and self.fits:
            one = TrialFit.share_off(self.fits[0].predicted_after_per_s, self.fits[0].measured_rate_per_s)  # fmt: skip
            found = [abs(one)] if one is not None else []
        if not found:  # no goodput predicted: the fitted twin's latency error on the levels
            found = [f.error_after for f in self.fits if f.adopted and f.error_after is not None][-1:]  # fmt: skip
        return max(GOODPUT_TOLERANCE, *found) if found else None

    def matches(self, model: str, workload: WorkloadSpec) -> bool:
        """Whether its recommendation's goodput is this plan's: the same model, and the
        same workload shape and SLO (its rate and duration aside)."""
        ignore = ("arrival", "duration_s")
        ours = {k: v for k, v in workload.model_dump(mode="json").items() if k not in ignore}
        theirs = {k: v for k, v in self.workload.items() if k not in ignore}
        return self.model == model and ours == theirs


def read_run(run_dir: Path) -> CalibrationRun:
    """A ``--from`` run directory; ConfigError of one line when it is not one."""
    reader = RunReader(run_dir)
    layout = reader.layout
    accepted = "accepted: the run directory of a `tuner tune` (it holds tune.json and twin.json)"
    if not reader.is_run():
        raise ConfigError(f"--from {str(run_dir)!r} has no tune.json; {accepted}")
    try:
        tune = reader.tune_document()
    except RunFileError as exc:
        if not isinstance(exc.cause, OSError | ValueError):  # a document, not an object
            raise ConfigError(
                f"--from {str(run_dir)!r} was tuned on no GPU type (vLLM's CPU build): its step "
                "costs are a CPU's; accepted: a tune on a GPU (real, or the simulated engine's "
                "profile of one)"
            ) from exc
        raise ConfigError(f"--from {str(run_dir)!r}: tune.json cannot be read ({exc.cause}); {accepted}") from exc  # fmt: skip
    if not tune.get("gpu"):
        raise ConfigError(
            f"--from {str(run_dir)!r} was tuned on no GPU type (vLLM's CPU build): its step "
            "costs are a CPU's; accepted: a tune on a GPU (real, or the simulated engine's "
            "profile of one)"
        )
    gpu = recorded_gpu(str(tune["gpu"]), tune.get("gpu_profile"))  # as the run planned
    twin = read_twin(run_dir) if layout.twin_json.is_file() else None
    try:
        rec = reader.recommendation()
    except RunFileError:
        rec = None  # an older or damaged recommendation: its factors still count
    if twin is None and rec is None:
        raise ConfigError(
            f"--from {str(run_dir)!r} has neither twin.json nor a recommendation; "
            "accepted: a tune that measured at least one level"
        )
    found = tune.get("config")
    config: dict[str, Any] = found if isinstance(found, dict) else {}
    workload = tune.get("workload")
    fitted = twin is not None and any(f.adopted for f in twin.fits)
    # A tune that searched the tensor-parallel size recommends one of its own
    searched = rec.recommended.params.tensor_parallel_size if rec is not None else None
    return CalibrationRun(
        run_dir=run_dir, model=str(tune.get("model", "")), gpu=gpu,
        simulated=tune.get("backend") == "sim",
        tensor_parallel_size=searched or int(config.get("tensor_parallel_size") or 1),
        workload=workload if isinstance(workload, dict) else {},
        factors=twin.factors if twin is not None and fitted else None,
        # the trials the twin replayed: one that left it no level (a lagging load
        # generator) predicted nothing from a fit and says nothing of its error
        fits=tuple(f for f in twin.fits if f.levels) if twin is not None else (),
        recommendation=rec,
    )  # fmt: skip


@dataclass(frozen=True)
class TwinFor:
    """The twin's step costs for one GPU type and how sure of them the plan is."""

    factors: TimingFactors
    provenance: Provenance
    error: float  # the range's half-width, as a share of the goodput
    source: str  # which run, or "paper"
    run: CalibrationRun | None = None  # the run that calibrated this GPU type

    def error_at(self, tensor_parallel_size: int) -> float:
        """The range at a tensor-parallel size: a calibration at another size adds the
        twin's multi-GPU error (in quadrature)."""
        if self.run is None or self.run.tensor_parallel_size == tensor_parallel_size:
            return self.error
        return math.hypot(self.error, TENSOR_PARALLEL_ERROR)


def twin_for(gpu: GpuSpec, runs: list[CalibrationRun]) -> TwinFor:
    """The factors and range for ``gpu`` from ``runs`` (the module's docstring)."""
    fitted = [r for r in runs if r.factors is not None]
    own = [r for r in fitted if r.gpu.name == gpu.name]
    if own:
        run = max(own, key=lambda r: len(r.fits))
        assert run.factors is not None
        error = run.goodput_error
        return TwinFor(
            factors=run.factors, provenance=Provenance.CALIBRATED,
            error=PAPER_ERROR if error is None else min(error, PAPER_ERROR),
            source=str(run.run_dir), run=run,
        )  # fmt: skip
    if not fitted:
        return TwinFor(TimingFactors(), Provenance.PAPER, PAPER_ERROR, "paper")
    host = max(fitted, key=lambda r: len(r.fits))
    same_arch = [r for r in fitted if r.gpu.compute_capability[0] == gpu.compute_capability[0]]
    update: dict[str, float] = {k: getattr(host.factors, k) for k in HOST_FACTORS}
    sources = [f"host costs from {host.gpu.name}"]
    if same_arch:
        device = max(same_arch, key=lambda r: len(r.fits))
        update.update({k: getattr(device.factors, k) for k in DEVICE_FACTORS})
        sources.append(f"MFU/MBU from {device.gpu.name}")
    factors = TimingFactors().model_copy(update={**update, "source": "; ".join(sources)})
    return TwinFor(factors, Provenance.TRANSFERRED, PAPER_ERROR, factors.source)

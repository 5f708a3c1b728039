"""The memory model's calibration in the boot state production pods start in.

A tune calibrates the memory model from the first startup log that measured vLLM's budget,
trial 0's, which is usually a cold boot: the run's compile cache is empty, so torch.compile
runs inside vLLM's memory profile and its memory is charged as activation
(``tuner.vllm.boot``). Production pods that mount a filled compile cache boot warm, with a
larger KV cache. Every measured trial's log says which boot it was (its torch.compile lines,
``StartupReport.boot_state``); the calibration records it, and is converted to the
production boot (``--production-boot``, default warm):

* calibrated from a boot in the production state: kept as it is;
* from the other state: the compile memory is taken off (cold to warm) or added (warm to
  cold) by the model's factor, until a later trial boots in the production state; then the
  memory model is calibrated again from that one, and the pair of boots measures this run's
  own compile factor, which later cold predictions (a new node) use.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.vllm.boot import (
    COLD_COMPILE_FACTOR,
    COLD_COMPILE_SOURCE,
    BootState,
    measured_compile_factor,
)
from tuner.vllm.gpus import GiB, GpuSpec
from tuner.vllm.memory import Calibration, MemoryComponent, ServingParams, plan
from tuner.vllm.models import ModelSpec
from tuner.vllm.versions import VllmVersion


@dataclass(frozen=True)
class BootCalibration:
    """A calibration to adopt, and the tune's line saying which boot it came from."""

    calibration: Calibration
    line: str


def wants(current: Calibration | None, production: BootState) -> bool:
    """Whether a new startup could improve ``current``: none yet, or one measured in the
    other boot state than production's."""
    if current is None:
        return True
    return current.boot_state is not None and current.boot_state is not production


def adopt(
    current: Calibration | None,
    found: Calibration,
    *,
    production: BootState,
    settings: ServingParams,
    model: ModelSpec,
    gpu: GpuSpec,
    version: VllmVersion,
) -> BootCalibration | None:
    """The calibration to use after a startup that gave ``found`` (at ``settings``), in the
    production boot; None where ``current`` stays."""
    if not wants(current, production):
        return None
    state = found.boot_state
    if current is not None and state is not production:
        return None  # not better than the one in use
    if state is None:
        note = (
            f"{found.source}: its log shows no torch.compile lines (--enforce-eager, or a "
            "release that does not print them), taken as the production boot"
        )
    elif state is production:
        note = f"{found.source}: a {state.describe()}, as production pods boot ({production.value})"
    else:
        note = (
            f"{found.source}: a {state.describe()}; production pods boot {production.value}: "
            f"converted by the compile factor {COLD_COMPILE_FACTOR:g} x the warm activation "
            f"({COLD_COMPILE_SOURCE}) until a trial boots {production.value}"
        )
    factor: float | None = None
    if current is not None and current.boot_state is not None and state is not None:
        cold, warm = (current, found) if state is BootState.WARM else (found, current)
        factor = _measured_factor(cold, warm, settings, model, gpu, version)
        if factor is not None:
            compiled = _activation(warm, settings, model, gpu, version) or 0
            note += (
                f"; this run's cold and warm boots measure torch.compile's memory at "
                f"{factor:.2f} x the warm activation ({compiled * factor / GiB:.2f} GiB at "
                "these settings), used for cold boots on a new node"
            )
    adopted = found.model_copy(
        update={"production_boot": production, "compile_factor": factor, "boot_note": note}
    )
    verb = "calibrated" if current is None else "calibrated again"
    return BootCalibration(adopted, f"memory model {verb} from {note}")


def _activation(
    cal: Calibration,
    settings: ServingParams,
    model: ModelSpec,
    gpu: GpuSpec,
    version: VllmVersion,
) -> int | None:
    """The activation ``cal`` gives at ``settings`` as it was measured (no boot conversion);
    None where its log measured none."""
    raw = cal.model_copy(update={"boot_state": None})
    p = plan(model, gpu, settings, version, raw)
    if p.calibration is None:
        return None
    known = set(p.calibration.measured) | set(p.calibration.derived)
    return p.activation_bytes if MemoryComponent.ACTIVATION in known else None


def _measured_factor(
    cold: Calibration,
    warm: Calibration,
    settings: ServingParams,
    model: ModelSpec,
    gpu: GpuSpec,
    version: VllmVersion,
) -> float | None:
    """The compile factor a cold and a warm boot measure, both shifted to ``settings``."""
    cold_bytes = _activation(cold, settings, model, gpu, version)
    warm_bytes = _activation(warm, settings, model, gpu, version)
    if cold_bytes is None or warm_bytes is None:
        return None
    return measured_compile_factor(cold_bytes, warm_bytes)

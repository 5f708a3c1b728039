"""The recommendation on a cold boot on a new node, in ``recommendation.json``.

A pod on a new node starts with an empty compile cache: vLLM compiles inside its memory
profile and sizes a smaller KV cache (``tuner.vllm.boot``), so a setting near the lower
``--gpu-memory-utilization`` edge (or a ``--max-model-len`` the KV cache barely holds)
starts warm and fails cold. ``ColdBootCheck`` is what the calibrated memory model says of
the recommended settings on such a boot, and what the recommendation did about it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from tuner.vllm.boot import BootState
from tuner.vllm.failures import StartupFailure

GIB = 1 << 30


class ColdBootProbe(BaseModel):
    """The recommended settings launched once with an empty compile cache (a cold boot on
    a new node), up to ready or its failure; ``edge/cold-boot/``."""

    model_config = ConfigDict(frozen=True)

    started: bool
    boot_state: BootState | None  # what its log shows (cold, unless vLLM compiled nothing)
    kv_cache_tokens: int | None
    failure: StartupFailure | None = None  # vLLM's words where it did not start
    dir: str

    def line(self) -> str:
        if self.started:
            tokens = f" with {self.kv_cache_tokens:,} KV tokens" if self.kv_cache_tokens else ""
            return f"measured: launched with an empty compile cache, it started{tokens}"
        return (
            "measured: launched with an empty compile cache, it did NOT start "
            f"({self.failure.describe() if self.failure else 'see its log'}; {self.dir})"
        )


class ColdBootCheck(BaseModel):
    """The recommended settings on a cold boot (empty compile cache), predicted."""

    model_config = ConfigDict(frozen=True)

    production_boot: BootState  # the boot the tune's capacity figures are for
    calibrated: bool  # the memory model calibrated from this run's startups
    compile_factor: float  # torch.compile's memory on a cold boot, x the warm activation
    factor_source: str  # measured by this run's cold and warm boots, or the public figure
    compile_bytes: int  # what a cold boot charges at the recommended settings
    warm_kv_cache_tokens: int
    cold_kv_cache_tokens: int | None  # None: it does not start cold
    starts_cold: bool
    cold_failure: StartupFailure | None = None  # what vLLM would say on a cold boot
    # The lowest --gpu-memory-utilization that starts, cold and warm (None: none does).
    lowest_utilization_cold: float | None = None
    lowest_utilization_warm: float | None = None
    margin: float  # utilization kept above the cold edge (--safety-margin)
    utilization: float  # the recommended --gpu-memory-utilization
    # The utilization before the recommendation was raised to start cold with the margin
    # (None: it already did)
    raised_from: float | None = None
    # The recommendation launched cold (None: not launched, or the time budget had no room)
    measured: ColdBootProbe | None = None

    @property
    def cold_share_lost(self) -> float | None:
        """The share of the warm KV cache a cold boot does not get."""
        if self.cold_kv_cache_tokens is None or self.warm_kv_cache_tokens <= 0:
            return None
        return 1 - self.cold_kv_cache_tokens / self.warm_kv_cache_tokens

    def lines(self) -> list[str]:
        """The check in words, for the tune's output and the report's memory section."""
        compile_gib = self.compile_bytes / GIB
        head = (
            f"cold boot on a new node (empty compile cache): torch.compile's "
            f"{compile_gib:.2f} GiB is charged in vLLM's memory profile "
            f"({self.compile_factor:.2f} x the warm activation, {self.factor_source})"
        )
        out = [head]
        lost = self.cold_share_lost
        if self.starts_cold and lost is not None:
            out.append(
                f"it starts cold with {self.cold_kv_cache_tokens:,} KV tokens against "
                f"{self.warm_kv_cache_tokens:,} warm ({lost:.1%} fewer) until a restart finds "
                "the compile cache; the capacity figures are for a "
                f"{self.production_boot.value} boot"
            )
        elif not self.starts_cold:
            why = self.cold_failure.describe() if self.cold_failure else "out of memory"
            out.append(
                f"at --gpu-memory-utilization {self.utilization:g} it does NOT start cold "
                f"({why}): pre-fill the compile cache on its volume (the warm-up) before pods "
                "on new nodes take traffic, or lower --max-model-len"
            )
        cold_edge, warm_edge = (
            _value(self.lowest_utilization_cold),
            _value(self.lowest_utilization_warm),
        )
        if self.raised_from is not None:
            out.append(
                f"--gpu-memory-utilization raised from {self.raised_from:g} to "
                f"{self.utilization:g}: the lowest that starts cold is {cold_edge} (warm "
                f"{warm_edge}), plus the {self.margin:g} margin"
            )
        elif self.lowest_utilization_cold is not None:
            out.append(
                f"lowest --gpu-memory-utilization that starts: {cold_edge} "
                f"cold, {warm_edge} warm; the recommendation's "
                f"{self.utilization:g} keeps {self.utilization - self.lowest_utilization_cold:.2f} "
                "above the cold edge"
            )
        if self.measured is not None:
            out.append(self.measured.line())
        if not self.calibrated:
            out.append("(the memory model was not calibrated by a startup of this run)")
        return out


def _value(value: float | None) -> str:
    return "none" if value is None else f"{value:g}"

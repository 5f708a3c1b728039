"""Which settings change what the model computes, and the setting that keeps its own numerics.

Most knobs change how much vLLM serves, not what the model answers. A few change the
numbers the model computes with: ``--kv-cache-dtype fp8`` stores every key and value in
8 bits (half the bytes of a bf16 model's, so twice the tokens in the same memory), and
the model's outputs drift from its own dtype's. ``NUMERICS_KNOBS`` names each such knob
with the value that keeps the model's own numerics (``auto``: the KV cache in the
model's dtype); a setting with any other value there changes numerics, and
``tuner.search.quality_gate`` compares it with the same setting at the model's own
values before it can be recommended. A knob that changes numerics joins by one entry here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from tuner.vllm.space import Choice, Knob, TrialParams

# Each knob that changes the model's numerics, with the value that keeps its own.
NUMERICS_KNOBS: Mapping[Knob, Choice] = MappingProxyType({Knob.KV_CACHE_DTYPE: "auto"})


@dataclass(frozen=True)
class NumericsChange:
    """One knob of a setting away from the model's own numerics."""

    knob: Knob
    value: Choice
    reference: Choice  # the value that keeps the model's own numerics

    def text(self) -> str:
        """E.g. ``--kv-cache-dtype fp8 (the model's own: auto)``."""
        return f"{self.knob.flag} {self.value} (the model's own: {self.reference})"


def numerics_changes(params: TrialParams) -> tuple[NumericsChange, ...]:
    """The knobs of ``params`` that change the model's numerics (empty: none does)."""
    changes: list[NumericsChange] = []
    for knob, reference in NUMERICS_KNOBS.items():
        value = getattr(params, knob.field)
        if value is not None and value != reference:
            changes.append(NumericsChange(knob=knob, value=value, reference=reference))
    return tuple(changes)


def changes_numerics(params: TrialParams) -> bool:
    return bool(numerics_changes(params))


def with_model_numerics(params: TrialParams) -> TrialParams:
    """``params`` with every knob of ``NUMERICS_KNOBS`` at the model's own value: the
    reference a setting that changes numerics is compared with (its other knobs kept)."""
    return params.model_copy(update={knob.field: ref for knob, ref in NUMERICS_KNOBS.items()})


def numerics_flags(params: TrialParams) -> dict[str, Choice]:
    """The numerics knobs of ``params`` as flag names and values, the model's own values
    included (e.g. ``{"kv-cache-dtype": "auto"}``), for the gate's record."""
    return {knob.value: getattr(params, knob.field) for knob in NUMERICS_KNOBS}

"""The settings a study was set up with (``StudySettings``, a study attribute): the ones
recorded in a run, how two sets differ, and the refusals of a run given other
settings or another measurement than its study's.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict

from tuner.errors import ConfigError
from tuner.run.config import TuneConfig
from tuner.search.context import TuneContext
from tuner.vllm.space import Range


class StudySettings(BaseModel):
    """What a study's trials are measured under. A run directory belongs to one study and a
    study to one set of these: a trial measured under others would not compare, so
    continuing (``--resume``) with other settings is refused. What may change on resume:
    the trial count, the time budget, the seed, the edge search and the confirmations."""

    model_config = ConfigDict(frozen=True)

    study: str
    model: str
    gpu: str | None
    backend: str
    vllm_version: str
    workload: dict[str, Any]  # the resolved workload spec, SLO overrides applied
    objective: str
    space: dict[str, str]  # knob -> its range as --space writes it
    max_model_len: int | None
    kv_cache_memory_bytes: int | None
    tensor_parallel_size: int
    level_duration_s: float | None = None
    level_warmup_s: float | None = None
    level_max_duration_s: float | None = None
    max_levels: int
    chain_levels: bool = False

    @classmethod
    def of(cls, ctx: TuneContext) -> StudySettings:
        c = ctx.config
        return cls(
            study=ctx.study_name, model=ctx.model.name, gpu=ctx.gpu_name,
            backend=ctx.backend.value, vllm_version=str(ctx.version),
            workload=ctx.workload.model_dump(mode="json"), objective=c.objective.value,
            space={r.knob.value: r.describe() for r in ctx.space.ranges},
            max_model_len=c.max_model_len, kv_cache_memory_bytes=c.kv_cache_memory_bytes,
            tensor_parallel_size=c.tensor_parallel_size, level_duration_s=c.level_duration_s,
            level_warmup_s=c.level_warmup_s, level_max_duration_s=c.level_max_duration_s,
            max_levels=c.max_levels, chain_levels=c.chain_levels,
        )  # fmt: skip

    def flat(self) -> dict[str, Any]:
        return _flatten(self.model_dump(mode="json"))


SETTINGS_ATTR = "settings"  # study attribute: the StudySettings it was set up with


def _flatten(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested documents as dotted keys of their leaves (``workload.slo.ttft.p99_ms``)."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def recorded_settings(tune_json: dict[str, Any]) -> dict[str, Any]:
    """What a run's ``tune.json`` (``tuner.search.tune.describe``) says it was tuned with, flat;
    the fields an older or damaged file lacks are left out (not compared)."""
    found = tune_json.get("config")
    config: dict[str, Any] = found if isinstance(found, dict) else {}
    doc: dict[str, Any] = {
        k: tune_json[k]
        for k in ("study", "model", "gpu", "backend", "vllm_version")
        if k in tune_json
    }
    if isinstance(tune_json.get("workload"), dict):
        doc["workload"] = tune_json["workload"]
    if isinstance(tune_json.get("space"), list):
        try:
            ranges = [Range.model_validate(r) for r in tune_json["space"]]
            doc["space"] = {r.knob.value: r.describe() for r in ranges}
        except ValueError:
            pass
    for key in ("objective", "max_model_len", "kv_cache_memory_bytes", "tensor_parallel_size",
                "level_duration_s", "level_warmup_s", "level_max_duration_s", "max_levels",
                "chain_levels"):  # fmt: skip
        if key in config:
            doc[key] = config[key]
    return _flatten(doc)


def legacy_study_settings(attrs: dict[str, Any]) -> dict[str, Any]:
    """What a study set up by an older tuner recorded of its settings (no SETTINGS_ATTR)."""
    doc: dict[str, Any] = {
        k: attrs[k] for k in ("model", "gpu", "backend", "vllm_version", "objective") if k in attrs
    }
    if isinstance(attrs.get("workload"), str):
        doc["workload.name"] = attrs["workload"]
    return doc


_LABELS = {
    "study": "--study", "model": "--model", "gpu": "--gpu", "backend": "--backend",
    "vllm_version": "vLLM (--vllm-version)", "objective": "--objective",
    "max_model_len": "--max-model-len",
    "kv_cache_memory_bytes": "--kv-cache-memory-bytes",
    "tensor_parallel_size": "--tensor-parallel-size", "level_duration_s": "--level-duration",
    "level_warmup_s": "--level-warmup", "max_levels": "--max-levels",
    "level_max_duration_s": "--level-max-duration",
    "chain_levels": "--chain-levels",
    "workload.name": "--workload",
    "workload.slo.ttft": "--slo-ttft-ms", "workload.slo.itl": "--slo-itl-ms",
}  # fmt: skip

_ORDER = ("model", "gpu", "backend", "vllm_version", "workload", "objective", "space")


def _label(key: str) -> str:
    if key in _LABELS:
        return _LABELS[key]
    for prefix in ("workload.slo.ttft", "workload.slo.itl"):
        if key.startswith(prefix + "."):
            return f"{_LABELS[prefix]} (the workload's {key.removeprefix('workload.')})"
    if key.startswith("space."):
        return f"--space {key.removeprefix('space.')}"
    if key.startswith("workload."):
        return f"the workload's {key.removeprefix('workload.')}"
    return key


def _ancestors(key: str) -> list[str]:
    parts = key.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _shown(flat: dict[str, Any], key: str) -> str:
    if key in flat:
        return "(none)" if flat[key] is None else repr(flat[key])
    if any(k.startswith(key + ".") for k in flat):
        return "(set)"
    return "(not searched)" if key.startswith("space.") else "(none)"


def settings_differences(recorded: dict[str, Any], given: dict[str, Any]) -> list[str]:
    """The flat keys whose values differ, most telling first. A key only one side has
    counts where the other side has a leaf above it (a document against none) and for
    the knobs of the space; otherwise it is a field one tuner version lacks (or an older
    record does not hold), not compared."""
    differing: list[str] = []
    for key in dict.fromkeys([*recorded, *given]):
        if key in recorded and key in given:
            if recorded[key] != given[key]:
                differing.append(key)
            continue
        other = given if key in recorded else recorded
        above = next((a for a in _ancestors(key) if a in other), None)
        if above is not None:
            differing.append(above)
        elif key.startswith("space.") and any(k.startswith("space.") for k in other):
            differing.append(key)

    def rank(key: str) -> tuple[int, int, str]:
        top = key.split(".", 1)[0]
        order = _ORDER.index(top) if top in _ORDER else len(_ORDER) + (top == "study")
        return order, 0 if key == "workload.name" else 1, key

    return sorted(dict.fromkeys(differing), key=rank)


def refuse_other_settings(
    where: str, owner: str, recorded: dict[str, Any], given: dict[str, Any]
) -> None:
    differing = settings_differences(recorded, given)
    if not differing:
        return
    first = differing[0]
    also = f" (also {', '.join(_label(k) for k in differing[1:4])})" if differing[1:] else ""
    if first == "study":
        raise ConfigError(
            f"{where} belongs to study {recorded['study']!r}; given --study {given['study']!r}; "
            f"accepted: --study {recorded['study']} (with --resume) to continue it, or another "
            "--run-dir for a new study"
        )
    raise ConfigError(
        f"{where} belongs to study {owner!r}, measured with {_label(first)} "
        f"{_shown(recorded, first)}; given {_shown(given, first)}{also}; accepted: the "
        "study's own settings to continue it (--resume), or another --run-dir (or --study) "
        "for these"
    )


def refuse_other_measurement(where: str, attrs: dict[str, Any], config: TuneConfig) -> None:
    """A study measures every trial alike: a resumed one keeps the simulated clock's scale
    and the streamed share it chose, and refuses other values given for them (rather than
    ignoring them)."""
    for key, flag, given in (
        ("time_scale", "--time-scale", config.time_scale),
        ("stream_fraction", "--stream-fraction", config.stream_fraction),
        ("stream_interval", "--stream-interval", config.stream_interval),
    ):
        if given is None or key not in attrs:
            continue
        chosen = float(attrs[key])
        if not math.isclose(chosen, float(given), rel_tol=1e-9):
            raise ConfigError(
                f"{where} measured every trial with {flag} {chosen:g}; given {flag} {given:g}; "
                f"accepted: {flag} {chosen:g} or none to continue it (--resume), or another "
                "--run-dir (or --study) for this value"
            )

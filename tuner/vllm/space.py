"""The search space: which vLLM knobs a tune varies, over what, and what was left out and why.

Five knobs are searched by default: ``--gpu-memory-utilization``, ``--max-num-seqs``,
``--block-size``, ``--swap-space`` and ``--kv-cache-dtype``. ``--max-num-batched-tokens``,
``--enable-prefix-caching``, ``--cpu-offload-gb`` and ``--tensor-parallel-size`` join when
asked for (``--cpu-offload-gb`` on its own when the model does not fit the GPU otherwise).
``--kv-offloading-size`` (GiB of host memory for vLLM's native KV offloading, 0 = off)
and ``kv-offloading-policy`` (its eviction policy, ``lru`` or ``arc``, set through
``--kv-transfer-config``) join when asked for, where the target vLLM has them (0.11.1
on) and the host can pin the size.
``--tensor-parallel-size`` takes the sizes that divide the model's attention heads and fit
the host's GPUs; where it is searched, settings are compared per GPU (``per_gpu``): one
server over k GPUs against k servers of one.
Ranges come from the GPU and the vLLM release; a knob the target vLLM lacks or
the GPU cannot use is left out with the reason, which the run records.

A range is written ``LOW..HIGH`` (numbers; ``LOW..HIGH/STEP`` for a step) or a
comma list of choices, e.g. ``--space max-num-seqs=32..512`` or
``--space block-size=32,64``.
"""

from __future__ import annotations

import decimal
import json
import math
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from tuner.errors import ConfigError
from tuner.vllm.failures import StartupFailureKind
from tuner.vllm.flags import FLAGS_BY_NAME, KV_OFFLOAD_EVICTION_POLICIES
from tuner.vllm.gpus import GpuSpec
from tuner.vllm.host_memory import host_plan
from tuner.vllm.memory import KV_CACHE_DTYPES, ServingParams, default_limits, plan
from tuner.vllm.models import ModelSpec
from tuner.vllm.versions import VllmVersion


class Knob(StrEnum):
    GPU_MEMORY_UTILIZATION = "gpu-memory-utilization"
    MAX_NUM_SEQS = "max-num-seqs"
    BLOCK_SIZE = "block-size"
    SWAP_SPACE = "swap-space"
    KV_CACHE_DTYPE = "kv-cache-dtype"
    MAX_NUM_BATCHED_TOKENS = "max-num-batched-tokens"
    ENABLE_PREFIX_CACHING = "enable-prefix-caching"
    CPU_OFFLOAD_GB = "cpu-offload-gb"
    TENSOR_PARALLEL_SIZE = "tensor-parallel-size"
    KV_OFFLOADING_SIZE = "kv-offloading-size"
    # the native offloading connector's eviction_policy: no flag of its own, it rides in
    # --kv-transfer-config's kv_connector_extra_config
    KV_OFFLOADING_POLICY = "kv-offloading-policy"

    @property
    def flag(self) -> str:
        if self is Knob.KV_OFFLOADING_POLICY:
            return FLAGS_BY_NAME["kv-transfer-config"].option
        return FLAGS_BY_NAME[self.value].option

    @property
    def field(self) -> str:
        if self is Knob.KV_OFFLOADING_POLICY:
            return "kv_offloading_policy"
        return FLAGS_BY_NAME[self.value].dest

    @classmethod
    def parse(cls, text: str) -> Knob:
        name = text.strip().lstrip("-").replace("_", "-").lower()
        try:
            return cls(name)
        except ValueError:
            raise ConfigError(
                f"search knob {text!r} is not accepted; accepted: {', '.join(k.value for k in cls)}"
            ) from None


DEFAULT_KNOBS = (
    Knob.GPU_MEMORY_UTILIZATION,
    Knob.MAX_NUM_SEQS,
    Knob.BLOCK_SIZE,
    Knob.SWAP_SPACE,
    Knob.KV_CACHE_DTYPE,
)
INTEGER_KNOBS = (
    Knob.MAX_NUM_SEQS,
    Knob.BLOCK_SIZE,
    Knob.MAX_NUM_BATCHED_TOKENS,
    Knob.TENSOR_PARALLEL_SIZE,
)
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)  # what an engineer sweeps on one node

Choice = float | int | str | bool


class Range(BaseModel):
    """A numeric range (low..high, an optional step, log scale for counts) or a list of choices."""

    model_config = ConfigDict(frozen=True)

    knob: Knob
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    choices: tuple[Choice, ...] | None = None

    def describe(self) -> str:
        if self.choices is not None:
            return ",".join(_fmt(c) for c in self.choices)
        text = f"{_fmt(self.low)}..{_fmt(self.high)}"
        return text + (f"/{_fmt(self.step)}" if self.step else "") + (" (log)" if self.log else "")

    def contains(self, value: Choice) -> bool:
        if self.choices is not None:
            return value in self.choices
        assert self.low is not None and self.high is not None
        return isinstance(value, int | float) and self.low <= float(value) <= self.high

    def values(self) -> list[Choice]:
        """Every value of the range, for a grid (numeric ranges: by step, or powers of two)."""
        if self.choices is not None:
            return list(self.choices)
        assert self.low is not None and self.high is not None
        if self.step:
            n = round((self.high - self.low) / self.step)
            return [
                _num(self.knob, on_step(self.low + i * self.step, self.step)) for i in range(n + 1)
            ]
        out: list[Choice] = []
        v = self.low
        while v <= self.high:
            out.append(_num(self.knob, v))
            v *= 2
        return out


class LeftOut(BaseModel):
    model_config = ConfigDict(frozen=True)

    knob: Knob
    reason: str


class TrialParams(BaseModel):
    """One point of the space; None: the knob is not searched (vLLM's default)."""

    model_config = ConfigDict(frozen=True)

    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    block_size: int | None = None
    swap_space_gib: float | None = None
    kv_cache_dtype: str = "auto"
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None
    cpu_offload_gb: float = 0.0
    tensor_parallel_size: int | None = None
    kv_offloading_size_gib: float | None = None  # GiB of host memory; 0 or None: off
    kv_offloading_policy: str | None = None  # its eviction policy (None: vLLM's lru)

    @property
    def offloads_kv(self) -> bool:
        return bool(self.kv_offloading_size_gib)

    @property
    def gpus(self) -> int:
        """GPUs one server of these settings takes where the size is searched (1 where it is
        not: every setting then runs on the same GPUs)."""
        return self.tensor_parallel_size or 1

    def serving(self, base: ServingParams) -> ServingParams:
        return base.model_copy(
            update={
                "gpu_memory_utilization": self.gpu_memory_utilization,
                "max_num_seqs": self.max_num_seqs,
                "block_size": self.block_size,
                "kv_cache_dtype": self.kv_cache_dtype,
                "max_num_batched_tokens": self.max_num_batched_tokens
                or base.max_num_batched_tokens,
                "cpu_offload_gb": self.cpu_offload_gb or base.cpu_offload_gb,
                "tensor_parallel_size": self.tensor_parallel_size or base.tensor_parallel_size,
            }
        )

    def flags(self) -> dict[str, Choice]:
        """The searched settings as vLLM flag names (no leading dashes) and values."""
        out: dict[str, Choice] = {}
        for knob in Knob:
            value = getattr(self, knob.field)
            if value is None or (knob is Knob.CPU_OFFLOAD_GB and not value):
                continue
            if knob is Knob.KV_CACHE_DTYPE and value == "auto":
                continue
            if knob in (Knob.KV_OFFLOADING_SIZE, Knob.KV_OFFLOADING_POLICY):
                continue
            out[knob.value] = value
        out.update(self.offloading_flags())
        return out

    def offloading_flags(self) -> dict[str, Choice]:
        """``--kv-offloading-size`` with the native backend, and the eviction policy in
        ``--kv-transfer-config`` (as vLLM reads it: kv_connector_extra_config's
        eviction_policy); nothing when the size is 0 or not searched."""
        if not self.offloads_kv:
            return {}
        assert self.kv_offloading_size_gib is not None
        out: dict[str, Choice] = {
            "kv-offloading-size": self.kv_offloading_size_gib,
            "kv-offloading-backend": "native",  # required before vLLM 0.14
        }
        if self.kv_offloading_policy is not None:
            extra = {"eviction_policy": self.kv_offloading_policy}
            out["kv-transfer-config"] = json.dumps({"kv_connector_extra_config": extra})
        return out

    def short(self) -> str:
        parts = [
            f"{FLAGS_BY_NAME[k].short or k} {_fmt(v)}"
            for k, v in self.flags().items()
            if k not in ("kv-offloading-backend", "kv-transfer-config")
        ]
        if self.offloads_kv and self.kv_offloading_policy is not None:
            parts.append(f"evict {self.kv_offloading_policy}")
        return " ".join(parts)


class SearchSpace(BaseModel):
    model_config = ConfigDict(frozen=True)

    ranges: tuple[Range, ...]
    left_out: tuple[LeftOut, ...] = ()

    def range_of(self, knob: Knob) -> Range | None:
        return next((r for r in self.ranges if r.knob is knob), None)

    def suggest(self, trial: Any) -> TrialParams:
        """The trial's point, drawn through Optuna's suggest API."""
        values: dict[str, Choice] = {}
        for r in self.ranges:
            name = r.knob.value
            if r.choices is not None:
                values[r.knob.field] = trial.suggest_categorical(name, list(r.choices))
            elif r.knob in INTEGER_KNOBS:
                assert r.low is not None and r.high is not None
                values[r.knob.field] = trial.suggest_int(
                    name, int(r.low), int(r.high), log=r.log, step=int(r.step or 1)
                )
            else:
                assert r.low is not None and r.high is not None
                value = trial.suggest_float(
                    name, r.low, r.high, step=r.step, log=r.log and not r.step
                )
                values[r.knob.field] = on_step(value, r.step)
        return TrialParams.model_validate(values)

    def from_optuna(self, params: dict[str, Any]) -> TrialParams:
        steps = {
            r.knob.value: r.step
            for r in self.ranges
            if r.choices is None and r.step and r.knob not in INTEGER_KNOBS
        }
        return TrialParams.model_validate(
            {
                Knob(name).field: on_step(value, steps[name]) if name in steps else value
                for name, value in params.items()
                if name in _NAMES
            }
        )

    def to_optuna(self, point: TrialParams) -> dict[str, Choice]:
        """The point as Optuna parameters (only the searched knobs), e.g. to enqueue it."""
        return {r.knob.value: getattr(point, r.knob.field) for r in self.ranges}

    def grid(self) -> list[TrialParams]:
        points: list[dict[str, Choice]] = [{}]
        for r in self.ranges:
            points = [{**p, r.knob.field: v} for p in points for v in r.values()]
        return [TrialParams.model_validate(p) for p in points]

    def describe(self) -> list[str]:
        lines = [f"{r.knob.flag:<28} {r.describe()}" for r in self.ranges]
        lines += [f"{o.knob.flag:<28} left out: {o.reason}" for o in self.left_out]
        return lines


_NAMES = {k.value for k in Knob}


def per_gpu(rate: float, params: TrialParams) -> float:
    """``rate`` (a goodput or throughput of one server of ``params``) per GPU it takes:
    what settings are ranked by, so one server over k GPUs competes with k servers of one
    (where the tensor-parallel size is not searched, this is ``rate`` itself)."""
    return rate / params.gpus


def tensor_parallel_sizes(model: ModelSpec, gpu_count: int) -> tuple[int, ...]:
    """The sizes of ``TENSOR_PARALLEL_SIZES`` that divide the model's attention heads (vLLM
    refuses the others) and fit ``gpu_count`` GPUs."""
    return tuple(
        tp
        for tp in TENSOR_PARALLEL_SIZES
        if tp <= gpu_count and model.num_attention_heads % tp == 0
    )


def parse_range(knob: Knob, text: str) -> Range:
    """``LOW..HIGH``, ``LOW..HIGH/STEP`` or ``A,B,C``; one ConfigError line when malformed."""
    spec = text.strip()
    bad = ConfigError(
        f"--space {knob.value}={text!r} is not a range; accepted: LOW..HIGH, LOW..HIGH/STEP "
        "or a comma list of values, e.g. 0.80..0.95/0.01 or 16,32"
    )
    if ".." in spec:
        bounds, _, step_text = spec.partition("/")
        low_text, _, high_text = bounds.partition("..")
        try:
            low, high = float(low_text), float(high_text)
            step = float(step_text) if step_text else None
        except ValueError:
            raise bad from None
        if knob in _CHOICE_KNOBS or not low <= high:
            raise bad
        if step is not None and step <= 0:
            raise bad
        r = Range(knob=knob, low=low, high=high, step=step, log=knob in INTEGER_KNOBS and not step)
        if knob is Knob.TENSOR_PARALLEL_SIZE:  # sizes, not a continuum: 1..4 is 1,2,4
            _check_values(r)
            r = Range(knob=knob, choices=tuple(dict.fromkeys(r.values())))
    else:
        items = [item.strip() for item in spec.split(",") if item.strip()]
        if not items:
            raise bad
        try:
            choices = tuple(_choice(knob, item) for item in items)
        except ValueError:
            raise bad from None
        r = Range(knob=knob, choices=choices)
    _check_values(r)
    return r


_CHOICE_KNOBS = (Knob.KV_CACHE_DTYPE, Knob.ENABLE_PREFIX_CACHING, Knob.KV_OFFLOADING_POLICY)


def _choice(knob: Knob, text: str) -> Choice:
    if knob in (Knob.KV_CACHE_DTYPE, Knob.KV_OFFLOADING_POLICY):
        return text
    if knob is Knob.ENABLE_PREFIX_CACHING:
        lowered = text.lower()
        if lowered not in ("true", "false", "on", "off", "1", "0"):
            raise ValueError(text)
        return lowered in ("true", "on", "1")
    if knob in INTEGER_KNOBS:
        return int(text)
    return float(text)


def _check_values(r: Range) -> None:
    """Each value a vLLM could take; the message names the knob and what is accepted."""
    knob = r.knob
    values = list(r.choices) if r.choices is not None else [r.low, r.high]
    if r.step is not None:
        values.append(r.step)
    for value in values:
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(
                f"--space {knob.value} value {value} is not accepted; accepted: finite numbers"
            )
        if knob in INTEGER_KNOBS and isinstance(value, float) and value != int(value):
            raise ConfigError(
                f"--space {knob.value} value {_fmt(value)} is not an integer; accepted: "
                "integers >= 1"
            )
    values = values[:-1] if r.step is not None else values
    for value in values:
        if knob is Knob.GPU_MEMORY_UTILIZATION and not (
            isinstance(value, float | int) and 0 < value <= 1
        ):
            raise ConfigError(
                f"--space gpu-memory-utilization value {value} is out of range; accepted: 0 < value <= 1"
            )
        if knob in INTEGER_KNOBS and not (isinstance(value, int | float) and value >= 1):
            raise ConfigError(
                f"--space {knob.value} value {value} is out of range; accepted: integers >= 1"
            )
        if knob in (Knob.SWAP_SPACE, Knob.CPU_OFFLOAD_GB, Knob.KV_OFFLOADING_SIZE) and not (
            isinstance(value, int | float) and value >= 0
        ):
            raise ConfigError(f"--space {knob.value} value {value} is negative; accepted: >= 0")
        if knob is Knob.KV_OFFLOADING_POLICY and value not in KV_OFFLOAD_EVICTION_POLICIES:
            raise ConfigError(
                f"--space kv-offloading-policy value {value!r} is not one of vLLM's eviction "
                "policies; accepted: " + ", ".join(KV_OFFLOAD_EVICTION_POLICIES)
            )
        if knob is Knob.KV_CACHE_DTYPE and value not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"--space kv-cache-dtype value {value!r} is not accepted; accepted: "
                + ", ".join(KV_CACHE_DTYPES)
            )


def check_for_target(
    r: Range, *, model: ModelSpec, version: VllmVersion, gpu: bool, gpu_count: int = 1
) -> None:
    """A range given with ``--space`` against what the target vLLM accepts for this model;
    one ConfigError line before anything is launched. ``gpu``: a CUDA device (vLLM's
    attention backends there take block sizes in multiples of 16, MLA models aside);
    ``gpu_count``: the GPUs a server may take on this host."""
    if r.knob is Knob.TENSOR_PARALLEL_SIZE:
        _check_tensor_parallel(r, model=model, gpu=gpu, gpu_count=gpu_count)
        return
    if r.knob is not Knob.BLOCK_SIZE:
        return
    allowed = version.block_size_choices
    sixteen = gpu and not model.is_mla
    rule = f"one of {', '.join(map(str, allowed))}" if allowed is not None else "an integer >= 1"
    if sixteen:
        rule += " and a multiple of 16 (vLLM: 'Block size must be a multiple of 16.')"
    if r.choices is None:
        assert r.low is not None
        steps_ok = r.step is not None and (not sixteen or (r.low % 16 == 0 and r.step % 16 == 0))
        if allowed is not None or not steps_ok or r.low != int(r.low) or r.step != int(r.step or 0):
            raise ConfigError(
                f"--space block-size={r.describe()} is not accepted for vLLM {version}: each "
                f"value must be {rule}; accepted: a comma list such as 16,32"
                + (" or LOW..HIGH/STEP in multiples of 16" if allowed is None else "")
            )
        return
    for value in r.choices:
        if (allowed is not None and value not in allowed) or (sixteen and int(value) % 16):
            raise ConfigError(
                f"--space block-size value {_fmt(value)} is not accepted by vLLM {version} for "
                f"{model.name}; accepted: {rule}"
            )


def _check_tensor_parallel(r: Range, *, model: ModelSpec, gpu: bool, gpu_count: int) -> None:
    if not gpu:
        raise ConfigError(
            "--space tensor-parallel-size: vLLM's CPU build here has no GPUs to spread a "
            "server over; accepted: a GPU host (or the simulated backend with --gpu-count)"
        )
    heads = model.num_attention_heads
    for value in r.values():
        size = int(value)
        if heads % size:
            divisors = [d for d in range(1, heads + 1) if heads % d == 0 and d <= 64]
            raise ConfigError(
                f"--space tensor-parallel-size value {size} does not divide {model.name}'s "
                f"{heads} attention heads (vLLM: 'Total number of attention heads ({heads}) "
                f"must be divisible by tensor parallel size ({size}).'); accepted: "
                + ", ".join(map(str, divisors))
            )
        if size > gpu_count:
            raise ConfigError(
                f"--space tensor-parallel-size value {size} is more GPUs than the {gpu_count} "
                f"this host has (--gpu-count); accepted: 1 to {gpu_count}"
            )


def default_range(
    knob: Knob, gpu: GpuSpec, version: VllmVersion, sizes: tuple[int, ...] = (1,)
) -> Range:
    """Sensible defaults for a GPU: what an engineer would sweep by hand."""
    default_seqs, _ = default_limits(gpu, version)
    match knob:
        case Knob.GPU_MEMORY_UTILIZATION:
            return Range(knob=knob, low=0.80, high=0.97, step=0.01)
        case Knob.MAX_NUM_SEQS:
            return Range(knob=knob, low=16, high=max(default_seqs, 256), log=True)
        case Knob.BLOCK_SIZE:
            return Range(knob=knob, choices=(16, 32))
        case Knob.SWAP_SPACE:
            return Range(knob=knob, choices=(0.0, 4.0, 16.0))
        case Knob.KV_CACHE_DTYPE:
            return Range(knob=knob, choices=("auto", "fp8"))
        case Knob.MAX_NUM_BATCHED_TOKENS:
            return Range(knob=knob, choices=(2048, 4096, 8192, 16384))
        case Knob.ENABLE_PREFIX_CACHING:
            return Range(knob=knob, choices=(True, False))
        case Knob.CPU_OFFLOAD_GB:
            return Range(knob=knob, choices=(0.0, 8.0, 16.0, 32.0))
        case Knob.TENSOR_PARALLEL_SIZE:
            return Range(knob=knob, choices=sizes)
        case Knob.KV_OFFLOADING_SIZE:
            return Range(knob=knob, choices=(0.0, 16.0, 64.0))
        case Knob.KV_OFFLOADING_POLICY:
            return Range(knob=knob, choices=KV_OFFLOAD_EVICTION_POLICIES)
    raise AssertionError(knob)


def build_space(
    *,
    model: ModelSpec,
    gpu: GpuSpec,
    version: VllmVersion,
    accepted_flags: frozenset[str] | None,
    overrides: dict[Knob, Range] | None = None,
    extra: tuple[Knob, ...] = (),
    base: ServingParams | None = None,
    backend_note: str = "",
    gpu_count: int = 1,
    host_bytes: int | None = None,
) -> SearchSpace:
    """The space for this model, GPU and vLLM; ``accepted_flags`` None: every flag is
    accepted; ``gpu_count``: the GPUs one server may take (``--tensor-parallel-size``);
    ``host_bytes``: the host's RAM, which caps ``--kv-offloading-size`` (None: unknown)."""
    overrides = overrides or {}
    base = base or ServingParams()
    knobs = list(DEFAULT_KNOBS) + [k for k in (*extra, *overrides) if k not in DEFAULT_KNOBS]
    knobs = list(dict.fromkeys(knobs))
    left: list[LeftOut] = []
    sizes = tensor_parallel_sizes(model, gpu_count)
    if Knob.TENSOR_PARALLEL_SIZE in knobs and gpu_count > 1:  # fits over the most GPUs?
        widest = overrides.get(Knob.TENSOR_PARALLEL_SIZE) or default_range(
            Knob.TENSOR_PARALLEL_SIZE, gpu, version, sizes
        )
        base = base.model_copy(
            update={"tensor_parallel_size": max(int(v) for v in widest.values())}
        )
    if Knob.CPU_OFFLOAD_GB not in knobs and not _fits_without_offload(model, gpu, version, base):
        knobs.append(Knob.CPU_OFFLOAD_GB)
    ranges: list[Range] = []
    for knob in knobs:
        r = overrides.get(knob) or default_range(knob, gpu, version, sizes)
        reason = _unusable(knob, r, gpu, version, accepted_flags, backend_note)
        if reason is None and knob is Knob.TENSOR_PARALLEL_SIZE and gpu_count < 2:
            reason = "this host has one GPU (--gpu-count): no server to spread over several"
        if (
            reason is None
            and knob is Knob.KV_OFFLOADING_POLICY
            and Knob.KV_OFFLOADING_SIZE not in knobs
        ):
            reason = "the policy of a CPU tier: searched beside kv-offloading-size"
        if reason is None and knob is Knob.KV_OFFLOADING_SIZE and host_bytes is not None:
            r = _pinnable_part(r, host_bytes, explicit=knob in overrides)
        if reason is not None:
            left.append(LeftOut(knob=knob, reason=reason))
            continue
        r = _usable_part(r, gpu, version)
        if r.choices is not None and len(r.choices) == 1:
            left.append(
                LeftOut(knob=knob, reason=f"one value only ({_fmt(r.choices[0])}), held fixed")
            )
        ranges.append(r)
    return SearchSpace(ranges=tuple(ranges), left_out=tuple(left))


def _pinnable_part(r: Range, host_bytes: int, *, explicit: bool) -> Range:
    """The sizes this host can pin: one ConfigError line for a size asked for with
    ``--space`` that it cannot, the default sizes it cannot left out."""
    cap = host_plan(kv_offloading_size_gib=0.0, host_bytes=host_bytes).max_kv_offloading_gib()
    values = list(r.choices) if r.choices is not None else [r.high]
    too_big = [v for v in values if isinstance(v, int | float) and float(v) > cap]
    if not too_big:
        return r
    if explicit:
        refusal = host_plan(kv_offloading_size_gib=float(too_big[0]), host_bytes=host_bytes)
        raise ConfigError(f"--space kv-offloading-size: {refusal.refusal()}")
    assert r.choices is not None
    return r.model_copy(update={"choices": tuple(v for v in r.choices if v not in too_big)})


def _unusable(
    knob: Knob,
    r: Range,
    gpu: GpuSpec,
    version: VllmVersion,
    accepted: frozenset[str] | None,
    note: str,
) -> str | None:
    if knob is Knob.SWAP_SPACE and not version.has_swap_space:
        return f"vLLM {version} has no --swap-space (removed in 0.18)"
    if knob in (Knob.KV_OFFLOADING_SIZE, Knob.KV_OFFLOADING_POLICY) and not (
        version.has_kv_offloading
    ):
        return (
            f"vLLM {version} has no KV offloading to CPU memory (--kv-offloading-size, 0.11.1 on)"
        )
    if accepted is not None and knob.flag not in accepted:
        return f"{note or 'the target vLLM'} does not accept {knob.flag}"
    if knob is Knob.KV_CACHE_DTYPE and r.choices is not None:
        taken = gpu.kv_cache_dtypes_in(version)
        usable = [c for c in r.choices if c in taken or not str(c).startswith("fp8")]
        if len(usable) <= 1 and len(r.choices) > 1:
            cc = gpu.compute_capability
            return f"vLLM {version} takes no fp8 KV cache on the {gpu.name} (compute capability {cc[0]}.{cc[1]})"
    if knob is Knob.BLOCK_SIZE and r.choices is not None:
        allowed = version.block_size_choices
        if allowed is not None and not any(c in allowed for c in r.choices):
            return f"vLLM {version} accepts --block-size only in {allowed}"
    return None


def _usable_part(r: Range, gpu: GpuSpec, version: VllmVersion) -> Range:
    if r.knob is Knob.KV_CACHE_DTYPE and r.choices is not None:
        taken = gpu.kv_cache_dtypes_in(version)
        kept = tuple(c for c in r.choices if c in taken or not str(c).startswith("fp8"))
        return r.model_copy(update={"choices": kept})
    if r.knob is Knob.BLOCK_SIZE and r.choices is not None:
        allowed = version.block_size_choices
        if allowed is not None:
            return r.model_copy(update={"choices": tuple(c for c in r.choices if c in allowed)})
    return r


def _fits_without_offload(
    model: ModelSpec, gpu: GpuSpec, version: VllmVersion, base: ServingParams
) -> bool:
    best = plan(model, gpu, base.model_copy(update={"gpu_memory_utilization": 0.97}), version)
    return best.fits or (
        best.failure is not None and best.failure.kind is not StartupFailureKind.WEIGHTS_DO_NOT_FIT
    )


def vllm_defaults(space: SearchSpace, version: VllmVersion, gpu: GpuSpec) -> TrialParams:
    """vLLM's own defaults for the searched knobs: the baseline every tune measures first."""
    seqs, batched = default_limits(gpu, version)
    values: dict[str, Choice] = {}
    for r in space.ranges:
        match r.knob:
            case Knob.GPU_MEMORY_UTILIZATION:
                values[r.knob.field] = version.default_gpu_memory_utilization
            case Knob.MAX_NUM_SEQS:
                values[r.knob.field] = seqs
            case Knob.MAX_NUM_BATCHED_TOKENS:
                values[r.knob.field] = batched
            case Knob.BLOCK_SIZE:
                values[r.knob.field] = 16 if r.contains(16) else _first(r)
            case Knob.SWAP_SPACE:
                values[r.knob.field] = 4.0 if r.contains(4.0) else _first(r)
            case Knob.KV_CACHE_DTYPE:
                values[r.knob.field] = "auto" if r.contains("auto") else _first(r)
            case Knob.ENABLE_PREFIX_CACHING:
                values[r.knob.field] = True
            case Knob.TENSOR_PARALLEL_SIZE:
                values[r.knob.field] = 1 if r.contains(1) else _first(r)
            case Knob.KV_OFFLOADING_SIZE:
                values[r.knob.field] = 0.0 if r.contains(0.0) else _first(r)
            case Knob.KV_OFFLOADING_POLICY:
                values[r.knob.field] = "lru" if r.contains("lru") else _first(r)
            case _:
                values[r.knob.field] = _first(r)
        values[r.knob.field] = clamp(r, values[r.knob.field])
    return TrialParams.model_validate(values)


def clamp(r: Range, value: Choice) -> Choice:
    """The nearest value inside the range (a choice list: the value if listed, else the
    nearest number, else the first)."""
    if r.choices is not None:
        if value in r.choices:
            return value
        numbers = [c for c in r.choices if isinstance(c, int | float) and not isinstance(c, bool)]
        if isinstance(value, int | float) and not isinstance(value, bool) and numbers:
            return min(numbers, key=lambda c: abs(float(c) - float(value)))
        return r.choices[0]
    assert r.low is not None and r.high is not None
    assert isinstance(value, int | float)
    v = min(max(float(value), r.low), r.high)
    if r.step:
        v = on_step(r.low + round((v - r.low) / r.step) * r.step, r.step)
    return _num(r.knob, v)


def step_decimals(step: float) -> int:
    """The decimals a value on a grid of ``step`` needs: 2 for 0.01, 3 for 0.005, 0 for 16."""
    exponent = decimal.Decimal(repr(float(step))).normalize().as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def on_step(value: float, step: float | None) -> float:
    """A value drawn on a grid of ``step`` written as the grid writes it (0.87, not
    0.8700000000000001: low + k x step in binary floating point)."""
    return value if not step else round(value, step_decimals(step))


def _first(r: Range) -> Choice:
    if r.choices is not None:
        return r.choices[0]
    assert r.low is not None
    return _num(r.knob, r.low)


def _num(knob: Knob, value: float) -> Choice:
    if knob in INTEGER_KNOBS:
        return round(value)
    return round(value, 6)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}" if not math.isnan(value) else "nan"
    return str(value)

"""WorkloadSpec: what traffic a load run offers, read from YAML and validated.

A spec says *how* requests arrive (``arrival``), *how long* their prompts and
answers are (``prompt_tokens``, ``output_tokens``), what they share (a system
prompt, multi-turn sessions, Mooncake hash-id blocks), how long the run lasts and
which requests only warm the server up, and the latency objectives (``slo``).
``workloads.build.build_schedule`` turns a spec into the open-loop schedule.

Lengths count the *new* text of each request: a shared system prompt, the
conversation history of a session and the chat template's per-message tokens come
on top, and ``ScheduledRequest.prompt_tokens`` is the exact total.

Every bad value is a ``WorkloadError`` of one line naming the value and what is
accepted, e.g. ``workload chat.yaml: arrival.kind 'poison' is not accepted;
accepted: poisson, gamma, ramp, diurnal, trace, closed``.
"""

from __future__ import annotations

import math
import types
import typing
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Tag,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from workloads.schedule import Api
from workloads.slo import Slo
from workloads.traces import (
    TraceError,
    TraceRecord,
    load_trace,
    recorded_rate_per_s,
    resolve_trace,
)

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"


class WorkloadError(ValueError):
    """A workload spec or what it refers to is not usable; the message is one line."""


def read_trace_ref(ref: str) -> tuple[TraceRecord, ...]:
    """The rows of a trace reference (a path or builtin:NAME) as a WorkloadError on failure."""
    try:
        return load_trace(resolve_trace(ref))
    except TraceError as exc:
        raise WorkloadError(str(exc)) from exc


class _Model(BaseModel):
    # NaN and infinity are no rate, length, duration or weight: rejected like any bad value.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _check_trace_ref(ref: str, info: ValidationInfo) -> str:
    """A trace reference as given, checked now so a bad path fails before any server starts."""
    base = (info.context or {}).get("base_dir")
    try:
        path = resolve_trace(ref, base_dir=base)
    except TraceError as exc:
        raise ValueError(str(exc)) from None
    return ref if ref.startswith("builtin:") else str(path)


# A trace file (relative to the YAML file) or a shipped trace, e.g. builtin:azure-code.
TraceRef = Annotated[str, AfterValidator(_check_trace_ref)]


# --- arrivals -------------------------------------------------------------------------


class PoissonArrival(_Model):
    """Independent arrivals at a constant mean rate (exponential gaps)."""

    kind: Literal["poisson"]
    rate_per_s: PositiveFloat

    @property
    def mean_rate_per_s(self) -> float | None:
        return self.rate_per_s


class GammaArrival(_Model):
    """Renewal process with gamma gaps: mean 1/rate, coefficient of variation = burstiness."""

    kind: Literal["gamma"]
    rate_per_s: PositiveFloat
    burstiness: PositiveFloat  # CV of the gaps: 1 is Poisson, above 1 bursty, below regular

    @property
    def mean_rate_per_s(self) -> float | None:
        return self.rate_per_s


class RampArrival(_Model):
    """Poisson arrivals whose rate moves linearly from start to end over the measured run."""

    kind: Literal["ramp"]
    start_rate_per_s: NonNegativeFloat
    end_rate_per_s: NonNegativeFloat

    @model_validator(mode="after")
    def _some_traffic(self) -> Self:
        if self.start_rate_per_s == 0 and self.end_rate_per_s == 0:
            raise ValueError("start_rate_per_s and end_rate_per_s are both 0; one must be > 0")
        return self

    @property
    def mean_rate_per_s(self) -> float | None:
        return (self.start_rate_per_s + self.end_rate_per_s) / 2


class DiurnalArrival(_Model):
    """Poisson arrivals whose rate follows a sinusoid from trough to peak, `periods` times."""

    kind: Literal["diurnal"]
    peak_rate_per_s: PositiveFloat
    trough_rate_per_s: NonNegativeFloat
    periods: PositiveFloat = 1.0  # full trough-peak-trough cycles over the measured run

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.trough_rate_per_s > self.peak_rate_per_s:
            raise ValueError(
                f"trough_rate_per_s {self.trough_rate_per_s} is above peak_rate_per_s "
                f"{self.peak_rate_per_s}"
            )
        return self

    @property
    def mean_rate_per_s(self) -> float | None:
        return (self.peak_rate_per_s + self.trough_rate_per_s) / 2


class TraceArrival(_Model):
    """Replay a trace's arrival times (Azure CSV, Mooncake or own JSONL), rescaled to a rate.

    With ``rate_per_s`` the gaps are stretched or compressed so the trace's mean rate
    is that rate (one pass of n requests lasts n / rate_per_s seconds, whatever the
    run's length); without it the trace is replayed as recorded. The trace loops when
    it ends before the run does. ``start_share``: where in a pass the replay begins (0:
    at the trace's first request, 0.5: half a pass in). Mooncake ``hash_ids`` (and own
    ``prefix_id``) make requests share identical prompt blocks.
    """

    kind: Literal["trace"]
    path: TraceRef
    rate_per_s: PositiveFloat | None = None
    start_share: float = Field(default=0.0, ge=0.0, lt=1.0)

    @property
    def mean_rate_per_s(self) -> float | None:
        """``rate_per_s``, or the trace's own mean rate where it is replayed as recorded."""
        if self.rate_per_s is not None:
            return self.rate_per_s
        return recorded_rate_per_s(read_trace_ref(self.path))


class ClosedArrival(_Model):
    """Offline: every request is sent at once, served as fast as the server can."""

    kind: Literal["closed"]
    requests: PositiveInt

    @property
    def mean_rate_per_s(self) -> float | None:
        return None


ArrivalSpec = Annotated[
    PoissonArrival | GammaArrival | RampArrival | DiurnalArrival | TraceArrival | ClosedArrival,
    Field(discriminator="kind"),
]


# --- lengths --------------------------------------------------------------------------


class FixedLength(_Model):
    kind: Literal["fixed"]
    value: PositiveInt


class UniformLength(_Model):
    """Integers uniform in [low, high], both included."""

    kind: Literal["uniform"]
    low: PositiveInt
    high: PositiveInt

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")
        return self


class LognormalLength(_Model):
    """exp(Normal(ln median, sigma)), rounded and clipped to [low, high]."""

    kind: Literal["lognormal"]
    median: PositiveFloat
    sigma: NonNegativeFloat
    low: PositiveInt = 1
    high: PositiveInt | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.high is not None and self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")
        return self


class TraceLength(_Model):
    """Lengths from a trace's column (prompt or output, by the field this stands in).

    With a ``path``: the empirical distribution of that file's column, sampled with
    replacement. Without one (only under a trace arrival): each request keeps the
    length its trace row recorded.
    """

    kind: Literal["trace"]
    path: TraceRef | None = None


SimpleLength = Annotated[
    FixedLength | UniformLength | LognormalLength | TraceLength, Field(discriminator="kind")
]


class MixtureComponent(_Model):
    weight: PositiveFloat  # relative; weights need not sum to 1
    length: SimpleLength


class MixtureLength(_Model):
    """Each request draws a component by weight, then its length from that component."""

    kind: Literal["mixture"]
    components: list[MixtureComponent] = Field(min_length=1)


LengthSpec = Annotated[
    FixedLength | UniformLength | LognormalLength | TraceLength | MixtureLength,
    Field(discriminator="kind"),
]
TurnsSpec = Annotated[FixedLength | UniformLength | LognormalLength, Field(discriminator="kind")]


def _length_uses_row(length: LengthSpec) -> bool:
    """True when the length comes from each request's own trace row."""
    if isinstance(length, TraceLength):
        return length.path is None
    if isinstance(length, MixtureLength):
        return any(_length_uses_row(c.length) for c in length.components)
    return False


# --- sharing, sessions, warm-up -------------------------------------------------------


class SharedPrefixSpec(_Model):
    """A system prompt (identical words) that a fraction of requests or sessions start with."""

    system_prompt_tokens: PositiveInt
    fraction: float = Field(default=1.0, ge=0.0, le=1.0)
    distinct_prompts: PositiveInt = 1  # several tenants: each request picks one uniformly


class LognormalThinkTime(_Model):
    """Think times exp(Normal(ln median_s, sigma)) seconds, clipped to [low_s, high_s]: a
    tool's execution time is short for most calls and long for a few (a build, a search)."""

    kind: Literal["lognormal"]
    median_s: PositiveFloat
    sigma: NonNegativeFloat
    low_s: NonNegativeFloat = 0.0
    high_s: PositiveFloat | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.high_s is not None and self.low_s > self.high_s:
            raise ValueError(f"low_s {self.low_s} is above high_s {self.high_s}")
        return self


class UniformThinkTime(_Model):
    """Think times uniform in [low_s, high_s] seconds."""

    kind: Literal["uniform"]
    low_s: NonNegativeFloat
    high_s: NonNegativeFloat

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.low_s > self.high_s:
            raise ValueError(f"low_s {self.low_s} is above high_s {self.high_s}")
        return self


THINK_SECONDS_TAG = "seconds"  # the think time's tag for a plain number (not a YAML key)


def _think_time_kind(value: Any) -> str | None:
    """A plain number is a constant think time; a mapping is a distribution of its kind."""
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        return THINK_SECONDS_TAG
    if isinstance(value, dict):
        kind = value.get("kind")
        return kind if isinstance(kind, str) else None
    if isinstance(value, LognormalThinkTime | UniformThinkTime):
        return value.kind
    return None


# Seconds from an answer to the next turn: a constant, or a distribution drawn per turn.
ThinkTimeSpec = Annotated[
    Annotated[NonNegativeFloat, Tag(THINK_SECONDS_TAG)]
    | Annotated[LognormalThinkTime, Tag("lognormal")]
    | Annotated[UniformThinkTime, Tag("uniform")],
    Discriminator(
        _think_time_kind,
        custom_error_type="think_time_kind",
        custom_error_message="Input should be a number of seconds or a mapping with kind "
        "lognormal or uniform",
    ),
]


class SessionStart(StrEnum):
    """What a schedule of sessions opens on."""

    EMPTY = "empty"  # no conversation under way: the first seconds are first turns
    STATIONARY = "stationary"  # the conversations a server sees after hours of this traffic


class SessionSpec(_Model):
    """Multi-turn conversations: sessions arrive open loop, turns follow answers.

    Each turn's prompt is the previous turn's prompt, the previous answer (as many
    tokens as that turn's ``max_tokens``) and new user text. The arrival process gives
    the sessions' first turns, sent at their arrival whatever the server does. A later
    turn is sent ``think_time_s`` after the answer it extends arrived (closed loop
    within a session: a slow server delays the user's next turn, as it would a real
    user's); a turn that would then go out after the measured window is not sent.
    ``think_time_s`` is a constant or a distribution (``lognormal``, ``uniform``) drawn
    once per turn: an agent's next round waits for its tool to run.
    The plan spaces turns by the previous turn's expected service time
    (``expected_ttft_s`` + ``max_tokens`` × ``expected_tpot_s``) + ``think_time_s``:
    that decides how many turns fit in the window, and when a session already under
    way at offset 0 sends its first turn in it. A session ends early when the next turn's
    prompt and answer would exceed ``max_context_tokens``.

    ``start`` says what is under way when the schedule opens: ``empty`` (no session
    yet, the first seconds hold first turns only) or ``stationary`` (the sessions that
    arrived before, at the same rate, with their turns from offset 0 on; see
    ``workloads.stationary``). Rate-search levels use ``stationary`` unless the spec
    sets ``start`` itself.
    """

    turns: TurnsSpec
    # Seconds from an answer to the next turn: a constant, or a distribution drawn once
    # per turn (``workloads.think``), e.g. {kind: lognormal, median_s: 2, sigma: 1.35}.
    think_time_s: ThinkTimeSpec = 5.0
    expected_ttft_s: NonNegativeFloat = 0.5
    expected_tpot_s: NonNegativeFloat = 0.03
    max_context_tokens: PositiveInt | None = None
    start: SessionStart = SessionStart.EMPTY


class WarmupSpec(_Model):
    """Requests sent before the measured window and excluded from results.

    Warm-up lasts ``duration_s`` and, when ``requests`` is set, at least until that
    many arrivals were sent (with sessions: sessions' first turns); the measured
    window of the spec's ``duration_s`` starts when warm-up ends. Later turns of a
    session started in warm-up are measured once they fall in the window.

    With ``kv_cache_fill`` a trial first fills the server's KV cache to that fraction
    (requests of the workload's own length distribution, at its arrival rate), for
    at most ``max_s`` seconds, so the first measured requests meet a warm server.
    """

    duration_s: NonNegativeFloat = 0.0
    requests: NonNegativeInt = 0
    # Warm-up by KV-cache fill: before the timed warm-up above, send requests drawn
    # from the workload's own lengths and arrivals until the server's KV-cache usage
    # reaches this fraction, or ``max_s`` seconds pass, whichever comes first.
    kv_cache_fill: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    max_s: PositiveFloat = 60.0


# --- the spec -------------------------------------------------------------------------


class WorkloadSpec(_Model):
    name: str = Field(min_length=1)
    description: str = ""
    api: Api = Api.CHAT
    stream: bool = True
    # Ask the server for exactly max_tokens (vLLM's ignore_eos), so output lengths are
    # the spec's and not the model's whim; what capacity planning needs.
    ignore_eos: bool = True
    arrival: ArrivalSpec
    prompt_tokens: LengthSpec
    output_tokens: LengthSpec
    shared_prefix: SharedPrefixSpec | None = None
    sessions: SessionSpec | None = None
    warmup: WarmupSpec = WarmupSpec()
    duration_s: PositiveFloat = 60.0  # the measured window (a closed workload ignores it)
    seed: NonNegativeInt = 0
    slo: Slo = Slo()

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        for field in ("prompt_tokens", "output_tokens"):
            if _length_uses_row(getattr(self, field)):
                if not isinstance(self.arrival, TraceArrival):
                    raise ValueError(
                        f"{field} kind 'trace' without a path takes each request's length from "
                        "its trace row, which needs arrival.kind 'trace'; give a path to sample "
                        "the trace's distribution instead"
                    )
                if self.sessions is not None:
                    raise ValueError(
                        f"{field} from the trace rows cannot be combined with sessions; give "
                        "a path to sample the trace's distribution instead"
                    )
        return self

    @property
    def mean_rate_per_s(self) -> float | None:
        """New arrivals (requests, or sessions when sessions are on) per second; None when
        the workload is closed or a trace replayed at its recorded rate."""
        return self.arrival.mean_rate_per_s

    def with_rate(self, rate_per_s: float) -> WorkloadSpec:
        """The same workload at another mean arrival rate (the shape of ramp and diurnal kept)."""
        if not (math.isfinite(rate_per_s) and rate_per_s > 0):
            raise WorkloadError(
                f"rate {rate_per_s!r} is not accepted; accepted: a finite number > 0"
            )
        rate_per_s = float(rate_per_s)
        arrival = self.arrival
        update: dict[str, Any]
        if isinstance(arrival, PoissonArrival | GammaArrival | TraceArrival):
            update = {"rate_per_s": rate_per_s}
        elif isinstance(arrival, RampArrival):
            k = rate_per_s / ((arrival.start_rate_per_s + arrival.end_rate_per_s) / 2)
            update = {
                "start_rate_per_s": arrival.start_rate_per_s * k,
                "end_rate_per_s": arrival.end_rate_per_s * k,
            }
        elif isinstance(arrival, DiurnalArrival):
            k = rate_per_s / ((arrival.peak_rate_per_s + arrival.trough_rate_per_s) / 2)
            update = {
                "peak_rate_per_s": arrival.peak_rate_per_s * k,
                "trough_rate_per_s": arrival.trough_rate_per_s * k,
            }
        else:
            raise WorkloadError(
                f"workload {self.name!r} is closed (every request at once) and has no rate; "
                "accepted: poisson, gamma, ramp, diurnal or trace arrivals"
            )
        return self.model_copy(update={"arrival": arrival.model_copy(update=update)})

    def with_duration(self, duration_s: float) -> WorkloadSpec:
        """The same workload with another measured window."""
        if not (math.isfinite(duration_s) and duration_s > 0):
            raise WorkloadError(
                f"duration {duration_s!r} is not accepted; accepted: a finite number of seconds > 0"
            )
        return self.model_copy(update={"duration_s": float(duration_s)})


# --- loading --------------------------------------------------------------------------


def builtin_workloads() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def load_workload(name_or_path: str | Path) -> WorkloadSpec:
    """A built-in workload by name (case-insensitive) or a YAML file."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    looks_like_path = (
        isinstance(name_or_path, Path)
        or path.suffix.lower() in {".yaml", ".yml"}
        or "/" in text
        or path.is_file()
    )
    if not looks_like_path:
        names = builtin_workloads()
        wanted = text.strip().lower()
        if wanted not in names:
            raise WorkloadError(
                f"workload {text!r} is not built in; built-in workloads: {', '.join(names)}"
            )
        path = BUILTIN_DIR / f"{wanted}.yaml"
        label = path.name
    else:
        label = text
        if not path.is_file():
            raise WorkloadError(
                f"workload file {text!r} does not exist; or use a built-in workload: "
                f"{', '.join(builtin_workloads())}"
            )
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkloadError(f"workload {label}: cannot read it ({exc.strerror})") from exc
    try:
        return parse_workload(
            raw, label=label, base_dir=path.resolve().parent, default_name=path.stem
        )
    except WorkloadError:
        if not _reads_as_trace(path):
            raise
        raise WorkloadError(
            f"workload {text!r} is a trace, not a workload; accepted: a built-in workload "
            f"({', '.join(builtin_workloads())}) or a YAML file; to replay the trace, a YAML "
            f"with arrival: {{kind: trace, path: {path.resolve()}}} and prompt_tokens and "
            "output_tokens {kind: trace}, as the built-in code workload does"
        ) from None


def _reads_as_trace(path: Path) -> bool:
    """Whether a file that is no workload is a trace ``workloads.traces`` reads."""
    try:
        load_trace(path)
    except TraceError:
        return False
    return True


def parse_workload(
    text: str, *, label: str, base_dir: Path | None = None, default_name: str | None = None
) -> WorkloadSpec:
    """A spec from YAML text; ``label`` names it in errors, relative trace paths use base_dir."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise WorkloadError(f"workload {label}:{where} {problem}") from None
    if not isinstance(data, dict):
        raise WorkloadError(f"workload {label}: expected a mapping of fields, got {data!r:.60}")
    if default_name is not None:
        data.setdefault("name", default_name)
    return validate_workload(data, label=label, base_dir=base_dir)


def validate_workload(
    data: dict[str, Any], *, label: str = "spec", base_dir: Path | None = None
) -> WorkloadSpec:
    try:
        return WorkloadSpec.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise WorkloadError(f"workload {label}: {describe_validation_error(exc)}") from None


# --- pydantic errors as one line ------------------------------------------------------


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (through Optional, unions, Annotated, list)."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, list):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def _tag(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("kind")
    if field is None or typing.get_origin(field.annotation) is not Literal:
        return None
    return str(typing.get_args(field.annotation)[0])


def _walk(loc: tuple[int | str, ...]) -> tuple[str, list[type[BaseModel]]]:
    """A readable path for an error location, and the models that may hold its last key."""
    models: list[type[BaseModel]] = [WorkloadSpec]
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
            continue
        if item == THINK_SECONDS_TAG and not any(item in m.model_fields for m in models):
            continue  # the think time's plain-number branch, not a key of the YAML
        tagged = [m for m in models if _tag(m) == item]
        if tagged and not any(item in m.model_fields for m in models):
            models = tagged  # a discriminated union's tag, not a key of the YAML
            continue
        parts.append(item)
        holders = [m for m in models if item in m.model_fields]
        models = [m for h in holders for m in _models_in(h.model_fields[item].annotation)]
    return ".".join(parts), models


def _holder_fields(loc: tuple[int | str, ...]) -> list[str]:
    _, models = _walk(loc[:-1])
    fields = {name for m in models for name in m.model_fields}
    return sorted(fields)


def _accepted(expected: str) -> str:
    return expected.replace("'", "").replace(" or ", ", ")


def describe_validation_error(exc: ValidationError) -> str:
    """The first error of a ValidationError as 'where value is not accepted; accepted: ...'."""
    error = exc.errors()[0]
    loc = tuple(error["loc"])
    where, _ = _walk(loc)
    kind = error["type"]
    ctx = error.get("ctx") or {}
    value = error.get("input")
    if kind == "union_tag_invalid":
        return (
            f"{where}.kind {ctx.get('tag')!r} is not accepted; "
            f"accepted: {_accepted(str(ctx.get('expected_tags', '')))}"
        )
    if kind == "think_time_kind" and isinstance(value, dict) and "kind" in value:
        return (
            f"{where}.kind {value['kind']!r} is not accepted; accepted: lognormal, uniform "
            "(or a number of seconds)"
        )
    if kind == "union_tag_not_found":
        _, models = _walk(loc)
        tags = ", ".join(t for m in models if (t := _tag(m)) is not None)
        return f"{where}.kind is missing; accepted: {tags}"
    if kind == "extra_forbidden":
        return (
            f"{where} is not a field here; accepted: {', '.join(_holder_fields(loc))}"
            if where
            else "unknown field"
        )
    if kind == "missing":
        return f"{where} is missing"
    if kind in {"literal_error", "enum"}:
        return f"{where} {value!r} is not accepted; accepted: {_accepted(str(ctx.get('expected')))}"
    if kind in {"model_attributes_type", "model_type", "dict_type"}:
        _, models = _walk(loc)
        tags = ", ".join(t for m in models if (t := _tag(m)) is not None)
        accepted = f"a mapping with kind: {tags}" if tags else "a mapping of fields"
        return f"{where} {value!r} is not accepted; accepted: {accepted}"
    message = str(error["msg"])
    if message.startswith("Value error, "):
        text = message.removeprefix("Value error, ")
        return f"{where}: {text}" if where else text
    accepted = message.removeprefix("Input should be ").split(",")[0]
    if isinstance(value, dict | list):
        return f"{where} is not accepted; accepted: {accepted}"
    return f"{where} {value!r} is not accepted; accepted: {accepted}"

"""``Slo``: a workload's latency objectives, the one type from the command line to the gate.

An SLO is a set of objectives, each "the p-th percentile of a latency is at most a
limit" (``SloObjective``): ``ttft p99 <= 2000 ms``. The workload's YAML gives them as
``slo: {ttft: {p99_ms: 2000}, tpot: {p99_ms: 100}}``; ``--slo-ttft-ms`` and
``--slo-itl-ms`` replace a metric's objectives (``Slo.p99``, ``Slo.overridden_by``); a
load run counts a request towards goodput when it meets every limit the SLO puts on
it (``Slo.met_by``: the tightest limit per metric, TTFT, TPOT and end-to-end; an ITL
objective is a percentile over tokens, not one request's); the run records it, and the
regression gate compares a run's with its baseline's as objects: the same objectives,
however they were written or ordered.

Two serialized forms, both read back:

* the mapping above (a workload's YAML, the resolved workload in ``tune.json``, a
  load result's ``slo``);
* one text per objective, ``"ttft p99 <= 2000 ms"`` (``SloObjective.text``), where a run
  states its SLO for people and for the gate: ``recommendation.json``, capacity plans,
  baselines (fields typed ``SloAsTexts``; ``Slo.parse`` reads them back).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    PositiveFloat,
    model_validator,
)

Percentile = Literal[50, 90, 99]
PERCENTILES: tuple[Percentile, ...] = (50, 90, 99)


class SloMetric(StrEnum):
    TTFT = "ttft"
    ITL = "itl"
    TPOT = "tpot"
    E2E = "e2e"


class _Model(BaseModel):
    # NaN and infinity are no limit: rejected like any bad value.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _ms_text(limit_ms: float) -> str:
    """A limit as objectives have always been written (``{:g}``), exact where that is not."""
    short = f"{limit_ms:g}"
    return short if float(short) == limit_ms else repr(float(limit_ms))


_OBJECTIVE_TEXT = re.compile(
    r"^\s*(?P<metric>[a-z0-9]+)\s+p(?P<percentile>\d+)\s*<=\s*(?P<limit>\S+)\s*ms\s*$"
)


class SloObjective(_Model):
    """One objective: the metric's ``percentile``-th percentile must be at most limit_ms."""

    metric: SloMetric
    percentile: Percentile
    limit_ms: PositiveFloat

    def text(self) -> str:
        """``"ttft p99 <= 2000 ms"``: how a run records it (``parse`` reads it back)."""
        return f"{self.metric.value} p{self.percentile} <= {_ms_text(self.limit_ms)} ms"

    @classmethod
    def parse(cls, text: str) -> SloObjective:
        """An objective from its ``text``; ValueError naming the text when it is none."""
        found = _OBJECTIVE_TEXT.match(text)
        accepted = (
            "accepted: 'METRIC pP <= LIMIT ms' with METRIC one of "
            f"{', '.join(m.value for m in SloMetric)}, P one of "
            f"{', '.join(map(str, PERCENTILES))} and LIMIT > 0"
        )
        if found is None:
            raise ValueError(f"SLO objective {text!r} is not accepted; {accepted}")
        metric, percentile = found["metric"], int(found["percentile"])
        try:
            limit_ms = float(found["limit"])
        except ValueError:
            limit_ms = math.nan
        if (
            metric not in {m.value for m in SloMetric}
            or percentile not in PERCENTILES
            or not (math.isfinite(limit_ms) and limit_ms > 0)
        ):
            raise ValueError(f"SLO objective {text!r} is not accepted; {accepted}")
        return cls(metric=SloMetric(metric), percentile=percentile, limit_ms=limit_ms)


class PercentileLimits(_Model):
    p50_ms: PositiveFloat | None = None
    p90_ms: PositiveFloat | None = None
    p99_ms: PositiveFloat | None = None

    @model_validator(mode="after")
    def _one_at_least(self) -> Self:
        if self.p50_ms is None and self.p90_ms is None and self.p99_ms is None:
            raise ValueError("give at least one of p50_ms, p90_ms, p99_ms")
        return self

    def limit_ms(self, percentile: Percentile) -> float | None:
        value: float | None = getattr(self, f"p{percentile}_ms")
        return value


class Slo(_Model):
    """Latency objectives, e.g. ``ttft: {p99_ms: 2000}``; every one must hold.

    Two SLOs are equal when they hold the same objectives, whatever order or form
    (mapping or texts) they were written in."""

    ttft: PercentileLimits | None = None
    itl: PercentileLimits | None = None
    tpot: PercentileLimits | None = None
    e2e: PercentileLimits | None = None

    # --- making one ---------------------------------------------------------------------

    @classmethod
    def of(cls, objectives: Iterable[SloObjective]) -> Slo:
        """The SLO of these objectives (of two on the same percentile, the tighter)."""
        limits: dict[str, dict[str, float]] = {}
        for o in objectives:
            per_metric = limits.setdefault(o.metric.value, {})
            key = f"p{o.percentile}_ms"
            per_metric[key] = min(per_metric.get(key, o.limit_ms), o.limit_ms)
        return cls.model_validate(limits)

    @classmethod
    def p99(
        cls,
        *,
        ttft_ms: float | None = None,
        itl_ms: float | None = None,
        tpot_ms: float | None = None,
        e2e_ms: float | None = None,
    ) -> Slo:
        """p99 limits on the metrics given (what the ``--slo-*-ms`` flags set)."""
        given = {"ttft": ttft_ms, "itl": itl_ms, "tpot": tpot_ms, "e2e": e2e_ms}
        return cls.model_validate(
            {metric: {"p99_ms": limit} for metric, limit in given.items() if limit is not None}
        )

    @classmethod
    def parse(cls, texts: Iterable[str]) -> Slo:
        """The SLO a run recorded as texts (``texts``), e.g. ``["ttft p99 <= 2000 ms"]``."""
        return cls.of(SloObjective.parse(text) for text in texts)

    # --- reading it ---------------------------------------------------------------------

    def limits(self, metric: SloMetric) -> PercentileLimits | None:
        value: PercentileLimits | None = getattr(self, metric.value)
        return value

    def objectives(self) -> list[SloObjective]:
        """Every objective, by metric (TTFT, ITL, TPOT, e2e) then percentile."""
        out: list[SloObjective] = []
        for metric in SloMetric:
            limits = self.limits(metric)
            if limits is None:
                continue
            for percentile in PERCENTILES:
                limit = limits.limit_ms(percentile)
                if limit is not None:
                    out.append(SloObjective(metric=metric, percentile=percentile, limit_ms=limit))
        return out

    def texts(self) -> list[str]:
        """Each objective as ``SloObjective.text``, in ``objectives`` order."""
        return [o.text() for o in self.objectives()]

    def text(self) -> str:
        """The objectives on one line, ``"; "``-separated ("none" without any)."""
        return "; ".join(self.texts()) or "none"

    def request_limit_ms(self, metric: SloMetric) -> float | None:
        """The tightest limit the SLO puts on one request's ``metric`` (None: none)."""
        limits = [o.limit_ms for o in self.objectives() if o.metric is metric]
        return min(limits) if limits else None

    def met_by(self, *, ttft_ms: float, tpot_ms: float, e2e_ms: float) -> bool:
        """Whether one request's latencies meet every per-request limit (``request_limit_ms``
        of TTFT, TPOT and end-to-end latency): what counts it towards goodput."""
        for metric, value in (
            (SloMetric.TTFT, ttft_ms),
            (SloMetric.TPOT, tpot_ms),
            (SloMetric.E2E, e2e_ms),
        ):
            limit = self.request_limit_ms(metric)
            if limit is not None and value > limit:
                return False
        return True

    # --- changing it --------------------------------------------------------------------

    def overridden_by(self, other: Slo) -> Slo:
        """This SLO with every metric ``other`` sets replaced by ``other``'s objectives."""
        update = {m.value: other.limits(m) for m in SloMetric if other.limits(m) is not None}
        return self.model_copy(update=update)

    def scaled(self, factor: float) -> Slo:
        """Every limit multiplied by ``factor`` (a simulator's slower clock)."""
        if factor == 1.0:
            return self
        return Slo.of(
            SloObjective(metric=o.metric, percentile=o.percentile, limit_ms=o.limit_ms * factor)
            for o in self.objectives()
        )


def _slo_from_texts(value: object) -> object:
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return Slo.parse(value)
    return value


# An ``Slo`` a run records as its objectives' texts (``["ttft p99 <= 2000 ms", ...]``, the
# form recommendation.json, capacity plans and baselines have always held); read from
# those texts or from the mapping form.
SloAsTexts = Annotated[
    Slo,
    BeforeValidator(_slo_from_texts),
    PlainSerializer(lambda slo: slo.texts(), return_type=list[str]),
]

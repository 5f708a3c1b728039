"""One ``Slo`` from the command line to the gate: its forms, read back, compared as objects."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from workloads.load_result import LoadResult
from workloads.slo import Slo, SloAsTexts, SloMetric, SloObjective

CHAT = Slo.model_validate({"ttft": {"p99_ms": 2000}, "tpot": {"p99_ms": 100}})


def test_an_objective_reads_back_from_its_text() -> None:
    o = SloObjective(metric=SloMetric.TTFT, percentile=99, limit_ms=2000.0)
    assert o.text() == "ttft p99 <= 2000 ms"
    assert SloObjective.parse(o.text()) == o
    odd = SloObjective(metric=SloMetric.E2E, percentile=90, limit_ms=1234.5678)
    assert SloObjective.parse(odd.text()) == odd  # exact where {:g} would round


@pytest.mark.parametrize(
    "text", ["ttft p95 <= 2000 ms", "qps p99 <= 1 ms", "ttft p99 <= 0 ms", "ttft p99 < 2 ms", ""]
)
def test_a_bad_text_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match="is not accepted; accepted: 'METRIC pP <= LIMIT ms'"):
        SloObjective.parse(text)


def test_the_forms_are_one_slo() -> None:
    assert CHAT.texts() == ["ttft p99 <= 2000 ms", "tpot p99 <= 100 ms"]
    assert Slo.parse(["tpot p99 <= 100 ms", "ttft p99 <= 2000 ms"]) == CHAT
    assert Slo.p99(ttft_ms=2000, tpot_ms=100) == CHAT
    assert Slo.of(CHAT.objectives()) == CHAT
    assert Slo.parse(["ttft p99 <= 2000 ms"]) != CHAT
    assert Slo().text() == "none"


def test_per_request_limits_are_the_tightest_of_ttft_tpot_e2e() -> None:
    slo = Slo.parse(["ttft p50 <= 300 ms", "ttft p99 <= 2000 ms", "itl p99 <= 50 ms"])
    assert slo.request_limit_ms(SloMetric.TTFT) == 300
    assert slo.request_limit_ms(SloMetric.TPOT) is None
    assert slo.met_by(ttft_ms=300, tpot_ms=1e9, e2e_ms=1e9)  # ITL limits no one request
    assert not slo.met_by(ttft_ms=301, tpot_ms=0, e2e_ms=0)


def test_flags_replace_a_metric_and_a_slower_clock_scales_every_limit() -> None:
    workload = Slo.parse(["ttft p50 <= 300 ms", "ttft p99 <= 2000 ms", "tpot p99 <= 100 ms"])
    assert workload.overridden_by(Slo.p99(ttft_ms=500)) == Slo.p99(ttft_ms=500, tpot_ms=100)
    assert workload.overridden_by(Slo()) == workload
    assert CHAT.scaled(4.0) == Slo.p99(ttft_ms=8000, tpot_ms=400)


class _Recorded(BaseModel):
    slo: SloAsTexts


def test_a_recorded_slo_is_its_texts_and_reads_back() -> None:
    recorded = _Recorded(slo=CHAT)
    assert recorded.model_dump(mode="json") == {"slo": CHAT.texts()}
    assert _Recorded.model_validate_json(recorded.model_dump_json()).slo == CHAT
    assert _Recorded.model_validate({"slo": CHAT.model_dump()}).slo == CHAT
    with pytest.raises(ValidationError, match="'ttft p95 <= 1 ms' is not accepted"):
        _Recorded.model_validate({"slo": ["ttft p95 <= 1 ms"]})


def test_a_load_result_reads_the_per_request_form_runs_wrote_before() -> None:
    empty = LoadResult.from_records([], slo=CHAT)
    assert LoadResult.model_validate_json(empty.model_dump_json()) == empty
    old = empty.model_dump(mode="json") | {
        "slo": {"ttft_ms": 2000.0, "tpot_ms": 100.0, "e2e_ms": None}
    }
    assert LoadResult.model_validate(old).slo == CHAT

"""A goodput's units count one population (issue 34).

A goodput is the highest arrival rate whose SLOs held; its requests/s and output tokens/s
are the declared workload at that rate (``Goodput.stated``: the rate times the workload's
requests per arrival and output tokens per request), not what the best level's window
happened to count: a Poisson draw of arrivals over tens of seconds, the turns of the
conversations under way, and the requests still running when the run was cut after the
window, counted with part of their output over the window and its drain. On the virtual
clock (benchmarks/units_agreement.md) vLLM's defaults' window held 15% fewer
conversations than its rate and cut a third of its requests; the twin's pick's, 17% and a
fifth: +30% in conversations/s read as +36% in req/s and +49% in output tokens/s.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tuner.run.evaluation import Evaluation
from tuner.run.goodput import Goodput, GoodputBound, GoodputUnit, UnitGains, UnitsBasis, gains_text
from tuner.search.rate_search import RateLevel, RateSearch
from tuner.serving.live_server import LoadMeasurement
from tuner.serving.load import SloVerdict
from tuner.serving.server import TrialOutcome
from workloads.lengths import TraceColumn, mean_length, sample_lengths
from workloads.load_errors import ABORTED
from workloads.load_result import LoadResult
from workloads.schedule import RequestRecord
from workloads.spec import (
    FixedLength,
    LognormalLength,
    MixtureComponent,
    MixtureLength,
    TraceLength,
    UniformLength,
    WorkloadError,
    load_workload,
)
from workloads.stationary import arrival_means
from workloads.traces import TraceRecord

REPO = Path(__file__).resolve().parents[2]
OLD_RUN = REPO / "tests" / "fixtures" / "old_runs" / "chat-before-layout"
CHAT_OUTPUT = LognormalLength(kind="lognormal", median=250, sigma=0.6, low=16, high=1024)


# --- what one arrival of the declared workload sends ------------------------------------


@pytest.mark.parametrize(
    "length",
    [
        FixedLength(kind="fixed", value=128),
        UniformLength(kind="uniform", low=8, high=24),
        CHAT_OUTPUT,
        LognormalLength(kind="lognormal", median=3, sigma=0.8, low=1, high=10),  # near 1: rounding
        LognormalLength(kind="lognormal", median=150, sigma=0.5),  # no upper end
        LognormalLength(kind="lognormal", median=100, sigma=1.5, low=5, high=10**7),  # integrated
        MixtureLength(
            kind="mixture",
            components=[
                MixtureComponent(
                    weight=0.95, length=UniformLength(kind="uniform", low=100, high=300)
                ),
                MixtureComponent(weight=0.05, length=CHAT_OUTPUT),
            ],
        ),
    ],
    ids=lambda length: length.kind,
)
def test_a_lengths_mean_is_the_mean_of_its_draws(length: object) -> None:
    draws = sample_lengths(length, 400_000, np.random.default_rng(7))  # type: ignore[arg-type]
    standard_error = float(draws.std()) / np.sqrt(len(draws))
    assert mean_length(length) == pytest.approx(float(draws.mean()), abs=4 * standard_error + 1e-9)  # type: ignore[arg-type]


def test_a_trace_length_without_a_path_is_its_rows_mean() -> None:
    rows = [
        TraceRecord(arrival_s=float(i), prompt_tokens=10 * i + 1, output_tokens=i + 1)
        for i in range(4)
    ]
    assert mean_length(TraceLength(kind="trace"), column=TraceColumn.OUTPUT, rows=rows) == 2.5
    assert mean_length(TraceLength(kind="trace"), rows=rows) == 16.0  # the prompt column
    with pytest.raises(WorkloadError, match="needs a trace arrival"):
        mean_length(TraceLength(kind="trace"))


def test_a_chat_conversation_sends_its_declared_turns_and_output() -> None:
    chat = load_workload("chat")
    means = arrival_means(chat)
    assert means.requests_per_arrival == pytest.approx(3.5)  # 1 to 6 turns, uniform
    assert means.output_tokens_per_request == pytest.approx(296.9, abs=0.1)
    # the model ends its answers: no declared output length
    assert (
        arrival_means(chat.model_copy(update={"ignore_eos": False})).output_tokens_per_request
        is None
    )
    assert arrival_means(load_workload("rag")).requests_per_arrival == 1.0
    code = arrival_means(load_workload("code"))  # each request its trace row's output
    assert code.output_tokens_per_request is not None and 1 < code.output_tokens_per_request < 1000


# --- a window's populations ---------------------------------------------------------------

T0 = 1_000.0
TOKEN_S = 0.03


def _answer(
    i: int, scheduled_s: float, tokens: int, *, cut_at_s: float | None = None
) -> RequestRecord:
    """A streamed answer of ``tokens`` tokens, the first 0.1 s after it was due, one every
    30 ms; cut at ``cut_at_s`` (the run's end): aborted with the tokens it had by then."""
    times = [scheduled_s + 0.1 + k * TOKEN_S for k in range(tokens)]
    if cut_at_s is not None and times[-1] > cut_at_s:
        kept = [t for t in times if t < cut_at_s]
        return RequestRecord(
            request_id=f"r{i}", scheduled_s=scheduled_s, sent_s=scheduled_s, prompt_tokens=500,
            output_tokens=len(kept), status=200, first_token_s=kept[0] if kept else None,
            token_times_s=kept, error=ABORTED,
        )  # fmt: skip
    return RequestRecord(
        request_id=f"r{i}", scheduled_s=scheduled_s, sent_s=scheduled_s, prompt_tokens=500,
        output_tokens=tokens, status=200, first_token_s=times[0], end_s=times[-1] + 0.005,
        token_times_s=times,
    )  # fmt: skip


def _window(requests_per_s: float, window_s: float, drain_s: float, tokens: int) -> LoadResult:
    """A window's records: requests evenly spaced at ``requests_per_s`` over ``window_s``,
    each asking for ``tokens``; the run is cut ``drain_s`` after the window closes."""
    n = round(requests_per_s * window_s)
    cut = T0 + window_s + drain_s
    records = [_answer(i, T0 + i / requests_per_s, tokens, cut_at_s=cut) for i in range(n)]
    return LoadResult.from_records(records, window_s=window_s, cut_short=True)


def _search(rate_per_s: float, load: LoadResult, tmp_path: Path) -> RateSearch:
    m = LoadMeasurement(
        out_dir=str(tmp_path / f"level-{rate_per_s:g}"), outcome=TrialOutcome.READY, load=load,
        slo=SloVerdict(met=True, violations=[]),
    )  # fmt: skip
    best = RateLevel(index=0, rate_per_s=rate_per_s, met=True, measurement=m)
    return RateSearch(levels=(best,), best=best, broken_rate_per_s=None, died=False)


def test_the_window_counts_cut_answers_in_part_and_completed_ones_whole() -> None:
    """A 10-s window at 2 req/s of 300-token answers (9.1 s each), cut 4 s after it closes:
    the answers due in its last 5 s are cut, with part of their tokens."""
    load = _window(2.0, 10.0, 4.0, 300)
    assert load.num_requests == 20 and load.num_completed == 10 and load.num_truncated == 10
    assert load.completed_output_tokens == 10 * 300
    assert load.output_tokens_per_completed == 300.0
    assert load.output_tokens < 20 * 300  # the cut ones as far as they got
    assert load.output_token_throughput == pytest.approx(load.output_tokens / load.duration_s)
    assert load.duration_s > load.window_s  # the window and its drain


def test_a_goodputs_units_count_the_same_population_whatever_the_window_held(
    tmp_path: Path,
) -> None:
    """Two settings of chat whose best windows counted differently, as issue 34's did: the
    defaults' held 3.2 requests a conversation and cut a third of them, the pick's 3.7 and
    cut few. Their windows' gains disagree; the goodputs' agree, each unit the declared
    workload at the rate that held."""
    chat = load_workload("chat")
    defaults = _search(6.0, _window(6.0 * 3.2, 18.0, 4.0, 297), tmp_path)
    pick = _search(7.8, _window(7.8 * 3.7, 18.0, 12.0, 297), tmp_path)
    windows = UnitGains(
        unit=GoodputUnit.CONVERSATIONS_PER_S, arrivals=7.8 / 6.0,
        requests=pick.goodput / defaults.goodput, output_tokens=pick.throughput / defaults.throughput,
    )  # fmt: skip
    assert windows.spread is not None and windows.spread > 0.10 and not windows.agree

    old, new = defaults.goodput_of(chat), pick.goodput_of(chat)
    for goodput, rate in ((old, 6.0), (new, 7.8)):
        assert (
            goodput.basis is UnitsBasis.DECLARED and goodput.unit is GoodputUnit.CONVERSATIONS_PER_S
        )
        assert goodput.arrival_rate_per_s == rate
        assert goodput.requests_per_s == pytest.approx(rate * 3.5)
        assert goodput.output_tokens_per_request == pytest.approx(296.9, abs=0.1)
    gains = UnitGains.of(new, old)
    assert gains.spread == pytest.approx(0.0, abs=1e-12) and gains.agree
    text = gains_text(new, old)
    assert text is not None and text.startswith(
        "the same gain over vLLM's defaults in every unit, +30%"
    )
    assert "3.50 requests a conversation and 297 output tokens a request" in text


def test_a_single_turn_goodput_is_what_its_window_offered_with_the_declared_output(
    tmp_path: Path,
) -> None:
    rag = load_workload("rag")
    goodput = _search(2.0, _window(2.1, 20.0, 4.0, 105), tmp_path).goodput_of(rag)
    assert goodput.unit is GoodputUnit.REQUESTS_PER_S
    assert goodput.arrival_rate_per_s == goodput.requests_per_s == pytest.approx(2.1)  # offered
    assert goodput.output_tokens_per_request == pytest.approx(
        arrival_means(rag).output_tokens_per_request
    )


def test_where_the_model_ends_its_answers_the_output_is_the_completed_requests(
    tmp_path: Path,
) -> None:
    """``ignore_eos: false``: the output tokens per request are measured, over the answers
    the window completed (a cut one's length is not known), and a gain that differs in
    output tokens/s says why."""
    chat = load_workload("chat").model_copy(update={"ignore_eos": False})
    defaults = _search(6.0, _window(21.0, 10.0, 4.0, 300), tmp_path).goodput_of(chat)
    pick = _search(7.8, _window(27.3, 10.0, 4.0, 240), tmp_path).goodput_of(chat)
    assert defaults.basis is UnitsBasis.MEASURED_OUTPUT
    assert defaults.output_tokens_per_request == pytest.approx(300.0)
    assert pick.output_tokens_per_request == pytest.approx(240.0)
    assert pick.requests_per_s / defaults.requests_per_s == pytest.approx(7.8 / 6.0)
    text = gains_text(pick, defaults)
    assert text is not None and "the model ends its answers" in text
    assert "240 output tokens a request here against 300" in text


def test_a_goodput_written_before_its_basis_reads_as_its_windows_and_says_so() -> None:
    """Old run files: a goodput without ``basis`` counted its window; its gains in each unit
    are stated with why they differ."""
    old = Goodput.model_validate(
        {"arrival_rate_per_s": 6.02, "unit": "conversations_per_s", "requests_per_s": 19.42,
         "output_tokens_per_s": 3097.0, "bound": "bracketed"}
    )  # fmt: skip
    assert old.basis is UnitsBasis.WINDOW
    new = old.model_copy(
        update={"arrival_rate_per_s": 7.75, "requests_per_s": 27.95, "output_tokens_per_s": 5629.0}
    )
    text = gains_text(new, old)
    assert text is not None
    assert text.startswith("+29% in conversations/s, +44% in req/s, +82% in output tok/s over")
    assert "3.61 requests a conversation and 201 output tokens a request, against 3.23" in text
    assert "the conversations/s is the rate that held" in text
    evaluation = Evaluation.model_validate_json(
        (OLD_RUN / "trials" / "000" / "evaluation.json").read_text()
    )
    assert evaluation.stated_goodput.basis is UnitsBasis.WINDOW


def test_gains_need_both_goodputs_and_keep_a_common_basis() -> None:
    zero = Goodput(unit=GoodputUnit.CONVERSATIONS_PER_S)
    some = Goodput(
        arrival_rate_per_s=2.0, unit=GoodputUnit.CONVERSATIONS_PER_S, requests_per_s=7.0,
        output_tokens_per_s=2000.0, bound=GoodputBound.BRACKETED, basis=UnitsBasis.DECLARED,
    )  # fmt: skip
    assert gains_text(some, zero) is None
    assert Goodput.mean([some, some]).basis is UnitsBasis.DECLARED
    assert Goodput.mean([some, zero]).basis is UnitsBasis.DECLARED  # a repeat that held nothing
    assert Goodput.mean([some, some.model_copy(update={"basis": UnitsBasis.WINDOW})]).basis is (
        UnitsBasis.WINDOW
    )
    # within 5% but not both declared: they agree, and it says no more
    close = some.model_copy(update={"basis": UnitsBasis.WINDOW, "output_tokens_per_s": 2050.0})
    assert gains_text(close, some) == (
        "+0% in conversations/s, +0% in req/s, +2% in output tok/s over vLLM's defaults: "
        "the same gain in every unit, within 5%"
    )

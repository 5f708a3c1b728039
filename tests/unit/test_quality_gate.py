"""The quality gate's pure parts: which settings change numerics, what vLLM's answers say
(token ids, prompt log-probs), the figures and the verdict on fixed answers, the prompts
drawn from a workload, the result in words and the thresholds' validation."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from tuner.errors import ConfigError, QualityProbeError
from tuner.run.quality import (
    QualityFigures,
    QualityOutcome,
    QualityRejection,
    QualityResult,
    QualityThresholds,
)
from tuner.search.config import load_config
from tuner.search.quality_gate import compare, gate_prompts, thresholds_of, verdict
from tuner.serving.token_probe import (
    LOGPROB_FLOOR,
    GreedyAnswer,
    ProbePrompt,
    ServerAnswers,
    TokenScores,
    greedy_answer_of,
    token_scores_of,
)
from tuner.vllm.numerics import (
    NUMERICS_KNOBS,
    changes_numerics,
    numerics_changes,
    numerics_flags,
    with_model_numerics,
)
from tuner.vllm.space import Knob, TrialParams
from workloads.spec import load_workload

# --- which settings change numerics ---------------------------------------------------------


def test_a_kv_cache_dtype_other_than_auto_changes_numerics() -> None:
    assert NUMERICS_KNOBS[Knob.KV_CACHE_DTYPE] == "auto"
    fp8 = TrialParams(gpu_memory_utilization=0.95, max_num_seqs=64, kv_cache_dtype="fp8")
    (change,) = numerics_changes(fp8)
    assert (change.knob, change.value, change.reference) == (Knob.KV_CACHE_DTYPE, "fp8", "auto")
    assert change.text() == "--kv-cache-dtype fp8 (the model's own: auto)"
    assert changes_numerics(fp8)
    assert not changes_numerics(TrialParams(max_num_seqs=64))
    assert not changes_numerics(TrialParams(kv_cache_dtype="auto", block_size=32))


def test_the_reference_keeps_every_other_knob() -> None:
    fp8 = TrialParams(gpu_memory_utilization=0.95, max_num_seqs=64, kv_cache_dtype="fp8_e5m2")
    reference = with_model_numerics(fp8)
    assert reference == fp8.model_copy(update={"kv_cache_dtype": "auto"})
    assert numerics_flags(fp8) == {"kv-cache-dtype": "fp8_e5m2"}
    assert numerics_flags(reference) == {"kv-cache-dtype": "auto"}


# --- what vLLM answers ----------------------------------------------------------------------

# The shapes of vLLM 0.32's answers (its CPU build, the tiny model): a completion with
# return_token_ids, a chat completion with them (the prompt's ids at the response's top
# level), and a completion with prompt_logprobs: 1 (the first entry None; each entry the
# given token and, where it is not first, the token ranked first).
COMPLETION = {
    "object": "text_completion",
    "choices": [{
        "index": 0, "text": " thank brow", "finish_reason": "length",
        "token_ids": [204, 550, 517], "prompt_token_ids": [303, 605, 624, 521],
        "prompt_logprobs": None,
    }],
}  # fmt: skip
CHAT = {
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "222"},
                 "finish_reason": "stop", "token_ids": [22, 22, 1]}],
    "prompt_token_ids": [0, 3, 203, 597],
}  # fmt: skip
SCORED = {
    "choices": [{
        "index": 0, "text": "x", "token_ids": None, "prompt_token_ids": None,
        "prompt_logprobs": [
            None,
            {"605": {"logprob": -6.33, "rank": 185}, "66": {"logprob": -5.53, "rank": 1}},
            {"624": {"logprob": -6.77, "rank": 514}, "66": {"logprob": -5.56, "rank": 1}},
            {"521": {"logprob": -6.73, "rank": 484}, "550": {"logprob": -5.37, "rank": 1}},
            {"204": {"logprob": -5.46, "rank": 1}},
            {"550": {"logprob": -5.70, "rank": 2}, "517": {"logprob": -5.60, "rank": 1}},
            {"517": {"logprob": -math.inf, "rank": 600}, "9": {"logprob": -0.1, "rank": 1}},
        ],
    }],
}  # fmt: skip


def test_a_completion_answer_gives_the_prompt_and_answer_token_ids() -> None:
    answer = greedy_answer_of(COMPLETION, "p0")
    assert answer == GreedyAnswer(
        prompt_id="p0", prompt_token_ids=[303, 605, 624, 521], token_ids=[204, 550, 517],
        finish_reason="length",
    )  # fmt: skip


def test_a_chat_answer_gives_the_prompt_ids_from_the_response() -> None:
    answer = greedy_answer_of(CHAT, "c0")
    assert answer.prompt_token_ids == [0, 3, 203, 597]
    assert answer.token_ids == [22, 22, 1] and answer.finish_reason == "stop"


def test_an_answer_without_token_ids_is_an_error_that_says_so() -> None:
    # what the simulated engine answers: text and fake log-probs, no token ids
    body = {"choices": [{"index": 0, "text": "abc", "finish_reason": "length"}]}
    with pytest.raises(QualityProbeError, match="without token ids"):
        greedy_answer_of(body, "p0")
    with pytest.raises(QualityProbeError, match="no choices"):
        greedy_answer_of({"error": "x"}, "p0")


def test_prompt_logprobs_give_each_tokens_logprob_and_the_top_token() -> None:
    scores = token_scores_of(SCORED, "p0", prompt_len=4, token_ids=[204, 550, 517])
    assert scores.token_ids == [204, 550, 517]
    # 204 is first itself; 550 is second to 517; 517 underflowed (vLLM's floor)
    assert scores.top_token_ids == [204, 517, 9]
    assert scores.logprobs == [-5.46, -5.70, LOGPROB_FLOOR]


def test_prompt_logprobs_that_do_not_cover_the_tokens_are_an_error() -> None:
    with pytest.raises(QualityProbeError, match="do not cover the 8 tokens"):
        token_scores_of(SCORED, "p0", prompt_len=4, token_ids=[204, 550, 517, 1])
    with pytest.raises(QualityProbeError, match="lack token 7"):
        token_scores_of(SCORED, "p0", prompt_len=4, token_ids=[204, 7, 517])


def test_the_greedy_request_follows_the_workloads_api() -> None:
    path, body = ProbePrompt("a", max_tokens=8, prompt="Hello").body("m")
    assert path == "/v1/completions" and body["prompt"] == "Hello"
    assert body["temperature"] == 0.0 and body["return_token_ids"] is True
    path, body = ProbePrompt("b", max_tokens=8, messages=(("user", "Hi"),)).body("m")
    assert path == "/v1/chat/completions"
    assert body["messages"] == [{"role": "user", "content": "Hi"}] and body["max_tokens"] == 8


# --- the figures and the verdict ------------------------------------------------------------


def _answers(
    answers: list[list[int]], scored: list[list[int]], top: list[list[int]], lp: list[list[float]]
) -> ServerAnswers:
    return ServerAnswers(
        answers=[
            GreedyAnswer(prompt_id=f"p{i}", prompt_token_ids=[0, 1], token_ids=a)
            for i, a in enumerate(answers)
        ],
        scores=[
            TokenScores(prompt_id=f"p{i}", token_ids=s, logprobs=lps, top_token_ids=t)
            for i, (s, t, lps) in enumerate(zip(scored, top, lp, strict=True))
        ],
    )


REF_TOKENS = [[5, 6, 7, 8], [9, 10]]
REFERENCE = _answers(
    REF_TOKENS,
    REF_TOKENS,
    top=[[5, 6, 7, 3], [9, 10]],  # its own scoring ranks 3 over its answer's 8 once
    lp=[[-0.1, -0.2, -0.3, -0.4], [-1.0, -2.0]],
)
CANDIDATE = _answers(
    [[5, 6, 2, 2], [9, 10]],  # its free-running answer departs at the third token
    REF_TOKENS,  # it scores the reference's answers
    top=[[5, 6, 2, 3], [9, 11]],  # and picks otherwise at two of the six positions
    lp=[[-0.1, -0.25, -0.9, -0.4], [-1.0, -2.5]],
)


def test_the_figures_of_fixed_answers() -> None:
    figures = compare(REFERENCE, CANDIDATE)
    assert figures.prompts == 2 and figures.reference_tokens == 6
    assert figures.token_agreement == pytest.approx(4 / 6)
    # |differences|: 0, 0.05, 0.6, 0, 0, 0.5
    assert figures.mean_logprob_divergence_nats == pytest.approx(1.15 / 6)
    assert figures.max_logprob_divergence_nats == pytest.approx(0.6)
    assert figures.greedy_prefix_agreement == pytest.approx((2 + 2) / 6)
    assert figures.identical_answers == 1
    assert figures.reference_consistency == pytest.approx(5 / 6)


def test_a_setting_compared_with_itself_agrees_wholly() -> None:
    figures = compare(REFERENCE, REFERENCE)
    assert figures.token_agreement == 1.0 and figures.greedy_prefix_agreement == 1.0
    assert figures.mean_logprob_divergence_nats == 0.0 == figures.max_logprob_divergence_nats
    assert figures.identical_answers == 2


def test_scores_of_other_tokens_are_refused() -> None:
    other = _answers(REF_TOKENS, [[5, 6, 7, 9], [9, 10]], top=REF_TOKENS, lp=[[0.0] * 4, [0.0] * 2])
    with pytest.raises(QualityProbeError, match="not of the reference's answer"):
        compare(REFERENCE, other)
    empty = _answers([[], []], [[], []], top=[[], []], lp=[[], []])
    with pytest.raises(QualityProbeError, match="no tokens"):
        compare(empty, empty)


def test_the_verdict_names_each_threshold_missed() -> None:
    figures = compare(REFERENCE, CANDIDATE)  # 66.7% agreement, 0.192 nats/token
    loose = QualityThresholds(min_token_agreement=0.6, max_logprob_divergence_nats=0.2)
    assert verdict(figures, loose) == (QualityOutcome.PASSED, "")
    outcome, reason = verdict(figures, QualityThresholds(min_token_agreement=0.7, max_logprob_divergence_nats=0.2))  # fmt: skip
    assert outcome is QualityOutcome.FAILED
    assert reason == "token agreement 66.7% is below 70.0% (--quality-min-agreement)"
    outcome, reason = verdict(figures, QualityThresholds(min_token_agreement=0.5, max_logprob_divergence_nats=0.1))  # fmt: skip
    assert outcome is QualityOutcome.FAILED
    assert reason == (
        "log-prob divergence 0.192 nats/token is above 0.1 (--quality-max-logprob-divergence)"
    )
    outcome, reason = verdict(figures, QualityThresholds())  # the defaults: both missed
    assert outcome is QualityOutcome.FAILED and reason.count("(--quality-") == 2


# --- the prompts ----------------------------------------------------------------------------


def test_the_prompts_are_the_workloads_own_spread_over_its_schedule() -> None:
    chat = load_workload("chat")
    prompts = gate_prompts(chat, count=6, max_tokens=16)
    assert len(prompts) == 6 and len({p.prompt_id for p in prompts}) == 6
    assert all(p.messages is not None and p.prompt is None for p in prompts)
    assert all(p.messages[-1][0] == "user" for p in prompts if p.messages)
    assert all(1 <= p.max_tokens <= 16 for p in prompts)
    # later turns carry their conversation's history: workload-shaped, not one short prompt
    assert max(len(p.messages or ()) for p in prompts) > 2
    assert gate_prompts(chat, count=6, max_tokens=16) == prompts  # the workload's seed
    tiny = Path(__file__).resolve().parents[1] / "fixtures" / "workloads" / "tiny.yaml"
    completions = gate_prompts(load_workload(tiny), count=4, max_tokens=64)
    assert len(completions) == 4 and all(p.prompt and p.messages is None for p in completions)
    # one token short of the request's own cap (8..24): the scoring request adds one
    assert all(p.max_tokens <= 23 for p in completions)


# --- the result in words --------------------------------------------------------------------


def _result(outcome: QualityOutcome, reason: str = "", figures: Any = None) -> QualityResult:
    return QualityResult(
        outcome=outcome, reason=reason, candidate={"kv-cache-dtype": "fp8"},
        reference={"kv-cache-dtype": "auto"}, thresholds=QualityThresholds(),
        figures=figures, workload="chat", trial=3,
    )  # fmt: skip


def test_the_result_says_what_was_compared_and_how_it_came_out() -> None:
    not_measured = _result(QualityOutcome.NOT_MEASURED, "the simulated engine computes no model")
    assert not_measured.text() == (
        "quality not measured (--kv-cache-dtype fp8 against --kv-cache-dtype auto): "
        "the simulated engine computes no model"
    )
    figures = QualityFigures(
        prompts=32, reference_tokens=1024, token_agreement=0.984,
        mean_logprob_divergence_nats=0.0123, max_logprob_divergence_nats=0.41,
        greedy_prefix_agreement=0.9, identical_answers=27, reference_consistency=1.0,
    )  # fmt: skip
    passed = _result(QualityOutcome.PASSED, figures=figures).text()
    assert passed.startswith("quality passed (--kv-cache-dtype fp8 against --kv-cache-dtype auto on 32 prompts of chat): 98.4% of 1,024 greedy tokens agree, log-prob divergence 0.0123 nats/token")  # fmt: skip
    assert passed.endswith("held to token agreement >= 95.0%, log-prob divergence <= 0.1 nats/token")  # fmt: skip
    failed = _result(QualityOutcome.FAILED, "token agreement 98.4% is below 99.0%", figures)
    assert failed.text().startswith("quality FAILED (")
    assert failed.text().endswith("; token agreement 98.4% is below 99.0%")
    rejection = QualityRejection(trial=3, flags={"kv-cache-dtype": "fp8"}, result=failed, instead=1)
    assert rejection.text().startswith("trial 3 not recommended: quality FAILED")
    assert rejection.text().endswith(
        "recommended instead: trial 1, the best setting that keeps the model's own numerics"
    )


# --- the thresholds -------------------------------------------------------------------------


def test_the_thresholds_come_from_the_config_with_defaults() -> None:
    config = load_config(None, {})
    assert config.quality_gate and thresholds_of(config) == QualityThresholds()
    assert (config.quality_prompts, config.quality_max_tokens) == (32, 32)
    config = load_config(
        None, {"quality_min_agreement": 0.99, "quality_max_logprob_divergence_nats": 0.02}
    )
    assert thresholds_of(config) == QualityThresholds(
        min_token_agreement=0.99, max_logprob_divergence_nats=0.02
    )


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            {"quality_min_agreement": 95.0},
            "--quality-min-agreement 95.0 is not accepted: a token agreement is a share from "
            "0 to 1 (0.95: 95% of the tokens agree)",
        ),
        (
            {"quality_max_logprob_divergence_nats": -0.1},
            "--quality-max-logprob-divergence -0.1 is not accepted: a log-prob divergence is "
            "nats per token, 0 or more (e.g. 0.1)",
        ),
        ({"quality_prompts": 0}, "--quality-prompts 0 is not accepted"),
    ],
)
def test_a_bad_threshold_is_one_line_naming_it(overrides: dict[str, Any], line: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(None, overrides)
    assert str(raised.value).startswith(line) and "\n" not in str(raised.value)

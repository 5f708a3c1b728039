"""The quality gate: a setting that changes numerics is compared with the model's own before
it can be recommended.

A setting that changes what the model computes (``tuner.vllm.numerics``, e.g.
``--kv-cache-dtype fp8``) may serve more and answer worse. Before the recommendation is
built from such a setting, ``gate_best`` launches the setting's reference (the same
flags with the model's own numerics: ``--kv-cache-dtype auto``) and then the setting
itself, one at a time, and asks each for its greedy answers to prompts of the tuned
workload and for the log-probs of the reference's answers (``tuner.serving.token_probe``):

- **token agreement**: at each token of the reference's greedy answers, whether both
  settings pick the same greedy token given the same text before it (teacher-forced:
  one near-tie that flips does not make every later token a disagreement);
- **log-prob divergence**: the mean |log p_candidate - log p_reference| of the
  reference's tokens, in nats per token;
- and, not gated, the free-running answers' agreement before they first differ.

It passes when the agreement is at least ``--quality-min-agreement`` and the divergence at
most ``--quality-max-logprob-divergence``. A setting that fails, or that could not be
measured on a real vLLM (it did not start, an error, no time left in the budget), is not
recommended: the best trial that keeps the model's numerics is, and the recommendation
says which setting was passed over and why. On the simulated engine nothing can be
measured (it computes no model), and with ``--no-quality-gate`` nothing is: the
recommendation keeps the setting and says "quality not measured" with the reason.

    <run>/quality/quality.json                 the result (``tuner.run.quality.QualityResult``)
    <run>/quality/reference/server.log         the reference server's log
    <run>/quality/reference/answers.jsonl      its answers and their scores
    <run>/quality/candidate/...                the same for the setting gated
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tuner.errors import ConfigError, QualityProbeError, TunerError, WorkloadLoadError
from tuner.run.budget import LaunchKind
from tuner.run.config import TuneConfig
from tuner.run.evaluation import Evaluation
from tuner.run.layout import RunLayout
from tuner.run.quality import (
    QualityFigures,
    QualityOutcome,
    QualityRejection,
    QualityResult,
    QualityThresholds,
)
from tuner.search.budget import TimeBudget, launch_prior_s
from tuner.search.context import StudySetup, TuneContext
from tuner.search.evaluate import launch_spec
from tuner.search.optuna_store import FrozenTrial, Study
from tuner.search.study import best_trial, load_evaluation
from tuner.serving.live_server import LiveServer
from tuner.serving.load import plan_schedule
from tuner.serving.processes import ChildRegistry
from tuner.serving.server import Backend
from tuner.serving.token_probe import (
    GreedyAnswer,
    ProbePrompt,
    ServerAnswers,
    TokenProbe,
    TokenScores,
)
from tuner.vllm.numerics import (
    NUMERICS_KNOBS,
    changes_numerics,
    numerics_changes,
    numerics_flags,
    with_model_numerics,
)
from tuner.vllm.space import TrialParams
from workloads.schedule import ScheduledRequest
from workloads.spec import WorkloadSpec

log = logging.getLogger(__name__)

Progress = Callable[[str], None]

REFERENCE = "reference"
CANDIDATE = "candidate"
SIMULATED_REASON = (
    "the simulated engine computes no model, so its tokens and log-probs say nothing of "
    "the model's answers; measure on a real vLLM before deploying this setting"
)
GATE_OFF_REASON = "the quality gate was turned off (--no-quality-gate)"
# A request's time before any was measured (for the budget): per answer token at a batch
# of one, and per request on top (tokenization, the prompt's prefill, HTTP).
TOKEN_S_PRIOR = 0.05
REQUEST_S_PRIOR = 0.5


# --- the prompts ---------------------------------------------------------------------------


def gate_prompts(
    workload: WorkloadSpec,
    *,
    count: int,
    max_tokens: int,
    max_model_len: int | None = None,
    model_dir: Path | None = None,
) -> list[ProbePrompt]:
    """``count`` prompts of the workload's own schedule (its seed, lengths, shared prefixes,
    conversations' histories), spread evenly over its measured requests, each answer capped
    at ``max_tokens`` and one short of the request's own cap (the scoring request appends
    the answer to the prompt and asks for one more token: it fits where the request did)."""
    schedule = plan_schedule(workload, max_model_len=max_model_len, model_dir=model_dir)
    measured = [r for r in schedule if not r.warmup] or schedule
    return [_prompt(r, max_tokens) for r in _spread(measured, count)]


def _spread(requests: Sequence[ScheduledRequest], count: int) -> list[ScheduledRequest]:
    if len(requests) <= count:
        return list(requests)
    if count == 1:
        return [requests[0]]
    last = len(requests) - 1
    picks = sorted({round(i * last / (count - 1)) for i in range(count)})
    return [requests[i] for i in picks]


def _prompt(request: ScheduledRequest, max_tokens: int) -> ProbePrompt:
    cap = max(1, min(max_tokens, request.max_tokens - 1))
    if request.messages is not None:
        messages = tuple((m["role"], m["content"]) for m in request.messages)
        return ProbePrompt(prompt_id=request.request_id, max_tokens=cap, messages=messages)
    return ProbePrompt(prompt_id=request.request_id, max_tokens=cap, prompt=request.prompt or "")


# --- the comparison ------------------------------------------------------------------------


def thresholds_of(config: TuneConfig) -> QualityThresholds:
    return QualityThresholds(
        min_token_agreement=config.quality_min_agreement,
        max_logprob_divergence_nats=config.quality_max_logprob_divergence_nats,
    )


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def compare(reference: ServerAnswers, candidate: ServerAnswers) -> QualityFigures:
    """The figures of ``candidate`` against ``reference``: both servers' answers to the same
    prompts, and each one's scores of the reference's answers (``QualityFigures``)."""
    n = len(reference.answers)
    if not n or len(candidate.answers) != n or len(reference.scores) != n:
        raise QualityProbeError(
            f"the servers answered {len(reference.answers)} and {len(candidate.answers)} "
            "prompts: nothing to compare"
        )
    if len(candidate.scores) != n:
        raise QualityProbeError(f"the candidate scored {len(candidate.scores)} of {n} answers")
    tokens = agree = consistent = prefix = identical = 0
    divergences: list[float] = []
    for ref, cand, ref_scores, cand_scores in zip(
        reference.answers, candidate.answers, reference.scores, candidate.scores, strict=True
    ):
        _check_scores(ref, ref_scores, REFERENCE)
        _check_scores(ref, cand_scores, CANDIDATE)
        tokens += len(ref.token_ids)
        agree += sum(a == b for a, b in zip(ref_scores.top_token_ids, cand_scores.top_token_ids, strict=True))  # fmt: skip
        consistent += sum(a == b for a, b in zip(ref_scores.top_token_ids, ref.token_ids, strict=True))  # fmt: skip
        divergences += [abs(a - b) for a, b in zip(cand_scores.logprobs, ref_scores.logprobs, strict=True)]  # fmt: skip
        prefix += _common_prefix(ref.token_ids, cand.token_ids)
        identical += ref.token_ids == cand.token_ids
    if not tokens:
        raise QualityProbeError(f"the reference answered no tokens to any of the {n} prompts")
    return QualityFigures(
        prompts=n,
        reference_tokens=tokens,
        token_agreement=agree / tokens,
        mean_logprob_divergence_nats=sum(divergences) / tokens,
        max_logprob_divergence_nats=max(divergences),
        greedy_prefix_agreement=prefix / tokens,
        identical_answers=identical,
        reference_consistency=consistent / tokens,
    )


def _check_scores(answer: GreedyAnswer, scores: TokenScores, role: str) -> None:
    if scores.prompt_id != answer.prompt_id or scores.token_ids != answer.token_ids:
        raise QualityProbeError(
            f"the {role}'s scores of prompt {answer.prompt_id} are not of the reference's answer"
        )


def verdict(figures: QualityFigures, thresholds: QualityThresholds) -> tuple[QualityOutcome, str]:
    """Passed when both figures are within the thresholds; else failed, with which is not."""
    misses: list[str] = []
    if figures.token_agreement < thresholds.min_token_agreement:
        misses.append(
            f"token agreement {figures.token_agreement:.1%} is below "
            f"{thresholds.min_token_agreement:.1%} (--quality-min-agreement)"
        )
    if figures.mean_logprob_divergence_nats > thresholds.max_logprob_divergence_nats:
        misses.append(
            f"log-prob divergence {figures.mean_logprob_divergence_nats:.3g} nats/token is above "
            f"{thresholds.max_logprob_divergence_nats:g} (--quality-max-logprob-divergence)"
        )
    if misses:
        return QualityOutcome.FAILED, "; ".join(misses)
    return QualityOutcome.PASSED, ""


# --- the gate ------------------------------------------------------------------------------


def gate_need_s(ctx: TuneContext, budget: TimeBudget | None) -> float:
    """What the gate takes: two launches (as measured, else the prior) and each server's
    answers and scores at a batch of one (``TOKEN_S_PRIOR``, ``REQUEST_S_PRIOR``)."""
    c = ctx.config
    launch = budget.launch_estimate_s() if budget is not None else launch_prior_s(ctx)
    answers = c.quality_prompts * (2 * REQUEST_S_PRIOR + c.quality_max_tokens * TOKEN_S_PRIOR)
    return 2 * (launch + answers)


def may_gate(ctx: TuneContext) -> bool:
    """Whether this tune may have a setting to measure: the gate is on, the backend is a
    real vLLM and the space has a value that changes numerics."""
    if not ctx.config.quality_gate or ctx.backend is Backend.SIM:
        return False
    return any(
        value != NUMERICS_KNOBS[r.knob]
        for r in ctx.space.ranges
        if r.knob in NUMERICS_KNOBS
        for value in r.values()
    )


def run_quality_gate(
    ctx: TuneContext,
    setup: StudySetup,
    params: TrialParams,
    *,
    registry: ChildRegistry,
    progress: Progress,
    trial: int | None = None,
    budget: TimeBudget | None = None,
    deadline_s: float | None = None,
) -> QualityResult:
    """``params`` (a setting that changes numerics) against its reference, written to
    ``quality/quality.json`` and said; never raises for what a server did (that is a
    result: not measured, with the reason)."""
    reference = with_model_numerics(params)
    layout = RunLayout(ctx.run_dir)

    def result(outcome: QualityOutcome, reason: str, figures: QualityFigures | None = None) -> QualityResult:  # fmt: skip
        return QualityResult(
            outcome=outcome, reason=reason, candidate=numerics_flags(params),
            reference=numerics_flags(reference), thresholds=thresholds_of(ctx.config),
            figures=figures, workload=ctx.workload.name, trial=trial,
            dir=str(layout.quality_dir) if figures is not None else None,
        )  # fmt: skip

    changes = numerics_changes(params)
    if not changes:
        raise ValueError(f"{params.short()} keeps the model's own numerics: nothing to gate")
    gated: QualityResult
    if not ctx.config.quality_gate:
        gated = result(QualityOutcome.NOT_MEASURED, GATE_OFF_REASON)
    elif ctx.backend is Backend.SIM:
        gated = result(QualityOutcome.NOT_MEASURED, SIMULATED_REASON)
    else:
        gated = _measure(ctx, setup, params, reference, result, registry, progress, budget, deadline_s)  # fmt: skip
    layout.quality_dir.mkdir(parents=True, exist_ok=True)
    layout.quality_json.write_text(gated.model_dump_json(indent=2), encoding="utf-8")
    progress(f"quality     {gated.text()}")
    return gated


def _measure(
    ctx: TuneContext,
    setup: StudySetup,
    params: TrialParams,
    reference: TrialParams,
    result: Callable[..., QualityResult],
    registry: ChildRegistry,
    progress: Progress,
    budget: TimeBudget | None,
    deadline_s: float | None,
) -> QualityResult:
    c = ctx.config
    try:
        prompts = gate_prompts(
            ctx.workload, count=c.quality_prompts, max_tokens=c.quality_max_tokens,
            max_model_len=ctx.base.max_model_len, model_dir=ctx.model_dir,
        )  # fmt: skip
    except (WorkloadLoadError, ConfigError) as exc:
        return result(QualityOutcome.NOT_MEASURED, f"the workload's prompts: {exc}")
    if budget is not None:
        skip = budget.fits(
            LaunchKind.QUALITY_GATE, "the quality gate", gate_need_s(ctx, budget),
            deadline_s=deadline_s,
        )  # fmt: skip
        if skip is not None:
            return result(QualityOutcome.NOT_MEASURED, skip.text())
    progress(
        f"quality     {' '.join(ch.text() for ch in numerics_changes(params))}: "
        f"{len(prompts)} prompts of {ctx.workload.name}, the reference first"
    )
    try:
        ref = server_answers(
            ctx, setup, reference, REFERENCE, prompts, registry=registry, budget=budget,
            deadline_s=deadline_s,
        )  # fmt: skip
        cand = server_answers(
            ctx, setup, params, CANDIDATE, prompts, registry=registry, budget=budget,
            deadline_s=deadline_s, score=ref.answers,
        )  # fmt: skip
        figures = compare(ref, cand)
    except TunerError as exc:  # a server that did not start or answer; a launcher not found
        return result(QualityOutcome.NOT_MEASURED, str(exc))
    outcome, reason = verdict(figures, thresholds_of(c))
    return result(outcome, reason, figures)


def server_answers(
    ctx: TuneContext,
    setup: StudySetup,
    params: TrialParams,
    role: str,
    prompts: Sequence[ProbePrompt],
    *,
    registry: ChildRegistry,
    budget: TimeBudget | None = None,
    deadline_s: float | None = None,
    score: Sequence[GreedyAnswer] | None = None,
) -> ServerAnswers:
    """Launch ``params``, ask it for its greedy answers to ``prompts`` and its scores of
    ``score``'s answers (None: its own), stop it; written to ``quality/<role>/``.
    ``QualityProbeError`` when it does not start or its answers cannot be read."""
    out_dir = RunLayout(ctx.run_dir).quality_server_dir(role)
    began = time.monotonic()
    launched = measured = began
    ready = False
    try:
        with LiveServer(
            launch_spec(ctx, setup, params), trial_dir=out_dir, registry=registry,
            gpu_source=ctx.gpu_source,
        ) as live:  # fmt: skip
            launched = measured = time.monotonic()
            startup = live.startup
            if startup is None or not live.ready:
                said = "no startup" if startup is None else startup.outcome.value
                if startup is not None and (startup.failure or startup.note):
                    said = startup.failure.message if startup.failure else str(startup.note)
                raise QualityProbeError(
                    f"the {role} server ({params.short() or 'vLLM defaults'}) did not start: "
                    f"{said} (its log: {out_dir / 'server.log'})"
                )
            ready = True
            probe = TokenProbe(live.server.base_url, live.model)
            answers = [probe.greedy(p) for p in prompts]
            scored = answers if score is None else list(score)
            scores = [probe.score(a.prompt_id, a.prompt_token_ids, a.token_ids) for a in scored]
            measured = time.monotonic()
    finally:
        if budget is not None:
            budget.record(
                LaunchKind.QUALITY_GATE, f"quality {role}", began_s=began,
                launch_s=launched - began, measure_s=measured - launched,
                stop_s=time.monotonic() - measured, ready=ready, deadline_s=deadline_s,
            )  # fmt: skip
    found = ServerAnswers(answers=answers, scores=scores)
    RunLayout(ctx.run_dir).quality_answers(role).write_text(found.jsonl(), encoding="utf-8")
    return found


# --- the recommendation's setting ----------------------------------------------------------


@dataclass(frozen=True)
class GatedBest:
    """The trial the recommendation is built from once the gate has been through it."""

    trial: FrozenTrial | None  # None: no trial may be recommended
    evaluation: Evaluation | None
    quality: QualityResult | None  # the gate's result for it (None: it keeps the numerics)
    rejected: QualityRejection | None  # the best trial, where it was passed over


class GateRunner(Protocol):
    """What gates one setting (``run_quality_gate``; a test's stand-in)."""

    def __call__(
        self,
        ctx: TuneContext,
        setup: StudySetup,
        params: TrialParams,
        *,
        registry: ChildRegistry,
        progress: Progress,
        trial: int | None = None,
        budget: TimeBudget | None = None,
        deadline_s: float | None = None,
    ) -> QualityResult: ...


def keeps_model_numerics(ctx: TuneContext) -> Callable[[FrozenTrial], bool]:
    """Whether a trial of this study keeps the model's own numerics."""
    return lambda t: not changes_numerics(ctx.space.from_optuna(t.params))


def gate_best(
    ctx: TuneContext,
    setup: StudySetup,
    study: Study,
    best: FrozenTrial,
    evaluation: Evaluation,
    *,
    registry: ChildRegistry,
    progress: Progress,
    budget: TimeBudget | None = None,
    deadline_s: float | None = None,
    gate: GateRunner | None = None,
) -> GatedBest:
    """The best trial, gated where its settings change numerics: kept when it passed (or
    where nothing can be measured: the simulated engine, ``--no-quality-gate``, said in
    words); else the best trial that keeps the model's numerics, with the rejection.
    ``gate``: what gates the setting (None: ``run_quality_gate``)."""
    if not changes_numerics(evaluation.params):
        return GatedBest(best, evaluation, None, None)
    result = (gate or run_quality_gate)(
        ctx, setup, evaluation.params, registry=registry, progress=progress,
        trial=best.number, budget=budget, deadline_s=deadline_s,
    )  # fmt: skip
    unmeasurable = result.outcome is QualityOutcome.NOT_MEASURED and (
        ctx.backend is Backend.SIM or not ctx.config.quality_gate
    )
    if result.passed or unmeasurable:
        return GatedBest(best, evaluation, result, None)
    fallback = best_trial(study, where=keeps_model_numerics(ctx))
    fallback_eval = load_evaluation(fallback) if fallback is not None else None
    instead = fallback if fallback_eval is not None else None
    rejected = QualityRejection(
        trial=best.number, flags=dict(evaluation.flags), result=result,
        instead=instead.number if instead is not None else None,
    )  # fmt: skip
    progress(f"quality     {rejected.text()}")
    return GatedBest(instead, fallback_eval, None, rejected)

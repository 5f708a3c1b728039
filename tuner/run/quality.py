"""``quality/quality.json``: the quality gate's result for a setting that changes numerics.

``tuner.search.quality_gate`` compares a setting that changes what the model computes
(``tuner.vllm.numerics``: ``--kv-cache-dtype fp8``) with the same setting at the model's
own values (``--kv-cache-dtype auto``) on prompts of the tuned workload, through vLLM's
OpenAI API, and records a ``QualityResult``: ``QualityOutcome`` (passed, failed, or not
measured with the reason), the figures (``QualityFigures``) and the thresholds they were
held to (``QualityThresholds``). ``recommendation.json`` carries the result of the
recommended setting, and a ``QualityRejection`` where a faster setting failed the gate
and a setting that keeps the model's numerics was recommended instead.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

# The thresholds a setting is held to unless the user sets others (--quality-min-agreement,
# --quality-max-logprob-divergence); see docs/guides/recommendations.md.
DEFAULT_MIN_TOKEN_AGREEMENT = 0.95
DEFAULT_MAX_LOGPROB_DIVERGENCE_NATS = 0.1


class QualityOutcome(StrEnum):
    """What the quality gate found of a setting that changes numerics."""

    PASSED = "passed"  # within both thresholds: it may be recommended
    FAILED = "failed"  # past a threshold: not recommended
    NOT_MEASURED = "not_measured"  # not compared (the reason says why)


class QualityThresholds(BaseModel):
    """What a setting that changes numerics must hold to be recommended."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    # The share of the reference's greedy tokens at which both settings pick the same
    # greedy token (given the same text before it)
    min_token_agreement: float = Field(default=DEFAULT_MIN_TOKEN_AGREEMENT, ge=0, le=1)
    # The mean |log p(candidate) - log p(reference)| of the reference's greedy tokens
    max_logprob_divergence_nats: float = Field(default=DEFAULT_MAX_LOGPROB_DIVERGENCE_NATS, ge=0)

    def text(self) -> str:
        return (
            f"token agreement >= {self.min_token_agreement:.1%}, log-prob divergence "
            f"<= {self.max_logprob_divergence_nats:g} nats/token"
        )


class QualityFigures(BaseModel):
    """What the comparison measured over the gate's prompts.

    Each figure is over the reference's greedy tokens (its answers at temperature 0), each
    scored by both servers with the same text before it (``prompt_logprobs``), so one token
    that flips on a near-tie does not count every later token as a disagreement:

    - ``token_agreement``: the share at which both servers' greedy (top-1) token is the same;
    - ``mean_logprob_divergence_nats``: the mean |log p_candidate - log p_reference| of the
      reference's token; ``max_logprob_divergence_nats`` the largest;
    - ``greedy_prefix_agreement``: of the free-running answers, the share of the reference's
      tokens the candidate generated identically before the first token where they differ;
      ``identical_answers``: the prompts whose answers were identical end to end;
    - ``reference_consistency``: the share of the reference's tokens that its own scoring
      ranks first (about 1: the scoring reads the answers it was given).
    """

    model_config = ConfigDict(frozen=True)

    prompts: int
    reference_tokens: int
    token_agreement: float
    mean_logprob_divergence_nats: float
    max_logprob_divergence_nats: float
    greedy_prefix_agreement: float
    identical_answers: int
    reference_consistency: float

    def text(self) -> str:
        return (
            f"{self.token_agreement:.1%} of {self.reference_tokens:,} greedy tokens agree, "
            f"log-prob divergence {self.mean_logprob_divergence_nats:.3g} nats/token "
            f"(largest {self.max_logprob_divergence_nats:.3g}); the free-running answers "
            f"agree on {self.greedy_prefix_agreement:.1%} of tokens before they first differ, "
            f"{self.identical_answers} of {self.prompts} identical"
        )


class QualityResult(BaseModel):
    """The quality gate's result for one setting that changes numerics."""

    model_config = ConfigDict(frozen=True)

    outcome: QualityOutcome
    # Why, in words: which threshold failed, or why nothing was measured ("" when passed)
    reason: str = ""
    # The numerics knobs of the setting compared and of its reference, e.g.
    # {"kv-cache-dtype": "fp8"} against {"kv-cache-dtype": "auto"}
    candidate: dict[str, str | float | int | bool]
    reference: dict[str, str | float | int | bool]
    thresholds: QualityThresholds
    figures: QualityFigures | None = None
    workload: str | None = None  # whose prompts
    trial: int | None = None  # the trial whose settings were gated
    dir: str | None = None  # the evidence: each server's log and answers

    @property
    def passed(self) -> bool:
        return self.outcome is QualityOutcome.PASSED

    def compared(self) -> str:
        """E.g. ``--kv-cache-dtype fp8 against --kv-cache-dtype auto``."""

        def flags(values: dict[str, str | float | int | bool]) -> str:
            return " ".join(f"--{k} {v}" for k, v in values.items())

        return f"{flags(self.candidate)} against {flags(self.reference)}"

    def text(self) -> str:
        """The result in words, e.g. "quality passed: --kv-cache-dtype fp8 against
        --kv-cache-dtype auto on 32 prompts of chat: 98.4% of 1,024 greedy tokens agree,
        ..." or "quality not measured: the simulated engine ..."."""
        if self.outcome is QualityOutcome.NOT_MEASURED:
            return f"quality not measured ({self.compared()}): {self.reason}"
        verdict = "passed" if self.passed else "FAILED"
        on = f" on {self.figures.prompts} prompts" if self.figures is not None else ""
        of = f" of {self.workload}" if self.workload and self.figures is not None else ""
        figures = f": {self.figures.text()}" if self.figures is not None else ""
        why = f"; {self.reason}" if self.reason else ""
        return (
            f"quality {verdict} ({self.compared()}{on}{of}){figures}; "
            f"held to {self.thresholds.text()}{why}"
        )


class QualityRejection(BaseModel):
    """A setting that served more but was not recommended because of its quality result."""

    model_config = ConfigDict(frozen=True)

    trial: int
    flags: dict[str, object]
    result: QualityResult
    # The trial recommended instead (the best that keeps the model's numerics); None: none
    # met the SLOs
    instead: int | None

    def text(self) -> str:
        instead = (
            f"recommended instead: trial {self.instead}, the best setting that keeps the "
            "model's own numerics"
            if self.instead is not None
            else "no setting that keeps the model's own numerics met the SLOs"
        )
        return f"trial {self.trial} not recommended: {self.result.text()}; {instead}"

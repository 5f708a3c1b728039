"""The quality gate against vLLM's CPU build: the tiny model's KV cache in fp8 against its own
dtype (bf16), two real launches one after the other, through vLLM's OpenAI API.

The CPU build's attention lists ``--kv-cache-dtype`` auto, fp8, fp8_e4m3 and fp8_e5m2, and
takes fp8 only on x86 with AVX-512 or AMX ("FP8 KV cache on CPU requires x86 with AVX-512
or AMX."); elsewhere the gate compares float16, which the build also starts with (its
answers were those of auto on an AVX-512 host: 0 nats/token). What it took and refused is
in docs/guides/recommendations.md, in its own words. The tiny model's weights are random,
so whether fp8 passes the default thresholds says nothing of a real model: the test
checks that the gate measured, that its figures are what its evidence says, and that the
verdict follows them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.vllm_cpu.conftest import (
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    TINY_MODEL,
    VLLM_CMD_TEXT,
    TinyModel,
    write_workload,
)
from tuner.run.config import TuneConfig
from tuner.run.layout import RunLayout
from tuner.run.quality import QualityOutcome
from tuner.run.reader import RunReader
from tuner.search.context import StudySetup, resolve
from tuner.search.quality_gate import CANDIDATE, REFERENCE, compare, run_quality_gate, verdict
from tuner.serving.processes import ChildRegistry
from tuner.serving.server import Backend
from tuner.serving.token_probe import GreedyAnswer, ServerAnswers, TokenScores
from tuner.vllm.space import TrialParams

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.integration, pytest.mark.timeout(900)]

PROMPTS = 8
MAX_TOKENS = 16


def _fp8_kv_here() -> bool:
    """Whether this CPU has what the CPU build's fp8 KV cache needs (AVX-512 or AMX)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return re.search(r"\b(avx512f|amx_tile)\b", cpuinfo) is not None


KV_DTYPE = "fp8" if _fp8_kv_here() else "float16"


def _answers(path: Path) -> ServerAnswers:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return ServerAnswers(
        answers=[GreedyAnswer.model_validate(r["answer"]) for r in rows],
        scores=[TokenScores.model_validate(r["scores"]) for r in rows],
    )


def test_the_gate_compares_a_quantized_kv_cache_with_the_models_own_dtype(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    workload = write_workload(
        tmp_path / "tiny-chat.yaml", rate_per_s=4, duration_s=8, warmup_requests=0, api="chat"
    )
    config = TuneConfig(
        backend="vllm", vllm_cmd=VLLM_CMD_TEXT, model=str(TINY_MODEL), workload=str(workload),
        max_model_len=MAX_MODEL_LEN,
        kv_cache_memory_bytes=64 * BLOCK_SIZE * tiny_model.kv_bytes_per_token(),
        quality_prompts=PROMPTS, quality_max_tokens=MAX_TOKENS, run_dir=tmp_path / "run",
    )  # fmt: skip
    ctx = resolve(config)
    assert ctx.backend is Backend.VLLM and ctx.gpu is None  # the CPU build
    registry = ChildRegistry(ctx.run_dir)
    lines: list[str] = []
    params = TrialParams(max_num_seqs=4, block_size=BLOCK_SIZE, kv_cache_dtype=KV_DTYPE)
    try:
        result = run_quality_gate(
            ctx, StudySetup(), params, registry=registry, progress=lines.append, trial=1
        )
    finally:
        registry.stop_all()
    print("\n".join(lines))  # the figures, for the record (pytest -s)
    layout = RunLayout(ctx.run_dir)
    assert result.outcome is not QualityOutcome.NOT_MEASURED, result.text()
    assert result.candidate == {"kv-cache-dtype": KV_DTYPE}
    assert result.reference == {"kv-cache-dtype": "auto"}
    figures = result.figures
    assert figures is not None and figures.prompts == PROMPTS
    assert 0 < figures.reference_tokens <= PROMPTS * MAX_TOKENS
    # The servers were what they were asked to be, one after the other.
    ref_log = (layout.quality_server_dir(REFERENCE) / "server.log").read_text()
    cand_log = (layout.quality_server_dir(CANDIDATE) / "server.log").read_text()
    assert "--kv-cache-dtype" not in ref_log.splitlines()[0]  # auto: vLLM's default
    assert f"--kv-cache-dtype {KV_DTYPE}" in cand_log.splitlines()[0]
    assert "--block-size 32" in cand_log.splitlines()[0]
    # The reference scores its own greedy answers as it generated them: the scoring reads
    # the tokens it was given (the same engine, one request at a time).
    assert figures.reference_consistency >= 0.9, result.text()
    if KV_DTYPE == "fp8":  # fp8 keys and values change the numbers the model computes with
        assert figures.mean_logprob_divergence_nats > 0, result.text()
    assert figures.max_logprob_divergence_nats >= figures.mean_logprob_divergence_nats
    # The figures are what the evidence on disk says, and the verdict follows them.
    reference = _answers(layout.quality_answers(REFERENCE))
    candidate = _answers(layout.quality_answers(CANDIDATE))
    assert compare(reference, candidate) == figures
    assert [a.prompt_token_ids for a in reference.answers] == [
        a.prompt_token_ids for a in candidate.answers
    ]  # one tokenizer, one chat template
    assert compare(reference, reference).token_agreement == 1.0
    assert (result.outcome, result.reason) == verdict(figures, result.thresholds)
    assert RunReader(ctx.run_dir).quality() == result
    assert lines[-1] == f"quality     {result.text()}"
    assert result.text().startswith(
        f"quality {'passed' if result.passed else 'FAILED'} (--kv-cache-dtype {KV_DTYPE} against "
        f"--kv-cache-dtype auto on {PROMPTS} prompts of tiny-chat): "
    )

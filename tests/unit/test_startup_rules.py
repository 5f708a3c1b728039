"""vLLM's config rules on the values it resolves, defaults included: one rule for the plan,
the simulated engine's startup and the tuner's pre-launch screening."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuner.search.context import StudySetup
from tuner.search.evaluate import screened
from tuner.vllm.failures import StartupFailureKind
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams, plan
from tuner.vllm.models import resolve_model
from tuner.vllm.space import TrialParams
from tuner.vllm.versions import VllmVersion

REFUSED = "max_num_batched_tokens (8192) must be greater than or equal to max_num_seqs (10000)."


@pytest.mark.parametrize(
    ("params", "message"),
    [
        # The default batch limit on an H100 is 8192 tokens.
        (ServingParams(max_num_seqs=10000), REFUSED),
        (
            ServingParams(max_num_seqs=300, max_num_batched_tokens=256),
            "max_num_batched_tokens (256) must be greater than or equal to max_num_seqs (300).",
        ),
        # Without chunked prefill vLLM checks the model length first, as its SchedulerConfig does.
        (
            ServingParams(
                max_num_seqs=10000,
                max_num_batched_tokens=4096,
                max_model_len=8192,
                enable_chunked_prefill=False,
            ),
            "max_num_batched_tokens (4096) is smaller than max_model_len (8192).",
        ),
    ],
)
def test_scheduler_rules_apply_to_resolved_defaults(params: ServingParams, message: str) -> None:
    result = plan(
        resolve_model("llama-3.1-8b"), get_gpu("H100-80GB"), params, VllmVersion.current()
    )
    assert not result.fits
    assert result.failure is not None
    assert result.failure.kind is StartupFailureKind.INVALID_CONFIGURATION
    assert message in result.failure.message


@pytest.mark.parametrize(
    "params",
    [
        ServingParams(),
        # A defaulted max_num_seqs is capped at the given batch limit, so it never trips the rule.
        ServingParams(max_num_batched_tokens=128),
        ServingParams(max_num_seqs=8192),
        ServingParams(max_num_seqs=9000, enable_chunked_prefill=False, max_model_len=16384),
    ],
)
def test_settings_vllm_accepts_still_start(params: ServingParams) -> None:
    result = plan(
        resolve_model("llama-3.1-8b"), get_gpu("H100-80GB"), params, VllmVersion.current()
    )
    assert (
        result.failure is None
        or result.failure.kind is not StartupFailureKind.INVALID_CONFIGURATION
    )


def test_plan_cli_says_vllm_refuses_it() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner.cli",
            "plan",
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "H100-80GB",
            "--max-num-seqs",
            "10000",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAILS (invalid_configuration)" in out.stdout
    assert REFUSED in out.stdout


def test_sim_serve_refuses_at_startup_with_vllms_message() -> None:
    """The simulated engine, as a real process, dies in config validation like vLLM."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner.cli",
            "sim-serve",
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "H100-80GB",
            "--max-num-seqs",
            "10000",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "ValidationError" in out.stdout + out.stderr
    assert REFUSED in out.stdout + out.stderr


def test_screening_skips_a_trial_vllm_would_refuse(tmp_path: Path) -> None:
    ctx = SimpleNamespace(
        config=SimpleNamespace(screen=True),
        model=resolve_model("llama-3.1-8b"),
        gpu=get_gpu("H100-80GB"),
        version=VllmVersion.current(),
        base=ServingParams(),
    )
    setup = StudySetup()
    evaluation = screened(ctx, setup, TrialParams(max_num_seqs=10000), tmp_path / "trial")  # type: ignore[arg-type]
    assert evaluation is not None
    assert evaluation.failure is not None and REFUSED in evaluation.failure.message
    assert screened(ctx, setup, TrialParams(max_num_seqs=512), tmp_path / "ok") is None  # type: ignore[arg-type]

"""`tuner plan` as a user runs it: a real subprocess, its stdout, stderr and exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tuner_command import tuner_in_process

PLAN_FIELDS = {
    "fits",
    "failure",
    "requested_bytes",
    "weights_bytes",
    "activation_bytes",
    "non_torch_bytes",
    "cudagraph_bytes",
    "kv_cache_bytes",
    "num_gpu_blocks",
    "kv_cache_tokens",
    "max_concurrency",
}


def tuner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_plan_json_has_the_documented_fields() -> None:
    out = tuner("plan", "--model", "llama-3.1-8b", "--gpu", "H100-80GB", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data.keys() >= PLAN_FIELDS
    assert data["fits"] is True and data["failure"] is None
    assert data["kv_cache_tokens"] == data["num_gpu_blocks"] * 16


def test_plan_json_reports_a_failure_with_kind_and_message() -> None:
    out = tuner("plan", "--model", "llama-3.1-8b", "--gpu", "L4-24GB", "--json")
    assert out.returncode == 1
    data = json.loads(out.stdout)
    assert data["fits"] is False
    assert data["failure"]["kind"] in {"no_memory_for_cache_blocks", "max_model_len_does_not_fit"}
    assert data["failure"]["error_type"] == "ValueError"
    assert "gpu_memory_utilization" in data["failure"]["message"]


def test_plan_table_is_readable() -> None:
    out = tuner("plan", "--model", "qwen2.5-7b", "--gpu", "h100", "--max-model-len", "8192")
    assert out.returncode == 0, out.stderr
    assert "KV cache tokens" in out.stdout and "result           starts" in out.stdout


def test_sweep_finds_the_lowest_utilization_that_starts() -> None:
    out = tuner(
        "plan",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100",
        "--sweep",
        "gpu-memory-utilization",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    edge = data["edge"]
    assert 0.2 < edge < 0.9
    below = tuner(
        "plan",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100",
        "--json",
        "--gpu-memory-utilization",
        f"{edge - 0.01:.2f}",
    )
    at = tuner(
        "plan",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100",
        "--json",
        "--gpu-memory-utilization",
        f"{edge:.2f}",
    )
    assert json.loads(below.stdout)["fits"] is False
    assert json.loads(at.stdout)["fits"] is True


def test_sweep_max_model_len_table_marks_the_edge() -> None:
    out = tuner(
        "plan",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100",
        "--gpu-memory-utilization",
        "0.3",
        "--sweep",
        "max-model-len",
    )
    assert out.returncode == 0, out.stderr
    assert "<- edge" in out.stdout and "largest --max-model-len that starts" in out.stdout


BAD_INPUT = [
    (["--model", "nope-9b", "--gpu", "h100"], "unknown model 'nope-9b'"),
    (["--model", "llama-3.1-8b", "--gpu", "V100"], "unknown GPU 'V100'"),
    (
        ["--model", "llama-3.1-8b", "--gpu", "h100", "--gpu-memory-utilization", "1.2"],
        "--gpu-memory-utilization 1.2 is out of range",
    ),
    (
        ["--model", "llama-3.1-8b", "--gpu", "h100", "--max-num-seqs", "-4"],
        "--max-num-seqs -4 is out of range",
    ),
    (
        ["--model", "llama-3.1-8b", "--gpu", "h100", "--vllm-version", "0.4"],
        "vLLM version '0.4' is not emulated",
    ),
    (
        ["--model", "llama-3.1-8b", "--gpu", "h100", "--sweep", "temperature"],
        "--sweep 'temperature' is not a knob",
    ),
    (
        ["--model", "llama-3.1-8b", "--gpu", "h100", "--calibrate-from", "/nonexistent.log"],
        "cannot read vLLM log",
    ),
    (
        ["--model", "llama-3.1-8b", "--gpu", "h100", "--max-num-seqs", "many"],
        "argument --max-num-seqs: invalid int value: 'many'",
    ),
    (
        ["--model", "llama-3.1-8b", "--gpu", "h100", "--boot", "lukewarm"],
        "--boot 'lukewarm' is not a boot state; accepted: cold, warm",
    ),
    (["--gpu", "h100"], "the following arguments are required: --model"),
]


def _bad_input_is_one_line_and_exit_code_2(
    out: subprocess.CompletedProcess[str], needle: str
) -> None:
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert needle in lines[0]
    assert out.stdout == ""


def test_bad_input_in_a_process_of_its_own_is_one_line_and_exit_code_2() -> None:
    for args, needle in (BAD_INPUT[0], BAD_INPUT[-1]):  # the tuner's check and argparse's
        _bad_input_is_one_line_and_exit_code_2(tuner("plan", *args), needle)


@pytest.mark.parametrize(("args", "needle"), BAD_INPUT)
def test_bad_input_is_one_line_and_exit_code_2(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """In this process (tests/tuner_command.py): the same line and exit code."""
    _bad_input_is_one_line_and_exit_code_2(tuner_in_process(["plan", *args], capsys), needle)


def test_model_directory_without_config_json(tmp_path: Path) -> None:
    out = tuner("plan", "--model", str(tmp_path), "--gpu", "h100")
    assert out.returncode == 2
    assert "has no config.json" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_calibrating_log_without_memory_lines(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("INFO 01-01 00:00:00 api_server.py:1] hello\n")
    out = tuner("plan", "--model", "llama-3.1-8b", "--gpu", "h100", "--calibrate-from", str(log))
    assert out.returncode == 2
    assert "no vLLM memory summary found" in out.stderr


def test_utilization_sweep_reports_both_edges() -> None:
    out = tuner(
        "plan",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100",
        "--vllm-version",
        "0.11",
        "--sweep",
        "gpu-memory-utilization",
        "--json",
    )
    data = json.loads(out.stdout)
    assert data["edge"] < data["upper_edge"] < 1.0
    above = tuner(
        "plan",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100",
        "--vllm-version",
        "0.11",
        "--json",
        "--gpu-memory-utilization",
        f"{data['upper_edge'] + 0.01:.2f}",
    )
    assert json.loads(above.stdout)["failure"]["kind"] == "cuda_oom_in_warmup_or_graph_capture"


def test_calibration_from_a_032_log_says_what_it_took() -> None:
    """vLLM 0.32's budget line alone: the JSON names the measured and derived components, and
    the plan at the log's own settings has the KV memory the log printed."""
    log = (
        Path(__file__).resolve().parents[1]
        / "fixtures"
        / "vllm_logs"
        / "d03-llama-3.1-8b-h100-tp1-v0.33.0.log"
    )
    args = ["plan", "--model", "llama-3.1-8b", "--gpu", "H100-80GB", "--max-model-len", "32768"]
    args += ["--gpu-memory-utilization", "0.9", "--calibrate-from", str(log)]
    out = tuner(*args, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["calibration"]["measured"] == ["weights", "cudagraph", "activation"]
    assert data["calibration"]["derived"] == ["non_torch"]
    assert data["kv_cache_tokens"] == 446128
    text = tuner(*args)
    assert "measured: weights, cudagraph, activation; derived: non_torch" in text.stdout
    uncalibrated = json.loads(tuner(*args[:-2], "--json").stdout)
    assert uncalibrated["calibration"] is None

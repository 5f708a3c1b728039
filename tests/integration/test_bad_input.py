"""Bad input to the long-running commands: one line naming the value and what is accepted,
exit status 2, before any server is launched (nothing under the run directory but what
the check itself needs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.tune_run import SMALL_TUNE_ARGS
from tests.models import small_llama_dir
from tests.virtual import Done, tuner_cli

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def tuner(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("VLLM_ALLOW_LONG_MAX_MODEL_LEN", None)
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd, env=env,
    )  # fmt: skip


def _one_line(done: subprocess.CompletedProcess[str] | Done, *expected: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "error:" in lines[0] and "Traceback" not in done.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def _launched(run_dir: Path) -> list[Path]:
    return list(run_dir.rglob("server.log")) + list(run_dir.rglob("locust.log"))


TUNE_CASES = [
    (("--space", "block-size=7,16"), ("block-size", "7", "multiple of 16")),
    (("--space", "block-size=8..64"), ("block-size=8..64", "multiples of 16")),
    (("--space", "gpu-memory-utilization=0.5..1.5"), ("gpu-memory-utilization", "1.5", "<= 1")),
    (("--space", "max-num-seqs=4..inf"), ("max-num-seqs", "inf", "finite")),
    (("--space", "max-num-seqs=2.5..8"), ("max-num-seqs", "2.5", "integer")),
    (("--space", "kv-cache-dtype=auto,fp7"), ("kv-cache-dtype", "fp7", "fp8")),
    (("--space", "swap-space=-1..4"), ("swap-space", "-1", ">= 0")),
    (("--cache-volume", "nfs:/x"), ("nfs:/x", "hostpath:/absolute/path")),
    (("--cache-volume", "hostpath:relative"), ("relative", "absolute")),
    (("--model-cache", "nfs:/x"), ("--model-cache 'nfs:/x'", "claim:EXISTING-CLAIM")),
    (("--model-source", "gs://bucket/llama"), ("--model-source 'gs://bucket/llama'", "s3://")),
    (
        ("--model-source", "path:/mnt/models/llama", "--model-secret", "hf"),
        ("--model-secret 'hf'", "fetches nothing"),
    ),
    (("--max-model-len", "200000"), ("200000", "131072", "VLLM_ALLOW_LONG_MAX_MODEL_LEN")),
    (("--budget-min", "inf"), ("--budget-min", "inf", "finite")),
    (("--rate", "nan"), ("--rate", "nan", "finite")),
    (("--level-duration", "0"), ("--level-duration", "0", "greater than 0")),
    (("--trials", "0"), ("--trials", "0")),
    (("--safety-margin", "-0.1"), ("--safety-margin", "-0.1")),
    (("--target-peak-rate", "inf"), ("--target-peak-rate", "inf", "finite")),
    (("--time-scale", "nan"), ("--time-scale", "nan")),
    (("--quality-min-agreement", "95"), ("--quality-min-agreement 95.0", "share from 0 to 1")),
    (
        ("--quality-max-logprob-divergence", "-0.1"),
        ("--quality-max-logprob-divergence -0.1", "0 or more"),
    ),
    # vLLM: 'Total number of attention heads (32) must be divisible by tensor parallel size (3).'
    (("--tensor-parallel-size", "3"), ("--tensor-parallel-size 3", "heads (32)", "1, 2, 4, 8")),
]


@pytest.mark.parametrize(
    ("flags", "expected"), TUNE_CASES, ids=[" ".join(c[0]) for c in TUNE_CASES]
)
def test_tune_refuses_bad_values_before_launching(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    flags: tuple[str, ...],
    expected: tuple[str, ...],
) -> None:
    """Through the command line's own entry point in this process (tests/virtual.py's
    ``tuner_cli``: its exit code, stdout and stderr); the first case also in a process of its
    own, as a user's shell runs it (``test_a_bad_value_is_one_line_from_a_process_of_its_own``)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    run_dir = tmp_path / "run"
    done = tuner_cli("tune", *SMALL_TUNE_ARGS, "--run-dir", str(run_dir), *flags)
    _one_line(done, *expected)
    assert not _launched(run_dir)


def test_a_bad_value_is_one_line_from_a_process_of_its_own(tmp_path: Path) -> None:
    flags, expected = TUNE_CASES[0]
    run_dir = tmp_path / "run"
    done = tuner(tmp_path, "tune", *SMALL_TUNE_ARGS, "--run-dir", str(run_dir), *flags)
    _one_line(done, *expected)
    assert not _launched(run_dir)


def test_a_model_directory_without_a_tokenizer_is_refused_before_launching(
    tmp_path: Path,
) -> None:
    model = small_llama_dir(tmp_path / "tiny-llama")
    run_dir = tmp_path / "run"
    args = [a if a != "llama-3.1-8b" else str(model) for a in SMALL_TUNE_ARGS]
    done = tuner(tmp_path, "tune", *args, "--run-dir", str(run_dir))
    _one_line(done, str(model), "tokenizer.json")
    assert not _launched(run_dir)
    done = tuner(tmp_path, "tune", *SMALL_TUNE_ARGS, "--model-dir", str(model),
                 "--run-dir", str(run_dir))  # fmt: skip
    _one_line(done, "--model-dir", "tokenizer.json")


def test_a_bad_yaml_config_is_one_line(tmp_path: Path) -> None:
    for text, where in (("model: [a\ntrials: 3\n", "line 2, column 7"),
                        ("trials: 3\n  x: 1\n", "line 2, column 4")):  # fmt: skip
        config = tmp_path / "tune.yaml"
        config.write_text(text)
        _one_line(tuner(tmp_path, "tune", "--config", str(config)), str(config), where)
    config.write_text("trials: .nan\n")
    _one_line(tuner(tmp_path, "tune", "--config", str(config)), "trials", "nan", "finite")
    config.write_text("cache_volume: nfs:/x\n")
    _one_line(tuner(tmp_path, "tune", "--config", str(config)), "nfs:/x")


TRIAL = ("trial", "--model", "qwen2.5-7b", "--max-model-len", "4096")
FLAG_CASES = [
    ((*TRIAL, "--rate", "nan"), ("--rate", "nan", "finite number > 0")),
    ((*TRIAL, "--duration", "-3"), ("--duration", "-3")),
    ((*TRIAL, "--swap-space", "inf"), ("--swap-space", "inf", ">= 0")),
    ((*TRIAL, "--sim-startup-delay", "nan"), ("--sim-startup-delay", "nan")),
    ((*TRIAL, "--gpu-memory-utilization", "nan"), ("--gpu-memory-utilization", "nan")),
    ((*TRIAL, "--max-num-seqs", "0"), ("--max-num-seqs", "0")),
    ((*TRIAL, "--cpu-offload-gb", "inf"), ("--cpu-offload-gb", "inf")),
    ((*TRIAL, "--processes", "0"), ("--processes", "0")),
    ((*TRIAL, "--gpu-source", "NVML"), ("--gpu-source", "'NVML'", "auto, nvml, sim, none")),
    (("serve", "--model", "qwen2.5-7b", "--gpu-source", "x"), ("--gpu-source", "'x'", "nvml")),
    (("bench", "--url", "http://127.0.0.1:9", "--rate", "0"), ("--rate", "'0'")),
    (("bench", "--url", "http://127.0.0.1:9", "--duration", "inf"), ("--duration", "inf")),
    (("serve", "--model", "qwen2.5-7b", "--gpu-sample-hz", "inf"), ("--gpu-sample-hz", "inf")),
    (("serve", "--model", "qwen2.5-7b", "--startup-timeout", "0"), ("--startup-timeout", "'0'")),
    (("serve", "--model", "qwen2.5-7b", "--swap-space", "-2"), ("--swap-space", "-2")),
]


@pytest.mark.parametrize(
    ("args", "expected"), FLAG_CASES, ids=[" ".join(c[0][:1] + c[0][-2:]) for c in FLAG_CASES]
)
def test_trial_bench_and_serve_refuse_bad_numbers(
    tmp_path: Path, args: tuple[str, ...], expected: tuple[str, ...]
) -> None:
    out_flag = "--run-dir" if args[0] == "serve" else "--out"
    done = tuner(tmp_path, *args, out_flag, str(tmp_path / "out"))
    _one_line(done, *expected)
    assert not _launched(tmp_path / "out")


@pytest.mark.parametrize("command", ["tune", "trial", "bench", "serve"])
def test_a_run_directory_that_is_a_file_is_one_line(tmp_path: Path, command: str) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    args = {
        "tune": ("tune", *SMALL_TUNE_ARGS, "--run-dir", str(afile)),
        "trial": (*TRIAL, "--out", str(afile / "sub")),
        "serve": ("serve", "--model", "qwen2.5-7b", "--run-dir", str(afile)),
    }.get(command)
    if command == "bench":
        from tests.integration.simserver import start_sim

        server = start_sim(("--model", "qwen2.5-7b", "--max-model-len", "4096"), tmp_path / "s.log")
        try:
            done = tuner(tmp_path, "bench", "--url", server.url, "--out", str(afile))
        finally:
            server.stop()
    else:
        assert args is not None
        done = tuner(tmp_path, *args)
    _one_line(done, str(afile), "is a file, not a directory")
    assert afile.read_text() == "not a directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_run_directory_is_one_line(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        done = tuner(tmp_path, "tune", *SMALL_TUNE_ARGS, "--run-dir", str(locked / "run"))
        _one_line(done, str(locked / "run"), "Permission denied")
        done = tuner(tmp_path, *TRIAL, "--out", str(locked))
        _one_line(done, str(locked), "Permission denied")
    finally:
        locked.chmod(0o755)


def test_a_run_directory_on_a_read_only_file_system_is_one_line(tmp_path: Path) -> None:
    """/proc takes no new directories, for root too."""
    done = tuner(tmp_path, *TRIAL, "--out", "/proc/tuner-run")
    _one_line(done, "/proc/tuner-run", "accepted: a directory this user can create and write")

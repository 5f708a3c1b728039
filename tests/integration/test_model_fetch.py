"""`tuner fetch` and `tuner tune --backend vllm` against the stand-in hub, as a user runs them:
the model fetched into HF_HOME before anything launches, or one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gpuhost.hub_standin import GRANTED_TOKEN, HubStandin

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
GATED_LINE = (
    "tuner: error: model meta-llama/Llama-3.1-8B-Instruct is gated on the Hugging Face hub "
    "and this host has no token: set HF_TOKEN or run `hf auth login` after accepting its licence"
)


@pytest.fixture
def hub() -> Iterator[HubStandin]:
    with HubStandin() as standin:
        yield standin


def _tuner(hub: HubStandin, home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    base.update(
        HF_ENDPOINT=hub.endpoint, HF_HOME=str(home), HF_HUB_DISABLE_PROGRESS_BARS="1", **env
    )
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args],
        capture_output=True, text=True, timeout=120, env=base, cwd=REPO, check=False,
    )  # fmt: skip


def test_tuner_fetch_a_public_model_then_offline(hub: HubStandin, tmp_path: Path) -> None:
    done = _tuner(hub, tmp_path, "fetch", "--model", "qwen2.5-7b")
    assert done.returncode == 0, done.stderr
    assert "model Qwen/Qwen2.5-7B-Instruct: fetched" in done.stdout
    snapshots = tmp_path / "hub" / "models--Qwen--Qwen2.5-7B-Instruct" / "snapshots"
    (snapshot,) = snapshots.iterdir()
    names = {p.name for p in snapshot.iterdir()}
    assert "model-00001-of-00002.safetensors" in names and "tokenizer.json" in names
    assert not names & {"pytorch_model.bin", "model-q4.gguf", "consolidated.safetensors"}
    hub.requests.clear()
    offline = _tuner(hub, tmp_path, "fetch", "--model", "qwen2.5-7b", HF_HUB_OFFLINE="1")
    assert offline.returncode == 0, offline.stderr
    assert "from the hub cache" in offline.stdout
    assert hub.requests == []


def test_a_gated_model_without_a_token_is_one_line_and_exit_2(
    hub: HubStandin, tmp_path: Path
) -> None:
    fetch = _tuner(hub, tmp_path, "fetch", "--model", "llama-3.1-8b")
    assert (fetch.returncode, fetch.stderr.strip()) == (2, GATED_LINE)
    script = tmp_path / "vllm_help.py"  # a launch command that is never launched
    script.write_text("print('--gpu-memory-utilization --max-num-seqs --block-size')\n")
    fake_vllm = f"{sys.executable} {script} serve"
    tune = _tuner(
        hub, tmp_path, "tune", "--dry-run", "--backend", "vllm", "--model", "llama-3.1-8b",
        "--gpu", "H100-80GB", "--vllm-cmd", fake_vllm, "--run-dir", str(tmp_path / "run"),
    )  # fmt: skip
    assert (tune.returncode, tune.stderr.strip()) == (2, GATED_LINE)
    assert hub.downloads == []
    granted = _tuner(hub, tmp_path, "fetch", "--model", "llama-3.1-8b", HF_TOKEN=GRANTED_TOKEN)
    assert granted.returncode == 0, granted.stderr
    assert "model meta-llama/Llama-3.1-8B-Instruct: fetched" in granted.stdout


def test_a_name_that_is_no_repository_is_one_line_and_exit_2(
    hub: HubStandin, tmp_path: Path
) -> None:
    done = _tuner(hub, tmp_path, "fetch", "--model", "meta-llama/Llama-3.1-8B-Instructt")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "'meta-llama/Llama-3.1-8B-Instructt' is no repository on the Hugging Face hub" in line
    assert "answered 401: Repository not found" in line

"""The model vLLM is launched with and fetched before trial 0 (issue 32, items 2, 4 and 14).

The hub is the stand-in (tests/gpuhost/hub_standin.py): a real HTTP server the real
``huggingface_hub`` client talks to, answering as huggingface.co answers.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from tests.gpuhost.hub_standin import GRANTED_TOKEN, OTHER_TOKEN, HubStandin, preset_repo
from tuner.deploy import DeploymentConfig, kubernetes_manifests, vllm_args, vllm_config_yaml
from tuner.errors import ConfigError
from tuner.search.config import load_config
from tuner.search.context import StudySetup, resolve
from tuner.search.evaluate import launch_spec
from tuner.serving.hub import HubSettings, fetch_model, wanted_files
from tuner.serving.processes import ChildRegistry
from tuner.serving.server import Backend, ServerProcess
from tuner.vllm.flags import accepted_options
from tuner.vllm.models import launch_name
from tuner.vllm.space import TrialParams
from tuner.vllm.versions import VllmVersion
from workloads.prompts import TokenizerPromptBuilder, WordPromptBuilder

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen2.5-7B-Instruct"
WANTED = {
    "config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
}


# --- the name vLLM is launched with (item 2) -------------------------------------------------


def test_a_preset_short_name_launches_its_hugging_face_id(tmp_path: Path) -> None:
    ctx = resolve(
        load_config(
            None, {"model": "llama-3.1-8b", "backend": "sim", "run_dir": tmp_path, "dry_run": True}
        )
    )
    spec = launch_spec(ctx, StudySetup(), TrialParams(max_num_seqs=64))
    assert spec.model == LLAMA
    # the real backend's command line, as ServerProcess builds it (no probe of vLLM)
    real = dataclasses.replace(spec, backend=Backend.VLLM, vllm_cmd=("vllm", "serve"))
    server = ServerProcess(
        real, registry=ChildRegistry(tmp_path), log_path=tmp_path / "s.log", adapt=False
    )
    assert server.command[:3] == ["vllm", "serve", LLAMA]
    assert "llama-3.1-8b" not in server.command
    assert spec.name == LLAMA  # what /v1/models must list and the load generator sends


def test_launch_names() -> None:
    assert launch_name("llama-3.1-8b") == LLAMA
    assert launch_name("qwen2.5-7b") == QWEN
    assert launch_name("meta-llama/Llama-3.1-8B") == "meta-llama/Llama-3.1-8B"
    assert launch_name("someone/not-a-preset") == "someone/not-a-preset"
    assert launch_name("tests") == str(Path("tests").absolute())


def test_deployment_outputs_name_the_hugging_face_id() -> None:
    cfg = DeploymentConfig.build(
        model="llama-3.1-8b", vllm_version="0.11.0", config_hash="abc123",
        flags={"max-num-seqs": 64},
    )  # fmt: skip
    assert cfg.model == LLAMA
    assert vllm_args(cfg).split()[:3] == ["vllm", "serve", LLAMA]
    assert f"model: {LLAMA}" in vllm_config_yaml(cfg)
    manifests = kubernetes_manifests(cfg)
    assert LLAMA in manifests
    assert "llama-3.1-8b\n" not in manifests and "'llama-3.1-8b'" not in manifests


# --- which files vLLM loads ------------------------------------------------------------------


def test_only_the_files_vllm_loads() -> None:
    names = list(preset_repo(QWEN).files)
    index = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    assert set(wanted_files(names, index=index)) == WANTED
    config_only = set(wanted_files(names, weights=False))
    assert config_only == {n for n in WANTED if "safetensors" not in n}
    bins = ["config.json", "pytorch_model.bin", "model.gguf", "tokenizer.json"]
    assert wanted_files(bins) == ("config.json", "tokenizer.json", "pytorch_model.bin")


# --- the fetch against the stand-in hub (item 4) ---------------------------------------------


def _settings(hub: HubStandin, home: Path, token: str | None = None, **kw: object) -> HubSettings:
    return dataclasses.replace(
        HubSettings.from_env({"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home)}),
        token=token, **kw,
    )  # fmt: skip


def test_a_public_model_is_fetched_into_the_hub_cache_with_only_the_wanted_files(
    tmp_path: Path,
) -> None:
    with HubStandin() as hub:
        fetched = fetch_model(QWEN, settings=_settings(hub, tmp_path))
        again = fetch_model(QWEN, settings=_settings(hub, tmp_path))
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2.5-7B-Instruct" / "snapshots"
    assert fetched.snapshot_dir.parent == snapshot
    assert {p.name for p in fetched.snapshot_dir.iterdir()} == WANTED
    assert set(hub.downloads) == WANTED  # nothing else crossed the wire
    assert fetched.fetched_bytes > 0 and "fetched" in fetched.line()
    assert again.fetched_bytes == 0 and "nothing fetched" in again.line()


def test_a_gated_model_without_a_token_is_one_line_before_any_download(tmp_path: Path) -> None:
    with HubStandin() as hub, pytest.raises(ConfigError) as err:
        fetch_model(LLAMA, settings=_settings(hub, tmp_path))
    assert str(err.value) == (
        f"model {LLAMA} is gated on the Hugging Face hub and this host has no token: set "
        "HF_TOKEN or run `hf auth login` after accepting its licence"
    )
    assert hub.downloads == []


def test_a_gated_model_with_a_token(tmp_path: Path) -> None:
    with HubStandin() as hub:
        with pytest.raises(ConfigError, match="this host's token has no access"):
            fetch_model(LLAMA, settings=_settings(hub, tmp_path, OTHER_TOKEN))
        fetched = fetch_model(LLAMA, settings=_settings(hub, tmp_path, GRANTED_TOKEN))
    assert {p.name for p in fetched.snapshot_dir.iterdir()} == WANTED


def test_a_name_that_is_no_repository_names_the_hubs_answer(tmp_path: Path) -> None:
    with HubStandin() as hub, pytest.raises(ConfigError) as err:
        fetch_model("meta-llama/Llama-3.1-8B-Instructt", settings=_settings(hub, tmp_path))
    line = str(err.value)
    assert "\n" not in line
    assert "is no repository on the Hugging Face hub" in line
    assert "answered 401: Repository not found" in line


def test_offline_with_the_model_cached_needs_no_network(tmp_path: Path) -> None:
    with HubStandin() as hub:
        fetch_model(QWEN, settings=_settings(hub, tmp_path))
        endpoint = hub.endpoint
        hub.requests.clear()
        offline = fetch_model(QWEN, settings=_settings(hub, tmp_path, offline=True))
        assert hub.requests == []
    assert offline.offline and {p.name for p in offline.snapshot_dir.iterdir()} == WANTED
    # the hub gone: the cache still serves it, and one that is not cached is one line
    down = dataclasses.replace(_settings(hub, tmp_path), endpoint=endpoint)
    assert fetch_model(QWEN, settings=down).snapshot_dir == offline.snapshot_dir
    with pytest.raises(ConfigError, match="is not in the hub cache"):
        fetch_model(LLAMA, settings=_settings(hub, tmp_path, offline=True))


# --- prompts sized with the fetched tokenizer (item 14) --------------------------------------


def _vllm_help(tmp_path: Path) -> str:
    """A launch command whose --help lists the current release's flags (nothing is launched)."""
    flags = " ".join(sorted(accepted_options(VllmVersion.current())))
    script = tmp_path / "vllm_help.py"
    script.write_text(f"print({flags!r})\n", encoding="utf-8")
    return f"{sys.executable} {script} serve"


def test_a_hub_models_prompts_are_sized_with_its_fetched_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with HubStandin() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        ctx = resolve(
            load_config(
                None,
                {
                    "model": "qwen2.5-7b", "backend": "vllm", "gpu": "H100-80GB",
                    "vllm_cmd": _vllm_help(tmp_path), "run_dir": tmp_path / "run",
                    "dry_run": True,
                },
            )
        )  # fmt: skip
    assert ctx.model.name == QWEN
    assert ctx.model_dir is not None
    assert ctx.model_dir.parent == tmp_path / "hf/hub/models--Qwen--Qwen2.5-7B-Instruct/snapshots"
    assert not any(p.suffix == ".safetensors" for p in ctx.model_dir.iterdir())  # a dry run
    text = "The quick brown fox jumps over the lazy dog; capacity reviews ask hard questions"
    words = WordPromptBuilder().count(text)
    tokens = TokenizerPromptBuilder.from_model_dir(ctx.model_dir).count(text)
    assert tokens != words  # its own BPE, not one token a word
    assert any("config and tokenizer of Qwen/Qwen2.5-7B-Instruct" in n for n in ctx.notes)

"""The weights pulled before the server starts (issue 35): the model cache volume, the init
container that fills it, vLLM offline on it, and the program the init container runs,
against the stand-in hub (a real HTTP server the real ``huggingface_hub`` talks to)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.gpuhost.hub_standin import GRANTED_TOKEN, HubStandin
from tests.unit.test_configs import HASH_KEY, assert_valid_k8s, by_kind, docs_of, make
from tuner.deploy import (
    CACHE_MOUNT_PATH,
    HF_HOME_PATH,
    HF_HUB_CACHE_PATH,
    MODEL_CACHE_MOUNT_PATH,
    SCRIPTS_MOUNT_PATH,
    ClaimCache,
    DeploymentConfig,
    HostPathCache,
    HubSource,
    LocalSource,
    ObjectStoreSource,
    PvcCache,
    SecretKeyRef,
    kubernetes_manifests,
    kubernetes_switch,
    model_cache_size,
    model_fields,
    parse_model_cache,
    parse_model_source,
    tuning_job_manifests,
    warmup_job_manifests,
    warmup_plan_of,
)
from tuner.errors import ConfigError
from tuner.model_fetch import CONFIG_FILES, FETCH_FILE, fetch_model_script
from tuner.serving import hub
from tuner.vllm.models import load_model_dir

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"  # gated on the stand-in, as on the hub
HUB_DIR = f"{MODEL_CACHE_MOUNT_PATH}/hf/{LLAMA}"
QWEN = "Qwen/Qwen2.5-7B-Instruct"
TOKEN = SecretKeyRef(name="hf", key="token")
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


def all_docs(cfg: DeploymentConfig) -> list[dict[str, Any]]:
    docs = docs_of(kubernetes_manifests(cfg)) + docs_of(warmup_job_manifests(cfg))
    return docs + docs_of(kubernetes_switch(cfg) or "")


def pod_of(cfg: DeploymentConfig) -> dict[str, Any]:
    docs = docs_of(kubernetes_manifests(cfg))
    kind = "Deployment" if cfg.rollout.value == "rolling" else "StatefulSet"
    spec: dict[str, Any] = by_kind(docs, kind)["spec"]["template"]["spec"]
    return spec


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def mounted_volume(pod: dict[str, Any], container: dict[str, Any], path: str) -> str:
    """The volume a container has mounted at ``path`` or above it, which the pod has."""
    names = {v["name"] for v in pod["volumes"]}
    claims = {"vllm-cache", "model-cache"}  # a StatefulSet's come from its claim templates
    best = max(
        (m for m in container["volumeMounts"] if (path + "/").startswith(m["mountPath"] + "/")),
        key=lambda m: len(m["mountPath"]),
    )
    assert best["name"] in names or best["name"] in claims, best
    return str(best["name"])


# --- every form validates --------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {
            "hf_token_secret": TOKEN,
            "flags": {"revision": "0e9e39f249a16976918f6564b8830bc894c89659"},
        },
        {"model_cache": "pvc:300Gi:nfs-client:rwx", "replicas": 4},
        {"model_cache": "hostpath:/mnt/models", "cache_volume": "hostpath:/mnt/vllm"},
        {"model_cache": "claim:model-store", "rollout": "blue-green"},
        {"rollout": "blue-green", "replicas": 3, "model_cache": "pvc:80Gi:fast-ssd"},
        {"model_source": "s3://models/llama-3.1-8b-instruct/", "served_model_name": "chat"},
        {"model_source": ObjectStoreSource(uri="s3://m.bucket/a/b", credentials_secret="s3-creds")},
        {"model_source": "path:/mnt/models/llama", "rollout": "blue-green"},
        {"model": "/mnt/models/Llama-3.1-8B-Instruct"},
        {"model_source": "path:/models/llama", "model_cache": "claim:llama-weights"},
        {"model": "acme/<x> it's $(HOME) `id`", "hf_token_secret": TOKEN},
    ],
)
def test_every_model_source_and_cache_validates_against_the_kubernetes_schema(
    overrides: dict[str, Any],
) -> None:
    cfg = make(**overrides)
    docs = all_docs(cfg)
    assert_valid_k8s(docs)
    for doc in docs:
        assert doc["metadata"]["labels"][HASH_KEY] == cfg.config_hash, doc["kind"]


# --- the init container, the mounts, vLLM offline -------------------------------------------


@pytest.mark.parametrize("rollout", ["rolling", "blue-green"])
@pytest.mark.parametrize(
    "cache", ["pvc", "pvc:300Gi:nfs:rwx", "hostpath:/mnt/models", "claim:model-store"]
)
def test_the_init_container_fills_the_cache_vllm_reads_before_it_starts(
    rollout: str, cache: str
) -> None:
    cfg = make(model_cache=cache, rollout=rollout, hf_token_secret=TOKEN)
    pod = pod_of(cfg)
    (init,) = pod["initContainers"]  # Kubernetes starts the containers after it succeeded
    (vllm,) = pod["containers"]
    assert init["image"] == vllm["image"] == cfg.image  # its huggingface_hub is vLLM's
    assert init["command"][:2] == ["python3", f"{SCRIPTS_MOUNT_PATH}/{FETCH_FILE}"]
    command = init["command"]
    assert command[command.index("--repo") + 1] == cfg.model
    # vLLM serves the directory the init container filled, under the model's own name
    assert command[command.index("--local-dir") + 1] == vllm["args"][0] == HUB_DIR
    assert vllm["args"][1:3] == ["--served-model-name", cfg.model]
    assert warmup_plan_of(cfg).served_model == cfg.model  # the warm-up asks for that name
    # the same volume at the same path in both, HF_HOME and HF_HUB_CACHE on it
    model_mount = {"name": "model-cache", "mountPath": MODEL_CACHE_MOUNT_PATH}
    assert model_mount in init["volumeMounts"] and model_mount in vllm["volumeMounts"]
    for container in (init, vllm):
        env = env_of(container)
        assert env["HF_HOME"]["value"] == HF_HOME_PATH
        assert env["HF_HUB_CACHE"]["value"] == HF_HUB_CACHE_PATH
        assert HF_HUB_CACHE_PATH.startswith(HF_HOME_PATH + "/")
        assert mounted_volume(pod, container, HF_HUB_CACHE_PATH) == "model-cache"
        assert mounted_volume(pod, container, HUB_DIR) == "model-cache"
    assert mounted_volume(pod, vllm, env_of(vllm)["VLLM_CACHE_ROOT"]["value"]) == "vllm-cache"
    assert env_of(vllm)["VLLM_CACHE_ROOT"]["value"] == CACHE_MOUNT_PATH
    # vLLM never downloads at start; the fetch does (so it is not offline)
    assert env_of(vllm)["HF_HUB_OFFLINE"]["value"] == "1"
    assert "HF_HUB_OFFLINE" not in env_of(init)
    # the program is the ConfigMap's, mounted in the init container
    scripts = by_kind(docs_of(kubernetes_manifests(cfg)), "ConfigMap")
    assert scripts["data"][FETCH_FILE] == fetch_model_script()
    assert {"name": "scripts", "mountPath": SCRIPTS_MOUNT_PATH, "readOnly": True} in init[
        "volumeMounts"
    ]


def test_the_token_is_only_a_secret_reference_and_only_where_the_model_is_fetched() -> None:
    cfg = make(hf_token_secret=TOKEN)
    pod = pod_of(cfg)
    (init,) = pod["initContainers"]
    assert env_of(init)["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}},
    }
    assert "HF_TOKEN" not in env_of(pod["containers"][0])  # offline: it needs none
    assert not any("token" in arg.lower() for arg in init["command"])
    assert "HF_TOKEN" not in env_of(pod_of(make())["initContainers"][0])  # none configured
    # a token is a reference: a literal is no SecretKeyRef
    with pytest.raises(ConfigError, match="hf_token_secret"):
        make(hf_token_secret="hf_live_123")


def test_a_model_on_a_volume_has_no_init_container_and_is_mounted_read_only() -> None:
    for cfg in (
        make(model="/mnt/models/Llama-3.1-8B-Instruct"),
        make(model_source="path:/mnt/models/llama", rollout="blue-green"),
        make(model_source="path:/models/llama", model_cache="claim:llama-weights"),
    ):
        pod = pod_of(cfg)
        assert "initContainers" not in pod
        assert isinstance(cfg.model_source, LocalSource)
        path = cfg.model_source.path
        (vllm,) = pod["containers"]
        assert vllm["args"][0] == path
        assert {"name": "model-cache", "mountPath": path, "readOnly": True} in vllm["volumeMounts"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "model-cache"]
        if isinstance(cfg.model_cache, HostPathCache):  # it must be there: not made empty
            assert volume["hostPath"] == {"path": path, "type": "Directory"}
        else:
            assert volume["persistentVolumeClaim"] == {
                "claimName": "llama-weights",
                "readOnly": True,
            }
        assert env_of(vllm)["HF_HUB_OFFLINE"]["value"] == "1"
        assert FETCH_FILE not in by_kind(docs_of(kubernetes_manifests(cfg)), "ConfigMap")["data"]
    # a model given by its id, read from a volume: served under its id
    cfg = make(model_source="path:/mnt/models/llama")
    args = pod_of(cfg)["containers"][0]["args"]
    assert args[:3] == ["/mnt/models/llama", "--served-model-name", cfg.model]


def test_an_object_store_copy_is_synced_by_its_client_and_served_under_the_models_name() -> None:
    source = ObjectStoreSource(uri="s3://models/llama-3.1-8b/", credentials_secret="s3")
    cfg = make(model_source=source)
    pod = pod_of(cfg)
    (init,) = pod["initContainers"]
    local = f"{MODEL_CACHE_MOUNT_PATH}/s3/models/llama-3.1-8b"
    assert init["command"][:5] == ["aws", "s3", "sync", "s3://models/llama-3.1-8b", local]
    assert init["envFrom"] == [{"secretRef": {"name": "s3"}}]  # AWS_* keys, by reference
    assert {"name": "model-cache", "mountPath": MODEL_CACHE_MOUNT_PATH} in init["volumeMounts"]
    (vllm,) = pod["containers"]
    assert vllm["args"][:3] == [local, "--served-model-name", cfg.model]
    assert warmup_plan_of(cfg).served_model == cfg.model  # the warm-up asks for that name
    assert env_of(vllm)["HF_HUB_OFFLINE"]["value"] == "1"
    # a name of its own is kept
    named = make(model_source="s3://models/llama", served_model_name="chat")
    assert pod_of(named)["containers"][0]["args"].count("--served-model-name") == 1


# --- a new pod's caches and its time to start ---------------------------------------------------


def test_the_manifests_say_what_a_new_pod_finds_in_each_cache() -> None:
    def notes(**overrides: Any) -> tuple[str, str]:
        cfg = make(**overrides)
        annotations = by_kind(docs_of(kubernetes_manifests(cfg)), "Deployment")["spec"]["template"][
            "metadata"
        ]["annotations"]
        text = kubernetes_manifests(cfg)
        model = annotations["vllm-capacity-tuner/model-cache"]
        compile_ = annotations["vllm-capacity-tuner/compile-cache"]
        assert f"# model-cache: {model}" in text and f"# compile-cache: {compile_}" in text
        return model, compile_

    model, compile_ = notes()
    assert model.startswith("cold in every new pod") and "init container" in model
    assert compile_.startswith("cold in every new pod") and "cold compile" in compile_
    model, compile_ = notes(model_cache="pvc:200Gi:nfs:rwx", cache_volume="pvc:20Gi:nfs:rwx")
    assert model.startswith("warm after the first pod") and compile_.startswith("warm after")
    model, compile_ = notes(model_cache="hostpath:/mnt/m", cache_volume="hostpath:/mnt/c")
    assert model.startswith("warm on a node") and compile_.startswith("warm on a node")
    model, _ = notes(model="/mnt/models/llama")
    assert "nothing is fetched" in model


def test_the_start_budgets_count_the_fetch_and_a_cold_compile() -> None:
    cfg = make(model_fetch_timeout_s=1200, startup_timeout_s=2400, warmup_timeout_s=300)
    deployment = by_kind(docs_of(kubernetes_manifests(cfg)), "Deployment")
    assert deployment["spec"]["progressDeadlineSeconds"] > 1200 + 2400
    init = deployment["spec"]["template"]["spec"]["initContainers"][0]
    assert init["command"][init["command"].index("--timeout-s") + 1] == "1200"
    startup = deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 2400  # cold compile
    job = by_kind(docs_of(warmup_job_manifests(cfg)), "Job")
    assert job["spec"]["activeDeadlineSeconds"] >= 1200 + 2400 + 300
    local = make(model="/mnt/models/llama", startup_timeout_s=2400, warmup_timeout_s=300)
    job = by_kind(docs_of(warmup_job_manifests(local)), "Job")
    assert job["spec"]["activeDeadlineSeconds"] == 2400 + 300  # nothing fetched


def test_tuning_workers_keep_the_model_on_their_shared_volume() -> None:
    docs = docs_of(
        tuning_job_manifests(
            model=LLAMA, workers=2, study="s", image="tuner:1", storage_url="postgresql://h/db"
        )
    )
    (container,) = by_kind(docs, "Job")["spec"]["template"]["spec"]["containers"]
    home = env_of(container)["HF_HOME"]["value"]
    assert home.startswith(CACHE_MOUNT_PATH + "/")
    assert {"name": "vllm-cache", "mountPath": CACHE_MOUNT_PATH} in container["volumeMounts"]


# --- forms, defaults and bad input ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("pvc", PvcCache(size="100Gi")),
        ("pvc:40Gi", PvcCache(size="40Gi")),
        ("pvc:1Ti:nfs:rwx", PvcCache(size="1Ti", storage_class="nfs", access_mode="ReadWriteMany")),
        ("hostpath:/mnt/models", HostPathCache(path="/mnt/models")),
        ("claim:model-store", ClaimCache(claim_name="model-store")),
    ],
)
def test_model_cache_strings_parse_and_print_back(text: str, value: object) -> None:
    assert parse_model_cache(text) == value
    assert parse_model_cache(value.cli) == value  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("hub", HubSource()),
        ("s3://models/llama/8b/", ObjectStoreSource(uri="s3://models/llama/8b")),
        ("path:/mnt/models/llama/", LocalSource(path="/mnt/models/llama")),
        ("/mnt/models/llama", LocalSource(path="/mnt/models/llama")),
    ],
)
def test_model_source_strings_parse_and_print_back(text: str, value: object) -> None:
    assert parse_model_source(text) == value
    assert parse_model_source(value.cli) == value  # type: ignore[attr-defined]


def test_defaults_follow_the_models_name_and_the_claim_its_weights() -> None:
    assert isinstance(make().model_source, HubSource)
    assert make().model_cache == PvcCache(size="100Gi")
    assert make(model="s3://models/llama").model_source == ObjectStoreSource(
        uri="s3://models/llama"
    )
    local = make(model="/mnt/models/llama")
    assert local.model_cache == HostPathCache(path="/mnt/models/llama")
    assert model_cache_size(16 * 2**30) == "20Gi"  # at least 20Gi
    assert model_cache_size(140 * 2**30) == "175Gi"  # a quarter more than the weights
    assert model_cache_size(None) == "100Gi"


@pytest.mark.parametrize(
    ("fields", "needles"),
    [
        ({"source": "gs://bucket/llama"}, ["--model-source", "'gs://bucket/llama'", "accepted"]),
        ({"source": "s3://B/llama"}, ["--model-source", "'s3://B/llama'", "bucket name"]),
        ({"source": "s3://bucket"}, ["--model-source", "PREFIX"]),
        ({"source": "s3://bucket/../etc"}, ["--model-source", "'..'"]),
        ({"source": "path:models"}, ["--model-source", "'models'", "absolute"]),
        ({"cache": "nfs:/x"}, ["--model-cache", "'nfs:/x'", "claim:EXISTING-CLAIM"]),
        ({"cache": "pvc:lots"}, ["--model-cache", "'lots'", "a Kubernetes quantity"]),
        ({"cache": "claim:Bad_Name"}, ["--model-cache", "'Bad_Name'", "DNS-1123"]),
        ({"cache": "pvc:10Gi::rwx"}, ["--model-cache", "ReadWriteMany"]),
        ({"source": "path:/mnt/m", "cache": "pvc"}, ["path:/mnt/m", "empty", "claim:NAME"]),
        ({"source": "path:/mnt/m", "secret": "hf"}, ["--model-secret", "fetches nothing"]),
        ({"source": "s3://bucket/m", "secret": "s3:key"}, ["--model-secret", "no key"]),
        ({"secret": "Bad Secret"}, ["--model-secret", "'Bad Secret'"]),
    ],
)
def test_bad_model_inputs_are_one_line_config_errors(
    fields: dict[str, str | None], needles: list[str]
) -> None:
    args = {"source": None, "cache": None, "secret": None, **fields}
    with pytest.raises(ConfigError) as info:
        model_fields(LLAMA, **args)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_a_tokenizer_from_another_repository_is_refused_in_one_line() -> None:
    # vLLM starts offline: a tokenizer it would fetch at start cannot load
    with pytest.raises(ConfigError) as info:
        make(flags={"tokenizer": "meta-llama/Llama-3.2-1B"})
    assert "\n" not in str(info.value) and "'meta-llama/Llama-3.2-1B'" in str(info.value)
    assert make(flags={"tokenizer": "/mnt/tokenizers/llama"}).flags["tokenizer"]


def test_model_fields_set_the_token_or_the_object_stores_credentials() -> None:
    assert model_fields(LLAMA, source=None, cache=None, secret="hf-token") == {
        "hf_token_secret": SecretKeyRef(name="hf-token", key="token")
    }
    fields = model_fields(LLAMA, source="s3://models/llama", cache="hostpath:/m", secret="s3")
    assert fields["model_source"].credentials_secret == "s3"
    assert fields["model_cache"] == HostPathCache(path="/m")


def test_the_recommendation_deploys_the_model_fetched_before_the_server(tmp_path: Path) -> None:
    from tuner.search.config import load_config
    from tuner.search.context import resolve
    from tuner.search.recommend import deployment
    from tuner.vllm.space import TrialParams

    base = {"backend": "sim", "run_dir": tmp_path, "dry_run": True}
    ctx = resolve(load_config(None, {**base, "model_secret": "hf:hub-token"}))
    cfg = deployment(ctx, TrialParams(max_num_seqs=64))
    assert isinstance(cfg.model_source, HubSource)
    assert cfg.hf_token_secret == SecretKeyRef(name="hf", key="hub-token")
    assert isinstance(cfg.model_cache, PvcCache) and cfg.model_cache.size == "20Gi"  # 8B
    assert_valid_k8s(docs_of(kubernetes_manifests(cfg)))
    ctx = resolve(
        load_config(
            None, {**base, "model_source": "s3://models/llama", "model_cache": "pvc:50Gi:nfs:rwx"}
        )
    )
    cfg = deployment(ctx, TrialParams(max_num_seqs=64))
    assert cfg.model_source == ObjectStoreSource(uri="s3://models/llama")
    assert cfg.model_cache == parse_model_cache("pvc:50Gi:nfs:rwx")
    with pytest.raises(ConfigError, match="--model-source 'gs://x/y' is not accepted"):
        load_config(None, {**base, "model_source": "gs://x/y"})


# --- the init container's program, against the stand-in hub ------------------------------------


def test_the_program_chooses_the_files_the_tune_fetches() -> None:
    assert CONFIG_FILES == hub.CONFIG_FILES
    namespace: dict[str, Any] = {}
    exec(compile(fetch_model_script(), FETCH_FILE, "exec"), namespace)
    listings = [
        ["config.json", "model.safetensors", "pytorch_model.bin", "x.gguf", "original/a.pth"],
        ["config.json", "tokenizer.json", "pytorch_model-1.bin", "pytorch_model.bin.index.json"],
        ["config.json", "consolidated.safetensors", "model-1.safetensors", hub.SAFETENSORS_INDEX],
        ["params.json", "tekken.json", "weights.pt", "README.md"],
    ]
    index = {"a": "model-1.safetensors"}
    for paths in listings:
        for weights_index in (None, index):
            assert namespace["wanted_files"](paths, weights_index) == list(
                hub.wanted_files(paths, index=weights_index)
            )
    ast.parse(fetch_model_script(), feature_version=(3, 8))  # the oldest python3 it meets


def run_init_container(
    cfg: DeploymentConfig, tmp_path: Path, hub_standin: HubStandin, **env: str
) -> subprocess.CompletedProcess[str]:
    """The init container's command and environment, its two volumes here under
    ``tmp_path``, the hub the stand-in, HF_TOKEN the Secret's value where it names one."""
    (init,) = pod_of(cfg)["initContainers"]
    scripts = tmp_path / "scripts"
    scripts.mkdir(parents=True, exist_ok=True)
    (scripts / FETCH_FILE).write_text(fetch_model_script())
    cache = tmp_path / "model-cache"

    def here(value: str) -> str:
        value = value.replace(SCRIPTS_MOUNT_PATH, str(scripts))
        return value.replace(MODEL_CACHE_MOUNT_PATH, str(cache))

    environ = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path / "home"),
        "HF_ENDPOINT": hub_standin.endpoint,
        **env,
    }
    for item in init["env"]:
        if "value" in item:
            environ[item["name"]] = here(item["value"])
        else:  # a Secret's key: its value as the cluster would put it there
            assert item["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
            environ[item["name"]] = GRANTED_TOKEN
    command = [here(arg) for arg in init["command"]]
    assert command[0] == "python3"
    return subprocess.run(
        [sys.executable, *command[1:]], env=environ, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def vllm_reads(cfg: DeploymentConfig, tmp_path: Path) -> set[str]:
    """What vLLM's container is given (its first argument, on the model cache here): the
    files of a model directory, whose config the tuner's own reader reads."""
    (vllm,) = pod_of(cfg)["containers"]
    folder = tmp_path / "model-cache" / Path(vllm["args"][0]).relative_to(MODEL_CACHE_MOUNT_PATH)
    assert load_model_dir(folder).num_layers > 0
    return {p.name for p in folder.iterdir() if p.is_file()}


def test_the_init_container_fetches_once_and_a_warm_cache_downloads_nothing(
    tmp_path: Path,
) -> None:
    cfg = make(model=QWEN)
    with HubStandin() as hub_standin:
        first = run_init_container(cfg, tmp_path, hub_standin)
        assert first.returncode == 0, first.stdout + first.stderr
        assert set(hub_standin.downloads) == WANTED  # only what vLLM loads
        hub_standin.downloads.clear()
        again = run_init_container(cfg, tmp_path, hub_standin)
        assert again.returncode == 0, again.stdout + again.stderr
        assert hub_standin.downloads == []  # the warm cache: nothing crossed the wire
    assert "fetched" in first.stdout and "nothing fetched" in again.stdout
    assert vllm_reads(cfg, tmp_path) == WANTED
    # the hub gone: a warm cache still starts the pod, and says so
    down = run_init_container(cfg, tmp_path, hub_standin)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "was not reached" in down.stdout and "serves" in down.stdout


def test_a_gated_model_is_fetched_with_the_secrets_token_and_refused_in_one_line_without(
    tmp_path: Path,
) -> None:
    with HubStandin() as hub_standin:
        refused = run_init_container(make(), tmp_path / "a", hub_standin)
        assert hub_standin.downloads == []
        fetched = run_init_container(make(hf_token_secret=TOKEN), tmp_path / "b", hub_standin)
    assert refused.returncode == 1
    (line,) = refused.stdout.splitlines()
    assert "is gated" in line and "HF_TOKEN" in line and "is not set" in line
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert vllm_reads(make(), tmp_path / "b") == WANTED

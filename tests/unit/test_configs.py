"""Deployable configs: command line, vLLM config YAML, Kubernetes manifests, tuning Job."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from typing import Any

import pytest
import yaml
from kubernetes_validate import validate
from kubernetes_validate.utils import ValidationError as K8sValidationError
from kubernetes_validate.utils import latest_version

from tuner.deploy import (
    CACHE_MOUNT_PATH,
    MODEL_CACHE_MOUNT_PATH,
    SCRIPTS_MOUNT_PATH,
    DeploymentConfig,
    HostPathCache,
    PvcCache,
    Rollout,
    SecretKeyRef,
    dns_label,
    kubernetes_manifests,
    kubernetes_switch,
    parse_cache_volume,
    tuning_job_manifests,
    vllm_args,
    vllm_config_yaml,
    warmup_job_manifests,
    warmup_plan_of,
)
from tuner.drain import drain_script, drain_timing
from tuner.errors import ConfigError
from tuner.warmup import warmup_script

# The oldest Kubernetes the manifests promise (backoffLimitPerIndex is beta there) and the
# newest whose schema the installed kubernetes-validate ships.
K8S_VERSIONS = ["1.29", latest_version()]
HASH_KEY = "vllm-capacity-tuner/config-hash"

DNS_1035 = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")

NASTY_MODEL = 'acme/<script>alert("x")</script> it\'s $(HOME) `id` model'
FLAGS: dict[str, Any] = {
    "gpu-memory-utilization": 0.9,
    "max-num-seqs": 256,
    "max-num-batched-tokens": 8192,
    "block-size": 16,
    "kv-cache-dtype": "fp8",
    "enable-prefix-caching": True,
    "enforce-eager": False,
    "swap-space": 0.30000000000000004,
    "seed": -1,
    "chat-template": "{{ 'a b' }}; rm -rf / && echo \"$USER\"",
}


def make(**overrides: Any) -> DeploymentConfig:
    fields: dict[str, Any] = {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "vllm_version": "0.11.0",
        "config_hash": "3f2a9c0d11b7e4a8",
        "flags": FLAGS,
    }
    fields.update(overrides)
    return DeploymentConfig.build(**fields)


def parse_flags(tokens: list[str]) -> dict[str, Any]:
    """argv after the model back to {flag: value-as-text or True}, in order."""
    flags: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        assert token.startswith("--"), tokens
        if "=" in token:
            name, value = token[2:].split("=", 1)
            flags[name] = value
            i += 1
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            flags[token[2:]] = tokens[i + 1]
            i += 2
        else:
            flags[token[2:]] = True
            i += 1
    return flags


def expected_flags(cfg: DeploymentConfig) -> dict[str, Any]:
    head: dict[str, Any] = {}
    if cfg.served_model_name:
        head["served-model-name"] = cfg.served_model_name
    head["port"] = str(cfg.port)
    head["tensor-parallel-size"] = str(cfg.tensor_parallel_size)
    for name, value in cfg.flags.items():
        if value is True:
            head[name] = True
        elif value is not False:
            head[name] = repr(value) if isinstance(value, float) else str(value)
    return head


def vllm_config_file_argv(data: dict[str, Any]) -> list[str]:
    """vLLM's documented reading of a --config YAML (FlexibleArgumentParser.load_config_file)."""
    argv: list[str] = []
    for key, value in data.items():
        if isinstance(value, bool):
            argv += [f"--{key}"] if value else []
        elif isinstance(value, list):
            argv += [f"--{key}", *(str(v) for v in value)]
        else:
            argv += [f"--{key}", str(value)]
    return argv


def docs_of(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def assert_valid_k8s(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        for version in K8S_VERSIONS:
            validate(doc, version, strict=True)
        name = doc["metadata"]["name"]
        pattern = DNS_1035 if doc["kind"] == "Service" else DNS_SUBDOMAIN
        assert pattern.fullmatch(name) and len(name) <= 63, name
        labels = dict(doc["metadata"].get("labels", {}))
        template = doc.get("spec", {}).get("template")
        if template:
            labels.update(template["metadata"].get("labels", {}))
        for value in labels.values():
            assert LABEL_VALUE.fullmatch(value), value


# --- 1. command line ------------------------------------------------------------------


def test_args_round_trip_through_shlex_to_the_same_flags() -> None:
    cfg = make(served_model_name="llama-8b", tensor_parallel_size=2)
    text = vllm_args(cfg)
    lines = text.rstrip("\n").split("\n")
    assert lines[0] == "vllm serve meta-llama/Llama-3.1-8B-Instruct \\"
    assert all(line.endswith(" \\") for line in lines[:-1]) and not lines[-1].endswith("\\")
    assert all(line.startswith("    --") for line in lines[1:])  # one flag a line
    tokens = shlex.split(text.replace("\\\n", ""))  # what a shell does with the continuations
    assert tokens[:3] == ["vllm", "serve", cfg.model]
    flags = parse_flags(tokens[3:])
    assert flags == expected_flags(cfg)
    assert list(flags) == list(expected_flags(cfg))  # order kept
    assert "enforce-eager" not in flags  # False: omitted
    assert flags["enable-prefix-caching"] is True  # True: a bare flag
    assert "--seed=-1" in tokens  # a value that looks like an option is glued on
    assert float(flags["swap-space"]) == FLAGS["swap-space"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_args_are_one_command_for_a_real_shell_even_with_a_hostile_model_name() -> None:
    cfg = make(model=NASTY_MODEL, served_model_name='it\'s "quoted"')
    text = vllm_args(cfg)
    script = "vllm() { printf '%s\\0' \"$@\"; }\n" + text
    out = subprocess.run(
        ["bash", "-c", script], capture_output=True, check=True, env={"PATH": os.defpath}
    ).stdout.decode()
    argv = out.split("\0")[:-1]
    assert argv[0] == "serve"
    assert argv[1] == NASTY_MODEL  # no expansion, no splitting, no command substitution
    assert parse_flags(argv[2:]) == expected_flags(cfg)


# --- 2. vLLM config YAML --------------------------------------------------------------


def test_config_yaml_loads_with_vllm_keys_and_reads_as_the_command_line() -> None:
    cfg = make(served_model_name="llama-8b")
    data = yaml.safe_load(vllm_config_yaml(cfg))
    assert list(data) == ["model", *expected_flags(cfg)]
    assert data["model"] == cfg.model
    assert data["port"] == 8000 and data["tensor-parallel-size"] == 1
    assert data["gpu-memory-utilization"] == 0.9
    assert data["enable-prefix-caching"] is True
    assert "enforce-eager" not in data
    assert data["kv-cache-dtype"] == "fp8" and data["chat-template"] == FLAGS["chat-template"]
    # vLLM turns the file into arguments; they must be the same as the command line's.
    argv = vllm_config_file_argv(data)
    assert argv[:2] == ["--model", cfg.model]
    cli = shlex.split(vllm_args(cfg).replace("\\\n", ""))
    assert parse_flags(argv[2:]) == parse_flags(cli[3:])


def test_config_yaml_keeps_strings_that_look_like_numbers_as_text() -> None:
    cfg = make(flags={"revision": "0123", "tokenizer-mode": "true", "max-model-len": 4096})
    data = yaml.safe_load(vllm_config_yaml(cfg))
    assert data["revision"] == "0123" and data["tokenizer-mode"] == "true"
    assert data["max-model-len"] == 4096


def test_hostile_model_name_survives_yaml() -> None:
    cfg = make(model=NASTY_MODEL)
    assert yaml.safe_load(vllm_config_yaml(cfg))["model"] == NASTY_MODEL


# --- 3. Kubernetes serving manifests --------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"tensor_parallel_size": 4, "replicas": 3, "memory_request": "128Gi", "cpu_request": "16"},
        {"cache_volume": "hostpath:/mnt/vllm-cache", "served_model_name": "chat"},
        {"cache_volume": "pvc:200Gi:fast-ssd", "model": NASTY_MODEL, "labels": {"team": "ml"}},
        {
            "api_key_secret": SecretKeyRef(name="vllm-api", key="key"),
            "hf_token_secret": SecretKeyRef(name="hf", key="token"),
        },
        {"cache_volume": "pvc:200Gi:nfs-client:rwx", "replicas": 4},
        {"rollout": "blue-green", "replicas": 3, "tensor_parallel_size": 2},
        {"rollout": "blue-green", "cache_volume": "pvc:50Gi:efs:rwx", "model": NASTY_MODEL},
        {"rollout": "blue-green", "cache_volume": "hostpath:/mnt/c", "name": "a" * 50},
    ],
)
def test_every_manifest_validates_against_the_kubernetes_schema(overrides: dict[str, Any]) -> None:
    cfg = make(**overrides)
    docs = docs_of(kubernetes_manifests(cfg))
    docs += docs_of(warmup_job_manifests(cfg))
    switch = kubernetes_switch(cfg)
    assert (switch is None) == (cfg.rollout is Rollout.ROLLING)
    if switch is not None:
        docs += docs_of(switch)
    assert_valid_k8s(docs)
    for doc in docs:  # a fleet can tell every object's version
        assert doc["metadata"]["labels"][HASH_KEY] == cfg.config_hash, doc["kind"]
        assert doc["metadata"]["annotations"][HASH_KEY] == cfg.config_hash, doc["kind"]


def test_the_schema_check_is_not_vacuous() -> None:
    deployment = by_kind(docs_of(kubernetes_manifests(make())), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = ["gpu"]
    with pytest.raises(K8sValidationError):
        validate(deployment, latest_version(), strict=True)
    deployment = by_kind(docs_of(kubernetes_manifests(make())), "Deployment")
    deployment["spec"]["replica"] = 2
    with pytest.raises(K8sValidationError):
        validate(deployment, latest_version(), strict=True)


def test_deployment_serves_the_flags_on_the_gpus_with_probes_and_drain() -> None:
    drain = drain_timing(4000.0)
    cfg = make(tensor_parallel_size=2, served_model_name="chat", drain=drain)
    docs = docs_of(kubernetes_manifests(cfg))
    deployment = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "vllm/vllm-openai:v0.11.0"
    assert container["command"] == ["vllm", "serve"]
    # the directory the init container fetched the model into (served as "chat")
    assert container["args"][0] == f"{MODEL_CACHE_MOUNT_PATH}/hf/{cfg.model}"
    # Kubernetes reads $$ as a literal $ (the chat template has one).
    args = [arg.replace("$$", "$") for arg in container["args"][1:]]
    assert parse_flags(args) == expected_flags(cfg)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["ports"][0] == {"name": "http", "containerPort": 8000, "protocol": "TCP"}
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= cfg.startup_timeout_s
    assert startup["timeoutSeconds"] > cfg.warmup_timeout_s
    # The warm-up runs in the startup probe, so readiness (and traffic) only follows it;
    # the program is the ConfigMap's, rendered from the plan.
    command = startup["exec"]["command"]
    assert command[:2] == ["python3", f"{SCRIPTS_MOUNT_PATH}/warmup.py"]
    assert "--probe" in command and command[command.index("--url") + 1] == "http://127.0.0.1:8000"
    scripts = by_kind(docs, "ConfigMap")["data"]
    assert scripts["warmup.py"] == warmup_script(warmup_plan_of(cfg))
    assert warmup_plan_of(cfg).served_model == "chat"
    assert scripts["drain.py"] == drain_script()
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[:2] == ["python3", f"{SCRIPTS_MOUNT_PATH}/drain.py"]
    assert float(pre_stop[pre_stop.index("--bound-s") + 1]) == drain.bound_s
    assert float(pre_stop[pre_stop.index("--settle-s") + 1]) == drain.settle_s
    assert pod["terminationGracePeriodSeconds"] == drain.grace_period_s
    assert drain.grace_period_s > drain_timing(None).settle_s + drain.bound_s  # room after
    assert pod["enableServiceLinks"] is False  # a Service named vllm would set VLLM_PORT
    env = {e["name"]: e for e in container["env"]}
    assert env["VLLM_CACHE_ROOT"]["value"] == CACHE_MOUNT_PATH
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts[CACHE_MOUNT_PATH] == "vllm-cache"
    assert (
        volumes[mounts[SCRIPTS_MOUNT_PATH]]["configMap"]["name"]
        == by_kind(docs, "ConfigMap")["metadata"]["name"]
    )
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"


def test_a_rolling_update_never_takes_a_replica_down() -> None:
    for cache in ("pvc", "pvc:100Gi:nfs:rwx", "hostpath:/mnt/c"):
        for replicas in (1, 3):
            deployment = by_kind(
                docs_of(kubernetes_manifests(make(cache_volume=cache, replicas=replicas))),
                "Deployment",
            )
            strategy = deployment["spec"]["strategy"]
            assert strategy == {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            }, (cache, replicas)
            # A new pod's startup (load, compile, warm-up) is not "no progress".
            assert deployment["spec"]["progressDeadlineSeconds"] > 1800


def test_single_gpu_has_no_shm_volume_and_pipeline_parallel_counts_gpus() -> None:
    pod = by_kind(docs_of(kubernetes_manifests(make())), "Deployment")["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["vllm-cache", "model-cache", "scripts"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    cfg = make(tensor_parallel_size=2, flags={"pipeline-parallel-size": 2})
    container = by_kind(docs_of(kubernetes_manifests(cfg)), "Deployment")["spec"]["template"][
        "spec"
    ]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4


def test_config_hash_is_an_annotation_and_a_label_and_service_selects_the_pods() -> None:
    cfg = make(labels={"team": "inference"})
    docs = docs_of(kubernetes_manifests(cfg))
    deployment, service = by_kind(docs, "Deployment"), by_kind(docs, "Service")
    template = deployment["spec"]["template"]["metadata"]
    for meta in (deployment["metadata"], template):
        assert meta["annotations"][HASH_KEY] == cfg.config_hash
        assert meta["labels"][HASH_KEY] == cfg.config_hash
        assert meta["labels"]["team"] == "inference"
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert HASH_KEY not in selector  # the selector is immutable; the hash changes
    assert selector.items() <= template["labels"].items()
    assert service["spec"]["selector"] == selector
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_each_replica_gets_its_own_cache_claim_unless_a_shared_class_is_named() -> None:
    # pvc: a claim per pod, made with it, so a new pod never waits for an old one's volume.
    docs = docs_of(kubernetes_manifests(make(cache_volume="pvc:100Gi:fast-ssd", replicas=3)))
    assert "PersistentVolumeClaim" not in [d["kind"] for d in docs]
    pod = by_kind(docs, "Deployment")["spec"]["template"]["spec"]
    template = pod["volumes"][0]["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert template["accessModes"] == ["ReadWriteOnce"]
    assert template["resources"]["requests"]["storage"] == "100Gi"
    assert template["storageClassName"] == "fast-ssd"
    # pvc:...:rwx: one ReadWriteMany claim of the named class, mounted by every pod.
    docs = docs_of(kubernetes_manifests(make(cache_volume="pvc:100Gi:nfs:rwx", replicas=3)))
    claim = by_kind(docs, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["storageClassName"] == "nfs"
    volumes = by_kind(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert volumes[0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]


def test_hostpath_cache_has_no_claim() -> None:
    docs = docs_of(kubernetes_manifests(make(cache_volume="hostpath:/mnt/cache")))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Deployment", "Service"]
    pod = by_kind(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["volumes"][0]["hostPath"] == {"path": "/mnt/cache", "type": "DirectoryOrCreate"}


def test_blue_green_renders_one_side_per_config_hash_and_a_switch() -> None:
    old = make(rollout="blue-green", replicas=2, config_hash="1111111111111111")
    new = make(rollout="blue-green", replicas=2, config_hash="2222222222222222")
    old_docs, new_docs = docs_of(kubernetes_manifests(old)), docs_of(kubernetes_manifests(new))
    assert [d["kind"] for d in new_docs] == ["ConfigMap", "Service", "StatefulSet"]
    # The two sides share no object: applying the new one leaves the old one serving.
    names = {(d["kind"], d["metadata"]["name"]) for d in old_docs}
    assert not names & {(d["kind"], d["metadata"]["name"]) for d in new_docs}
    sts = by_kind(new_docs, "StatefulSet")
    assert sts["metadata"]["name"] == f"{new.name}-22222222"
    assert sts["spec"]["selector"]["matchLabels"][HASH_KEY] == new.config_hash
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    # a compile cache claim and a model cache claim per replica, kept
    claims = sts["spec"]["volumeClaimTemplates"]
    assert [c["metadata"]["name"] for c in claims] == ["vllm-cache", "model-cache"]
    assert all(c["spec"]["accessModes"] == ["ReadWriteOnce"] for c in claims)
    side = by_kind(new_docs, "Service")
    assert (
        side["spec"]["clusterIP"] == "None"
        and sts["spec"]["serviceName"] == side["metadata"]["name"]
    )
    # The switch: the Service of the model's name, selecting the new side's pods only.
    (switch,) = docs_of(kubernetes_switch(new) or "")
    assert switch["metadata"]["name"] == new.name
    assert switch["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    assert by_kind(docs_of(kubernetes_switch(old) or ""), "Service")["metadata"]["name"] == new.name
    # The warm-up Job goes to the new side before the switch.
    job = by_kind(docs_of(warmup_job_manifests(new)), "Job")
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--url") + 1] == f"http://{side['metadata']['name']}:8000"


def test_long_names_stay_labels_in_every_version() -> None:
    cfg = make(rollout="blue-green", name="a" * 50)
    sts = by_kind(docs_of(kubernetes_manifests(cfg)), "StatefulSet")
    # The controller adds controller-revision-hash=<name>-<10 chars>: a label value.
    assert len(sts["metadata"]["name"]) + 11 <= 63


def test_api_key_only_from_a_secret_reference() -> None:
    cfg = make(api_key_secret=SecretKeyRef(name="vllm-api", key="key"))
    container = by_kind(docs_of(kubernetes_manifests(cfg)), "Deployment")["spec"]["template"][
        "spec"
    ]["containers"][0]
    (key_env,) = [e for e in container["env"] if e["name"] == "VLLM_API_KEY"]
    assert key_env == {
        "name": "VLLM_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "vllm-api", "key": "key"}},
    }
    assert not any(a.startswith("--api-key") for a in container["args"])
    with pytest.raises(ConfigError, match="api_key_secret"):
        make(flags={"api-key": "sk-live-123"})


def test_hostile_model_name_is_literal_in_the_container_args() -> None:
    cfg = make(model=NASTY_MODEL)
    container = by_kind(docs_of(kubernetes_manifests(cfg)), "Deployment")["spec"]["template"][
        "spec"
    ]["containers"][0]
    # Kubernetes expands $(VAR) in args; $$ is its escape for a literal $. The model is
    # served from the directory it was fetched into, under its own name.
    assert container["args"][1:3] == ["--served-model-name", NASTY_MODEL.replace("$", "$$")]
    assert container["args"][0].startswith(f"{MODEL_CACHE_MOUNT_PATH}/hf/acme/")
    assert not re.search(r"[$`<>' ]", container["args"][0])
    assert DNS_1035.fullmatch(cfg.name)


# --- the warm-up Job -------------------------------------------------------------------


def test_warmup_job_runs_the_same_program_through_the_service() -> None:
    cfg = make(api_key_secret=SecretKeyRef(name="vllm-api", key="key"))
    job = by_kind(docs_of(warmup_job_manifests(cfg)), "Job")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"][:2] == ["python3", f"{SCRIPTS_MOUNT_PATH}/warmup.py"]
    assert (
        container["command"][container["command"].index("--url") + 1] == f"http://{cfg.name}:8000"
    )
    assert "--probe" not in container["command"]
    config_map = by_kind(docs_of(kubernetes_manifests(cfg)), "ConfigMap")["metadata"]["name"]
    assert pod["volumes"][0]["configMap"]["name"] == config_map
    assert container["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "vllm-api", "key": "key"}
    # Its pod is not one of the serving pods' (no Service or Deployment selects it).
    service = by_kind(docs_of(kubernetes_manifests(cfg)), "Service")
    assert (
        not service["spec"]["selector"].items()
        <= job["spec"]["template"]["metadata"]["labels"].items()
    )


# --- names and bad input --------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3-1-8b-instruct"),
        ("./my_models/Qwen2.5-72B-Instruct-AWQ/", "qwen2-5-72b-instruct-awq"),
        ("Org/Model_Name.V2!!", "model-name-v2"),
        ("01-ai/Yi-1.5-34B", "yi-1-5-34b"),
        ("/models/7b", "vllm-7b"),
        ("///", "vllm"),
        ("Ünïcode/模型", "vllm"),
        ("x/" + "A" * 80, "a" * 50),
    ],
)
def test_dns_invalid_model_names_become_valid_names(model: str, name: str) -> None:
    # "///" is no directory a pod can read the model from: its source is said
    cfg = make(model=model, model_source="hub" if model == "///" else None)
    assert cfg.name == name
    assert DNS_1035.fullmatch(cfg.name) and len(cfg.name) <= 50
    assert_valid_k8s(docs_of(kubernetes_manifests(cfg)))


def test_dns_label_never_ends_with_a_dash_after_cutting() -> None:
    assert dns_label("abcd-efgh", max_len=5) == "abcd"
    assert dns_label("123", fallback="tune") == "tune-123"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "nfs:/exports/cache",
        "pvc:",
        "pvc:100",
        "pvc:lots",
        "pvc:10Gi:Bad_Class",
        "pvc:10Gi::rwx",
        "pvc:10Gi:nfs:rox",
        "hostpath",
        "hostpath:",
        "hostpath:relative/dir",
        "hostpath:/",
        "hostpath:/a/../b",
    ],
)
def test_bad_cache_volume_is_one_clear_config_error(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_cache_volume(text)
    message = str(info.value)
    assert "\n" not in message
    assert repr(text) in message and "accepted" in message
    with pytest.raises(ConfigError) as info:
        make(cache_volume=text)
    assert "\n" not in str(info.value) and repr(text) in str(info.value)


@pytest.mark.parametrize(
    ("text", "volume"),
    [
        ("pvc", PvcCache()),
        ("PVC:50Gi", PvcCache(size="50Gi")),
        ("pvc:1Ti:standard-rwx", PvcCache(size="1Ti", storage_class="standard-rwx")),
        ("pvc:1Ti:nfs:rwx", PvcCache(size="1Ti", storage_class="nfs", access_mode="ReadWriteMany")),
        ("hostpath:/mnt/vllm cache", HostPathCache(path="/mnt/vllm cache")),
    ],
)
def test_cache_volume_strings_parse_and_print_back(
    text: str, volume: PvcCache | HostPathCache
) -> None:
    assert parse_cache_volume(text) == volume
    assert parse_cache_volume(volume.cli) == volume


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"flags": {"port": 9000}}, "port field"),
        ({"flags": {"tensor-parallel-size": 2}}, "tensor_parallel_size"),
        ({"flags": {"max-num-seqs": [1, 2]}}, "max-num-seqs"),
        ({"flags": {"bad flag": 1}}, "'bad flag'"),
        ({"flags": {"max_num_seqs": 1, "max-num-seqs": 2}}, "twice"),
        ({"port": 80}, "port"),
        ({"config_hash": "a" * 64}, "config hash"),
        ({"vllm_version": "latest"}, "'latest'"),
        ({"name": "Llama_8B"}, "'Llama_8B'"),
        ({"labels": {HASH_KEY: "x"}}, HASH_KEY),
        ({"labels": {"team": "not ok"}}, "not ok"),
        ({"memory_request": "lots"}, "'lots'"),
        ({"model": "bad\nname"}, "control character"),
        ({"bogus": 1}, "bogus is not a field here"),
        ({"flags": {"gpu-memory-utilization": float("nan")}}, "nan"),
        ({"rollout": "canary"}, "'canary'"),
    ],
)
def test_bad_deployment_values_are_one_line_config_errors(
    overrides: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ConfigError) as info:
        make(**overrides)
    assert "\n" not in str(info.value) and needle in str(info.value), str(info.value)


def test_flag_names_are_normalised_and_image_follows_the_version() -> None:
    cfg = make(flags={"--max_num_seqs": 8}, vllm_version="0.10.1.1")
    assert cfg.flags == {"max-num-seqs": 8}
    assert cfg.image == "vllm/vllm-openai:v0.10.1.1"
    assert make(vllm_version="0.11").image == "vllm/vllm-openai:v0.11.0"
    assert make(image="registry.local/vllm:custom").image == "registry.local/vllm:custom"


# --- 4. distributed tuning Job --------------------------------------------------------

STORAGE = "postgresql://optuna:Pa55-w0rd@db.internal:5432/tuning"


def job_docs(**overrides: Any) -> list[dict[str, Any]]:
    fields: dict[str, Any] = {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "workers": 4,
        "storage_url": STORAGE,
        "study": "llama8b-h100",
        "image": "ghcr.io/acme/vllm-capacity-tuner:0.1.0",
        "extra_args": ["--trials", "60", "--gpu", "H100-80GB"],
    }
    fields.update(overrides)
    return docs_of(tuning_job_manifests(**fields))


def test_tuning_job_is_an_indexed_job_of_one_gpu_workers_and_validates() -> None:
    docs = job_docs()
    assert_valid_k8s(docs)
    assert [d["kind"] for d in docs] == ["Secret", "PersistentVolumeClaim", "Job"]
    job = by_kind(docs, "Job")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 4
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["command"] == ["tuner"]
    args = container["args"]
    assert args[:6] == [
        "tune",
        "--model",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--study",
        "llama8b-h100",
        "--resume",
    ]
    assert args[6:] == ["--trials", "60", "--gpu", "H100-80GB"]
    assert not any("TUNER_STORAGE" in a or "--storage" in a for a in args)  # read from the env
    claim = by_kind(docs, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # shared by every worker
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert {"name": "vllm-cache", "mountPath": CACHE_MOUNT_PATH} in container["volumeMounts"]


@pytest.mark.parametrize("cache", ["pvc", "pvc:100Gi:nfs:rwx", "hostpath:/mnt/c"])
def test_every_vllm_container_names_its_mounted_cache_in_vllm_cache_root(cache: str) -> None:
    # vLLM reads VLLM_CACHE_ROOT (vllm/envs.py), never VLLM_CACHE_DIR; its default
    # (~/.cache/vllm) follows HOME, so the mount must be named explicitly and its path must
    # not be a home directory: a pod that runs as another user still uses the volume.
    assert not CACHE_MOUNT_PATH.startswith(("/root", "/home", "~"))
    cfg = make(cache_volume=cache, replicas=2)
    for rollout in ("rolling", "blue-green"):
        docs = docs_of(kubernetes_manifests(make(cache_volume=cache, rollout=rollout)))
        docs += docs_of(warmup_job_manifests(cfg)) + job_docs(cache_volume=cache)
        assert_valid_k8s(docs)
        containers = [
            c
            for d in docs
            if d["kind"] in ("Deployment", "StatefulSet", "Job")
            for c in d["spec"]["template"]["spec"]["containers"]
        ]
        launching = [c for c in containers if c["name"] != "warmup"]  # the warm-up only asks
        assert len(launching) == 2
        for container in launching:
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert "VLLM_CACHE_DIR" not in env
            assert env["VLLM_CACHE_ROOT"] == CACHE_MOUNT_PATH
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert mounts[CACHE_MOUNT_PATH] == "vllm-cache"


def test_storage_url_is_only_in_the_secret_and_the_job_reads_it_by_reference() -> None:
    text = tuning_job_manifests(
        model="m", workers=2, storage_url=STORAGE, study="s", image="tuner:1"
    )
    docs = docs_of(text)
    job, secret = by_kind(docs, "Job"), by_kind(docs, "Secret")
    job_text = yaml.safe_dump(job)
    for secret_part in (STORAGE, "Pa55-w0rd", "db.internal"):
        assert secret_part not in job_text
        assert secret_part not in yaml.safe_dump(by_kind(docs, "PersistentVolumeClaim"))
    assert text.count("Pa55-w0rd") == 1  # once, in the Secret
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    (storage_env,) = [e for e in env if e["name"] == "TUNER_STORAGE"]
    assert "value" not in storage_env
    ref = storage_env["valueFrom"]["secretKeyRef"]
    assert ref["name"] == secret["metadata"]["name"]
    assert secret["stringData"][ref["key"]] == STORAGE


def test_tuning_job_with_an_existing_secret_prints_nothing_secret() -> None:
    docs = job_docs(
        storage_url=None,
        storage_secret=SecretKeyRef(name="optuna-db", key="url"),
        cache_volume="hostpath:/mnt/cache",
    )
    assert_valid_k8s(docs)
    assert [d["kind"] for d in docs] == ["Job"]
    container = docs[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "optuna-db", "key": "url"}


def test_tuning_job_name_is_a_dns_label_and_literals_are_escaped() -> None:
    docs = job_docs(study="Llama 8B / H100 $(sweep)", extra_args=["--note=$(HOME)"])
    job = by_kind(docs, "Job")
    assert DNS_1035.fullmatch(job["metadata"]["name"]) and job["metadata"]["name"].startswith(
        "tune-"
    )
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "Llama 8B / H100 $$(sweep)" in args and "--note=$$(HOME)" in args


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"storage_url": "sqlite:///runs/study.db"}, "SQLite"),
        ({"storage_url": "postgres//optuna:Pa55-w0rd@db/x"}, "SQLAlchemy URL"),
        ({"storage_secret": SecretKeyRef(name="db", key="url")}, "exactly one"),
        ({"storage_url": None}, "exactly one"),
        ({"workers": 0}, "workers 0"),
        ({"extra_args": ["--storage=sqlite:///x.db"]}, "--storage"),
        ({"extra_args": ["--study", "other"]}, "--study"),
        ({"cache_volume": "nfs:/x"}, "'nfs:/x'"),
        ({"image": "bad image"}, "'bad image'"),
    ],
)
def test_bad_tuning_job_input_is_one_line_without_the_password(
    overrides: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ConfigError) as info:
        job_docs(**overrides)
    message = str(info.value)
    assert "\n" not in message and needle in message, message
    assert "Pa55-w0rd" not in message

"""Manifests of a recommendation that offloads KV to CPU memory: an in-memory /dev/shm that
holds the whole buffer (vLLM maps it from there) and a pod memory request that covers it;
they validate against Kubernetes' schema."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_configs import assert_valid_k8s, by_kind, docs_of, make
from tuner.deploy import SERVER_HOST_GIB, kubernetes_manifests, quantity_gib
from tuner.errors import ConfigError


def _pod(**overrides: Any) -> dict[str, Any]:
    docs = docs_of(kubernetes_manifests(make(**overrides)))
    assert_valid_k8s(docs)
    spec: dict[str, Any] = by_kind(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


def test_an_offloading_pod_mounts_a_shm_that_holds_the_buffer_and_requests_it() -> None:
    pod = _pod(flags={"kv-offloading-size": 64.0})
    container = pod["containers"][0]
    assert "--kv-offloading-size" in " ".join(container["args"] + container.get("command", []))
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    shm = volumes[mounts["/dev/shm"]]["emptyDir"]
    assert shm["medium"] == "Memory"
    assert quantity_gib(shm["sizeLimit"]) >= 64 + 2  # the buffer and the default shm_size
    memory = quantity_gib(container["resources"]["requests"]["memory"])
    assert memory == quantity_gib(shm["sizeLimit"]) + SERVER_HOST_GIB


def test_a_memory_request_is_kept_where_it_holds_the_buffer_and_refused_where_not() -> None:
    pod = _pod(flags={"kv-offloading-size": 16}, memory_request="128Gi")
    resources = pod["containers"][0]["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == "128Gi"
    with pytest.raises(ConfigError) as info:
        make(flags={"kv-offloading-size": 64}, memory_request="32Gi")
    message = str(info.value)
    assert "\n" not in message
    assert "memory_request 32Gi" in message and "accepted: at least 66Gi" in message


def test_without_offloading_one_gpu_has_no_shm_and_no_memory_request() -> None:
    pod = _pod(flags={"kv-offloading-size": 0})
    assert "dshm" not in {v["name"] for v in pod["volumes"]}
    assert "requests" not in pod["containers"][0]["resources"]

"""KV offloading in the registry, the search space, the host memory model and `simulate`."""

from __future__ import annotations

import json

import pytest

from tuner.errors import ConfigError
from tuner.sim.cpu_tier import OffloadPolicy
from tuner.sim.eviction import eviction_choices
from tuner.vllm.flags import KV_OFFLOAD_EVICTION_POLICIES, accepted_options
from tuner.vllm.gpus import get_gpu
from tuner.vllm.host_memory import GiB, host_plan, simulated_host_bytes
from tuner.vllm.models import resolve_model
from tuner.vllm.space import Knob, SearchSpace, TrialParams, build_space, parse_range
from tuner.vllm.versions import VllmVersion

MODEL = resolve_model("llama-3.1-8b")
H100 = get_gpu("H100-80GB")
OFFLOADING = (Knob.KV_OFFLOADING_SIZE, Knob.KV_OFFLOADING_POLICY)


def space(version: str, host_bytes: int | None = None, **overrides: str) -> SearchSpace:
    v = VllmVersion.parse(version)
    return build_space(
        model=MODEL, gpu=H100, version=v, accepted_flags=accepted_options(v), extra=OFFLOADING,
        overrides={Knob(k.replace("_", "-")): parse_range(Knob(k.replace("_", "-")), t)
                   for k, t in overrides.items()},
        host_bytes=host_bytes,
    )  # fmt: skip


def test_the_policies_are_vllms_and_the_simulators() -> None:
    assert tuple(p.value for p in OffloadPolicy) == KV_OFFLOAD_EVICTION_POLICIES == ("lru", "arc")


def test_the_flags_exist_from_0_11_1() -> None:
    assert "--kv-offloading-size" not in accepted_options(VllmVersion.parse("0.11"))
    assert "--kv-offloading-size" in accepted_options(VllmVersion.parse("0.11.1"))
    assert "--kv-offloading-backend" in accepted_options(VllmVersion.current())


def test_the_knobs_are_searched_where_vllm_has_them() -> None:
    searched = space("0.33")
    assert searched.range_of(Knob.KV_OFFLOADING_SIZE) is not None
    policy = searched.range_of(Knob.KV_OFFLOADING_POLICY)
    assert policy is not None and policy.choices == ("lru", "arc")
    old = space("0.10")
    left = {o.knob: o.reason for o in old.left_out}
    assert "0.11.1" in left[Knob.KV_OFFLOADING_SIZE]
    assert old.range_of(Knob.KV_OFFLOADING_SIZE) is None


def test_a_setting_launches_the_native_backend_and_its_policy() -> None:
    params = TrialParams(kv_offloading_size_gib=16.0, kv_offloading_policy="arc")
    flags = params.flags()
    assert flags["kv-offloading-size"] == 16.0
    assert flags["kv-offloading-backend"] == "native"
    config = json.loads(str(flags["kv-transfer-config"]))
    assert config == {"kv_connector_extra_config": {"eviction_policy": "arc"}}
    assert params.short() == "cpu-kv 16 evict arc"
    off = TrialParams(kv_offloading_size_gib=0.0, kv_offloading_policy="arc")
    assert off.flags() == {}  # no CPU tier: nothing to pass


def test_sizes_the_host_cannot_pin_are_left_out_or_refused() -> None:
    small_host = 40 * GiB  # pins at most 36 GiB
    r = space("0.33", host_bytes=small_host).range_of(Knob.KV_OFFLOADING_SIZE)
    assert r is not None and r.choices == (0.0, 16.0)  # 64 GiB left out
    with pytest.raises(ConfigError) as info:
        space("0.33", host_bytes=small_host, kv_offloading_size="0,64")
    assert "\n" not in str(info.value)
    assert "accepted: at most 36 GiB" in str(info.value)


def test_the_host_memory_plan_counts_every_pinned_buffer() -> None:
    plan = host_plan(
        kv_offloading_size_gib=100.0, host_bytes=128 * GiB, swap_space_gib=8.0, cpu_offload_gb=10
    )
    assert plan.pinned_bytes == 108 * GiB + 10 * 10**9
    assert not plan.fits
    refusal = plan.refusal()
    assert refusal is not None and "--kv-offloading-size 100 GiB" in refusal
    assert host_plan(kv_offloading_size_gib=64.0, host_bytes=simulated_host_bytes(1)).fits


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("lfu", "'lfu' is not one of vLLM's eviction policies; accepted: lru, arc"),
        ("1..2", "is not a range"),
    ],
)
def test_a_bad_policy_is_one_line(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_range(Knob.KV_OFFLOADING_POLICY, text)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_simulate_says_which_evictions_are_vllms() -> None:
    current = VllmVersion.current()
    described = {e.name: e.describe() for e in eviction_choices("lru", 8.0, current)}
    assert described["lru"] == "lru: vLLM's"
    assert described["arc"].startswith("arc: vLLM's")
    for what_if in ("lfu", "fifo", "tiered"):
        assert described[what_if] == f"{what_if}: a what-if, not in vLLM"
    assert "arc" not in {e.name for e in eviction_choices("lru", 0.0, current)}
    with pytest.raises(ConfigError, match="arc with --kv-offloading-size"):
        eviction_choices("arc", 0.0, current)
    with pytest.raises(ConfigError, match=r"vLLM 0\.10\.0 has no KV offloading"):
        eviction_choices("lru", 8.0, VllmVersion.parse("0.10"))


def test_a_launch_leaves_the_flags_out_with_the_reason_where_vllm_lacks_them() -> None:
    from tuner.serving.server import Backend, LaunchSpec, _flag_args, adapt_flags

    params = TrialParams(kv_offloading_size_gib=8.0, kv_offloading_policy="arc")
    spec = LaunchSpec(
        backend=Backend.SIM, model="llama-3.1-8b",
        offloading_flags=tuple(params.offloading_flags().items()),
    )  # fmt: skip
    pairs = _flag_args(spec)
    assert ("--kv-offloading-size", "8.0") in pairs
    assert ("--kv-offloading-backend", "native") in pairs
    old = VllmVersion.parse("0.10")
    kept, dropped = adapt_flags(pairs, accepted_options(old), "the emulated vLLM 0.10")
    assert kept == []  # the policy goes with the size it is the policy of
    reasons = {d.flag: d.reason for d in dropped}
    assert (
        reasons["--kv-offloading-size"] == "--kv-offloading-size does not exist before vLLM 0.11.1"
    )
    assert "--kv-offloading-backend" in reasons
    assert "left out with it" in reasons["--kv-transfer-config"]
    kept_now, none = adapt_flags(pairs, accepted_options(VllmVersion.current()), "vLLM")
    assert none == [] and kept_now == pairs

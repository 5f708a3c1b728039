"""Which GPUs the tuner reads: CUDA_VISIBLE_DEVICES mapped to NVML's devices, on the
stand-in NVML of tests/gpuhost (the one thing faked: a physical GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tests.gpuhost import hosts
from tests.models import small_llama_dir
from tuner.errors import ConfigError
from tuner.search.context import detect_gpu_count, detect_gpu_name, detect_gpu_profile
from tuner.serving.nvml_host import read_visible, server_devices, visible_gpus
from tuner.serving.server import Backend, LaunchSpec
from tuner.vllm.memory import ServingParams

pytestmark = pytest.mark.timeout(30)

StandIn = Callable[..., ModuleType]


def _uuids(host: dict[str, object]) -> list[str]:
    return [str(d["uuid"]) for d in host["devices"]]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, [0, 1, 2, 3]),
        ("", []),
        ("1", [1]),
        ("2,3", [2, 3]),
        ("3,1", [3, 1]),
        (" 2 , 0 ", [2, 0]),
        ("1,7,2", [1]),  # an index out of range ends the list, as CUDA reads it
        ("1,x,2", [1]),
        ("1,1", [1]),  # a device already listed ends it too
        ("-1", []),
    ],
)
def test_cuda_visible_devices_indices_map_to_nvml_devices(
    standin_nvml: StandIn, visible: str | None, expected: list[int]
) -> None:
    standin_nvml(hosts.h100_quad(), visible=visible)
    gpus = visible_gpus()
    assert [g.nvml_index for g in gpus] == expected
    assert [g.cuda_index for g in gpus] == list(range(len(expected)))
    assert detect_gpu_count() == len(expected)


def test_uuids_and_unique_prefixes_name_devices_as_cuda_does(standin_nvml: StandIn) -> None:
    host = hosts.h100_quad()
    uuids = _uuids(host)
    standin_nvml(host, visible=f"{uuids[2]},{uuids[1][:12]}")
    assert [g.nvml_index for g in visible_gpus()] == [2, 1]
    # "GPU-000000" is a prefix of every UUID here: ambiguous, it names none and ends the list
    assert [g.nvml_index for g in visible_gpus(f"{uuids[3]},GPU-000000,{uuids[0]}")] == [3]
    assert visible_gpus("GPU-ffffffff") == ()


def test_the_h100_nvl_pair_with_device_1_visible(standin_nvml: StandIn) -> None:
    standin_nvml(hosts.h100_nvl_pair(), visible="1")
    (gpu,) = visible_gpus()
    assert (gpu.nvml_index, gpu.name) == (1, "NVIDIA H100 NVL")
    assert detect_gpu_name() == "NVIDIA H100 NVL" and detect_gpu_count() == 1
    spec, note = detect_gpu_profile("NVIDIA H100 NVL")
    assert spec.name == "H100-NVL-94GB" and note is None


def test_a_mig_uuid_names_the_slice_and_its_memory(standin_nvml: StandIn) -> None:
    host = hosts.mig_slice()
    mig_uuid = host["devices"][0]["mig_devices"][0]["uuid"]
    standin_nvml(host, visible=mig_uuid)
    (gpu,) = visible_gpus()
    assert gpu.uuid == mig_uuid and gpu.is_mig and gpu.nvml_index == 0
    assert gpu.total_bytes == hosts.MIG_3G_40GB_BYTES
    # a prefix of the MIG UUID, the GPU's index and no CUDA_VISIBLE_DEVICES: the same slice
    for visible in (mig_uuid[:10], "0", None):
        (again,) = visible_gpus(visible) if visible is not None else visible_gpus()
        assert again.uuid == mig_uuid


def test_a_mig_slice_is_profiled_as_the_slice(standin_nvml: StandIn) -> None:
    standin_nvml(hosts.mig_slice(), visible="0")
    spec, note = detect_gpu_profile(detect_gpu_name() or "")
    assert spec.nvml_total_bytes == hosts.MIG_3G_40GB_BYTES
    assert spec.name == "A100-80GB-MIG-3g.40gb" and spec.nvlink_bytes_per_s is None
    # bandwidth by the memory share, FLOP/s by the SM share (42 of the A100's 108)
    assert spec.bf16_dense_flops == pytest.approx(312e12 * 42 / 108)
    assert spec.hbm_bandwidth_bytes_per_s == pytest.approx(
        2.039e12 * hosts.MIG_3G_40GB_BYTES / hosts.A100_80GB_BYTES
    )
    assert note is not None and "MIG slice" in note and "42 of 108 SMs" in note
    assert detect_gpu_count() == 1


def test_mig_without_permission_is_refused_in_one_line(standin_nvml: StandIn) -> None:
    standin_nvml(hosts.mig_slice(no_permission=True), visible="0")
    with pytest.raises(ConfigError) as err:
        visible_gpus()
    message = str(err.value)
    assert "\n" not in message
    assert "MIG" in message and "Insufficient Permissions" in message
    assert "NVIDIA_MIG_MONITOR_DEVICES=all" in message and "--backend sim" in message


def test_no_nvml_here_is_no_gpu(monkeypatch: pytest.MonkeyPatch, standin_nvml: StandIn) -> None:
    standin_nvml(hosts.h100_quad())
    monkeypatch.delenv("STANDIN_NVML_HOST")  # the stand-in then has no driver
    assert visible_gpus() == ()
    assert detect_gpu_name() is None and detect_gpu_count() == 0


def test_read_visible_takes_the_server_environment(standin_nvml: StandIn) -> None:
    nvml = standin_nvml(hosts.h100_quad(), visible="0")
    nvml.nvmlInit()
    try:
        gpus = read_visible(nvml, environ={"CUDA_VISIBLE_DEVICES": "3"})
    finally:
        nvml.nvmlShutdown()
    assert [g.nvml_index for g in gpus] == [3]


# --- the tune on such a host: its GPU profile, or one line and exit 2 ------------------------

REPO = Path(__file__).resolve().parents[2]
FAKE_VLLM = f"{sys.executable} {REPO / 'tests' / 'gpuhost' / 'fake_vllm.py'} serve"


def _model_dir(path: Path) -> Path:
    from tests.gpuhost.hub_standin import tokenizer_json

    return small_llama_dir(path, tokenizer=tokenizer_json())


def test_an_unknown_part_is_planned_and_said_in_the_notes(
    standin_nvml: StandIn, tmp_path: Path
) -> None:
    from tuner.search.config import load_config
    from tuner.search.context import resolve

    standin_nvml(hosts.unknown_part(), visible="0")
    config = load_config(
        None,
        {"backend": "vllm", "vllm_cmd": FAKE_VLLM, "model": str(_model_dir(tmp_path / "m")),
         "dry_run": True, "run_dir": tmp_path / "run"},
    )  # fmt: skip
    context = resolve(config)
    assert context.gpu is not None
    assert context.gpu.name == "RTX-PRO-6000-Blackwell-Server-Edition"
    (note,) = [n for n in context.notes if "not a known profile" in n]
    assert note.startswith(
        "GPU 'NVIDIA RTX PRO 6000 Blackwell Server Edition' is not a known profile: planned as "
        "RTX-PRO-6000-Blackwell-Server-Edition from NVML's 95.6 GiB and compute capability 12.0"
    )


@pytest.mark.parametrize(
    ("host", "said"),
    [
        (hosts.unknown_part_without_memory(), "NVML reports no memory for it"),
        (hosts.mig_slice(no_permission=True), "NVML refused the MIG queries"),
    ],
)
def test_a_gpu_nvml_cannot_describe_is_one_line_and_exit_2(
    host: dict[str, object], said: str, tmp_path: Path
) -> None:
    """`tuner tune --dry-run --backend vllm` on the stand-in host: nothing launched."""
    from tests.gpuhost.standin import standin_env, write_host

    env = standin_env(write_host(host, tmp_path / "host.json"), visible="0")
    env["PYTHONPATH"] = os.pathsep.join((env["PYTHONPATH"], str(REPO)))
    done = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "tune", "--dry-run", "--backend", "vllm",
         "--vllm-cmd", FAKE_VLLM, "--model", str(_model_dir(tmp_path / "m")),
         "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0] and "Traceback" not in done.stderr
    assert not list((tmp_path / "run").rglob("server.log"))


@pytest.mark.parametrize(
    ("shown", "gpus", "used"),
    [
        ("2,3", 1, "2"),  # two of four visible, a one-GPU server: device 3 is not the server's
        ("2,3", 2, "2,3"),
        ("GPU-aa, GPU-bb ,GPU-cc", 2, "GPU-aa,GPU-bb"),
        (None, 1, "0"),  # nothing hidden: vLLM's rank 0 is device 0
        (None, 4, "0,1,2,3"),
        ("", 1, ""),  # no GPU shown
    ],
)
def test_a_server_uses_the_first_visible_gpu_of_each_rank(
    shown: str | None, gpus: int, used: str
) -> None:
    assert server_devices(shown, gpus) == used


def test_a_launch_samples_the_devices_of_its_own_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    one = LaunchSpec(backend=Backend.VLLM, model="m")
    two = LaunchSpec(backend=Backend.VLLM, model="m", params=ServingParams(tensor_parallel_size=2))
    given = LaunchSpec(backend=Backend.VLLM, model="m", cuda_visible_devices="1,0")
    assert (one.server_devices(), two.server_devices(), given.server_devices()) == ("2", "2,3", "1")

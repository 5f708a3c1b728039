"""A run planned on a GPU profile derived from NVML (a part no preset describes, a MIG
slice: ``tuner.vllm.gpus.gpu_from_nvml``) is read back with that profile: ``tune.json``
records the whole profile beside its name, and the report's memory view and
`tuner capacity --from` take it. Before, they looked the name up among the presets, which
cannot find a derived one: the report said the memory model "cannot be rebuilt" and the
capacity plan stopped at "unknown GPU". A run written before profiles were recorded is
still read by its name."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reports.html import write_report_noting
from reports.run_data import load_run
from tuner.capacity.calibration import read_run
from tuner.run.layout import RunLayout
from tuner.search.config import load_config
from tuner.search.context import resolve
from tuner.search.tune import describe
from tuner.vllm.gpus import GpuSpec, MiB, MigShare, get_gpu, gpu_from_nvml
from tuner.vllm.memory import ServingParams
from tuner.vllm.memory_boundary import memory_boundary, seqs_grid
from tuner.vllm.models import resolve_model
from tuner.vllm.space import TrialParams
from tuner.vllm.versions import VllmVersion

OLD_RUN = Path(__file__).parents[1] / "fixtures" / "old_runs" / "chat-before-layout"

L40 = gpu_from_nvml("NVIDIA L40", total_bytes=46068 * MiB, compute_capability=(8, 9)).spec
H100_SLICE = gpu_from_nvml(
    "NVIDIA H100 80GB HBM3",
    total_bytes=81559 * MiB,
    compute_capability=(9, 0),
    mig=MigShare(
        profile="3g.40gb",
        total_bytes=40192 * MiB,
        parent_total_bytes=81559 * MiB,
        multiprocessors=60,
        parent_multiprocessors=132,
    ),
).spec
DERIVED = pytest.mark.parametrize("gpu", [L40, H100_SLICE], ids=["unknown-part", "mig-slice"])


def _described(gpu: GpuSpec | None) -> dict[str, Any]:
    """``tune.json`` as `tuner tune` writes it for a run planned on ``gpu``, through JSON."""
    ctx = dataclasses.replace(resolve(load_config(None, {"backend": "sim"})), gpu=gpu)
    doc: dict[str, Any] = json.loads(json.dumps(describe(ctx)))
    return doc


def _run_on(tmp_path: Path, gpu: GpuSpec) -> Path:
    """A finished run's directory (a sim tune's, from the fixtures) whose tune.json records
    ``gpu`` as `tuner tune` records it."""
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    path = RunLayout(run).tune_json
    tune = json.loads(path.read_text(encoding="utf-8"))
    written = _described(gpu)
    tune.update({k: v for k, v in written.items() if k.startswith("gpu")})
    path.write_text(json.dumps(tune), encoding="utf-8")
    return run


@DERIVED
def test_tune_json_records_the_profile_the_run_planned_with(gpu: GpuSpec) -> None:
    doc = _described(gpu)
    assert doc["gpu"] == gpu.name
    assert GpuSpec.model_validate(doc["gpu_profile"]) == gpu
    with pytest.raises(Exception, match="unknown GPU"):
        get_gpu(doc["gpu"])  # why the name alone does not do
    assert _described(None)["gpu_profile"] is None  # vLLM's CPU build: no profile


@DERIVED
def test_the_report_rebuilds_the_memory_model_of_a_derived_profile(
    tmp_path: Path, gpu: GpuSpec
) -> None:
    run = _run_on(tmp_path, gpu)
    assert load_run(run).tune.gpu_spec() == gpu
    html = write_report_noting(run).path.read_text(encoding="utf-8")
    # the fixture's run is from before the boundary was recorded: the map says so
    assert "predicted boundary not drawn: this run did not record one" in html
    # as a tune on this profile records it: the report draws it, without the memory model
    model, version = resolve_model("llama-3.1-8b"), VllmVersion.parse("0.11.0")
    boundary = memory_boundary(
        model, gpu, version, ServingParams(max_model_len=8192), TrialParams(), None,
        ["auto"], seqs_grid([64, 256]),
    )  # fmt: skip
    assert boundary.rows_by_dtype["auto"], "the memory model starts nothing on this profile"
    RunLayout(run).memory_boundary_json.write_text(boundary.model_dump_json(), encoding="utf-8")
    assert load_run(run).memory_boundary == boundary
    html = write_report_noting(run).path.read_text(encoding="utf-8")
    assert "cannot be rebuilt" not in html and "predicted boundary not drawn" not in html
    assert "memory model: starts inside this boundary" in html


@DERIVED
def test_capacity_from_a_run_on_a_derived_profile(tmp_path: Path, gpu: GpuSpec) -> None:
    run = _run_on(tmp_path, gpu)
    assert read_run(run).gpu == gpu
    out = tmp_path / "plan"
    done = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "capacity", "--model", "llama-3.1-8b",
         "--workload", "chat", "--peak", "20", "--gpus", "L4", "--tensor-parallel-size", "1",
         "--no-report", "--out", str(out), "--from", str(run)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "capacity.json").is_file()


def test_a_run_written_before_profiles_were_recorded_reads_by_its_name(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    assert "gpu_profile" not in json.loads(RunLayout(run).tune_json.read_text(encoding="utf-8"))
    preset = get_gpu("H100-80GB")
    assert load_run(run).tune.gpu_spec() == preset
    assert read_run(run).gpu == preset
    # a profile that does not read (a later tuner's, a damaged file) leaves the name's
    path = RunLayout(run).tune_json
    tune = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**tune, "gpu_profile": {"name": "H100-80GB"}}), encoding="utf-8")
    assert load_run(run).tune.gpu_spec() == preset
    assert read_run(run).gpu == preset

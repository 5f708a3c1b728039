"""The device check's script (benchmarks/gpu_host_check.py) on the stand-in NVML, and its
one line without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_host_check.py"


def _has_cuda() -> bool:
    try:
        import torch  # type: ignore[import-not-found]
    except Exception:
        return False
    return bool(torch.cuda.is_available())


def test_standin_run_samples_only_the_last_visible_gpu_by_index_and_by_uuid(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--standin", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert all(line.startswith(("{", "#")) for line in lines)
    checks = {e["check"]: e for e in (json.loads(x) for x in lines if x.startswith("{"))}
    written = [json.loads(x) for x in (tmp_path / "summary.jsonl").read_text().splitlines()]
    assert [e["check"] for e in written] == list(checks)
    for label, visible in (("index", "1"), ("uuid", "GPU-5ad1c0de-0000-4000-8000-000000000001")):
        entry = checks[f"sampler_{label}"]
        assert entry["ok"] is True and entry["visible"] == visible and entry["sampler"] == "tuner"
        # device 0 holds another job's 40 GiB: only device 1 may be sampled
        assert entry["devices_sampled"] == [1]
        assert 10 * 2**30 <= entry["peak_process_used_bytes"] <= 10 * 2**30 + 1536 * 2**20
        assert entry["freed_process_bytes"] is not None and entry["freed_process_bytes"] < 2**30
        assert entry["released"] is True and entry["release_s"] <= entry["release_within_s"]
        assert (tmp_path / f"sampler-{label}" / "gpu_timeline.csv").is_file()
    assert checks["oom_standin_built"]["ok"] is True
    assert (
        checks["oom_standin_built"]["raw_is_oom"]
        and checks["oom_standin_built"]["engine_core_is_oom"]
    )
    assert checks["step_costs"]["ok"] is None
    assert checks["done"] == {"check": "done", "ok": True, "failed": []}
    assert "STAND-IN" in done.stdout


@pytest.mark.skipif(_has_cuda(), reason="this host has a CUDA GPU")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert "no CUDA GPU here" in done.stderr
    assert not (tmp_path / "out").exists()

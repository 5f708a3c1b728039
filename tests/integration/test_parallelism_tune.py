"""Parallelism in the tune (issue 19): on a (virtual) host of two GPUs, `tuner tune`
searches ``--tensor-parallel-size``, launches a server over both GPUs beside one on
one, ranks them per GPU, states the comparison and deploys the winner's size.

The tune runs on the twin's virtual clock (tests/virtual.py: sim-serve's own startup of
each server, its flags included, into the trial's server.log); the refusal runs the command
line in this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.virtual import tune_cli, virtual_tune
from tuner.run.evaluation import Evaluation
from tuner.run.parallelism import ParallelismComparison, Source

pytestmark = pytest.mark.integration


def test_a_tune_over_two_gpus_compares_one_server_of_two_with_two_of_one(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    done = virtual_tune(
        run_dir, "--gpu-count", "2", "--space", "tensor-parallel-size=1,2",
        "--space", "max-num-seqs=16", "--knobs", "max-num-seqs,tensor-parallel-size",
        "--trials", "2", "--no-edge", "--no-confirm",
        twin_search=True,
    )  # fmt: skip
    assert done.summary.best_trial is not None, done.output  # `tuner tune` exits 0
    evaluations = {
        int(p.parent.name): Evaluation.model_validate_json(p.read_text())
        for p in (run_dir / "trials").glob("*/evaluation.json")
    }
    sizes = {n: ev.params.gpus for n, ev in evaluations.items()}
    assert sorted(sizes.values()) == [1, 2], sizes
    two = next(n for n, tp in sizes.items() if tp == 2)
    log = (run_dir / "trials" / f"{two:03d}" / "server.log").read_text()
    assert "tensor_parallel_size=2" in log  # the server was started over two GPUs

    goodput = {sizes[n]: ev.stated_goodput.arrival_rate_per_s for n, ev in evaluations.items()}
    assert all(g > 0 for g in goodput.values()), goodput
    comparison = ParallelismComparison.model_validate_json(
        (run_dir / "parallelism.json").read_text()
    )
    assert comparison.gpu_count == 2
    by_size = {s.tensor_parallel_size: s for s in comparison.sizes}
    for tp in (1, 2):
        assert by_size[tp].source is Source.MEASURED
        assert by_size[tp].goodput_per_server == pytest.approx(goodput[tp])
        assert by_size[tp].host_goodput(2) == pytest.approx(goodput[tp] * (2 // tp))
    per_gpu_best = max((1, 2), key=lambda tp: goodput[tp] / tp)
    assert comparison.best is not None
    assert comparison.best.tensor_parallel_size == per_gpu_best
    assert "parallelism on 2 GPUs" in done.output
    # the trial over two GPUs says what it holds per GPU, the one over one does not
    trial_lines = {int(line.split()[1]): line for line in done.lines if line.startswith("trial ")}
    assert f"({goodput[2] / 2:.2f} per GPU)" in trial_lines[two], trial_lines
    one = next(n for n in sizes if n != two)
    # a trial that met counts itself in the best so far, the first one too
    first = min(trial_lines)
    assert f"(#{first}" in trial_lines[first].split("best", 1)[1], trial_lines
    assert "per GPU)" not in trial_lines[one].split("best")[0], trial_lines

    # the best trial is the best per GPU, and the recommendation deploys its size
    summary = json.loads((run_dir / "summary.json").read_text())
    assert sizes[summary["best_trial"]] == per_gpu_best
    rec = run_dir / "recommendation"
    args = (rec / "vllm-args.txt").read_text()
    assert args.count("--tensor-parallel-size") == 1
    assert f"--tensor-parallel-size {per_gpu_best}" in args
    docs = [d for d in yaml.safe_load_all((rec / "kubernetes.yaml").read_text()) if d]
    (deployment,) = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == per_gpu_best

    html = (run_dir / "report.html").read_text()
    assert "One server over k GPUs, or k servers of one" in html


def test_more_gpus_than_the_host_has_is_one_line_before_any_launch(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = tune_cli(run_dir, "--gpu-count", "2", "--space", "tensor-parallel-size=1,2,4")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "tensor-parallel-size value 4 is more GPUs than the 2 this host has" in line
    assert not run_dir.exists()

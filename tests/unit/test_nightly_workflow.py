"""The nightly GPU workflow: it loads as YAML and has the structure GitHub and the project
expect (a schedule, the GPU runner's labels, the install of the pinned vLLM into an
environment kept between nights, the model fetched first, tune, check and upload steps)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tuner.cli.main import build_parser
from tuner.vllm.versions import VllmVersion

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "nightly-gpu.yml"


@pytest.fixture(scope="module")
def workflow() -> dict[Any, Any]:
    data = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def job(workflow: dict[Any, Any]) -> dict[str, Any]:
    jobs = workflow["jobs"]
    assert len(jobs) == 1
    (only,) = jobs.values()
    assert isinstance(only, dict)
    return only


def steps_running(job: dict[str, Any], text: str) -> list[dict[str, Any]]:
    return [s for s in job["steps"] if text in s.get("run", "")]


def test_triggers_nightly_and_by_hand(workflow: dict[Any, Any]) -> None:
    # YAML 1.1 reads the bare key `on` as true; GitHub reads it as "on".
    triggers = workflow.get("on", workflow.get(True))
    assert isinstance(triggers, dict)
    (schedule,) = triggers["schedule"]
    fields = schedule["cron"].split()
    assert len(fields) == 5 and fields[2:] == ["*", "*", "*"]  # every day
    assert "workflow_dispatch" in triggers
    assert triggers["workflow_dispatch"]["inputs"]["update_baseline"]["type"] == "boolean"


def test_runs_on_a_self_hosted_gpu_runner_one_at_a_time(
    workflow: dict[Any, Any], job: dict[str, Any]
) -> None:
    assert set(job["runs-on"]) == {"self-hosted", "gpu"}
    assert isinstance(job["timeout-minutes"], int)
    assert workflow["concurrency"]["cancel-in-progress"] is False
    assert workflow["permissions"] == {"contents": "read"}


def test_every_step_is_well_formed(job: dict[str, Any]) -> None:
    for step in job["steps"]:
        assert "name" in step
        assert ("uses" in step) != ("run" in step), step["name"]
    assert job["steps"][0]["uses"].startswith("actions/checkout@")


def pinned_vllm() -> str:
    """The one release pyproject.toml's `vllm` extra pins."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    (requirement,) = pyproject["project"]["optional-dependencies"]["vllm"]
    match = re.fullmatch(r"vllm==(\d+\.\d+\.\d+)", requirement)
    assert match is not None, f"the vllm extra pins no single release: {requirement!r}"
    return match.group(1)


def test_the_vllm_extra_pins_the_newest_release_the_tuner_emulates() -> None:
    assert VllmVersion.parse(pinned_vllm()) == VllmVersion.current()


def test_make_vllm_installs_the_pinned_extra_or_the_release_asked_for() -> None:
    def recipe(*args: str) -> str:
        done = subprocess.run(
            ["make", "-n", "-C", str(REPO), "vllm", *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        (install,) = [line for line in done.stdout.splitlines() if "uv pip install" in line and "vllm" in line]  # fmt: skip
        return install

    default = recipe()
    assert "--python .venv/bin/python" in default and "-e '.[vllm]'" in default
    assert "'vllm==0.32.0'" in recipe("VLLM_VERSION=0.32.0")


def test_installs_the_pinned_vllm_with_make_and_keeps_the_environment(job: dict[str, Any]) -> None:
    """Not the newest vLLM every night: the repository variable's release (default the
    pin), into a .venv kept between nights (the checkout would wipe it)."""
    assert job["env"]["VLLM_VERSION"] == f"${{{{ vars.VLLM_VERSION || '{pinned_vllm()}' }}}}"
    (install,) = steps_running(job, "make vllm")
    assert 'make vllm VLLM_VERSION="$VLLM_VERSION"' in install["run"]
    assert "pip install" not in install["run"]
    assert "GITHUB_PATH" in install["run"]  # `tuner check` on PATH
    checkout = job["steps"][0]
    assert checkout["with"]["clean"] is False
    (clean,) = steps_running(job, "git clean")
    assert "-e .venv" in clean["run"].split("git clean", 1)[1].replace("  ", " ")
    assert job["steps"].index(clean) < job["steps"].index(install)


def test_fetches_the_model_first_and_fails_in_one_line_without_access(job: dict[str, Any]) -> None:
    (fetch,) = steps_running(job, "tuner fetch")
    (tune,) = steps_running(job, "make tune")
    assert job["steps"].index(fetch) < job["steps"].index(tune)
    assert 'tuner fetch --model "$MODEL"' in fetch["run"]
    assert "::error::" in fetch["run"] and "tail -n 1" in fetch["run"] and "exit 1" in fetch["run"]
    assert "HF_TOKEN" in job["env"] and "secrets.HF_TOKEN" in job["env"]["HF_TOKEN"]
    parsed = build_parser().parse_args(["fetch", "--model", "meta-llama/Llama-3.1-8B-Instruct"])
    assert parsed.model == "meta-llama/Llama-3.1-8B-Instruct"


def test_tune_is_bounded_by_a_variable(job: dict[str, Any]) -> None:
    (tune,) = steps_running(job, "make tune")
    assert "vars.TUNE_BUDGET_MIN" in job["env"]["BUDGET_MIN"]
    args = re.search(r'ARGS="([^"]*)"', tune["run"])
    assert args is not None
    assert "--backend vllm" in args.group(1)  # never a silent fall-back to the simulator
    assert "--repeats $REPEATS" in args.group(1)
    assert "--run-dir $RUN_DIR" in args.group(1)


def test_the_make_variables_are_the_tune_targets(job: dict[str, Any]) -> None:
    (tune,) = steps_running(job, "make tune")
    passed = set(re.findall(r"\b([A-Z_]+)=", tune["run"]))
    assert {"MODEL", "GPU", "WORKLOAD", "TRIALS", "BUDGET_MIN", "ARGS"} <= passed
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^tune:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe is not None
    for var in passed:
        assert f"$({var})" in recipe.group(1), f"make tune does not use {var}"


def test_the_tune_flags_exist(job: dict[str, Any]) -> None:
    (tune,) = steps_running(job, "make tune")
    args = re.search(r'ARGS="([^"]*)"', tune["run"])
    assert args is not None
    values = {"$REPEATS": "3", "$RUN_DIR": "runs/nightly"}
    argv = [values.get(a, a) for a in args.group(1).split()]
    parsed = build_parser().parse_args(["tune", *argv])
    assert (parsed.backend, parsed.repeats, str(parsed.run_dir)) == ("vllm", 3, "runs/nightly")


def test_gates_with_tuner_check_against_the_committed_baseline(job: dict[str, Any]) -> None:
    (gate,) = steps_running(job, "tuner check")
    assert 'tuner check "$RUN_DIR" --baseline "$BASELINE"' in gate["run"]
    assert "--update-baseline" in gate["run"]  # the first run writes one to commit
    assert "if" not in gate  # a regression fails the job
    assert job["env"]["BASELINE"].endswith("'benchmarks/baselines/nightly-gpu.json' }}")
    command = ["check", "runs/nightly", "--baseline", "b.json", "--tolerance", "5"]
    assert build_parser().parse_args(command).tolerance == 5.0


def test_uploads_the_report_and_recommendation_whatever_happened(job: dict[str, Any]) -> None:
    (upload,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
    assert upload["if"] == "always()"
    paths = upload["with"]["path"].split()
    run_dir = job["env"]["RUN_DIR"]
    assert f"{run_dir}/report.html" in paths
    assert f"{run_dir}/recommendation/" in paths
    summary = [s for s in job["steps"] if "GITHUB_STEP_SUMMARY" in s.get("run", "")]
    assert any(s.get("if") == "always()" for s in summary)

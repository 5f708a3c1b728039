"""What a run imports is what a plain install (no dev extra) provides.

Two checks: every import written in the shipped packages (``tuner``, ``workloads``,
``reports``) belongs to a runtime dependency or one of its own dependencies; and the
whole job (a tune to five complete trials, the OOM edge, the recommendation, the report
with its parameter importances, then ``tuner report`` again) runs with the dev extra's
packages hidden from it and every process it starts, and none of them even tries to
import one. The second catches what a dependency imports on the tuner's behalf (Optuna's
fANOVA imports scikit-learn), which no reading of the tuner's own files can.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.integration.tune_run import SMALL_TUNE_ARGS

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("tuner", "workloads", "reports")
RUNTIME_ONLY_SITE = REPO / "tests" / "fixtures" / "runtime_only"
# Imports that only a named extra provides; the code imports them only on that path.
EXTRA_IMPORTS = {"vllm": "vllm", "psycopg": "postgres"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _project() -> dict[str, object]:
    project: dict[str, object] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project


def runtime_closure() -> frozenset[str]:
    """The installed distributions a plain `pip install` of the project brings."""
    project = _project()
    todo = [Requirement(r) for r in project["dependencies"]]  # type: ignore[attr-defined]
    seen = {_norm(str(project["name"]))}
    while todo:
        req = todo.pop()
        name = _norm(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here (a platform-specific dependency)
        for line in requires:
            sub = Requirement(line)
            wanted = ["", *sorted(req.extras)]
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in wanted):
                todo.append(sub)
    return frozenset(seen)


def _top_level_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif (  # importlib.import_module("name"), the lazy form
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value.split(".")[0])
    return names


def test_every_import_of_the_shipped_code_is_a_runtime_dependency() -> None:
    closure = runtime_closure()
    owners = importlib.metadata.packages_distributions()
    missing: list[str] = []
    for package in SHIPPED:
        for path in sorted((REPO / package).rglob("*.py")):
            for name in sorted(_top_level_imports(path)):
                if name in sys.stdlib_module_names or name in SHIPPED or name in EXTRA_IMPORTS:
                    continue
                dists = [_norm(d) for d in owners.get(name, [])]
                if not dists:
                    missing.append(f"{path.relative_to(REPO)}: {name} (not installed at all)")
                elif not any(d in closure for d in dists):
                    missing.append(f"{path.relative_to(REPO)}: {name} (from {', '.join(dists)})")
    assert not missing, "imports a plain install does not provide:\n" + "\n".join(missing)


def test_the_runtime_only_site_hides_a_dev_package(tmp_path: Path) -> None:
    """The blocker itself: a dev-extra package installed here fails to import under it."""
    log = tmp_path / "blocked.txt"
    done = subprocess.run(
        [sys.executable, "-c", "import selenium"],
        env=_runtime_only_env(log),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "runtime-only install" in done.stderr
    assert log.read_text().startswith("selenium ")


def _runtime_only_env(log: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(RUNTIME_ONLY_SITE), str(REPO)])
    env["TUNER_RUNTIME_ONLY_DISTS"] = ",".join(sorted(runtime_closure()))
    env["TUNER_RUNTIME_ONLY_LOG"] = str(log)
    return env


def _tuner(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_whole_job_to_five_trials_on_a_runtime_only_install(tmp_path: Path) -> None:
    blocked = tmp_path / "blocked-imports.txt"
    env = _runtime_only_env(blocked)
    trials = ["--trials", "5", "--budget-min", "12"]
    args = list(SMALL_TUNE_ARGS)
    at = args.index("--trials")
    del args[at : at + 4]  # --trials 3 --budget-min 8
    run = _tuner(["tune", *args, *trials, "--run-dir", "runs/five"], env, tmp_path)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "Traceback" not in out, out
    run_dir = tmp_path / "runs" / "five"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (run_dir / "report.html").is_file(), out
    assert summary["trials"] >= 5, summary
    html = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "fANOVA over" in html, "the report computed no parameter importances"

    again = _tuner(["report", "runs/five"], env, tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Traceback" not in again.stderr, again.stderr
    assert "fANOVA over" in (run_dir / "report.html").read_text(encoding="utf-8")

    attempts = blocked.read_text() if blocked.exists() else ""
    unexpected = [line for line in attempts.splitlines() if line.split()[0] not in EXTRA_IMPORTS]
    assert not unexpected, "the job tried to import what a plain install lacks:\n" + attempts

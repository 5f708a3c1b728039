"""What a run imports is what a plain install (no dev extra) provides.

Three checks: every import written in the shipped packages (``tuner``, ``workloads``,
``reports``) belongs to a runtime dependency or one of its own dependencies; the one
real-time tune (``real_tuned_run``: sim-serve processes, Locust, the report) ran with the
dev extra's packages hidden from it and from every process it started (tests/runtime_only.py),
and none of them even tried to import one; and the whole job to five complete trials (the
twin's screen, the OOM edge, the recommendation, the report with its parameter importances,
then ``tuner report`` again), on the twin's virtual clock in a process of its own, likewise.
The last two catch what a dependency imports on the tuner's behalf (Optuna's fANOVA imports
scikit-learn), which no reading of the tuner's own files can.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime_only import (
    EXTRA_IMPORTS,
    REPO,
    normalized,
    runtime_closure,
    runtime_only_env,
    started_under_blocker,
    unexpected_imports,
)

SHIPPED = ("tuner", "workloads", "reports")


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
                dists = [normalized(d) for d in owners.get(name, [])]
                if not dists:
                    missing.append(f"{path.relative_to(REPO)}: {name} (not installed at all)")
                elif not any(d in closure for d in dists):
                    missing.append(f"{path.relative_to(REPO)}: {name} (from {', '.join(dists)})")
    assert not missing, "imports a plain install does not provide:\n" + "\n".join(missing)


def test_the_runtime_only_site_hides_a_dev_package(tmp_path: Path) -> None:
    """The blocker itself: a dev-extra package installed here fails to import under it,
    and the process says it ran under it."""
    done = subprocess.run(
        [sys.executable, "-c", "import selenium"],
        env=runtime_only_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "runtime-only install" in done.stderr
    assert unexpected_imports(tmp_path)[0].startswith("selenium ")
    (started,) = started_under_blocker(tmp_path)
    assert "import selenium" in started


def _tuner(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_the_real_time_tune_and_its_processes_import_only_runtime_packages(
    real_tuned_run: Path,
) -> None:
    """``real_tuned_run`` (tests/integration/conftest.py) ran under the blocker: the tune,
    its simulated servers and its Locust processes, none of which tried a dev import."""
    logs = real_tuned_run.parent
    started = started_under_blocker(logs)
    assert any(" tuner.cli tune " in line for line in started), started
    assert any(" sim-serve " in line for line in started), started
    assert any("locust" in line for line in started), started
    unexpected = unexpected_imports(logs)
    assert not unexpected, "the tune tried to import what a plain install lacks:\n" + "\n".join(
        unexpected
    )


# The whole job on the twin's virtual clock (tests/virtual.py), in a process of its own
# under the blocker: five trials, the screen's pool, the edge, the confirmations, the report.
VIRTUAL_JOB = """
import sys
from pathlib import Path
from tests.virtual import virtual_tune
done = virtual_tune(Path(sys.argv[1]), "--trials", "5", "--budget-min", "12", twin_search=True)
print(done.output)
"""


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_whole_job_to_five_trials_on_a_runtime_only_install(tmp_path: Path) -> None:
    env = runtime_only_env(tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", VIRTUAL_JOB, "runs/five"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
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

    assert len(started_under_blocker(tmp_path)) >= 2  # the job and `tuner report`
    unexpected = unexpected_imports(tmp_path)
    assert not unexpected, "the job tried to import what a plain install lacks:\n" + "\n".join(
        unexpected
    )

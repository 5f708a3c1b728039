"""A process environment that behaves as an install without the dev extra.

``tests/fixtures/runtime_only/sitecustomize.py`` on ``PYTHONPATH``: in the process and every
process it starts, importing a module that only the dev extra (or another distribution a
plain ``pip install`` does not bring) provides fails, and the attempt is logged. Used by
the whole job on the twin's virtual clock (tests/integration/test_runtime_install.py) and by
the one real-time tune (``real_tuned_run``), whose servers and Locust processes it covers.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
RUNTIME_ONLY_SITE = REPO / "tests" / "fixtures" / "runtime_only"
# Imports that only a named extra provides; the code imports them only on that path.
EXTRA_IMPORTS = {"vllm": "vllm", "psycopg": "postgres"}
# Optional imports a runtime dependency tries and goes on without: urllib3, under Locust's
# requests, tries PySocks for SOCKS proxies.
LIBRARY_OPTIONAL_IMPORTS = frozenset({"socks"})
EXPLAINED_IMPORTS = frozenset(EXTRA_IMPORTS) | LIBRARY_OPTIONAL_IMPORTS
BLOCKED_LOG = "blocked-imports.txt"  # beside a run directory: what was refused
STARTED_LOG = "runtime-only-processes.txt"  # beside it: every process started under the blocker


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure() -> frozenset[str]:
    """The installed distributions a plain `pip install` of the project brings."""
    project: dict[str, object] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in project["dependencies"]]  # type: ignore[attr-defined]
    seen = {normalized(str(project["name"]))}
    while todo:
        req = todo.pop()
        name = normalized(req.name)
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


def runtime_only_env(logs_dir: Path) -> dict[str, str]:
    """This process's environment with the blocker on; its logs (``BLOCKED_LOG``,
    ``STARTED_LOG``) go to ``logs_dir``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(RUNTIME_ONLY_SITE), str(REPO)])
    env["RUNTIME_ONLY_DISTS"] = ",".join(sorted(runtime_closure()))
    env["RUNTIME_ONLY_LOG"] = str(logs_dir / BLOCKED_LOG)
    env["RUNTIME_ONLY_STARTED"] = str(logs_dir / STARTED_LOG)
    return env


def unexpected_imports(logs_dir: Path) -> list[str]:
    """The refused imports logged in ``logs_dir`` that no extra, and no dependency's own
    optional import, explains."""
    log = logs_dir / BLOCKED_LOG
    attempts = log.read_text().splitlines() if log.exists() else []
    return [line for line in attempts if line.split()[0] not in EXPLAINED_IMPORTS]


def started_under_blocker(logs_dir: Path) -> list[str]:
    """The command lines of the processes that started under the blocker."""
    log = logs_dir / STARTED_LOG
    return log.read_text().splitlines() if log.exists() else []

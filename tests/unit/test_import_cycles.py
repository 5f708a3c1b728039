"""No import cycle among the project's modules (tuner/, reports/, workloads/).

Every ``import`` counts, those inside functions too (a deferred import hides a cycle from
import time, not from the design): the modules are read with ``ast``, none is imported.
An import of a module's name reaches that module (``from tuner.cli import tune`` reaches
``tuner.cli.tune``); of any other name, the module it is imported from.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("tuner", "reports", "workloads")


def module_names(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``, by its dotted name (a package by its
    own name, for its ``__init__.py``)."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _imported(node: ast.AST, name: str, is_package: bool, modules: dict[str, Path]) -> set[str]:
    """The project's modules that one import statement of module ``name`` reaches."""
    found: set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name in modules:
                found.add(alias.name)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        for alias in node.names:
            if f"{source}.{alias.name}" in modules:
                found.add(f"{source}.{alias.name}")
            elif source in modules:
                found.add(source)
    return found


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Which of the project's modules each module imports, anywhere in its body."""
    modules = module_names(root, packages)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(tree):
            edges |= _imported(node, name, is_package, modules)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each sorted; the import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_project_has_no_import_cycle() -> None:
    graph = import_graph(ROOT, PACKAGES)
    assert "tuner.cli.main" in graph and "reports.html" in graph and "workloads.spec" in graph
    assert cycles(graph) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    """The cycle this test was written against: ``tuner/cli/k8s.py`` checked the workers'
    tune flags with ``tuner.cli.main.build_parser``, imported inside the function because
    ``main`` imports ``k8s``."""
    _write(
        tmp_path,
        {
            "tuner/__init__.py": "",
            "tuner/cli/__init__.py": "",
            "tuner/cli/tune.py": "STORAGE_ENV = 'TUNER_STORAGE'\n",
            "tuner/cli/main.py": "from tuner.cli import k8s, tune\n",
            "tuner/cli/k8s.py": (
                "from tuner.cli.tune import STORAGE_ENV\n\n"
                "def _tune_args(args):\n"
                "    from tuner.cli.main import build_parser  # here: main imports this one\n"
                "    return build_parser()\n"
            ),
        },
    )
    graph = import_graph(tmp_path, ("tuner",))
    assert graph["tuner.cli.main"] == {"tuner.cli.k8s", "tuner.cli.tune"}
    assert cycles(graph) == [["tuner.cli.k8s", "tuner.cli.main"]]


def test_relative_imports_and_longer_cycles_are_found(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "reports/__init__.py": "",
            "reports/a.py": "from .b import x\n",
            "reports/b.py": "from reports import c\nx = 1\n",
            "reports/c.py": "import reports.a\n",
            "reports/d.py": "from reports.a import y\n",
        },
    )
    graph = import_graph(tmp_path, ("reports",))
    assert cycles(graph) == [["reports.a", "reports.b", "reports.c"]]


def test_a_one_way_graph_has_no_cycle() -> None:
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []

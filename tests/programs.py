"""What the standalone programs the product renders (warm-up, drain) import."""

from __future__ import annotations

import ast


def top_level_imports(tree: ast.AST) -> set[str]:
    """The top-level package of every ``import`` and ``from ... import`` in ``tree``."""
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    return imported

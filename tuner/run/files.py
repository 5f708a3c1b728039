"""Open and parse one of a run's JSON files: the only code that reads one (tuner.run).

Imports nothing of the tuning loop, so the loop (``--resume``) and every reader of a
finished run use it alike; the error is one ``RunFileError`` naming the file and why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from tuner.errors import RunFileError

M = TypeVar("M", bound=BaseModel)


def first_error(exc: ValidationError) -> str:
    """A validation error's first problem in one line: ``loc: msg``."""
    error = exc.errors()[0]
    loc = ".".join(str(part) for part in error["loc"]) or "the document"
    return f"{loc}: {error['msg']}"


def read_document(path: Path) -> dict[str, Any]:
    """A run file as the JSON object it holds (older runs' fields untouched)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RunFileError(path, f"cannot be read ({exc.strerror})", exc) from exc
    except ValueError as exc:
        raise RunFileError(path, f"is not JSON ({exc})", exc) from exc
    if not isinstance(doc, dict):
        raise RunFileError(path, "is not a JSON object")
    return doc


def read_model(path: Path, model: type[M]) -> M:
    """A run file validated as ``model``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RunFileError(path, f"cannot be read ({exc.strerror})", exc) from exc
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        raise RunFileError(path, first_error(exc), exc) from exc


def read_optional(path: Path, model: type[M]) -> M | None:
    """``read_model``, None when the file is not there."""
    return read_model(path, model) if path.is_file() else None

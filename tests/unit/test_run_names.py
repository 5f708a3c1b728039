"""Nothing outside tuner/run spells a run file's name: every reader and writer reaches a
run's files through ``tuner.run`` (``RunLayout``'s paths, ``RunReader``), so a file renamed
or added is renamed in one place. Names in prose (a message saying "tune.json is
missing") are fine; a string that is the name, or a path ending in it, is not."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

from tuner.run import layout

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("tuner", "reports")
OWNER = ROOT / "tuner" / "run"

RUN_FILE_NAMES = {
    value
    for name, value in vars(layout).items()
    if name.isupper() and isinstance(value, str) and "." in value
}


def spelled_names(source: str) -> list[tuple[int, str]]:
    """(line, literal) of each string literal that is a run file's name or a path ending in
    one (f-strings included), not prose that mentions one."""
    found: list[tuple[int, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.STRING:
            continue
        text = tok.string.lstrip("rbfuRBFU").strip("'\"")
        for name in RUN_FILE_NAMES:
            # a path: the name itself, or a path ending in it (no spaces: not prose)
            if text == name or (text.endswith("/" + name) and not any(c.isspace() for c in text)):
                found.append((tok.start[0], tok.string))
    return found


def test_the_names_are_the_layouts() -> None:
    assert {"tune.json", "summary.json", "evaluation.json", "edge.json"} <= RUN_FILE_NAMES
    assert {"recommendation.json", "budget.json", "study.db", "calibration.json"} <= RUN_FILE_NAMES


def test_no_run_file_is_opened_by_name_outside_tuner_run() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {literal}"
        for top in SCANNED
        for path in sorted((ROOT / top).rglob("*.py"))
        if OWNER not in path.parents
        for line, literal in spelled_names(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], "use tuner.run (RunLayout, RunReader) instead:\n" + "\n".join(offenders)


def test_the_scan_finds_a_name_spelled_elsewhere() -> None:
    source = (
        'path = run_dir / "tune.json"\n'
        'other = f"{run_dir}/budget.json"\n'
        'said = "tune.json is missing"\n'
        'helped = "default: RUN_DIR/study.db"\n'
        'rel = "recommendation/recommendation.json"\n'
    )
    assert [line for line, _ in spelled_names(source)] == [1, 2, 5]

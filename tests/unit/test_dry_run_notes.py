"""``tuner tune --dry-run`` says the resolve's notes as the tune does (issue 32, item 14):
the simulated backend, the model fetched from the hub, a chat template missing, ..."""

from __future__ import annotations

from pathlib import Path

from tuner.search.config import load_config
from tuner.search.context import resolve
from tuner.search.dry_run import dry_run


def test_a_dry_run_says_every_note_of_the_resolve(tmp_path: Path) -> None:
    config = load_config(
        None,
        {
            "model": "llama-3.1-8b", "backend": "sim", "gpu": "H100-80GB", "trials": 2,
            "twin_search": False, "dry_run": True, "run_dir": tmp_path / "run",
        },
    )  # fmt: skip
    notes = resolve(config).notes
    assert any(n.startswith("SIMULATED backend (--backend sim)") for n in notes)
    lines: list[str] = []
    dry_run(config, lines.append)
    for note in notes:
        assert note in lines
    # before the plan, as the tune says them before it tunes
    assert lines.index(notes[-1]) < next(i for i, s in enumerate(lines) if s.startswith("dry run:"))

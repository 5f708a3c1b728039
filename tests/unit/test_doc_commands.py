"""The commands the README and the getting-started page print still work.

Every command in a fenced ``bash`` block of README.md and docs/getting-started.md is
checked against the code, so a renamed flag, subcommand or make target fails here
instead of on a new engineer's terminal:

* ``tuner ...`` (also ``.venv/bin/tuner`` and ``python -m tuner``): parsed by the real
  parser in-process (``tuner.cli.main.build_parser``), which rejects an unknown
  subcommand, flag or choice; each subcommand they use also answers ``--help`` through
  the real entry point in a subprocess, ``tuner plan`` in full (it launches nothing) and ``tuner tune
  --dry-run`` with ``--no-twin-search`` (the twin's screen of the whole space takes
  minutes on a small machine);
* ``make TARGET VAR=...``: ``make -n`` of the repository's Makefile exits 0, and the
  ``tuner tune`` line that ``make tune`` would run is parsed too (``ARGS`` included).

Placeholders such as ``<study>`` are replaced by a valid value (``PLACEHOLDERS``); one
without a value fails the test, so a page cannot print a command this file cannot check.

Also: README.md stays at most 250 lines, the relative links it makes point at files that
exist, and every page under docs/ is in mkdocs.yml's nav (``make docs`` fails on that
too: ``validation.omitted_files: warn`` under ``--strict``).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tuner.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/getting-started.md")
README_MAX_LINES = 250

# What a placeholder in a printed command stands for.
PLACEHOLDERS = {
    "<study>": "llama-3.1-8b-h100-80gb-chat",
    "<model>": "llama-3.1-8b",
    "<workload>": "chat",
}

TUNER_PROGRAMS = {"tuner", ".venv/bin/tuner"}
PYTHON_PROGRAMS = {"python", "python3", ".venv/bin/python"}
SEPARATORS = {"|", "||", "&&", ";"}
FENCE = re.compile(r"^```(\w*)\s*$")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class DocCommand:
    page: str
    line_no: int
    kind: str  # "tuner" or "make"
    argv: tuple[str, ...]  # without the program: tuner's or make's arguments

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line_no}:{self.kind} {' '.join(self.argv)}"[:120]


def shell_blocks(text: str) -> list[tuple[int, list[str]]]:
    """The fenced bash/sh/shell/console blocks of a page: (first line number, lines)."""
    blocks: list[tuple[int, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        lang, start, body = match.group(1), i + 2, []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        if lang in {"bash", "sh", "shell", "console"}:
            blocks.append((start, body))
    return blocks


def substitute(line: str) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        line = line.replace(placeholder, value)
    left = re.findall(r"<[a-z_-]+>", line)
    assert not left, f"placeholder(s) {left} have no value in PLACEHOLDERS: {line!r}"
    return line


def commands_of_line(page: str, line_no: int, line: str) -> list[DocCommand]:
    tokens = shlex.split(substitute(line), comments=True)
    found: list[DocCommand] = []
    segment: list[str] = []
    for token in [*tokens, ";"]:
        if token not in SEPARATORS:
            segment.append(token)
            continue
        while segment and (segment[0] == "export" or ENV_ASSIGNMENT.match(segment[0])):
            segment.pop(0)
        if segment:
            program, args = segment[0], segment[1:]
            if program in TUNER_PROGRAMS:
                found.append(DocCommand(page, line_no, "tuner", tuple(args)))
            elif (
                program in PYTHON_PROGRAMS
                and args[:1] == ["-m"]
                and args[1].split(".")[0] == "tuner"
            ):
                found.append(DocCommand(page, line_no, "tuner", tuple(args[2:])))
            elif program == "make":
                found.append(DocCommand(page, line_no, "make", tuple(args)))
        segment = []
    return found


def page_commands(page: str, text: str) -> list[DocCommand]:
    found: list[DocCommand] = []
    for start, body in shell_blocks(text):
        logical, first = "", start
        for offset, raw in enumerate(body):
            if not logical:
                first = start + offset
            if raw.rstrip().endswith("\\"):
                logical += raw.rstrip()[:-1] + " "
                continue
            logical += raw
            if logical.strip():
                found.extend(commands_of_line(page, first, logical))
            logical = ""
    return found


def doc_commands() -> list[DocCommand]:
    return [c for page in PAGES for c in page_commands(page, (ROOT / page).read_text())]


COMMANDS = doc_commands()
TUNER_COMMANDS = [c for c in COMMANDS if c.kind == "tuner"]
MAKE_COMMANDS = [c for c in COMMANDS if c.kind == "make"]


def parse_tuner(argv: tuple[str, ...] | list[str]) -> None:
    """Parse as `tuner` would; an argparse error (unknown flag, subcommand, choice) fails."""
    try:
        build_parser().parse_args(list(argv))
    except SystemExit as exit_:
        if "--help" in argv or "-h" in argv:
            assert exit_.code == 0
            return
        raise AssertionError(f"`tuner {' '.join(argv)}` is rejected by the parser") from exit_


def test_the_pages_print_commands() -> None:
    """The extraction finds what the pages print (an empty list would pass everything)."""
    subcommands = {c.argv[0] for c in TUNER_COMMANDS if c.argv}
    assert {"tune", "capacity", "report", "check", "fetch"} <= subcommands
    assert {"tune", "test", "lint", "docs", "bench", "vllm"} <= {c.argv[0] for c in MAKE_COMMANDS}


@pytest.mark.parametrize("command", TUNER_COMMANDS, ids=[c.id for c in TUNER_COMMANDS])
def test_tuner_command_parses(command: DocCommand, capsys: pytest.CaptureFixture[str]) -> None:
    parse_tuner(command.argv)


def test_a_misspelt_flag_fails_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    """The check has teeth: what a typo in a page would look like is rejected."""
    for page in PAGES:
        text = (ROOT / page).read_text().replace("--budget-min", "--budget-mins")
        text = text.replace("--dry-run", "--dryrun").replace("--tolerance", "--tolerence")
        bad = [c for c in page_commands(page, text) if c.kind == "tuner"]
        typos = [c for c in bad if {"--budget-mins", "--dryrun", "--tolerence"} & set(c.argv)]
        assert typos, f"{page}: no tuner command to misspell"
        for command in typos:
            with pytest.raises(AssertionError, match="rejected by the parser"):
                parse_tuner(command.argv)
    with pytest.raises(AssertionError, match="rejected by the parser"):
        parse_tuner(["capacitee", "--model", "llama-3.1-8b", "--peak", "4"])


def run_tuner(args: list[str], cwd: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


SUBCOMMANDS = sorted(
    {c.argv[0] for c in TUNER_COMMANDS if c.argv and not c.argv[0].startswith("-")}
)
HELP_ALL = """
import contextlib, io, sys
from tuner.cli.main import main
for name in sys.argv[1:]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main([name, "--help"])
        except SystemExit as exit_:
            assert exit_.code == 0, (name, exit_.code)
    assert out.getvalue().startswith("usage: tuner " + name), (name, out.getvalue()[:200])
    print("ok", name)
"""


def test_subcommand_help_runs(tmp_path: Path) -> None:
    """The entry point answers --help for every subcommand the pages use (one interpreter)."""
    done = subprocess.run(
        [sys.executable, "-c", HELP_ALL, *SUBCOMMANDS],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [w for name in SUBCOMMANDS for w in ("ok", name)]


def runnable(command: DocCommand) -> list[str] | None:
    """The printed commands cheap enough to run whole: plan, and tune's dry run."""
    argv = list(command.argv)
    if argv[:1] == ["plan"]:
        return argv
    if argv[:1] == ["tune"] and "--dry-run" in argv and "--resume" not in argv:
        return [*argv, "--no-twin-search"]
    return None


RUNNABLE = [(c, argv) for c in TUNER_COMMANDS if (argv := runnable(c)) is not None]


@pytest.mark.parametrize(("command", "argv"), RUNNABLE, ids=[c.id for c, _ in RUNNABLE])
def test_command_runs(command: DocCommand, argv: list[str], tmp_path: Path) -> None:
    done = run_tuner(argv, tmp_path, 120)
    assert done.returncode == 0, (
        f"`tuner {' '.join(argv)}` exited {done.returncode}: {done.stderr[-2000:]}"
    )
    assert not any(tmp_path.iterdir()), "a plan or a dry run wrote files"


def make_dry_run(args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-n", "-C", str(ROOT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("command", MAKE_COMMANDS, ids=[c.id for c in MAKE_COMMANDS])
def test_make_command(command: DocCommand) -> None:
    done = make_dry_run(command.argv)
    assert done.returncode == 0, f"`make {' '.join(command.argv)}`: {done.stderr}"
    if command.argv[:1] == ("tune",):
        script = done.stdout.replace("\\\n", " ")
        lines = [line for line in script.splitlines() if re.search(r"/tuner tune( |$)", line)]
        assert lines, f"`make {' '.join(command.argv)}` runs no `tuner tune`:\n{done.stdout}"
        argv = shlex.split(lines[-1])
        parse_tuner(argv[argv.index("tune") :])


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_a_misspelt_make_target_or_args_fails() -> None:
    assert make_dry_run(("tunee",)).returncode != 0
    script = make_dry_run(("tune", "ARGS=--dryrun")).stdout.replace("\\\n", " ")
    argv = shlex.split([line for line in script.splitlines() if "/tuner tune" in line][-1])
    with pytest.raises(AssertionError, match="rejected by the parser"):
        parse_tuner(argv[argv.index("tune") :])


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; the rest belongs in docs/"
    )


def test_readme_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert local, "the README links into docs/"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def nav_pages(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [page for item in node for page in nav_pages(item)]
    if isinstance(node, dict):
        return [page for value in node.values() for page in nav_pages(value)]
    return []


def test_every_docs_page_is_in_the_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    in_nav = set(nav_pages(config["nav"]))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert pages - in_nav == set(), "pages missing from mkdocs.yml's nav"
    assert in_nav - pages == set(), "nav entries without a page"

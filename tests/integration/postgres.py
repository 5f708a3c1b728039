"""A throwaway PostgreSQL server for tests (pytest marker ``postgres``).

``postgres_url`` runs ``initdb`` into a fresh directory under the system temp dir,
starts the server with ``pg_ctl`` on a free loopback port (its unix socket in the
same directory, so it never touches /var/run/postgresql), creates a database and
yields its SQLAlchemy URL; afterwards the server is stopped and the directory
removed. TCP connections need the password (scram-sha-256), so the URL carries one,
as a real deployment's does.

PostgreSQL refuses to run as root: as root the server runs as the ``postgres`` OS
user (``runuser``, else ``su``), which owns the directory. The binaries are taken
from PATH or Debian's ``/usr/lib/postgresql/<version>/bin``
(``tools/install_postgres.sh`` installs them); only their absence skips the test.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

USER = "tuner"
PASSWORD = "pg-test-S3cret"  # tests assert this never reaches a file or a command line
DATABASE = "tuner_test"
OS_USER = "postgres"


def bin_dir() -> Path | None:
    """Where initdb and pg_ctl are: PATH first, else Debian's newest versioned directory."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    for initdb in reversed(candidates):
        if (initdb.parent / "pg_ctl").exists():
            return initdb.parent
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _Runner:
    """Runs the server's commands as the user who may own the cluster."""

    def __init__(self, bins: Path) -> None:
        self.bins = bins
        self.as_root = os.geteuid() == 0
        self.owner: pwd.struct_passwd | None = None
        if self.as_root:
            try:
                self.owner = pwd.getpwnam(OS_USER)
            except KeyError:
                pytest.fail(
                    f"running as root and there is no {OS_USER!r} OS user to run PostgreSQL as "
                    "(Debian's postgresql package creates it: tools/install_postgres.sh)"
                )

    def chown(self, path: Path) -> None:
        if self.owner is not None:
            os.chown(path, self.owner.pw_uid, self.owner.pw_gid)

    def run(self, tool: str, *args: str, timeout_s: float = 120) -> None:
        cmd = [str(self.bins / tool), *args]
        if self.owner is not None:
            if shutil.which("runuser"):
                cmd = ["runuser", "-u", OS_USER, "--", *cmd]
            else:
                cmd = ["su", OS_USER, "-s", "/bin/sh", "-c", shlex.join(cmd)]
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, cwd="/", check=False
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{tool} failed ({done.returncode}): {(done.stdout + done.stderr).strip()[-2000:]}"
            )


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """Start a throwaway server with one database; yield its URL; stop and remove it."""
    bins = bin_dir()
    if bins is None:
        pytest.skip(
            "PostgreSQL is not installed (no initdb/pg_ctl on PATH or in "
            "/usr/lib/postgresql/*/bin): run tools/install_postgres.sh"
        )
    runner = _Runner(bins)
    base = Path(tempfile.mkdtemp(prefix="tuner-pg-"))  # not under pytest's root-only tmp
    started = False
    try:
        runner.chown(base)
        data = base / "data"
        pwfile = base / "pw"
        pwfile.write_text(PASSWORD + "\n", encoding="utf-8")
        runner.chown(pwfile)
        runner.run(
            "initdb", "-D", str(data), "-U", USER, f"--pwfile={pwfile}", "-E", "UTF8",
            "--locale=C", "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync",
        )  # fmt: skip
        pwfile.unlink()
        for attempt in range(3):  # a free port can be taken between choosing and binding
            port = _free_port()
            options = (
                f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off"
            )
            try:
                runner.run(
                    "pg_ctl", "-D", str(data), "-l", str(base / "server.log"), "-o", options,
                    "-w", "-t", "60", "start",
                )  # fmt: skip
            except RuntimeError:
                if attempt == 2:
                    log = base / "server.log"
                    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                    raise RuntimeError(f"PostgreSQL did not start; its log:\n{tail}") from None
                continue
            started = True
            break
        runner.run("createdb", "-h", str(base), "-p", str(port), "-U", USER, DATABASE)
        yield f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{port}/{DATABASE}"
    finally:
        if started:
            with contextlib.suppress(Exception):
                runner.run("pg_ctl", "-D", str(base / "data"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """The URL of an empty database on a throwaway PostgreSQL server (see the module)."""
    with postgres_server() as url:
        yield url

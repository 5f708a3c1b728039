"""Child processes that never outlive the harness.

Every server and load generator the harness starts runs in its own process group
and is recorded in ``<run dir>/children.json``. Three layers make sure none is
left behind:

1. normal stop: SIGTERM to the whole group, a grace period, then SIGKILL;
2. the harness itself interrupted (SIGINT, SIGTERM, an exception): ``ChildRegistry``
   stops every recorded group before the harness exits;
3. the harness killed with SIGKILL: each child was started with a parent-death
   signal (Linux ``PR_SET_PDEATHSIG``), and the next run in the same run directory
   stops any recorded group that is still alive and says so.

Several harnesses may share a run directory (tuning workers of one study on one
host): each record names the harness that started it (host, pid and start time), a
harness rewrites only its own records (under a lock, merging the others'), and the
leftovers stopped at start are only those of harnesses no longer alive.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType

from tuner.errors import RunDirError

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
REGISTRY_FILE = "children.json"
FORCED_EXIT_AFTER_S = 45.0  # from SIGINT or SIGTERM to a forced exit if unwinding hangs


def writable_dir(path: Path, *, what: str = "run directory", keep: bool = True) -> Path:
    """``path`` made absolute, created and checked writable; RunDirError (one line) if not.
    ``keep=False``: only checked (what it created for the check is removed again)."""
    path = path.absolute()
    probe = path / f".tuner-write-check.{os.getpid()}"
    created = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
        if not keep:
            for p in created:  # deepest first
                p.rmdir()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        existing = next((p for p in (path, *path.parents) if p.exists()), path)
        if not existing.is_dir():
            reason = f"{existing} is a file, not a directory"
        elif exc.filename and Path(exc.filename) not in (path, probe):
            reason += f": {exc.filename}"
        raise RunDirError(
            f"{what} {str(path)!r} cannot be used ({reason}); accepted: a directory this "
            "user can create and write"
        ) from exc
    return path


class Interrupted(KeyboardInterrupt):
    """The harness got SIGINT or SIGTERM; the exit status is 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum)
        self.run_dir: Path | None = None  # where what was recorded is kept (set by the guard)
        super().__init__(self.signal.name)

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signal)


def raise_interrupted(signum: int, frame: FrameType | None) -> None:
    """A signal handler: SIGINT and SIGTERM become ``Interrupted`` where the program is."""
    raise Interrupted(signum)


REDELIVER_AFTER_S = 0.02  # an Interrupted that went nowhere, sent again after this


def _redeliver(pending: queue.SimpleQueue[int | None]) -> None:
    """The thread that sends a swallowed interruption again to the main thread."""
    while (signum := pending.get()) is not None:
        time.sleep(REDELIVER_AFTER_S)
        with contextlib.suppress(ProcessLookupError):
            signal.pthread_kill(threading.main_thread().ident or 0, signum)


@contextlib.contextmanager
def interrupts_raised(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """SIGINT and SIGTERM handled by ``handler`` (one that raises ``Interrupted``) inside
    the block; the previous handlers back after.

    Python runs some code whose exceptions go nowhere (the hooks around a fork, which
    ``Popen`` with a ``preexec_fn`` runs; ``__del__``; the collector's callbacks), and an
    ``Interrupted`` raised there would be lost, the interruption then waiting for a
    watchdog. Inside the block such an ``Interrupted`` is sent again, from another thread,
    to land where it unwinds."""
    previous = {sig: signal.getsignal(sig) for sig in INTERRUPT_SIGNALS}
    previous_hook = sys.unraisablehook
    # The hook only queues (a call into C that runs no Python, so no second signal can
    # land inside it); the thread waits and sends.
    pending: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    sender = threading.Thread(target=_redeliver, args=(pending,), daemon=True)
    sender.start()

    def not_swallowed(unraisable: sys.UnraisableHookArgs) -> None:
        if isinstance(unraisable.exc_value, Interrupted):
            pending.put(int(unraisable.exc_value.signal))
        else:
            previous_hook(unraisable)

    sys.unraisablehook = not_swallowed
    for sig in INTERRUPT_SIGNALS:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        sys.unraisablehook = previous_hook
        pending.put(None)


INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _ignore(signum: int, frame: FrameType | None) -> None:
    log.warning("%s while stopping the children: still stopping them", signal.Signals(signum).name)


def set_parent_death_signal() -> None:
    """In the child, before exec: die with SIGKILL when the parent dies (Linux only)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the registry still stops leftovers on the next run


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def process_id(pid: int) -> str:
    """``host:pid:start`` naming one process even after its pid is reused ("" if gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
        start = stat.rsplit(")", 1)[1].split()[19]  # field 22: start time, ticks after boot
    except (OSError, IndexError):
        return ""
    return f"{socket.gethostname()}:{pid}:{start}"


def _on_this_host(owner: str) -> bool:
    return owner.split(":", 1)[0] == socket.gethostname()


def _owner_alive(owner: str) -> bool:
    """Whether the harness that recorded a child still runs (another host's: assumed so)."""
    if not _on_this_host(owner):
        return True
    try:
        pid = int(owner.split(":")[1])
    except (IndexError, ValueError):
        return False
    return process_id(pid) == owner


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(
    pgid: int, *, grace_s: float = 10.0, leader: subprocess.Popen[bytes] | None = None
) -> bool:
    """SIGTERM the group, wait up to grace_s, SIGKILL what is left. True if anything was running.

    ``leader`` is the group's first process when it is our child: it is reaped as it
    exits, so the group does not linger as a zombie.
    """

    def reap() -> None:
        if leader is not None:
            leader.poll()

    reap()
    if not group_alive(pgid):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        reap()
        if not group_alive(pgid):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        reap()
        if not group_alive(pgid):
            break
        time.sleep(0.05)
    return True


@dataclass(frozen=True)
class ChildRecord:
    pgid: int
    cmdline: str
    started_at: float
    role: str
    owner: str = ""  # process_id() of the harness that started it ("": an older file)


class ChildRegistry:
    """The process groups this run started, on disk, so none outlives the harness."""

    def __init__(self, run_dir: Path) -> None:
        run_dir = writable_dir(run_dir)
        self.path = run_dir / REGISTRY_FILE
        self.owner = process_id(os.getpid())
        self._children: dict[int, ChildRecord] = {}
        self._procs: dict[int, subprocess.Popen[bytes]] = {}

    # -- leftovers of an earlier run --------------------------------------------------------

    def stop_leftovers(self) -> list[str]:
        """Stop groups an earlier harness in this run directory left alive; say which.

        Children of another harness still running here (a worker of the same study
        sharing the run directory) are left alone.
        """
        notes: list[str] = []
        handled: set[tuple[str, int]] = set()
        with self._locked():
            records = self._read()
        for record in records:
            if record.owner and record.owner != self.owner and _owner_alive(record.owner):
                continue
            handled.add((record.owner, record.pgid))
            if not group_alive(record.pgid):
                continue
            current = _cmdline(record.pgid)
            if current and current != record.cmdline:
                continue  # the pid was reused by an unrelated process
            stop_group(record.pgid, grace_s=5.0)
            notes.append(
                f"stopped a {record.role} left running by an earlier run "
                f"(process group {record.pgid}: {record.cmdline[:120]})"
            )
        self._children.clear()
        self._write(handled)
        return notes

    # -- this run ----------------------------------------------------------------------------

    def spawn(
        self,
        cmd: list[str],
        *,
        role: str,
        stdout_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start cmd in its own process group, output to a file, recorded until stopped."""
        stdout_path.parent.mkdir(parents=True, exist_ok=True)
        with stdout_path.open("ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=None if cwd is None else cwd.absolute(),
                start_new_session=True,
                preexec_fn=set_parent_death_signal,
            )
        record = ChildRecord(
            pgid=proc.pid,
            cmdline=_cmdline(proc.pid) or " ".join(cmd),
            started_at=time.time(),
            role=role,
            owner=self.owner,
        )
        self._children[proc.pid] = record
        self._procs[proc.pid] = proc
        self._write()
        return proc

    def stop(self, pgid: int, *, grace_s: float = 10.0) -> None:
        stop_group(pgid, grace_s=grace_s, leader=self._procs.get(pgid))
        self._children.pop(pgid, None)
        self._procs.pop(pgid, None)
        self._write()

    def stop_all(self) -> None:
        for pgid in list(self._children):
            self.stop(pgid, grace_s=5.0)

    @contextlib.contextmanager
    def guard(self) -> Iterator[ChildRegistry]:
        """Stop every child on exit, exception, SIGINT or SIGTERM (raised as ``Interrupted``,
        a KeyboardInterrupt); a second signal while the children are stopped does not cut
        the stopping short."""

        watchdogs: list[threading.Timer] = []

        def on_signal(signum: int, frame: FrameType | None) -> None:
            # The exception unwinds from wherever the program was; should that be inside a
            # lock the unwinding needs again, the watchdog still stops every child and exits.
            if not watchdogs:
                watchdog = threading.Timer(FORCED_EXIT_AFTER_S, self._force_exit, args=(signum,))
                watchdog.daemon = True
                watchdog.start()
                watchdogs.append(watchdog)
            raise Interrupted(signum)

        with interrupts_raised(on_signal):
            try:
                yield self
            except Interrupted as exc:
                if exc.run_dir is None:
                    exc.run_dir = self.path.parent
                raise
            finally:
                for sig in INTERRUPT_SIGNALS:
                    signal.signal(sig, _ignore)
                self.stop_all()

    def _force_exit(self, signum: int) -> None:
        """The watchdog of an interruption that did not finish unwinding in time."""
        for pgid in list(self._children):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        name = signal.Signals(signum).name
        os.write(2, f"tuner: interrupted by {name}; stopped every child process\n".encode())
        os._exit(128 + signum)

    # -- the file ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self.path.with_name(REGISTRY_FILE + ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> list[ChildRecord]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return []
        fields = set(ChildRecord.__dataclass_fields__)
        return [
            ChildRecord(**{k: v for k, v in item.items() if k in fields})
            for item in data
            if isinstance(item, dict)
        ]

    def _others(self, record: ChildRecord, drop: set[tuple[str, int]]) -> bool:
        """Records of other harnesses kept when this one rewrites the file: their children
        still alive (a dead harness's too, for the next run to stop), another host's."""
        if record.owner == self.owner or (record.owner, record.pgid) in drop:
            return False
        return (bool(record.owner) and not _on_this_host(record.owner)) or group_alive(record.pgid)

    def _write(self, drop: set[tuple[str, int]] | None = None) -> None:
        with self._locked():
            records = [r for r in self._read() if self._others(r, drop or set())]
            records += self._children.values()
            tmp = self.path.with_name(f"{REGISTRY_FILE}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps([asdict(r) for r in records], indent=1), encoding="utf-8")
            tmp.replace(self.path)

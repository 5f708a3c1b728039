"""An interruption that lands where Python ignores exceptions is not lost.

Python runs some code whose exceptions go nowhere: the hooks around a fork (``Popen``
with a ``preexec_fn`` runs them, and every server the harness starts has one),
``__del__``, the collector's callbacks. A SIGINT there used to be printed as "Exception
ignored" with a traceback and then waited 45 s for the watchdog's forced exit.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import signal, sys, time
    from pathlib import Path
    from tuner.serving.processes import ChildRegistry, Interrupted

    class SignalledWhileDeleted:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)
            total = 0
            for i in range(100_000):  # the handler runs here, inside __del__
                total += i

    registry = ChildRegistry(Path(sys.argv[1]))
    started = time.monotonic()
    try:
        with registry.guard():
            obj = SignalledWhileDeleted()
            del obj
            while time.monotonic() - started < 20:
                time.sleep(0.01)
        print("not interrupted")
    except Interrupted as exc:
        print(f"interrupted by {exc.signal.name} after {time.monotonic() - started:.1f} s")
    """
)


def test_an_interrupt_inside_del_reaches_the_program(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("interrupted by SIGINT after "), done.stdout + done.stderr
    seconds = float(done.stdout.split()[-2])
    assert seconds < 5, done.stdout
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


def test_a_spawn_with_a_preexec_hook_under_repeated_interrupts(tmp_path: Path) -> None:
    """SIGINT sent while servers are spawned (the fork hooks run Python): each run of
    the harness stops with Interrupted, never a swallowed traceback."""
    script = textwrap.dedent(
        """
        import os, signal, sys, threading, time
        from pathlib import Path
        from tuner.serving.processes import ChildRegistry, Interrupted

        registry = ChildRegistry(Path(sys.argv[1]))
        threading.Timer(0.5, os.kill, args=(os.getpid(), signal.SIGINT)).start()
        try:
            with registry.guard():
                for i in range(2000):
                    registry.spawn(["true"], role="probe", stdout_path=Path(sys.argv[1]) / "out")
            print("not interrupted")
        except Interrupted:
            print("interrupted")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.stdout.strip() == "interrupted", done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr

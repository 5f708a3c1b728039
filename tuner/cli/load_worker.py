"""`tuner load-worker`: the agent on a load host that serves every load run of a tune.

Each load run (each rate level of a tune) is a new Locust master on the tuning host.
The agent runs one Locust worker (``python -m locust --worker``, in its own process
group, output in ``<out>/locust-worker.log``) that connects to the master at
``--master HOST:PORT``, gets its share of the schedule from it, sends it and quits
when the master's run ends; the agent then starts the next one after a short pause.
SIGINT or SIGTERM stops the agent and everything it started. The load host's clock
must be synchronized with NTP: the schedule's start is a wall-clock time.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError

RESTART_PAUSE_S = 1.0
POLL_S = 0.1
# The line each Locust worker logs when its share is done (workloads.locustfile).
_SUMMARY = re.compile(r"(w\d+: \d+ sent, .*)$")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "load-worker",
        help="on a load host: serve every load run of a tune as a Locust worker",
        description="Run Locust workers for a tuning host's load runs: one at a time, each "
        "connecting to the Locust master at --master, sending its share of the schedule and "
        "exiting when the master's run ends; a new one starts for the next run. Start it on "
        "each load host, then run `tuner tune --load-workers K --load-master-bind HOST:PORT` "
        "(K: the load hosts' --processes, summed). Needs an NTP-synchronized clock.",
    )
    p.add_argument("--master", required=True, metavar="HOST:PORT", help="the Locust master")
    p.add_argument(
        "--processes", type=int, default=1, help="Locust worker processes on this host (default 1)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("runs/load-worker"),
        help="log directory (default runs/load-worker)",
    )
    p.set_defaults(func=_cmd_load_worker)


def locust_worker_command(host: str, port: int, processes: int) -> list[str]:
    from workloads.runner import LOCUSTFILE

    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--worker",
           "--master-host", host, "--master-port", str(port)]  # fmt: skip
    if processes > 1:
        cmd += ["--processes", str(processes)]
    return cmd


def check_args(master: str, processes: int) -> tuple[str, int]:
    from workloads.load_errors import LoadConfigError
    from workloads.runner import parse_host_port

    try:
        host, port = parse_host_port(master, "--master")
    except LoadConfigError as exc:
        raise ConfigError(str(exc)) from exc
    if processes < 1:
        raise ConfigError(f"--processes {processes} is out of range; accepted: an integer >= 1")
    return host, port


def _cmd_load_worker(args: argparse.Namespace) -> int:
    from tuner.serving.processes import ChildRegistry
    from workloads.runner import locust_base_env

    host, port = check_args(args.master, args.processes)
    out = args.out.resolve()
    registry = ChildRegistry(out)
    for note in registry.stop_leftovers():
        print(f"tuner load-worker: {note}", file=sys.stderr, flush=True)
    log_path = out / "locust-worker.log"
    cmd = locust_worker_command(host, port, args.processes)
    print(
        f"tuner load-worker: serving the Locust master at {host}:{port} with "
        f"{args.processes} process(es); log {log_path}",
        flush=True,
    )
    run = served = 0
    try:
        with registry.guard():
            while True:
                run += 1
                offset = log_path.stat().st_size if log_path.exists() else 0
                began = time.monotonic()
                proc = registry.spawn(
                    cmd, role="load worker", stdout_path=log_path, env=locust_base_env(), cwd=out
                )
                while proc.poll() is None:
                    time.sleep(POLL_S)
                registry.stop(proc.pid, grace_s=5.0)  # forked workers, if any are left
                summary = _summaries(log_path, offset)
                served += bool(summary)
                print(
                    f"run {run}: {summary or 'nothing sent'} "
                    f"(exit {proc.returncode}, {time.monotonic() - began:.1f} s)",
                    flush=True,
                )
                time.sleep(RESTART_PAUSE_S)
    except KeyboardInterrupt:
        # Stopped as a user stops it: say what it served, then exit as interrupted (130
        # for SIGINT, 143 for SIGTERM), as every other command does.
        print(f"tuner load-worker: stopped; served {served} run(s)", flush=True)
        raise


def _summaries(log_path: Path, offset: int) -> str:
    """The share summaries a Locust worker logged since ``offset`` of its log."""
    try:
        with log_path.open("rb") as log_file:
            log_file.seek(offset)
            text = log_file.read().decode(errors="replace")
    except OSError:
        return ""
    return "; ".join(m.group(1) for line in text.splitlines() if (m := _SUMMARY.search(line)))

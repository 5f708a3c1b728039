"""The wall time of `make tune` on the default, and where it went.

Runs what `make tune` runs with the Makefile's defaults (llama-3.1-8b, the chat workload,
``TRIALS`` and ``BUDGET_MIN`` as the Makefile sets them; on a machine without a GPU the
simulated engine on an H100-80GB profile) into a fresh run directory, and reports, from
what the run wrote:

- its wall time, against the target (10 minutes);
- the trials measured (launched and served; screened ones are not launched), against
  the target (4);
- per trial its launch seconds (start to ready, and the stop) and each level's seconds
  (warm-up, window, hold-on, drain, the rest), and the clock it ran on;
- whether the OOM edge was probed and the recommendation confirmed (``budget.json``);
- the recommendation's goodput and its interval (the confirmation's, else its trial's).

Run (about ten minutes; the tune's own lines go to ``<run dir>.console.txt`` beside it)::

    .venv/bin/python benchmarks/make_tune_wall.py
    .venv/bin/python benchmarks/make_tune_wall.py --budget-min 10 --trials 8 --keep /tmp/wall-1
    .venv/bin/python benchmarks/make_tune_wall.py --busy-s 40   # a busy host at trial 1

Timings on a shared machine are noisy: the load generator and the simulated engine
share its cores with everything else running, and a level whose load generator lagged
is measured again (its attempts set aside show in ``other``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGET_WALL_S = 600.0
TARGET_TRIALS = 4


def makefile_default(name: str) -> str:
    """A variable's default in the Makefile (``NAME ?= value``)."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    match = re.search(rf"^{name}\s*\?=\s*(\S*)", text, re.MULTILINE)
    if match is None:
        raise SystemExit(f"Makefile sets no default for {name}")
    return match.group(1)


def tuner_command() -> list[str]:
    """``tuner`` beside this interpreter (the project's venv), else ``python -m tuner.cli``."""
    here = Path(sys.executable).with_name("tuner")
    return [str(here)] if here.is_file() else [sys.executable, "-m", "tuner.cli"]


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def trial_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Each launched trial's seconds, from its evaluation.json."""
    rows = []
    for path in sorted((run_dir / "trials").glob("*/evaluation.json")):
        ev = read_json(path)
        if ev is None or ev.get("launch_s") is None:
            continue  # screened: not launched
        keys = ("wall_s", "warmup_s", "window_s", "hold_on_s", "drain_s", "other_s", "time_scale")
        levels = []
        for lv in ev.get("levels", []):
            seconds = lv.get("seconds") or {}
            parts = {k: seconds.get(k) for k in keys}
            levels.append({"rate": lv["rate_per_s"], "held": lv["met"], **parts})
        interval = ev.get("capacity_interval") or {}
        rows.append(
            {
                "trial": int(path.parent.name),
                "verdict": ev["verdict"],
                "goodput": (ev.get("goodput_figures") or {}).get("arrival_rate_per_s"),
                "interval": (interval.get("low_per_s"), interval.get("high_per_s")),
                "launch_s": ev.get("launch_s"),
                "warmup_s": ev.get("warmup_s"),
                "levels_s": ev.get("levels_s"),
                "stop_s": ev.get("stop_s"),
                "time_scale": ev.get("time_scale"),
                "levels": levels,
            }
        )
    return rows


def launches(run_dir: Path) -> dict[str, Any]:
    """What budget.json says ran and was skipped, by kind."""
    budget = read_json(run_dir / "budget.json") or {}
    ran: dict[str, int] = {}
    for launch in budget.get("launches", []):
        ran[launch["kind"]] = ran.get(launch["kind"], 0) + 1
        if launch["kind"] == "edge_probe" and "cold boot" not in launch["name"]:
            ran["oom_edge_probe"] = ran.get("oom_edge_probe", 0) + 1  # not the cold boot's
    skipped = [s["reason"] and f"{s['name']}: {s['reason']}" for s in budget.get("skipped", [])]
    return {"ran": ran, "skipped": skipped}


def recommendation(run_dir: Path) -> dict[str, Any]:
    """The recommendation's goodput and interval: its confirmation's, else its trial's."""
    rec = read_json(run_dir / "recommendation" / "recommendation.json")
    summary = read_json(run_dir / "summary.json") or {}
    out: dict[str, Any] = {"recommended": rec is not None}
    measured = ((rec or {}).get("recommended") or {}).get("measured")
    if measured:
        interval = measured.get("capacity_interval") or {}
        out["confirmed_goodput"] = (measured.get("goodput_figures") or {}).get("arrival_rate_per_s")
        out["confirmed_interval"] = (interval.get("low_per_s"), interval.get("high_per_s"))
    trial_interval = summary.get("best_capacity_interval") or {}
    out["trial_goodput"] = summary.get("best_goodput_arrival_rate_per_s")
    out["trial_interval"] = (trial_interval.get("low_per_s"), trial_interval.get("high_per_s"))
    return out


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(run_dir: Path, wall_s: float, command: list[str]) -> str:
    rows = trial_rows(run_dir)
    ran = launches(run_dir)
    rec = recommendation(run_dir)
    lines = [
        f"command: {' '.join(command)}",
        f"wall: {wall_s:.0f} s ({wall_s / 60:.1f} min; target <= {TARGET_WALL_S / 60:.0f} min)",
        f"trials measured: {len(rows)} (target >= {TARGET_TRIALS})",
        "",
        "trial  verdict     goodput  interval        clock  launch  warm-up  levels (wall: "
        "warm-up/window/hold-on/drain/other)  stop",
    ]
    for row in rows:
        low, high = row["interval"]
        levels = " + ".join(
            f"{fmt(lv['wall_s'])} ({fmt(lv['warmup_s'])}/{fmt(lv['window_s'])}/"
            f"{fmt(lv['hold_on_s'])}/{fmt(lv['drain_s'])}/{fmt(lv['other_s'])})"
            for lv in row["levels"]
        )
        lines.append(
            f"{row['trial']:>5}  {row['verdict']:<10} {fmt(row['goodput'], 2):>8}  "
            f"[{fmt(low, 2)}, {fmt(high, 2)}]  {row['time_scale'] or 1:>5g}  "
            f"{fmt(row['launch_s'], 1):>6}  {fmt(row['warmup_s']):>7}  {levels}  "
            f"{fmt(row['stop_s'], 1)}"
        )
    lines += [
        "",
        f"launches: {json.dumps(ran['ran'])}",
        f"OOM edge probed: {'yes' if ran['ran'].get('oom_edge_probe') else 'no'}; "
        f"recommendation confirmed: {'yes' if 'confirmed_goodput' in rec else 'no'}",
    ]
    if "confirmed_goodput" in rec:
        low, high = rec["confirmed_interval"]
        lines.append(
            f"recommendation (confirmation): goodput {fmt(rec['confirmed_goodput'], 2)} "
            f"conversations/s, interval [{fmt(low, 2)}, {fmt(high, 2)}]"
        )
    low, high = rec["trial_interval"]
    lines.append(
        f"recommendation (its trial): goodput {fmt(rec['trial_goodput'], 2)} conversations/s, "
        f"interval [{fmt(low, 2)}, {fmt(high, 2)}]"
    )
    lines += [f"skipped: {s}" for s in ran["skipped"]]
    return "\n".join(lines)


def busy_host(start_at: Path, seconds: float) -> None:
    """Once ``start_at`` exists, keep every core busy for ``seconds`` (a host where other
    work runs beside the tune: the load generator and the simulated server lag)."""
    while not start_at.exists():
        time.sleep(0.5)
    spin = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\n"
    spin += "while time.monotonic() < end: pass\n"
    procs = [
        subprocess.Popen([sys.executable, "-c", spin, str(seconds)])
        for _ in range(os.cpu_count() or 1)
    ]
    for proc in procs:
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=makefile_default("MODEL"))
    parser.add_argument("--workload", default=makefile_default("WORKLOAD"))
    parser.add_argument("--trials", default=makefile_default("TRIALS"))
    parser.add_argument("--budget-min", default=makefile_default("BUDGET_MIN"))
    parser.add_argument(
        "--keep", type=Path, help="the run directory (default: a fresh temporary one)"
    )
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    parser.add_argument(
        "--busy-s", type=float, default=0.0,
        help="a busy host: keep every core busy this many seconds once trial --busy-trial's "
        "first level starts (default 0: none)",
    )  # fmt: skip
    parser.add_argument("--busy-trial", type=int, default=1)
    args = parser.parse_args(argv)
    run_dir = args.keep or Path(tempfile.mkdtemp(prefix="make-tune-wall-")) / "run"
    if run_dir.exists() and any(run_dir.iterdir()):
        raise SystemExit(f"{run_dir} is not empty: the benchmark measures a fresh run")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    console_path = run_dir.parent / f"{run_dir.name}.console.txt"
    command = [
        *tuner_command(), "tune", "--model", args.model, "--workload", args.workload,
        "--trials", str(args.trials), "--budget-min", str(args.budget_min),
        "--run-dir", str(run_dir),
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    began = time.monotonic()
    busy = None
    if args.busy_s > 0:
        level = run_dir / "trials" / f"{args.busy_trial:03d}" / "level-0"
        busy = threading.Thread(target=busy_host, args=(level, args.busy_s), daemon=True)
        busy.start()
    with console_path.open("w", encoding="utf-8") as console:
        rc = subprocess.run(command, stdout=console, stderr=subprocess.STDOUT, env=env, check=False)
    wall_s = time.monotonic() - began
    if busy is not None:
        print(
            f"busy host: every core busy for {args.busy_s:g} s from trial {args.busy_trial}'s first level"
        )
    print(report(run_dir, wall_s, command))
    print(f"exit status {rc.returncode}; run directory {run_dir}")
    if args.json:
        figures = {
            "wall_s": wall_s,
            "trials": trial_rows(run_dir),
            "launches": launches(run_dir),
            "recommendation": recommendation(run_dir),
        }
        print(json.dumps(figures, indent=2))
    return rc.returncode


if __name__ == "__main__":
    raise SystemExit(main())

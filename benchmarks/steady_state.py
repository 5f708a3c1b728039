"""Goodput against the rate the server sustains in the steady state of the workload.

For each built-in workload on the simulated engine (llama-3.1-8b, vLLM's defaults at
the current version) it prints:

(a) the reference rate: ``tuner.twin.prediction.reference_rate``, 10 virtual minutes (or as
    long as 200 requests take, for a p99, where that is longer) after a long warm-up
    (2 minutes, or the longest conversation's planned length), opening on the
    stationary population of conversations (planned with the answer times this server
    gave at the nearest rate it held, as the live search plans it), every later turn
    sent its think time after the answer it follows;
(b) today's figure: what the old method says, ``tuner.twin.prediction.max_rate`` on an 8-s cold
    window (``level_workload(spec, None, 8)`` with ``sessions.start: empty``, each turn
    at its planned time), and its error against (a);
(c) the tuner's figure: the goodput a live rate search measures, from ``tuner tune`` on
    the sim backend for one trial (vLLM's defaults; no OOM-edge search, no
    confirmation) into a temporary run directory, and its error against (a).

An error within 5 % is a PASS. Rates are in the workload's unit (conversations/s with
sessions, else requests/s), with requests/s beside them for sessions.

``batch`` has closed arrivals (every request at once): it has no arrival rate to
search, so every column is the request throughput of the whole batch when its SLOs
hold (0 when not); (a) and (b) are then the same run and agree by construction.

Run (CPU only, a few minutes per workload and GPU for (a))::

    .venv/bin/python benchmarks/steady_state.py --no-live
    .venv/bin/python benchmarks/steady_state.py --workloads chat,rag --gpus H100-80GB
    .venv/bin/python benchmarks/steady_state.py --no-live --gpus L4-24GB --max-model-len 8192
    .venv/bin/python benchmarks/steady_state.py --run-dir runs/<study>
    .venv/bin/python benchmarks/steady_state.py --workloads mixed-long-short --keep-runs /tmp/ss

``--keep-runs``: each live trial's run directory is kept there (its levels' ``window.json``
say how long each window was held, and why); the last column is that trial's wall time.

At vLLM's defaults llama-3.1-8b does not start on an L4 (its 131072-token context
does not fit the KV cache); such a case prints "does not start" and its reason.

``--run-dir``: confirm an existing tune instead: its best trial's settings, GPU,
model, workload and goodput (``tune.json``, ``summary.json``, the trial's
``evaluation.json``), against the reference rate at those settings. Nothing is cached.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tuner.run.goodput import GoodputUnit
from tuner.serving.level_schedule import level_workload
from tuner.sim.build import build_engine
from tuner.twin.prediction import Setup, max_rate, predict, reference_rate
from tuner.vllm.gpus import get_gpu, recorded_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import resolve_model
from tuner.vllm.space import TrialParams
from tuner.vllm.versions import VllmVersion
from workloads.spec import SessionStart, WorkloadSpec, load_workload
from workloads.stationary import expected_turns

WORKLOADS = ("chat", "code", "rag", "batch", "mixed-long-short")
GPUS = ("H100-80GB", "L4-24GB")
MODEL = "llama-3.1-8b"
OLD_WINDOW_S = 8.0  # the cold window the tuner's levels used before
TOLERANCE = 0.05


@dataclass(frozen=True)
class Row:
    workload: str
    gpu: str
    unit: GoodputUnit
    reference: float  # in ``unit``
    reference_req_s: float
    today: float
    live: float | None
    cpu_s: float
    failure: str | None = None  # the server would not start at these settings
    live_wall_s: float | None = None  # the tuner's one trial, wall time


def cold_window(spec: WorkloadSpec) -> WorkloadSpec:
    """The old level: an 8-s window from an empty server, no warm-up."""
    level = level_workload(spec, None, OLD_WINDOW_S)
    if level.sessions is not None:
        sessions = level.sessions.model_copy(update={"start": SessionStart.EMPTY})
        level = level.model_copy(update={"sessions": sessions})
    return level


def closed_throughput(setup: Setup, spec: WorkloadSpec) -> float:
    p = predict(setup, spec)
    return p.result.request_throughput if p.met and p.result is not None else 0.0


def reference(setup: Setup, spec: WorkloadSpec) -> tuple[float, float]:
    """(a): in the workload's unit, and in requests/s."""
    if spec.mean_rate_per_s is None:
        rate = closed_throughput(setup, spec)
        return rate, rate
    rate = reference_rate(setup, spec)
    if GoodputUnit.of(spec) is GoodputUnit.CONVERSATIONS_PER_S:
        return rate, rate * expected_turns(spec)
    return rate, rate


def today(setup: Setup, spec: WorkloadSpec) -> float:
    """(b): the old method's figure, in the workload's unit."""
    if spec.mean_rate_per_s is None:
        return closed_throughput(setup, spec)
    return max_rate(setup, cold_window(spec))


def live_goodput(
    workload: str, gpu: str, max_model_len: int | None = None, keep: Path | None = None,
    tune_args: tuple[str, ...] = (),
) -> float | None:  # fmt: skip
    """(c): one trial of ``tuner tune`` on the sim backend, in the workload's unit; its run
    directory is kept under ``keep`` (``<workload>-<gpu>``) when given."""
    with tempfile.TemporaryDirectory(prefix="steady-state-") as tmp:
        out = Path(tmp) / "run" if keep is None else keep / f"{workload}-{gpu}"
        if keep is not None and out.exists():
            shutil.rmtree(out)
        cmd = [
            sys.executable, "-m", "tuner.cli", "tune", "--backend", "sim", "--model", MODEL,
            "--gpu", gpu, "--workload", workload, "--trials", "1", "--no-edge",
            "--no-confirm", "--run-dir", str(out),
        ]  # fmt: skip
        if max_model_len is not None:
            cmd += ["--max-model-len", str(max_model_len)]
        cmd += tune_args
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        summary = out / "summary.json"
        if done.returncode != 0 or not summary.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            print(
                f"  tuner tune failed for {workload} on {gpu}: {' | '.join(tail)}", file=sys.stderr
            )
            return None
        data = json.loads(summary.read_text(encoding="utf-8"))
        figures = data.get("best_goodput_figures") or {}
        return float(
            figures.get("arrival_rate_per_s", data.get("best_goodput_requests_per_s") or 0.0)
        )


def setup_for(gpu: str, params: ServingParams | None = None) -> Setup:
    return Setup(
        resolve_model(MODEL), get_gpu(gpu), VllmVersion.current(), params or ServingParams()
    )


def measure(
    workload: str, gpu: str, live: bool, max_model_len: int | None = None,
    keep: Path | None = None, tune_args: tuple[str, ...] = (),
) -> Row:  # fmt: skip
    t0 = time.process_time()
    spec = load_workload(workload)
    setup = setup_for(gpu, ServingParams(max_model_len=max_model_len))
    plan, engine = build_engine(setup.model, setup.gpu, setup.params, setup.version)
    if engine is None:
        kind = plan.failure.kind.value if plan.failure is not None else "unknown"
        return Row(workload, gpu, GoodputUnit.of(spec), 0.0, 0.0, 0.0, None, 0.0, kind)
    ref, ref_req = reference(setup, spec)
    old = today(setup, spec)
    cpu = time.process_time() - t0
    wall = time.perf_counter()
    figure = live_goodput(workload, gpu, max_model_len, keep, tune_args) if live else None
    wall = time.perf_counter() - wall
    return Row(workload, gpu, GoodputUnit.of(spec), ref, ref_req, old, figure, cpu,
               live_wall_s=wall if live else None)  # fmt: skip


def error_text(figure: float | None, ref: float) -> str:
    if figure is None:
        return f"{'-':>8} {'-':>8}     "
    if ref <= 0.0:
        return f"{figure:8.2f} {'n/a':>8}     "
    err = figure / ref - 1.0
    verdict = "PASS" if abs(err) <= TOLERANCE else "FAIL"
    return f"{figure:8.2f} {100 * err:+7.1f}% {verdict}"


def print_table(rows: list[Row]) -> None:
    print(f"{'workload':<17} {'gpu':<10} {'unit':<16} {'ref':>8} {'ref req/s':>9} "
          f"{'today':>8} {'error':>8}      {'tuner':>8} {'error':>8}      {'trial':>11}")  # fmt: skip
    for r in rows:
        if r.failure is not None:
            print(f"{r.workload:<17} {r.gpu:<10} {r.unit.label:<16} does not start: {r.failure}")
            continue
        trial = f" {r.live_wall_s / 60:7.1f} min" if r.live_wall_s is not None else ""
        print(f"{r.workload:<17} {r.gpu:<10} {r.unit.label:<16} {r.reference:8.2f} "
              f"{r.reference_req_s:9.2f} {error_text(r.today, r.reference)} "
              f"{error_text(r.live, r.reference)}{trial}")  # fmt: skip


def confirm_run(run_dir: Path) -> None:
    """Check an existing tune's best goodput against the reference rate at its settings."""
    tune = json.loads((run_dir / "tune.json").read_text(encoding="utf-8"))
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    best = summary.get("best_trial")
    if best is None:
        sys.exit(f"{run_dir}: no feasible trial to confirm")
    evaluation = json.loads(
        (run_dir / "trials" / f"{int(best):03d}" / "evaluation.json").read_text(encoding="utf-8")
    )
    config = tune.get("config", {})
    base = ServingParams(
        max_model_len=config.get("max_model_len"),
        tensor_parallel_size=config.get("tensor_parallel_size") or 1,
        kv_cache_memory_bytes=config.get("kv_cache_memory_bytes"),
    )
    params = TrialParams.model_validate(evaluation["params"]).serving(base)
    spec = WorkloadSpec.model_validate(tune["workload"])
    setup = Setup(
        resolve_model(tune["model"]), recorded_gpu(tune["gpu"], tune.get("gpu_profile")),
        VllmVersion.parse(tune["vllm_version"]), params,
    )  # fmt: skip
    figures = summary.get("best_goodput_figures") or {}
    unit = GoodputUnit.of(spec)
    tuned = float(
        figures.get("arrival_rate_per_s", summary.get("best_goodput_requests_per_s") or 0.0)
    )
    tuned_req = float(
        figures.get("requests_per_s", summary.get("best_goodput_requests_per_s") or 0.0)
    )
    ref, ref_req = reference(setup, spec)
    print(f"{run_dir}: trial {best}, {tune['model']} on {tune['gpu']}, {spec.name}, "
          f"vLLM {tune['vllm_version']}, {evaluation['params']}")  # fmt: skip
    print(f"  tuned goodput   {tuned:8.2f} {unit.label} ({tuned_req:.2f} req/s)")
    print(f"  reference rate  {ref:8.2f} {unit.label} ({ref_req:.2f} req/s)")
    print(f"  error           {error_text(tuned, ref)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--gpus", default=",".join(GPUS))
    parser.add_argument("--no-live", action="store_true", help="only (a) and (b)")
    parser.add_argument("--run-dir", type=Path, help="confirm an existing tune instead")
    parser.add_argument("--jobs", type=int, default=1, help="cases computed at once")
    parser.add_argument(
        "--max-model-len", type=int, help="instead of vLLM's default (the model's 131072)"
    )
    parser.add_argument(
        "--keep-runs", type=Path, help="keep each live trial's run directory under this one"
    )
    parser.add_argument(
        "--tune-arg", action="append", default=[],
        help="passed on to the live trial's `tuner tune` (e.g. --tune-arg=--chain-levels)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.run_dir is not None:
        confirm_run(args.run_dir)
        return 0
    cases = [(w, g) for w in args.workloads.split(",") for g in args.gpus.split(",")]
    t0 = time.perf_counter()
    live = not args.no_live
    keep = args.keep_runs.resolve() if args.keep_runs is not None else None
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            n = len(cases)
            ws, gs = zip(*cases, strict=True)
            rows = list(
                pool.map(
                    measure,
                    ws,
                    gs,
                    [live] * n,
                    [args.max_model_len] * n,
                    [keep] * n,
                    [tuple(args.tune_arg)] * n,
                )
            )
    else:
        tune_args = tuple(args.tune_arg)
        rows = [measure(w, g, live, args.max_model_len, keep, tune_args) for w, g in cases]
    print_table(rows)
    cpu = sum(r.cpu_s for r in rows)
    print(f"\n{len(rows)} cases in {time.perf_counter() - t0:.0f} s wall "
          f"({cpu:.0f} s CPU for (a) and (b)); PASS: within {100 * TOLERANCE:.0f} %")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

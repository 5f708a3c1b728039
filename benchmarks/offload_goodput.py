"""Where KV offloading to CPU memory pays, on the twin: goodput and prefix hits with and without it.

For ``chat`` and ``agent`` with Llama-3.1-8B on an H100-80GB and an L40S-48GB (each a
cell), on the twin's virtual clock (no real time: every launch a ``VirtualServer``):

* **goodput at the SLO**: one trial of ``tuner tune`` (vLLM's defaults for the other
  knobs, ``benchmarks/virtual_trial.py``) per setting of ``--kv-offloading-size`` and its
  eviction policy (``--space kv-offloading-size=S --space kv-offloading-policy=P``):
  0 (no CPU tier) against 16 GiB ``lru`` and 64 GiB with ``lru`` and with ``arc``;
* **prefix hit rate**: one run of the simulated engine over the workload at its own rate
  (``tuner simulate --workload W``'s path) per setting, read as vLLM's counters name them:
  the GPU's ``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``, and GPU plus CPU
  with the offloading connector's ``vllm:external_prefix_cache_hits`` added; with the
  tokens loaded from host memory (``vllm:kv_offload_total_bytes{transfer_type=
  "CPU_to_GPU"}``) and the CPU blocks evicted.

It prints one table per cell and, per cell, the best offloading setting against none:
"pays" where its goodput's capacity interval lies above the interval without it, "no
measurable gain" otherwise.

Run (CPU only; about 4 to 8 minutes a cell on a 2-core machine at the default 4 levels)::

    .venv/bin/python benchmarks/offload_goodput.py
    .venv/bin/python benchmarks/offload_goodput.py --cells agent:L40S-48GB --levels 6

``--json`` prints the rows; ``--keep DIR`` keeps each trial's run directory.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from tuner.run.evaluation import Evaluation
from tuner.sim.build import SimOptions, build_engine
from tuner.sim.cpu_tier import OffloadPolicy, TransferType
from tuner.sim.simulate import run
from tuner.sim.simulate_workload import load_for_simulation, plan_workload_run, simulation_slo
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion
from workloads.spec import load_workload

try:  # the repository root is on the path (the editable install, python -m)
    from benchmarks.virtual_trial import one_trial
except ModuleNotFoundError:  # run as a script: benchmarks/ is sys.path[0]
    from virtual_trial import one_trial  # type: ignore[no-redef]

MODEL = "llama-3.1-8b"
CELLS = ("chat:H100-80GB", "chat:L40S-48GB", "agent:H100-80GB", "agent:L40S-48GB")
GiB = float(1 << 30)


@dataclass(frozen=True)
class Row:
    workload: str
    gpu: str
    size_gib: float
    policy: str
    goodput: float  # the workload's unit, at the SLO
    unit: str
    low: float | None  # its capacity interval
    high: float | None
    gpu_hit_rate: float  # vllm:prefix_cache_hits / vllm:prefix_cache_queries
    total_hit_rate: float  # GPU plus vllm:external_prefix_cache_hits, over the same queries
    loaded_gib: float  # CPU_to_GPU bytes
    cpu_evicted_blocks: int
    trial_wall_s: float

    @property
    def label(self) -> str:
        return "none" if self.size_gib == 0 else f"{self.size_gib:g} GiB {self.policy}"


def parse_settings(text: str) -> list[tuple[float, OffloadPolicy | None]]:
    """``0,16:lru,64:arc``: sizes in GiB, each with its policy (0: no CPU tier)."""
    out: list[tuple[float, OffloadPolicy | None]] = []
    for item in text.split(","):
        size, _, policy = item.partition(":")
        out.append((float(size), OffloadPolicy(policy) if float(size) > 0 else None))
    return out


def workload_path(workload: str, duration_s: float | None, folder: Path) -> Path:
    """The built-in workload's file, or a copy with another duration."""
    if duration_s is None:
        return Path(f"workloads/builtin/{workload}.yaml")
    spec = load_workload(workload).model_copy(update={"duration_s": duration_s})
    path = folder / f"{workload}-{duration_s:g}s.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_unset=True)), "utf-8")
    return path


def hit_rates(
    workload: str, gpu_name: str, size_gib: float, policy: OffloadPolicy | None
) -> tuple[float, float, float, int]:
    """The GPU's and the GPU-plus-CPU prefix hit rates over one run at the workload's own
    rate, the GiB loaded from host memory and the CPU blocks evicted."""
    model = resolve_model(MODEL)
    version = VllmVersion.current()
    spec = load_for_simulation(workload, rate_per_s=None, duration_s=None)
    planned = plan_workload_run(spec, vocab=model.vocab_size)
    options = SimOptions(
        kv_offloading_size_gib=size_gib, offload_policy=policy or OffloadPolicy.LRU, seed=spec.seed
    )
    startup, engine = build_engine(model, get_gpu(gpu_name), ServingParams(), version, options)
    assert engine is not None, startup.failure
    run(
        engine, planned.records, slo=simulation_slo(spec, None, None), vocab=model.vocab_size,
        seed=spec.seed, max_model_len=startup.max_model_len,
        prompt_token_ids=planned.prompt_token_ids, follows=planned.follows,
        think_s=planned.think_s, measure_from_s=planned.measure_from_s,
        measure_to_s=planned.measure_to_s, stop_at_s=planned.stop_at_s,
    )  # fmt: skip
    queries = engine.prefix_queries_tokens or 1
    gpu_hits = engine.prefix_hits_tokens
    tier = engine.cpu_tier
    if tier is None:
        return gpu_hits / queries, gpu_hits / queries, 0.0, 0
    loaded = tier.transfers[TransferType.LOAD].bytes / GiB
    total = (gpu_hits + tier.external_hits_tokens) / queries
    return gpu_hits / queries, total, loaded, tier.evictions


def measure(
    workload: str,
    gpu: str,
    size_gib: float,
    policy: OffloadPolicy | None,
    root: Path,
    levels: int,
    duration_s: float | None,
) -> Row:
    space = [] if size_gib == 0 else [f"kv-offloading-size={size_gib:g}"]
    if policy is not None:
        space.append(f"kv-offloading-policy={policy.value}")
    run_dir = root / f"{workload}-{gpu}-{size_gib:g}-{policy or 'none'}"
    started = time.monotonic()
    evaluation: Evaluation = one_trial(
        model=MODEL, gpu=gpu, workload=workload_path(workload, duration_s, root),
        run_dir=run_dir, max_levels=levels, space=space,
    )  # fmt: skip
    wall_s = time.monotonic() - started
    stated = evaluation.stated_goodput
    interval = evaluation.capacity_interval
    gpu_rate, total_rate, loaded, evicted = hit_rates(workload, gpu, size_gib, policy)
    return Row(
        workload=workload, gpu=gpu, size_gib=size_gib,
        policy=policy.value if policy else "-", goodput=stated.arrival_rate_per_s,
        unit=str(stated.unit), low=interval.low_per_s if interval else None,
        high=interval.high_per_s if interval else None, gpu_hit_rate=gpu_rate,
        total_hit_rate=total_rate, loaded_gib=loaded, cpu_evicted_blocks=evicted,
        trial_wall_s=wall_s,
    )  # fmt: skip


def _interval(row: Row) -> str:
    if row.low is None:
        return "-"
    return f"[{row.low:.3f}, {'open' if row.high is None else f'{row.high:.3f}'}]"


def verdict(rows: list[Row]) -> str:
    """The best offloading setting of a cell against none, in one line."""
    base = next(r for r in rows if r.size_gib == 0)
    best = max((r for r in rows if r.size_gib > 0), key=lambda r: r.goodput)
    gain = best.goodput / base.goodput - 1 if base.goodput > 0 else None
    separated = (best.low is not None and base.high is not None and best.low > base.high) or (
        base.goodput == 0 and best.goodput > 0
    )
    said = f"{gain:+.0%}" if gain is not None else f"{best.goodput:.3f} against 0"
    hits = f"hit rate {base.gpu_hit_rate:.1%} GPU only, {best.total_hit_rate:.1%} GPU+CPU"
    if separated:
        return f"offloading pays: {best.label} {said} ({hits})"
    return f"no measurable gain: best {best.label} {said}, inside the intervals ({hits})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default=",".join(CELLS), help="workload:GPU, comma-separated")
    parser.add_argument("--levels", type=int, default=4, help="rate levels per trial (default 4)")
    parser.add_argument(
        "--settings", default="0,16:lru,64:lru,64:arc",
        help="GiB:policy, comma-separated (default 0,16:lru,64:lru,64:arc)",
    )  # fmt: skip
    parser.add_argument(
        "--duration-s", type=float, help="each level's workload duration (default its own)"
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--keep", type=Path, help="keep the trials' run directories here")
    args = parser.parse_args(argv)
    root = args.keep or Path(tempfile.mkdtemp(prefix="offload-goodput-"))
    all_rows: list[Row] = []
    for cell in args.cells.split(","):
        workload, gpu = cell.split(":")
        rows = [
            measure(workload, gpu, s, p, root, args.levels, args.duration_s)
            for s, p in parse_settings(args.settings)
        ]
        all_rows += rows
        if args.json:
            continue
        duration = f", {args.duration_s:g} s a level" if args.duration_s else ""
        print(f"{workload} / {MODEL} / {gpu} ({rows[0].unit}, {args.levels} levels{duration})")
        print(
            f"  {'offloading':<12} {'goodput':>8} {'interval':>18} {'GPU hits':>9} "
            f"{'GPU+CPU':>8} {'loaded':>9} {'CPU evicted':>11} {'wall':>6}"
        )
        for r in rows:
            print(
                f"  {r.label:<12} {r.goodput:>8.3f} {_interval(r):>18} {r.gpu_hit_rate:>9.1%} "
                f"{r.total_hit_rate:>8.1%} {r.loaded_gib:>6.1f}GiB {r.cpu_evicted_blocks:>11} "
                f"{r.trial_wall_s:>5.0f}s"
            )
        print(f"  {verdict(rows)}", flush=True)
    if args.json:
        print(json.dumps([asdict(r) for r in all_rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

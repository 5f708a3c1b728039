"""`tuner capacity`: the cheapest fleet that holds a peak, across GPU types and
tensor-parallel sizes (``tuner.capacity.plan``), its configs and its report."""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError

DEFAULT_GPUS = "A100-80GB,H100-80GB,H200-141GB,L40S-48GB,L4-24GB,B200-180GB"
DEFAULT_TENSOR_PARALLEL = "1,2,4,8"
GPUS_PER_NODE = 8  # an HGX/DGX node: the largest tensor-parallel group on one NVLink domain


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "capacity",
        help="plan the cheapest fleet for a peak across GPU types and tensor-parallel sizes",
        description="For each GPU type and tensor-parallel size that holds the model: the "
        "memory settings the twin picks, one replica's steady-state goodput at the SLO, the "
        "replicas and GPUs for the peak with the headroom, and their cost; ranked, with the "
        "configs of the chosen option and the runner-up. Runs given with --from calibrate "
        "the twin, or measure an option outright. Nothing is launched.",
    )
    p.add_argument(
        "--model", required=True, help="preset name, Hugging Face id, or model directory"
    )
    p.add_argument("--workload", default="chat", help="built-in (chat, code, rag, batch, mixed-long-short, agent) or YAML")  # fmt: skip
    p.add_argument("--peak", type=float, required=True, metavar="RATE",
                   help="the peak to hold, in the workload's unit (conversations/s where it "
                        "has sessions, else requests/s)")  # fmt: skip
    p.add_argument("--gpus", default=DEFAULT_GPUS, help=f"comma list of GPU types (default {DEFAULT_GPUS})")  # fmt: skip
    p.add_argument("--tensor-parallel-size", dest="tensor_parallel", metavar="SIZES",
                   help=f"comma list of tensor-parallel sizes (default {DEFAULT_TENSOR_PARALLEL}, "
                        "those that divide the model's attention heads)")  # fmt: skip
    p.add_argument("--price", action="append", default=[], metavar="GPU=USD_PER_HOUR",
                   help="a GPU's price per hour (repeatable; for every GPU or none)")  # fmt: skip
    p.add_argument("--from", dest="runs", action="append", default=[], type=Path, metavar="RUN_DIR",
                   help="a tune's run directory that calibrates the twin (repeatable)")  # fmt: skip
    p.add_argument("--headroom", type=float, default=0.2, help="share of each replica kept free (default 0.2)")  # fmt: skip
    p.add_argument("--slo-ttft-ms", type=float, help="p99 TTFT limit (overrides the workload's)")
    p.add_argument("--slo-itl-ms", type=float, help="p99 ITL limit (overrides the workload's)")
    p.add_argument("--max-model-len", type=int, help="default: the model's where it fits, else the workload's")  # fmt: skip
    p.add_argument("--safety-margin", type=float, default=0.02, help="utilization kept below the memory edge")  # fmt: skip
    p.add_argument("--vllm-version", help="the vLLM release planned for (default the newest known)")
    p.add_argument("--out", type=Path, help="output directory (default runs/capacity-<model>-<workload>)")  # fmt: skip
    p.add_argument("--no-report", dest="report", action="store_false", help="skip capacity.html")
    p.set_defaults(func=_cmd_capacity)


def _sizes(text: str, flag: str) -> list[int]:
    sizes: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ConfigError(
                f"{flag} {text!r}: {part!r} is not accepted; accepted: a comma list of "
                "integers >= 1, e.g. 1,2,4,8"
            )
        sizes.append(int(part))
    return sorted(set(sizes))


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "plan"


def _cmd_capacity(args: argparse.Namespace) -> int:
    from tuner.capacity.calibration import read_run
    from tuner.capacity.fleet import parse_prices
    from tuner.capacity.option import OptionSpace
    from tuner.capacity.plan import CAPACITY_HTML, make_plan, write_plan
    from tuner.capacity.text import format_plan
    from tuner.search.context import workload_context
    from tuner.serving.load import resolve_workload
    from tuner.vllm.gpus import get_gpu
    from tuner.vllm.models import resolve_model
    from tuner.vllm.versions import VllmVersion
    from workloads.slo import Slo

    # Every value checked before anything runs.
    if not (math.isfinite(args.peak) and args.peak > 0):
        raise ConfigError(f"--peak {args.peak:g} is not accepted; accepted: a rate > 0")
    if not (0.0 <= args.headroom < 1.0):
        raise ConfigError(f"--headroom {args.headroom:g} is not accepted; accepted: 0 <= value < 1")
    if not (0.0 <= args.safety_margin < 0.5):
        raise ConfigError(f"--safety-margin {args.safety_margin:g} is not accepted; accepted: 0 <= value < 0.5")  # fmt: skip
    if args.max_model_len is not None and args.max_model_len < 1:
        raise ConfigError(f"--max-model-len {args.max_model_len} is not accepted; accepted: an integer >= 1")  # fmt: skip
    gpus = []
    for name in (n.strip() for n in args.gpus.split(",")):
        gpu = get_gpu(name)  # an unknown name: one line with the known ones
        if gpu not in gpus:
            gpus.append(gpu)
    model = resolve_model(args.model)
    heads = model.num_attention_heads
    if args.tensor_parallel:
        sizes = _sizes(args.tensor_parallel, "--tensor-parallel-size")
        for tp in sizes:
            if tp > GPUS_PER_NODE:
                raise ConfigError(
                    f"--tensor-parallel-size {tp} is more GPUs than one node's {GPUS_PER_NODE}: "
                    "each replica of the plan is one server on one node, its all-reduces "
                    f"within it; accepted: 1 to {GPUS_PER_NODE}"
                )
            if heads % tp:
                divisors = [str(d) for d in range(1, GPUS_PER_NODE + 1) if heads % d == 0]
                raise ConfigError(
                    f"--tensor-parallel-size {tp} does not divide {model.name}'s {heads} "
                    f"attention heads; accepted: {', '.join(divisors)}"
                )
    else:
        sizes = _sizes(DEFAULT_TENSOR_PARALLEL, "--tensor-parallel-size")
    canonical = {g.name.lower(): g.name for g in gpus}
    for g in gpus:
        canonical.update({a.lower(): g.name for a in g.aliases})
    prices = parse_prices(args.price, canonical)
    workload = resolve_workload(args.workload, rate_per_s=None, duration_s=None)
    for flag, value in (("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-itl-ms", args.slo_itl_ms)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{flag} {value:g} is not accepted; accepted: milliseconds > 0")
    overrides = Slo.p99(ttft_ms=args.slo_ttft_ms, itl_ms=args.slo_itl_ms)
    workload = workload.model_copy(update={"slo": workload.slo.overridden_by(overrides)})
    if workload.mean_rate_per_s is None:
        raise ConfigError(
            f"--workload {args.workload!r} is a closed batch: it has no arrival rate to plan "
            "a peak for; accepted: a workload with arrivals (chat, code, rag, mixed-long-short, "
            "agent)"
        )
    version = VllmVersion.parse(args.vllm_version) if args.vllm_version else VllmVersion.current()
    runs = [read_run(path) for path in args.runs]
    out = args.out or Path("runs") / f"capacity-{_slug(model.name)}-{_slug(workload.name)}"
    space = OptionSpace(
        model=model, version=version, workload=workload, max_model_len=args.max_model_len,
        workload_context=workload_context(model, workload)[1], safety_margin=args.safety_margin,
    )  # fmt: skip

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    plan = make_plan(
        space=space, gpus=gpus, tensor_parallel_sizes=sizes, peak=args.peak,
        headroom=args.headroom, prices=prices, runs=runs, progress=progress,
    )  # fmt: skip
    write_plan(plan, workload, out)
    print(format_plan(plan))
    if args.report:
        from reports.capacity import write_capacity_report

        write_capacity_report(plan, out / CAPACITY_HTML)
    print(f"\nwritten: {out}/capacity.json" + (f", {out}/{CAPACITY_HTML}" if args.report else "")
          + (", chosen/ and runner-up/ configs" if plan.chosen else ""))  # fmt: skip
    return 0 if plan.chosen is not None else 1

"""Whether a setting's gain over vLLM's defaults is the same in every unit of its goodput.

Issue 34: a ``make tune`` of chat on the H100 profile stated the twin's pick +29% over
vLLM's defaults in conversations/s, +44% in requests/s and +82% in output tokens/s. For
one workload the gain is the same in every unit; where it is not, the units count
different populations. This measures it on the simulated engine's virtual clock: one
trial of vLLM's defaults and one of the pinned setting (``--space``, default the issue's
pick: utilization 0.97, 512 sequences, block 32, fp8 KV), each ``tuner tune`` as the
command runs it with every launch a ``VirtualServer`` (no edge, no confirmation), per
workload seed. For each it prints:

* the goodput as the run states it (``evaluation.json``'s ``goodput_figures``): the rate
  that held, in requests/s and output tokens/s, and their gains with the spread between
  them (the largest gain over the smallest; they agree when it is within 5%);
* the best level's window as it counted (``LoadResult``: its offered requests/s, and the
  output tokens of what it served per second of the window and the drain: what the
  goodput's units were before), and the populations behind it: the conversations that
  arrived in the window against the rate, requests per conversation, output tokens per
  request, requests cut at the run's end (and the share of their output they had),
  failed, never sent, and the requests planned that the run never sent (later turns due
  after the window, the schedule past the cut).

Run (CPU only; about a minute a trial for chat on an H100 profile)::

    .venv/bin/python benchmarks/units_agreement.py
    .venv/bin/python benchmarks/units_agreement.py --seeds 1,2,3
    .venv/bin/python benchmarks/units_agreement.py --space max-num-seqs=64

Each tune's output and run directory go to a temporary folder (``--keep DIR`` keeps them).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tuner.run.evaluation import Evaluation
from tuner.run.goodput import UNITS_AGREE, Goodput, UnitGains
from tuner.run.layout import WINDOW_JSON
from tuner.serving.window import WindowOpening
from workloads.load_errors import ABORTED, STOPPED_BEFORE_SEND
from workloads.schedule import read_records, read_schedule

PICK = (
    "gpu-memory-utilization=0.97",
    "max-num-seqs=512",
    "block-size=32",
    "kv-cache-dtype=fp8",
)

try:  # the repository root is on the path (the editable install, python -m)
    from benchmarks.virtual_trial import one_trial, workload_file
except ModuleNotFoundError:  # run as a script: benchmarks/ is sys.path[0]
    from virtual_trial import one_trial, workload_file  # type: ignore[no-redef]


@dataclass(frozen=True)
class Window:
    """What the best level's window counted, and the populations behind it."""

    rate_per_s: float  # the level's arrival rate (the goodput in its unit)
    window_s: float
    requests: int
    arrived: int  # first turns in the window (conversations, or requests)
    offered_per_s: float  # LoadResult.offered_rate
    tokens_per_s: float  # LoadResult.output_token_throughput
    tokens_counted: int  # LoadResult.output_tokens
    duration_s: float  # what tokens_per_s divides by: the window and the drain
    cut: int  # requests cut at the run's end (measured as far as they got)
    cut_tokens: int  # the output they had
    cut_asked: int  # the output they asked for (max_tokens)
    failed: int
    not_sent: int
    planned_unsent: int  # planned in the level's schedule, never sent (after the cut)
    declared_tokens: float  # the window's requests' max_tokens, per request

    @property
    def requests_per_arrival(self) -> float:
        return self.offered_per_s / self.rate_per_s if self.rate_per_s else 0.0

    @property
    def tokens_per_request(self) -> float:
        return self.tokens_per_s / self.offered_per_s if self.offered_per_s else 0.0


@dataclass(frozen=True)
class Trial:
    name: str
    stated: Goodput
    window: Window | None
    wall_s: float


def _window(evaluation: Evaluation) -> Window | None:
    best = evaluation.best
    if best is None or not (Path(best.dir) / WINDOW_JSON).exists():
        return None
    level = Path(best.dir)
    window = WindowOpening.model_validate_json((level / WINDOW_JSON).read_text())
    k = evaluation.time_scale
    schedule = {r.request_id: r for r in read_schedule(level / "schedule.jsonl")}
    records = list(read_records(level / "requests.jsonl"))
    # (the schedule kept is what the level sent: a record not sent has no request there)
    planned = {r.request_id: p for r in records if (p := schedule.get(r.request_id)) is not None}
    zero = min(
        r.scheduled_s
        for r in records
        if (p := planned.get(r.request_id)) is not None and p.follows is None and not r.warmup
    )  # offset 0: the first open-loop send (at 0: the conversations under way)
    opened = zero + k * window.opened_at_s
    closed = opened + k * window.window_s
    kept = [r for r in records if not r.warmup and opened <= r.scheduled_s < closed]
    cut = [r for r in kept if r.error == ABORTED]
    load = best.load
    return Window(
        rate_per_s=best.rate_per_s,
        window_s=window.window_s,
        requests=len(kept),
        arrived=sum(1 for r in kept if (p := planned.get(r.request_id)) and p.turn == 0),
        offered_per_s=load.offered_rate or 0.0,
        tokens_per_s=load.output_token_throughput,
        tokens_counted=load.output_tokens,
        duration_s=load.duration_s,
        cut=len(cut),
        cut_tokens=sum(r.output_tokens for r in cut),
        cut_asked=sum(planned[r.request_id].max_tokens for r in cut),
        failed=sum(1 for r in kept if not r.ok and r.error != ABORTED),
        not_sent=load.num_not_sent,
        planned_unsent=sum(1 for r in records if r.error == STOPPED_BEFORE_SEND)
        + len(schedule)
        - len(planned),
        declared_tokens=sum(p.max_tokens for r in kept if (p := planned.get(r.request_id)))
        / max(1, len(kept)),
    )


def _trial(args: argparse.Namespace, name: str, space: list[str], seed: int, folder: Path) -> Trial:
    began = time.monotonic()
    evaluation = one_trial(
        model=args.model,
        gpu=args.gpu,
        workload=workload_file(args.workload, seed, folder),
        run_dir=folder / f"run-{name}-seed{seed}",
        max_levels=args.max_levels,
        space=space,
    )
    return Trial(name, evaluation.stated_goodput, _window(evaluation), time.monotonic() - began)


def _show(t: Trial) -> None:
    g = t.stated
    print(f"  {t.name:<9} goodput {g.text()}  [{g.basis.value}: {g.per_arrival_text()}]"
          f"  {t.wall_s:4.0f} s")  # fmt: skip
    w = t.window
    if w is None:
        return
    print(
        f"  {'':<9} its window ({w.window_s:.1f} s): {w.requests} requests, "
        f"{w.offered_per_s:.2f} req/s offered, {w.tokens_per_s:,.0f} output tok/s counted "
        f"({w.tokens_counted:,} tokens over {w.duration_s:.1f} s)"
    )
    print(
        f"  {'':<9}   arrivals {w.arrived} = {w.arrived / w.window_s:.2f}/s against the rate "
        f"{w.rate_per_s:.2f}/s ({w.arrived / w.window_s / w.rate_per_s - 1:+.0%}); "
        f"{w.requests_per_arrival:.2f} requests a rate unit, "
        f"{w.requests / max(1, w.arrived):.2f} a conversation that arrived in it; "
        f"{w.tokens_per_request:.0f} output tokens a request counted, "
        f"{w.declared_tokens:.0f} asked"
    )
    print(
        f"  {'':<9}   cut at the run's end {w.cut} ({w.cut / max(1, w.requests):.0%}, "
        f"{w.cut_tokens:,} of the {w.cut_asked:,} tokens they asked for); failed {w.failed}; "
        f"not sent {w.not_sent}; planned and never sent (after the cut) {w.planned_unsent}"
    )


def _gains(label: str, ratios: list[tuple[str, float]]) -> tuple[float, bool]:
    values = [r for _, r in ratios]
    spread = max(values) / min(values) - 1.0
    listed = ", ".join(f"{r - 1:+.1%} {unit}" for unit, r in ratios)
    agree = spread <= UNITS_AGREE
    print(f"  {label}: {listed}; spread {spread:.1%} "
          f"({'agree' if agree else 'disagree'} within {UNITS_AGREE:.0%})")  # fmt: skip
    return spread, agree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--gpu", default="H100-80GB")
    parser.add_argument("--workload", default="chat")
    parser.add_argument("--seeds", default="1", help="workload seeds, comma-separated")
    parser.add_argument("--max-levels", type=int, default=4)
    parser.add_argument("--space", action="append", help=f"the setting (default {PICK})")
    parser.add_argument("--keep", type=Path, help="keep the runs in this folder")
    args = parser.parse_args()
    space = args.space or list(PICK)
    agreed = True
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        print(f"{args.model} on {args.gpu}, {args.workload}: {', '.join(space)} "
              "against vLLM's defaults")  # fmt: skip
        for seed in (int(s) for s in args.seeds.split(",")):
            print(f"seed {seed}:")
            default = _trial(args, "defaults", [], seed, folder)
            pinned = _trial(args, "setting", space, seed, folder)
            _show(default)
            _show(pinned)
            gains = UnitGains.of(pinned.stated, default.stated)
            if len(gains.ratios()) < 2:  # one of them held no level: no gain to state
                print("  no gain to compare: a setting held no level")
                continue
            _, agree = _gains("gain as stated", gains.ratios())
            agreed &= agree
            d, p = default.window, pinned.window
            if d is not None and p is not None:
                _gains("gain as the windows counted", [
                    (pinned.stated.unit.label, p.rate_per_s / d.rate_per_s),
                    ("req/s", p.offered_per_s / d.offered_per_s),
                    ("output tok/s", p.tokens_per_s / d.tokens_per_s),
                ])  # fmt: skip
            print(json.dumps({"seed": seed, "stated_gains": dict(gains.ratios())}))
    print("the stated units agree within 5% wherever both held" if agreed else "they do NOT agree")
    return 0 if agreed else 1


if __name__ == "__main__":
    sys.exit(main())

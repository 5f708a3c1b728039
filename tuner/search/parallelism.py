"""Parallelism on the tuned host: one server over k GPUs against k servers of one.

Where a tune searches ``--tensor-parallel-size`` (``tuner tune --gpu-count N --knobs
...,tensor-parallel-size``), its trials are ranked by goodput per GPU
(``tuner.vllm.space.per_gpu``). This module states the comparison an engineer asks
for at the end: for each size, the best goodput one server holds at the SLO, per GPU,
and what the host's GPUs serve as servers of that size (``gpu_count // size`` of them).
A measured trial's figure beats the twin's prediction; a size no trial met the SLO at
says so, and the twin's figure for a size never launched is marked predicted.

``parallelism.json`` in the run directory holds it; the tune prints it and the report
shows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path

from optuna.trial import FrozenTrial
from pydantic import BaseModel, ConfigDict

from tuner.search.rate_search import GoodputUnit
from tuner.search.study import arrival_goodput
from tuner.twin.landscape import Landscape
from tuner.vllm.space import Knob, SearchSpace, TrialParams

PARALLELISM_JSON = "parallelism.json"


class Source(StrEnum):
    MEASURED = "measured"  # a trial held it at the SLO
    PREDICTED = "predicted"  # the twin's landscape; no trial of this size met the SLO
    NONE = "none"  # neither: no trial met the SLO and the twin has no figure


class SizeResult(BaseModel):
    """One tensor-parallel size: its best server at the SLO."""

    model_config = ConfigDict(frozen=True)

    tensor_parallel_size: int
    source: Source
    goodput_per_server: float  # in ``unit``; 0 with Source.NONE
    goodput_is_lower_bound: bool = False  # no measured rate broke the SLO
    params: TrialParams | None = None
    trial: int | None = None  # MEASURED: the trial
    trials_launched: int = 0  # trials of this size (any verdict)

    @property
    def goodput_per_gpu(self) -> float:
        return self.goodput_per_server / self.tensor_parallel_size

    def servers_on(self, gpu_count: int) -> int:
        return gpu_count // self.tensor_parallel_size

    def host_goodput(self, gpu_count: int) -> float:
        """What ``gpu_count`` GPUs serve as independent servers of this size."""
        return self.servers_on(gpu_count) * self.goodput_per_server


class ParallelismComparison(BaseModel):
    """Every searched size on a host of ``gpu_count`` GPUs."""

    model_config = ConfigDict(frozen=True)

    gpu_count: int
    unit: GoodputUnit
    sizes: list[SizeResult]

    @property
    def best(self) -> SizeResult | None:
        """The size with the most goodput per GPU, measured ones before predicted ones."""
        measured = [s for s in self.sizes if s.source is Source.MEASURED]
        pool = measured or [s for s in self.sizes if s.source is Source.PREDICTED]
        return max(pool, key=lambda s: s.goodput_per_gpu, default=None)

    def lines(self) -> list[str]:
        unit = self.unit.label
        out = [
            f"parallelism on {self.gpu_count} GPUs ({unit} at the SLO; one server over k GPUs "
            "against k servers of one):"
        ]
        for s in self.sizes:
            at_least = ">=" if s.goodput_is_lower_bound else ""
            servers = s.servers_on(self.gpu_count)
            if s.source is Source.NONE:
                why = (
                    f"no goodput at the SLO ({s.trials_launched} trial(s) launched)"
                    if s.trials_launched
                    else "not launched, and no prediction of the twin (its screen unfinished)"
                )
                out.append(f"  tp {s.tensor_parallel_size}: {why}")
                continue
            where = (
                f"measured, trial {s.trial}"
                if s.source is Source.MEASURED
                else "predicted by the twin, not measured"
                + (f"; {s.trials_launched} trial(s) missed the SLO" if s.trials_launched else "")
            )
            out.append(
                f"  tp {s.tensor_parallel_size}: {at_least}{s.goodput_per_server:.2f} a server, "
                f"{at_least}{s.goodput_per_gpu:.2f} a GPU; {servers} server(s) on "
                f"{self.gpu_count} GPUs: {at_least}{s.host_goodput(self.gpu_count):.2f}  ({where})"
            )
        best = self.best
        if best is not None:
            ones = next((s for s in self.sizes if s.tensor_parallel_size == 1), None)
            versus = ""
            if ones is not None and ones is not best and ones.goodput_per_gpu > 0:
                gain = best.goodput_per_gpu / ones.goodput_per_gpu - 1.0
                versus = f", {gain:+.0%} a GPU against servers of one GPU"
            out.append(
                f"  best a GPU: tp {best.tensor_parallel_size} ({best.source.value}){versus}"
            )
        return out

    def write(self, run_dir: Path) -> Path:
        path = run_dir / PARALLELISM_JSON
        path.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        return path


def read_parallelism(run_dir: Path) -> ParallelismComparison | None:
    path = run_dir / PARALLELISM_JSON
    try:
        return ParallelismComparison.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def compare(
    space: SearchSpace,
    gpu_count: int,
    trials: Sequence[FrozenTrial],
    landscape: Landscape | None,
    unit: GoodputUnit,
) -> ParallelismComparison | None:
    """The comparison, where ``space`` searches the tensor-parallel size (else None).
    ``trials``: the study's completed trials (their recorded attributes)."""
    r = space.range_of(Knob.TENSOR_PARALLEL_SIZE)
    if r is None:
        return None
    sizes: list[SizeResult] = []
    for value in r.values():
        size = int(value)
        own = [t for t in trials if _size_of(t) == size]
        met = [t for t in own if t.user_attrs.get("verdict") == "met"]
        if met:
            best = max(met, key=arrival_goodput)
            sizes.append(
                SizeResult(
                    tensor_parallel_size=size, source=Source.MEASURED,
                    goodput_per_server=arrival_goodput(best),
                    goodput_is_lower_bound=best.user_attrs.get("goodput_bound") == "lower_bound",
                    params=space.from_optuna(best.params), trial=best.number,
                    trials_launched=len(own),
                )
            )  # fmt: skip
            continue
        points = [
            p
            for p in (landscape.points if landscape is not None else [])
            if (p.params.tensor_parallel_size or 1) == size and p.rate_per_s > 0
        ]
        top = max(points, key=lambda p: p.rate_per_s, default=None)
        sizes.append(
            SizeResult(
                tensor_parallel_size=size,
                source=Source.PREDICTED if top is not None else Source.NONE,
                goodput_per_server=top.rate_per_s if top is not None else 0.0,
                params=top.params if top is not None else None,
                trials_launched=len(own),
            )
        )
    return ParallelismComparison(gpu_count=gpu_count, unit=unit, sizes=sizes)


def _size_of(trial: FrozenTrial) -> int:
    return int(trial.params.get(Knob.TENSOR_PARALLEL_SIZE.value, 1))

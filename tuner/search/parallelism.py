"""Parallelism on the tuned host: one server over k GPUs against k servers of one.

Where a tune searches ``--tensor-parallel-size`` (``tuner tune --gpu-count N --knobs
...,tensor-parallel-size``), its trials are ranked by goodput per GPU
(``tuner.vllm.space.per_gpu``). This module states the comparison an engineer asks
for at the end: for each size, the best goodput one server holds at the SLO, per GPU,
and what the host's GPUs serve as servers of that size (``gpu_count // size`` of them).
A measured trial's figure beats the twin's prediction; a size no trial met the SLO at
says so, and the twin's figure for a size never launched is marked predicted.

``parallelism.json`` in the run directory holds it (``tuner.run.parallelism``); the tune
prints it and the report shows it.
"""

from __future__ import annotations

from collections.abc import Sequence

from optuna.trial import FrozenTrial

from tuner.run.goodput import GoodputUnit
from tuner.run.parallelism import ParallelismComparison, SizeResult, Source
from tuner.search.study import arrival_goodput
from tuner.twin.landscape import Landscape
from tuner.vllm.space import Knob, SearchSpace


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

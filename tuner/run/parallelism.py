"""``parallelism.json``: one server over k GPUs against k servers of one, per searched size.

``tuner.search.parallelism.compare`` states it where a tune searched the tensor-parallel
size; the tune prints it (``ParallelismComparison.lines``) and the report reads it back
(``read_parallelism``).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tuner.run.goodput import GoodputUnit
from tuner.run.layout import RunLayout
from tuner.vllm.space import TrialParams


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
        path = RunLayout(run_dir).parallelism_json
        path.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        return path


def read_parallelism(run_dir: Path) -> ParallelismComparison | None:
    path = RunLayout(run_dir).parallelism_json
    try:
        return ParallelismComparison.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None

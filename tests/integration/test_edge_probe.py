"""An OOM-edge probe on the simulated engine (`tuner sim-serve`, a real process over a real
socket): the worst case is held until the KV cache has peaked or every output finished,
not for a fixed 8 seconds; a cap that cuts it short first leaves a startup edge only."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.run.edge import EdgeProbe, ProbeVerdict
from tuner.search.config import load_config
from tuner.search.context import StudySetup, TuneContext, resolve
from tuner.search.edge import EdgeSearch
from tuner.serving.processes import ChildRegistry
from tuner.serving.worst_case_hold import HoldEnd
from tuner.vllm.space import Knob, TrialParams

pytestmark = pytest.mark.timeout(120)

# Eight answers of ~200 tokens at once: on the simulated L4 a step of Llama-3.1-8B takes
# ~55 ms, so the last output finishes ~11 s after the first prompt (the 8 s the edge held
# before ended with every answer in flight).
LONG_ANSWERS = """\
name: long-answers
api: completions
stream: true
arrival: {kind: poisson, rate_per_s: 2.0}
prompt_tokens: {kind: uniform, low: 48, high: 64}
output_tokens: {kind: uniform, low: 190, high: 200}
warmup: {duration_s: 0, requests: 0}
duration_s: 5
seed: 5
slo:
  ttft: {p99_ms: 2000}
"""


def _ctx(tmp_path: Path, **extra: object) -> TuneContext:
    workload = tmp_path / "long-answers.yaml"
    workload.write_text(LONG_ANSWERS)
    config = load_config(
        None,
        {
            "backend": "sim", "gpu": "L4", "model": "llama-3.1-8b", "workload": str(workload),
            "max_model_len": 512, "run_dir": tmp_path / "run", "time_scale": 1.0,
            "sim_startup_delay_s": 0.5, **extra,
        },
    )  # fmt: skip
    return resolve(config)


def _probe(ctx: TuneContext, tmp_path: Path) -> EdgeProbe:
    registry = ChildRegistry(tmp_path / "run")
    with registry.guard():
        search = EdgeSearch(ctx, StudySetup(), registry, None)
        params = TrialParams(gpu_memory_utilization=0.9, max_num_seqs=8)
        probe = search.probe(Knob.GPU_MEMORY_UTILIZATION, params)
    assert probe is not None
    return probe


def test_the_worst_case_is_held_until_every_output_finished(tmp_path: Path) -> None:
    probe = _probe(_ctx(tmp_path), tmp_path)
    assert probe.verdict is ProbeVerdict.HELD
    assert probe.hold_end in (HoldEnd.OUTPUTS_FINISHED, HoldEnd.KV_PEAKED)
    assert not probe.startup_edge_only
    assert probe.hold_s is not None and probe.hold_s > 8.0
    assert probe.request_errors == 0 and probe.requests == 8
    assert probe.peak_kv_cache_usage is not None and probe.peak_kv_cache_usage > 0


def test_a_worst_case_cut_by_its_cap_is_a_startup_edge_only(tmp_path: Path) -> None:
    probe = _probe(_ctx(tmp_path, edge_load_s=2.0), tmp_path)
    assert probe.verdict is ProbeVerdict.HELD
    assert probe.hold_end is HoldEnd.CAP
    assert probe.startup_edge_only
    assert "startup edge only" in probe.said()
    assert probe.request_errors == 0  # the answers the cap cut off are not failures

from __future__ import annotations

from typing import Any

from tuner.twin.prediction import Setup, max_rate, predict
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion
from workloads.spec import WorkloadSpec

LLAMA = resolve_model("llama-3.1-8b")
H100 = get_gpu("H100-80GB")
CURRENT = VllmVersion.parse("0.33")


def _workload(
    slo: dict[str, Any], *, duration_s: float = 4.0, rate_per_s: float = 2.0
) -> WorkloadSpec:
    return WorkloadSpec.model_validate(
        {
            "name": "unit",
            "api": "completions",
            "arrival": {"kind": "poisson", "rate_per_s": rate_per_s},
            "prompt_tokens": {"kind": "uniform", "low": 100, "high": 300},
            "output_tokens": {"kind": "fixed", "value": 64},
            "warmup": {"duration_s": 0},
            "duration_s": duration_s,
            "seed": 7,
            "slo": slo,
        }
    )


def _setup(**params: Any) -> Setup:
    serving = ServingParams(max_model_len=4096, **params)
    return Setup(model=LLAMA, gpu=H100, version=CURRENT, params=serving)


LOOSE = {"ttft": {"p99_ms": 5000}, "tpot": {"p99_ms": 200}}
TIGHT = {"ttft": {"p99_ms": 50}, "tpot": {"p99_ms": 8}}


def test_a_loose_slo_holds_at_a_low_rate() -> None:
    p = predict(_setup(), _workload(LOOSE), 2.0)
    assert p.result is not None and p.met
    assert p.rate_per_s == 2.0
    assert p.plan.fits
    assert p.result.num_finished == p.result.num_requests > 0
    assert p.result.num_failed == 0


def test_a_tight_slo_breaks_at_a_high_rate() -> None:
    p = predict(_setup(max_num_seqs=8), _workload(TIGHT), 60.0)
    assert p.result is not None and not p.met
    assert p.result.ttft_ms.p99 > 50


def test_the_workloads_own_rate_is_used_without_one() -> None:
    p = predict(_setup(), _workload(LOOSE, rate_per_s=3.0))
    assert p.rate_per_s == 3.0 and p.met


def test_max_rate_grows_with_max_num_seqs() -> None:
    spec = _workload({"ttft": {"p99_ms": 1000}, "tpot": {"p99_ms": 50}}, duration_s=3.0)
    rates = [
        max_rate(_setup(max_num_seqs=seqs), spec, start_rate_per_s=4.0, precision=0.1)
        for seqs in (1, 2, 8)
    ]
    assert 0 < rates[0] <= rates[1] <= rates[2]
    assert rates[2] > 2 * rates[0]


def test_max_rate_is_zero_when_no_rate_meets_the_slo() -> None:
    spec = _workload({"ttft": {"p99_ms": 0.001}}, duration_s=2.0)
    assert max_rate(_setup(), spec, start_rate_per_s=1.0, max_runs=4) == 0.0


def test_a_setting_that_cannot_start_has_no_result() -> None:
    p = predict(_setup(gpu_memory_utilization=0.1), _workload(LOOSE), 2.0)
    assert not p.plan.fits and p.plan.failure is not None
    assert p.result is None
    assert not p.met

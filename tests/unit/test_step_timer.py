"""The twin's step time across GPUs: tensor-parallel all-reduces cross NVLink where the GPU
has it and PCIe where it has not, as a ring over the ranks."""

from __future__ import annotations

import pytest

from tuner.sim.timing import (
    ALLREDUCE_LATENCY_S,
    NVLINK_ALLREDUCE_EFFICIENCY,
    PCIE_ALLREDUCE_EFFICIENCY,
    StepTimer,
    StepWork,
)
from tuner.vllm.gpus import GpuSpec, get_gpu
from tuner.vllm.memory import ServingParams, plan
from tuner.vllm.models import resolve_model

BATCH = 256


def _timer(gpu: GpuSpec, tp: int, model: str = "llama-3.1-8b") -> StepTimer:
    spec = resolve_model(model)
    startup = plan(spec, gpu, ServingParams(tensor_parallel_size=tp, max_model_len=4096))
    assert startup.fits, startup.failure
    return StepTimer(spec, gpu, startup, enforce_eager=False)


def _decode(batch: int = BATCH) -> StepWork:
    return StepWork(
        num_tokens=batch,
        num_seqs=batch,
        context_tokens=batch * 1024,
        attention_pairs=float(batch * 1024),
    )


def _transfer_s(timer: StepTimer, tokens: int = BATCH) -> float:
    """The all-reduces' time less their fixed latency: what the link's rate decides."""
    return timer.allreduce_s(tokens) - 2 * timer.layers * ALLREDUCE_LATENCY_S


def test_one_rank_has_no_all_reduce() -> None:
    assert _timer(get_gpu("H100-80GB"), 1).allreduce_s(BATCH) == 0.0


@pytest.mark.parametrize(
    ("name", "link"), [("H100-80GB", "NVLink"), ("L40S-48GB", "PCIe"), ("H100-PCIe-80GB", "PCIe")]
)
def test_each_gpu_names_the_link_its_ranks_share(name: str, link: str) -> None:
    assert ("NVLink" if get_gpu(name).nvlink_bytes_per_s else "PCIe") == link


def test_pcie_only_gpus_pay_their_link_rate_for_the_same_all_reduce() -> None:
    nvlink = _transfer_s(_timer(get_gpu("H100-80GB"), 2))
    pcie = _transfer_s(_timer(get_gpu("L40S-48GB"), 2))
    # Same model and batch, so the same bytes: the time scales with the links' achieved
    # rates, a third of NVLink's 450 GB/s against half of PCIe's 25 GB/s.
    assert pcie / nvlink == pytest.approx(
        (450e9 * NVLINK_ALLREDUCE_EFFICIENCY) / (25e9 * PCIE_ALLREDUCE_EFFICIENCY), rel=1e-9
    )
    assert pcie / nvlink > 10


def test_the_ring_sends_more_per_gpu_as_ranks_are_added() -> None:
    gpu = get_gpu("H200-141GB")
    by_tp = {tp: _transfer_s(_timer(gpu, tp)) for tp in (2, 4, 8)}
    assert by_tp[4] / by_tp[2] == pytest.approx(1.5)  # 2(k-1)/k: 1, 1.5, 1.75
    assert by_tp[8] / by_tp[2] == pytest.approx(1.75)


def test_the_step_carries_the_all_reduce_of_its_link() -> None:
    l40s = get_gpu("L40S-48GB")
    bridged = l40s.model_copy(update={"nvlink_bytes_per_s": 450e9})
    over_pcie, over_nvlink = _timer(l40s, 4), _timer(bridged, 4)
    saved = over_pcie.step_s(_decode()) - over_nvlink.step_s(_decode())
    assert saved == pytest.approx(
        over_pcie.allreduce_s(BATCH) - over_nvlink.allreduce_s(BATCH), rel=1e-9
    )
    assert saved > 0.1 * over_nvlink.step_s(_decode())

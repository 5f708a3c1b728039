"""Parallelism in the tune: ``--tensor-parallel-size`` as a searched knob on a host of
several GPUs, settings ranked per GPU, and the comparison of one server over k GPUs
against k servers of one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from tests.unit.test_landscape import _landscape
from tuner.errors import ConfigError
from tuner.run.goodput import Goodput, GoodputBound, GoodputUnit
from tuner.run.parallelism import Source, read_parallelism
from tuner.search.config import load_config
from tuner.search.context import resolve
from tuner.search.parallelism import compare
from tuner.search.recommend import capacity, config_hash, deployment
from tuner.search.study import best_trial
from tuner.twin.landscape import ScreenedPoint, ScreenMethod
from tuner.vllm.gpus import get_gpu
from tuner.vllm.models import resolve_model
from tuner.vllm.space import (
    Knob,
    Range,
    SearchSpace,
    TrialParams,
    build_space,
    check_for_target,
    parse_range,
    per_gpu,
    vllm_defaults,
)
from tuner.vllm.versions import VllmVersion

LLAMA = resolve_model("llama-3.1-8b")  # 32 attention heads
QWEN = resolve_model("qwen2.5-7b")  # 28 attention heads
H100 = get_gpu("H100-80GB")
CURRENT = VllmVersion.parse("0.33")
TP = Knob.TENSOR_PARALLEL_SIZE


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


# --- the knob -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "gpu_count", "sizes"),
    [(LLAMA, 4, (1, 2, 4)), (LLAMA, 8, (1, 2, 4, 8)), (QWEN, 8, (1, 2, 4)), (LLAMA, 3, (1, 2))],
)
def test_the_default_sizes_divide_the_heads_and_fit_the_host(
    model: object, gpu_count: int, sizes: tuple[int, ...]
) -> None:
    space = build_space(
        model=model, gpu=H100, version=CURRENT, accepted_flags=None, extra=(TP,),  # type: ignore[arg-type]
        gpu_count=gpu_count,
    )  # fmt: skip
    r = space.range_of(TP)
    assert r is not None and r.choices == sizes
    assert vllm_defaults(space, CURRENT, H100).tensor_parallel_size == 1


def test_a_host_of_one_gpu_leaves_the_size_out_with_the_reason() -> None:
    space = build_space(model=LLAMA, gpu=H100, version=CURRENT, accepted_flags=None, extra=(TP,))
    assert space.range_of(TP) is None
    (left,) = [o for o in space.left_out if o.knob is TP]
    assert "one GPU" in left.reason


def test_a_range_of_sizes_is_powers_of_two() -> None:
    assert parse_range(TP, "1..8").choices == (1, 2, 4, 8)
    assert parse_range(TP, "2,4").choices == (2, 4)


@pytest.mark.parametrize(
    ("text", "gpu_count", "expected"),
    [
        ("1,3", 4, "value 3 does not divide meta-llama/Llama-3.1-8B-Instruct's 32 attention heads"),
        (
            "1,2,8",
            4,
            "value 8 is more GPUs than the 4 this host has (--gpu-count); accepted: 1 to 4",
        ),
        ("0,2", 4, "value 0 is out of range"),
    ],
)
def test_a_bad_size_is_one_line_naming_it(text: str, gpu_count: int, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_for_target(
            parse_range(TP, text), model=LLAMA, version=CURRENT, gpu=True, gpu_count=gpu_count
        )
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_a_model_that_does_not_fit_one_gpu_needs_no_offload_where_tp_spreads_it() -> None:
    big = resolve_model("llama-3.1-70b")
    alone = build_space(model=big, gpu=H100, version=CURRENT, accepted_flags=None)
    spread = build_space(
        model=big, gpu=H100, version=CURRENT, accepted_flags=None, extra=(TP,), gpu_count=4
    )
    assert alone.range_of(Knob.CPU_OFFLOAD_GB) is not None
    assert spread.range_of(Knob.CPU_OFFLOAD_GB) is None


# --- resolving a tune ---------------------------------------------------------------------


def test_a_sim_tune_searches_the_size_on_its_virtual_host() -> None:
    ctx = resolve(
        load_config(
            None,
            {"backend": "sim", "gpu_count": 4, "knobs": ("max-num-seqs", "tensor-parallel-size")},
        )
    )
    assert ctx.gpu_count == 4
    r = ctx.space.range_of(TP)
    assert r is not None and r.choices == (1, 2, 4)
    params = TrialParams(max_num_seqs=64, tensor_parallel_size=2)
    assert ctx.gpus_of(params) == 2
    assert params.serving(ctx.base).tensor_parallel_size == 2
    assert params.flags()["tensor-parallel-size"] == 2


def test_knobs_add_the_ones_outside_the_default_five() -> None:
    # --knobs named max-num-batched-tokens, and the space came out without it
    ctx = resolve(
        load_config(None, {"backend": "sim", "knobs": ("max-num-seqs", "max-num-batched-tokens")})
    )
    assert [r.knob for r in ctx.space.ranges] == [Knob.MAX_NUM_SEQS, Knob.MAX_NUM_BATCHED_TOKENS]


def test_a_multi_gpu_host_without_the_knob_is_told_how_to_compare() -> None:
    ctx = resolve(load_config(None, {"backend": "sim", "gpu_count": 2}))
    assert ctx.space.range_of(TP) is None
    assert any("tensor-parallel-size" in note and "2 GPUs" in note for note in ctx.notes)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"gpu_count": 1, "tensor_parallel_size": 2},
            "--tensor-parallel-size 2 is more GPUs than the 1 of this host (--gpu-count); accepted: 1 to 1",
        ),
        (
            {"gpu_count": 2, "space": {"tensor-parallel-size": "1,4"}},
            "--space tensor-parallel-size value 4 is more GPUs than the 2 this host has",
        ),
    ],
)
def test_more_gpus_than_the_host_has_is_refused_before_any_launch(
    overrides: dict[str, object], expected: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(load_config(None, {"backend": "sim", **overrides}))
    assert expected in str(err.value)
    assert not (tmp_path / "runs").exists()


def test_a_fixed_size_makes_the_virtual_host_that_large() -> None:
    ctx = resolve(load_config(None, {"backend": "sim", "tensor_parallel_size": 2}))
    assert ctx.gpu_count == 2 and ctx.gpus_of(TrialParams()) == 2


# --- ranked per GPU -----------------------------------------------------------------------


def _point(tp: int, rate: float) -> ScreenedPoint:
    return ScreenedPoint(
        params=TrialParams(max_num_seqs=256, tensor_parallel_size=tp), rate_per_s=rate,
        method=ScreenMethod.COMPUTED,
    )  # fmt: skip


def test_the_landscape_ranks_per_gpu() -> None:
    # one server over 4 GPUs serves the most, but 2 servers of 2 serve more per GPU
    ranked = _landscape([_point(1, 6.0), _point(2, 14.0), _point(4, 20.0)]).ranked()
    assert [p.params.tensor_parallel_size for p in ranked] == [2, 1, 4]
    assert per_gpu(14.0, ranked[0].params) == 7.0
    # unsearched: every setting on the same GPUs, ranked by the server's goodput
    assert per_gpu(14.0, TrialParams(max_num_seqs=8)) == 14.0


def _trial(number: int, tp: int, goodput: float, *, verdict: str = "met") -> FrozenTrial:
    return optuna.trial.create_trial(
        params={"max-num-seqs": 256, "tensor-parallel-size": tp},
        distributions={
            "max-num-seqs": IntDistribution(16, 512, log=True),
            "tensor-parallel-size": CategoricalDistribution([1, 2, 4]),
        },
        value=goodput / tp,
        user_attrs={
            "verdict": verdict, "goodput": goodput * 3, "goodput_arrival_rate_per_s": goodput,
            "throughput": goodput * 900, "ranked_gpus": tp, "goodput_bound": "bracketed",
        },
        state=TrialState.COMPLETE,
    )  # fmt: skip


def _numbered(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The trials as a study numbers them."""
    study = optuna.create_study(direction="maximize")
    for t in trials:
        study.add_trial(t)
    return study.trials


def test_the_best_trial_is_the_best_per_gpu() -> None:
    study = optuna.create_study(direction="maximize")
    for t in (_trial(0, 1, 6.0), _trial(1, 2, 13.0), _trial(2, 4, 22.0)):
        study.add_trial(t)
    best = best_trial(study)
    assert best is not None and best.params["tensor-parallel-size"] == 2


# --- the comparison ---------------------------------------------------------------------


def test_the_comparison_states_each_size_measured_before_predicted(tmp_path: Path) -> None:
    space = SearchSpace(
        ranges=(
            Range(knob=Knob.MAX_NUM_SEQS, low=16, high=512, log=True),
            Range(knob=TP, choices=(1, 2, 4)),
        )
    )
    trials = _numbered(
        [
            _trial(0, 1, 6.0), _trial(1, 2, 13.0), _trial(2, 2, 11.0),
            _trial(3, 4, 0.0, verdict="slo_missed"),
        ]
    )  # fmt: skip
    # the twin: 7/s at tp 1, 14.5 at tp 2 (measured beats both), 23 at tp 4 (never met)
    landscape = _landscape([_point(1, 7.0), _point(2, 14.5), _point(4, 23.0)])
    got = compare(space, 4, trials, landscape, GoodputUnit.CONVERSATIONS_PER_S)
    assert got is not None
    one, two, four = got.sizes
    assert (one.source, one.goodput_per_server, one.trial) == (Source.MEASURED, 6.0, 0)
    assert (two.source, two.goodput_per_server, two.trial) == (Source.MEASURED, 13.0, 1)
    assert two.goodput_per_gpu == 6.5 and two.servers_on(4) == 2 and two.host_goodput(4) == 26.0
    assert (four.source, four.goodput_per_server, four.trials_launched) == (
        Source.PREDICTED, 23.0, 1,
    )  # fmt: skip
    assert one.host_goodput(4) == 24.0
    best = got.best
    assert best is not None and best.tensor_parallel_size == 2  # 6.5 a GPU against 6.0
    text = "\n".join(got.lines())
    assert "tp 2: 13.00 a server, 6.50 a GPU; 2 server(s) on 4 GPUs: 26.00" in text
    assert "tp 4: 23.00 a server" in text and "predicted by the twin, not measured" in text
    assert "best a GPU: tp 2 (measured), +8% a GPU against servers of one GPU" in text
    got.write(tmp_path)
    assert read_parallelism(tmp_path) == got

    # without the knob there is nothing to compare
    plain = SearchSpace(ranges=(Range(knob=Knob.MAX_NUM_SEQS, low=16, high=512, log=True),))
    assert compare(plain, 4, trials, landscape, GoodputUnit.REQUESTS_PER_S) is None


def test_a_size_with_neither_a_measurement_nor_a_prediction_says_so() -> None:
    space = SearchSpace(ranges=(Range(knob=TP, choices=(1, 2)),))
    got = compare(
        space, 2, _numbered([_trial(0, 1, 5.0), _trial(1, 2, 0.0, verdict="startup_failed")]), None,
        GoodputUnit.REQUESTS_PER_S,
    )  # fmt: skip
    assert got is not None
    assert got.sizes[1].source is Source.NONE
    assert "  tp 2: no goodput at the SLO (1 trial(s) launched)" in got.lines()


# --- what the recommendation deploys ----------------------------------------------------------


def test_the_recommendation_deploys_its_size_on_that_many_gpus(tmp_path: Path) -> None:
    ctx = resolve(
        load_config(
            None,
            {"backend": "sim", "gpu_count": 4, "knobs": ("max-num-seqs", "tensor-parallel-size")},
        )
    )
    params = TrialParams(max_num_seqs=256, tensor_parallel_size=2)
    cfg = deployment(ctx, params, replicas=3)
    assert cfg.tensor_parallel_size == 2 and cfg.gpus_per_replica == 2
    assert "tensor-parallel-size" not in cfg.flags  # the field, not twice on the line
    hashes = {config_hash(ctx, {"max-num-seqs": 256}, tp) for tp in (1, 2)}
    assert len(hashes) == 2

    goodput = Goodput(
        arrival_rate_per_s=10.0, requests_per_s=30.0, output_tokens_per_s=9000.0,
        unit=GoodputUnit.CONVERSATIONS_PER_S, bound=GoodputBound.BRACKETED,
    )  # fmt: skip
    ctx2 = resolve(load_config(None, {"backend": "sim", "gpu_count": 4, "target_peak_rate": 50.0}))
    cap = capacity(ctx2, goodput, gpus_per_replica=2)
    assert cap is not None and cap.replicas == 7  # 50 / (10 x 0.8) = 6.25
    assert "7 replica(s) of 2 GPUs (14 GPUs)" in cap.text()
    from tuner.deploy import kubernetes_manifests

    docs = list(yaml.safe_load_all(kubernetes_manifests(cfg)))
    (dep,) = [d for d in docs if d and d.get("kind") == "Deployment"]
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["args"].count("--tensor-parallel-size") == 1


# --- the host's GPUs on a real one ---------------------------------------------------------


@pytest.mark.parametrize(("visible", "expected"), [(None, 4), ("0,1", 2), ("", 0), ("2", 1)])
def test_a_real_host_counts_the_gpus_cuda_visible_devices_leaves(
    visible: str | None, expected: int, standin_nvml: Callable[..., object]
) -> None:
    from tests.gpuhost import hosts
    from tuner.search.context import detect_gpu_count

    standin_nvml(hosts.h100_quad(), visible=visible)  # NVML of a 4-GPU host (no GPU here)
    assert detect_gpu_count() == expected


def test_a_real_host_refuses_more_gpus_than_it_has(monkeypatch: pytest.MonkeyPatch) -> None:
    import tuner.search.context as context
    from tuner.search.context import host_gpu_count
    from tuner.serving.server import Backend

    monkeypatch.setattr(context, "detect_gpu_count", lambda: 2)
    config = load_config(None, {"backend": "vllm"})
    assert host_gpu_count(config, Backend.VLLM, H100) == 2
    limited = load_config(None, {"backend": "vllm", "gpu_count": 1})
    assert host_gpu_count(limited, Backend.VLLM, H100) == 1
    with pytest.raises(ConfigError) as err:
        host_gpu_count(load_config(None, {"backend": "vllm", "gpu_count": 4}), Backend.VLLM, H100)
    assert "--gpu-count 4 is more GPUs than the 2 this host makes visible" in str(err.value)
    assert host_gpu_count(config, Backend.VLLM, None) == 1  # vLLM's CPU build: one device


def test_knobs_keep_the_offload_a_model_too_large_for_the_host_needs() -> None:
    # the README's `--knobs ...,tensor-parallel-size` for a 70B on a host of one H100:
    # the offload that joins on its own was filtered out, and no setting started
    ctx = resolve(
        load_config(
            None,
            {
                "backend": "sim", "model": "llama-3.1-70b",
                "knobs": ("gpu-memory-utilization", "max-num-seqs", "tensor-parallel-size"),
            },
        )
    )  # fmt: skip
    assert [r.knob for r in ctx.space.ranges] == [
        Knob.GPU_MEMORY_UTILIZATION, Knob.MAX_NUM_SEQS, Knob.CPU_OFFLOAD_GB,
    ]  # fmt: skip
    spread = resolve(
        load_config(
            None,
            {
                "backend": "sim", "model": "llama-3.1-70b", "gpu_count": 4,
                "knobs": ("gpu-memory-utilization", "max-num-seqs", "tensor-parallel-size"),
            },
        )
    )  # fmt: skip
    assert spread.space.range_of(Knob.CPU_OFFLOAD_GB) is None
    assert spread.space.range_of(TP) is not None

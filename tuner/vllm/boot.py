"""Cold and warm boots: what an empty compile cache costs vLLM's KV cache.

vLLM sizes its KV cache from a memory profile (``vllm/v1/worker/gpu_worker.py``
``determine_available_memory``): the torch peak increase of one profile run is charged
as *activation* memory and taken off the budget. With ``torch.compile`` on (the default;
not with ``--enforce-eager``) the first boot of a compile key (``VllmConfig.compute_hash``,
``tuner.sim.compile_cache``) compiles inside that profile run: Inductor's and Triton's
temporary allocations and autotuning buffers raise the peak, and the KV cache is sized
smaller until a restart finds the compiled graphs in ``$VLLM_CACHE_ROOT``. So the same
``--gpu-memory-utilization`` gives a *cold* boot (empty compile cache) a smaller KV
cache than a *warm* one, and near the edge can start warm and fail cold.

Sources (vllm-project/vllm, read 2026-12-04):

* issue #54122 "Cold AOT compilation is charged as peak activation memory, shrinking KV
  cache until restart" (RTX PRO 6000 Blackwell 96 GiB, MoE model): the mechanism, and
  a loss of tens of GiB per GPU there;
* issue #54383 "First boot of a new (max-num-batched-tokens, max-num-seqs) shape is granted
  a ~5% smaller KV cache" and its fix PR #54479, whose reporter measured on 2x RTX 4090
  (Qwen3-32B-AWQ, TP 2, ``--max-model-len 8192``, ``--gpu-memory-utilization 0.85``,
  ``--max-num-batched-tokens 3584 --max-num-seqs 40``) a cold deficit of 245 blocks,
  0.47 GiB per GPU, 4.5 % of the KV cache (the "about -4.5 %" of the tuner's issue 35);
* PR #54209 (open, "Exclude the compilation peak from memory profiling") and PR #54479
  (open): fixes not in a release the tuner knows, so every release is modelled as
  charging it.

The model: a cold boot's profiled activation is the warm one's plus
``COLD_COMPILE_FACTOR`` times it (Inductor autotunes the graphs of the largest shape the
profile runs, ``max_num_batched_tokens``, so its scratch grows with that shape's
activations; #54383 names the batch limits as the key). The factor is fitted to #54383's
figure: the memory model's activation for that case (Qwen3-32B, TP 2, 3584 tokens, 40
sequences: 0.36 GiB) against its 0.47 GiB deficit, 1.3. Other public figures are larger
(a 27B NVFP4 model on a Quadro RTX 8000, 1CatAI/1Cat-vLLM PR #518: warm peak 0.74 GiB,
cold 2.59 GiB plus 0.64 GiB more non-torch memory, a factor of 3.4), so a tune that
measured both a cold and a warm boot uses its own factor (``measured_compile_factor``).
"""

from __future__ import annotations

import re
from enum import StrEnum

from tuner.errors import ConfigError

# Cold compile memory as a share of the warm profile's activation peak (module docstring).
COLD_COMPILE_FACTOR = 1.3
COLD_COMPILE_SOURCE = (
    "vLLM issue #54383 / PR #54479: 0.47 GiB per GPU, 4.5 % of the KV cache, on a cold boot "
    "(mechanism: issue #54122)"
)
# A measured factor is kept within these bounds (a noisy pair of boots, not a new engine).
MEASURED_FACTOR_BOUNDS = (0.0, 10.0)

# vLLM's torch.compile lines (vllm/compilation/backends.py, decorators.py), as public logs
# print them (tests/fixtures/vllm_logs/boot_state) and ``tuner sim-serve`` reproduces them:
#   warm: "Directly load the compiled graph(s) for compile range (1, 8192) from the cache"
#         "Directly load AOT compilation from path ..."
#         "Directly lookup the graph for shape None from the cache" (0.7 and 0.8)
#   cold: "Compiling a graph for compile range (1, 8192) takes 21.3 s"
#         "Compiling model again due to a load failure from ..." (an AOT artifact refused)
# 0.7 and 0.8 also print "Compiling a graph for general shape takes 0.34 s" after a cache
# lookup, so that line alone says cold only where no lookup hit precedes it.
RE_WARM_COMPILE = re.compile(
    r"Directly load the compiled graph\(s\)|Directly load AOT compilation from path"
    r"|Directly lookup the graph for"
)
RE_COLD_COMPILE = re.compile(r"Compiling a graph for ")
RE_RECOMPILE = re.compile(r"Compiling model again due to a load failure")


class BootState(StrEnum):
    """The state of vLLM's compile cache when a server boots."""

    COLD = "cold"  # empty compile cache for its key: torch.compile runs inside the profile
    WARM = "warm"  # the compiled graphs are loaded from $VLLM_CACHE_ROOT

    @classmethod
    def parse(cls, text: str, *, option: str = "--production-boot") -> BootState:
        """One of the states by name; ConfigError of one line naming the bad value."""
        name = text.strip().lower()
        for state in cls:
            if state.value == name:
                return state
        raise ConfigError(
            f"{option} {text!r} is not a boot state; accepted: "
            + ", ".join(s.value for s in cls)
            + " (warm: the compile cache filled, as pods that mount it boot; cold: a new "
            "node with an empty compile cache)"
        )

    def describe(self) -> str:
        if self is BootState.COLD:
            return "cold boot (empty compile cache: torch.compile ran inside the memory profile)"
        return "warm boot (compiled graphs loaded from the compile cache)"


def cold_compile_bytes(
    warm_activation_bytes: int, *, enforce_eager: bool, factor: float | None = None
) -> int:
    """What a cold boot's profile charges on top of the warm activation peak (0 without
    torch.compile: ``--enforce-eager`` compiles nothing)."""
    if enforce_eager or warm_activation_bytes <= 0:
        return 0
    share = COLD_COMPILE_FACTOR if factor is None else factor
    return int(warm_activation_bytes * share)


def warm_activation_of(
    cold_activation_bytes: int, *, enforce_eager: bool, factor: float | None = None
) -> int:
    """The warm activation peak behind a cold boot's measured one (the inverse of
    ``cold_compile_bytes``)."""
    if enforce_eager:
        return cold_activation_bytes
    share = COLD_COMPILE_FACTOR if factor is None else factor
    return int(cold_activation_bytes / (1.0 + share))


def measured_compile_factor(cold_activation_bytes: int, warm_activation_bytes: int) -> float | None:
    """The factor a cold and a warm boot at the same batch limits measured; None where the
    warm one measured no activation."""
    if warm_activation_bytes <= 0:
        return None
    low, high = MEASURED_FACTOR_BOUNDS
    return min(high, max(low, cold_activation_bytes / warm_activation_bytes - 1.0))


def boot_state_of_log(text: str) -> BootState | None:
    """The boot state a vLLM startup log shows: WARM where it loaded compiled graphs, COLD
    where it compiled; None where it shows neither (``--enforce-eager``, or a log cut short
    before torch.compile)."""
    if RE_RECOMPILE.search(text) is not None:
        return BootState.COLD  # an artifact refused: compiled again inside the profile
    warm = RE_WARM_COMPILE.search(text) is not None
    if RE_COLD_COMPILE.search(text) is not None and not warm:
        return BootState.COLD
    if warm:
        return BootState.WARM
    return None

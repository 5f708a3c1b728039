"""The vLLM versions the tuner can emulate, and what changed between them.

Only behaviour the tuner depends on is recorded: how startup memory is
accounted and logged, which flags exist, and the defaults the OpenAI server
applies. Each boundary was read in the released vLLM wheels (each entry below names
its source); where a change landed between two releases that were not both
read, the later one is given.
"""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from tuner.errors import UnknownVersionError

OLDEST_SUPPORTED = (0, 9)  # the V1 engine; 0.9 accounts memory as 0.10 does
CURRENT_RELEASE = (0, 33)

# Each boundary is the first release with the new behaviour.
SWAP_SPACE_REMOVED = (0, 18)  # `--swap-space` is an unrecognized argument
BLOCK_SIZE_256_ACCEPTED = (0, 11, 2)  # argparse choices gain 256
BLOCK_SIZE_ANY_INT = (0, 18)  # --block-size is a plain positive int, no choices
KV_CACHE_MEMORY_BYTES_FLAG = (0, 10, 2)
RESERVE_FULL_ISL = (0, 19)  # a waiting request is admitted only if its whole sequence fits
CUDAGRAPH_IN_BUDGET = (0, 20)  # CUDA-graph estimate subtracted from the KV budget
DEFAULT_UTILIZATION_092 = (0, 20)  # default gpu_memory_utilization 0.9 -> 0.92
TOKENS_FROM_CONCURRENCY = (0, 21)  # "GPU KV cache size" = int(max_concurrency * max_model_len)
DOCS_LINK_IN_KV_ERRORS = (0, 13)
FORMAT_GIB = (0, 14)  # "cuda:0" in the free-memory error; "%s GiB" without padding
MODEL_S_TYPO_FIXED = (0, 25)  # "models's" -> "model's"; CPU-backend note in KV errors
SLIDING_WINDOW_IN_FLIGHT = (0, 26)  # sliding-window need uses 2 x max_num_batched_tokens
COMBINED_KV_LOG_LINE = (0, 28)  # one "GPU KV cache size: ..., Maximum concurrency ..." line
BIG_GPU_TIER = (0, 28)  # >= 160 GiB GPUs default to 16384 batched tokens
# A chat or completions request's own ``stream_interval`` (tokens batched into each
# streamed chunk, at least the server's --stream-interval): vLLM PR #49754, merged
# 2026-07-24, between 0.25.1 (2026-07-15) and 0.27.1 (2026-08-13); read in 0.32's
# entrypoints/openai/chat_completion/protocol.py and v1/engine/output_processor.py.
REQUEST_STREAM_INTERVAL = (0, 27)
# KV offloading to CPU memory (not read in the wheels: the merge dates of vLLM's pull
# requests, and the first release cut after each). --kv-offloading-size and
# --kv-offloading-backend: #27621, merged 2025-10-28 (vllm/config/kv_offloading.py); the
# native connector's "eviction_policy" "arc" beside "lru": #27039, October 2025.
KV_OFFLOADING_FLAGS = (0, 11, 1)
# --kv-offloading-backend defaults to "native" (#32421, merged 2026-01-15); before, a size
# without a backend is a ValueError ("kv_offloading_backend must be specified ...").
KV_OFFLOADING_NATIVE_DEFAULT = (0, 14)
# kv_connector_extra_config "store_threshold" (#35342, merged 2026-02-26): a block is stored
# to the CPU only once it was seen that many times; older releases ignore the key.
KV_OFFLOAD_STORE_THRESHOLD = (0, 17)
# --kv-cache-metrics and --kv-cache-metrics-sample (KV cache residency histograms:
# vllm:kv_block_lifetime_seconds, vllm:kv_block_idle_before_evict_seconds,
# vllm:kv_block_reuse_gap_seconds): vLLM PR #27793, merged in the week to 2025-12-05
# (vLLM's weekly summary), between 0.12.0 (2025-12-03) and 0.13.0; read in 0.32's
# config/observability.py, v1/core/kv_cache_metrics.py and v1/metrics/loggers.py.
KV_CACHE_METRICS_FLAG = (0, 13)
STARTING_SERVER_LINE = (
    0,
    33,
)  # "Starting vLLM server on" (before: "Starting vLLM API server 0 on")

_VERSION_TEXT = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+\-]?[0-9A-Za-z.+\-]*)?")


class VllmVersion(BaseModel):
    """A vLLM release as (major, minor, patch) with the traits the tuner needs."""

    model_config = ConfigDict(frozen=True)

    major: int
    minor: int
    patch: int = 0

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.major, self.minor, self.patch)

    def at_least(self, boundary: tuple[int, ...]) -> bool:
        return self.key >= tuple(boundary) + (0,) * (3 - len(boundary))

    @property
    def has_swap_space(self) -> bool:
        return not self.at_least(SWAP_SPACE_REMOVED)

    @property
    def reserves_full_sequence(self) -> bool:
        """The scheduler admits a waiting request only when its whole sequence fits in free blocks."""
        return self.at_least(RESERVE_FULL_ISL)

    @property
    def cudagraph_in_budget(self) -> bool:
        return self.at_least(CUDAGRAPH_IN_BUDGET)

    @property
    def has_kv_offloading(self) -> bool:
        """``--kv-offloading-size`` and ``--kv-offloading-backend`` exist."""
        return self.at_least(KV_OFFLOADING_FLAGS)

    @property
    def has_kv_cache_metrics(self) -> bool:
        """``--kv-cache-metrics`` (the KV block residency histograms) exists."""
        return self.at_least(KV_CACHE_METRICS_FLAG)

    @property
    def default_gpu_memory_utilization(self) -> float:
        return 0.92 if self.at_least(DEFAULT_UTILIZATION_092) else 0.9

    @property
    def block_size_choices(self) -> tuple[int, ...] | None:
        """argparse choices for --block-size; None once any positive int is accepted."""
        if self.at_least(BLOCK_SIZE_ANY_INT):
            return None
        if self.at_least(BLOCK_SIZE_256_ACCEPTED):
            return (1, 8, 16, 32, 64, 128, 256)
        return (1, 8, 16, 32, 64, 128)

    @property
    def known(self) -> bool:
        """A release the tuner emulates: between the oldest supported and the newest known."""
        return OLDEST_SUPPORTED <= (self.major, self.minor) <= CURRENT_RELEASE

    @property
    def minor_release(self) -> tuple[int, int]:
        """(major, minor): releases that differ in it change defaults and behaviour."""
        return (self.major, self.minor)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    @classmethod
    def read(cls, text: str) -> VllmVersion | None:
        """The release a version string names (``0.10.1.1``, ``v0.11.0+cpu``,
        ``0.26.1rc1.dev156+g0eec856cc``), whether or not the tuner knows it; None when it
        names none."""
        match = _VERSION_TEXT.fullmatch(text.strip())
        if match is None:
            return None
        return cls(major=int(match[1]), minor=int(match[2]), patch=int(match[3] or 0))

    @classmethod
    def parse(cls, text: str) -> VllmVersion:
        """A release the tuner emulates (``--vllm-version``); one line naming the range else."""
        version = cls.read(text)
        supported = f"{OLDEST_SUPPORTED[0]}.{OLDEST_SUPPORTED[1]} to {CURRENT_RELEASE[0]}.{CURRENT_RELEASE[1]}"
        if version is None:
            raise UnknownVersionError(
                f"vLLM version {text!r} is not a version number; give X.Y or X.Y.Z ({supported})"
            )
        if not version.known:
            raise UnknownVersionError(
                f"vLLM version {text!r} is not emulated; supported versions: {supported}"
            )
        return version

    @classmethod
    def current(cls) -> VllmVersion:
        return cls(major=CURRENT_RELEASE[0], minor=CURRENT_RELEASE[1])


# What vLLM prints of its own release at startup, in the three forms of the last year's
# releases: the API server's line (0.9 to 0.13: "vLLM API server version 0.10.1.1"), its
# banner (0.14 on: "... █ ▀▄▀ █  version 0.19.1"), and the engine core's
# "Initializing a V1 LLM engine (v0.10.1.1) with config: ..." (the V0 engine's
# "Initializing an LLM engine (v0.8.5) ..." before 0.10). The one pattern for a release in a
# log: the startup parser (``tuner.vllm.log``) and the cross-check read it.
LOGGED_VERSION = re.compile(
    r"vLLM API server version\s+v?(?P<api>\d+\.\d+\S*)"
    r"|█\s+version\s+v?(?P<banner>\d+\.\d+\S*)"
    r"|Initializing an? (?:V1 )?LLM engine \(v?(?P<engine>\d+\.\d+[^)\s]*)\)"
)


def logged_version_text(text: str) -> str | None:
    """The release as a log spells it at its first mention (``0.26.1rc1.dev156+g0eec856cc``),
    None when the text names none."""
    for match in LOGGED_VERSION.finditer(text):
        named = match["api"] or match["banner"] or match["engine"]
        if VllmVersion.read(named) is not None:
            return str(named)
    return None


def logged_version(text: str) -> VllmVersion | None:
    """The vLLM release a startup log names (its first mention), known to the tuner or
    not; None when the log names none."""
    named = logged_version_text(text)
    return None if named is None else VllmVersion.read(named)


class ReleaseFit(StrEnum):
    """How an installed vLLM release relates to the releases the tuner emulates."""

    KNOWN = "known"  # emulated: its own behaviour is assumed
    UNKNOWN = "unknown"  # could not be read: the newest known is assumed
    NEWER = "newer"  # newer than the newest known: the newest known is assumed
    OLDER = "older"  # older than the oldest supported: not tuned


def assumed_release(installed: VllmVersion | None) -> tuple[VllmVersion, ReleaseFit]:
    """The release whose behaviour the tuner assumes for an installed one (None: unread)."""
    if installed is None:
        return VllmVersion.current(), ReleaseFit.UNKNOWN
    if installed.minor_release > CURRENT_RELEASE:
        return VllmVersion.current(), ReleaseFit.NEWER
    if installed.minor_release < OLDEST_SUPPORTED:
        return installed, ReleaseFit.OLDER
    return installed, ReleaseFit.KNOWN


def logged_disagreement(
    installed: VllmVersion | None, assumed: VllmVersion, logged: VllmVersion | None
) -> str | None:
    """One line when the release a startup log names is not the one read before launching
    (or assumed, where none was read); None when they agree or the log names none."""
    if logged is None:
        return None
    if installed is None:
        if logged.minor_release == assumed.minor_release:
            return None
        return (
            f"vLLM's startup log names release {logged}; its version could not be read before "
            f"launching, so this tune assumes vLLM {assumed.major}.{assumed.minor}'s behaviour "
            f"(pass --vllm-cmd with the interpreter that has vLLM installed to read it)"
        )
    if logged.key == installed.key:
        return None
    return (
        f"vLLM's startup log names release {logged}, but {installed} was read from the "
        "launcher's installed packages: another vLLM than the one inspected is starting "
        "(check --vllm-cmd and its environment)"
    )

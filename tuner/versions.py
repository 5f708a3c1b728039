"""The vLLM versions the tuner can emulate, and what changed between them.

Only behaviour the tuner depends on is recorded: how startup memory is
accounted, which flags exist, and the defaults the OpenAI server applies.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from tuner.errors import UnknownVersionError

OLDEST_SUPPORTED = (0, 10)
CURRENT_RELEASE = (0, 19)
# `--swap-space` is an unrecognized argument from this release on.
SWAP_SPACE_REMOVED = (0, 18)
# From this release vLLM profiles CUDA-graph memory before sizing the KV cache and
# subtracts it; 0.10 and 0.11 captured graphs after the KV cache was allocated.
CUDAGRAPH_IN_BUDGET = (0, 12)


class VllmVersion(BaseModel):
    """A vLLM release as (major, minor[, patch]) with the traits the tuner needs."""

    model_config = ConfigDict(frozen=True)

    major: int
    minor: int
    patch: int = 0

    @property
    def key(self) -> tuple[int, int]:
        return (self.major, self.minor)

    @property
    def has_swap_space(self) -> bool:
        return self.key < SWAP_SPACE_REMOVED

    @property
    def cudagraph_in_budget(self) -> bool:
        return self.key >= CUDAGRAPH_IN_BUDGET

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    @classmethod
    def parse(cls, text: str) -> VllmVersion:
        match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+\-].*)?", text.strip())
        supported = f"{OLDEST_SUPPORTED[0]}.{OLDEST_SUPPORTED[1]} to {CURRENT_RELEASE[0]}.{CURRENT_RELEASE[1]}"
        if match is None:
            raise UnknownVersionError(
                f"vLLM version {text!r} is not a version number; give X.Y or X.Y.Z ({supported})"
            )
        version = cls(major=int(match[1]), minor=int(match[2]), patch=int(match[3] or 0))
        if not (OLDEST_SUPPORTED <= version.key <= CURRENT_RELEASE):
            raise UnknownVersionError(
                f"vLLM version {text!r} is not emulated; supported versions: {supported}"
            )
        return version

    @classmethod
    def current(cls) -> VllmVersion:
        return cls(major=CURRENT_RELEASE[0], minor=CURRENT_RELEASE[1])

"""The one registry of the ``vllm serve`` flags the tuner sets, reads or searches.

Each ``VllmFlag`` says once what every other module needs of a flag: its name, how it
is spelled on a command line (a value, a bare switch, or a ``--x``/``--no-x`` pair),
the value that leaves vLLM's default, which releases accept it, the attribute that
holds it (``ServingParams``, ``TrialParams`` or the launch), and the short name of a
trial's one-line summary. From it:

* ``add_memory_flags``/``params_from_args``: the flags of ``tuner trial``, ``bench``,
  ``serve`` and ``simulate``, under vLLM's names;
* ``accepted_options``: what an emulated release accepts (``tuner sim-serve`` answers
  the others as vLLM does, and a launch leaves them out with the reason);
* ``command_line``: a launch's settings as ``(option, value)`` pairs, those at vLLM's
  default left out (the server's command line, sim or real);
* ``FLAGS_BY_NAME[name].short``: a trial's settings in one line.

The deployable configs (``tuner.deploy``) write the recommendation's flags by these
names too. Release boundaries are ``tuner.vllm.versions``'.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from tuner.vllm.memory import ServingParams
from tuner.vllm.versions import (
    KV_CACHE_MEMORY_BYTES_FLAG,
    KV_CACHE_METRICS_FLAG,
    KV_OFFLOADING_FLAGS,
    SWAP_SPACE_REMOVED,
    VllmVersion,
)


class FlagForm(StrEnum):
    """How a flag is spelled on vLLM's command line."""

    VALUE = "value"  # --name VALUE
    SWITCH = "switch"  # --name, or nothing
    TOGGLE = "toggle"  # --name or --no-name


@dataclass(frozen=True)
class VllmFlag:
    name: str  # without dashes, as vLLM's config file keys it
    form: FlagForm
    value_type: Callable[[str], object] | None = None  # VALUE: argparse's type
    field: str | None = None  # the attribute that holds it (None: the launch's own)
    unset: object = None  # the value that leaves vLLM's default (not written)
    short: str | None = None  # in a trial's one-line summary
    since: tuple[int, ...] | None = None  # the first release that accepts it
    until: tuple[int, ...] | None = None  # the first release that no longer does
    memory: bool = False  # one of the memory and scheduling flags every command takes
    help: str | None = None
    gone: str | None = None  # why a launch leaves it out on a release past ``until``

    @property
    def option(self) -> str:
        return f"--{self.name}"

    @property
    def dest(self) -> str:
        return self.field or self.name.replace("-", "_")

    def accepted_by(self, version: VllmVersion) -> bool:
        if self.since is not None and not version.at_least(self.since):
            return False
        return self.until is None or not version.at_least(self.until)

    def options(self) -> tuple[str, ...]:
        """Every spelling vLLM's parser knows."""
        if self.form is FlagForm.TOGGLE:
            return (self.option, f"--no-{self.name}")
        return (self.option,)

    def spelled(self, value: object) -> tuple[str, str | None] | None:
        """``(option, value text)`` for a launch; None at vLLM's default."""
        if value is None or value == self.unset:
            return None
        if self.form is FlagForm.SWITCH:
            return (self.option, None) if value else None
        if self.form is FlagForm.TOGGLE:
            return (self.option if value else f"--no-{self.name}", None)
        return self.option, str(value)


FLAGS: tuple[VllmFlag, ...] = (
    VllmFlag(
        "gpu-memory-utilization", FlagForm.VALUE, float, short="util", memory=True,
        help="default: the emulated release's (0.92 from 0.20, 0.9 before)",
    ),
    VllmFlag("max-num-seqs", FlagForm.VALUE, int, short="seqs", memory=True),
    VllmFlag("max-num-batched-tokens", FlagForm.VALUE, int, short="mnbt", memory=True),
    VllmFlag("block-size", FlagForm.VALUE, int, short="bs", memory=True),
    VllmFlag("max-model-len", FlagForm.VALUE, int, memory=True),
    VllmFlag(
        "kv-cache-memory-bytes", FlagForm.VALUE, int, since=KV_CACHE_MEMORY_BYTES_FLAG,
        memory=True,
    ),
    VllmFlag(
        "swap-space", FlagForm.VALUE, float, field="swap_space_gib", short="swap",
        until=SWAP_SPACE_REMOVED,
        gone="--swap-space does not exist in vLLM 0.18 and later (the V1 engine never swaps)",
    ),
    VllmFlag("kv-cache-dtype", FlagForm.VALUE, str, unset="auto", short="kv", memory=True),
    VllmFlag("tensor-parallel-size", FlagForm.VALUE, int, unset=1, short="tp", memory=True),
    VllmFlag("cpu-offload-gb", FlagForm.VALUE, float, unset=0.0, short="offload", memory=True),
    VllmFlag("enforce-eager", FlagForm.SWITCH, memory=True),
    VllmFlag("enable-chunked-prefill", FlagForm.TOGGLE, unset=True, memory=True),
    VllmFlag("enable-prefix-caching", FlagForm.TOGGLE, short="prefix"),
    # KV offloading to CPU memory (vllm/config/cache.py: kv_offloading_size, GiB over all
    # ranks; kv_offloading_backend native | lmcache). The native connector's eviction policy
    # and store threshold ride in --kv-transfer-config's kv_connector_extra_config.
    VllmFlag(
        "kv-offloading-size", FlagForm.VALUE, float, field="kv_offloading_size_gib",
        short="cpu-kv", since=KV_OFFLOADING_FLAGS,
        gone="--kv-offloading-size does not exist before vLLM 0.11.1",
    ),
    VllmFlag(
        "kv-offloading-backend", FlagForm.VALUE, str, since=KV_OFFLOADING_FLAGS,
        gone="--kv-offloading-backend does not exist before vLLM 0.11.1",
    ),
    VllmFlag("kv-transfer-config", FlagForm.VALUE, str, short="kv-transfer"),
    # KV block residency histograms (vllm/config/observability.py: kv_cache_metrics, and
    # kv_cache_metrics_sample, the share of blocks sampled, default 0.01).
    VllmFlag(
        "kv-cache-metrics", FlagForm.SWITCH, since=KV_CACHE_METRICS_FLAG,
        gone="--kv-cache-metrics does not exist before vLLM 0.13",
    ),
    VllmFlag(
        "kv-cache-metrics-sample", FlagForm.VALUE, float, since=KV_CACHE_METRICS_FLAG,
        gone="--kv-cache-metrics-sample does not exist before vLLM 0.13",
    ),
    VllmFlag("served-model-name", FlagForm.VALUE, str),
    VllmFlag("host", FlagForm.VALUE, str),
    VllmFlag("port", FlagForm.VALUE, int),
)  # fmt: skip

# The native offloading connector's built-in eviction policies (kv_connector_extra_config's
# "eviction_policy"; vllm/v1/kv_offload/cpu/policies: lru.py, arc.py). SLRU and a
# session-aware policy are open pull requests, not in a release.
KV_OFFLOAD_EVICTION_POLICIES = ("lru", "arc")

FLAGS_BY_NAME: Mapping[str, VllmFlag] = {f.name: f for f in FLAGS}
FLAGS_BY_OPTION: Mapping[str, VllmFlag] = {o: f for f in FLAGS for o in f.options()}


def accepted_options(version: VllmVersion) -> frozenset[str]:
    """Every option an emulated release of vLLM accepts, of those in the registry."""
    return frozenset(o for f in FLAGS if f.accepted_by(version) for o in f.options())


def command_line(values: Mapping[str, object]) -> list[tuple[str, str | None]]:
    """A launch's settings (by flag name) as ``(option, value text)`` pairs in the
    registry's order, those at vLLM's default left out."""
    pairs: list[tuple[str, str | None]] = []
    for flag in FLAGS:
        if flag.name in values and (spelled := flag.spelled(values[flag.name])) is not None:
            pairs.append(spelled)
    return pairs


def serving_values(params: ServingParams) -> dict[str, object]:
    """A ``ServingParams``' flags, by flag name."""
    return {f.name: getattr(params, f.dest) for f in FLAGS if f.memory}


def add_memory_flags(parser: argparse.ArgumentParser) -> None:
    """Add vLLM's memory and scheduling flags under vLLM's names; None means vLLM's
    default for the version."""
    for flag in FLAGS:
        if not flag.memory:
            continue
        if flag.form is FlagForm.SWITCH:
            parser.add_argument(flag.option, action="store_true", help=flag.help)
        elif flag.form is FlagForm.TOGGLE:  # only the spelling that leaves the default
            off = f"--no-{flag.name}" if flag.unset else flag.option
            action = "store_false" if flag.unset else "store_true"
            parser.add_argument(off, dest=flag.dest, action=action, help=flag.help)
        else:
            parser.add_argument(
                flag.option, type=flag.value_type or str, default=flag.unset, help=flag.help
            )
    parser.add_argument(
        "--vllm-version", help="emulated vLLM version X.Y (default: current release)"
    )


def params_from_args(args: argparse.Namespace) -> ServingParams:
    values = {f.dest: getattr(args, f.dest) for f in FLAGS if f.memory}
    return ServingParams.model_validate(values).checked()

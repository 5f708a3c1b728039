"""TuneContext: a TuneConfig resolved against this machine, before any server is launched.

Resolves the backend (``auto``: the real vLLM when NVML sees an NVIDIA GPU, found where
users install it by ``tuner.serving.vllm_install``, and one line where none is; else the
simulated engine), the GPU profile, the vLLM release (read through the launcher's own
interpreter; a note where it is unknown or newer than the tuner knows) and the flags it
accepts, the model, the workload with its SLO overrides and the search space. Every
bad value fails here with one line, before anything starts.

Both types here are frozen. ``TuneContext`` is what ``resolve`` found and does not change
for the run; what the study decides once it is open (the simulator's time scale, the
share of requests streamed, the memory model's calibration) is a ``StudySetup``, which
``tuner.search.study.trial_loop.TrialLoop.prepare`` returns and every launch is handed beside the
context (a calibrated one replaces it after the first real startup).
"""

from __future__ import annotations

import logging
import math
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.errors import ConfigError, TunerError, UnknownModelError
from tuner.run.config import TuneConfig
from tuner.serving.hub import FetchedModel, fetch_model
from tuner.serving.load import resolve_workload
from tuner.serving.nvml_host import VisibleGpu, visible_gpus
from tuner.serving.processes import writable_dir
from tuner.serving.server import Backend, probe_vllm_flags
from tuner.serving.vllm_install import VllmInstall, installed_version, require_vllm
from tuner.sim.timing import TimingFactors
from tuner.vllm.failures import StartupFailureKind
from tuner.vllm.flags import accepted_options
from tuner.vllm.gpus import GpuSpec, cpu_device, get_gpu, gpu_from_nvml
from tuner.vllm.host_memory import simulated_host_bytes, this_host_bytes
from tuner.vllm.memory import Calibration, ServingParams
from tuner.vllm.models import ModelSpec, launch_name, load_model_dir, resolve_model
from tuner.vllm.platform import DEFAULT_CPU_KV_CACHE_BYTES
from tuner.vllm.space import (
    Knob,
    Range,
    SearchSpace,
    TrialParams,
    build_space,
    check_for_target,
    parse_range,
)
from tuner.vllm.versions import OLDEST_SUPPORTED, ReleaseFit, VllmVersion, assumed_release
from workloads.spec import WorkloadSpec

if TYPE_CHECKING:
    from tuner.serving.live_server import ServerFactory

log = logging.getLogger(__name__)

DEFAULT_SIM_GPU = "H100-80GB"
ALLOW_LONG_MAX_MODEL_LEN_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


@dataclass(frozen=True)
class TuneContext:
    config: TuneConfig
    backend: Backend
    model: ModelSpec
    gpu: GpuSpec | None  # None: no GPU profile (vLLM's CPU build)
    version: VllmVersion
    vllm_cmd: tuple[str, ...]
    accepted_flags: frozenset[str] | None
    workload: WorkloadSpec
    space: SearchSpace
    base: ServingParams
    run_dir: Path
    model_dir: Path | None = None  # whose tokenizer sizes the prompts
    gpu_source: str = "auto"  # nvml, sim or none, resolved from the backend and NVML
    notes: tuple[str, ...] = ()
    # What the twin simulates the server on: the GPU profile, or on vLLM's CPU build a
    # profile of the host it learns from the trials (``tuner.vllm.gpus.cpu_device``); and
    # the settings every setting of the space is simulated from (on the CPU build, the
    # KV cache the launcher gives it). None: no twin.
    twin_device: GpuSpec | None = None
    twin_base: ServingParams | None = None
    # The GPUs one server may take on this host: the simulated host's (--gpu-count, else
    # the --tensor-parallel-size), or those NVML sees that CUDA_VISIBLE_DEVICES leaves.
    gpu_count: int = 1
    # The vLLM release as its launcher's packages spell it ("0.10.1.1"; None: the simulated
    # engine, or unreadable); ``version`` is the release whose behaviour is assumed.
    installed_version: str | None = None
    # What makes the server of every launch (``tuner.search.evaluate.live_server``): None,
    # ``LiveServer``; a test's stand-in (``run_tune(server_factory=)``), never the CLI's.
    server_factory: ServerFactory | None = None

    @property
    def release(self) -> str:
        """The vLLM release measured: the installed one where it was read, else the assumed."""
        return self.installed_version or str(self.version)

    @property
    def twin(self) -> tuple[GpuSpec, ServingParams] | None:
        """The twin's device and base settings where it can predict this workload (an
        arrival rate to search), else None."""
        if self.twin_device is None or self.workload.mean_rate_per_s is None:
            return None
        return self.twin_device, self.twin_base or self.base

    @property
    def study_name(self) -> str:
        return self.config.study_name(self.gpu_name)

    @property
    def gpu_name(self) -> str | None:
        return self.gpu.name if self.gpu is not None else None

    def gpus_of(self, params: TrialParams) -> int:
        """GPUs one server of ``params`` takes: its tensor-parallel size, searched or set."""
        return params.tensor_parallel_size or self.base.tensor_parallel_size

    @property
    def gpu_or_default(self) -> GpuSpec:
        """The GPU profile, or the simulator's default where there is none (vLLM's CPU build)."""
        return self.gpu if self.gpu is not None else get_gpu(DEFAULT_SIM_GPU)


@dataclass(frozen=True, kw_only=True)
class StudySetup:
    """How a study measures every trial, decided once per study (``TrialLoop.prepare``,
    recorded in the study's attributes) and handed to every launch beside the context."""

    time_scale: float = 1.0  # the simulator's clock slowed this many times (1.0: vLLM)
    stream_fraction: float = 1.0  # share of requests streamed (token timings); see sample_streams
    stream_interval: int = 1  # tokens a streamed event carries (vLLM's stream_interval)
    calibration: Calibration | None = None  # the memory model's, from the first real startup
    # The twin's step costs: the paper's, a --twin-from run's, then fitted after each trial.
    timing: TimingFactors = field(default_factory=TimingFactors)
    # Settings whose simulated server fell behind a faster clock (its own core, while its
    # load generator kept up), with the clock they were measured on after it: their later
    # launches (a confirmation, a tie's measurement) start there (``time_scale_for``).
    # Pairs of the settings' JSON and a time scale; recorded with the clock of now in the
    # study (``clock_record``), where a resumed run finds them.
    slower_clocks: tuple[tuple[str, float], ...] = ()

    def calibrated(self, calibration: Calibration) -> StudySetup:
        return replace(self, calibration=calibration)

    def time_scale_for(self, params: TrialParams) -> float:
        """The clock a launch of ``params`` runs on: the study's, or the slower one its
        simulated server needed before (``slower_clocks``)."""
        own = dict(self.slower_clocks).get(params.model_dump_json())
        return self.time_scale if own is None else max(self.time_scale, own)

    def with_slower_clock(self, params: TrialParams, time_scale: float) -> StudySetup:
        """This set-up with ``params``'s launches on ``time_scale`` (``slower_clocks``)."""
        key = params.model_dump_json()
        kept = tuple((k, scale) for k, scale in self.slower_clocks if k != key)
        return replace(self, slower_clocks=(*kept, (key, time_scale)))

    def learned(self, timing: TimingFactors) -> StudySetup:
        return replace(self, timing=timing)

    def clock_record(self) -> dict[str, Any]:
        """The clock the run measures on now, as the study records it for a run that
        resumes it (``with_clock_record``): the time scale and tokens an event its trials
        adapted to (``TrialLoop._adapt_clock``), and the settings' slower clocks."""
        return {
            "time_scale": self.time_scale,
            "stream_interval": self.stream_interval,
            "slower_clocks": [[key, scale] for key, scale in self.slower_clocks],
        }

    def with_clock_record(self, record: Mapping[str, Any]) -> StudySetup:
        """This set-up on the clock ``clock_record`` recorded: a resumed run goes on where
        the run before had adapted it (its clock, its tokens an event, the settings whose
        server needed a slower one), not on the study's first clock, on which a level
        whose load generator or server lags is measured again."""
        return replace(
            self,
            time_scale=float(record["time_scale"]),
            stream_interval=int(record["stream_interval"]),
            slower_clocks=tuple(
                (str(key), float(scale)) for key, scale in record.get("slower_clocks", ())
            ),
        )


def _nvml_devices() -> tuple[VisibleGpu, ...]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES mapped to NVML's devices
    (``tuner.serving.nvml_host``; a MIG slice is its MIG device); () without a driver.
    ConfigError (one line) where NVML refuses the MIG queries."""
    return visible_gpus()


def detect_gpu_name() -> str | None:
    """The first GPU this process may use, as NVML names it, or None without a driver or
    a visible device."""
    gpus = _nvml_devices()
    return gpus[0].name if gpus else None


def detect_gpu_count() -> int:
    """NVIDIA GPUs this process may use: those NVML sees that CUDA_VISIBLE_DEVICES names
    (indices, GPU-/MIG- UUIDs, as CUDA reads it); 0 without a driver."""
    return len(_nvml_devices())


def detect_gpu_profile(nvml_name: str) -> tuple[GpuSpec, str | None]:
    """The profile of the first GPU this process may use (``tuner.vllm.gpus.gpu_from_nvml``:
    a preset part, or NVML's memory and compute capability with its family's rates, or a
    MIG slice's share), and the line that says how it was planned where it is no preset.
    UnknownGpuError (one line) where NVML gives too little to plan it."""
    gpus = _nvml_devices()
    if gpus:
        resolved = gpus[0].profile()
    else:  # NVML named it but lists no device now: a preset part or nothing
        resolved = gpu_from_nvml(nvml_name, total_bytes=None, compute_capability=None)
    return resolved.spec, resolved.note


def _vllm_gpu(typed: str | None, nvml_name: str | None) -> tuple[GpuSpec | None, str | None]:
    """The GPU profile on the vLLM backend and its note: a ``--gpu`` name as typed (an
    unknown one is an error), else NVML's; None: no GPU (vLLM's CPU build, --gpu none)."""
    name = typed or nvml_name
    if not name or name.lower() in ("none", "cpu"):
        return None, None
    if typed:
        return get_gpu(typed), None
    return detect_gpu_profile(name)


def host_gpu_count(config: TuneConfig, backend: Backend, gpu: GpuSpec | None) -> int:
    """The GPUs one server may take: the simulated host has ``--gpu-count`` (default: the
    ``--tensor-parallel-size``); a real one those it has, which ``--gpu-count`` may limit."""
    fixed = config.tensor_parallel_size
    if gpu is None:
        count = 1  # vLLM's CPU build: one device
    elif backend is Backend.SIM:
        count = config.gpu_count or fixed
    else:
        found = detect_gpu_count()
        if config.gpu_count is not None and found and config.gpu_count > found:
            raise ConfigError(
                f"--gpu-count {config.gpu_count} is more GPUs than the {found} this host "
                f"makes visible (NVML, CUDA_VISIBLE_DEVICES); accepted: 1 to {found}"
            )
        count = config.gpu_count or max(found, 1)
    if fixed > count:
        raise ConfigError(
            f"--tensor-parallel-size {fixed} is more GPUs than the {count} of this host "
            f"(--gpu-count); accepted: 1 to {count}"
        )
    return count


def resolve_backend(config: TuneConfig, gpu_name: str | None) -> tuple[Backend, VllmInstall | None]:
    """The backend and, for vLLM, where it is installed (``tuner.serving.vllm_install``).

    ``auto`` is the real vLLM where NVML sees a GPU (``gpu_name``), the simulated engine
    elsewhere. A GPU host, or ``--backend vllm``, without a vLLM to launch is one line,
    before anything starts: never a silent simulation.
    """
    if config.backend == "auto":
        backend = Backend.VLLM if gpu_name is not None else Backend.SIM
    else:
        try:
            backend = Backend(config.backend)
        except ValueError:
            raise ConfigError(
                f"--backend {config.backend!r} is not a backend; accepted: auto, "
                + ", ".join(b.value for b in Backend)
            ) from None
    if backend is Backend.SIM:
        return backend, None
    if config.backend == "auto":
        return backend, require_vllm(
            config.vllm_cmd, why=f"NVML sees a GPU here ({gpu_name}) but no vLLM"
        )
    return backend, require_vllm(config.vllm_cmd)


def with_slo_overrides(spec: WorkloadSpec, config: TuneConfig) -> WorkloadSpec:
    """The workload with the SLO of ``--slo-ttft-ms`` / ``--slo-itl-ms`` in place of its own
    objectives on those metrics."""
    return spec.model_copy(update={"slo": spec.slo.overridden_by(config.slo_overrides())})


def resolve(config: TuneConfig) -> TuneContext:
    """Everything checked, nothing launched."""
    if config.backend not in ("auto", *(b.value for b in Backend)):
        resolve_backend(config, None)  # raises the one-line error
    nvml_name = _gpu_here() if config.backend == "sim" else detect_gpu_name()
    backend, install = resolve_backend(config, nvml_name)
    model, hub_model = _resolve_model(config, backend)
    vllm_cmd = install.command if install is not None else tuple(shlex.split(config.vllm_cmd))
    if not vllm_cmd:
        raise ConfigError("--vllm-cmd is empty; accepted: a launch command such as 'vllm serve'")
    installed: str | None = None
    version_note: str | None = None
    gpu: GpuSpec | None
    gpu_note: str | None = None  # how NVML's GPU was planned, where it is no preset
    if backend is Backend.SIM:
        gpu = get_gpu(config.gpu or DEFAULT_SIM_GPU)
        version = (
            VllmVersion.parse(config.vllm_version) if config.vllm_version else VllmVersion.current()
        )
        accepted: frozenset[str] | None = accepted_options(version)
        note = f"the emulated vLLM {version}"
    else:
        gpu, gpu_note = _vllm_gpu(config.gpu, nvml_name)
        accepted = probe_vllm_flags(vllm_cmd)
        assert install is not None  # resolve_backend found it
        version, installed, version_note = _installed_version(install)
        note = f"the vLLM behind {shlex.join(vllm_cmd)!r}"
    workload = with_slo_overrides(
        resolve_workload(config.workload, rate_per_s=None, duration_s=None), config
    )
    if config.rate is not None and workload.mean_rate_per_s is None:
        raise ConfigError(
            f"--rate {config.rate} does not apply: workload {workload.name!r} is closed "
            "(every request at once); accepted: a workload with an arrival rate"
        )
    base = ServingParams(
        max_model_len=config.max_model_len,
        tensor_parallel_size=config.tensor_parallel_size,
        kv_cache_memory_bytes=config.kv_cache_memory_bytes,
    ).checked()
    gpu_count = host_gpu_count(config, backend, gpu)
    _check_tensor_parallel_size(config, model, backend, gpu_count)
    notes: list[str] = [version_note] if version_note else []
    if install is not None and backend is Backend.VLLM:
        notes.insert(0, f"vLLM: {install.describe()}")
    if gpu_note:
        notes.append(gpu_note)
    overrides: dict[Knob, Range] = {}
    for name, text in config.space.items():
        knob = Knob.parse(name)
        overrides[knob] = parse_range(knob, str(text))
        check_for_target(
            overrides[knob], model=model, version=version, gpu=gpu is not None,
            gpu_count=gpu_count,
        )  # fmt: skip
    wanted = tuple(Knob.parse(k) for k in config.knobs) if config.knobs is not None else ()
    _check_context_length(config.max_model_len, model)
    model_dir = config.model_dir or (Path(config.model) if Path(config.model).is_dir() else None)
    if model_dir is not None:
        _check_tokenizer(model_dir, given=config.model_dir is not None)
    elif hub_model is not None:
        model_dir, tokenizer_note = _hub_tokenizer_dir(hub_model)
        if tokenizer_note:
            notes.append(tokenizer_note)
    if model_dir is not None:  # a chat workload on a model without a chat template: said
        from workloads.prompts import chat_template_note
        from workloads.schedule import Api

        if workload.api is Api.CHAT and (template_note := chat_template_note(model_dir)):
            notes.append(template_note)
    if gpu is None:
        # vLLM's CPU build: no device memory to search or screen; its KV cache is
        # VLLM_CPU_KVCACHE_SPACE.
        knobs = tuple(Knob.parse(k) for k in (config.knobs or ("max-num-seqs", "block-size")))
        space = _cpu_space(knobs, overrides, accepted)
    else:
        space = build_space(
            model=model, gpu=gpu, version=version, accepted_flags=accepted,
            overrides=overrides, extra=wanted, base=base, backend_note=note,
            gpu_count=gpu_count,
            host_bytes=(
                simulated_host_bytes(gpu_count) if backend is Backend.SIM else this_host_bytes()
            ),
        )  # fmt: skip
        if config.knobs is not None:
            # --cpu-offload-gb joins on its own where the model does not fit otherwise: a
            # --knobs list that leaves it out would leave nothing that starts
            space = SearchSpace(
                ranges=tuple(
                    r for r in space.ranges if r.knob in wanted or r.knob is Knob.CPU_OFFLOAD_GB
                ),
                left_out=space.left_out,
            )
    if not space.ranges:
        raise ConfigError("the search space is empty; accepted: at least one knob to search")
    if gpu_count > 1 and space.range_of(Knob.TENSOR_PARALLEL_SIZE) is None:
        notes.append(
            f"this host has {gpu_count} GPUs: --knobs ...,tensor-parallel-size (or --space "
            "tensor-parallel-size=1,2,...) compares one server over k GPUs with k servers of one"
        )
    if gpu is not None and config.max_model_len is None:
        base, fitted = _fit_context(model, gpu, version, base, workload, space)
        if fitted:
            notes.append(fitted)
    if backend is Backend.SIM:
        notes.insert(0, _simulated_note(config, nvml_name))
    if hub_model is not None:
        # Everything else checked: the weights now (a dry run keeps to config and tokenizer)
        fetched = hub_model if config.dry_run else fetch_model(hub_model.repo_id)
        notes.append(fetched.line())
    return TuneContext(
        config=config, backend=backend, model=model, gpu=gpu, version=version,
        vllm_cmd=vllm_cmd, accepted_flags=accepted, workload=workload, space=space,
        base=base, notes=tuple(notes),
        run_dir=writable_dir(
            config.run_path(gpu.name if gpu else None),
            what="--run-dir" if config.run_dir is not None else "run directory",
            keep=not config.dry_run,  # a dry run writes nothing
        ),
        model_dir=None if model_dir is None else model_dir.absolute(),
        gpu_count=gpu_count, installed_version=installed,
        gpu_source=_gpu_source(config.gpu_source, backend, nvml_name),
        twin_device=gpu or cpu_device(_host_bytes()),
        twin_base=base if gpu is not None else base.model_copy(
            update={"kv_cache_memory_bytes": base.kv_cache_memory_bytes or DEFAULT_CPU_KV_CACHE_BYTES}
        ),
    )  # fmt: skip


def _resolve_model(config: TuneConfig, backend: Backend) -> tuple[ModelSpec, FetchedModel | None]:
    """The model's shape and, on the vLLM backend, its config and tokenizer fetched from the
    Hugging Face hub into the cache vLLM reads (access checked: a gated model without a
    token, or a name that is no repository, fails here in one line). A preset keeps its own
    shape; a Hugging Face id that is no preset takes the fetched config.json's."""
    if backend is not Backend.VLLM or Path(config.model).expanduser().is_dir():
        return resolve_model(config.model), None
    repo_id = launch_name(config.model)
    fetched = fetch_model(repo_id, weights=False)
    try:
        return resolve_model(config.model), fetched
    except UnknownModelError:
        spec = load_model_dir(fetched.snapshot_dir)
        return spec.model_copy(update={"name": repo_id, "source": f"hub {repo_id}"}), fetched


def _hub_tokenizer_dir(fetched: FetchedModel) -> tuple[Path | None, str | None]:
    """The fetched snapshot, whose tokenizer sizes the prompts as vLLM counts them; None
    with a note where it has no tokenizer.json the prompts can be built with."""
    from workloads.prompts import prompt_builder_for
    from workloads.spec import WorkloadError

    try:
        prompt_builder_for(fetched.snapshot_dir)
    except WorkloadError as exc:
        return None, f"prompts sized one token a word: {fetched.repo_id}'s tokenizer: {exc}"
    return fetched.snapshot_dir, None


def _host_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def _check_context_length(max_model_len: int | None, model: ModelSpec) -> None:
    """vLLM refuses a --max-model-len beyond the model's context unless told to allow it."""
    if max_model_len is None or max_model_len <= model.max_position_embeddings:
        return
    if os.environ.get(ALLOW_LONG_MAX_MODEL_LEN_ENV, "").strip().lower() in ("1", "true"):
        return
    raise ConfigError(
        f"--max-model-len {max_model_len} is greater than {model.name}'s context "
        f"(max_position_embeddings={model.max_position_embeddings}): vLLM refuses it "
        f"('User-specified max_model_len ({max_model_len}) is greater than the derived "
        "max_model_len'); accepted: 1 to "
        f"{model.max_position_embeddings}, or {ALLOW_LONG_MAX_MODEL_LEN_ENV}=1 in the environment"
    )


def _check_tokenizer(model_dir: Path, *, given: bool) -> None:
    """The prompts are sized with a model directory's own tokenizer: it must load."""
    from workloads.prompts import prompt_builder_for
    from workloads.spec import WorkloadError

    try:
        prompt_builder_for(model_dir)
    except WorkloadError as exc:
        flag = "--model-dir" if given else "--model"
        raise ConfigError(f"{flag} {str(model_dir)!r}: {exc}") from exc


def _gpu_source(wanted: str, backend: Backend, nvml_name: str | None) -> str:
    """Where GPU memory is sampled from: the simulator's /sim/gpu, NVML, or nowhere."""
    accepted = ("auto", "nvml", "sim", "none")
    if wanted not in accepted:
        raise ConfigError(
            f"--gpu-source {wanted!r} is not accepted; accepted: {', '.join(accepted)}"
        )
    if wanted == "auto":
        return "sim" if backend is Backend.SIM else ("nvml" if nvml_name else "none")
    if wanted == "nvml" and nvml_name is None:
        raise ConfigError(
            "--gpu-source nvml: NVML sees no NVIDIA GPU here; accepted: sim (simulated backend) or none"
        )
    return wanted


def _fit_context(
    model: ModelSpec,
    gpu: GpuSpec,
    version: VllmVersion,
    base: ServingParams,
    workload: WorkloadSpec,
    space: SearchSpace,
) -> tuple[ServingParams, str | None]:
    """vLLM's default context (the model's maximum) when it fits the GPU; else the smallest
    power of two that holds the workload's longest request, as an engineer would set it."""
    from tuner.vllm.memory import plan
    from tuner.vllm.space import Knob

    util_range = space.range_of(Knob.GPU_MEMORY_UTILIZATION)
    util = util_range.high if util_range is not None and util_range.high else 0.95
    best = plan(model, gpu, base.model_copy(update={"gpu_memory_utilization": util}), version)
    if (
        best.failure is None
        or best.failure.kind is not StartupFailureKind.MAX_MODEL_LEN_DOES_NOT_FIT
    ):
        return base, None
    need, length = workload_context(model, workload)
    note = (
        f"--max-model-len {length}: the model's own {model.max_position_embeddings} tokens do not "
        f"fit the {gpu.name}'s KV cache, and the workload's longest request needs {need}"
    )
    return base.model_copy(update={"max_model_len": length}), note


def workload_context(model: ModelSpec, workload: WorkloadSpec) -> tuple[int, int]:
    """The workload's longest request (prompt and output tokens), and the context an
    engineer would give it: the smallest power of two holding it and half again, at most
    the model's own."""
    from tuner.serving.load import plan_schedule

    schedule = plan_schedule(workload)
    need = max((r.prompt_tokens + r.max_tokens for r in schedule), default=1)
    length = 1 << max(need + need // 2 - 1, 1).bit_length()  # half again for headroom
    return need, min(length, model.max_position_embeddings)


# What vLLM's CPU build (0.32) says when started with --kv-offloading-size: the offloading
# connector's CPUOffloadingSpec.get_worker (vllm/v1/kv_offload/cpu/spec.py) raises it once
# the model is loaded, and the engine exits (docs/guides/kv-offloading.md records the run).
CPU_BUILD_REFUSAL = "CPU Offloading is currently only supported on CUDA-alike and XPU GPUs"


def _cpu_space(
    knobs: tuple[Knob, ...], overrides: dict[Knob, Range], accepted: frozenset[str] | None
) -> SearchSpace:
    from tuner.vllm.space import LeftOut

    ranges: list[Range] = []
    gpu_only = (Knob.GPU_MEMORY_UTILIZATION, Knob.KV_CACHE_DTYPE, Knob.SWAP_SPACE)
    left: list[LeftOut] = [
        LeftOut(knob=knob, reason="no GPU: vLLM's CPU build has no device memory")
        for knob in gpu_only
    ]
    if Knob.TENSOR_PARALLEL_SIZE in knobs:
        left.append(
            LeftOut(
                knob=Knob.TENSOR_PARALLEL_SIZE, reason="no GPU: vLLM's CPU build here is one device"
            )
        )
    offloading = (Knob.KV_OFFLOADING_SIZE, Knob.KV_OFFLOADING_POLICY)
    left += [
        LeftOut(
            knob=knob,
            reason=(
                f"no GPU: vLLM's CPU build refuses KV offloading at startup ('{CPU_BUILD_REFUSAL}')"
            ),
        )
        for knob in offloading
        if knob in knobs
    ]
    for knob in knobs:
        if knob in gpu_only or knob in offloading or knob is Knob.TENSOR_PARALLEL_SIZE:
            continue
        if accepted is not None and knob.flag not in accepted:
            left.append(LeftOut(knob=knob, reason=f"the target vLLM does not accept {knob.flag}"))
            continue
        default = {
            Knob.MAX_NUM_SEQS: Range(knob=knob, low=2, high=32, log=True),
            Knob.BLOCK_SIZE: Range(knob=knob, choices=(32, 64)),
        }.get(knob)
        r = overrides.get(knob) or default
        if r is None:
            left.append(LeftOut(knob=knob, reason="no default range on CPU; give one with --space"))
            continue
        ranges.append(r)
    return SearchSpace(ranges=tuple(ranges), left_out=tuple(left))


def _installed_version(install: VllmInstall) -> tuple[VllmVersion, str | None, str | None]:
    """The release whose behaviour the tune assumes for the vLLM of ``install``, the
    version its packages spell (None: unread) and a one-line note where they differ (the
    version unread, or newer than the newest release the tuner knows); a release older
    than the oldest it emulates is refused."""
    reading = installed_version(install)
    read = VllmVersion.read(reading.text) if reading.text else None
    version, fit = assumed_release(read)
    newest = f"{version.major}.{version.minor}"
    match fit:
        case ReleaseFit.KNOWN:
            return version, reading.text, None
        case ReleaseFit.UNKNOWN:
            why = reading.why_unknown or f"{reading.text!r} is not a version"
            return (
                version,
                None,
                (
                    f"vLLM's release behind {install.describe()} is unknown ({why}): this tune "
                    f"assumes vLLM {newest}'s behaviour (defaults, memory accounting), the newest "
                    "the tuner knows"
                ),
            )
        case ReleaseFit.NEWER:
            return (
                version,
                reading.text,
                (
                    f"vLLM {reading.text} ({install.describe()}) is newer than the newest release "
                    f"the tuner knows ({newest}): this tune assumes {newest}'s behaviour (defaults, "
                    f"memory accounting); `make vllm` installs the pinned {version}"
                ),
            )
    oldest = ".".join(map(str, OLDEST_SUPPORTED))
    raise ConfigError(
        f"vLLM {reading.text} ({install.describe()}) is older than the oldest release the "
        f"tuner emulates ({oldest}, the V1 engine); accepted: vLLM {oldest} to {newest} "
        f"(`make vllm` installs {VllmVersion.current()}), or --backend sim"
    )


def _check_tensor_parallel_size(
    config: TuneConfig, model: ModelSpec, backend: Backend, gpu_count: int
) -> None:
    """vLLM refuses a tensor-parallel size that does not divide the model's attention heads
    (``ModelConfig.verify_with_parallel_config``) or that neither divides nor is a multiple
    of its KV heads (``QKVParallelLinear``: KV heads are split, or replicated when fewer
    than the ranks). A fixed --tensor-parallel-size is checked here, before anything starts."""
    size = config.tensor_parallel_size
    heads = model.num_attention_heads
    kv_heads = 1 if model.is_mla else model.num_kv_heads  # MLA: one latent KV, replicated
    if _tp_fits(size, heads, kv_heads):
        return
    # the simulated host without --gpu-count is as large as the size asked for
    limit = heads if backend is Backend.SIM and config.gpu_count is None else gpu_count
    accepted = [str(tp) for tp in range(1, limit + 1) if _tp_fits(tp, heads, kv_heads)]
    why = (
        f"does not divide {model.name}'s {heads} attention heads (vLLM: 'Total number of "
        f"attention heads ({heads}) must be divisible by tensor parallel size ({size}).')"
        if heads % size
        else f"neither divides nor is a multiple of {model.name}'s {kv_heads} KV heads "
        "(vLLM splits or replicates them whole)"
    )
    raise ConfigError(
        f"--tensor-parallel-size {size} {why}; accepted: {', '.join(accepted)}"
        + ("" if limit == heads else f" (on this host's {gpu_count} GPUs)")
    )


def _tp_fits(size: int, heads: int, kv_heads: int) -> bool:
    return heads % size == 0 and (kv_heads % size == 0 or size % kv_heads == 0)


def _gpu_here() -> str | None:
    """NVML's GPU, for what ``--backend sim`` says: it simulates although a GPU is here."""
    try:
        return detect_gpu_name()
    except TunerError:  # a GPU NVML cannot profile: the simulated engine does not need it
        return None


def _simulated_note(config: TuneConfig, nvml_name: str | None) -> str:
    engine = "the simulated engine reproduces vLLM's memory accounting, scheduling and metrics"
    if config.backend == "auto":
        return f"SIMULATED backend: NVML sees no NVIDIA GPU here; {engine}"
    if nvml_name is not None:
        return (
            f"SIMULATED backend (--backend sim) although NVML sees a GPU here ({nvml_name}): "
            f"{engine}; --backend auto measures the real vLLM"
        )
    return f"SIMULATED backend (--backend sim): {engine}"


# What one request costs the load generator beyond its token events (connection, body,
# records), in token events: measured with benchmarks/locust_event_rate.py.
REQUEST_COST_EVENTS = 10.0


# A clock faster than the emulated GPU's is chosen in steps of this (0.7: 1.43x faster);
# a slower one in steps of 0.5.
FAST_CLOCK_STEP = 0.05


def clock_scale(load_events_per_s: float, max_events_per_s: float, fastest: float = 1.0) -> float:
    """The simulated clock's scale K (its clock runs K times slower than the emulated GPU;
    K < 1: faster) at which a load generator that sees ``load_events_per_s`` on the
    emulated GPU's clock sees at most ``max_events_per_s`` per wall second: slower in
    steps of 0.5 where it has no room; where it has, faster in steps of
    ``FAST_CLOCK_STEP``, never faster than ``fastest`` (1: never faster)."""
    ratio = load_events_per_s / max_events_per_s
    if ratio > 1.0:
        return math.ceil(2 * ratio) / 2
    if fastest >= 1.0:
        return 1.0
    steps = math.ceil(ratio / FAST_CLOCK_STEP - 1e-9)
    return max(fastest, min(1.0, round(steps * FAST_CLOCK_STEP, 2)))


def auto_time_scale(
    predicted_tokens_per_s: float,
    predicted_requests_per_s: float,
    max_events_per_s: float,
    stream_fraction: float = 1.0,
    *,
    fastest: float = 1.0,
    stream_interval: int = 1,
) -> float:
    """The simulator's clock scale so the load generator sees at most ``max_events_per_s``
    (``clock_scale``; ``fastest`` < 1 lets it run faster than the emulated GPU where the
    load leaves room)."""
    load = planned_events_per_s(
        predicted_tokens_per_s, predicted_requests_per_s, stream_fraction, stream_interval
    )
    return clock_scale(load, max_events_per_s, fastest)


def planned_events_per_s(
    tokens_per_s: float, requests_per_s: float, stream_fraction: float, stream_interval: int
) -> float:
    """What a planned load will ask of the load generator, in token events per second:
    each streamed request's first token alone and the rest ``stream_interval`` to an
    event, and ``REQUEST_COST_EVENTS`` per request (``tuner.search.clock.client_events_per_s``
    reads the same of a level that ran)."""
    rest = max(tokens_per_s - requests_per_s, 0.0)
    token_events = stream_fraction * (min(requests_per_s, tokens_per_s) + rest / stream_interval)
    return token_events + REQUEST_COST_EVENTS * requests_per_s


# The most tokens one streamed event is asked to carry (``auto_stream_interval``): past
# 16 the request's own costs dominate the load generator's, and a chunk spans a few
# hundred milliseconds of decoding.
MAX_STREAM_INTERVAL = 16


def auto_stream_interval(
    predicted_tokens_per_s: float,
    predicted_requests_per_s: float,
    max_events_per_s: float,
    fastest: float,
) -> int:
    """The fewest tokens an event (at most ``MAX_STREAM_INTERVAL``) at which the load
    generator keeps up with every request streamed with the simulator's clock at its
    fastest (``fastest``: its scale, 1 on vLLM): 1 where every token fits."""
    budget = max_events_per_s * fastest
    for interval in range(1, MAX_STREAM_INTERVAL + 1):
        load = planned_events_per_s(predicted_tokens_per_s, predicted_requests_per_s, 1.0, interval)
        if load <= budget:
            return interval
    return MAX_STREAM_INTERVAL


def auto_stream_fraction(
    predicted_tokens_per_s: float,
    predicted_requests_per_s: float,
    max_events_per_s: float,
    min_fraction: float,
) -> float:
    """The share of requests to stream so the token events fit the load generator's budget
    (never below ``min_fraction``, so the latency percentiles keep enough samples)."""
    room = max_events_per_s - REQUEST_COST_EVENTS * predicted_requests_per_s
    if predicted_tokens_per_s <= 0 or room >= predicted_tokens_per_s:
        return 1.0
    # rounded down: a share rounded up would put the load past the budget (0.5179 -> 0.52
    # asked 4,719 + 300 events/s of a 5,000 budget, and the clock ran 1.5x slower for it)
    share = math.floor(100 * room / predicted_tokens_per_s + 1e-9) / 100
    return max(min_fraction, share)

"""``TuneConfig``: every setting of a tuning run, as ``tune.json`` records it.

``tuner.search.config.load_config`` reads it from a YAML file and the command line (one
``ConfigError`` line per bad value); ``tune.json``'s ``config`` is this model dumped
(``tuner.run.records.TuneRecord`` reads it back). ``Objective``: what the study maximizes.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from tuner.errors import ConfigError
from tuner.run.quality import DEFAULT_MAX_LOGPROB_DIVERGENCE_NATS, DEFAULT_MIN_TOKEN_AGREEMENT
from tuner.serving.client_lag import DEFAULT_RETRIES, ClientRule
from tuner.serving.load import LoadGenerators
from tuner.sim.timing import TimingFactors
from tuner.vllm.boot import BootState
from workloads.client_lag import MAX_SEND_LAG_P99_MS, SERVER_LAG_FLOOR_MS, ClientBounds
from workloads.slo import Slo


class Objective(StrEnum):
    GOODPUT = "goodput"  # the highest request rate at which the SLOs hold
    THROUGHPUT = "throughput"  # output tokens/s at that rate
    PARETO = "pareto"  # output tokens/s vs p99 TTFT, a Pareto front (NSGA-II)

    @classmethod
    def parse(cls, text: str) -> Objective:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise ConfigError(
                f"--objective {text!r} is not accepted; accepted: {', '.join(o.value for o in cls)}"
            ) from None

    @property
    def directions(self) -> list[Literal["maximize", "minimize"]]:
        if self is Objective.PARETO:
            return ["maximize", "minimize"]
        return ["maximize"]


# A study's name names its run directory (runs/<study>) and its rows in a shared storage.
STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class TuneConfig(BaseModel):
    # allow_inf_nan: every number is finite (nan and inf pass `gt=0` checks otherwise).
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # What to tune
    model: str = "llama-3.1-8b"
    gpu: str | None = None  # sim: the virtual GPU (default H100-80GB); vllm: detected by NVML
    backend: str = "auto"  # auto: vllm when an NVIDIA GPU and vLLM are here, else sim
    vllm_cmd: str = "vllm serve"
    vllm_version: str | None = None  # sim: the emulated release (default: current)
    model_dir: Path | None = None  # a local model directory whose tokenizer sizes prompts
    max_model_len: int | None = Field(default=None, ge=1)
    kv_cache_memory_bytes: int | None = Field(default=None, ge=1)  # a fixed KV cache size
    tensor_parallel_size: int = Field(default=1, ge=1)
    # The GPUs a server may take on this host: sim, the virtual host's (default: the
    # tensor-parallel size); vllm, at most those visible (default: all of them).
    gpu_count: int | None = Field(default=None, ge=1)
    # The traffic and its objectives
    workload: str = "chat"
    rate: float | None = Field(default=None, gt=0)  # first arrival rate measured
    slo_ttft_ms: float | None = Field(
        default=None, gt=0
    )  # p99 TTFT limit (overrides the workload's)
    slo_itl_ms: float | None = Field(default=None, gt=0)  # p99 ITL limit (overrides the workload's)
    objective: Objective = Objective.GOODPUT
    # The search
    trials: int = Field(default=10, ge=1)
    budget_min: float = Field(default=14.0, gt=0)
    seed: int = 0
    knobs: tuple[str, ...] | None = None  # default: the five; see tuner.vllm.space
    space: dict[str, str] = Field(default_factory=dict)  # knob -> range text
    screen: bool = True  # skip launches the memory model says will fail
    # Each measured rate's window and warm-up, emulated seconds; None: the window sized
    # for the SLO's percentiles, opening once the server is steady (tuner.serving.window).
    level_duration_s: float | None = Field(default=None, gt=0)
    level_warmup_s: float | None = Field(default=None, ge=0)
    # The longest a sized window is held on (its server's correlation time, an SLO
    # verdict near its limit); None: tuner.serving.window.MAX_WINDOW_S.
    level_max_duration_s: float | None = Field(default=None, gt=0)
    max_levels: int = Field(default=4, ge=1)
    # Draws of the workload the bracket's ends are measured with once the levels are spent
    # (tuner.search.rate_search's edge draws, beyond max_levels); 1: none. ``edge_draws``
    # in the recommendation's confirmation, the capacity a review acts on;
    # ``trial_edge_draws`` in each trial, which the search ranks on one draw shared by all
    # trials (common random numbers: their difference is the settings', not the draw's).
    edge_draws: int = Field(default=4, ge=1)
    trial_edge_draws: int = Field(default=1, ge=1)
    # A trial's levels follow one another on one load run, the conversations under way
    # carrying on from each to the next (workloads.chain); False: each from an empty server
    # (the default: near capacity a chained level sees the healthy state of a bistable
    # server, which tips minutes later; see docs/design/measurement.md).
    chain_levels: bool = False
    # The twin's step costs fitted to each trial's levels (tuner.twin.fit), from the
    # paper's factors or those a run recorded (twin_from: its run directory).
    twin_fit: bool = True
    twin_from: Path | None = None
    # The twin's landscape (tuner.twin.landscape): every setting of the space predicted
    # before the first launch; the trials after vLLM's defaults go to its best settings.
    twin_search: bool = True
    dry_run: bool = False  # the space, the twin's best and the plan; nothing launched
    # Where it goes
    study: str | None = None
    run_dir: Path | None = None
    storage: str | None = None  # SQLAlchemy URL; default SQLite in the run directory
    resume: bool = False
    # The OOM edge and the recommendation
    edge: bool = True
    edge_resolution: float = Field(default=0.01, gt=0, le=0.1)
    max_edge_launches: int = Field(default=4, ge=1)
    seqs_edge_launches: int = Field(default=2, ge=0)
    # The longest an edge probe's worst case is held (emulated seconds): it ends sooner once
    # the KV cache has peaked or every output finished (tuner.search.edge).
    edge_load_s: float = Field(default=120.0, gt=0)
    safety_margin: float = Field(default=0.02, ge=0, lt=0.5)  # utilization kept from the edge
    # The boot production pods start in (tuner.vllm.boot): "warm" (the compile cache filled,
    # on its volume) or "cold" (an empty one); the calibration is converted to it, and the
    # recommendation must start cold on a new node either way.
    production_boot: str = "warm"
    confirm: bool = True
    repeats: int = Field(default=1, ge=1)  # confirmation runs of the recommendation
    target_peak_rate: float | None = Field(
        default=None, gt=0
    )  # the peak, in the workload's unit (conversations/s with sessions)
    capacity_headroom: float = Field(default=0.2, ge=0, lt=1)
    # The quality gate (tuner.search.quality_gate): a setting that changes numerics
    # (--kv-cache-dtype fp8) is compared with the model's own before it is recommended, on
    # quality_prompts prompts of the workload, answers of up to quality_max_tokens tokens.
    quality_gate: bool = True
    quality_min_agreement: float = DEFAULT_MIN_TOKEN_AGREEMENT  # a share of tokens, 0..1
    quality_max_logprob_divergence_nats: float = DEFAULT_MAX_LOGPROB_DIVERGENCE_NATS
    quality_prompts: int = Field(default=32, ge=1, le=1000)
    quality_max_tokens: int = Field(default=32, ge=1, le=4096)
    cache_volume: str = "pvc"
    # The recommendation's model before vLLM starts (tuner.deploy.model_fields): where the
    # weights come from (None: what the model's name says), the volume they are kept on
    # (None: a claim per replica sized from the weights), the Secret the fetch reads.
    model_source: str | None = None
    model_cache: str | None = None
    model_secret: str | None = None
    rollout: str = "rolling"  # how a new recommendation replaces the serving one
    # Measurement
    processes: int = Field(default=1, ge=0)  # Locust processes here (0: all on load hosts)
    load_workers: int = Field(default=0, ge=0)  # Locust workers on load hosts (tuner load-worker)
    load_master_bind: str | None = None  # HOST:PORT the Locust master listens on for them
    # A level whose load generator lagged past this (send lag and event-loop delay p99 of
    # any process, ms) does not count; it is measured again with more processes or, on
    # the simulated engine, a slower clock, at most client_retries times
    # (tuner.serving.client_lag).
    client_lag_ms: float = Field(default=MAX_SEND_LAG_P99_MS, gt=0)
    client_retries: int = Field(default=DEFAULT_RETRIES, ge=0)
    gpu_source: str = "auto"
    time_scale: float | None = Field(default=None, gt=0)  # sim: slower clock; None: automatic
    max_events_per_s: float = Field(default=5000.0, gt=0)  # auto time scale keeps below this
    # sim, automatic clock: the fastest it runs where the load generator has room (0.25: four
    # times the emulated GPU's pace, where the default chat tune's levels measure as at its
    # own pace but for 10-13 ms more TTFT p50; 1: never faster than it); tuner.search.clock.
    fastest_time_scale: float = Field(default=0.25, gt=0, le=1)
    # Share of requests streamed (the rest sent whole): None lets the load generator's
    # budget decide, never below min_stream_fraction; 1 streams every request.
    stream_fraction: float | None = Field(default=None, gt=0, le=1)
    min_stream_fraction: float = Field(default=0.25, gt=0, le=1)
    # Tokens a streamed event carries (vLLM's per-request stream_interval): None lets the
    # load generator's budget decide where the target vLLM reads it and the SLO has no ITL
    # objective (tuner.search.context.auto_stream_interval); 1 streams every token.
    stream_interval: int | None = Field(default=None, ge=1)
    sim_startup_delay_s: float = Field(default=1.0, ge=0)
    # sim: the simulated server's own step costs (sim-serve --step-costs), unknown to the
    # twin, which learns them from the trials; None: the twin's paper factors.
    sim_step_costs: str | None = None

    @field_validator("sim_step_costs")
    @classmethod
    def _step_costs(cls, value: str | None) -> str | None:
        if value is not None:
            TimingFactors.parse(value)  # a ValueError: one line naming it
        return value

    @field_validator("quality_min_agreement")
    @classmethod
    def _agreement_is_a_share(cls, value: float) -> float:
        if not 0.0 <= value <= 1.0:
            raise PydanticCustomError(
                "quality_share",
                "a token agreement is a share from 0 to 1 (0.95: 95% of the tokens agree)",
            )
        return value

    @field_validator("quality_max_logprob_divergence_nats")
    @classmethod
    def _divergence_is_not_negative(cls, value: float) -> float:
        if value < 0.0:
            raise PydanticCustomError(
                "quality_divergence",
                "a log-prob divergence is nats per token, 0 or more (e.g. 0.1)",
            )
        return value

    @field_validator("model_dir", "run_dir", "twin_from")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        # Child processes run in other directories: paths are absolute from here on.
        return None if value is None else value.absolute()

    @property
    def production_boot_state(self) -> BootState:
        return BootState.parse(self.production_boot)

    def slo_overrides(self) -> Slo:
        """The objectives ``slo_ttft_ms`` and ``slo_itl_ms`` set (p99), which replace the
        workload's own on those metrics (empty when neither is set)."""
        return Slo.p99(ttft_ms=self.slo_ttft_ms, itl_ms=self.slo_itl_ms)

    def load_generators(self) -> LoadGenerators:
        """Who sends the load (ConfigError when the three settings do not go together)."""
        bounds = ClientBounds(
            send_lag_p99_ms=self.client_lag_ms,
            loop_delay_p99_ms=self.client_lag_ms,
            # the simulated server's, as it was judged with the event loop's, never below
            # its floor
            server_lag_p99_ms=max(SERVER_LAG_FLOOR_MS, self.client_lag_ms),
        )
        return LoadGenerators(
            processes=self.processes,
            remote_workers=self.load_workers,
            master_bind=self.load_master_bind,
            client_rule=ClientRule(bounds=bounds, retries=self.client_retries),
        )

    @field_validator("study")
    @classmethod
    def _study_is_a_name(cls, value: str | None) -> str | None:
        if value is not None and not STUDY_NAME.fullmatch(value):
            raise PydanticCustomError(
                "study_name",
                "a study name is 1 to 100 letters, digits, '.', '_' or '-', starting with a "
                "letter or digit (no path: the run goes to runs/<study> or --run-dir), "
                "e.g. llama8b-h100",
            )
        return value

    def study_name(self, gpu_name: str | None) -> str:
        """The given name, else one from the model, the GPU the run resolved and the workload."""
        if self.study:
            return self.study

        def slug(text: str) -> str:
            return "".join(c if c.isalnum() or c in "-." else "-" for c in text).lower()

        parts = (Path(self.model).name, gpu_name or "cpu", Path(self.workload).stem)
        name = "-".join(slug(part) for part in parts)
        return re.sub(r"^[^A-Za-z0-9]+", "", name)[:100] or "study"

    def run_path(self, gpu_name: str | None) -> Path:
        """The run directory, absolute (load generators run in their own directories)."""
        return (self.run_dir or Path("runs") / self.study_name(gpu_name)).resolve()

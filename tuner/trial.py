"""One whole trial: launch, sample GPU memory, warm up, load, scrape /metrics, stop.

Everything a trial measured is written to its directory, so reports can be rebuilt
without rerunning anything:

    <trial dir>/server.log      the server's own output
    <trial dir>/gpu.csv         GPU memory timeline
    <trial dir>/warmup/         the warm-up load run (schedule, records, Locust log)
    <trial dir>/load/           the measured load run (schedule.jsonl, requests.jsonl, locust.log)
    <trial dir>/result.json     the TrialResult

Warm-up requests are sent as a load run of their own and finish before the
measured window opens, so the window's token counts on the client and the
server's /metrics counters describe the same requests.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tuner.gpu_sampler import GpuSampler, GpuSummary, ProcessTree, make_source
from tuner.load import SloVerdict, plan_schedule, run_schedule, split_warmup
from tuner.processes import ChildRegistry
from tuner.server import Backend, LaunchSpec, ServerProcess, StartupResult, TrialOutcome
from tuner.server_metrics import KvUsageWatcher, ServerCounters, scrape
from workloads.metrics import LoadResult
from workloads.schedule import ScheduledRequest
from workloads.spec import WorkloadSpec

log = logging.getLogger(__name__)


class TrialResult(BaseModel):
    """What one trial found: settings, startup, load, server counters, GPU, outcome."""

    model_config = ConfigDict(frozen=True)

    outcome: TrialOutcome
    trial_dir: str
    settings: dict[str, object]
    startup: StartupResult
    load: LoadResult | None = None
    slo: SloVerdict | None = None
    server: ServerCounters | None = None
    gpu: GpuSummary | None = None
    client_saturated: bool = False
    client_saturation_reason: str | None = None
    death: StartupResult | None = None


class _ServerPids:
    """The server's process tree once it has a pid (vLLM starts worker processes)."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.tree: ProcessTree | None = None

    def __call__(self) -> frozenset[int]:
        if self.tree is None and self.server.pid is not None:
            self.tree = ProcessTree(self.server.pid)
        return self.tree() if self.tree is not None else frozenset()


def settings_of(spec: LaunchSpec) -> dict[str, object]:
    params = spec.params.model_dump(exclude_none=True, exclude={"other_process_bytes"})
    return {
        "backend": spec.backend.value,
        "model": spec.model,
        "gpu": spec.gpu,
        "vllm_version": spec.vllm_version,
        **params,
        "swap_space_gib": spec.swap_space_gib,
        "enable_prefix_caching": spec.enable_prefix_caching,
    }


def run_trial(
    launch: LaunchSpec,
    workload: WorkloadSpec,
    *,
    trial_dir: Path,
    registry: ChildRegistry,
    gpu_source: str = "auto",
    gpu_sample_interval_s: float = 0.1,
    model_dir: Path | None = None,
    processes: int = 1,
) -> TrialResult:
    """Run one trial; a server that fails to start or dies is an outcome, not an exception."""
    schedule = plan_schedule(
        workload, max_model_len=launch.params.max_model_len, model_dir=model_dir
    )
    warm, measured = split_warmup(schedule)
    trial_dir.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(launch, registry=registry, log_path=trial_dir / "server.log")
    kind = (
        gpu_source if gpu_source != "auto" else ("sim" if launch.backend is Backend.SIM else "nvml")
    )
    sampler = GpuSampler(
        make_source(kind, base_url=server.base_url),
        interval_s=gpu_sample_interval_s,
        timeline_path=trial_dir / "gpu.csv",
        pids=_ServerPids(server),
    )
    sampling = False
    fields: dict[str, object] = {"trial_dir": str(trial_dir), "settings": settings_of(launch)}
    try:
        if kind == "nvml":  # before the launch: startup memory is part of the timeline
            sampler.start()
            sampling = True
        startup = server.wait_ready()
        fields["startup"] = startup
        fields["outcome"] = startup.outcome
        if startup.outcome is TrialOutcome.READY:
            if not sampling:
                sampler.start()
                sampling = True
            fields.update(
                _load(server, launch, workload, warm, measured, trial_dir, registry, processes)
            )
    finally:
        if sampling:
            fields["gpu"] = sampler.stop()
        server.stop()
    result = TrialResult.model_validate(fields)
    (trial_dir / "result.json").write_text(result.model_dump_json(indent=2), encoding="utf-8")
    return result


def _load(
    server: ServerProcess,
    launch: LaunchSpec,
    workload: WorkloadSpec,
    warm: list[ScheduledRequest],
    measured: list[ScheduledRequest],
    trial_dir: Path,
    registry: ChildRegistry,
    processes: int,
) -> dict[str, object]:
    model = launch.served_model_name or launch.model
    if warm:
        run_schedule(
            workload, warm, base_url=server.base_url, model=model, out_dir=trial_dir / "warmup",
            registry=registry, processes=processes,
        )  # fmt: skip
    before = scrape(server.base_url)
    watcher = KvUsageWatcher(server.base_url).start()
    run = run_schedule(
        workload, measured, base_url=server.base_url, model=model, out_dir=trial_dir / "load",
        registry=registry, processes=processes,
    )  # fmt: skip
    peak_kv = watcher.stop()
    after = scrape(server.base_url)
    died = server.engine_outcome()
    return {
        "outcome": died.outcome if died is not None else TrialOutcome.READY,
        "death": died,
        "load": run.result,
        "slo": run.verdict,
        "server": ServerCounters.between(before, after, peak_kv) if after else None,
        "client_saturated": run.run.client_saturated,
        "client_saturation_reason": run.run.saturation_reason,
    }

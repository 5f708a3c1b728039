"""One load run of a workload against a running server: schedule, Locust, results, SLO verdict.

Shared by `tuner bench` (a server someone else runs) and `tuner trial` (a server
the tuner launched). The workload's errors (``WorkloadError``, ``TraceError``)
become ``TunerError``s here, where they enter the tuner.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tuner.errors import ConfigError, WorkloadLoadError
from tuner.serving.client_lag import ClientRule
from tuner.serving.processes import ChildRegistry
from workloads.build import build_schedule
from workloads.load_errors import LoadConfigError, LoadGeneratorError
from workloads.load_result import LoadResult
from workloads.prompts import prompt_builder_for
from workloads.runner import (
    GeneratorNames,
    LoadRun,
    Spawn,
    is_any_address,
    is_local_address,
    run_load,
    startup_lead_s,
    validate_generators,
)
from workloads.schedule import RequestRecord, ScheduledRequest
from workloads.spec import WorkloadError, WorkloadSpec, load_workload
from workloads.traces import TraceError

# The flags of `tuner bench`, `trial` and `tune` that set the load generators, as their
# error messages name them.
FLAG_NAMES = GeneratorNames(
    processes="--processes",
    remote_workers="--load-workers",
    master_bind="--load-master-bind",
    joiner=" ",
)


@dataclass(frozen=True, kw_only=True)
class LoadGenerators:
    """Who sends the load: ``processes`` Locust processes here and ``remote_workers`` Locust
    workers on load hosts (``tuner load-worker``), which connect to the master at
    ``master_bind`` (``HOST:PORT``). Checked when made: a bad value is a ConfigError.
    ``client_rule``: the bounds on their lag, and what a level whose client lagged past
    them is measured again with (``tuner.serving.client_lag``)."""

    processes: int = 1
    remote_workers: int = 0
    master_bind: str | None = None
    client_rule: ClientRule = field(default_factory=ClientRule)

    def __post_init__(self) -> None:
        try:
            validate_generators(
                processes=self.processes,
                remote_workers=self.remote_workers,
                master_bind=self.master_bind,
                names=FLAG_NAMES,
            )
        except LoadConfigError as exc:
            raise ConfigError(str(exc)) from exc

    @property
    def startup_lead_s(self) -> float:
        """From launching Locust to offset 0 of the schedule."""
        return startup_lead_s(self.processes, self.remote_workers)

    @property
    def server_host(self) -> str:
        """The address a server the tuner launches listens on: loopback, unless workers
        on other hosts must reach it (then the master's address, or every interface)."""
        if not self.remote_workers or self.master_bind is None:
            return "127.0.0.1"
        host = self.master_bind.rpartition(":")[0].strip("[]")
        if is_any_address(host):
            return "0.0.0.0"
        return "127.0.0.1" if is_local_address(host) else host  # loopback: workers are here


LOCAL_LOAD = LoadGenerators()  # one Locust process on this host


class SloVerdict(BaseModel):
    """Whether a run met its workload's SLOs, objective by objective."""

    model_config = ConfigDict(frozen=True)

    met: bool
    violations: list[str]
    # A level's window: the share of resamples of its requests that meet the SLO
    # (``workloads.slo_bootstrap``), how sure ``met`` is; None where not estimated.
    hold_share: float | None = None


@dataclass(frozen=True)
class WorkloadRun:
    spec: WorkloadSpec
    run: LoadRun
    result: LoadResult
    verdict: SloVerdict


def resolve_workload(
    name: str, *, rate_per_s: float | None, duration_s: float | None
) -> WorkloadSpec:
    try:
        spec = load_workload(name)
        if rate_per_s is not None:
            spec = spec.with_rate(rate_per_s)
        if duration_s is not None:
            spec = spec.with_duration(duration_s)  # NaN and inf rejected as well
    except (WorkloadError, TraceError) as exc:
        raise WorkloadLoadError(str(exc)) from exc
    return spec


def percentile_shares(spec: WorkloadSpec, result: LoadResult) -> list[float]:
    """Each SLO objective's measured percentile as a share of its limit (1: at the limit);
    objectives the run could not measure are left out."""
    shares = []
    for objective in spec.slo.objectives():
        value = result.measured_ms(objective)
        if value is not None and value > 0:
            shares.append(value / objective.limit_ms)
    return shares


def slo_verdict(spec: WorkloadSpec, result: LoadResult) -> SloVerdict:
    """Each objective (a percentile of a metric at most a limit) against the run's percentiles."""
    violations: list[str] = []
    for objective in spec.slo.objectives():
        value = result.measured_ms(objective)
        if value is not None and value > objective.limit_ms:
            violations.append(
                f"{objective.metric.value} p{objective.percentile} {value:.1f} ms > {objective.limit_ms:g} ms"
            )
    failed = result.num_errors - result.num_cut_by_stop
    if failed:
        violations.append(f"{failed} of {result.num_requests} requests failed")
    if result.num_cut_by_stop:  # the harness's stop, not the server's failures
        violations.append(
            f"{result.num_cut_by_stop} of {result.num_requests} requests unanswered when "
            "the load generator stopped"
        )
    return SloVerdict(met=not violations, violations=violations)


def served_model(base_url: str) -> tuple[str, int | None]:
    """The first model the server lists, and its max_model_len when it says."""
    request = urllib.request.Request(base_url.rstrip("/") + "/v1/models")
    key = os.environ.get("VLLM_API_KEY")
    if key:  # the key the load generators send too
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            state = "is not one it accepts" if key else "is not set"
            raise ConfigError(
                f"the server at {base_url!r} answers 401 Unauthorized: it requires an API key "
                f"and VLLM_API_KEY {state}; set VLLM_API_KEY to the server's key"
            ) from exc
        raise ConfigError(f"no OpenAI-compatible server answers at {base_url!r}: {exc}") from exc
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"no OpenAI-compatible server answers at {base_url!r}: {exc}") from exc
    models = body.get("data") or []
    if not models:
        raise ConfigError(f"the server at {base_url!r} lists no model under /v1/models")
    first = models[0]
    limit = first.get("max_model_len")
    return str(first["id"]), int(limit) if isinstance(limit, int) else None


def check_fits(schedule: list[ScheduledRequest], max_model_len: int | None) -> None:
    """One line, before anything is sent, if a request cannot fit the server's context."""
    if max_model_len is None or not schedule:
        return
    longest = max(schedule, key=lambda r: r.prompt_tokens + r.max_tokens)
    need = longest.prompt_tokens + longest.max_tokens
    if need > max_model_len:
        raise ConfigError(
            f"the workload's longest request needs {need} tokens ({longest.prompt_tokens} prompt + "
            f"{longest.max_tokens} output) but the server's max_model_len is {max_model_len}; "
            "raise --max-model-len or choose a workload with shorter requests"
        )


def plan_schedule(
    spec: WorkloadSpec, *, max_model_len: int | None = None, model_dir: Path | None = None
) -> list[ScheduledRequest]:
    """The open-loop schedule of a workload, checked against the server's context length."""
    try:
        schedule = build_schedule(spec, prompt_builder=prompt_builder_for(model_dir))
    except (WorkloadError, TraceError) as exc:
        raise WorkloadLoadError(str(exc)) from exc
    check_fits(schedule, max_model_len)
    return schedule


def split_warmup(
    schedule: list[ScheduledRequest],
) -> tuple[list[ScheduledRequest], list[ScheduledRequest]]:
    """Warm-up requests, and the measured ones shifted to start at offset 0."""
    warm = [r for r in schedule if r.warmup]
    measured = [r for r in schedule if not r.warmup]
    if measured:
        origin = min(r.send_s for r in measured)
        measured = [dataclasses.replace(r, send_s=r.send_s - origin) for r in measured]
    return warm, measured


def run_schedule(
    spec: WorkloadSpec,
    schedule: list[ScheduledRequest],
    *,
    base_url: str,
    model: str,
    out_dir: Path,
    registry: ChildRegistry,
    generators: LoadGenerators = LOCAL_LOAD,
    time_scale: float = 1.0,
    stop_when: Callable[[], bool] | None = None,
    cut_short: bool = False,
) -> WorkloadRun:
    """Send a schedule with Locust and summarise the records against the workload's SLOs.

    ``time_scale`` K: the server is the simulator on a K times slower clock. The
    schedule is stretched by K before sending and the result converted back to the
    simulator's virtual time, so rates, latencies and SLO verdicts read as on the
    emulated GPU. ``stop_when``: see ``workloads.runner.run_load``; with ``cut_short`` a
    stop after the window is expected and requests cut off in flight are measured as far
    as they got (``LoadResult.from_records``).
    """
    schedule = scaled_schedule(schedule, time_scale)
    # A session's later turn waits for the answer it extends; one that would then go out
    # after the window (the builder plans none at or after its end, duration_s from the
    # schedule's start) is not sent.
    turns_until_s = None if spec.sessions is None else spec.duration_s * time_scale
    try:
        run = run_load(
            base_url=base_url, model=model, schedule=schedule, out_dir=out_dir,
            processes=generators.processes, remote_workers=generators.remote_workers,
            master_bind=generators.master_bind, spawn=locust_spawner(registry),
            stop_when=stop_when,
            turns_until_s=turns_until_s,
        )  # fmt: skip
    except (LoadConfigError, LoadGeneratorError) as exc:
        raise WorkloadLoadError(f"load run failed: {exc}") from exc
    wall_slo = spec.slo.scaled(time_scale)
    window_s = spec.duration_s * time_scale
    result = LoadResult.from_file(
        run.records_path, slo=wall_slo, window_s=window_s, cut_short=cut_short
    )
    result = result.in_virtual_time(time_scale)
    return WorkloadRun(spec=spec, run=run, result=result, verdict=slo_verdict(spec, result))


def scaled_schedule(schedule: list[ScheduledRequest], time_scale: float) -> list[ScheduledRequest]:
    """A schedule on a K times slower clock (the simulator's ``--time-scale``): its offsets
    and think times stretched by K (a user thinks on the emulated clock too)."""
    if time_scale == 1.0:
        return schedule
    return [
        dataclasses.replace(
            r, send_s=r.send_s * time_scale, think_time_s=r.think_time_s * time_scale
        )
        for r in schedule
    ]


def locust_spawner(registry: ChildRegistry) -> Spawn:
    """How the load generator is started: as a child of ``registry``, in its own group."""

    def spawn(cmd: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        return registry.spawn(
            cmd, role="load generator", stdout_path=log_path, env=env, cwd=log_path.parent
        )

    return spawn


def summarise_records(
    spec: WorkloadSpec,
    records: list[RequestRecord],
    *,
    window_s: float,
    time_scale: float = 1.0,
    cut_short: bool = False,
) -> tuple[LoadResult, SloVerdict]:
    """Some records of a run (e.g. one level's measured window, ``window_s`` emulated
    seconds) against the workload's SLOs, in the emulated GPU's time (see run_schedule)."""
    k = time_scale
    result = LoadResult.from_records(
        records, slo=spec.slo.scaled(k), window_s=window_s * k, cut_short=cut_short
    ).in_virtual_time(k)
    return result, slo_verdict(spec, result)

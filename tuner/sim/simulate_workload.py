"""`tuner simulate --workload`: a workload spec's schedule, as the simulated engine runs it.

A built-in workload (``agent``, ``chat``, ...) or a YAML file, at its own rate or
``--rate`` (its arrivals: sessions per second where it has sessions) over its own window
or ``--duration``. Sessions open on the conversations already under way, as a tune's
levels do (``sessions.start: stationary`` unless the spec sets its start), and every later
turn arrives its think time after the answer it follows, on the virtual clock. The
summary counts the requests of the measured window (warm-up left out); the run is cut a
drain after it, as a measured level is.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import WorkloadLoadError
from tuner.sim.tokenizer import ChatEncoder, encode
from workloads.build import build_schedule
from workloads.slo import Slo, SloMetric
from workloads.spec import SessionStart, WorkloadError, WorkloadSpec, load_workload
from workloads.traces import TraceError, TraceRecord

MIN_DRAIN_S = 4.0  # as a measured level's (tuner.serving.level_schedule.drain_s)


@dataclass(frozen=True)
class WorkloadRun:
    """What ``tuner.sim.simulate.run`` is given for one workload's schedule."""

    spec: WorkloadSpec
    records: list[TraceRecord]
    prompt_token_ids: list[list[int]]
    follows: list[int | None] | None
    think_s: list[float] | None
    measure_from_s: float
    measure_to_s: float
    stop_at_s: float


def load_for_simulation(
    name: str, *, rate_per_s: float | None, duration_s: float | None
) -> WorkloadSpec:
    """The workload at ``rate_per_s`` over ``duration_s`` (each its own when None), its
    sessions opening on those under way; a bad name, file or value is a WorkloadLoadError."""
    try:
        spec = load_workload(name)
        if rate_per_s is not None:
            spec = spec.with_rate(rate_per_s)
        if duration_s is not None:
            spec = spec.with_duration(duration_s)
    except (WorkloadError, TraceError) as exc:
        raise WorkloadLoadError(str(exc)) from exc
    if spec.mean_rate_per_s is None:
        raise WorkloadLoadError(
            f"--workload {name!r} is a closed batch; accepted: a workload with arrivals "
            "(agent, chat, code, rag, mixed-long-short or a YAML file)"
        )
    sessions = spec.sessions
    if sessions is not None and "start" not in sessions.model_fields_set:
        sessions = sessions.model_copy(update={"start": SessionStart.STATIONARY})
        spec = spec.model_copy(update={"sessions": sessions})
    return spec


def plan_workload_run(spec: WorkloadSpec, *, vocab: int) -> WorkloadRun:
    """The spec's schedule as records, prompt ids (its own text through the simulator's
    tokenizer, each chat message once) and the links of later turns to their answers."""
    schedule = build_schedule(spec)
    if not schedule:
        raise WorkloadLoadError(f"workload {spec.name!r} sends no request in {spec.duration_s:g} s")
    chats = ChatEncoder(vocab)
    ids = [
        chats.encode_chat(r.messages) if r.messages is not None else encode(r.prompt or "", vocab)
        for r in schedule
    ]
    records = [
        TraceRecord(arrival_s=r.send_s, prompt_tokens=r.prompt_tokens, output_tokens=r.max_tokens)
        for r in schedule
    ]
    follows: list[int | None] | None = None
    think: list[float] | None = None
    if any(r.follows is not None for r in schedule):
        index = {r.request_id: i for i, r in enumerate(schedule)}
        follows = [index.get(r.follows) if r.follows is not None else None for r in schedule]
        think = [r.think_time_s for r in schedule]
    measured = [r.send_s for r in schedule if not r.warmup]
    start = min(measured) if measured else min(r.send_s for r in schedule)
    end = start + spec.duration_s
    ttft_limits = [o.limit_ms for o in spec.slo.objectives() if o.metric is SloMetric.TTFT]
    drain = max(MIN_DRAIN_S, 1.5 * max(ttft_limits, default=0.0) / 1000.0)
    return WorkloadRun(
        spec=spec, records=records, prompt_token_ids=ids, follows=follows, think_s=think,
        measure_from_s=start, measure_to_s=end, stop_at_s=end + drain,
    )  # fmt: skip


def simulation_slo(spec: WorkloadSpec, ttft_ms: float | None, tpot_ms: float | None) -> Slo:
    """The workload's SLO, a metric replaced where ``--slo-ttft-ms``/``--slo-tpot-ms`` say."""
    return spec.slo.overridden_by(Slo.p99(ttft_ms=ttft_ms, tpot_ms=tpot_ms))

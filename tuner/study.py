"""The Optuna study: each trial is one candidate launched, warmed up, loaded and scored.

Storage is SQLite in the run directory unless ``--storage`` gives any SQLAlchemy
URL (PostgreSQL for several workers on one study). Heartbeats mark a trial whose
worker died; such a trial is failed and retried with the same settings, by this
worker or another. The first trial of a new study is vLLM's own defaults, so
every run measures the baseline its recommendation is compared with.

Trials are COMPLETE whatever happened to the server: the verdict, failure class
and evidence go into user attributes and ``trials/<n>/evaluation.json``, and the
constraints (``tuner.sampling.CONSTRAINTS``) tell the sampler which were feasible.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.context import TuneContext, auto_stream_fraction, auto_time_scale
from tuner.errors import ConfigError
from tuner.evaluate import Evaluation, Verdict, evaluate
from tuner.load import plan_schedule
from tuner.memory import Calibration
from tuner.predict import Setup, max_rate
from tuner.processes import ChildRegistry
from tuner.rate_search import level_workload
from tuner.sampling import Objective, make_sampler
from tuner.server import Backend
from tuner.space import TrialParams, vllm_defaults
from tuner.vllm_log import calibration_from_report

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 15
HEARTBEAT_ENV = "TUNER_HEARTBEAT_S"  # seconds between heartbeats; the grace is 4 of them
PREPARE_WAIT_S = 600.0
OTHERS_POLL_S = 2.0  # how often a worker waiting for other workers' trials looks again
FINALIZED_ATTR = "finalized"  # study attribute set once the finalize is written
EVALUATION_ATTR = "evaluation"  # trial attribute: the Evaluation, for workers on other hosts
ROLE_DEFAULT = "vllm-default"
ROLE_SEARCH = "search"

Progress = Callable[[str], None]


def storage_url(ctx: TuneContext) -> str:
    if ctx.config.storage:
        return ctx.config.storage
    return f"sqlite:///{(ctx.run_dir / 'study.db').resolve()}"


def open_storage(url: str) -> Any:
    import warnings

    import optuna
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 30}}

    def attempt() -> Any:
        with warnings.catch_warnings():  # heartbeats are stable in use, flagged experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            interval = int(os.environ.get(HEARTBEAT_ENV) or HEARTBEAT_INTERVAL_S)
            return RDBStorage(
                url,
                heartbeat_interval=interval,
                grace_period=max(4 * interval, 2),
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=2),
                **kwargs,
            )

    try:
        return _retry_schema_race(attempt)
    except (optuna.exceptions.StorageInternalError, ImportError, ValueError) as exc:
        raise ConfigError(
            f"cannot open the study storage {redact_url(url)!r}: {exc}; accepted: a SQLAlchemy "
            "URL such as sqlite:///runs/study.db or postgresql://user@host/db"
        ) from None
    except Exception as exc:  # SQLAlchemy's errors: unreachable host, bad credentials
        raise ConfigError(f"cannot open the study storage {redact_url(url)!r}: {exc}") from None


def _retry_schema_race(attempt: Callable[[], Any], tries: int = 5) -> Any:
    """Workers opening a new database at once all create Optuna's tables; all but one
    collide (duplicate type, table or version row). Once one has, opening again works."""
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    for i in range(tries):
        try:
            return attempt()
        except (IntegrityError, ProgrammingError):
            if i == tries - 1:
                raise
            log.info("the study storage's tables were being created by another worker; again")
            time.sleep(0.5 + i)
    raise AssertionError("unreachable")


def redact_url(url: str) -> str:
    """The URL without its password."""
    head, sep, tail = url.partition("://")
    if not sep or "@" not in tail:
        return url
    creds, _, host = tail.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{head}://{user}:***@{host}" if ":" in creds else url


def open_study(ctx: TuneContext) -> Any:
    """Create the study, or load it with ``--resume`` (an existing one without it is an error)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    config = ctx.config
    url = storage_url(ctx)
    if url.startswith("sqlite"):
        ctx.run_dir.mkdir(parents=True, exist_ok=True)
    storage = open_storage(url)
    name = ctx.study_name
    existing = {s.study_name: s for s in optuna.get_all_study_summaries(storage)}
    if name in existing and existing[name].n_trials > 0 and not config.resume:
        raise ConfigError(
            f"study {name!r} already has {existing[name].n_trials} trials in "
            f"{redact_url(url)!r}; accepted: --resume to continue it, or --study NEW for a new one"
        )
    seed = config.seed
    if seed is not None and config.storage is not None:
        seed = worker_seed(seed)
    study = optuna.create_study(
        study_name=name,
        storage=storage,
        directions=config.objective.directions,
        sampler=make_sampler(config.objective, seed=seed, n_trials=config.trials),
        load_if_exists=True,
    )
    return study


def worker_seed(seed: int) -> int:
    """The sampler's seed of this worker of a shared study: ``--seed`` mixed with the
    worker's host and pid, so workers seeded alike do not suggest the same settings
    (which makes a study shared by several workers unrepeatable anyway)."""
    import socket
    import zlib

    identity = zlib.crc32(f"{socket.gethostname()}:{os.getpid()}".encode())
    return (seed * 1_000_003 + identity) % 2**32


def fail_interrupted(study: Any, *, local: bool) -> int:
    """Trials left RUNNING by a crashed worker: failed (and retried by the storage's callback).

    With a local SQLite study no other worker can be running, so every RUNNING trial
    was cut off; elsewhere only those whose heartbeat stopped.
    """
    from optuna.trial import TrialState

    if not local:
        before = len(study.get_trials(deepcopy=False, states=(TrialState.FAIL,)))
        fail_stale(study)
        return len(study.get_trials(deepcopy=False, states=(TrialState.FAIL,))) - before
    storage = study._storage
    failed = 0
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
            failed += 1
            study.enqueue_trial(trial.params, user_attrs={"retried_from": trial.number})
    return failed


class TrialLoop:
    """Runs trials until the study has ``trials`` complete ones or the time is up."""

    def __init__(
        self,
        ctx: TuneContext,
        study: Any,
        registry: ChildRegistry,
        *,
        deadline_s: float,
        progress: Progress,
    ) -> None:
        self.ctx = ctx
        self.study = study
        self.registry = registry
        self.deadline_s = deadline_s
        self.progress = progress
        self.trial_estimate_s = 0.0
        self._predicted: dict[str, float] = {}

    # -- set-up shared by every worker --------------------------------------------------------

    def prepare(self) -> None:
        """Time scale, streamed share, calibration and the baseline trial, decided once per
        study: the first worker claims the set-up (a marker study created once in the
        storage), the others wait for it and adopt what it chose."""
        import optuna

        attrs = self.study.user_attrs
        if "time_scale" not in attrs:
            if claim(self.study, "prepare"):
                time_scale, fraction = self._choose_measurement()
                for key, value in {
                    "model": self.ctx.config.model,
                    "gpu": self.ctx.gpu_name,
                    "backend": self.ctx.backend.value,
                    "vllm_version": str(self.ctx.version),
                    "workload": self.ctx.workload.name,
                    "objective": self.ctx.config.objective.value,
                    "space": self.ctx.space.describe(),
                    "stream_fraction": fraction,
                }.items():
                    self.study.set_user_attr(key, value)
                if not self.study.trials:
                    defaults = vllm_defaults(
                        self.ctx.space, self.ctx.version, self.ctx.gpu_or_default
                    )
                    self.study.enqueue_trial(
                        self.ctx.space.to_optuna(defaults), user_attrs={"role": ROLE_DEFAULT}
                    )
                self.study.set_user_attr("time_scale", time_scale)  # last: set-up complete
            else:
                self.progress("another worker is setting this study up; waiting for it")
                deadline = time.monotonic() + PREPARE_WAIT_S
                while "time_scale" not in self.study.user_attrs:
                    if time.monotonic() > deadline:
                        raise ConfigError(
                            f"study {self.study.study_name!r}: the worker setting it up did not "
                            f"finish within {PREPARE_WAIT_S:.0f} s; accepted: start again with --resume"
                        )
                    time.sleep(1.0)
            attrs = optuna.load_study(
                study_name=self.study.study_name, storage=self.study._storage
            ).user_attrs
        self.ctx.time_scale = float(attrs["time_scale"])
        self.ctx.stream_fraction = float(attrs.get("stream_fraction", 1.0))
        if "calibration" in attrs and self.ctx.calibration is None:
            self.ctx.calibration = Calibration.model_validate(attrs["calibration"])

    def _choose_measurement(self) -> tuple[float, float]:
        """The simulator's time scale and the share of requests streamed, so the load
        generator keeps up with the busiest rate the search will offer."""
        ctx = self.ctx
        config = ctx.config
        fraction = config.stream_fraction
        if ctx.backend is not Backend.SIM and fraction is not None:
            return 1.0, fraction
        if ctx.gpu is None or ctx.workload.mean_rate_per_s is None:
            return config.time_scale or 1.0, fraction or 1.0
        defaults = vllm_defaults(ctx.space, ctx.version, ctx.gpu)
        rate = self.predicted_max_rate(defaults, config.rate or ctx.workload.mean_rate_per_s)
        if rate <= 0:
            return config.time_scale or 1.0, fraction or 1.0
        # What the busiest level offers: its schedule's requests and tokens per second.
        spec = level_workload(ctx.workload, rate * 1.3, config.level_duration_s)
        schedule = [r for r in plan_schedule(spec) if not r.warmup]
        requests_per_s = len(schedule) / config.level_duration_s
        tokens_per_s = sum(r.max_tokens for r in schedule) / config.level_duration_s
        if fraction is None:
            fraction = auto_stream_fraction(
                tokens_per_s, requests_per_s, config.max_events_per_s, config.min_stream_fraction
            )
        if ctx.backend is not Backend.SIM:
            scale = 1.0
        elif config.time_scale is not None:
            scale = config.time_scale
        else:
            scale = auto_time_scale(tokens_per_s, requests_per_s, config.max_events_per_s, fraction)
        self.progress(
            f"the busiest level offers ~{requests_per_s:,.0f} requests/s and "
            f"~{tokens_per_s:,.0f} tokens/s: streaming {fraction:.0%} of requests"
            + (
                f", the simulated GPU's clock {scale:g}x slower (results in its own time)"
                if scale != 1.0
                else ""
            )
        )
        return scale, fraction

    # -- the loop ---------------------------------------------------------------------------------

    def complete_trials(self) -> list[Any]:
        from optuna.trial import TrialState

        return list(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))

    def running_trials(self) -> list[Any]:
        from optuna.trial import TrialState

        return list(self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))

    def run(self) -> None:
        """Run trials until the study has ``trials`` complete ones and none running.

        Between its trials a worker runs none, so the RUNNING trials are other
        workers': it starts another only while complete and running trials together
        are fewer than wanted, and otherwise waits for them (until its deadline), so
        the finalize sees every trial. A worker that died mid-trial stops sending
        heartbeats: its trial is failed here and retried (the storage's callback
        enqueues it with the same settings), and a waiting worker runs the retry.
        """
        wanted = self.ctx.config.trials
        said_waiting = False
        while True:
            fail_stale(self.study)
            done = len(self.complete_trials())
            running = len(self.running_trials())
            left = self.deadline_s - time.monotonic()
            if done >= wanted and running == 0:
                return
            if done + running >= wanted:
                if left <= 0:
                    self.progress(
                        f"time budget spent: not waiting for the {running} trial(s) other "
                        "workers are running"
                    )
                    return
                if not said_waiting:
                    self.progress(
                        f"{done} trial(s) complete, {running} running on other workers: "
                        "waiting for them"
                    )
                    said_waiting = True
                time.sleep(OTHERS_POLL_S)
                continue
            said_waiting = False
            if done > 0 and left < self.trial_estimate_s:
                self.progress(
                    f"time budget: {left:.0f} s left, a trial takes ~{self.trial_estimate_s:.0f} s; "
                    "stopping the search"
                )
                return
            began = time.monotonic()
            self.study.optimize(self._objective, n_trials=1, catch=())
            took = time.monotonic() - began
            self.trial_estimate_s = (
                max(self.trial_estimate_s * 0.5, took) if self.trial_estimate_s else took
            )

    def _objective(self, trial: Any) -> float | tuple[float, float]:
        ctx = self.ctx
        params = ctx.space.suggest(trial)
        role = trial.user_attrs.get("role", ROLE_SEARCH)
        out_dir = ctx.run_dir / "trials" / f"{trial.number:03d}"
        start = self.start_rate(params)
        evaluation = evaluate(
            ctx, params, out_dir=out_dir, registry=self.registry, start_rate_per_s=start
        )
        self._calibrate(evaluation)
        record(trial, evaluation, role=role)
        self.progress(self._line(trial.number, evaluation))
        return objective_values(ctx.config.objective, evaluation)

    def start_rate(self, params: TrialParams) -> float | None:
        """The first rate to measure: 10% below the simulator's prediction for these
        settings (so the first level usually holds and the next one brackets the edge),
        else the best goodput so far, else the workload's own rate."""
        ctx = self.ctx
        fallback = self.best_rate() or ctx.config.rate or ctx.workload.mean_rate_per_s
        if ctx.gpu is None or ctx.workload.mean_rate_per_s is None:
            return fallback
        predicted = self.predicted_max_rate(params, fallback)
        return predicted * 0.9 if predicted > 0 else fallback

    def predicted_max_rate(self, params: TrialParams, start: float | None) -> float:
        """The simulator's highest arrival rate meeting the SLOs (cached per settings)."""
        ctx = self.ctx
        key = params.model_dump_json()
        if key not in self._predicted:
            assert ctx.gpu is not None
            setup = Setup(ctx.model, ctx.gpu, ctx.version, params.serving(ctx.base))
            spec = level_workload(ctx.workload, None, ctx.config.level_duration_s)
            self._predicted[key] = max_rate(
                setup, spec, start_rate_per_s=start, precision=0.08, max_runs=10
            )
        return self._predicted[key]

    def best_rate(self) -> float | None:
        rates = [
            float(t.user_attrs["rate_per_s"])
            for t in self.complete_trials()
            if t.user_attrs.get("verdict") == Verdict.MET and t.user_attrs.get("rate_per_s")
        ]
        return max(rates) if rates else None

    def _calibrate(self, evaluation: Evaluation) -> None:
        ctx = self.ctx
        if ctx.calibration is not None or evaluation.startup is None or ctx.gpu is None:
            return
        try:
            calibration = calibration_from_report(
                evaluation.startup, source=str(Path(evaluation.dir) / "server.log")
            )
        except ConfigError:
            return
        except Exception:  # a log without the memory summary: keep the uncalibrated model
            log.info("no calibration from %s", evaluation.dir, exc_info=True)
            return
        ctx.calibration = calibration
        self.study.set_user_attr("calibration", calibration.model_dump(mode="json"))
        (ctx.run_dir / "calibration.json").write_text(
            calibration.model_dump_json(indent=2), encoding="utf-8"
        )
        self.progress(f"memory model calibrated from {calibration.source}")

    def _line(self, number: int, ev: Evaluation) -> str:
        best = best_trial(self.study)
        best_text = (
            f"best {best.user_attrs['goodput']:.2f} req/s (#{best.number})" if best else "best -"
        )
        left = max(0.0, self.deadline_s - time.monotonic())
        if ev.verdict is Verdict.MET:
            what = f"goodput {ev.goodput:6.2f} req/s  p99 TTFT {ev.p99_ttft_ms or 0:,.0f} ms"
        elif ev.failure is not None:
            what = f"{ev.failure.kind.value}"
        else:
            what = "SLO missed at every rate"
        return (
            f"trial {number:>3}  {ev.params.short():<52} {ev.verdict.value:<14} {what:<44} "
            f"{best_text}  {left / 60:4.1f} min left"
        )


def fail_stale(study: Any) -> None:
    """Fail the trials of workers whose heartbeat stopped (each is retried by the storage's
    callback); what Optuna does itself before each trial, here also while waiting."""
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def claim(study: Any, what: str) -> bool:
    """True for exactly one worker of a study: creating the marker study succeeds once."""
    import optuna

    try:
        optuna.create_study(study_name=f"{study.study_name}.{what}", storage=study._storage)
    except optuna.exceptions.DuplicatedStudyError:
        return False
    return True


def mark_finalized(study: Any, run_dir: Path) -> None:
    """Tell the other workers the edge search, recommendation and report are written."""
    import socket

    study.set_user_attr(
        FINALIZED_ATTR, {"host": socket.gethostname(), "run_dir": str(run_dir), "at": time.time()}
    )


def wait_finalized(study: Any, *, deadline_s: float, progress: Progress) -> bool:
    """Wait (until ``deadline_s``, monotonic) for the worker that claimed the finalize."""
    while FINALIZED_ATTR not in study.user_attrs:
        if time.monotonic() > deadline_s:
            progress("the finalizing worker did not finish in time; reporting what is here")
            return False
        time.sleep(OTHERS_POLL_S)
    where = study.user_attrs[FINALIZED_ATTR]
    progress(f"finalized by the worker on {where.get('host')} in {where.get('run_dir')}")
    return True


def objective_values(objective: Objective, ev: Evaluation) -> float | tuple[float, float]:
    if objective is Objective.GOODPUT:
        return ev.goodput if ev.verdict.feasible else 0.0
    if objective is Objective.THROUGHPUT:
        return ev.throughput if ev.verdict.feasible else 0.0
    p99 = ev.p99_ttft_ms if ev.verdict.feasible and ev.p99_ttft_ms is not None else 1e9
    return (ev.throughput if ev.verdict.feasible else 0.0, p99)


def record(trial: Any, ev: Evaluation, *, role: str) -> None:
    """User attributes (what the report and other workers read) and constraints."""
    starts = ev.verdict not in (Verdict.SCREENED, Verdict.STARTUP_FAILED)
    trial.set_constraint("starts", 0.0 if starts else 1.0)
    trial.set_constraint("survives", 1.0 if ev.verdict is Verdict.DIED else 0.0)
    trial.set_constraint("slo", 0.0 if ev.verdict.feasible else 1.0)
    best = ev.best.load if ev.best else None
    attrs: dict[str, Any] = {
        "role": role,
        "verdict": ev.verdict.value,
        "outcome": ev.outcome.value if ev.outcome else None,
        "dir": ev.dir,
        "flags": ev.flags,
        "goodput": ev.goodput,
        "throughput": ev.throughput,
        "rate_per_s": ev.rate_per_s,
        "failure_kind": ev.failure.kind.value if ev.failure else None,
        "failure_message": ev.failure.message[:300] if ev.failure else None,
        "p99_ttft_ms": best.ttft_ms.p99 if best else None,
        "p99_itl_ms": best.itl_ms.p99 if best else None,
        "p99_e2e_ms": best.e2e_ms.p99 if best else None,
        "peak_used_bytes": ev.gpu.peak_used_bytes if ev.gpu else None,
        "total_bytes": ev.gpu.total_bytes if ev.gpu else None,
        "kv_cache_tokens": ev.startup.kv_cache_tokens if ev.startup else None,
        "levels": len(ev.levels),
    }
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    # The whole evaluation too (~20 kB): a worker on another host finalizing the study
    # reads it from the storage when this run directory is not on its filesystem.
    trial.set_user_attr(EVALUATION_ATTR, ev.model_dump(mode="json"))


def best_trial(study: Any) -> Any | None:
    """The feasible trial with the highest goodput (ties: the higher throughput)."""
    from optuna.trial import TrialState

    feasible = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.user_attrs.get("verdict") == Verdict.MET.value
    ]
    if not feasible:
        return None
    return max(feasible, key=lambda t: (t.user_attrs["goodput"], t.user_attrs["throughput"]))


def default_trial(study: Any) -> Any | None:
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get("role") == ROLE_DEFAULT:
            return t
    return None


def load_evaluation(trial: Any) -> Evaluation | None:
    """The trial's evaluation.json, else (run by a worker on another host) its copy in the
    study."""
    path = Path(str(trial.user_attrs.get("dir", "")), "evaluation.json")
    try:
        return Evaluation.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    try:
        return Evaluation.model_validate(trial.user_attrs[EVALUATION_ATTR])
    except (KeyError, ValueError):
        return None

"""The regression gate: a run's recommendation against a stored baseline; what `tuner check` runs.

A run's figures are those of its recommended variant's confirmation runs
(``RUN_DIR/recommendation/recommendation.json``, and each repeat's
``confirm/<variant>[-<i>]/evaluation.json`` beside it when ``tuner tune --repeats N``
made several):

    goodput          requests/s at the highest rate meeting the SLOs   higher is better
    ttft_p99_ms      p99 time to first token at that rate              lower is better
    itl_p99_ms       p99 inter-token latency at that rate              lower is better
    e2e_p99_ms       p99 end-to-end latency at that rate               lower is better
    peak_used_bytes  peak GPU memory used during the run               lower is better

Each figure is the mean over the repeats, with the repeats' relative spread
((max - min) / mean) as the run-to-run noise. A metric fails the check only when it
is worse than the baseline by more than the tolerance *and* by more than the noise
(the larger of the baseline's and this run's spread): a change the repeats
themselves show between identical runs is not evidence of a regression. The goodput
has a second measure of its noise, from each run's own levels: its capacity interval
(``tuner.search.capacity_interval``). The sum of the two intervals' relative
half-widths is about how far apart the two must be before their intervals stop
overlapping, and the goodput's noise is the larger of that and the spreads: a
goodput within it is a tie, not a regression. With one run and no interval there is
no measured noise and the tolerance alone decides.

The quality gate's result for the recommended settings (``tuner.search.quality_gate``)
travels with the figures. On a real vLLM, a recommendation that changes the model's
numerics (``--kv-cache-dtype fp8``) without a passed quality result (``tuner tune
--no-quality-gate``) fails the check: its speed may be bought with wrong answers. Both
sides' quality results are said under the table. A baseline written before the goodput
stated the declared workload at its rate (``UnitsBasis.DECLARED``) counted its windows'
requests; such a pair is compared and the note says so.

A baseline (``Baseline``, JSON) is a run's figures with what they were measured
for: model, GPU, workload, SLOs, backend, vLLM release. A run of another model, GPU,
workload or SLO, or a real GPU against a simulated baseline (or the reverse), is
refused. A run of another minor vLLM release is compared, and said above the table
(and on top of the job summary): its defaults and kernels differ.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reports.gate_settings import SUMMARY_ENV
from tuner.errors import ConfigError, RunFileError
from tuner.run.evaluation import Verdict
from tuner.run.goodput import CapacityInterval, UnitsBasis
from tuner.run.quality import QualityResult
from tuner.run.reader import RunReader
from tuner.run.recommendation import ConfirmationResult
from tuner.search.recommend import HARNESS_VERSION, measured_of
from tuner.serving.server import Backend
from tuner.vllm.versions import VllmVersion
from workloads.slo import SloAsTexts

BASELINE_FORMAT = 1
SIMULATED_NOTE = (
    "SIMULATED: measured on the simulated engine, not on a GPU; for tests and "
    "demonstrations, never a gate for real vLLM"
)
_EPSILON_PCT = 1e-9  # changes within this of a limit count as at the limit (float rounding)


class Direction(StrEnum):
    HIGHER = "higher is better"
    LOWER = "lower is better"


class Metric(StrEnum):
    """The figures the gate compares, in the order the table shows them."""

    GOODPUT = "goodput"
    TTFT_P99_MS = "ttft_p99_ms"
    ITL_P99_MS = "itl_p99_ms"
    E2E_P99_MS = "e2e_p99_ms"
    PEAK_USED_BYTES = "peak_used_bytes"

    @property
    def direction(self) -> Direction:
        return Direction.HIGHER if self is Metric.GOODPUT else Direction.LOWER

    @property
    def label(self) -> str:
        return {
            Metric.GOODPUT: "goodput (req/s)",
            Metric.TTFT_P99_MS: "p99 TTFT (ms)",
            Metric.ITL_P99_MS: "p99 ITL (ms)",
            Metric.E2E_P99_MS: "p99 e2e (ms)",
            Metric.PEAK_USED_BYTES: "peak memory (GiB)",
        }[self]

    def show(self, value: float | None) -> str:
        if value is None:
            return "-"
        if self is Metric.PEAK_USED_BYTES:
            return f"{value / 2**30:.2f}"
        if self is Metric.GOODPUT:
            return f"{value:.2f}"
        return f"{value:.1f}"

    def of(self, measured: ConfirmationResult) -> float | None:
        """This metric of one confirmation measurement (None when it was not measured)."""
        if self is Metric.GOODPUT:
            return measured.goodput
        if self is Metric.PEAK_USED_BYTES:
            return float(measured.peak_used_bytes) if measured.peak_used_bytes else None
        latency = {
            Metric.TTFT_P99_MS: measured.ttft_ms,
            Metric.ITL_P99_MS: measured.itl_ms,
            Metric.E2E_P99_MS: measured.e2e_ms,
        }[self]
        return latency.p99 if latency is not None else None


def spread_pct(runs: Sequence[float]) -> float:
    """Relative run-to-run spread in percent: (max - min) / mean; 0 with fewer than two runs."""
    if len(runs) < 2:
        return 0.0
    mean = statistics.fmean(runs)
    if mean == 0:
        return 0.0
    return (max(runs) - min(runs)) / abs(mean) * 100.0


class Figure(BaseModel):
    """One metric of one run: the mean over its repeats, each repeat's value, their spread;
    for the goodput, also its capacity interval's half-width over its middle (percent:
    the sampling noise of the confirmation's own levels; None: not measured, or the
    interval has no upper end)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: float
    runs: list[float]
    spread_pct: float = Field(ge=0)
    interval_pct: float | None = Field(default=None, ge=0)

    @classmethod
    def of(cls, runs: Sequence[float]) -> Figure:
        if not runs:
            raise ValueError("a figure needs at least one run")
        return cls(value=statistics.fmean(runs), runs=list(runs), spread_pct=spread_pct(runs))


class RunFigures(BaseModel):
    """What a run's recommendation comes to, for the gate, and what it was measured for."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_dir: str
    study: str
    model: str
    gpu: str | None
    backend: Backend
    simulated: bool
    vllm_version: str
    workload: str
    slo: SloAsTexts  # recorded as its objectives' texts, e.g. "ttft p99 <= 2000 ms"
    flags: dict[str, object]
    version_hash: str
    repeats: int
    metrics: dict[Metric, Figure]
    notes: list[str] = []
    # The quality gate's result for the recommended settings (None: they keep the model's
    # own numerics, or a baseline written before the gate)
    quality: QualityResult | None = None
    # What the goodput's requests/s count (tuner.run.goodput.UnitsBasis): WINDOW in
    # baselines written before it was recorded
    goodput_basis: UnitsBasis = UnitsBasis.WINDOW


class Baseline(RunFigures):
    """A run's figures kept as the reference later runs are checked against."""

    format: int = BASELINE_FORMAT
    created_at: str
    harness_version: str
    note: str | None = None  # SIMULATED_NOTE for a baseline from the simulated engine

    @classmethod
    def from_run(cls, run: RunFigures) -> Baseline:
        return cls(
            **run.model_dump(),
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            harness_version=HARNESS_VERSION,
            note=SIMULATED_NOTE if run.simulated else None,
        )


class RowVerdict(StrEnum):
    OK = "ok"  # within the tolerance (either way)
    IMPROVED = "improved"  # better by more than the tolerance and the noise
    NOISE = "within noise"  # worse by more than the tolerance, within the measured noise
    REGRESSED = "REGRESSED"  # worse by more than the tolerance and the noise: fails
    MISSING = "MISSING"  # the baseline has it, this run did not measure it: fails
    NOT_IN_BASELINE = "not in baseline"  # not compared

    @property
    def failed(self) -> bool:
        return self in (RowVerdict.REGRESSED, RowVerdict.MISSING)


class Row(BaseModel):
    """One metric compared."""

    model_config = ConfigDict(frozen=True)

    metric: Metric
    direction: Direction
    baseline: float | None
    current: float | None
    change_pct: float | None  # (current - baseline) / baseline; None when not comparable
    tolerance_pct: float
    noise_pct: float  # the larger of the two runs' spreads (goodput: and their intervals' widths)
    allowed_pct: float  # max(tolerance, noise): how much worse still passes
    verdict: RowVerdict


class CheckResult(BaseModel):
    """A run checked against a baseline: one row per metric."""

    model_config = ConfigDict(frozen=True)

    run_dir: str
    baseline_path: str
    tolerance_pct: float
    repeats: int
    baseline_repeats: int
    rows: list[Row]
    notes: list[str]
    # the baseline is from another minor vLLM release (compared, said above the table)
    release_changed: str | None = None
    # why the recommendation's quality fails the check (None: it does not)
    quality_failure: str | None = None

    @property
    def passed(self) -> bool:
        return self.quality_failure is None and not any(row.verdict.failed for row in self.rows)

    @property
    def failures(self) -> list[Row]:
        return [row for row in self.rows if row.verdict.failed]


# -- comparing ------------------------------------------------------------------------------------


def interval_noise_pct(baseline: Figure | None, current: Figure | None) -> float:
    """The goodput's noise from the two capacity intervals: the sum of their relative
    half-widths, about how far apart their middles must be before the intervals stop
    overlapping (``CapacityInterval.overlaps``, a tie within the noise). 0 where neither
    has one."""
    return sum(f.interval_pct or 0.0 for f in (baseline, current) if f is not None)


def interval_pct(interval: CapacityInterval | None) -> float | None:
    """A capacity interval's half-width over its middle, in percent (None: no interval or
    no upper end)."""
    if interval is None or interval.high_per_s is None:
        return None
    middle = (interval.low_per_s + interval.high_per_s) / 2.0
    if middle <= 0:
        return None
    return (interval.high_per_s - interval.low_per_s) / 2.0 / middle * 100.0


def compare_metric(
    metric: Metric, baseline: Figure | None, current: Figure | None, tolerance_pct: float
) -> Row:
    """One metric's verdict: worse beyond both the tolerance and the noise fails."""
    noise = max(
        baseline.spread_pct if baseline is not None else 0.0,
        current.spread_pct if current is not None else 0.0,
        interval_noise_pct(baseline, current),
    )
    allowed = max(tolerance_pct, noise)

    def row(change: float | None, verdict: RowVerdict) -> Row:
        return Row(
            metric=metric,
            direction=metric.direction,
            baseline=baseline.value if baseline is not None else None,
            current=current.value if current is not None else None,
            change_pct=change,
            tolerance_pct=tolerance_pct,
            noise_pct=noise,
            allowed_pct=allowed,
            verdict=verdict,
        )

    if baseline is None:
        return row(None, RowVerdict.NOT_IN_BASELINE)
    if current is None:
        return row(None, RowVerdict.MISSING)
    sign = 1.0 if metric.direction is Direction.LOWER else -1.0
    if baseline.value == 0:
        # No relative change from zero: any move the wrong way is a regression.
        worse = sign * current.value
        if worse > 0:
            return row(None, RowVerdict.REGRESSED)
        if worse < 0:
            return row(None, RowVerdict.IMPROVED)
        return row(0.0, RowVerdict.OK)
    change = (current.value - baseline.value) / abs(baseline.value) * 100.0
    worse_pct = sign * change
    if worse_pct > allowed + _EPSILON_PCT:
        verdict = RowVerdict.REGRESSED
    elif worse_pct > tolerance_pct + _EPSILON_PCT:
        verdict = RowVerdict.NOISE
    elif -worse_pct > allowed + _EPSILON_PCT:
        verdict = RowVerdict.IMPROVED
    else:
        verdict = RowVerdict.OK
    return row(change, verdict)


def mismatches(baseline: RunFigures, run: RunFigures) -> list[str]:
    """What makes the two runs incomparable: model, GPU, workload, SLOs, simulated or real."""
    out: list[str] = []
    for name in ("model", "gpu", "workload"):
        a, b = getattr(baseline, name), getattr(run, name)
        if a != b:
            out.append(f"{name} {b!r} (baseline: {a!r})")
    if baseline.slo != run.slo:  # the same objectives, however each run wrote them
        out.append(f"SLO {run.slo.text()!r} (baseline: {baseline.slo.text()!r})")
    if baseline.simulated != run.simulated:
        kinds = {True: "the simulated engine", False: "real vLLM"}
        out.append(f"measured on {kinds[run.simulated]} (baseline: {kinds[baseline.simulated]})")
    return out


def check(
    run: RunFigures, baseline: Baseline, *, baseline_path: Path, tolerance_pct: float
) -> CheckResult:
    """Compare ``run`` with ``baseline``; ConfigError when they were measured for different things."""
    validate_tolerance(tolerance_pct)
    different = mismatches(baseline, run)
    if different:
        raise ConfigError(
            f"baseline {str(baseline_path)!r} is not comparable with run {run.run_dir!r}: "
            + "; ".join(different)
            + "; accepted: a baseline of the same model, GPU, workload and SLO "
            "(write one with --update-baseline)"
        )
    rows = [
        compare_metric(m, baseline.metrics.get(m), run.metrics.get(m), tolerance_pct)
        for m in Metric
    ]
    notes = list(run.notes)
    goodput = rows[0]
    if goodput.verdict not in (RowVerdict.OK, RowVerdict.MISSING, RowVerdict.NOT_IN_BASELINE):
        notes.append(
            "p99 latencies are each run's at its own goodput rate "
            f"({Metric.GOODPUT.show(goodput.current)} req/s here, "
            f"{Metric.GOODPUT.show(goodput.baseline)} in the baseline): different loads"
        )
    release_changed = another_release(baseline.vllm_version, run.vllm_version)
    if release_changed is None and baseline.vllm_version != run.vllm_version:
        notes.append(f"vLLM {run.vllm_version} (baseline: vLLM {baseline.vllm_version})")
    if baseline.version_hash != run.version_hash:
        notes.append(
            f"recommended settings differ from the baseline's: {_flags(run.flags)} "
            f"(baseline: {_flags(baseline.flags)})"
        )
    if run.repeats < 2 and baseline.repeats < 2:
        notes.append(
            "one confirmation run on each side: no run-to-run noise measured, the tolerance "
            "alone decides (tuner tune --repeats 3 measures it)"
        )
    if baseline.note:
        notes.append(f"baseline: {baseline.note}")
    notes.extend(quality_notes(baseline, run))
    if baseline.goodput_basis is not run.goodput_basis:
        notes.append(units_note(baseline.goodput_basis, run.goodput_basis))
    return CheckResult(
        run_dir=run.run_dir,
        baseline_path=str(baseline_path),
        tolerance_pct=tolerance_pct,
        repeats=run.repeats,
        baseline_repeats=baseline.repeats,
        rows=rows,
        notes=notes,
        release_changed=release_changed,
        quality_failure=quality_failure(run),
    )


def quality_failure(run: RunFigures) -> str | None:
    """Why the run's recommendation fails on its quality, or None: on a real vLLM, settings
    that change the model's numerics are recommended only with a passed quality result
    (on the simulated engine nothing can be measured, and the note says so)."""
    quality = run.quality
    if run.simulated or quality is None or quality.passed:
        return None
    return (
        f"the recommendation changes the model's numerics without a passed quality check: "
        f"{quality.text()} (run tuner tune without --no-quality-gate)"
    )


def quality_notes(baseline: RunFigures, run: RunFigures) -> list[str]:
    """Each side's quality result in words, where either side changed the numerics."""
    if run.quality is None and baseline.quality is None:
        return []
    own = "the recommended settings keep the model's own numerics"
    notes = [f"quality: {run.quality.text() if run.quality is not None else own}"]
    notes.append(
        f"baseline's quality: {baseline.quality.text() if baseline.quality is not None else own}"
    )
    return notes


def units_note(baseline: UnitsBasis, run: UnitsBasis) -> str:
    """What differs when the two goodputs' requests/s count differently."""
    return (
        f"the goodputs' requests/s count differently (baseline: {baseline.value}, this run: "
        f"{run.value}): a window's own count is a draw of the workload (its arrivals, the "
        "requests its end cut), the declared one is the rate that held times the workload's "
        "requests per arrival; the difference is that draw, a few percent (write a new "
        "baseline with --update-baseline to compare like with like)"
    )


def another_release(baseline_version: str, run_version: str) -> str | None:
    """One line when the run's vLLM is another minor release than the baseline's (its
    defaults, scheduler and kernels change between minor releases: the comparison measures
    vLLM as much as the settings); None within one minor release."""
    base, now = VllmVersion.read(baseline_version), VllmVersion.read(run_version)
    if base is not None and now is not None and base.minor_release == now.minor_release:
        return None
    if base is None and now is None and baseline_version == run_version:
        return None
    return (
        f"BASELINE FROM ANOTHER vLLM RELEASE: this run measured vLLM {run_version}, the "
        f"baseline vLLM {baseline_version}; a difference may be vLLM's, not the settings' "
        "(after a deliberate upgrade, write a new baseline with --update-baseline)"
    )


def validate_tolerance(tolerance_pct: float) -> None:
    if not math.isfinite(tolerance_pct) or tolerance_pct < 0:
        raise ConfigError(
            f"--tolerance {tolerance_pct:g} is not accepted; accepted: a percentage >= 0, e.g. 5"
        )


def _flags(flags: dict[str, object]) -> str:
    return " ".join(f"--{k} {v}" for k, v in sorted(flags.items()))


# -- reading a run and a baseline -----------------------------------------------------------------


def load_run(run_dir: Path) -> RunFigures:
    """The figures of a finished `tuner tune` run's recommendation."""
    reader = RunReader(run_dir)
    path = reader.layout.recommendation_json
    if not run_dir.is_dir():
        raise ConfigError(
            f"run directory {str(run_dir)!r} does not exist; accepted: the run directory of a "
            "finished `tuner tune`"
        )
    if not path.is_file():
        raise ConfigError(
            f"{str(run_dir)!r} has no recommendation/recommendation.json; accepted: the run "
            "directory of a `tuner tune` that finished with a recommendation"
        )
    try:
        rec = reader.recommendation()
    except RunFileError as exc:
        raise ConfigError(
            f"{str(path)!r} is not a readable recommendation: {_first(exc.cause or exc)}"
        ) from exc
    assert rec is not None  # the file is there
    variant = rec.recommended
    measured = variant.measured
    if measured is None:
        raise ConfigError(
            f"the recommendation in {str(run_dir)!r} was not measured (tuner tune --no-confirm); "
            "accepted: a run whose recommendation was confirmed"
        )
    notes: list[str] = []
    repeats = _repeat_measurements(reader, variant.name, measured)
    if repeats is None:
        repeats = [measured]
        if len(measured.goodput_runs) > 1:
            notes.append(
                f"the {len(measured.goodput_runs)} repeats' evaluation.json are not under "
                f"{str(run_dir / 'confirm')!r}: latency and memory noise unknown (goodput's known)"
            )
    metrics: dict[Metric, Figure] = {}
    for metric in Metric:
        if metric is Metric.GOODPUT:
            runs = list(measured.goodput_runs) or [measured.goodput]
        else:
            runs = [v for v in (metric.of(m) for m in repeats) if v is not None]
        if runs:
            metrics[metric] = Figure.of(runs)
    if Metric.GOODPUT in metrics:
        width = interval_pct(measured.capacity_interval)
        metrics[Metric.GOODPUT] = metrics[Metric.GOODPUT].model_copy(update={"interval_pct": width})
    if measured.verdict is not Verdict.MET:
        notes.append(f"the recommendation's confirmation came out {measured.verdict.value}")
    missed = [i for i, g in enumerate(measured.goodput_runs) if g <= 0]
    if missed and len(missed) < len(measured.goodput_runs):
        notes.append(
            f"repeat(s) {', '.join(map(str, missed))} of {len(measured.goodput_runs)} met the "
            "SLO at no rate (goodput 0): the goodput noise includes them"
        )
    return RunFigures(
        run_dir=str(run_dir),
        study=rec.study,
        model=rec.model,
        gpu=rec.gpu,
        backend=rec.backend,
        simulated=rec.simulated,
        vllm_version=rec.vllm_version,
        workload=rec.workload,
        slo=rec.slo,
        flags=dict(variant.flags),
        version_hash=rec.version_hash,
        repeats=max(1, len(measured.goodput_runs)),
        metrics=metrics,
        notes=notes,
        quality=rec.quality,
        goodput_basis=measured.stated_goodput.basis,
    )


def _repeat_measurements(
    reader: RunReader, variant: str, measured: ConfirmationResult
) -> list[ConfirmationResult] | None:
    """Each confirmation repeat's measurement, from its evaluation.json (layout of
    ``tuner.search.recommend.confirm``: ``confirm/<variant>`` for one run, ``<variant>-<i>`` for
    several); None unless every repeat is there and agrees with the recommendation."""
    n = len(measured.goodput_runs)
    if n == 0:
        return None
    repeats: list[int | None] = [None] if n == 1 else list(range(n))
    out: list[ConfirmationResult] = []
    for repeat, goodput in zip(repeats, measured.goodput_runs, strict=True):
        try:
            evaluation = reader.evaluation(reader.confirmation_dir(variant, repeat))
        except RunFileError:
            return None
        if evaluation is None:
            return None
        one = measured_of([evaluation])
        if not math.isclose(one.goodput, goodput, rel_tol=1e-9, abs_tol=1e-12):
            return None
        out.append(one)
    return out


def load_baseline(path: Path) -> Baseline:
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            f"baseline {str(path)!r} does not exist; accepted: a baseline JSON written by "
            "`tuner check RUN_DIR --baseline FILE --update-baseline`"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read baseline {str(path)!r}: {exc.strerror}") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"baseline {str(path)!r} is not JSON: {exc}") from exc
    if isinstance(data, dict) and data.get("format", BASELINE_FORMAT) != BASELINE_FORMAT:
        raise ConfigError(
            f"baseline {str(path)!r} has format {data.get('format')!r}; accepted: format "
            f"{BASELINE_FORMAT} (write a new one with --update-baseline)"
        )
    try:
        return Baseline.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"baseline {str(path)!r} is not a baseline: {_first(exc)}") from exc


def write_baseline(run: RunFigures, path: Path) -> Baseline:
    """Write ``run``'s figures as the baseline at ``path`` (atomically); refuses a run that
    met no SLO, which would make every later run pass."""
    goodput = run.metrics.get(Metric.GOODPUT)
    if goodput is None or goodput.value <= 0:
        raise ConfigError(
            f"run {run.run_dir!r} served nothing within the SLO (goodput 0); accepted: a run "
            "whose recommendation met the SLO as a baseline"
        )
    baseline = Baseline.from_run(run)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", delete=False
        ) as tmp:
            tmp.write(baseline.model_dump_json(indent=2) + "\n")
        os.replace(tmp.name, path)
    except OSError as exc:
        raise ConfigError(f"cannot write baseline {str(path)!r}: {exc.strerror}") from exc
    return baseline


def _first(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        loc = ".".join(str(p) for p in error["loc"])
        return f"{loc}: {error['msg']}" if loc else str(error["msg"])
    if isinstance(exc, OSError):
        return str(exc.strerror)
    return str(exc)


# -- showing --------------------------------------------------------------------------------------


def _pct(value: float | None, *, signed: bool = True) -> str:
    if value is None:
        return "-"
    return f"{value:+.1f}%" if signed else f"{value:.1f}%"


def _allowed(row: Row) -> str:
    mark = "*" if row.noise_pct > row.tolerance_pct else ""
    return _pct(row.allowed_pct, signed=False) + mark


def _cells(row: Row) -> list[str]:
    return [
        row.metric.label,
        row.metric.show(row.baseline),
        row.metric.show(row.current),
        _pct(row.change_pct),
        _allowed(row),
        row.verdict.value,
    ]


_HEADER = ["metric", "baseline", "current", "change", "allowed", "verdict"]


def outcome_line(result: CheckResult) -> str:
    if result.passed:
        return "PASS: no metric worse than the tolerance and the measured noise"
    names = [f"{r.metric.label} {_verdict_detail(r)}" for r in result.failures]
    if result.quality_failure is not None:
        names.append(f"quality: {result.quality_failure}")
    return f"REGRESSION: {', '.join(names)}"


def _verdict_detail(row: Row) -> str:
    if row.verdict is RowVerdict.MISSING:
        return "not measured"
    if row.change_pct is None:
        return f"{row.metric.show(row.baseline)} -> {row.metric.show(row.current)}"
    return f"{row.change_pct:+.1f}% (allowed {row.allowed_pct:.1f}%)"


def _legend(result: CheckResult) -> str:
    return (
        f"tolerance {result.tolerance_pct:g}%; * = the measured noise is the larger: the "
        f"repeats' run-to-run spread (this run {result.repeats} run(s), baseline "
        f"{result.baseline_repeats}), for goodput also its capacity intervals' half-widths"
    )


def format_table(result: CheckResult) -> str:
    """The plain-text table `tuner check` prints."""
    lines = [_HEADER, *(_cells(r) for r in result.rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(_HEADER))]
    out = [f"tuner check: {result.run_dir} against {result.baseline_path}"]
    if result.release_changed:
        out.append(f"warning: {result.release_changed}")
    for line in lines:
        first = line[0].ljust(widths[0])
        rest = [cell.rjust(w) for cell, w in zip(line[1:-1], widths[1:-1], strict=True)]
        out.append("  ".join([first, *rest, line[-1]]).rstrip())
    out.append(_legend(result))
    out.extend(f"note: {n}" for n in result.notes)
    out.append(outcome_line(result))
    return "\n".join(out)


def markdown_escape(text: str) -> str:
    return re.sub(r"([\\`*_{}\[\]<>|])", r"\\\1", text)


def format_markdown(result: CheckResult) -> str:
    """The same table for a GitHub job summary."""
    status = "✅ passed" if result.passed else "❌ regression"
    out = [
        f"### Regression gate: {status}",
        "",
        f"Run {markdown_escape(result.run_dir)} against "
        f"baseline {markdown_escape(result.baseline_path)}.",
        "",
    ]
    if result.release_changed:
        out += [f"> ⚠️ **{markdown_escape(result.release_changed)}**", ""]
    out += [
        "| " + " | ".join(_HEADER) + " |",
        "| :-- | --: | --: | --: | --: | :-- |",
    ]
    for row in result.rows:
        cells = [markdown_escape(c) for c in _cells(row)]
        if row.verdict.failed:
            cells[-1] = f"**{cells[-1]}**"
        out.append("| " + " | ".join(cells) + " |")
    out += ["", markdown_escape(_legend(result)), ""]
    out += [f"- {markdown_escape(n)}" for n in result.notes]
    out += ["", f"**{markdown_escape(outcome_line(result))}**", ""]
    return "\n".join(out)


def write_job_summary(markdown: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """Append to the GitHub job summary when ``GITHUB_STEP_SUMMARY`` names a file (OSError
    when it cannot be written)."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    target = env.get(SUMMARY_ENV)
    if not target:
        return None
    path = Path(target)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(markdown + "\n")
    return path

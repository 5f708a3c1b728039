"""The capacity-review report: one self-contained HTML file built from a run directory.

``write_report(run_dir)`` reads what ``tuner tune`` left (``reports.run_data``), draws
the charts (``reports.charts``) and renders ``templates/report.html.j2`` with jinja2
(autoescaped: every model name, log excerpt, failure message and setting that came
from outside is escaped) into ``RUN_DIR/report.html``. plotly's JavaScript is
embedded once; the page makes no request to any other host (no CDN, no web fonts),
opens offline and prints (A4 landscape, the SIMULATED banner on every page).

Sections, in the order a reviewer reads them: summary (recommended settings beside
vLLM's defaults, headroom to the OOM edge, replicas for the peak), the OOM edge,
trade-offs, memory over time, latency, every trial, the steady state of each measured
rate, how it was measured.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import plotly.io as pio
from plotly.offline import get_plotlyjs

from reports.charts import (
    DEFAULT_COLOR,
    GIB,
    RECOMMENDED_COLOR,
    VERDICT_COLORS,
    Chart,
    bucket_latency,
    edge_map,
    importances,
    latency_cdfs,
    level_timeline,
    memory_timeline,
    probe_memory,
    tradeoffs,
)
from reports.eviction import SHARE_LABEL, SHARE_NOTE, idle_cell, level_lines, share_cell
from reports.run_data import RunData, TrialRow, load_run
from reports.twin import twin_section
from tuner.errors import ReportError
from tuner.run.config import TuneConfig
from tuner.run.edge import KnobEdge
from tuner.run.evaluation import Evaluation, LevelRecord, Verdict
from tuner.run.goodput import CapacityGain, CapacityInterval, Goodput, GoodputUnit, gains_text
from tuner.run.layout import REPORT_HTML, RunLayout
from tuner.run.levels import (
    NOT_RECORDED,
    LatencySamples,
    LevelEvidence,
    WindowRecord,
    level_evidence,
    level_latencies,
    rebase,
    timeline,
)
from tuner.run.parallelism import Source, read_parallelism
from tuner.run.recommendation import Capacity, ConfirmationResult, Recommendation, Variant
from tuner.search.recommend import HARNESS_VERSION, measured_of
from tuner.search.study import TrialRole
from tuner.serving.backlog import BacklogCheck, BacklogVerdict, Signal, SignalTrend
from tuner.serving.gpu_sampler import AUTO_SOURCE
from tuner.serving.server import TrialOutcome
from tuner.serving.window import trace_part
from tuner.vllm.memory import Calibration
from workloads.load_result import BucketLatency, Percentiles
from workloads.spec import WorkloadSpec

REPORT_NAME = REPORT_HTML
TEMPLATE = "report.html.j2"

__all__ = ["REPORT_NAME", "WrittenReport", "render_report", "write_report", "write_report_noting"]


@dataclass(frozen=True)
class WrittenReport:
    path: Path
    study_note: str | None  # why the report was built without the study, when it was


def write_report(run_dir: Path, storage: str | None = None) -> Path:
    """Build ``run_dir/report.html`` from the run's files; ``ReportError`` if not a tune run.

    ``storage``: where the study is when it is not the run's own ``study.db``.
    """
    return write_report_noting(run_dir, storage).path


def write_report_noting(run_dir: Path, storage: str | None = None) -> WrittenReport:
    """``write_report``, also saying whether the study could be read (the report of a run
    whose study is damaged or elsewhere shows its files only: the terminal should say so)."""
    run_dir = Path(run_dir)
    data = load_run(run_dir, storage)
    text = _environment().get_template(TEMPLATE).render(**_context(data))
    out = run_dir / REPORT_NAME
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"{out}: cannot be written ({exc.strerror})") from exc
    return WrittenReport(path=out, study_note=data.study_note)


def render_report(run_dir: Path, storage: str | None = None) -> str:
    data = load_run(run_dir, storage)
    return _environment().get_template(TEMPLATE).render(**_context(data))


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("reports", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=_num, ms=_ms, gib=_gib, pct=_pct, value=_value)
    return env


# --- formatting -------------------------------------------------------------------------


def _num(value: float | int | None, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, int) or (float(value).is_integer() and abs(value) >= 100):
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def _ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f} ms" if value >= 100 else f"{value:,.1f} ms"


def _gib(value: int | float | None) -> str:
    return "–" if value is None else f"{value / GIB:,.2f} GiB"


def _pct(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:.{digits}%}"


def _value(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _script_json(value: Any) -> str:
    """JSON that is safe inside a <script> element (no '<', '>' or '&' left to end it)."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# --- view models ------------------------------------------------------------------------


@dataclass
class ChartView:
    """A chart for the template; ``json`` None: not drawn, ``note`` says why."""

    id: str
    json: str | None  # safe inside <script type="application/json">
    note: str | None
    title: str | None


def _figure(chart: Chart) -> ChartView:
    if chart.figure is None:
        return ChartView(f"chart-{chart.key}", None, chart.note or "not available", chart.title)
    spec = pio.to_json(chart.figure, validate=False, remove_uids=True)
    return ChartView(f"chart-{chart.key}", _script_json(spec), chart.note, chart.title)


@dataclass
class CompareRow:
    label: str
    recommended: str
    default: str
    change: str  # relative change, recommended against the default
    better: bool | None  # colours the change


def _change(
    rec: float | None, default: float | None, higher_is_better: bool
) -> tuple[str, bool | None]:
    if rec is None or default is None or default == 0:
        return "", None
    rel = rec / default - 1.0
    if abs(rel) < 0.005:
        return "±0%", None
    return f"{rel:+.0%}", (rel > 0) == higher_is_better


def _at_least(m: ConfirmationResult | None, text: str = "≥") -> str:
    """``text`` before a goodput that is only a lower bound (no measured rate broke)."""
    return text if m is not None and m.goodput_bound.is_lower_bound else ""


def _unit(data: RunData) -> GoodputUnit:
    """The unit the run states goodput in: the workload's (requests/s when it is unreadable)."""
    return (
        GoodputUnit.of(data.workload) if data.workload is not None else GoodputUnit.REQUESTS_PER_S
    )


def _figures(g: Goodput) -> str:
    """A goodput's other figures: "41.50 req/s, 9,800 output tok/s" (no req/s when that
    is already its unit)."""
    requests = [] if g.unit is GoodputUnit.REQUESTS_PER_S else [f"{g.requests_per_s:.2f} req/s"]
    return ", ".join([*requests, f"{g.output_tokens_per_s:,.0f} output tok/s"])


def _interval(interval: CapacityInterval | None) -> str:
    """``[5.40, 6.90]``, ``[5.40, –]`` with no upper end, ``–`` when not measured."""
    if interval is None:
        return "–"
    return f"[{_num(interval.low_per_s)}, {_num(interval.high_per_s)}]"


def _latency(lat: Percentiles | None, pct: str) -> float | None:
    return None if lat is None else getattr(lat, pct)


def _compare_rows(
    rec: ConfirmationResult | None,
    default: ConfirmationResult | None,
    gain: CapacityGain | None = None,
) -> list[CompareRow]:
    rows: list[CompareRow] = []

    def add(label: str, r: float | None, d: float | None, fmt: Any, higher: bool) -> None:
        change, better = _change(r, d, higher)
        rows.append(CompareRow(label, fmt(r), fmt(d), change, better))

    r_stated = rec.stated_goodput if rec else None
    d_stated = default.stated_goodput if default else None
    unit = (r_stated or d_stated or Goodput()).unit
    r_arrivals = r_stated.arrival_rate_per_s if r_stated else None
    d_arrivals = d_stated.arrival_rate_per_s if d_stated else None
    rows.append(
        CompareRow(f"Goodput at the SLO ({unit.label})", _at_least(rec) + _num(r_arrivals),
                   _at_least(default) + _num(d_arrivals), *_change(r_arrivals, d_arrivals, True))
    )  # fmt: skip
    r_interval = rec.capacity_interval if rec else None
    d_interval = default.capacity_interval if default else None
    if r_interval is not None or d_interval is not None:
        # where each one's capacity lies, from its levels' own statistics; within the
        # noise, the two tie (tuner.search.capacity_interval)
        change, better = "", None
        if gain is not None:
            change = f"{gain.ratio - 1:+.0%}" if gain.measurable else "tie (within noise)"
            better = (gain.ratio > 1.0) if gain.measurable else None
        shown = r_interval if r_interval is not None else d_interval
        assert shown is not None
        label = f"Capacity, {shown.confidence:.0%} interval ({unit.label})"
        rows.append(CompareRow(label, _interval(r_interval), _interval(d_interval), change, better))
    if unit is not GoodputUnit.REQUESTS_PER_S:
        r_goodput, d_goodput = (
            (rec.goodput if rec else None),
            (default.goodput if default else None),
        )
        rows.append(
            CompareRow("Goodput at the SLO (req/s)", _at_least(rec) + _num(r_goodput),
                       _at_least(default) + _num(d_goodput), *_change(r_goodput, d_goodput, True))
        )  # fmt: skip
    add("Output throughput (tokens/s)", rec.throughput if rec else None,
        default.throughput if default else None, lambda v: _num(v, 0), True)  # fmt: skip
    for name, label in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "End-to-end")):
        for pct in ("p50", "p99"):
            add(f"{label} {pct}", _latency(getattr(rec, name) if rec else None, pct),
                _latency(getattr(default, name) if default else None, pct), _ms, False)  # fmt: skip
    add("Peak GPU memory", rec.peak_used_bytes if rec else None,
        default.peak_used_bytes if default else None, _gib, False)  # fmt: skip
    add("KV-cache tokens", rec.kv_cache_tokens if rec else None,
        default.kv_cache_tokens if default else None, lambda v: _num(v, 0), True)  # fmt: skip
    return rows


@dataclass
class SettingRow:
    flag: str
    recommended: str
    default: str
    changed: bool


def _setting_rows(rec: dict[str, object], default: dict[str, object]) -> list[SettingRow]:
    keys = list(dict.fromkeys([*rec, *default]))
    return [
        SettingRow(
            f"--{k}", _value(rec.get(k, "(default)")), _value(default.get(k, "(default)")),
            rec.get(k) != default.get(k),
        )
        for k in keys
    ]  # fmt: skip


@dataclass
class VariantRow:
    name: str
    settings: list[str]
    offered: str
    goodput: str
    p99_ttft: str
    p99_e2e: str
    peak: str
    headroom: str
    verdict: str


def _variant_row(v: Variant) -> VariantRow:
    m = v.measured
    return VariantRow(
        name=v.name,
        settings=[f"--{k} {_value(val)}" for k, val in v.flags.items()],
        offered=_num(m.offered_rate_per_s) if m else "–",
        goodput=_at_least(m) + _num(m.stated_goodput.arrival_rate_per_s) if m else "not measured",
        p99_ttft=_ms(_latency(m.ttft_ms, "p99")) if m else "–",
        p99_e2e=_ms(_latency(m.e2e_ms, "p99")) if m else "–",
        peak=_gib(m.peak_used_bytes) if m else "–",
        headroom=_value(v.utilization_headroom),
        verdict=m.verdict.value if m else "–",
    )


@dataclass
class TrialView:
    number: int
    role: TrialRole
    state: str
    verdict: str
    verdict_color: str
    failure_kind: str
    failure_message: str
    log_excerpt: str
    dropped_flags: list[str]
    settings: list[tuple[str, str]]
    util: float | None
    seqs: int | None
    block: int | None
    dtype: str
    goodput: float | None  # in the workload's unit (conversations/s where it has sessions)
    goodput_at_least: bool  # no measured rate broke the SLOs: goodput is a lower bound
    goodput_requests: float | None  # the same goodput in requests/s
    throughput: float | None
    rate: float | None
    p99_ttft: float | None
    p99_itl: float | None
    p99_e2e: float | None
    peak_bytes: int | None
    kv_tokens: int | None
    startup_s: float | None
    levels: int
    violations: list[str]
    winner: bool
    dir: str
    # Where the launch's wall time went (``Evaluation.seconds_text``); None: not launched,
    # or written before it was recorded.
    seconds: str | None = None


def _trial_view(t: TrialRow, data: RunData, winner: int | None) -> TrialView:
    ev = t.evaluation
    if ev is None:
        return TrialView(
            number=t.number, role=t.role, state=t.state, verdict="no evidence",
            verdict_color="#9e9e9e", failure_kind="", failure_message="", log_excerpt="",
            dropped_flags=[], settings=[], util=None, seqs=None, block=None, dtype="", goodput=None,
            goodput_at_least=False, goodput_requests=None, throughput=None, rate=None, p99_ttft=None, p99_itl=None,
            p99_e2e=None,
            peak_bytes=None, kv_tokens=None, startup_s=None, levels=0, violations=[],
            winner=t.number == winner, dir=str(t.dir.relative_to(data.run_dir)),
        )  # fmt: skip
    pred = ev.predicted
    level = ev.best or (ev.levels[-1] if ev.levels else None)
    load = level.load if level else None
    violations = [v for lv in ev.levels for v in lv.violations] if ev.best is None else []
    return TrialView(
        number=t.number, role=t.role, state=t.state, verdict=ev.verdict.value,
        verdict_color=VERDICT_COLORS[ev.verdict],
        failure_kind=ev.failure.kind.value if ev.failure else "",
        failure_message=ev.failure.message if ev.failure else "",
        log_excerpt=ev.log_excerpt, dropped_flags=list(ev.dropped_flags),
        settings=[(k, _value(v)) for k, v in ev.flags.items()],
        util=pred.gpu_memory_utilization if pred else ev.params.gpu_memory_utilization,
        seqs=pred.max_num_seqs if pred else ev.params.max_num_seqs,
        block=pred.block_size if pred else ev.params.block_size,
        dtype=ev.params.kv_cache_dtype,
        goodput=ev.stated_goodput.arrival_rate_per_s if ev.levels else None,
        goodput_at_least=ev.goodput_bound.is_lower_bound,
        goodput_requests=ev.goodput_requests_per_s if ev.levels else None,
        throughput=ev.output_tokens_per_s if ev.levels else None, rate=ev.rate_per_s,
        p99_ttft=load.ttft_ms.p99 if load else None, p99_itl=load.itl_ms.p99 if load else None,
        p99_e2e=load.e2e_ms.p99 if load else None,
        peak_bytes=ev.gpu.peak_used_bytes if ev.gpu else None,
        kv_tokens=ev.startup.kv_cache_tokens if ev.startup else (pred.kv_cache_tokens if pred else None),
        startup_s=ev.startup_s, levels=len(ev.levels), violations=violations[:6],
        winner=t.number == winner, dir=str(t.dir.relative_to(data.run_dir)),
        seconds=ev.seconds_text(),
    )  # fmt: skip


# --- sections ---------------------------------------------------------------------------


@dataclass
class Kpi:
    label: str
    value: str
    sub: str
    tone: str = ""  # "good", "bad" or ""


@dataclass(frozen=True)
class SummaryView:
    """The summary section: KPIs, recommendation beside defaults, headroom, replicas, variants."""

    kpis: list[Kpi]
    status: str  # why there is no recommendation; "" when there is one
    recommended_label: str  # the recommended column's heading
    compare_rows: list[CompareRow]
    setting_rows: list[SettingRow]
    command: str  # the recommended `vllm serve` command; "" without a recommendation
    version_hash: str
    headroom_lines: list[str]
    capacity_text: str
    variant_rows: list[VariantRow]
    variants_one_rate: bool  # the other variants were measured at the recommendation's rate
    noise_note: str
    units_note: str  # the gain in each unit, and why they differ where they do
    default_note: str
    eviction_note: str  # what the eviction rows mean; "" where nothing was measured
    ties_note: str  # the trials within the noise of the best; "" where none
    # whether KV offloading paid (tuner.run.offloading); "" where it was not searched
    offloading_note: str
    # The quality gate in words: the recommendation's result, "quality not measured" and
    # why, or the faster setting passed over for its result (empty: no recommendation and
    # nothing gated)
    quality_lines: list[str]


@dataclass(frozen=True)
class _Side:
    """One column of the comparison: what it is called, what it measured, its flags."""

    label: str
    measured: ConfirmationResult | None
    flags: dict[str, object]


@dataclass(frozen=True)
class _CapacityPlan:
    """The replicas for the peak: the sentence, and the KPI's value and note."""

    text: str
    replicas_value: str
    replicas_note: str


_CAPACITY_UNKNOWN = _CapacityPlan(
    "Not known: no settings met the SLOs.", "–", "no settings met the SLOs"
)


def _summary(data: RunData) -> SummaryView:
    """The summary section, from the recommendation (else the best trial) and the edge."""
    rec = data.recommendation
    recommended = _recommended_side(data)
    default = _default_side(data)
    rec_measured, default_measured = recommended.measured, default.measured
    edge = data.edge
    util_edge = edge.utilization if edge is not None else None
    free_bytes = _free_bytes(rec_measured)
    capacity = _capacity_plan(data, rec_measured)
    return SummaryView(
        kpis=_kpis(data, rec_measured, default_measured, util_edge, free_bytes, rec, capacity),
        status=_status(data),
        recommended_label=recommended.label,
        compare_rows=[
            *_compare_rows(
                rec_measured, default_measured, rec.capacity_gain if rec is not None else None
            ),
            *_eviction_rows(data, rec_measured, default_measured),
        ]
        if (rec_measured or default_measured)
        else [],
        setting_rows=_setting_rows(recommended.flags, default.flags)
        if (recommended.flags or default.flags)
        else [],
        command=rec.recommended.command if rec is not None else "",
        version_hash=rec.version_hash if rec is not None else "",
        headroom_lines=_headroom_lines(data, rec_measured, free_bytes),
        capacity_text=capacity.text,
        variant_rows=[_variant_row(v) for v in rec.variants] if rec is not None else [],
        variants_one_rate=_variants_one_rate(rec),
        noise_note=_noise_note(rec_measured),
        units_note=_units_note(rec_measured, default_measured),
        default_note="" if default_measured else "vLLM's defaults were not measured in this run.",
        eviction_note=SHARE_NOTE if (rec_measured or default_measured) else "",
        ties_note=_ties_note(data),
        offloading_note=_offloading_note(data),
        quality_lines=_quality_lines(data),
    )


def _eviction_rows(
    data: RunData, rec: ConfirmationResult | None, default: ConfirmationResult | None
) -> list[CompareRow]:
    """The share of later turns' misses lost to eviction while under way (measured, and
    the twin's) and vLLM's median idle time before eviction, beside the defaults'."""
    simulated = data.tune.simulated
    return [
        CompareRow(
            SHARE_LABEL, share_cell(rec, simulated=simulated),
            share_cell(default, simulated=simulated), "", None,
        ),
        CompareRow("Idle before eviction, median (vLLM)", idle_cell(rec), idle_cell(default), "", None),
    ]  # fmt: skip


def _quality_lines(data: RunData) -> list[str]:
    """The quality gate as the recommendation says it, else (no recommendation) the result
    the gate recorded."""
    if data.recommendation is not None:
        return data.recommendation.quality_lines()
    return [data.quality.text()] if data.quality is not None else []


def _recommended_side(data: RunData) -> _Side:
    """The recommendation as measured (with --no-confirm: its trial), else the best trial."""
    rec = data.recommendation
    best_row = data.best_trial
    best_ev = best_row.evaluation if best_row is not None else None
    if rec is not None:
        measured = rec.recommended.measured
        if measured is None and best_ev is not None:
            measured = measured_of([best_ev])  # --no-confirm: the trial itself
        return _Side("Recommended", measured, dict(rec.recommended.flags))
    if best_row is not None and best_ev is not None:
        return _Side(f"Best trial ({best_row.number})", measured_of([best_ev]), dict(best_ev.flags))
    return _Side("Recommended", None, {})


def _default_side(data: RunData) -> _Side:
    """vLLM's defaults: the recommendation's measurement of them, else the default trial."""
    rec = data.recommendation
    default_row = data.default_trial
    if rec is not None and rec.default is not None:
        return _Side("vLLM defaults", rec.default.measured, dict(rec.default.flags))
    if default_row is not None and default_row.evaluation is not None:
        ev = default_row.evaluation
        return _Side("vLLM defaults", measured_of([ev]), dict(ev.flags))
    return _Side("vLLM defaults", None, {})


def _status(data: RunData) -> str:
    """Why the summary shows no recommendation; "" when it shows one."""
    if data.recommendation is not None:
        return ""
    if data.best_trial is None:
        return "No recommendation: no trial met the SLOs."
    if data.quality is not None and data.quality.trial is not None and not data.quality.passed:
        return (
            f"No recommendation: trial {data.quality.trial}'s settings were not recommended "
            "for their quality result and no setting that keeps the model's own numerics "
            "met the SLOs (see Quality)."
        )
    return "No recommendation was written (the run did not finalize); the best trial is shown."


def _free_bytes(measured: ConfirmationResult | None) -> int | None:
    """GPU memory still free at the measured peak; None when either figure is unknown."""
    if measured is not None and measured.peak_used_bytes and measured.total_bytes:
        return measured.total_bytes - measured.peak_used_bytes
    return None


def _headroom_lines(
    data: RunData, rec_measured: ConfirmationResult | None, free_bytes: int | None
) -> list[str]:
    """The headroom to the OOM edge: kept below it, where each knob's edge is, memory free."""
    lines: list[str] = []
    rec = data.recommendation
    edge = data.edge
    if rec is not None and rec.recommended.utilization_headroom is not None:
        lines.append(
            f"--gpu-memory-utilization {_value(rec.recommended.params.gpu_memory_utilization)} "
            f"keeps {rec.recommended.utilization_headroom:g} below the highest value that held "
            "the worst-case load."
        )
    if edge is not None and edge.utilization is not None:
        lines.append(_utilization_edge_line(edge.utilization))
    if edge is not None and edge.max_num_seqs is not None:
        lines.append(_seqs_edge_line(edge.max_num_seqs))
    if free_bytes is not None and rec_measured is not None and rec_measured.total_bytes:
        lines.append(
            f"At its fullest the device still had {_gib(free_bytes)} free of "
            f"{_gib(rec_measured.total_bytes)} ({free_bytes / rec_measured.total_bytes:.1%})."
        )
    if edge is None:
        lines.append("The OOM edge was not searched, so the headroom to it is unknown.")
    if rec is not None and rec.cold_boot is not None:
        # The edge's probes boot warm (the trials filled the compile cache); a new node's
        # pod boots cold, with a smaller KV cache (tuner.run.cold_boot).
        lines += [line[0].upper() + line[1:] + "." for line in rec.cold_boot.lines()]
    return lines


def _calibration_text(calibration: Calibration | None) -> str:
    """Where the memory model's calibration came from, and the boot it was converted to."""
    if calibration is None:
        return "none (uncalibrated memory model)"
    if calibration.boot_note:
        return calibration.boot_note
    return calibration.source


def _utilization_edge_line(e: KnobEdge) -> str:
    """Where the --gpu-memory-utilization edge was found, beside the memory model's guess."""
    return (
        f"--gpu-memory-utilization edge: {_value(e.highest_ok)} held, "
        f"{_value(e.lowest_failed)} ran out of memory ({e.launches} launch(es); the "
        f"memory model predicted {_value(e.predicted)}){'; ' + e.note if e.note else ''}."
    )


def _seqs_edge_line(e: KnobEdge) -> str:
    """Where the --max-num-seqs edge was found, or why it was not probed."""
    if e.launches == 0:
        return f"--max-num-seqs edge: not probed ({e.note or 'no launch budget'})."
    return (
        f"--max-num-seqs edge: {_value(e.highest_ok)} held, {_value(e.lowest_failed)} "
        f"ran out of memory ({e.launches} launch(es)){'; ' + e.note if e.note else ''}."
    )


def _capacity_plan(data: RunData, rec_measured: ConfirmationResult | None) -> _CapacityPlan:
    """The replicas for the target peak, else one replica's share of the peak, else unknown."""
    rec = data.recommendation
    if rec is not None and rec.capacity is not None:
        return _capacity_for_peak(rec.capacity)
    if rec_measured is not None and rec_measured.goodput > 0:
        return _capacity_per_replica(rec_measured, data.tune.config.capacity_headroom)
    return _CAPACITY_UNKNOWN


def _capacity_for_peak(c: Capacity) -> _CapacityPlan:
    """The recommendation's replicas for the target peak (at most, from a lower bound)."""
    u = c.unit.label
    peak = f"{c.target_peak_rate:g} {u}" + (
        f" (about {c.peak_requests_per_s:,.0f} req/s)"
        if c.unit is not GoodputUnit.REQUESTS_PER_S and c.peak_requests_per_s is not None
        else ""
    )
    each = f"{c.goodput_per_replica:.2f} {u}" + (f" ({_figures(c.goodput)})" if c.goodput else "")
    if c.replicas_is_upper_bound:
        return _CapacityPlan(
            f"At most {c.replicas} replica(s) serve the target peak of "
            f"{peak}: each holds at least "
            f"{each} at the SLO (no rate measured broke it, "
            f"so it may hold more and the peak need fewer) and is planned to "
            f"{1 - c.headroom:.0%} of that ({c.headroom:.0%} headroom kept).",
            f"at most {c.replicas}",
            f"for a peak of {c.target_peak_rate:g} {u} (goodput is a lower bound)",
        )
    return _CapacityPlan(
        f"{c.replicas} replica(s) serve the target peak of {peak}: "
        f"each holds {each} at the SLO and is planned to "
        f"{1 - c.headroom:.0%} of it ({c.headroom:.0%} headroom kept).",
        str(c.replicas),
        f"for a peak of {c.target_peak_rate:g} {u}",
    )


def _capacity_per_replica(measured: ConfirmationResult, headroom_fraction: float) -> _CapacityPlan:
    """No target peak: how much peak traffic to plan one replica for, headroom kept."""
    g = measured.stated_goodput
    u = g.unit.label
    per = g.arrival_rate_per_s * (1 - headroom_fraction)
    lower = measured.goodput_bound.is_lower_bound
    return _CapacityPlan(
        f"No target peak was given (--target-peak-rate, in {u}). One replica holds "
        f"{_at_least(measured, 'at least ')}{g.arrival_rate_per_s:.2f} {u} "
        f"({_figures(g)}) at the SLO"
        + (" (no rate measured broke it)" if lower else "")
        + f"; keeping {headroom_fraction:.0%} headroom, plan one replica per {per:.2f} {u} "
        + "of peak traffic"
        + (" (an upper bound on the replicas needed: each may hold more)." if lower else "."),
        f"1 per {per:.1f} {u}",
        f"of peak traffic ({headroom_fraction:.0%} kept"
        + ("; each may hold more)" if lower else ")"),
    )


def _variants_one_rate(rec: Recommendation | None) -> bool:
    """Whether the other variants were measured at one rate (the one the recommendation held)."""
    return rec is not None and any(
        v.measured is not None and len(v.measured.rates_per_s) == 1 for v in rec.variants[1:]
    )


def _offloading_note(data: RunData) -> str:
    """Whether KV offloading paid, as the recommendation says it; "" where not searched."""
    rec = data.recommendation
    if rec is None or rec.offloading is None:
        return ""
    text = rec.offloading.text()
    return text[0].upper() + text[1:] + "."


def _ties_note(data: RunData) -> str:
    """Which trials tie with the best within their capacity intervals; "" where none."""
    best, ties = data.best_trial, data.ties_with_best
    rec = data.recommendation
    if rec is not None and rec.tie_break is not None:
        text = rec.tie_break.text()
        return text[0].upper() + text[1:] + "."
    if best is None or not ties:
        return ""
    numbers = ", ".join(str(t.number) for t in ties)
    which = "Trial" if len(ties) == 1 else "Trials"
    return (
        f"{which} {numbers} tie with trial {best.number}: their capacity intervals overlap "
        "its own, so the measurement cannot rank them; the highest goodput is shown."
    )


def _units_note(rec: ConfirmationResult | None, default: ConfirmationResult | None) -> str:
    """The gain over vLLM's defaults in each unit, and why they differ where they do
    (``tuner.run.goodput.gains_text``); "" where either was not measured."""
    if rec is None or default is None:
        return ""
    text = gains_text(rec.stated_goodput, default.stated_goodput)
    return "" if text is None else text[0].upper() + text[1:] + "."


def _noise_note(measured: ConfirmationResult | None) -> str:
    """The run-to-run spread of goodput over the confirmation runs; "" with one run."""
    if measured is not None and len(measured.goodput_runs) > 1:
        return (
            f"{len(measured.goodput_runs)} confirmation runs, "
            f"goodput spread {measured.goodput_spread:.1%}"
        )
    return ""


def _kpis(
    data: RunData,
    rec: ConfirmationResult | None,
    default: ConfirmationResult | None,
    util_edge: KnobEdge | None,
    free_bytes: int | None,
    recommendation: Recommendation | None,
    replicas: _CapacityPlan,
) -> list[Kpi]:
    out: list[Kpi] = []
    if rec is not None:
        g = rec.stated_goodput
        d = default.stated_goodput if default is not None else None
        change, better = _change(g.arrival_rate_per_s, d.arrival_rate_per_s if d else None, True)
        sub = _figures(g) + "; defaults not measured"
        if d is not None:
            sub = f"{_figures(g)}; vLLM defaults {_at_least(default)}{d.arrival_rate_per_s:.2f}" + (
                f" ({change})" if change else ""
            )
        if rec.goodput_bound.is_lower_bound:
            sub = "no rate measured broke the SLO; " + sub
        value = f"{_at_least(rec, 'at least ')}{g.arrival_rate_per_s:.2f} {g.unit.label}"
        out.append(
            Kpi("Goodput at the SLO", value, sub,
                "good" if better else ("bad" if better is False else ""))
        )  # fmt: skip
        p99 = _latency(rec.ttft_ms, "p99")
        limit = None
        if data.workload is not None and data.workload.slo.ttft is not None:
            limit = data.workload.slo.ttft.p99_ms
        out.append(
            Kpi("p99 TTFT", _ms(p99), f"SLO ≤ {limit:g} ms" if limit else "no TTFT objective",
                "bad" if p99 is not None and limit is not None and p99 > limit else "")
        )  # fmt: skip
    else:
        out.append(Kpi("Goodput at the SLO", "none", "no trial met the SLOs", "bad"))
    if recommendation is not None and recommendation.recommended.utilization_headroom is not None:
        edge_text = f"{recommendation.recommended.utilization_headroom:g}"
        sub = "utilization below the edge"
        if free_bytes is not None:
            sub += f"; {_gib(free_bytes)} free at peak"
        out.append(Kpi("Headroom to OOM", edge_text, sub))
    elif util_edge is not None:
        out.append(Kpi("OOM edge", _value(util_edge.highest_ok), "highest utilization that held"))
    else:
        out.append(Kpi("Headroom to OOM", "unknown", "the OOM edge was not searched"))
    out.append(Kpi("Replicas", replicas.replicas_value, replicas.replicas_note))
    return out


def _edge(data: RunData) -> dict[str, Any]:
    chart, points = edge_map(data)
    edge = data.edge
    knobs = []
    if edge is not None:
        for e in (edge.utilization, edge.max_num_seqs):
            if e is not None:
                knobs.append(
                    {
                        "knob": f"--{e.knob.value}", "start": _value(e.start),
                        "predicted": _value(e.predicted), "ok": _value(e.highest_ok),
                        "failed": _value(e.lowest_failed), "launches": e.launches,
                        "bracketed": e.bracketed, "note": e.note,
                    }
                )  # fmt: skip
    probes = []
    if edge is not None:
        for i, p in enumerate(edge.probes, start=1):
            probes.append(
                {
                    "n": i, "knob": p.knob.value, "value": _value(p.value),
                    "flags": [f"--{k} {_value(v)}" for k, v in p.flags.items()],
                    "predicted": "starts" if p.predicted_fits else ("fails" if p.predicted_fits is False else "–"),
                    "outcome": p.outcome.value, "survived": p.survived,
                    "verdict": p.verdict.value, "said": p.said(),
                    "failure": f"{p.failure_kind}: {p.failure_message}" if p.failure_kind else "",
                    "peak": _gib(p.peak_used_bytes), "total": _gib(p.total_bytes),
                    "headroom": _gib(p.headroom_bytes), "kv_tokens": _num(p.kv_cache_tokens, 0),
                    "preemptions": _value(p.num_preemptions), "wall_s": f"{p.wall_s:.0f} s",
                }
            )  # fmt: skip
    if edge is None:
        absent = (
            "The OOM-edge search did not run (--no-edge): the map shows the trials only."
            if not data.tune.config.edge
            else "No OOM-edge result (edge/edge.json) in this run: the map shows the trials only."
        )
    else:
        absent = edge.skipped or ""
    worst = edge.worst_case if edge is not None else None
    return {
        "map": _figure(chart),
        "probe_memory": _figure(probe_memory(data, points)),
        "knobs": knobs,
        "probes": probes,
        "absent": absent,
        "worst_case": (
            f"{worst.concurrency} requests at once, each a {worst.prompt_tokens}-token prompt and "
            f"{worst.output_tokens} output tokens (the workload's longest), held until the KV "
            f"cache peaked or every output finished, at most {worst.load_s:g} s"
            if worst is not None
            else ""
        ),
    }


def _level_dirs(ev: Evaluation, base: Path) -> list[tuple[str, Path]]:
    u = ev.stated_goodput.unit.label  # a level's rate is the workload's arrival rate
    return [
        (
            f"level {i}: {lv.rate_per_s:.2f} {u}{_draw_note(lv)}{' (met)' if lv.met else ''}",
            rebase(lv.dir, base),
        )
        for i, lv in enumerate(ev.levels)
    ]


def _draw_note(lv: LevelRecord) -> str:
    """Where a level measured another draw of the workload (the rate search's edge draws,
    pooled with the search's own at that rate), which one: " (draw 1, seed 1000004)"."""
    if not lv.draw:
        return ""
    seed = f", seed {lv.seed}" if lv.seed is not None else ""
    return f" (draw {lv.draw}{seed})"


def _memory(data: RunData) -> list[ChartView]:
    best = data.best_trial
    default = data.default_trial
    first = [t for t in (best, default) if t is not None]
    order = first + [t for t in data.trials if all(t is not f for f in first)]
    if best is not None and best is default:
        order = order[1:]
    out: list[ChartView] = []
    for t in order:
        ev = t.evaluation
        if ev is None or ev.outcome is None:
            continue  # screened or no evidence: nothing was launched
        tags = [s for s, on in (("winner", t is best), ("vLLM defaults", t.is_default)) if on]
        label = f"Trial {t.number}{' (' + ', '.join(tags) + ')' if tags else ''}: " + (
            ev.params.short() or "vLLM defaults"
        )
        label += f" — {ev.verdict.value}"
        tl = timeline(label, t.dir, _level_dirs(ev, t.dir))
        # the trial's own clock (a simulated clock may run faster after the first trial,
        # tuner.search.clock); the run's where the evaluation did not record one
        scale = ev.time_scale if "time_scale" in ev.model_fields_set else data.time_scale
        out.append(_figure(memory_timeline(f"memory-trial-{t.number}", tl, scale)))
    if data.edge is not None:
        for i, p in enumerate(data.edge.probes, start=1):
            pdir = rebase(p.dir, RunLayout(data.run_dir).edge_dir)
            if p.outcome is not TrialOutcome.READY and not (pdir / "gpu.csv").is_file():
                continue
            flags = " ".join(f"{k} {_value(v)}" for k, v in p.flags.items())
            label = f"Edge probe {i}: {flags} — {p.said()}"
            tl = timeline(label, pdir, [("worst-case load", pdir / "load")])
            scale = p.time_scale or data.time_scale
            out.append(_figure(memory_timeline(f"memory-probe-{i}", tl, scale)))
    return out


def _latency_section(data: RunData) -> dict[str, Any]:
    runs: list[tuple[str, str, LatencySamples]] = []
    buckets: list[tuple[str, str, tuple[BucketLatency, ...]]] = []
    notes: list[str] = []

    def add(label: str, color: str, ev: Evaluation | None, base: Path) -> None:
        if ev is None:
            return
        level: LevelRecord | None = ev.best or (ev.levels[-1] if ev.levels else None)
        if level is None:
            notes.append(f"{label}: no measured level")
            return
        lat = level_latencies(rebase(level.dir, base), level.time_scale or data.time_scale)
        if lat is None:
            notes.append(f"{label}: no request records in {rebase(level.dir, base).name}")
        else:
            u = ev.stated_goodput.unit.label
            runs.append((f"{label} at {level.rate_per_s:.2f} {u}", color, lat))
        buckets.append((label, color, level.load.prompt_buckets))

    confirmed = data.confirm.get("recommended")
    best = data.best_trial
    if confirmed is not None and data.recommendation is not None:
        add(
            "recommended (confirmation)",
            RECOMMENDED_COLOR,
            confirmed,
            RunLayout(data.run_dir).confirm_run_dir("recommended"),
        )
    elif best is not None:
        add(f"winner (trial {best.number})", RECOMMENDED_COLOR, best.evaluation, best.dir)
    default = data.default_trial
    if default is not None:
        add(
            f"vLLM defaults (trial {default.number})",
            DEFAULT_COLOR,
            default.evaluation,
            default.dir,
        )
    return {
        "cdf": _figure(latency_cdfs(data, runs)),
        "buckets": _figure(bucket_latency(buckets)),
        "notes": notes,
    }


# --- steady state -------------------------------------------------------------------------

STEADY_P = 0.01  # a measured mix this unlikely under the stationary one differs from it
_WINDOW_SIGNAL_NAMES = {  # window.json names its signals as plain strings
    "waiting": "waiting requests",
    "running": "running requests",
    "kv_usage": "KV-cache usage",
    "ttft": "TTFT",
}
_SIGNAL_NAMES = {
    Signal.WAITING: "waiting requests",
    Signal.KV_USAGE: "KV-cache usage",
    Signal.TTFT: "TTFT",
}


def _p(value: float | None) -> str:
    if value is None:
        return "–"
    return "< 0.001" if value < 0.001 else f"{value:.2g}"


@dataclass
class EvidencePart:
    """One part of a level's evidence: a line, its tone and the numbers behind it."""

    label: str
    text: str
    tone: str  # "good", "bad", "missing" or ""
    details: list[str]


@dataclass
class LevelEvidenceView:
    title: str
    verdict: str
    verdict_color: str
    parts: list[EvidencePart]
    chart: ChartView
    dir: str


@dataclass
class TrialEvidenceView:
    number: int
    label: str
    levels: list[LevelEvidenceView]


def _missing(label: str, note: str | None) -> EvidencePart:
    return EvidencePart(label, note or NOT_RECORDED, "missing", [])


_WINDOW_CLOSES = {
    "shortest": "closed at its shortest",
    "held": "held on past its shortest",
    "longest": "closed at its longest, holding fewer correlation times than wanted",
    "fixed": "fixed by --level-duration",
    "trace": "the replayed trace's pass, or its busiest stretch",
    "stopped": "cut when the level stopped early",
}


def _window_length(w: WindowRecord) -> str:
    """Why the window lasted as long as it did: the server state's correlation time."""
    if w.closed is None:
        return ""
    text = f"length: {_WINDOW_CLOSES.get(w.closed, w.closed)}"
    if w.window_min_s is not None and w.window_max_s is not None:
        text += f" (between {w.window_min_s:g} s and {w.window_max_s:g} s)"
    if w.correlation_s is not None:
        held = w.window_s / w.correlation_s if w.correlation_s > 0 else math.inf
        wanted = f" of {w.correlations_wanted:g} wanted" if w.correlations_wanted else ""
        floor = ""
        if w.correlation_floor_s is not None and w.correlation_floor_s >= w.correlation_s:
            floor = " (the one a lower rate that held measured: at least that)"
        text += (
            f"; the running batch and KV usage have a correlation time of "
            f"{w.correlation_s:.1f} s{floor}: the window holds {held:.0f}{wanted}"
        )
    if w.slo_share is not None and w.band is not None:
        text += (
            f"; the worst SLO percentile was {100 * w.slo_share:.0f} % of its limit at the "
            f"close (clear of it by {100 * w.band:.0f} % needed)"
        )
    return text


def _window_part(level: LevelEvidence) -> EvidencePart:
    w = level.window.value
    if w is None:
        return _missing("Window opening", level.window.note)
    if w.steady_at_open:
        state = "steady at open"
    elif w.warmup_max_s is not None:
        state = f"not steady at open: the longest warm-up ({w.warmup_max_s:g} s) was spent"
    else:
        state = "not steady at open: the longest warm-up was spent"
    text = f"opened {w.opened_at_s:.1f} s into the level, {state}; measured {w.window_s:g} s"
    if w.carried_on is not None:
        text = (
            "carried on from the rate before without draining the server (its conversations "
            f"under way went on; {100 * w.carried_on:.0f} % of this rate's were added); " + text
        )
    if w.trace_pass_s is not None:
        text += f" ({trace_part(w.window_s, w.trace_pass_s)})"
    if w.requests is not None:
        text += f", {w.requests:,} requests"
        if w.needed_requests is not None:
            text += f" (the SLO's percentiles need {w.needed_requests:,})"
    details = []
    if w.warmup_min_s is not None and w.warmup_max_s is not None:
        details.append(f"warm-up between {w.warmup_min_s:g} s and {w.warmup_max_s:g} s")
    if w.test:
        details.append(f"test: {w.test}")
    closed = _window_length(w)
    if closed:
        details.append(closed)
    for sig in w.signals:
        name = _WINDOW_SIGNAL_NAMES.get(sig.signal, sig.signal.replace("_", " "))
        growth, span = sig.number("growth"), sig.number("span_s")
        trend = ""
        if growth is not None and span:
            shown = f"{100 * growth:+.0f} points" if sig.signal == "kv_usage" else f"{growth:+.3g}"
            trend = f" ({shown} over {span:.0f} s)"
        details.append(f"{name} at open: {sig.verdict.replace('_', ' ')}{trend}")
    return EvidencePart("Window opening", text, "good" if w.steady_at_open else "bad", details)


def _signal_line(t: SignalTrend) -> str:
    name = _SIGNAL_NAMES.get(t.signal, t.signal.value.replace("_", " "))
    if t.verdict is BacklogVerdict.TOO_SHORT:
        return f"{name}: too few points to judge ({t.points})"
    return f"{t.describe()}: {t.verdict.value.replace('_', ' ')} (material growth: {_margin(t)})"


def _margin(t: SignalTrend) -> str:
    if t.signal is Signal.KV_USAGE:
        return f"{100 * t.margin:.0f} points"
    if t.signal is Signal.TTFT:
        return f"{t.margin:,.0f} ms"
    return f"{t.margin:.3g} requests"


def _backlog_part(level: LevelEvidence) -> EvidencePart:
    check: BacklogCheck | None = level.backlog.value
    if check is None:
        return _missing("Backlog guard", level.backlog.note)
    if check.verdict is BacklogVerdict.GROWING:
        grown = [s.describe() for s in check.signals if s.verdict is BacklogVerdict.GROWING]
        text, tone = "growing: a backlog builds (" + "; ".join(grown) + ")", "bad"
    elif check.verdict is BacklogVerdict.STEADY:
        text, tone = "steady: nothing grows through the window", "good"
    else:
        text, tone = "too short to judge", ""
    text += f" over {check.window_s:.0f} s"
    return EvidencePart("Backlog guard", text, tone, [_signal_line(t) for t in check.signals])


def _turn_mix_part(level: LevelEvidence, sessions: bool) -> EvidencePart:
    mix = level.turn_mix.value
    if mix is None:
        if not sessions and level.turn_mix.note == NOT_RECORDED:
            return EvidencePart(
                "Turn mix", "single-turn workload: every request is a first turn", "", []
            )
        return _missing("Turn mix", level.turn_mix.note)
    text = (
        f"later turns {mix.later_turn_share:.0%} of {mix.requests:,} requests "
        f"(stationary {mix.stationary_later_turn_share:.0%}); chi-square p = {_p(mix.p_value)}"
    )
    tone = ""
    if mix.p_value is None:
        text += ", too few requests to test"
    elif mix.p_value >= STEADY_P:
        text, tone = text + ": matches the stationary mix", "good"
    else:
        text, tone = text + ": differs from the stationary mix", "bad"
    shares = " · ".join(
        f"{k + 1}: {m:.0%} / {st:.0%}"
        for k, (m, st) in enumerate(zip(mix.shares, mix.stationary_shares, strict=False))
    )
    details = [
        f"share by turn, measured / stationary: {shares}",
        f"{mix.test}, {mix.dof} degree(s) of freedom, chi-square {mix.chi_square:.2f}",
    ]
    if mix.planned_ttft_s is not None and mix.planned_tpot_s is not None:
        details.append(
            "conversations under way at the start planned with answers of "
            f"TTFT {mix.planned_ttft_s * 1000:.0f} ms + {mix.planned_tpot_s * 1000:.1f} ms "
            "a token"
        )
    return EvidencePart("Turn mix", text, tone, details)


def _prompt_part(level: LevelEvidence) -> EvidencePart:
    mix = level.prompt_lengths.value
    if mix is None:
        return _missing("Prompt lengths", level.prompt_lengths.note)
    st = mix.stationary
    m = mix.measured
    if m is None:
        return EvidencePart(
            "Prompt lengths",
            f"no measured request (stationary p50 {st.p50:,.0f} tokens)",
            "bad",
            [],
        )
    text = (
        f"p50 {m.p50:,.0f} tokens (stationary {st.p50:,.0f}), p90 {m.p90:,.0f} ({st.p90:,.0f}); "
        f"Kolmogorov-Smirnov p = {_p(mix.p_value)}"
    )
    tone = ""
    if mix.p_value is not None:
        ok = mix.p_value >= STEADY_P
        text += (
            ": matches the stationary lengths" if ok else ": differs from the stationary lengths"
        )
        tone = "good" if ok else "bad"
    details = [
        f"p10 / p50 / p90 / p99: {m.p10:,.0f} / {m.p50:,.0f} / {m.p90:,.0f} / {m.p99:,.0f} measured, "
        f"{st.p10:,.0f} / {st.p50:,.0f} / {st.p90:,.0f} / {st.p99:,.0f} stationary",
        f"largest gap between the two distributions D = {mix.ks_statistic or 0.0:.3f}; "
        f"{mix.requests:,} measured requests ({mix.effective_requests:,} independent) against "
        f"{mix.reference_requests:,} of a {mix.reference_duration_s:,.0f}-s stationary schedule",
    ]
    return EvidencePart("Prompt lengths", text, tone, details)


def _level_verdict(lv: LevelRecord) -> tuple[str, str]:
    if lv.unmeasurable and lv.client is not None:  # neither a hold nor a break
        return f"unmeasurable: {lv.client.summary()}", DEFAULT_COLOR
    if lv.met:
        return "met the SLOs", VERDICT_COLORS[Verdict.MET]
    if lv.failed_by_backlog:
        return "missed: backlog", VERDICT_COLORS[Verdict.SLO_MISSED]
    if lv.stopped_early:
        return "missed (stopped early)", VERDICT_COLORS[Verdict.SLO_MISSED]
    return "missed the SLOs", VERDICT_COLORS[Verdict.SLO_MISSED]


def _steady_state(data: RunData) -> list[TrialEvidenceView]:
    sessions = data.workload is not None and data.workload.sessions is not None
    out: list[TrialEvidenceView] = []
    for t in data.trials:
        ev = t.evaluation
        if ev is None or not ev.levels:
            continue
        unit = ev.stated_goodput.unit.label
        levels = []
        for lv, level in zip(ev.levels, level_evidence(t.dir, ev), strict=True):
            verdict, color = _level_verdict(lv)
            evictions = level_lines(lv, simulated=data.tune.simulated)
            scale = lv.time_scale or data.time_scale  # a level measured again: its own clock
            chart = level_timeline(f"level-{t.number}-{level.index}", level, scale)
            levels.append(
                LevelEvidenceView(
                    title=f"Rate {level.index + 1}: {lv.rate_per_s:.2f} {unit}{_draw_note(lv)}",
                    verdict=verdict, verdict_color=color,
                    parts=[_window_part(level), _backlog_part(level),
                           _turn_mix_part(level, sessions), _prompt_part(level),
                           *([EvidencePart("Evictions", evictions.text, evictions.tone,
                                           evictions.details)] if evictions else [])],
                    chart=_figure(chart), dir=str(level.dir.relative_to(data.run_dir)),
                )
            )  # fmt: skip
        tags = [s for s, on in (("vLLM defaults", t.is_default),) if on]
        label = f"Trial {t.number}{' (' + ', '.join(tags) + ')' if tags else ''}: " + (
            ev.params.short() or "vLLM defaults"
        )
        out.append(TrialEvidenceView(t.number, label, levels))
    return out


def _how(data: RunData) -> dict[str, Any]:
    tune = data.tune
    c = tune.config
    w = data.workload
    rows: list[tuple[str, str]] = [
        ("Backend", "simulated vLLM engine (sim)" if tune.simulated else f"real vLLM ({tune.backend})"),
        ("Model", tune.model),
        ("GPU", tune.gpu or "none (CPU)"),
        ("vLLM version", tune.vllm_version + (" (emulated)" if tune.simulated else "")),
        ("vLLM command", " ".join(tune.vllm_cmd)),
        ("Objective", c.objective.value),
        ("Trials asked / budget", f"{c.trials} trials within {c.budget_min:g} min"),
        ("Seed", str(c.seed)),
        ("ConfirmationResult rates per trial", f"up to {c.max_levels}, {_level_text(c)}"),
        ("Screening by the memory model", "on" if c.screen else "off"),
        ("OOM-edge search", f"up to {c.max_edge_launches} + {c.seqs_edge_launches} launches, "
         f"the worst case held at most {c.edge_load_s:g} s each, resolution {c.edge_resolution:g}"
         if c.edge else "off (--no-edge)"),
        ("Confirmation", f"{c.repeats} run(s) of the recommendation" if c.confirm else "off (--no-confirm)"),
        ("Safety margin", f"{c.safety_margin:g} of utilization below the edge"),
        ("Load generator", f"Locust, {c.processes} local process(es)" + (
            f" and {c.load_workers} worker(s) on load hosts (master {c.load_master_bind})"
            if c.load_workers else "") + ", open loop"),
        ("GPU memory source", c.gpu_source + (" (sim: the simulator's /sim/gpu)" if tune.simulated and c.gpu_source == AUTO_SOURCE else "")),
        ("Time scale", f"{data.time_scale:g}" + (
            " (the simulator ran its clock this many times slower; every time and rate here is in "
            "the emulated GPU's time)" if tune.simulated else "")),
        ("Harness version", data.recommendation.harness_version if data.recommendation else HARNESS_VERSION),
        ("Study", f"{data.study_name} ({tune.storage})"),
        ("Calibration", _calibration_text(data.calibration)),
    ]  # fmt: skip
    if data.summary is not None:
        rows.append(("Wall time", f"{data.summary.wall_s / 60:.1f} min"))
    workload: list[tuple[str, str]] = []
    if w is not None:
        workload = [
            ("Workload", w.name + (f" — {w.description}" if w.description else "")),
            ("API", f"{w.api.value}, {'streaming' if w.stream else 'not streaming'}"
             f"{', ignore_eos' if w.ignore_eos else ''}"),
            ("Arrivals", _describe(w.arrival.model_dump(mode="json"))),
            ("Prompt lengths (tokens)", _describe(w.prompt_tokens.model_dump(mode="json"))),
            ("Output lengths (tokens)", _describe(w.output_tokens.model_dump(mode="json"))),
            ("Shared prefix", _describe(w.shared_prefix.model_dump(mode="json")) if w.shared_prefix else "none"),
            ("Sessions", _describe(w.sessions.model_dump(mode="json")) if w.sessions else "none"),
            ("Warm-up", _warmup(w)),
            ("Duration of the workload", f"{w.duration_s:g} s (each measured rate: {_level_text(c)})"),
            ("SLO", w.slo.text()),
        ]  # fmt: skip
    return {
        "rows": rows,
        "workload": workload,
        "workload_error": data.workload_error or "",
        "workload_raw": json.dumps(tune.workload, indent=2, default=str) if w is None else "",
        "space": [(f"--{r.knob.value}", r.describe()) for r in tune.space],
        "left_out": [(f"--{o.knob.value}", o.reason) for o in tune.left_out],
        "notes": tune.notes,
    }


def _level_text(c: TuneConfig) -> str:
    """How each measured rate spends its time, as configured (emulated seconds)."""
    window = (
        f"a {c.level_duration_s:g}-s window"
        if c.level_duration_s is not None
        else "a window sized for the SLO's percentiles (8-120 s)"
    )
    warmup = (
        f"after a {c.level_warmup_s:g}-s warm-up"
        if c.level_warmup_s is not None
        else "opening once the server is steady at that rate"
    )
    return f"{window} {warmup} (emulated seconds)"


def _warmup(w: WorkloadSpec) -> str:
    parts = []
    if w.warmup.duration_s:
        parts.append(f"{w.warmup.duration_s:g} s")
    if w.warmup.requests:
        parts.append(f"{w.warmup.requests} requests")
    if w.warmup.kv_cache_fill:
        parts.append(f"until the KV cache is {w.warmup.kv_cache_fill:.0%} full")
    if not parts:
        return "none"
    return (
        " and ".join(parts)
        + f" before each measurement (at most {w.warmup.max_s:g} s), left out of the results"
    )


def _describe(values: dict[str, Any]) -> str:
    """A spec's fields as a line: ``poisson: rate 4/s``, ``uniform: low 32, high 96``."""
    parts = []
    for key, value in values.items():
        if value is None or key == "kind":
            continue
        if isinstance(value, list | dict):
            text = json.dumps(value, default=str)
        elif isinstance(value, float):
            text = f"{value:g}"
        else:
            text = str(value)
        if key.endswith("_per_s"):
            parts.append(f"{key.removesuffix('_per_s').replace('_', ' ')} {text}/s")
        elif key.endswith("_s"):
            parts.append(f"{key.removesuffix('_s').replace('_', ' ')} {text} s")
        else:
            parts.append(f"{key.replace('_', ' ')} {text}")
    kind = values.get("kind")
    return (f"{kind}: " if kind else "") + (", ".join(parts) or "none")


def _twin(data: RunData) -> dict[str, Any]:
    section = twin_section(data)
    return {
        "absent": section.absent,
        "chart": _figure(section.chart) if section.chart is not None else None,
        "screened": section.screened,
        "points": section.points,
        "fits": section.fits,
    }


def _parallelism(data: RunData) -> dict[str, Any] | None:
    """Where the tune searched the tensor-parallel size: each size's best server."""
    comparison = read_parallelism(data.run_dir)  # written before the report, the summary after
    if comparison is None and data.summary is not None:
        comparison = data.summary.parallelism
    if comparison is None:
        return None
    best = comparison.best
    rows = []
    for s in comparison.sizes:
        known = s.source is not Source.NONE
        at_least = "≥" if s.goodput_is_lower_bound else ""
        rows.append(
            {
                "size": s.tensor_parallel_size,
                "server": at_least + _num(s.goodput_per_server) if known else "–",
                "gpu": at_least + _num(s.goodput_per_gpu) if known else "–",
                "servers": s.servers_on(comparison.gpu_count),
                "host": at_least + _num(s.host_goodput(comparison.gpu_count)) if known else "–",
                "source": (
                    f"measured (trial {s.trial})"
                    if s.source is Source.MEASURED
                    else "predicted by the twin"
                    if s.source is Source.PREDICTED
                    else f"no goodput at the SLO ({s.trials_launched} trial(s))"
                ),
                "best": best is not None and s.tensor_parallel_size == best.tensor_parallel_size,
            }
        )
    return {"gpu_count": comparison.gpu_count, "rows": rows}


def _context(data: RunData) -> dict[str, Any]:
    tune = data.tune
    winner = data.best_trial
    trials = [_trial_view(t, data, winner.number if winner else None) for t in data.trials]
    tr = tradeoffs(data)
    imp = importances(data)
    slo: list[str] = []
    if data.recommendation is not None:
        slo = data.recommendation.slo.texts()
    elif data.workload is not None:
        slo = data.workload.slo.texts()
    plotly_js = get_plotlyjs().replace("</script", "<\\/script")
    return {
        "title": f"Capacity review: {tune.model} on {tune.gpu or 'CPU'}",
        "generated": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "simulated": tune.simulated,
        "run": {
            "study": data.study_name,
            "dir": str(data.run_dir),
            "model": tune.model,
            "gpu": tune.gpu or "none (CPU)",
            "vllm": tune.vllm_version,
            "backend": tune.backend,
            "workload": data.workload.name
            if data.workload
            else str(tune.workload.get("name", "?")),
            "slo": slo,
            "objective": tune.config.objective.value,
            "trials": len(data.trials),
            "feasible": sum(
                1 for t in data.trials if t.evaluation and t.evaluation.verdict.feasible
            ),
            "time_scale": data.time_scale,
        },
        "missing": data.missing + ([f"study: {data.study_note}"] if data.study_note else []),
        "summary": _summary(data),
        "unit": _unit(data).label,
        "edge": _edge(data),
        "tradeoffs": _figure(tr),
        "importances": _figure(imp),
        "importance_note": data.importances.note,
        "memory": _memory(data),
        "latency": _latency_section(data),
        "trials": trials,
        "steady": _steady_state(data),
        "twin": _twin(data),
        "parallelism": _parallelism(data),
        "steady_p": f"{STEADY_P:g}",
        "other_settings": any(
            k not in ("gpu-memory-utilization", "max-num-seqs", "block-size", "kv-cache-dtype")
            for t in trials
            for k, _ in t.settings
        ),
        "verdict_colors": {v.value: c for v, c in VERDICT_COLORS.items()},
        "how": _how(data),
        "plotly_js": plotly_js,
        "harness_version": HARNESS_VERSION,
    }

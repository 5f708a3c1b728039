"""The report's charts: plotly figures built from a run read back by ``reports.run_data``.

Each function returns a ``Chart`` (the figure, or None with the reason it could not
be drawn). Text that came from outside the harness (model names, failure messages,
settings) is HTML-escaped before it goes into a label, because plotly renders a
subset of HTML in its text. Times are in the emulated GPU's time on the simulator
(wall time divided by the run's time scale). Only SVG traces are used (no WebGL), so
the charts render and print anywhere.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from reports.run_data import RunData, TrialRow
from tuner.errors import TunerError
from tuner.run.edge import EdgeProbe, ProbeVerdict
from tuner.run.evaluation import Evaluation, Verdict
from tuner.run.levels import NOT_RECORDED, LatencySamples, LevelEvidence, Timeline
from tuner.serving.server import TrialOutcome
from tuner.vllm.gpus import GpuSpec
from tuner.vllm.memory import default_limits
from tuner.vllm.space import Knob
from tuner.vllm.versions import VllmVersion
from workloads.load_result import BucketLatency

GIB = 1024**3
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
MAX_POINTS = 1500  # per timeline trace
CDF_POINTS = 400

VERDICT_COLORS = {
    Verdict.MET: "#2e7d32",
    Verdict.SLO_MISSED: "#ef6c00",
    Verdict.SCREENED: "#9e9e9e",
    Verdict.STARTUP_FAILED: "#c62828",
    Verdict.DIED: "#6a1b9a",
}
RECOMMENDED_COLOR = "#1565c0"
DEFAULT_COLOR = "#757575"


@dataclass
class Chart:
    key: str
    figure: go.Figure | None
    note: str | None = None  # why there is no figure, or a caveat about it
    title: str | None = None  # shown above the chart (plain text: the template escapes it)


def esc(value: object, limit: int = 240) -> str:
    text = str(value)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return html.escape(text)


def _figure() -> go.Figure:
    """An empty figure without plotly's default template (a plain one is styled in ``_layout``:
    the templates weigh 7 KB of JSON and a tenth of a second per chart)."""
    return go.Figure(layout={"template": "none"})


def _subplots(**kwargs: Any) -> go.Figure:
    return make_subplots(figure=_figure(), **kwargs)


def _layout(fig: go.Figure, *, height: int, **extra: Any) -> go.Figure:
    fig.update_layout(
        font={"family": FONT, "size": 12, "color": "#1f2933"},
        paper_bgcolor="#ffffff",
        plot_bgcolor="#ffffff",
        height=height,
        margin={"l": 64, "r": 24, "t": 36, "b": 52},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0, "font": {"size": 11}},
        hoverlabel={"font": {"family": FONT, "size": 11}},
        hovermode="closest",
        **extra,
    )
    axis = {
        "showgrid": True, "gridcolor": "#e9edf2", "zeroline": False, "showline": True,
        "linecolor": "#b8c2cc", "ticks": "outside", "tickcolor": "#b8c2cc", "ticklen": 4,
        "title": {"font": {"size": 12, "color": "#3c4858"}}, "automargin": True,
    }  # fmt: skip
    fig.update_xaxes(**axis)
    fig.update_yaxes(**axis)
    return fig


# --- the memory model, as the run recorded it --------------------------------------------


def boundary_note(data: RunData) -> str | None:
    """Why the map has no predicted boundary (None: it has one)."""
    if data.tune.gpu is None:
        return "no GPU profile (vLLM's CPU build): there is no device-memory boundary"
    if data.memory_boundary is None:
        return "this run did not record one (a run from before the tuner recorded it)"
    return None


def _resolved(
    version: VllmVersion | None,
    gpu: GpuSpec | None,
    flags: dict[str, object],
) -> tuple[float | None, int | None]:
    """(utilization, max-num-seqs) that vLLM ran with: the flag, else its default."""
    util = _num(flags.get(Knob.GPU_MEMORY_UTILIZATION.value))
    seqs = _num(flags.get(Knob.MAX_NUM_SEQS.value))
    if util is None and version is not None:
        util = version.default_gpu_memory_utilization
    if seqs is None and gpu is not None and version is not None:
        seqs = float(default_limits(gpu, version)[0])
    return util, (int(seqs) if seqs is not None else None)


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


# --- 2. the OOM edge ------------------------------------------------------------------------


class EdgeCategory(StrEnum):
    """Where a launched or screened setting falls on the OOM-edge map."""

    HELD = "held"
    OVER = "over"
    OOM = "oom"
    INVALID = "invalid"
    OTHER = "other"
    SCREENED = "screened"


EDGE_CATEGORIES = {
    EdgeCategory.HELD: ("started, held the load", "#2e7d32", "circle"),
    EdgeCategory.OVER: ("started, ran out of memory or died under load", "#6a1b9a", "circle"),
    EdgeCategory.OOM: ("failed to start: out of memory", "#c62828", "x"),
    EdgeCategory.INVALID: ("failed to start: rejected settings", "#455a64", "x"),
    EdgeCategory.OTHER: ("inconclusive: timeout, crash or failed requests", "#8d6e63", "x"),
    EdgeCategory.SCREENED: (
        "not launched: the memory model says it cannot start", "#9e9e9e", "circle-open",
    ),
}  # fmt: skip


class PointSource(StrEnum):
    """What put a point on the map: a trial of the study or a probe of the OOM edge."""

    TRIAL = "trial"
    PROBE = "probe"


def _category_of_outcome(outcome: TrialOutcome | None) -> EdgeCategory:
    if outcome is TrialOutcome.STARTUP_OOM:
        return EdgeCategory.OOM
    if outcome is TrialOutcome.INVALID_CONFIG:
        return EdgeCategory.INVALID
    if outcome is TrialOutcome.ENGINE_DIED:
        return EdgeCategory.OVER
    return EdgeCategory.OTHER


def _trial_category(ev: Evaluation) -> EdgeCategory:
    if ev.verdict in (Verdict.MET, Verdict.SLO_MISSED):
        return EdgeCategory.HELD
    if ev.verdict is Verdict.SCREENED:
        return EdgeCategory.SCREENED
    if ev.verdict is Verdict.DIED:
        return EdgeCategory.OVER
    return _category_of_outcome(ev.outcome)


def _probe_category(p: EdgeProbe) -> EdgeCategory:
    if p.survived:
        return EdgeCategory.HELD
    if p.verdict is ProbeVerdict.INCONCLUSIVE:  # failed not by memory: says nothing of it
        return EdgeCategory.OTHER
    if p.outcome is TrialOutcome.READY:
        return EdgeCategory.OVER
    return _category_of_outcome(p.outcome)


@dataclass
class MapPoint:
    source: PointSource
    label: str
    util: float
    seqs: int
    dtype: str
    category: EdgeCategory
    peak_used_bytes: int | None
    total_bytes: int | None
    failure: str | None


def map_points(data: RunData) -> list[MapPoint]:
    version = _version(data)
    gpu = _gpu(data)
    points: list[MapPoint] = []
    for row in data.trials:
        ev = row.evaluation
        if ev is None:
            continue
        if ev.predicted is not None:
            util: float | None = ev.predicted.gpu_memory_utilization
            seqs: int | None = ev.predicted.max_num_seqs
        else:
            util, seqs = _resolved(version, gpu, dict(ev.flags))
        if util is None or seqs is None:
            continue
        failure = f"{ev.failure.kind.value}: {ev.failure.message}" if ev.failure else None
        points.append(
            MapPoint(
                source=PointSource.TRIAL, label=f"trial {row.number}", util=util, seqs=seqs,
                dtype=ev.params.kv_cache_dtype, category=_trial_category(ev),
                peak_used_bytes=ev.gpu.peak_used_bytes if ev.gpu else None,
                total_bytes=ev.gpu.total_bytes if ev.gpu else None, failure=failure,
            )
        )  # fmt: skip
    if data.edge is not None:
        for i, p in enumerate(data.edge.probes, start=1):
            util, seqs = _resolved(version, gpu, dict(p.flags))
            if util is None or seqs is None:
                continue
            dtype = str(p.flags.get(Knob.KV_CACHE_DTYPE.value, "auto"))
            failure = f"{p.failure_kind}: {p.failure_message}" if p.failure_kind else None
            points.append(
                MapPoint(
                    source=PointSource.PROBE, label=f"edge probe {i} ({p.knob.value} {p.value:g})",
                    util=util, seqs=seqs, dtype=dtype, category=_probe_category(p),
                    peak_used_bytes=p.peak_used_bytes, total_bytes=p.total_bytes, failure=failure,
                )
            )  # fmt: skip
    return points


def _version(data: RunData) -> VllmVersion | None:
    try:
        return VllmVersion.parse(data.tune.vllm_version)
    except TunerError:
        return None


def _gpu(data: RunData) -> GpuSpec | None:
    try:
        return data.tune.gpu_spec()
    except TunerError:
        return None


def edge_map(data: RunData) -> tuple[Chart, list[MapPoint]]:
    ctx_note = boundary_note(data)
    boundary = data.memory_boundary
    points = map_points(data)
    if not points:
        return Chart("edge-map", None, "no launched or screened settings to place on the map"), []
    dtypes = sorted({p.dtype for p in points})
    for r in data.tune.space:
        if r.knob is Knob.KV_CACHE_DTYPE and r.choices:
            dtypes = sorted(set(dtypes) | {str(c) for c in r.choices})
    fig = _subplots(
        rows=1, cols=len(dtypes), shared_yaxes=True, horizontal_spacing=0.04,
        subplot_titles=[f"KV-cache dtype: {esc(d)}" for d in dtypes],
    )  # fmt: skip
    seqs_all = [p.seqs for p in points]
    low_seqs, high_seqs = max(1, min(seqs_all) // 4), max(seqs_all) * 4
    notes: list[str] = []
    if ctx_note:
        notes.append(f"predicted boundary not drawn: {ctx_note}")
    shown: set[EdgeCategory] = set()
    for col, dtype in enumerate(dtypes, start=1):
        if boundary is not None:
            band = [
                (r.max_num_seqs, r.lowest_utilization, r.highest_utilization)
                for r in boundary.rows_by_dtype.get(dtype, ())
            ]
            if dtype not in boundary.rows_by_dtype:
                notes.append(f"kv-cache-dtype {dtype}: the run recorded no boundary for it")
            elif band:
                xs = [lo for _, lo, _ in band] + [hi for _, _, hi in reversed(band)] + [band[0][1]]
                ys = [s for s, _, _ in band] + [s for s, _, _ in reversed(band)] + [band[0][0]]
                fig.add_trace(
                    go.Scatter(
                        x=xs, y=ys, mode="lines", fill="toself", fillcolor="rgba(46,125,50,0.08)",
                        line={"color": "rgba(46,125,50,0.7)", "dash": "dash", "width": 1.5},
                        name="memory model: starts inside this boundary",
                        legendgroup="band", showlegend=col == 1, hoverinfo="skip",
                    ),
                    row=1, col=col,
                )  # fmt: skip
                cold = [
                    (r.max_num_seqs, r.lowest_utilization_cold)
                    for r in boundary.rows_by_dtype.get(dtype, ())
                    if r.lowest_utilization_cold is not None
                ]
                if cold and any(u != lo for (_, u), (_, lo, _) in zip(cold, band, strict=False)):
                    fig.add_trace(
                        go.Scatter(
                            x=[u for _, u in cold], y=[s for s, _ in cold], mode="lines",
                            line={"color": "rgba(21,101,192,0.8)", "dash": "dot", "width": 1.5},
                            name="memory model, cold boot (empty compile cache): starts right of this",
                            legendgroup="cold", showlegend=col == 1, hoverinfo="skip",
                        ),
                        row=1, col=col,
                    )  # fmt: skip
            else:
                notes.append(f"kv-cache-dtype {dtype}: the memory model says nothing starts")
        for key, (name, color, symbol) in EDGE_CATEGORIES.items():
            for source in (PointSource.TRIAL, PointSource.PROBE):
                group = [
                    p
                    for p in points
                    if p.dtype == dtype and p.category == key and p.source == source
                ]
                if not group:
                    continue
                legend = f"{name}"
                fig.add_trace(
                    go.Scatter(
                        x=[p.util for p in group], y=[p.seqs for p in group], mode="markers",
                        name=legend, legendgroup=key.value, showlegend=key not in shown,
                        marker={
                            "color": color, "symbol": symbol if source is PointSource.TRIAL else _diamond(symbol),
                            "size": 11 if source is PointSource.PROBE else 9,
                            "line": {"width": 1.5, "color": "#ffffff" if "open" not in symbol else color},
                        },
                        text=[_point_hover(p) for p in group], hovertemplate="%{text}<extra></extra>",
                    ),
                    row=1, col=col,
                )  # fmt: skip
                shown.add(key)
        fig.update_xaxes(title_text="--gpu-memory-utilization", row=1, col=col)
    rec = data.recommendation
    if rec is not None:
        params = rec.recommended.params
        util, seqs = _resolved(_version(data), _gpu(data), dict(rec.recommended.flags))
        dtype = params.kv_cache_dtype
        if util is not None and seqs is not None and dtype in dtypes:
            fig.add_trace(
                go.Scatter(
                    x=[util], y=[seqs], mode="markers", name="recommended",
                    marker={"symbol": "star", "size": 17, "color": RECOMMENDED_COLOR,
                            "line": {"width": 1, "color": "#ffffff"}},
                    hovertemplate=f"recommended: utilization {util:g}, max-num-seqs {seqs}<extra></extra>",
                ),
                row=1, col=dtypes.index(dtype) + 1,
            )  # fmt: skip
    lo_tick, hi_tick = max(1, low_seqs), high_seqs
    ticks = [2**i for i in range(0, 17) if lo_tick / 2 <= 2**i <= hi_tick * 2]
    fig.update_yaxes(title_text="--max-num-seqs", row=1, col=1)
    xs = [p.util for p in points]
    fig.update_xaxes(range=[min(0.5, min(xs) - 0.05), 1.02], dtick=0.05)
    _layout(fig, height=440)
    fig.update_layout(legend={"y": -0.2, "yanchor": "top"}, margin={"b": 110, "t": 40})
    fig.update_yaxes(type="log", tickvals=ticks, ticktext=[str(t) for t in ticks])
    note = "; ".join(notes) or None
    return Chart("edge-map", fig, note), points


def _diamond(symbol: str) -> str:
    return {"circle": "diamond", "circle-open": "diamond-open", "x": "x-thin-open"}.get(
        symbol, symbol
    )


def _point_hover(p: MapPoint) -> str:
    lines = [
        f"<b>{esc(p.label)}</b>",
        f"utilization {p.util:g} · max-num-seqs {p.seqs} · kv {esc(p.dtype)}",
        esc(EDGE_CATEGORIES[p.category][0]),
    ]
    if p.peak_used_bytes is not None:
        total = f" of {p.total_bytes / GIB:.2f}" if p.total_bytes else ""
        lines.append(f"peak memory {p.peak_used_bytes / GIB:.2f}{total} GiB")
    if p.failure:
        lines.append(esc(p.failure, 160))
    return "<br>".join(lines)


def probe_memory(data: RunData, points: Sequence[MapPoint]) -> Chart:
    """Peak device memory of every launched setting on the map, against the device's total."""
    rows = [p for p in points if p.source is PointSource.PROBE]
    rows += [
        p
        for p in points
        if p.source is PointSource.TRIAL and p.category is not EdgeCategory.SCREENED
    ]
    if not rows:
        return Chart("probe-memory", None, "no launched setting recorded its peak memory")
    labels = [esc(f"{p.label}: util {p.util:g}, seqs {p.seqs}, kv {p.dtype}") for p in rows]
    fig = _figure()
    for key, (name, color, _) in EDGE_CATEGORIES.items():
        idx = [i for i, p in enumerate(rows) if p.category == key and p.peak_used_bytes]
        if not idx:
            continue
        fig.add_trace(
            go.Bar(
                y=[labels[i] for i in idx], x=[(rows[i].peak_used_bytes or 0) / GIB for i in idx],
                orientation="h", name=name, marker={"color": color}, width=0.7,
                text=[f"{(rows[i].peak_used_bytes or 0) / GIB:.2f} GiB" for i in idx],
                textposition="inside", insidetextanchor="end", textfont={"color": "#ffffff"},
                hovertemplate="%{y}<br>peak %{x:.2f} GiB<extra></extra>",
            )
        )  # fmt: skip
    unmeasured = [i for i, p in enumerate(rows) if not p.peak_used_bytes]
    if unmeasured:
        fig.add_trace(
            go.Scatter(
                y=[labels[i] for i in unmeasured], x=[0.0] * len(unmeasured), mode="text",
                text=[f"  no peak: {esc(EDGE_CATEGORIES[rows[i].category][0])}" for i in unmeasured],
                textposition="middle right", textfont={"color": "#c62828", "size": 11},
                hoverinfo="skip",
            )
        )  # fmt: skip
    totals = [p.total_bytes for p in rows if p.total_bytes]
    _layout(fig, height=max(160, 70 + 28 * len(rows)), barmode="overlay", showlegend=False)
    if totals:
        total = max(totals) / GIB
        fig.add_vline(x=total, line={"color": "#c62828", "dash": "dot", "width": 1.5})
        fig.add_annotation(
            x=total, y=1.0, xref="x", yref="paper", yanchor="bottom", xanchor="right",
            text=f"device total {total:.2f} GiB", showarrow=False,
            font={"size": 10, "color": "#c62828"},
        )  # fmt: skip
    fig.update_xaxes(title_text="peak used device memory (GiB)", rangemode="tozero")
    fig.update_yaxes(
        autorange="reversed", showgrid=False, categoryorder="array", categoryarray=labels
    )
    fig.update_layout(margin={"t": 24})
    return Chart("probe-memory", fig)


# --- 3. trade-offs --------------------------------------------------------------------------


def _p99(ev: Evaluation, metric: str) -> float | None:
    level = ev.best or (ev.levels[0] if ev.levels else None)
    if level is None:
        return None
    value: float | None = getattr(level.load, metric).p99
    return value


def pareto(points: Iterable[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """The (latency, goodput, id) points no other beats on both (lower latency, more goodput)."""
    front: list[tuple[float, float, int]] = []
    best = -math.inf
    for lat, good, ident in sorted(points, key=lambda p: (p[0], -p[1])):
        if good > best:
            front.append((lat, good, ident))
            best = good
    return front


def tradeoffs(data: RunData) -> Chart:
    measured = [t for t in data.trials if t.evaluation is not None and t.evaluation.levels]
    if not measured:
        return Chart("tradeoffs", None, "no trial was measured under load")
    winner = data.best_trial
    default = data.default_trial
    marks = [
        (winner, "winner", RECOMMENDED_COLOR, "star", -60, -34),
        (default, "vLLM defaults", DEFAULT_COLOR, "square-open", 60, 34),
    ]
    if winner is not None and winner is default:
        marks = [(winner, "winner = vLLM defaults", RECOMMENDED_COLOR, "star", -70, 34)]
    by_number = {t.number: t for t in measured}
    metrics = (("ttft_ms", "p99 TTFT (ms)"), ("e2e_ms", "p99 end-to-end latency (ms)"))
    fig = _subplots(rows=1, cols=2, horizontal_spacing=0.08)
    for col, (metric, title) in enumerate(metrics, start=1):
        pts: list[tuple[float, float, int]] = []
        for t in measured:
            assert t.evaluation is not None
            lat = _p99(t.evaluation, metric)
            if lat is not None:
                pts.append((lat, t.evaluation.goodput_requests_per_s, t.number))
        front = pareto(p for p in pts if by_number[p[2]].verdict is Verdict.MET)
        if len(front) > 1:
            fig.add_trace(
                go.Scatter(
                    x=[p[0] for p in front], y=[p[1] for p in front], mode="lines",
                    line={"color": "#37474f", "dash": "dot", "shape": "hv", "width": 1.5},
                    name="Pareto front", legendgroup="pareto", showlegend=col == 1, hoverinfo="skip",
                ),
                row=1, col=col,
            )  # fmt: skip
        for verdict in Verdict:
            group = [p for p in pts if by_number[p[2]].verdict is verdict]
            if not group:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[p[0] for p in group], y=[p[1] for p in group], mode="markers",
                    name=verdict.value.replace("_", " "), legendgroup=verdict.value,
                    showlegend=col == 1,
                    marker={"color": VERDICT_COLORS[verdict], "size": 9, "line": {"width": 1, "color": "#fff"}},
                    text=[_trial_hover(by_number[p[2]]) for p in group],
                    hovertemplate="%{text}<extra></extra>",
                ),
                row=1, col=col,
            )  # fmt: skip
        for row, label, color, symbol, ax, ay in marks:
            if row is None or row.evaluation is None:
                continue
            lat = _p99(row.evaluation, metric)
            if lat is None:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[lat], y=[row.evaluation.goodput_requests_per_s], mode="markers",
                    marker={"symbol": symbol, "size": 18 if symbol == "star" else 16, "color": color,
                            "line": {"width": 2, "color": color}},
                    name=label, legendgroup=label, showlegend=col == 1,
                    hovertemplate=f"{label}: trial {row.number}<extra></extra>",
                ),
                row=1, col=col,
            )  # fmt: skip
            fig.add_annotation(
                x=lat, y=row.evaluation.goodput_requests_per_s, text=f"{label} (trial {row.number})", ax=ax, ay=ay,
                showarrow=True, arrowhead=0, arrowcolor=color, font={"size": 11, "color": color},
                bgcolor="rgba(255,255,255,0.85)", row=1, col=col,
            )  # fmt: skip
        slo = _slo_p99(data, metric.removesuffix("_ms"))
        if slo is not None:
            fig.add_vline(
                x=slo, line={"color": "#c62828", "dash": "dash", "width": 1}, row=1, col=col,
                annotation_text=f"SLO p99 {slo:g} ms", annotation_position="bottom right",
                annotation_font={"size": 10, "color": "#c62828"},
            )  # fmt: skip
        fig.update_xaxes(title_text=title, row=1, col=col)
    _layout(fig, height=420)
    fig.update_xaxes(rangemode="tozero")
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text="goodput at the SLO (req/s)", row=1, col=1)
    left = len(data.trials) - len(measured)
    note = (
        f"{left} trial(s) without measurements (screened or failed to start) are in the table below"
        if left
        else None
    )
    return Chart("tradeoffs", fig, note)


def _trial_hover(t: TrialRow) -> str:
    ev = t.evaluation
    assert ev is not None
    settings = ", ".join(f"{esc(k)} {esc(v)}" for k, v in ev.flags.items()) or "vLLM defaults"
    return (
        f"<b>trial {t.number}</b> ({esc(t.role)})<br>{settings}<br>"
        f"goodput {ev.goodput_requests_per_s:.2f} req/s · throughput {ev.output_tokens_per_s:,.0f} tok/s<br>"
        f"p99 TTFT {_fmt_ms(_p99(ev, 'ttft_ms'))} · p99 e2e {_fmt_ms(_p99(ev, 'e2e_ms'))}"
    )


def _fmt_ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f} ms"


def _slo_p99(data: RunData, metric: str) -> float | None:
    if data.workload is None:
        return None
    limits = getattr(data.workload.slo, metric, None)
    value = getattr(limits, "p99_ms", None) if limits is not None else None
    return float(value) if isinstance(value, int | float) else None


def importances(data: RunData) -> Chart:
    imp = data.importances
    if not imp.values:
        return Chart("importances", None, imp.note)
    items = sorted(imp.values.items(), key=lambda kv: kv[1])
    fig = _figure()
    fig.add_trace(
        go.Bar(
            x=[v for _, v in items], y=[esc(k) for k, _ in items], orientation="h",
            marker={"color": RECOMMENDED_COLOR}, text=[f"{v:.0%}" for _, v in items],
            textposition="auto", hovertemplate="%{y}: %{x:.1%}<extra></extra>",
        )
    )  # fmt: skip
    _layout(fig, height=max(160, 60 + 30 * len(items)), showlegend=False)
    fig.update_xaxes(title_text="share of goodput's variance", tickformat=".0%", range=[0, 1])
    fig.update_yaxes(showgrid=False)
    fig.update_layout(margin={"t": 16})
    return Chart("importances", fig, imp.note)


# --- 4. memory over time --------------------------------------------------------------------


def _thin(n: int) -> int:
    return max(1, math.ceil(n / MAX_POINTS))


def memory_timeline(key: str, tl: Timeline, time_scale: float) -> Chart:
    if not tl.gpu and not tl.levels:
        return Chart(key, None, tl.note or "nothing was sampled", title=tl.label)
    k = 1.0 / (time_scale or 1.0)
    fig = _subplots(
        rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.42, 0.58],
        specs=[[{}], [{"secondary_y": True}]],
    )  # fmt: skip
    devices = sorted({s.device_index for s in tl.gpu})
    for d in devices:
        rows = [s for s in tl.gpu if s.device_index == d]
        step = _thin(len(rows))
        rows = rows[::step] + ([rows[-1]] if (len(rows) - 1) % step else [])
        xs = [s.t_s * k for s in rows]
        suffix = f" (GPU {d})" if len(devices) > 1 else ""
        fig.add_trace(
            go.Scatter(
                x=xs, y=[s.used_bytes / GIB for s in rows], mode="lines", name=f"device used{suffix}",
                line={"color": "#1565c0", "width": 2}, legendgroup="used",
                hovertemplate="%{x:.1f} s: %{y:.2f} GiB used<extra></extra>",
            ),
            row=1, col=1,
        )  # fmt: skip
        if any(s.process_used_bytes for s in rows):
            fig.add_trace(
                go.Scatter(
                    x=xs, y=[s.process_used_bytes / GIB for s in rows], mode="lines",
                    name=f"server processes{suffix}", line={"color": "#00897b", "dash": "dash"},
                    hovertemplate="%{x:.1f} s: %{y:.2f} GiB (server)<extra></extra>",
                ),
                row=1, col=1,
            )  # fmt: skip
    if tl.gpu:
        total = max(s.total_bytes for s in tl.gpu) / GIB
        fig.add_hline(
            y=total, line={"color": "#c62828", "dash": "dot", "width": 1}, row=1, col=1,
            annotation_text=f"device total {total:.1f} GiB", annotation_position="top right",
            annotation_font={"size": 10, "color": "#c62828"},
        )  # fmt: skip
        fig.update_yaxes(range=[0, total * 1.18], row=1, col=1)
    origin = tl.anchor_unix_s
    if origin is None and tl.levels:
        origin = min(s.unix_s for _, rows in tl.levels for s in rows)
    first = True
    for name, samples in tl.levels:
        assert origin is not None
        xs = [(s.unix_s - origin) * k for s in samples]
        for row in (1, 2):
            fig.add_vrect(
                x0=xs[0], x1=xs[-1], fillcolor="#90a4ae", opacity=0.13, line_width=0, row=row, col=1
            )
        fig.add_annotation(
            x=xs[0], y=1.0, xref="x", yref="paper", xanchor="left", yanchor="bottom",
            text=esc(name), showarrow=False, font={"size": 10, "color": "#455a64"},
        )  # fmt: skip
        fig.add_trace(
            go.Scatter(
                x=xs, y=[100 * s.kv_cache_usage for s in samples], mode="lines",
                name="KV-cache usage (%)", legendgroup="kv", showlegend=first,
                line={"color": "#ef6c00", "width": 2},
                hovertemplate="%{x:.1f} s: KV cache %{y:.1f}%<extra></extra>",
            ),
            row=2, col=1, secondary_y=False,
        )  # fmt: skip
        for field, color, label in (
            ("running", "#5e35b1", "running"),
            ("waiting", "#8d6e63", "waiting"),
        ):
            values = [getattr(s, field) for s in samples]
            if all(v is None for v in values):
                continue
            fig.add_trace(
                go.Scatter(
                    x=xs, y=values, mode="lines", name=f"requests {label}", legendgroup=label,
                    showlegend=first, line={"color": color, "width": 1.2, "dash": "dot"},
                    hovertemplate=f"%{{x:.1f}} s: %{{y:.0f}} {label}<extra></extra>",
                ),
                row=2, col=1, secondary_y=True,
            )  # fmt: skip
        pre_x: list[float] = []
        pre_y: list[float] = []
        pre_text: list[str] = []
        before = samples[0].preemptions_total
        for x, s in zip(xs, samples, strict=True):
            now = s.preemptions_total
            if now is not None and before is not None and now > before:
                pre_x.append(x)
                pre_y.append(100 * s.kv_cache_usage)
                pre_text.append(f"{now - before:g} preemption(s) (total {now:g})")
            before = now if now is not None else before
        if pre_x:
            fig.add_trace(
                go.Scatter(
                    x=pre_x, y=pre_y, mode="markers", name="preemptions", legendgroup="pre",
                    marker={"symbol": "x", "size": 9, "color": "#c62828"}, text=pre_text,
                    hovertemplate="%{x:.1f} s: %{text}<extra></extra>",
                ),
                row=2, col=1, secondary_y=False,
            )  # fmt: skip
        first = False
    _layout(fig, height=400)
    unit = "emulated s" if time_scale != 1.0 else "s"
    fig.update_xaxes(title_text=f"time since the GPU sampler started ({unit})", row=2, col=1)
    fig.update_yaxes(title_text="memory (GiB)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="KV cache (%)", range=[0, 105], row=2, col=1, secondary_y=False)
    fig.update_yaxes(
        title_text="requests", rangemode="tozero", tickformat=",d", showgrid=False, row=2, col=1,
        secondary_y=True,
    )  # fmt: skip
    fig.update_layout(margin={"t": 26, "b": 96}, legend={"y": -0.3, "yanchor": "top", "x": 0})
    return Chart(key, fig, tl.note, title=tl.label)


def level_timeline(key: str, level: LevelEvidence, time_scale: float) -> Chart:
    """One level's waiting and running requests and KV-cache usage against its own time
    (emulated seconds from its start), the measured window shaded when it is known."""
    samples = level.metrics
    if not samples:
        return Chart(key, None, f"/metrics over the level: {NOT_RECORDED}")
    k = 1.0 / (time_scale or 1.0)
    note = None
    origin = level.start_unix_s
    if origin is None:
        origin = samples[0].unix_s
        note = "time from the first /metrics sample (the level's start was not recorded)"
    xs = [(s.unix_s - origin) * k for s in samples]
    step = _thin(len(samples))
    keep = list(range(0, len(samples), step))
    if keep[-1] != len(samples) - 1:
        keep.append(len(samples) - 1)
    xs = [xs[i] for i in keep]
    rows = [samples[i] for i in keep]
    fig = _subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Scatter(
            x=xs, y=[100 * s.kv_cache_usage for s in rows], mode="lines", name="KV-cache usage (%)",
            line={"color": "#ef6c00", "width": 2},
            hovertemplate="%{x:.1f} s: KV cache %{y:.1f}%<extra></extra>",
        ),
        secondary_y=False,
    )  # fmt: skip
    for field, color, label in (
        ("running", "#5e35b1", "running"),
        ("waiting", "#8d6e63", "waiting"),
    ):
        values = [getattr(s, field) for s in rows]
        if all(v is None for v in values):
            continue
        fig.add_trace(
            go.Scatter(
                x=xs, y=values, mode="lines", name=f"requests {label}",
                line={"color": color, "width": 1.4, "dash": "dot" if label == "running" else "solid"},
                hovertemplate=f"%{{x:.1f}} s: %{{y:.0f}} {label}<extra></extra>",
            ),
            secondary_y=True,
        )  # fmt: skip
    window = level.window.value  # shaded once there are traces (plotly skips empty plots)
    if window is not None:
        fig.add_vrect(
            x0=window.opened_at_s, x1=window.opened_at_s + window.window_s, fillcolor="#90a4ae",
            opacity=0.15, line_width=0, annotation_text="measured window",
            annotation_position="top left", annotation_font={"size": 10, "color": "#455a64"},
        )  # fmt: skip
    _layout(fig, height=230)
    unit = "emulated s" if time_scale != 1.0 else "s"
    fig.update_xaxes(title_text=f"time since the level started ({unit})")
    fig.update_yaxes(title_text="KV cache (%)", range=[0, 105], secondary_y=False)
    fig.update_yaxes(
        title_text="requests", rangemode="tozero", tickformat=",d", showgrid=False,
        secondary_y=True,
    )  # fmt: skip
    fig.update_layout(margin={"l": 56, "r": 56, "t": 30, "b": 44})
    return Chart(key, fig, note)


# --- 5. latency -----------------------------------------------------------------------------


def _ecdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    data = sorted(values)
    n = len(data)
    if n <= CDF_POINTS:
        return data, [(i + 1) / n for i in range(n)]
    idx = sorted({min(n - 1, round(i * (n - 1) / (CDF_POINTS - 1))) for i in range(CDF_POINTS)})
    return [data[i] for i in idx], [(i + 1) / n for i in idx]


def latency_cdfs(data: RunData, runs: Sequence[tuple[str, str, LatencySamples]]) -> Chart:
    if not runs:
        return Chart("latency-cdf", None, "neither the winner nor the default has request records")
    panels = (
        ("ttft_ms", "TTFT (ms)", "ttft"),
        ("itl_ms", "inter-token latency (ms)", "itl"),
        ("e2e_ms", "end-to-end latency (ms)", "e2e"),
    )
    fig = _subplots(rows=1, cols=3, shared_yaxes=True, horizontal_spacing=0.035)
    for col, (field, title, slo_name) in enumerate(panels, start=1):
        for label, color, lat in runs:
            values = getattr(lat, field)
            if not values:
                continue
            xs, ys = _ecdf(values)
            fig.add_trace(
                go.Scatter(
                    x=xs, y=ys, mode="lines", line={"color": color, "width": 2, "shape": "hv"},
                    name=esc(label), legendgroup=label, showlegend=col == 1,
                    hovertemplate=f"{esc(label)}<br>%{{x:,.1f}} ms: %{{y:.1%}} of samples<extra></extra>",
                ),
                row=1, col=col,
            )  # fmt: skip
        slo = _slo_p99(data, slo_name)
        if slo is not None:
            fig.add_vline(
                x=slo, line={"color": "#c62828", "dash": "dash", "width": 1}, row=1, col=col,
                annotation_text=f"SLO p99 {slo:g} ms", annotation_position="bottom right",
                annotation_font={"size": 10, "color": "#c62828"},
            )  # fmt: skip
        fig.add_hline(y=0.99, line={"color": "#b0bec5", "dash": "dot", "width": 1}, row=1, col=col)
        fig.update_xaxes(title_text=title, row=1, col=col)
    _layout(fig, height=360)
    fig.update_xaxes(rangemode="tozero")
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02])
    fig.update_yaxes(title_text="fraction of samples", row=1, col=1)
    return Chart("latency-cdf", fig)


def _tint(color: str, amount: float) -> str:
    """``color`` (#rrggbb) mixed with white by ``amount``."""
    rgb = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    mixed = [round(c + (255 - c) * amount) for c in rgb]
    return "#" + "".join(f"{c:02x}" for c in mixed)


def bucket_latency(runs: Sequence[tuple[str, str, Sequence[BucketLatency]]]) -> Chart:
    labels: list[str] = []
    for _, _, buckets in runs:
        for b in buckets:
            if b.count and b.label not in labels:
                labels.append(b.label)
    if not labels:
        return Chart("bucket-latency", None, "no measured requests in any prompt-length bucket")
    fig = _subplots(
        rows=1, cols=2, horizontal_spacing=0.08,
        subplot_titles=("TTFT by prompt length", "end-to-end latency by prompt length"),
    )  # fmt: skip
    for col, field in enumerate(("ttft_ms", "e2e_ms"), start=1):
        for label, color, buckets in runs:
            by_label = {b.label: b for b in buckets}
            for pct, shade in (("p50", _tint(color, 0.55)), ("p99", color)):
                ys = [
                    getattr(getattr(by_label[lab], field), pct) if lab in by_label else None
                    for lab in labels
                ]
                counts = [by_label[lab].count if lab in by_label else 0 for lab in labels]
                fig.add_trace(
                    go.Bar(
                        x=[f"{esc(lab)} tokens" for lab in labels], y=ys, name=f"{esc(label)} {pct}",
                        marker={"color": shade}, legendgroup=f"{label}{pct}",
                        showlegend=col == 1, customdata=counts,
                        hovertemplate=f"{esc(label)} {pct}: %{{y:,.0f}} ms (%{{customdata}} requests)<extra></extra>",
                    ),
                    row=1, col=col,
                )  # fmt: skip
    _layout(fig, height=360, barmode="group", bargap=0.25)
    fig.update_yaxes(title_text="ms", rangemode="tozero")
    fig.update_xaxes(showgrid=False)
    fig.update_layout(legend={"y": -0.16, "yanchor": "top"}, margin={"t": 40, "b": 80})
    note = (
        "every measured request fell in one prompt-length bucket: this workload cannot show "
        "whether long prompts starve"
        if len(labels) == 1
        else None
    )
    return Chart("bucket-latency", fig, note)

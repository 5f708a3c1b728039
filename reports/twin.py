"""The report's twin section: its landscape of the space with the measured trials on it,
its error at each measured setting, and its step costs as each trial's fit left them
(``landscape.json`` and ``twin.json`` of the run)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import plotly.graph_objects as go

from reports.charts import RECOMMENDED_COLOR, Chart, _figure, _layout, esc
from reports.run_data import RunData, TrialRow
from tuner.errors import ConfigError
from tuner.run.evaluation import Verdict
from tuner.run.layout import RunLayout
from tuner.run.twin_record import TrialFit, TwinRecord
from tuner.twin.fit import FIT_WITHIN_SHARE, read_twin
from tuner.twin.landscape import Landscape, ScreenMethod, read_landscape

log = logging.getLogger(__name__)

COMPUTED_COLOR = "#90a4ae"
BETWEEN_COLOR = "#cfd8dc"


@dataclass
class TrialVsTwin:
    """One measured trial beside the twin's prediction for its settings."""

    trial: int
    settings: str
    rank: int | None  # its place in the twin's ranking (1: the twin's best)
    landscape_rate: float | None  # the screen's goodput for these settings
    predicted_rate: float | None  # the twin's just before the trial (a level's length)
    measured_rate: float | None  # None: no rate held
    role: str

    @property
    def error(self) -> str:
        return _share(self.predicted_rate, self.measured_rate)

    @property
    def landscape_error(self) -> str:
        return _share(self.landscape_rate, self.measured_rate)


@dataclass
class FitRow:
    trial: int
    levels: str
    before: str
    after: str
    factors: str
    goodput: str


@dataclass
class TwinSection:
    absent: str | None = None
    chart: Chart | None = None
    screened: str | None = None
    points: list[TrialVsTwin] = field(default_factory=list)
    fits: list[FitRow] = field(default_factory=list)


def _share(predicted: float | None, measured: float | None) -> str:
    if not predicted or not measured:
        return "-"
    return f"{predicted / measured - 1:+.0%}"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


def twin_section(data: RunData) -> TwinSection:
    layout = RunLayout(data.run_dir)
    try:
        landscape = read_landscape(layout.landscape_json)
    except ConfigError as exc:
        log.warning("%s", exc)
        landscape = None
    record: TwinRecord | None = None
    if layout.twin_json.is_file():
        try:
            record = read_twin(data.run_dir)
        except ConfigError as exc:
            log.warning("%s", exc)
    if landscape is None and record is None:
        return TwinSection(
            absent="The twin neither screened the space nor learned from this run's trials "
            "(a run without a GPU profile, a closed workload, or --no-twin-search and "
            "--no-twin-fit)."
        )
    fits = {f.trial: f for f in (record.fits if record is not None else [])}
    points = _measured_points(data, landscape, fits)
    section = TwinSection(points=points, fits=[_fit_row(f) for f in fits.values()])
    if landscape is not None:
        section.chart = _landscape_chart(landscape, points)
        section.screened = (
            f"{len(landscape.points)} settings screened in {landscape.wall_s:.0f} s of CPU "
            f"time before the first launch was measured: {landscape.computed} computed by their "
            f"own rate search ({landscape.window_s:g} s windows after {landscape.warmup_s:g} s "
            f"of warm-up, rates {landscape.ladder_step - 1:.0%} apart), the rest between two "
            "computed utilizations of the same settings (bounded by them). Step costs: "
            f"{landscape.factors.describe()}."
        )
    return section


def _measured_points(
    data: RunData, landscape: Landscape | None, fits: dict[int, TrialFit]
) -> list[TrialVsTwin]:
    ranked = landscape.ranked() if landscape is not None else []
    rank_of = {p.params.model_dump_json(): i + 1 for i, p in enumerate(ranked)}
    out: list[TrialVsTwin] = []
    for t in data.trials:
        ev = t.evaluation
        if ev is None:
            continue
        point = landscape.point(ev.params) if landscape is not None else None
        fit = fits.get(t.number)
        measured = ev.stated_goodput.arrival_rate_per_s if ev.verdict is Verdict.MET else None
        out.append(
            TrialVsTwin(
                trial=t.number,
                settings=ev.params.short(),
                rank=rank_of.get(ev.params.model_dump_json()),
                landscape_rate=point.rate_per_s if point is not None else None,
                predicted_rate=fit.predicted_rate_per_s if fit is not None else None,
                measured_rate=measured or None,
                role=_role_text(t),
            )
        )
    return out


def _role_text(t: TrialRow) -> str:
    return {"vllm-default": "vLLM defaults", "twin-pick": "twin's pick"}.get(
        t.role.value, "sampler"
    )


def _fit_row(f: TrialFit) -> FitRow:
    return FitRow(
        trial=f.trial,
        levels=", ".join(f.levels),
        before=_pct(f.error_before),
        after=_pct(f.error_after) if f.fitted else "not fitted",
        factors=f.after.describe()
        + (
            ""
            if f.adopted or not f.fitted
            else ": not adopted, its goodput prediction was further off"
        )
        + ("" if f.fitted else f": {f.kept_because or f'within {_pct(FIT_WITHIN_SHARE)}'}, kept"),
        goodput=_share(f.predicted_rate_per_s, f.measured_rate_per_s)
        + (f" -> {_share(f.predicted_after_per_s, f.measured_rate_per_s)}" if f.fitted else ""),
    )


def _landscape_chart(landscape: Landscape, points: list[TrialVsTwin]) -> Chart:
    ranked = [p for p in landscape.ranked() if p.method is not ScreenMethod.NOT_STARTING]
    if not ranked:
        return Chart("twin-landscape", None, "no setting of the space starts, by the memory model")
    fig = _figure()
    for method, color, name in (
        (ScreenMethod.COMPUTED, COMPUTED_COLOR, "twin: computed"),
        (ScreenMethod.BETWEEN, BETWEEN_COLOR, "twin: between computed utilizations"),
    ):
        xs = [i + 1 for i, p in enumerate(ranked) if p.method is method]
        if not xs:
            continue
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[ranked[i - 1].rate_per_s for i in xs],
                mode="markers",
                name=name,
                marker={"color": color, "size": 5},
                text=[esc(ranked[i - 1].params.short()) for i in xs],
                hovertemplate="#%{x} %{text}<br>twin %{y:.3g}/s<extra></extra>",
            )
        )
    shown = [p for p in points if p.rank is not None and p.measured_rate]
    if shown:
        fig.add_trace(
            go.Scatter(
                x=[p.rank for p in shown],
                y=[p.measured_rate for p in shown],
                mode="markers+text",
                name="measured trial",
                text=[f"#{p.trial}" for p in shown],
                textposition="top center",
                marker={"color": RECOMMENDED_COLOR, "size": 11, "symbol": "diamond"},
                customdata=[[esc(p.settings), p.landscape_error, p.error] for p in shown],
                hovertemplate="trial %{text}: %{customdata[0]}<br>measured %{y:.3g}/s<br>"
                "twin's landscape %{customdata[1]}, before the trial %{customdata[2]}<extra></extra>",
            )
        )
    _layout(fig, height=360)
    fig.update_xaxes(title_text="settings, ranked by the twin's goodput (1: its best)")
    fig.update_yaxes(title_text="goodput (workload's unit)", rangemode="tozero")
    off = len(landscape.points) - len(ranked)
    note = f"{off} setting(s) that would not start are left out" if off else None
    return Chart("twin-landscape", fig, note, title="The twin's landscape and the measured trials")

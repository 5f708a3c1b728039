"""The capacity plan's HTML report (``tuner capacity``): one offline page for a capacity
review: the chosen fleet and its cost, the options ranked with their ranges, the Pareto
frontier, and which figures were measured and which predicted."""

from __future__ import annotations

import html
from pathlib import Path

from tuner.capacity.plan import CapacityPlan, PlanOption

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}tr.chosen{background:#e8f5e9}tr.runner{background:#f1f8ff}
.note{color:#555}.pred{color:#8a6d00}.meas{color:#1b5e20;font-weight:600}
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _money(value: float | None) -> str:
    return "–" if value is None else f"${value:,.2f}"


def _row(option: PlanOption, plan: CapacityPlan) -> str:
    cls = (
        "chosen" if option is plan.chosen or option == plan.chosen
        else "runner" if option == plan.runner_up else ""
    )  # fmt: skip
    replica = option.replica
    if replica is None or option.fleet_low is None or option.fleet is None:
        return (
            f'<tr><td></td><td class="l">{_e(option.label)}</td>'
            f'<td class="l" colspan="9">{_e(option.status.value)}: {_e(option.failure or "")}</td></tr>'
        )
    kind = "meas" if not option.provenance.predicted else "pred"
    error = f" (twin {option.prediction_error:+.0%})" if option.prediction_error is not None else ""
    return (
        f'<tr class="{cls}"><td>{option.rank}</td><td class="l">{_e(option.label)}</td>'
        f'<td class="l">{_e(option.params.short() if option.params else "")}</td>'
        f"<td>{replica.goodput.arrival_rate_per_s:.2f}</td>"
        f"<td>{option.goodput_low or 0:.2f} – {option.goodput_high or 0:.2f}</td>"
        f"<td>{option.fleet.replicas} – {option.fleet_low.replicas}</td>"
        f"<td>{option.fleet_low.gpus}</td><td>{_money(option.fleet_low.usd_per_hour)}</td>"
        f"<td>{_money(option.fleet_low.usd_per_million_output_tokens)}</td>"
        f"<td>{option.output_tokens_per_s_per_gpu or 0:,.0f}</td>"
        f"<td>{replica.output_tokens_per_s_per_user or 0:,.1f}{' ★' if option.on_frontier else ''}</td>"
        f'<td class="l {kind}">{_e(option.provenance.value)}{_e(error)}</td></tr>'
    )


def _frontier_svg(plan: CapacityPlan) -> str:
    points = [
        (o.replica.output_tokens_per_s_per_user or 0.0, o.output_tokens_per_s_per_gpu or 0.0, o)
        for o in plan.options
        if o.replica is not None
    ]
    if not points:
        return "<p>No option holds the SLO.</p>"
    w, h, pad = 640, 360, 50
    xmax = max(p[0] for p in points) * 1.1 or 1.0
    ymax = max(p[1] for p in points) * 1.1 or 1.0

    def xy(x: float, y: float) -> tuple[float, float]:
        return pad + x / xmax * (w - 2 * pad), h - pad - y / ymax * (h - 2 * pad)

    parts = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg" role="img">',
             f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#444"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#444"/>',
             f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle" font-size="12">output tokens/s per user</text>',
             f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle" font-size="12">output tokens/s per GPU</text>']  # fmt: skip
    front = sorted((p for p in points if p[2].on_frontier), key=lambda p: p[0])
    if len(front) > 1:
        path = " ".join(f"{xy(x, y)[0]:.1f},{xy(x, y)[1]:.1f}" for x, y, _ in front)
        parts.append(f'<polyline points="{path}" fill="none" stroke="#2e7d32" stroke-width="1.5"/>')
    for x, y, option in points:
        cx, cy = xy(x, y)
        colour = "#2e7d32" if option.on_frontier else "#888"
        parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4" fill="{colour}"><title>{_e(option.label)}: {y:,.0f} tok/s/GPU, {x:.1f} tok/s/user</title></circle>')  # fmt: skip
        parts.append(f'<text x="{cx + 6:.1f}" y="{cy - 4:.1f}" font-size="10">{_e(option.label)}</text>')  # fmt: skip
    parts.append("</svg>")
    return "\n".join(parts)


def render_capacity_report(plan: CapacityPlan) -> str:
    chosen = plan.chosen
    if chosen is not None and chosen.fleet_low is not None:
        cost = (
            f", {_money(chosen.fleet_low.usd_per_hour)} per hour, "
            f"{_money(chosen.fleet_low.usd_per_million_output_tokens)} per million output tokens"
            if chosen.fleet_low.usd_per_hour is not None
            else ""
        )
        how = chosen.how_known().replace("+-", "±")
        headline = (
            f"<p><b>Chosen:</b> {chosen.fleet_low.replicas} × {_e(chosen.label)} = "
            f"{chosen.fleet_low.gpus} GPUs{cost}; {_e(how)}. Configs in <code>chosen/</code>"
            + (
                f"; runner-up {_e(plan.runner_up.label)} in <code>runner-up/</code>"
                if plan.runner_up
                else ""
            )
            + ".</p>"
        )
    else:
        headline = "<p><b>No option holds the SLO.</b></p>"
    rows = "\n".join(_row(o, plan) for o in plan.options)
    runs = "".join(f"<li><code>{_e(r)}</code></li>" for r in plan.runs) or "<li>none: every figure is the twin's on paper step costs</li>"  # fmt: skip
    notes = "".join(f"<li>{_e(n)}</li>" for n in plan.notes)
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>Capacity plan: {_e(plan.model)}, {_e(plan.workload)}</title><style>{_CSS}</style></head><body>
<h1>Capacity plan: {_e(plan.model)} for a peak of {plan.peak:g} {_e(plan.unit)}</h1>
<p>Workload <b>{_e(plan.workload)}</b>, SLO {_e(plan.slo.text())}; headroom {plan.headroom:.0%};
vLLM {_e(plan.vllm_version)}. Each option's goodput is one replica's steady-state rate at the SLO:
<span class="meas">measured</span> where a run confirmed it, else <span class="pred">predicted</span>
by the twin, with a range as wide as the twin has been measured to be off. Fleets are sized at the
range's low end (replicas: at the goodput – at the low end).</p>
{headline}
<h2>Options, ranked</h2>
<table><tr><th>#</th><th class="l">GPU × TP</th><th class="l">settings</th><th>goodput/replica</th>
<th>range</th><th>replicas</th><th>GPUs</th><th>USD/hour</th><th>USD/M output tok</th>
<th>tok/s per GPU</th><th>tok/s per user</th><th class="l">source</th></tr>
{rows}</table>
<h2>Pareto frontier</h2>
<p class="note">Output tokens/s per GPU against output tokens/s per user, each option at its goodput; ★ and green: on the frontier.</p>
{_frontier_svg(plan)}
<h2>Measured and predicted</h2>
<p>Runs that calibrated the twin (<code>--from</code>):</p><ul>{runs}</ul>
<ul class="note">{notes}</ul>
<p class="note">{plan.twin_runs} twin runs in {plan.wall_s:.1f} s. Written by vllm-capacity-tuner.</p>
</body></html>
"""


def write_capacity_report(plan: CapacityPlan, path: Path) -> Path:
    path.write_text(render_capacity_report(plan), encoding="utf-8")
    return path

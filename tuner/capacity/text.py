"""The capacity plan as the terminal prints it: the options ranked, then the chosen fleet."""

from __future__ import annotations

from tuner.capacity.plan import CapacityPlan, PlanOption


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def _row(option: PlanOption) -> str:
    replica = option.replica
    low = option.fleet_low
    mid = option.fleet
    if replica is None or low is None or mid is None:
        return f"  {'':>3} {option.label:<20} {option.status.value}: {option.failure or ''}"
    per_user = replica.output_tokens_per_s_per_user
    goodput = replica.goodput.arrival_rate_per_s
    return (
        f"  {option.rank or '':>3} {option.label:<20} "
        f"{goodput:8.2f} ({option.goodput_low or 0:.2f}-{option.goodput_high or 0:.2f}) "
        f"{mid.replicas:>4}-{low.replicas:<4} {low.gpus:>5} {_money(low.usd_per_hour):>10} "
        f"{_money(low.usd_per_million_output_tokens):>8} "
        f"{option.output_tokens_per_s_per_gpu or 0:>9,.0f} {per_user or 0:>7.1f} "
        f"{'*' if option.on_frontier else ' '} {option.provenance.value}"
        + (" (on the simulated engine)" if option.simulated_measurement else "")
    )


def format_plan(plan: CapacityPlan) -> str:
    lines = [
        f"capacity plan: {plan.model}, workload {plan.workload} ({plan.slo.text()}), "
        f"peak {plan.peak:g} {plan.unit}, headroom {plan.headroom:.0%}, vLLM {plan.vllm_version}",
        "",
        f"  {'#':>3} {'option (GPU x TP)':<20} {'goodput per replica (range)':<26} "
        f"{'replicas':>9} {'GPUs':>5} {'USD/hour':>10} {'USD/Mtok':>8} {'tok/s/GPU':>9} "
        f"{'tok/s/user':>7}   source",
    ]
    lines += [_row(o) for o in plan.options]
    lines.append(
        "  goodput in " + plan.unit + "; replicas: at the goodput - at the range's low end "
        "(GPUs, cost and the deployed configs at the low end); * on the Pareto frontier "
        "(tok/s per GPU against tok/s per user)"
    )
    for name, option in (("chosen", plan.chosen), ("runner-up", plan.runner_up)):
        if option is None or option.fleet_low is None or option.replica is None:
            continue
        cost = (
            f", {_money(option.fleet_low.usd_per_hour)}/hour"
            if option.fleet_low.usd_per_hour is not None
            else ""
        )
        what = option.how_known()
        lines.append(
            f"{name}: {option.fleet_low.replicas} x {option.label} = {option.fleet_low.gpus} "
            f"GPUs{cost}; {option.params.short() if option.params else ''}; {what}"
        )
        if option.prediction_error is not None:
            lines.append(
                f"  the twin predicted {option.predicted.goodput.arrival_rate_per_s:.2f} "  # type: ignore[union-attr]
                f"for it ({option.prediction_error:+.0%} off the measurement)"
            )
    lines += [f"note: {n}" for n in plan.notes]
    lines.append(f"{plan.twin_runs} twin runs in {plan.wall_s:.1f} s")
    return "\n".join(lines)

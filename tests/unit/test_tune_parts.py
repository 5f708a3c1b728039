"""The tuning loop's pure parts: config loading, variants, capacity, hashes, time scale, stop
rule, and the rate search's climbing and bracketing (on a stand-in server of known capacity)."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuner.errors import ConfigError
from tuner.run.edge import EdgeResult, KnobEdge
from tuner.run.evaluation import LevelRecord
from tuner.run.goodput import Goodput, GoodputBound, GoodputUnit
from tuner.search.capacity_interval import capacity_interval
from tuner.search.config import load_config
from tuner.search.context import StudySetup, auto_time_scale, resolve
from tuner.search.evaluate import _summary
from tuner.search.rate_search import (
    DRAW_SEED_STRIDE,
    HOLD_MIN,
    TWIN_MISS_STEP,
    RateLevel,
    RateSearch,
    climb_step,
    descent_step,
    draw_seed,
    ends_clean,
    goodput_text,
    hold_rule_miss,
    level_met,
    pooled_verdicts,
    search_rate,
    stop_rule,
)
from tuner.search.recommend import capacity, combined_bound, config_hash, variant_params
from tuner.search.study import redact_url
from tuner.serving.backlog import BacklogCheck, BacklogVerdict, Signal, SignalTrend
from tuner.serving.live_server import LoadMeasurement, StopRule
from tuner.serving.load import SloVerdict
from tuner.serving.prometheus_scrape import ServerCounters
from tuner.serving.server import TrialOutcome
from tuner.serving.window import WindowOpening
from tuner.vllm.memory import Calibration
from tuner.vllm.space import Knob, TrialParams
from workloads.load_result import LoadResult, Percentiles
from workloads.schedule import RequestRecord, ScheduledRequest
from workloads.spec import WorkloadSpec, load_workload
from workloads.stationary import TURN_MIX_FILE, AnswerTimes, TurnMix


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A context resolved without --run-dir makes runs/<study> where it runs: here, not in
    the checkout."""
    monkeypatch.chdir(tmp_path)


def test_yaml_config_with_flags_on_top(tmp_path: Path) -> None:
    path = tmp_path / "tune.yaml"
    path.write_text(
        "model: qwen2.5-7b\ntrials: 20\nspace:\n  max-num-seqs: 32..256\n"
        "knobs: [max-num-seqs, block-size]\n"
    )
    config = load_config(path, {"trials": 5, "space": {"block-size": "16"}, "gpu": None})
    assert config.model == "qwen2.5-7b"
    assert config.trials == 5  # the flag wins
    assert config.space == {"max-num-seqs": "32..256", "block-size": "16"}
    assert config.knobs == ("max-num-seqs", "block-size")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("trials: 0\n", "trials = 0"),
        ("budget_min: -3\n", "budget_min = -3"),
        ("colour: blue\n", "setting 'colour' is not accepted"),
        ("objective: fastest\n", "objective = 'fastest'"),
        ("- a list\n", "not a mapping"),
    ],
)
def test_bad_config_is_one_line_naming_the_value(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "tune.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path, {})
    message = str(err.value)
    assert "\n" not in message and expected in message


def test_resolve_leaves_out_what_the_release_lacks_and_fits_the_context() -> None:
    config = load_config(None, {"gpu": "L4", "vllm_version": "0.17", "backend": "sim"})
    ctx = resolve(config)
    searched = {r.knob for r in ctx.space.ranges}
    assert Knob.SWAP_SPACE in searched  # 0.17 still has --swap-space
    assert Knob.KV_CACHE_DTYPE in searched  # the L4 (Ada) has an fp8 KV cache
    # Llama 3.1's 131072-token context cannot fit an L4: a workload-sized one is chosen.
    assert ctx.base.max_model_len is not None and ctx.base.max_model_len < 131072
    assert any("--max-model-len" in note for note in ctx.notes)
    current = resolve(load_config(None, {"gpu": "A100-40GB", "backend": "sim"}))
    left = {o.knob: o.reason for o in current.space.left_out}
    assert "0.18" in left[Knob.SWAP_SPACE]
    # An A100 (8.0) takes an fp8 KV cache from vLLM 0.11 (FlashInfer, PR #24577), not before.
    assert Knob.KV_CACHE_DTYPE in {r.knob for r in current.space.ranges}
    older = resolve(
        load_config(None, {"gpu": "A100-40GB", "vllm_version": "0.10", "backend": "sim"})
    )
    assert "fp8" in {o.knob: o.reason for o in older.space.left_out}[Knob.KV_CACHE_DTYPE]


def test_the_context_is_frozen_and_the_study_setup_is_passed_apart() -> None:
    ctx = resolve(load_config(None, {"backend": "sim"}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.run_dir = Path("elsewhere")  # type: ignore[misc]
    assert ctx.notes[0].startswith("SIMULATED backend")
    setup = StudySetup(time_scale=2.0, stream_fraction=0.5)
    calibration = Calibration(source="server.log")
    calibrated = setup.calibrated(calibration)
    assert setup.calibration is None  # a new set-up, the old one unchanged
    assert calibrated == StudySetup(time_scale=2.0, stream_fraction=0.5, calibration=calibration)


def _edge(highest_ok: float | None) -> EdgeResult:
    util = KnobEdge(
        knob=Knob.GPU_MEMORY_UTILIZATION, start=0.9, predicted=0.95, highest_ok=highest_ok,
        lowest_failed=None if highest_ok is None else highest_ok + 0.01, resolution=0.01,
        launches=2,
    )  # fmt: skip
    return EdgeResult(worst_case=None, utilization=util, max_num_seqs=None, probes=[])


def test_variants_step_back_from_the_edge() -> None:
    ctx = resolve(load_config(None, {"backend": "sim", "safety_margin": 0.03}))
    best = TrialParams(gpu_memory_utilization=0.88, max_num_seqs=200, block_size=16)
    points = variant_params(ctx, best, _edge(0.96))
    assert points["recommended"].gpu_memory_utilization == pytest.approx(0.93)
    assert points["aggressive"].gpu_memory_utilization == pytest.approx(0.96)
    conservative = points["conservative"]
    assert (conservative.gpu_memory_utilization or 1) < 0.93
    assert conservative.max_num_seqs == 150
    # Without a known edge the best settings stand.
    assert variant_params(ctx, best, _edge(None))["recommended"] == best


def test_capacity_and_hash() -> None:
    ctx = resolve(load_config(None, {"backend": "sim", "target_peak_rate": 100.0}))

    def per_s(value: float, bound: GoodputBound) -> Goodput:
        return Goodput(
            arrival_rate_per_s=value, requests_per_s=value, output_tokens_per_s=100 * value,
            bound=bound,
        )  # fmt: skip

    cap = capacity(ctx, per_s(12.5, GoodputBound.BRACKETED))
    assert cap is not None and cap.replicas == 10  # 100 / (12.5 * 0.8)
    assert not cap.replicas_is_upper_bound
    assert cap.unit is GoodputUnit.REQUESTS_PER_S
    assert cap.text() == "10 replica(s) for a peak of 100 req/s, 20% headroom"
    # From a goodput that is only a lower bound, the replicas are an upper bound.
    at_least = capacity(ctx, per_s(12.5, GoodputBound.LOWER_BOUND))
    assert at_least is not None and at_least.replicas == 10 and at_least.replicas_is_upper_bound
    assert at_least.text().startswith("at most 10 replica(s)")
    assert capacity(ctx, per_s(0.0, GoodputBound.NONE)) is None
    # A multi-turn workload's peak is in conversations/s, its replicas from conversations/s.
    chat = Goodput(
        arrival_rate_per_s=5.0, unit=GoodputUnit.CONVERSATIONS_PER_S, requests_per_s=17.5,
        output_tokens_per_s=4000.0, bound=GoodputBound.BRACKETED,
    )  # fmt: skip
    sessions = capacity(ctx, chat)
    assert sessions is not None and sessions.replicas == 25  # 100 / (5 * 0.8), not 100 / 17.5
    assert sessions.unit is GoodputUnit.CONVERSATIONS_PER_S and sessions.goodput == chat
    assert sessions.peak_requests_per_s == pytest.approx(350.0)
    assert sessions.text() == (
        "25 replica(s) for a peak of 100 conversations/s (about 350 req/s), 20% headroom"
    )
    a = config_hash(ctx, {"max-num-seqs": 64})
    assert a == config_hash(ctx, {"max-num-seqs": 64})
    assert a != config_hash(ctx, {"max-num-seqs": 65})
    assert len(a) == 16


def test_time_scale_keeps_the_load_generator_below_its_limit() -> None:
    assert auto_time_scale(1000.0, 10.0, 5000.0) == 1.0
    scale = auto_time_scale(12000.0, 50.0, 5000.0)
    assert (12000.0 + 10 * 50.0) / scale <= 5000.0
    assert scale - 0.5 < (12000.0 + 10 * 50.0) / 5000.0  # not slower than needed


def test_stop_rule_allowance_follows_the_percentile() -> None:
    spec = load_workload("chat")  # ttft p99 2000 ms
    rule = stop_rule(spec, expected_requests=1000, time_scale=2.0)
    assert rule is not None
    assert rule.max_bad == 22  # 2 x 1% of 1000, plus 2
    assert rule.bad_fraction == pytest.approx(0.02)  # a window held on past them: 2 %
    assert rule.ttft_limit_s == pytest.approx(4.0)  # 2 s on a clock twice as slow
    no_ttft = spec.model_copy(update={"slo": spec.slo.model_copy(update={"ttft": None})})
    assert stop_rule(no_ttft, 1000, 1.0) is None


def test_a_held_window_is_allowed_its_share_of_late_requests(tmp_path: Path) -> None:
    """A level's early stop is sized for its shortest window; a window held on past it
    stops once more than twice the percentile's allowance of what it recorded was late.
    The records are read on from where the last reading stopped, a half-written line
    waiting for the next."""
    rule = StopRule(1000.0, time_scale=1.0, max_bad=5, bad_fraction=0.02).bind(tmp_path)
    path = tmp_path / "records.jsonl.w0"
    written = 0

    def append(n: int, late: int, tail: str = "") -> bool:
        nonlocal written
        lines = []
        for i in range(written, written + n):
            ttft = 2.0 if i - written < late else 0.1
            record = RequestRecord(request_id=f"r{i}", scheduled_s=100.0 + i, sent_s=100.0 + i,
                                   prompt_tokens=10, output_tokens=5, status=200,
                                   first_token_s=100.0 + i + ttft, end_s=100.0 + i + ttft + 0.1)  # fmt: skip
            lines.append(record.to_json() + "\n")
        written += n
        with path.open("a", encoding="utf-8") as f:
            f.write("".join(lines) + tail)
        rule._last_check = 0.0
        return rule()

    assert not append(100, 5)  # 5 late of 100: within max_bad
    assert not append(900, 16)  # 21 late of 1,000: within 2 % of them, plus 2
    half = RequestRecord(request_id="half", scheduled_s=1.0, sent_s=1.0, prompt_tokens=1,
                         output_tokens=1, status=200, first_token_s=9.0).to_json()  # fmt: skip
    assert not append(2, 2, tail=half[:20])  # 23 late of 1,002 (limit 23); a line half out
    assert len(rule.tail.records) == 1002
    with path.open("a", encoding="utf-8") as f:
        f.write(half[20:] + "\n")  # the half line completed: one more late
    rule._last_check = 0.0
    assert rule()  # 24 late of 1,003: past ceil(2 % of them) + 2 = 23
    assert len(rule.tail.records) == 1003


def test_storage_password_is_redacted() -> None:
    assert (
        redact_url("postgresql://tuner:s3cret@db:5432/optuna")
        == "postgresql://tuner:***@db:5432/optuna"
    )
    assert redact_url("sqlite:///runs/x/study.db") == "sqlite:///runs/x/study.db"


# --- the rate search ---------------------------------------------------------------------------

CHAT_TTFT_LIMIT_MS = 2000.0  # the chat workload's p99 TTFT objective (TPOT p99 100 ms)


def _measurement(
    out_dir: Path,
    rate: float,
    *,
    met: bool,
    ttft_p99_ms: float,
    tpot_p99_ms: float = 20.0,
    server: ServerCounters | None = None,
) -> LoadMeasurement:
    load = LoadResult(
        num_requests=100, num_completed=100, num_errors=0, num_not_sent=0, error_rate=0.0,
        window_s=10.0, duration_s=10.0, offered_rate=rate, achieved_rate=rate,
        request_throughput=rate, output_token_throughput=100 * rate, output_tokens=1000,
        prompt_tokens=1000, slo=None, num_good=100, goodput=rate,
        ttft_ms=Percentiles(count=100, p99=ttft_p99_ms), itl_ms=Percentiles(),
        tpot_ms=Percentiles(count=100, p99=tpot_p99_ms), e2e_ms=Percentiles(),
        send_lag_ms=Percentiles(), prompt_buckets=(),
    )  # fmt: skip
    violations = [] if met else [f"ttft p99 {ttft_p99_ms:.1f} ms > 2000 ms"]
    return LoadMeasurement(
        out_dir=str(out_dir), outcome=TrialOutcome.READY, load=load,
        slo=SloVerdict(met=met, violations=violations), server=server,
    )  # fmt: skip


class _KnownCapacity:
    """A stand-in for ``trial.LiveServer``: the SLO holds up to ``capacity_per_s``. Below it
    the p99 TTFT grows like a queue's, ``base / (1 - load)``, from a server that is idle at
    21 ms (vLLM's CPU build with the chat workload, issue 16); past it, it is the limit
    times ``load ** 4``."""

    def __init__(self, capacity_per_s: float, base_ttft_ms: float = 21.0) -> None:
        self.capacity_per_s = capacity_per_s
        self.base_ttft_ms = base_ttft_ms
        self.launch = SimpleNamespace(params=SimpleNamespace(max_model_len=None))
        self.time_scale = 1.0
        self.rates: list[float] = []

    def measure(
        self,
        workload: WorkloadSpec,
        schedule: list[ScheduledRequest],
        *,
        out_dir: Path,
        stop_when: object = None,
        drain_s: float | None = None,
        stop_on_backlog: bool = False,
        level: object = None,
        chain: object = None,
    ) -> LoadMeasurement:
        rate = workload.mean_rate_per_s
        assert rate is not None
        self.rates.append(rate)
        load = rate / self.capacity_per_s
        met = load <= 1.0
        ttft = (
            min(self.base_ttft_ms / max(1e-9, 1.0 - load), CHAT_TTFT_LIMIT_MS)
            if met
            else CHAT_TTFT_LIMIT_MS * load**4
        )
        return _measurement(out_dir, rate, met=met, ttft_p99_ms=ttft)


def _search(
    server: _KnownCapacity, tmp_path: Path, *, start: float, max_levels: int, precision: float
) -> RateSearch:
    return search_rate(
        server, load_workload("chat"), start_rate_per_s=start, out_dir=tmp_path,
        level_duration_s=2.0, warmup_s=1.0, max_levels=max_levels, precision=precision,
        edge_draws=1,  # the search's own levels alone (the edge draws: their own tests)
    )  # fmt: skip


def test_no_level_after_the_first_starts_that_would_end_past_the_deadline(
    tmp_path: Path,
) -> None:
    """A trial started short (its first levels fit before the search's deadline) measures
    the levels that end before it, each taken to last as long as the longest so far; the
    first level always runs."""
    from tuner.search.rate_search import _ends_in_time

    def took(*wall_s: float) -> list[RateLevel]:
        return [SimpleNamespace(wall_s=w, measurement=SimpleNamespace(client=None)) for w in wall_s]  # type: ignore[misc]

    now = time.monotonic()
    assert _ends_in_time([], now - 1.0)  # the first level
    assert not _ends_in_time(took(30.0), now + 20.0)
    assert _ends_in_time(took(30.0, 10.0), now + 40.0)
    assert not _ends_in_time(took(30.0, 50.0), now + 40.0)  # as long as the longest
    assert _ends_in_time(took(30.0), None)
    server = _KnownCapacity(capacity_per_s=10.0)
    late = search_rate(
        server, load_workload("chat"), start_rate_per_s=None, out_dir=tmp_path,
        level_duration_s=2.0, warmup_s=1.0, max_levels=4, precision=0.05,
        predicted_rate_per_s=10.0, edge_draws=1, deadline=time.monotonic() - 1.0,
    )  # fmt: skip
    assert len(late.levels) == 1 and len(server.rates) == 1
    free = _KnownCapacity(capacity_per_s=10.0)
    search_rate(
        free, load_workload("chat"), start_rate_per_s=None, out_dir=tmp_path / "free",
        level_duration_s=2.0, warmup_s=1.0, max_levels=4, precision=0.05,
        predicted_rate_per_s=10.0, edge_draws=1,
    )  # fmt: skip
    assert len(free.rates) > 1


def test_a_confirmation_straddles_its_trials_bracket(tmp_path: Path) -> None:
    """A confirmation of a trial that held 8.84 and broke at 9.34 measures on both sides of
    their middle first (not a climb by what its first level allows), and where both hold,
    climbs by at most the twin's step: the capacity is near where the trial put it."""
    from tuner.search.recommend import trial_bracket_middle

    trial = SimpleNamespace(
        rate_per_s=8.84,
        levels=[SimpleNamespace(rate_per_s=r, met=m) for r, m in
                [(9.34, False), (7.48, True), (8.36, True), (8.84, True), (12.0, False)]],
    )  # fmt: skip
    middle = trial_bracket_middle(trial)  # type: ignore[arg-type]
    assert middle == pytest.approx(math.sqrt(8.84 * 9.34))
    assert trial_bracket_middle(SimpleNamespace(rate_per_s=8.84, levels=[])) is None  # type: ignore[arg-type]
    assert trial_bracket_middle(SimpleNamespace(rate_per_s=None, levels=[])) is None  # type: ignore[arg-type]
    for edge_per_s, out in ((9.0, "near"), (14.0, "far")):
        server = _KnownCapacity(capacity_per_s=edge_per_s)
        search_rate(
            server, load_workload("chat"), start_rate_per_s=8.84, out_dir=tmp_path / out,
            level_duration_s=2.0, warmup_s=1.0, max_levels=3, precision=0.05,
            predicted_rate_per_s=middle, start_held=True, edge_draws=1,
        )  # fmt: skip
        assert server.rates[0] == pytest.approx(middle / math.sqrt(1.05))
        assert server.rates[1] == pytest.approx(server.rates[0] * 1.05)
        if edge_per_s == 9.0:
            assert len(server.rates) == 2  # bracketed within 5%
        else:
            assert server.rates[2] <= server.rates[1] * TWIN_MISS_STEP + 1e-9


def test_search_doubles_while_far_from_the_slo_then_bisects_to_the_capacity(
    tmp_path: Path,
) -> None:
    server = _KnownCapacity(capacity_per_s=37.0)
    result = _search(server, tmp_path, start=1.0, max_levels=12, precision=0.05)
    # Far below the TTFT limit every step doubles, up to the first rate that breaks.
    assert server.rates[:7] == pytest.approx([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0])
    assert [lv.met for lv in result.levels[:7]] == [True] * 6 + [False]
    # Then the geometric middle of the bracket, until it is within the precision.
    assert server.rates[7] == pytest.approx(math.sqrt(32.0 * 64.0))
    assert result.bound is GoodputBound.BRACKETED
    assert result.best is not None and result.broken_rate_per_s is not None
    assert result.best.rate_per_s <= 37.0 < result.broken_rate_per_s
    assert result.broken_rate_per_s / result.best.rate_per_s <= 1.05
    assert len(result.levels) < 12  # it stopped on the precision, not on the budget
    assert result.goodput == pytest.approx(result.best.rate_per_s)
    assert goodput_text(result.goodput, result.bound) == f"{result.goodput:.2f} req/s"


def test_no_breaking_rate_within_the_budget_is_a_lower_bound(tmp_path: Path) -> None:
    """Issue 16: 1.0, 1.15, 1.32 conversations/s all met at p99 TTFT 21 ms is not a goodput."""
    server = _KnownCapacity(capacity_per_s=1000.0)
    result = _search(server, tmp_path, start=1.0, max_levels=3, precision=0.15)
    assert server.rates == pytest.approx([1.0, 2.0, 4.0])  # not x1.15: the SLO is far off
    assert all(lv.met for lv in result.levels)
    assert result.bound is GoodputBound.LOWER_BOUND and result.bound.is_lower_bound
    assert result.broken_rate_per_s is None
    assert result.goodput == pytest.approx(4.0)
    assert goodput_text(result.goodput, result.bound) == (
        "at least 4.00 req/s (no breaking rate found)"
    )


class _Collapsing(_KnownCapacity):
    """Past its capacity the server collapses: 60 % of the requests fail (time out in the
    queue), which alone would put the capacity at 40 % of the rate."""

    def measure(self, workload: WorkloadSpec, schedule: list[ScheduledRequest], **kw: object) -> LoadMeasurement:  # fmt: skip
        m = super().measure(workload, schedule, **kw)  # type: ignore[arg-type]
        if m.slo.met:
            return m
        load = m.load.model_copy(update={"num_errors": 60, "num_completed": 40})
        return m.model_copy(update={"load": load})


@pytest.mark.parametrize("start_held", [False, True])
def test_a_confirmation_that_breaks_where_its_trial_held_steps_down_gently(
    tmp_path: Path, start_held: bool
) -> None:
    """Stop 28's walk-through: the recommendation's trial held 8.31, its confirmation's first
    level collapsed there (60 % failed) and the search halved to 4.15, then climbed to only
    5.88 in three levels, below vLLM's defaults. A rate the settings held before puts the
    capacity near it: one step of ``growth`` down, then the bracket's middle."""
    server = _Collapsing(capacity_per_s=7.5)
    result = search_rate(
        server, load_workload("chat"), start_rate_per_s=8.31, out_dir=tmp_path,
        level_duration_s=2.0, warmup_s=1.0, max_levels=3, precision=0.05,
        start_held=start_held, edge_draws=1,
    )  # fmt: skip
    assert [lv.met for lv in result.levels][:2] == [False, True]
    if not start_held:  # the failure share asks for x2.5: halved, far below the capacity
        assert server.rates[1] == pytest.approx(8.31 / 2)
        assert result.goodput < 0.8 * 7.5
        return
    assert server.rates[1] == pytest.approx(8.31 / 1.15)
    assert result.best is not None and result.broken_rate_per_s is not None
    assert result.goodput >= 7.5 / 1.1 and result.broken_rate_per_s / result.goodput < 1.1


def test_a_first_rate_that_breaks_is_halved_until_one_holds(tmp_path: Path) -> None:
    server = _KnownCapacity(capacity_per_s=3.0)
    result = _search(server, tmp_path, start=20.0, max_levels=8, precision=0.1)
    assert server.rates[:4] == pytest.approx([20.0, 10.0, 5.0, 2.5])
    assert [lv.met for lv in result.levels[:4]] == [False, False, False, True]
    assert server.rates[4] == pytest.approx(math.sqrt(2.5 * 5.0))  # then bisection
    assert result.bound is GoodputBound.BRACKETED
    assert result.best is not None and result.broken_rate_per_s is not None
    assert result.best.rate_per_s <= 3.0 < result.broken_rate_per_s
    assert result.broken_rate_per_s / result.best.rate_per_s <= 1.1


def test_a_first_rate_just_past_the_edge_steps_down_a_little(tmp_path: Path) -> None:
    """A start the twin placed just above the edge is not halved: 11/s on a server of 10/s
    misses its TTFT p99 by x1.46, so the next rate is 11 / sqrt(1.46) = 9.09/s."""
    server = _KnownCapacity(capacity_per_s=10.0)
    result = _search(server, tmp_path, start=11.0, max_levels=2, precision=0.15)
    assert server.rates == pytest.approx([11.0, 11.0 / 1.1**2])
    assert result.bound is GoodputBound.BRACKETED
    assert result.broken_rate_per_s == pytest.approx(11.0)
    assert result.goodput == pytest.approx(11.0 / 1.21)


class _StopsEarly(_KnownCapacity):
    """Past its capacity every level stops early (its queue grew at once), so how far it
    missed is unknown from its own requests: ``descent_step`` halves."""

    def measure(self, workload: WorkloadSpec, schedule: list[ScheduledRequest], **kw: object) -> LoadMeasurement:  # fmt: skip
        m = super().measure(workload, schedule, **kw)  # type: ignore[arg-type]
        return m if m.slo.met else m.model_copy(update={"stopped_early": True})


def test_a_first_rate_the_twin_placed_that_breaks_steps_down_by_the_twins_error(
    tmp_path: Path,
) -> None:
    """Issue 34: the twin placed its first level 10 to 25% above what held, the miss stopped
    early, and halving put the next level far below the edge, where three climbs could not
    reach it again. Its own error bounds the step: the goodput ends within the bracket's
    precision of the capacity in four levels."""
    capacity = 10.0
    server = _StopsEarly(capacity_per_s=capacity)
    predicted = 1.2 * capacity  # the twin 20% over
    result = search_rate(
        server, load_workload("chat"), start_rate_per_s=None, out_dir=tmp_path,
        level_duration_s=2.0, warmup_s=1.0, max_levels=4, precision=0.05,
        predicted_rate_per_s=predicted, edge_draws=1,
    )  # fmt: skip
    first = predicted / math.sqrt(1.05)
    assert server.rates[0] == pytest.approx(first) and not result.levels[0].met
    assert server.rates[1] == pytest.approx(first / TWIN_MISS_STEP)  # not first / 2
    assert result.best is not None and result.broken_rate_per_s is not None
    assert result.best.rate_per_s <= capacity < result.broken_rate_per_s
    assert result.best.rate_per_s >= capacity / 1.06
    # a second break steps by its own evidence: a twin 2.5 times over is still found
    far = _StopsEarly(capacity_per_s=capacity)
    found = search_rate(
        far, load_workload("chat"), start_rate_per_s=None, out_dir=tmp_path / "far",
        level_duration_s=2.0, warmup_s=1.0, max_levels=4, precision=0.05,
        predicted_rate_per_s=2.5 * capacity, edge_draws=1,
    )  # fmt: skip
    assert far.rates[2] == pytest.approx(far.rates[1] / 2.0)
    assert found.best is not None and found.best.rate_per_s <= capacity
    # with two levels there is no coming back from a far miss: the miss halves, and the
    # trial ends on a rate that held (the GPU-host rehearsal's twin was 64% off)
    short = _StopsEarly(capacity_per_s=capacity)
    held = search_rate(
        short, load_workload("chat"), start_rate_per_s=None, out_dir=tmp_path / "short",
        level_duration_s=2.0, warmup_s=1.0, max_levels=2, precision=0.05,
        predicted_rate_per_s=1.6 * capacity, edge_draws=1,
    )  # fmt: skip
    assert short.rates[1] == pytest.approx(short.rates[0] / 2.0)
    assert held.best is not None and held.best.rate_per_s <= capacity


def test_once_a_trial_was_measured_the_twins_step_is_its_error_there(tmp_path: Path) -> None:
    """The default 10-minute tune (wall-h): the twin was 8% over trial 0's goodput, and
    trial 1's first level, placed 8% over its capacity, broke; a step of 1.25 took two
    climbs to close the bracket (9.34, 7.48, 8.36, 8.84). A step of the twin's error, at
    least two precisions, closes it with one level more; before any trial was measured,
    or where the twin was far off, the step stays 1.25."""
    from tuner.search.rate_search import twin_step

    assert twin_step(None, 0.05) == TWIN_MISS_STEP
    assert twin_step(0.084, 0.05) == pytest.approx(1.05**2)  # at least one bisection's
    assert twin_step(-0.18, 0.05) == pytest.approx(1.18)
    assert twin_step(0.64, 0.05) == TWIN_MISS_STEP
    capacity = 10.0
    runs = {}
    for off in (None, 0.084):
        server = _KnownCapacity(capacity_per_s=capacity)
        result = search_rate(
            server, load_workload("chat"), start_rate_per_s=None, out_dir=tmp_path / str(off),
            level_duration_s=2.0, warmup_s=1.0, max_levels=4, precision=0.05,
            predicted_rate_per_s=1.08 * capacity, edge_draws=1, twin_off_share=off,
        )  # fmt: skip
        assert not result.levels[0].met
        assert result.best is not None and result.broken_rate_per_s is not None
        assert result.best.rate_per_s <= capacity < result.broken_rate_per_s
        assert result.broken_rate_per_s / result.best.rate_per_s <= 1.05 + 1e-9
        runs[off] = server.rates
    assert runs[0.084][1] == pytest.approx(runs[0.084][0] / 1.05**2)
    assert len(runs[0.084]) == 3 and len(runs[None]) == 4


def test_levels_past_the_bracket_end_before_the_extra_deadline(tmp_path: Path) -> None:
    """A trial's levels past its first two end before ``extra_deadline`` (the further trials
    of a short budget); the first two only before ``deadline``."""
    import time as clock

    for extra, count in ((None, 3), (clock.monotonic() - 1.0, 2)):
        server = _KnownCapacity(capacity_per_s=10.0)
        search_rate(
            server, load_workload("chat"), start_rate_per_s=None,
            out_dir=tmp_path / str(count), level_duration_s=2.0, warmup_s=1.0, max_levels=4,
            precision=0.05, predicted_rate_per_s=10.8, edge_draws=1, twin_off_share=0.084,
            extra_deadline=extra,
        )  # fmt: skip
        assert len(server.rates) == count


def test_both_sides_of_the_twins_rate_holding_climb_by_the_twins_error(tmp_path: Path) -> None:
    """Both of the twin's levels held far below the TTFT limit (climb_step: x2): the twin is
    near, so the next level climbs by its error, and the bracket closes on the capacity."""
    capacity = 10.0
    server = _KnownCapacity(capacity_per_s=capacity)
    result = search_rate(
        server, load_workload("chat"), start_rate_per_s=None, out_dir=tmp_path,
        level_duration_s=2.0, warmup_s=1.0, max_levels=4, precision=0.05,
        predicted_rate_per_s=0.85 * capacity, edge_draws=1,
    )  # fmt: skip
    assert [lv.met for lv in result.levels[:2]] == [True, True]
    assert server.rates[2] == pytest.approx(server.rates[1] * TWIN_MISS_STEP)  # not x2
    assert result.best is not None and result.broken_rate_per_s is not None
    assert result.best.rate_per_s <= capacity < result.broken_rate_per_s
    assert result.best.rate_per_s >= capacity / 1.05  # x2 then bisecting: 8.71, 15% short


class _DrawnCapacity(_KnownCapacity):
    """A server whose capacity moves with the draw of the workload (its seed): where the
    edge falls depends on the arrivals and conversations the window drew."""

    def __init__(self, capacity_by_seed: dict[int, float]) -> None:
        super().__init__(capacity_per_s=0.0)
        self.capacity_by_seed = capacity_by_seed
        self.seeds: list[int] = []

    def measure(self, workload: WorkloadSpec, schedule: list[ScheduledRequest], **kw: object) -> LoadMeasurement:  # fmt: skip
        self.seeds.append(workload.seed)
        self.capacity_per_s = self.capacity_by_seed[workload.seed]
        m = super().measure(workload, schedule, **kw)  # type: ignore[arg-type]
        return m.model_copy(update={"slo": m.slo.model_copy(update={"hold_share": 1.0 if m.slo.met else 0.0})})  # fmt: skip


def _drawn_search(server: _DrawnCapacity, tmp_path: Path, edge_draws: int) -> RateSearch:
    chat = load_workload("chat").model_copy(update={"seed": 7})
    return search_rate(
        server, chat, start_rate_per_s=8.0, out_dir=tmp_path, level_duration_s=2.0,
        warmup_s=1.0, max_levels=4, precision=0.05, edge_draws=edge_draws,
    )  # fmt: skip


def test_the_bracket_is_measured_again_with_another_draw_and_pooled(tmp_path: Path) -> None:
    """Issue 34: the goodput is the rate the declared workload holds over its draws, not
    the rate one lucky draw held. Draw 0 holds up to 10/s, draw 1 only up to 9/s."""
    seed1 = 7 + DRAW_SEED_STRIDE
    assert draw_seed(load_workload("chat").model_copy(update={"seed": 7}), 1) == seed1
    lucky = _drawn_search(_DrawnCapacity({7: 10.0, seed1: 9.0}), tmp_path / "one", 1)
    assert lucky.best is not None and lucky.best.rate_per_s > 9.0  # one draw: lucky
    server = _DrawnCapacity({7: 10.0, seed1: 9.0})
    result = _drawn_search(server, tmp_path / "two", 2)
    own = len(lucky.levels)
    assert server.rates[:own] == pytest.approx([lv.rate_per_s for lv in lucky.levels])
    edge = result.levels[own:]
    # the bracket's ends again, the held one first, with draw 1's seed
    assert [lv.draw for lv in edge[:2]] == [1, 1] and set(server.seeds[own : own + 2]) == {seed1}
    assert edge[0].rate_per_s == lucky.best.rate_per_s and not edge[0].met
    assert all(lv.seed == 7 for lv in result.levels[:own]) and edge[0].seed == seed1
    # pooled, that rate broke: the goodput is a rate both draws held, below 9/s
    assert result.best is not None and result.best.rate_per_s <= 9.0
    assert {lv.draw for lv in result.levels if lv.rate_per_s == result.best.rate_per_s} == {0, 1}
    assert result.bound is GoodputBound.BRACKETED
    assert len(edge) <= 5


def test_a_draw_that_breaks_the_lowest_rate_held_steps_down_with_both(tmp_path: Path) -> None:
    """The search's own levels held only at their lowest rate, which the other draw broke:
    the edge draws step below it, so the trial still has a goodput both draws held."""
    seed1 = 7 + DRAW_SEED_STRIDE
    server = _DrawnCapacity({7: 8.2, seed1: 7.6})
    chat = load_workload("chat").model_copy(update={"seed": 7})
    result = search_rate(
        server, chat, start_rate_per_s=None, out_dir=tmp_path, level_duration_s=2.0,
        warmup_s=1.0, max_levels=2, precision=0.05, predicted_rate_per_s=8.0 * math.sqrt(1.05),
        edge_draws=2,
    )  # fmt: skip
    assert [(round(lv.rate_per_s, 2), lv.met, lv.draw) for lv in result.levels[:3]] == [
        (8.0, True, 0), (8.4, False, 0), (8.0, False, 1)
    ]  # fmt: skip
    assert result.best is not None and result.best.rate_per_s < 7.6
    assert result.best.rate_per_s >= 7.6 / 1.1**2
    assert {lv.draw for lv in result.levels if lv.rate_per_s == result.best.rate_per_s} == {0, 1}


def test_draws_that_agree_cost_two_levels_and_keep_the_goodput(tmp_path: Path) -> None:
    one = _drawn_search(_DrawnCapacity({7: 10.0}), tmp_path / "one", 1)
    server = _DrawnCapacity({7: 10.0, 7 + DRAW_SEED_STRIDE: 10.0})
    two = _drawn_search(server, tmp_path / "two", 2)
    assert len(two.levels) == len(one.levels) + 2
    assert one.best is not None and two.best is not None
    assert two.best.rate_per_s == one.best.rate_per_s
    assert two.broken_rate_per_s == one.broken_rate_per_s
    # no edge draws without a bracket: a lower bound is measured once
    high = _drawn_search(_DrawnCapacity({7: 1000.0}), tmp_path / "high", 2)
    assert all(lv.draw == 0 for lv in high.levels)


def test_three_draws_measure_one_draw_at_both_ends_before_the_next(tmp_path: Path) -> None:
    """With ``--edge-draws 3``, draw 1 at the bracket's two ends, then draw 2: a deadline
    that cuts the draws short leaves each measured draw at both ends (measured low end
    first, draw 1 then draw 2 there, a cut after two levels left one end with three draws
    and the other with one: no between-draw interval)."""
    seeds = {7: 10.0, 7 + DRAW_SEED_STRIDE: 10.0, 7 + 2 * DRAW_SEED_STRIDE: 10.0}
    one = _drawn_search(_DrawnCapacity({7: 10.0}), tmp_path / "one", 1)
    three = _drawn_search(_DrawnCapacity(seeds), tmp_path / "three", 3)
    assert one.best is not None and one.broken_rate_per_s is not None
    low, high = one.best.rate_per_s, one.broken_rate_per_s
    edge = three.levels[len(one.levels) :]
    assert [(lv.rate_per_s, lv.draw) for lv in edge] == [(low, 1), (high, 1), (low, 2), (high, 2)]
    assert three.best is not None and three.best.rate_per_s == low


def _trial_records(server: _DrawnCapacity, tmp_path: Path) -> list[LevelRecord]:
    """A trial's levels as its evaluation records them: its own draw (0), no edge draws."""
    trial = _drawn_search(server, tmp_path, 1)
    return [_summary(level, 1.0) for level in trial.levels]


def _pooled_search(
    server: _DrawnCapacity, records: list[LevelRecord], held: float, tmp_path: Path
) -> RateSearch:
    """A confirmation's search that pools ``records`` (its trial's levels, held at ``held``)."""
    chat = load_workload("chat").model_copy(update={"seed": 7})
    return search_rate(
        server, chat, start_rate_per_s=held, out_dir=tmp_path / "confirm", level_duration_s=2.0,
        warmup_s=1.0, max_levels=3, precision=0.05, edge_draws=2, prior=records,
    )  # fmt: skip


def test_a_confirmation_pools_its_trials_levels_with_another_draw(tmp_path: Path) -> None:
    """The recommendation's confirmation measures the other draw at its trial's bracket's
    ends on a launch of its own (two levels, not a bracket of its own and then its edge
    draws), and states what the two draws pooled say."""
    seed1 = 7 + DRAW_SEED_STRIDE
    records = _trial_records(_DrawnCapacity({7: 10.0}), tmp_path / "trial")
    held = max(r.rate_per_s for r in records if r.met)
    broke = min(r.rate_per_s for r in records if not r.met and r.rate_per_s > held)
    # the same settings, measured in one search with its edge draws: the same verdicts
    both = _drawn_search(_DrawnCapacity({7: 10.0, seed1: 10.0}), tmp_path / "both", 2)
    server = _DrawnCapacity({7: 10.0, seed1: 10.0})
    result = _pooled_search(server, records, held, tmp_path)
    assert server.rates == [held, broke] and set(server.seeds) == {seed1}
    own = result.levels[len(records) :]
    assert [(lv.rate_per_s, lv.draw, lv.index) for lv in own] == [(held, 1, 0), (broke, 1, 1)]
    assert [Path(lv.measurement.out_dir).name for lv in own] == ["level-0", "level-1"]
    assert result.best is not None and result.best.rate_per_s == held
    assert result.best is own[0]  # of a rate both draws held, the confirmation's own level
    assert result.broken_rate_per_s == broke and result.bound is GoodputBound.BRACKETED
    assert both.best is not None and both.best.rate_per_s == held
    assert capacity_interval([_summary(lv, 1.0) for lv in result.levels]) == capacity_interval(
        [_summary(lv, 1.0) for lv in both.levels]
    )


def test_a_pooled_confirmation_whose_draw_breaks_the_trials_rate_measures_below(
    tmp_path: Path,
) -> None:
    """Where the confirmation's draw breaks the rate its trial held (the trial's hold was
    its draw's luck), the bracket moves down and the rates below are measured with both
    draws on the confirmation's launch: its goodput is a rate both held."""
    seed1 = 7 + DRAW_SEED_STRIDE
    records = _trial_records(_DrawnCapacity({7: 10.0}), tmp_path / "trial")
    held = max(r.rate_per_s for r in records if r.met)
    server = _DrawnCapacity({7: 10.0, seed1: 9.0})
    result = _pooled_search(server, records, held, tmp_path)
    own = result.levels[len(records) :]
    assert (own[0].rate_per_s, own[0].draw, own[0].met) == (held, 1, False)
    assert result.best is not None and result.best.rate_per_s <= 9.0
    assert {lv.draw for lv in own if lv.rate_per_s == result.best.rate_per_s} == {0, 1}
    assert len(own) <= 6


def test_a_level_from_its_record_reads_as_it_was_measured(tmp_path: Path) -> None:
    """A trial's level read back from its record (``RateLevel.of_record``) pools as the
    level did: its rate, draw, verdict, P(hold) and whether it ended clean."""
    server = _DrawnCapacity({7: 10.0})
    trial = _drawn_search(server, tmp_path, 1)
    for index, level in enumerate(trial.levels):
        again = RateLevel.of_record(_summary(level, 1.0), index)
        assert (again.rate_per_s, again.draw, again.met) == (level.rate_per_s, 0, level.met)
        assert again.hold == level.hold
        assert ends_clean(again.measurement) == ends_clean(level.measurement)
    assert pooled_verdicts(
        [RateLevel.of_record(_summary(lv, 1.0), i) for i, lv in enumerate(trial.levels)]
    ) == pooled_verdicts(list(trial.levels))


def test_the_climb_follows_the_kv_usage_projected_a_conversation_ahead(tmp_path: Path) -> None:
    spec = load_workload("chat")
    m = _measurement(tmp_path, 1.0, met=True, ttft_p99_ms=21.0)
    assert climb_step(spec, m, growth=1.15) == pytest.approx(2.0)

    def trend(signal: Signal, projected: float | None = None) -> SignalTrend:
        return SignalTrend(signal=signal, verdict=BacklogVerdict.STEADY, points=40, span_s=20.0,
                           margin=0.1, projected=projected)  # fmt: skip

    backlog = BacklogCheck(
        verdict=BacklogVerdict.STEADY, window_s=20.0, settle_s=2.0,
        waiting=trend(Signal.WAITING), kv_usage=trend(Signal.KV_USAGE, 0.8),
        ttft=trend(Signal.TTFT),
    )  # fmt: skip
    filling = m.model_copy(update={"backlog": backlog})
    assert climb_step(spec, filling, growth=1.15) == pytest.approx(1.25)


@pytest.mark.parametrize(
    ("share", "met"), [(None, True), (1.0, True), (HOLD_MIN, True), (0.89, False), (0.5, False)]
)
def test_a_window_that_met_the_slo_holds_only_when_its_resamples_do(
    tmp_path: Path, share: float | None, met: bool
) -> None:
    m = _measurement(tmp_path, 1.0, met=True, ttft_p99_ms=1990.0)
    m = m.model_copy(update={"slo": m.slo.model_copy(update={"hold_share": share})})
    assert level_met(m) is met
    miss = hold_rule_miss(m)
    assert (miss is None) is met
    if miss is not None:
        assert miss == (
            f"P(hold) {share:.2f} (the SLO held in {share:.0%} of the window's resamples); "
            "the rule: at least 0.90"
        )
    # a window that broke the SLO is broken whatever its resamples say, and not by the rule
    broke = _measurement(tmp_path, 1.0, met=False, ttft_p99_ms=2100.0)
    broke = broke.model_copy(update={"slo": broke.slo.model_copy(update={"hold_share": 0.95})})
    assert not level_met(broke) and hold_rule_miss(broke) is None


def test_no_level_met_is_no_bound(tmp_path: Path) -> None:
    server = _KnownCapacity(capacity_per_s=0.01)
    result = _search(server, tmp_path, start=8.0, max_levels=3, precision=0.1)
    assert server.rates == pytest.approx([8.0, 4.0, 2.0])
    assert result.best is None and result.goodput == 0.0
    assert result.bound is GoodputBound.NONE


@pytest.mark.parametrize(
    ("ttft_p99_ms", "server", "step"),
    [
        (21.0, None, 2.0),  # far below the limit: double
        (500.0, None, 2.0),  # a quarter of it: still double
        (1000.0, None, math.sqrt(2.0)),  # half of it
        (1800.0, None, 1.15),  # close: the smallest step, growth
        (21.0, ServerCounters.model_construct(num_preemptions=0, max_kv_cache_usage=0.8), 1.25),
        (21.0, ServerCounters.model_construct(num_preemptions=3, max_kv_cache_usage=0.3), 1.15),
    ],
)
def test_the_climb_follows_the_headroom_the_level_left(
    tmp_path: Path, ttft_p99_ms: float, server: ServerCounters | None, step: float
) -> None:
    spec = load_workload("chat")  # ttft p99 2000 ms, tpot p99 100 ms (here 20 ms)
    m = _measurement(tmp_path, 1.0, met=True, ttft_p99_ms=ttft_p99_ms, server=server)
    assert climb_step(spec, m, growth=1.15) == pytest.approx(step)
    assert climb_step(spec, m, growth=3.0) == pytest.approx(3.0)  # growth is the least step


@pytest.mark.parametrize(
    ("ttft_p99_ms", "failed", "stopped_early", "step"),
    [
        (10_000.0, 0, False, 2.0),  # five times the limit: halve
        (4500.0, 0, False, 1.5),  # 2.25 times
        (2400.0, 0, False, 1.15),  # barely missed: the smallest step, growth
        (2400.0, 1, False, 1.15),  # one request of 100 failed: still barely
        (900.0, 30, False, 1 / 0.7),  # 30 of 100 failed: it serves about 70% of the rate
        (2400.0, 0, True, 2.0),  # stopped early: how far it would have missed is unknown
    ],
)
def test_the_descent_follows_how_far_the_level_missed(
    tmp_path: Path, ttft_p99_ms: float, failed: int, stopped_early: bool, step: float
) -> None:
    spec = load_workload("chat")
    m = _measurement(tmp_path, 1.0, met=False, ttft_p99_ms=ttft_p99_ms)
    load = m.load.model_copy(update={"num_errors": failed})
    m = m.model_copy(update={"stopped_early": stopped_early, "load": load})
    assert descent_step(spec, m, growth=1.15) == pytest.approx(step)


def test_repeats_with_a_lower_bound_are_a_lower_bound() -> None:
    lower, bracketed, none = GoodputBound.LOWER_BOUND, GoodputBound.BRACKETED, GoodputBound.NONE
    assert combined_bound([bracketed, lower]) is lower
    assert combined_bound([bracketed, none]) is bracketed
    assert combined_bound([none]) is none


def test_goodput_text_states_every_unit() -> None:
    chat = Goodput(
        arrival_rate_per_s=12.0, unit=GoodputUnit.CONVERSATIONS_PER_S, requests_per_s=41.5,
        output_tokens_per_s=9800.0, bound=GoodputBound.BRACKETED,
    )  # fmt: skip
    assert chat.text() == "12.00 conversations/s (41.50 req/s, 9,800 output tok/s)"
    single = Goodput(
        arrival_rate_per_s=41.5, requests_per_s=41.5, output_tokens_per_s=9800.0,
        bound=GoodputBound.LOWER_BOUND,
    )  # fmt: skip
    assert single.text() == "at least 41.50 req/s (9,800 output tok/s), no breaking rate found"
    mean = Goodput.mean([chat, chat.model_copy(update={"arrival_rate_per_s": 10.0})])
    assert mean.arrival_rate_per_s == pytest.approx(11.0) and mean.unit is chat.unit
    assert Goodput.mean([chat, single]).bound is GoodputBound.LOWER_BOUND


def test_goodput_unit_is_conversations_only_for_a_workload_with_sessions() -> None:
    chat = load_workload("chat")
    assert chat.sessions is not None
    assert GoodputUnit.of(chat) is GoodputUnit.CONVERSATIONS_PER_S
    single = chat.model_copy(update={"sessions": None})
    assert GoodputUnit.of(single) is GoodputUnit.REQUESTS_PER_S
    assert GoodputUnit.of(load_workload("code")) is GoodputUnit.REQUESTS_PER_S


def test_a_chat_search_states_goodput_in_conversations_per_s(tmp_path: Path) -> None:
    """Issue 16: a chat level at 2 conversations/s offers about 3.5 requests per conversation;
    its goodput is 2 conversations/s, 7 req/s, and the output tokens/s of those requests
    (issue 34: the declared workload's at that rate, 297 a request, not what its window
    counted, 100 a request here)."""
    chat = load_workload("chat")

    def level(index: int, sessions_per_s: float, *, met: bool) -> RateLevel:
        m = _measurement(tmp_path / f"level-{index}", 3.5 * sessions_per_s, met=met,
                         ttft_p99_ms=100.0 if met else 5000.0)  # fmt: skip
        return RateLevel(index=index, rate_per_s=sessions_per_s, met=met, measurement=m)

    held, broke = level(0, 2.0, met=True), level(1, 4.0, met=False)
    search = RateSearch(levels=(held, broke), best=held, broken_rate_per_s=4.0, died=False)
    goodput = search.goodput_of(chat)
    assert goodput.unit is GoodputUnit.CONVERSATIONS_PER_S
    assert goodput.arrival_rate_per_s == pytest.approx(2.0)
    assert goodput.requests_per_s == pytest.approx(7.0) == search.goodput
    assert goodput.output_tokens_per_s == pytest.approx(7.0 * 296.93, rel=1e-4)
    assert search.throughput == pytest.approx(700.0)  # the window's count
    assert goodput.bound is GoodputBound.BRACKETED
    assert goodput.text() == "2.00 conversations/s (7.00 req/s, 2,078 output tok/s)"
    # The same levels of a single-turn workload: the arrival rate is the offered req/s.
    single = search.goodput_of(chat.model_copy(update={"sessions": None}))
    assert single.unit is GoodputUnit.REQUESTS_PER_S
    assert single.arrival_rate_per_s == pytest.approx(7.0) == single.requests_per_s
    # No level held: zero in the workload's unit.
    none = RateSearch(levels=(broke,), best=None, broken_rate_per_s=4.0, died=False)
    assert none.goodput_of(chat) == Goodput(unit=GoodputUnit.CONVERSATIONS_PER_S)


def test_a_trace_replays_goodput_is_its_mean_rate_not_its_busiest_stretchs(tmp_path: Path) -> None:
    """A trace replay measured on its busiest 600 s (offering 1.25 req/s there) at a mean
    rate of 0.38 req/s: its goodput is 0.38 req/s, and output tokens/s over the pass (its
    rows' mean output, 27.6 tokens a request)."""
    code = load_workload("code")
    m = _measurement(tmp_path / "level-0", 1.25, met=True, ttft_p99_ms=600.0)
    opening = WindowOpening(
        warmup_min_s=3.0, warmup_max_s=13.0, opened_at_s=3.0, steady_at_open=True, test="t",
        window_s=600.0, needed_requests=200, trace_pass_s=2632.0,
    )  # fmt: skip
    held = RateLevel(index=0, rate_per_s=0.38, met=True,
                 measurement=m.model_copy(update={"window": opening}))  # fmt: skip
    search = RateSearch(levels=(held,), best=held, broken_rate_per_s=None, died=False)
    goodput = search.goodput_of(code)
    assert goodput.arrival_rate_per_s == pytest.approx(0.38) == search.goodput
    assert goodput.output_tokens_per_s == pytest.approx(0.38 * 27.621)
    assert search.throughput == pytest.approx(100 * 1.25 * 0.38 / 1.25)  # the stretch's count
    # A window that held a whole pass offered the mean rate: what it offered is the goodput.
    whole = opening.model_copy(update={"trace_pass_s": 600.0})
    held = held.model_copy(update={"measurement": m.model_copy(update={"window": whole})})
    search = RateSearch(levels=(held,), best=held, broken_rate_per_s=None, died=False)
    assert search.goodput == pytest.approx(1.25)


class _AnswersInMs(_KnownCapacity):
    """``_KnownCapacity`` whose levels measure a mean TTFT of ``rate`` x 10 ms and a mean
    TPOT of ``rate`` ms, and which keeps the answer times each level was planned with."""

    def __init__(self, capacity_per_s: float) -> None:
        super().__init__(capacity_per_s)
        self.planned: list[tuple[float, float]] = []

    def measure(
        self, workload: WorkloadSpec, schedule: list[ScheduledRequest], **kw: object
    ) -> LoadMeasurement:  # type: ignore[override]
        assert workload.sessions is not None and workload.mean_rate_per_s is not None
        self.planned.append((workload.sessions.expected_ttft_s, workload.sessions.expected_tpot_s))
        m = super().measure(workload, schedule, **kw)  # type: ignore[arg-type]
        rate = workload.mean_rate_per_s
        load = m.load.model_copy(
            update={
                "ttft_ms": m.load.ttft_ms.model_copy(update={"mean": 10.0 * rate}),
                "tpot_ms": m.load.tpot_ms.model_copy(update={"mean": rate}),
            }
        )
        return m.model_copy(update={"load": load})


def test_each_level_opens_on_the_population_of_the_nearest_level_that_held(
    tmp_path: Path,
) -> None:
    """Issue 16: the conversations under way when a level opens are as many as the server
    measured holds (its answer times at the nearest rate that held); until one has held,
    the twin's answer times; never a broken level's backlog latencies."""
    server = _AnswersInMs(capacity_per_s=10.5)
    twin = AnswerTimes(ttft_s=0.2, tpot_s=0.02)
    result = search_rate(
        server, load_workload("chat"), start_rate_per_s=None, out_dir=tmp_path,
        level_duration_s=2.0, max_levels=4, precision=0.05, predicted_rate_per_s=12.0,
        predicted_answer_times=twin,
    )  # fmt: skip
    rates = [lv.rate_per_s for lv in result.levels]
    met = [lv.met for lv in result.levels]
    # 12/sqrt(1.05) breaks (capacity 10.5); the descent's levels hold or break in turn.
    assert met[0] is False and server.planned[0] == (0.2, 0.02)
    for index in range(1, len(rates)):
        held = [(r, ok) for r, ok in zip(rates[:index], met[:index], strict=True) if ok]
        if not held:
            assert server.planned[index] == (0.2, 0.02)
            continue
        nearest = min(held, key=lambda pair: abs(math.log(pair[0] / rates[index])))[0]
        assert server.planned[index] == pytest.approx((nearest * 0.01, nearest * 0.001))
    assert any(met) and len(rates) >= 3
    mix = TurnMix.model_validate_json((tmp_path / "level-0" / TURN_MIX_FILE).read_text())
    assert (mix.planned_ttft_s, mix.planned_tpot_s) == (0.2, 0.02)


def test_the_next_levels_length_leaves_out_attempts_set_aside(tmp_path: Path) -> None:
    """The default 10-minute tune (wall-m): trial 1's first level lagged at 4x (the
    simulated server's steps 54 ms late), was set aside after 23 s and measured again at
    2x, 96 s in all; its next level, at 2x from the start, takes about 73. With 94 s left
    the search measured no second level, and the trial ended on one that broke."""
    from tuner.search.rate_search import _ends_in_time
    from tuner.serving.client_lag import (
        ClientAttempt,
        ClientChange,
        ClientRemedy,
        ClientSetup,
        LevelClient,
    )
    from workloads.client_lag import ClientBounds, ClientLag, ClientVerdict

    lag = ClientLag(verdict=ClientVerdict.KEPT_UP, reason=None, bounds=ClientBounds(), processes=())
    fast, slow = ClientSetup(processes=1, time_scale=0.25), ClientSetup(processes=1, time_scale=0.5)
    aside = ClientAttempt(
        dir="level-0/lagged-0", setup=fast, lag=lag, wall_s=23.0,
        then=ClientChange(remedy=ClientRemedy.SLOWER_CLOCK, before=fast, after=slow),
    )  # fmt: skip
    m = _measurement(tmp_path, 9.34, met=False, ttft_p99_ms=9000.0)
    level = RateLevel(
        index=0, rate_per_s=9.34, met=False, wall_s=96.0,
        measurement=m.model_copy(update={"client": LevelClient(lag=lag, setup=slow, attempts=(aside,))}),
    )  # fmt: skip
    assert _ends_in_time([level], time.monotonic() + 94.0)
    assert not _ends_in_time([level], time.monotonic() + 70.0)
    bare = level.model_copy(update={"measurement": m})  # no attempt set aside: 96 s
    assert not _ends_in_time([bare], time.monotonic() + 94.0)

"""The report shows that every measured rate was in steady state, and says what was not recorded.

The first tests work on a copy of the session's small tune (``tuned_run``) turned into a
chat run: the chat workload in tune.json and, in one level's directory, the evidence a
chat level leaves (window.json, backlog.json, turn_mix.json, prompt_lengths.json); the
other levels keep only what the small tune wrote. The last ones read hand-written level
files, without a tune.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
from html import unescape
from pathlib import Path

import pytest

from reports.charts import level_timeline
from reports.html import (
    _backlog_part,
    _p,
    _prompt_part,
    _turn_mix_part,
    _window_part,
    write_report,
)
from tuner.run.evaluation import Evaluation, LevelRecord
from tuner.run.layout import PROMPT_LENGTHS_FILE
from tuner.run.levels import NOT_RECORDED, level_evidence, rebase
from tuner.run.prompt_lengths import PromptLengthMix
from tuner.search.level_evidence import write_level_evidence
from tuner.serving.backlog import BacklogCheck, BacklogVerdict, Signal, SignalTrend
from workloads.build import build_schedule
from workloads.schedule import write_schedule
from workloads.spec import SessionStart, WarmupSpec, WorkloadSpec, load_workload
from workloads.stationary import TURN_MIX_FILE, TurnMix

RATE_PER_S, WINDOW_S = 30.0, 8.0

WINDOW = {
    "warmup_min_s": 5.0,
    "warmup_max_s": 40.0,
    "opened_at_s": 12.5,
    "steady_at_open": True,
    "test": "waiting and KV usage flat over the last 6 s",
    "signals": [
        {"signal": "waiting", "verdict": "steady", "growth": 0.2, "span_s": 6.0},
        {"signal": "kv_usage", "verdict": "steady", "growth": 0.01, "span_s": 6.0},
        {"signal": "running", "verdict": "steady"},
    ],
    "window_s": WINDOW_S,
    "requests": 850,
    "needed_requests": 200,
    "window_min_s": 4.0,
    "window_max_s": 600.0,
    "closed": "held",
    "correlation_s": 0.4,
    "correlations_wanted": 20.0,
    "slo_share": 0.5,
    "band": 0.28,
    "some_later_field": [1, 2],  # what a newer harness may add is ignored
}


def _chat_level() -> WorkloadSpec:
    spec = load_workload("chat").with_rate(RATE_PER_S).with_duration(WINDOW_S)
    assert spec.sessions is not None
    sessions = spec.sessions.model_copy(update={"start": SessionStart.STATIONARY})
    return spec.model_copy(update={"warmup": WarmupSpec(), "sessions": sessions})


def _trend(signal: Signal, verdict: BacklogVerdict, growth: float, margin: float) -> SignalTrend:
    return SignalTrend(
        signal=signal, verdict=verdict, points=30, span_s=WINDOW_S, slope_per_s=growth / WINDOW_S,
        t_stat=1.0, growth=growth, margin=margin, thirds=(1.0, 1.0, 1.0),
    )  # fmt: skip


def _backlog(verdict: BacklogVerdict = BacklogVerdict.STEADY) -> BacklogCheck:
    return BacklogCheck(
        verdict=verdict, window_s=WINDOW_S, settle_s=1.0,
        waiting=_trend(Signal.WAITING, verdict, 40.0 if verdict.value == "growing" else 0.5, 2.0),
        kv_usage=_trend(Signal.KV_USAGE, BacklogVerdict.STEADY, 0.02, 0.1),
        ttft=_trend(Signal.TTFT, BacklogVerdict.STEADY, 30.0, 500.0),
    )  # fmt: skip


def _write_chat_evidence(level_dir: Path) -> None:
    spec = _chat_level()
    write_level_evidence(level_dir, build_schedule(spec), spec)
    (level_dir / "window.json").write_text(json.dumps(WINDOW), encoding="utf-8")
    (level_dir / "backlog.json").write_text(_backlog().model_dump_json(), encoding="utf-8")


def _steady(text: str) -> str:
    return text[text.index('<section class="card" id="steady">') : text.index('id="how"')]


def _level_block(text: str, trial: int, index: int) -> str:
    """One level's block of the steady-state section, as HTML."""
    start = text.index(f'id="steady-{trial}-{index}"')
    ends = [text.find(mark, start + 1) for mark in ('<div class="level"', "</section>")]
    return text[start : min(e for e in ends if e != -1)]


def _plain(html_text: str) -> str:
    """The text a reader sees (charts left out), whitespace folded."""
    text = re.sub(r'<script type="application/json".*?</script>', " ", html_text, flags=re.S)
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", text)))


@pytest.fixture(scope="module")
def chat_run(tuned_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A copy of the small tune restated as a chat run, the first trial's first level
    carrying a chat level's evidence, every other level stripped of it."""
    run = tmp_path_factory.mktemp("evidence") / "run"
    shutil.copytree(tuned_run, run, ignore=shutil.ignore_patterns("vllm-cache", "report.html"))
    tune = json.loads((run / "tune.json").read_text())
    tune["workload"] = load_workload("chat").model_dump(mode="json")
    (run / "tune.json").write_text(json.dumps(tune))
    numbers = []
    for path in sorted(run.glob("trials/*/evaluation.json")):
        doc = json.loads(path.read_text())
        if not doc.get("levels"):
            continue
        numbers.append(int(path.parent.name))
        for level in doc["levels"]:  # no verdict kept in the evaluation either
            level["backlog"] = None
            level_dir = rebase(level["dir"], path.parent)
            for name in ("window.json", "backlog.json", TURN_MIX_FILE, PROMPT_LENGTHS_FILE):
                (level_dir / name).unlink(missing_ok=True)
        path.write_text(json.dumps(doc))
    assert numbers, "the small tune measured no level"
    first = json.loads((run / "trials" / f"{numbers[0]:03d}" / "evaluation.json").read_text())
    _write_chat_evidence(rebase(first["levels"][0]["dir"], run / "trials" / f"{numbers[0]:03d}"))
    return run, numbers[0]


def test_a_chat_level_shows_its_window_backlog_turn_mix_and_prompt_lengths(
    chat_run: tuple[Path, int],
) -> None:
    run, trial = chat_run
    text = write_report(run).read_text(encoding="utf-8")
    assert 'href="#steady"' in text
    block = _plain(_level_block(text, trial, 0))
    level_dir = rebase(
        Evaluation.model_validate_json(
            (run / "trials" / f"{trial:03d}" / "evaluation.json").read_text()
        )
        .levels[0]
        .dir,
        run / "trials" / f"{trial:03d}",
    )
    mix = TurnMix.model_validate_json((level_dir / TURN_MIX_FILE).read_text())
    lengths = PromptLengthMix.model_validate_json((level_dir / PROMPT_LENGTHS_FILE).read_text())
    assert "opened 12.5 s into the level, steady at open; measured 8 s, 850 requests" in block
    assert "test: waiting and KV usage flat over the last 6 s" in block
    assert "Backlog guard steady: nothing grows through the window over 8 s" in block
    assert "waiting +0 over 8 s: steady" in block
    assert f"chi-square p = {_p(mix.p_value)}" in block
    assert mix.p_value is not None and mix.p_value >= 0.01
    assert "matches the stationary mix" in block
    assert f"Kolmogorov-Smirnov p = {_p(lengths.p_value)}" in block
    assert "matches the stationary lengths" in block
    assert lengths.measured is not None and f"p50 {lengths.measured.p50:,.0f} tokens" in block
    assert f'id="chart-level-{trial}-0"' in text  # the level's /metrics over time


def test_levels_without_evidence_say_not_recorded(chat_run: tuple[Path, int]) -> None:
    run, trial = chat_run
    text = write_report(run).read_text(encoding="utf-8")
    ev = Evaluation.model_validate_json(
        (run / "trials" / f"{trial:03d}" / "evaluation.json").read_text()
    )
    blocks = [
        _plain(_level_block(text, t, i))
        for t in (int(p.parent.name) for p in run.glob("trials/*/evaluation.json"))
        for i in range(len(json.loads((run / "trials" / f"{t:03d}" / "evaluation.json").read_text())["levels"]))
        if (t, i) != (trial, 0)
    ]  # fmt: skip
    assert blocks or len(ev.levels) == 1
    for block in blocks:
        for label in ("Window opening", "Backlog guard", "Turn mix", "Prompt lengths"):
            assert f"{label} {NOT_RECORDED}" in block, (label, block[:400])
    steady = _plain(_steady(text))
    assert "issue" not in steady.lower()


def test_a_run_from_before_the_evidence_still_reports(
    chat_run: tuple[Path, int], tmp_path: Path
) -> None:
    run, _ = chat_run
    old = tmp_path / "run"
    shutil.copytree(run, old, ignore=shutil.ignore_patterns("report.html"))
    for path in old.glob("trials/*/level-*/*"):
        if path.name in ("metrics.csv", "schedule.jsonl", "requests.jsonl") or path.name.startswith(
            "records"
        ):
            path.unlink()
    text = write_report(old).read_text(encoding="utf-8")
    steady = _plain(_steady(text))
    assert "/metrics over the level: not recorded" in steady
    assert "Prompt lengths not recorded" in steady


# --- the pieces, from hand-written level files ------------------------------------------


def _evaluation(level_dir: Path, **level: object) -> Evaluation:
    summary = LevelRecord.model_construct(
        rate_per_s=RATE_PER_S, met=True, stopped_early=False, dir=str(level_dir), backlog=None,
        stopped_by_backlog=False, **level,
    )  # fmt: skip
    return Evaluation.model_construct(levels=[summary])


def _write_level_files(level_dir: Path, *, start_unix_s: float) -> None:
    level_dir.mkdir(parents=True)
    spec = _chat_level()
    schedule = build_schedule(spec)
    write_schedule(level_dir / "schedule.jsonl", schedule)
    first = schedule[0]  # the earliest request follows no answer: sent at its offset
    record = {"request_id": first.request_id, "scheduled_s": start_unix_s + first.send_s}
    (level_dir / "requests.jsonl").write_text(json.dumps(record) + "\n", encoding="utf-8")
    with (level_dir / "metrics.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(("unix_s", "kv_cache_usage", "running", "waiting", "preemptions_total"))
        for i in range(80):
            writer.writerow((start_unix_s + 0.25 * i, 0.4, 20, 1, 0))


def test_level_files_are_read_and_drawn(tmp_path: Path) -> None:
    level_dir = tmp_path / "trials" / "000" / "level-0"
    _write_level_files(level_dir, start_unix_s=1_700_000_000.0)
    _write_chat_evidence(level_dir)
    (level_evidence_,) = level_evidence(level_dir.parent, _evaluation(level_dir))
    assert level_evidence_.start_unix_s == pytest.approx(1_700_000_000.0)
    window = level_evidence_.window.value
    assert window is not None and window.opened_at_s == 12.5 and len(window.signals) == 3
    window = _window_part(level_evidence_)
    assert window.tone == "good"
    (length,) = [d for d in window.details if d.startswith("length:")]
    assert "held on past its shortest (between 4 s and 600 s)" in length
    assert "correlation time of 0.4 s: the window holds 20 of 20 wanted" in length
    assert "worst SLO percentile was 50 % of its limit" in length
    assert _backlog_part(level_evidence_).text.startswith("steady")
    assert _turn_mix_part(level_evidence_, sessions=True).tone == "good"
    assert _prompt_part(level_evidence_).tone == "good"
    chart = level_timeline("level-0-0", level_evidence_, time_scale=1.0)
    assert chart.figure is not None and chart.note is None
    names = {t.name for t in chart.figure.data}
    assert names == {"KV-cache usage (%)", "requests running", "requests waiting"}
    (shape,) = chart.figure.layout.shapes  # the measured window, on the level's own clock
    assert (shape.x0, shape.x1) == (12.5, 12.5 + WINDOW_S)
    assert chart.figure.data[0].x[0] == pytest.approx(0.0)


def test_a_growing_backlog_and_an_empty_start_read_as_not_steady(tmp_path: Path) -> None:
    level_dir = tmp_path / "level-0"
    level_dir.mkdir()
    spec = _chat_level()
    assert spec.sessions is not None
    empty = spec.model_copy(
        update={"sessions": spec.sessions.model_copy(update={"start": SessionStart.EMPTY})}
    )
    write_level_evidence(level_dir, build_schedule(empty), empty)
    (level_dir / "backlog.json").write_text(
        _backlog(BacklogVerdict.GROWING).model_dump_json(), encoding="utf-8"
    )
    (level_dir / "window.json").write_text(
        json.dumps({**WINDOW, "steady_at_open": False}), encoding="utf-8"
    )
    (level,) = level_evidence(tmp_path, _evaluation(level_dir))
    window = _window_part(level)
    assert window.tone == "bad" and "the longest warm-up (40 s) was spent" in window.text
    backlog = _backlog_part(level)
    assert backlog.tone == "bad" and "waiting +40 over 8 s" in backlog.text
    assert _turn_mix_part(level, sessions=True).tone == "bad"
    prompts = _prompt_part(level)
    assert prompts.tone == "bad" and "differs from the stationary lengths" in prompts.text


def test_unreadable_files_are_said_and_nothing_breaks(tmp_path: Path) -> None:
    level_dir = tmp_path / "level-0"
    level_dir.mkdir()
    (level_dir / "window.json").write_text("{not json", encoding="utf-8")
    (level_dir / "backlog.json").write_text('{"verdict": "maybe"}', encoding="utf-8")
    (level,) = level_evidence(tmp_path, _evaluation(level_dir))
    assert level.window.value is None and "window.json is not readable here" in str(
        level.window.note
    )
    assert "backlog.json is not readable here" in _backlog_part(level).text
    assert _turn_mix_part(level, sessions=False).text.startswith("single-turn workload")
    assert _turn_mix_part(level, sessions=True).text == NOT_RECORDED
    assert _prompt_part(level).tone == "missing"
    chart = level_timeline("k", level, time_scale=1.0)
    assert chart.figure is None and chart.note == f"/metrics over the level: {NOT_RECORDED}"


def test_a_level_carried_on_from_the_one_before_says_so(tmp_path: Path) -> None:
    """A chained level's window.json records the share of conversations it added; the
    report says it carried on without draining the server (an unchained one does not)."""
    level_dir = tmp_path / "trials" / "000" / "level-0"
    _write_level_files(level_dir, start_unix_s=1_700_000_000.0)
    (level,) = level_evidence(level_dir.parent, _evaluation(level_dir))
    assert "carried on" not in _window_part(level).text
    (level_dir / "window.json").write_text(
        json.dumps({**WINDOW, "carried_on": 0.25}), encoding="utf-8"
    )
    (level,) = level_evidence(level_dir.parent, _evaluation(level_dir))
    text = _window_part(level).text
    assert text.startswith("carried on from the rate before without draining the server")
    assert "25 % of this rate's were added" in text


def test_a_trace_replays_window_says_what_of_a_pass_it_held(tmp_path: Path) -> None:
    """A trace replay's window.json records the trace's pass; the report says whether the
    window held all of it or its busiest stretch (and says nothing of a pass otherwise)."""
    level_dir = tmp_path / "trials" / "000" / "level-0"
    _write_level_files(level_dir, start_unix_s=1_700_000_000.0)
    (level,) = level_evidence(level_dir.parent, _evaluation(level_dir))
    assert "pass" not in _window_part(level).text
    for pass_s, said in ((2500.0, "the busiest"), (WINDOW["window_s"], "one whole pass")):
        (level_dir / "window.json").write_text(
            json.dumps({**WINDOW, "trace_pass_s": pass_s}), encoding="utf-8"
        )
        (level,) = level_evidence(level_dir.parent, _evaluation(level_dir))
        assert said in _window_part(level).text

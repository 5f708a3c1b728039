"""A level's early stop in its warm-up (``tuner.serving.live_server.StopRule`` with the level's
window): a start's surge that drains does not stop a level; a queue that keeps backing up
does; once the window opens, only its requests count."""

from __future__ import annotations

from pathlib import Path

from tuner.serving.live_server import StopRule, WindowRule
from tuner.serving.prometheus_scrape import MetricsSample
from tuner.serving.window import LevelPlan
from workloads.schedule import RequestRecord

START_S = 1000.0
PLAN = LevelPlan(
    warmup_min_s=4.0, warmup_max_s=20.0, window_s=30.0, needed_requests=200, requests_per_s=10.0
)


def queue(*waiting: float, every_s: float = 0.25) -> list[MetricsSample]:
    return [
        MetricsSample(START_S + i * every_s, 0.3, running=50.0, waiting=w, preemptions_total=0.0)
        for i, w in enumerate(waiting)
    ]


class Level:
    """A level's window rule, bound, with a /metrics timeline the test sets."""

    def __init__(self, out_dir: Path) -> None:
        self.samples: list[MetricsSample] = []
        rule = WindowRule(
            PLAN, time_scale=1.0, drain_s=2.0, ttft_limit_ms=2000.0, samples=lambda: self.samples
        )
        self.window = rule.bind(out_dir, start_unix_s=START_S)
        self.out_dir = out_dir
        self.written = 0

    def record(self, n: int, *, ttft_s: float, at_s: float) -> None:
        """``n`` requests intended at ``at_s`` into the level, each ``ttft_s`` to its first token."""
        with (self.out_dir / "records.jsonl.w0").open("a", encoding="utf-8") as f:
            for i in range(self.written, self.written + n):
                sent = START_S + at_s
                record = RequestRecord(
                    request_id=f"r{i}", scheduled_s=sent, sent_s=sent, prompt_tokens=10,
                    output_tokens=5, status=200, first_token_s=sent + ttft_s,
                    end_s=sent + ttft_s + 0.5,
                )  # fmt: skip
                f.write(record.to_json() + "\n")
        self.written += n


def check(rule: object) -> bool:
    rule._last_check = 0.0  # type: ignore[attr-defined]  # the rule reads once a second
    return bool(rule())  # type: ignore[operator]


def test_the_queue_backs_up_while_it_stays_near_its_peak(tmp_path: Path) -> None:
    level = Level(tmp_path)
    level.samples = queue(0, 10, 40, 58, 30, 5, 0, 0, 0)  # a start's surge, drained
    assert not level.window.queue_backing_up()
    level.samples = queue(0, 10, 40, 58, 50, 45, 40)  # still near its peak
    assert level.window.queue_backing_up()
    level.samples = queue(0, 20, 40, 60, 80, 100, 120)  # an overloaded server's
    assert level.window.queue_backing_up()
    level.samples = []  # /metrics gave no queue: the stop stands as without the test
    assert level.window.queue_backing_up()


def test_a_start_surge_that_drains_does_not_stop_the_level(tmp_path: Path) -> None:
    level = Level(tmp_path)
    rule = StopRule(2000.0, time_scale=1.0, max_bad=5).bind(tmp_path, phase=level.window)
    level.record(40, ttft_s=3.0, at_s=2.0)  # the surge's requests: all past the 2-s limit
    level.samples = queue(0, 30, 58, 20, 2, 0, 0, 0)
    assert not check(rule)  # far past max_bad, but the queue drained: a surge
    level.samples = queue(0, 30, 58, 50, 40, 45, 50)
    assert check(rule)  # the same misses with a queue still backing up: stopped
    assert rule.in_warmup
    assert rule.text is not None and rule.text.startswith("stopped in its warm-up: 40 of 40")


def test_once_the_window_opens_only_its_requests_count(tmp_path: Path) -> None:
    level = Level(tmp_path)
    rule = StopRule(2000.0, time_scale=1.0, max_bad=5).bind(tmp_path, phase=level.window)
    level.record(40, ttft_s=3.0, at_s=2.0)  # the surge, in the warm-up
    level.samples = queue(*([0.0] * 40))  # 10 s of an empty queue: steady
    assert not check(rule)
    level.window.opening = level.window.open_now(level.samples)
    opened = level.window.opened_unix_s()
    assert opened is not None and opened > START_S + 2.0  # the surge was before it
    level.record(50, ttft_s=0.2, at_s=opened - START_S + 1.0)
    assert not check(rule)  # the surge's 40 misses are not the window's
    level.record(6, ttft_s=3.0, at_s=opened - START_S + 2.0)
    assert check(rule)  # 6 of the window's own: past max_bad
    assert not rule.in_warmup


def test_without_a_window_every_request_counts(tmp_path: Path) -> None:
    """A run that is not a rate-search level (a warm-up run, a probe) stops as before."""
    level = Level(tmp_path)
    rule = StopRule(2000.0, time_scale=1.0, max_bad=5).bind(tmp_path)
    level.record(40, ttft_s=3.0, at_s=2.0)
    assert check(rule)

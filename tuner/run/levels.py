"""A measured level's evidence as the run left it, read back for the report.

Per level directory (``trials/<n>/level-<i>/``): ``window.json`` (when the measured window
opened), ``backlog.json`` (the backlog guard), ``turn_mix.json``, ``prompt_lengths.json``,
``metrics.csv`` (/metrics over time), ``requests.jsonl`` and ``schedule.jsonl``; per
launched server, ``gpu.csv`` (its GPU timeline). Every part may be missing (older runs, a
level cut short): each reads as ``Recorded`` with why, never an error.
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from tuner.errors import GpuTimelineError
from tuner.run.evaluation import Evaluation
from tuner.run.files import first_error
from tuner.run.layout import BACKLOG_JSON, PROMPT_LENGTHS_FILE, WINDOW_JSON
from tuner.run.prompt_lengths import PromptLengthMix
from tuner.serving.backlog import BacklogCheck
from tuner.serving.gpu_sampler import GpuSample, read_timeline
from tuner.serving.prometheus_scrape import MetricsSample
from workloads.schedule import read_records
from workloads.stationary import TURN_MIX_FILE, TurnMix

log = logging.getLogger(__name__)


def rebase(recorded: str, parent: Path) -> Path:
    """A path recorded by the run, as it is now (the run directory may have moved): its
    last component under ``parent``; where it was recorded under another directory of the
    run at ``parent``'s depth (a confirmation that pools its trial's levels records them
    as ``trials/<n>/level-<k>``), its last three components under ``parent``'s run."""
    path = Path(recorded)
    if path.parent.name == parent.name or len(parent.parents) < 2:
        return parent / path.name
    return parent.parents[1] / path.parent.parent.name / path.parent.name / path.name


@dataclass(frozen=True)
class LatencySamples:
    """One measured level's latencies in milliseconds of the emulated GPU's time."""

    ttft_ms: list[float]
    itl_ms: list[float]
    e2e_ms: list[float]
    prompt_tokens: list[int]


def level_latencies(level_dir: Path, time_scale: float) -> LatencySamples | None:
    """TTFT, ITL and e2e of each measured request, as ``LoadResult`` defines them.

    On the simulator the wall times are divided by the run's time scale, exactly as
    ``LoadResult.in_virtual_time`` does, so they are in the emulated GPU's time.
    """
    path = level_dir / "requests.jsonl"
    if not path.is_file():
        return None
    k = 1000.0 / (time_scale or 1.0)
    ttft: list[float] = []
    itl: list[float] = []
    e2e: list[float] = []
    prompts: list[int] = []
    try:
        records = list(read_records(path))
    except (OSError, ValueError, TypeError):
        log.info("unreadable %s", path, exc_info=True)
        return None
    for r in records:
        if r.warmup or not r.ok or r.first_token_s is None:
            continue
        ttft.append((r.first_token_s - r.scheduled_s) * k)
        if r.end_s is not None:
            e2e.append((r.end_s - r.scheduled_s) * k)
        times = r.token_times_s
        itl.extend((b - a) * k for a, b in itertools.pairwise(times))
        prompts.append(r.prompt_tokens)
    return LatencySamples(ttft_ms=ttft, itl_ms=itl, e2e_ms=e2e, prompt_tokens=prompts)


def read_metrics(path: Path) -> list[MetricsSample]:
    """A level's ``metrics.csv`` (``KvUsageWatcher.write_csv``); empty when absent."""
    if not path.is_file():
        return []

    def num(text: str | None) -> float | None:
        if text is None or text == "":
            return None
        value = float(text)
        return value if math.isfinite(value) else None

    out: list[MetricsSample] = []
    try:
        with path.open(encoding="utf-8", newline="") as fh:
            for row in csv.DictReader(fh):
                unix_s, usage = num(row.get("unix_s")), num(row.get("kv_cache_usage"))
                if unix_s is None or usage is None:
                    continue
                out.append(
                    MetricsSample(
                        unix_s=unix_s, kv_cache_usage=usage, running=num(row.get("running")),
                        waiting=num(row.get("waiting")),
                        preemptions_total=num(row.get("preemptions_total")),
                    )
                )  # fmt: skip
    except (OSError, ValueError):
        log.info("unreadable %s", path, exc_info=True)
    return out


@dataclass(frozen=True)
class Timeline:
    """One launched server's memory and /metrics over time."""

    label: str
    gpu: list[GpuSample]  # t_s: seconds since the sampler started (wall clock)
    anchor_unix_s: float | None  # wall clock at gpu t_s = 0, when it could be placed
    levels: list[tuple[str, list[MetricsSample]]]  # (label, samples) per measured run
    note: str | None


def timeline(label: str, run_dir: Path, level_dirs: list[tuple[str, Path]]) -> Timeline:
    """The GPU timeline of ``run_dir`` (``gpu.csv``) and the /metrics of its levels.

    ``gpu.csv`` counts seconds from the sampler's start, ``metrics.csv`` has Unix
    times. The file is closed (so last written) when the sampler stops, so its
    modification time less its last ``t_s`` places it on the wall clock; the
    placement is used only when every /metrics sample falls inside the timeline.
    """
    path = run_dir / "gpu.csv"
    samples: list[GpuSample] = []
    note: str | None = None
    if path.is_file():
        try:
            samples = read_timeline(path)
        except GpuTimelineError as exc:
            note = str(exc)
    else:
        note = "no GPU timeline (gpu.csv) was recorded"
    levels = [(name, read_metrics(d / "metrics.csv")) for name, d in level_dirs]
    levels = [(name, rows) for name, rows in levels if rows]
    anchor: float | None = None
    if samples:
        anchor = path.stat().st_mtime - samples[-1].t_s
        end = anchor + samples[-1].t_s
        stamps = [s.unix_s for _, rows in levels for s in rows]
        if stamps and (min(stamps) < anchor - 2.0 or max(stamps) > end + 2.0):
            anchor = None
            note = (
                "the /metrics samples could not be placed on the GPU timeline's clock "
                "(gpu.csv was copied without its modification time?); shown from their own start"
            )
    return Timeline(label=label, gpu=samples, anchor_unix_s=anchor, levels=levels, note=note)


# --- a level's steady-state evidence ----------------------------------------------------

WINDOW_FILE = WINDOW_JSON  # tuner.serving.window.WindowOpening, read leniently (older runs: none)
BACKLOG_FILE = BACKLOG_JSON  # tuner.serving.backlog.BacklogCheck
NOT_RECORDED = "not recorded"

R = TypeVar("R", bound=BaseModel)
T = TypeVar("T")


class WindowSignalRecord(BaseModel):
    """One signal of the steadiness test at the window's opening (its numbers kept as extras)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    signal: str
    verdict: str

    def number(self, name: str) -> float | None:
        value = (self.model_extra or {}).get(name)
        return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


class WindowRecord(BaseModel):
    """``window.json``: when a level's measured window opened and whether the server was
    steady then (``tuner.serving.window.WindowOpening``, read as plain JSON: fields it may add
    later are ignored, those an older one lacks are None)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    warmup_min_s: float | None = None
    warmup_max_s: float | None = None
    opened_at_s: float  # emulated seconds from the level's start
    steady_at_open: bool
    test: str = ""
    signals: list[WindowSignalRecord] = []
    window_s: float
    requests: int | None = None
    needed_requests: int | None = None
    window_min_s: float | None = None
    window_max_s: float | None = None
    closed: str | None = None  # tuner.serving.window.WindowClose
    correlation_s: float | None = None
    correlation_floor_s: float | None = None
    correlations_wanted: float | None = None
    slo_share: float | None = None
    band: float | None = None
    carried_on: float | None = None  # chained on from the level before: the share it added
    trace_pass_s: float | None = (
        None  # a trace replay's pass: the window is it, or its busiest stretch
    )


@dataclass(frozen=True)
class Recorded(Generic[T]):
    """One part of a level's evidence: its value, or why there is none (``note``)."""

    value: T | None
    note: str | None = None  # "not recorded", or what is wrong with the file


@dataclass(frozen=True)
class LevelEvidence:
    """What shows that one measured level was in steady state (every part may be missing)."""

    index: int
    rate_per_s: float
    met: bool
    stopped_early: bool
    dir: Path
    window: Recorded[WindowRecord]
    backlog: Recorded[BacklogCheck]
    turn_mix: Recorded[TurnMix]
    prompt_lengths: Recorded[PromptLengthMix]
    metrics: list[MetricsSample]
    start_unix_s: float | None  # wall clock at the level's offset 0, when it could be placed


def _level_file(path: Path, model: type[R]) -> Recorded[R]:
    if not path.is_file():
        return Recorded(None, NOT_RECORDED)
    try:
        return Recorded(model.model_validate_json(path.read_text(encoding="utf-8")))
    except OSError as exc:
        return Recorded(None, f"{path.name} cannot be read ({exc.strerror})")
    except ValidationError as exc:
        return Recorded(None, f"{path.name} is not readable here ({first_error(exc)})")


def level_start_unix(level_dir: Path) -> float | None:
    """Wall clock at a level's offset 0: a record's intended send time less its offset in
    the schedule as sent (``schedule.jsonl``, open-loop requests only: a later turn's
    intended time follows its answer); None when either file is missing."""
    offsets: dict[str, float] = {}
    try:
        with (level_dir / "schedule.jsonl").open(encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                if row.get("follows") is None:
                    offsets[str(row["request_id"])] = float(row["send_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    paths = [level_dir / "requests.jsonl", *sorted(level_dir.glob("records.jsonl.w*[0-9]"))]
    for path in paths:
        try:
            with path.open(encoding="utf-8") as fh:
                for line, _ in zip(fh, range(256), strict=False):
                    row = json.loads(line)
                    if row.get("request_id") in offsets:
                        return float(row["scheduled_s"]) - offsets[row["request_id"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def level_evidence(trial_dir: Path, ev: Evaluation) -> list[LevelEvidence]:
    """Each measured level's evidence of steady state, from its directory under
    ``trial_dir``; the backlog guard's verdict from the evaluation when ``backlog.json``
    is not there (runs from before it was written)."""
    out: list[LevelEvidence] = []
    for index, lv in enumerate(ev.levels):
        level_dir = rebase(lv.dir, trial_dir)
        backlog = _level_file(level_dir / BACKLOG_FILE, BacklogCheck)
        if backlog.value is None and lv.backlog is not None:
            backlog = Recorded(lv.backlog)
        out.append(
            LevelEvidence(
                index=index, rate_per_s=lv.rate_per_s, met=lv.met,
                stopped_early=lv.stopped_early, dir=level_dir,
                window=_level_file(level_dir / WINDOW_FILE, WindowRecord), backlog=backlog,
                turn_mix=_level_file(level_dir / TURN_MIX_FILE, TurnMix),
                prompt_lengths=_level_file(level_dir / PROMPT_LENGTHS_FILE, PromptLengthMix),
                metrics=read_metrics(level_dir / "metrics.csv"),
                start_unix_s=level_start_unix(level_dir),
            )
        )  # fmt: skip
    return out

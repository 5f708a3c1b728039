"""vLLM's Prometheus /metrics: scrape, and the counters a trial reports as deltas over its window."""

from __future__ import annotations

import csv
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from tuner.serving.eviction_scrape import EvictionEvidence, labelled_key

COUNTERS = {
    "generation_tokens": "vllm:generation_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "num_preemptions": "vllm:num_preemptions_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
}
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # current, and before 0.11


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample values summed over label sets, by sample name (histogram series included),
    read with ``prometheus_client``'s parser, as vLLM writes them with its exposition:
    label values may hold spaces, commas and escaped quotes, and a sample may carry a
    timestamp after its value. A text that does not parse from some line on gives what
    was read before it (a truncated scrape is not an error). The residency histograms of
    ``--kv-cache-metrics`` and the simulator's ``tuner_sim:`` series are also kept per
    label set (``tuner.serving.eviction_scrape.labelled_key``)."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
                key = labelled_key(sample.name, sample.labels)
                if key is not None:
                    values[key] = values.get(key, 0.0) + float(sample.value)
    except ValueError:
        pass
    return values


def scrape(base_url: str, timeout_s: float = 5.0) -> dict[str, float]:
    try:
        with urllib.request.urlopen(
            base_url.rstrip("/") + "/metrics", timeout=timeout_s
        ) as response:
            return parse_prometheus(response.read().decode("utf-8", errors="replace"))
    except (urllib.error.URLError, OSError, TimeoutError):
        return {}


class ServerCounters(BaseModel):
    """What the server itself counted over the measured window."""

    model_config = ConfigDict(frozen=True)

    generation_tokens: int
    prompt_tokens: int
    num_preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    prefix_cache_hit_rate: float | None
    max_kv_cache_usage: float | None
    # --kv-cache-metrics' histograms and the simulated engine's ground truth of evictions
    # (None: the server exported neither, or written before they were read).
    eviction: EvictionEvidence | None = None

    @classmethod
    def between(
        cls, before: dict[str, float], after: dict[str, float], max_kv_usage: float | None
    ) -> ServerCounters:
        delta = {
            key: int(after.get(name, 0.0) - before.get(name, 0.0)) for key, name in COUNTERS.items()
        }
        queries = delta["prefix_cache_queries"]
        rate = delta["prefix_cache_hits"] / queries if queries > 0 else None
        return cls(
            **delta,
            prefix_cache_hit_rate=rate,
            max_kv_cache_usage=max_kv_usage,
            eviction=EvictionEvidence.between(before, after),
        )


class KvUsageWatcher:
    """Polls /metrics during a run: the peak KV-cache usage (vLLM exposes only the current
    value) and a timeline of usage, running and waiting requests and preemptions.

    With ``csv_path`` each sample is also appended to that CSV as it is taken, so a rule
    that reads the run's directory (``tuner.serving.live_server.BacklogStopRule``) sees the timeline so far."""

    def __init__(
        self, base_url: str, interval_s: float = 0.5, *, csv_path: Path | None = None
    ) -> None:
        self.base_url = base_url
        self.interval_s = interval_s
        self.csv_path = csv_path
        self.peak: float | None = None
        self.samples: list[MetricsSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-usage", daemon=True)

    def start(self) -> KvUsageWatcher:
        if self.csv_path is not None:
            self.write_csv(self.csv_path)  # the header: samples are appended as they come
        self._thread.start()
        return self

    def stop(self) -> float | None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._poll()
        return self.peak

    def snapshot(self) -> list[MetricsSample]:
        """The samples so far (safe while the watcher still polls)."""
        return list(self.samples)

    def write_csv(self, path: Path) -> None:
        """The timeline as CSV: unix_s, kv_cache_usage, running, waiting, preemptions_total."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(MetricsSample.COLUMNS)
            for sample in self.samples:
                writer.writerow(sample.row())

    def _poll(self) -> None:
        values = scrape(self.base_url, timeout_s=2.0)
        usage = next((values[name] for name in KV_USAGE if name in values), None)
        if usage is None:
            return
        self.peak = usage if self.peak is None else max(self.peak, usage)
        sample = MetricsSample(
            unix_s=time.time(),
            kv_cache_usage=usage,
            running=values.get("vllm:num_requests_running"),
            waiting=values.get("vllm:num_requests_waiting"),
            preemptions_total=values.get(COUNTERS["num_preemptions"]),
        )
        self.samples.append(sample)
        if self.csv_path is not None:
            try:
                with self.csv_path.open("a", encoding="utf-8", newline="") as out:
                    csv.writer(out).writerow(sample.row())
            except OSError:  # the timeline in memory is still whole; write_csv writes it
                pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._poll()


def read_metrics_csv(path: Path) -> list[MetricsSample]:
    """A timeline written by ``KvUsageWatcher.write_csv`` (empty cells are None)."""

    def value(cell: str) -> float | None:
        return float(cell) if cell else None

    with path.open(encoding="utf-8", newline="") as fh:
        return [
            MetricsSample(
                unix_s=float(row["unix_s"]),
                kv_cache_usage=float(row["kv_cache_usage"]),
                running=value(row["running"]),
                waiting=value(row["waiting"]),
                preemptions_total=value(row["preemptions_total"]),
            )
            for row in csv.DictReader(fh)
        ]


@dataclass(frozen=True)
class MetricsSample:
    """One /metrics reading during a run."""

    COLUMNS: ClassVar[tuple[str, ...]] = (
        "unix_s", "kv_cache_usage", "running", "waiting", "preemptions_total",
    )  # fmt: skip

    unix_s: float
    kv_cache_usage: float
    running: float | None
    waiting: float | None
    preemptions_total: float | None

    def row(self) -> list[str]:
        def cell(value: float | None) -> str:
            return "" if value is None else f"{value:g}"

        return [f"{self.unix_s:.3f}", f"{self.kv_cache_usage:.6f}"] + [
            cell(v) for v in (self.running, self.waiting, self.preemptions_total)
        ]

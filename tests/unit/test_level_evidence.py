"""A level's measured requests against the workload's stationary ones: prompt lengths, turns."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuner.run.layout import PROMPT_LENGTHS_FILE
from tuner.run.prompt_lengths import PromptLengthMix
from tuner.search import level_evidence
from tuner.search.level_evidence import (
    REFERENCE_REQUESTS,
    ks_sf,
    ks_two_sample,
    prompt_lengths,
    reference_spec,
    write_level_evidence,
)
from workloads.build import build_schedule
from workloads.schedule import ScheduledRequest
from workloads.spec import (
    PoissonArrival,
    RampArrival,
    SessionStart,
    WarmupSpec,
    WorkloadSpec,
    load_workload,
)
from workloads.stationary import TURN_MIX_FILE, TurnMix

RATE_PER_S, WINDOW_S = 30.0, 8.0


def _chat(start: SessionStart, seed: int = 1, window_s: float = WINDOW_S) -> WorkloadSpec:
    spec = load_workload("chat").with_rate(RATE_PER_S).with_duration(window_s)
    assert spec.sessions is not None
    sessions = spec.sessions.model_copy(update={"start": start})
    return spec.model_copy(update={"warmup": WarmupSpec(), "sessions": sessions, "seed": seed})


class TestKolmogorovSmirnov:
    def test_the_distribution_at_known_points(self) -> None:
        # Kolmogorov's distribution: P(K > 1.36) = 0.049, P(K > 1.63) = 0.0098
        assert ks_sf(1.358) == pytest.approx(0.05, abs=0.001)
        assert ks_sf(1.628) == pytest.approx(0.01, abs=0.0005)
        assert ks_sf(0.1) == 1.0 and ks_sf(5.0) < 1e-20

    def test_same_and_shifted_samples(self) -> None:
        rng = np.random.default_rng(0)
        a, b = rng.normal(size=800), rng.normal(size=3000)
        d, p = ks_two_sample(a, b)
        assert d < 0.07 and p > 0.01
        d_shift, p_shift = ks_two_sample(a + 0.5, b)
        assert d_shift > 0.15 and p_shift < 1e-10

    def test_fewer_independent_samples_weigh_less(self) -> None:
        rng = np.random.default_rng(1)
        a, b = rng.normal(0.1, 1.0, size=2000), rng.normal(size=4000)
        _, p_all = ks_two_sample(a, b)
        _, p_few = ks_two_sample(a, b, effective_a=200)
        assert p_few > p_all


class TestPromptLengths:
    def test_a_stationary_chat_level_passes_for_most_seeds(self) -> None:
        spec = _chat(SessionStart.STATIONARY, seed=1)
        mix = prompt_lengths(build_schedule(spec), spec)
        assert mix.p_value is not None and mix.p_value > 0.01
        assert mix.measured is not None
        assert mix.measured.p50 == pytest.approx(mix.stationary.p50, rel=0.15)
        # the same test for more seeds, against one reference (building it is the slow part)
        reference = [r.prompt_tokens for r in build_schedule(reference_spec(spec))]
        passed = 0
        for seed in range(2, 10):
            window = build_schedule(_chat(SessionStart.STATIONARY, seed=seed))
            sessions = len({r.session_id for r in window})
            _, p = ks_two_sample([r.prompt_tokens for r in window], reference, effective_a=sessions)
            passed += p > 0.01
        assert passed >= 7

    def test_an_empty_start_window_fails_clearly(self) -> None:
        spec = _chat(SessionStart.EMPTY)
        mix = prompt_lengths(build_schedule(spec), spec)
        assert mix.p_value is not None and mix.p_value < 1e-6
        assert mix.ks_statistic is not None and mix.ks_statistic > 0.4
        assert mix.measured is not None and mix.measured.p50 < 0.5 * mix.stationary.p50

    def test_the_reference_is_long_stationary_and_quick_to_build(self) -> None:
        spec = _chat(SessionStart.EMPTY)
        ref = reference_spec(spec)
        assert ref.sessions is not None and ref.sessions.start is SessionStart.STATIONARY
        assert ref.seed != spec.seed and ref.duration_s > 5 * WINDOW_S
        started = time.perf_counter()
        mix = prompt_lengths(build_schedule(spec), spec)
        assert time.perf_counter() - started < 6.0  # about 1.5 s on a laptop core
        assert 0.8 * REFERENCE_REQUESTS < mix.reference_requests < 1.2 * REFERENCE_REQUESTS

    def test_every_level_of_a_workload_shares_one_reference_built_once(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Levels differ in rate, window and planned answer times, none of which changes
        the stationary prompt lengths: one reference, built for the first level only
        (counted, not timed: a busy host's second is not a cache's)."""
        built: list[WorkloadSpec] = []

        def counted(spec: WorkloadSpec, **kw: Any) -> list[ScheduledRequest]:
            built.append(spec)
            return build_schedule(spec, **kw)

        monkeypatch.setattr(level_evidence, "_REFERENCES", {})
        monkeypatch.setattr(level_evidence, "build_schedule", counted)
        spec = _chat(SessionStart.STATIONARY, seed=5)
        slow = spec.with_rate(2.0).with_duration(30.0)
        fast = spec.with_rate(9.0).with_duration(WINDOW_S)
        assert fast.sessions is not None
        fast = fast.model_copy(
            update={"sessions": fast.sessions.model_copy(update={"expected_ttft_s": 2.0})}
        )
        assert reference_spec(slow) == reference_spec(fast)
        first = prompt_lengths(build_schedule(slow), slow)
        assert built == [reference_spec(slow)]
        second = prompt_lengths(build_schedule(fast), fast)
        assert second.stationary == first.stationary
        assert second.reference_requests == first.reference_requests
        assert built == [reference_spec(slow)]  # not built again
        # another workload (seed) is another reference
        other = _chat(SessionStart.STATIONARY, seed=6)
        assert reference_spec(other) != reference_spec(slow)

    def test_a_ramp_is_compared_with_its_mean_rate_held(self) -> None:
        spec = _chat(SessionStart.STATIONARY).model_copy(
            update={"arrival": RampArrival(kind="ramp", start_rate_per_s=0, end_rate_per_s=20)}
        )
        ref = reference_spec(spec)
        assert isinstance(ref.arrival, PoissonArrival)  # constant: stationary
        assert ref.arrival == reference_spec(_chat(SessionStart.STATIONARY)).arrival

    def test_a_single_turn_workload_counts_each_request(self) -> None:
        spec = load_workload("chat").model_copy(update={"sessions": None, "seed": 2})
        spec = spec.with_rate(20.0).with_duration(WINDOW_S)
        schedule = [r for r in build_schedule(spec) if not r.warmup]
        mix = prompt_lengths(schedule, spec)
        assert mix.requests == mix.effective_requests == len(schedule)
        assert mix.p_value is not None and mix.p_value > 0.001

    def test_no_measured_request_has_no_test(self) -> None:
        mix = prompt_lengths([], _chat(SessionStart.STATIONARY))
        assert mix.requests == 0 and mix.measured is None and mix.p_value is None


def test_a_level_writes_its_prompt_lengths_and_turn_mix(tmp_path: Path) -> None:
    spec = _chat(SessionStart.STATIONARY)
    write_level_evidence(tmp_path / "level-0", build_schedule(spec), spec)
    mix = PromptLengthMix.model_validate_json(
        (tmp_path / "level-0" / PROMPT_LENGTHS_FILE).read_text()
    )
    turns = TurnMix.model_validate_json((tmp_path / "level-0" / TURN_MIX_FILE).read_text())
    assert mix.requests == turns.requests > 500
    assert turns.p_value is not None and mix.p_value is not None


def test_a_single_turn_level_writes_no_turn_mix(tmp_path: Path) -> None:
    spec = load_workload("chat").model_copy(update={"sessions": None}).with_duration(WINDOW_S)
    write_level_evidence(tmp_path, build_schedule(spec), spec)
    assert (tmp_path / PROMPT_LENGTHS_FILE).is_file()
    assert not (tmp_path / TURN_MIX_FILE).exists()

"""A sized window is held on while its SLO verdict is near the limit, and closes at its
shortest where it is far from it (tuner.serving.window, tuner.serving.live_server.WindowRule).

The server is `tuner sim-serve` (Llama 3.1 8B on an L4, ``--max-num-seqs 16``) behind
``LiveServer``, loaded by Locust over real sockets, one level of the rate search at a
time. The p90 TTFT the level is judged by is first measured on a fixed window; a limit
at that p90 leaves the verdict unclear, one ten times above it leaves it clear.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.simserver import live_sim
from tuner.search.rate_search import search_rate
from tuner.serving.live_server import LiveServer, LoadMeasurement
from tuner.serving.window import FAR_CORRELATIONS, WindowClose, WindowOpening
from tuner.vllm.memory import ServingParams
from workloads.spec import WorkloadSpec, parse_workload

# One worker: the module's server and its fixed-window p90 (a 12-s real-time level) are built
# once, not once on each worker a test of it lands on.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("window-hold")]

WORKLOAD = """
name: hold
api: completions
stream: true
arrival: {kind: poisson, rate_per_s: 8}
prompt_tokens: {kind: uniform, low: 32, high: 96}
output_tokens: {kind: uniform, low: 8, high: 24}
warmup: {duration_s: 0}
duration_s: 6
seed: 4
slo:
  ttft: {p90_ms: 5000}
"""
PARAMS = ServingParams(max_model_len=2048, max_num_seqs=16)
RATE = 8.0
LONGEST_S = 24.0


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_sim(tmp_path_factory.mktemp("hold"), PARAMS) as server:
        yield server


def _with_limit(limit_ms: float) -> WorkloadSpec:
    text = WORKLOAD.replace("p90_ms: 5000", f"p90_ms: {limit_ms:.1f}")
    return parse_workload(text, label="hold.yaml")


def _one_level(
    live: LiveServer, spec: WorkloadSpec, out: Path, *, level_duration_s: float | None = None,
    warmup_s: float | None = None, level_max_duration_s: float | None = None,
    deadline: float | None = None,
) -> tuple[WindowOpening, LoadMeasurement]:  # fmt: skip
    search = search_rate(
        live, spec, start_rate_per_s=RATE, out_dir=out, max_levels=1,
        level_duration_s=level_duration_s, warmup_s=warmup_s,
        level_max_duration_s=level_max_duration_s, deadline=deadline,
    )  # fmt: skip
    (only,) = search.levels
    window = only.measurement.window
    assert window is not None
    saved = WindowOpening.model_validate_json((out / "level-0" / "window.json").read_text())
    assert saved.closed == window.closed and saved.window_s == window.window_s
    return window, only.measurement


@pytest.fixture(scope="module")
def p90_ms(live: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> float:
    """The level's p90 TTFT on a fixed 10-s window."""
    out = tmp_path_factory.mktemp("fixed")
    window, m = _one_level(live, _with_limit(5000.0), out, level_duration_s=10.0, warmup_s=2.0)
    assert window.closed is WindowClose.FIXED and window.window_s == 10.0
    value = m.load.ttft_ms.p90
    assert value is not None and value > 0
    return value


def test_a_verdict_at_the_limit_holds_the_window_on(
    live: LiveServer, p90_ms: float, tmp_path: Path
) -> None:
    window, _ = _one_level(live, _with_limit(p90_ms), tmp_path, level_max_duration_s=LONGEST_S)
    assert window.window_min_s is not None and window.window_min_s < LONGEST_S
    assert window.window_max_s == LONGEST_S
    assert window.closed in (WindowClose.LONGEST, WindowClose.HELD), window
    assert window.window_s > window.window_min_s + 1.0  # held past its shortest
    if window.closed is WindowClose.HELD:  # only once the verdict came clear of the limit
        assert window.slo_share is not None and window.band is not None
        assert abs(window.slo_share - 1.0) >= window.band / (1.0 + window.band)
    else:
        assert window.window_s == LONGEST_S
        assert "wanted" in window.summary() or window.slo_share is not None


def test_a_verdict_far_from_the_limit_closes_on_the_servers_own_evidence(
    live: LiveServer, p90_ms: float, tmp_path: Path
) -> None:
    window, _ = _one_level(live, _with_limit(10 * p90_ms), tmp_path, level_max_duration_s=LONGEST_S)
    assert window.closed in (WindowClose.SHORTEST, WindowClose.HELD, WindowClose.LONGEST)
    assert window.slo_share is not None and window.slo_share < 0.2
    if window.closed is not WindowClose.LONGEST:  # it held enough of the server's memory
        assert window.correlation_s is not None
        assert window.correlations_wanted == FAR_CORRELATIONS  # far from the limit: fewer
        assert window.window_s >= FAR_CORRELATIONS * window.correlation_s - 1e-6
    assert window.window_s <= LONGEST_S


def test_a_window_held_on_near_the_limit_ends_by_its_searchs_deadline(
    live: LiveServer, p90_ms: float, tmp_path: Path
) -> None:
    """A level whose verdict sits at its limit is held on to its longest window, unless
    its search's deadline comes first (a trial's, or the budget's end for a confirmation):
    then its window is cut to end the level by it (``held_until``), never below its
    shortest, and says so. Uncut, a 10-minute tune's confirmation held its last level on
    135 s and ended 73 s past the budget."""
    longest_s = 120.0
    deadline = time.monotonic() + 40.0
    window, _ = _one_level(
        live, _with_limit(p90_ms), tmp_path, level_max_duration_s=longest_s, deadline=deadline
    )
    ended = time.monotonic()
    assert window.window_max_s is not None and window.window_max_s < longest_s - 60.0
    assert window.window_min_s is not None and window.window_max_s >= window.window_min_s
    assert window.closed in (WindowClose.DEADLINE, WindowClose.HELD), window
    if window.closed is WindowClose.DEADLINE:
        assert window.window_s == window.window_max_s
    assert ended <= deadline + 2.0

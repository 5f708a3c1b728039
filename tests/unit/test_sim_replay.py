"""Trace replay in the simulated engine: block tokens, the replay rule, failure reasons."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tuner.sim.build import build_engine
from tuner.sim.engine import SimEngine, block_hashes
from tuner.sim.simulate import FailureReason, block_token_ids, prompt_ids, run
from tuner.sim.timing import TimingFactors
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion
from workloads.arrivals import plan_arrivals, replay_trace, trace_arrivals
from workloads.slo import Slo
from workloads.spec import TraceArrival, WarmupSpec, read_trace_ref
from workloads.traces import TraceRecord, load_trace, resolve_trace

MODEL = resolve_model("llama-3.1-8b")
VOCAB = MODEL.vocab_size


def engine(max_model_len: int = 8192) -> SimEngine:
    params = ServingParams(max_model_len=max_model_len)
    plan, eng = build_engine(MODEL, get_gpu("H100-80GB"), params, VllmVersion.current())
    assert eng is not None, plan.failure
    return eng


def tuner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, timeout=120
    )


class TestBlockTokens:
    def test_hash_ids_a_vocabulary_apart_give_distinct_blocks(self) -> None:
        a, b = block_token_ids(5, 512, VOCAB, 0), block_token_ids(5 + VOCAB, 512, VOCAB, 0)
        assert len(a) == len(b) == 512
        assert block_hashes(list(a), 16)[0] != block_hashes(list(b), 16)[0]
        assert block_token_ids(5, 512, VOCAB, 0) == a  # deterministic

    def test_distinct_ids_differ_within_the_first_kv_block(self) -> None:
        ids = [*range(2000), *(k * VOCAB + 7 for k in range(1, 50)), 182_789, VOCAB**3]
        firsts = {block_token_ids(i, 16, VOCAB, 3) for i in ids}
        assert len(firsts) == len(ids)

    def test_a_false_prefix_hit_is_gone(self) -> None:
        """Two requests whose blocks have ids a vocabulary apart share nothing in the cache."""

        def hit_rate(second_id: int) -> float:
            records = [
                TraceRecord(0.0, 512, 4, prefix_block_ids=(5,)),
                TraceRecord(1.0, 512, 4, prefix_block_ids=(second_id,)),
            ]
            return run(engine(), records, slo=Slo(), vocab=VOCAB).prefix_cache_hit_rate

        assert hit_rate(5) > 0.4  # the same id: its 512 tokens are reused
        assert hit_rate(5 + VOCAB) == 0.0

    def test_a_prompt_keeps_its_length(self) -> None:
        record = TraceRecord(0.0, 700, 4, prefix_block_ids=(1, 2))
        assert len(prompt_ids(record, 0, VOCAB, 0)) == 700


@pytest.fixture(scope="module")
def azure() -> tuple[TraceRecord, ...]:
    return load_trace(resolve_trace("builtin:azure-code"))


class TestReplayRule:
    def test_max_requests_scales_what_is_replayed_then_cuts(
        self, azure: tuple[TraceRecord, ...]
    ) -> None:
        rows = replay_trace(azure, rate_per_s=4.0, duration_s=None, max_requests=300)
        assert len(rows) == 300
        # The trace's pace at 4/s (a pass of its 1,000 requests in 250 s), cut after 300.
        whole = replay_trace(azure, rate_per_s=4.0, duration_s=None)
        assert [r.arrival_s for r in rows] == [r.arrival_s for r in whole[:300]]
        assert whole[-1].arrival_s < 250.0 < whole[-1].arrival_s + 1.0

    def test_simulate_and_bench_replay_the_same_arrivals(
        self, azure: tuple[TraceRecord, ...]
    ) -> None:
        """The same rate and duration give the same times through simulate's and bench's path."""
        simulated = replay_trace(azure, rate_per_s=6.0, duration_s=90.0)
        plan = plan_arrivals(
            TraceArrival(kind="trace", path="builtin:azure-code", rate_per_s=6.0),
            duration_s=90.0,
            warmup=WarmupSpec(),
            seed=0,
            trace=azure,
        )
        assert np.allclose([r.arrival_s for r in simulated], plan.send_s)
        assert plan.trace_rows is not None
        assert [r.prompt_tokens for r in simulated] == [
            azure[i].prompt_tokens for i in plan.trace_rows
        ]

    def test_a_duration_cuts_the_trace(self, azure: tuple[TraceRecord, ...]) -> None:
        times, _ = trace_arrivals(azure, rate_per_s=None, duration_s=30.0)
        assert times.max() < 30.0
        assert len(times) == sum(1 for r in azure if r.arrival_s < 30.0)

    def test_without_duration_or_rate_one_pass_as_recorded(
        self, azure: tuple[TraceRecord, ...]
    ) -> None:
        rows = replay_trace(azure, rate_per_s=None, duration_s=None)
        assert [r.arrival_s for r in rows] == [r.arrival_s for r in azure]


BASE = ("simulate", "--model", "llama-3.1-8b", "--gpu", "H100-80GB")


class TestSimulateCommand:
    def test_duration_cuts_a_trace_replay(self) -> None:
        out = tuner(*BASE, "--trace", "builtin:azure-code", "--rate", "4", "--duration", "30")
        assert out.returncode == 0, out.stderr
        cut = len(
            trace_arrivals(read_trace_ref("builtin:azure-code"), rate_per_s=4.0, duration_s=30.0)[0]
        )
        assert 0 < cut < 1000
        assert f"of {cut}\n" in out.stdout  # the trace's first 30 s at 4/s, not all of it

    def test_max_requests_then_rate_gives_the_rate(self) -> None:
        args = ("--trace", "builtin:azure-code", "--max-requests", "200", "--rate", "4", "--json")
        out = tuner(*BASE, "--max-model-len", "16384", *args)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["num_requests"] == 200

    def test_failed_requests_say_why_as_vllm_does(self) -> None:
        out = tuner(*BASE, "--max-model-len", "4096", "--trace", "builtin:azure-code",
                    "--max-requests", "50")  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "failed (prompt too long): vLLM answers 400: This model's maximum context " in (
            out.stdout
        )
        assert "length is 4096 tokens. However, your request has " in out.stdout
        data = json.loads(tuner(*BASE, "--max-model-len", "4096", "--trace",
                                "builtin:azure-code", "--max-requests", "50", "--json").stdout)  # fmt: skip
        (failed,) = data["failures"]
        assert failed["reason"] == FailureReason.PROMPT_TOO_LONG.value
        assert failed["count"] == data["num_failed"] > 0
        assert failed["http_status"] == 400

    @pytest.mark.parametrize(
        ("args", "expected"),
        [
            (("--rate", "1", "--duration", "nan"), "--duration nan is not accepted"),
            (("--rate", "1", "--duration", "-5"), "--duration -5.0 is not accepted"),
            (("--rate", "inf"), "--rate inf is not accepted; accepted: a finite number > 0"),
            (("--rate", "0"), "--rate 0.0 is not accepted"),
            (("--rate", "1", "--prompt-tokens", "-100"), "--prompt-tokens -100 is not accepted"),
            (("--rate", "1", "--output-tokens", "0"), "--output-tokens 0 is not accepted"),
            (("--rate", "1", "--shared-fraction", "nan"), "--shared-fraction nan is not"),
            (("--rate", "1", "--shared-prefix-tokens", "-1"), "--shared-prefix-tokens -1 is"),
            (("--rate", "1", "--shared-prefix-tokens", "900"), "more than --prompt-tokens 512"),
            (("--rate", "1", "--slo-ttft-ms", "nan"), "--slo-ttft-ms nan is not accepted"),
            (("--rate", "1", "--slo-tpot-ms", "-1"), "--slo-tpot-ms -1.0 is not accepted"),
            (("--rate", "1", "--swap-space", "nan"), "--swap-space nan is not accepted"),
            (("--rate", "1", "--cpu-offload-gb", "inf"), "--cpu-offload-gb inf is not"),
            (("--rate", "1", "--seed", "-3"), "--seed -3 is not accepted"),
            (("--trace", "builtin:azure-code", "--max-requests", "0"), "--max-requests 0 is"),
            (("--rate", "1", "--max-requests", "5"), "--max-requests cuts a trace replay"),
        ],
    )
    def test_bad_values_are_one_line_before_anything_runs(
        self, args: tuple[str, ...], expected: str
    ) -> None:
        out = tuner(*BASE, *args)
        assert out.returncode == 2, out.stdout
        assert expected in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
        assert out.stdout == ""


def test_an_unreadable_trace_names_it(tmp_path: Path) -> None:
    out = tuner(*BASE, "--trace", str(tmp_path / "none.csv"))
    assert out.returncode == 2 and "none.csv" in out.stderr


def test_simulate_starts_from_the_step_costs_a_tune_fitted(tmp_path: Path) -> None:
    """``--twin-from RUN_DIR``: the factors in its twin.json time the steps (half the
    bandwidth: decode steps about twice as long); a run without one is one line, exit 2."""
    args = (*BASE, "--rate", "2", "--duration", "20", "--prompt-tokens", "50",
            "--output-tokens", "40", "--json")  # fmt: skip
    slow = TimingFactors(mbu=0.4, source="fitted")
    (tmp_path / "twin.json").write_text(json.dumps({"factors": slow.model_dump(), "fits": []}))
    paper = json.loads(tuner(*args).stdout)["itl_ms"]["p50"]
    fitted = json.loads(tuner(*args, "--twin-from", str(tmp_path)).stdout)["itl_ms"]["p50"]
    assert fitted > 1.6 * paper
    bad = tuner(*args, "--twin-from", str(tmp_path / "none"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "twin.json" in bad.stderr

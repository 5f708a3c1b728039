"""Public agent-trace formats beside Mooncake's: the Qwen-Bailian usage traces (its to-B
trace is task automation with API calls) and the Mooncake FAST'25 toolagent trace (the
conversation trace's format); rows written by hand in tests/fixtures/traces/ (README.md
there states the sources). Each loads, keeps its shared blocks, replays as a workload where
traces are accepted, and runs through `tuner simulate --trace`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.virtual import tuner_cli
from tuner.twin.prediction import Setup, predict
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion
from workloads.build import build_schedule
from workloads.spec import load_workload
from workloads.traces import (
    BAILIAN_BLOCK_TOKENS,
    MOONCAKE_BLOCK_TOKENS,
    TraceError,
    read_trace,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
BAILIAN = FIXTURES / "qwen-bailian-agent-rows.jsonl"
TOOLAGENT = FIXTURES / "mooncake-toolagent-rows.jsonl"
TOOLS_BLOCKS = (1, 2, 3, 4)  # the fixture's 64-token system-and-tools prefix


def test_bailian_rows_load_as_requests_with_16_token_blocks() -> None:
    records = read_trace(BAILIAN)
    assert len(records) == 6
    assert records[0].arrival_s == 0.0
    assert [round(r.arrival_s, 3) for r in records] == [0.0, 0.738, 2.492, 3.388, 4.263, 5.618]
    assert [r.prompt_tokens for r in records] == [100, 90, 180, 40, 150, 260]
    assert all(r.block_tokens == BAILIAN_BLOCK_TOKENS for r in records)
    agent_calls = [r for r in records if r.prefix_block_ids[:4] == TOOLS_BLOCKS]
    assert len(agent_calls) == 5  # all but the one-off search request
    # a later call carries its history's blocks: chat 103 extends chat 101
    assert records[2].prefix_block_ids[:6] == records[0].prefix_block_ids[:6]


def test_the_mooncake_toolagent_format_is_the_mooncake_reader_s() -> None:
    records = read_trace(TOOLAGENT)
    assert [r.arrival_s for r in records] == [0.0, 0.85, 2.1, 3.05, 4.4]  # ms -> s
    assert all(r.prefix_block_ids[0] == 0 for r in records)
    assert all(r.block_tokens == MOONCAKE_BLOCK_TOKENS for r in records)


def test_a_multi_turn_mooncake_row_is_refused_in_one_line(tmp_path: Path) -> None:
    """AIPerf's multi-turn variant (session_id, delay after the previous answer) is sessions,
    not arrivals: said so, not read as a row missing its timestamp."""
    trace = tmp_path / "sessions.jsonl"
    rows = [
        {"session_id": "s", "timestamp": 0, "input_length": 300, "output_length": 40},
        {"session_id": "s", "delay": 2000, "input_length": 150, "output_length": 20},
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TraceError) as err:
        read_trace(trace)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(f"{trace}:2: a multi-turn Mooncake row (session_id, delay")


def test_a_bailian_row_without_its_fields_names_them(tmp_path: Path) -> None:
    trace = tmp_path / "b.jsonl"
    trace.write_text(BAILIAN.read_text() + '{"chat_id": 9, "parent_chat_id": -1}\n')
    with pytest.raises(TraceError, match=r"b\.jsonl:7: a Qwen-Bailian row needs chat_id, "):
        read_trace(trace)


def _replay(tmp_path: Path, trace: Path, api: str = "completions") -> Path:
    """A workload that replays ``trace`` as recorded, as docs/guides/workloads.md shows."""
    path = tmp_path / f"{trace.stem}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": trace.stem,
                "api": api,
                "arrival": {"kind": "trace", "path": str(trace)},
                "prompt_tokens": {"kind": "trace"},
                "output_tokens": {"kind": "trace"},
                "duration_s": 6,
                "slo": {"ttft": {"p99_ms": 3000}},
            }
        )
    )
    return path


def test_a_bailian_trace_replays_as_a_workload_sharing_its_blocks(tmp_path: Path) -> None:
    spec = load_workload(_replay(tmp_path, BAILIAN))
    schedule = build_schedule(spec)
    rows = read_trace(BAILIAN)
    assert [r.prompt_tokens for r in schedule] == [r.prompt_tokens for r in rows]
    assert [r.max_tokens for r in schedule] == [r.output_tokens for r in rows]
    prompts = [r.prompt or "" for r in schedule]
    head = len(TOOLS_BLOCKS) * BAILIAN_BLOCK_TOKENS
    shared = {" ".join(p.split()[:head]) for p, row in zip(prompts, rows, strict=True)
              if row.prefix_block_ids[:4] == TOOLS_BLOCKS}  # fmt: skip
    assert len(shared) == 1  # every agent call opens with the same 64 tokens of text
    # chat 103 resends chat 101's first six blocks, and differs from the seventh on
    first, later = prompts[0].split(), prompts[2].split()
    assert first[: 6 * BAILIAN_BLOCK_TOKENS] == later[: 6 * BAILIAN_BLOCK_TOKENS]
    assert (
        first[6 * BAILIAN_BLOCK_TOKENS : 7 * BAILIAN_BLOCK_TOKENS]
        != (later[6 * BAILIAN_BLOCK_TOKENS : 7 * BAILIAN_BLOCK_TOKENS])
    )
    # the twin serves it, its prefix cache reusing the shared blocks
    setup = Setup(
        resolve_model("llama-3.1-8b"), get_gpu("H100-80GB"), VllmVersion.current(),
        ServingParams(max_model_len=4096),
    )  # fmt: skip
    prediction = predict(setup, spec)
    assert prediction.result is not None and prediction.met
    assert prediction.result.prefix_cache_hit_rate is not None
    assert prediction.result.prefix_cache_hit_rate > 0.2


@pytest.mark.parametrize("trace", [BAILIAN, TOOLAGENT], ids=["bailian", "toolagent"])
def test_tuner_simulate_replays_the_trace(trace: Path) -> None:
    done = tuner_cli(
        "simulate", "--model", "llama-3.1-8b", "--gpu", "H100-80GB", "--max-model-len", "8192",
        "--trace", trace, "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["num_finished"] == len(read_trace(trace))

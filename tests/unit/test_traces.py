from __future__ import annotations

import json
from pathlib import Path

import pytest

from workloads.arrivals import replay_trace
from workloads.traces import TraceError, read_trace

AZURE = (
    Path(__file__).resolve().parents[3] / "shared" / "traces" / "azure-llm-inference-2023-code.csv"
)


@pytest.mark.skipif(not AZURE.exists(), reason="../shared/traces is not beside this checkout")
def test_reads_the_azure_code_trace() -> None:
    records = read_trace(AZURE)
    assert len(records) == 8819  # rows in the file (its README says 8,818)
    assert records[0].arrival_s == 0.0
    assert records[1].arrival_s == pytest.approx(0.052, abs=0.001)
    assert (records[0].prompt_tokens, records[0].output_tokens) == (4808, 10)
    assert 3000 < records[-1].arrival_s < 3700  # about one hour
    scaled = replay_trace(records, rate_per_s=10.0, duration_s=None)
    assert len(scaled) == len(records)
    # One pass: n requests in n / rate seconds (the span and one mean gap after it).
    n = len(scaled)
    assert n / (scaled[-1].arrival_s * n / (n - 1)) == pytest.approx(10.0)


def test_the_shipped_excerpt_is_the_head_of_the_trace() -> None:
    excerpt = Path(__file__).resolve().parents[2] / "workloads" / "data"
    records = read_trace(excerpt / "azure-llm-inference-2023-code-excerpt.csv")
    assert len(records) == 1000
    assert (records[0].prompt_tokens, records[0].output_tokens) == (4808, 10)
    assert "CC-BY 4.0" in (excerpt / "README.md").read_text()


def test_malformed_azure_row_names_its_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319600,many,8\n"
    )
    with pytest.raises(TraceError, match=r"t\.csv:3: ContextTokens 'many' is not an integer"):
        read_trace(trace)


def test_mooncake_rows_keep_their_block_hash_ids(tmp_path: Path) -> None:
    trace = tmp_path / "m.jsonl"
    rows = [
        {"timestamp": 1000, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1]},
    ]
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    records = read_trace(trace)
    assert [r.arrival_s for r in records] == [0.0, 1.0]
    assert records[1].prefix_block_ids == (1, 2)


def test_mooncake_bad_json_names_its_line(tmp_path: Path) -> None:
    trace = tmp_path / "m.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1}\n{oops\n')
    with pytest.raises(TraceError, match=r"m\.jsonl:2: not JSON"):
        read_trace(trace)


def test_unknown_format_says_what_is_accepted(tmp_path: Path) -> None:
    trace = tmp_path / "x.txt"
    trace.write_text("hello\n")
    with pytest.raises(TraceError, match="accepted: Azure CSV"):
        read_trace(trace)

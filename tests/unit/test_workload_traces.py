"""Our own JSONL trace format, trace references and the trace cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from workloads.traces import TraceError, load_trace, read_trace, resolve_trace


def write_rows(path: Path, rows: list[Any]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_own_jsonl_reads_sorted_from_the_first_arrival(tmp_path: Path) -> None:
    trace = write_rows(
        tmp_path / "own.jsonl",
        [
            {"arrival_s": 12.5, "prompt_tokens": 900, "output_tokens": 20},
            {"arrival_s": 10.0, "prompt_tokens": 700, "output_tokens": 0},
            {
                "arrival_s": 11,
                "prompt_tokens": 400,
                "output_tokens": 8,
                "prefix_id": "sys-a",
                "prefix_tokens": 300,
            },
            {
                "arrival_s": 13,
                "prompt_tokens": 350,
                "output_tokens": 8,
                "prefix_id": "sys-a",
                "prefix_tokens": 300,
            },
            {
                "arrival_s": 14,
                "prompt_tokens": 50,
                "output_tokens": 8,
                "prefix_id": 7,
                "prefix_tokens": 40,
            },
        ],
    )
    records = read_trace(trace)
    assert [r.arrival_s for r in records] == [0.0, 1.0, 2.5, 3.0, 4.0]
    assert records[0].output_tokens == 1  # at least one token
    assert records[1].prefix_block_ids == records[3].prefix_block_ids == (1,)
    assert records[1].block_tokens == 300
    assert records[4].prefix_block_ids == (2,) and records[4].block_tokens == 40
    assert records[2].prefix_block_ids == ()


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{oops", r"own\.jsonl:2: not JSON"),
        ("[1, 2]", r"own\.jsonl:2: a row must be a JSON object"),
        ({"arrival_s": 1, "prompt_tokens": 5}, r"own\.jsonl:2: missing output_tokens"),
        (
            {"arrival_s": 1, "prompt_tokens": 5, "output_tokens": 1, "tenant": "x"},
            r"own\.jsonl:2: unknown field 'tenant'",
        ),
        (
            {"arrival_s": "soon", "prompt_tokens": 5, "output_tokens": 1},
            r"own\.jsonl:2: arrival_s 'soon' is not a number",
        ),
        (
            {"arrival_s": -1, "prompt_tokens": 5, "output_tokens": 1},
            r"own\.jsonl:2: arrival_s -1 is not a non-negative number",
        ),
        (
            {"arrival_s": 1, "prompt_tokens": "many", "output_tokens": 1},
            r"own\.jsonl:2: prompt_tokens 'many' is not an integer",
        ),
        (
            {"arrival_s": 1, "prompt_tokens": 5, "output_tokens": -2},
            r"own\.jsonl:2: output_tokens -2 is negative",
        ),
        (
            {"arrival_s": 1, "prompt_tokens": 5, "output_tokens": 1, "prefix_id": "a"},
            r"own\.jsonl:2: prefix_id and prefix_tokens go together",
        ),
        (
            {
                "arrival_s": 1,
                "prompt_tokens": 5,
                "output_tokens": 1,
                "prefix_id": "a",
                "prefix_tokens": 9,
            },
            r"own\.jsonl:2: prefix_tokens 9 is more than prompt_tokens 5",
        ),
    ],
)
def test_malformed_rows_name_file_and_line(tmp_path: Path, row: Any, message: str) -> None:
    good = {"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1}
    trace = write_rows(tmp_path / "own.jsonl", [good, row])
    with pytest.raises(TraceError, match=message) as err:
        read_trace(trace)
    assert "\n" not in str(err.value)


def test_a_prefix_id_has_one_length(tmp_path: Path) -> None:
    rows = [
        {
            "arrival_s": 0,
            "prompt_tokens": 50,
            "output_tokens": 1,
            "prefix_id": "a",
            "prefix_tokens": 9,
        },
        {"arrival_s": 1, "prompt_tokens": 50, "output_tokens": 1},
        {
            "arrival_s": 2,
            "prompt_tokens": 50,
            "output_tokens": 1,
            "prefix_id": "a",
            "prefix_tokens": 8,
        },
    ]
    with pytest.raises(TraceError, match=r"own\.jsonl:3: prefix_id 'a' has prefix_tokens 8 here"):
        read_trace(write_rows(tmp_path / "own.jsonl", rows))


def test_mooncake_timestamp_must_be_a_number(tmp_path: Path) -> None:
    trace = write_rows(
        tmp_path / "m.jsonl",
        [{"timestamp": "noon", "input_length": 5, "output_length": 1, "hash_ids": []}],
    )
    with pytest.raises(TraceError, match=r"m\.jsonl:1: timestamp 'noon' is not a number"):
        read_trace(trace)


def test_builtin_references() -> None:
    assert resolve_trace("builtin:azure-code").name == "azure-llm-inference-2023-code-excerpt.csv"
    assert resolve_trace("builtin:Azure-Code").is_file()
    with pytest.raises(TraceError, match="built-in traces: builtin:azure-code"):
        resolve_trace("builtin:azure-chat")


def test_relative_paths_resolve_against_a_base(tmp_path: Path) -> None:
    write_rows(tmp_path / "t.jsonl", [{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}])
    assert resolve_trace("t.jsonl", base_dir=tmp_path) == (tmp_path / "t.jsonl").resolve()
    with pytest.raises(TraceError, match=r"'t\.jsonl' is not a file"):
        resolve_trace("t.jsonl", base_dir=tmp_path / "elsewhere")


def test_load_trace_rereads_a_changed_file(tmp_path: Path) -> None:
    path = write_rows(
        tmp_path / "t.jsonl", [{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}]
    )
    assert len(load_trace(path)) == 1
    assert load_trace(path) is load_trace(path)
    write_rows(
        path,
        [
            {"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1},
            {"arrival_s": 1, "prompt_tokens": 2, "output_tokens": 1},
        ],
    )
    assert len(load_trace(path)) == 2

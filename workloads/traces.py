"""Trace readers: Azure LLM inference CSV, Mooncake JSONL, Qwen-Bailian JSONL, our own JSONL.

Every reader returns ``TraceRecord``s sorted by arrival, with arrival times in
seconds from the first request. A malformed row is an error naming the file and
line number; nothing is silently skipped.

* Azure (Patel et al., "Splitwise", ISCA 2024; CC-BY 4.0):
  ``TIMESTAMP,ContextTokens,GeneratedTokens``.
* Mooncake: one JSON object per line with ``timestamp`` (ms), ``input_length``,
  ``output_length`` and ``hash_ids`` (one id per 512-token block of the prompt;
  equal ids mean equal prompt blocks, which is what prefix caching reuses).
  The FAST'25 release's three traces (``conversation_trace.jsonl``,
  ``toolagent_trace.jsonl``: a tool-and-agent workload, ``synthetic_trace.jsonl``) share
  this format (kvcache-ai/Mooncake, FAST25-release/README.md). AIPerf's multi-turn
  variant (rows with ``session_id`` and a ``delay`` after the previous answer instead
  of a ``timestamp``) is closed-loop sessions, not arrivals: refused, saying so.
* Qwen-Bailian (alibaba-edu/qwen-bailian-usagetraces-anon, Apache 2.0; Wang et al.,
  "KVCache Cache in the Wild", USENIX ATC 2025): one JSON object per line with
  ``chat_id``, ``parent_chat_id`` (-1 for a session's first request), ``timestamp``
  (seconds), ``input_length``, ``output_length``, ``type``, ``turn`` and ``hash_ids``
  (one id per 16-token block). Its to-B trace is task automation with API calls: agent
  traffic. Every row is a whole request (a later turn's blocks include its history),
  so rows replay as open-loop arrivals whose equal blocks are equal text.
* Own JSONL: ``arrival_s``, ``prompt_tokens``, ``output_tokens`` and optional
  ``prefix_id`` / ``prefix_tokens``: the first ``prefix_tokens`` of the prompt are
  identical in every row with the same ``prefix_id`` (a shared system prompt or
  document). It becomes one shared block of ``prefix_tokens`` tokens.

Shipped traces are named ``builtin:NAME`` (``resolve_trace`` turns a name into
its file); ``load_trace`` reads and caches a trace by path.
"""

from __future__ import annotations

import csv
import functools
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

MOONCAKE_BLOCK_TOKENS = 512
BAILIAN_BLOCK_TOKENS = 16
BAILIAN_FIELDS = ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length")
BUILTIN_PREFIX = "builtin:"
_DATA_DIR = Path(__file__).resolve().parent / "data"
# Shipped traces, by the name that follows "builtin:".
BUILTIN_TRACES: dict[str, str] = {
    "azure-code": "azure-llm-inference-2023-code-excerpt.csv",
}


class TraceError(ValueError):
    """A trace file could not be read; the message names the file and line."""


@dataclass(frozen=True)
class TraceRecord:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    # Ids of the prompt's shared blocks, each block_tokens long (empty: no sharing).
    prefix_block_ids: tuple[int, ...] = ()
    block_tokens: int = MOONCAKE_BLOCK_TOKENS


def _positive_int(value: object, what: str, where: str) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise TraceError(f"{where}: {what} {value!r} is not an integer") from None
    if number < 0:
        raise TraceError(f"{where}: {what} {number} is negative")
    return number


def read_azure_csv(path: Path) -> list[TraceRecord]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read trace {str(path)!r}: {exc.strerror}") from exc
    rows = csv.DictReader(text.splitlines())
    wanted = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
    if rows.fieldnames is None or not wanted <= set(rows.fieldnames):
        raise TraceError(
            f"{path}: not an Azure LLM inference trace; expected columns "
            "TIMESTAMP,ContextTokens,GeneratedTokens"
        )
    records: list[tuple[datetime, int, int]] = []
    for line, row in enumerate(rows, start=2):
        where = f"{path}:{line}"
        stamp = (row["TIMESTAMP"] or "").strip()
        try:
            # Seven fractional digits in the trace; datetime takes six.
            head, _, frac = stamp.partition(".")
            when = datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}" if frac else head)
        except ValueError:
            raise TraceError(f"{where}: TIMESTAMP {stamp!r} is not a date and time") from None
        prompt = _positive_int(row["ContextTokens"], "ContextTokens", where)
        output = _positive_int(row["GeneratedTokens"], "GeneratedTokens", where)
        records.append((when, prompt, output))
    if not records:
        raise TraceError(f"{path}: the trace has no requests")
    records.sort(key=lambda r: r[0])
    start = records[0][0]
    return [
        TraceRecord(
            arrival_s=(when - start).total_seconds(), prompt_tokens=p, output_tokens=max(o, 1)
        )
        for when, p, o in records
    ]


def _json_rows(path: Path) -> Iterator[tuple[str, object]]:
    """A JSON-lines trace's rows, each with where it is (``path:line``), blank lines left out."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TraceError(f"cannot read trace {str(path)!r}: {exc.strerror}") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not JSON ({exc.msg})") from None


def _from_first_arrival(path: Path, records: list[TraceRecord]) -> list[TraceRecord]:
    """``records`` in arrival order, their times from the first one's."""
    if not records:
        raise TraceError(f"{path}: the trace has no requests")
    records.sort(key=lambda r: r.arrival_s)
    start = records[0].arrival_s
    return [replace(r, arrival_s=r.arrival_s - start) for r in records]


def read_mooncake_jsonl(path: Path) -> list[TraceRecord]:
    out: list[TraceRecord] = []
    for where, obj in _json_rows(path):
        if (
            isinstance(obj, dict)
            and "timestamp" not in obj
            and {"session_id", "delay"} & obj.keys()
        ):
            raise TraceError(
                f"{where}: a multi-turn Mooncake row (session_id, delay: AIPerf's agentic "
                "format) is a closed-loop session, not an arrival; accepted: rows with a "
                "timestamp (Mooncake, Qwen-Bailian), or a workload with sessions"
            )
        if (
            not isinstance(obj, dict)
            or not {"timestamp", "input_length", "output_length"} <= obj.keys()
        ):
            raise TraceError(
                f"{where}: a Mooncake row needs timestamp, input_length, output_length"
            )
        hash_ids = obj.get("hash_ids") or []
        if not isinstance(hash_ids, list):
            raise TraceError(f"{where}: hash_ids must be a list of integers")
        out.append(
            TraceRecord(
                arrival_s=_seconds(obj["timestamp"], "timestamp", where) / 1000.0,
                prompt_tokens=_positive_int(obj["input_length"], "input_length", where),
                output_tokens=max(_positive_int(obj["output_length"], "output_length", where), 1),
                prefix_block_ids=tuple(_positive_int(h, "hash id", where) for h in hash_ids),
            )
        )
    return _from_first_arrival(path, out)


def read_bailian_jsonl(path: Path) -> list[TraceRecord]:
    """Qwen-Bailian rows: whole requests at ``timestamp`` seconds, 16-token hash blocks."""
    out: list[TraceRecord] = []
    for where, obj in _json_rows(path):
        if not isinstance(obj, dict) or not set(BAILIAN_FIELDS) <= obj.keys():
            raise TraceError(f"{where}: a Qwen-Bailian row needs {', '.join(BAILIAN_FIELDS)}")
        hash_ids = obj.get("hash_ids") or []
        if not isinstance(hash_ids, list):
            raise TraceError(f"{where}: hash_ids must be a list of integers")
        out.append(
            TraceRecord(
                arrival_s=_seconds(obj["timestamp"], "timestamp", where),
                prompt_tokens=_positive_int(obj["input_length"], "input_length", where),
                output_tokens=max(_positive_int(obj["output_length"], "output_length", where), 1),
                prefix_block_ids=tuple(_positive_int(h, "hash id", where) for h in hash_ids),
                block_tokens=BAILIAN_BLOCK_TOKENS,
            )
        )
    return _from_first_arrival(path, out)


def _seconds(value: object, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TraceError(f"{where}: {what} {value!r} is not a number")
    try:
        number = float(value)
    except ValueError:
        raise TraceError(f"{where}: {what} {value!r} is not a number") from None
    if not math.isfinite(number) or number < 0:
        raise TraceError(f"{where}: {what} {value!r} is not a non-negative number")
    return number


OWN_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens")


def read_own_jsonl(path: Path) -> list[TraceRecord]:
    """Our JSONL: arrival_s, prompt_tokens, output_tokens, optional prefix_id / prefix_tokens."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TraceError(f"cannot read trace {str(path)!r}: {exc.strerror}") from exc
    out: list[TraceRecord] = []
    prefix_ids: dict[str, int] = {}  # prefix_id -> block id (order of first appearance)
    prefix_sizes: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: a row must be a JSON object with {', '.join(OWN_FIELDS)}")
        missing = [name for name in OWN_FIELDS if name not in obj]
        if missing:
            raise TraceError(
                f"{where}: missing {', '.join(missing)}; a row needs {', '.join(OWN_FIELDS)}"
                " (optional prefix_id, prefix_tokens)"
            )
        unknown = sorted(set(obj) - {*OWN_FIELDS, "prefix_id", "prefix_tokens"})
        if unknown:
            raise TraceError(
                f"{where}: unknown field {unknown[0]!r}; accepted: {', '.join(OWN_FIELDS)},"
                " prefix_id, prefix_tokens"
            )
        arrival = _seconds(obj["arrival_s"], "arrival_s", where)
        prompt = _positive_int(obj["prompt_tokens"], "prompt_tokens", where)
        output = _positive_int(obj["output_tokens"], "output_tokens", where)
        blocks: tuple[int, ...] = ()
        block_tokens = MOONCAKE_BLOCK_TOKENS
        has_id, has_tokens = obj.get("prefix_id") is not None, "prefix_tokens" in obj
        if has_id != has_tokens:
            raise TraceError(f"{where}: prefix_id and prefix_tokens go together; one is missing")
        if has_id:
            key = str(obj["prefix_id"])
            size = _positive_int(obj["prefix_tokens"], "prefix_tokens", where)
            if size > prompt:
                raise TraceError(
                    f"{where}: prefix_tokens {size} is more than prompt_tokens {prompt}"
                )
            if prefix_sizes.setdefault(key, size) != size:
                raise TraceError(
                    f"{where}: prefix_id {key!r} has prefix_tokens {size} here and "
                    f"{prefix_sizes[key]} before; a prefix has one length"
                )
            if size > 0:
                blocks = (prefix_ids.setdefault(key, len(prefix_ids) + 1),)
                block_tokens = size
        out.append(TraceRecord(arrival, prompt, max(output, 1), blocks, block_tokens))
    if not out:
        raise TraceError(f"{path}: the trace has no requests")
    out.sort(key=lambda r: r.arrival_s)
    start = out[0].arrival_s
    return [
        TraceRecord(
            r.arrival_s - start,
            r.prompt_tokens,
            r.output_tokens,
            r.prefix_block_ids,
            r.block_tokens,
        )
        for r in out
    ]


def read_trace(path: Path) -> list[TraceRecord]:
    """Read a trace, choosing the reader by content: CSV header, own, Qwen-Bailian or
    Mooncake JSONL."""
    try:
        with path.open(encoding="utf-8") as fh:
            first = fh.readline()
            while first and not first.strip():
                first = fh.readline()
    except OSError as exc:
        raise TraceError(f"cannot read trace {str(path)!r}: {exc.strerror}") from exc
    if first.startswith("TIMESTAMP"):
        return read_azure_csv(path)
    if first.lstrip().startswith("{"):
        if '"arrival_s"' in first:
            return read_own_jsonl(path)
        if '"chat_id"' in first and '"parent_chat_id"' in first:
            return read_bailian_jsonl(path)
        return read_mooncake_jsonl(path)
    raise TraceError(
        f"{path}: unknown trace format; accepted: Azure CSV (TIMESTAMP,ContextTokens,"
        "GeneratedTokens), Mooncake JSONL (timestamp, input_length, output_length, hash_ids),"
        " Qwen-Bailian JSONL (chat_id, parent_chat_id, timestamp, input_length, output_length,"
        " hash_ids) or JSONL with arrival_s, prompt_tokens, output_tokens"
    )


def resolve_trace(ref: str, *, base_dir: Path | None = None) -> Path:
    """The file of a trace reference: ``builtin:NAME`` or a path (relative to base_dir)."""
    if ref.startswith(BUILTIN_PREFIX):
        name = ref[len(BUILTIN_PREFIX) :].strip().lower()
        if name not in BUILTIN_TRACES:
            accepted = ", ".join(BUILTIN_PREFIX + n for n in sorted(BUILTIN_TRACES))
            raise TraceError(f"trace {ref!r} is not shipped; built-in traces: {accepted}")
        return _DATA_DIR / BUILTIN_TRACES[name]
    path = Path(ref).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_file():
        accepted = ", ".join(BUILTIN_PREFIX + n for n in sorted(BUILTIN_TRACES))
        raise TraceError(
            f"trace {ref!r} is not a file (looked at {path}); or use one of {accepted}"
        )
    return path.resolve()


def load_trace(path: Path) -> tuple[TraceRecord, ...]:
    """Read a trace once per file version (path, size and mtime key a small cache)."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise TraceError(f"cannot read trace {str(path)!r}: {exc.strerror}") from exc
    return _load_trace_cached(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def recorded_pass_s(records: Sequence[TraceRecord]) -> float:
    """How long one pass of a trace lasts as recorded, looped: its span and one mean gap
    before it starts again (1 s for a single request or a span of 0)."""
    if not records:
        raise TraceError("the trace has no requests")
    n = len(records)
    span = records[-1].arrival_s - records[0].arrival_s
    return span + (span / (n - 1) if n > 1 and span > 0 else 1.0)


def recorded_rate_per_s(records: Sequence[TraceRecord]) -> float:
    """The trace's own mean rate, looped as recorded: its requests over one pass."""
    return len(records) / recorded_pass_s(records)


@functools.lru_cache(maxsize=8)
def _load_trace_cached(path: str, size: int, mtime_ns: int) -> tuple[TraceRecord, ...]:
    del size, mtime_ns  # cache key only
    return tuple(read_trace(Path(path)))


def prefix_free_digits(value: int, base: int) -> list[int]:
    """``value`` written prefix-free in ``base``: its digit count (mod ``base``), then its
    digits, most significant first. Distinct block ids so encoded never start one another,
    so the tokens or words they open differ whatever follows."""
    digits: list[int] = []
    rest = value
    while True:
        rest, digit = divmod(rest, base)
        digits.append(digit)
        if rest == 0:
            break
    return [len(digits) % base, *reversed(digits)]

"""vLLM's /metrics text read as Prometheus' own parser reads it."""

from __future__ import annotations

import pytest

from tuner.serving.prometheus_scrape import parse_prometheus

EXPOSITION = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="my model, v2"} 3.0
vllm:num_requests_running{engine="1",model_name="my model, v2"} 4.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="say \\"hi\\" } 9"} 1200.0 1733040000000
vllm:generation_tokens_created{engine="0",model_name="say \\"hi\\" } 9"} 1.7e9
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 5.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 8.0
vllm:time_to_first_token_seconds_count{model_name="m"} 8.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 1.25
"""


def test_label_values_with_spaces_commas_and_quotes_and_timestamps() -> None:
    values = parse_prometheus(EXPOSITION)
    # Summed over label sets (both engines).
    assert values["vllm:num_requests_running"] == 7.0
    # The value, not the timestamp after it; a brace and quotes inside a label value.
    assert values["vllm:generation_tokens_total"] == 1200.0
    assert values["vllm:time_to_first_token_seconds_bucket"] == 13.0
    assert values["vllm:time_to_first_token_seconds_count"] == 8.0
    assert values["vllm:time_to_first_token_seconds_sum"] == pytest.approx(1.25)


def test_a_truncated_scrape_gives_what_was_read_before_it() -> None:
    cut = EXPOSITION[: EXPOSITION.index("vllm:time_to_first_token_seconds_count")] + 'vllm:x{a="b'
    values = parse_prometheus(cut)
    assert values["vllm:num_requests_running"] == 7.0
    assert "vllm:x" not in values
    assert parse_prometheus("") == {}


def test_the_simulators_exposition_reads_whole() -> None:
    from tuner.sim.prometheus import EngineSnapshot, ServerMetrics

    metrics = ServerMetrics('llama "3" 8b, test')
    snapshot = EngineSnapshot(
        num_running=2, num_waiting=1, kv_cache_usage=0.25, num_preemptions=3,
        prompt_tokens=400, generation_tokens=90, prefix_cache_queries=40, prefix_cache_hits=10,
    )  # fmt: skip
    text = metrics.render(snapshot)
    values = parse_prometheus(text)
    # Every sample line the simulator wrote was read (none lost to a parse error).
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(samples) > 20
    assert values["vllm:num_requests_running"] == 2.0
    assert values["vllm:num_requests_waiting"] == 1.0
    assert values["vllm:kv_cache_usage_perc"] == 0.25
    assert values["vllm:num_preemptions_total"] == 3.0
    assert values["vllm:generation_tokens_total"] == 90.0
    assert values["vllm:prefix_cache_hits_total"] == 10.0
    last = samples[-1].split("{")[0].split(" ")[0]
    assert last in values

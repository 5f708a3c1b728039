"""`tuner sim-serve` as a launcher sees it: a subprocess, its log, its HTTP API and /metrics."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.integration.simserver import Launch, SimServer, spawn_sim
from tuner.sim.tokenizer import decode_token
from tuner.vllm.classify import classify_failure
from tuner.vllm.failures import StartupFailureKind
from tuner.vllm.log import parse_startup_log
from tuner.vllm.models import resolve_model

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SMALL = ("--model", "qwen2.5-7b", "--gpu", "H100-80GB", "--max-model-len", "4096")


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """One default server for the tests that only send requests to it."""
    log_path = tmp_path_factory.mktemp("shared") / "sim-serve.log"
    server = spawn_sim((*SMALL, "--time-scale", "0.2"), log_path)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of one metric whose labels include the given ones."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        metric_name, _, label_text = series.partition("{")
        if metric_name != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(value)
    return total


def words(n: int, stem: str = "w") -> str:
    return " ".join(f"{stem}{i}" for i in range(n))


def tuner_plan(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "plan", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    data: dict[str, Any] = json.loads(out.stdout)
    return data


# --- the OpenAI API -----------------------------------------------------------------------


def test_openai_client_completions(shared: SimServer) -> None:
    client = openai.OpenAI(base_url=f"{shared.url}/v1", api_key="unused", max_retries=0)
    (model,) = [m.id for m in client.models.list().data]
    assert model == "qwen2.5-7b"

    done = client.completions.create(
        model=model, prompt=words(7), max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert done.usage is not None
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (7, 5)
    assert len(done.choices[0].text.split()) == 5
    assert done.choices[0].finish_reason == "length"

    stream = client.completions.create(
        model=model,
        prompt=words(11),
        max_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) == 9
    usage = chunks[-1].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (11, 9)


def test_openai_client_chat(shared: SimServer) -> None:
    client = openai.OpenAI(base_url=f"{shared.url}/v1", api_key="unused", max_retries=0)
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [
        {"role": "system", "content": "you are terse"},
        {"role": "user", "content": "name four colours"},
    ]
    done = client.chat.completions.create(
        model="qwen2.5-7b", messages=messages, max_tokens=6, extra_body={"ignore_eos": True}
    )
    assert done.usage is not None
    # One role marker per message plus the words: (1 + 3) + (1 + 3).
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (8, 6)
    assert done.choices[0].message.role == "assistant"
    assert len((done.choices[0].message.content or "").split()) == 6

    stream = client.chat.completions.create(
        model="qwen2.5-7b",
        messages=messages,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    contents = [c.choices[0].delta.content for c in chunks if c.choices]
    assert contents[0] == "" and len([c for c in contents if c]) == 4
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_sse_events_are_one_per_token(shared: SimServer) -> None:
    body = {"prompt": words(20), "max_tokens": 12, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{shared.url}/v1/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["x-sim-time-scale"] == "0.2"
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) == 12
    assert [c["choices"][0]["finish_reason"] for c in chunks][-2:] == [None, "length"]


def expected_texts(request_id: str, count: int) -> list[str]:
    """The simulator's deterministic output tokens of a request (engine._next_token)."""
    vocab = resolve_model("qwen2.5-7b").vocab_size
    seed = zlib.crc32(request_id.encode())
    return [decode_token((seed + i * 7919) % (vocab - 1)) for i in range(count)]


def test_sse_events_are_compact_json_in_token_order(shared: SimServer) -> None:
    body = {"prompt": words(8), "max_tokens": 40, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    headers = {"X-Request-Id": "order-1"}
    with httpx.stream("POST", f"{shared.url}/v1/completions", json=body, headers=headers) as resp:
        payloads = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    # Byte for byte what vLLM writes: compact JSON, keys in vLLM's order.
    assert [json.dumps(c, separators=(",", ":")) for c in chunks] == payloads[:-1]
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == expected_texts("order-1", 40)
    assert chunks[-1]["usage"]["completion_tokens"] == 40


def test_sim_requests_reports_each_side_of_a_request(shared: SimServer) -> None:
    body = {"prompt": words(30), "max_tokens": 6, "ignore_eos": True, "stream": True}
    headers = {"X-Request-Id": "truth-1"}
    sent_s = time.time()
    with httpx.stream("POST", f"{shared.url}/v1/completions", json=body, headers=headers) as resp:
        seen = [time.time() for line in resp.iter_lines() if line.startswith('data: {"')]
    truth = httpx.get(f"{shared.url}/sim/requests", timeout=5).json()["requests"]
    (timing,) = [t for t in truth if t["request_id"] == "truth-1"]
    written, generated = timing["token_times_s"], timing["generated_s"]
    assert len(written) == len(generated) == 6
    assert sent_s <= timing["received_s"] <= timing["arrival_s"] <= generated[0] <= written[0]
    assert all(g <= w for g, w in zip(generated, written, strict=True))
    assert written == sorted(written) and written[-1] <= seen[-1]


def test_prompt_longer_than_max_model_len_is_rejected(shared: SimServer) -> None:
    client = openai.OpenAI(base_url=f"{shared.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="qwen2.5-7b", prompt=words(5000), max_tokens=1)
    assert err.value.status_code == 400
    assert "maximum context length is 4096 tokens" in str(err.value)


def test_client_disconnect_aborts_the_request(shared: SimServer) -> None:
    before = metric(shared.metrics(), "vllm:request_success_total", finished_reason="abort")
    body = {"prompt": words(10), "max_tokens": 3000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{shared.url}/v1/completions", json=body, timeout=30) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                break
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        text = shared.metrics()
        aborted = metric(text, "vllm:request_success_total", finished_reason="abort")
        if aborted > before and metric(text, "vllm:num_requests_running") == 0:
            break
        time.sleep(0.05)
    assert aborted == before + 1
    assert metric(text, "vllm:num_requests_running") == 0


def test_shared_prefix_hits_the_prefix_cache(shared: SimServer) -> None:
    before = metric(shared.metrics(), "vllm:prefix_cache_hits_total")
    prefix = words(256, stem="shared")
    client = openai.OpenAI(base_url=f"{shared.url}/v1", api_key="unused", max_retries=0)
    for i in range(3):
        client.completions.create(
            model="qwen2.5-7b", prompt=f"{prefix} {words(8, stem=f'q{i}x')}", max_tokens=1
        )
    hits = metric(shared.metrics(), "vllm:prefix_cache_hits_total") - before
    assert hits >= 2 * 256  # the second and third requests reuse the whole shared prefix


def test_sim_gpu_is_consistent(shared: SimServer) -> None:
    plan = tuner_plan(*SMALL)
    body = {"prompt": words(500), "max_tokens": 400, "ignore_eos": True, "stream": True}
    busy: dict[str, float] = {}
    with httpx.stream("POST", f"{shared.url}/v1/completions", json=body, timeout=30) as resp:
        for line in resp.iter_lines():  # read to the end: leaving early would abort the request
            if line.startswith("data: ") and not busy:
                busy = httpx.get(f"{shared.url}/sim/gpu", timeout=5).json()
    assert busy["used_bytes"] <= busy["total_bytes"]
    assert busy["free_bytes"] == busy["total_bytes"] - busy["used_bytes"]
    assert busy["process_used_bytes"] > plan["weights_bytes"] + plan["kv_cache_bytes"]
    assert 0 < busy["kv_cache_usage"] <= 1
    assert 0 < busy["utilization_percent"] <= 100
    assert busy["power_watts"] > 70
    assert busy["time_scale"] == 0.2


# --- startup --------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.11", "0.33"])
def test_startup_log_parses_to_the_plan(launch: Launch, version: str) -> None:
    server = launch(*SMALL, "--vllm-version", version, "--gpu-memory-utilization", "0.8")
    report = parse_startup_log(server.log())
    assert report.boot_state is not None  # its first start of that compile key: cold
    plan = tuner_plan(
        *SMALL, "--vllm-version", version, "--gpu-memory-utilization", "0.8",
        "--boot", report.boot_state.value,
    )  # fmt: skip
    assert report.ready
    assert report.vllm_version == f"{version}.0"
    assert report.kv_cache_tokens == plan["kv_cache_tokens"]
    assert report.max_model_len == 4096
    assert report.gpu_memory_utilization == 0.8
    assert report.max_concurrency == plan["max_concurrency"]


def test_startup_that_does_not_fit_fails_like_vllm(launch: Launch) -> None:
    args = ("--model", "llama-3.1-8b", "--gpu", "H100-80GB", "--gpu-memory-utilization", "0.15")
    server = launch(*args, healthy=False)
    assert server.wait_exit() == 1
    failure = tuner_plan(*args)["failure"]
    assert isinstance(failure, dict)
    log = server.log()
    assert f"ValueError: {failure['message']}" in log
    assert "RuntimeError: Engine core initialization failed. See root cause above." in log
    assert "Application startup complete" not in log


def test_more_tensor_parallel_ranks_than_the_host_has_gpus_fails_like_vllm(
    launch: Launch,
) -> None:
    server = launch(*SMALL, "--tensor-parallel-size", "4", "--gpu-count", "2", healthy=False)
    assert server.wait_exit() == 1
    log = server.log()
    assert "Tensor parallel size (4) cannot be larger than the number of available GPUs (2)." in log
    assert "Application startup complete" not in log
    failure = classify_failure(log)
    assert failure is not None and failure.kind is StartupFailureKind.INVALID_CONFIGURATION

    fits = launch(*SMALL, "--tensor-parallel-size", "2", "--gpu-count", "2")
    assert httpx.get(f"{fits.url}/health", timeout=5).status_code == 200
    assert "tensor_parallel_size=2" in fits.log()


def test_swap_space_is_rejected_where_vllm_removed_it(launch: Launch) -> None:
    rejected = launch(*SMALL, "--swap-space", "4", healthy=False)
    assert rejected.wait_exit() == 2
    assert rejected.log().strip() == "vllm: error: unrecognized arguments: --swap-space 4"

    accepted = launch(*SMALL, "--swap-space", "4", "--vllm-version", "0.17")
    assert httpx.get(f"{accepted.url}/health", timeout=5).status_code == 200


def test_block_size_outside_the_version_choices_is_rejected(launch: Launch) -> None:
    server = launch(*SMALL, "--vllm-version", "0.11", "--block-size", "48", healthy=False)
    assert server.wait_exit() == 2
    assert "argument --block-size: invalid choice: 48 (choose from 1, 8, 16, 32, 64, 128" in (
        server.log()
    )


def test_the_clock_slows_while_the_server_runs(launch: Launch) -> None:
    """``POST /sim/time-scale``: the same request's tokens come K times slower from then on,
    and every response says the new scale (how the tuner gives a lagging client room)."""
    server = launch(*SMALL)

    def token_span_s(request_id: str) -> float:
        body = {"prompt": words(30), "max_tokens": 40, "ignore_eos": True}
        headers = {"X-Request-Id": request_id}
        resp = httpx.post(f"{server.url}/v1/completions", json=body, headers=headers, timeout=30)
        assert resp.status_code == 200
        truth = httpx.get(f"{server.url}/sim/requests", timeout=5).json()["requests"]
        (timing,) = [t for t in truth if t["request_id"] == request_id]
        return float(timing["generated_s"][-1] - timing["generated_s"][0])

    before = token_span_s("at-1")
    bad = httpx.post(f"{server.url}/sim/time-scale", json={"time_scale": 0}, timeout=5)
    assert bad.status_code == 400 and "time_scale" in bad.text
    resp = httpx.post(f"{server.url}/sim/time-scale", json={"time_scale": 4}, timeout=5)
    assert resp.json() == {"time_scale": 4.0, "was": 1.0}
    assert resp.headers["x-sim-time-scale"] == "4.0"
    assert httpx.get(f"{server.url}/sim/gpu", timeout=5).json()["time_scale"] == 4.0
    assert token_span_s("at-4") == pytest.approx(4 * before, rel=0.3)


def test_sigterm_stops_the_server_cleanly(launch: Launch) -> None:
    server = launch(*SMALL)
    os.killpg(server.proc.pid, signal.SIGTERM)
    assert server.wait_exit(10) == 0
    assert "Application shutdown complete." in server.log()


# --- under load -----------------------------------------------------------------------------


async def _post_all(url: str, bodies: list[dict[str, object]]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(timeout=45, limits=limits) as client:
        return await asyncio.gather(*(client.post(url, json=b) for b in bodies))


def test_small_kv_cache_preempts(launch: Launch) -> None:
    # 80 blocks of 16 tokens; requests growing to 700 tokens (44 blocks): two cannot both fit.
    server = launch(
        *("--model", "qwen2.5-7b", "--max-model-len", "1024"),
        *("--kv-cache-memory-bytes", str(80 * 917504), "--time-scale", "0.05"),
    )
    body: dict[str, object] = {"prompt": words(200), "max_tokens": 500, "ignore_eos": True}
    responses = asyncio.run(_post_all(f"{server.url}/v1/completions", [body] * 4))
    assert [r.status_code for r in responses] == [200] * 4
    assert all(r.json()["usage"]["completion_tokens"] == 500 for r in responses)
    text = server.metrics()
    assert metric(text, "vllm:num_preemptions_total") > 0
    assert metric(text, "vllm:request_success_total", finished_reason="length") == 4
    assert metric(text, "vllm:generation_tokens_total") == 4 * 500


def test_logprobs_without_headroom_kill_the_engine(launch: Launch) -> None:
    # 0.998 leaves ~162 MiB beyond the budget; logprobs rows of a 152k vocabulary need 1.2 MB each.
    server = launch(*SMALL, "--gpu-memory-utilization", "0.998", "--time-scale", "0.2")
    body: dict[str, object] = {
        "prompt": words(10),
        "max_tokens": 2000,  # long enough that all 200 overlap however slowly they arrive
        "ignore_eos": True,
        "logprobs": 1,
    }
    responses = asyncio.run(_post_all(f"{server.url}/v1/completions", [body] * 200))
    statuses = {r.status_code for r in responses}
    assert 500 in statuses
    failed = next(r for r in responses if r.status_code == 500)
    assert "EngineCore encountered an issue" in failed.json()["error"]["message"]
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 503
    after = httpx.post(f"{server.url}/v1/completions", json=body, timeout=5)
    assert after.status_code == 500
    log = server.log()
    assert "EngineCore encountered a fatal error." in log
    assert "torch.OutOfMemoryError: CUDA out of memory." in log
    assert "died unexpectedly" in log


def test_a_prompt_that_fills_the_context_gets_vllms_400_body(shared: SimServer) -> None:
    body = {"model": "qwen2.5-7b", "prompt": words(4096), "max_tokens": 1}
    response = httpx.post(f"{shared.url}/v1/completions", json=body, timeout=10)
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": "This model's maximum context length is 4096 tokens. However, your "
            "request has 4096 input tokens. Please reduce the length of the input messages.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    }


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ("--time-scale", "nan"),
            "--time-scale nan is not accepted; accepted: a finite number > 0",
        ),
        (("--time-scale", "-1"), "--time-scale -1.0 is not accepted"),
        (("--startup-delay", "inf"), "--startup-delay inf is not accepted"),
        (("--swap-space", "nan", "--vllm-version", "0.17"), "--swap-space nan is not accepted"),
        (("--cpu-offload-gb", "-2"), "--cpu-offload-gb -2.0 is not accepted"),
        (("--gpu-count", "0"), "--gpu-count 0 is not accepted; accepted: 1 or more"),
    ],
)
def test_bad_simulator_values_are_one_line_before_serving(
    launch: Launch, args: tuple[str, ...], expected: str
) -> None:
    server = launch(*SMALL, *args, healthy=False)
    assert server.wait_exit() == 2
    (line,) = server.log().strip().splitlines()
    assert line.startswith("tuner: error: ") and expected in line


class TestApiKey:
    """vLLM's --api-key / VLLM_API_KEY: every /v1 path needs the key, the rest is open."""

    def test_the_key_from_the_environment_guards_every_v1_path(
        self, launch: Launch, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("VLLM_API_KEY", "sk-sim")
        server = launch(*SMALL)
        v1 = ("/v1/models", "/v1/nowhere")
        for path in v1:
            response = httpx.get(server.url + path, timeout=5)
            assert (response.status_code, response.json()) == (401, {"error": "Unauthorized"})
            wrong = httpx.get(server.url + path, headers={"Authorization": "Bearer x"}, timeout=5)
            assert wrong.status_code == 401
        body = {"prompt": words(5), "max_tokens": 2}
        assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=5).status_code == 401
        good = {"Authorization": "bearer sk-sim"}  # the scheme in any case, as vLLM takes it
        assert httpx.get(f"{server.url}/v1/models", headers=good, timeout=5).status_code == 200
        done = httpx.post(f"{server.url}/v1/completions", json=body, headers=good, timeout=5)
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 2
        for path in ("/health", "/metrics", "/version", "/sim/gpu"):
            assert httpx.get(server.url + path, timeout=5).status_code == 200, path

    def test_the_flag_takes_precedence_over_the_environment(
        self, launch: Launch, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("VLLM_API_KEY", "from-env")
        server = launch(*SMALL, "--api-key", "one", "two")
        for key, status in (("one", 200), ("two", 200), ("from-env", 401)):
            auth = {"Authorization": f"Bearer {key}"}
            assert httpx.get(f"{server.url}/v1/models", headers=auth, timeout=5).status_code == (
                status
            ), key

    def test_no_key_no_authentication(self, shared: SimServer) -> None:
        assert httpx.get(f"{shared.url}/v1/models", timeout=5).status_code == 200


def _tuner(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def test_bench_sends_the_key_and_without_it_says_401(launch: Launch, tmp_path: Path) -> None:
    from tests.integration.tune_run import TINY_WORKLOAD

    server = launch(*SMALL, "--api-key", "sk-bench")
    bench = ("bench", "--url", server.url, "--workload", str(TINY_WORKLOAD), "--duration", "2")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    with_key = _tuner(*bench, "--out", str(tmp_path / "with"), "--json",
                      env={**env, "VLLM_API_KEY": "sk-bench"})  # fmt: skip
    assert with_key.returncode == 0, with_key.stderr[-3000:]
    load = json.loads(with_key.stdout)["load"]
    assert load["num_completed"] > 0 and load["num_errors"] == 0

    without = _tuner(*bench, "--out", str(tmp_path / "without"), env=env)
    assert without.returncode == 2
    assert "answers 401 Unauthorized" in without.stderr and "VLLM_API_KEY is not set" in (
        without.stderr
    )
    assert len(without.stderr.strip().splitlines()) == 1
    wrong = _tuner(*bench, "--out", str(tmp_path / "wrong"), env={**env, "VLLM_API_KEY": "nope"})
    assert wrong.returncode == 2 and "is not one it accepts" in wrong.stderr


def test_a_trial_with_a_key_uses_it_everywhere(tmp_path: Path) -> None:
    """The launched simulator enforces VLLM_API_KEY; readiness, warm-up and load all send it."""
    from tests.integration.tune_run import TINY_WORKLOAD

    out_dir = tmp_path / "trial"
    done = _tuner("trial", "--model", "qwen2.5-7b", "--max-model-len", "4096",
                  "--workload", str(TINY_WORKLOAD), "--duration", "2", "--sim-startup-delay",
                  "0.1", "--out", str(out_dir), "--json",
                  env={**os.environ, "VLLM_API_KEY": "sk-trial"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["load"]["num_completed"] > 0 and result["load"]["num_errors"] == 0
    log = (out_dir / "server.log").read_text()
    assert '"GET /v1/models HTTP/1.1" 200' in log and " 401 " not in log

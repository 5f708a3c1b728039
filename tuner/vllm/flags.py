"""The `vllm serve` flags that shape memory and scheduling, shared by every command that takes them."""

from __future__ import annotations

import argparse

from tuner.vllm.memory import ServingParams


def add_memory_flags(parser: argparse.ArgumentParser) -> None:
    """Add vLLM's flags under vLLM's names; None means vLLM's default for the version."""
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        help="default: the emulated release's (0.92 from 0.20, 0.9 before)",
    )
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--max-num-batched-tokens", type=int)
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--cpu-offload-gb", type=float, default=0.0)
    parser.add_argument("--kv-cache-memory-bytes", type=int)
    parser.add_argument(
        "--no-enable-chunked-prefill", dest="enable_chunked_prefill", action="store_false"
    )
    parser.add_argument(
        "--vllm-version", help="emulated vLLM version X.Y (default: current release)"
    )


def params_from_args(args: argparse.Namespace) -> ServingParams:
    return ServingParams(
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        kv_cache_dtype=args.kv_cache_dtype,
        max_model_len=args.max_model_len,
        tensor_parallel_size=args.tensor_parallel_size,
        enforce_eager=args.enforce_eager,
        cpu_offload_gb=args.cpu_offload_gb,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        enable_chunked_prefill=args.enable_chunked_prefill,
    ).checked()

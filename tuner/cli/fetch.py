"""`tuner fetch --model MODEL`: the model's files vLLM loads, into the Hugging Face hub cache.

What `tuner tune` does before trial 0 on the vLLM backend, on its own: the nightly job
runs it first, so a host without access to a gated model fails in one line (exit 2)
before any server is launched, and the tune then finds the model in the cache.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "fetch",
        help="download a model's config, tokenizer and weights into the Hugging Face cache",
        description="Fetch the files vLLM loads for a model (config, tokenizer and chat "
        "template, safetensors weights) into the Hugging Face hub cache vLLM reads (HF_HUB_CACHE, "
        "else $HF_HOME/hub), checking access first: a gated model without a token or a name that "
        "is no repository is one line and exit 2. A local directory is not fetched; with "
        "HF_HUB_OFFLINE=1 the cached snapshot is checked without the network.",
    )
    p.add_argument(
        "--model", required=True, help="preset name, Hugging Face id, or model directory"
    )
    p.add_argument(
        "--no-weights",
        dest="weights",
        action="store_false",
        help="only the config, tokenizer and chat template (no weights)",
    )
    p.set_defaults(func=_cmd_fetch)


def _cmd_fetch(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tuner.serving.hub import fetch_model
    from tuner.vllm.models import launch_name

    name = launch_name(args.model)
    if Path(name).is_dir():
        print(f"model {name}: a local directory, nothing to fetch")
        return 0
    fetched = fetch_model(name, weights=args.weights)
    print(fetched.line())
    print(f"snapshot: {fetched.snapshot_dir}")
    return 0

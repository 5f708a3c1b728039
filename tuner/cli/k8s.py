"""`tuner k8s-job`: Kubernetes manifests that run one study from N tuning workers, one GPU each.

Prints ``tuner.deploy.tuning_job_manifests``: a Secret holding the storage URL
(unless ``--storage-secret`` names one that exists), the shared compile-cache claim
and an Indexed Job whose pods run ``tuner tune --model M --study NAME --resume
[extra tune args]`` and read the storage from ``$TUNER_STORAGE`` (the Secret, by
``secretKeyRef``). The URL may come from ``$TUNER_STORAGE`` here too, so its password
stays out of the shell history. Unless the extra args name one, the run directory is
``runs/<study>`` on the cache volume, shared by every pod (a ReadWriteMany claim by
default). Bad input is one line, exit 2.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from tuner import __version__
from tuner.cli import tune
from tuner.cli.args import OneLineParser
from tuner.cli.tune import STORAGE_ENV
from tuner.errors import ConfigError

DEFAULT_IMAGE = f"vllm-capacity-tuner:{__version__}"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "k8s-job",
        help="print a Kubernetes Indexed Job of N tuning workers sharing one study",
        description="Print Kubernetes manifests (YAML) for distributed tuning: a Secret with "
        "the study storage URL, a PersistentVolumeClaim for the shared compile cache and an "
        "Indexed Job of N workers, one GPU each, all running `tuner tune` on one study. "
        "Apply with `tuner k8s-job ... | kubectl apply -f -`. Tune flags after `--` are "
        "passed to every worker.",
    )
    p.add_argument("--model", required=True, help="preset name, Hugging Face id, or model path")
    p.add_argument("--workers", type=int, required=True, help="tuning workers (pods), 1 GPU each")
    p.add_argument("--study", required=True, help="the study's name in the storage")
    p.add_argument(
        "--storage",
        help=f"SQLAlchemy URL of a database every pod reaches (default ${STORAGE_ENV}); "
        "it goes into the printed Secret",
    )
    p.add_argument(
        "--storage-secret",
        metavar="NAME[:KEY]",
        help="an existing Secret holding the URL (key default 'url'): nothing secret is printed",
    )
    p.add_argument(
        "--image",
        default=DEFAULT_IMAGE,
        help=f"image with vLLM and the tuner (default {DEFAULT_IMAGE})",
    )
    p.add_argument(
        "--cache-volume", help="pvc[:SIZE[:CLASS]] (default pvc, ReadWriteMany) or hostpath:/path"
    )
    p.add_argument("--name", help="the Job's name (default tune-<study>)")
    p.add_argument(
        "tune_args",
        nargs=argparse.REMAINDER,
        metavar="-- TUNE_ARGS",
        help="flags of `tuner tune` for every worker, e.g. -- --trials 60 --gpu H100-80GB",
    )
    p.set_defaults(func=_cmd_k8s_job)


def _tune_parser() -> argparse.ArgumentParser:
    """``tuner tune``'s own parser (its registration, ``tuner.cli.tune.add_parser``), under
    a ``tuner`` of its own: its errors read as the command's, one line, exit code 2."""
    parser = OneLineParser(prog="tuner")
    tune.add_parser(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return parser


def _tune_args(args: argparse.Namespace) -> list[str]:
    """The workers' extra tune flags, checked here (every worker would fail on a flag
    `tuner tune` does not know), with the run directory on the shared cache volume."""
    from tuner.deploy import CACHE_MOUNT_PATH

    extra = list(args.tune_args)
    if extra and extra[0] == "--":
        extra = extra[1:]
    _tune_parser().parse_args(["tune", "--model", args.model, *extra])
    if not any(a == "--run-dir" or a.startswith("--run-dir=") for a in extra):
        # Same path in every pod: each worker's trial evidence, the recommendation and the
        # report outlive the pods, and the finalizing worker reads every worker's trials.
        extra += ["--run-dir", f"{CACHE_MOUNT_PATH}/runs/{_path_part(args.study)}"]
    return extra


def _path_part(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip(".-") or "study"


def _cmd_k8s_job(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from tuner.deploy import SecretKeyRef, tuning_job_manifests

    storage = args.storage
    secret: SecretKeyRef | None = None
    if args.storage_secret:
        if storage:
            raise ConfigError(
                "k8s job: --storage and --storage-secret both given; accepted: one of them"
            )
        name, _, key = args.storage_secret.partition(":")
        try:
            secret = SecretKeyRef(name=name, key=key or "url")
        except ValidationError as exc:
            reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise ConfigError(f"k8s job: --storage-secret: {reason}") from None
    elif not storage:
        storage = os.environ.get(STORAGE_ENV)
        if not storage:
            raise ConfigError(
                f"k8s job: no study storage; accepted: --storage URL, ${STORAGE_ENV}, or "
                "--storage-secret NAME[:KEY] (e.g. postgresql://user:password@db:5432/optuna)"
            )
    text = tuning_job_manifests(
        model=args.model,
        workers=args.workers,
        study=args.study,
        image=args.image,
        storage_url=storage,
        storage_secret=secret,
        cache_volume=args.cache_volume,
        extra_args=_tune_args(args),
        name=args.name,
    )
    sys.stdout.write(text)
    if secret is None:
        print(
            "k8s-job: the printed Secret holds the storage URL and its password: pipe it to "
            "`kubectl apply -f -` rather than keeping the file, or create the Secret yourself "
            "and pass --storage-secret",
            file=sys.stderr,
        )
    return 0

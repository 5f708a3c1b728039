"""The init container's program: the model fetched onto the model cache before vLLM starts.

``fetch_model_script()`` is the source of ``fetch_model.py``, which the Kubernetes output
(``tuner.deploy``) puts in its ConfigMap beside the warm-up and the drain and runs in an
init container of vLLM's own image, on the model cache volume (``HF_HOME`` is there too).
vLLM's container then starts on that directory with ``HF_HUB_OFFLINE=1``: it never asks
the hub.

Why a program and not ``hf download``: the image's ``huggingface_hub`` follows its vLLM
release, and the command line moved under it (``huggingface-cli download`` until 0.34,
``hf download`` from 0.34, ``huggingface-cli`` gone in 1.0, whose ``hf`` takes one
pattern per ``--include`` where the old one took a list after one ``--include``). Both
are wrappers of ``snapshot_download`` (huggingface_hub's ``commands/download.py``), which
every release has with the same arguments; the program calls it on the files vLLM loads,
chosen as ``tuner.serving.hub.wanted_files`` chooses them for a tune (a test keeps the two
alike).

Why a directory (``local_dir``) and not the hub cache: vLLM reads a hub id offline with
``snapshot_download(allow_patterns=["*.safetensors", "*.bin", ...], local_files_only=True)``
(``download_weights_from_hf`` in vLLM's ``model_loader/weight_utils.py``), and
huggingface_hub 2.x refuses a cached snapshot that lacks a file those patterns match in its
cached tree listing (``IncompleteSnapshotError``): a repository with ``pytorch_model.bin``
or ``consolidated.safetensors`` beside its shards would not start offline. Given a
directory, vLLM reads it and asks the hub nothing.

A warm directory downloads nothing: ``snapshot_download`` is given the commit the one
metadata request resolved, and ``hf_hub_download`` returns a file of that commit already
in the directory (its ``.cache/huggingface/`` records which) without a request.
"""

from __future__ import annotations

import json

__all__ = ["CONFIG_FILES", "FETCH_FILE", "fetch_model_script"]

FETCH_FILE = "fetch_model.py"
# Top-level files vLLM reads besides the weights (transformers' config, tokenizer and
# chat template loaders, vLLM's own generation config and Mistral-format readers): the
# pods' fetch and the tune's (``tuner.serving.hub``) choose the same files.
CONFIG_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "tokenizer.model",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "chat_template.jinja",
        "chat_template.json",
        "preprocessor_config.json",
        "processor_config.json",
        "params.json",
        "tekken.json",
    }
)


def fetch_model_script() -> str:
    """The source of a standalone Python 3 program (3.8 or later) that needs only the
    ``huggingface_hub`` of vLLM's image; see its docstring for its command line."""
    return _PROGRAM.replace("__CONFIG_FILES__", repr(json.dumps(sorted(CONFIG_FILES))))


# The program itself. It runs in the vllm/vllm-openai image, not here: no imports from the
# tuner, nothing newer than Python 3.8, only what huggingface_hub has had since 0.20.
_PROGRAM = r'''#!/usr/bin/env python3
"""Fetch a model from the Hugging Face hub before vLLM starts: an init container
(vllm-capacity-tuner).

    python3 fetch_model.py --repo ORG/NAME --local-dir DIR [--revision REV] [--timeout-s S]

Into DIR, the directory vLLM is given (huggingface_hub's own cache, HF_HOME, holds what
the library keeps beside it), with the token in HF_TOKEN where the model is gated; only
the files vLLM loads: the top-level config, tokenizer and chat-template files and one
kind of weights (safetensors, only those its index names; *.bin where there are none;
never *.gguf, nor original/).

A warm directory downloads nothing: the revision is resolved to a commit with one request
and a file already there from that commit (DIR/.cache/huggingface records it) is not
asked for. A hub that cannot be reached, with the model there: it serves, said in one
line. Exit status 1 with one line: a gated model without access, no such repository, no
hub and no model there, or --timeout-s passed.
"""

import argparse
import json
import os
import signal
import sys
import time

CONFIG_FILES = frozenset(json.loads(__CONFIG_FILES__))
INDEX = "model.safetensors.index.json"
WEIGHT_KINDS = ((".safetensors", INDEX), (".bin", "pytorch_model.bin.index.json"), (".pt", None))


class Failed(Exception):
    """One line for the pod's log; exit status 1."""


class OutOfTime(BaseException):
    """--timeout-s passed (not an Exception: no fallback catches it)."""


def wanted_files(paths, index=None):
    """The files of a repository vLLM loads (tuner.serving.hub.wanted_files)."""
    top = sorted(p for p in paths if "/" not in p)
    chosen = [p for p in top if p in CONFIG_FILES]
    for suffix, index_name in WEIGHT_KINDS:
        files = [p for p in top if p.endswith(suffix)]
        if not files:
            continue
        if suffix == ".safetensors" and index:
            named = set(index.values())
            files = [p for p in files if p in named] or files
        chosen += files
        if index_name is not None and index_name in top:
            chosen.append(index_name)
        break
    return list(dict.fromkeys(chosen))


def weight_map(path):
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    found = data.get("weight_map") if isinstance(data, dict) else None
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else None


def files_in(folder):
    """The top-level files of ``folder``: name -> (size, modification time)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    out = {}
    for name in names:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            stat = os.stat(path)
            out[name] = (stat.st_size, stat.st_mtime_ns)
    return out


def size_text(n):
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return "%.2f %s" % (n / scale, unit)
    return "%d bytes" % n


def hub_errors():
    try:
        from huggingface_hub import errors
    except ImportError:  # before 0.21 they lived in huggingface_hub.utils
        from huggingface_hub import utils as errors
    return errors.GatedRepoError, errors.RepositoryNotFoundError, errors.HfHubHTTPError


def one_line(exc):
    text = str(exc).strip().splitlines()
    return " ".join(text[0].split()) if text else type(exc).__name__


def complete(folder):
    """The model is there: its config and weights of a kind vLLM loads."""
    names = files_in(folder)
    return "config.json" in names and any(
        n.endswith(tuple(k for k, _ in WEIGHT_KINDS)) for n in names)


def fetch(repo, local_dir, revision, say):
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download

    gated, missing, http_error = hub_errors()
    started = time.monotonic()
    before = files_in(local_dir)
    try:
        info = HfApi().model_info(repo, revision=revision)
        names = [s.rfilename for s in (info.siblings or ())]
        index = None
        if INDEX in names:
            index = weight_map(hf_hub_download(repo, INDEX, revision=info.sha,
                                               local_dir=local_dir))
        files = wanted_files(names, index)
        if "config.json" not in files:
            raise Failed("model %s on the Hugging Face hub has no config.json" % repo)
        snapshot_download(repo, revision=info.sha, allow_patterns=files, local_dir=local_dir)
    except gated:
        raise Failed(
            "model %s is gated on the Hugging Face hub and the pod's HF_TOKEN %s" % (
                repo, "has no access to it" if os.environ.get("HF_TOKEN") else
                "is not set (the Secret named in the manifest)"))
    except missing as exc:
        raise Failed("model %s is no repository on the Hugging Face hub, or a private one "
                     "this token cannot see (%s)" % (repo, one_line(exc)))
    except http_error as exc:
        response = getattr(exc, "response", None)
        raise Failed("model %s: the Hugging Face hub answered %s (%s)" % (
            repo, getattr(response, "status_code", "?"), one_line(exc)))
    except Failed:
        raise
    except Exception as exc:  # the hub not reached: the model already there, if it is
        if not complete(local_dir):
            raise Failed("model %s: the Hugging Face hub was not reached (%s) and the model "
                         "is not in %s" % (repo, one_line(exc), local_dir))
        say("model %s: the Hugging Face hub was not reached (%s); the copy in %s serves"
            % (repo, one_line(exc), local_dir))
        return
    after = files_in(local_dir)
    added = sum(after[n][0] for n in files if n in after and before.get(n) != after[n])
    seconds = time.monotonic() - started
    if added == 0:
        say("model %s: in %s, nothing fetched (%d files, %.1f s)"
            % (repo, local_dir, len(files), seconds))
    else:
        say("model %s: fetched %s in %.1f s (%d files) into %s"
            % (repo, size_text(added), seconds, len(files), local_dir))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", required=True, help="the model's Hugging Face id")
    parser.add_argument("--local-dir", required=True, help="the directory vLLM is given")
    parser.add_argument("--revision", default=None, help="a branch, tag or commit (default main)")
    parser.add_argument("--timeout-s", type=int, default=0, help="give up after this long")
    args = parser.parse_args(argv)

    def say(text):
        sys.stdout.write("[fetch_model.py] %s\n" % text)
        sys.stdout.flush()

    def out_of_time(signum, frame):
        raise OutOfTime()

    if args.timeout_s > 0 and hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, out_of_time)
        signal.alarm(args.timeout_s)
    try:
        fetch(args.repo, args.local_dir, args.revision, say)
    except Failed as exc:
        say(str(exc))
        return 1
    except OutOfTime:
        say("model %s: not fetched within --timeout-s %d; the files fetched so far stay for "
            "the next try" % (args.repo, args.timeout_s))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''

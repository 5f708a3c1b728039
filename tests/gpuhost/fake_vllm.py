"""A stand-in `vllm` executable for the GPU-host rehearsal: the simulated engine behind
vLLM's own command line. It is NOT vLLM; every line it adds says "stand-in".

Installed by ``tests/gpuhost/host.py`` as ``<venv>/bin/vllm`` (its first line rewritten to
that venv's python, as pip writes a console script), it does what the first minutes of a
real ``vllm serve`` do on a GPU host, where the tuner can see them:

* ``vllm --version`` prints the release, as vLLM's CLI does;
* ``vllm serve MODEL`` resolves MODEL as vLLM does: a local directory, else a Hugging Face
  repository fetched through the real ``huggingface_hub`` client (``HF_ENDPOINT``,
  ``HF_TOKEN``, ``HF_HOME``, ``HF_HUB_OFFLINE`` as the user has them), so a name that is no
  repository and a gated one without a token fail with the hub client's own exception and
  traceback, as vLLM prints them;
* then it runs ``tuner sim-serve`` with the same flags, on the virtual GPU named by
  ``STANDIN_VLLM_SIM_GPU``: a warm start takes ``STANDIN_VLLM_WARM_S`` seconds, and a first
  start of a compile key adds a cold torch.compile of ``STANDIN_VLLM_COLD_S`` seconds, kept
  under ``VLLM_CACHE_ROOT`` as vLLM keeps it (``tuner/sim/compile_cache.py``), and reports the server's device memory to the stand-in NVML
  (``STANDIN_NVML_HOST``'s ``state_dir``) on the device ``CUDA_VISIBLE_DEVICES`` names.

Standard library and huggingface_hub only: it runs in the rehearsed venv's interpreter.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

VERSION = "0.33.0"  # rewritten by tests/gpuhost/host.py
TUNER_PYTHON = sys.executable  # rewritten: the interpreter that has the tuner installed


def _value(args: list[str], flag: str) -> str | None:
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _resolve_model(model: str) -> None:
    """vLLM reads the model's config from the hub before anything else: fail as it fails."""
    if Path(model).is_dir():
        return
    from huggingface_hub import snapshot_download

    # The exception propagates: its traceback is what vLLM prints for the same failure.
    snapshot_download(model, allow_patterns=["config.json"])


def _visible_uuid() -> str | None:
    host_path = os.environ.get("STANDIN_NVML_HOST")
    if not host_path:
        return None
    host = json.loads(Path(host_path).read_text(encoding="utf-8"))
    devices = host.get("devices", [])
    first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip()
    # CUDA's own mapping, written apart from the tuner's so that it can catch the tuner's
    # mistakes: an index, or a full GPU- or MIG- UUID (a MIG device: the first visible one)
    for index, device in enumerate(devices):
        migs = [str(m["uuid"]) for m in device.get("mig_devices", [])]
        if first in (str(index), device.get("uuid")):
            return migs[0] if device.get("mig_mode") and migs else str(device.get("uuid"))
        if first in migs:
            return first
    return None


def _report_memory(pid: int, port: int, stop: threading.Event) -> None:
    """What NVML would show of the server: its device memory, on the visible GPU."""
    host_path = os.environ.get("STANDIN_NVML_HOST")
    uuid = _visible_uuid()
    if not host_path or uuid is None:
        return
    state_dir = json.loads(Path(host_path).read_text(encoding="utf-8")).get("state_dir")
    if not state_dir:
        return
    path = Path(state_dir) / f"{pid}.json"
    while not stop.wait(0.5):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/sim/gpu", timeout=2) as r:
                used = int(json.loads(r.read())["process_used_bytes"])
        except (OSError, ValueError, KeyError):
            continue
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"uuid": uuid, "used_bytes": used}), encoding="utf-8")
        os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if argv[:1] in (["--version"], ["-v"]):
        print(VERSION)
        return 0
    if argv[:1] != ["serve"]:
        print("usage: vllm serve MODEL [options]  (stand-in vllm of the GPU-host rehearsal)")
        return 2
    args = argv[1:]
    if args and not args[0].startswith("-"):
        model, rest = args[0], args[1:]
    else:
        model = _value(args, "--model") or ""
        at = args.index("--model") if "--model" in args else -1
        rest = (
            args[:at] + args[at + 2 :]
            if at >= 0
            else [a for a in args if not a.startswith("--model=")]
        )
    print(
        f"INFO {time.strftime('%m-%d %H:%M:%S')} [api_server.py:1] vLLM API server version {VERSION}"
    )
    _resolve_model(model)
    port = int(_value(rest, "--port") or 8000)
    command = [
        TUNER_PYTHON, "-m", "tuner.cli", "sim-serve", "--model", model, *rest,
        "--vllm-version", VERSION,
        "--startup-delay", os.environ.get("STANDIN_VLLM_WARM_S", "2"),
        "--compile-delay", os.environ.get("STANDIN_VLLM_COLD_S", "8"),
    ]  # fmt: skip
    gpu = os.environ.get("STANDIN_VLLM_SIM_GPU")
    if gpu:
        command += ["--gpu", gpu]
    child = subprocess.Popen(command)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    stop = threading.Event()
    reporter = threading.Thread(target=_report_memory, args=(child.pid, port, stop), daemon=True)
    reporter.start()
    code = child.wait()
    stop.set()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

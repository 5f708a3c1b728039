"""The device check: what only a real NVIDIA GPU can tell about the tuner, in one run.

How to run it on a lent device (the session's ``run`` tool; PyTorch with CUDA and
nvidia-ml-py there, no vLLM, no network), with a timeout that leaves time to rerun it:

    run(command="python benchmarks/gpu_host_check.py --out $OUT", timeout_s=480)

It takes about 3-4 minutes on an H200 (the step-cost fit is most of it; ``--step-budget-s``).
Its results land under ``--out`` (default ``$OUT`` where set, else ``./gpu-host-check``):
``summary.jsonl`` (one JSON object per check, also printed on stdout, each line starting
with ``{``; the human lines around them start with ``#``), the GPU timelines of each pass,
the OOM texts, and the step-cost fit's JSON and log. Without a CUDA GPU it prints one line
and exits 2; with one it exits 0 when every check passed, 1 otherwise.

What each check proves:

a. ``sampler`` (two passes, ``CUDA_VISIBLE_DEVICES`` = the last visible GPU's index, then
   its ``GPU-`` UUID): a child process takes 2 GiB, then 8 GiB more, holds, frees all with
   ``torch.cuda.empty_cache()``, holds, exits. The tuner's ``GpuSampler`` on
   ``make_source("nvml", visible=...)`` (``tuner.serving.nvml_host.visible_gpus`` mapping)
   must sample that one device only (the child reports the UUID CUDA gave it: the same
   device), see the child's peak within ``PEAK_TOLERANCE_BYTES`` above 10 GiB (the CUDA
   context is the slack) and its memory back under ``FREED_BYTES_MAX`` once freed, and
   ``wait_until_released`` must return True within ``RELEASE_WITHIN_S`` of the exit.
b. ``oom``: real CUDA out-of-memory texts (one allocation over the GPU's size; memory
   filled 1 GiB at a time; a first matmul on a full GPU, which fails in cuBLAS's handle or
   workspace allocation) must each classify as out of memory through
   ``tuner.vllm.classify`` (``classify_failure``, ``engine_death_failure``), raw and with
   vLLM's engine-core log prefix. The texts are kept under ``oom/`` to classify again.
c. ``step_costs``: ``benchmarks/gpu_step_costs.py`` with a small time budget; its JSON and
   log are kept (the twin's MFU/MBU against this GPU's measured steps).

Where the tuner's modules cannot be imported on the device (no pydantic there), the check
says so in one line and samples with plain pynvml instead (the mapping and the release
wait are then this script's, not the tuner's, which the summary says).

``--standin`` runs check (a) here, without a GPU or PyTorch: against the stand-in NVML
(``tests/gpuhost/pynvml_standin``, ``STANDIN_NVML_HOST``) on a host of two "NVIDIA H100 NVL"
(device 0 holding another job's 40 GiB), with a fake child that reports its pattern to the
stand-in instead of allocating; and check (b) on a built OOM text. It exercises every code
path of the script; it proves nothing about a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STANDIN_DIR = ROOT / "tests" / "gpuhost" / "pynvml_standin"
GiB = 1 << 30
MiB = 1 << 20

FIRST_BYTES = 2 * GiB
SECOND_BYTES = 8 * GiB
PATTERN_PEAK_BYTES = FIRST_BYTES + SECOND_BYTES
PEAK_TOLERANCE_BYTES = 1536 * MiB  # the CUDA context and torch's allocator rounding
FREED_BYTES_MAX = 1536 * MiB  # what is left after empty_cache: the context only
RELEASE_WITHIN_S = 10.0
RELEASE_SLACK_BYTES = 256 * MiB
HOLD_S = 2.0
STANDIN_HOLD_S = 0.4
SAMPLE_INTERVAL_S = 0.05
STEP_BUDGET_S = 90


# --- output ----------------------------------------------------------------------------------


class Report:
    """JSON lines on stdout and in ``summary.jsonl``; human lines start with '#'."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.path = out / "summary.jsonl"
        self.path.write_text("", encoding="utf-8")
        self.failed: list[str] = []

    def say(self, text: str) -> None:
        print(f"# {text}", flush=True)

    def record(self, check: str, ok: bool | None, **fields: Any) -> None:
        entry = {"check": check, "ok": ok, **fields}
        line = json.dumps(entry, sort_keys=False, default=str)
        print(line, flush=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
        if ok is False:
            self.failed.append(check)


# --- the children ----------------------------------------------------------------------------


def child_pattern(hold_s: float) -> int:
    """Run under CUDA_VISIBLE_DEVICES: take 2 GiB, 8 GiB more, hold, free all, hold, exit."""
    import torch

    def phase(name: str, **extra: Any) -> None:
        print(json.dumps({"phase": name, "t": time.time(), **extra}), flush=True)

    torch.cuda.init()
    props = torch.cuda.get_device_properties(0)
    uuid = str(getattr(props, "uuid", "") or "")
    phase("start", uuid=("GPU-" + uuid) if uuid and not uuid.startswith("GPU-") else uuid,
          name=props.name, devices=torch.cuda.device_count())  # fmt: skip
    first = torch.empty(FIRST_BYTES, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    phase("first")
    time.sleep(hold_s)
    second = torch.empty(SECOND_BYTES, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    phase("peak")
    time.sleep(hold_s)
    del first, second
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    phase("freed")
    time.sleep(hold_s)
    phase("exit")
    return 0


def child_fake(state_dir: Path, uuid: str, hold_s: float) -> int:
    """The stand-in's child: reports the same pattern to the stand-in NVML, allocates nothing."""
    state = state_dir / f"{os.getpid()}.json"

    def phase(name: str, used: int) -> None:
        state.write_text(json.dumps({"uuid": uuid, "used_bytes": used}), encoding="utf-8")
        print(json.dumps({"phase": name, "t": time.time(), "uuid": uuid}), flush=True)

    phase("start", 300 * MiB)  # a context's worth
    phase("first", 300 * MiB + FIRST_BYTES)
    time.sleep(hold_s)
    phase("peak", 300 * MiB + PATTERN_PEAK_BYTES)
    time.sleep(hold_s)
    phase("freed", 300 * MiB)
    time.sleep(hold_s)
    print(json.dumps({"phase": "exit", "t": time.time()}), flush=True)
    state.unlink()
    return 0


OOM_SCRIPTS = {
    "one_allocation_over_total": (
        "import torch\n"
        "total = torch.cuda.get_device_properties(0).total_memory\n"
        "torch.empty(int(total * 1.5), dtype=torch.uint8, device='cuda')\n"
    ),
    "filled_1gib_at_a_time": (
        "import torch\n"
        "held = []\n"
        "while True:\n"
        "    held.append(torch.empty(1 << 30, dtype=torch.uint8, device='cuda'))\n"
    ),
    "cublas_on_a_full_gpu": (
        "import torch\n"
        "x = torch.randn(256, 256, device='cuda')\n"
        "held = []\n"
        "for size in (1 << 30, 64 << 20, 2 << 20):\n"
        "    try:\n"
        "        while True:\n"
        "            held.append(torch.empty(size, dtype=torch.uint8, device='cuda'))\n"
        "    except torch.OutOfMemoryError:\n"
        "        pass\n"
        "print('filled; first matmul', flush=True)\n"
        "torch.cuda.synchronize()\n"
        "y = x @ x\n"
        "torch.cuda.synchronize()\n"
        "print('matmul ran on a full GPU', flush=True)\n"
    ),
}

STANDIN_OOM_TEXT = (  # built in torch's words (c10/cuda/CUDACachingAllocator.cpp): not real
    "Traceback (most recent call last):\n"
    '  File "<string>", line 3, in <module>\n'
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 132.00 GiB. GPU 0 has a "
    "total capacity of 93.10 GiB of which 92.55 GiB is free. Including non-PyTorch memory, "
    "this process has 560.00 MiB memory in use. Of the allocated memory 0 bytes is allocated "
    "by PyTorch, and 0 bytes is reserved by PyTorch but unallocated.\n"
)


# --- sampling --------------------------------------------------------------------------------


class Tuner:
    """The tuner's sampler and classifier, or why they could not be imported here."""

    def __init__(self) -> None:
        self.error: str | None = None
        self.sampler: Any = None
        self.nvml_host: Any = None
        self.classify: Any = None
        sys.path.insert(0, str(ROOT))
        try:
            from tuner.serving import gpu_sampler, nvml_host

            self.sampler, self.nvml_host = gpu_sampler, nvml_host
        except Exception as exc:  # no pydantic on the device, or a broken tree
            self.error = f"{type(exc).__name__}: {exc}"
        try:
            from tuner.vllm import classify

            self.classify = classify
        except Exception as exc:
            self.classify_error = f"{type(exc).__name__}: {exc}"
        else:
            self.classify_error = None


class PlainNvml:
    """The fallback where the tuner's modules do not import: pynvml, one device."""

    def __init__(self, visible: str) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        if visible.upper().startswith("GPU-"):
            self.handle = pynvml.nvmlDeviceGetHandleByUUID(visible)
        else:
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(int(visible))
        self.index = int(pynvml.nvmlDeviceGetIndex(self.handle))

    def read(self, pids: frozenset[int]) -> tuple[int, int, int]:
        memory = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
        procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        mine = sum(int(p.usedGpuMemory or 0) for p in procs if int(p.pid) in pids)
        return self.index, int(memory.used), mine

    def close(self) -> None:
        self.nvml.nvmlShutdown()


_PLAIN_START: dict[str, float] = {}


def _children_of(pid: int) -> frozenset[int]:
    found = {pid}
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    stat = (entry / "stat").read_text()
                    if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                        found.add(int(entry.name))
    return frozenset(found)


@contextlib.contextmanager
def plain_sampling(
    visible: str, pids: Callable[[], frozenset[int]]
) -> Iterator[list[tuple[float, int, int, int]]]:
    plain = PlainNvml(visible)
    rows: list[tuple[float, int, int, int]] = []
    stop = threading.Event()
    _PLAIN_START["unix"] = time.time()

    def run() -> None:
        start = time.monotonic()
        while not stop.is_set():
            index, used, mine = plain.read(pids())
            rows.append((time.monotonic() - start, index, used, mine))
            stop.wait(SAMPLE_INTERVAL_S)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield rows
    finally:
        stop.set()
        thread.join(5)
        plain.close()


def _phases(text: str) -> dict[str, dict[str, Any]]:
    phases = {}
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and "phase" in entry:
                phases[entry["phase"]] = entry
    return phases


def check_sampler(
    report: Report,
    tuner: Tuner,
    *,
    label: str,
    visible: str,
    nvml_index: int,
    uuid: str,
    child_cmd: list[str],
    env: dict[str, str],
) -> None:
    """One pass of (a): the child under CUDA_VISIBLE_DEVICES=visible, sampled by the tuner."""
    out = report.out / f"sampler-{label}"
    out.mkdir(exist_ok=True)
    child_env = {**env, "CUDA_VISIBLE_DEVICES": visible, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    stdout_path = out / "child.out"
    fields: dict[str, Any] = {"visible": visible, "nvml_index": nvml_index}
    if tuner.sampler is not None:
        gs = tuner.sampler
        baseline_source = gs.make_source("nvml", visible=visible)
        baseline_source.open()
        baseline = {r.device_index: r.used_bytes for r in baseline_source.read(frozenset())}
        baseline_source.close()
        holder: dict[str, Any] = {}
        sampler = gs.GpuSampler(
            gs.make_source("nvml", visible=visible),
            interval_s=SAMPLE_INTERVAL_S,
            timeline_path=out / "gpu_timeline.csv",
            pids=lambda: holder["tree"]() if "tree" in holder else frozenset(),
        )
        sampler.start()
        with stdout_path.open("w") as stdout:
            child = subprocess.Popen(
                child_cmd, env=child_env, stdout=stdout, stderr=subprocess.STDOUT
            )
            holder["tree"] = gs.ProcessTree(child.pid, refresh_s=0.2)
            rc = child.wait(timeout=120)
        exit_s = time.monotonic()
        release = gs.make_source("nvml", visible=visible)
        release.open()
        released = gs.wait_until_released(
            release, baseline_used_bytes=baseline, slack_bytes=RELEASE_SLACK_BYTES,
            timeout_s=RELEASE_WITHIN_S * 3, interval_s=0.1,
        )  # fmt: skip
        release_s = time.monotonic() - exit_s
        release.close()
        summary = sampler.stop()
        samples = sampler.samples
        devices = sorted({s.device_index for s in samples})
        peak_process = max((s.process_used_bytes for s in samples), default=0)
        peak_used_delta = max((s.used_bytes for s in samples), default=0) - max(
            baseline.values(), default=0
        )
        fields.update(sampler="tuner", summary_peak_used_bytes=summary.peak_used_bytes)
        started_unix_s = float(sampler.started_unix_s or 0.0)
        child_bytes = [(s.t_s, s.process_used_bytes) for s in samples]
    else:
        report.say(f"tuner sampler unavailable ({tuner.error}); sampling with plain pynvml")
        baseline_plain = PlainNvml(visible)
        _, base_used, _ = baseline_plain.read(frozenset())
        baseline_plain.close()
        with stdout_path.open("w") as stdout, contextlib.ExitStack() as stack:
            pid_box: dict[str, int] = {}
            rows = stack.enter_context(
                plain_sampling(
                    visible, lambda: _children_of(pid_box["pid"]) if pid_box else frozenset()
                )
            )
            child = subprocess.Popen(
                child_cmd, env=child_env, stdout=stdout, stderr=subprocess.STDOUT
            )
            pid_box["pid"] = child.pid
            rc = child.wait(timeout=120)
            exit_s = time.monotonic()
            released, release_s = False, RELEASE_WITHIN_S * 3
            while time.monotonic() - exit_s < RELEASE_WITHIN_S * 3:
                if rows and rows[-1][2] <= base_used + RELEASE_SLACK_BYTES:
                    released, release_s = True, time.monotonic() - exit_s
                    break
                time.sleep(0.1)
        devices = sorted({r[1] for r in rows})
        peak_process = max((r[3] for r in rows), default=0)
        peak_used_delta = max((r[2] for r in rows), default=0) - base_used
        samples = rows
        started_unix_s = _PLAIN_START.get("unix", 0.0)
        child_bytes = [(r[0], r[3]) for r in rows]
        fields.update(sampler=f"plain pynvml (tuner import failed: {tuner.error})")
    phases = _phases(stdout_path.read_text(encoding="utf-8", errors="replace"))
    child_uuid = str(phases.get("start", {}).get("uuid", ""))
    # The child's memory once freed: samples between its "freed" and "exit" phases.
    freed_process = _freed_process_bytes(child_bytes, started_unix_s, phases)
    same_device = not child_uuid or child_uuid.lower() == uuid.lower()
    peak = peak_process if peak_process > 0 else peak_used_delta
    fields.update(
        child_rc=rc,
        child_uuid=child_uuid or None,
        expected_uuid=uuid,
        devices_sampled=devices,
        samples=len(samples),
        peak_process_used_bytes=peak_process,
        peak_used_over_baseline_bytes=peak_used_delta,
        pattern_peak_bytes=PATTERN_PEAK_BYTES,
        peak_tolerance_bytes=PEAK_TOLERANCE_BYTES,
        freed_process_bytes=freed_process,
        released=released,
        release_s=round(release_s, 3),
        release_within_s=RELEASE_WITHIN_S,
    )
    problems = []
    if rc != 0:
        problems.append(f"the child exited {rc}")
    if devices != [nvml_index]:
        problems.append(f"sampled devices {devices}, wanted only [{nvml_index}]")
    if not same_device:
        problems.append(f"CUDA gave the child {child_uuid}, not {uuid}")
    if not PATTERN_PEAK_BYTES <= peak <= PATTERN_PEAK_BYTES + PEAK_TOLERANCE_BYTES:
        problems.append(
            f"peak {peak / GiB:.2f} GiB, wanted 10 GiB to +{PEAK_TOLERANCE_BYTES / GiB:.1f}"
        )
    if freed_process is not None and freed_process > FREED_BYTES_MAX:
        problems.append(f"{freed_process / GiB:.2f} GiB still held after empty_cache")
    if not released or release_s > RELEASE_WITHIN_S:
        problems.append(f"wait_until_released took {release_s:.1f} s (released={released})")
    report.record(f"sampler_{label}", not problems, problems=problems, **fields)
    report.say(
        f"sampler, CUDA_VISIBLE_DEVICES={visible}: devices {devices}, peak "
        f"{peak / GiB:.2f} GiB, released after {release_s:.2f} s: "
        + ("ok" if not problems else "; ".join(problems))
    )


def _freed_process_bytes(
    samples: list[tuple[float, int]], started_unix_s: float, phases: dict[str, Any]
) -> int | None:
    """The child's largest memory between its 'freed' and 'exit' phases (0.2 s inside):
    ``samples`` are (seconds since the sampler started, the child's bytes)."""
    if "freed" not in phases or "exit" not in phases:
        return None
    start = float(phases["freed"]["t"]) + 0.2 - started_unix_s
    end = float(phases["exit"]["t"]) - 0.05 - started_unix_s
    values = [used for t_s, used in samples if start <= t_s <= end]
    return max(values) if values else None


# --- (b) OOM texts ---------------------------------------------------------------------------


ENGINE_PREFIX = "(EngineCore_DP0 pid={pid}) ERROR 12-03 12:00:00 [core.py:710] "


def check_oom(report: Report, tuner: Tuner, *, texts: dict[str, str]) -> None:
    out = report.out / "oom"
    out.mkdir(exist_ok=True)
    for name, text in texts.items():
        (out / f"{name}.txt").write_text(text, encoding="utf-8")
        prefixed = "".join(
            ENGINE_PREFIX.format(pid=4242) + line + "\n" for line in text.splitlines()
        )
        fields: dict[str, Any] = {
            "text_tail": text.strip().splitlines()[-1:] if text.strip() else []
        }
        if tuner.classify is None:
            seen = "out of memory" in text.lower() or "ALLOC_FAILED" in text
            report.record(
                f"oom_{name}", None, classifier=f"not importable: {tuner.classify_error}",
                says_out_of_memory=seen, **fields,
            )  # fmt: skip
            report.say(f"oom {name}: classifier not importable here; text kept in oom/")
            continue
        kinds = {}
        for variant, body in (("raw", text), ("engine_core", prefixed)):
            failure = tuner.classify.classify_failure(body) or tuner.classify.engine_death_failure(
                body
            )
            kinds[variant] = None if failure is None else failure.kind.value
            fields[f"{variant}_is_oom"] = bool(
                failure is not None and failure.kind.is_out_of_memory
            )
        ok = bool(text.strip()) and fields["raw_is_oom"] and fields["engine_core_is_oom"]
        report.record(f"oom_{name}", ok, kinds=kinds, **fields)
        report.say(f"oom {name}: {kinds} -> {'ok' if ok else 'NOT read as out of memory'}")


def real_oom_texts(report: Report, python: str) -> dict[str, str]:
    texts = {}
    for name, code in OOM_SCRIPTS.items():
        try:
            done = subprocess.run(
                [python, "-c", code], capture_output=True, text=True, timeout=120,
                env={k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"},
            )  # fmt: skip
            text = done.stdout + done.stderr
            if done.returncode == 0:
                report.say(f"oom {name}: no error was provoked (rc 0): {text.strip()[-200:]}")
                report.record(f"oom_{name}", None, provoked=False, output=text[-2000:])
                continue
        except subprocess.TimeoutExpired as exc:
            text = f"timed out after {exc.timeout} s"
        texts[name] = text
    return texts


# --- (c) step costs --------------------------------------------------------------------------


def check_step_costs(report: Report, python: str, budget_s: int) -> None:
    out_json = report.out / "gpu_step_costs.json"
    log_path = report.out / "gpu_step_costs.log"
    cmd = [python, str(ROOT / "benchmarks" / "gpu_step_costs.py"), "--out", str(out_json),
           "--budget-s", str(budget_s)]  # fmt: skip
    started = time.monotonic()
    try:
        with log_path.open("w") as log_file:
            rc = subprocess.run(
                cmd, stdout=log_file, stderr=subprocess.STDOUT, timeout=budget_s + 120, cwd=ROOT
            ).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    took_s = round(time.monotonic() - started, 1)
    fit: Any = None
    if out_json.is_file():
        with contextlib.suppress(ValueError):
            data = json.loads(out_json.read_text(encoding="utf-8"))
            fit = data.get("fit") if isinstance(data, dict) else None
    report.record("step_costs", rc == 0 and out_json.is_file(), rc=rc, took_s=took_s, fit=fit,
                  json=str(out_json.name), log=str(log_path.name))  # fmt: skip
    tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:]
    report.say(f"step costs: rc {rc} in {took_s} s; " + " | ".join(tail))


# --- main ------------------------------------------------------------------------------------


def standin_host(out: Path) -> tuple[Path, Path]:
    """Two H100 NVL, device 0 busy with another job's 40 GiB, written for the stand-in."""
    state = out / "standin-state"
    state.mkdir(exist_ok=True)
    total = 95830 * MiB

    def gpu(n: int, used: int, processes: list[dict[str, int]]) -> dict[str, Any]:
        return {"name": "NVIDIA H100 NVL", "uuid": f"GPU-5ad1c0de-0000-4000-8000-00000000000{n}",
                "total_bytes": total, "used_bytes": used, "compute_capability": [9, 0],
                "mig_mode": 0, "mig_devices": [], "processes": processes}  # fmt: skip

    host = {
        "devices": [gpu(0, 40 * GiB, [{"pid": 4_000_001, "used_bytes": 40 * GiB}]),
                    gpu(1, 512 * MiB, [])],
        "no_permission": False,
        "state_dir": str(state),
    }  # fmt: skip
    path = out / "standin-host.json"
    path.write_text(json.dumps(host, indent=1), encoding="utf-8")
    return path, state


def no_gpu_reason() -> str | None:
    try:
        import torch
    except Exception as exc:
        return f"PyTorch is not importable ({type(exc).__name__}: {exc})"
    if not torch.cuda.is_available():
        return f"PyTorch {torch.__version__} sees no CUDA device"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_out = os.environ.get("OUT") or "gpu-host-check"
    parser.add_argument(
        "--out", default=default_out, help="results folder (default: $OUT, else ./gpu-host-check)"
    )
    parser.add_argument(
        "--standin", action="store_true", help="check (a) and (b) on the stand-in NVML, no GPU"
    )
    parser.add_argument(
        "--step-budget-s", type=int, default=STEP_BUDGET_S, help="gpu_step_costs.py's --budget-s"
    )
    parser.add_argument("--skip-step-costs", action="store_true")
    parser.add_argument("--child", choices=["pattern", "fake"], help=argparse.SUPPRESS)
    parser.add_argument("--child-uuid", help=argparse.SUPPRESS)
    parser.add_argument("--child-state", help=argparse.SUPPRESS)
    parser.add_argument("--hold-s", type=float, default=HOLD_S, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "pattern":
        return child_pattern(args.hold_s)
    if args.child == "fake":
        return child_fake(Path(args.child_state), args.child_uuid, args.hold_s)

    if not args.standin and (reason := no_gpu_reason()) is not None:
        print(f"gpu_host_check: no CUDA GPU here: {reason}; run it on a lent NVIDIA device, "
              "or --standin for the stand-in NVML", file=sys.stderr)  # fmt: skip
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out)
    env = dict(os.environ)
    hold_s = args.hold_s
    if args.standin:
        host, state = standin_host(out)
        env["STANDIN_NVML_HOST"] = str(host)
        os.environ["STANDIN_NVML_HOST"] = str(host)
        sys.path.insert(0, str(STANDIN_DIR))
        hold_s = min(hold_s, STANDIN_HOLD_S)
        report.say("STAND-IN run: the stand-in NVML (not a GPU), a fake child; proves no GPU claim")
    tuner = Tuner()
    report.record("imports", tuner.error is None and tuner.classify_error is None,
                  sampler_error=tuner.error, classify_error=tuner.classify_error,
                  standin=args.standin, python=sys.version.split()[0])  # fmt: skip

    # (a) the last visible GPU, by index and by UUID
    if tuner.nvml_host is not None:
        gpus = tuner.nvml_host.visible_gpus()
        last = gpus[-1] if gpus else None
        target = None if last is None else (last.nvml_index, last.uuid, last.name)
    else:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        handle = pynvml.nvmlDeviceGetHandleByIndex(count - 1) if count else None
        target = None
        if handle is not None:
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            target = (count - 1, uuid.decode() if isinstance(uuid, bytes) else uuid,
                      name.decode() if isinstance(name, bytes) else name)  # fmt: skip
        pynvml.nvmlShutdown()
    if target is None:
        report.record("sampler", False, problems=["NVML lists no visible GPU"])
    else:
        index, uuid, name = target
        report.say(f"the last visible GPU: NVML index {index}, {uuid} ({name})")
        for label, visible in (("index", str(index)), ("uuid", uuid)):
            if args.standin:
                child = [sys.executable, __file__, "--child", "fake", "--child-uuid", uuid,
                         "--child-state", str(state), "--hold-s", str(hold_s)]  # fmt: skip
            else:
                child = [sys.executable, __file__, "--child", "pattern", "--hold-s", str(hold_s)]
            check_sampler(report, tuner, label=label, visible=visible, nvml_index=index,
                          uuid=uuid, child_cmd=child, env=env)  # fmt: skip

    # (b) out-of-memory texts
    if args.standin:
        check_oom(report, tuner, texts={"standin_built": STANDIN_OOM_TEXT})
    else:
        check_oom(report, tuner, texts=real_oom_texts(report, sys.executable))

    # (c) the step-cost fit
    if args.standin or args.skip_step_costs:
        report.record(
            "step_costs", None, skipped="stand-in run" if args.standin else "--skip-step-costs"
        )
    else:
        check_step_costs(report, sys.executable, args.step_budget_s)

    report.record("done", not report.failed, failed=report.failed)
    report.say("all checks passed" if not report.failed else f"FAILED: {', '.join(report.failed)}")
    return 0 if not report.failed else 1


if __name__ == "__main__":
    sys.exit(main())

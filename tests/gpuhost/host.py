"""A rehearsed GPU host: what a user's machine looks like to the tuner, without a GPU.

``RehearsedHost.build`` lays out, in a temporary directory:

* a copy of the project (its tracked and new files, as a fresh clone has them) whose
  ``.venv`` is a real virtual environment seeing this checkout's installed packages, so
  ``make tune`` there runs as it runs after ``make install`` on the user's host;
* vLLM where users install it: in that venv (``make vllm``), in another environment on
  ``PATH``, as a pipx or uv-tool install under ``HOME``, or nowhere. The executable is the
  stand-in of ``tests/gpuhost/fake_vllm.py`` (the simulated engine speaking vLLM's command
  line, startup and hub failures), with the distribution metadata of its release, so its
  version is read as a real install's is;
* the stand-in NVML (``tests/gpuhost/pynvml_standin``) first on ``PYTHONPATH``, describing
  the host's GPUs, with ``CUDA_VISIBLE_DEVICES`` as the user set it;
* the Hugging Face hub as ``HF_ENDPOINT`` (``tests/gpuhost/hub_standin.py``), an empty
  ``HF_HOME`` and, where given, a token.

``env`` is the whole environment of a command on that host: nothing of this checkout's
venv is on its ``PATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from tuner.serving.processes import group_alive, stop_group

REPO = Path(__file__).resolve().parents[2]
STANDIN_NVML_DIR = REPO / "tests" / "gpuhost" / "pynvml_standin"
FAKE_VLLM = REPO / "tests" / "gpuhost" / "fake_vllm.py"
VLLM_RELEASE = "0.33.0"


class VllmLayout(StrEnum):
    """Where the rehearsed host has vLLM."""

    PROJECT_VENV = "project-venv"  # make vllm: .venv/bin/vllm, not on PATH
    PATH = "path"  # another environment whose bin is on PATH
    PIPX = "pipx"  # pipx install vllm: ~/.local/bin/vllm, ~/.local/share/pipx/venvs/vllm
    UV_TOOL = "uv-tool"  # uv tool install vllm: ~/.local/share/uv/tools/vllm
    NONE = "none"


def _site_packages(venv: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return venv / "lib" / version / "site-packages"


def make_venv(venv: Path) -> Path:
    """A virtual environment whose interpreter sees this checkout's installed packages (the
    tuner, Optuna, huggingface_hub...) through a .pth, as if they were installed in it."""
    base = Path(sysconfig.get_config_var("BINDIR")) / f"python{sys.version_info.major}"
    if not base.exists():
        base = Path(sys.base_prefix) / "bin" / "python3"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "pyvenv.cfg").write_text(
        f"home = {base.parent}\ninclude-system-site-packages = false\n"
        f"version = {'.'.join(map(str, sys.version_info[:3]))}\n",
        encoding="utf-8",
    )
    python = venv / "bin" / "python"
    if not python.exists():
        python.symlink_to(base)
    site = _site_packages(venv)
    site.mkdir(parents=True, exist_ok=True)
    ours = _site_packages(Path(sys.prefix))
    (site / "_rehearsal_packages.pth").write_text(
        f"import site; site.addsitedir({str(ours)!r})\n", encoding="utf-8"
    )
    return python


def install_vllm(venv: Path, *, release: str = VLLM_RELEASE) -> Path:
    """The stand-in ``vllm`` console script in ``venv``, with its distribution's metadata."""
    python = make_venv(venv)
    text = FAKE_VLLM.read_text(encoding="utf-8")
    text = text.replace('VERSION = "0.33.0"', f"VERSION = {release!r}", 1)
    text = text.replace("TUNER_PYTHON = sys.executable", f"TUNER_PYTHON = {sys.executable!r}", 1)
    script = venv / "bin" / "vllm"
    script.write_text(f"#!{python}\n{text}", encoding="utf-8")
    script.chmod(0o755)
    dist = _site_packages(venv) / f"vllm-{release}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {release}\n", encoding="utf-8"
    )
    (dist / "INSTALLER").write_text("stand-in\n", encoding="utf-8")
    return script


def copy_project(dest: Path) -> Path:
    """The project's files as a fresh clone has them (tracked and new, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = REPO / name
        if not source.is_file():
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return dest


@dataclass
class RehearsedHost:
    root: Path
    project: Path
    env: dict[str, str]
    nvml_host: dict[str, Any]
    vllm: Path | None
    state_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.nvml_host["state_dir"])

    @classmethod
    def build(
        cls,
        root: Path,
        nvml_host: dict[str, Any],
        *,
        visible: str | None,
        layout: VllmLayout = VllmLayout.PROJECT_VENV,
        hub_endpoint: str | None = None,
        hf_token: str | None = None,
        sim_gpu: str = "H100-PCIe-80GB",
        cold_start_s: float = 8.0,
        warm_start_s: float = 2.0,
    ) -> RehearsedHost:
        project = copy_project(root / "project")
        venv = project / ".venv"
        python = make_venv(venv)
        tuner = venv / "bin" / "tuner"
        tuner.write_text(
            # as pip writes a console script (multiprocessing's spawn imports it again)
            f"#!{python}\nimport sys\nfrom tuner.cli.main import main\n"
            "if __name__ == '__main__':\n    sys.exit(main())\n",
            encoding="utf-8",
        )
        tuner.chmod(0o755)
        # make install has run: the stamp is newer than pyproject.toml
        (venv / ".installed-stamp").touch()
        home = root / "home"
        home.mkdir(parents=True, exist_ok=True)
        path = ["/usr/local/bin", "/usr/bin", "/bin"]
        vllm: Path | None = None
        if layout is VllmLayout.PROJECT_VENV:
            vllm = install_vllm(venv)
        elif layout is VllmLayout.PATH:
            vllm = install_vllm(root / "opt" / "vllm-env")
            path.insert(0, str(vllm.parent))
        elif layout is VllmLayout.PIPX:
            vllm = install_vllm(home / ".local" / "share" / "pipx" / "venvs" / "vllm")
            link = home / ".local" / "bin" / "vllm"
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(vllm)
        elif layout is VllmLayout.UV_TOOL:
            vllm = install_vllm(home / ".local" / "share" / "uv" / "tools" / "vllm")
            link = home / ".local" / "bin" / "vllm"
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(vllm)
        state_dir = root / "nvml-state"
        state_dir.mkdir(parents=True, exist_ok=True)
        host = {**nvml_host, "state_dir": str(state_dir)}
        host_json = root / "nvml-host.json"
        host_json.write_text(json.dumps(host, indent=2), encoding="utf-8")
        env = {
            "PATH": os.pathsep.join(path),
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(STANDIN_NVML_DIR),
            "STANDIN_NVML_HOST": str(host_json),
            "STANDIN_VLLM_SIM_GPU": sim_gpu,
            "STANDIN_VLLM_COLD_S": str(cold_start_s),
            "STANDIN_VLLM_WARM_S": str(warm_start_s),
            "HF_HOME": str(root / "hf-home"),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        }
        for keep in ("TMPDIR", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
            if keep in os.environ:
                env[keep] = os.environ[keep]
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        if hub_endpoint is not None:
            env["HF_ENDPOINT"] = hub_endpoint
        if hf_token is not None:
            env["HF_TOKEN"] = hf_token
        return cls(root=root, project=project, env=env, nvml_host=host, vllm=vllm)

    def run(
        self, command: str, *, extra_env: dict[str, str] | None = None, timeout_s: float = 900
    ) -> subprocess.CompletedProcess[str]:
        """A shell command typed on the host, in the project's directory, in a session of its
        own. Past ``timeout_s`` the whole session is stopped (not only the shell: a tuner
        left behind would go on launching servers). A process of the session still alive
        after the command returned outlived the harness: it is stopped and the call fails."""
        proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=self.project,
            env={**self.env, **(extra_env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop_session(proc.pid)
            proc.communicate()
            raise
        left = _stop_session(proc.pid, grace_s=5.0)
        if left:
            raise AssertionError(
                f"{command!r}: {left} process(es) outlived it (stopped now)\n{out}\n{err}"
            )
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _stop_session(pgid: int, *, grace_s: float = 0.0) -> int:
    """Stop what is left of the process group ``pgid`` (the session the command ran in):
    first wait ``grace_s`` for it to end by itself, then the harness's own stop (SIGTERM,
    then SIGKILL). The number of processes that were still there after the grace (0: none)."""
    deadline = time.monotonic() + grace_s
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not group_alive(pgid):
        return 0
    left = len(
        subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout.split()
    )
    stop_group(pgid)
    return left

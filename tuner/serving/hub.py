"""The model fetched from the Hugging Face hub before trial 0, where vLLM reads it.

``vllm serve meta-llama/Llama-3.1-8B-Instruct`` downloads the model on its first start,
inside the startup timeout, and a gated model without a token crashes the server with a
traceback. The tuner fetches it first, with ``huggingface_hub`` (the library vLLM itself
downloads with) into the same hub cache (``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``), checking access before anything is downloaded:

* a gated model without a token, a token without access, a name that is no repository:
  one line (``ConfigError``), before any server is launched;
* only the files vLLM loads: the config, the tokenizer and chat template, the generation
  config, the safetensors weights named by their index (not the ``*.bin``/``*.pt``/
  ``*.gguf`` copies, nor a second ``consolidated.safetensors``); ``*.bin`` where a
  repository has no safetensors;
* ``HF_HUB_OFFLINE=1``: the cached snapshot, without the network.

The settings are read from the environment when a fetch starts (``huggingface_hub``
reads its own at import), so a test or the nightly job may set them per call.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.errors import ConfigError
from tuner.model_fetch import CONFIG_FILES

if TYPE_CHECKING:
    from huggingface_hub import HfApi

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = ("1", "on", "yes", "true")

SAFETENSORS_INDEX = "model.safetensors.index.json"
_WEIGHT_KINDS = (  # the first kind a repository has is the one vLLM loads
    (".safetensors", SAFETENSORS_INDEX),
    (".bin", "pytorch_model.bin.index.json"),
    (".pt", None),
)


@dataclass(frozen=True, kw_only=True)
class HubSettings:
    """Where the hub is and where its files go, as ``huggingface_hub`` and vLLM read them."""

    endpoint: str = DEFAULT_ENDPOINT
    cache_dir: Path
    offline: bool = False
    token: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HubSettings:
        env = os.environ if env is None else env
        home = Path(
            env.get("HF_HOME")
            or Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
        ).expanduser()
        cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
        return cls(
            endpoint=(env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/"),
            cache_dir=Path(cache).expanduser() if cache else home / "hub",
            offline=env.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE,
            token=_token(env, home),
        )


def _token(env: Mapping[str, str], home: Path) -> str | None:
    """HF_TOKEN, else the file `hf auth login` writes (HF_TOKEN_PATH, else $HF_HOME/token)."""
    if env.get("HF_HUB_DISABLE_IMPLICIT_TOKEN", "").strip().lower() in _TRUE:
        return env.get("HF_TOKEN") or None
    token = env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN")
    if token:
        return token.strip() or None
    path = Path(env.get("HF_TOKEN_PATH") or home / "token").expanduser()
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


@dataclass(frozen=True)
class FetchedModel:
    """A model's snapshot in the hub cache: what is there, and what this fetch added."""

    repo_id: str
    snapshot_dir: Path
    files: tuple[str, ...]
    fetched_bytes: int  # new in the cache (0: every file was there)
    seconds: float
    offline: bool = False  # read from the cache without asking the hub
    weights: bool = True  # False: config and tokenizer only (a dry run)

    def line(self) -> str:
        what = "model" if self.weights else "config and tokenizer of"
        where = self.snapshot_dir.parent.parent.parent  # <cache>/models--org--name/snapshots/<sha>
        if self.offline:
            return (
                f"{what} {self.repo_id}: from the hub cache {where}, without the hub "
                f"({len(self.files)} files)"
            )
        if self.fetched_bytes == 0:
            return (
                f"{what} {self.repo_id}: in the hub cache {where}, nothing fetched "
                f"({len(self.files)} files, {self.seconds:.1f} s)"
            )
        return (
            f"{what} {self.repo_id}: fetched {_size(self.fetched_bytes)} in "
            f"{self.seconds:.1f} s ({len(self.files)} files) into {where}"
        )


def _size(n_bytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.2f} {unit}"
    return f"{n_bytes} bytes"


def wanted_files(
    paths: Iterable[str], *, weights: bool = True, index: Mapping[str, str] | None = None
) -> tuple[str, ...]:
    """The files of a repository vLLM loads: its top-level config and tokenizer files and,
    with ``weights``, one kind of weights (safetensors over ``*.bin`` over ``*.pt``; never
    ``*.gguf``); with a safetensors ``index`` (its weight_map), only the files it names."""
    top = sorted(p for p in paths if "/" not in p)
    chosen = [p for p in top if p in CONFIG_FILES]
    if weights:
        for suffix, index_name in _WEIGHT_KINDS:
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
    return tuple(dict.fromkeys(chosen))


def repo_dir(settings: HubSettings, repo_id: str) -> Path:
    """The hub cache's folder of a model repository (``models--org--name``)."""
    return settings.cache_dir / ("models--" + repo_id.replace("/", "--"))


def _blob_bytes(folder: Path) -> int:
    blobs = folder / "blobs"
    if not blobs.is_dir():
        return 0
    return sum(p.stat().st_size for p in blobs.iterdir() if p.is_file())


def fetch_model(
    repo_id: str, *, weights: bool = True, settings: HubSettings | None = None
) -> FetchedModel:
    """The model's snapshot in the hub cache, fetched where it is not there yet.

    Raises ``ConfigError`` (one line) for a gated model this host has no access to, a name
    that is no repository, an unreachable hub without the model cached, or an offline host
    without it."""
    settings = settings or HubSettings.from_env()
    started_s = time.monotonic()
    if settings.offline:
        cached = _cached(repo_id, settings, weights=weights, started_s=started_s)
        if isinstance(cached, FetchedModel):
            return cached
        raise ConfigError(
            f"model {repo_id} {cached} in the hub cache {settings.cache_dir} and "
            "HF_HUB_OFFLINE=1 keeps the hub out of reach; accepted: the model fetched before "
            f"(`tuner fetch --model {repo_id}` on a host with the network, the same HF_HOME), "
            "or HF_HUB_OFFLINE unset"
        )
    before = _blob_bytes(repo_dir(settings, repo_id))
    try:
        snapshot, files = _download(repo_id, settings, weights=weights)
    except _Unreachable as exc:
        cached = _cached(repo_id, settings, weights=weights, started_s=started_s)
        if not isinstance(cached, FetchedModel):
            raise ConfigError(
                f"model {repo_id}: the Hugging Face hub at {settings.endpoint} cannot be "
                f"reached ({exc}) and the model {cached} in the hub cache "
                f"{settings.cache_dir}; accepted: a host that reaches the hub, or the model "
                "fetched before (`tuner fetch --model ...`)"
            ) from exc
        log.warning(
            "the Hugging Face hub at %s cannot be reached (%s): %s uses its cached snapshot",
            settings.endpoint, exc, repo_id,
        )  # fmt: skip
        return cached
    return FetchedModel(
        repo_id=repo_id,
        snapshot_dir=snapshot,
        files=files,
        fetched_bytes=max(_blob_bytes(repo_dir(settings, repo_id)) - before, 0),
        seconds=time.monotonic() - started_s,
        weights=weights,
    )


class _Unreachable(Exception):
    """The hub did not answer (connection refused, timeout)."""


def _api(settings: HubSettings) -> HfApi:
    from huggingface_hub import HfApi

    # token=False: no token sent (not the one huggingface_hub found at import)
    return HfApi(endpoint=settings.endpoint, token=settings.token or False)


def _transport_errors() -> tuple[type[BaseException], ...]:
    """A hub that does not answer, as the HTTP library of the installed huggingface_hub
    raises it (requests before 1.0, httpx in 1.x, httpx2 in 2.x)."""
    errors: list[type[BaseException]] = []
    for module, names in (
        ("httpx2", ("ConnectError", "TimeoutException")),
        ("httpx", ("ConnectError", "TimeoutException")),
        ("requests", ("ConnectionError", "Timeout")),
    ):
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        errors += [getattr(found, name) for name in names if hasattr(found, name)]
    return tuple(errors)


def _download(
    repo_id: str, settings: HubSettings, *, weights: bool
) -> tuple[Path, tuple[str, ...]]:
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    api = _api(settings)
    token: str | bool = settings.token or False
    try:
        api.auth_check(repo_id)  # gated or missing: said before a byte is downloaded
        info = api.model_info(repo_id, files_metadata=True)
        names = [s.rfilename for s in info.siblings or ()]
        index: dict[str, str] | None = None
        if weights and SAFETENSORS_INDEX in names:
            path = hf_hub_download(
                repo_id, SAFETENSORS_INDEX, revision=info.sha, cache_dir=settings.cache_dir,
                endpoint=settings.endpoint, token=token,
            )  # fmt: skip
            index = _weight_map(Path(path))
        files = wanted_files(names, weights=weights, index=index)
        if "config.json" not in files:
            raise ConfigError(
                f"model {repo_id} on the Hugging Face hub has no config.json; accepted: a "
                "transformers model repository, a preset, or a local model directory"
            )
        # revision main, not the sha: the cache's refs/main is written, which vLLM and an
        # offline run read
        folder = snapshot_download(
            repo_id, allow_patterns=list(files),
            cache_dir=settings.cache_dir, endpoint=settings.endpoint, token=token,
        )  # fmt: skip
    except GatedRepoError as exc:  # a RepositoryNotFoundError: before it
        raise ConfigError(_gated_line(repo_id, settings)) from exc
    except RepositoryNotFoundError as exc:
        raise ConfigError(_missing_line(repo_id, settings, exc)) from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise ConfigError(
            f"model {repo_id}: the Hugging Face hub at {settings.endpoint} answered {status} "
            f"({_answer(exc)})"
        ) from exc
    except _transport_errors() as exc:
        raise _Unreachable(str(exc) or type(exc).__name__) from exc
    return Path(folder), files


def _weight_map(path: Path) -> dict[str, str] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    return {str(k): str(v) for k, v in weight_map.items()} if isinstance(weight_map, dict) else None


def _answer(exc: Exception) -> str:
    message = getattr(exc, "server_message", None) or str(exc).splitlines()[0]
    return " ".join(str(message).split())


def _gated_line(repo_id: str, settings: HubSettings) -> str:
    if settings.token is None:
        return (
            f"model {repo_id} is gated on the Hugging Face hub and this host has no token: set "
            "HF_TOKEN or run `hf auth login` after accepting its licence"
        )
    return (
        f"model {repo_id} is gated on the Hugging Face hub and this host's token has no access "
        f"to it: accept its licence at {settings.endpoint}/{repo_id} with the token's account, "
        "or set HF_TOKEN to a token of an account that has"
    )


def _missing_line(repo_id: str, settings: HubSettings, exc: Exception) -> str:
    from tuner.vllm.models import preset_names

    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", "?")
    private = "; a private repository needs a token (HF_TOKEN)" if settings.token is None else ""
    return (
        f"model {repo_id!r} is no repository on the Hugging Face hub ({settings.endpoint} "
        f"answered {status}: {_answer(exc)}){private}; accepted: a Hugging Face model id, a "
        f"preset ({', '.join(preset_names())}) or a local model directory"
    )


def _cached(
    repo_id: str, settings: HubSettings, *, weights: bool, started_s: float
) -> FetchedModel | str:
    """The snapshot the cache's ``main`` points at, read without the network; else what
    is missing ("is not", "is without its weights")."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=settings.cache_dir)
    if not isinstance(found, str):
        return "is not"
    snapshot = Path(found).parent
    files = wanted_files(
        (p.name for p in snapshot.iterdir()), weights=weights,
        index=_weight_map(snapshot / SAFETENSORS_INDEX),
    )  # fmt: skip
    if weights and not any(f.endswith(tuple(k for k, _ in _WEIGHT_KINDS)) for f in files):
        return "is without its weights"
    return FetchedModel(
        repo_id=repo_id, snapshot_dir=snapshot, files=files, fetched_bytes=0,
        seconds=time.monotonic() - started_s, offline=True, weights=weights,
    )  # fmt: skip

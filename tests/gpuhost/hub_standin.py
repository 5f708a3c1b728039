"""A stand-in Hugging Face hub: a real HTTP server that ``huggingface_hub`` talks to.

Not the hub: a thread on 127.0.0.1 answering the few routes ``huggingface_hub`` uses to
check access and download a model (``auth-check``, ``model_info``/``repo_info``, the tree
listing, ``resolve`` with HEAD and GET), with the status codes and ``X-Error-Code`` /
``X-Error-Message`` headers the real hub sends, so the real client raises what it raises
against huggingface.co (``huggingface_hub.utils._http.hf_raise_for_status``):

* a missing repository: 401 without a token, 404 with one, ``X-Error-Code: RepoNotFound``
  -> ``RepositoryNotFoundError``;
* a gated repository: its metadata and file list are public (200), its files and its
  ``auth-check`` answer 401 without a token and 403 with a token that was not granted
  access, ``X-Error-Code: GatedRepo`` -> ``GatedRepoError``; 200 with
  ``Authorization: Bearer <granted token>``.

The files are tiny and real: a preset's ``config.json`` (``tuner/presets/models.json``),
a small byte-level BPE ``tokenizer.json`` with a chat template in
``tokenizer_config.json`` (as ``tools/tiny_model.py`` makes them), safetensors shards
named by their index, and the copies vLLM does not load (``pytorch_model.bin``, a
``*.gguf``, ``consolidated.safetensors``, ``original/``).

    with HubStandin(repos=[preset_repo("Qwen/Qwen2.5-7B-Instruct")]) as hub:
        env["HF_ENDPOINT"] = hub.endpoint
"""

from __future__ import annotations

import hashlib
import json
import struct
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

REPO_ROOT = Path(__file__).resolve().parents[2]
GRANTED_TOKEN = "hf_standin_granted"  # a token whose account accepted every licence
OTHER_TOKEN = "hf_standin_other"  # a valid token of an account without access
LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pth", ".pt")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


@dataclass(frozen=True)
class HubRepo:
    """One model repository: its id, files (path -> bytes) and whether it is gated."""

    repo_id: str
    files: Mapping[str, bytes]
    gated: bool = False

    @property
    def sha(self) -> str:
        digest = hashlib.sha1(self.repo_id.encode())
        for path in sorted(self.files):
            digest.update(path.encode() + b"\0" + hashlib.sha1(self.files[path]).digest())
        return digest.hexdigest()

    def etag(self, path: str) -> str:
        """The hub's ETag: the sha256 of an LFS file, the git blob id of another."""
        data = self.files[path]
        if path.endswith(LFS_SUFFIXES):
            return hashlib.sha256(data).hexdigest()
        return _git_blob_id(data)


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def safetensors_bytes(tensors: Mapping[str, tuple[int, ...]]) -> bytes:
    """A real safetensors file of BF16 zeros: an 8-byte header length, the JSON header, data."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors.items():
        size = 2
        for dim in shape:
            size *= dim
        header[name] = {
            "dtype": "BF16",
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + bytes(offset)


@cache
def tokenizer_json() -> bytes:
    """A small byte-level BPE tokenizer (``tokenizers``), trained as tools/tiny_model.py does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    sentences = (
        "The quick brown fox jumps over the lazy dog near the river bank.",
        "A capacity review asks how much traffic one replica holds within the objective.",
        "She said that the people of this city have been working on the new house for years.",
        "There is one thing that all of them should know: the world is large and life is long.",
        "Hello, how are you today? I am fine, thank you. What would you like to talk about?",
    )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[BOS, EOS, "<|system|>", "<|user|>", "<|assistant|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(sentences), trainer=trainer)
    return tokenizer.to_str().encode()


def preset_config(repo_id: str) -> dict[str, Any]:
    """The config.json of the preset that lists ``repo_id`` among its Hugging Face ids."""
    presets = json.loads((REPO_ROOT / "tuner/presets/models.json").read_text(encoding="utf-8"))
    for entry in presets.values():
        if repo_id in entry["hf_ids"]:
            return dict(entry["config"])
    raise KeyError(f"no preset lists {repo_id}")


def _json(data: object) -> bytes:
    return (json.dumps(data, indent=2) + "\n").encode()


def preset_repo(
    repo_id: str, *, gated: bool = False, config: dict[str, Any] | None = None
) -> HubRepo:
    """A repository laid out as the real one (config, tokenizer, chat template, safetensors
    shards and their index) with tiny files, and the duplicates vLLM does not load."""
    shards = {
        "model-00001-of-00002.safetensors": safetensors_bytes(
            {"model.embed_tokens.weight": (8, 8)}
        ),
        "model-00002-of-00002.safetensors": safetensors_bytes({"lm_head.weight": (8, 8)}),
    }
    index = {
        "metadata": {"total_size": 256},
        "weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors",
        },
    }
    files: dict[str, bytes] = {
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
        "README.md": f"# {repo_id}\n\nA stand-in repository.\n".encode(),
        "config.json": _json(config if config is not None else preset_config(repo_id)),
        "generation_config.json": _json({"bos_token_id": 0, "eos_token_id": 1}),
        "tokenizer.json": tokenizer_json(),
        "tokenizer_config.json": _json(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": BOS,
                "eos_token": EOS,
                "chat_template": CHAT_TEMPLATE,
                "model_max_length": 131072,
            }
        ),
        "special_tokens_map.json": _json({"bos_token": BOS, "eos_token": EOS}),
        **shards,
        "model.safetensors.index.json": _json(index),
        # copies vLLM does not load where safetensors named by the index exist
        "consolidated.safetensors": safetensors_bytes({"tok_embeddings.weight": (8, 16)}),
        "pytorch_model.bin": b"\x80\x02stand-in pickle" + bytes(64),
        "model-q4.gguf": b"GGUF" + bytes(60),
        "original/consolidated.00.pth": bytes(64),
        "original/params.json": _json({"dim": 4096}),
    }
    return HubRepo(repo_id=repo_id, files=files, gated=gated)


def default_repos() -> tuple[HubRepo, ...]:
    """Llama 3.1 8B Instruct gated (as on the hub), Qwen 2.5 7B Instruct public."""
    return (
        preset_repo("meta-llama/Llama-3.1-8B-Instruct", gated=True),
        preset_repo("Qwen/Qwen2.5-7B-Instruct"),
    )


@dataclass
class HubRequest:
    method: str
    path: str
    token: str | None


@dataclass
class HubStandin:
    """The stand-in hub: ``with HubStandin(...) as hub: hub.endpoint``; ``hub.requests``
    lists what was asked (method, path, token), ``hub.downloads`` the files sent."""

    repos: Iterable[HubRepo] = field(default_factory=default_repos)
    granted_tokens: frozenset[str] = frozenset({GRANTED_TOKEN})
    requests: list[HubRequest] = field(default_factory=list)
    downloads: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._by_id = {repo.repo_id: repo for repo in self.repos}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "the stand-in hub is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> HubStandin:
        standin = self

        class Handler(_Handler):
            hub = standin

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def repo(self, repo_id: str) -> HubRepo | None:
        return self._by_id.get(repo_id)


class _Handler(BaseHTTPRequestHandler):
    hub: HubStandin
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    # -- answers -----------------------------------------------------------------------

    def _send(self, status: int, body: bytes, headers: Mapping[str, str] = {}) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, data: object, headers: Mapping[str, str] = {}) -> None:
        self._send(
            status, json.dumps(data).encode(), {"Content-Type": "application/json", **headers}
        )

    def _error(self, status: int, code: str | None, message: str) -> None:
        headers = {"X-Error-Message": message}
        if code is not None:
            headers["X-Error-Code"] = code
        self._json(status, {"error": message}, headers)

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        return auth.removeprefix("Bearer ").strip() or None if auth.startswith("Bearer ") else None

    def _missing(self, repo_id: str) -> None:
        # The hub answers 401 to an anonymous request for a repository it does not show
        # (missing or private), 404 to an authenticated one.
        self._error(404 if self._token() else 401, "RepoNotFound", "Repository not found")

    def _gated(self, repo: HubRepo) -> bool:
        """Answer a gated repository's file or auth-check without access; True if answered."""
        token = self._token()
        if not repo.gated or token in self.hub.granted_tokens:
            return False
        if token is None:
            self._error(
                401, "GatedRepo",
                f"Access to model {repo.repo_id} is restricted. You must have access to it and "
                "be authenticated to access it. Please log in.",
            )  # fmt: skip
        else:
            self._error(
                403, "GatedRepo",
                f"Access to model {repo.repo_id} is restricted and you are not in the authorized "
                f"list. Visit https://huggingface.co/{repo.repo_id} to ask for access.",
            )  # fmt: skip
        return True

    # -- routes ------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self._route()

    def do_GET(self) -> None:
        self._route()

    def _route(self) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/") if p]
        query = parse_qs(url.query)
        self.hub.requests.append(HubRequest(self.command, url.path, self._token()))
        if len(parts) >= 4 and parts[0] == "api" and parts[1] == "models":
            repo_id = f"{parts[2]}/{parts[3]}"
            rest = parts[4:]
            repo = self.hub.repo(repo_id)
            if repo is None:
                return self._missing(repo_id)
            if rest == ["auth-check"]:
                if not self._gated(repo):
                    self._json(200, {"ok": True})
                return None
            if not rest or (rest[0] == "revision" and len(rest) == 2):
                revision = rest[1] if rest else "main"
                if revision not in ("main", repo.sha):
                    return self._error(404, "RevisionNotFound", "Invalid rev id: " + revision)
                return self._json(200, self._info(repo, blobs="blobs" in query))
            if rest and rest[0] == "tree" and len(rest) >= 2:
                under = "/".join(rest[2:])
                recursive = query.get("recursive", ["False"])[0].lower() == "true"
                return self._json(200, self._tree(repo, under, recursive=recursive))
            return self._error(404, None, f"stand-in hub: no route {url.path}")
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = self.hub.repo(f"{parts[0]}/{parts[1]}")
            if repo is None:
                return self._missing(f"{parts[0]}/{parts[1]}")
            if self._gated(repo):
                return None
            revision, path = parts[3], "/".join(parts[4:])
            if revision not in ("main", repo.sha):
                return self._error(404, "RevisionNotFound", "Invalid rev id: " + revision)
            if path not in repo.files:
                return self._error(404, "EntryNotFound", "Entry not found")
            return self._file(repo, path)
        return self._error(404, None, f"stand-in hub: no route {url.path}")

    def _info(self, repo: HubRepo, *, blobs: bool) -> dict[str, Any]:
        siblings = []
        for path, data in sorted(repo.files.items()):
            sibling: dict[str, Any] = {"rfilename": path}
            if blobs:
                sibling.update(size=len(data), blobId=_git_blob_id(data))
                if path.endswith(LFS_SUFFIXES):
                    sibling["lfs"] = {
                        "sha256": repo.etag(path),
                        "size": len(data),
                        "pointerSize": 134,
                    }
            siblings.append(sibling)
        return {
            "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": repo.sha,
            "lastModified": "2024-09-25T14:00:00.000Z",
            "private": False,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "library_name": "transformers",
            "tags": ["transformers", "safetensors"],
            "siblings": siblings,
        }

    def _tree(self, repo: HubRepo, under: str, *, recursive: bool) -> list[dict[str, Any]]:
        prefix = f"{under}/" if under else ""
        entries: dict[str, dict[str, Any]] = {}
        for path, data in sorted(repo.files.items()):
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix) :]
            if "/" in rest and not recursive:
                folder = prefix + rest.split("/", 1)[0]
                entries[folder] = {
                    "type": "directory",
                    "path": folder,
                    "oid": _git_blob_id(folder.encode()),
                }
                continue
            entry: dict[str, Any] = {
                "type": "file",
                "path": path,
                "size": len(data),
                "oid": _git_blob_id(data),
            }
            if path.endswith(LFS_SUFFIXES):
                entry["lfs"] = {"oid": repo.etag(path), "size": len(data), "pointerSize": 134}
            entries[path] = entry
        return list(entries.values())

    def _file(self, repo: HubRepo, path: str) -> None:
        data = repo.files[path]
        headers = {
            "Content-Type": "application/octet-stream",
            "X-Repo-Commit": repo.sha,
            "ETag": f'"{repo.etag(path)}"',
            "Accept-Ranges": "bytes",
        }
        status = 200
        wanted = self.headers.get("Range")
        if wanted and wanted.startswith("bytes="):
            start_text, _, end_text = wanted[6:].partition("-")
            start = int(start_text or 0)
            end = int(end_text) if end_text else len(data) - 1
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data, status = data[start : end + 1], 206
        if self.command == "GET":
            self.hub.downloads.append(path)
        self._send(status, data, headers)

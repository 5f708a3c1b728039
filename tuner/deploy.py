"""Deployable configs from a recommendation: the command line, vLLM's config YAML, Kubernetes.

A ``DeploymentConfig`` says what to deploy (model, vLLM flags, GPUs per replica, cache
volume, replicas...) and knows nothing of the tuning loop; the recommendation fills one
in and these functions render it:

    vllm_args(cfg)             ``vllm serve MODEL --flag value ...``, shell-quoted, one flag a line
    vllm_config_yaml(cfg)      YAML for ``vllm serve --config FILE``
    kubernetes_manifests(cfg)  Deployment + Service (+ PersistentVolumeClaim), multi-document YAML;
                               the model on its own volume, fetched by an init container
                               before vLLM starts offline (``model_source``, ``model_cache``)
    tuning_job_manifests(...)  Secret + Indexed Job (+ PersistentVolumeClaim) for distributed tuning

vLLM's config file (``FlexibleArgumentParser.load_config_file`` in vLLM's
``vllm/utils/argparse_utils.py``, formerly ``vllm/utils/__init__.py``) is a flat YAML
mapping whose keys are the long option names without ``--``; each ``key: value`` becomes
``--key str(value)``, ``key: true`` a bare ``--key``, and ``key: false`` nothing (recent
releases: ``--no-key`` where that option exists). ``model:`` is accepted in the file when
the command line gives no positional model. So a flag whose value is False is left out of
every rendering, which means the same thing in every release.

Bad input is a ``tuner.errors.ConfigError`` of one line naming the value and what is
accepted (``DeploymentConfig.build``, ``parse_cache_volume``, ``parse_model_cache``,
``parse_model_source``, ``model_fields``, ``tuning_job_manifests``).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from tuner.drain import DrainTiming, drain_script, drain_timing
from tuner.errors import ConfigError
from tuner.model_fetch import FETCH_FILE, fetch_model_script
from tuner.vllm.models import hf_id_of
from tuner.warmup import WarmupPlan, WarmupRequest, warmup_script

__all__ = [
    "CACHE_MOUNT_PATH",
    "HF_HOME_PATH",
    "HF_HUB_CACHE_PATH",
    "MODEL_CACHE_MOUNT_PATH",
    "CacheVolume",
    "ClaimCache",
    "DeploymentConfig",
    "FlagValue",
    "HostPathCache",
    "HubSource",
    "LocalSource",
    "ModelCache",
    "ModelSource",
    "ObjectStoreSource",
    "PvcCache",
    "Rollout",
    "SecretKeyRef",
    "dns_label",
    "kubernetes_manifests",
    "kubernetes_switch",
    "model_cache_size",
    "model_fields",
    "parse_cache_volume",
    "parse_model_cache",
    "parse_model_source",
    "tuning_job_manifests",
    "vllm_args",
    "vllm_config_yaml",
    "warmup_job_manifests",
]

# vLLM's cache (VLLM_CACHE_ROOT in vllm/envs.py; the compile cache is its
# torch_compile_cache/): mounted at a path of its own and named in VLLM_CACHE_ROOT, so it
# is used whatever user the pod runs as and whatever HOME is (vLLM's default,
# ~/.cache/vllm, is /root/.cache/vllm only for root with HOME=/root).
CACHE_MOUNT_PATH = "/var/cache/vllm"
CACHE_ROOT_ENV = "VLLM_CACHE_ROOT"
GPU_RESOURCE = "nvidia.com/gpu"
LABEL_PREFIX = "vllm-capacity-tuner"
HASH_KEY = f"{LABEL_PREFIX}/config-hash"
MANAGED_BY = "vllm-capacity-tuner"
WARM_MARKER = "/tmp/vllm-warmed-up"
SCRIPTS_MOUNT_PATH = "/opt/vllm-capacity-tuner"  # the warm-up and drain programs (a ConfigMap)
WARMUP_FILE = "warmup.py"
DRAIN_FILE = "drain.py"
WARMUP_JOB_IMAGE = "python:3.12-slim"  # the warm-up needs only Python's standard library
STORAGE_SECRET_KEY = "url"
# The model cache (a volume of its own): the hub cache under HF_HOME (huggingface_hub's
# constants.py: HF_HUB_CACHE defaults to $HF_HOME/hub; both are set, so an image that sets
# either still uses the volume), an object store's copies under s3/.
MODEL_CACHE_MOUNT_PATH = "/var/cache/models"
HF_HOME_PATH = f"{MODEL_CACHE_MOUNT_PATH}/huggingface"
HF_HUB_CACHE_PATH = f"{HF_HOME_PATH}/hub"
OBJECT_STORE_PATH = f"{MODEL_CACHE_MOUNT_PATH}/s3"
HUB_MODELS_PATH = f"{MODEL_CACHE_MOUNT_PATH}/hf"  # a hub model's files, the directory vLLM reads
TUNING_HF_HOME_PATH = f"{CACHE_MOUNT_PATH}/huggingface"  # a tuning job's one volume
DEFAULT_MODEL_CACHE_SIZE = "100Gi"
# The object store's own client: `aws s3 sync` copies only what differs (size, or a newer
# object than the local copy, whose time it sets to the object's), so a warm cache copies
# nothing. AWS_ENDPOINT_URL (aws-cli 2.13 and later) reaches an S3-compatible store.
S3_SYNC_IMAGE = "amazon/aws-cli:2.22.0"

# Flags set through their own field (or never written down at all, like the API key).
_RESERVED_FLAGS = {
    "model": "the model field",
    "served-model-name": "the served_model_name field",
    "port": "the port field",
    "tensor-parallel-size": "the tensor_parallel_size field",
    "config": "vllm_config_yaml() (the config file is the whole point)",
    "api-key": "api_key_secret (an API key is read from a Secret, never written into a config)",
}
_RESERVED_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", HASH_KEY)
_RESERVED_JOB_ARGS = ("--model", "--storage", "--study")

_FLAG_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_DNS_1035 = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?")
_LABEL_NAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")
_QUANTITY = re.compile(r"\d+(?:\.\d+)?(?:Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?")
_SIZE = re.compile(r"\d+(?:\.\d+)?(?:Mi|Gi|Ti|Pi|M|G|T|P)")
_VERSION = re.compile(r"\d+\.\d+(?:\.\d+){0,2}(?:rc\d+|\.post\d+)?")
# What an installed vLLM adds to the release it was built from (its packages' spelling: a
# .devN build, a local part such as +cpu, +cu128 or +g0eec856cc.d20260731): no image has it.
_BUILD_SUFFIX = re.compile(r"(?:\.dev\d+)?(?:\+[0-9A-Za-z.]*)?$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _no_control(what: str, value: str) -> str:
    if not value:
        raise ValueError(f"{what} is empty")
    if _CONTROL.search(value):
        raise ValueError(f"{what} {value!r} contains a control character; accepted: printable text")
    return value


def dns_label(text: str, *, max_len: int = 63, fallback: str = "vllm") -> str:
    """``text`` as a DNS-1035 label (valid for every object name here, Services included).

    The last path segment of a model id or directory (``meta-llama/Llama-3.1-8B`` ->
    ``llama-3-1-8b``), lower-cased, every run of other characters made one ``-``, cut to
    ``max_len``; prefixed with ``fallback-`` when it would start with a digit, and
    ``fallback`` itself when nothing usable is left.
    """
    segments = [s for s in re.split(r"[/\\]+", text) if s.strip(". ")]
    base = segments[-1] if segments else ""
    label = re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-")
    if not label:
        return fallback[:max_len]
    if not label[0].isalpha():
        label = f"{fallback}-{label}"
    return label[:max_len].rstrip("-")


# --- small value objects --------------------------------------------------------------


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SecretKeyRef(_Frozen):
    """One key of an existing Kubernetes Secret (the value is never in a rendered file)."""

    name: str
    key: str

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _DNS_SUBDOMAIN.fullmatch(value):
            raise ValueError(
                f"Secret name {value!r} is not accepted; accepted: a DNS-1123 subdomain "
                "(lowercase letters, digits, '-' and '.')"
            )
        return value

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        if not _SECRET_KEY.fullmatch(value):
            raise ValueError(
                f"Secret key {value!r} is not accepted; accepted: letters, digits, '-', '_', '.'"
            )
        return value


class PvcCache(_Frozen):
    """A PersistentVolumeClaim for the compile cache (CLI: ``pvc[:SIZE[:CLASS[:rwx]]]``).

    Serving: without ``:rwx`` every replica gets a claim of its own (ReadWriteOnce), so
    a new pod never waits for an old one's volume; with ``:rwx`` all replicas share one
    ReadWriteMany claim of CLASS, which must offer that mode (NFS, EFS, Filestore,
    CephFS...). Tuning jobs (``access_mode`` None) share one claim: ReadWriteOnce for
    one pod, ReadWriteMany for several.
    """

    kind: Literal["pvc"] = "pvc"
    size: str = "20Gi"
    storage_class: str | None = None
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"] | None = None

    @model_validator(mode="after")
    def _shared_needs_a_class(self) -> PvcCache:
        if self.access_mode == "ReadWriteMany" and self.storage_class is None:
            raise ValueError(
                "a ReadWriteMany cache needs its storage class named; accepted: "
                "pvc:SIZE:CLASS:rwx with a class that offers ReadWriteMany"
            )
        return self

    @property
    def shared(self) -> bool:
        """One claim for every serving replica (ReadWriteMany), not one per replica."""
        return self.access_mode == "ReadWriteMany"

    @field_validator("size")
    @classmethod
    def _size(cls, value: str) -> str:
        if not _SIZE.fullmatch(value):
            raise ValueError(
                f"cache volume size {value!r} is not accepted; accepted: a Kubernetes quantity "
                "with a unit, e.g. 20Gi, 500Mi, 1Ti"
            )
        return value

    @field_validator("storage_class")
    @classmethod
    def _storage_class(cls, value: str | None) -> str | None:
        if value is not None and not _DNS_SUBDOMAIN.fullmatch(value):
            raise ValueError(
                f"storage class {value!r} is not accepted; accepted: a DNS-1123 subdomain "
                "(lowercase letters, digits, '-' and '.')"
            )
        return value

    @property
    def cli(self) -> str:
        """The ``--cache-volume`` string that parses back to this volume."""
        parts = ["pvc", self.size] + ([self.storage_class] if self.storage_class else [])
        return ":".join(parts + (["rwx"] if self.shared else []))

    def access_mode_for(self, pods: int) -> str:
        if self.access_mode is not None:
            return self.access_mode
        return "ReadWriteMany" if pods > 1 else "ReadWriteOnce"


class HostPathCache(_Frozen):
    """A directory on each node (CLI: ``hostpath:/path``); no claim is rendered."""

    kind: Literal["hostpath"] = "hostpath"
    path: str

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        _no_control("hostPath", value)
        if not value.startswith("/") or value.rstrip("/") == "":
            raise ValueError(
                f"hostPath {value!r} is not accepted; accepted: an absolute directory "
                "other than /, e.g. /mnt/vllm-cache"
            )
        if ".." in value.split("/"):
            raise ValueError(f"hostPath {value!r} contains '..'; accepted: a plain absolute path")
        return value

    @property
    def cli(self) -> str:
        return f"hostpath:{self.path}"


CacheVolume = Annotated[PvcCache | HostPathCache, Field(discriminator="kind")]

_CACHE_FORMS = (
    "pvc, pvc:SIZE (e.g. pvc:50Gi), pvc:SIZE:STORAGECLASS, pvc:SIZE:STORAGECLASS:rwx "
    "(one ReadWriteMany claim shared by the replicas), hostpath:/absolute/path"
)


def parse_cache_volume(text: str) -> PvcCache | HostPathCache:
    """The cache volume of a CLI string; ConfigError of one line when it is not one."""
    return _parse_volume(text, what="cache volume", forms=_CACHE_FORMS, default_size="20Gi")


def _parse_volume(
    text: str, *, what: str, forms: str, default_size: str
) -> PvcCache | HostPathCache:
    """``pvc[:SIZE[:CLASS[:rwx]]]`` or ``hostpath:/path``, errors naming ``what``."""
    kind, sep, rest = text.strip().partition(":")
    kind = kind.lower()
    try:
        if kind == "pvc" and not sep:
            return PvcCache(size=default_size)
        if kind == "pvc":
            size, _, rest = rest.partition(":")
            storage_class, _, mode = rest.partition(":")
            if mode not in ("", "rwx"):
                raise ConfigError(
                    f"{what} {text!r}: access {mode!r} is not accepted; accepted: rwx "
                    f"or nothing; forms: {forms}"
                )
            return PvcCache(
                size=size, storage_class=storage_class or None,
                access_mode="ReadWriteMany" if mode else None,
            )  # fmt: skip
        if kind == "hostpath" and rest:
            return HostPathCache(path=rest)
    except ValidationError as exc:
        reason = _first_error(exc, where=False)
        raise ConfigError(f"{what} {text!r}: {reason}; forms: {forms}") from None
    raise ConfigError(f"{what} {text!r} is not accepted; accepted: {forms}")


def _as_cache_volume(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return parse_cache_volume(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    return value


# --- where the model's weights come from, and the volume they are kept on ---------------


class ClaimCache(_Frozen):
    """An existing PersistentVolumeClaim, by name (CLI: ``claim:NAME``): a model store the
    cluster already has (ReadOnlyMany or ReadWriteMany), mounted by every pod."""

    kind: Literal["claim"] = "claim"
    claim_name: str

    @field_validator("claim_name")
    @classmethod
    def _claim_name(cls, value: str) -> str:
        if not _DNS_SUBDOMAIN.fullmatch(value):
            raise ValueError(
                f"claim name {value!r} is not accepted; accepted: a DNS-1123 subdomain "
                "(lowercase letters, digits, '-' and '.')"
            )
        return value

    @property
    def cli(self) -> str:
        return f"claim:{self.claim_name}"


ModelCache = Annotated[PvcCache | HostPathCache | ClaimCache, Field(discriminator="kind")]

_MODEL_CACHE_FORMS = (
    f"pvc (a {DEFAULT_MODEL_CACHE_SIZE} claim per replica), pvc:SIZE, pvc:SIZE:STORAGECLASS, "
    "pvc:SIZE:STORAGECLASS:rwx (one ReadWriteMany claim shared by the replicas), "
    "hostpath:/absolute/path, claim:EXISTING-CLAIM"
)


def parse_model_cache(text: str) -> PvcCache | HostPathCache | ClaimCache:
    """The model cache of a CLI string (``--cache-volume``'s forms with a bigger default
    claim, and ``claim:NAME``); ConfigError of one line when it is not one."""
    kind, _, rest = text.strip().partition(":")
    if kind.lower() == "claim" and rest:
        try:
            return ClaimCache(claim_name=rest)
        except ValidationError as exc:
            reason = _first_error(exc, where=False)
            raise ConfigError(
                f"model cache {text!r}: {reason}; forms: {_MODEL_CACHE_FORMS}"
            ) from None
    return _parse_volume(
        text, what="model cache", forms=_MODEL_CACHE_FORMS, default_size=DEFAULT_MODEL_CACHE_SIZE
    )


def model_cache_size(weights_bytes: int | None) -> str:
    """A claim for a model of ``weights_bytes``: its weights and a quarter more (tokenizer,
    the hub cache's own files, a new revision beside the old one), at least 20Gi."""
    if weights_bytes is None or weights_bytes <= 0:
        return DEFAULT_MODEL_CACHE_SIZE
    return f"{max(20, math.ceil(weights_bytes * 1.25 / 2**30))}Gi"


class HubSource(_Frozen):
    """The model from the Hugging Face hub (the model field is its id): fetched by an init
    container into a directory of the model cache volume, which vLLM serves (CLI: ``hub``;
    ``tuner.model_fetch`` says why a directory and not the hub cache)."""

    kind: Literal["hub"] = "hub"

    @staticmethod
    def local_dir(model: str) -> str:
        """Where a hub model's files lie in the pod: ``hf/ORG/NAME`` on the model cache."""
        parts = [re.sub(r"[^A-Za-z0-9._-]+", "-", p) for p in model.split("/")]
        kept = [p for p in parts if p.strip(".-")]
        return "/".join([HUB_MODELS_PATH, *(kept or ["model"])])

    @property
    def cli(self) -> str:
        return "hub"


_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


class ObjectStoreSource(_Frozen):
    """A copy of the model's files in an S3 bucket (CLI: ``s3://BUCKET/PREFIX``), synced by
    an init container of the object store's client into the model cache volume; vLLM
    serves that directory. ``credentials_secret``: a Secret whose keys are the client's
    environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL);
    None for the pod's own identity (a service account bound to a cloud role)."""

    kind: Literal["s3"] = "s3"
    uri: str
    credentials_secret: str | None = None
    image: str = S3_SYNC_IMAGE

    @field_validator("uri")
    @classmethod
    def _uri(cls, value: str) -> str:
        _no_control("object store URI", value)
        bucket, _, prefix = value.removeprefix("s3://").partition("/")
        prefix = prefix.strip("/")
        if not value.startswith("s3://") or not _S3_BUCKET.fullmatch(bucket):
            raise ValueError(
                f"object store URI {value!r} is not accepted; accepted: s3://BUCKET/PREFIX "
                "with a bucket name of 3 to 63 lowercase letters, digits, '.' and '-'"
            )
        if not prefix or ".." in prefix.split("/") or re.search(r"\s|//", prefix):
            raise ValueError(
                f"object store URI {value!r} is not accepted; accepted: s3://BUCKET/PREFIX, "
                "the folder of the model's config.json and weights (no '..', no spaces)"
            )
        return f"s3://{bucket}/{prefix}"

    @field_validator("credentials_secret")
    @classmethod
    def _secret(cls, value: str | None) -> str | None:
        if value is not None and not _DNS_SUBDOMAIN.fullmatch(value):
            raise ValueError(
                f"Secret name {value!r} is not accepted; accepted: a DNS-1123 subdomain "
                "(lowercase letters, digits, '-' and '.')"
            )
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        if not value or re.search(r"\s", value):
            raise ValueError(f"image {value!r} is not accepted; accepted: an image reference")
        return value

    @property
    def local_dir(self) -> str:
        """Where the copy lies in the pod: under the model cache, by bucket and prefix."""
        return f"{OBJECT_STORE_PATH}/{self.uri.removeprefix('s3://')}"

    @property
    def cli(self) -> str:
        return self.uri


class LocalSource(_Frozen):
    """The model's files already on a volume (CLI: ``path:/dir``): mounted read-only at
    ``path``, which vLLM is given; nothing is fetched, no init container."""

    kind: Literal["path"] = "path"
    path: str

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        _no_control("model path", value)
        if not value.startswith("/") or value.rstrip("/") == "" or ".." in value.split("/"):
            raise ValueError(
                f"model path {value!r} is not accepted; accepted: an absolute directory "
                "other than /, without '..', e.g. /mnt/models/llama-3.1-8b"
            )
        return value.rstrip("/")

    @property
    def cli(self) -> str:
        return f"path:{self.path}"


ModelSource = Annotated[HubSource | ObjectStoreSource | LocalSource, Field(discriminator="kind")]

_MODEL_SOURCE_FORMS = (
    "hub (the Hugging Face hub, the model field its id), s3://BUCKET/PREFIX (a copy in an "
    "S3 bucket), path:/absolute/dir (the model already on a volume)"
)


def parse_model_source(text: str) -> HubSource | ObjectStoreSource | LocalSource:
    """The model source of a CLI string; ConfigError of one line when it is not one."""
    value = text.strip()
    try:
        if value.lower() == "hub":
            return HubSource()
        if value.lower().startswith("s3://"):
            return ObjectStoreSource(uri="s3://" + value[5:])
        if value.lower().startswith("path:"):
            return LocalSource(path=value[5:])
        if value.startswith("/"):
            return LocalSource(path=value)
    except ValidationError as exc:
        reason = _first_error(exc, where=False)
        raise ConfigError(f"model source {text!r}: {reason}") from None
    raise ConfigError(f"model source {text!r} is not accepted; accepted: {_MODEL_SOURCE_FORMS}")


def _default_model_source(model: str) -> HubSource | ObjectStoreSource | LocalSource:
    """What a model name says of its source: an s3:// URI, an absolute directory, else a
    Hugging Face id."""
    if model.startswith("s3://"):
        return ObjectStoreSource(uri=model)
    if model.startswith("/"):
        return LocalSource(path=model)
    return HubSource()


def model_fields(
    model: str, *, source: str | None, cache: str | None, secret: str | None
) -> dict[str, Any]:
    """``DeploymentConfig``'s model fields from the command line's ``--model-source``,
    ``--model-cache`` and ``--model-secret NAME[:KEY]`` (the hub's token, key default
    ``token``; an object store's credentials, a Secret of its environment variables);
    ConfigError of one line naming the option. None leaves a field to its default."""
    fields: dict[str, Any] = {}
    try:
        if source is not None:
            fields["model_source"] = parse_model_source(source)
    except ConfigError as exc:  # "model source 'x' ..." -> "--model-source 'x' ..."
        raise ConfigError("--model-source " + str(exc).removeprefix("model source ")) from None
    try:
        if cache is not None:
            fields["model_cache"] = parse_model_cache(cache)
    except ConfigError as exc:
        raise ConfigError("--model-cache " + str(exc).removeprefix("model cache ")) from None
    if secret is not None:
        fields.update(_secret_fields(model, fields.get("model_source"), secret))
    try:  # the three together (a model on a volume needs the volume that holds it)
        DeploymentConfig(model=model, vllm_version="0.11.0", config_hash="check", **fields)
    except ValidationError as exc:
        raise ConfigError(f"the model's deployment: {_first_error(exc, where=False)}") from None
    return fields


def _secret_fields(
    model: str, source: HubSource | ObjectStoreSource | LocalSource | None, secret: str
) -> dict[str, Any]:
    name, colon, key = secret.strip().partition(":")
    try:
        source = source or _default_model_source(model)
        if isinstance(source, HubSource):
            return {"hf_token_secret": SecretKeyRef(name=name, key=key or "token")}
        if isinstance(source, ObjectStoreSource) and not colon:
            return {"model_source": ObjectStoreSource(uri=source.uri, credentials_secret=name)}
    except ValidationError as exc:
        raise ConfigError(f"--model-secret {secret!r}: {_first_error(exc, where=False)}") from None
    if isinstance(source, ObjectStoreSource):
        raise ConfigError(
            f"--model-secret {secret!r}: an object store's credentials are a whole Secret "
            "(its keys AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY...); accepted: NAME, no key"
        )
    raise ConfigError(
        f"--model-secret {secret!r}: the model source {source.cli!r} is a volume and fetches "
        "nothing; accepted: no secret, or a model from the hub or an object store"
    )


def _as_model_source(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return parse_model_source(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    return value


def _as_model_cache(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return parse_model_cache(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    return value


def _first_error(exc: ValidationError, *, where: bool = True) -> str:
    """A pydantic error as one line: where, what, with the value when it adds something."""
    errors = exc.errors()
    error = errors[0]
    loc = ".".join(str(p) for p in error["loc"]) if where else ""
    message = str(error["msg"])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if error["type"] in ("missing", "extra_forbidden"):
        what = "is missing" if error["type"] == "missing" else "is not a field here"
        return f"{loc or 'a field'} {what}{more}"
    if message.startswith("Value error, "):
        text = message.removeprefix("Value error, ")
    else:
        text = f"{error.get('input')!r} is not accepted: {message}"
    return f"{loc}: {text}{more}" if loc else f"{text}{more}"


# --- the deployment -------------------------------------------------------------------

FiniteFloat = Annotated[float, Field(strict=True, allow_inf_nan=False)]
# bool first so True/False never read as 1/0; strict, so "8" stays the string "8".
FlagValue = StrictBool | StrictInt | FiniteFloat | StrictStr


class Rollout(StrEnum):
    """How a new recommendation replaces the one serving (``--rollout``)."""

    # One Deployment: a new pod is added, warmed up and Ready before an old one drains
    # (maxSurge 1, maxUnavailable 0); old and new serve side by side meanwhile.
    ROLLING = "rolling"
    # One StatefulSet per config hash beside the old one; the Service is switched to it
    # (kubernetes-switch.yaml) once all its replicas are Ready, then the old one drains.
    BLUE_GREEN = "blue-green"

    @classmethod
    def parse(cls, text: str) -> Rollout:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise ConfigError(
                f"--rollout {text!r} is not accepted; accepted: " + ", ".join(r.value for r in cls)
            ) from None


class DeploymentConfig(_Frozen):
    """What to deploy: one vLLM server per replica, rendered by the functions below.

    ``flags`` are ``vllm serve`` options by long name without ``--`` (``--x`` and ``x_y``
    are accepted and normalised to ``x-y``), in order; True is a bare flag, False leaves
    it out. ``name`` defaults to a DNS label made from the model; ``image`` to vLLM's
    OpenAI server image of ``vllm_version``. Construct with keywords (pydantic raises
    ``ValidationError``) or with ``DeploymentConfig.build(...)`` (raises ``ConfigError``).
    """

    model: str
    vllm_version: str
    config_hash: str
    served_model_name: str | None = None
    flags: dict[str, FlagValue] = Field(default_factory=dict)
    tensor_parallel_size: PositiveInt = 1
    port: Annotated[int, Field(ge=1024, le=65535)] = 8000
    image: str
    cache_volume: CacheVolume = Field(default_factory=PvcCache)
    replicas: NonNegativeInt = 1
    name: str
    memory_request: str | None = None  # e.g. "64Gi"; also the memory limit
    cpu_request: str | None = None  # e.g. "8"; no CPU limit (throttling hurts latency)
    labels: dict[str, str] = Field(default_factory=dict)
    api_key_secret: SecretKeyRef | None = None  # VLLM_API_KEY from this Secret key
    # HF_TOKEN from this Secret key (gated models), for the init container that fetches
    # the model from the hub; vLLM itself starts offline and never sees it.
    hf_token_secret: SecretKeyRef | None = None
    # Where the weights come from (default: what the model's name says, a Hugging Face id,
    # an s3:// URI or an absolute directory) and the volume they are kept on (default: a
    # claim per replica for a fetched model, the directory itself on each node for a path).
    model_source: ModelSource
    model_cache: ModelCache
    model_fetch_timeout_s: PositiveInt = 3600  # the init container's bound
    rollout: Rollout = Rollout.ROLLING
    # What the startup probe sends before the pod turns Ready (None: a few short
    # requests of every size class, for a deployment without a measured workload).
    warmup: WarmupPlan | None = None
    warmup_timeout_s: PositiveInt = 600  # the warm-up's own bound, inside the startup's
    # Load + compile + warm-up, from an empty compile cache: a pod on a new node, or with a
    # new claim of its own, compiles from cold (the model was fetched before, in the init
    # container, within model_fetch_timeout_s).
    startup_timeout_s: PositiveInt = 1800
    # preStop: wait for the endpoints to drop the pod, then for the requests in flight.
    drain: DrainTiming = Field(default_factory=lambda: drain_timing(None))
    shm_size: str = "2Gi"  # /dev/shm for NCCL when a replica has more than one GPU
    # Pods go only to nodes with these labels (the GPU type a capacity plan chose:
    # ``nvidia.com/gpu.product``, as NVIDIA's GPU feature discovery labels nodes).
    node_selector: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if isinstance(data.get("model"), str):  # a preset's short name is no Hugging Face repo
            data["model"] = hf_id_of(data["model"]) or data["model"]
        if isinstance(data.get("vllm_version"), str):  # the installed release a tune measured
            data["vllm_version"] = image_release(data["vllm_version"])
        if data.get("image") is None and isinstance(data.get("vllm_version"), str):
            data["image"] = f"vllm/vllm-openai:v{_image_tag(data['vllm_version'])}"
        if data.get("name") is None and isinstance(data.get("model"), str):
            data["name"] = dns_label(data["model"], max_len=50)
        if "cache_volume" in data:
            data["cache_volume"] = _as_cache_volume(data["cache_volume"])
        if data.get("model_source") is None and isinstance(data.get("model"), str):
            try:
                data["model_source"] = _default_model_source(data["model"])
            except ValidationError as exc:
                reason = _first_error(exc, where=False)
                raise ValueError(f"the model's source: {reason}") from None
        source = data["model_source"] = _as_model_source(data.get("model_source"))
        if data.get("model_cache") is None:
            if isinstance(source, LocalSource):  # the directory itself, on each node
                data["model_cache"] = HostPathCache(path=source.path)
            elif isinstance(source, HubSource | ObjectStoreSource):
                data["model_cache"] = PvcCache(size=DEFAULT_MODEL_CACHE_SIZE)
        else:
            data["model_cache"] = _as_model_cache(data["model_cache"])
        return data

    @model_validator(mode="after")
    def _model_source_fits(self) -> DeploymentConfig:
        source, cache = self.model_source, self.model_cache
        if isinstance(source, LocalSource) and isinstance(cache, PvcCache):
            raise ValueError(
                f"model source {source.cli!r} reads a model already on a volume and a new "
                f"claim ({cache.cli}) is empty; accepted: a model cache that holds it, "
                "hostpath:/dir or claim:NAME"
            )
        tokenizer = self.flags.get("tokenizer")
        if isinstance(tokenizer, str) and not tokenizer.startswith("/"):
            raise ValueError(
                f"flag tokenizer {tokenizer!r} names a hub repository, which a pod would "
                "download at start (vLLM runs offline there); accepted: the model's own "
                "tokenizer, or a directory on a volume"
            )
        if self.hf_token_secret is not None and not isinstance(source, HubSource):
            raise ValueError(
                f"hf_token_secret is for a model from the Hugging Face hub, and the model "
                f"source is {source.cli!r}; accepted: no token, or model source hub"
            )
        shm_gib = shm_size_gib(self)
        if (
            kv_offloading_gib(self) > 0
            and self.memory_request is not None
            and quantity_gib(self.memory_request) < shm_gib
        ):
            raise ValueError(
                f"memory_request {self.memory_request} does not hold the in-memory /dev/shm "
                f"({shm_gib}Gi) that --kv-offloading-size "
                f"{kv_offloading_gib(self):g} maps its buffer from; accepted: at least "
                f"{shm_gib}Gi"
            )
        return self

    @field_validator("model", "served_model_name")
    @classmethod
    def _model(cls, value: str | None) -> str | None:
        return None if value is None else _no_control("model name", value)

    @field_validator("vllm_version")
    @classmethod
    def _version(cls, value: str) -> str:
        if not _VERSION.fullmatch(value.removeprefix("v")):
            raise ValueError(
                f"vLLM version {value!r} is not accepted; accepted: X.Y or X.Y.Z, e.g. 0.11.0"
            )
        return value.removeprefix("v")

    @field_validator("config_hash")
    @classmethod
    def _hash(cls, value: str) -> str:
        if not _LABEL_NAME.fullmatch(value):
            raise ValueError(
                f"config hash {value!r} is not accepted; accepted: 1 to 63 letters, digits, "
                "'-', '_' or '.', starting and ending alphanumeric (it is a label value), "
                "e.g. the first 16 hex digits of a sha256"
            )
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        if not value or re.search(r"\s", value):
            raise ValueError(f"image {value!r} is not accepted; accepted: an image reference")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if len(value) > 50 or not _DNS_1035.fullmatch(value):
            raise ValueError(
                f"name {value!r} is not accepted; accepted: a DNS-1035 label of at most 50 "
                "characters (lowercase letters, digits and '-', starting with a letter)"
            )
        return value

    @field_validator("memory_request", "cpu_request", "shm_size")
    @classmethod
    def _quantity(cls, value: str | None) -> str | None:
        if value is not None and not _QUANTITY.fullmatch(value):
            raise ValueError(
                f"quantity {value!r} is not accepted; accepted: a Kubernetes quantity "
                "such as 64Gi, 8 or 500m"
            )
        return value

    @field_validator("flags", mode="before")
    @classmethod
    def _flag_names(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        out: dict[str, Any] = {}
        for raw, flag_value in value.items():
            if not isinstance(raw, str):
                raise ValueError(f"flag name {raw!r} is not accepted; accepted: a string")
            name = raw.removeprefix("--").replace("_", "-")
            if not _FLAG_NAME.fullmatch(name):
                raise ValueError(
                    f"flag {raw!r} is not accepted; accepted: a vllm serve long option name "
                    "such as gpu-memory-utilization"
                )
            if name in _RESERVED_FLAGS:
                raise ValueError(
                    f"flag {raw!r} is not accepted here; set it with {_RESERVED_FLAGS[name]}"
                )
            if name in out:
                raise ValueError(f"flag {name!r} is given twice")
            if not isinstance(flag_value, bool | int | float | str) or (
                isinstance(flag_value, float) and not math.isfinite(flag_value)
            ):
                raise ValueError(
                    f"flag {name} value {flag_value!r} is not accepted; accepted: text, an "
                    "integer, a finite number, or true/false"
                )
            if isinstance(flag_value, str) and _CONTROL.search(flag_value):
                raise ValueError(
                    f"flag {name} value {flag_value!r} contains a control character; "
                    "accepted: printable text"
                )
            out[name] = flag_value
        return out

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label_value in value.items():
            prefix, slash, label_name = key.rpartition("/")
            if (slash and not _DNS_SUBDOMAIN.fullmatch(prefix)) or not _LABEL_NAME.fullmatch(
                label_name
            ):
                raise ValueError(f"label key {key!r} is not accepted; accepted: [prefix/]name")
            if label_value and not _LABEL_NAME.fullmatch(label_value):
                raise ValueError(
                    f"label {key}={label_value!r} is not accepted; accepted: at most 63 "
                    "letters, digits, '-', '_' or '.', starting and ending alphanumeric"
                )
            if key in _RESERVED_LABELS:
                raise ValueError(f"label {key!r} is set by the renderer; accepted: other keys")
        return value

    @classmethod
    def build(cls, **fields: Any) -> DeploymentConfig:
        """Validate ``fields``; ConfigError of one line naming the first bad value."""
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise ConfigError(f"deployment config: {_first_error(exc)}") from None

    @property
    def gpus_per_replica(self) -> int:
        """tensor x pipeline parallel size: the GPUs one server uses on its node."""
        pipeline = self.flags.get("pipeline-parallel-size", 1)
        pp = 1
        if isinstance(pipeline, str) and pipeline.isdigit():
            pp = int(pipeline)
        elif isinstance(pipeline, int) and not isinstance(pipeline, bool):
            pp = pipeline
        return self.tensor_parallel_size * max(pp, 1)

    def serve_flags(self) -> list[tuple[str, FlagValue]]:
        """Every ``vllm serve`` option in order, the fields' first; False ones left out."""
        head: list[tuple[str, FlagValue]] = []
        if self.served_model_name is not None:
            head.append(("served-model-name", self.served_model_name))
        head += [("port", self.port), ("tensor-parallel-size", self.tensor_parallel_size)]
        return head + [(k, v) for k, v in self.flags.items() if v is not False]


def image_release(version: str) -> str:
    """The release of vLLM's image for an installed release as its packages spell it
    (``0.10.1.1`` stays, ``v0.11.0+cpu`` is ``0.11.0``, ``0.26.1rc1.dev156+g0eec856cc`` is
    ``0.26.1rc1``): the image a recommendation deploys is the release the tune measured."""
    return _BUILD_SUFFIX.sub("", version.strip().removeprefix("v"), count=1)


def _image_tag(version: str) -> str:
    """vLLM's images are tagged vX.Y.Z: an X.Y version gets .0."""
    version = version.removeprefix("v")
    return f"{version}.0" if re.fullmatch(r"\d+\.\d+", version) else version


def _flag_text(value: FlagValue) -> str:
    if isinstance(value, float):
        return repr(value)  # shortest text that reads back as the same float
    return str(value)


def _flag_groups(cfg: DeploymentConfig) -> list[list[str]]:
    """Each option as the arguments it takes on a command line (no shell involved)."""
    groups: list[list[str]] = []
    for name, value in cfg.serve_flags():
        if value is True:
            groups.append([f"--{name}"])
            continue
        text = _flag_text(value)
        # argparse would take a value starting with '-' for an option: glue it on.
        groups.append([f"--{name}={text}"] if text.startswith("-") else [f"--{name}", text])
    return groups


def _argv(cfg: DeploymentConfig) -> list[str]:
    """``MODEL --flag value ...``: the arguments after ``vllm serve``."""
    return [cfg.model] + [arg for group in _flag_groups(cfg) for arg in group]


# --- 1. the command line --------------------------------------------------------------


def vllm_args(cfg: DeploymentConfig) -> str:
    """A ready ``vllm serve`` command: shell-quoted, one flag a line, backslash continued."""
    lines = [f"vllm serve {shlex.quote(cfg.model)}"]
    lines += ["    " + " ".join(shlex.quote(arg) for arg in group) for group in _flag_groups(cfg)]
    return " \\\n".join(lines) + "\n"


# --- 2. vLLM's config file ------------------------------------------------------------


def vllm_config_yaml(cfg: DeploymentConfig) -> str:
    """YAML for ``vllm serve --config FILE``: long option names as keys, ``model:`` included.

    Values keep their YAML types (vLLM passes ``str(value)`` to its parser), True is a
    bare flag, False flags are absent. A model given on the command line
    (``vllm serve MODEL --config FILE``) takes precedence over ``model:``.
    """
    data: dict[str, Any] = {"model": cfg.model}
    data.update(cfg.serve_flags())
    header = (
        f"# vLLM {cfg.vllm_version} serve config, config hash {cfg.config_hash}, "
        "rendered by vllm-capacity-tuner\n"
        "# Start with: vllm serve --config vllm-config.yaml\n"
    )
    return header + yaml.safe_dump(
        data, sort_keys=False, default_flow_style=False, allow_unicode=True, width=4096
    )


# --- 3. Kubernetes: the serving workload ----------------------------------------------


def _k8s_literal(text: str) -> str:
    """Kubernetes expands $(VAR) in command, args and env values; $$ is a literal $."""
    return text.replace("$", "$$")


# Without a measured workload: short, medium and long prompts, once each, one at a time.
_GENERIC_WARMUP = (
    WarmupRequest(prompt_tokens=16, output_tokens=16, prefix=None),
    WarmupRequest(prompt_tokens=256, output_tokens=64, prefix=None),
    WarmupRequest(prompt_tokens=1024, output_tokens=128, prefix=None),
    WarmupRequest(prompt_tokens=64, output_tokens=256, prefix=None),
)


def warmup_plan_of(cfg: DeploymentConfig) -> WarmupPlan:
    """The warm-up the pods run: the configured plan, else a generic one."""
    if cfg.warmup is not None:
        return cfg.warmup
    return WarmupPlan(
        served_model=cfg.served_model_name or cfg.model, api="completions", prefixes=[],
        requests=list(_GENERIC_WARMUP), max_requests=len(_GENERIC_WARMUP),
        kv_cache_fill=None, concurrency=1,
    )  # fmt: skip


def _selector(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": name}


def _version_selector(cfg: DeploymentConfig) -> dict[str, str]:
    """The pods of this config only (blue-green: one side)."""
    return {**_selector(cfg.name), HASH_KEY: cfg.config_hash}


def _versioned_name(cfg: DeploymentConfig) -> str:
    """``name-<hash8>``: this version's objects. At most 52 characters, so a StatefulSet's
    controller-revision-hash label (the name, a dash and 10 characters) stays a label."""
    suffix = re.sub(r"[^a-z0-9]", "", cfg.config_hash.lower())[:8] or "0"
    return f"{dns_label(cfg.name, max_len=43)}-{suffix}"


def _scripts_name(cfg: DeploymentConfig) -> str:
    """The ConfigMap of the warm-up and drain programs (per version: old pods keep theirs)."""
    return f"{_versioned_name(cfg)}-scripts"


def _secret_env(var: str, ref: SecretKeyRef) -> dict[str, Any]:
    return {"name": var, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def _claim_spec(volume: PvcCache, access_mode: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "accessModes": [access_mode],
        "volumeMode": "Filesystem",
        "resources": {"requests": {"storage": volume.size}},
    }
    if volume.storage_class is not None:
        spec["storageClassName"] = volume.storage_class
    return spec


def _claim(volume: PvcCache, *, name: str, pods: int, labels: dict[str, str]) -> dict[str, Any]:
    """The PersistentVolumeClaim of a PVC cache, its access mode chosen for ``pods``."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": labels},
        "spec": _claim_spec(volume, volume.access_mode_for(pods)),
    }


def _shared_cache_volume(volume: PvcCache | HostPathCache, claim_name: str) -> dict[str, Any]:
    """One cache for every pod: the claim they share, or a hostPath (a directory per node)."""
    if isinstance(volume, PvcCache):
        return {"name": "vllm-cache", "persistentVolumeClaim": {"claimName": claim_name}}
    return {"name": "vllm-cache", "hostPath": {"path": volume.path, "type": "DirectoryOrCreate"}}


_GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
_STARTUP_PERIOD_S = 10


def kubernetes_manifests(cfg: DeploymentConfig) -> str:
    """The serving objects of ``cfg.rollout``, as multi-document YAML.

    Both modes: a ConfigMap with the warm-up and drain programs; pods whose startup
    probe runs the warm-up (the workload's lengths and prefixes) before readiness
    (GET /health) starts, so no traffic reaches a cold server; a preStop that waits
    for the endpoints to drop the pod and then for ``vllm:num_requests_running`` and
    ``vllm:num_requests_waiting`` to reach zero, within a grace period sized from the
    measured p99 end-to-end latency. Every object carries the config hash (label and
    annotation).

    rolling: a Deployment (maxSurge 1, maxUnavailable 0) and its Service; the compile
    cache is one claim per pod (a generic ephemeral volume), a shared ReadWriteMany
    claim (``pvc:SIZE:CLASS:rwx``) or a hostPath.
    blue-green: this version's StatefulSet (a claim per replica from its template) and
    headless Service, both named ``name-<hash8>``; ``kubernetes_switch`` is the Service
    that moves the traffic to it.
    """
    docs: list[dict[str, Any]] = [_scripts_config_map(cfg)]
    volume = cfg.cache_volume
    if isinstance(volume, PvcCache) and volume.shared:
        # Shared by every version: its hash label says which version applied it last.
        claim = _claim(
            volume, name=_serving_claim_name(cfg), pods=cfg.replicas, labels=_hashed_labels(cfg)
        )
        claim["metadata"]["annotations"] = _serving_annotations(cfg)
        docs.append(claim)
    model_cache = cfg.model_cache
    if isinstance(model_cache, PvcCache) and model_cache.shared:
        claim = _claim(
            model_cache, name=_model_claim_name(cfg), pods=cfg.replicas,
            labels=_hashed_labels(cfg),
        )  # fmt: skip
        claim["metadata"]["annotations"] = _serving_annotations(cfg)
        docs.append(claim)
    if cfg.rollout is Rollout.ROLLING:
        docs += [_deployment(cfg), _service(cfg, name=cfg.name, selector=_selector(cfg.name))]
    else:
        versioned = _versioned_name(cfg)
        docs += [
            _service(cfg, name=versioned, selector=_version_selector(cfg), headless=True),
            _stateful_set(cfg),
        ]
    notes = "".join(f"# {what}: {note}\n" for what, note in _cache_notes(cfg).items())
    return _header(cfg) + notes + _dump_all(docs)


def kubernetes_switch(cfg: DeploymentConfig) -> str | None:
    """blue-green: the Service that sends the traffic to this version's pods (apply it once
    they are all Ready); None for a rolling update, whose Service never changes."""
    if cfg.rollout is not Rollout.BLUE_GREEN:
        return None
    return _header(cfg) + _dump_all([_service(cfg, name=cfg.name, selector=_version_selector(cfg))])


def warmup_job_manifests(cfg: DeploymentConfig) -> str:
    """A Job that runs the same warm-up from outside the pods, through the Service (the
    rolling Service, or blue-green's side not yet switched to). Needs the ConfigMap of
    ``kubernetes_manifests``."""
    target = cfg.name if cfg.rollout is Rollout.ROLLING else _versioned_name(cfg)
    env: list[dict[str, Any]] = []
    if cfg.api_key_secret is not None:
        env.append(_secret_env("VLLM_API_KEY", cfg.api_key_secret))
    container: dict[str, Any] = {
        "name": "warmup",
        "image": WARMUP_JOB_IMAGE,
        "command": [
            "python3", f"{SCRIPTS_MOUNT_PATH}/{WARMUP_FILE}", "--url",
            f"http://{target}:{cfg.port}", "--timeout-s", str(cfg.warmup_timeout_s),
        ],
        "volumeMounts": [{"name": "scripts", "mountPath": SCRIPTS_MOUNT_PATH, "readOnly": True}],
    }  # fmt: skip
    if env:
        container["env"] = env
    # Not the serving pods' name label: the Services and the Deployment must not select
    # the Job's pod.
    labels = {
        **_hashed_labels(cfg),
        "app.kubernetes.io/name": "vllm-warmup",
        "app.kubernetes.io/component": "warmup",
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"{_versioned_name(cfg)}-warmup",
            "labels": labels,
            "annotations": _serving_annotations(cfg),
        },
        "spec": {
            "backoffLimit": 2,
            # The serving pods' whole start: the model fetched, a cold compile, the warm-up.
            "activeDeadlineSeconds": _fetch_budget_s(cfg)
            + cfg.startup_timeout_s
            + cfg.warmup_timeout_s,
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "OnFailure",
                    "enableServiceLinks": False,
                    "containers": [container],
                    "volumes": [_scripts_volume(cfg)],
                },
            },
        },
    }
    return _header(cfg) + _dump_all([job])


def _header(cfg: DeploymentConfig) -> str:
    return (
        f"# vLLM {cfg.vllm_version} serving {cfg.model!r}, config hash {cfg.config_hash}, "
        f"rollout {cfg.rollout.value}; rendered by vllm-capacity-tuner\n"
    )


def _serving_claim_name(cfg: DeploymentConfig) -> str:
    """The name of the shared cache claim (ReadWriteMany; every version mounts it)."""
    return f"{cfg.name}-vllm-cache"


def _model_claim_name(cfg: DeploymentConfig) -> str:
    """The name of the shared model cache claim (ReadWriteMany; every version mounts it)."""
    return f"{cfg.name}-model-cache"


def _serving_labels(cfg: DeploymentConfig) -> dict[str, str]:
    """The labels of every serving object (the claim's; the others add the config hash)."""
    return {
        **cfg.labels,
        **_selector(cfg.name),
        "app.kubernetes.io/component": "inference-server",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/version": cfg.vllm_version,
    }


def _hashed_labels(cfg: DeploymentConfig) -> dict[str, str]:
    """The serving labels plus the config hash: the Deployment's, its pods' and the Service's."""
    return {**_serving_labels(cfg), HASH_KEY: cfg.config_hash}


def _serving_annotations(cfg: DeploymentConfig) -> dict[str, str]:
    """The config hash and the model, as annotations of the Deployment, pods and Service."""
    return {HASH_KEY: cfg.config_hash, f"{LABEL_PREFIX}/model": cfg.model}


def _scripts_config_map(cfg: DeploymentConfig) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": _scripts_name(cfg),
            "labels": _hashed_labels(cfg),
            "annotations": _serving_annotations(cfg),
        },
        "data": {
            WARMUP_FILE: warmup_script(warmup_plan_of(cfg)),
            DRAIN_FILE: drain_script(),
            **(
                {FETCH_FILE: fetch_model_script()}
                if isinstance(cfg.model_source, HubSource)
                else {}
            ),
        },
    }


def _scripts_volume(cfg: DeploymentConfig) -> dict[str, Any]:
    return {"name": "scripts", "configMap": {"name": _scripts_name(cfg), "defaultMode": 0o555}}


def _serving_env(cfg: DeploymentConfig) -> list[dict[str, Any]]:
    """The vLLM container's environment: the cache directory, and the Secrets' keys."""
    env: list[dict[str, Any]] = [{"name": CACHE_ROOT_ENV, "value": CACHE_MOUNT_PATH}]
    if not isinstance(cfg.model_source, LocalSource):
        env += _hub_cache_env()
    # The model is on a volume before vLLM starts: it never asks the hub (huggingface_hub's
    # HF_HUB_OFFLINE), so a pod neither downloads at start nor needs a token.
    env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    if cfg.api_key_secret is not None:
        env.append(_secret_env("VLLM_API_KEY", cfg.api_key_secret))
    return env


def _hub_cache_env() -> list[dict[str, Any]]:
    """HF_HOME and HF_HUB_CACHE on the model cache volume."""
    return [
        {"name": "HF_HOME", "value": HF_HOME_PATH},
        {"name": "HF_HUB_CACHE", "value": HF_HUB_CACHE_PATH},
    ]


# Host memory a server uses beside its KV offloading buffer, requested with it where no
# memory_request is given: the process (Python, the tokenizer, the scheduler) and the
# weights' staging while loading; an assumption, set memory_request to state your own.
SERVER_HOST_GIB = 16
_QUANTITY_GIB = {
    "": 1 / 2**30, "Ki": 1 / 2**20, "Mi": 1 / 2**10, "Gi": 1, "Ti": 2**10, "Pi": 2**20,
    "Ei": 2**30, "m": 1e-3 / 2**30, "k": 1e3 / 2**30, "M": 1e6 / 2**30, "G": 1e9 / 2**30,
    "T": 1e12 / 2**30, "P": 1e15 / 2**30, "E": 1e18 / 2**30,
}  # fmt: skip


def quantity_gib(quantity: str) -> float:
    """A Kubernetes quantity (already checked against ``_QUANTITY``) in GiB."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", quantity)
    assert match is not None, quantity
    return float(match.group(1)) * _QUANTITY_GIB[match.group(2)]


def kv_offloading_gib(cfg: DeploymentConfig) -> float:
    """The config's --kv-offloading-size in GiB (0: it does not offload)."""
    value = cfg.flags.get("kv-offloading-size")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return 0.0
    try:
        return max(float(value), 0.0)
    except ValueError:
        return 0.0


def shm_size_gib(cfg: DeploymentConfig) -> int:
    """Whole GiB of in-memory /dev/shm the pod mounts where the server offloads KV: the
    whole buffer (vLLM maps it from /dev/shm, ``cpu/shared_offload_region.py``, and
    refuses to start where it does not fit: "Insufficient space in /dev/shm") plus
    ``shm_size`` for NCCL and the rest."""
    return math.ceil(kv_offloading_gib(cfg) + quantity_gib(cfg.shm_size))


def _serving_mounts(cfg: DeploymentConfig) -> list[dict[str, Any]]:
    """The vLLM container's mounts: the cache, the scripts, and /dev/shm with several GPUs
    or a KV offloading buffer."""
    mounts: list[dict[str, Any]] = [
        {"name": "vllm-cache", "mountPath": CACHE_MOUNT_PATH},
        _model_mount(cfg),
        {"name": "scripts", "mountPath": SCRIPTS_MOUNT_PATH, "readOnly": True},
    ]
    if cfg.gpus_per_replica > 1 or kv_offloading_gib(cfg) > 0:
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return mounts


def _cache_volume(cfg: DeploymentConfig) -> dict[str, Any] | None:
    """The pod's cache volume (None: a StatefulSet's claim template provides it)."""
    volume = cfg.cache_volume
    if isinstance(volume, HostPathCache) or volume.shared:
        return _shared_cache_volume(volume, _serving_claim_name(cfg))
    if cfg.rollout is Rollout.BLUE_GREEN:
        return None
    return _claim_per_pod("vllm-cache", cfg, volume)


def _claim_per_pod(name: str, cfg: DeploymentConfig, volume: PvcCache) -> dict[str, Any]:
    """Volume ``name`` as a claim per pod, made with it and deleted with it (a container
    restart keeps it)."""
    return {
        "name": name,
        "ephemeral": {
            "volumeClaimTemplate": {
                "metadata": {"labels": _hashed_labels(cfg)},
                "spec": _claim_spec(volume, "ReadWriteOnce"),
            }
        },
    }


def _serving_volumes(cfg: DeploymentConfig) -> list[dict[str, Any]]:
    """The pod's volumes: the cache, the scripts, an in-memory /dev/shm with several GPUs
    or a KV offloading buffer (``shm_size_gib``)."""
    volumes: list[dict[str, Any]] = [
        v for v in (_cache_volume(cfg), _model_volume(cfg)) if v is not None
    ]
    volumes.append(_scripts_volume(cfg))
    if cfg.gpus_per_replica > 1 or kv_offloading_gib(cfg) > 0:
        limit = f"{shm_size_gib(cfg)}Gi" if kv_offloading_gib(cfg) > 0 else cfg.shm_size
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": limit}})
    return volumes


# --- the model before the server: its volume, the init container, what a new pod finds --


def _fetches(cfg: DeploymentConfig) -> bool:
    """An init container fetches the model (from the hub or an object store)."""
    return not isinstance(cfg.model_source, LocalSource)


def _fetch_budget_s(cfg: DeploymentConfig) -> int:
    """The init container's bound (0 without one): before the startup probe's budget."""
    return cfg.model_fetch_timeout_s if _fetches(cfg) else 0


def _vllm_model(cfg: DeploymentConfig) -> str:
    """What the pod's vLLM is given: the directory the init container filled from the hub
    or the object store, or the model's own directory on a volume."""
    source = cfg.model_source
    if isinstance(source, ObjectStoreSource):
        return source.local_dir
    if isinstance(source, LocalSource):
        return source.path
    return HubSource.local_dir(cfg.model)


def _pod_argv(cfg: DeploymentConfig) -> list[str]:
    """``_argv`` with the model vLLM reads in the pod; served under the model's own name
    where that is another (clients and the warm-up ask for it by that name)."""
    argv = _argv(cfg)
    argv[0] = _vllm_model(cfg)
    if argv[0] != cfg.model and cfg.served_model_name is None:
        argv[1:1] = ["--served-model-name", cfg.model]
    return argv


def _model_mount(cfg: DeploymentConfig) -> dict[str, Any]:
    """The model cache in a container: at its own path, or read-only at the model's
    directory for a model already on a volume."""
    if isinstance(cfg.model_source, LocalSource):
        return {"name": "model-cache", "mountPath": cfg.model_source.path, "readOnly": True}
    return {"name": "model-cache", "mountPath": MODEL_CACHE_MOUNT_PATH}


def _model_volume(cfg: DeploymentConfig) -> dict[str, Any] | None:
    """The pod's model volume (None: a StatefulSet's claim template provides it)."""
    cache = cfg.model_cache
    local = isinstance(cfg.model_source, LocalSource)
    if isinstance(cache, HostPathCache):
        # A model already there must be there: no empty directory made in its place.
        kind = "Directory" if local else "DirectoryOrCreate"
        return {"name": "model-cache", "hostPath": {"path": cache.path, "type": kind}}
    if isinstance(cache, ClaimCache):
        claim: dict[str, Any] = {"claimName": cache.claim_name}
        if local:
            claim["readOnly"] = True
        return {"name": "model-cache", "persistentVolumeClaim": claim}
    if cache.shared:
        return {
            "name": "model-cache",
            "persistentVolumeClaim": {"claimName": _model_claim_name(cfg)},
        }
    if cfg.rollout is Rollout.BLUE_GREEN:
        return None
    return _claim_per_pod("model-cache", cfg, cache)


def _init_containers(cfg: DeploymentConfig) -> list[dict[str, Any]]:
    """The container that puts the model on the model cache before vLLM starts (none for
    a model already on a volume). Idempotent: on a warm cache it fetches nothing."""
    source = cfg.model_source
    cache_mount = {"name": "model-cache", "mountPath": MODEL_CACHE_MOUNT_PATH}
    if isinstance(source, HubSource):
        # vLLM's own image: its huggingface_hub is the one vLLM reads the cache with.
        command = [
            "python3", f"{SCRIPTS_MOUNT_PATH}/{FETCH_FILE}", "--repo", _k8s_literal(cfg.model),
            "--local-dir", _k8s_literal(_vllm_model(cfg)),
            "--timeout-s", str(cfg.model_fetch_timeout_s),
        ]  # fmt: skip
        revision = cfg.flags.get("revision")
        if isinstance(revision, str):
            command += ["--revision", _k8s_literal(revision)]
        env = [*_hub_cache_env(), {"name": "HF_HUB_DISABLE_PROGRESS_BARS", "value": "1"}]
        if cfg.hf_token_secret is not None:
            env.append(_secret_env("HF_TOKEN", cfg.hf_token_secret))
        return [
            {
                "name": "fetch-model",
                "image": cfg.image,
                "command": command,
                "env": env,
                "volumeMounts": [
                    cache_mount,
                    {"name": "scripts", "mountPath": SCRIPTS_MOUNT_PATH, "readOnly": True},
                ],
            }
        ]
    if isinstance(source, ObjectStoreSource):
        container: dict[str, Any] = {
            "name": "fetch-model",
            "image": source.image,
            "command": ["aws", "s3", "sync", source.uri, source.local_dir, "--only-show-errors"],
            "volumeMounts": [cache_mount],
        }
        if source.credentials_secret is not None:
            container["envFrom"] = [{"secretRef": {"name": source.credentials_secret}}]
        return [container]
    return []


def _cache_notes(cfg: DeploymentConfig) -> dict[str, str]:
    """What a new pod finds in each cache, said on the pods and atop the manifests: warm
    where the volume outlives the pod, cold (fetched, compiled) where it is new."""
    return {"model-cache": _model_cache_note(cfg), "compile-cache": _compile_cache_note(cfg)}


def _model_cache_note(cfg: DeploymentConfig) -> str:
    source, cache = cfg.model_source, cfg.model_cache
    if isinstance(source, LocalSource):
        return f"the model is read from {source.path} on {cache.cli}; nothing is fetched"
    where = "the Hugging Face hub" if isinstance(source, HubSource) else source.uri
    fetched = f"the init container fetch-model copies it from {where} before vLLM starts"
    if isinstance(cache, HostPathCache):
        return f"warm on a node that held it before ({cache.path}); on a new node {fetched}"
    if isinstance(cache, ClaimCache):
        return f"warm once fetched (the claim {cache.claim_name}, shared); else {fetched}"
    if cache.shared:
        return f"warm after the first pod (one ReadWriteMany claim); for that pod {fetched}"
    if cfg.rollout is Rollout.BLUE_GREEN:
        return f"cold in each new replica (a claim per replica, kept across restarts): {fetched}"
    return f"cold in every new pod (a claim per pod): {fetched}"


def _compile_cache_note(cfg: DeploymentConfig) -> str:
    cache = cfg.cache_volume
    budget = f"the startup probe's {cfg.startup_timeout_s} s allow for a cold compile"
    if isinstance(cache, HostPathCache):
        return f"warm on a node that compiled this config before ({cache.path}); {budget}"
    if cache.shared:
        return f"warm after the first pod compiled (one ReadWriteMany claim); {budget}"
    if cfg.rollout is Rollout.BLUE_GREEN:
        return f"cold in each new replica (a claim per replica, kept across restarts); {budget}"
    return f"cold in every new pod (a claim per pod); {budget}"


def _serving_resources(cfg: DeploymentConfig) -> dict[str, Any]:
    """GPU limit, optional CPU request, and memory as both request and limit."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {GPU_RESOURCE: cfg.gpus_per_replica}
    if cfg.cpu_request is not None:
        requests["cpu"] = cfg.cpu_request
    if cfg.memory_request is not None:
        requests["memory"] = limits["memory"] = cfg.memory_request
    elif kv_offloading_gib(cfg) > 0:
        # the in-memory /dev/shm counts as the pod's memory: the node must have it (no
        # limit set where none was asked for: the server's own use beside it is unknown)
        requests["memory"] = f"{shm_size_gib(cfg) + SERVER_HOST_GIB}Gi"
    resources: dict[str, Any] = {"limits": limits}
    if requests:
        resources["requests"] = requests
    return resources


def _local_url(cfg: DeploymentConfig) -> str:
    return f"http://127.0.0.1:{cfg.port}"


def _startup_probe(cfg: DeploymentConfig) -> dict[str, Any]:
    """The probe that runs the warm-up once the server is healthy (``startup_timeout_s``
    in all); its marker file makes later probes a health check only."""
    return {
        "exec": {
            "command": [
                "python3", f"{SCRIPTS_MOUNT_PATH}/{WARMUP_FILE}", "--url", _local_url(cfg),
                "--probe", WARM_MARKER, "--timeout-s", str(cfg.warmup_timeout_s),
            ]
        },
        "periodSeconds": _STARTUP_PERIOD_S,
        "timeoutSeconds": cfg.warmup_timeout_s + 30,
        "failureThreshold": math.ceil(cfg.startup_timeout_s / _STARTUP_PERIOD_S),
    }  # fmt: skip


def _pre_stop(cfg: DeploymentConfig) -> dict[str, Any]:
    """The drain: wait for the endpoints to drop the pod, then for the requests in flight."""
    return {
        "exec": {
            "command": [
                "python3", f"{SCRIPTS_MOUNT_PATH}/{DRAIN_FILE}", "--url", _local_url(cfg),
                *cfg.drain.script_args(),
            ]
        }
    }  # fmt: skip


def _health_probe(*, period_s: int, timeout_s: int, failures: int) -> dict[str, Any]:
    """A GET /health probe on the http port (readiness and liveness)."""
    return {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": period_s,
        "timeoutSeconds": timeout_s,
        "failureThreshold": failures,
    }


def _serving_container(cfg: DeploymentConfig) -> dict[str, Any]:
    """The vLLM container: ``vllm serve`` with its arguments, probes and preStop drain."""
    return {
        "name": "vllm",
        "image": cfg.image,
        "command": ["vllm", "serve"],
        "args": [_k8s_literal(arg) for arg in _pod_argv(cfg)],
        "env": _serving_env(cfg),
        "ports": [{"name": "http", "containerPort": cfg.port, "protocol": "TCP"}],
        "resources": _serving_resources(cfg),
        "volumeMounts": _serving_mounts(cfg),
        "startupProbe": _startup_probe(cfg),
        "readinessProbe": _health_probe(period_s=5, timeout_s=5, failures=3),
        "livenessProbe": _health_probe(period_s=15, timeout_s=10, failures=4),
        "lifecycle": {"preStop": _pre_stop(cfg)},
    }


def _pod_template(cfg: DeploymentConfig) -> dict[str, Any]:
    return {
        "metadata": {
            "labels": _hashed_labels(cfg),
            "annotations": {
                **_serving_annotations(cfg),
                **{f"{LABEL_PREFIX}/{what}": note for what, note in _cache_notes(cfg).items()},
            },
        },
        "spec": {
            # No FOO_PORT variables from Services: a Service named vllm would set
            # VLLM_PORT, which vLLM reads as its own setting.
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": cfg.drain.grace_period_s,
            **({"nodeSelector": dict(cfg.node_selector)} if cfg.node_selector else {}),
            "tolerations": [_GPU_TOLERATION],
            **({"initContainers": inits} if (inits := _init_containers(cfg)) else {}),
            "containers": [_serving_container(cfg)],
            "volumes": _serving_volumes(cfg),
        },
    }


def _deployment(cfg: DeploymentConfig) -> dict[str, Any]:
    """rolling: the Deployment of ``replicas`` vLLM pods, none taken down before its
    replacement is Ready."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": cfg.name,
            "labels": _hashed_labels(cfg),
            "annotations": _serving_annotations(cfg),
        },
        "spec": {
            "replicas": cfg.replicas,
            "selector": {"matchLabels": _selector(cfg.name)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            # A new pod fetches the model, loads, compiles (from cold on a new node) and
            # warms up before it counts as progress.
            "progressDeadlineSeconds": _fetch_budget_s(cfg) + cfg.startup_timeout_s + 600,
            "template": _pod_template(cfg),
        },
    }


def _stateful_set(cfg: DeploymentConfig) -> dict[str, Any]:
    """blue-green: this version's pods, a cache claim each (kept across restarts)."""
    versioned = _versioned_name(cfg)
    spec: dict[str, Any] = {
        "replicas": cfg.replicas,
        "serviceName": versioned,
        "podManagementPolicy": "Parallel",  # all replicas start at once
        "selector": {"matchLabels": _version_selector(cfg)},
        "template": _pod_template(cfg),
    }
    templates = [
        {
            "metadata": {"name": name, "labels": _hashed_labels(cfg)},
            "spec": _claim_spec(volume, "ReadWriteOnce"),
        }
        for name, volume in (("vllm-cache", cfg.cache_volume), ("model-cache", cfg.model_cache))
        if isinstance(volume, PvcCache) and not volume.shared
    ]
    if templates:
        spec["volumeClaimTemplates"] = templates
        spec["persistentVolumeClaimRetentionPolicy"] = {
            "whenDeleted": "Delete",  # the old side's claims go with it
            "whenScaled": "Retain",
        }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": versioned,
            "labels": _hashed_labels(cfg),
            "annotations": _serving_annotations(cfg),
        },
        "spec": spec,
    }


def _service(
    cfg: DeploymentConfig, *, name: str, selector: dict[str, str], headless: bool = False
) -> dict[str, Any]:
    """A Service in front of ``selector``'s pods (headless: a StatefulSet's own)."""
    spec: dict[str, Any] = {
        "type": "ClusterIP",
        "selector": selector,
        "ports": [{"name": "http", "port": cfg.port, "targetPort": "http", "protocol": "TCP"}],
    }
    if headless:
        spec["clusterIP"] = "None"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "labels": _hashed_labels(cfg),
            "annotations": _serving_annotations(cfg),
        },
        "spec": spec,
    }


class _Dumper(yaml.SafeDumper):
    """Safe YAML without anchors (shared label dicts are written out) and with multi-line
    strings (the warm-up script) as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _represent_str)


def _dump_all(docs: Sequence[Mapping[str, Any]]) -> str:
    return yaml.dump_all(
        docs,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=4096,
    )


# --- 4. Kubernetes: distributed tuning ------------------------------------------------


def tuning_job_manifests(
    *,
    model: str,
    workers: int,
    study: str,
    image: str,
    storage_url: str | None = None,
    storage_secret: SecretKeyRef | None = None,
    cache_volume: PvcCache | HostPathCache | str | None = None,
    extra_args: Sequence[str] = (),
    name: str | None = None,
) -> str:
    """A Secret with the storage URL, an Indexed Job of ``workers`` tuning workers, the claim.

    Each pod gets one GPU and runs ``tuner tune --model M --study NAME --resume ...``
    (``--resume``: every worker joins the study, whichever starts first, and a retried
    pod continues it); ``tuner tune`` reads the storage from TUNER_STORAGE, which comes
    from the Secret through ``secretKeyRef``, so the URL (and its password) is nowhere
    in the Job, nor on the worker's command line. Give ``storage_secret`` instead of
    ``storage_url`` to use a Secret that exists already (nothing secret is printed then).
    Pods are not restarted in place: a failed worker's pod stays for its log and the
    index is retried in a new pod, up to 3 times, while the other workers carry on.
    """
    try:
        return _tuning_job(
            model=model,
            workers=workers,
            study=study,
            image=image,
            storage_url=storage_url,
            storage_secret=storage_secret,
            cache_volume=cache_volume,
            extra_args=extra_args,
            name=name,
        )
    except ValueError as exc:
        raise ConfigError(f"k8s job: {exc}") from None


def _tuning_job(
    *,
    model: str,
    workers: int,
    study: str,
    image: str,
    storage_url: str | None,
    storage_secret: SecretKeyRef | None,
    cache_volume: PvcCache | HostPathCache | str | None,
    extra_args: Sequence[str],
    name: str | None,
) -> str:
    """Check the inputs (ValueError naming the first bad one), then render the objects."""
    _check_job_inputs(
        model=model,
        workers=workers,
        study=study,
        image=image,
        storage_url=storage_url,
        storage_secret=storage_secret,
        extra_args=extra_args,
    )
    volume = PvcCache() if cache_volume is None else _as_cache_volume(cache_volume)
    job_name = _job_name(study, name)
    labels = _job_labels(job_name)
    secret_ref = storage_secret or SecretKeyRef(name=f"{job_name}-storage", key=STORAGE_SECRET_KEY)
    claim_name = f"{job_name}-vllm-cache"
    docs: list[dict[str, Any]] = []
    if storage_url is not None:
        docs.append(_storage_secret(secret_ref, storage_url, labels=labels))
    if isinstance(volume, PvcCache):
        docs.append(_claim(volume, name=claim_name, pods=workers, labels=labels))
    container = _tuner_container(
        model=model, study=study, image=image, extra_args=extra_args, secret_ref=secret_ref
    )
    docs.append(
        _job(
            job_name,
            model=model,
            study=study,
            workers=workers,
            labels=labels,
            container=container,
            volume=_shared_cache_volume(volume, claim_name),
        )
    )
    header = (
        f"# {workers} tuning worker(s) of study {study!r} on {model!r}; "
        "rendered by vllm-capacity-tuner\n"
    )
    return header + _dump_all(docs)


def _check_job_inputs(
    *,
    model: str,
    workers: int,
    study: str,
    image: str,
    storage_url: str | None,
    storage_secret: SecretKeyRef | None,
    extra_args: Sequence[str],
) -> None:
    """ValueError naming the first of the tuning job's inputs that is not accepted."""
    _no_control("model name", model)
    _no_control("study name", study)
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 1000:
        raise ValueError(f"workers {workers!r} is not accepted; accepted: an integer 1 to 1000")
    if not image or re.search(r"\s", image):
        raise ValueError(f"image {image!r} is not accepted; accepted: an image reference")
    if (storage_url is None) == (storage_secret is None):
        raise ValueError("give exactly one of storage_url and storage_secret")
    if storage_url is not None:
        _check_storage_url(storage_url)
    _check_extra_args(extra_args)


def _check_storage_url(storage_url: str) -> None:
    """ValueError unless ``storage_url`` is an SQLAlchemy URL of a database server."""
    scheme = storage_url.partition("://")[0]
    if not re.fullmatch(r"[a-z][a-z0-9+]*", scheme) or "://" not in storage_url:
        raise ValueError(
            "storage URL is not accepted; accepted: an SQLAlchemy URL such as "
            "postgresql://user:password@host/db"
        )
    if scheme.startswith("sqlite"):
        raise ValueError(
            f"storage {scheme}:// is not accepted: workers on several pods cannot share "
            "SQLite; accepted: a database server URL such as postgresql://user:pw@host/db"
        )


def _check_extra_args(extra_args: Sequence[str]) -> None:
    """ValueError for an extra argument that is not text or that k8s-job sets itself."""
    for arg in extra_args:
        if not isinstance(arg, str):
            raise ValueError(f"extra argument {arg!r} is not accepted; accepted: strings")
        _no_control("extra argument", arg)
        if arg.split("=", 1)[0] in _RESERVED_JOB_ARGS:
            raise ValueError(
                f"extra argument {arg!r} is set by k8s-job itself; accepted: other tune flags"
            )


def _job_name(study: str, name: str | None) -> str:
    """``name``, else a DNS label made from the study; ValueError when it is not one."""
    job_name = (
        name if name is not None else dns_label("tune-" + re.sub(r"[/\\]", "-", study), max_len=50)
    )
    if len(job_name) > 50 or not _DNS_1035.fullmatch(job_name):
        raise ValueError(
            f"name {job_name!r} is not accepted; accepted: a DNS-1035 label of at most 50 "
            "characters (lowercase letters, digits and '-', starting with a letter)"
        )
    return job_name


def _job_labels(job_name: str) -> dict[str, str]:
    """The labels of every object of the tuning job."""
    return {
        "app.kubernetes.io/name": "vllm-capacity-tuner",
        "app.kubernetes.io/instance": job_name,
        "app.kubernetes.io/component": "tuning-worker",
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def _storage_secret(
    secret_ref: SecretKeyRef, storage_url: str, *, labels: dict[str, str]
) -> dict[str, Any]:
    """The Secret that holds the storage URL under ``secret_ref``'s name and key."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": secret_ref.name, "labels": labels},
        "type": "Opaque",
        "stringData": {STORAGE_SECRET_KEY: storage_url},
    }


def _tuner_container(
    *,
    model: str,
    study: str,
    image: str,
    extra_args: Sequence[str],
    secret_ref: SecretKeyRef,
) -> dict[str, Any]:
    """A tuning worker's container: ``tuner tune ... --resume``, a GPU, storage from the Secret."""
    args = ["tune", "--model", _k8s_literal(model), "--study", _k8s_literal(study), "--resume"]
    args += [_k8s_literal(a) for a in extra_args]
    return {
        "name": "tuner",
        "image": image,
        "command": ["tuner"],
        "args": args,
        "env": [
            _secret_env("TUNER_STORAGE", secret_ref),
            # The tuner launches its servers with this cache (tuner.serving.server).
            {"name": CACHE_ROOT_ENV, "value": CACHE_MOUNT_PATH},
            # ... and fetches the model before trial 0 into this hub cache (tuner.serving.hub),
            # on the same volume: a retried worker's pod finds it there.
            {"name": "HF_HOME", "value": TUNING_HF_HOME_PATH},
        ],
        "resources": {"limits": {GPU_RESOURCE: 1}},
        "volumeMounts": [{"name": "vllm-cache", "mountPath": CACHE_MOUNT_PATH}],
    }


def _job(
    job_name: str,
    *,
    model: str,
    study: str,
    workers: int,
    labels: dict[str, str],
    container: dict[str, Any],
    volume: dict[str, Any],
) -> dict[str, Any]:
    """The Indexed Job of ``workers`` pods, each index retried up to 3 times in a new pod."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name,
            "labels": labels,
            "annotations": {f"{LABEL_PREFIX}/study": study, f"{LABEL_PREFIX}/model": model},
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": workers,
            "parallelism": workers,
            "backoffLimitPerIndex": 3,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "enableServiceLinks": False,
                    "tolerations": [_GPU_TOLERATION],
                    "containers": [container],
                    "volumes": [volume],
                },
            },
        },
    }

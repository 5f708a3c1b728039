"""Every setting of a tuning run, from a YAML file and the command line, validated.

``load_config`` reads a ``TuneConfig`` (the model ``tune.json`` records, ``tuner.run.config``).
A YAML file (``tuner tune --config tune.yaml``) uses its field names; a flag
given on the command line wins over the file. Every bad value is one
``ConfigError`` line naming the field, the value and what is accepted, raised
before any server is launched.

    model: llama-3.1-8b
    gpu: H100-80GB
    workload: chat
    trials: 12
    budget_min: 30
    slo_ttft_ms: 500
    space:
      gpu-memory-utilization: 0.85..0.97/0.01
      max-num-seqs: 32..512
    knobs: [gpu-memory-utilization, max-num-seqs, block-size]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tuner.deploy import Rollout, model_fields, parse_cache_volume
from tuner.errors import ConfigError
from tuner.run.config import TuneConfig
from tuner.vllm.boot import BootState


def load_config(path: Path | None, overrides: dict[str, Any]) -> TuneConfig:
    """The file's settings (if any) with ``overrides`` (the flags given) on top."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read tune config {str(path)!r}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"tune config {str(path)!r} is not YAML: {_yaml_problem(exc)}"
            ) from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"tune config {str(path)!r} is not a mapping of settings")
        data.update({str(k).replace("-", "_"): v for k, v in loaded.items()})
    for key, value in overrides.items():
        if value is None:
            continue
        if key == "space" and isinstance(value, dict):
            data["space"] = {**data.get("space", {}), **value}
        else:
            data[key] = value
    try:
        config = TuneConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, path)) from None
    config.load_generators()  # checked here, before any server is launched
    try:
        parse_cache_volume(config.cache_volume)
    except ConfigError as exc:
        raise ConfigError(f"--cache-volume: {exc}") from None
    Rollout.parse(config.rollout)
    deploy_model_fields(config, config.model)
    BootState.parse(config.production_boot)  # one line naming a bad value
    return config


def deploy_model_fields(config: TuneConfig, model: str) -> dict[str, Any]:
    """The recommendation's model fields (``tuner.deploy.model_fields``): a model directory
    of this host, unless a source is given, is read from the same directory on the nodes."""
    source = config.model_source
    if source is None and Path(model).expanduser().is_dir():
        source = f"path:{Path(model).expanduser().absolute()}"
    return model_fields(model, source=source, cache=config.model_cache, secret=config.model_secret)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error as one line: where (line and column) and what (PyYAML prints both on
    several lines, with the source and a caret)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + " ".join(str(problem or exc).split())


def _one_line(exc: ValidationError, path: Path | None) -> str:
    error = exc.errors()[0]
    loc = ".".join(str(part) for part in error["loc"])
    where = f"tune config {str(path)!r}: " if path is not None else ""
    if error["type"] == "extra_forbidden":
        accepted = ", ".join(TuneConfig.model_fields)
        return f"{where}setting {loc!r} is not accepted; accepted: {accepted}"
    value = error.get("input")
    if path is None:  # the value came from a flag
        flag = _FLAGS.get(loc, "--" + loc.replace("_", "-").split(".")[0])
        return f"{flag} {value!r} is not accepted: {error['msg']}"
    return f"{where}{loc} = {value!r} is not accepted: {error['msg']}"


# Fields whose flag is not the field's name with dashes.
_FLAGS = {
    "level_duration_s": "--level-duration",
    "level_warmup_s": "--level-warmup",
    "level_max_duration_s": "--level-max-duration",
    "quality_max_logprob_divergence_nats": "--quality-max-logprob-divergence",
}

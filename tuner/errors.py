"""Every error the tuner raises on purpose.

    TunerError                      root: the CLI prints its message on one line, exit code 2
    ├── ConfigError                 a setting is out of range or inconsistent
    │   ├── UnknownModelError       model name is neither a preset nor a model directory
    │   ├── UnknownGpuError         GPU name is not a known profile
    │   └── UnknownVersionError     vLLM version this tuner cannot emulate
    ├── ModelConfigError            a model directory's config.json or weights are unreadable
    ├── TraceReadError              a trace file is unreadable or has a malformed row
    ├── LogParseError               a vLLM log lacks the lines a calibration needs
    ├── ReportError                 a directory is not a tune run the report can be built from
    ├── RunDirError                 a run or trial directory cannot be created or written
    ├── WorkloadLoadError           a workload cannot be loaded, built or run
    ├── QualityProbeError           a server's answers to the quality gate cannot be compared
    ├── GpuSamplingUnavailable      the chosen GPU source cannot be used here (no driver)
    ├── GpuReadError                one read of a GPU source failed (counted, not fatal)
    └── GpuTimelineError            a GPU timeline CSV cannot be written or read back

Each message says what was wrong, with the bad value, and what would be accepted.
Third-party exceptions are wrapped where they enter (``raise ... from exc``).
"""

from __future__ import annotations

from pathlib import Path


class TunerError(Exception):
    """Root of the tuner's own errors; shown to the user as one line."""


class ConfigError(TunerError):
    """A setting has a value the tuner or vLLM does not accept."""


class UnknownModelError(ConfigError):
    """The model is neither a shipped preset nor a directory with a config.json."""


class UnknownGpuError(ConfigError):
    """The GPU name matches no known profile."""


class UnknownVersionError(ConfigError):
    """The vLLM version is not one whose behaviour the tuner knows."""


class ModelConfigError(TunerError):
    """A model's config.json or safetensors metadata could not be read."""


class LogParseError(TunerError):
    """A vLLM log does not contain the lines needed."""


class TraceReadError(TunerError):
    """A trace file could not be read; the message names the file and line."""


class ReportError(TunerError):
    """A report cannot be built: the message names the path and what is missing."""


class RunDirError(TunerError):
    """A run (or trial) directory cannot be created or written."""


class RunFileError(TunerError):
    """A run's file cannot be read or is not what its name says (``tuner.run.files``):
    ``path``, and ``reason`` in one line (``cause``: the OSError or ValidationError)."""

    def __init__(self, path: Path, reason: str, cause: Exception | None = None) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.cause = cause


class WorkloadLoadError(TunerError):
    """A workload could not be loaded, built or run."""


class QualityProbeError(TunerError):
    """A server answered the quality gate's requests with an error, or without the token
    ids or log-probs asked for; the message says what it answered."""


class GpuSamplingUnavailable(TunerError):
    """The chosen GPU source cannot be used on this machine (no NVIDIA driver)."""


class GpuReadError(TunerError):
    """One read of a GPU source failed; the sampler counts it and carries on."""


class GpuTimelineError(TunerError):
    """A GPU timeline CSV could not be written or read back."""

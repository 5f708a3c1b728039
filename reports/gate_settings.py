"""The nightly gate's settings the command line shows before anything is loaded: its
default tolerance and where a GitHub job summary goes (``reports.gate`` uses them)."""

DEFAULT_TOLERANCE_PCT = 5.0
SUMMARY_ENV = "GITHUB_STEP_SUMMARY"

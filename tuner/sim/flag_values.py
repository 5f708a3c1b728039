"""Checks of the simulator's command-line numbers: one ``ConfigError`` line naming the flag,
the value and what is accepted, before anything starts.

argparse turns ``nan``, ``inf`` and ``-100`` into numbers without complaint; these reject
what no run can mean (a NaN duration, an infinite rate, a negative token count).
"""

from __future__ import annotations

import math

from tuner.errors import ConfigError


def positive_number(flag: str, value: float | None) -> None:
    """None (not given) or a finite number > 0."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{flag} {value} is not accepted; accepted: a finite number > 0")


def non_negative_number(flag: str, value: float | None) -> None:
    """None (not given) or a finite number >= 0."""
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"{flag} {value} is not accepted; accepted: a finite number >= 0")


def fraction(flag: str, value: float | None) -> None:
    """None (not given) or a number from 0 to 1."""
    if value is not None and not 0.0 <= value <= 1.0:
        raise ConfigError(f"{flag} {value} is not accepted; accepted: a number from 0 to 1")


def integer_at_least(flag: str, value: int | None, minimum: int) -> None:
    """None (not given) or an integer >= minimum."""
    if value is not None and value < minimum:
        raise ConfigError(f"{flag} {value} is not accepted; accepted: an integer >= {minimum}")

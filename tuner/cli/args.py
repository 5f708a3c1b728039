"""Argument types for numeric flags: a bad number is one line naming it and what is accepted.

``argparse`` reports a ``ArgumentTypeError`` as ``tuner trial: error: argument --rate:
'nan' is not accepted; accepted: a finite number > 0`` with exit status 2, before the
command does anything.
"""

from __future__ import annotations

import argparse
import math


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (a rate, a duration, a frequency)."""
    value = _number(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not accepted; accepted: a finite number > 0")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (GiB of swap, a delay)."""
    value = _number(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not accepted; accepted: a finite number >= 0"
        )
    return value

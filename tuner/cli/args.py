"""The command's argument parser and the types of its numeric flags: a bad argument is one
line naming it and what is accepted (``OneLineParser``).

``argparse`` reports a ``ArgumentTypeError`` as ``tuner trial: error: argument --rate:
'nan' is not accepted; accepted: a finite number > 0`` with exit status 2, before the
command does anything.
"""

from __future__ import annotations

import argparse
import math
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """Argument errors as one line (no usage dump), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


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

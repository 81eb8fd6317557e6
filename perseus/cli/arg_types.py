"""argparse ``type=`` converters: a bad value becomes argparse's one-line error naming the flag."""

from __future__ import annotations

import argparse
import math
from typing import Callable, TypeVar

Number = TypeVar("Number", int, float)


def number_list(kind: type[Number]) -> Callable[[str], list[Number]]:
    """``12,24,48`` → ``[12, 24, 48]``."""

    def parse(text: str) -> list[Number]:
        try:
            values = [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError("expected at least one value")
        if not all(math.isfinite(v) for v in values):
            raise argparse.ArgumentTypeError(f"values must be finite, got {text!r}")
        return values

    parse.__name__ = f"{kind.__name__} list"
    return parse


def positive(kind: type[Number]) -> Callable[[str], Number]:
    """A finite number above zero."""

    def parse(text: str) -> Number:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value

    parse.__name__ = kind.__name__
    return parse


def share(text: str) -> float:
    """A fraction strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text!r}")
    return value


def octal(text: str) -> int:
    """A file mode such as ``666`` or ``0660``."""
    return int(text, 8)

"""argparse types shared by the command lines: whole numbers with a least value, finite
numbers of 0 or more, and JSON objects (the chat template's options). Each refuses a bad
value with a message argparse prints after the option's name, e.g. ``--workers: must be 1
or more, got 0``. The standard library alone: the parsers answer --help without torch."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable


def whole(minimum: int) -> Callable[[str], int]:
    """A whole number of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value

    return parse


def non_negative(text: str) -> float:
    """A finite number of 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of 0 or more, got {text}")
    return value


def json_object(text: str) -> dict:
    """A JSON object, such as the chat template's options."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"must be a JSON object such as '{{\"enable_thinking\": false}}', got {text!r}"
        )
    return value

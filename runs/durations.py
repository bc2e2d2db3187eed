"""Durations as operators type them: 30s, 5m, 1h, 1d, or plain seconds."""

import re
from datetime import timedelta

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(text):
    """A timedelta; ValueError with a readable message for anything else."""
    match = _PATTERN.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a duration (examples: 30s, 5m, 1h, 90)")
    number, unit = match.groups()
    return timedelta(seconds=float(number) * _UNITS[unit or "s"])

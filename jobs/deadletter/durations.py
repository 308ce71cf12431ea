"""Durations as operators type them: ``90s``, ``15m``, ``24h``, ``7d``, ``2w`` or plain seconds."""

from __future__ import annotations

import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)


def parse(text: str) -> float:
    """Seconds in ``text``; raises ValueError with a message an operator can act on."""
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a duration: use e.g. 90s, 15m, 24h, 7d, 2w or seconds")
    seconds = float(match.group(1)) * _UNITS[(match.group(2) or "s").lower()]
    if seconds <= 0:
        raise ValueError(f"{text!r}: a duration must be longer than zero")
    return seconds


def render(seconds: float) -> str:
    """The shortest exact spelling: 3600 -> '1h', 5400 -> '90m'."""
    for unit in ("w", "d", "h", "m"):
        if seconds >= _UNITS[unit] and seconds % _UNITS[unit] == 0:
            return f"{int(seconds // _UNITS[unit])}{unit}"
    return f"{seconds:g}s"

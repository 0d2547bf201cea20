"""Durations as people write them in config and on the command line: `90s`, `15m`, `1h30m`."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: Any) -> timedelta:
    """`90s`, `15m`, `24h`, `1h30m`, `500ms`, `2d`, or a number of seconds."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")  # noqa: TRY004 - pydantic wants ValueError
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"duration must not be negative: {value!r}")
        return timedelta(seconds=value)
    if not isinstance(value, str):
        raise ValueError(f"not a duration: {value!r}")  # noqa: TRY004 - pydantic wants ValueError
    text = value.strip().lower().replace(" ", "")
    try:
        return parse_duration(float(text))
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f"not a duration: {value!r} (use e.g. 90s, 15m, 24h, 1h30m)")
    return timedelta(seconds=total)


def format_duration(value: timedelta) -> str:
    seconds = value.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
]


def format_age(seconds: float) -> str:
    """`42s`, `3m05s`, `2h10m`, `3d4h`: short enough for a table cell."""
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def ago(t: datetime | None, now: datetime) -> str:
    """`4m12s ago`; `-` for no time."""
    return "-" if t is None else f"{format_age((now - t).total_seconds())} ago"


def clock(t: datetime | None, now: datetime) -> str:
    """`18:42:05 (in 4m12s)`, or `(4m12s ago)` once past; `-` for no time."""
    if t is None:
        return "-"
    delta = (t - now).total_seconds()
    when = f"in {format_age(delta)}" if delta >= 0 else f"{format_age(-delta)} ago"
    return f"{t.astimezone(UTC):%H:%M:%S} ({when})"

"""Durations as people write them ('4h', '1d12h', '90m', '600') and as the tools print them ('1h 05m')."""

from __future__ import annotations

import re
from datetime import datetime

PART = re.compile(r"(\d+)([dhms])")
SECONDS_PER_UNIT = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse(text: str) -> int:
    """'4h' -> 14400, '1d12h' -> 129600, '600' -> 600 seconds; ValueError with the reason otherwise."""
    text = str(text)
    if text.isdigit():
        seconds = int(text)
    elif text and not PART.sub("", text):
        seconds = sum(int(n) * SECONDS_PER_UNIT[unit] for n, unit in PART.findall(text))
    else:
        raise ValueError(f"{text!r} is not a duration like 4h, 90m or 1d12h")
    if seconds <= 0:
        raise ValueError(f"{text!r} must be longer than zero")
    return seconds


def human(seconds: float) -> str:
    """'2d 3h', '1h 05m', '7 min' or '45 s' (the sign dropped: callers say 'ago' or 'in')."""
    seconds = int(abs(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        return f"{days}d {hours}h"
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes} min" if minutes else f"{seconds} s"


def setting(seconds: int) -> str:
    """Seconds as a setting: 9600 -> '2h40m', 14400 -> '4h', 90 -> '1m30s'."""
    parts, left = [], int(seconds)
    for unit, size in SECONDS_PER_UNIT.items():
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"


def timestamp(text: str | None) -> datetime | None:
    """RFC 3339 as Google's and Kubernetes' APIs write it ('2026-11-29T02:00:00.000-08:00', or with 'Z'), in its own
    offset; None for none or an unreadable one."""
    try:
        return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text) if text else None
    except ValueError:
        return None

"""The bounded readers every dialect shares: numbers, counts, times, structured lists.

Every function here takes text a server sent and never raises on it, never
runs long on it (no regular expression can backtrack, lengths are bounded
before parsing), and never returns a negative, NaN or infinite value: numbers
too large to mean anything saturate at ``_MAX_SECONDS`` and
:data:`MAX_COUNT`. What they cannot read comes back as None, and the dialect
that asked says so in a short note quoted with :func:`show`.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from email.utils import parsedate_tz

__all__ = [
    "MAX_COUNT",
    "MAX_FIELD",
    "MAX_MEMBERS",
    "check_now",
    "count",
    "first_item",
    "go_duration",
    "http_date",
    "members",
    "reset",
    "seconds",
    "show",
    "unquote",
]

MAX_FIELD = 4096
"""Longer header values are ignored unparsed: no real server sends them."""

_MAX_SECONDS = 1e18
"""Seconds saturate here: finite, and far beyond any cap a caller applies."""

MAX_COUNT = 10**15
"""Counts saturate here (the largest structured-field integer is 10**15 - 1)."""

MAX_MEMBERS = 32
"""Members of a list field read at most: real fields have a handful."""

_MAX_DATE = 64
"""HTTP-dates are about 30 characters; longer text is not tried as a date."""

_EPOCH_SECONDS = 1e9
"""A reset at least this large is an epoch timestamp (2001-09-09), not a delta."""

_EPOCH_MILLIS = 1e12
"""A reset at least this large is an epoch in milliseconds (also 2001-09-09)."""

_EPOCH_LIMIT = 1e14
"""A reset at least this large (year 5138 in milliseconds) is garbage."""

# Non-negative decimal number. No nested or overlapping quantifiers, so matching
# is linear in the (already bounded) length.
_NUMBER = re.compile(r"([0-9]+)(?:\.[0-9]+)?")
# RFC 3339 date-time (Anthropic's resets, Atlassian's): fixed-width fields, no
# backtracking. Only ASCII digits: \d would take other scripts' digits.
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,9})?"
    r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)

# One term of a Go duration (OpenAI's "6m0s", "20ms", "1h2m3.5s").
_DURATION_TERM = re.compile(r"([0-9]{1,18})(\.[0-9]{1,9})?(h|ms|m|s|us|\u00b5s|\u03bcs|ns)")
_DURATION_UNITS = {
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "\u00b5s": 1e-6,
    "\u03bcs": 1e-6,
    "ns": 1e-9,
}


def check_now(now: float) -> None:
    """Refuse a wall-clock time that is not a finite number (the caller's bug)."""
    if type(now) is float and math.isfinite(now):
        return  # time.time()'s answer, for every response: the short way
    if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
        raise ValueError(f"now must be a finite number of epoch seconds, got {now!r}")


def show(value: str) -> str:
    """``value`` quoted for a log line, cut short if long (escapes included)."""
    shown = repr(value[:40])
    if len(shown) > 60:
        shown = shown[:60] + "..."
    elif len(value) > 40:
        shown += "..."
    if len(value) > 40:
        shown += f" ({len(value)} chars)"
    return shown


def seconds(text: str) -> float | None:
    """A non-negative decimal number of seconds, saturating at :data:`_MAX_SECONDS`."""
    text = text.strip()
    match = _NUMBER.fullmatch(text)
    if match is None:
        return None
    if len(match.group(1).lstrip("0")) > 18:
        return _MAX_SECONDS
    return min(float(text), _MAX_SECONDS)


def count(text: str) -> int | None:
    """A non-negative count, saturating at :data:`MAX_COUNT`; a fraction is rounded down.

    Reddit sends ``598.0``: a fraction of a request cannot be sent, so ``1.5``
    is 1 and ``0.5`` is nothing left.
    """
    match = _NUMBER.fullmatch(text.strip())
    if match is None:
        return None
    digits = match.group(1).lstrip("0")
    if len(digits) > 15:
        return MAX_COUNT
    return min(int(digits or "0"), MAX_COUNT)


def http_date(text: str) -> float | None:
    """An HTTP-date as epoch seconds, or None. Dates without a zone are GMT."""
    text = text.strip()
    if len(text) > _MAX_DATE or not text.isascii():
        return None
    try:
        parts = parsedate_tz(text)
    except Exception:  # the stdlib parser has raised odd errors on odd input before
        return None
    if parts is None:
        return None
    year, month, day, hour, minute, second = parts[:6]
    offset = parts[9] or 0
    try:
        moment = datetime(year, month, day, hour, minute, min(second, 59), tzinfo=UTC)
    except (ValueError, OverflowError, TypeError):
        return None
    return moment.timestamp() - offset


def _rfc3339(text: str) -> float | None:
    """An RFC 3339 date-time (``2024-07-15T12:34:56.5Z``) as epoch seconds, or None."""
    text = text.strip()
    if len(text) > _MAX_DATE:
        return None
    match = _RFC3339.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(part) for part in match.group(1, 2, 3, 4, 5, 6))
    if second > 60:  # 60 is a leap second, read as :59
        return None
    try:
        moment = datetime(year, month, day, hour, minute, min(second, 59), tzinfo=UTC)
    except ValueError:
        return None
    offset = 0
    if match.group(8) is None:
        hours, minutes = int(match.group(10)), int(match.group(11))
        if hours > 23 or minutes > 59:
            return None
        offset = (hours * 60 + minutes) * 60 * (-1 if match.group(9) == "-" else 1)
    fraction = float(match.group(7) or 0.0)
    return moment.timestamp() - offset + fraction


def go_duration(text: str) -> float | None:
    """A Go duration (``6m0s``, ``1s``, ``20ms``, ``1h2m3.5s``) in seconds, or None.

    At most 8 terms of at most 18 digits each: anything longer is no duration
    a server means. A bare number is not a Go duration (except ``0``); the
    caller tries it as seconds.
    """
    text = text.strip()
    if not text or len(text) > _MAX_DATE:
        return None
    total = 0.0
    position = 0
    for _ in range(8):
        match = _DURATION_TERM.match(text, position)
        if match is None:
            return None
        whole, fraction, unit = match.groups()
        total += (int(whole) + float(fraction or 0.0)) * _DURATION_UNITS[unit]
        position = match.end()
        if position == len(text):
            return min(total, _MAX_SECONDS)
    return None


def reset(text: str, *, now: float) -> float | None:
    """A reset time as seconds from ``now``: delta, epoch (s or ms), HTTP-date or RFC 3339."""
    value = seconds(text)
    if value is None:
        when = http_date(text)
        if when is None:
            when = _rfc3339(text)
        return None if when is None else max(0.0, when - now)
    if value >= _EPOCH_LIMIT:
        return None
    if value >= _EPOCH_MILLIS:
        return max(0.0, value / 1000.0 - now)
    if value >= _EPOCH_SECONDS:
        return max(0.0, value - now)
    return value


def _split(text: str, separator: str) -> list[str]:
    """``text`` split on ``separator`` outside double-quoted strings."""
    if '"' not in text:
        return text.split(separator)
    parts: list[str] = []
    start = 0
    quoted = False
    index = 0
    end = len(text)
    while index < end:
        char = text[index]
        if quoted:
            if char == "\\":
                index += 1
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char == separator:
            parts.append(text[start:index])
            start = index + 1
        index += 1
    parts.append(text[start:])
    return parts


def members(text: str) -> list[tuple[str, dict[str, str]]]:
    """A structured-field list, leniently: each member's bare part and parameters.

    Parameter keys are lower-cased; a repeated key keeps its last value (RFC 8941).
    Members past the first :data:`MAX_MEMBERS` are dropped.
    """
    found: list[tuple[str, dict[str, str]]] = []
    for member in _split(text, ",")[:MAX_MEMBERS]:
        pieces = _split(member, ";")
        params: dict[str, str] = {}
        for piece in pieces[1:]:
            key, _, value = piece.partition("=")
            params[key.strip().lower()] = value.strip()
        found.append((pieces[0].strip(), params))
    return found


def unquote(text: str) -> str:
    """A structured-field string or token as plain text, cut to 64 characters."""
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        text = re.sub(r"\\(.)", r"\1", text[1:-1])
    return text[:64]


def first_item(text: str) -> str:
    """The bare part of a list's first member (``"10"`` from ``"10;w=1, 50"``)."""
    return text.partition(",")[0].partition(";")[0]

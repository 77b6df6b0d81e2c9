"""``Retry-After`` (RFC 9110) and OpenAI's ``retry-after-ms``: how long to wait.

Not capped here: a huge wait comes back huge (saturating at
1e18 seconds, so it is always finite); the engine caps it at
its ``max_pause`` and logs that.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._values import http_date, seconds, show

__all__ = ["retry_after"]


def retry_after(folded: Mapping[str, str], now: float, notes: list[str]) -> float | None:
    """Seconds to wait from ``now`` (epoch seconds), or None when no usable field says.

    ``retry-after-ms`` (milliseconds, a non-negative decimal; OpenAI sends it
    on its 429s beside a whole-second ``Retry-After``) wins when usable: it
    is the finer of the two. Otherwise ``Retry-After``: delta-seconds (RFC
    9110 says a non-negative integer; a decimal is tolerated, and so is a
    repeated value joined with commas) or an HTTP-date in the IMF-fixdate, RFC
    850 or asctime form, a date in the past giving 0.0. Garbage and negative
    numbers are noted and ignored.
    """
    raw = folded.get("retry-after-ms")
    if raw is not None:
        millis = _repeated(raw)
        if millis is not None:
            return millis / 1000.0
        notes.append(f"Retry-After-Ms {show(raw)}: not milliseconds")
    raw = folded.get("retry-after")
    if raw is None:
        return None
    wait = seconds(raw)
    if wait is not None:
        return wait
    when = http_date(raw)
    if when is not None:
        return max(0.0, when - now)
    wait = _repeated(raw)
    if wait is None:
        notes.append(f"Retry-After {show(raw)}: neither delta-seconds nor an HTTP-date")
    return wait


def _repeated(raw: str) -> float | None:
    """A non-negative number, or the first of a repeated one joined by the client."""
    number = seconds(raw)
    if number is None:
        head, comma, _ = raw.partition(",")
        if comma:
            return seconds(head)
    return number

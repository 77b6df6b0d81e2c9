"""Dialects of separate fields: a remaining count, a limit, and a reset.

Most dialects say one budget in three headers (``X-RateLimit-Remaining``,
``-Limit``, ``-Reset``); they differ only in the names and in how the reset
is written. A :class:`Family` names them, and :func:`read_family` reads any of
them the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ._budget import RateLimit
from ._names import display
from ._values import MAX_COUNT, count, first_item, go_duration, members, reset, seconds, show

__all__ = ["Family", "read_family"]


@dataclass(frozen=True, slots=True)
class Family:
    """A dialect of separate fields: remaining, limit, and resets in order of preference.

    Each reset is ``(name, how)``: ``"delta"`` seconds, ``"go"`` a Go duration
    (or else as ``"reset"``), ``"reset"`` delta, epoch, HTTP-date or RFC 3339.
    ``used`` is a count spent in the window: with no limit field, the limit is
    ``used + remaining`` (Reddit). ``unit`` is what the budget counts
    (:attr:`RateLimit.unit`).
    """

    source: str
    remaining: str
    limit: str
    resets: tuple[tuple[str, str], ...]
    used: str | None = None
    unit: str = "requests"


def read_family(
    folded: Mapping[str, str], now: float, notes: list[str], family: Family
) -> RateLimit | None:
    """A family's remaining, limit and reset fields, or None (noted) if unusable.

    Each may be a structured list (``10, 10;w=1``): the first member counts.
    """
    remaining_raw = folded[family.remaining]
    remaining = count(first_item(remaining_raw))
    if remaining is None:
        notes.append(f"{display(family.remaining)} {show(remaining_raw)}: not a count")
        return None
    limit, window = _limit(folded, notes, family)
    wait = None
    for name, how in family.resets:
        reset_raw = folded.get(name)
        if reset_raw is None:
            continue
        wait = _reset_as(how, reset_raw, now)
        if wait is None and "," in reset_raw:
            wait = _reset_as(how, first_item(reset_raw), now)
        if wait is None:
            notes.append(f"{display(name)} {show(reset_raw)}: not a time")
            return None
        break
    else:
        # No reset given: a window advertised with the limit bounds it.
        wait = window
        if wait is None:
            notes.append(f"{family.source}: remaining without a reset")
            return None
    return RateLimit(remaining, wait, limit, family.source, window=window, unit=family.unit)


def _limit(
    folded: Mapping[str, str], notes: list[str], family: Family
) -> tuple[int | None, float | None]:
    """A family's limit and the window a ``;w=`` parameter on it gives, if any."""
    limit_raw = folded.get(family.limit)
    if limit_raw is None:
        used_raw = None if family.used is None else folded.get(family.used)
        if used_raw is None:
            return None, None
        used = count(first_item(used_raw))
        remaining = count(first_item(folded[family.remaining]))
        if used is None or remaining is None:
            notes.append(f"{display(str(family.used))} {show(used_raw)}: not a count")
            return None, None
        return min(used + remaining, MAX_COUNT), None
    main, params = members(limit_raw)[0]
    limit = count(main)
    if limit is None:
        notes.append(f"{display(family.limit)} {show(limit_raw)}: not a count")
        return None, None
    window = seconds(params["w"]) if "w" in params else None
    return limit, window


def _reset_as(how: str, text: str, now: float) -> float | None:
    if how == "delta":
        return seconds(text)
    if how == "go":
        duration = go_duration(text)
        if duration is not None:
            return duration
    return reset(text, now=now)

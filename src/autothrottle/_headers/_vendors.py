"""The vendors' own rate-limit dialects, outside the IETF drafts and the LLM APIs.

* ``X-RateLimit-*`` (GitHub, Discord, Reddit, Atlassian), ``X-RateLimit-Used``
  giving the limit when none is sent (Reddit), ``-Reset-After`` preferred;
* ``X-Rate-Limit-*`` (Twitter/X, Okta);
* ``X-Shopify-Shop-Api-Call-Limit: USED/LIMIT``, a leaky bucket;
* windows named by their length, which add to the main budget: Kong's
  ``X-RateLimit-Remaining-Minute`` (``-Second`` ... ``-Year``), Etsy's
  ``x-remaining-today``, and Riot Games' ``X-App-Rate-Limit: 20:1,100:120``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._budget import RateLimit
from ._fields import Family
from ._names import display
from ._values import MAX_MEMBERS, count, first_item, seconds, show

__all__ = ["SHOPIFY", "X_RATELIMIT", "X_RATE_LIMIT", "shopify", "windows"]

X_RATELIMIT = Family(
    "X-RateLimit-*",
    "x-ratelimit-remaining",
    "x-ratelimit-limit",
    (("x-ratelimit-reset-after", "delta"), ("x-ratelimit-reset", "reset")),
    used="x-ratelimit-used",
)

X_RATE_LIMIT = Family(
    "X-Rate-Limit-*",
    "x-rate-limit-remaining",
    "x-rate-limit-limit",
    (("x-rate-limit-reset", "reset"),),
)

SHOPIFY = "x-shopify-shop-api-call-limit"

_SHOPIFY_DRAIN = 20.0
"""Seconds a full Shopify bucket takes to leak empty: 40 at 2/s on standard
plans, 400 at 20/s on Plus. Shopify documents the rates, not this constant; it
is our reading of them (``docs/signals.md``, "Header dialects")."""

# Kong's per-unit windows (``X-RateLimit-Limit-Minute``): each unit's length in
# seconds. A month and a year are taken at their longest, so a pace worked out
# from them is never too fast.
_UNITS = (
    ("second", 1.0),
    ("minute", 60.0),
    ("hour", 3600.0),
    ("day", 86400.0),
    ("month", 31 * 86400.0),
    ("year", 366 * 86400.0),
)

# (remaining, limit, window name, seconds) of every window named by its length:
# Kong's, then Etsy's.
_UNIT_FIELDS = (
    *(
        (f"x-ratelimit-remaining-{unit}", f"x-ratelimit-limit-{unit}", unit, length)
        for unit, length in _UNITS
    ),
    ("x-remaining-this-second", "x-limit-per-second", "second", 1.0),
    ("x-remaining-today", "x-limit-per-day", "day", 86400.0),
)

# Riot Games' "LIMIT:SECONDS,..." lists and their "USED:SECONDS,..." counts.
_RIOT = (
    ("x-app-rate-limit", "x-app-rate-limit-count"),
    ("x-method-rate-limit", "x-method-rate-limit-count"),
)

# The names that make a window of their own: Kong's, Etsy's and Riot's.
_WINDOW_NAMES = frozenset(
    {name for remaining, limit, _, _ in _UNIT_FIELDS for name in (remaining, limit)}
    | {name for pair in _RIOT for name in pair}
)


def windows(folded: Mapping[str, str], notes: list[str]) -> list[RateLimit]:
    """The windows Kong's, Etsy's and Riot's fields advertise (none: ``[]``)."""
    if _WINDOW_NAMES.isdisjoint(folded):
        return []
    return _unit_windows(folded, notes) + _riot_windows(folded, notes)


def shopify(raw: str, notes: list[str]) -> RateLimit | None:
    """``X-Shopify-Shop-Api-Call-Limit: 32/40``: a leaky bucket, 32 of 40 used.

    The bucket leaks ``limit / 20`` requests a second (``_SHOPIFY_DRAIN``), so
    the window is 20 s and the pace ``20 / limit``. While room remains, the
    reset is 0 (nothing to wait for but the pace); with the bucket full, it is
    the time one request takes to leak out.
    """
    used_raw, slash, limit_raw = raw.partition(",")[0].partition("/")
    used = count(used_raw)
    limit = count(limit_raw)
    if not slash or used is None or not limit:
        notes.append(f"{display(SHOPIFY)} {show(raw)}: not USED/LIMIT")
        return None
    remaining = max(0, limit - used)
    wait = 0.0 if remaining else _SHOPIFY_DRAIN / limit
    return RateLimit(remaining, wait, limit, display(SHOPIFY), window=_SHOPIFY_DRAIN)


def _unit_windows(folded: Mapping[str, str], notes: list[str]) -> list[RateLimit]:
    """Windows named by their length: Kong's ``-Second`` ... ``-Year``, Etsy's.

    They carry no reset: the window's length bounds it.
    """
    found: list[RateLimit] = []
    for remaining_name, limit_name, name, length in _UNIT_FIELDS:
        remaining_raw = folded.get(remaining_name)
        if remaining_raw is None:
            continue
        remaining = count(first_item(remaining_raw))
        if remaining is None:
            notes.append(f"{display(remaining_name)} {show(remaining_raw)}: not a count")
            continue
        limit_raw = folded.get(limit_name)
        limit = None if limit_raw is None else count(first_item(limit_raw))
        if limit_raw is not None and limit is None:
            notes.append(f"{display(limit_name)} {show(limit_raw)}: not a count")
        kong = limit_name.startswith("x-ratelimit-")
        source = f"X-RateLimit-*-{name.capitalize()}" if kong else display(limit_name)
        found.append(RateLimit(remaining, length, limit, source, name, length))
    return found


def _riot_windows(folded: Mapping[str, str], notes: list[str]) -> list[RateLimit]:
    """Riot Games: ``X-App-Rate-Limit: 20:1,100:120`` with ``-Count: 3:1,40:120``.

    Each ``LIMIT:SECONDS`` is a window; its count is what was spent in it.
    """
    found: list[RateLimit] = []
    for limits_name, counts_name in _RIOT:
        limits_raw = folded.get(limits_name)
        if limits_raw is None:
            continue
        limits = _pairs(limits_raw)
        used = dict((w, n) for n, w in _pairs(folded.get(counts_name, "")))
        if not limits:
            notes.append(f"{display(limits_name)} {show(limits_raw)}: not LIMIT:SECONDS,...")
            continue
        for limit, length in limits:
            if not limit or not length:
                continue
            remaining = max(0, limit - int(used.get(length, 0)))
            name = f"{length:g}s"
            found.append(RateLimit(remaining, length, limit, display(limits_name), name, length))
    return found


def _pairs(text: str) -> list[tuple[int, float]]:
    """``"20:1,100:120"`` as ``[(20, 1.0), (100, 120.0)]``; [] if any pair is bad."""
    pairs: list[tuple[int, float]] = []
    for member in text.split(",")[:MAX_MEMBERS]:
        count_raw, colon, seconds_raw = member.partition(":")
        limit = count(count_raw)
        length = seconds(seconds_raw)
        if not colon or limit is None or length is None:
            return []
        pairs.append((limit, length))
    return pairs

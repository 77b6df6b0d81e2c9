"""What a response's headers say about pacing: Retry-After, rate-limit budgets, cache hits.

Pure and synchronous: the engine passes the headers and the wall-clock time in,
and gets plain values back. Header values come from servers we do not control,
so every parser here treats its input as hostile:

* nothing raises on any text, and nothing is slow on any text: fields longer
  than ``_MAX_FIELD`` characters are ignored before any parsing, and no regular
  expression here can backtrack;
* no wait is ever negative, NaN or infinite: times in the past become 0.0,
  numbers too large to mean anything saturate at ``_MAX_SECONDS`` (about 31.7
  billion years) and counts at ``_MAX_COUNT``; capping to a sane pause is the
  caller's job (it knows ``max_pause`` and the slot to name in its warning);
* what was ignored is said in short notes (:attr:`HeaderSignals.ignored`) that
  quote at most a few dozen characters of the offending value, so a hostile
  header cannot flood the log.

Headers may arrive as any ``Mapping[str, str]``: httpx and aiohttp give
case-insensitive ones, a plain dict is not, so names are matched
case-insensitively here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from email.utils import parsedate_tz
from typing import Any

__all__ = [
    "HeaderSignals",
    "RateLimit",
    "first_header",
    "is_cache_hit",
    "parse_rate_limit",
    "parse_retry_after",
    "read_headers",
    "response_age",
]

_MAX_FIELD = 4096
"""Longer header values are ignored unparsed: no real server sends them."""

_MAX_SECONDS = 1e18
"""Seconds saturate here: finite, and far beyond any cap a caller applies."""

_MAX_COUNT = 10**15
"""Counts saturate here (the largest structured-field integer is 10**15 - 1)."""

_MAX_MEMBERS = 32
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

# Cache statuses (nginx X-Cache-Status, Cloudflare CF-Cache-Status) that mean a
# cache answered without asking the origin. REVALIDATED and EXPIRED are left
# out: the origin was asked, so the latency is the origin's.
_SERVED_FROM_CACHE = frozenset({"HIT", "STALE", "UPDATING"})

# First words of an X-Cache member that mean a hit: Varnish/Squid "HIT",
# CloudFront "Hit from cloudfront", Fastly "HIT-STALE", Akamai "TCP_MEM_HIT".
# CloudFront "RefreshHit" and Akamai "TCP_REFRESH_HIT" asked the origin.
_X_CACHE_HITS = frozenset({"HIT", "MEM_HIT", "IMS_HIT"})

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

# Etsy's windows: (remaining, limit, window name, seconds).
_ETSY = (
    ("x-remaining-this-second", "x-limit-per-second", "second", 1.0),
    ("x-remaining-today", "x-limit-per-day", "day", 86400.0),
)

# Riot Games' "LIMIT:SECONDS,..." lists and their "USED:SECONDS,..." counts.
_RIOT = (
    ("x-app-rate-limit", "x-app-rate-limit-count"),
    ("x-method-rate-limit", "x-method-rate-limit-count"),
)

_SHOPIFY = "x-shopify-shop-api-call-limit"

_SHOPIFY_DRAIN = 20.0
"""Seconds a full Shopify bucket takes to leak empty: 40 at 2/s on standard
plans, 400 at 20/s on Plus. Shopify documents the rates, not this constant; it
is our reading of them (``docs/signals.md``, "Header dialects")."""

_OTHER_RELEVANT = {
    "age",
    "cache-status",
    "cf-cache-status",
    "ratelimit",
    "ratelimit-policy",
    "retry-after",
    "x-cache",
    "x-cache-status",
    _SHOPIFY,
}

# Canonical spelling of names that title case gets wrong, for the notes.
_DISPLAY = {
    "ratelimit": "RateLimit",
    "cf-cache-status": "CF-Cache-Status",
    "x-shopify-shop-api-call-limit": "X-Shopify-Shop-Api-Call-Limit",
}


def _display(name: str) -> str:
    """A lower-case header name spelled as servers document it (``X-RateLimit-Reset``)."""
    shown = _DISPLAY.get(name)
    if shown is None:
        shown = "-".join(part.capitalize() for part in name.split("-"))
        shown = shown.replace("Ratelimit", "RateLimit")
    return shown


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A rate-limit budget a response advertised.

    When a response advertises several windows at once ("10 per second and
    10,000 per day"), the record's own fields are those of the **binding**
    window, the one that holds sends back the most, and :attr:`windows` lists
    them all (``docs/signals.md``, "Several windows")::

        budget = parse_rate_limit(
            {"X-Limit-Per-Second": "10", "X-Remaining-This-Second": "9",
             "X-Limit-Per-Day": "10000", "X-Remaining-Today": "9000"}, now=time.time())
        budget.policy, [w.policy for w in budget.windows]  # 'day', ['second', 'day']

    Attributes:
        remaining: Requests the server still accepts before ``reset`` (>= 0).
            A fractional count (Reddit's ``598.0``) is rounded down.
        reset: Seconds from the response until the budget refills (finite, >= 0).
        limit: The whole quota of the window, if the server said.
        source: The header family read, e.g. ``"RateLimit"`` (the IETF draft's
            structured field), ``"RateLimit-*"`` (the older draft's separate
            fields), ``"X-RateLimit-*"``; ``docs/signals.md`` lists them all.
        policy: The draft's policy name (``"default"`` in
            ``RateLimit: "default";r=5;t=30``), or the window's name for the
            dialects that name it (``"minute"``, ``"day"``, ``"1s"``).
        window: The policy's window in seconds (``w`` of ``RateLimit-Policy``,
            or ``;w=`` on a ``-Limit`` field), when the server said.
        windows: Every window the response advertised, the binding one among
            them, when there were several; empty when there was one.
    """

    remaining: int
    reset: float
    limit: int | None = None
    source: str = "RateLimit"
    policy: str | None = None
    window: float | None = None
    windows: tuple[RateLimit, ...] = ()

    @property
    def sustained(self) -> float | None:
        """Seconds between requests at the policy's own pace (``window / limit``), if known.

        Unlike :attr:`spacing`, it does not hang on ``reset``, which servers
        round up to whole seconds, send as 0 while tokens remain, or measure to
        a full refill: it is the pace the quota allows in the long run.
        """
        if self.window is None or not self.limit:
            return None
        return self.window / self.limit

    @property
    def slowest(self) -> RateLimit:
        """The window whose own pace (:attr:`sustained`) is the slowest: this one if alone.

        With several windows the long-run pace is the slowest of theirs, which
        need not be the binding window's (that one may be binding for now only).
        """
        if not self.windows:
            return self
        return max(self.windows, key=lambda window: window.sustained or 0.0)

    @property
    def spacing(self) -> float:
        """Seconds between requests that spend the budget evenly until the reset.

        With nothing remaining it is the whole ``reset``: wait for the refill.
        """
        if self.remaining == 0:
            return self.reset
        return self.reset / self.remaining

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready data (its windows as a list of such dicts)."""
        data = {part.name: getattr(self, part.name) for part in fields(self)}
        data["windows"] = [window.to_dict() for window in self.windows]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RateLimit:
        """A record from :meth:`to_dict`'s data (older data without ``windows`` too)."""
        values = dict(data)
        values["windows"] = tuple(cls.from_dict(window) for window in values.get("windows", ()))
        return cls(**values)


@dataclass(frozen=True, slots=True)
class HeaderSignals:
    """Everything :func:`read_headers` found in one response's headers.

    Attributes:
        cache_hit: A cache answered (see :func:`is_cache_hit`).
        age: The ``Age`` header in seconds, or None when absent or invalid.
        retry_after: Seconds to wait from ``now`` per ``Retry-After``, or None.
            Finite and >= 0 but not capped: the caller caps it and says so.
        rate_limit: The advertised budget, or None. None as well when a cache
            served the response (``Age`` > 0 or a cache header saying HIT):
            its budget is stale, as the draft warns. A bare 304 keeps it: the
            origin may have sent it fresh.
        ignored: One short note per header that was present but not used and
            why, for the caller's debug log. Quotes at most a few dozen
            characters of any value.
    """

    cache_hit: bool = False
    age: float | None = None
    retry_after: float | None = None
    rate_limit: RateLimit | None = None
    ignored: tuple[str, ...] = ()


# -- public functions -------------------------------------------------------------


def first_header(headers: Mapping[str, str], name: str) -> str | None:
    """The value of header ``name`` in ``headers``, matched case-insensitively.

    Tries ``name`` as given and in lower case first (what case-insensitive
    mappings and HTTP/2-style dicts answer at once), then scans the keys.
    With several values (a multidict), the first one.
    """
    value = headers.get(name)
    if isinstance(value, str):
        return value
    lower = name.lower()
    if lower != name:
        value = headers.get(lower)
        if isinstance(value, str):
            return value
    for key, value in headers.items():
        if isinstance(key, str) and isinstance(value, str) and key.lower() == lower:
            return value
    return None


def parse_retry_after(value: str, *, now: float) -> float | None:
    """Seconds to wait from ``now`` (epoch seconds) per a ``Retry-After`` value.

    Accepts delta-seconds (RFC 9110 says a non-negative integer; a decimal is
    tolerated, and so is a repeated value joined with commas) and HTTP-dates in
    the IMF-fixdate, RFC 850 and asctime forms. A date in the past gives 0.0.
    Garbage, negative numbers and over-long values give None.

    Not capped: a huge delta comes back huge (saturating at 1e18 seconds, so it
    is always finite); the caller caps it at its ``max_pause`` and logs that.
    """
    _check_now(now)
    return _retry_after(value, now)


def parse_rate_limit(headers: Mapping[str, str], *, now: float) -> RateLimit | None:
    """The rate-limit budget advertised in ``headers``, or None.

    The first family present and valid wins:

    1. ``RateLimit`` (IETF draft 08+: ``"name";r=REMAINING;t=SECONDS``, with
       ``RateLimit-Policy: "name";q=QUOTA;w=WINDOW`` for the limit; draft 07:
       ``limit=L, remaining=R, reset=T``). Each policy is a window.
    2. ``RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` (older drafts).
    3. ``X-RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` (or ``-Reset-After``),
       with ``X-RateLimit-Used`` giving the limit when none is sent (Reddit).
    4. ``x-ratelimit-*-requests`` (OpenAI), the reset a Go duration (``6m0s``).
    5. ``anthropic-ratelimit-requests-*`` (Anthropic), the reset RFC 3339.
    6. ``x-rate-limit-*`` (Twitter/X, Okta).
    7. ``X-Shopify-Shop-Api-Call-Limit: USED/LIMIT``, a leaky bucket.

    Kong's per-unit fields (``X-RateLimit-Remaining-Minute``), Etsy's
    (``x-remaining-today``) and Riot's (``X-App-Rate-Limit: 20:1,100:120``)
    add windows to it. With several windows, the binding one: an exhausted one
    (longest reset first), else the one demanding the widest gap, the wider of
    ``reset / remaining`` and its own pace ``window / limit`` (ties: fewer
    remaining); :attr:`RateLimit.windows` lists them all. That is the gap that
    honours every window at once; the window with the fewest remaining alone
    could still overrun a larger, longer one. ``docs/signals.md`` has the table.

    A reset is delta seconds, unless it is so large that it can only be an
    epoch timestamp (>= 1e9: seconds; >= 1e12: milliseconds), which is turned
    into a delta with ``now``; an HTTP-date or an RFC 3339 timestamp is
    accepted too. Resets in the past give 0.0. Counts may be fractional
    (rounded down). A family with a negative or garbage remaining count or
    reset is ignored, and the next one is tried.

    This function does not look at ``Age``; :func:`read_headers` drops the
    budget of a cached response, as the draft requires.
    """
    _check_now(now)
    return _rate_limit(_fold(headers, []), now, [])


def is_cache_hit(status: int, headers: Mapping[str, str]) -> bool:
    """True when a cache answered, so the latency says nothing about the origin.

    Any of these counts:

    * status 304;
    * ``Age`` > 0;
    * ``X-Cache`` with a member whose first word is HIT (any case; "HIT",
      "Hit from cloudfront", "HIT-STALE", Akamai "TCP_HIT"/"TCP_MEM_HIT"). Any
      member counts: with a chain of caches ("MISS, HIT" or "HIT, MISS") one
      of them answered, so the origin was not asked;
    * ``X-Cache-Status`` (nginx) or ``CF-Cache-Status`` (Cloudflare) of HIT,
      STALE or UPDATING: a cached copy was served. REVALIDATED and EXPIRED do
      not count: the origin was asked;
    * ``Cache-Status`` (RFC 9211) with a member carrying the ``hit`` parameter.
    """
    return status == 304 or _served_by_cache(_fold(headers, []))


def response_age(headers: Mapping[str, str]) -> float | None:
    """The ``Age`` header in seconds (>= 0, finite), or None when absent or invalid."""
    return _age(_fold(headers, []), [])


def read_headers(
    status: int, headers: Mapping[str, str], *, now: float, from_cache: bool = False
) -> HeaderSignals:
    """All the pacing signals of one response, read in one pass over its headers.

    This is what the engine calls on every response: one scan of the header
    names, and nothing else when none of them is relevant.

    ``from_cache=True`` says a client-side cache (hishel, aiohttp-client-cache)
    answered: the response is then a cache hit exactly as if a header said so,
    and its stored rate-limit budget is dropped as stale.
    """
    _check_now(now)
    notes: list[str] = []
    folded = _fold(headers, notes)
    if not folded and not notes:
        return _NOT_MODIFIED if status == 304 or from_cache else _NOTHING
    served = from_cache or _served_by_cache(folded)
    age = _age(folded, notes)
    retry_after = None
    raw = folded.get("retry-after")
    if raw is not None:
        retry_after = _retry_after(raw, now)
        if retry_after is None:
            notes.append(f"Retry-After {_show(raw)}: neither delta-seconds nor an HTTP-date")
    rate_limit = _rate_limit(folded, now, notes)
    if rate_limit is not None and served:
        notes.append(f"{rate_limit.source}: ignored on a response a cache served")
        rate_limit = None
    return HeaderSignals(served or status == 304, age, retry_after, rate_limit, tuple(notes))


_NOTHING = HeaderSignals()
_NOT_MODIFIED = HeaderSignals(cache_hit=True)


# -- helpers ----------------------------------------------------------------------


def _check_now(now: float) -> None:
    if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
        raise ValueError(f"now must be a finite number of epoch seconds, got {now!r}")


def _show(value: str) -> str:
    """``value`` quoted for a log line, cut short if long (escapes included)."""
    shown = repr(value[:40])
    if len(shown) > 60:
        shown = shown[:60] + "..."
    elif len(value) > 40:
        shown += "..."
    if len(value) > 40:
        shown += f" ({len(value)} chars)"
    return shown


def _fold(headers: Mapping[str, str], notes: list[str]) -> dict[str, str]:
    """The relevant headers, keyed by lower-case name; the first value of each wins."""
    folded: dict[str, str] = {}
    for key, value in headers.items():
        if not isinstance(key, str) or not isinstance(value, str):
            continue
        name = key.lower()
        if name not in _RELEVANT or name in folded:
            continue
        if len(value) > _MAX_FIELD:
            notes.append(f"{key}: ignored, {len(value)} characters long")
            continue
        folded[name] = value
    return folded


def _seconds(text: str) -> float | None:
    """A non-negative decimal number of seconds, saturating at ``_MAX_SECONDS``."""
    text = text.strip()
    match = _NUMBER.fullmatch(text)
    if match is None:
        return None
    if len(match.group(1).lstrip("0")) > 18:
        return _MAX_SECONDS
    return min(float(text), _MAX_SECONDS)


def _count(text: str) -> int | None:
    """A non-negative count, saturating at ``_MAX_COUNT``; a fraction is rounded down.

    Reddit sends ``598.0``: a fraction of a request cannot be sent, so ``1.5``
    is 1 and ``0.5`` is nothing left.
    """
    match = _NUMBER.fullmatch(text.strip())
    if match is None:
        return None
    digits = match.group(1).lstrip("0")
    if len(digits) > 15:
        return _MAX_COUNT
    return min(int(digits or "0"), _MAX_COUNT)


def _http_date(text: str) -> float | None:
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


def _go_duration(text: str) -> float | None:
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


def _retry_after(value: str, now: float) -> float | None:
    if len(value) > _MAX_FIELD:
        return None
    delta = _seconds(value)
    if delta is not None:
        return delta
    when = _http_date(value)
    if when is not None:
        return max(0.0, when - now)
    # "120, 120": a repeated header joined by the client.
    head, comma, _ = value.partition(",")
    if comma:
        return _seconds(head)
    return None


def _reset(text: str, *, now: float) -> float | None:
    """A reset time as seconds from ``now``: delta, epoch (s or ms) or HTTP-date."""
    value = _seconds(text)
    if value is None:
        when = _http_date(text)
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


def _members(text: str) -> list[tuple[str, dict[str, str]]]:
    """A structured-field list, leniently: each member's bare part and parameters.

    Parameter keys are lower-cased; a repeated key keeps its last value (RFC 8941).
    Members past the first ``_MAX_MEMBERS`` are dropped.
    """
    members: list[tuple[str, dict[str, str]]] = []
    for member in _split(text, ",")[:_MAX_MEMBERS]:
        pieces = _split(member, ";")
        params: dict[str, str] = {}
        for piece in pieces[1:]:
            key, _, value = piece.partition("=")
            params[key.strip().lower()] = value.strip()
        members.append((pieces[0].strip(), params))
    return members


def _unquote(text: str) -> str:
    """A structured-field string or token as plain text, cut to 64 characters."""
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        text = re.sub(r"\\(.)", r"\1", text[1:-1])
    return text[:64]


# -- cache ------------------------------------------------------------------------


def _age(folded: Mapping[str, str], notes: list[str]) -> float | None:
    raw = folded.get("age")
    if raw is None:
        return None
    age = _seconds(raw.partition(",")[0])
    if age is None:
        notes.append(f"Age {_show(raw)}: not a number of seconds")
    return age


def _served_by_cache(folded: Mapping[str, str]) -> bool:
    """A cache header says a cache answered (whatever the status)."""
    age = folded.get("age")
    if age is not None:
        seconds = _seconds(age.partition(",")[0])
        if seconds is not None and seconds > 0:
            return True
    raw = folded.get("x-cache")
    if raw is not None:
        for member in raw.split(","):
            words = member.split(None, 1)
            if not words:
                continue
            word = words[0].upper()
            word = word.removeprefix("TCP_")
            if word in _X_CACHE_HITS or word.startswith("HIT-"):
                return True
    for name in ("x-cache-status", "cf-cache-status"):
        raw = folded.get(name)
        if raw is not None and raw.partition(",")[0].strip().upper() in _SERVED_FROM_CACHE:
            return True
    raw = folded.get("cache-status")
    if raw is not None:
        for _, params in _members(raw):
            if params.get("hit", "?0") in ("", "?1"):
                return True
    return False


# -- rate limits ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Family:
    """A dialect of separate fields: remaining, limit, and resets in order of preference.

    Each reset is ``(name, how)``: ``"delta"`` seconds, ``"go"`` a Go duration
    (or else as ``"reset"``), ``"reset"`` delta, epoch, HTTP-date or RFC 3339.
    ``used`` is a count spent in the window: with no limit field, the limit is
    ``used + remaining`` (Reddit).
    """

    source: str
    remaining: str
    limit: str
    resets: tuple[tuple[str, str], ...]
    used: str | None = None


# Tried in this order; the first that gives a budget wins (the same budget is
# often sent in two dialects at once, for old clients).
_FAMILIES = (
    _Family(
        "RateLimit-*", "ratelimit-remaining", "ratelimit-limit", (("ratelimit-reset", "reset"),)
    ),
    _Family(
        "X-RateLimit-*",
        "x-ratelimit-remaining",
        "x-ratelimit-limit",
        (("x-ratelimit-reset-after", "delta"), ("x-ratelimit-reset", "reset")),
        used="x-ratelimit-used",
    ),
    _Family(
        "X-RateLimit-*-Requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-limit-requests",
        (("x-ratelimit-reset-requests", "go"),),
    ),
    _Family(
        "Anthropic-RateLimit-Requests-*",
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-requests-limit",
        (("anthropic-ratelimit-requests-reset", "reset"),),
    ),
    _Family(
        "X-Rate-Limit-*",
        "x-rate-limit-remaining",
        "x-rate-limit-limit",
        (("x-rate-limit-reset", "reset"),),
    ),
)


def _relevant() -> frozenset[str]:
    names = set(_OTHER_RELEVANT)
    for family in _FAMILIES:
        names.update((family.remaining, family.limit, *(name for name, _ in family.resets)))
        if family.used is not None:
            names.add(family.used)
    for unit, _ in _UNITS:
        names.update((f"x-ratelimit-remaining-{unit}", f"x-ratelimit-limit-{unit}"))
    for remaining, limit, _, _ in _ETSY:
        names.update((remaining, limit))
    for limits, counts in _RIOT:
        names.update((limits, counts))
    return frozenset(names)


_RELEVANT = _relevant()

# (remaining, limit, window name, seconds) of every window named by its length.
_UNIT_FIELDS = (
    *(
        (f"x-ratelimit-remaining-{unit}", f"x-ratelimit-limit-{unit}", unit, s)
        for unit, s in _UNITS
    ),
    *_ETSY,
)

# The names that make a window of their own: Kong's, Etsy's and Riot's.
_WINDOW_NAMES = frozenset(
    {name for remaining, limit, _, _ in _UNIT_FIELDS for name in (remaining, limit)}
    | {name for pair in _RIOT for name in pair}
)


def _rate_limit(folded: Mapping[str, str], now: float, notes: list[str]) -> RateLimit | None:
    """The binding window among the main family's and the per-window dialects'."""
    windows = _main_budget(folded, now, notes)
    extra = []
    if not _WINDOW_NAMES.isdisjoint(folded):
        extra = _unit_windows(folded, notes) + _riot_windows(folded, notes)
    for window in extra:
        same = next((i for i, w in enumerate(windows) if _same_window(w, window)), None)
        if same is None:
            windows.append(window)
        else:  # one window in two dialects: the main one's reset, the other's length
            windows[same] = replace(windows[same], window=window.window)
    if len(windows) <= 1:
        return windows[0] if windows else None
    binding = max(windows, key=_restrictiveness)
    return replace(binding, windows=tuple(windows))


def _main_budget(folded: Mapping[str, str], now: float, notes: list[str]) -> list[RateLimit]:
    if "ratelimit" in folded:
        found = _structured(folded, now, notes)
        if found:
            return found
    for family in _FAMILIES:
        if family.remaining in folded:
            budget = _separate(folded, now, notes, family)
            if budget is not None:
                return [budget]
    if _SHOPIFY in folded:
        budget = _shopify(folded[_SHOPIFY], notes)
        if budget is not None:
            return [budget]
    return []


def _same_window(main: RateLimit, other: RateLimit) -> bool:
    """Kong sends the binding window twice: as ``RateLimit-*`` and per unit."""
    return main.window is None and (main.remaining, main.limit) == (other.remaining, other.limit)


def _structured(folded: Mapping[str, str], now: float, notes: list[str]) -> list[RateLimit]:
    """The IETF draft's ``RateLimit`` field, draft 07 or draft 08+ form: each policy."""
    raw = folded["ratelimit"]
    members = _members(raw)
    if any("=" in main and not main.startswith('"') for main, _ in members):
        found = _structured_draft7(raw, members, now, notes)
        return [] if found is None else [found]
    policies: dict[str, tuple[int | None, float | None]] = {}
    policy_raw = folded.get("ratelimit-policy")
    if policy_raw is not None:
        for main, params in _members(policy_raw):
            quota_raw = params.get("q")
            window_raw = params.get("w")
            policies[_unquote(main)] = (
                None if quota_raw is None else _count(quota_raw),
                None if window_raw is None else _seconds(window_raw),
            )
    candidates: list[RateLimit] = []
    problems: list[str] = []
    for main, params in members:
        name = _unquote(main)
        quota, window = policies.get(name, (None, None))
        remaining_raw = params.get("r")
        remaining = None if remaining_raw is None else _count(remaining_raw)
        if remaining is None:
            problems.append(f"{_show(main)} has no valid r= (remaining)")
            continue
        reset_raw = params.get("t")
        # No t=: the policy's window bounds the time to the reset.
        reset = window if reset_raw is None else _reset(reset_raw, now=now)
        if reset is None:
            problems.append(f"{_show(main)} has no valid t= (reset)")
            continue
        candidates.append(RateLimit(remaining, reset, quota, "RateLimit", name or None, window))
    if problems:
        # One note per field, however many members a hostile server sends.
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        notes.append(f"RateLimit: policy {problems[0]}{more}: skipped")
    return candidates


def _restrictiveness(budget: RateLimit) -> tuple[int, float, int]:
    """Exhausted windows first (longest reset), then the widest gap, then fewer left.

    The gap is the wider of the spacing until the reset and the window's own
    pace: a window that says ``t=0`` while tokens remain still binds by its pace.
    """
    if budget.remaining == 0:
        return (1, budget.reset, 0)
    return (0, max(budget.spacing, budget.sustained or 0.0), -budget.remaining)


def _structured_draft7(
    raw: str, members: list[tuple[str, dict[str, str]]], now: float, notes: list[str]
) -> RateLimit | None:
    """Draft 07's dictionary form: ``RateLimit: limit=100, remaining=50, reset=30``."""
    fields: dict[str, str] = {}
    for main, _ in members:
        key, _, value = main.partition("=")
        fields[key.strip().lower()] = value
    remaining = _count(fields.get("remaining", ""))
    reset = _reset(fields.get("reset", ""), now=now)
    if remaining is None or reset is None:
        notes.append(f"RateLimit {_show(raw)}: no valid remaining= and reset=")
        return None
    limit_raw = fields.get("limit")
    limit = None if limit_raw is None else _count(limit_raw)
    return RateLimit(remaining, reset, limit, "RateLimit")


def _separate(
    folded: Mapping[str, str], now: float, notes: list[str], family: _Family
) -> RateLimit | None:
    """A family's remaining, limit and reset fields.

    Each may be a structured list (``10, 10;w=1``): the first member counts.
    """
    remaining_raw = folded[family.remaining]
    remaining = _count(_first_item(remaining_raw))
    if remaining is None:
        notes.append(f"{_display(family.remaining)} {_show(remaining_raw)}: not a count")
        return None
    limit, window = _limit(folded, notes, family)
    reset = None
    for name, how in family.resets:
        reset_raw = folded.get(name)
        if reset_raw is None:
            continue
        reset = _reset_as(how, reset_raw, now)
        if reset is None and "," in reset_raw:
            reset = _reset_as(how, _first_item(reset_raw), now)
        if reset is None:
            notes.append(f"{_display(name)} {_show(reset_raw)}: not a time")
            return None
        break
    else:
        # No reset given: a window advertised with the limit bounds it.
        reset = window
        if reset is None:
            notes.append(f"{family.source}: remaining without a reset")
            return None
    return RateLimit(remaining, reset, limit, family.source, window=window)


def _limit(
    folded: Mapping[str, str], notes: list[str], family: _Family
) -> tuple[int | None, float | None]:
    """A family's limit and the window a ``;w=`` parameter on it gives, if any."""
    limit_raw = folded.get(family.limit)
    if limit_raw is None:
        used_raw = None if family.used is None else folded.get(family.used)
        if used_raw is None:
            return None, None
        used = _count(_first_item(used_raw))
        remaining = _count(_first_item(folded[family.remaining]))
        if used is None or remaining is None:
            notes.append(f"{_display(str(family.used))} {_show(used_raw)}: not a count")
            return None, None
        return min(used + remaining, _MAX_COUNT), None
    main, params = _members(limit_raw)[0]
    limit = _count(main)
    if limit is None:
        notes.append(f"{_display(family.limit)} {_show(limit_raw)}: not a count")
        return None, None
    window = _seconds(params["w"]) if "w" in params else None
    return limit, window


def _reset_as(how: str, text: str, now: float) -> float | None:
    if how == "delta":
        return _seconds(text)
    if how == "go":
        duration = _go_duration(text)
        if duration is not None:
            return duration
    return _reset(text, now=now)


def _shopify(raw: str, notes: list[str]) -> RateLimit | None:
    """``X-Shopify-Shop-Api-Call-Limit: 32/40``: a leaky bucket, 32 of 40 used.

    The bucket leaks ``limit / 20`` requests a second (``_SHOPIFY_DRAIN``), so
    the window is 20 s and the pace ``20 / limit``. While room remains, the
    reset is 0 (nothing to wait for but the pace); with the bucket full, it is
    the time one request takes to leak out.
    """
    used_raw, slash, limit_raw = raw.partition(",")[0].partition("/")
    used = _count(used_raw)
    limit = _count(limit_raw)
    if not slash or used is None or not limit:
        notes.append(f"{_display(_SHOPIFY)} {_show(raw)}: not USED/LIMIT")
        return None
    remaining = max(0, limit - used)
    reset = 0.0 if remaining else _SHOPIFY_DRAIN / limit
    return RateLimit(remaining, reset, limit, _display(_SHOPIFY), window=_SHOPIFY_DRAIN)


def _unit_windows(folded: Mapping[str, str], notes: list[str]) -> list[RateLimit]:
    """Windows named by their length: Kong's ``-Second`` ... ``-Year``, Etsy's.

    They carry no reset: the window's length bounds it.
    """
    windows: list[RateLimit] = []
    for remaining_name, limit_name, name, seconds in _UNIT_FIELDS:
        remaining_raw = folded.get(remaining_name)
        if remaining_raw is None:
            continue
        remaining = _count(_first_item(remaining_raw))
        if remaining is None:
            notes.append(f"{_display(remaining_name)} {_show(remaining_raw)}: not a count")
            continue
        limit_raw = folded.get(limit_name)
        limit = None if limit_raw is None else _count(_first_item(limit_raw))
        if limit_raw is not None and limit is None:
            notes.append(f"{_display(limit_name)} {_show(limit_raw)}: not a count")
        kong = limit_name.startswith("x-ratelimit-")
        source = f"X-RateLimit-*-{name.capitalize()}" if kong else _display(limit_name)
        windows.append(RateLimit(remaining, seconds, limit, source, name, seconds))
    return windows


def _riot_windows(folded: Mapping[str, str], notes: list[str]) -> list[RateLimit]:
    """Riot Games: ``X-App-Rate-Limit: 20:1,100:120`` with ``-Count: 3:1,40:120``.

    Each ``LIMIT:SECONDS`` is a window; its count is what was spent in it.
    """
    windows: list[RateLimit] = []
    for limits_name, counts_name in _RIOT:
        limits_raw = folded.get(limits_name)
        if limits_raw is None:
            continue
        limits = _pairs(limits_raw)
        used = dict((w, n) for n, w in _pairs(folded.get(counts_name, "")))
        if not limits:
            notes.append(f"{_display(limits_name)} {_show(limits_raw)}: not LIMIT:SECONDS,...")
            continue
        for limit, seconds in limits:
            if not limit or not seconds:
                continue
            remaining = max(0, limit - int(used.get(seconds, 0)))
            name = f"{seconds:g}s"
            windows.append(
                RateLimit(remaining, seconds, limit, _display(limits_name), name, seconds)
            )
    return windows


def _pairs(text: str) -> list[tuple[int, float]]:
    """``"20:1,100:120"`` as ``[(20, 1.0), (100, 120.0)]``; [] if any pair is bad."""
    pairs: list[tuple[int, float]] = []
    for member in text.split(",")[:_MAX_MEMBERS]:
        count_raw, colon, seconds_raw = member.partition(":")
        count = _count(count_raw)
        seconds = _seconds(seconds_raw)
        if not colon or count is None or seconds is None:
            return []
        pairs.append((count, seconds))
    return pairs


def _first_item(text: str) -> str:
    """The bare part of a list's first member (``"10"`` from ``"10;w=1, 50"``)."""
    return text.partition(",")[0].partition(";")[0]

"""What a response's headers say about pacing: Retry-After, rate-limit budgets, cache hits.

Pure and synchronous: the engine passes the headers and the wall-clock time in
(:func:`read_headers`), and gets plain values back. One module per family of
dialects (``_retry_after``, ``_ietf``, ``_vendors``, ``_llm``, ``_cache``),
one table of the names they read (``_names``), and the bounded readers they
share (``_values``). Header values come from servers we do not control, so
every parser here treats its input as hostile:

* nothing raises on any text, and nothing is slow on any text: fields longer
  than 4096 characters are ignored before any parsing, and no regular
  expression here can backtrack;
* no wait is ever negative, NaN or infinite: times in the past become 0.0,
  numbers too large to mean anything saturate at 1e18 seconds (about 31.7
  billion years) and counts at 10**15; capping to a sane pause is the caller's
  job (it knows ``max_pause`` and the slot to name in its warning);
* what was ignored is said in short notes (:attr:`HeaderSignals.ignored`) that
  quote at most a few dozen characters of the offending value, so a hostile
  header cannot flood the log.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import isfinite

from . import _ietf, _llm, _vendors
from ._budget import RateLimit, combine
from ._cache import age, served_by_cache
from ._fields import read_family
from ._names import PASSED, RAW_TYPES, fold, passed_raw, raw_names
from ._retry_after import retry_after
from ._values import check_now

__all__ = [
    "PASSED",
    "RAW_TYPES",
    "HeaderSignals",
    "RateLimit",
    "passed_raw",
    "raw_names",
    "read_headers",
]


@dataclass(frozen=True, slots=True)
class HeaderSignals:
    """Everything :func:`read_headers` found in one response's headers.

    Attributes:
        cache_hit: A cache answered (status 304, or a cache header says so:
            ``docs/signals.md``, "Caches").
        age: The ``Age`` header in seconds, or None when absent or invalid.
        retry_after: Seconds to wait from ``now`` per ``retry-after-ms`` or
            ``Retry-After``, or None. Finite and >= 0 but not capped: the
            caller caps it and says so.
        rate_limit: The advertised budget, or None. None as well when a cache
            served the response (``Age`` > 0 or a cache header saying HIT):
            its budget is stale, as the draft warns. A bare 304 keeps it: the
            origin may have sent it fresh.
        ignored: One short note per header that was present but not used and
            why, for the caller's debug log. Quotes at most a few dozen
            characters of any value.
        tokens: The token windows the LLM APIs advertise beside their
            requests budget, each with its :attr:`RateLimit.unit`; () when
            none, or when a cache served the response.
    """

    cache_hit: bool = False
    age: float | None = None
    retry_after: float | None = None
    rate_limit: RateLimit | None = None
    ignored: tuple[str, ...] = ()
    tokens: tuple[RateLimit, ...] = ()


_NOTHING = HeaderSignals()
_NOT_MODIFIED = HeaderSignals(cache_hit=True)

# The dialects of separate fields, tried in this order after the IETF
# ``RateLimit`` field; the first that gives a budget wins (the same budget is
# often sent in two dialects at once, for old clients).
_FAMILIES = (
    _ietf.SEPARATE,
    _vendors.X_RATELIMIT,
    _llm.OPENAI_REQUESTS,
    _llm.ANTHROPIC_REQUESTS,
    _vendors.X_RATE_LIMIT,
)


def read_headers(
    status: int, headers: Mapping[str, str], *, now: float, from_cache: bool = False
) -> HeaderSignals:
    """All the pacing signals of one response, read in one pass over its headers.

    This is what the engine calls on every response: one scan of the header
    names, and nothing else when none of them is relevant. ``now`` is the
    wall clock (epoch seconds): it turns dates and epoch resets into waits.

    ``from_cache=True`` says a client-side cache (hishel, aiohttp-client-cache)
    answered: the response is then a cache hit exactly as if a header said so,
    and its stored rate-limit budget is dropped as stale.
    """
    if type(now) is not float or not isfinite(now):
        check_now(now)  # raises
    if passed_raw(headers) if type(headers) in RAW_TYPES else PASSED.issuperset(headers):
        # None of the names read (most responses): what fold would find, without
        # the call (and for httpx, without decoding every field: `raw_names`).
        return _NOT_MODIFIED if status == 304 or from_cache else _NOTHING
    notes: list[str] = []
    folded = fold(headers, notes)
    if not folded and not notes:
        return _NOT_MODIFIED if status == 304 or from_cache else _NOTHING
    served = from_cache or served_by_cache(folded)
    seconds_old = age(folded, notes)
    wait = retry_after(folded, now, notes)
    budget = _rate_limit(folded, now, notes)
    tokens = _llm.token_windows(folded, now, notes)
    if served:
        for stale in (budget, *tokens):
            if stale is not None:
                notes.append(f"{stale.source}: ignored on a response a cache served")
        budget, tokens = None, ()
    cache_hit = served or status == 304
    return HeaderSignals(cache_hit, seconds_old, wait, budget, tuple(notes), tokens)


def _rate_limit(folded: Mapping[str, str], now: float, notes: list[str]) -> RateLimit | None:
    """The budget advertised: the first main dialect that gives one, and the
    per-window dialects' windows beside it, the binding window first."""
    return combine(_main_budget(folded, now, notes), _vendors.windows(folded, notes))


def _main_budget(folded: Mapping[str, str], now: float, notes: list[str]) -> list[RateLimit]:
    if "ratelimit" in folded:
        found = _ietf.structured(folded, now, notes)
        if found:
            return found
    for family in _FAMILIES:
        if family.remaining in folded:
            budget = read_family(folded, now, notes, family)
            if budget is not None:
                return [budget]
    if _vendors.SHOPIFY in folded:
        budget = _vendors.shopify(folded[_vendors.SHOPIFY], notes)
        if budget is not None:
            return [budget]
    return []

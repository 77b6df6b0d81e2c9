"""Every response header the dialects read: one table, and the fold that uses it.

A response's headers are folded once (:func:`fold`): the names in
``_TABLE``, in lower case, each with its first value; every other header is
passed over unread, so a response with none of them costs one scan of its
names. Each row is a name as its servers spell it (for the notes and for
:attr:`~autothrottle.store.RateLimit.source`) and the module of this package that
reads it; ``docs/signals.md`` ("Header dialects") says what each means.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from operator import attrgetter, itemgetter
from typing import Any

from ._values import MAX_FIELD

__all__ = ["PASSED", "RAW_TYPES", "display", "fold", "passed_raw", "raw_names"]

_TABLE = (
    # _retry_after
    ("Retry-After", "_retry_after"),
    ("Retry-After-Ms", "_retry_after"),
    # _cache
    ("Age", "_cache"),
    ("Cache-Status", "_cache"),
    ("CF-Cache-Status", "_cache"),
    ("X-Cache", "_cache"),
    ("X-Cache-Status", "_cache"),
    # _ietf
    ("RateLimit", "_ietf"),
    ("RateLimit-Policy", "_ietf"),
    ("RateLimit-Limit", "_ietf"),
    ("RateLimit-Remaining", "_ietf"),
    ("RateLimit-Reset", "_ietf"),
    # _vendors: GitHub, Discord, Reddit, Atlassian
    ("X-RateLimit-Limit", "_vendors"),
    ("X-RateLimit-Remaining", "_vendors"),
    ("X-RateLimit-Reset", "_vendors"),
    ("X-RateLimit-Reset-After", "_vendors"),
    ("X-RateLimit-Used", "_vendors"),
    # _vendors: Twitter/X, Okta
    ("X-Rate-Limit-Limit", "_vendors"),
    ("X-Rate-Limit-Remaining", "_vendors"),
    ("X-Rate-Limit-Reset", "_vendors"),
    # _vendors: Kong, one window per unit
    ("X-RateLimit-Limit-Second", "_vendors"),
    ("X-RateLimit-Remaining-Second", "_vendors"),
    ("X-RateLimit-Limit-Minute", "_vendors"),
    ("X-RateLimit-Remaining-Minute", "_vendors"),
    ("X-RateLimit-Limit-Hour", "_vendors"),
    ("X-RateLimit-Remaining-Hour", "_vendors"),
    ("X-RateLimit-Limit-Day", "_vendors"),
    ("X-RateLimit-Remaining-Day", "_vendors"),
    ("X-RateLimit-Limit-Month", "_vendors"),
    ("X-RateLimit-Remaining-Month", "_vendors"),
    ("X-RateLimit-Limit-Year", "_vendors"),
    ("X-RateLimit-Remaining-Year", "_vendors"),
    # _vendors: Etsy
    ("X-Limit-Per-Second", "_vendors"),
    ("X-Remaining-This-Second", "_vendors"),
    ("X-Limit-Per-Day", "_vendors"),
    ("X-Remaining-Today", "_vendors"),
    # _vendors: Riot Games
    ("X-App-Rate-Limit", "_vendors"),
    ("X-App-Rate-Limit-Count", "_vendors"),
    ("X-Method-Rate-Limit", "_vendors"),
    ("X-Method-Rate-Limit-Count", "_vendors"),
    # _vendors: Shopify
    ("X-Shopify-Shop-Api-Call-Limit", "_vendors"),
    # _llm: OpenAI (and Groq)
    ("X-RateLimit-Limit-Requests", "_llm"),
    ("X-RateLimit-Remaining-Requests", "_llm"),
    ("X-RateLimit-Reset-Requests", "_llm"),
    ("X-RateLimit-Limit-Tokens", "_llm"),
    ("X-RateLimit-Remaining-Tokens", "_llm"),
    ("X-RateLimit-Reset-Tokens", "_llm"),
    # _llm: Anthropic
    ("Anthropic-RateLimit-Requests-Limit", "_llm"),
    ("Anthropic-RateLimit-Requests-Remaining", "_llm"),
    ("Anthropic-RateLimit-Requests-Reset", "_llm"),
    ("Anthropic-RateLimit-Tokens-Limit", "_llm"),
    ("Anthropic-RateLimit-Tokens-Remaining", "_llm"),
    ("Anthropic-RateLimit-Tokens-Reset", "_llm"),
    ("Anthropic-RateLimit-Input-Tokens-Limit", "_llm"),
    ("Anthropic-RateLimit-Input-Tokens-Remaining", "_llm"),
    ("Anthropic-RateLimit-Input-Tokens-Reset", "_llm"),
    ("Anthropic-RateLimit-Output-Tokens-Limit", "_llm"),
    ("Anthropic-RateLimit-Output-Tokens-Remaining", "_llm"),
    ("Anthropic-RateLimit-Output-Tokens-Reset", "_llm"),
)

_NAMES: Mapping[str, str] = {name.lower(): name for name, _ in _TABLE}
"""Each header read, by its lower-case name: its spelling."""


def display(name: str) -> str:
    """A lower-case header name of the table as servers spell it (``X-RateLimit-Reset``)."""
    return _NAMES.get(name, name)


PASSED: set[object] = set()
"""Header names, as responses spell them, that the table does not read: most
responses repeat the same few, and whether all of a response's names are
among them is one call (a set's ``issuperset``) instead of a loop."""

_PASSED_KEPT = 1024
"""Names remembered at most (a server inventing names must not grow memory).
Full, the memory starts again: a long crawl's rare names would otherwise fill
it for good, and every later response with a name not yet seen (a common one
among them) would be folded the slow way for the rest of the process."""


PASSED_RAW: set[bytes] = set()
"""The same as :data:`PASSED` for the raw names of a header type whose
``.raw`` is its ``(name, value)`` pairs in bytes (httpx's ``Headers``, see
:func:`raw_names`): ASCII names only, as the server spelled them."""

Fields = Callable[[Any], Iterable[tuple[Any, ...]]]
"""How to get a header type's fields: each a tuple whose first item is the
name as sent, in bytes; a list or another sequence that can be read twice."""

RAW_TYPES: dict[type, Fields] = {}
"""The header types :func:`raw_names` was told of, each with its :data:`Fields`."""

_NAME = itemgetter(0)


def raw_names(header_type: type, fields: Fields | None = None) -> None:
    """Say that ``header_type``'s fields, ``fields(headers)`` (default its
    ``.raw``: ``(name, value)`` pairs of bytes), name them as sent: whether
    none of them is read is then checked on those bytes, without decoding
    every field (httpx decodes them all to iterate its ``Headers``). An
    adapter calls this for its client's type; ``fields`` best a C callable
    (``operator.attrgetter``): it is called on every response."""
    RAW_TYPES[header_type] = attrgetter("raw") if fields is None else fields


def passed_raw(headers: Mapping[str, str]) -> bool:
    """True when none of the names of ``headers``, of a :data:`RAW_TYPES`
    type, is in the table: what :func:`fold` would find ({}), without decoding.

    A raw name joins :data:`PASSED_RAW` only when it is ASCII and its lower
    case is not in the table, and any client decodes an ASCII name to the same
    text: so a name in it is one :func:`fold` passes over, whatever the
    client's decoding. False (fold them the usual way) when a name is new or read.

    The usual response (every name passed over before) is one loop over its
    few fields, stopping at the first new name: on four fields, cheaper than
    ``issuperset`` over a ``map`` (the map and the getter's calls cost more
    than the loop's bytecodes).
    """
    fields = RAW_TYPES[type(headers)](headers)
    passed = PASSED_RAW
    for field in fields:
        if field[0] not in passed:
            break
    else:
        return True
    for name in map(_NAME, fields):
        if (
            isinstance(name, bytes)
            and name.isascii()
            and name.decode("ascii").lower() not in _NAMES
        ):
            if len(passed) >= _PASSED_KEPT:
                passed.clear()
            passed.add(name)
    return False


def fold(headers: Mapping[str, str], notes: list[str]) -> dict[str, str]:
    """The headers of the table, keyed by lower-case name; the first value of each wins.

    Headers may arrive as any ``Mapping[str, str]``: httpx and aiohttp give
    case-insensitive ones, a plain dict is not, so names are matched in lower
    case here. A value longer than :data:`~._values.MAX_FIELD` is ignored
    unread, and noted. Values are read only for the names in the table.
    """
    passed = PASSED
    if passed.issuperset(headers):
        return {}  # none of the names read: most responses
    folded: dict[str, str] = {}
    for key in headers:
        if key in passed:
            continue
        name = key.lower() if isinstance(key, str) else ""
        if name not in _NAMES:
            if len(passed) >= _PASSED_KEPT:
                passed.clear()
            passed.add(key)
            continue
        if name in folded:
            continue
        # get, not []: httpx looks a name up by str.lower(), which turns a
        # non-ASCII name into another (a Kelvin sign into "k") it cannot find.
        value = headers.get(key)
        if not isinstance(value, str):
            continue
        if len(value) > MAX_FIELD:
            notes.append(f"{key}: ignored, {len(value)} characters long")
            continue
        folded[name] = value
    return folded

"""Cache status: whether a cache answered, so the latency says nothing about the origin.

Any of these counts as a hit (``docs/signals.md``, "Caches"):

* status 304 (the caller checks it);
* ``Age`` > 0;
* ``X-Cache`` with a member whose first word is HIT (any case; "HIT",
  "Hit from cloudfront", "HIT-STALE", Akamai "TCP_HIT"/"TCP_MEM_HIT"). Any
  member counts: with a chain of caches ("MISS, HIT" or "HIT, MISS") one of
  them answered, so the origin was not asked;
* ``X-Cache-Status`` (nginx) or ``CF-Cache-Status`` (Cloudflare) of HIT,
  STALE or UPDATING: a cached copy was served. REVALIDATED and EXPIRED do not
  count: the origin was asked;
* ``Cache-Status`` (RFC 9211) with a member carrying the ``hit`` parameter.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._values import members, seconds, show

__all__ = ["age", "served_by_cache"]

# Cache statuses (nginx X-Cache-Status, Cloudflare CF-Cache-Status) that mean a
# cache answered without asking the origin. REVALIDATED and EXPIRED are left
# out: the origin was asked, so the latency is the origin's.
_SERVED_FROM_CACHE = frozenset({"HIT", "STALE", "UPDATING"})

# First words of an X-Cache member that mean a hit: Varnish/Squid "HIT",
# CloudFront "Hit from cloudfront", Fastly "HIT-STALE", Akamai "TCP_MEM_HIT".
# CloudFront "RefreshHit" and Akamai "TCP_REFRESH_HIT" asked the origin.
_X_CACHE_HITS = frozenset({"HIT", "MEM_HIT", "IMS_HIT"})


def age(folded: Mapping[str, str], notes: list[str]) -> float | None:
    """The ``Age`` header in seconds (>= 0, finite), or None when absent or invalid."""
    raw = folded.get("age")
    if raw is None:
        return None
    seconds_old = seconds(raw.partition(",")[0])
    if seconds_old is None:
        notes.append(f"Age {show(raw)}: not a number of seconds")
    return seconds_old


def served_by_cache(folded: Mapping[str, str]) -> bool:
    """A cache header says a cache answered (whatever the status)."""
    raw = folded.get("age")
    if raw is not None:
        seconds_old = seconds(raw.partition(",")[0])
        if seconds_old is not None and seconds_old > 0:
            return True
    raw = folded.get("x-cache")
    if raw is not None:
        for member in raw.split(","):
            words = member.split(None, 1)
            if not words:
                continue
            word = words[0].upper().removeprefix("TCP_")
            if word in _X_CACHE_HITS or word.startswith("HIT-"):
                return True
    for name in ("x-cache-status", "cf-cache-status"):
        raw = folded.get(name)
        if raw is not None and raw.partition(",")[0].strip().upper() in _SERVED_FROM_CACHE:
            return True
    raw = folded.get("cache-status")
    if raw is not None:
        for _, params in members(raw):
            if params.get("hit", "?0") in ("", "?1"):
                return True
    return False

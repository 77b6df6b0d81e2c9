"""The cache estimate: what share of a slot's sends reach the origin, and how many
may be in flight.

:class:`Cache` is the record; this module is the only one that writes it
(``tests/test_architecture.py`` checks it). :class:`CacheShare` is pure, with
no clock, slot or throttle: it is given the record and one response. The rules
are written out in ``docs/signals.md`` ("Caches", "In-flight cap"); in short:

* ``miss_share`` is the averaged share of responses a cache did not answer:
  the first responses weigh ``1/n``, then each weighs 1 % (about the last 100
  count), never below 1 %;
* the policy paces the origin: it is handed ``delay / miss_share`` and its
  answer is scaled back by the share; a policy that caps requests in flight
  gets headroom ``(1 + miss_share) / 2`` on top;
* the cap is the policy's limit plus the hits in flight by Little's law
  (hit send rate times the averaged hit latency), rounded up.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Cache", "CacheShare"]

_SHARE_WEIGHT = 0.01
"""Least weight of one response in the averaged miss share (about the last 100
responses; the first ones weigh 1/n, so the share starts as the plain mean). A
one-in-ten miss share read from 20 responses swings threefold, and the delay
swings with it."""

_HIT_WEIGHT = 0.1
"""Weight of one hit in the averaged hit latency."""

MIN_SHARE = 0.01
"""The miss share never reads lower: a cache that answers everything still has an origin."""


@dataclass(slots=True)
class Cache:
    """What a slot learned of the cache in front of its origin.

    Attributes:
        in_flight_cap: The policy's own cap on requests in flight (0: none; the
            gate also applies ``max_concurrency``).
        miss_share: The averaged share of responses a cache did not answer (1 until
            a hit is seen): the share of the slot's sends that reach the origin.
        hit_latency: The averaged latency of cache hits (0: none yet).
    """

    in_flight_cap: int = 0
    miss_share: float = 1.0
    hit_latency: float = 0.0


def _weight(responses: int) -> float:
    """The weight of this response in the miss share: 1/n for the first ones."""
    return max(_SHARE_WEIGHT, 1.0 / max(1, responses))


class CacheShare:
    """The miss share, the hit latency and the in-flight cap of one slot."""

    __slots__ = ()

    @staticmethod
    def miss(cache: Cache, responses: int) -> float:
        """Count a response that reached the origin (the ``responses``-th); the new share."""
        share = cache.miss_share
        if share == 1.0:
            return share  # no hit seen yet (most slots): a miss leaves the share at 1
        cache.miss_share = share = share + _weight(responses) * (1.0 - share)
        return share

    @staticmethod
    def hit(cache: Cache, latency: float, responses: int, delay: float) -> float:
        """Count a cache hit of ``latency`` (the ``responses``-th response).

        Returns ``delay`` moved with the share: fewer sends reach the origin,
        so the same pace at the origin allows a shorter delay.
        """
        hit_latency = cache.hit_latency
        cache.hit_latency = (
            latency if hit_latency <= 0.0 else (hit_latency + _HIT_WEIGHT * (latency - hit_latency))
        )
        share = cache.miss_share
        new_share = max(MIN_SHARE, share - _weight(responses) * share)
        cache.miss_share = new_share
        return delay * new_share / share

    @staticmethod
    def headroom(share: float, *, capped: bool) -> float:
        """The pace's headroom behind a cache: the factor on the rate that holds the
        origin at the policy's aim (``docs/signals.md``, "Caches", "In-flight cap").

        Misses come at random among the sends: paced at exactly the origin's
        mean, a run of hits leaves it idle and a run of misses crowds it. A
        policy that caps requests in flight holds the origin to its limit, so
        its pace gets headroom for the hits' share, up to twice the rate.

        A policy without a cap (Scrapy's AutoThrottle rule) gets the opposite:
        the origin held where that rule, response by response, holds it. A miss
        sets the delay to its latency over the target, and the hits after it
        halve it toward theirs: a run of hits sums to twice the miss's delay
        less the run's last halving, ``2 / (1 + share)`` of it on average. So
        Scrapy's own rule keeps ``target * (1 + share) / 2`` in flight at the
        origin (a half of the target at 90 % hits), not the target, and a pace
        that kept the whole target there loaded the origin past it.
        """
        return (1.0 + share) / 2.0 if capped else 2.0 / (1.0 + share)

    @staticmethod
    def pace_origin(
        share: float,
        delay: float,
        ask: Callable[[float], float],
        *,
        capped: bool,
        hits: float = 0.0,
    ) -> float:
        """The slot's delay when its policy paces the origin: ``ask`` (the policy)
        is handed the gap between sends that reach the origin, the delay over the
        share and the :meth:`headroom`, and its answer is scaled back by both.
        ``hits``: seconds of the delay that pace the hits in flight, kept out of
        what the policy is handed and added back (:meth:`hit_time`)."""
        headroom = CacheShare.headroom(share, capped=capped)
        return ask(max(0.0, delay - hits) / (share * headroom)) * share * headroom + hits

    @staticmethod
    def hit_time(cache: Cache, share: float) -> float:
        """Seconds of hits in flight per send at miss share ``share``: the hits'
        share of the sends times their averaged latency (Little's law)."""
        return (1.0 - share) * cache.hit_latency

    @staticmethod
    def cap(cache: Cache, limit: float, gap: float) -> bool:
        """Cap requests in flight at the origin's ``limit`` plus the hits in flight
        at a send every ``gap`` seconds; True when the cap rose (the gate must re-check).
        """
        hits = (1.0 - cache.miss_share) * cache.hit_latency / gap
        cap = math.ceil(limit + hits - 1e-9)
        if cap < 1:  # max(1, cap), without its call: asked on every response
            cap = 1
        rose = cap > cache.in_flight_cap > 0
        cache.in_flight_cap = cap
        return rose

    @staticmethod
    def bound(cache: Cache, max_concurrency: int) -> None:
        """Hold a loaded record's cap to the loading slot's ``max_concurrency``."""
        cache.in_flight_cap = min(cache.in_flight_cap, max_concurrency)

"""The counters of one slot: what happened to it, for snapshots and stats.

:class:`Counters` is the record; this module is the only one that writes it
(``tests/test_architecture.py`` checks it), through the ``count_*`` methods the
gate (sends, releases) and the rules (responses, failures, backoffs, pauses)
call. Nothing here decides anything: :mod:`autothrottle._stats` reads the
counters, and the latency histogram, into plain figures.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field

__all__ = ["LATENCY_BUCKETS", "Counters", "latency_bucket"]

LATENCY_BUCKETS = 80
"""Quarter-octave latency buckets from 1 ms; the last starts at 2**19.75 ms."""

_LAST_BUCKET = LATENCY_BUCKETS - 1


def latency_bucket(latency: float) -> int:
    """The histogram's bucket of ``latency`` (seconds, finite): the rule itself,
    ``int(4 * log2(latency / 1 ms))`` within ``[0, LATENCY_BUCKETS)``.

    A response is counted with :data:`_EDGES` instead, which gives the same
    bucket for every latency (``tests/test_stats.py`` compares them)."""
    if latency <= 0.001:
        return 0
    index = int(4.0 * math.log2(latency / 0.001))
    return index if index < _LAST_BUCKET else _LAST_BUCKET


def _first_of(bucket: int) -> float:
    """The smallest float :func:`latency_bucket` puts in ``bucket`` (> 0) or past it:
    ``1 ms * 2 ** (bucket / 4)`` moved to the float where the rule's answer
    changes (a few units in the last place at most; bounded, and checked)."""
    edge: float = 0.001 * 2.0 ** (bucket / 4.0)
    for _ in range(64):
        if latency_bucket(edge) < bucket:
            edge = math.nextafter(edge, math.inf)
        elif latency_bucket(below := math.nextafter(edge, 0.0)) >= bucket:
            edge = below
        else:
            return edge
    raise AssertionError(f"no edge found for latency bucket {bucket}")  # pragma: no cover


_EDGES = [_first_of(bucket) for bucket in range(1, LATENCY_BUCKETS)]
"""Each bucket's smallest latency, the first's left out: ``bisect_right(_EDGES,
latency)`` is :func:`latency_bucket`'s answer, in C (a division, a logarithm and
a clamp in Python were a third of a usual response's counting)."""


@dataclass(slots=True)
class Counters:
    """What happened to a slot since it was created.

    Attributes:
        last_latency: Latency of the last observed response, or None.
        last_activity: The last send, release or response.
        sent: Requests sent since the slot was created; likewise the counters
            ``responses``, ``failures``, ``cache_hits``, ``backoffs``,
            ``ignored_backoffs``, ``pauses`` and ``status_counts``.
        backoff_reason: Why the slot last backed off.
        backoff_reasons: Backoffs by reason (``"status 429"``, ``"blocked"`` ...).
        latency_buckets: Responses by latency, in quarter-octave buckets from
            1 ms (:mod:`autothrottle._stats` reads percentiles from them).

    The two counts by key are plain dicts, not ``collections.Counter``: a
    Counter defines ``__delitem__`` in Python, so every ``counts[k] += 1`` on
    it goes through a slot wrapper (about a thousand machine instructions, on
    every response); a dict's costs a tenth of that.
    """

    last_latency: float | None = None
    last_activity: float = 0.0
    sent: int = 0
    responses: int = 0
    failures: int = 0
    cache_hits: int = 0
    backoffs: int = 0
    ignored_backoffs: int = 0
    pauses: int = 0
    status_counts: dict[int, int] = field(default_factory=dict)
    backoff_reason: str | None = None
    backoff_reasons: dict[str, int] = field(default_factory=dict)
    latency_buckets: list[int] = field(default_factory=list)

    def count_send(self, now: float) -> None:
        """A request was sent at ``now``."""
        self.sent += 1
        self.last_activity = now

    def touch(self, now: float) -> None:
        """Something happened at ``now`` (a release): the slot is not idle since."""
        self.last_activity = now

    def count_response(self, status: int, latency: float, now: float) -> None:
        """A response of ``status`` arrived at ``now``, ``latency`` seconds after it was sent."""
        self.responses += 1
        counts = self.status_counts
        try:
            counts[status] += 1
        except KeyError:  # the first of its status
            counts[status] = 1
        buckets = self.latency_buckets
        if not buckets:
            buckets.extend([0] * LATENCY_BUCKETS)
        buckets[bisect_right(_EDGES, latency)] += 1  # latency_bucket(latency)
        self.last_latency = latency
        self.last_activity = now

    def count_cache_hit(self) -> None:
        """The response just counted was a cache's."""
        self.cache_hits += 1

    def count_failure(self, now: float) -> None:
        """A request failed without a response at ``now``."""
        self.failures += 1
        self.last_activity = now

    def count_backoff(self, reason: str, *, ignored: bool = False) -> None:
        """A backoff signal: it backed the slot off for ``reason``, or was ``ignored``
        as the lag of an earlier backoff."""
        if ignored:
            self.ignored_backoffs += 1
            return
        self.backoff_reason = reason
        reasons = self.backoff_reasons
        reasons[reason] = reasons.get(reason, 0) + 1
        self.backoffs += 1

    def count_pause(self) -> None:
        """The slot was paused (or a pause made longer)."""
        self.pauses += 1

    def bound(self, now: float) -> None:
        """Place a loaded record's last activity no later than ``now``."""
        self.last_activity = min(self.last_activity, now)

"""The counters of one slot: what happened to it, for snapshots and stats.

:class:`Counters` is the record; this module is the only one that writes it
(``tests/test_architecture.py`` checks it), through the ``count_*`` methods the
gate (sends, releases) and the rules (responses, failures, backoffs, pauses)
call. Nothing here decides anything: :mod:`autothrottle._stats` reads the
counters, and the latency histogram, into plain figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["LATENCY_BUCKETS", "Counters"]

LATENCY_BUCKETS = 80
"""Quarter-octave latency buckets from 1 ms; the last starts at 2**19.75 ms."""

_LAST_BUCKET = LATENCY_BUCKETS - 1
_log2 = math.log2


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
        if latency <= 0.001:
            index = 0
        else:
            index = int(4.0 * _log2(latency / 0.001))
            if index > _LAST_BUCKET:
                index = _LAST_BUCKET
        buckets = self.latency_buckets
        if not buckets:
            buckets.extend([0] * LATENCY_BUCKETS)
        buckets[index] += 1
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

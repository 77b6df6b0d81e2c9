"""What a throttle has done, as plain data: per slot and in total.

The counters live in each slot's :class:`~autothrottle._counters.Counters`,
updated by the gate and the rules; this module only reads them. The
latency percentiles come from a fixed histogram per slot (quarter-octave
buckets from 1 ms, so a percentile is within 19 % of the true value), which
costs one increment per response and a few hundred bytes per slot.

Reading is O(slots). :func:`collect` with ``top`` keeps the per-slot rows
for the busiest slots only (the totals still count every slot);
``Throttle.stats_async`` yields to the event loop every thousand slots, so a
table of 10^5 slots never blocks the loop for long.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import AsyncIterator, Iterable
from dataclasses import asdict, dataclass, field
from itertools import accumulate
from typing import Any

import anyio.lowlevel

from ._counters import LATENCY_BUCKETS
from ._slot import LiveSlot, positional_builder

__all__ = ["Collector", "SlotStats", "ThrottleStats", "collect", "in_chunks", "slot_stats"]


def _percentiles(buckets: list[int]) -> tuple[float | None, float | None, float | None]:
    """p50, p90 and p99 from a latency histogram (bucket middles): the first
    bucket whose running total reaches each rank (a bisection, not a walk of
    the 80 buckets: a row of ``stats()`` reads one per slot)."""
    running = list(accumulate(buckets))
    total = running[-1] if running else 0
    if not total:
        return None, None, None
    return (
        0.001 * 2.0 ** ((bisect_left(running, 0.5 * total) + 0.5) / 4.0),
        0.001 * 2.0 ** ((bisect_left(running, 0.9 * total) + 0.5) / 4.0),
        0.001 * 2.0 ** ((bisect_left(running, 0.99 * total) + 0.5) / 4.0),
    )


@dataclass(frozen=True, slots=True)
class SlotStats:
    """One slot's figures (or, in :attr:`ThrottleStats.totals`, every slot's).

    Attributes:
        key: The slot key (``"*"`` for the totals).
        sent: Requests sent.
        responses: Responses observed.
        statuses: Responses by status code.
        failures: Requests that failed without a response.
        cache_hits: Responses a cache answered.
        backoffs: Times the slot backed off; ``backoff_reasons`` by reason.
        pauses: Times the slot was paused (Retry-After, a spent budget, by hand).
        delay: The current delay in seconds (the totals: the largest).
        in_flight: Requests sent and not finished.
        queued: Requests waiting for their turn.
        latency_p50, latency_p90, latency_p99: Latency percentiles in seconds
            (within 19 %), or None before the first response.
    """

    key: str
    sent: int
    responses: int
    statuses: dict[int, int]
    failures: int
    cache_hits: int
    backoffs: int
    backoff_reasons: dict[str, int]
    pauses: int
    delay: float
    in_flight: int
    queued: int
    latency_p50: float | None
    latency_p90: float | None
    latency_p99: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (status codes as strings)."""
        data = asdict(self)
        data["statuses"] = {str(k): v for k, v in self.statuses.items()}
        return data


_NO_SLOTS = SlotStats("*", 0, 0, {}, 0, 0, 0, {}, 0, 0.0, 0, 0, None, None, None)
"""The totals of a throttle with no slots."""


@dataclass(frozen=True, slots=True)
class ThrottleStats:
    """Every slot's figures and their totals, from :meth:`Throttle.stats`.

    Attributes:
        slots: One row per slot (the busiest ``top`` when asked), busiest first.
        totals: Every slot summed (``key="*"``), whatever ``top`` was.
        slot_count: How many slots the throttle has.
    """

    slots: list[SlotStats] = field(default_factory=list)
    totals: SlotStats = field(default_factory=lambda: _NO_SLOTS)
    slot_count: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {
            "slots": [row.to_dict() for row in self.slots],
            "totals": self.totals.to_dict(),
            "slot_count": self.slot_count,
        }


_build_row = positional_builder(SlotStats)
"""A :class:`SlotStats` from every field in order (a row a slot)."""


def slot_stats(slot: LiveSlot) -> SlotStats:
    """One slot's figures now."""
    state = slot.state.counters
    gate = slot.gate
    return _build_row(  # SlotStats' fields, in order
        slot.key,
        state.sent,
        state.responses,
        dict(state.status_counts),
        state.failures,
        state.cache_hits,
        state.backoffs,
        dict(state.backoff_reasons),
        state.pauses,
        slot.state.pace.delay,
        gate.in_flight(),
        gate.queued(),
        *_percentiles(state.latency_buckets),
    )


_SUM_EVERY = 256
"""Latency histograms a :class:`Collector` holds before it sums them."""


class Collector:
    """Reads slots one at a time: the totals, and the rows to keep.

    Feeding it a slot at a time lets an async caller yield between slots.
    """

    def __init__(self, top: int | None) -> None:
        self._top = top
        self._kept: list[tuple[int, int, LiveSlot]] = []
        self._count = 0
        self._sent = self._responses = self._failures = self._cache_hits = 0
        self._backoffs = self._pauses = self._in_flight = self._queued = 0
        self._statuses: dict[int, int] = {}
        self._reasons: dict[str, int] = {}
        self._buckets = [0] * LATENCY_BUCKETS
        self._unsummed: list[list[int]] = []
        self._delay = 0.0

    def add(self, slot: LiveSlot) -> None:
        state = slot.state.counters
        gate = slot.gate
        self._count += 1
        self._sent += state.sent
        self._responses += state.responses
        self._failures += state.failures
        self._cache_hits += state.cache_hits
        self._backoffs += state.backoffs
        self._pauses += state.pauses
        self._in_flight += gate.in_flight()
        self._queued += gate.queued()
        if state.status_counts:
            statuses = self._statuses
            for status, count in state.status_counts.items():
                statuses[status] = statuses.get(status, 0) + count
        if state.backoff_reasons:
            reasons = self._reasons
            for reason, count in state.backoff_reasons.items():
                reasons[reason] = reasons.get(reason, 0) + count
        if state.latency_buckets:
            # a copy now, summed _SUM_EVERY at a time: 80 additions a slot in
            # Python were two thirds of stats(top=20)'s cost
            self._unsummed.append(state.latency_buckets[:])
            if len(self._unsummed) == _SUM_EVERY:
                self._sum_buckets()
        delay = slot.state.pace.delay
        if delay > self._delay:
            self._delay = delay
        entry = (state.sent, -self._count, slot)
        if self._top is None:
            self._kept.append(entry)
        elif len(self._kept) < self._top:
            heapq.heappush(self._kept, entry)
        elif self._top and entry[:2] > self._kept[0][:2]:
            heapq.heapreplace(self._kept, entry)

    def _sum_buckets(self) -> None:
        self._buckets = [sum(column) for column in zip(self._buckets, *self._unsummed, strict=True)]
        self._unsummed.clear()

    def result(self) -> ThrottleStats:
        self._sum_buckets()
        kept = sorted(self._kept, key=lambda entry: entry[:2], reverse=True)
        totals = SlotStats(
            "*",
            self._sent,
            self._responses,
            dict(self._statuses),
            self._failures,
            self._cache_hits,
            self._backoffs,
            dict(self._reasons),
            self._pauses,
            self._delay,
            self._in_flight,
            self._queued,
            *_percentiles(self._buckets),
        )
        return ThrottleStats([slot_stats(slot) for _, _, slot in kept], totals, self._count)


async def in_chunks(slots: Iterable[LiveSlot], chunk: int) -> AsyncIterator[LiveSlot]:
    """``slots``, yielding to the event loop after every ``chunk`` of them."""
    for index, slot in enumerate(slots):
        if index and index % chunk == 0:
            await anyio.lowlevel.checkpoint()
        yield slot


def collect(slots: Iterable[LiveSlot], top: int | None = None) -> ThrottleStats:
    """Figures for ``slots``: every row, or the ``top`` busiest by requests sent."""
    collector = Collector(top)
    for slot in slots:
        collector.add(slot)
    return collector.result()

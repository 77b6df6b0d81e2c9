"""Where a throttle keeps its slots.

The store is a seam: the throttle asks it for a slot by key and never holds a
slot table of its own, so another store (one that shares learned delays across
processes, say) can stand in without touching the scheduling code.

:class:`MemoryStore` keeps slots in a dict and forgets a slot that has been
idle (nothing queued, nothing in flight) for ``idle_timeout`` seconds, so a
crawl over millions of hosts does not grow without bound. A forgotten slot
loses what it learned: the next request to that key starts a fresh slot at
the start delay, and goes at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

from ._config import check_number
from ._slot import Slot

__all__ = ["MemoryStore", "SlotStore"]


@runtime_checkable
class SlotStore(Protocol):
    """The interface a slot store implements."""

    def get(self, key: str) -> Slot | None:
        """The slot for ``key`` if the store holds one."""
        ...

    def get_or_create(self, key: str, factory: Callable[[str], Slot]) -> Slot:
        """The slot for ``key``, made with ``factory(key)`` if there is none yet."""
        ...

    def __iter__(self) -> Iterator[Slot]:
        """Every slot held now."""
        ...

    def __len__(self) -> int: ...


class MemoryStore:
    """Slots in a dict of this process, with idle slots evicted.

    Args:
        idle_timeout: Seconds a slot may stay idle before it is forgotten
            (``math.inf`` keeps every slot forever). Eviction runs as new slots
            are created, at most once per ``idle_timeout / 2`` seconds, so its
            cost is amortised over many requests.
    """

    __slots__ = ("_last_sweep", "_slots", "idle_timeout")

    def __init__(self, idle_timeout: float = 600.0) -> None:
        if idle_timeout != math.inf:
            check_number("idle_timeout", idle_timeout, minimum=0.0)
        self.idle_timeout = float(idle_timeout)
        self._slots: dict[str, Slot] = {}
        self._last_sweep = -math.inf

    def get(self, key: str) -> Slot | None:
        return self._slots.get(key)

    def get_or_create(self, key: str, factory: Callable[[str], Slot]) -> Slot:
        slot = self._slots.get(key)
        if slot is None:
            slot = factory(key)
            self._maybe_evict(slot.last_activity)
            self._slots[key] = slot
        return slot

    def __iter__(self) -> Iterator[Slot]:
        return iter(list(self._slots.values()))

    def __len__(self) -> int:
        return len(self._slots)

    def evict_idle(self, now: float) -> int:
        """Forget every slot idle since before ``now - idle_timeout``; return how many."""
        cutoff = now - self.idle_timeout
        stale = [
            key for key, slot in self._slots.items() if slot.last_activity < cutoff and slot.idle
        ]
        for key in stale:
            del self._slots[key]
        self._last_sweep = now
        return len(stale)

    def _maybe_evict(self, now: float) -> None:
        if math.isfinite(self.idle_timeout) and now - self._last_sweep >= self.idle_timeout / 2:
            self.evict_idle(now)

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
from collections import OrderedDict
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
            (``math.inf`` keeps every slot forever). A slot is idle when nothing
            is queued or in flight and no pause or rate-limit budget is in force.

    Slots are kept in order of last use, so eviction looks only at the least
    recently used ones: each new slot evicts at most a few hundred stale ones,
    and no single request pays for a sweep of the whole table.
    """

    __slots__ = ("_slots", "idle_timeout")

    #: Stale slots one slot creation may evict: the cost is bounded per call.
    evict_batch = 256

    def __init__(self, idle_timeout: float = 600.0) -> None:
        if idle_timeout != math.inf:
            check_number("idle_timeout", idle_timeout, minimum=0.0)
        self.idle_timeout = float(idle_timeout)
        self._slots: OrderedDict[str, Slot] = OrderedDict()

    def get(self, key: str) -> Slot | None:
        return self._slots.get(key)

    def get_or_create(self, key: str, factory: Callable[[str], Slot]) -> Slot:
        slots = self._slots
        slot = slots.get(key)
        if slot is None:
            slot = factory(key)
            if math.isfinite(self.idle_timeout):
                self._evict(slot.last_activity, self.evict_batch)
            self._slots[key] = slot  # _evict may have rebuilt the table
        else:
            slots.move_to_end(key)
        return slot

    def __iter__(self) -> Iterator[Slot]:
        return iter(list(self._slots.values()))

    def __len__(self) -> int:
        return len(self._slots)

    def evict_idle(self, now: float) -> int:
        """Forget every slot idle since before ``now - idle_timeout``; return how many."""
        return self._evict(now, len(self._slots))

    def _evict(self, now: float, limit: int) -> int:
        cutoff = now - self.idle_timeout
        slots = self._slots
        evicted = 0
        looked = 0
        while slots and looked < limit:
            key, slot = next(iter(slots.items()))
            if slot.last_activity >= cutoff:
                break  # everything after it was used more recently
            looked += 1
            if slot.idle:
                del slots[key]
                evicted += 1
            else:
                slots.move_to_end(key)  # busy or paused: look again later
        if evicted and evicted * 2 > len(slots):
            # A dict never shrinks its table by itself; after a mass eviction
            # rebuild it so the memory goes back.
            self._slots = OrderedDict(slots)
        return evicted

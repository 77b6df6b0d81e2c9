"""The throttle's live slots, in order of last use, with idle ones forgotten.

A live slot is this process's :class:`~autothrottle._slot.LiveSlot`: its
learned record (kept in the store) and its gate (queue, leases). The table keeps them in
least-recently-used order so that forgetting idle slots only ever looks at the
oldest: each look is bounded (``evict_batch`` slots), so no single request
pays for a sweep of the whole table, and it happens both when a new slot is
made and, every ``_HIT_SWEEP`` uses, when a known one is used, so a crawl that
only revisits known hosts still forgets the stale ones.
"""

from __future__ import annotations

import math
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator

from ._slot import LiveSlot
from ._store import SlotStore

__all__ = ["SlotTable"]

_HIT_SWEEP = 256
"""Uses of known slots between two bounded looks for idle ones."""

_ATOMIC = getattr(sys, "_is_gil_enabled", lambda: True)()
"""Whether one operation on an ``OrderedDict`` is atomic (the GIL): a use of a
known slot then takes no lock. A free-threaded build takes it every time."""

_FREE_HITS = _HIT_SWEEP - 1 if _ATOMIC else 0
"""Uses of known slots in a row that take no lock (none without the GIL)."""


class SlotTable:
    """Live slots by key; makes missing ones with ``make(key)``."""

    __slots__ = ("_clock", "_hits", "_lock", "_make", "_slots", "evict_batch", "store")

    def __init__(
        self, store: SlotStore, make: Callable[[str], LiveSlot], clock: Callable[[], float]
    ) -> None:
        self.store = store
        self.evict_batch = 256
        self._make = make
        self._clock = clock
        self._slots: OrderedDict[str, LiveSlot] = OrderedDict()
        self._hits = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> LiveSlot | None:
        """The live slot for ``key``, if there is one (does not count as a use)."""
        return self._slots.get(key)

    def get_or_create(self, key: str) -> LiveSlot:
        """The live slot for ``key``, made on first use (thread-safe).

        A use of a known slot takes no lock (on every request, a lock taken and
        let go costs more than the rest): its lookup and its move to the end
        are each one atomic step; a slot forgotten between the two (the move
        finds no key) goes the locked way, which makes it anew. One forgotten
        just after is as one forgotten after the locked way returned it.
        Every ``_HIT_SWEEP``-th use goes the locked way, and looks for idle ones.

        Raises:
            TypeError: ``key`` is no non-empty str (checked before a slot is
                made: a known key was checked when its slot was made, so the
                use of a known slot asks nothing).
        """
        slots = self._slots
        try:
            slot = slots.get(key)
        except TypeError:  # unhashable: no key, said below
            slot = None
        if slot is not None and self._hits < _FREE_HITS:
            try:
                slots.move_to_end(key)
            except KeyError:
                pass
            else:
                self._hits += 1
                return slot
        if not isinstance(key, str) or not key:
            raise TypeError(f"key must be a non-empty str, got {key!r}")
        lock = self._lock
        lock.acquire()  # not `with`: on every request, it costs twice as much
        try:
            slots = self._slots
            slot = slots.get(key)
            if slot is not None:
                slots.move_to_end(key)
                self._hits += 1
                if self._hits >= _HIT_SWEEP:
                    self._hits = 0
                    if math.isfinite(self.store.idle_timeout):
                        self._evict(self._clock(), self.evict_batch)
                return slot
            slot = self._make(key)
            if math.isfinite(self.store.idle_timeout):
                self._evict(self._clock(), self.evict_batch)
            self._slots[key] = slot  # _evict may have rebuilt the table
            return slot
        finally:
            lock.release()

    def __iter__(self) -> Iterator[LiveSlot]:
        return iter(list(self._slots.values()))

    def __len__(self) -> int:
        return len(self._slots)

    def evict_idle(self) -> int:
        """Forget every slot idle for the store's ``idle_timeout``; return how many."""
        with self._lock:
            return self._evict(self._clock(), len(self._slots))

    def _evict(self, now: float, limit: int) -> int:
        cutoff = now - self.store.idle_timeout
        slots = self._slots
        evicted = 0
        looked = 0
        while slots and looked < limit:
            key, slot = next(iter(slots.items()))
            if slot.state.counters.last_activity >= cutoff:
                break  # everything after it was used more recently
            looked += 1
            if slot.gate.idle():
                del slots[key]
                self.store.discard(key)
                evicted += 1
            else:
                slots.move_to_end(key)  # busy or paused: look again later
        if evicted and evicted * 2 > len(slots):
            # A dict never shrinks its table by itself; after a mass eviction
            # rebuild it so the memory goes back.
            self._slots = OrderedDict(slots)
        return evicted

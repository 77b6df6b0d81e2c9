"""Where a throttle keeps what its slots learned.

The store is a seam: it holds one :class:`~autothrottle._state.SlotState`
record per slot key, plain data with no tickets, leases or clocks, so another
store (one that shares learned state across processes, or keeps it across
runs) can stand in without touching the scheduling code. The throttle's live
slots (queues, leases in flight) stay in the throttle's own table.

:class:`MemoryStore` keeps records in a dict of this process. The throttle
forgets a slot that has been idle (nothing queued or in flight, no pause or
budget in force) for the store's ``idle_timeout`` seconds and discards its
record too, so a crawl over millions of hosts does not grow without bound. A
forgotten slot loses what it learned: the next request to that key starts a
fresh slot at the start delay, and goes at once.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

from ._state import SlotState
from ._validate import check_number

__all__ = ["MemoryStore", "SlotStore"]


@runtime_checkable
class SlotStore(Protocol):
    """The interface a store of learned slot state implements.

    ``idle_timeout`` is how long an idle slot's record is worth keeping; the
    throttle forgets its live slot after that long too (a read-only property
    satisfies it, as a plain attribute does).
    """

    @property
    def idle_timeout(self) -> float:
        """Seconds an idle slot's record is worth keeping (``math.inf``: forever)."""
        ...

    def load(self, key: str) -> SlotState | None:
        """The record for ``key``, or None if the store has none."""
        ...

    def save(self, key: str, state: SlotState) -> None:
        """Keep ``state`` as the record for ``key``."""
        ...

    def discard(self, key: str) -> None:
        """Forget the record for ``key`` (no error if there is none)."""
        ...

    def __iter__(self) -> Iterator[str]:
        """The keys held now."""
        ...

    def __len__(self) -> int: ...


class MemoryStore:
    """Learned slot state in a dict of this process.

    Args:
        idle_timeout: Seconds a slot may stay idle before it is forgotten
            (``math.inf`` keeps every slot forever). A slot is idle when nothing
            is queued or in flight and no pause or rate-limit budget is in force.

    The records are the live slots' own state objects: saving one costs a dict
    assignment, and a change to a slot is in the store at once.
    """

    __slots__ = ("_most", "_records", "idle_timeout")

    def __init__(self, idle_timeout: float = 600.0) -> None:
        if idle_timeout != math.inf:
            check_number("idle_timeout", idle_timeout, minimum=0.0)
        self.idle_timeout = float(idle_timeout)
        self._records: dict[str, SlotState] = {}
        self._most = 0  # the most records held when one was discarded

    def load(self, key: str) -> SlotState | None:
        return self._records.get(key)

    def save(self, key: str, state: SlotState) -> None:
        self._records[key] = state

    def discard(self, key: str) -> None:
        """Forget ``key``'s record. A dict never shrinks its table by itself: once
        discards leave a quarter of the most it held, the table is rebuilt, so an
        evicted crawl's memory goes back (3.7 MiB after 100,000 slots)."""
        records = self._records
        size = len(records)
        if size > self._most:
            self._most = size
        records.pop(key, None)
        if size * 4 < self._most:
            self._records = dict(records)
            self._most = size

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._records))

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        return f"MemoryStore(idle_timeout={self.idle_timeout!r}, slots={len(self._records)})"

    def save_file(self, path: str | os.PathLike[str], *, now: float) -> None:
        """Write every record to ``path`` as JSON, so a later run starts from them.

        ``now`` is the throttle's clock (``time.monotonic()`` by default): times
        are written relative to it. The file is replaced atomically: the records
        go to a temporary file of its own in the same folder, which then takes
        the path's place, so a reader sees the old file or the new one, and
        saves from several threads or processes at once each succeed (the
        last one wins).

            store.save_file("learned.json", now=time.monotonic())
        """
        data = {key: state.to_dict(now) for key, state in list(self._records.items())}
        text = json.dumps({"autothrottle_slots": 1, "slots": data})
        target = Path(path)
        handle, temporary = tempfile.mkstemp(
            prefix=f".{target.name}.", suffix=".tmp", dir=target.parent
        )
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                file.write(text)
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, now: float, idle_timeout: float = 600.0
    ) -> MemoryStore:
        """A store holding the records :meth:`save_file` wrote (missing file: empty).

        Every field of every record is checked as it is read; the times are
        placed before ``now`` (the throttle's clock). A throttle that takes a
        record also holds it to its own bounds (``max_pause``, ``max_delay``):
        see ``docs/fleet.md``, "State files".

        Raises:
            ValueError: the file is not such a record file, or a field of a
                record is wrongly typed or out of bounds (names the path, the
                slot and the field). Nothing is loaded then.
        """
        store = cls(idle_timeout)
        target = Path(path)
        if not target.exists():
            return store
        try:
            document = json.loads(target.read_text())
        except (ValueError, RecursionError) as error:  # bad UTF-8 is a ValueError too
            raise ValueError(f"{str(path)!r} is not a slot state file: {error}") from error
        slots = document.get("slots") if isinstance(document, dict) else None
        if not isinstance(slots, dict):
            raise ValueError(f"{str(path)!r} is not a slot state file: no mapping of slots")
        for key, data in slots.items():
            try:
                store._records[key] = SlotState.from_dict(data, now)
            except (TypeError, ValueError) as error:
                raise ValueError(f"{str(path)!r}: slot {key!r}: {error}") from error
        return store

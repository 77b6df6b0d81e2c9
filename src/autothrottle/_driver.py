"""The waiting loop: the only place the engine awaits.

It parks a ticket in the gate's queue and sleeps until the gate says the
ticket may go, or until the gate wakes it because something it waits on
changed. anyio makes it work under asyncio and trio alike.

Cancellation is safe at the one await point: the ticket is granted inside
:meth:`Gate.try_acquire`, synchronously, so there is no moment at which a
hold has been granted to a task that has not yet seen it. A task cancelled
while waiting only has to leave the queue, which ``abandon`` does (and wakes
the next head if it was the head).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol, TypeVar, cast

import anyio

from ._gate import Gate, Hold

__all__ = ["wait_for_hold"]


class _Releasable(Hold, Protocol):
    def release(self) -> None: ...


H = TypeVar("H", bound=_Releasable)


async def wait_for_hold(gate: Gate, make: Callable[[float], H]) -> H:
    """Wait in ``gate``'s queue until granted; return ``make(grant_time)``."""
    ticket = gate.enqueue()
    try:
        while True:
            wait = gate.try_acquire(ticket, make)
            if ticket.hold is not None:
                return cast(H, ticket.hold)
            event = anyio.Event()
            ticket.wake = event.set
            if math.isinf(wait):
                await event.wait()
            else:
                with anyio.move_on_after(wait):
                    await event.wait()
    except BaseException:
        granted = gate.abandon(ticket)
        if granted is not None:
            cast(H, granted).release()
        raise

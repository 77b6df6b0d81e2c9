"""The waiting loop: the only place the engine awaits.

It parks a ticket in the slot's queue and sleeps until the slot says the
ticket may go, or until the slot wakes it because something it waits on
changed. anyio makes it work under asyncio and trio alike.

Cancellation is safe at the one await point: the ticket grants itself inside
:meth:`Slot._try_acquire`, synchronously, so there is no moment at which a
lease has been granted to a task that has not yet seen it. A task cancelled
while waiting only has to leave the queue, which ``_abandon`` does (and wakes
the next head if it was the head).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from ._slot import Lease, Slot
    from ._throttle import Throttle


async def wait_for_lease(slot: Slot, throttle: Throttle, adjust: bool) -> Lease:
    ticket = slot._enqueue()
    try:
        while True:
            wait = slot._try_acquire(ticket, throttle, adjust)
            if ticket.lease is not None:
                return ticket.lease
            event = anyio.Event()
            ticket.wake = event.set
            if math.isinf(wait):
                await event.wait()
            else:
                with anyio.move_on_after(wait):
                    await event.wait()
    except BaseException:
        slot._abandon(ticket)
        raise

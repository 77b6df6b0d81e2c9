"""The waiting loops: the only places the engine waits.

:func:`wait_for_hold` parks a ticket in the gate's queue and sleeps until the
gate says the ticket may go, or until the gate wakes it because something it
waits on changed. anyio makes it work under asyncio and trio alike.
:func:`wait_for_hold_blocking` does the same for a thread (the sync client).

Wake-ups may come from any thread: a lease released by another thread or by
another event loop's task. The async waker therefore sets the event directly
only from the waiting loop's own thread, and otherwise hands the wake-up to
that loop thread-safely. A waiter whose event loop was closed under it (never
cancelled) is dropped from the queue by the gate, so it cannot stall the slot.

Cancellation is safe at the one await point: the ticket is granted inside
:meth:`Gate.try_acquire`, synchronously, so there is no moment at which a
hold has been granted to a task that has not yet seen it. A task cancelled
while waiting only has to leave the queue, which ``abandon`` does (and wakes
the next head if it was the head).

A throttle on a :class:`Skipping` clock (``autothrottle.testing.VirtualClock``)
waits through :func:`wait_skipping` and :func:`wait_skipping_blocking`
instead: the same loop, but a wait is a short real pause after which the
clock may jump to the end of it, so a test runs through a throttle at once
while every decision is taken on the clock as it would have been.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, runtime_checkable

import anyio

from ._gate import Gate, Hold, Ticket
from ._request import Cost

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "Skipping",
    "running_loop",
    "wait_for_hold",
    "wait_for_hold_blocking",
    "wait_skipping",
    "wait_skipping_blocking",
]


class _Releasable(Hold, Protocol):
    def release(self) -> None: ...


H = TypeVar("H", bound=_Releasable)


@runtime_checkable
class Skipping(Protocol):
    """A clock that may jump to the end of a wait rather than be waited out.

    The driver calls :meth:`expect` with the clock time a waiter's turn (or its
    ``max_wait``) comes, pauses ``idle`` real seconds so that every other
    waiter may say when its own comes, then :meth:`skip`; :meth:`done` when it
    leaves, with the clock seconds it waited if it got its turn. A clock that
    jumps wakes the other waiters (the gates' tickets: their ``wake``), so
    that none sleeps past a turn the jump reached.
    """

    idle: float

    def __call__(self) -> float: ...

    def attach(self, throttle: object) -> None: ...

    def expect(self, waiter: object, deadline: float) -> None: ...

    def skip(self, waiter: object) -> None: ...

    def done(self, waiter: object, key: str, waited: float | None) -> None: ...


def _first_running_loop() -> asyncio.AbstractEventLoop:
    """``asyncio.get_running_loop`` once asyncio is imported; until then, no loop.

    A thread's user (the requests adapter, a sync httpx client) runs no event
    loop, and importing asyncio would cost its import of the library more than
    the driver itself. With no asyncio imported, no asyncio loop can be
    running: the answer is asyncio's own ``RuntimeError``, without importing
    it. Once imported (by the program, or an event loop of anyio's), the first
    call puts asyncio's function in this one's place as :data:`running_loop`,
    so that later calls call it directly.
    """
    global running_loop
    if "asyncio" not in sys.modules:
        raise RuntimeError("no running event loop")
    from asyncio import get_running_loop

    running_loop = get_running_loop
    return get_running_loop()


running_loop: Callable[[], asyncio.AbstractEventLoop] = _first_running_loop
"""``asyncio.get_running_loop`` once asyncio is imported. Read it as
``_driver.running_loop`` (never imported by name: the name changes)."""


def _loop_waker(ticket: Ticket) -> Callable[[anyio.Event], None]:
    """Point ``ticket`` at the current loop; return how to arm it for one event."""
    thread = threading.get_ident()
    try:
        loop = running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        schedule: Callable[[Callable[[], object]], object] = loop.call_soon_threadsafe
        ticket.alive = lambda: not loop.is_closed()
    else:  # trio: it cancels every task before its run ends, so no alive check
        trio: Any = sys.modules["trio"]
        schedule = trio.lowlevel.current_trio_token().run_sync_soon

    def arm(event: anyio.Event) -> None:
        set_event = event.set

        def wake() -> None:
            if threading.get_ident() == thread:
                set_event()
            else:
                schedule(set_event)

        ticket.wake = wake

    return arm


def wait_for_hold(
    gate: Gate, make: Callable[[float], H], cost: Cost | None = None
) -> Coroutine[Any, Any, H]:
    """Wait in ``gate``'s queue until granted; return ``make(grant_time)``.

    ``cost``: the request's weight in tokens, if it has one. Under asyncio the
    wait is a future the gate's wake-up or a timer of the loop resolves: an
    anyio cancel scope per wait costs several times as much (trio's wait is
    anyio's).
    """
    try:
        loop = running_loop()
    except RuntimeError:
        return _wait_anyio(gate, make, cost)
    return _wait_on_loop(gate, make, cost, loop)


_LEAST_WAIT = 1e-6
"""The shortest timer a waiter of an asyncio loop sets, in seconds."""


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _LoopWaker:
    """Wakes a waiter of an asyncio loop from any thread: it resolves the
    future the waiter awaits now (thread-safely, from another thread)."""

    __slots__ = ("future", "loop", "thread")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.thread = threading.get_ident()
        self.future: asyncio.Future[None] | None = None

    def __call__(self) -> None:
        future = self.future
        if future is None:
            return
        if threading.get_ident() == self.thread:
            _resolve(future)
        else:
            self.loop.call_soon_threadsafe(_resolve, future)

    def alive(self) -> bool:
        return not self.loop.is_closed()


async def _wait_on_loop(
    gate: Gate, make: Callable[[float], H], cost: Cost | None, loop: asyncio.AbstractEventLoop
) -> H:
    ticket = gate.enqueue(cost)
    try:
        waker = _LoopWaker(loop)
        ticket.wake = waker
        ticket.alive = waker.alive
        while True:
            # Before the check, so a wake-up during it is not lost.
            future = waker.future = loop.create_future()
            wait = gate.try_acquire(ticket, make)
            if ticket.hold is not None:
                return cast(H, ticket.hold)
            if math.isinf(wait):
                await future
            else:
                # At least a microsecond: a wait of a float's rounding (1e-17 s)
                # would be due at once, and a loop whose time moves only when
                # it is idle (looptime, a virtual clock) would never move on.
                timer = loop.call_later(max(wait, _LEAST_WAIT), _resolve, future)
                try:
                    await future
                finally:
                    timer.cancel()
    except BaseException:
        granted = gate.abandon(ticket)
        if granted is not None:
            cast(H, granted).release()
        raise


async def _wait_anyio(gate: Gate, make: Callable[[float], H], cost: Cost | None) -> H:
    ticket = gate.enqueue(cost)
    try:
        arm = _loop_waker(ticket)
        while True:
            event = anyio.Event()
            arm(event)  # before the check, so a wake-up during it is not lost
            wait = gate.try_acquire(ticket, make)
            if ticket.hold is not None:
                return cast(H, ticket.hold)
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


def wait_for_hold_blocking(
    gate: Gate, make: Callable[[float], H], timeout: float | None = None, cost: Cost | None = None
) -> H:
    """:func:`wait_for_hold` for a thread: block until granted.

    Raises:
        TimeoutError: not granted within ``timeout`` seconds (nothing is held).
    """
    ticket = gate.enqueue(cost)
    event = threading.Event()
    ticket.wake = event.set
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    try:
        while True:
            event.clear()
            wait = gate.try_acquire(ticket, make)
            if ticket.hold is not None:
                return cast(H, ticket.hold)
            left = deadline - time.monotonic()
            if left <= 0.0:
                raise TimeoutError
            wait = min(wait, left)
            event.wait(None if math.isinf(wait) else wait)
    except BaseException:
        granted = gate.abandon(ticket)
        if granted is not None:
            cast(H, granted).release()
        raise


def _turn_at(gate: Gate, now: float, wait: float, give_up: float) -> tuple[float, bool]:
    """When a waiter's turn ``wait`` seconds away comes on a skipping clock, or
    its bound ``give_up`` if sooner (inf: when woken), and whether the clock may
    jump there.

    Not while the slot is at its cap: its head waits for a release or for the
    soonest hold's expiry (the wait the gate gives), in real time; a slot at its
    cap has a request in flight, which holds every jump back, and once that
    hold expires the turn is free, so a jump decided before it expired would
    pass over the free turn. It still says when, as every waiter with a bound
    does (one behind the head too, whose turn is only known once it is the
    head): no other waiter's jump, once nothing is in flight, may pass over a
    turn or a ``max_wait`` still to come, which would then time out late on
    the clock."""
    deadline = min(now + wait, give_up)
    if math.isinf(deadline):
        return deadline, False
    return deadline, math.isinf(wait) or gate.in_flight() < gate.cap()


async def wait_skipping(
    gate: Gate,
    make: Callable[[float], H],
    clock: Skipping,
    key: str,
    cost: Cost | None = None,
    bound: float | None = None,
) -> H:
    """:func:`wait_for_hold` on a :class:`Skipping` clock; ``bound`` on that clock.

    Raises:
        TimeoutError: not granted within ``bound`` clock seconds (nothing is held).
    """
    ticket = gate.enqueue(cost)
    started = clock()
    give_up = math.inf if bound is None else started + bound
    waited = None
    idled = False  # the last pause ran out: jump, by a deadline asked afresh
    try:
        arm = _loop_waker(ticket)
        while True:
            event = anyio.Event()
            arm(event)
            wait = gate.try_acquire(ticket, make)
            if ticket.hold is not None:
                waited = clock() - started
                return cast(H, ticket.hold)
            now = clock()
            if now >= give_up:
                raise TimeoutError
            deadline, jump = _turn_at(gate, now, wait, give_up)
            clock.expect(ticket, deadline)
            if not jump:  # woken, or at the soonest hold's expiry, in real time
                idled = False
                with anyio.move_on_after(deadline - now):
                    await event.wait()
                continue
            if idled:
                idled = False
                clock.skip(ticket)
                continue
            with anyio.move_on_after(min(deadline - now, clock.idle)):
                await event.wait()
            idled = not event.is_set()
    except BaseException:
        granted = gate.abandon(ticket)
        if granted is not None:
            cast(H, granted).release()
        raise
    finally:
        clock.done(ticket, key, waited)


def wait_skipping_blocking(
    gate: Gate,
    make: Callable[[float], H],
    clock: Skipping,
    key: str,
    cost: Cost | None = None,
    bound: float | None = None,
) -> H:
    """:func:`wait_skipping` for a thread."""
    ticket = gate.enqueue(cost)
    event = threading.Event()
    ticket.wake = event.set
    started = clock()
    give_up = math.inf if bound is None else started + bound
    waited = None
    idled = False
    try:
        while True:
            event.clear()
            wait = gate.try_acquire(ticket, make)
            if ticket.hold is not None:
                waited = clock() - started
                return cast(H, ticket.hold)
            now = clock()
            if now >= give_up:
                raise TimeoutError
            deadline, jump = _turn_at(gate, now, wait, give_up)
            clock.expect(ticket, deadline)
            if not jump:  # woken, or at the soonest hold's expiry, in real time
                idled = False
                event.wait(None if math.isinf(deadline) else deadline - now)
                continue
            if idled:
                idled = False
                clock.skip(ticket)
            else:
                idled = not event.wait(min(deadline - now, clock.idle))
    except BaseException:
        granted = gate.abandon(ticket)
        if granted is not None:
            cast(H, granted).release()
        raise
    finally:
        clock.done(ticket, key, waited)

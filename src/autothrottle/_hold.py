"""A request's hold of its lease until its response is finished or collected.

Rule 5 of the request lifecycle (``docs/adapters.md``, and ``_exchange``'s
docstring): the lease is released when the body is finished or the response
closed, its connection lost, or the response dropped unread. The first few are
the adapters' to see; the last is this module's: :func:`watch` makes the hold a
weak reference to the response's owner, and :func:`release_later` serves an
adapter's own finalizer. Either way a release the garbage collector caused is
deferred, since the collector may run inside the gate's lock.

It knows nothing of the exchange, only a :class:`~autothrottle._lease.Lease`,
and the exchange nothing of it: the two sit side by side, and the adapters
import each for its own part.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, cast

from . import _driver
from ._lease import Lease

__all__ = ["Watch", "release_later", "watch"]


_Schedule = Callable[[Callable[[], None]], object]


def _scheduler() -> _Schedule | None:
    """A thread-safe way to run a callback soon on the current event loop
    (asyncio or trio), or None in a thread with no loop."""
    try:
        return _driver.running_loop().call_soon_threadsafe
    except RuntimeError:
        pass
    trio: Any = sys.modules.get("trio")
    if trio is not None:
        try:
            return cast(_Schedule, trio.lowlevel.current_trio_token().run_sync_soon)
        except RuntimeError:
            pass
    return None


_WATCHED: set[weakref.ref[Any]] = set()
"""The weak references of the holds not yet released: a reference must outlive
everything but its owner for its callback to run, as ``weakref.finalize``
keeps its own; a plain reference in a set costs a fraction of one."""


def _release_soon(lease: Lease, schedule: _Schedule | None) -> None:
    """Release ``lease`` soon, not now: on the loop of ``schedule``, or in a
    short-lived thread (the collector may have run inside the gate's lock)."""
    if lease.released:
        return
    try:
        if schedule is not None:
            schedule(lease.release)
        else:
            threading.Thread(target=lease.release, name="autothrottle-release").start()
    except RuntimeError:  # the loop is closed, or the interpreter is shutting down
        lease.release()


def release_later(lease: Lease) -> None:
    """Release ``lease`` soon, not now: for a finalizer of an adapter's own
    object that holds it (httpx's response stream), whose owner was collected
    unreleased. As for :func:`watch`'s hold, the collector may have run inside
    the gate's lock: on this thread's event loop, or a short-lived thread."""
    _release_soon(lease, _scheduler())


class Watch(weakref.ref):  # type: ignore[type-arg]
    """Holds a request's lease until its response is finished, or collected: a
    weak reference to the owner (the object whose life is the response's) that
    is the hold itself, made by :func:`watch`.

    The adapter calls :meth:`release` when the body is finished or the
    response closed. If the owner is garbage-collected first, the lease is
    released too. The collector may run in the middle of any code, the slot's
    own bookkeeping included (on this very thread, inside the gate's lock), so
    a release caused by it is deferred: to the event loop the hold was made
    on, or, made in a thread with no loop, to a short-lived thread that waits
    its turn for the lock; a later :meth:`release` does nothing.
    ``hold_timeout`` bounds anything else. One object, made without a frame of
    ours: the adapters make one for every held response.
    """

    __slots__ = ("lease", "schedule")

    lease: Lease | None
    schedule: _Schedule | None

    def release(self) -> None:
        """The response is finished: release now (idempotent)."""
        lease = self.lease
        if lease is not None:
            self.lease = None
            _WATCHED.discard(self)
            lease.release()


def watch(owner: object, lease: Lease) -> Watch:
    """Hold ``lease`` until the returned :class:`Watch` is released, or
    ``owner`` collected. ``owner`` must not refer to ``lease`` but through it."""
    ref = Watch(owner, _on_watch_collected)
    ref.lease = lease
    try:  # _scheduler's first answer, without its call
        ref.schedule = _driver.running_loop().call_soon_threadsafe
    except RuntimeError:
        ref.schedule = _scheduler()
    _WATCHED.add(ref)
    return ref


def _on_watch_collected(ref: Watch) -> None:
    _WATCHED.discard(ref)
    lease = ref.lease
    if lease is not None:
        ref.lease = None
        _release_soon(lease, ref.schedule)

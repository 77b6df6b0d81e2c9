"""Run code through a throttle in a test without waiting out its delays.

A :class:`VirtualClock` given to a :class:`~autothrottle.Throttle` as its
clock makes the throttle skip its waits: when a request would wait for its
turn, the clock jumps to that turn instead, so a crawl that would take
minutes runs in milliseconds, and every decision (which request goes when,
each delay, backoff, pause and ``Retry-After``) is taken on the clock as it
would have been. What the throttle did is then there to assert on: the clock's
:attr:`~VirtualClock.waits` (each turn waited for, and how long) and
:attr:`~VirtualClock.skipped`, and the throttle's own ``stats()``::

    from autothrottle import FixedDelayPolicy, Throttle
    from autothrottle.httpx import AsyncThrottledClient
    from autothrottle.testing import VirtualClock

    clock = VirtualClock()
    throttle = Throttle(policy=FixedDelayPolicy(1.0), clock=clock)
    async with AsyncThrottledClient(throttle=throttle) as client:
        await asyncio.gather(*(client.get(url) for url in urls))   # 10 URLs of one host
    assert clock.waited() == pytest.approx(9.0, abs=0.1)         # 9 gaps of 1 s
    assert throttle.stats().totals.sent == 10

It works with every client (httpx async and sync, aiohttp, requests), under
asyncio, trio and threads, against a loopback server (``autothrottle.sim``,
an ``aiohttp.web`` test server) or respx. Not aioresponses: it replaces
aiohttp's request outside the session's middlewares, so nothing it mocks
reaches the throttle (``docs/compose.md``). The rules of the jump:

- the clock is the real monotonic clock plus the time skipped: the time the
  code really takes (a response's latency included) still counts;
- the clock jumps only when no request of the throttle is on the wire (so a
  response's latency is never stretched by a jump) and only to the soonest
  turn of all the requests waiting (so no host's turn is passed over); each
  waiter first gives the others ``idle`` real seconds to say when theirs is,
  and a jump wakes the others, so none takes a turn the jump reached late;
- a ``max_wait`` (the throttle's, a request's, httpx's pool timeout) is
  counted on the clock too: a request that would have timed out still does.

Time that is not the throttle's is not skipped: your own ``asyncio.sleep``,
a client's timeouts, a Redis store's turns, and the short wait some requests
take for their turn on the wire after a connection was set up (milliseconds).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._throttle import Throttle

__all__ = ["VirtualClock", "Wait"]


@dataclass(frozen=True, slots=True)
class Wait:
    """One request's wait for its turn, as the throttle took it.

    Attributes:
        slot: The slot key (by default the host).
        seconds: Clock seconds from asking for the turn to getting it.
        at: The clock time the turn came.
    """

    slot: str
    seconds: float
    at: float


class VirtualClock:
    """A monotonic clock that skips a throttle's waits instead of sleeping them.

    Pass it as ``Throttle(clock=VirtualClock())``; one clock serves one
    throttle or several (they then share its time). Thread-safe.

    Args:
        idle: Real seconds a waiting request lets pass before the clock may
            jump to its turn: time for the other tasks and threads to run
            and ask for theirs. Raise it if your code does real work between
            requests (a jump before that work asks for its turn sends it late).
    """

    def __init__(self, *, idle: float = 0.001) -> None:
        if isinstance(idle, bool) or not isinstance(idle, (int, float)):
            raise TypeError(f"idle must be a number of seconds, got {idle!r}")
        if not 0.0 <= idle <= 1.0 or math.isnan(idle):
            raise ValueError(f"idle must be within [0, 1] seconds, got {idle!r}")
        self.idle = float(idle)
        self._lock = threading.Lock()
        self._skipped = 0.0
        self._deadlines: dict[int, tuple[float, object]] = {}
        self._waits: list[Wait] = []
        self._throttles: list[Throttle] = []

    def __call__(self) -> float:
        """Now: the real monotonic time plus every second skipped so far."""
        return time.monotonic() + self._skipped

    def __repr__(self) -> str:
        return f"VirtualClock(skipped={self._skipped:.3f}, waits={len(self._waits)})"

    @property
    def skipped(self) -> float:
        """Seconds the clock jumped over in all: the time the throttle saved the test."""
        return self._skipped

    @property
    def waits(self) -> list[Wait]:
        """Every request that waited for its turn, in the order the turns came.

        A request whose turn was free at once is not listed (the throttle's
        ``stats()`` counts every request sent).
        """
        with self._lock:
            return list(self._waits)

    def waited(self, slot: str | None = None) -> float:
        """Clock seconds the requests waited for their turns, in all or for ``slot``."""
        return math.fsum(w.seconds for w in self.waits if slot is None or w.slot == slot)

    def advance(self, seconds: float) -> None:
        """Move the clock on by hand: let a pause or an idle spell pass.

        Every request waiting is woken to look at the clock again, as by a jump.

        Raises:
            ValueError: ``seconds`` is negative or not finite.
        """
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"seconds must be a number, got {seconds!r}")
        if not 0.0 <= seconds < math.inf:
            raise ValueError(f"seconds must be >= 0 and finite, got {seconds!r}")
        with self._lock:
            self._skipped += seconds
            waiters = [waiter for _, waiter in self._deadlines.values()]
        _wake(waiters)

    # -- what the throttle calls ---------------------------------------------------------

    def attach(self, throttle: object) -> None:
        """A throttle reads this clock: its requests on the wire hold the jumps back."""
        from ._throttle import check_throttle

        checked = check_throttle(throttle, "VirtualClock.attach")
        with self._lock:
            self._throttles.append(checked)

    def expect(self, waiter: object, deadline: float) -> None:
        """``waiter``'s turn comes at ``deadline`` (clock time; inf: when woken)."""
        with self._lock:
            if math.isinf(deadline):
                self._deadlines.pop(id(waiter), None)
            else:
                self._deadlines[id(waiter)] = (deadline, waiter)

    def skip(self, waiter: object) -> None:
        """Jump to ``waiter``'s turn if it is the soonest and nothing is on the wire.

        A jump wakes every other waiter that said when its turn comes: each
        sleeps up to ``idle`` at a time, and one whose turn (or ``max_wait``)
        the jump reached would otherwise take it only when it woke, late on
        the clock by as much.
        """
        if self._on_the_wire():
            return
        with self._lock:
            mine = self._deadlines.get(id(waiter))
            if mine is None or mine[0] > min(d for d, _ in self._deadlines.values()):
                return
            now = self()
            if mine[0] <= now:
                return
            self._skipped += mine[0] - now
            others = [w for key, (_, w) in self._deadlines.items() if key != id(waiter)]
        _wake(others)

    def done(self, waiter: object, key: str, waited: float | None) -> None:
        """``waiter`` leaves: with its turn after ``waited`` seconds, or without one (None)."""
        with self._lock:
            self._deadlines.pop(id(waiter), None)
            if waited is not None:
                self._waits.append(Wait(key, waited, self()))

    def _on_the_wire(self) -> bool:
        """Whether any request of the throttles reading this clock is in flight."""
        with self._lock:
            throttles = list(self._throttles)
        return any(throttle.stats().totals.in_flight for throttle in throttles)


def _wake(waiters: list[object]) -> None:
    """Let each of ``waiters`` (the gates' tickets) look at the clock again now.

    A wake-up the waiter did not need costs it one more look: it asks for its
    turn, and says again when it comes. One whose event loop has closed will
    not run again: there is nothing to wake.
    """
    for waiter in waiters:
        wake = getattr(waiter, "wake", None)
        if wake is None:
            continue
        with contextlib.suppress(RuntimeError):  # its loop is closed
            wake()

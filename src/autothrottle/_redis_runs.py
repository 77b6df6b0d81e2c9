"""A process's runs of turns on the store's side (rule 8): what a request is
served from the turns this process reserved ahead, and the line behind a
slot's one ask on its way to Redis.

:class:`Runs` is :class:`~autothrottle.redis.RedisStore`'s, and the only writer
of what it keeps per slot: the :class:`~autothrottle._fleet.Run`, the requests
waiting behind the slot's ask (:class:`Behind`), and the fleet's pauses and
stated paces heard for the slots it takes turns of (rules 2 and 8), which void
a run. The event loop and
the sync client's threads share them, under one lock. It speaks no protocol:
the store's ask is a callable it is given with each turn, and the turns no
request took go back through the callable it was made with.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Awaitable, Callable

from ._fleet import LATE_MOST, Run, SharedTurn, TurnAsk, narrower_than_stated
from ._redis_parts import ASK_AGAIN

__all__ = ["Asked", "AskedBlocking", "Behind", "Runs"]

Ready = SharedTurn | tuple[int, float]
"""What a request is served: a turn or a wait, or ``(turns, room)``: the slot's
next ask, its own to make."""

Asked = Callable[[str, TurnAsk, float, tuple[int, float], Run], Awaitable[SharedTurn]]
"""The store's one ask of a slot, for a run of ``turns`` turns with ``room`` after it."""

AskedBlocking = Callable[[str, TurnAsk, float, tuple[int, float], Run], SharedTurn]
""":data:`Asked` for a thread."""


class Behind:
    """A request of this process waiting behind another's ask for the same slot
    (rule 8: one reservation in flight per process), and what it is served
    when that answer comes (set under the runs' lock): a turn or a wait
    (:class:`SharedTurn`), or ``(turns, room)``, the slot's next ask, its own.
    It is woken through a future on its event loop, or an event for a thread
    (the sync client); another thread serving an async request wakes it
    through its loop."""

    __slots__ = ("ask", "loop", "served", "wake")

    def __init__(self, ask: TurnAsk, loop: asyncio.AbstractEventLoop | None) -> None:
        self.ask = ask
        self.loop = loop
        self.served: Ready | None = None
        self.wake: asyncio.Future[None] | threading.Event = (
            threading.Event() if loop is None else loop.create_future()
        )

    def serve(self, served: Ready) -> None:
        self.served = served
        wake = self.wake
        if isinstance(wake, threading.Event):
            wake.set()
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            _woken(wake)
        elif self.loop is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                self.loop.call_soon_threadsafe(_woken, wake)


def _woken(wake: asyncio.Future[None]) -> None:
    if not wake.done():  # (a request given up meanwhile cancelled it)
        wake.set_result(None)


class Runs:
    """This process's runs of every slot it takes turns of, and the requests
    behind each slot's ask.

    Args:
        unused: Hands back turns of a slot no request took: ``(key, gap,
            leases)``, the latest reserved first (the store sends them).
    """

    def __init__(self, unused: Callable[[str, float, list[str]], None]) -> None:
        self._unused = unused
        self._runs: dict[str, Run] = {}
        self._lock = threading.Lock()
        # The fleet's pauses other processes set, heard (rule 2): the slot's end (on
        # time.monotonic's clock) and Redis's stamp of it, until a request adopts it.
        self._heard: dict[str, tuple[float, str]] = {}
        # The paces hosts stated to other processes, heard (rule 8): the slot's
        # gap and its end (on time.monotonic's clock).
        self._stated: dict[str, tuple[float, float]] = {}
        # What :attr:`turns` counts: the turns taken from a run (no round trip),
        # and the slots' asks Redis answered (a turn, a pause, the cap).
        self._taken = 0
        self._answers = 0

    async def take_turn(
        self, key: str, ask: TurnAsk, now: float, left: float, asked: Asked
    ) -> SharedTurn:
        """The request's turn (rule 8): a turn of the slot's run, or what it is
        served behind another request's ask (waited at most ``left``
        seconds), or ``asked``'s answer, the slot's one ask, which then serves
        the requests behind it."""
        run, ready = self._from_run(key, ask, asyncio.get_running_loop())
        if isinstance(ready, Behind):
            started = time.monotonic()
            ready = await self._behind(key, run, ready, left)
            now += time.monotonic() - started
        if isinstance(ready, SharedTurn):
            return ready
        try:
            turn = await asked(key, ask, now, ready, run)
        except BaseException:
            self._serve(key, run)
            raise
        self._serve(key, run, turn)
        return turn

    def take_turn_blocking(
        self, key: str, ask: TurnAsk, now: float, left: float, asked: AskedBlocking
    ) -> SharedTurn:
        """:meth:`take_turn` for a thread."""
        run, ready = self._from_run(key, ask, None)
        if isinstance(ready, Behind):
            started = time.monotonic()
            ready = self._behind_blocking(run, ready, left)
            now += time.monotonic() - started
        if isinstance(ready, SharedTurn):
            return ready
        try:
            turn = asked(key, ask, now, ready, run)
        except BaseException:
            self._serve(key, run)
            raise
        self._serve(key, run, turn)
        return turn

    @property
    def turns(self) -> int:
        """Turns taken through the fleet so far: Redis's answers to the slots'
        asks (:meth:`answered`) and the turns taken from runs."""
        with self._lock:
            return self._answers + self._taken

    def answered(self) -> None:
        """Redis answered a slot's ask. Counted under the lock the turns taken
        from runs are counted under: the sync client's threads answer the asks
        of different slots at the same time, and a count of them kept apart,
        unlocked, could lose one."""
        with self._lock:
            self._answers += 1

    def reserved(
        self,
        key: str,
        run: Run,
        dues: list[float],
        leases: list[str],
        *,
        spacing: float,
        delay: float | None,
        senders: int,
        slack: float,
        free: int,
        at: float = -math.inf,
        asked: float = -math.inf,
    ) -> None:
        """The slot's ask reserved a run (:meth:`Run.reserved`), ``free`` leases
        left under the fleet's cap after it, at ``at`` on Redis's clock (µs),
        asked for at ``asked`` (the throttle's clock)."""
        with self._lock:
            # The slot's run (forgotten and taken again meanwhile: the new one's).
            run = self._runs.setdefault(key, run)
            run.reserved(dues, leases, spacing, delay, senders, slack, free, at, asked)

    def get(self, key: str) -> Run | None:
        """The slot's run, read without the lock (a hint: what it held at its last turn)."""
        return self._runs.get(key)

    def void(self, key: str) -> None:
        """The slot's answer was a pause (rule 2): the turns reserved before it are void."""
        with self._lock:
            run = self._runs.get(key)
            stale = [] if run is None else run.drop()
            spacing = 0.0 if run is None else run.spacing
        self._hand_back(key, stale, spacing)

    def heard(self, key: str, end: str, until: float) -> None:
        """Another process paused the slot until ``until`` (``end`` on Redis's
        clock): the turns this process reserved ahead and no request took are
        void and go back (rule 2); a request waiting for its turn finds the
        pause when its turn is due (:meth:`told`). A slot this process takes
        no turns of is none of its business."""
        if until <= time.monotonic():
            return
        with self._lock:
            run = self._runs.get(key)
            if run is None:
                return
            previous = self._heard.get(key)
            if previous is None or until > previous[0]:
                self._heard[key] = (until, end)
            stale, spacing = run.drop(), run.spacing
        self._hand_back(key, stale, spacing)

    def stated(self, key: str, gap: float, until: float, told: float = math.inf) -> None:
        """Another process heard the slot's host state a pace of one send per
        ``gap`` seconds until ``until``, beginning or wider than before, merged
        into the store at ``told`` (µs on Redis's clock): a run of this
        process's reserved before that, narrower than the pace, is void (rule
        8), its turns no request took go back, and a request holding one finds
        the pace at its due time (:meth:`stated_gap`). A run reserved after the
        merge was spaced by the pace already, cut to what was left of it.

        A slot this process takes no turns of is none of its business: it
        holds no turn to void, and each turn it reserves after this reaches
        the store after the merge that told it, which spaces it by the pace. A
        run whose answer comes after this is the slot's run already (made as
        the slot's first request asked): the pace is kept, and that run, if
        reserved before the merge, is void at its due."""
        if until <= time.monotonic():
            return
        with self._lock:
            run = self._runs.get(key)
            if run is None:
                return
            self._stated[key] = (gap, until)
            # As the store floors a run by it (rule 1): cut to what is left of it
            # and to the asker's max_pause. Near the pace's end a run reserved
            # after the merge is spaced by less than the whole gap, as the pace
            # asks, and is none of this: Redis's clock tells, not the mapping of
            # the message's end onto this process's clock.
            held = min(gap, until - time.monotonic(), run.longest)
            narrower = run.reserved_at < told and narrower_than_stated(run.spacing, held)
            stale, spacing = (run.drop() if narrower else []), run.spacing
        self._hand_back(key, stale, spacing)

    def stated_gap(self, key: str) -> float:
        """What is left of the gap another process heard the slot's host state
        (:meth:`stated`) as the next send would keep it (0.0: none holds)."""
        if not self._stated:
            return 0.0
        held = self._stated.get(key)
        if held is None:
            return 0.0
        gap, until = held
        left = until - time.monotonic()
        if left <= 0.0:
            with self._lock:
                if self._stated.get(key) == held:
                    del self._stated[key]
            return 0.0
        return min(gap, left)

    def told(self, key: str) -> tuple[float, str] | None:
        """The pause heard for the slot since its last answer, ``(until, end)``
        (:meth:`heard`), told once: the asker adopts it."""
        if not self._heard:
            return None
        return self._heard.pop(key, None)

    def idle(self, key: str) -> None:
        """No request of this process is left for the slot: its run's rest goes back."""
        with self._lock:
            run = self._runs.get(key)
            if run is None or not len(run):
                return
            leases = run.drop()
        self._hand_back(key, leases, run.spacing)

    def late(self, key: str, lease: str) -> None:
        """A turn reached after its slack goes back, its time too when it was the
        latest reserved (rule 1)."""
        with self._lock:
            run = self._runs.get(key)
            spacing = 0.0 if run is None else run.spacing
        self._hand_back(key, [lease], spacing)

    def forget(self, key: str) -> None:
        """The slot is forgotten here: its run's rest goes back, its heard pause goes."""
        with self._lock:
            run = self._runs.pop(key, None)
            self._heard.pop(key, None)
            self._stated.pop(key, None)
        if run is not None:
            self._hand_back(key, run.drop(), run.spacing)

    def drop(self) -> None:
        """Hand back every turn reserved and not taken (closing: nothing will take them)."""
        with self._lock:
            runs, self._runs = self._runs, {}
        for key, run in runs.items():
            self._hand_back(key, run.drop(), run.spacing)

    # -- a request's place: from the run, or behind the slot's ask ---------------------

    def _from_run(
        self, key: str, ask: TurnAsk, loop: asyncio.AbstractEventLoop | None
    ) -> tuple[Run, Ready | Behind]:
        """What the request does now (rule 8): the next turn of a run this process
        reserved, or the wait for its last reserved turn, or the run to ask the
        store for and the room to leave after it (it is then the slot's asking
        request), or, while another request of this process asks, its place
        behind that one (on ``loop``, or a thread's with None)."""
        received = time.monotonic()
        with self._lock:
            run = self._runs.get(key)
            if run is None:
                run = self._runs[key] = Run()
            run.longest = ask.max_pause
            then, stale = self._next(run, ask, received)
            ready: Ready | Behind
            if then is None:
                ready = Behind(ask, loop)
                run.behind.append(ready)
            else:
                ready = then
            spacing = run.spacing
        self._hand_back(key, stale, spacing)
        return run, ready

    def _next(
        self, run: Run, ask: TurnAsk, received: float, waited: bool = False
    ) -> tuple[Ready | None, list[str]]:
        """:meth:`Run.next` for a request asking with ``ask`` (under the lock;
        ``waited`` behind the slot's ask), and the stale leases to hand back."""
        gap = min(max(ask.gap, ask.min_gap), ask.max_gap)
        room = max(gap * (ask.margin - 1.0) + 2.0 * ask.late, LATE_MOST)
        then, stale = run.next(received, room, waited)
        if then is None:
            return None, stale
        if isinstance(then, int):
            return (then, run.room(received, gap)), stale
        delay, senders = run.delay, run.senders
        if isinstance(then, float):  # ask again when this process's last turn is due
            wait = max(then - received, ASK_AGAIN)
            return SharedTurn(wait, None, delay, 0.0, None, senders), stale
        due, lease, closes = then
        self._taken += 1
        wait = max(0.0, due - received)
        after = run.slack if closes else math.inf
        turn = SharedTurn(
            wait, lease, delay, 0.0, due, senders, True, closes, after, run.spacing, run.asked_at
        )
        return turn, stale

    async def _behind(self, key: str, run: Run, waiter: Behind, left: float) -> Ready:
        """Wait behind the slot's ask for what :meth:`_serve` serves, at most
        ``left`` seconds; given up meanwhile, the request holds nothing."""
        assert isinstance(waiter.wake, asyncio.Future)
        try:
            async with asyncio.timeout(left if left < math.inf else None):
                await waiter.wake
        except TimeoutError:
            pass
        except BaseException:
            self._unserve(key, run, waiter)
            raise
        return self._waited(run, waiter)

    def _behind_blocking(self, run: Run, waiter: Behind, left: float) -> Ready:
        """:meth:`_behind` for a thread."""
        assert isinstance(waiter.wake, threading.Event)
        waiter.wake.wait(min(left, threading.TIMEOUT_MAX) if left < math.inf else None)
        return self._waited(run, waiter)

    def _waited(self, run: Run, waiter: Behind) -> Ready:
        """What the request behind the slot's ask was served; nothing yet when
        its ``max_wait`` ended: out of the line, it gets a wait no bound allows
        (the fleet's rule 3 fails it)."""
        with self._lock:
            served = waiter.served
            if served is None:
                with contextlib.suppress(ValueError):
                    run.behind.remove(waiter)
                return SharedTurn(math.inf, None, run.delay, 0.0, None, run.senders)
        return served

    def _serve(self, key: str, run: Run, turn: SharedTurn | None = None) -> None:
        """The slot's ask was answered (``turn``) or given up (None): the requests
        behind it are served in the order they came (rule 8). A pause or the
        cap (a wait, no turn) serves each of them that wait; anything else, each
        takes its :meth:`Run.next`: a turn of the run just reserved or, the
        first left, the next ask (the others then wait behind that one)."""
        later = turn is not None and turn.lease is None and turn.wait > 0.0
        received = time.monotonic()
        stale: list[str] = []
        with self._lock:
            run.answered()
            while (waiter := run.serve()) is not None:
                served: Ready | None
                if later:
                    assert turn is not None
                    served = turn
                else:
                    served, old = self._next(run, waiter.ask, received, True)
                    stale += old
                    assert served is not None  # nobody asks: Run.next never says "behind"
                waiter.serve(served)
            spacing = run.spacing
        self._hand_back(key, stale, spacing)

    def _unserve(self, key: str, run: Run, waiter: Behind) -> None:
        """A request given up behind the slot's ask holds nothing: out of the
        line; a turn it was served goes back, and the next ask it was to make
        passes to the next request behind."""
        with self._lock:
            served = waiter.served
            if served is None:
                with contextlib.suppress(ValueError):
                    run.behind.remove(waiter)
                return
            spacing = run.spacing
        if not isinstance(served, SharedTurn):
            self._serve(key, run)
        elif served.lease is not None:
            self._hand_back(key, [served.lease], spacing)

    def _hand_back(self, key: str, leases: list[str], gap: float) -> None:
        """Turns of a run that no request took go back, the latest first (rule 8)."""
        self._unused(key, gap, leases[::-1])

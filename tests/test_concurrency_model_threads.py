"""A model-based test of the blocking driver: real threads on one throttle
(docs/scheduling.md, rules 1, 3, 5, 6, 9, 11).

``tests/test_concurrency_model.py`` checks the engine through the asyncio
driver; this one through the threads' (``Throttle.acquire_blocking``, the sync
clients' path: ``wait_for_hold_blocking``, and ``wait_skipping_blocking`` on
an ``autothrottle.testing.VirtualClock``). Hypothesis writes the scripts: a
thread per request (``acquire_blocking`` with or without ``max_wait``, or
``try_acquire``), a held request finished by its own thread (200, a failure, a
release) or released by another (the test's), the clock advanced, slots
paused, their delay set by hand, their cap changed; with holds that never
expire and with a ``hold_timeout`` the silent holders outlive.

**Time.** Every thread runs for real (its locks, its wake-ups from other
threads), but the time is the test's: the throttle's clock and the driver's
own (``time.monotonic``, ``threading.Event``'s timeouts) read a virtual time
that moves only when every thread of the test is parked, to the soonest time
one of them waits for, as looptime moves an event loop's. So the verdicts hold
whatever the machine's load: a thread held up by the scheduler holds the time
up with it. A thread parked forever where it should have been woken (a lost
wake-up) stays parked: the check after the step sees the head of a free slot
waiting for nothing, and at the end a request never granted; every wait for
the threads is bounded in real time, so a thread that never parks fails the
test instead of hanging it.

**Ask order.** Threads ask at once; the order of their asks is the order the
gate queued them in (``Gate.enqueue``, recorded under the slot's lock), and a
request granted at once (the fast path) asked after every request queued then.

What is checked, after every step that let the threads settle (some steps run
on while the threads still move, so that releases, asks and grants meet), and
at the end:

- **one grant at a time**: a grant runs under its slot's lock, in the thread
  granted (outside it, two threads may take one turn, and every verdict
  below, read as one grant at a time leaves the slot, would pass both);
- **the cap**: at a grant, the holds still counting (neither let go nor past
  their ``hold_timeout``) are under the slot's cap and the gate's;
- **FIFO**: no request is granted while one of its slot that asked before it
  still waits;
- **the bound**: granted within it, or ``ThrottleTimeout`` exactly at it on the
  throttle's clock (the time the thread left the queue, recorded under the
  lock), on a VirtualClock too (see ``IDLE``);
- **spacing and pause**: for the policies whose delay is the spacing, a grant
  no sooner than the last one plus the delay in force now and when the gap
  began (unless set by hand since), and none during a pause;
- **nothing phantom**: the gate's queue is exactly the waiting threads' tickets
  in their ask order (a thread that timed out left it), its holds the held
  leases (all that still count), the slot's ``sent`` the grants;
- **no lost wake-up**: the head of a slot that could grant it now is not
  parked, for good or until a later time (late for its turn, within its
  bound or not); and a wake-up that came after a waiter's check began is
  still there at its wait. Every other request is woken once just after a
  check that left it waiting, as a release from another thread may wake it
  there: the window of a check-then-wait race (an event cleared after the
  check instead of before it), a few bytecodes wide, which real threads
  meet once in thousands of scripts;
- **the end**: with holds that expire, every request still waiting is granted
  (or reaches its bound) with no hold let go; then every held request is let
  go, every request with no bound that asked to wait was granted, every thread
  ended, and the slots hold nothing.

``AUTOTHROTTLE_MODEL_EXAMPLES=2000`` runs more scripts than the suite's.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import autothrottle._driver as driver_module
import autothrottle.testing as testing_module
from autothrottle import (
    AutoThrottlePolicy,
    FixedDelayPolicy,
    Lease,
    Throttle,
    ThrottleTimeout,
)
from autothrottle._gate import Gate, Ticket
from autothrottle._policy import DelayPolicy
from autothrottle.testing import VirtualClock

EPS = 1e-9
REAL_LIMIT = 10.0
"""Real seconds the threads may take to settle after a step: far more than any
step needs on a loaded machine, and a test that would hang fails instead."""
MAX_WAKES = 20_000
"""Wake-ups one advance of the clock may take: a spinning thread fails the test."""

SLOTS = ("one.test", "two.test", "three.test")
CAPS = {"one.test": 1, "two.test": 2, "three.test": 3}
HOST_BOUND = {"three.test": 1.5}
MAX_DELAY = 4.0
MAX_PAUSE = 10.0
NEVER = 1e6
HOLD = 2.0
IDLE = 0.05
"""The VirtualClock's idle: the (virtual) seconds a waiter gives the others
before the clock jumps; each is a wake-up while a request is in flight. A
waiter sleeps at most ``idle`` at a time, and the clock wakes it when another
waiter's jump (to a time no later than its own turn or bound) reached its
turn or bound: it comes on time, not late by up to ``idle``."""

POLICIES: dict[str, Callable[[], DelayPolicy]] = {
    "scrapy": AutoThrottlePolicy,
    "fixed": lambda: FixedDelayPolicy(0.5),
    "unpaced": lambda: FixedDelayPolicy(0.0),
}


class Stuck(AssertionError):
    """The threads did not settle within REAL_LIMIT real seconds."""


class Abort(BaseException):
    """Raised in a parked thread when the test ends early: it unwinds the driver."""


# -- the virtual time ----------------------------------------------------------------


class VirtualTime:
    """The time of the test's threads: it moves only when every live thread is
    parked (in a driver's wait, or waiting for its next step), to the soonest
    time one of them waits until. The waker marks a thread runnable, not the
    thread itself, so "every thread parked" is never seen between a wake-up
    and the thread it wakes."""

    def __init__(self, start: float) -> None:
        self.now = start
        self.cond = threading.Condition()
        self.parked: dict[VirtualEvent, float] = {}
        self.live = 0
        self.aborted = False
        self.ticks = itertools.count()
        """The order of the gate's checks and the wake-ups (a wake-up's tick above
        its waiter's last check: it came after that check began)."""
        self.lost: list[str] = []
        """Wake-ups lost between a waiter's check and its wait."""

    def __call__(self) -> float:
        return self.now

    monotonic = __call__

    def settle(self) -> None:
        """Wait until every live thread is parked."""
        end = time.monotonic() + REAL_LIMIT
        with self.cond:
            while len(self.parked) < self.live:
                left = end - time.monotonic()
                if left <= 0.0:
                    raise Stuck(f"{self.live - len(self.parked)} thread(s) never parked")
                self.cond.wait(left)

    def advance(self, seconds: float) -> None:
        """Move the time on by ``seconds``, waking each parked thread at its time."""
        target = self.now + seconds
        for _ in range(MAX_WAKES):
            self.settle()
            with self.cond:
                due = min(self.parked.values(), default=math.inf)
                if due > target:
                    self.now = target
                    return
                self.now = max(self.now, due)
                for waiter, at in list(self.parked.items()):
                    if at <= self.now:
                        del self.parked[waiter]
                self.cond.notify_all()
        raise Stuck(f"more than {MAX_WAKES} wake-ups in {seconds} s: a thread spins")

    def abort(self) -> None:
        with self.cond:
            self.aborted = True
            self.parked.clear()
            self.cond.notify_all()


class VirtualEvent:
    """``threading.Event`` on the virtual time: ``wait(timeout)`` parks the
    thread until ``set()`` or until the time has moved on by ``timeout``."""

    def __init__(self, clock: VirtualTime, owner: Request | None = None) -> None:
        self._time = clock
        self._flag = False
        self.owner = owner  # the request whose thread waits on it
        self.due = math.nan
        self.set_at = -1  # the tick of the last set()

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        clock = self._time
        with clock.cond:
            self._flag = True
            self.set_at = next(clock.ticks)
            if clock.parked.pop(self, None) is not None:
                clock.cond.notify_all()

    def clear(self) -> None:
        with self._time.cond:
            self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        clock = self._time
        with clock.cond:
            if clock.aborted:
                raise Abort
            if self._flag:
                return True
            if timeout is not None and timeout <= 0.0:
                return False
            if self.owner is None:
                self.owner = getattr(_local, "request", None)
            owner = self.owner
            if owner is not None and self.set_at > owner.checked:
                # Woken after its check began, and the wake-up is gone: it waits
                # on what it saw before, late for a turn that may have come.
                clock.lost.append(
                    f"request {owner.index} lost a wake-up between its check and its wait"
                )
            self.due = math.inf if timeout is None else clock.now + timeout
            clock.parked[self] = self.due
            clock.cond.notify_all()
            end = time.monotonic() + 3 * REAL_LIMIT
            while self in clock.parked:
                if time.monotonic() > end or clock.aborted:
                    clock.parked.pop(self, None)
                    raise Abort
                clock.cond.wait(REAL_LIMIT)
            if clock.aborted:
                raise Abort
            return self._flag


class _Threading:
    """``threading`` for the driver, its events on the virtual time."""

    def __init__(self, clock: VirtualTime) -> None:
        self._clock = clock

    def Event(self) -> VirtualEvent:  # threading's name
        return VirtualEvent(self._clock)

    def __getattr__(self, name: str) -> Any:
        return getattr(threading, name)


class _Time:
    """``time`` for the driver and the VirtualClock: ``monotonic`` is the virtual time."""

    def __init__(self, clock: VirtualTime) -> None:
        self.monotonic = clock

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


_local = threading.local()
"""The request of the thread running (each request's thread sets it)."""


# -- the operations -----------------------------------------------------------------


@dataclass(frozen=True)
class Ask:
    slot: int
    max_wait: float | None
    now_only: bool = False
    rush: bool = False  # the next step comes before the threads settle


@dataclass(frozen=True)
class Finish:
    pick: int
    outcome: str
    rush: bool = False


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class Pause:
    slot: int
    seconds: float


@dataclass(frozen=True)
class SetDelay:
    slot: int
    delay: float


@dataclass(frozen=True)
class SetCap:
    slot: int
    cap: int


Op = Ask | Finish | Advance | Pause | SetDelay | SetCap

OUTCOMES = ("ok", "finish", "refused", "failed", "released", "elsewhere")
"""How a held request ends; ``elsewhere``: the test's thread releases its lease
while its own thread still holds it."""

_slot = st.integers(0, len(SLOTS) - 1)
_kinds = {
    "ask": st.builds(
        Ask,
        _slot,
        st.one_of(st.none(), st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0])),
        st.sampled_from([False, False, False, True]),
        st.booleans(),
    ),
    "finish": st.builds(Finish, st.integers(0, 29), st.sampled_from(OUTCOMES), st.booleans()),
    "advance": st.builds(Advance, st.sampled_from([1e-6, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0])),
    "pause": st.builds(Pause, _slot, st.sampled_from([0.5, 1.0, 3.0])),
    "delay": st.builds(SetDelay, _slot, st.sampled_from([0.0, 0.25, 0.5, 1.0])),
    "cap": st.builds(SetCap, _slot, st.integers(1, 4)),
}
_WEIGHTS = {"ask": 6, "finish": 4, "advance": 3, "pause": 1, "delay": 1, "cap": 1}
operations = st.sampled_from([k for k, n in _WEIGHTS.items() for _ in range(n)]).flatmap(
    _kinds.__getitem__
)
scripts = st.lists(operations, min_size=15, max_size=25)


# -- the model ----------------------------------------------------------------------


@dataclass(eq=False)
class Request:
    index: int
    key: str
    max_wait: float | None
    bound: float | None
    now_only: bool
    state: str = "new"  # new, waiting, holding, done
    order: int = -1
    asked_at: float = math.nan
    ticket: Ticket | None = None
    left_at: float = math.nan  # left the queue without a turn
    lease: Lease | None = None
    checked: int = -1  # the tick its last check of the gate began at (VirtualTime.ticks)
    woken: bool = False  # a wake-up came just after one of its checks (``recorded``)
    let_go: bool = False  # the gate let go of its lease (released)
    ended: str = ""
    outcome: str = ""
    go: VirtualEvent | None = None
    thread: threading.Thread | None = None


@dataclass
class SlotModel:
    grants: int = 0
    last_grant: float | None = None
    delay_at_last_grant: float = 0.0
    set_by_hand: bool = False


@dataclass(eq=False)
class Model:
    clock: VirtualTime
    throttle: Throttle
    hold_timeout: float
    spaced: bool
    requests: list[Request] = field(default_factory=list)
    slots: dict[str, SlotModel] = field(default_factory=lambda: {k: SlotModel() for k in SLOTS})
    caps: dict[str, int] = field(default_factory=lambda: dict(CAPS))
    errors: list[str] = field(default_factory=list)
    leases: dict[int, Request] = field(default_factory=dict)
    _order: Iterator[int] = field(default_factory=itertools.count)

    def now(self) -> float:
        return self.throttle._clock()

    # -- what the gate's wrappers record, under the slot's lock --

    def enqueued(self, gate: Gate, ticket: Ticket) -> None:
        request: Request = _local.request
        request.state, request.order, request.ticket = "waiting", next(self._order), ticket
        request.asked_at = gate.clock()

    def abandoned(self, gate: Gate, ticket: Ticket) -> None:
        request: Request = _local.request
        if ticket.hold is None:
            request.state, request.left_at = "left", gate.clock()

    def let_go(self, hold: Any) -> None:
        request = self.leases.get(id(hold))
        if request is not None:
            request.let_go = True

    def counting(self, key: str, now: float) -> list[Request]:
        """The holds of ``key`` that still count: not let go, not past their expiry."""
        return [
            r
            for r in self.requests
            if r.key == key
            and r.state == "holding"
            and not r.let_go
            and r.lease is not None
            and r.lease.expires_at > now
        ]

    def granted(self, gate: Gate, lease: Lease, now: float) -> None:
        """A grant, recorded by the thread granted, under the slot's lock."""
        request: Request = _local.request
        key = request.key
        problems = []
        if threading.current_thread() is not request.thread:
            problems.append("granted in another request's thread")
        if not gate.lock._is_owned():  # type: ignore[attr-defined]
            # Every verdict here reads the slot as one grant at a time leaves it:
            # outside the lock two threads may take one turn, and both pass.
            problems.append("granted outside the slot's lock")
        counting = len(self.counting(key, now)) + 1
        if counting > min(self.caps[key], gate.cap()):
            problems.append(f"{counting} holding, cap {self.caps[key]}, gate's {gate.cap()}")
        earlier = [
            r.index
            for r in self.requests
            if r.key == key
            and r.state == "waiting"
            and (request.order < 0 or r.order < request.order)
        ]
        if earlier:
            problems.append(f"granted before {earlier}, which asked earlier (FIFO)")
        if request.bound is not None and now - request.asked_at > request.bound + EPS:
            problems.append(
                f"granted {now - request.asked_at!r} s after asking, bound {request.bound}"
            )
        pause_until = gate.state.limits.pause_until
        if now < pause_until - EPS:
            problems.append(f"granted at {now!r} during a pause until {pause_until!r}")
        slot = self.slots[key]
        delay = gate.state.pace.delay
        if self.spaced and slot.last_grant is not None:
            need = delay if slot.set_by_hand else max(delay, slot.delay_at_last_grant)
            if now - slot.last_grant < need - EPS:
                problems.append(f"granted {now - slot.last_grant!r} s after the last, delay {need}")
        slot.delay_at_last_grant, slot.last_grant, slot.set_by_hand = delay, now, False
        slot.grants += 1
        request.state, request.lease = "holding", lease
        self.leases[id(lease)] = request
        self.errors.extend(f"request {request.index} on {key}: {p}" for p in problems)

    # -- the threads --

    def run(self, request: Request) -> None:
        _local.request = request
        try:
            self.ask(request)
        except Abort:
            pass
        except BaseException as error:
            self.errors.append(f"request {request.index} raised {error!r}")
        finally:
            with self.clock.cond:
                if request.state != "holding":
                    request.state = "done"
                self.clock.live -= 1
                self.clock.cond.notify_all()

    def ask(self, request: Request) -> None:
        if request.now_only:
            lease = self.throttle.try_acquire(request.key)
            if lease is None:
                request.ended = "refused"
                return
        else:
            try:
                lease = self.throttle.acquire_blocking(request.key, max_wait=request.max_wait)
            except ThrottleTimeout:
                request.ended = "timeout"
                self.timed_out(request)
                return
        assert request.go is not None
        with lease:
            request.go.wait()
            outcome = request.outcome
            if outcome == "ok":
                lease.observe(latency=0.1, status=200)
            elif outcome == "finish":
                lease.finish(latency=0.1, status=200)
            elif outcome == "refused":
                lease.observe(latency=0.01, status=429, headers={"Retry-After": "1"})
            elif outcome == "failed":
                lease.fail(ConnectionError("reset"))
        request.ended = "released"
        request.state = "done"

    def timed_out(self, request: Request) -> None:
        waited = request.left_at - request.asked_at
        if request.bound is None:
            self.errors.append(f"request {request.index} timed out with no bound")
        elif request.state != "left":
            self.errors.append(f"request {request.index} timed out, its ticket still queued")
        elif not request.bound - EPS <= waited <= request.bound + EPS:
            self.errors.append(
                f"request {request.index} timed out after {waited!r} s, its bound {request.bound}"
            )

    # -- the steps --

    def apply(self, op: Op) -> bool:
        """Take one step; whether to let the threads settle and check after it."""
        if isinstance(op, Ask):
            self.start(op)
            return not op.rush
        if isinstance(op, Finish):
            held = [r for r in self.requests if r.state == "holding" and not r.outcome]
            if held:
                request = held[op.pick % len(held)]
                assert request.lease is not None and request.go is not None
                if op.outcome == "elsewhere":
                    request.lease.release()  # from this thread, not the request's
                request.outcome = op.outcome
                request.go.set()
            return not op.rush
        if isinstance(op, Advance):
            self.clock.advance(op.seconds)
        elif isinstance(op, Pause):
            self.throttle.backoff(SLOTS[op.slot], pause=op.seconds)
        elif isinstance(op, SetDelay):
            key = SLOTS[op.slot]
            with self.throttle._live(key).gate.lock:
                self.throttle.slot(key).delay = op.delay
                self.slots[key].set_by_hand = True
        elif isinstance(op, SetCap):
            key = SLOTS[op.slot]
            with self.throttle._live(key).gate.lock:
                self.throttle.set_host(
                    key, {"max_concurrency": op.cap, "max_wait": HOST_BOUND.get(key)}
                )
                self.caps[key] = op.cap
        return True

    def start(self, op: Ask) -> None:
        key = SLOTS[op.slot]
        own = HOST_BOUND.get(key)
        bound = (
            own if op.max_wait is None else op.max_wait if own is None else min(own, op.max_wait)
        )
        request = Request(len(self.requests), key, op.max_wait, bound, op.now_only)
        request.go = VirtualEvent(self.clock, request)
        self.requests.append(request)
        request.thread = threading.Thread(target=self.run, args=(request,), daemon=True)
        with self.clock.cond:
            self.clock.live += 1
        request.thread.start()

    # -- the checks (the threads settled: every one parked) --

    def check(self) -> None:
        assert not self.errors, self.errors
        assert not self.clock.lost, self.clock.lost
        now = self.now()
        for key in SLOTS:
            gate = self.throttle._live(key).gate
            with gate.lock:
                waiting = sorted(
                    (r for r in self.requests if r.key == key and r.state == "waiting"),
                    key=lambda r: r.order,
                )
                assert list(gate._queue) == [r.ticket for r in waiting], (key, "queue")
                holding = {id(r.lease) for r in self.requests if r.key == key and r.lease}
                counting = self.counting(key, now)
                for hold in gate._holds:
                    assert id(hold) in holding, (key, "a hold no thread holds")
                    assert not self.leases[id(hold)].let_go, (key, "a hold let go still held")
                for request in counting:
                    assert request.lease in gate._holds, (key, f"{request.index} let go early")
                assert self.throttle.slot(key).sent == self.slots[key].grants, key
                if waiting:
                    self.check_awake(key, gate, waiting[0], len(counting), now)

    def check_awake(self, key: str, gate: Gate, head: Request, counting: int, now: float) -> None:
        """The head of a slot that may grant it now is not parked: not for good (a
        lost wake-up), nor until a later time (late for its turn, within its
        bound or not). Its turn came by a release, a change of the slot's
        settings (each wakes it) or the time it waited for (it is woken then)."""
        assert head.go is not None
        parked = [e for e in self.clock.parked if e.owner is head]
        free = (
            counting < min(self.caps[key], gate.cap())
            and now >= gate.state.limits.pause_until
            and gate.send_at(now) <= now
        )
        if free and parked:
            raise AssertionError(
                f"request {head.index} on {key} parked until {parked[0].due} with its turn"
                f" free at {now}: a lost wake-up"
            )

    def drain(self) -> None:
        """With holds that expire, first let none go: every request still waiting
        gets its turn by expiries alone. Then let every held one go, and run the
        clock until every thread ended."""
        per = MAX_DELAY + MAX_PAUSE + (self.hold_timeout if self.hold_timeout < NEVER else 0.0)
        if self.hold_timeout < NEVER:
            limit = self.now() + (len(self.requests) + 2) * per
            while self.now() < limit and any(r.state == "waiting" for r in self.requests):
                self.clock.advance(MAX_DELAY)
                self.check()
            waiting = [r.index for r in self.requests if r.state == "waiting"]
            assert not waiting, f"{waiting} still waiting with every hold expired: starved"
        limit = self.now() + (len(self.requests) + 2) * per
        while self.now() < limit:
            for request in self.requests:
                if request.state == "holding" and not request.outcome:
                    assert request.go is not None
                    request.outcome = "released"
                    request.go.set()
            self.clock.settle()
            self.check()
            if all(r.state == "done" for r in self.requests):
                break
            self.clock.advance(MAX_DELAY)
        for request in self.requests:
            assert request.state == "done", (
                f"request {request.index} on {request.key} still {request.state}: starved"
            )
            if request.bound is None and not request.now_only:
                assert request.ended == "released", (request.index, request.ended)
            assert request.lease is None or request.lease.released, request.index
        for key in SLOTS:
            gate = self.throttle._live(key).gate
            assert not gate._holds and not gate._queue, key
            assert self.throttle.slot(key).in_flight == 0


@contextmanager
def recorded(model: Model) -> Iterator[None]:
    """The gate's queue, grants and releases, recorded under the slot's lock as
    they happen: the threads' ask order, and each grant's check."""
    enqueue, abandon, release, let_go = Gate.enqueue, Gate.abandon, Gate.release, Gate.let_go
    try_acquire = Gate.try_acquire
    ticks = model.clock.ticks

    def enqueue_(gate: Gate, cost: Any = None) -> Ticket:
        with gate.lock:
            ticket = enqueue(gate, cost)
            model.enqueued(gate, ticket)
            return ticket

    def abandon_(gate: Gate, ticket: Ticket) -> Any:
        with gate.lock:
            model.abandoned(gate, ticket)
            return abandon(gate, ticket)

    def release_(gate: Gate, hold: Any) -> None:
        with gate.lock:
            model.let_go(hold)
            release(gate, hold)

    def let_go_(gate: Gate, hold: Any) -> None:
        model.let_go(hold)
        let_go(gate, hold)

    def try_acquire_(gate: Gate, ticket: Ticket, make: Any) -> float:
        # A waiter's check. Every other request's first one that leaves it waiting
        # is woken just after it, as by a release from another thread then (the
        # window of a check-then-wait race, a few bytecodes wide, that real
        # threads meet once in thousands of scripts): its driver must check
        # again, not wait on what it saw (the wait's check: VirtualEvent.wait).
        request: Request | None = getattr(_local, "request", None)
        if request is not None:
            request.checked = next(ticks)
        wait = try_acquire(gate, ticket, make)
        if request is not None and ticket.hold is None and not request.woken:
            request.woken = request.index % 2 == 0
            if request.woken:
                ticket.wake()
        return wait

    Gate.enqueue, Gate.abandon = enqueue_, abandon_  # type: ignore[method-assign, assignment]
    Gate.release, Gate.let_go = release_, let_go_  # type: ignore[method-assign, assignment]
    Gate.try_acquire = try_acquire_  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        Gate.enqueue, Gate.abandon, Gate.release, Gate.let_go = (  # type: ignore[method-assign]
            enqueue,
            abandon,
            release,
            let_go,
        )
        Gate.try_acquire = try_acquire  # type: ignore[method-assign]


def _recording_maker(model: Model, gate: Gate, make: Callable[[float], Lease]) -> Any:
    def made(now: float) -> Lease:
        lease = make(now)
        model.granted(gate, lease, now)
        return lease

    return made


def run_script(policy: str, skipping: bool, hold_timeout: float, script: list[Op]) -> Model:
    clock = VirtualTime(100.0)
    saved = driver_module.threading, driver_module.time, testing_module.time  # type: ignore[attr-defined]
    driver_module.threading = _Threading(clock)  # type: ignore[attr-defined, assignment]
    driver_module.time = testing_module.time = _Time(clock)  # type: ignore[attr-defined, assignment]
    model: Model | None = None
    try:
        throttle = Throttle(
            clock=VirtualClock(idle=IDLE) if skipping else clock,
            policy=POLICIES[policy](),
            start_delay=0.5,
            max_delay=MAX_DELAY,
            max_concurrency=3,
            max_pause=MAX_PAUSE,
            hold_timeout=hold_timeout,
            hosts={
                "one.test": {"max_concurrency": 1},
                "two.test": {"max_concurrency": 2},
                "three.test": {"max_wait": HOST_BOUND["three.test"]},
            },
        )
        model = Model(clock, throttle, hold_timeout, spaced=True)
        for key in SLOTS:
            live = throttle._live(key)
            live.hold_maker = _recording_maker(model, live.gate, throttle._turns.maker(live, True))
        with recorded(model):
            for op in script:
                if model.apply(op):
                    clock.settle()
                    model.check()
            model.drain()
        return model
    finally:
        clock.abort()
        for request in model.requests if model is not None else ():
            if request.thread is not None:
                request.thread.join(REAL_LIMIT)
        driver_module.threading, driver_module.time, testing_module.time = saved  # type: ignore[attr-defined]


@settings(
    max_examples=int(os.environ.get("AUTOTHROTTLE_MODEL_EXAMPLES", "250")),
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    policy=st.sampled_from(sorted(POLICIES)),
    skipping=st.booleans(),
    hold_timeout=st.sampled_from([NEVER, HOLD]),
    script=scripts,
)
def test_threads_keep_every_promise(
    policy: str, skipping: bool, hold_timeout: float, script: list[Op]
) -> None:
    model = run_script(policy, skipping, hold_timeout, script)
    for how in sorted({r.ended for r in model.requests}):
        event(f"a request {how or 'never asked'}")


@pytest.mark.parametrize("skipping", [False, True], ids=["plain", "skipping"])
def test_a_busy_script_of_threads_runs_to_the_end(skipping: bool) -> None:
    # A fixed script that meets grants, waits, a timeout and a refusal, so the
    # model is known to see them.
    script: list[Op] = [
        Ask(0, None),
        Ask(0, None),
        Ask(0, 0.25),
        Ask(1, None, rush=True),
        Ask(1, None),
        Ask(2, None, now_only=True),
        Advance(0.5),
        Finish(0, "ok"),
        Advance(1.0),
        Finish(0, "elsewhere"),
        Ask(1, None, now_only=True),
        Advance(2.0),
    ]
    model = run_script("fixed", skipping, NEVER, script)
    assert {r.ended for r in model.requests} == {"released", "timeout", "refused"}


def test_a_jump_wakes_the_waiter_it_reached() -> None:
    # Two waiters with the same turn (100.5) and idle cycles out of phase:
    # the one on one.test asked at 100.0, the one on two.test at 100.27, its
    # bound 0.24 s (100.51). A request on the wire holds the jumps back until
    # 100.27; at 100.30 the first jumps the clock to 100.5. The second, asleep
    # until 100.32, would take its turn at 100.52, 0.25 s after asking: past
    # its bound. The jump wakes it, and it takes its turn at 100.5.
    script: list[Op] = [
        Ask(0, None),
        Finish(0, "ok"),
        Ask(1, None),
        Finish(0, "ok"),
        Ask(2, None),  # on the wire until 100.27
        Ask(0, None),
        Advance(0.27),
        Ask(1, 0.24),
        Finish(0, "ok"),
        Advance(1.0),
    ]
    model = run_script("fixed", True, NEVER, script)
    assert [r.ended for r in model.requests] == ["released"] * 5

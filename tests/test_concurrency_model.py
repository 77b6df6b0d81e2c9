"""A model-based test of the engine under concurrency (docs/scheduling.md, rules 1, 3, 5-9).

The example tests pin one interleaving each; this one lets hypothesis write
the scripts. A script is a list of operations on a real :class:`Throttle`
driven through the real asyncio driver on looptime's fake-time loop: start a
request on a slot (``acquire`` with or without ``max_wait``, or
``try_acquire``), cancel a task (waiting or holding its turn), finish a held
request (200, 429 with ``Retry-After``, 503, a failure, an exception inside
the lease's ``with``), pass a held request onto the wire, let the loop run a
few turns, advance the clock, pause a slot, set its delay by hand, change its
cap (``set_host``). An abrupt advance stops
in the loop's turn that reached the time, with the wake-ups of that instant
still pending, so the next operation lands between a wake-up and the task it
wakes: a cancel may meet a grant, a deadline or another cancel at one instant.
Each script runs under one of several policies (Scrapy's, fixed, unpaced,
AIMD, adaptive, a rate with a burst, a jittered delay).

What is checked, after every operation and at the end:

- **the cap**: the tasks holding a turn of a slot are never more than its
  ``max_concurrency`` (nor, at a grant, than the gate's own cap; a cap lowered
  under more holders lets none go until they are fewer);
- **FIFO**: when a request of a slot is granted, no request of that slot that
  asked before it is still waiting;
- **nothing phantom**: the gate's holds and queue (private state: the public
  snapshot's ``in_flight`` expires holds, which would hide a leak) are exactly
  the model's holders and waiters, the public snapshot says the same, and the
  slot's ``sent`` counter is the number of grants the tasks saw;
- **the bound**: a request with a bound is granted within it or fails with
  :class:`ThrottleTimeout` exactly at it (looptime's clock ticks in µs);
- **spacing**: a grant comes no sooner than the previous grant of its slot plus
  the delay in force now and the delay in force when that gap began (unless
  the delay was set by hand since: it applies to the gap begun, rule 3), less
  the lead by which rule 10 lets a grant come early, and not during a pause.
  The delay is not checked where it is not the spacing: the adaptive policy's
  ramp-up lets a falling delay shorten a gap begun (docs/signals.md,
  "Ramp-up"), a burst spends tokens, a jitter scales it;
- **the wire**: a held request that takes its turn on the wire goes no sooner
  than the last one of its slot plus the gap of the later grant of the two,
  and not during a pause (rule 10);
- **one grant at a time**: a grant runs in the task of the request granted,
  under its slot's lock (a gate is shared with sync clients' threads and
  other loops; outside the lock two threads may take one turn, and every
  verdict here, read as one grant at a time leaves the slot, would pass both);
- **no lost wake-up**: the head of a slot that could grant it now is not
  parked, for good or until a later time (its future unresolved, its timer
  not due: late for its turn, within its bound or not); and a wake-up that
  came after a waiter's check began has resolved the future it then awaits.
  Every other request is woken once just after a check that left it
  waiting, as a release in another thread may wake it there;
- **the end**: once every held request is let go and the clock has run long
  enough, every request that was not cancelled and had no bound was granted
  (no starvation), every lease is released and the slots hold nothing.

The last two catch mutants of the driver and the gate that every check
before them lets pass (each applied by hand, the file run, then reverted):
``_wait_on_loop`` making its future after the check instead of before it (a
wake-up during the check lost), or checking with ``Gate._try_acquire``
outside the lock; its timer set 50 ms past the turn, or ``Gate._try_acquire``
telling a waiter a quarter more than its wait (a head late for a free turn);
``LiveSlot.configure`` (``set_host``) not waking the head; and, only in
``test_what_frees_a_turn_wakes_the_head``'s fixed scripts, which the random
ones meet too seldom, ``Gate.let_go`` (a turn ended by ``Lease.finish``) or
the delay set by hand not waking it.

Not covered here: threads (the blocking driver), holds that expire
(``hold_timeout``), a fleet's shared store.
``AUTOTHROTTLE_MODEL_EXAMPLES=5000`` runs more scripts than the suite's.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import random
from collections.abc import Callable, Coroutine, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import looptime
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from autothrottle import (
    AdaptiveConcurrencyPolicy,
    AIMDPolicy,
    AutoThrottlePolicy,
    FixedDelayPolicy,
    FixedRatePolicy,
    Lease,
    Throttle,
    ThrottleTimeout,
)
from autothrottle._driver import _resolve
from autothrottle._gate import Gate, Ticket
from autothrottle._policy import DelayPolicy

EPS = 2e-6
"""Looptime's clock ticks in µs; a timer set for a float time fires at the tick
nearest to it, and the gate, woken half a tick early, asks again a tick later."""

SLOTS = ("one.test", "two.test", "three.test")
CAPS = {"one.test": 1, "two.test": 2, "three.test": 3}
HOST_BOUND = {"three.test": 1.5}
"""three.test has a per-host ``max_wait``: every request to it is bounded."""

MAX_DELAY = 4.0
MAX_PAUSE = 10.0
NEVER = 1e6
"""The hold_timeout of the scripts where no hold expires: one that expired would hide a leak."""
HOLD = 2.0
"""The hold_timeout of the scripts where holds expire: shorter than the longest advance,
the longest delay and a Retry-After, so a silent holder outlives its hold often."""


@dataclass(frozen=True)
class Variant:
    """A throttle the scripts run on: its policy, its jitter, and whether the
    spacing check applies (a ramp-up, a burst or a jitter spaces otherwise)."""

    policy: Callable[[], DelayPolicy]
    spaced: bool
    jitter: float = 0.0


VARIANTS = {
    "scrapy": Variant(AutoThrottlePolicy, True),
    "fixed": Variant(lambda: FixedDelayPolicy(0.5), True),
    "unpaced": Variant(lambda: FixedDelayPolicy(0.0), True),
    "aimd": Variant(AIMDPolicy, True),
    "adaptive": Variant(AdaptiveConcurrencyPolicy, False),
    "burst": Variant(lambda: FixedRatePolicy(2.0, burst=3), False),
    "jitter": Variant(AutoThrottlePolicy, False, jitter=0.5),
}


# -- the operations -----------------------------------------------------------------


@dataclass(frozen=True)
class Ask:
    slot: int
    max_wait: float | None
    now_only: bool = False  # try_acquire: a lease now or None


@dataclass(frozen=True)
class Cancel:
    pick: int  # among the requests whose task has not ended


@dataclass(frozen=True)
class Finish:
    pick: int  # among the requests holding a turn
    outcome: str
    value: float = 0.0


@dataclass(frozen=True)
class Advance:
    seconds: float
    abrupt: bool = False  # stop in the loop's turn that reached the time: wake-ups pending


@dataclass(frozen=True)
class Turns:
    count: int  # let the loop run this many turns without moving the clock


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
    cap: int  # the slot's max_concurrency from now on (Throttle.set_host)


Op = Ask | Cancel | Finish | Advance | Turns | Pause | SetDelay | SetCap

OUTCOMES = ("ok", "finish", "refused", "unavailable", "failed", "raised", "released")
"""How a held request ends; ``Finish(pick, "wire")`` instead takes its turn on
the wire (rule 10) and holds on, as a client between its request and the answer."""

_slot = st.integers(0, len(SLOTS) - 1)
_pick = st.integers(0, 29)
_bounds = st.one_of(st.none(), st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0]))
_asks = st.builds(Ask, _slot, _bounds, st.sampled_from([False, False, False, True]))
_advances = st.builds(
    Advance, st.sampled_from([1e-6, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0]), st.booleans()
)
_kinds = {
    "ask": _asks,
    "cancel": st.builds(Cancel, _pick),
    "finish": st.builds(
        Finish,
        _pick,
        st.sampled_from(OUTCOMES),
        st.sampled_from([0.0, 0.05, 0.3, 1.0, 2.0, 5.0]),
    ),
    "wire": st.builds(Finish, _pick, st.just("wire")),
    "advance": _advances,
    "turns": st.builds(Turns, st.sampled_from([1, 2, 3, 50])),
    "pause": st.builds(Pause, _slot, st.sampled_from([0.5, 1.0, 3.0])),
    "delay": st.builds(SetDelay, _slot, st.sampled_from([0.0, 0.25, 0.5, 1.0])),
    "cap": st.builds(SetCap, _slot, st.integers(1, 4)),
}
_WEIGHTS = {
    "ask": 6,
    "cancel": 2,
    "finish": 3,
    "wire": 4,
    "advance": 3,
    "turns": 1,
    "pause": 1,
    "delay": 1,
    "cap": 1,
}
"""How often each kind comes: requests enough to queue, and time to move them."""
operations = st.sampled_from([k for k, n in _WEIGHTS.items() for _ in range(n)]).flatmap(
    _kinds.__getitem__
)
scripts = st.lists(operations, min_size=20, max_size=30)
_expiring_kinds = {**_kinds, "ask": st.builds(Ask, _slot, _bounds, st.booleans())}
expiring_scripts = st.lists(
    st.sampled_from([k for k, n in _WEIGHTS.items() for _ in range(n)]).flatmap(
        _expiring_kinds.__getitem__
    ),
    min_size=20,
    max_size=30,
)
"""Where holds expire, half the requests ask ``try_acquire``: a turn free only
because a hold expired is then asked for now and again before anything else
let the expired hold go."""


# -- the model ----------------------------------------------------------------------


@dataclass(eq=False)
class Request:
    index: int
    key: str
    max_wait: float | None
    bound: float | None
    state: str = "new"  # new, waiting, holding, done
    asked_at: float = math.nan
    order: int = -1
    granted_at: float | None = None
    ended: str = ""  # released, timeout, cancelled, refused (try_acquire said no)
    ended_at: float = math.nan
    cancel_asked: bool = False
    lease: Lease | None = None
    outcome: asyncio.Future[tuple[str, float]] | None = None
    task: asyncio.Task[None] | None = None
    ticket: Ticket | None = None
    woken: bool = False  # a wake-up came just after one of its checks (``recorded``)
    unseen: bool = False  # that wake-up came after its last check, and no check since


@dataclass
class SlotModel:
    holders: int = 0
    waiters: int = 0
    grants: int = 0
    last_grant: float | None = None
    delay_at_last_grant: float = 0.0
    set_by_hand: bool = False
    over: int = 0  # holders a lowered cap left in flight, while they last
    wire: Lease | None = None  # the last request on the wire
    wire_at: float = -math.inf
    responses: int = 0  # observed by the holders (a late one after expiry too)
    failures: int = 0


class Boom(Exception):
    """The caller's own error inside ``with lease``."""


@dataclass(eq=False)
class Model:
    loop: asyncio.AbstractEventLoop
    throttle: Throttle
    spaced: bool
    requests: list[Request] = field(default_factory=list)
    slots: dict[str, SlotModel] = field(default_factory=lambda: {k: SlotModel() for k in SLOTS})
    caps: dict[str, int] = field(default_factory=lambda: dict(CAPS))
    errors: list[str] = field(default_factory=list)
    hold_timeout: float = NEVER
    draining: bool = False
    wires: int = 0
    late: int = 0  # held requests finished after their hold expired
    tasks: dict[asyncio.Task[None], Request] = field(default_factory=dict)
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def now(self) -> float:
        return self.loop.time()

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coroutine)

    # -- the operations --

    def apply(self, op: Op) -> None:
        if isinstance(op, Ask):
            self.ask(op)
        elif isinstance(op, Cancel):
            # A task that has asked, else one not yet started (cancelled before it asks).
            live = [r for r in self.requests if r.state in ("waiting", "holding")] or [
                r for r in self.requests if r.task is not None and not r.task.done()
            ]
            if live:
                request = live[op.pick % len(live)]
                request.cancel_asked = True
                assert request.task is not None
                request.task.cancel()
        elif isinstance(op, Finish):
            held = [
                r
                for r in self.requests
                if r.state == "holding" and r.outcome is not None and not r.outcome.done()
            ]
            if held:
                request = held[op.pick % len(held)]
                assert request.outcome is not None
                request.outcome.set_result((op.outcome, op.value))
        elif isinstance(op, Advance):
            if op.abrupt:
                # The loop stops in the turn that runs the timers due then, so
                # the tasks they wake have not run yet when the next step comes.
                self.loop.call_at(self.now() + op.seconds, self.loop.stop)
                self.loop.run_forever()
            else:
                self.run(asyncio.sleep(op.seconds))
        elif isinstance(op, Turns):
            self.run(_turns(op.count))
        elif isinstance(op, Pause):
            self.throttle.backoff(SLOTS[op.slot], pause=op.seconds)
        elif isinstance(op, SetDelay):
            key = SLOTS[op.slot]
            self.throttle.slot(key).delay = op.delay
            self.slots[key].set_by_hand = True
        elif isinstance(op, SetCap):
            key = SLOTS[op.slot]
            self.throttle.set_host(
                key, {"max_concurrency": op.cap, "max_wait": HOST_BOUND.get(key)}
            )
            self.caps[key] = op.cap
            slot = self.slots[key]
            slot.over = max(slot.over, slot.holders)  # a lower cap lets no one go

    def ask(self, op: Ask) -> None:
        key = SLOTS[op.slot]
        own = HOST_BOUND.get(key)
        bound = (
            own if op.max_wait is None else op.max_wait if own is None else min(own, op.max_wait)
        )
        request = Request(len(self.requests), key, op.max_wait, bound)
        self.requests.append(request)
        send = self.send_now if op.now_only else self.send
        request.task = self.loop.create_task(send(request))
        self.tasks[request.task] = request

    async def send_now(self, request: Request) -> None:
        request.asked_at = self.now()
        request.order = next(self._order)
        lease = self.throttle.try_acquire(request.key)
        if lease is None:
            self.ended(request, "refused")
            self.refused(request)
            return
        self.granted(request, lease)
        await self.hold(request, lease)

    def refused(self, request: Request) -> None:
        """``try_acquire`` said no: something must hold the turn back (rules 1, 5,
        6; the spacing is the gate's own answer, ``send_at``): no one queued, the
        holds that count under the cap and the gate open is a free turn refused."""
        key = request.key
        gate = self.throttle._live(key).gate
        now = self.now()
        queued = any(r.key == key and r.state == "waiting" for r in self.requests)
        counting = len(self.counting(key))
        if not queued and counting < min(self.caps[key], gate.cap()) and gate.send_at(now) <= now:
            self.errors.append(
                f"request {request.index}: try_acquire refused a free turn on {key} "
                f"({counting} holds counting, cap {self.caps[key]})"
            )

    def counting(self, key: str) -> list[Request]:
        """The requests of ``key`` holding a turn that still counts: not yet
        past their ``hold_timeout`` (the gate lets go of a hold at its expiry)."""
        now = self.now()
        return [
            r
            for r in self.requests
            if r.key == key
            and r.state == "holding"
            and r.lease is not None
            and r.lease.expires_at > now
        ]

    async def send(self, request: Request) -> None:
        slot = self.slots[request.key]
        request.asked_at = self.now()
        request.order = next(self._order)
        request.state = "waiting"
        slot.waiters += 1
        try:
            lease = await self.throttle.acquire(request.key, max_wait=request.max_wait)
        except ThrottleTimeout:
            slot.waiters -= 1
            self.ended(request, "timeout")
            if request.bound is None:
                self.errors.append(f"request {request.index} timed out with no bound")
            elif request.cancel_asked:
                self.errors.append(f"request {request.index}: its cancel became a timeout")
            elif abs(request.ended_at - request.asked_at - request.bound) > EPS:
                self.errors.append(
                    f"request {request.index} timed out after "
                    f"{request.ended_at - request.asked_at!r} s, its bound {request.bound!r}"
                )
            return
        except asyncio.CancelledError:
            slot.waiters -= 1
            self.ended(request, "cancelled waiting")
            raise
        except BaseException as error:
            slot.waiters -= 1
            self.ended(request, f"raised {error!r}")
            self.errors.append(f"request {request.index} raised {error!r} waiting")
            raise
        slot.waiters -= 1
        self.granted(request, lease)
        await self.hold(request, lease)

    def granted(self, request: Request, lease: Lease) -> None:
        """The checks at a grant: the task runs here in the step that granted it."""
        now = self.now()
        key = request.key
        slot = self.slots[key]
        live = self.throttle._live(key)
        request.state, request.granted_at, request.lease = "holding", now, lease
        slot.holders += 1
        slot.grants += 1
        problems = []
        if lease.sent_at != now:
            problems.append(f"sent_at {lease.sent_at!r} is not the grant's time {now!r}")
        if lease.expires_at != now + self.hold_timeout:
            problems.append(f"expires_at {lease.expires_at!r}, granted at {now!r}")
        if any(r.lease is lease for r in self.requests if r is not request):
            problems.append("a lease granted twice")
        # The holds that count: a hold past its hold_timeout no longer does (rule 5).
        counting = len(self.counting(key))
        if counting > self.caps[key]:
            problems.append(f"{counting} holding, cap {self.caps[key]}")
        if counting > live.gate.cap():
            problems.append(f"{counting} holding, the gate's cap {live.gate.cap()}")
        earlier = [
            r.index
            for r in self.requests
            if r.key == key and r.state == "waiting" and r.order < request.order
        ]
        if earlier:
            problems.append(f"granted before {earlier}, which asked earlier (FIFO)")
        if request.bound is not None and now - request.asked_at > request.bound + EPS:
            problems.append(
                f"granted {now - request.asked_at!r} s after asking, bound {request.bound}"
            )
        pause_until = self.throttle.slot(key).pause_until
        if now < pause_until - EPS:
            problems.append(f"granted at {now!r} during a pause until {pause_until!r}")
        if self.spaced:
            delay = self.throttle.slot(key).delay
            if slot.last_grant is not None:
                need = delay if slot.set_by_hand else max(delay, slot.delay_at_last_grant)
                # Early by the grants' lead to the wire, a quarter of the gap at most (rule 10).
                need -= min(live.gate.lead, 0.25 * need)
                gap = now - slot.last_grant
                if gap < need - EPS:
                    problems.append(f"granted {gap!r} s after the last grant, delay {need!r}")
            slot.delay_at_last_grant = delay
        slot.last_grant = now
        slot.set_by_hand = False
        for problem in problems:
            self.errors.append(f"request {request.index} on {key}: {problem}")

    async def hold(self, request: Request, lease: Lease) -> None:
        slot = self.slots[request.key]
        request.outcome = self.loop.create_future()
        if self.draining:
            request.outcome.set_result(("released", 0.0))
        try:
            with lease:
                outcome, value = await request.outcome
                while outcome == "wire":
                    await self.wire(request, lease)
                    request.outcome = self.loop.create_future()
                    if self.draining:
                        request.outcome.set_result(("released", 0.0))
                    outcome, value = await request.outcome
                if self.now() >= lease.expires_at and outcome != "released":
                    self.late += 1  # a late finish: its hold expired (it must change no other)
                if outcome in ("ok", "finish", "refused", "unavailable"):
                    slot.responses += 1
                elif outcome == "failed":
                    slot.failures += 1
                if outcome == "ok":
                    lease.observe(latency=value, status=200)
                elif outcome == "finish":
                    lease.finish(latency=value, status=200)
                elif outcome == "refused":
                    retry = str(max(1, round(value)))
                    lease.observe(latency=0.01, status=429, headers={"Retry-After": retry})
                elif outcome == "unavailable":
                    lease.observe(latency=value, status=503)
                elif outcome == "failed":
                    lease.fail(ConnectionError("reset"))
                elif outcome == "raised":
                    raise Boom
        except Boom:
            pass
        except asyncio.CancelledError:
            request.ended = "cancelled holding"
            raise
        finally:
            slot.holders -= 1
            slot.over = min(slot.over, slot.holders)
            self.ended(request, request.ended or "released")
            if not lease.released:
                self.errors.append(f"request {request.index}: its lease outlived its with")

    async def wire(self, request: Request, lease: Lease) -> None:
        """Take the wire turn as the adapters do, and check it: no sooner than
        the last request on the wire plus the gap of the later grant of the two,
        and not during a pause (rule 10)."""
        while True:
            wait = lease.wire_wait()
            if wait <= 0.0:
                break
            await asyncio.sleep(wait)
        now = self.now()
        slot = self.slots[request.key]
        last = slot.wire
        pause_until = self.throttle.slot(request.key).pause_until
        if now < pause_until - EPS:
            self.errors.append(f"request {request.index} on the wire in a pause")
        if last is not None:
            gap = lease.wire_gap if lease.sent_at >= last.sent_at else last.wire_gap
            if now - slot.wire_at < gap - EPS:
                self.errors.append(
                    f"request {request.index} on the wire {now - slot.wire_at!r} s "
                    f"after the last, gap {gap!r}"
                )
        slot.wire, slot.wire_at = lease, now
        self.wires += 1

    def ended(self, request: Request, how: str) -> None:
        """The request's task ends (or, holding, is about to)."""
        request.state, request.ended, request.ended_at = "done", how, self.now()

    # -- what the gate's wrappers record --

    def current(self) -> Request | None:
        """The request whose task runs now (None: the test's own step)."""
        task = asyncio.current_task(self.loop)
        return None if task is None else self.tasks.get(task)

    def making(self, key: str, gate: Gate) -> None:
        """A grant, as the gate makes it: in the task of a request of its slot,
        under the slot's lock. A gate is shared with other threads (a sync
        client's, another loop's), and every verdict here reads the slot as one
        grant at a time leaves it: outside the lock two threads may take one turn."""
        request = self.current()
        if request is None or request.key != key:
            self.errors.append(f"a turn of {key} granted outside its request's task")
        if not gate.lock._is_owned():  # type: ignore[attr-defined]
            self.errors.append(f"a turn of {key} granted outside the slot's lock")

    # -- the checks --

    def check_awake(self, key: str, gate: Gate, counting: int) -> None:
        """The head of a slot that may grant it now is not parked: not for good
        (a lost wake-up), nor until a later time (late for its turn, within its
        bound or not). Its turn came by a release, a change of the slot's
        settings (each wakes it) or the time it waited for (its timer is due)."""
        queue = gate._queue
        if not queue:
            return
        now = self.now()
        if counting >= min(self.caps[key], gate.cap()) or gate.send_at(now) > now:
            return
        head = queue[0]
        if self.awake(head, now):
            return
        index = next((r.index for r in self.requests if r.ticket is head), None)
        self.errors.append(
            f"request {index} on {key} parked with its turn free at {now!r}: a lost wake-up"
        )

    def awake(self, ticket: Ticket, now: float) -> bool:
        """Whether the waiter of ``ticket`` runs again without anything else
        happening: its future resolved (woken, or cancelled), or the timer that
        resolves it due by ``now``."""
        future = getattr(ticket.wake, "future", None)
        if future is None:
            return False
        if future.done():
            return True
        loop: Any = self.loop
        for handle in loop._scheduled:
            if handle._callback is _resolve and handle._args[0] is future:
                return not handle.cancelled() and handle.when() <= now + EPS
        return False

    def check(self, look: bool = True) -> None:
        """The checks after a step; ``look``: the public snapshot's too (reading
        its count lets the expired holds go, which the gate must also do when
        nobody reads it: a grant's, a ``try_acquire``'s)."""
        assert not self.errors, self.errors
        for key in SLOTS:
            slot = self.slots[key]
            live = self.throttle._live(key)
            gate = live.gate
            holding = [r for r in self.requests if r.key == key and r.state == "holding"]
            waiting = sum(1 for r in self.requests if r.key == key and r.state == "waiting")
            assert (len(holding), waiting) == (slot.holders, slot.waiters)
            counting = self.counting(key)
            assert len(counting) <= max(self.caps[key], slot.over), (key, len(counting))
            self.check_holds(key, gate._holds, holding, counting)
            assert len(gate._queue) == slot.waiters, (key, len(gate._queue), slot.waiters)
            self.check_awake(key, gate, len(counting))
            assert not self.errors, self.errors
            if not look:
                continue
            snapshot = self.throttle.slot(key).snapshot()
            # The public count expires holds first: exactly the holds that count.
            assert (snapshot.in_flight, snapshot.queued) == (len(counting), slot.waiters), key
            assert snapshot.sent == slot.grants, (key, snapshot.sent, slot.grants)
            assert (snapshot.responses, snapshot.failures) == (slot.responses, slot.failures), (
                key,
                (snapshot.responses, snapshot.failures),
                (slot.responses, slot.failures),
            )

    def check_holds(
        self, key: str, holds: set[Any], holding: list[Request], counting: list[Request]
    ) -> None:
        """The gate's holds (private state: the public count expires them, which
        would hide a leak) are the holders' leases: every one that still counts,
        perhaps some past their expiry the gate has not looked at yet, and none
        else (a late finish lets go of its own hold only, once). A lease is
        released once the gate let go of it, and not before."""
        leases = {id(r.lease): r for r in holding}
        for hold in holds:
            assert id(hold) in leases, (key, "a hold no task holds", hold.sent_at)
            assert not hold.released, (key, "a released lease still held", hold.sent_at)
        for request in counting:
            assert request.lease in holds, (key, f"request {request.index} let go early")
        for request in holding:
            assert request.lease is not None
            if request.lease not in holds:  # the gate let it go at its expiry
                assert request.lease.expires_at <= self.now(), (key, request.index)
                assert request.lease.released, (key, f"request {request.index} expired unreleased")

    def drain_silent(self) -> None:
        """Holds that expire: let no held request go, and run the clock until no
        request waits. Every hold expires within hold_timeout, so every request
        still waiting is granted (or reaches its bound) by expiries alone: a
        waiter the gate did not wake at an expiry would wait here for good."""
        # Each request waits at most a delay, a pause and a hold.
        per = MAX_DELAY + MAX_PAUSE + self.hold_timeout
        limit = self.now() + (len(self.requests) + 2) * per
        while self.now() < limit and any(r.state == "waiting" for r in self.requests):
            self.run(asyncio.sleep(MAX_DELAY))
            self.check()
        for request in self.requests:
            assert request.state != "waiting", (
                f"request {request.index} on {request.key} still waiting at {self.now()!r} "
                "with every hold expired: starved"
            )

    def drain(self) -> None:
        """Let every held request go, then run the clock until every task ended."""
        if self.hold_timeout < NEVER:
            self.drain_silent()
        self.draining = True
        for request in self.requests:
            if request.outcome is not None and not request.outcome.done():
                request.outcome.set_result(("released", 0.0))
        # Each request waits at most a delay (<= MAX_DELAY) and a pause (<= MAX_PAUSE).
        limit = self.now() + (len(self.requests) + 2) * (MAX_DELAY + MAX_PAUSE)
        while self.now() < limit and not all(
            r.task is None or r.task.done() for r in self.requests
        ):
            self.run(asyncio.sleep(MAX_DELAY))
            self.check()
        self.run(_turns(3))
        self.check()
        for request in self.requests:
            assert request.task is None or request.task.done(), (
                f"request {request.index} on {request.key} still {request.state} "
                f"at {self.now()!r}: starved"
            )
            if request.bound is None and not request.cancel_asked and request.ended != "refused":
                assert request.ended == "released", (request.index, request.ended)
            if request.cancel_asked and request.ended == "":
                request.ended = "cancelled before asking"
            if request.lease is not None:
                assert request.lease.released, request.index
        for key in SLOTS:
            gate = self.throttle._live(key).gate
            assert not gate._holds and not gate._queue, key
            assert self.throttle.slot(key).in_flight == 0


class _Watched(asyncio.Future[None]):
    """A future a waiting request's task made (the driver's wait), watched at
    its await: a wake-up that came after the request's last check began must
    have resolved it, else the driver waits on what it saw before the wake-up."""

    request: Request
    model: Model

    def __await__(self) -> Generator[Any, None, None]:
        request = self.request
        if request.unseen and not self.done():
            self.model.errors.append(
                f"request {request.index} lost a wake-up between its check and its wait"
            )
        return (yield from super().__await__())

    __iter__ = __await__


@contextmanager
def recorded(model: Model) -> Iterator[None]:
    """The requests' tickets, and a wake-up just after a check: every other
    request, the first time a check leaves it waiting, is woken just after it,
    as by a release in another thread then (a gate is shared with sync
    clients' threads and other loops, whose wake-ups reach a waiter at any
    moment). Its driver must check again, not wait on what it saw; the
    futures its task makes as it waits are watched (``_Watched``)."""
    loop: Any = model.loop
    enqueue, try_acquire, create_future = Gate.enqueue, Gate.try_acquire, loop.create_future

    def enqueue_(gate: Gate, cost: Any = None) -> Ticket:
        ticket = enqueue(gate, cost)
        request = model.current()
        if request is not None:
            request.ticket = ticket
        return ticket

    def try_acquire_(gate: Gate, ticket: Ticket, make: Any) -> float:
        request = model.current()
        if request is not None:
            request.unseen = False
        wait = try_acquire(gate, ticket, make)
        if request is not None and ticket.hold is None and not request.woken:
            request.woken = request.index % 2 == 0
            if request.woken:
                request.unseen = True
                ticket.wake()
        return wait

    def create_future_() -> asyncio.Future[Any]:
        request = model.current()
        if request is None or request.state != "waiting":
            return create_future()  # type: ignore[no-any-return]
        future = _Watched(loop=loop)
        future.request, future.model = request, model
        return future

    Gate.enqueue, Gate.try_acquire = enqueue_, try_acquire_  # type: ignore[method-assign,assignment]
    loop.create_future = create_future_
    try:
        yield
    finally:
        Gate.enqueue, Gate.try_acquire = enqueue, try_acquire  # type: ignore[method-assign]
        loop.create_future = create_future


def _recording_maker(
    model: Model, key: str, gate: Gate, make: Callable[[float], Lease]
) -> Callable[[float], Lease]:
    def made(now: float) -> Lease:
        model.making(key, gate)
        return make(now)

    return made


async def _turns(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def run_script(policy: str, script: list[Op], hold_timeout: float = NEVER) -> Model:
    """Run ``script`` on a fresh throttle under ``policy``, checking after every step."""
    variant = VARIANTS[policy]
    # One idle turn before the clock jumps is enough: nothing here waits on I/O.
    loop = looptime.new_event_loop(start=100.0, noop_cycles=1)
    try:
        throttle = Throttle(
            clock=loop.time,
            policy=variant.policy(),
            jitter=variant.jitter,
            rng=random.Random(7),
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
        model = Model(loop, throttle, variant.spaced, hold_timeout=hold_timeout)
        for key in SLOTS:
            live = throttle._live(key)
            make = throttle._turns.maker(live, True)
            live.hold_maker = _recording_maker(model, key, live.gate, make)
        with recorded(model):
            for step, op in enumerate(script):
                model.apply(op)
                # Where holds expire, the public count only after every fourth step.
                model.check(look=hold_timeout >= NEVER or step % 4 == 3)
            model.drain()
        return model
    finally:
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.close()


@settings(
    max_examples=int(os.environ.get("AUTOTHROTTLE_MODEL_EXAMPLES", "400")),
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(policy=st.sampled_from(sorted(VARIANTS)), script=scripts)
def test_random_interleavings_keep_every_promise(policy: str, script: list[Op]) -> None:
    model = run_script(policy, script)
    for how in sorted({r.ended for r in model.requests}):
        event(f"a request {how}")
    event(f"requests: {len(model.requests) // 5 * 5}+")
    event(f"on the wire: {min(model.wires, 3)}+")


@settings(
    max_examples=int(os.environ.get("AUTOTHROTTLE_MODEL_EXAMPLES", "150")),
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(policy=st.sampled_from(sorted(VARIANTS)), script=expiring_scripts)
def test_holds_that_expire_keep_every_promise(policy: str, script: list[Op]) -> None:
    # The same scripts with a hold_timeout shorter than the clock's steps: a
    # holder left silent outlives its hold, and may finish late; the end lets
    # the holds expire before it lets any go.
    model = run_script(policy, script, hold_timeout=HOLD)
    event(f"finished late: {min(model.late, 3)}+")


WAKE_PATHS: dict[str, list[Op]] = {
    "finish": [Ask(0, None), Ask(0, None), Turns(3), Advance(1.0), Finish(0, "finish"), Turns(3)],
    "cap": [Ask(0, None), Ask(0, None), Turns(3), Advance(1.0), SetCap(0, 2), Turns(3)],
    "delay": [Ask(1, None), Ask(1, None), Turns(3), SetDelay(1, 0.0), Turns(3)],
}
"""A head waiting for its turn, and a step that frees it at once: a turn ended
by ``Lease.finish`` (past the spacing), the cap raised, the delay set by hand
to 0; each must wake the head, which the check after it finds parked otherwise."""


@pytest.mark.parametrize("policy", sorted(VARIANTS))
@pytest.mark.parametrize("path", sorted(WAKE_PATHS))
def test_what_frees_a_turn_wakes_the_head(path: str, policy: str) -> None:
    model = run_script(policy, WAKE_PATHS[path])
    assert [r.ended for r in model.requests] == ["released", "released"]


def test_try_acquire_takes_the_turn_an_expired_hold_left() -> None:
    # A hold past its hold_timeout no longer counts (rule 5): a slot at its cap
    # only by such holds has a free turn, which try_acquire (and the adapters'
    # acquire_now) must not refuse before anything else let the hold go.
    now = [0.0]
    throttle = Throttle(
        policy=FixedDelayPolicy(0.0), clock=lambda: now[0], max_concurrency=1, hold_timeout=5.0
    )
    assert throttle.try_acquire("k") is not None  # never released
    now[0] = 4.9
    assert throttle.try_acquire("k") is None  # still counts
    now[0] = 5.0
    lease = throttle.acquire_now("k")
    assert lease is not None and lease.sent_at == 5.0
    lease.release()
    assert throttle.try_acquire("k") is not None
    assert throttle.slot("k").in_flight == 1


@pytest.mark.parametrize("policy", sorted(VARIANTS))
def test_a_busy_script_runs_to_the_end(policy: str) -> None:
    # A fixed interleaving that meets each kind of step at least once, so that
    # the model itself is known to see grants, waits, timeouts and cancels.
    script: list[Op] = [
        Ask(0, None),
        Ask(0, None),
        Ask(0, 0.25),
        Ask(1, None),
        Ask(1, None),
        Ask(1, None),
        Ask(2, None),
        Turns(5),
        Advance(0.5),
        Cancel(1),
        Finish(0, "refused", 2.0),
        Advance(1.0),
        Finish(0, "ok", 0.3),
        Pause(1, 1.0),
        Advance(2.0),
        Ask(1, 0.0, now_only=True),
        SetDelay(0, 0.0),
        Finish(0, "failed"),
        Finish(0, "raised"),
        Advance(5.0),
    ]
    model = run_script(policy, script)
    assert {r.ended for r in model.requests} == {
        "released",
        "cancelled waiting",
        "timeout",
        "refused",
    }

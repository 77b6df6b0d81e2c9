"""A fleet turn's second look at its slack, at the wire (the fleet's rule 1).

The rules are written once, in :mod:`autothrottle._fleet`'s docstring; this is
:class:`WireCheck`, the part of rules 1-3 that runs when a request's
connection is ready, long after :class:`~autothrottle._fleet.Fleet` let it go.
What a request's lease holds of its turn (:class:`HeldTurn`, :class:`NoTurn`)
is :mod:`autothrottle._fleet_hooks`'; it is named here too, where the check
swaps one for the other. It sits below the fleet and reaches it only through
:class:`WireFleet`, what it uses of it, so that the fleet stays the one writer
of what this process sees of a fleet's slot (``LiveSlot.fleet_went``:
:meth:`WireFleet.went`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Callable

from ._errors import ThrottleTimeout
from ._fleet_hooks import HeldTurn, NoTurn, WireFleet
from ._fleet_turns import LATE_TOLERANCE, SharedTurn
from ._lease import Lease
from ._slot import LiveSlot

logger = logging.getLogger(__name__)

__all__ = ["WIRE_POLL", "HeldTurn", "NoTurn", "WireCheck", "WireFleet"]


WIRE_POLL = 0.002
"""Seconds between a waiting request's looks at a turn being taken at the wire."""


class WireCheck:
    """A closing turn's second look at its slack, when its request's connection
    is ready (rule 1).

    A request reaches the wire later than its turn when its connection is new
    or its event loop busy (tens to hundreds of milliseconds on a loaded
    machine, after :meth:`Fleet._done` let it go on time). Later than the
    slack, the turn goes back and another is taken, and the request waits for
    it at the wire, once per request as at its turn; a later turn of the
    request reached late (the one it waits for here, or the one it went on
    after handing one back at its turn) goes off its turn after the store's
    look found no pause of the fleet's and room under its cap
    (:meth:`Fleet.looked`): only the store knows what another process set
    while this one stood still. A pause that runs then (this process's own,
    or another's the store heard of: :meth:`Fleet.paused`) voids the turn,
    as at the turn (rule 2): it goes back, and a new one is taken when the
    pause is over. :meth:`Lease.wire_wait` calls it:
    0.0 when the request may go, else the seconds to wait before asking again.

    The bounds hold as at the turn (rule 3): a new turn, or a pause or the
    cap the fleet answers with, that ends later than the request's
    ``max_wait`` allows is not waited for, and the request is not sent
    either (sent off its turn, through the pause, the host's limit would not
    hold): the turn it held goes back (its time too, when nobody reserved
    after it) and :class:`~autothrottle.ThrottleTimeout` is raised, which the
    request's exchange hands its caller as a turn past ``max_wait`` (never
    the host's failure). What the store raises (it answers an outage itself,
    rule 6: anything else is a fault, or its task was cancelled with the
    loop) the request raises, as at its turn (:meth:`Fleet.take_turn`):
    neither sent off its turn nor counted as the host's. A request given up
    here (cancelled, failed, its error raised) never sent the turn it holds
    while it waits for it or for the store's look at it (:meth:`_hold`):
    the turn goes back whole, its time too when nobody reserved after it
    (:meth:`HeldTurn.hand_back`), as at its turn; so does a turn answered
    after its request was given up, and an error, with nobody to raise it
    to, is logged.
    """

    __slots__ = (
        "_again",
        "_bound",
        "_came",
        "_failed",
        "_fleet",
        "_held",
        "_lease",
        "_looking",
        "_skipped",
        "_slot",
        "_task",
        "_turn",
        "_until",
    )

    def __init__(
        self,
        fleet: WireFleet,
        slot: LiveSlot,
        lease: Lease,
        turn: SharedTurn,
        until: float,
        bound: float | None = None,
        skipped: bool = False,
    ) -> None:
        self._fleet, self._slot, self._lease = fleet, slot, lease
        self._turn: SharedTurn | None = turn  # None: a new one is taken from _again on
        self._came = True  # the turn held came (a new one taken here is waited for)
        self._until = until
        self._bound = bound
        self._skipped = skipped  # the request handed a late turn back already
        self._again = -math.inf
        self._task: asyncio.Task[SharedTurn] | None = None
        self._looking = False  # the task is the store's look at _turn, not a new turn
        self._failed = False
        self._held: HeldTurn | None = None  # the turn held here, not sent yet (_hold)

    def __call__(self) -> float:
        if self._failed:  # asked again (a client's retry of the write): still past the bound
            self._timed_out()
        task = self._task
        if task is not None:
            if not task.done():
                return WIRE_POLL  # the store's answer is on its way
            self._task = None
            if not task.cancelled() and task.exception() is not None:
                self._hand_back_turn()  # raised here, to the request: not lost
            if self._looking:
                return self._seen(task.result())  # what look raised, raised here
            return self._taken(task.result())  # what take_turn raised, raised here
        turn = self._turn
        if turn is not None:
            return self._at(turn, time.monotonic())
        now = time.monotonic()
        if now < self._again:
            return self._again - now
        return self._take()

    def _at(self, turn: SharedTurn, now: float) -> float:
        """The request holds ``turn``: wait for it, go on it, or let it go (rules 1-3).

        Only a turn taken here is waited for: the turn :meth:`Fleet._done`
        let go came already, and its own send is what a run's next turn is
        spaced from (rule 8), not a reason to hold it a run's gap more."""
        if not self._came:
            wait = 0.0 if turn.due is None else turn.due - now
            if turn.joined:
                wait = max(
                    wait, self._fleet.after_own(self._slot, turn, self._fleet.ask(self._slot))
                )
            if wait > 0.0:
                if now + wait > self._until:  # unused: back, its time too if nobody reserved after
                    self._drop(late=True)
                    self._timed_out()
                return wait
            self._came = True
        late = turn.due is not None and now - turn.due > turn.slack + LATE_TOLERANCE
        paused = self._paused()
        if paused:  # void; a late turn's time goes back too, as at its turn (rule 1)
            self._drop(late=late)
            return self._wait_out(now, paused)
        if not late:  # on the turn the fleet let go, or on one held here
            return self._go() if self._held is None else self._go_held()
        if not self._skipped:  # once per request: back, and a new turn
            self._skipped = True
            self._drop(late=True)
            return self._take()
        return self._look(turn)

    def _drop(self, *, late: bool) -> None:
        """The turn held is void: it goes back (``late``: its time too, when
        nobody reserved after it); the request holds nothing."""
        turn, self._turn = self._turn, None
        self._held = None
        self._lease.on_release = NoTurn(self._fleet, self._slot)
        if turn is not None and turn.lease is not None:
            store = self._fleet.store
            (store.late if late else store.released)(self._slot.key, turn.lease)

    def _hold(self, lease: str) -> None:
        """The request holds the turn ``lease`` here, at the wire, and waits: given
        up now, it never sent it, and its release hands it back whole
        (:meth:`HeldTurn.hand_back`); :meth:`_go_held` makes it a sent turn's again."""
        self._held = held = HeldTurn(self._fleet, self._slot, lease)
        self._lease.on_release = held.hand_back

    def _hand_back_turn(self) -> None:
        """The store raised: the request raises it, and its release hands back
        the turn it holds, if any, whole (it was never sent)."""
        turn = self._turn if self._looking else None
        if turn is None or turn.lease is None:
            self._held = None
            self._lease.on_release = NoTurn(self._fleet, self._slot)
        else:
            self._hold(turn.lease)

    def _take(self) -> float:
        fleet, key = self._fleet, self._slot.key
        ask = fleet.ask(self._slot)
        left = self._until - time.monotonic()  # behind another's ask, no longer (rule 3)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a thread: the sync client
            return self._taken(fleet.store.take_turn_blocking(key, ask, fleet.clock(), left))
        self._looking = False
        self._task = task = loop.create_task(fleet.store.take_turn(key, ask, fleet.clock(), left))
        task.add_done_callback(self._answered)
        return WIRE_POLL

    def _look(self, turn: SharedTurn) -> float:
        """Ask the store whether the late ``turn`` may go now (:meth:`Fleet.looked`)."""
        fleet, key = self._fleet, self._slot.key
        assert turn.lease is not None
        self._hold(turn.lease)
        ask = fleet.ask(self._slot)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a thread: the sync client
            return self._seen(fleet.store.look_blocking(key, turn.lease, ask, fleet.clock()))
        self._looking = True
        self._task = task = loop.create_task(fleet.store.look(key, turn.lease, ask, fleet.clock()))
        task.add_done_callback(self._answered)
        return WIRE_POLL

    def _answered(self, task: asyncio.Task[SharedTurn]) -> None:
        """The store's answer came: held by the request until it looks at it,
        or a new turn handed back at once if the request was given up
        meanwhile (then nobody looks). A failed task is left for the
        request's look to raise; with nobody to look (given up before or
        after the answer), its error is logged, never lost and never raised
        here."""
        if task.cancelled():  # the loop is ending
            return
        error = task.exception()
        if error is not None:
            if self._lease.released:  # what it held went back with its release
                self._lost(error)
            else:  # logged if the request is let go without looking
                held = self._held if self._looking else None
                let_go = NoTurn(self._fleet, self._slot) if held is None else held.hand_back
                self._lease.on_release = functools.partial(self._lost, error, let_go)
            return
        lease = task.result().lease
        if lease is None or self._looking:  # a look's lease is the turn the request holds
            return
        if self._lease.released:  # never sent: back whole
            self._task = None
            HeldTurn(self._fleet, self._slot, lease).hand_back()
        else:
            self._hold(lease)

    def _lost(self, error: BaseException, let_go: Callable[[], None] | None = None) -> None:
        """The store failed with nobody to raise it to: say so in the log (and
        ``let_go`` of what the request, given up now, holds: a turn it never
        sent, :meth:`HeldTurn.hand_back`, or none, :class:`NoTurn`)."""
        if let_go is not None:
            let_go()
        logger.warning(
            "autothrottle: slot %r: a fleet turn taken again at the wire failed after its "
            "request was given up (%s: %s)",
            self._slot.key,
            type(error).__name__,
            error,
            exc_info=(type(error), error, error.__traceback__),
        )

    def _taken(self, new: SharedTurn) -> float:
        now = time.monotonic()
        if new.lease is None and new.wait > 0.0:  # a pause, the cap: ask again then
            self._fleet.adopt(self._slot, new)  # rule 4: the other turns waiting see it too
            return self._wait_out(now, new.wait)
        if new.lease is not None:
            if self._lease.released:  # the request was given up meanwhile: back whole
                HeldTurn(self._fleet, self._slot, new.lease).hand_back()
                return 0.0
            self._hold(new.lease)
        self._turn, self._came = new, False
        return self._at(new, now)

    def _seen(self, seen: SharedTurn) -> float:
        """The store's look at the late turn held (:meth:`Fleet.looked`): it goes,
        or it is void and the request waits the fleet's pause (or its cap) out,
        then takes a new turn."""
        turn = self._turn
        assert turn is not None and turn.lease is not None
        now = time.monotonic()
        try:
            wait = self._fleet.looked(
                self._slot, self._lease, turn.lease, seen, self._bound, self._until - now
            )
        except ThrottleTimeout:
            self._turn, self._held, self._failed = None, None, True
            raise
        if wait <= 0.0:
            return self._go_held()
        self._turn = self._held = None
        self._again = now + wait
        return wait

    def _paused(self) -> float:
        """Seconds a pause of the slot still runs (0.0: none): this process's
        own, or another process's that the store heard of (:meth:`Fleet.paused`).

        The slot's gate holds a paused request after this check let it go,
        with no second look: a turn let go into a pause left late, at the
        end of it, just before the next process's punctual turn (a 429's
        1-s ``Retry-After`` held turns 0.5 s past their time in a loaded
        fleet crawl: a refusal, and three requests in a second at the host).
        So a pause voids the turn here as at the turn (rule 2,
        :meth:`Fleet._done`): it goes back, and a new one is taken when the
        pause is over.
        """
        return self._fleet.paused(self._slot)

    def _wait_out(self, now: float, paused: float) -> float:
        """Wait out a pause (this process's, the fleet's) or the fleet's cap, then
        take a new turn; past the request's ``max_wait``, fail at once (rule 3)."""
        if now + paused > self._until:
            self._timed_out()
        self._again = now + paused
        return paused

    def _timed_out(self) -> None:
        """The wait passes the request's ``max_wait``: it fails, as at its turn
        (rule 3). The check stays on the lease: a client that retries the
        write on a new connection (urllib3's retries) is refused again, not
        sent off its turn."""
        self._failed = True
        raise ThrottleTimeout(self._slot.key, self._bound or 0.0)

    def _go(self) -> float:
        self._lease.on_wire = None
        self._fleet.went(self._slot)
        return 0.0

    def _go_held(self) -> float:
        """:meth:`_go` on the turn held here (:meth:`_hold`): from now on a sent
        one, whose release hands back its lease only."""
        self._lease.on_release = self._held
        return self._go()

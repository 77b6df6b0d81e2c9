"""The fleet: how processes that share a store pace each slot as one.

A shared store (:class:`autothrottle.redis.RedisStore`) implements
:class:`SharedTurns`; the throttle talks to it only through :class:`Fleet`,
here, which passes every time on the throttle's own clock (``now``). The
rules, numbered as the Lua scripts of :mod:`autothrottle._redis_lua` cite them
(the scripts run rules 1, 2 and 5 on the server, atomically, on its clock):

1. **Turn.** A request takes its process's own turn (the slot's gate: FIFO,
   cap, spacing), then the fleet's: the fleet reserves the slot's next send
   at ``max(now, next free time)`` and moves the free time one gap past it.
   The gap is the fleet's delay (the asker's own delay while the fleet has
   none), within the asker's ``min_delay`` .. ``max_delay`` and never shorter
   than the pace the host stated in its headers (a rate-limit policy or
   budget), to the asker (which its gate keeps too) or to any process of the
   fleet (the store keeps it, rule 5, so a process that has not heard the
   host yet keeps it from its first request): beyond ``max_delay`` as well,
   and as the gate does only until that pace ends, a gap cut to what is left
   of it, and at most the asker's ``max_pause`` (as any header it reads). A
   pace that begins spaces the next send from the latest reserved at once,
   not one gap of the old pace on. All times :data:`SPACING_MARGIN`: sends
   of different processes reach the host each with its own process's
   lateness, and a host that allows exactly the rate refuses the one that
   arrives early; the asker's own lateness lately (how
   long after its reserved time its sends left) is added to the gap after its
   send, so a late process costs the fleet its lateness, not a refusal. A
   turn the asker reaches later than that room (its :func:`slack`), at its
   due time or when its connection is ready
   (:class:`~autothrottle._fleet_wire.WireCheck`), is not sent but handed
   back and another taken, once per request: sent, it would reach the host
   closer than the gap to the next turn reserved after it.
   A later turn of the request reached late goes off its turn (so a process
   late every time still sends), after the store looked, reserving nothing,
   that no pause of the fleet's runs (rule 2) and that its lease still holds
   a place under the cap (an expired one needs a free place again): while
   the process stood still another may have paused the slot, which only the
   store knows. Looked at the wire, it goes without another look. A
   new slot (or one idle for a minute) sends first at its own phase point: a
   fraction of the gap (of a second, if the gap is longer) that the slot's
   name sets, so a crawl that starts many hosts at once does not send every
   host's turns at the same instants ever after (a burst of hundreds leaves
   late, and the next process's punctual send reaches the host early). That
   first wait is half a gap on average, never more than one gap or a second.
   A send is never reserved more than the asker's gap after the next free
   time it would have had with that gap. The fleet holds at most
   ``max_concurrency`` leases per slot, reserved or in flight, each expiring
   ``hold_timeout`` after its send, so a crashed process's share comes back.
   At the cap nothing is reserved: the asker asks again within 50 ms.
2. **Pause.** While the fleet's pause runs, as long as the asker's own
   ``max_pause`` allows, nothing is reserved: the asker is told to ask again
   at its end. A pause that begins while a request waits for its reserved
   send voids that turn: it is handed back and a new one asked for, so the
   turns reserved before a pause do not all leave together when it ends
   (a pause this process knows of, seen at the turn and at the wire: its
   own, or the fleet's as adopted from any answer of the store for the
   slot, rule 4, the look at a turn reached late included, rule 1). A
   pause another process sets while this one asks the store nothing for
   the slot (its turn waits for its due) reaches it anyway: the store tells
   the fleet of every pause it records, and a store that holds turns of the
   slot hears it (:meth:`SharedTurns.fleet_pause`) and voids them as its
   own, the pause adopted into the slot's state (rule 4), so the slot's
   other requests wait it out too. What the store did not hear (it was not
   listening yet, or its store was unreachable) reaches it with its next
   answer, as before.
3. **Bounds.** Every wait, the process's and the fleet's, obeys the local
   bounds: a request waits at most its ``max_wait`` all told (a reserved
   turn further away than that is handed back at once, and the request
   fails with :class:`~autothrottle.ThrottleTimeout`); a pause adopted from
   the fleet lasts at most ``max_pause``.
4. **Adoption.** At each turn the process takes the fleet's delay (within
   its ``min_delay`` .. ``max_delay``) and pause (within ``max_pause``), so a
   new process starts where the fleet is, and how many processes took a turn
   on the slot lately (``LiveSlot.senders``): it sees that share of the
   host's answers, and the pacing rules judge the pace the host let through
   from its own successes times that (a refusal at the configured pace is
   then jitter, a margin step, not a backoff of the whole fleet).
5. **Merge.** Each response, failure and backoff is shared, coalesced per
   slot. Only the first signal of a burst counts (``docs/recovery.md``, "One
   backoff per burst", the rule the engine applies to one process): a
   backoff for a request sent before the fleet's last backoff changes
   nothing, and a response to such a request never lowers the fleet's delay.
   A refused request counts as sent when the store's answer gave it its
   turn if the slot backed off between its gate's grant and that answer (it
   waited that backoff's pause out): it went at the new pace.
   A backoff at a strict pace (the policy's own, as ``FixedRatePolicy``'s)
   that the fleet kept is the host's jitter, judged on the fleet's successes
   as one process judges its own (``docs/recovery.md``, "At the stated
   pace"): at least two since the fleet's last counted backoff, coming
   within 1.25 gaps each, or the latest two within 2.5 gaps of the refusal
   (the fleet never sends faster than a strict pace: wider gaps before them
   were its own slowness, a start or a delay coming back down, and a slow
   start made the first jitter refusal a full backoff). Each process sees
   only its share of them, so one process alone would take the refusal for
   a real one: the fleet's delay stays, and the pause the refusal asked for
   lasts at most one gap. Any other backoff is counted: it dates the fleet's backoff, starts the
   successes' count again, and never lowers the delay. Otherwise the
   process's delay becomes the fleet's, but a strict pace rises only by a
   counted backoff. Of two pauses the later end wins. A pace the host stated
   in the process's answers while it holds (``Limits.stated_pace``: its gap
   and its end) is the fleet's (rule 1) until that end: of two, the one
   that keeps a send longer now wins (each gap cut to what is left of it:
   a budget spent further, whose reset rounded to the second may end a
   little earlier, or a budget's gap wider than the policy's pace, which
   ends later), and of two that keep it as long the later end (each answer
   that states it renews it, so that is the host's latest word; a narrower
   pace waits for the wider to end, at most its window); only a process
   that heard it writes it, so nobody
   renews it whom the host did not tell; the answer by which one begins, or
   widens by more than a quarter, goes to the store as soon as a backoff,
   and the store tells it on the prefix's channel (rule 8). The last record is kept
   (``RedisStore.shared_record``).
6. **Alone.** When the store is unreachable or slow, the process paces on its
   own, from what it learned last, and keeps its share of the fleet's last
   pace: the fleet's gap times the processes that took a turn on the slot in
   the last minute (a slot it never shared: its own gap times the most
   processes seen on any slot). That gap is the one the store's last answer
   of the slot (a turn, the cap, a pause) said it reserves with, a pace a host
   stated to any process included until that pace ends, then without it (rule
   1). With ``fail_closed`` it waits for the store
   instead (rule 3 bounds that wait). A data error (a key of the wrong type)
   sends only its own slot alone.
7. **Handing back.** A finished request's lease goes back with the next
   message to the store; one that could not be sent is kept and sent again
   (handing back is idempotent), so a slow moment never leaves a lease that
   blocks the slot until ``hold_timeout``. A request never finished is let
   go by its process at ``hold_timeout`` (its lease expires, ``Lease.expire``)
   without that ending: its lease in the store expires ``hold_timeout`` after
   its due on the store's side, and the rest of its run, if it was the last
   request of the process for the slot, is not handed back then (rule 8): the
   next request of the process hands back the turns past their due (or takes
   those still ahead), or the slot's forgetting (``idle_timeout``) or the
   store's close does; each of their leases expires ``hold_timeout`` after its
   due meanwhile, as a crashed process's do, at most :data:`RUN_MOST` - 1
   gaps after the request's own. That is the fleet's bound for a lease
   nobody hands back: nothing is held past it. Their time is long past then,
   unless ``hold_timeout`` is shorter than the run: the turns still ahead
   stay reserved, unused unless the process sends again. A request whose
   hold runs out before it ends (it waited a pause or the cap out, its
   response was slow) is not lost, though: its lease stays unreleased, and
   its end hands back what it holds as any request's does (the fleet's other
   processes need not wait for the store's expiry). The expiry runs no
   release hook on purpose: the gate lets go of the lease under its lock, in
   the middle of a count of what is in flight, which :meth:`Fleet.left` asks
   for itself; deferred, the hook would need an event loop or a thread for
   what the bound above gives back anyway.
8. **Runs.** A process whose requests to a slot come faster than the fleet
   gives it turns takes a run of consecutive turns in one round trip
   (:class:`Run`): the next request takes the next turn of the run without
   asking the store. A turn of the run goes no sooner than one run's gap
   after the run's previous turn reached the wire (after the process let it
   go, until it has), so a send that left late delays the next of the run
   instead of letting it arrive early; only
   where the run ends and another
   process's begins do two processes' lateness meet, and that junction gets
   the room of this process's lateness for every turn of the run. A run is
   one turn long at first and doubles, up to :data:`RUN_MOST`, each time
   a request of the process took a turn of the last run or waited for it; a
   turn of the run that no request took in time is handed back, and so is
   the rest of the run when no request of the process is left for the slot
   (its time comes back to the fleet when no other process reserved after
   it); the next run is then one turn long again. A run takes at most half of the slot's free leases
   (each turn is a lease, rule 1), so the other processes still get turns.
   A run reserved before a pace the host stated began, narrower than it, is
   void, as a pause voids reserved turns (rule 2): at its due, a turn of the
   run (not its first) whose spacing is narrower than the stated pace this
   process knows, from its own answers or as its store heard another
   process's on the channel, goes back with the rest of the run, the latest
   first, and its request asks again; a store that hears it hands the run's
   untaken turns back at once, if the store reserved the run before the
   merge that told it and narrower than the pace as the store cuts it (to
   what is left of it, to the asker's ``max_pause``): a run reserved after
   it, near the pace's end, is spaced by what is left, as the pace asks.
   Sent, the run's turns would keep the old spacing for up to
   :data:`RUN_MOST` - 1 turns fleet-wide, or, held to the pace by the
   process's gate, run into the turns reserved after the run.
   A process keeps one reservation of a slot waiting at a time: a request
   that finds its process's last reserved turn not yet due waits for it,
   then asks (so a run, not a queue of single turns, serves its requests);
   and one ask of the slot on its way to the store: a request that finds
   another of its process asking (the slot's first ask too, before the
   store ever answered) waits for that answer, first come first, within
   its ``max_wait`` (rule 3), and is served from it: a turn of the run, the
   pause or the cap the store answered with, or the next ask, which the
   requests after it wait for in turn (not for the due of a turn they could
   not take: they would have asked alongside). A request given up meanwhile
   holds nothing; one given up while it waits for its reserved turn's due
   time (cancelled, past its ``max_wait``), or at the wire while it waits
   for a turn taken there or for the store's look, hands the turn back as
   one no request took, its time too when nobody reserved after it
   (:class:`~autothrottle._fleet_hooks.HeldTurn`); so does one whose
   connection was never made (refused, a connect timeout, a name not found,
   as its client says before its wire turn, or cancelled while it was being
   made, or while it waited for one in its client's own pool:
   :func:`~autothrottle._fleet_hooks.never_sent`), and one cancelled
   while its gate held it at the wire after the fleet let its turn go, which
   carried nothing to the host (a failure is the host's still, rule 5). However a request ends,
   finished or given up, holding a turn or none (waiting out a pause or the
   cap, its ask on its way, gone alone:
   :class:`~autothrottle._fleet_hooks.NoTurn`), in its process's queue too,
   the last of the process's for the slot hands the run's rest back.
   A process's first turn of a slot in :data:`FRESH_AFTER` seconds may leave
   on a new connection, late by its setup, which the process cannot see
   coming: the turn after it is reserved :data:`FRESH_ROOM` of a gap (at
   most :data:`FRESH_MOST`) later.

A time crossing the seam is on the throttle's clock: the store turns it into
"seconds before now" before it leaves the process (``docs/architecture.md``,
"The clock contract").
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Generator, Mapping
from typing import Any

import anyio

from ._errors import ThrottleTimeout
from ._fleet_hooks import HeldTurn, NoTurn
from ._fleet_turns import (
    FRESH_AFTER,
    FRESH_MOST,
    FRESH_ROOM,
    LATE_MOST,
    LATE_SHARE,
    LATE_TOLERANCE,
    RUN_MOST,
    SPACING_MARGIN,
    Lateness,
    Run,
    SharedTurn,
    SharedTurns,
    TurnAsk,
    narrower_than_stated,
    slack,
)
from ._fleet_wire import WireCheck
from ._lease import Lease
from ._rules import Rules
from ._slot import LiveSlot

GO, AGAIN, LOOK = 0, 1, 2
"""What :meth:`Fleet._done` says of a turn that came: the request goes; its turn
is void and it asks again; it asks the store whether it may go (rule 1)."""

_TAKE, _LOOK, _SLEEP = 0, 1, 2
"""What :meth:`Fleet._steps` asks its driver to do: take a turn, look at one, sleep."""

__all__ = [
    "AGAIN",
    "FRESH_AFTER",
    "FRESH_MOST",
    "FRESH_ROOM",
    "GO",
    "LATE_MOST",
    "LATE_TOLERANCE",
    "LOOK",
    "RUN_MOST",
    "SPACING_MARGIN",
    "Fleet",
    "Lateness",
    "Run",
    "SharedTurn",
    "SharedTurns",
    "TurnAsk",
    "narrower_than_stated",
    "slack",
]


class Fleet:
    """The throttle's side of a shared store: its turns, adoption and reports.

    It stands between a lease and the rules (it is the lease's reporter), so
    every change the rules make after a request reaches the fleet with that
    request's send time (rule 5).
    """

    __slots__ = ("_rules", "clock", "late", "store")

    def __init__(self, store: SharedTurns, rules: Rules, clock: Callable[[], float]) -> None:
        self.store = store
        self._rules = rules
        self.clock = clock
        self.late = Lateness()

    # -- turns (rules 1-4) ------------------------------------------------------------

    async def take_turn(
        self, slot: LiveSlot, lease: Lease, bound: float | None, left: float
    ) -> None:
        """Wait for the fleet's turn after the slot's own was granted (:meth:`_steps`).

        ``bound`` is the request's ``max_wait`` (None: none), ``left`` what is
        left of it. On any failure, cancellation or timeout the lease is released.
        """
        clock = anyio.current_time
        deadline = clock() + left
        steps = self._steps(slot, lease, bound, deadline, clock)
        try:
            step, arg = next(steps)
            while True:
                if step == _SLEEP:
                    await anyio.sleep(arg)
                    step, arg = steps.send(None)
                elif step == _TAKE:
                    turn = await self.store.take_turn(
                        slot.key, arg, self.clock(), deadline - clock()
                    )
                    step, arg = steps.send(turn)
                else:
                    turn, ask = arg
                    seen = await self.store.look(slot.key, turn, ask, self.clock())
                    step, arg = steps.send(seen)
        except StopIteration:
            return
        except BaseException:
            self._unsent(slot, lease)
            raise

    def take_turn_blocking(
        self, slot: LiveSlot, lease: Lease, bound: float | None, left: float
    ) -> None:
        """:meth:`take_turn` for a thread."""
        clock = time.monotonic
        deadline = clock() + left
        steps = self._steps(slot, lease, bound, deadline, clock)
        try:
            step, arg = next(steps)
            while True:
                if step == _SLEEP:
                    time.sleep(arg)
                    step, arg = steps.send(None)
                elif step == _TAKE:
                    turn = self.store.take_turn_blocking(
                        slot.key, arg, self.clock(), deadline - clock()
                    )
                    step, arg = steps.send(turn)
                else:
                    turn, ask = arg
                    seen = self.store.look_blocking(slot.key, turn, ask, self.clock())
                    step, arg = steps.send(seen)
        except StopIteration:
            return
        except BaseException:
            self._unsent(slot, lease)
            raise

    def _steps(
        self,
        slot: LiveSlot,
        lease: Lease,
        bound: float | None,
        deadline: float,
        clock: Callable[[], float],
    ) -> Generator[tuple[int, Any], Any, None]:
        """The fleet's turn of a request, without I/O: each step it yields is done
        by :meth:`take_turn` (awaited) or :meth:`take_turn_blocking` (in a
        thread), which send back the answer. ``(_TAKE, ask)``: the store's turn;
        ``(_LOOK, (lease, ask))``: the store's look at a turn reached late again;
        ``(_SLEEP, seconds)``. ``deadline`` is the request's ``max_wait`` on
        ``clock``; it returns when the request may go (rules 1-4)."""
        skipped = False  # a late turn is handed back once per request, not forever
        while True:
            ask = self.ask(slot)
            turn: SharedTurn = yield _TAKE, ask
            wait = self._settle(slot, lease, turn, ask, bound, deadline - clock())
            while wait > 0.0 or (wait := self.after_own(slot, turn, ask)) > 0.0:
                yield _SLEEP, wait
                wait = 0.0
            done = self._done(slot, lease, turn, skipped)
            if done == LOOK:
                assert turn.lease is not None
                seen: SharedTurn = yield _LOOK, (turn.lease, ask)
                wait = self.looked(slot, lease, turn.lease, seen, bound, deadline - clock())
                if wait > 0.0:
                    yield _SLEEP, wait
                else:  # the look at the wire counts from this one
                    turn, done = turn._replace(due=time.monotonic()), GO
            if done == GO:
                self._check_at_wire(slot, lease, turn, skipped, bound, deadline - clock())
                return
            skipped = skipped or turn.lease is not None

    def _unsent(self, slot: LiveSlot, lease: Lease) -> None:
        """The request ends before its turn went (cancelled while it waited for
        the turn's due time, the store's answer or look, a pause or the cap,
        past its ``max_wait``, a fault): the turn it holds (:meth:`_settle`)
        was never sent, so it goes back as a late one does, its time too when
        nobody reserved after it (rules 3, 8; :meth:`HeldTurn.hand_back`; a
        finished request's hands back its lease only), and the lease is
        released. Holding none (:class:`NoTurn`, or None before the store's
        first answer), the last of this process's for the slot still hands
        its run's rest back (rule 8). Only this path pays for it."""
        held = lease.on_release
        if isinstance(held, HeldTurn):
            lease.on_release = held.hand_back
        elif held is None:
            lease.on_release = NoTurn(self, slot)
        lease.release()

    def _check_at_wire(
        self,
        slot: LiveSlot,
        lease: Lease,
        turn: SharedTurn,
        skipped: bool,
        bound: float | None,
        left: float,
    ) -> None:
        """Have the lease look at its turn's slack again when its connection is
        ready (:class:`WireCheck`): the first request on a new connection, or
        one whose event loop was busy, reaches the wire long after its turn.
        ``skipped``: the request handed a late turn back already.
        ``bound``: the request's ``max_wait`` (None: none), ``left`` what is left of it.
        A turn inside a run only notes when it reached the wire: the run's next
        turn goes a gap after that (rule 8), not after the moment it was let go."""
        if turn.due is None:
            return
        if turn.slack == math.inf:
            if not turn.closes:
                lease.on_wire = functools.partial(self._on_the_wire, slot, lease)
            return
        until = math.inf if bound is None else time.monotonic() + left
        lease.on_wire = WireCheck(self, slot, lease, turn, until, bound, skipped)

    @staticmethod
    def _on_the_wire(slot: LiveSlot, lease: Lease) -> float:
        Fleet.went(slot)
        lease.on_wire = None
        return 0.0

    @staticmethod
    def went(slot: LiveSlot) -> None:
        """This process let a fleet turn of ``slot`` go, now: the next turn of its
        run is spaced from this send (rule 8, :meth:`after_own`). Here, at the
        turn and at the wire (:class:`~autothrottle._fleet_wire.WireCheck`), the
        fleet is the one writer of what this process sees of a fleet's slot."""
        slot.fleet_went = time.monotonic()

    def _done(self, slot: LiveSlot, lease: Lease, turn: SharedTurn, skipped: bool) -> int:
        """Whether the request may go now (:data:`GO`): its reserved turn came (or
        the store is down: it paces alone). A pause that began while it waited
        for its turn voids the turn (rule 2): it is handed back and a new one
        asked for (:data:`AGAIN`), so the turns reserved before a pause do not
        all leave together at its end. So does a turn reached later than its
        slack (rule 1: the room the fleet left for lateness before the next
        turn reserved after it, and a tolerance of :data:`LATE_TOLERANCE`):
        sent, it would reach the host closer than the gap to the next process's
        punctual send, and a strict host refuses that one. It goes back, its
        time too when nobody reserved after it (then the next turn is this
        process's, now); otherwise it costs the host one gap unused. Once per
        request: a process stalled every time still sends. A later turn of the
        request reached late goes off its turn, but not blind (:data:`LOOK`):
        while the process stood still another may have paused the slot, which
        only the store knows (:meth:`looked`). A late turn inside a run goes:
        the next send is this process's own, spaced from it on the wire (rule 8);
        but a turn of a run reserved narrower than a pace the host stated since
        is void as in a pause (:meth:`respaced`)."""
        if turn.lease is None:
            return GO if turn.wait <= 0.0 else AGAIN
        late = 0.0 if turn.due is None else time.monotonic() - turn.due
        if turn.due is not None:
            self.late.add(late)
        late = late > turn.slack + LATE_TOLERANCE
        if late and not skipped:
            lease.on_release = NoTurn(self, slot)
            self.store.late(slot.key, turn.lease)
            return AGAIN
        if self.paused(slot) > 0.0:
            lease.on_release = NoTurn(self, slot)
            self.store.released(slot.key, turn.lease)
            return AGAIN
        if turn.joined and self.respaced(slot, turn.spacing):
            lease.on_release = NoTurn(self, slot)
            self.store.idle(slot.key)  # the run's rest, the latest first, then this one
            self.store.late(slot.key, turn.lease)
            return AGAIN
        if late:
            return LOOK
        self._going(slot, lease)
        return GO

    def respaced(self, slot: LiveSlot, spacing: float) -> bool:
        """Whether a pace the host stated is wider than the ``spacing`` a run's
        turns were reserved at (rule 8): stated to this process (its gate keeps
        it too), or to another, as the store heard (within ``max_pause``). The
        run was reserved before the pace began, and its turns not yet sent are
        void, as a pause voids them (rule 2). Sent, they would keep the old
        spacing for up to :data:`RUN_MOST` - 1 turns, and this process's gate,
        holding them to the new one, would push them into the turns other
        processes reserved after the run."""
        stated = slot.state.limits.stated_gap_left(self.clock())
        heard = min(self.store.fleet_stated(slot.key), self._rules.signals.max_pause)
        stated = max(stated, heard)
        return narrower_than_stated(spacing, stated)

    @staticmethod
    def _going(slot: LiveSlot, lease: Lease) -> None:
        # The fleet spaced this send from the last one: the wire keeps no gap of
        # this process's own on top, which would hold it past its turn into the
        # next one's.
        lease.wire_gap = 0.0
        Fleet.went(slot)

    def looked(
        self,
        slot: LiveSlot,
        lease: Lease,
        held: str,
        seen: SharedTurn,
        bound: float | None,
        left: float,
    ) -> float:
        """What the store's look at a turn reached late again said (rules 1-3),
        at the turn (:meth:`_steps`) and at the wire (:class:`WireCheck`): 0.0,
        the request goes on its turn ``held``, off its time (once per request is
        enough to hand one back); else the fleet's pause or its cap runs: the
        turn is void and goes back (its time too, when nobody reserved after
        it), the fleet's answer is adopted (rule 4: the other turns waiting see
        it too), and the request waits the seconds returned, then takes a new
        turn; or it fails at once with :class:`~autothrottle.ThrottleTimeout`
        when that passes its ``max_wait`` (``bound``; ``left``: what is left of it)."""
        if seen.lease is not None or seen.wait <= 0.0:
            self._going(slot, lease)
            return 0.0
        lease.on_release = NoTurn(self, slot)
        self.store.late(slot.key, held)
        self.adopt(slot, seen)
        if bound is not None and seen.wait > left:
            raise ThrottleTimeout(slot.key, bound)
        return seen.wait

    def paused(self, slot: LiveSlot) -> float:
        """Seconds a pause of the slot still runs (0.0: none): this process's own,
        or the fleet's, adopted from any answer of the store for the slot or as
        the store heard another process set it while this one asked nothing
        (rule 2): adopted (rule 4), so the slot's other requests wait it out too."""
        now = self.clock()
        left = slot.state.pause_until - now
        heard = self.store.fleet_pause(slot.key, self._rules.signals.max_pause, now)
        if heard > 0.0:
            self._rules.adopt(slot, None, heard, now)
            left = max(left, heard)
        return left if left > 0.0 else 0.0

    def ask(self, slot: LiveSlot) -> TurnAsk:
        """What this process asks the fleet for a turn of ``slot`` with (rule 1)."""
        config = slot.config
        signals = self._rules.signals
        # The pace the host stated in headers is the fleet's floor, as it is the
        # gate's: each process hears the host's answers, and paced by it alone,
        # N processes would send N times what the host allows. The gate keeps a
        # stated pace slower than max_delay too (the host's word, not a guess),
        # so the fleet's ceiling gives way to it.
        stated = slot.state.limits.stated_gap_left(self.clock())
        gap = max(slot.state.delay, stated)
        return TurnAsk(
            gap,
            max(config.min_delay, stated),
            max(config.max_delay, stated),
            config.max_concurrency,
            signals.hold_timeout,
            signals.max_pause,
            SPACING_MARGIN,
            min(self.late.value, gap * LATE_SHARE),
        )

    def _settle(
        self,
        slot: LiveSlot,
        lease: Lease,
        turn: SharedTurn,
        ask: TurnAsk,
        bound: float | None,
        left: float,
    ) -> float:
        """Adopt what the fleet said (rule 4) and return the wait, within the bounds (rule 3)."""
        self.adopt(slot, turn)
        # Held or not, the lease's release reaches left (rule 8).
        if turn.lease is not None:
            lease.on_release = HeldTurn(self, slot, turn.lease, turn.asked)
        else:
            lease.on_release = NoTurn(self, slot)
        # The time since the answer came counts (a process that stood still
        # meanwhile is nearer its turn, not past its bound).
        wait = turn.wait if turn.due is None else turn.due - time.monotonic()
        if bound is not None and wait > left:
            raise ThrottleTimeout(slot.key, bound)
        return wait

    def adopt(self, slot: LiveSlot, turn: SharedTurn) -> None:
        """Take the fleet's delay and pause (within ``max_pause``) from the store's
        answer ``turn``, and how many processes share the slot (rule 4)."""
        pause = min(turn.pause, self._rules.signals.max_pause)
        self._rules.adopt(slot, turn.delay, pause, self.clock())
        slot.senders = max(1, turn.senders)

    @staticmethod
    def after_own(slot: LiveSlot, turn: SharedTurn, ask: TurnAsk) -> float:
        """Seconds a turn of a run still waits, now that its due time came: one
        run's gap after this process let the run's previous turn go (rule 8),
        which may have gone late, after this turn was taken."""
        if not turn.joined:
            return 0.0
        gap = min(max(ask.gap if turn.delay is None else turn.delay, ask.min_gap), ask.max_gap)
        return slot.fleet_went + gap * ask.margin - time.monotonic()

    def left(self, slot: LiveSlot) -> None:
        """A request of ``slot`` is finished, or given up (in its process's own
        queue too): the last of this process's for the slot hands the rest of
        its run back (rule 8), or the fleet keeps it until the next request."""
        gate = slot.gate
        if not gate.in_flight() and not gate.queued():
            self.store.idle(slot.key)

    # -- reports (rule 5): the lease's reporter ------------------------------------------

    def observe(
        self,
        slot: LiveSlot,
        *,
        latency: float,
        status: int,
        headers: Mapping[str, str] | None,
        adjust: bool,
        sent_at: float | None,
        from_cache: bool | None = None,
    ) -> None:
        """The rules' :meth:`~Rules.observe`, then the change goes to the fleet: soon
        when the answer stated a pace that begins or widens by more than a
        quarter (rules 5 and 8: the other processes' turns need it)."""
        with slot.gate.lock:
            backoffs = slot.state.backoffs
            now = self.clock()
            stated = slot.state.limits.stated_gap_left(now)
            self._rules.observe(
                slot,
                latency=latency,
                status=status,
                headers=headers,
                adjust=adjust,
                sent_at=sent_at,
                from_cache=from_cache,
            )
            backed_off = slot.state.backoffs != backoffs
            ok = status == 200 and not backed_off
            began = slot.state.limits.stated_gap_left(now) > 1.25 * stated
            self.report(slot, sent_at, backed_off=backed_off, ok=ok, began=began)

    def answered(
        self,
        slot: LiveSlot,
        lease: Lease,
        latency: float,
        status: int,
        headers: Mapping[str, str] | None,
        from_cache: bool | None,
        done: bool,
    ) -> None:
        """A lease's response (the reporter's): :meth:`observe`; ``done``, then
        the gate lets go of the lease, whatever observing raised."""
        try:
            self.observe(
                slot,
                latency=latency,
                status=status,
                headers=headers,
                adjust=lease.adjust,
                sent_at=lease.sent_at if status < 400 else self._refused_sent(slot, lease),
                from_cache=from_cache,
            )
        finally:
            if done:
                slot.gate.release(lease)

    @staticmethod
    def _refused_sent(slot: LiveSlot, lease: Lease) -> float:
        """When a refused request was sent, as the burst rule counts it (rule 5,
        ``docs/recovery.md``, "One backoff per burst"): its gate's grant; or,
        when the slot backed off between that grant and this process's ask
        that reserved its turn (it waited that backoff's pause out in the fleet;
        a turn of a run: the run's ask), that ask's time. It went at the new
        pace: its refusal is the host's new word, and its ``Retry-After``
        holds, not the lag of the backoff before (the fleet sent into it at
        once). A turn of a run asked for before the backoff keeps the grant."""
        sent = lease.sent_at
        held = lease.on_release
        if isinstance(held, HeldTurn) and sent < slot.state.refusal.backoff_at <= held.taken:
            return held.taken
        return sent

    def fail(self, slot: LiveSlot, error: BaseException, *, sent_at: float) -> None:
        """The rules' :meth:`~Rules.fail`, then the change goes to the fleet."""
        with slot.gate.lock:
            backoffs = slot.state.backoffs
            self._rules.fail(slot, error, sent_at=sent_at)
            self.report(slot, sent_at, backed_off=slot.state.backoffs != backoffs)

    def report(
        self,
        slot: LiveSlot,
        sent_at: float | None,
        *,
        backed_off: bool,
        ok: bool = False,
        began: bool = False,
    ) -> None:
        """Share the slot's record after a request sent at ``sent_at`` changed it
        (``ok``: the host let that request through; ``began``: its answer stated
        a pace that begins)."""
        self.store.changed(
            slot.key,
            slot.state,
            self.clock(),
            sent_at=-math.inf if sent_at is None else sent_at,
            backed_off=backed_off,
            ok=ok,
            strict=slot.config.policy.strict_spacing,
            began=began,
        )

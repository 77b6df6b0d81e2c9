"""What crosses the fleet's seam, and what a process remembers of its turns.

The rules are :mod:`autothrottle._fleet`'s (cited here by number): a store
shared by a fleet (:class:`SharedTurns`) is asked for a turn with a
:class:`TurnAsk` and answers with a :class:`SharedTurn`; :class:`Lateness`
is how late this process's sends leave (rule 1), :class:`Run` the turns of a
slot it reserved ahead (rule 8). Both are pure: every time is given.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, NamedTuple, Protocol, runtime_checkable

from ._state import SlotState

__all__ = [
    "FRESH_AFTER",
    "FRESH_MOST",
    "FRESH_ROOM",
    "LATE_MOST",
    "LATE_SHARE",
    "LATE_TOLERANCE",
    "RUN_MOST",
    "SPACING_MARGIN",
    "Lateness",
    "Run",
    "SharedTurn",
    "SharedTurns",
    "TurnAsk",
    "narrower_than_stated",
    "slack",
]

LATE_SAMPLES = 200
"""Sends :class:`Lateness` remembers."""

LATE_MOST = 0.05
"""Seconds: the most one send's lateness counts in :class:`Lateness`, and the
least a turn of a run waits for a request before it is handed back unused."""

LATE_SHARE = 0.03
"""The most of a gap a process's lateness adds after its sends: with the
:data:`SPACING_MARGIN`, a fleet keeps at least 95 % of the pace."""

RUN_MOST = 4
"""The most turns of a slot one process reserves in one round trip (rule 8)."""

FRESH_AFTER = 15.0
"""Seconds after its last turn of a slot that a process's next send may go on a
new connection (aiohttp keeps an idle one 15 s) (rule 8)."""

FRESH_ROOM = 0.25
"""The share of a gap left after a process's first turn of a slot (rule 8)."""

FRESH_MOST = 0.1
"""Seconds: the most room left after a process's first turn of a slot (rule 8)."""

LATE_TOLERANCE = 0.002
"""Seconds a send may leave later than its turn's slack and still go on it
(:meth:`Fleet._done`): the wake-up jitter of a process that is not stalled.
10 ms was tried (``benchmarks/redis_store.py``, paired 30-s crawls at load
6-8): 80.0 and 90.7 % of the aggregate with 262 and 182 refused, against
83.3 and 82.6 % with 98 and 96 at 2 ms."""

SPACING_MARGIN = 1.02
"""Turns are reserved this much wider than the gap (rule 1): 10 ms of lateness per
send at 2 requests a second. Measured with ``benchmarks/redis_store.py`` (20
hosts at 2/s, 4 processes): without it every host saw 3 requests in some second
and 65 were refused; with it none, and 0 refused."""


class TurnAsk(NamedTuple):
    """What a process asks the fleet for a turn with: its own pace and bounds (rule 1).

    ``late`` is how late this process's sends left after their reserved
    times lately (:class:`Lateness`); ``phase`` the slot's point in its gap,
    in [0, 1).
    """

    gap: float
    min_gap: float
    max_gap: float
    cap: int
    hold: float
    max_pause: float
    margin: float = 1.0
    late: float = 0.0
    phase: float = 0.0


class SharedTurn(NamedTuple):
    """A shared store's answer to a request for a turn.

    Attributes:
        wait: Seconds to wait before sending (the turn is reserved), or, when
            ``lease`` is None, before asking again (a pause, the cap, Redis down).
        lease: The shared lease to hand back when the request is finished.
        delay: The fleet's delay for the slot, if one is shared.
        pause: Seconds the fleet's pause of the slot still runs (0: none).
        due: When the reserved send is due, on ``time.monotonic``'s clock
            (None: not known; ``wait`` from now).
        senders: The processes that took a turn on the slot lately.
        joined: The turn follows this process's own previous turn of a run
            (rule 8): it goes no sooner than a gap after that one went.
        closes: The last turn of its run: the next send may be another
            process's.
        slack: Seconds the send may leave after ``due`` and still reach the
            host no closer than the gap to the next turn reserved after it
            (rule 1: the room the fleet left for lateness); infinite for a
            turn inside a run, whose next send is this process's own.
        spacing: For a ``joined`` turn, the seconds its run's turns were
            reserved apart: a pace the host stated since, wider than that,
            voids it (rule 8).
        asked: When this process asked the store for the turn (its run's ask),
            on the throttle's clock (-inf: not known): a refusal of it counts
            as sent then when the slot backed off after its request's grant
            (rule 5).
    """

    wait: float
    lease: str | None
    delay: float | None
    pause: float
    due: float | None = None
    senders: int = 1
    joined: bool = False
    closes: bool = True
    slack: float = math.inf
    spacing: float = 0.0
    asked: float = -math.inf


def narrower_than_stated(spacing: float, stated: float) -> bool:
    """Whether turns reserved ``spacing`` apart keep less than a pace the host
    stated, one send per ``stated`` seconds, as the fleet spaces it (times
    :data:`SPACING_MARGIN`; a microsecond's rounding of the store aside): a
    run's turns so reserved are void (rule 8). No pace (0.0) voids nothing."""
    return stated > 0.0 and spacing < stated * SPACING_MARGIN - 1e-6


def slack(spacing: float, margin: float, late: float, turns: int, room: float) -> float:
    """The lateness the fleet left room for after the last of ``turns`` turns
    reserved ``spacing`` apart (the gap times ``margin``), asked with this
    process's ``late`` and ``room`` (rule 1): the margin's share of the gap,
    the lateness for each turn, the room for a new connection. A send later
    than that would reach the host closer than the gap to the next process's
    punctual one (:meth:`Fleet._done` hands it back instead). Turns with no
    gap between them have no order to keep: their slack is infinite."""
    if spacing <= 0.0:
        return math.inf
    return spacing - spacing / margin + late * turns + room


class Lateness:
    """How late this process's reserved sends left, lately (rule 1).

    A send reserved at ``t`` leaves when the process gets to it: later when
    its event loop or its CPU is busy. The figure is the 90th percentile of
    the last :data:`LATE_SAMPLES` sends, at most :data:`LATE_MOST`: the
    typical lateness widens the gap after this process's sends (the turn's
    :func:`slack`), and a send later than its slack is not sent at its turn
    (:meth:`Fleet._done`).
    """

    __slots__ = ("_samples", "_seen", "value")

    def __init__(self) -> None:
        self._samples: list[float] = []
        self._seen = 0
        self.value = 0.0
        """Seconds: the typical lateness (0 until 20 sends have shown it)."""

    def add(self, late: float) -> None:
        late = min(max(late, 0.0), LATE_MOST)
        samples = self._samples
        if len(samples) < LATE_SAMPLES:
            samples.append(late)
        else:
            samples[self._seen % LATE_SAMPLES] = late
        self._seen += 1
        if self._seen % 20 == 0:  # sorting each time would cost more than it tells
            ordered = sorted(samples)
            self.value = ordered[len(ordered) * 9 // 10]


class Run:
    """This process's turns of one slot (rule 8): those reserved that no request
    took yet, the last one reserved, and how many the next run asks for.

    Pure: every method is given ``now`` on the clock the turns' due times are
    on. The store keeps one per slot.
    """

    __slots__ = (
        "_demand",
        "_pending",
        "_turns",
        "asked_at",
        "asking",
        "behind",
        "delay",
        "free",
        "last_due",
        "length",
        "longest",
        "reserved_at",
        "senders",
        "slack",
        "spacing",
    )

    def __init__(self) -> None:
        self._turns: deque[tuple[float, str]] = deque()
        self.delay: float | None = None
        """The fleet's delay when the run was reserved."""
        self.senders = 1
        """The processes that took a turn on the slot then."""
        self.length = 1
        """How many turns the next run asks for."""
        self.last_due = -math.inf
        """When the last turn this process reserved is due."""
        self.spacing = 0.0
        """Seconds between the turns of the last run."""
        self.longest = math.inf
        """The longest a pace a host stated spaces this process's turns: its
        ``max_pause``, as the store cuts the pace (rule 1)."""
        self.reserved_at = -math.inf
        """When the store reserved the last run, on its own clock (µs)."""
        self.asked_at = -math.inf
        """When this process asked for the last run, on the throttle's clock."""
        self.slack = math.inf
        """The lateness the fleet left room for after the last run's last turn."""
        self.free = 0
        """The slot's leases left free under the fleet's cap after the last run."""
        self.asking = False
        """A request of this process asks the store for a run of the slot now:
        its answer is on its way (one reservation in flight per process)."""
        self.behind: deque[Any] = deque()
        """The requests waiting for that answer, first come first (what waits
        for each is the store's)."""
        self._demand = False
        self._pending = -math.inf  # the last reserved turn a request may wait for

    def next(
        self, now: float, room: float, waited: bool = False
    ) -> tuple[tuple[float, str, bool] | float | int | None, list[str]]:
        """What a request of this process does at ``now``, and the leases of the
        turns more than ``room`` past their due that no request took (to hand
        back; the next run is one turn long again):

        * a tuple ``(due, lease, closes)``: it takes the run's next turn
          (``closes``: the last, whose lateness may meet another process's
          turn: it has :attr:`slack`);
        * a float: it waits until then, when this process's last reserved turn
          is due, before asking (one reservation waiting per process);
        * None: another request of this process is asking the store for a run
          (:attr:`asking`): it waits behind that one for the answer, and is
          then served from the run or asks next (:meth:`serve`), never on its
          own meanwhile (one reservation in flight per process). A request
          that ``waited`` so takes the next reservation when the run has no
          turn for it, without waiting for the last one's due: it came while
          nothing it could wait for was known, and would have asked alongside
          (a crawl's first turns of 200 hosts then left while the second
          ones' reservations were on their way, and a loaded worker's event
          loop, busy with 200 new connections, took Redis for unreachable).
          A request that finds others waiting so (:attr:`behind`) waits behind
          them, even when the run has turns: they are served first;
        * an int: it asks the store for a run of that many turns: twice the
          last run's when a request of this process waited for that run or
          took a turn of it (its requests come as fast as the fleet's turns),
          else one. It is the slot's :attr:`asking` request until its answer
          came (:meth:`answered`).
        """
        stale: list[str] = []
        turns = self._turns
        while turns and turns[0][0] < now - room:
            stale.append(turns.popleft()[1])
            self._demand = False
            self.length = 1
        if self.behind and not waited:
            # Older requests wait to be served from the answer (a thread may come
            # between the store's recording a run and its serving them): first
            # come first, even to the run's turns.
            self._demand = True
            return None, stale
        if turns:
            due, lease = turns.popleft()
            self._demand = True
            return (due, lease, not turns), stale
        if self._pending > now + room and not waited:
            self._demand = True
            return self._pending, stale
        if self.asking:
            self._demand = True
            return None, stale
        self.length = min(2 * self.length, RUN_MOST) if self._demand else 1
        self._demand = False
        self.asking = True
        return self.length, stale

    def answered(self) -> None:
        """The slot's asking request has its answer, or gave up: the requests
        behind it may be served (:meth:`serve`)."""
        self.asking = False

    def serve(self) -> Any | None:
        """The first request waiting behind the answer, if it may be served now
        (no request asks the store for the slot): it takes its :meth:`next`
        then, and the next one after it, first come first, until one of them
        asks the store in its turn."""
        if self.asking or not self.behind:
            return None
        return self.behind.popleft()

    def room(self, now: float, gap: float) -> float:
        """Seconds to leave after the run asked for at ``now``: more after this
        process's first turn of the slot in a while (a new connection's setup)."""
        if now - self.last_due <= FRESH_AFTER:
            return 0.0
        return min(FRESH_ROOM * gap, FRESH_MOST)

    def reserved(
        self,
        dues: list[float],
        leases: list[str],
        spacing: float,
        delay: float | None,
        senders: int,
        slack: float = math.inf,
        free: int = 0,
        at: float = -math.inf,
        asked: float = -math.inf,
    ) -> None:
        """The store reserved a run at ``at`` (µs, its clock), asked for at
        ``asked`` (the throttle's clock), its turns ``spacing`` apart, the last
        with ``slack``, ``free`` leases left under the fleet's cap after it: the
        asker takes the first turn, the rest wait here."""
        self._turns.extend(zip(dues[1:], leases[1:], strict=True))
        self.last_due = self._pending = dues[-1]
        self.spacing, self.delay, self.senders = spacing, delay, senders
        self.slack, self.free, self.reserved_at = slack, free, at
        self.asked_at = asked

    def drop(self) -> list[str]:
        """Every turn left, to hand back (a pause began, no request of this
        process waits for the slot, the slot is forgotten)."""
        leases = [lease for _, lease in self._turns]
        if leases:
            self._pending = -math.inf  # nothing of the run is left to wait for
        self._turns.clear()
        self._demand = False
        self.length = 1
        return leases

    def __len__(self) -> int:
        return len(self._turns)


@runtime_checkable
class SharedTurns(Protocol):
    """A store several processes share, spacing their sends together (the rules above).

    Every time it is given is on the throttle's clock (``now``).
    """

    async def take_turn(
        self, key: str, ask: TurnAsk, now: float, left: float = math.inf
    ) -> SharedTurn:
        """Reserve the slot's next send across the fleet (rules 1, 2 and 6).

        A request that finds another of this process asking for the slot
        waits for that answer (rule 8), at most ``left`` seconds (what is left
        of its ``max_wait``): past that, the answer is a wait of ``math.inf``
        with no lease, which no bound allows (rule 3)."""
        ...

    def take_turn_blocking(
        self, key: str, ask: TurnAsk, now: float, left: float = math.inf
    ) -> SharedTurn:
        """:meth:`take_turn` for a thread (the sync clients)."""
        ...

    async def look(self, key: str, lease: str, ask: TurnAsk, now: float) -> SharedTurn:
        """Whether the reserved turn ``lease``, reached late again, may go now
        (rules 1 and 2): its own lease when it may; else a wait (the fleet's
        pause, its cap) with no lease, and the turn is void. Reserves nothing."""
        ...

    def look_blocking(self, key: str, lease: str, ask: TurnAsk, now: float) -> SharedTurn:
        """:meth:`look` for a thread."""
        ...

    def fleet_pause(self, key: str, max_pause: float, now: float) -> float:
        """Seconds (at most ``max_pause``) a pause of the slot another process set
        still runs, as the store heard of it since its last answer for the slot
        (rule 2; 0.0: none): told once, for the asker to adopt (rule 4)."""
        ...

    def fleet_stated(self, key: str) -> float:
        """Seconds of the gap a host stated to another process, as the store
        heard of it, that a send now keeps (rule 8; 0.0: none)."""
        ...

    def changed(
        self,
        key: str,
        state: SlotState,
        now: float,
        *,
        sent_at: float,
        backed_off: bool,
        ok: bool = False,
        strict: bool = False,
        began: bool = False,
    ) -> None:
        """The slot's record changed after a request sent at ``sent_at``: share it
        soon. ``ok``: the host let that request through; ``strict``: the slot's
        pace is one the host was said to allow; ``began``: the answer stated a
        pace that begins (or widens by more than a quarter), which the fleet
        needs as soon as a backoff (rule 5)."""
        ...

    def released(self, key: str, lease: str) -> None:
        """A request holding shared ``lease`` is finished (rule 7)."""
        ...

    def idle(self, key: str) -> None:
        """No request of this process is left for the slot: the turns it
        reserved ahead go back (rule 8)."""
        ...

    def late(self, key: str, lease: str) -> None:
        """A reserved turn came later than its slack and is not sent: it goes
        back, and its time with it when no process reserved after it (rule 1)."""
        ...

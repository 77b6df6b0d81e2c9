"""What a fleet request's lease holds of its turn, and what a request that
never reached its host does with it: the part of the fleet every throttle's
requests touch, kept apart so that a throttle with no fleet never loads the
fleet's machinery (``import autothrottle`` does not import :mod:`autothrottle._fleet`,
:mod:`autothrottle._fleet_wire` or :mod:`autothrottle._fleet_turns`).

The rules are written once, in :mod:`autothrottle._fleet`'s docstring. A
request's lease holds :class:`HeldTurn` (rule 7: released, the turn goes
back; never sent, its time too) or :class:`NoTurn` when it holds none
(released, the last request of the process for the slot hands its run's rest
back, rule 8, as a :class:`HeldTurn`'s does); :func:`never_sent` is what the
adapters call for any request whose wire turn never came, a fleet's or not.
Both reach the fleet only through :class:`WireFleet`, what they (and
:class:`~autothrottle._fleet_wire.WireCheck`) use of it, so that they sit below
the fleet, whose types they name for the type checker alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ._fleet_turns import SharedTurn, SharedTurns, TurnAsk
    from ._lease import Lease
    from ._slot import LiveSlot

__all__ = ["HeldTurn", "NoTurn", "WireFleet", "never_sent"]


class WireFleet(Protocol):
    """What :class:`WireCheck` uses of :class:`~autothrottle._fleet.Fleet`: its
    store and clock, and the fleet's own answers (rules 1-4, 8), so a turn
    taken again at the wire is judged, adopted and handed back as one taken
    at the turn."""

    store: SharedTurns
    clock: Callable[[], float]

    def ask(self, slot: LiveSlot) -> TurnAsk: ...

    def left(self, slot: LiveSlot) -> None: ...

    def adopt(self, slot: LiveSlot, turn: SharedTurn) -> None: ...

    def looked(
        self,
        slot: LiveSlot,
        lease: Lease,
        held: str,
        seen: SharedTurn,
        bound: float | None,
        left: float,
    ) -> float: ...

    def paused(self, slot: LiveSlot) -> float: ...

    def after_own(self, slot: LiveSlot, turn: SharedTurn, ask: TurnAsk) -> float: ...

    def went(self, slot: LiveSlot) -> None: ...


class HeldTurn:
    """A fleet turn a request holds: its lease's release hook (``Lease.on_release``).

    Called (the lease released), the request is finished: the turn's lease
    goes back (rule 7) and its time stays spent. :meth:`hand_back` is the hook
    of a request that ends without sending its turn (given up while it waits
    for the turn's due time, past its ``max_wait``, a fault, at the wire
    before it went): the turn goes back as one no request took, its time too
    when nobody reserved after it (rules 1, 3, 8). Either way the last request
    of this process for the slot hands the rest of its run back (rule 8).

    The lease's hook is a :class:`HeldTurn` from the turn's answer until the
    request is finished; a request given up before its turn went swaps it for
    :meth:`hand_back` (:meth:`Fleet._unsent`, :class:`WireCheck`), so the
    finished request's release pays for nothing else.
    """

    __slots__ = ("_fleet", "_slot", "lease", "taken")

    def __init__(
        self, fleet: WireFleet, slot: LiveSlot, lease: str, taken: float = -math.inf
    ) -> None:
        self._fleet = fleet
        self._slot = slot
        self.lease = lease  # the store's name of the turn
        # When this process asked the store for the turn, on the throttle's clock
        # (-inf: not known, a turn taken at the wire).
        self.taken = taken

    def __call__(self) -> None:
        fleet = self._fleet
        fleet.store.released(self._slot.key, self.lease)
        fleet.left(self._slot)

    def hand_back(self) -> None:
        """The turn was never sent: the run's rest goes first (the latest reserved
        first, so each gives its time back in turn), then the turn, its time too."""
        fleet = self._fleet
        fleet.left(self._slot)
        fleet.store.late(self._slot.key, self.lease)


class NoTurn:
    """The release hook of a fleet request that holds no turn (``Lease.on_release``):
    it waits out a pause or the fleet's cap, or asks again, its turn void, or
    it went alone (the store unreachable, rule 6).

    Called (the lease released: the request is finished or given up), the last
    request of this process for the slot hands the rest of its run back
    (rule 8), as a :class:`HeldTurn`'s does: the requests before it saw it in
    flight when they finished, and handed nothing back. A request given up
    before the store's first answer holds None, which
    :meth:`~autothrottle._fleet.Fleet._unsent` reads as this.
    """

    __slots__ = ("_fleet", "_slot")

    def __init__(self, fleet: WireFleet, slot: LiveSlot) -> None:
        self._fleet = fleet
        self._slot = slot

    def __call__(self) -> None:
        self._fleet.left(self._slot)


def never_sent(lease: Lease) -> None:
    """The request of ``lease`` never reached its host: its connection was never
    made (refused, a connect timeout, a name not found), so nothing of it was
    written. A fleet turn it holds as a sent one's (:class:`HeldTurn`) goes
    back at its release as one no request took, its time too when nobody
    reserved after it (:meth:`HeldTurn.hand_back`), as a request given up
    before its turn went hands it back (rules 1, 8). A turn held at the wire
    is handed back so already; holding none (:class:`NoTurn`), or not a
    fleet's lease, nothing changes. The adapters call it for a request whose
    wire turn never came: its connection never made, or cancelled while it
    was being made or waited for (``Exchange.failed``, ``Exchange.unconnected``), the
    request never handed to its client (``_exchange.release_unsent``), or
    cancelled while it waited for its wire turn (``Exchange.on_wire``)."""
    held = lease.on_release
    if isinstance(held, HeldTurn):
        lease.on_release = held.hand_back

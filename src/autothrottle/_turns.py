"""A request's turn past the gate's fast path: its bound, the wait, and its lease.

The throttle takes a turn at once when the slot's gate is open
(``Gate.grant_now``) and nothing else is to be asked. Everything after that is
here: how long a request may wait (its own ``max_wait`` and its slot's, the
shorter), the wait itself (the driver's, or through a clock that skips waits:
``autothrottle.testing``), the fleet's turn on top of the gate's when the
store is shared (:mod:`autothrottle._fleet`), and what makes a slot's leases
(reporting to the rules, or to the fleet in between).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING

import anyio

from ._driver import (
    Skipping,
    wait_for_hold,
    wait_for_hold_blocking,
    wait_skipping,
    wait_skipping_blocking,
)
from ._errors import ThrottleTimeout
from ._headers import PASSED, RAW_TYPES, passed_raw
from ._lease import Lease, Reporter, lease_at
from ._request import Cost
from ._rules import Rules
from ._slot import LiveSlot, Slot

if TYPE_CHECKING:
    from ._fleet import Fleet

__all__ = ["Maker", "Plain", "Turns"]

Maker = Callable[[float], Lease]

_MAPPINGS: set[type] = {dict}
"""Header types the rules took as a mapping already: the usual response's
headers need no check of their own then."""

_MAPPINGS_KEPT = 32

_INF = math.inf


class Plain:
    """The leases' reporter without a fleet: the rules, with the usual response
    applied in one call (:meth:`LiveSlot.respond <autothrottle._slot.LiveSlot.respond>`).

    What makes a response the usual one is read here, without a call, from
    the rules' settings (frozen but for the listeners, asked each time) and
    the response; anything else (a status that backs off or may be a cache's,
    a header the rules read, a listener, a debug log, a cache seen on the
    slot) goes to the rules, which are the spec: the two agree field for
    field (a test drives random responses through both).
    """

    __slots__ = ("_clock", "_listeners", "_reads", "_recovery", "_rules", "_usual")

    def __init__(self, rules: Rules, clock: Callable[[], float]) -> None:
        self._rules = rules
        self._clock = clock
        self._recovery = rules.recovery
        self._listeners = rules.listeners  # the one setting that changes: asked each time
        signals = rules.signals
        self._reads = signals.reads_headers
        # The statuses a usual response may have (the settings are frozen): none
        # when a classifier reads every response or each delay change is logged.
        usual = frozenset(range(200, 400)) - signals.backoff_statuses
        if self._reads:
            usual -= {304}  # a cache's answer, whatever the headers say
        if signals.block_classifier is not None or rules.debug:
            usual = frozenset()
        self._usual = usual

    def fail(self, slot: LiveSlot, error: BaseException, *, sent_at: float) -> None:
        """A request failed without a response: the rules'."""
        self._rules.fail(slot, error, sent_at=sent_at)

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
        """Apply one response: in one call if it is the usual one, else by the
        rules; ``done``: and let go of ``lease`` under the same hold of the lock."""
        gate = slot.gate
        if (
            type(status) is int
            and status in self._usual
            and type(latency) is float
            and latency >= 0.0
            and latency < _INF
            and (from_cache is None or from_cache is False)
            and not self._listeners
            and (
                # In a type the rules took already, none of the names they read
                # (`read_headers`' first check), or none read at all.
                headers is None
                or (
                    (kind := type(headers)) in _MAPPINGS
                    and (
                        not self._reads
                        or (
                            passed_raw(headers) if kind in RAW_TYPES else PASSED.issuperset(headers)
                        )
                    )
                )
            )
        ):
            lock = gate.lock
            lock.acquire()  # not `with`: on every response, it costs twice as much
            try:
                # A slot that has seen a cache hit paces behind it: the rules'
                # (asked under the lock: another thread may be counting a hit).
                if slot.state.cache.miss_share == 1.0:
                    clock = self._clock  # a local first: a call on a field is looked up slowly
                    try:
                        slot.respond(
                            latency, status, clock(), lease.sent_at, lease.adjust, self._recovery
                        )
                    finally:
                        if done:
                            gate.let_go(lease)
                    return
            finally:
                lock.release()
        try:
            self._by_rules(slot, latency, status, headers, lease, from_cache)
        finally:
            if done:
                gate.release(lease)

    def _by_rules(
        self,
        slot: LiveSlot,
        latency: float,
        status: int,
        headers: Mapping[str, str] | None,
        lease: Lease,
        from_cache: bool | None,
    ) -> None:
        """Any other response: the rules'. Headers they took as a mapping are
        of a type the usual response's check may take as is."""
        self._rules.observe(
            slot,
            latency=latency,
            status=status,
            headers=headers,
            adjust=lease.adjust,
            sent_at=lease.sent_at,
            from_cache=from_cache,
            granted=lease.wire_gap,
        )
        if headers is not None and len(_MAPPINGS) < _MAPPINGS_KEPT and isinstance(headers, Mapping):
            _MAPPINGS.add(type(headers))


class Turns:
    """The turns of one throttle's requests, once the gate's fast path said no
    (or a fleet's turn is still to be taken)."""

    __slots__ = ("_fleet", "_hold_timeout", "_reporter", "_skipping")

    def __init__(
        self, rules: Rules, fleet: Fleet | None, clock: Callable[[], float], owner: object
    ) -> None:
        self._reporter: Reporter = Plain(rules, clock) if fleet is None else fleet
        self._hold_timeout = rules.signals.hold_timeout
        self._fleet = fleet
        # A clock that skips waits (``autothrottle.testing``): they are then
        # waited through it, and it is told which throttle (``owner``) reads it.
        self._skipping: Skipping | None = None
        if isinstance(clock, Skipping):
            clock.attach(owner)
            self._skipping = clock

    def maker(self, slot: LiveSlot, adjust: bool) -> Maker:
        """What makes the slot's leases: for the usual ``adjust``, made once per
        slot (a closure made per request cost a third of taking a turn)."""
        if not adjust:
            return self._make_leases(slot, False)
        maker: Maker | None = slot.hold_maker
        if maker is None:
            maker = slot.hold_maker = self._make_leases(slot, True)
        return maker

    def _make_leases(self, slot: LiveSlot, adjust: bool) -> Maker:
        # A partial calls through in C: the grant's one Python call is lease_at.
        return partial(lease_at, slot, self._reporter, self._hold_timeout, adjust)

    @staticmethod
    def bound(slot: LiveSlot | Slot, max_wait: float | None) -> float | None:
        """The shorter of the request's bound (checked by the caller) and its
        slot's (per-host) one: at the turn, and at the wire turn
        (``Exchange.within_bound``)."""
        own = slot.config.max_wait
        if max_wait is None:
            return own
        return max_wait if own is None else min(max_wait, own)

    async def take(
        self,
        slot: LiveSlot,
        make: Maker,
        tokens: Cost | None,
        lease: Lease | None,
        max_wait: float | None,
    ) -> Lease:
        """Wait for the slot's turn (unless ``lease`` holds it already), then the
        fleet's, within the bound.

        Raises:
            ThrottleTimeout: the turn did not come within the bound.
        """
        waited = 0.0
        bound = self.bound(slot, max_wait)
        if lease is None:
            started = anyio.current_time()
            try:
                lease = await self._wait(slot, make, tokens, bound)
            except BaseException:
                self._left(slot)
                raise
            waited = anyio.current_time() - started
        if self._fleet is not None:
            left = math.inf if bound is None else bound - waited
            await self._fleet.take_turn(slot, lease, bound, left)
        return lease

    async def _wait(
        self, slot: LiveSlot, make: Maker, tokens: Cost | None, bound: float | None
    ) -> Lease:
        key = slot.key
        if self._skipping is not None:
            try:
                return await wait_skipping(slot.gate, make, self._skipping, key, tokens, bound)
            except TimeoutError:
                raise ThrottleTimeout(key, bound or 0.0) from None
        if bound is None:
            return await wait_for_hold(slot.gate, make, tokens)
        lease = None
        with anyio.move_on_after(bound):
            lease = await wait_for_hold(slot.gate, make, tokens)
        if lease is None:
            raise ThrottleTimeout(key, bound)
        return lease

    def _left(self, slot: LiveSlot) -> None:
        """A request given up in its slot's queue: with a fleet, the last of this
        process's for the slot hands the rest of its run back (rule 8)."""
        if self._fleet is not None:
            self._fleet.left(slot)

    def take_blocking(
        self,
        slot: LiveSlot,
        make: Maker,
        tokens: Cost | None,
        lease: Lease | None,
        max_wait: float | None,
    ) -> Lease:
        """:meth:`take` for a thread: block until the turn."""
        waited = 0.0
        bound = self.bound(slot, max_wait)
        if lease is None:
            key = slot.key
            started = time.monotonic()
            try:
                if self._skipping is not None:
                    clock = self._skipping
                    lease = wait_skipping_blocking(slot.gate, make, clock, key, tokens, bound)
                else:
                    lease = wait_for_hold_blocking(slot.gate, make, bound, tokens)
            except TimeoutError:
                self._left(slot)
                raise ThrottleTimeout(key, bound or 0.0) from None
            except BaseException:
                self._left(slot)
                raise
            waited = time.monotonic() - started
        if self._fleet is not None:
            left = math.inf if bound is None else bound - waited
            self._fleet.take_turn_blocking(slot, lease, bound, left)
        return lease

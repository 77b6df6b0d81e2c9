"""A throttle's parts, checked and put together: the rules, the live slots, the fleet.

:class:`~autothrottle.Throttle` validates its settings into a
:class:`~autothrottle._policy.SlotConfig` and :class:`~autothrottle._settings.Signals`
and hands them here with the rest of its arguments; :func:`assemble` checks
those (the key function, the clocks, the store, the random source) and builds
what the facade routes to. :class:`SlotMaker` is how a live slot comes to be:
from the store's record, held to this throttle's bounds, or fresh.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from ._hosts import HostTable
from ._policy import SlotConfig
from ._recovery import Recovery
from ._rules import Rules
from ._settings import Signals
from ._slot import LiveSlot
from ._state import SlotState
from ._store import MemoryStore, SlotStore
from ._table import SlotTable
from ._validate import check_bool

if TYPE_CHECKING:
    from ._fleet import Fleet

__all__ = ["KeyFunction", "Parts", "SlotMaker", "assemble"]

KeyFunction = Callable[[str], str]
Clock = Callable[[], float]


class Parts(NamedTuple):
    """What a throttle routes to."""

    key: KeyFunction | None
    clock: Clock
    hosts: HostTable
    rules: Rules
    table: SlotTable
    fleet: Fleet | None


class SlotMaker:
    """Makes the live slot of a key: from the store's record if it has one (learned
    elsewhere: held to this throttle's bounds), else fresh at the policy's start."""

    __slots__ = ("_clock", "_hosts", "_max_pause", "_rng", "_store")

    def __init__(
        self,
        hosts: HostTable,
        store: SlotStore,
        *,
        clock: Clock,
        rng: random.Random,
        max_pause: float,
    ) -> None:
        self._hosts = hosts
        self._store = store
        self._clock = clock
        self._rng = rng
        self._max_pause = max_pause

    def __call__(self, key: str) -> LiveSlot:
        config = self._hosts.config_for(key)
        state = self._store.load(key)
        now = self._clock()
        if state is None:
            delay = config.clamp(config.policy.initial_delay(config))
            state = SlotState(delay=delay, last_activity=now, adjusted_at=now)
            self._store.save(key, state)
        else:
            state.bound(now, config, max_pause=self._max_pause)
        return LiveSlot(key, config, state, clock=self._clock, rng=self._rng)


def _checked_runtime(
    key: object, clock: object, wall_clock: object, store: object, rng: object
) -> tuple[KeyFunction | None, Clock, Clock, SlotStore, random.Random]:
    """The key function, clocks, store and random source, checked (defaults filled in)."""
    if key is not None and not callable(key):
        raise TypeError(f"key must be a callable from URL to slot key, got {key!r}")
    if not callable(clock):
        raise TypeError(f"clock must be a callable returning seconds, got {clock!r}")
    if not callable(wall_clock):
        raise TypeError(f"wall_clock must be a callable returning seconds, got {wall_clock!r}")
    if store is None:
        store = MemoryStore()
    elif not isinstance(store, SlotStore):
        raise TypeError(f"store must implement SlotStore, got {store!r}")
    if rng is None:
        rng = random.Random()
    elif not isinstance(rng, random.Random):
        raise TypeError(f"rng must be a random.Random, got {rng!r}")
    return key, clock, wall_clock, store, rng


def assemble(
    config: SlotConfig,
    hosts: Mapping[str, object] | None,
    signals: Signals,
    recovery: Recovery,
    debug: object,
    key: object,
    clock: object,
    wall_clock: object,
    store: object,
    rng: object,
    start_delay: float | None,
) -> Parts:
    """A throttle's parts from its validated settings and its other arguments, checked.

    ``start_delay``: the throttle's argument as given (None: its policy's own start),
    which the host table needs, as ``config`` resolved it.

    Raises:
        TypeError, ValueError: a bad argument, named in the message.
    """
    host_table = HostTable(config, hosts, start_given=start_delay is not None)
    key, clock, wall_clock, checked, rng = _checked_runtime(key, clock, wall_clock, store, rng)
    debug = check_bool("debug", debug)
    rules = Rules(signals, recovery, clock=clock, wall_clock=wall_clock, debug=debug)
    make = SlotMaker(host_table, checked, clock=clock, rng=rng, max_pause=signals.max_pause)
    table = SlotTable(checked, make, clock)
    fleet = None if type(checked) is MemoryStore else _fleet_of(checked, rules, clock)
    return Parts(key, clock, host_table, rules, table, fleet)


def _fleet_of(store: SlotStore, rules: Rules, clock: Callable[[], float]) -> Fleet | None:
    """The fleet of a store shared by one (``autothrottle.redis``), whose turns and
    reports go through :mod:`autothrottle._fleet`, or None. The fleet's modules
    are imported here, for a store other than the default memory one: a
    throttle with no fleet never loads them (``import autothrottle`` neither)."""
    from ._fleet import Fleet, SharedTurns

    return Fleet(store, rules, clock) if isinstance(store, SharedTurns) else None

"""What a slot has learned, as records a store can hold, copy or share.

A :class:`SlotState` is made of five records, each written by one module only
(``tests/test_architecture.py`` checks it; ``docs/architecture.md`` lists them):

========== ===================================================== ====================
record     what it holds                                         written by
========== ===================================================== ====================
pace       the delay, the policy's memory, the ramp-up's numbers :mod:`._pace`
limits     a pause and a rate-limit budget the host stated       :mod:`._limits`
refusal    the last backoff, the refused gap, the success count  :mod:`._recovery`
cache      the miss share, the hit latency, the in-flight cap    :mod:`._cache`
counters   what happened: sends, responses, statuses, latencies  :mod:`._counters`
========== ===================================================== ====================

The records hold numbers, strings and small dicts: no tickets, leases, clocks
or random sources (those belong to the live gate of one process). So a store
can keep a state in a dict, dump it to JSON and load it back in a later run,
or share it between processes. Every field reads flat as well
(``state.delay``, ``state.pause_until``), read-only: a change goes through the
record's owner.

Times in the records are read on the throttle's clock (monotonic by default,
which means nothing outside this process). :meth:`SlotState.to_dict`
therefore writes every time as seconds *ago*, relative to a ``now`` the caller
gives, in one flat mapping, and :meth:`SlotState.from_dict` checks every field
and turns the times back into times on the loading process's clock; see
``docs/architecture.md`` ("The clock contract").
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any, Generic, TypeVar, overload

from ._cache import Cache, CacheShare
from ._counters import Counters
from ._headers import RateLimit
from ._limits import Limits
from ._pace import Pace
from ._policy import SlotConfig
from ._recovery import Refusal
from ._state_fields import FLAT, TIMES, load_field

__all__ = ["SlotState"]

T = TypeVar("T")

_RECORDS: dict[str, type[Any]] = {
    "pace": Pace,
    "limits": Limits,
    "refusal": Refusal,
    "cache": Cache,
    "counters": Counters,
}

_RECORD_OF = {
    f.name: record
    for record, kind in _RECORDS.items()
    for f in fields(kind)
    if f.metadata.get("flat", True)
}
"""Each flat field's record (a field marked ``flat: False`` is the process's own,
never written or read: its default stands in a loaded record)."""

assert sorted(FLAT) == sorted(_RECORD_OF), "every record field has its place in the flat form"


class _Field(Generic[T]):
    """A read-only flat view of one record field: ``state.delay`` is ``state.pace.delay``."""

    __slots__ = ("name", "record")

    def __init__(self) -> None:
        self.name = ""
        self.record = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.record = _RECORD_OF[name]

    @overload
    def __get__(self, state: None, owner: type) -> _Field[T]: ...
    @overload
    def __get__(self, state: SlotState, owner: type) -> T: ...
    def __get__(self, state: SlotState | None, owner: type) -> _Field[T] | T:
        if state is None:
            return self
        value: T = getattr(getattr(state, self.record), self.name)
        return value


class SlotState:
    """The learned state of one slot: five records, each with one writer.

    ``SlotState(delay=1.0, pause_until=...)`` builds one from flat fields (any
    field not given takes its record's default). The records are ``pace``,
    ``limits``, ``refusal``, ``cache`` and ``counters`` (the field
    descriptions are on :class:`~autothrottle._pace.Pace`,
    :class:`~autothrottle._limits.Limits`, :class:`~autothrottle._recovery.Refusal`,
    :class:`~autothrottle._cache.Cache` and :class:`~autothrottle._counters.Counters`);
    every field also reads flat, read-only (``state.delay``).

    Raises:
        TypeError: a keyword that is no record's field.
    """

    __slots__ = ("cache", "counters", "limits", "pace", "refusal")

    def __init__(self, delay: float, **flat: Any) -> None:
        parts: dict[str, dict[str, Any]] = {record: {} for record in _RECORDS}
        parts["pace"]["delay"] = delay
        for name, value in flat.items():
            record = _RECORD_OF.get(name)
            if record is None or name == "delay":
                raise TypeError(f"SlotState() got an unexpected keyword argument {name!r}")
            parts[record][name] = value
        self.pace: Pace = Pace(**parts["pace"])
        self.limits: Limits = Limits(**parts["limits"])
        self.refusal: Refusal = Refusal(**parts["refusal"])
        self.cache: Cache = Cache(**parts["cache"])
        self.counters: Counters = Counters(**parts["counters"])

    delay = _Field[float]()
    policy_state = _Field[dict[str, float]]()
    adjusted_at = _Field[float]()
    ramp_to = _Field[float]()
    pause_until = _Field[float]()
    budget_gap = _Field[float]()
    budget_until = _Field[float]()
    sustained_gap = _Field[float]()
    sustained_until = _Field[float]()
    rate_limit = _Field[RateLimit | None]()
    backoff_at = _Field[float]()
    refused_gap = _Field[float]()
    recover_in = _Field[float]()
    allowed = _Field[float]()
    allowed_at = _Field[float]()
    ok_count = _Field[int]()
    ok_first = _Field[float]()
    ok_next = _Field[int]()
    ok_next_first = _Field[float]()
    ok_all = _Field[int]()
    ok_all_first = _Field[float]()
    in_flight_cap = _Field[int]()
    miss_share = _Field[float]()
    hit_latency = _Field[float]()
    last_latency = _Field[float | None]()
    last_activity = _Field[float]()
    sent = _Field[int]()
    responses = _Field[int]()
    failures = _Field[int]()
    cache_hits = _Field[int]()
    backoffs = _Field[int]()
    ignored_backoffs = _Field[int]()
    pauses = _Field[int]()
    status_counts = _Field[dict[int, int]]()
    backoff_reason = _Field[str | None]()
    backoff_reasons = _Field[dict[str, int]]()
    latency_buckets = _Field[list[int]]()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SlotState):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in _RECORDS)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        records = ", ".join(f"{name}={getattr(self, name)!r}" for name in _RECORDS)
        return f"SlotState({records})"

    def bound(self, now: float, config: SlotConfig, *, max_pause: float) -> None:
        """Hold a record that came from elsewhere (a file, another process) to the
        loading throttle's bounds at ``now``: the delay within ``[min_delay,
        max_delay]``, no pause or budget ending later than ``max_pause`` from
        now, no past event in the future, the cap within ``max_concurrency``.

        A ramp the record was on falls no lower than ``min_delay`` either, and
        only under a policy with a ramp-up: one saved under such a policy (or
        by a throttle with a lower ``min_delay``) is not this slot's to run.
        """
        pace = self.pace
        ramps = config.policy.ramp_up is not None and pace.ramp_to > 0.0
        pace.bound(now, config.clamp(pace.delay), config.clamp(pace.ramp_to) if ramps else 0.0)
        self.limits.bound(now, max_pause)
        self.refusal.bound(now)
        self.counters.bound(now)
        CacheShare.bound(self.cache, config.max_concurrency)

    def to_dict(self, now: float) -> dict[str, Any]:
        """The record as JSON-ready flat data, each time written as seconds before ``now``."""
        data: dict[str, Any] = {}
        for name in FLAT:
            value = getattr(self, name)
            if name in TIMES:
                value = now - value if math.isfinite(value) else None
            elif name == "status_counts":
                value = {str(status): count for status, count in value.items()}
            elif name in ("policy_state", "backoff_reasons"):
                value = dict(value)
            elif name == "latency_buckets":
                value = list(value)
            elif name == "rate_limit" and value is not None:
                value = value.to_dict()
            data[name] = value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], now: float) -> SlotState:
        """A record from :meth:`to_dict`'s data, its times placed before ``now``.

        Every field is checked (``docs/fleet.md``, "State files"): its type, and
        that its value is one the engine could have written (finite, not
        negative, within bounds). Fields left out take their defaults.

        Raises:
            TypeError: ``data`` is not a mapping, or a field has the wrong type
                (names the field).
            ValueError: an unknown field, no ``delay``, or a value out of
                bounds (names the field).
        """
        if not isinstance(data, dict):
            raise TypeError(f"slot state must be a mapping, got {type(data).__name__}")
        unknown = sorted(str(name) for name in set(data) - set(_RECORD_OF))
        if unknown:
            raise ValueError(f"unknown slot state field(s) {unknown!r}")
        if "delay" not in data:
            raise ValueError("slot state has no 'delay'")
        values = {name: load_field(name, value, now) for name, value in data.items()}
        return cls(**values)

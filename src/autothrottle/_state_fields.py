"""The flat form of a slot's state: its fields, and how each is read back and checked.

A state file or a shared record comes from outside the process: it may be
hand-edited, truncated, written by another version, or hostile. So every
field is checked when it is read (``docs/fleet.md``, "State files"): its type,
and that its value is one the engine could have written. A bad field raises a
``TypeError`` (wrong type) or ``ValueError`` (wrong value) naming it, at load
time, never an error later inside a request. Times are placed on the loading
process's clock here; the bounds of the loading throttle (``max_pause``,
``max_delay``) are applied when a throttle takes the record
(:meth:`SlotState.bound <autothrottle._state.SlotState.bound>`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ._cache import MIN_SHARE
from ._counters import LATENCY_BUCKETS
from ._headers import RateLimit

__all__ = ["FLAT", "TIMES", "load_field"]

FLAT = (
    "delay",
    "policy_state",
    "last_latency",
    "pause_until",
    "budget_gap",
    "budget_until",
    "sustained_gap",
    "sustained_until",
    "rate_limit",
    "backoff_at",
    "backoff_reason",
    "refused_gap",
    "recover_in",
    "allowed",
    "allowed_at",
    "ok_count",
    "ok_first",
    "ok_next",
    "ok_next_first",
    "ok_all",
    "ok_all_first",
    "in_flight_cap",
    "miss_share",
    "hit_latency",
    "adjusted_at",
    "ramp_to",
    "last_activity",
    "sent",
    "responses",
    "failures",
    "cache_hits",
    "backoffs",
    "ignored_backoffs",
    "pauses",
    "status_counts",
    "backoff_reasons",
    "latency_buckets",
)
"""The flat form's fields, in the order every file and shared record has them."""

TIMES = frozenset(
    {
        "adjusted_at",
        "allowed_at",
        "backoff_at",
        "budget_until",
        "last_activity",
        "ok_first",
        "ok_next_first",
        "ok_all_first",
        "pause_until",
        "sustained_until",
    }
)
"""Fields that are times on the throttle's clock (written as seconds before ``now``)."""

LONGEST = 1e9
"""The longest duration a record may hold, in seconds (about 32 years): a delay,
gap or latency beyond it is no measurement."""

FARTHEST = 1e12
"""The farthest a recorded time may lie from ``now``, in seconds."""

MOST = 2**53
"""The largest count a record may hold (every count is exact as a float)."""

_MAX_TEXT = 1000
"""The longest string a record may hold (a backoff reason, a policy's name)."""


def _number(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"slot state field {name!r} must be a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        number = math.inf
    if not low <= number <= high:  # also NaN and the infinities
        raise ValueError(f"slot state field {name!r} must be in [{low:g}, {high:g}], got {value!r}")
    return number


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"slot state field {name!r} must be an int, got {value!r}")
    if not 0 <= value <= MOST:
        raise ValueError(f"slot state field {name!r} must be in [0, 2**53], got {value!r}")
    return value


def _text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"slot state field {name!r} must be a str, got {value!r}")
    if len(value) > _MAX_TEXT:
        raise ValueError(f"slot state field {name!r} is longer than {_MAX_TEXT} characters")
    return value


def _mapping(name: str, value: object) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"slot state field {name!r} must be a mapping, got {value!r}")
    return value


def _seconds(name: str, value: object, now: float) -> float:
    return _number(name, value, 0.0, LONGEST)


def _time(name: str, value: object, now: float) -> float:
    if value is None:
        return -math.inf
    return now - _number(name, value, -FARTHEST, FARTHEST)


def _status(name: str, key: object) -> int:
    """A status code written as a key: any int (``Throttle.observe`` takes any), not huge."""
    text = str(key)
    try:
        status = int(text) if len(text) <= 20 else None
    except ValueError:
        status = None
    if status is None:
        raise ValueError(f"slot state field {name!r} has a key that is no status: {text[:40]!r}")
    return status


def _status_counts(name: str, value: object, now: float) -> dict[int, int]:
    counts = _mapping(name, value)
    return {_status(name, key): _count(name, count) for key, count in counts.items()}


def _backoff_reasons(name: str, value: object, now: float) -> dict[str, int]:
    reasons = _mapping(name, value)
    return {_text(name, key): _count(name, count) for key, count in reasons.items()}


def _policy_state(name: str, value: object, now: float) -> dict[str, float]:
    state = _mapping(name, value)
    return {_text(name, key): _number(name, v, -MOST, MOST) for key, v in state.items()}


def _latency_buckets(name: str, value: object, now: float) -> list[int]:
    if not isinstance(value, list):
        raise TypeError(f"slot state field {name!r} must be a list, got {value!r}")
    if value and len(value) != LATENCY_BUCKETS:
        raise ValueError(
            f"slot state field {name!r} must hold {LATENCY_BUCKETS} counts or none, "
            f"got {len(value)}"
        )
    return [_count(name, count) for count in value]


def _optional(
    load: Callable[[str, object, float], Any],
) -> Callable[[str, object, float], Any]:
    return lambda name, value, now: None if value is None else load(name, value, now)


_MAX_WINDOWS = 64
"""The most windows a budget may list."""

_WINDOW_FIELDS = frozenset({"remaining", "reset", "limit", "source", "policy", "window", "windows"})


def _rate_limit(name: str, value: object, now: float, *, nested: bool = False) -> RateLimit:
    """A budget, checked field by field; its windows hold no windows of their own."""
    data = _mapping(name, value)
    unknown = sorted(str(key) for key in set(data) - _WINDOW_FIELDS)
    if unknown:
        raise ValueError(f"slot state field {name!r} has unknown field(s) {unknown!r}")
    for part in ("remaining", "reset"):
        if part not in data:
            raise ValueError(f"slot state field {name!r} has no {part!r}")
    windows = data.get("windows", [])
    if not isinstance(windows, list):
        raise TypeError(f"slot state field {name!r} must list its windows, got {windows!r}")
    if windows and nested:
        raise ValueError(f"slot state field {name!r}: a window has windows of its own")
    if len(windows) > _MAX_WINDOWS:
        raise ValueError(f"slot state field {name!r} has more than {_MAX_WINDOWS} windows")
    limit = data.get("limit")
    policy = data.get("policy")
    window = data.get("window")
    return RateLimit(
        remaining=_count(f"{name}.remaining", data["remaining"]),
        reset=_number(f"{name}.reset", data["reset"], 0.0, LONGEST),
        limit=None if limit is None else _count(f"{name}.limit", limit),
        source=_text(f"{name}.source", data.get("source", "RateLimit")),
        policy=None if policy is None else _text(f"{name}.policy", policy),
        window=None if window is None else _number(f"{name}.window", window, 0.0, LONGEST),
        windows=tuple(_rate_limit(f"{name}.windows", item, now, nested=True) for item in windows),
    )


def _share(name: str, value: object, now: float) -> float:
    return _number(name, value, MIN_SHARE, 1.0)


def _rate(name: str, value: object, now: float) -> float:
    return _number(name, value, 0.0, LONGEST)


def _any_count(name: str, value: object, now: float) -> int:
    return _count(name, value)


def _any_text(name: str, value: object, now: float) -> str:
    return _text(name, value)


_LOADERS: dict[str, Callable[[str, object, float], Any]] = {
    **dict.fromkeys(TIMES, _time),
    **dict.fromkeys(
        ("delay", "budget_gap", "sustained_gap", "refused_gap", "recover_in"), _seconds
    ),
    **dict.fromkeys(("hit_latency", "ramp_to"), _seconds),
    **dict.fromkeys(
        (
            "ok_count",
            "ok_next",
            "ok_all",
            "in_flight_cap",
            "sent",
            "responses",
            "failures",
            "cache_hits",
            "backoffs",
            "ignored_backoffs",
            "pauses",
        ),
        _any_count,
    ),
    "last_latency": _optional(_seconds),
    "rate_limit": _optional(_rate_limit),
    "backoff_reason": _optional(_any_text),
    "allowed": _rate,
    "miss_share": _share,
    "policy_state": _policy_state,
    "status_counts": _status_counts,
    "backoff_reasons": _backoff_reasons,
    "latency_buckets": _latency_buckets,
}

assert sorted(_LOADERS) == sorted(FLAT), "every field of the flat form has its loader"


def load_field(name: str, value: object, now: float) -> Any:
    """The value of flat field ``name`` read from ``value``, checked, its time placed
    before ``now``.

    Raises:
        TypeError, ValueError: the value is not one the field can hold (names it).
    """
    return _LOADERS[name](name, value, now)

"""Argument checkers: the leaf every validating constructor imports.

Every public constructor funnels its numbers through the checkers here, so a bad
value fails at construction time with an error that names the parameter and the
value, instead of surfacing later as a stalled or runaway crawl.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

_NO_HEADERS: Mapping[str, str] = {}

_MAPPINGS: set[type] = {dict}
"""Types of headers seen to be mappings (``isinstance`` against the ABC costs a call)."""

_MAPPINGS_KEPT = 32


def check_number(name: str, value: object, *, minimum: float = 0.0) -> float:
    """Return ``value`` as a float if it is a finite real number >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:
        raise ValueError(f"{name} must be finite, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum:g}, got {value!r}")
    return float(value)


def check_positive(name: str, value: object) -> float:
    """Return ``value`` as a float if it is a finite real number > 0."""
    number = check_number(name, value, minimum=-math.inf)
    if number <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return number


def check_int(name: str, value: object, *, minimum: int) -> int:
    """Return ``value`` if it is an int (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return value


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a bool (not merely truthy)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def check_response(
    latency: object, status: object, headers: object, from_cache: object
) -> tuple[float, int, Mapping[str, str]]:
    """One observed response's ``latency``, ``status`` and ``headers`` (None: no
    headers), checked; ``from_cache`` must be a bool or None."""
    if (
        type(latency) is float
        and 0.0 <= latency < math.inf
        and type(status) is int
        and (from_cache is None or from_cache is True or from_cache is False)
        and type(headers) in _MAPPINGS
    ):
        # What the adapters hand over on every response, checked without a call.
        return latency, status, headers  # type: ignore[return-value]
    seconds = check_number("latency", latency)
    if isinstance(status, bool) or not isinstance(status, int):
        raise TypeError(f"status must be an int, got {status!r}")
    if from_cache is not None and not isinstance(from_cache, bool):
        raise TypeError(f"from_cache must be a bool or None, got {from_cache!r}")
    if headers is None:
        return seconds, status, _NO_HEADERS
    if type(headers) is not dict and not isinstance(headers, Mapping):
        raise TypeError(f"headers must be a mapping of str to str, got {headers!r}")
    if len(_MAPPINGS) < _MAPPINGS_KEPT:
        _MAPPINGS.add(type(headers))
    return seconds, status, headers

"""Argument checkers: the leaf every validating constructor imports.

Every public constructor funnels its numbers through the checkers here, so a bad
value fails at construction time with an error that names the parameter and the
value, instead of surfacing later as a stalled or runaway crawl.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

_T = TypeVar("_T")

Hint = Callable[[type, tuple[object, ...], dict[str, object]], "str | None"]
"""What a call of a class failed to say: the message of its TypeError, or None."""

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


def keywords_only(hint: Hint) -> Callable[[type[_T]], type[_T]]:
    """Decorate a public class whose constructor takes keywords: a call Python
    would refuse (a value given positionally, a required keyword missing) fails
    with ``hint``'s message instead, which says which keyword is meant, rather
    than Python's count of positional arguments.

    It wraps the class's own ``__init__`` (one call more a construction) rather
    than being a metaclass: a user's class may then combine ours with an ABC or
    any base with a metaclass of its own. ``hint`` is handed the class called
    (a subclass using this ``__init__``), or the class decorated when a
    subclass's own ``__init__`` called this one. A copy or an unpickling, which
    calls no ``__init__``, is not checked; ``inspect.signature`` shows the
    wrapped ``__init__``'s parameters.
    """

    def decorate(cls: type[_T]) -> type[_T]:
        init = cls.__dict__["__init__"]

        @functools.wraps(init)
        def __init__(self: object, *args: Any, **kwargs: Any) -> None:
            called = type(self)
            text = hint(called if called.__init__ is __init__ else cls, args, kwargs)
            if text is not None:
                raise TypeError(text)
            init(self, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[method-assign]
        return cls

    return decorate

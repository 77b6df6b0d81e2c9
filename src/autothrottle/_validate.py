"""Argument checkers: the leaf every validating constructor imports.

Every public constructor funnels its numbers through the checkers here, so a bad
value fails at construction time with an error that names the parameter and the
value, instead of surfacing later as a stalled or runaway crawl.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

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


class KeywordsOnly(type):
    """The type of a public class whose constructor takes keywords: a call Python
    would refuse (a value given positionally, a required keyword missing) fails
    with the class's ``hint`` instead, which says which keyword is meant, rather
    than Python's count of positional arguments.

    Only calls come here (a copy or an unpickling does not), and only a class
    still using the ``__init__`` the hint was written for: a subclass with an
    ``__init__`` of its own is left to Python. ``inspect.signature`` shows
    ``__init__``'s parameters, not this ``__call__``'s.
    """

    def __new__(
        mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any
    ) -> KeywordsOnly:
        cls = super().__new__(mcs, name, bases, namespace)
        hint: Hint | None = kwargs.get("hint")
        if hint is not None:
            cls._hint = hint  # type: ignore[attr-defined]
            cls._hinted_init = namespace["__init__"]  # type: ignore[attr-defined]
        if "__init__" in namespace:
            signature = inspect.signature(namespace["__init__"])
            cls.__signature__ = signature.replace(  # type: ignore[attr-defined]
                parameters=tuple(signature.parameters.values())[1:]
            )
        return cls

    def __call__(cls: type[_T], *args: Any, **kwargs: Any) -> _T:
        if cls.__init__ is getattr(cls, "_hinted_init", None):
            text = cls._hint(cls, args, kwargs)  # type: ignore[attr-defined]
            if text is not None:
                raise TypeError(text)
        return cast(_T, super().__call__(*args, **kwargs))  # type: ignore[misc]

"""A delay policy from its text form, as the command line and Scrapy's settings give it.

One reader for every place a user names a policy in a string (``--policy``,
``AUTOTHROTTLE_POLICY``), so the names and their
errors are the same everywhere.
"""

from __future__ import annotations

from collections.abc import Callable

from ._policies import (
    AdaptiveConcurrencyPolicy,
    AIMDPolicy,
    AutoThrottlePolicy,
    FixedDelayPolicy,
    FixedRatePolicy,
)
from ._policy import DelayPolicy

__all__ = ["POLICY_TEXT_FORMS", "policy_from_text"]

_NAMED: dict[str, Callable[[], DelayPolicy]] = {
    "autothrottle": AutoThrottlePolicy,
    "adaptive": AdaptiveConcurrencyPolicy,
    "aimd": AIMDPolicy,
}
_WITH_NUMBER: dict[str, Callable[[float], DelayPolicy]] = {
    "fixed-rate": FixedRatePolicy,
    "fixed-delay": FixedDelayPolicy,
}

#: The forms :func:`policy_from_text` reads, for messages and help texts.
POLICY_TEXT_FORMS = "autothrottle, adaptive, aimd, fixed-rate=N or fixed-delay=S"


def policy_from_text(text: str, *, name: str = "policy") -> DelayPolicy:
    """The policy ``text`` names, made with its defaults.

    ``autothrottle`` (Scrapy's rules), ``adaptive``, ``aimd``, ``fixed-rate=N``
    (N requests a second) or ``fixed-delay=S`` (S seconds between sends); case
    and surrounding spaces do not matter.

    >>> policy_from_text("fixed-rate=2")
    FixedRatePolicy(per_second=2.0, burst=1)

    Raises:
        ValueError: ``text`` is none of these, or its number is not one; the
            message starts with ``name`` (the flag or setting it came from).
    """
    if not isinstance(text, str):
        raise TypeError(f"{name}: expected a policy's name, got {text!r}")
    key, _, argument = text.strip().partition("=")
    key = key.strip().lower()
    argument = argument.strip()
    if key in _NAMED and not argument:
        return _NAMED[key]()
    if key in _WITH_NUMBER and argument:
        try:
            number = float(argument)
        except ValueError:
            raise ValueError(f"{name}: {key} needs a number, got {text!r}") from None
        try:
            return _WITH_NUMBER[key](number)
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None
    raise ValueError(f"{name}: expected {POLICY_TEXT_FORMS}, got {text!r}")

"""Validated settings of a slot.

Every public constructor funnels its numbers through the checkers here, so a bad
value fails at construction time with an error that names the parameter and the
value, instead of surfacing later as a stalled or runaway crawl.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._policy import DelayPolicy


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
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class SlotConfig:
    """The settings that govern one slot, already validated.

    A :class:`~autothrottle.Throttle` builds one from its own arguments; policies
    receive it with every sample so one policy object can serve slots with
    different settings.
    """

    start_delay: float
    min_delay: float
    max_delay: float
    target_concurrency: float
    max_concurrency: int
    jitter: float
    policy: DelayPolicy
    burst: int = 1

    @classmethod
    def build(
        cls,
        *,
        start_delay: object,
        min_delay: object,
        max_delay: object,
        target_concurrency: object,
        max_concurrency: object,
        jitter: object,
        policy: DelayPolicy,
    ) -> SlotConfig:
        start = check_number("start_delay", start_delay)
        low = check_number("min_delay", min_delay)
        high = check_number("max_delay", max_delay)
        if high < low:
            raise ValueError(
                f"max_delay must be >= min_delay, got max_delay={max_delay!r} "
                f"and min_delay={min_delay!r}"
            )
        target = check_positive("target_concurrency", target_concurrency)
        cap = check_int("max_concurrency", max_concurrency, minimum=1)
        jit = check_number("jitter", jitter)
        if jit >= 1.0:
            raise ValueError(f"jitter must be in [0, 1), got {jitter!r}")
        from ._policy import DelayPolicy, policy_burst

        if not isinstance(policy, DelayPolicy):
            raise TypeError(f"policy must be a DelayPolicy, got {policy!r}")
        return cls(start, low, high, target, cap, jit, policy, policy_burst(policy))

    def clamp(self, delay: float) -> float:
        """``delay`` bounded to ``[min_delay, max_delay]``."""
        return min(max(delay, self.min_delay), self.max_delay)

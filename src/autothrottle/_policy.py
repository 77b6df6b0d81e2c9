"""Delay policies: one sample in, a new delay out.

A policy is a small, synchronous object with no I/O and no clock of its own,
in the manner of Netflix's concurrency-limits: the throttle hands it the
slot's current delay and one observed response, and it answers with the delay
it wants next. The throttle then applies the rules every policy shares
(clamping to ``[min_delay, max_delay]``; a response that is not a plain 200
may raise the delay but never lower it), so a policy only states its idea.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ._config import SlotConfig

__all__ = ["AutoThrottlePolicy", "DelayPolicy", "Sample"]


@dataclass(frozen=True, slots=True)
class Sample:
    """One observed response, as a policy sees it.

    Attributes:
        latency: Seconds from the moment a connection was ready for the request
            to the moment the response headers arrived.
        status: The HTTP status code of the response.
        in_flight: Requests of the slot in flight when the response arrived,
            this one included.
    """

    latency: float
    status: int
    in_flight: int


@runtime_checkable
class DelayPolicy(Protocol):
    """The interface every delay policy implements.

    Implementations must be cheap (they run once per response) and must not
    raise on any finite, non-negative latency.
    """

    def initial_delay(self, config: SlotConfig) -> float:
        """The delay of a slot that has seen no response yet."""
        ...

    def next_delay(self, delay: float, sample: Sample, config: SlotConfig) -> float:
        """The delay the slot should use after ``sample``; the throttle clamps it."""
        ...


class AutoThrottlePolicy:
    """Scrapy's AutoThrottle rules, exactly.

    A slot starts at ``max(start_delay, min_delay)``. Each response of latency
    ``L`` sets a target of ``L / target_concurrency`` (the gap that keeps
    ``target_concurrency`` requests in flight on average), and the delay moves
    to ``max(target, (delay + target) / 2)``: up to the target at once, down
    towards it by halves, so one fast response cannot collapse the delay.
    """

    __slots__ = ()

    def initial_delay(self, config: SlotConfig) -> float:
        return max(config.start_delay, config.min_delay)

    def next_delay(self, delay: float, sample: Sample, config: SlotConfig) -> float:
        target = sample.latency / config.target_concurrency
        return max(target, (delay + target) / 2.0)

    def __repr__(self) -> str:
        return "AutoThrottlePolicy()"

"""What a :class:`~autothrottle.timeline.Timeline` records: samples of a slot, and marks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Mark", "SlotSample"]


@dataclass(frozen=True, slots=True)
class SlotSample:
    """One slot at one sampling moment, and what happened since the sample before.

    Attributes:
        time: Seconds since the timeline started.
        delay: The slot's delay then, in seconds.
        latency: The last latency it had observed, or None.
        in_flight: Requests in flight.
        queued: Requests waiting for their turn.
        responses: Responses observed since the previous sample.
        statuses: Those responses by HTTP status.
        cache_hits: Responses since the previous sample that a cache answered.
        backoffs: Backoffs since the previous sample (ignored ones included).
        pauses: Pauses since the previous sample (Retry-After, rate-limit budget).
        failures: Requests that failed without a response since the previous sample.
        backoff_reason: The slot's last backoff reason, when ``backoffs`` > 0.
    """

    time: float
    delay: float
    latency: float | None
    in_flight: int
    queued: int
    responses: int = 0
    statuses: Mapping[int, int] = field(default_factory=dict)
    cache_hits: int = 0
    backoffs: int = 0
    pauses: int = 0
    failures: int = 0
    backoff_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Mark:
    """An event the throttle cannot see, recorded by the caller (a CAPTCHA page, say).

    Attributes:
        time: Seconds since the timeline started.
        key: The slot key it belongs to.
        kind: A short label, e.g. ``"blocked"``.
    """

    time: float
    key: str
    kind: str

"""What a slot has learned, as one plain record a store can hold, copy or share.

The record holds numbers, strings and one small dict: no tickets, leases,
clocks or random sources (those belong to the live gate of one process). So a
store can keep it in a dict, dump it to JSON and load it back in a later run,
or share it between processes.

Times in the record are read on the throttle's clock (monotonic by default,
which means nothing outside this process). :meth:`SlotState.to_dict` therefore
writes every time as seconds *ago*, relative to a ``now`` the caller gives,
and :meth:`SlotState.from_dict` turns them back into times on the loading
process's clock; see ``docs/architecture.md`` ("The clock contract").
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any

from ._headers import RateLimit

__all__ = ["LATENCY_BUCKETS", "SlotState"]

LATENCY_BUCKETS = 80
"""Quarter-octave latency buckets from 1 ms; the last starts at 2**19.75 ms."""

#: Fields that are times on the throttle's clock (written relative to ``now``).
_TIMES = frozenset(
    {
        "adjusted_at",
        "allowed_at",
        "backoff_at",
        "budget_until",
        "last_activity",
        "ok_first",
        "ok_next_first",
        "pause_until",
        "sustained_until",
    }
)


@dataclass(slots=True)
class SlotState:
    """The learned state of one slot.

    Attributes:
        delay: Seconds between two sends (before jitter).
        policy_state: The delay policy's per-slot memory.
        last_latency: Latency of the last observed response, or None.
        pause_until: No send before this time (Retry-After, exhausted budget).
        budget_gap: Spacing a rate-limit header asked for, until ``budget_until``.
        budget_until: When that budget resets.
        sustained_gap: The spacing of the advertised policy's own pace (window
            over quota), until ``sustained_until``.
        sustained_until: When that pace stops holding unless renewed.
        rate_limit: The last budget a response advertised.
        backoff_at: When the slot last backed off (``-inf``: never).
        backoff_reason: Why it last backed off.
        refused_gap: The gap between sends the host last refused (0: none).
        recover_in: Seconds until the floor is back at the refused gap (0: the
            throttle's ``recovery_time``).
        allowed: The best success rate seen at a refusal lately (requests/s).
        allowed_at: When ``allowed`` was measured.
        ok_count: Successful responses counted into the success rate: those
            since the last refusal, or only the latest ones (between
            ``RECENT_SUCCESSES`` and twice that) once there are more.
        ok_first: The first of them.
        ok_next: Successes since ``ok_next_first``, the window that replaces
            the counted one when it reaches ``RECENT_SUCCESSES``.
        in_flight_cap: The policy's own cap on requests in flight (0: none; the
            gate also applies ``max_concurrency``).
        miss_share: The averaged share of responses a cache did not answer (1 until
            a hit is seen): the share of the slot's sends that reach the origin.
        hit_latency: The averaged latency of cache hits (0: none yet).
        adjusted_at: When the delay was last adapted (the ramp-up measures from it).
        ramp_to: The delay the policy asked for when the ramp-up held it back
            (0: none); the gate lets the delay fall toward it as time passes.
        last_activity: The last send, release or response.
        sent: Requests sent since the slot was created; likewise the counters
            ``responses``, ``failures``, ``cache_hits``, ``backoffs``,
            ``ignored_backoffs``, ``pauses`` and ``status_counts``.
        backoff_reasons: Backoffs by reason (``"status 429"``, ``"blocked"`` ...).
        latency_buckets: Responses by latency, in quarter-octave buckets from
            1 ms (:mod:`autothrottle._stats` reads percentiles from them).
    """

    delay: float
    policy_state: dict[str, float] = field(default_factory=dict)
    last_latency: float | None = None
    pause_until: float = -math.inf
    budget_gap: float = 0.0
    budget_until: float = -math.inf
    sustained_gap: float = 0.0
    sustained_until: float = -math.inf
    rate_limit: RateLimit | None = None
    backoff_at: float = -math.inf
    backoff_reason: str | None = None
    refused_gap: float = 0.0
    recover_in: float = 0.0
    allowed: float = 0.0
    allowed_at: float = -math.inf
    ok_count: int = 0
    ok_first: float = -math.inf
    ok_next: int = 0
    ok_next_first: float = -math.inf
    in_flight_cap: int = 0
    miss_share: float = 1.0
    hit_latency: float = 0.0
    adjusted_at: float = 0.0
    ramp_to: float = 0.0
    last_activity: float = 0.0
    sent: int = 0
    responses: int = 0
    failures: int = 0
    cache_hits: int = 0
    backoffs: int = 0
    ignored_backoffs: int = 0
    pauses: int = 0
    status_counts: Counter[int] = field(default_factory=Counter)
    backoff_reasons: Counter[str] = field(default_factory=Counter)
    latency_buckets: list[int] = field(default_factory=list)

    def count_latency(self, latency: float) -> None:
        """Count one response's latency into :attr:`latency_buckets`."""
        index = 0 if latency <= 0.001 else int(4.0 * math.log2(latency / 0.001))
        buckets = self.latency_buckets
        if not buckets:
            buckets.extend([0] * LATENCY_BUCKETS)
        buckets[min(index, LATENCY_BUCKETS - 1)] += 1

    def to_dict(self, now: float) -> dict[str, Any]:
        """The record as JSON-ready data, each time written as seconds before ``now``."""
        data: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _TIMES:
                value = now - value if math.isfinite(value) else None
            elif f.name == "status_counts":
                value = {str(status): count for status, count in value.items()}
            elif f.name in ("policy_state", "backoff_reasons"):
                value = dict(value)
            elif f.name == "latency_buckets":
                value = list(value)
            elif f.name == "rate_limit" and value is not None:
                value = value.to_dict()
            data[f.name] = value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], now: float) -> SlotState:
        """A record from :meth:`to_dict`'s data, its times placed before ``now``.

        Raises:
            TypeError, ValueError: ``data`` is not such a record (names the field).
        """
        if not isinstance(data, dict):
            raise TypeError(f"slot state must be a dict, got {data!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown slot state field(s) {unknown!r}")
        values: dict[str, Any] = {}
        for name, value in data.items():
            if name in _TIMES:
                values[name] = -math.inf if value is None else now - _number(name, value)
            elif name == "status_counts":
                values[name] = Counter({int(k): int(v) for k, v in dict(value).items()})
            elif name == "policy_state":
                values[name] = {str(k): _number(name, v) for k, v in dict(value).items()}
            elif name == "backoff_reasons":
                values[name] = Counter({str(k): int(v) for k, v in dict(value).items()})
            elif name == "latency_buckets":
                values[name] = [int(count) for count in value]
            elif name == "rate_limit" and value is not None:
                values[name] = RateLimit.from_dict(value)
            else:
                values[name] = value
        if "delay" not in values:
            raise ValueError("slot state has no 'delay'")
        values["delay"] = _number("delay", values["delay"])
        return cls(**values)


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise TypeError(f"slot state field {name!r} must be a number, got {value!r}")
    return float(value)

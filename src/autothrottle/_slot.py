"""A slot: one key's (usually one host's) gate and learned state, seen from outside.

:class:`Slot` is the public face of the engine's per-key parts: the learned
:class:`~autothrottle._state.SlotState` record (which a store holds) and the
:class:`~autothrottle._gate.Gate` that decides who may send (which lives in
this process only). It holds no rule of its own: the rules that change the
state are in :mod:`autothrottle._rules`, the scheduling in :mod:`._gate`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from ._gate import Gate
from ._headers import RateLimit
from ._policy import SlotConfig
from ._state import SlotState
from ._validate import check_number

__all__ = ["Slot", "SlotSnapshot"]

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class SlotSnapshot:
    """A consistent, read-only view of one slot at one moment.

    Attributes:
        key: The slot's key (usually the host).
        delay: The current delay between sends, in seconds.
        in_flight: Requests sent and not yet finished.
        queued: Requests waiting for their turn.
        last_latency: The latency of the last observed response, or None.
        sent: Requests sent through the slot so far.
        responses: Responses observed so far.
        failures: Requests that failed without a response.
        status_counts: Responses observed, by status code.
        cache_hits: Responses a cache answered (their latency never lowers the delay).
        backoffs: Backoff signals that slowed the slot down.
        ignored_backoffs: Backoff signals ignored as the lag of an earlier one
            (answers to requests sent before the slot last backed off).
        pauses: Times the slot was paused (Retry-After, exhausted budget, manual).
        last_backoff_ago: Seconds since the slot last backed off, or None.
        last_backoff_reason: Why it last backed off (``"status 429"``,
            ``"failure: ConnectError"``, ``"manual"``, ``"blocked"``), or None.
        pause_remaining: Seconds until the slot may send again after a pause (0 if
            not paused).
        rate_limit: The last rate-limit budget a response advertised, or None.
    """

    key: str
    delay: float
    in_flight: int
    queued: int
    last_latency: float | None
    sent: int
    responses: int
    failures: int
    status_counts: Mapping[int, int] = field(default_factory=dict)
    cache_hits: int = 0
    backoffs: int = 0
    ignored_backoffs: int = 0
    pauses: int = 0
    last_backoff_ago: float | None = None
    last_backoff_reason: str | None = None
    pause_remaining: float = 0.0
    rate_limit: RateLimit | None = None


class Slot:
    """The pacing state of one key (usually one host).

    Get one from :meth:`Throttle.slot <autothrottle.Throttle.slot>`; do not
    build it yourself. ``delay`` may be set by hand, for example to seed a slot
    with a delay learned in an earlier run; the policy keeps adjusting it from
    there.

    Attributes:
        key: The slot's key.
        state: What the slot has learned, as a plain record (read it; change it
            only through the throttle, which keeps the gate informed).
        gate: The engine's scheduling gate for this slot (package-internal).
    """

    __slots__ = ("_clock", "_config", "gate", "key", "noted", "state")

    def __init__(
        self,
        key: str,
        config: SlotConfig,
        state: SlotState,
        *,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        self.key = key
        self._config = config
        self._clock = clock
        self.state = state
        self.gate = Gate(state, config, clock=clock, rng=rng)
        #: Kinds of header problem already logged for this slot (see docs/signals.md).
        self.noted: set[str] = set()

    @property
    def config(self) -> SlotConfig:
        """The settings this slot runs with."""
        return self._config

    @property
    def delay(self) -> float:
        """Seconds between two sends to this slot (before jitter).

        Settable within ``[min_delay, max_delay]``; outside it raises
        ``ValueError`` (a delay the policy could never reach would stall it).
        """
        return self.state.delay

    @delay.setter
    def delay(self, value: float) -> None:
        delay = check_number("delay", value)
        config = self._config
        if not config.min_delay <= delay <= config.max_delay:
            raise ValueError(
                f"delay must be in [min_delay, max_delay] = "
                f"[{config.min_delay:g}, {config.max_delay:g}], got {value!r}"
            )
        if delay != self.state.delay:
            self.state.delay = delay
            self.gate.wake()

    def _configure(self, config: SlotConfig) -> None:
        """Run with new settings from now on (``Throttle.set_host``), keeping the policy:
        what the slot learned belongs to it. The delay is brought within the new
        bounds, and waiting requests re-check their turn."""
        if config.policy is not self._config.policy:
            config = replace(
                config,
                policy=self._config.policy,
                burst=self._config.burst,
                windows=self._config.windows,
            )
        self._config = config
        self.gate.config = config
        delay = config.clamp(self.state.delay)
        if delay != self.state.delay:
            self.state.delay = delay
        self.gate.wake()

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet finished (body read or response closed)."""
        return self.gate.in_flight()

    @property
    def queued(self) -> int:
        """Requests waiting for their turn."""
        return self.gate.queued()

    @property
    def idle(self) -> bool:
        """True when the slot may be forgotten without losing a promise to the host.

        Nothing queued or in flight, and no pause or rate-limit budget still in
        force: forgetting a paused slot would let the next request go at once.
        """
        return self.gate.idle()

    @property
    def last_latency(self) -> float | None:
        """The latency of the last observed response, or None."""
        return self.state.last_latency

    @property
    def sent(self) -> int:
        """Requests sent through the slot so far."""
        return self.state.sent

    @property
    def last_activity(self) -> float:
        """The last send, release or response, on the throttle's clock."""
        return self.state.last_activity

    @property
    def pause_until(self) -> float:
        """No request is sent before this time (throttle's clock; ``-inf``: no pause)."""
        return self.state.pause_until

    def snapshot(self) -> SlotSnapshot:
        """The slot's state now, as an immutable record."""
        now = self._clock()
        state = self.state
        return SlotSnapshot(
            key=self.key,
            delay=state.delay,
            in_flight=self.gate.in_flight(),
            queued=self.gate.queued(),
            last_latency=state.last_latency,
            sent=state.sent,
            responses=state.responses,
            failures=state.failures,
            status_counts=dict(state.status_counts),
            cache_hits=state.cache_hits,
            backoffs=state.backoffs,
            ignored_backoffs=state.ignored_backoffs,
            pauses=state.pauses,
            last_backoff_ago=(now - state.backoff_at if math.isfinite(state.backoff_at) else None),
            last_backoff_reason=state.backoff_reason,
            pause_remaining=max(0.0, state.pause_until - now),
            rate_limit=state.rate_limit,
        )

    def __repr__(self) -> str:
        return (
            f"<Slot {self.key!r} delay={self.state.delay:.3f}s "
            f"in_flight={self.gate.in_flight()} queued={self.gate.queued()}>"
        )

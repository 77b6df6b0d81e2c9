"""A slot: one key's (usually one host's) gate and learned state.

:class:`LiveSlot` holds the engine's parts of one key in this process: the
learned :class:`~autothrottle._state.SlotState` (which a store holds), the
:class:`~autothrottle._gate.Gate` that decides who may send (which lives in
this process only), the settings, and the header problems already logged. The
engine passes it around; users never see it.

:class:`Slot` is its public face: what a user reads of a slot (delay, in
flight, queued, a snapshot) and the one thing a user may set (the delay). It
holds no rule of its own: the rules that change the state are in
:mod:`autothrottle._rules`, the scheduling in :mod:`._gate`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, make_dataclass, replace
from typing import Any, TypeVar

from ._cache import CacheShare
from ._gate import Gate
from ._headers import RateLimit
from ._pace import RampUp
from ._policies import UsualStep, usual_step
from ._policy import SlotConfig
from ._recovery import Recovery
from ._state import SlotState
from ._validate import check_number

__all__ = ["LiveSlot", "Slot", "SlotSnapshot"]

Clock = Callable[[], float]

_Record = TypeVar("_Record")


class LiveSlot:
    """One key's engine parts in this process (package-internal).

    Attributes:
        key: The slot's key.
        config: The settings the slot runs with.
        state: What the slot learned (the store's record).
        gate: Who may send now.
        noted: Kinds of header problem already logged (``docs/signals.md``).
        view: The public :class:`Slot` of this key.
        hold_maker: What makes a hold of this slot, kept by the throttle
            that owns the slot (None until its first).
        senders: The processes sending to the slot's host, this one among
            them (a fleet's, ``docs/fleet.md``; 1 alone): this process sees
            that share of the host's answers.
        fleet_went: When this process last let a fleet turn of the slot go
            (``time.monotonic``; the fleet's, ``autothrottle._fleet`` rule 8).
        capped, capped_cap: The policy's limit and the cap it gave, at the
            last usual response that applied one. :meth:`respond` runs only
            while the slot has seen no cache hit, so the cap is then the
            limit's alone (not the gap's): the same two again give the same
            cap. Two fields, not a pair: a pair is built and compared on
            every response.
        strict: The policy keeps a strict pace or the settings a
            ``min_delay`` (fixed by the policy and settings, so kept here at
            :meth:`configure`): the wire's arrival guard may then keep
            something of every answer (``WireTurn.answered``). The policy's
            ``strict_spacing`` is a class attribute, which Python 3.11 reads
            the slow way on every read.
        step: The policy's answer to the usual response in one call
            (``_policies.usual_step``: a shipped policy's without a sample).
            The policy is the slot's for good (:meth:`configure` keeps it).
    """

    __slots__ = (
        "capped",
        "capped_cap",
        "config",
        "fleet_went",
        "gate",
        "hold_maker",
        "key",
        "noted",
        "senders",
        "state",
        "step",
        "strict",
        "view",
    )

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
        self.config = config
        self.state = state
        self.gate = Gate(state, config, clock=clock, rng=rng)
        self.noted: set[str] = set()
        self.view = Slot(self, clock)
        self.senders = 1
        self.fleet_went = -math.inf
        self.hold_maker: Callable[[float], Any] | None = None
        self.step: UsualStep = usual_step(config.policy)
        self.capped = 0.0
        self.capped_cap = -1
        self.strict = config.policy.strict_spacing or config.min_delay > 0.0

    def configure(self, config: SlotConfig) -> None:
        """Run with new settings from now on (``Throttle.set_host``), keeping the policy:
        what the slot learned belongs to it. The delay is brought within the new
        bounds, and waiting requests re-check their turn.

        Under the slot's lock, as every other writer of its state: from another
        thread (a sync client's), a response's new delay could otherwise be
        overwritten by the clamp of the one read before it, and a grant could
        read the gate's settings half changed."""
        with self.gate.lock:
            old = self.config
            if config.policy is not old.policy:
                config = replace(config, policy=old.policy, burst=old.burst, windows=old.windows)
            self.config = config
            self.gate.configure(config)
            self.strict = config.policy.strict_spacing or config.min_delay > 0.0
            self.state.pace.set_delay(config.clamp(self.state.pace.delay))
            self.gate.wake()

    def respond(
        self,
        latency: float,
        status: int,
        now: float,
        sent_at: float | None,
        adjust: bool,
        recovery: Recovery,
    ) -> None:
        """The usual response (``_turns.Plain`` checked it, holding the lock) in one
        call: the rules' steps, each record written by its owner (the rules are the
        spec: a test compares); the step reads the gate only if its rule needs to."""
        state, gate, config = self.state, self.gate, self.config
        state.counters.count_response(status, latency, now)
        limits = state.limits
        if (
            gate.arrivals is not None
            or self.strict
            or now < limits.sustained_until
            or now < limits.budget_until
        ):  # else the wire's `answered` keeps nothing (its pace is not strict)
            gate.answered(sent_at, latency, now)
        refusal = state.refusal
        if status == 200:
            recovery.count_success(refusal, now)
        if not adjust:
            return
        if now >= gate.soonest:  # a hold may have expired: the gate lets go of it first
            gate.expire(now)
        pace = state.pace
        old = pace.delay
        step = self.step  # a local first: a call on an attribute that holds no method is slow
        new, limit = step(
            config.policy, old, latency, status, False, gate, now, pace.policy_state, config
        )
        if limit is not None and (
            limit != self.capped or state.cache.in_flight_cap != self.capped_cap
        ):
            self._cap(limit, new)
        if new < config.min_delay:  # config.clamp(new), without its call
            new = config.min_delay
        elif new > config.max_delay:
            new = config.max_delay
        if not refusal.refused_gap <= 0.0:
            floor = recovery.floor(refusal, now)
            if new < floor:
                new = min(floor, config.max_delay)
        if new < old:
            if status != 200:
                new = old  # only a plain 200 may lower the delay
            elif config.policy.ramp_up is not None and refusal.refused_gap <= 0.0:
                new, ramp_to = self.ramped(config.policy.ramp_up, new, now)
                if pace.adapt(new, now, ramp_to=ramp_to):
                    gate.wake()
                return
        if pace.adapt(new, now):
            gate.wake()

    def _cap(self, limit: float, new: float) -> None:
        """:meth:`respond`'s cap on requests in flight, when the policy's ``limit``
        or the cap itself changed since it was last set (the step asked for the
        delay ``new``)."""
        cache = self.state.cache
        low = self.config.min_delay
        gap = low if low > new else new  # max(new, low, 1e-6), without its call
        if CacheShare.cap(cache, limit, 1e-6 if gap < 1e-6 else gap):
            self.gate.wake()
        self.capped, self.capped_cap = limit, cache.in_flight_cap

    def ramped(self, ramp: float, new: float, now: float) -> tuple[float, float]:
        """The delay the ramp-up lets a falling delay take (``new`` asked), and
        what it held back (0.0: nothing): the rules' ``_adapt`` and :meth:`respond`
        both ask it. A host that stated the pace it allows leaves nothing to ramp
        up to."""
        state = self.state
        held = RampUp(ramp).hold(state.pace, new, now)
        stated = state.limits.stated_gap(now)
        if 0.0 < stated < held:
            held = max(new, stated)  # the host stated the pace it allows
        if held > new:
            return held, new
        return new, 0.0


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


def positional_builder(record_type: type[_Record]) -> Callable[..., _Record]:
    """A cheaper way to build ``record_type``, a frozen slotted dataclass, from
    every field's value in order (no defaults, no keywords).

    A frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``: 17 calls for a :class:`SlotSnapshot`, 1.2-1.4 µs,
    a third of a snapshot's cost a slot. Here a plain slotted twin with the
    same fields (so the same layout, which lets Python change an object's
    class) takes the values with plain attribute stores, then becomes a
    ``record_type``: 0.3 µs. What it builds is a ``record_type`` in every way:
    its equality, repr, immutability and ``dataclasses.replace``.
    ``python benchmarks/stats.py --bytecodes`` counts it.
    """
    twin = make_dataclass(
        f"_{record_type.__name__}Draft",
        [(each.name, each.type) for each in fields(record_type)],  # type: ignore[arg-type]
        slots=True,
        eq=False,
        repr=False,
        namespace={"__module__": __name__},
    )
    set_class = object.__setattr__

    def build(*values: Any) -> _Record:
        record = twin(*values)
        set_class(record, "__class__", record_type)
        return record  # type: ignore[no-any-return]

    return build


_build_snapshot = positional_builder(SlotSnapshot)
"""A :class:`SlotSnapshot` from every field in order: :meth:`Slot.snapshot` builds
one a slot on every read of a whole throttle."""


class Slot:
    """The pacing state of one key (usually one host).

    Get one from :meth:`Throttle.slot <autothrottle.Throttle.slot>`; do not
    build it yourself. ``delay`` may be set by hand, for example to seed a slot
    with a delay learned in an earlier run; the policy keeps adjusting it from
    there. What the slot learned, as a plain record, is in the throttle's store:
    ``throttle.store.load(slot.key)``.

    Attributes:
        key: The slot's key.
    """

    __slots__ = ("_clock", "_live")

    def __init__(self, live: LiveSlot, clock: Clock) -> None:
        self._live = live
        self._clock = clock

    @property
    def key(self) -> str:
        """The slot's key."""
        return self._live.key

    @property
    def config(self) -> SlotConfig:
        """The settings this slot runs with."""
        return self._live.config

    @property
    def delay(self) -> float:
        """Seconds between two sends to this slot (before jitter).

        Settable within ``[min_delay, max_delay]``; outside it raises
        ``ValueError`` (a delay the policy could never reach would stall it).
        A delay set here applies at once, to the gap already begun too (a
        delay a response lowered shortens only the gaps after it).
        """
        return self._live.state.pace.delay

    @delay.setter
    def delay(self, value: float) -> None:
        delay = check_number("delay", value)
        live = self._live
        config = live.config
        if not config.min_delay <= delay <= config.max_delay:
            raise ValueError(
                f"delay must be in [min_delay, max_delay] = "
                f"[{config.min_delay:g}, {config.max_delay:g}], got {value!r}"
            )
        with live.gate.lock:
            # The gap begun takes it too: shorter than that gap, the head's turn
            # may come sooner, though the delay in force was this one already (a
            # response lowered it, and the gap kept the delay it began with).
            live.gate.set_by_hand()
            live.state.pace.set_delay(delay)
            live.gate.wake()

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet finished (body read or response closed)."""
        return self._live.gate.in_flight()

    @property
    def queued(self) -> int:
        """Requests waiting for their turn."""
        return self._live.gate.queued()

    @property
    def idle(self) -> bool:
        """True when the slot may be forgotten without losing a promise to the host.

        Nothing queued or in flight, and no pause or rate-limit budget still in
        force: forgetting a paused slot would let the next request go at once.
        """
        return self._live.gate.idle()

    @property
    def last_latency(self) -> float | None:
        """The latency of the last observed response, or None."""
        return self._live.state.counters.last_latency

    @property
    def sent(self) -> int:
        """Requests sent through the slot so far."""
        return self._live.state.counters.sent

    @property
    def last_activity(self) -> float:
        """The last send, release or response, on the throttle's clock."""
        return self._live.state.counters.last_activity

    @property
    def pause_until(self) -> float:
        """No request is sent before this time (throttle's clock; ``-inf``: no pause)."""
        return self._live.state.limits.pause_until

    def snapshot(self) -> SlotSnapshot:
        """The slot's state now, as an immutable record."""
        now = self._clock()
        live = self._live
        gate = live.gate
        state = live.state
        counters = state.counters
        backoff_at = state.refusal.backoff_at
        limits = state.limits
        pause_remaining = limits.pause_until - now
        return _build_snapshot(  # SlotSnapshot's fields, in order
            live.key,
            state.pace.delay,
            gate.in_flight(),
            gate.queued(),
            counters.last_latency,
            counters.sent,
            counters.responses,
            counters.failures,
            dict(counters.status_counts),
            counters.cache_hits,
            counters.backoffs,
            counters.ignored_backoffs,
            counters.pauses,
            now - backoff_at if math.isfinite(backoff_at) else None,
            counters.backoff_reason,
            pause_remaining if pause_remaining > 0.0 else 0.0,
            limits.rate_limit,
        )

    def __repr__(self) -> str:
        live = self._live
        return (
            f"<Slot {live.key!r} delay={live.state.pace.delay:.3f}s "
            f"in_flight={live.gate.in_flight()} queued={live.gate.queued()}>"
        )

"""The delay policies autothrottle ships, each one class behind :class:`DelayPolicy`.

See :mod:`autothrottle._policy` for the interface and the rules every policy
shares (the throttle applies those, so each class here states only its idea).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import Protocol

from ._policy import DelayPolicy, Sample, SlotConfig, new_sample
from ._validate import check_int, check_number, check_positive

__all__ = [
    "Load",
    "AIMDPolicy",
    "AdaptiveConcurrencyPolicy",
    "AutoThrottlePolicy",
    "FixedDelayPolicy",
    "FixedRatePolicy",
    "UsualStep",
    "usual_step",
]

_INF = math.inf
_NEG_INF = -math.inf
_ADAPTIVE_KEYS = ("limit", "base", "low", "second")
"""The adaptive rule's keys that read as None when missing (``seen`` reads 0).
All of them are there after a slot's first usual response, so the rule reads
them by subscript, a fifth of what ``get``'s calls cost (on every response),
and by ``get`` only when one is missing. A state of another type than ``dict``
(a subclass's subscript may make what it misses) is read through :class:`_Reads`."""


class AutoThrottlePolicy(DelayPolicy):
    """Scrapy's AutoThrottle rules, exactly.

    A slot starts at ``max(start_delay, min_delay)``. Each response of latency
    ``L`` sets a target of ``L / target_concurrency`` (the gap that keeps
    ``target_concurrency`` requests in flight on average), and the delay moves
    to ``max(target, (delay + target) / 2)``: up to the target at once, down
    towards it by halves, so one fast response cannot collapse the delay.
    """

    __slots__ = ()

    def next_delay(self, delay: float, sample: Sample, config: SlotConfig) -> float:
        return _of_sample(_autothrottle_step, self, delay, sample, config)

    def __repr__(self) -> str:
        return "AutoThrottlePolicy()"


class FixedDelayPolicy(DelayPolicy):
    """The same delay between sends, whatever the latency (Scrapy's DOWNLOAD_DELAY).

    Backoff signals still raise it; the delay returns to ``delay`` no faster
    than the refusal floor allows. The delay is kept as the host sees it
    (``strict_spacing``).
    """

    __slots__ = ("delay",)
    strict_spacing = True

    def __init__(self, delay: float) -> None:
        self.delay = check_number("delay", delay)

    def initial_delay(self, config: SlotConfig) -> float:
        return self.delay

    def next_delay(self, delay: float, sample: Sample, config: SlotConfig) -> float:
        return _fixed_delay_step(self, delay, 0.0, 0, False, _IDLE, 0.0, sample.state, config)[0]

    def __repr__(self) -> str:
        return f"FixedDelayPolicy(delay={self.delay!r})"


class FixedRatePolicy(DelayPolicy):
    """At most ``per_second`` requests per second, with an optional burst and
    further windows.

    Sends are spaced ``1 / per_second`` apart; with ``burst`` > 1 up to
    ``burst`` requests may go back to back after a quiet spell (a generic cell
    rate algorithm), never more than ``burst + per_second * w`` in any window
    of ``w`` seconds. ``min_delay``/``max_delay`` still bound the gap.

    ``windows`` adds limits honoured together with the rate, each ``(count,
    seconds)``: never more than ``count`` sends in any ``seconds``. An API
    that allows "10 per second and 10,000 per day"::

        FixedRatePolicy(10, windows=[(10_000, 86_400)])

    The slot then goes at 10/s until it has sent 10,000 in the last day, and
    after that each send waits until the oldest of those is a day old.

    The rate is kept as the host sees it (``strict_spacing``): a request held
    up on its way does not let the next one arrive early
    (``docs/scheduling.md``, rule 10).
    """

    __slots__ = ("burst", "per_second", "windows")
    strict_spacing = True

    def __init__(
        self, per_second: float, *, burst: int = 1, windows: Iterable[tuple[int, float]] = ()
    ) -> None:
        self.per_second = check_positive("per_second", per_second)
        self.burst = check_int("burst", burst, minimum=1)
        self.windows = _checked_windows(windows)

    def initial_delay(self, config: SlotConfig) -> float:
        return 1.0 / self.per_second

    def next_delay(self, delay: float, sample: Sample, config: SlotConfig) -> float:
        return _fixed_rate_step(self, delay, 0.0, 0, False, _IDLE, 0.0, sample.state, config)[0]

    def __repr__(self) -> str:
        extra = f", windows={list(self.windows)!r}" if self.windows else ""
        return f"FixedRatePolicy(per_second={self.per_second!r}, burst={self.burst!r}{extra})"


def _checked_windows(windows: object) -> tuple[tuple[int, float], ...]:
    """``(count, seconds)`` pairs, each count an int >= 1 and seconds > 0."""
    if isinstance(windows, (str, bytes)) or not isinstance(windows, Iterable):
        raise TypeError(f"windows must be (count, seconds) pairs, got {windows!r}")
    checked = []
    for window in windows:
        if not isinstance(window, tuple | list) or len(window) != 2:
            raise TypeError(f"windows must be (count, seconds) pairs, got {window!r} in windows")
        count = check_int("windows count", window[0], minimum=1)
        seconds = check_positive("windows seconds", window[1])
        checked.append((count, seconds))
    return tuple(checked)


class AIMDPolicy(DelayPolicy):
    """Additive increase of the rate on success, multiplicative decrease on backoff.

    Each 200 response adds ``increase * gap`` to the rate, so the rate grows by
    about ``increase`` requests per second for every second of success,
    whatever the current rate. A backoff multiplies the rate by ``decrease``.
    The throttle counts only the first backoff signal of a burst (responses to
    requests sent before the slot backed off are the concurrency lag of the
    old rate, not new evidence), so a burst of 429s cuts the rate once.

    Args:
        increase: Requests/second gained per second of success.
        decrease: Factor in (0, 1) applied to the rate on backoff.
        start_rate: Requests/second of a new slot; default from ``start_delay``.
    """

    __slots__ = ("decrease", "increase", "start_rate")

    def __init__(
        self, *, increase: float = 1.0, decrease: float = 0.5, start_rate: float | None = None
    ) -> None:
        self.increase = check_positive("increase", increase)
        self.decrease = check_positive("decrease", decrease)
        if self.decrease >= 1.0:
            raise ValueError(f"decrease must be in (0, 1), got {decrease!r}")
        self.start_rate = None if start_rate is None else check_positive("start_rate", start_rate)

    def initial_delay(self, config: SlotConfig) -> float:
        if self.start_rate is not None:
            return 1.0 / self.start_rate
        return super().initial_delay(config)

    def next_delay(self, delay: float, sample: Sample, config: SlotConfig) -> float:
        if sample.status != 200 or delay <= 0.0:
            return delay
        rate = 1.0 / delay + self.increase * delay
        return 1.0 / rate

    def backoff_delay(self, pace: float, factor: float, config: SlotConfig) -> float:
        return pace / self.decrease

    def __repr__(self) -> str:
        return (
            f"AIMDPolicy(increase={self.increase!r}, decrease={self.decrease!r}, "
            f"start_rate={self.start_rate!r})"
        )


class AdaptiveConcurrencyPolicy(DelayPolicy):
    """Finds how many requests a host serves in parallel, from the rise of latency.

    AutoThrottle keeps ``target_concurrency`` requests in flight, whatever the
    host can take: too low a target wastes capacity, too high a one keeps a
    standing queue at the host. This policy estimates the target itself, in
    the manner of TCP Vegas. It keeps the lowest latency seen (the no-load
    latency, slowly forgotten so it can follow a host that got slower) and,
    once per round of responses, the lowest latencies of that round. A queue at
    the host delays *every* request, the fastest too, so the round's lowest
    latency rises above the no-load one; slow pages alone do not raise it,
    because a round still holds fast ones (a steady mix of 30 ms and 800 ms
    pages is not a queue). It judges the round's second-lowest latency, so one
    request that happened to meet no queue does not hide one. From the two it
    reads how many of its in-flight
    requests wait at the host rather than being served:
    ``queued = limit * (1 - base / round_min)``. A loaded client reads every
    latency late by its own lag, the round's lowest too: that part of a rise
    is the client's, not a queue at the host, so the rise is judged above
    ``base + sample.lag`` (the lag the gate measured, 0 on an idle client).
    Under ``alpha`` queued it
    raises the limit by ``step``; above ``beta`` it lowers it by ``step``.
    Until the first round above ``beta`` it doubles the limit instead (a slow
    start, as TCP's), and at that round goes back to the last limit that
    showed no queue: it halves the limit, undoing the slow start's last
    doubling.

    The edges: only a plain 200 that is not a cache hit, with a latency
    above 0, teaches anything. The limit grows only while it is in use (at
    least ``limit - 1`` requests in flight when the round is judged), so a
    slot the caller keeps below its limit does not climb it; it never falls
    below 1. A round of a single response has no second-lowest latency and
    shows no queue.

    The limit caps the requests in flight (rounded up), and the delay is the
    no-load latency over the limit: the cap holds the host to the limit, so
    the pace only spreads the sends. Paced at the *averaged* latency over the
    limit (AutoThrottle's rule), a mix of fast and slow pages leaves the
    host's workers idle whenever slow ones cluster, and the time is never
    made up: 83-87 % of the benchmark's mixed site against 94-100 % now
    (docs/benchmarks.md).

    Its ``ramp_up`` (1 s) bounds how fast a new slot speeds up before its
    first refusal: the rate at most doubles each second, or every 8 sends if
    that is sooner (``docs/signals.md``, "Ramp-up").

    Args:
        initial_limit: Concurrency estimate of a new slot.
        alpha: Queued requests below which the limit grows.
        beta: Queued requests above which the limit shrinks.
        max_limit: The largest limit it will try (``max_concurrency`` also caps).
        base_decay: Per-sample factor by which the no-load latency is forgotten.
        step: How much the limit moves at a time.
        round_size: Responses per round at least (more when the limit is higher).
        ramp_up: Seconds in which the rate may at most double before the first
            refusal (None: no bound).
    """

    start_delay = 1.0
    """A new slot starts at 1 s (when the throttle was given no start delay): one
    request a second to a host never heard from, doubling every second or every
    8 sends (the ramp-up) until the host answers slower or refuses."""

    __slots__ = (
        "alpha",
        "base_decay",
        "beta",
        "initial_limit",
        "max_limit",
        "ramp_up",
        "round_size",
        "step",
    )

    def __init__(
        self,
        *,
        initial_limit: float = 1.0,
        alpha: float = 0.1,
        beta: float = 0.4,
        max_limit: float = 256.0,
        base_decay: float = 0.001,
        step: float = 0.5,
        round_size: int = 8,
        ramp_up: float | None = 1.0,
    ) -> None:
        self.initial_limit = check_positive("initial_limit", initial_limit)
        self.alpha = check_number("alpha", alpha)
        self.beta = check_positive("beta", beta)
        if self.beta <= self.alpha:
            raise ValueError(f"beta must be > alpha, got beta={beta!r} and alpha={alpha!r}")
        self.max_limit = check_positive("max_limit", max_limit)
        self.base_decay = check_number("base_decay", base_decay)
        if self.base_decay >= 1.0:
            raise ValueError(f"base_decay must be in [0, 1), got {base_decay!r}")
        self.step = check_positive("step", step)
        self.round_size = check_int("round_size", round_size, minimum=1)
        self.ramp_up = None if ramp_up is None else check_positive("ramp_up", ramp_up)

    def next_delay(self, delay: float, sample: Sample, config: SlotConfig) -> float:
        return _of_sample(_adaptive_step, self, delay, sample, config)

    def in_flight_limit(self, state: dict[str, float]) -> float | None:
        """The slot's limit: ``initial_limit`` until it has one (or one loaded from a
        file is not a limit at all)."""
        limit = state.get("limit", self.initial_limit)
        return limit if limit > 0.0 else self.initial_limit

    def backoff_delay(self, pace: float, factor: float, config: SlotConfig) -> float:
        return pace * factor

    def __repr__(self) -> str:
        return (
            f"AdaptiveConcurrencyPolicy(initial_limit={self.initial_limit!r}, "
            f"step={self.step!r}, ramp_up={self.ramp_up!r})"
        )


class Load(Protocol):
    """What a step reads of the slot's gate: a sample's ``in_flight`` (at the
    response's ``now``) and ``lag``. Read only by a rule that needs them (the
    adaptive one's, once a round): on the other responses, no call."""

    lag: float

    def in_flight_at(self, now: float) -> int:
        """Requests in flight at ``now``."""
        ...


class _Sampled:
    """A sample's in-flight count and lag as a :class:`Load` (the hooks' way
    into a step)."""

    __slots__ = ("in_flight", "lag")

    def __init__(self, in_flight: int, lag: float) -> None:
        self.in_flight = in_flight
        self.lag = lag

    def in_flight_at(self, now: float) -> int:
        return self.in_flight


_IDLE = _Sampled(0, 0.0)
"""The load handed to a rule that reads none (the fixed policies' hooks)."""

UsualStep = Callable[
    [DelayPolicy, float, float, int, bool, Load, float, dict[str, float], SlotConfig],
    tuple[float, float | None],
]
"""A shipped policy's rule in one call, without a :class:`Sample`:
``step(policy, delay, latency, status, cache_hit, load, now, state, config)``
gives ``(next_delay, in_flight_limit)``, the two hooks' answers to the sample
of ``load.in_flight_at(now)`` and ``load.lag`` (``in_flight_limit`` as the
state is left)."""


def _of_sample(
    step: Callable[..., tuple[float, float | None]],
    policy: DelayPolicy,
    delay: float,
    sample: Sample,
    config: SlotConfig,
) -> float:
    """``next_delay`` through ``step``: the hook and the usual response's one
    call run the same rule. A state of another type than ``dict`` (a caller's
    own, a ``defaultdict``) is read through :class:`_Reads`."""
    state = sample.state
    return step(
        policy,
        delay,
        sample.latency,
        sample.status,
        sample.cache_hit,
        _Sampled(sample.in_flight, sample.lag),
        0.0,
        state if type(state) is dict else _Reads(state),
        config,
    )[0]


_MISSING = object()


class _Reads(MutableMapping[str, float]):
    """A policy's state of another type than ``dict``, as the shipped steps read a
    slot's own: a missing key raises ``KeyError`` and makes nothing (a
    ``defaultdict``'s subscript would make it); the rest goes through."""

    __slots__ = ("_state",)

    def __init__(self, state: MutableMapping[str, float]) -> None:
        self._state = state

    def __getitem__(self, key: str) -> float:
        value = self._state.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value  # type: ignore[return-value]  # not _MISSING: a float

    def __setitem__(self, key: str, value: float) -> None:
        self._state[key] = value

    def __delitem__(self, key: str) -> None:
        del self._state[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)


def _autothrottle_step(
    policy: DelayPolicy,
    delay: float,
    latency: float,
    status: int,
    cache_hit: bool,
    load: Load,
    now: float,
    state: dict[str, float],
    config: SlotConfig,
) -> tuple[float, float | None]:
    """:meth:`AutoThrottlePolicy.next_delay`'s rule (the latency alone counts)."""
    target = latency / config.target_concurrency
    return max(target, (delay + target) / 2.0), None


def _fixed_delay_step(
    policy: FixedDelayPolicy,
    delay: float,
    latency: float,
    status: int,
    cache_hit: bool,
    load: Load,
    now: float,
    state: dict[str, float],
    config: SlotConfig,
) -> tuple[float, None]:
    """:meth:`FixedDelayPolicy.next_delay`'s rule: its delay, whatever the response."""
    return policy.delay, None


def _fixed_rate_step(
    policy: FixedRatePolicy,
    delay: float,
    latency: float,
    status: int,
    cache_hit: bool,
    load: Load,
    now: float,
    state: dict[str, float],
    config: SlotConfig,
) -> tuple[float, None]:
    """:meth:`FixedRatePolicy.next_delay`'s rule: one send a ``1 / per_second``."""
    return 1.0 / policy.per_second, None


def _adaptive_step(
    policy: AdaptiveConcurrencyPolicy,
    delay: float,
    latency: float,
    status: int,
    cache_hit: bool,
    load: Load,
    now: float,
    state: MutableMapping[str, float],
    config: SlotConfig,
) -> tuple[float, float]:
    """:meth:`AdaptiveConcurrencyPolicy.next_delay`'s rule, and the limit it leaves.

    A value read is not stored again when it is the very object to store (a
    dict's store costs a good part of the rule), so the memory ends the same;
    its keys are read by subscript (``_ADAPTIVE_KEYS`` says why)."""
    kept_all: Mapping[str, float | None] = state  # what a missing key reads: None
    try:
        kept, kept_base, kept_seen = kept_all["limit"], kept_all["base"], state["seen"]
        kept_low, kept_second = kept_all["low"], kept_all["second"]
    except KeyError:  # a new slot's first usual response
        kept, kept_base, kept_low, kept_second = map(state.get, _ADAPTIVE_KEYS)
        kept_seen = state.get("seen", 0.0)
    limit = kept if kept is not None and kept > 0.0 else policy.initial_limit  # in_flight_limit's
    if status != 200 or cache_hit or latency <= 0.0:
        if limit is not kept:
            state["limit"] = limit
        return delay, limit
    base = (latency if kept_base is None else kept_base) * (1.0 + policy.base_decay)
    if not base < latency:  # min(latency, base), without its call (on every response)
        base = latency
    # The round's two lowest latencies (0 stored: none yet, read as inf, so a
    # round's first latency is its lowest and not its second too); the second
    # is the one judged, so one lucky request that met no queue does not hide a queue.
    low = kept_low or _INF
    second = kept_second or _INF
    if latency < low:
        low, second = latency, low
    elif latency < second:
        second = latency
    # Judge once per round (about one round trip), as Vegas does once per RTT: judging
    # every response would move the limit many steps before a change could show in the latency.
    seen = kept_seen + 1.0
    if seen >= limit and seen >= policy.round_size:
        limit = _judged(
            policy, limit, base + load.lag, second, load.in_flight_at(now), state, config
        )
        seen, low, second = 0.0, 0.0, 0.0
    if limit is not kept:  # item by item: update(**...) builds a dict of its keywords first
        state["limit"] = limit
    state["base"] = base
    state["seen"] = seen
    if low is not kept_low:
        state["low"] = low
    if not _NEG_INF < second < _INF:  # not math.isfinite(second), without its call
        second = 0.0
    if second is not kept_second:
        state["second"] = second
    return base / limit, limit


def _judged(
    policy: AdaptiveConcurrencyPolicy,
    limit: float,
    floor: float,
    second: float,
    in_flight: int,
    state: MutableMapping[str, float],
    config: SlotConfig,
) -> float:
    """The limit after a round whose judged latency was ``second`` (inf: none),
    against the no-load latency and the client's own lag (``floor``): the
    lag is in every latency read, but not in the host's queue, so a rise it
    explains is no queue (docs/signals.md, "The client's own lag"; 0 on an
    idle client: no change there)."""
    queued = limit * (1.0 - floor / second) if math.isfinite(second) else 0.0
    cap = min(policy.max_limit, float(config.max_concurrency))
    steady = state.get("steady", 0.0)
    if queued < policy.alpha and in_flight >= limit - 1.0:
        # Slow start, as TCP's: double until the first queue shows.
        return min(limit + policy.step if steady else limit * 2.0, cap)
    if queued > policy.beta:
        # Leaving slow start: back to the last limit that showed no queue.
        state["steady"] = 1.0
        return max(limit - policy.step if steady else limit / 2.0, 1.0)
    return limit


_STEPS: dict[type, tuple[Callable[..., tuple[float, float | None]], object, object]] = {
    kind: (step, kind.next_delay, kind.in_flight_limit)
    for kind, step in (
        (AdaptiveConcurrencyPolicy, _adaptive_step),
        (AutoThrottlePolicy, _autothrottle_step),
        (FixedDelayPolicy, _fixed_delay_step),
        (FixedRatePolicy, _fixed_rate_step),
    )
}
"""Each shipped policy's step, and the hooks it stands for (a class whose hooks
were patched since is asked through them)."""


def usual_step(policy: DelayPolicy) -> UsualStep:
    """What answers a usual response for ``policy`` in one call: a shipped
    policy's rule, the very one its :meth:`~DelayPolicy.next_delay` runs,
    without building a :class:`Sample` (a frozen dataclass whose every field
    is set through a descriptor: it cost as much as the policy's own rule).
    Any other policy, a subclass too, or one whose hooks were replaced (on the
    instance or its class, before the slot was made), is asked through its
    hooks with a sample, as always."""
    kind = type(policy)
    known = _STEPS.get(kind)
    if known is None:
        return _by_hooks
    step, next_delay, in_flight_limit = known
    own = getattr(policy, "__dict__", {})
    if (
        kind.next_delay is not next_delay
        or kind.in_flight_limit is not in_flight_limit
        or "next_delay" in own
        or "in_flight_limit" in own
    ):
        return _by_hooks
    return step


def _by_hooks(
    policy: DelayPolicy,
    delay: float,
    latency: float,
    status: int,
    cache_hit: bool,
    load: Load,
    now: float,
    state: dict[str, float],
    config: SlotConfig,
) -> tuple[float, float | None]:
    """Any policy's answer, through its hooks and a sample."""
    sample = new_sample(latency, status, load.in_flight_at(now), cache_hit, state, load.lag)
    return policy.next_delay(delay, sample, config), policy.in_flight_limit(state)

"""The delay policy interface: one sample in, a new delay out.

A policy is a small, synchronous object with no I/O and no clock of its own,
in the manner of Netflix's concurrency-limits: the throttle hands it the
slot's current delay and one observed response, and it answers with the delay
it wants next. The throttle then applies the rules every policy shares
(clamping to ``[min_delay, max_delay]``; a response that is not a plain 200,
or that a cache answered, may raise the delay but never lower it; the floor
learned from the last refusal; pauses and rate-limit budgets), so a policy
only states its own idea.

One policy object serves every slot that uses it. A policy that needs memory
per slot keeps numbers in ``sample.state``, a dict that lives with the slot's
learned state (so a store can keep and share it).

:class:`SlotConfig` lives here too because it is half of the interface: a
policy is handed the validated settings of the slot with every sample. The
policies themselves are in :mod:`autothrottle._policies`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from ._validate import check_int, check_number, check_positive

__all__ = ["DelayPolicy", "Sample", "SlotConfig", "new_sample"]


@dataclass(frozen=True, slots=True)
class Sample:
    """One observed response, as a policy sees it.

    Attributes:
        latency: Seconds from the moment a connection was ready for the request
            to the moment the response headers arrived.
        status: The HTTP status code of the response.
        in_flight: Requests of the slot in flight when the response arrived,
            this one included.
        cache_hit: True when a cache (CDN, proxy) answered: the latency says
            nothing about the origin.
        state: Per-slot scratch space for policies that need memory.
        lag: Seconds the client itself has lately been late to run what was
            due (its event loop's lag, averaged; 0 on an idle client): a
            latency is read that late too, on average, and that part is not
            the host's (``docs/signals.md``, "The client's own lag").
    """

    latency: float
    status: int
    in_flight: int
    cache_hit: bool = False
    state: dict[str, float] = field(default_factory=dict)
    lag: float = 0.0


_new_object = object.__new__
_set_latency = vars(Sample)["latency"].__set__
_set_status = vars(Sample)["status"].__set__
_set_in_flight = vars(Sample)["in_flight"].__set__
_set_cache_hit = vars(Sample)["cache_hit"].__set__
_set_state = vars(Sample)["state"].__set__
_set_lag = vars(Sample)["lag"].__set__


def new_sample(
    latency: float,
    status: int,
    in_flight: int,
    cache_hit: bool,
    state: dict[str, float],
    lag: float,
) -> Sample:
    """``Sample(latency, status, in_flight, cache_hit, state, lag)``, the same
    object, made for every response at half the cost: a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__``; this sets the
    slots directly."""
    sample: Sample = _new_object(Sample)
    _set_latency(sample, latency)
    _set_status(sample, status)
    _set_in_flight(sample, in_flight)
    _set_cache_hit(sample, cache_hit)
    _set_state(sample, state)
    _set_lag(sample, lag)
    return sample


class DelayPolicy(ABC):
    """Base class of delay policies.

    Subclasses implement :meth:`next_delay`; the defaults of the other hooks
    suit most policies. ``burst`` is how many requests the slot may send back
    to back before the delay applies (1 for every policy but a rate with a
    burst). ``ramp_up`` bounds how fast the delay may fall while the slot has
    never been refused: the send rate at most doubles every ``ramp_up``
    seconds (None: no bound, as Scrapy's rules). A host is then met at a pace
    near the one it was last seen to accept, and its limit is found with one
    refusal instead of several (see ``docs/recovery.md``). ``windows`` are
    further limits the slot keeps whatever the delay, each ``(count,
    seconds)``: never more than ``count`` sends in any ``seconds``
    (``docs/scheduling.md``, rule 4). ``start_delay`` is the start a slot gets
    when the throttle was given none. ``strict_spacing`` says the delay is a
    rate the host holds arrivals to (a fixed rate or delay): the gate then
    keeps it as the host sees it, counting each gap from the latest moment the
    previous request may have reached the host (``docs/scheduling.md``, rule
    10); a pace a host stated in headers, or refused, is kept so whatever the
    policy.
    """

    burst: int = 1
    ramp_up: float | None = None
    windows: tuple[tuple[int, float], ...] = ()
    strict_spacing: bool = False
    start_delay: float = 5.0
    """The start delay a slot gets when the throttle was given none: Scrapy's
    ``AUTOTHROTTLE_START_DELAY`` (5 s) unless the policy says otherwise."""

    def initial_delay(self, config: SlotConfig) -> float:
        """The delay of a slot that has seen no response yet."""
        return max(config.start_delay, config.min_delay)

    @abstractmethod
    def next_delay(self, delay: float, sample: Sample, config: SlotConfig) -> float:
        """The delay the slot should use after ``sample``; the throttle clamps it."""

    def in_flight_limit(self, state: dict[str, float]) -> float | None:
        """How many requests the slot may have in flight, by this policy's estimate.

        None (the default): only ``max_concurrency`` caps. A policy that
        estimates a host's capacity (as a concurrency) returns it here, and the
        gate then holds the slot to it as well as to its delay, so a burst of
        slow responses cannot build a queue at the host.
        """
        return None

    def backoff_delay(self, pace: float, factor: float, config: SlotConfig) -> float:
        """The delay after a backoff signal (a 429/503, a failure, a block).

        ``pace`` is the gap between sends the slot was actually keeping when it
        was refused (at least its delay); the default multiplies it by the
        throttle's ``backoff_factor``.
        """
        return pace * factor


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
    windows: tuple[tuple[int, float], ...] = ()
    max_wait: float | None = None

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
        policy: object,
        max_wait: object = None,
    ) -> SlotConfig:
        """Validate every setting; raise naming the first bad one.

        ``start_delay=None`` is the policy's own (:attr:`DelayPolicy.start_delay`).
        """
        if not isinstance(policy, DelayPolicy):
            raise TypeError(_policy_hint(policy))
        if start_delay is None:
            start_delay = policy.start_delay
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
        burst = _policy_burst(policy)
        wait = None if max_wait is None else check_number("max_wait", max_wait)
        windows = tuple(policy.windows)
        return cls(start, low, high, target, cap, jit, policy, burst, windows, wait)

    def clamp(self, delay: float) -> float:
        """``delay`` bounded to ``[min_delay, max_delay]``."""
        low = self.min_delay
        if delay < low:
            delay = low
        high = self.max_delay
        return high if delay > high else delay


def _policy_hint(policy: object) -> str:
    """Why ``policy`` is not one, and what to pass instead.

    The two likely slips get their fix spelled out: the class where an
    instance belongs (its name, not its private module, and the call), and a
    name as the command line and Scrapy's settings write it, which only
    ``policy_from_text`` reads (a string here would mean a second reader of
    the same names)."""
    if isinstance(policy, type) and issubclass(policy, DelayPolicy):
        name = policy.__name__
        return (
            f"policy must be a DelayPolicy instance, got the class {name}; "
            f"pass an instance: policy={name}()"
        )
    if isinstance(policy, str):
        return (
            f"policy must be a DelayPolicy, got the string {policy!r}; a policy named "
            "in text is read by autothrottle.policy.policy_from_text: "
            f"policy=policy_from_text({policy!r})"
        )
    return f"policy must be a DelayPolicy, got {policy!r}"


def _policy_burst(policy: DelayPolicy) -> int:
    burst = getattr(policy, "burst", 1)
    return burst if isinstance(burst, int) and burst >= 1 else 1

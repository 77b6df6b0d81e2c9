"""The pace record and the ramp-up: the delay a slot keeps, and how fast it may fall.

:class:`Pace` holds the slot's delay between sends, the policy's own memory
(``policy_state``) and the ramp's two numbers. This module is the only one that
writes them (``tests/test_architecture.py`` checks it): the rules ask
:class:`RampUp` and then set the delay through :meth:`Pace.adapt`, a backoff,
a user or the fleet through :meth:`Pace.set_delay`. The policy writes its own
``policy_state`` dict, handed to it as ``Sample.state``.

:class:`RampUp` is pure: no clock, slot or throttle, only a ``Pace`` and a
time. The ramp-up rule (``docs/signals.md``, "Ramp-up") lives here and nowhere
else; the rules use it to hold a falling delay back, the gate to let a held
delay keep falling as time passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RAMP_SENDS", "Pace", "RampUp", "ramp_period"]

RAMP_SENDS = 8
"""The ramp-up lets the rate double every this many sends, if sooner than ``ramp_up``."""


def ramp_period(ramp_up: float, delay: float) -> float:
    """Seconds in which a ramping slot at ``delay`` may double its rate.

    ``ramp_up``, or the time of ``RAMP_SENDS`` sends at ``delay`` if that is
    shorter: as TCP's slow start doubles once per round trip, a fast slot
    doubles after a few sends rather than a whole second, while what it could
    send past a host's limit before the first refusal comes back stays a
    handful of requests (``docs/signals.md``, "Ramp-up").
    """
    return max(min(ramp_up, RAMP_SENDS * delay), 1e-6)


@dataclass(slots=True)
class Pace:
    """The delay of one slot and what it was last set from.

    Attributes:
        delay: Seconds between two sends (before jitter).
        policy_state: The delay policy's per-slot memory (the policy writes it).
        adjusted_at: When the delay was last adapted (the ramp-up measures from it).
        ramp_to: The delay the policy asked for when the ramp-up held it back
            (0: none); the gate lets the delay fall toward it as time passes.
    """

    delay: float
    policy_state: dict[str, float] = field(default_factory=dict)
    adjusted_at: float = 0.0
    ramp_to: float = 0.0

    def set_delay(self, delay: float) -> bool:
        """Set the delay from outside the ramp (a backoff, the user, the fleet);
        True when it changed (the gate must then re-check).

        A changed delay ends the ramp: what it held back was asked of the old
        delay, and falling toward it would undo the new one (a backoff's, say).
        """
        if delay == self.delay:
            return False
        self.delay = delay
        self.ramp_to = 0.0
        return True

    def adapt(self, delay: float, now: float, *, ramp_to: float = 0.0) -> bool:
        """The delay a response adapted at ``now``, and what the ramp held back
        (``ramp_to``, 0 for nothing); True when the delay changed."""
        changed = delay != self.delay
        self.delay = delay
        self.ramp_to = ramp_to
        self.adjusted_at = now
        return changed

    def bound(self, now: float, delay: float, ramp_to: float) -> None:
        """Hold a loaded record to ``delay`` and ``ramp_to`` (its delay and its
        ramp's end within the loading slot's bounds, the ramp's 0 where that
        slot's policy has no ramp-up), its adaptation time no later than ``now``.

        A ramp ends below the delay or not at all: one that ends at or above
        it (the delay held down to ``max_delay``) has nothing left to fall to.
        """
        self.delay = delay
        self.ramp_to = ramp_to if ramp_to < delay else 0.0
        self.adjusted_at = min(self.adjusted_at, now)


class RampUp:
    """How fast the delay of a slot that was never refused may fall.

    The send rate at most doubles every :func:`ramp_period`: the delay may be
    no less than ``delay * 2 ** (-elapsed / period)``, with ``elapsed`` the
    time since the delay was last adapted.

    Args:
        seconds: The policy's ``ramp_up`` (> 0).
    """

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def slowest(self, pace: Pace, now: float) -> float:
        """The least delay the ramp allows at ``now``, from the pace last set."""
        elapsed = max(0.0, now - pace.adjusted_at)
        share: float = 2.0 ** (-elapsed / ramp_period(self.seconds, pace.delay))
        return pace.delay * share

    def delay_at(self, pace: Pace, now: float) -> float:
        """The delay in force at ``now`` while the ramp holds it: falling from
        ``pace.delay`` toward ``pace.ramp_to``, never below it."""
        return max(self.slowest(pace, now), pace.ramp_to)

    def hold(self, pace: Pace, asked: float, now: float) -> float:
        """The delay the slot may take at ``now`` when its policy asks for ``asked``:
        ``asked``, or the ramp's :meth:`slowest` when that is more. Pure."""
        if asked >= pace.delay:
            return asked
        return max(asked, self.slowest(pace, now))

"""The refusal memory: what a slot learned from being refused, and how it returns.

One pure class, no clock of its own: every method takes ``now`` and the slot's
:class:`~autothrottle._state.SlotState`, and reads or writes plain numbers in
it. The rules are written out in ``docs/recovery.md``; in short:

* Successful responses feed an exponentially weighted success rate, the best
  estimate of what the host lets through.
* At a refusal, the host's limit lies between that rate (a lower bound) and the
  pace it refused (an upper one). Far apart, take their geometric mean, a step
  of binary search; close together, the lower bound is the limit.
* After a refusal the delay may not fall below a floor that follows a cubic
  around the refused gap, as TCP CUBIC does around the window of its last loss:
  ``margin`` of the refused rate at once, the refused rate after ``time``
  seconds with a long flat stretch around it, faster again beyond.
"""

from __future__ import annotations

import math

from ._state import SlotState
from ._validate import check_positive

__all__ = ["Recovery"]

RATE_WINDOW = 2.0
"""Seconds over which the success rate is averaged (the time constant)."""

_WARM = 0.3
"""Share of one time constant of history before the success rate is trusted."""

_ALLOWED_MEMORY = 60.0
"""Seconds a success rate measured at a refusal stays the lower bound."""

_CLOSE = 1.25
"""A refused gap within this factor of the allowed gap is taken as the limit itself."""


class Recovery:
    """How a slot brackets a host's limit from refusals and comes back after one.

    Args:
        margin: Right after a refusal the slot may come back to this fraction of
            the refused rate, in (0, 1].
        time: Seconds until it may reach the refused rate again (> 0).
    """

    __slots__ = ("margin", "time")

    def __init__(self, margin: float = 0.93, time: float = 15.0) -> None:
        self.margin = check_positive("recovery_margin", margin)
        if self.margin > 1.0:
            raise ValueError(f"recovery_margin must be in (0, 1], got {margin!r}")
        self.time = check_positive("recovery_time", time)

    def __repr__(self) -> str:
        return f"Recovery(margin={self.margin!r}, time={self.time!r})"

    def count_success(self, state: SlotState, now: float) -> None:
        """Count one successful response at ``now`` into the success rate."""
        if state.ok_first == -math.inf:
            state.ok_first = now
            state.ok_rate_at = now
        state.ok_rate *= math.exp((state.ok_rate_at - now) / RATE_WINDOW)
        state.ok_rate += 1.0 / RATE_WINDOW
        state.ok_rate_at = now

    def success_rate(self, state: SlotState, now: float) -> float | None:
        """Successful responses per second lately, or None before a fair estimate."""
        warm = 1.0 - math.exp((state.ok_first - now) / RATE_WINDOW)
        if warm < _WARM:
            return None
        return state.ok_rate * math.exp((state.ok_rate_at - now) / RATE_WINDOW) / warm

    def refused(self, state: SlotState, pace: float, now: float) -> None:
        """Remember a refusal of sends ``pace`` seconds apart, at ``now``."""
        refused_gap = pace
        allowed = self.success_rate(state, now) or 0.0
        if now - state.allowed_at < _ALLOWED_MEMORY:
            # Right after a pause the recent rate reads low: keep the best lately.
            allowed = max(allowed, state.allowed)
        if allowed > 0.0:
            state.allowed = allowed
            state.allowed_at = now
            if 1.0 / allowed > _CLOSE * pace:
                refused_gap = math.sqrt(pace / allowed)
            else:
                refused_gap = max(pace, 1.0 / allowed)
        state.refused_gap = refused_gap
        state.backoff_at = now

    def floor(self, state: SlotState, now: float) -> float:
        """The smallest delay the slot may use at ``now`` since its last refusal.

        With ``W`` the refused rate, ``K = time`` and ``b = 1 - margin``, the
        allowed rate ``t`` seconds after the refusal is
        ``W * (1 + b * (t / K - 1) ** 3)``.
        """
        refused = state.refused_gap
        if refused <= 0.0:
            return 0.0
        phase = max(0.0, now - state.backoff_at) / self.time - 1.0
        return refused / (1.0 + (1.0 - self.margin) * phase**3)

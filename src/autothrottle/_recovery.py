"""The refusal memory: what a slot learned from being refused, and how it returns.

One pure class, no clock of its own: every method takes ``now`` and the slot's
:class:`~autothrottle._state.SlotState`, and reads or writes plain numbers in
it. The rules are written out in ``docs/recovery.md``; in short:

* Successful responses since the last refusal are counted, from the first of
  them: ``(n - 1) / (now - first)`` is the rate the host let through (the one
  less for the request any host lets through at once), the best estimate of
  its limit. Only the latest 8 to 16 count: a slot that ramped up was let
  through at its latest rate, not at the mean of its ramp.
* At a refusal, the host's limit lies between that rate (a lower bound) and the
  pace it refused (an upper one). Close together, the lower bound is the
  limit. Far apart, take their geometric mean, a step of binary search; at a
  slot's first refusal, never more than the larger of the allowed rate and
  the refused rate over the backoff factor: a token bucket's burst lets a
  client run at twice its rate for a while, and the first refusal of a host
  must not be followed by a second one at nearly the same pace. Such a guess
  is reached again, and probed past, in 70 % of the recovery time.
* After a refusal the delay may not fall below a floor that follows a cubic
  around the refused gap, as TCP CUBIC does around the window of its last loss:
  ``margin`` of the refused rate at once, the refused rate after ``time``
  seconds with a long flat stretch around it, then rising ever faster beyond
  (the rate doubles by ``2 * time``), so a host whose limit is higher is found.
"""

from __future__ import annotations

import math

from ._state import SlotState
from ._validate import check_positive

__all__ = ["Recovery"]

_MIN_SPAN = 3
"""Successes since the last refusal before their rate is an estimate at all."""

RECENT_SUCCESSES = 8
"""Successes a rate is measured over at least (and at most twice as many)."""

_ALLOWED_MEMORY = 60.0
"""Seconds a success rate measured at a refusal stays the lower bound."""

_CLOSE = 1.25
"""A refused gap within this factor of the allowed gap is taken as the limit itself."""

_GUESS_SPEEDUP = 0.7
"""A first refusal's guessed limit is reached, and probed past, in this share of ``time``."""

_BEYOND = 1.0
"""How fast the floor opens past the refused rate: by ``2 * time`` the rate has doubled."""


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
        """Count one successful response at ``now``."""
        if state.ok_count == 0:
            state.ok_first = now
        state.ok_count += 1
        if state.ok_count > RECENT_SUCCESSES:
            # A second window runs behind the counted one and replaces it when full.
            if state.ok_next == 0:
                state.ok_next_first = now
            state.ok_next += 1
            if state.ok_next >= RECENT_SUCCESSES:
                state.ok_count, state.ok_first = state.ok_next, state.ok_next_first
                state.ok_next = 0

    def success_rate(self, state: SlotState, now: float) -> float | None:
        """The rate successes came at since the last refusal, or None before there is one."""
        span = now - state.ok_first
        if state.ok_count < _MIN_SPAN or span <= 0.0:
            return None
        return (state.ok_count - 1) / span

    def refused(self, state: SlotState, pace: float, now: float, factor: float = 2.0) -> None:
        """Remember a refusal of sends ``pace`` seconds apart, at ``now``.

        ``factor`` is the throttle's backoff factor: at the first refusal the
        limit is never taken as more than the refused rate over it, or the
        allowed rate if that is more, when the bounds are far apart.
        """
        refused_gap = pace
        guessed = False
        allowed = self.success_rate(state, now) or 0.0
        if now - state.allowed_at < _ALLOWED_MEMORY:
            # Right after a pause few successes have been counted: keep the best lately.
            allowed = max(allowed, state.allowed)
        if allowed > 0.0:
            state.allowed = allowed
            state.allowed_at = now
            if 1.0 / allowed > _CLOSE * pace:
                refused_gap = math.sqrt(pace / allowed)
                guess = min(pace * factor, 1.0 / allowed)
                if state.refused_gap <= 0.0 and guess > refused_gap:
                    # The first refusal: the burst may flatter. Guess low (but
                    # not below what was let through), and probe past it sooner.
                    refused_gap = guess
                    guessed = True
            else:
                refused_gap = max(pace, 1.0 / allowed)
        state.refused_gap = refused_gap
        state.recover_in = self.time * (_GUESS_SPEEDUP if guessed else 1.0)
        state.backoff_at = now
        state.ok_count = state.ok_next = 0

    def floor(self, state: SlotState, now: float) -> float:
        """The smallest delay the slot may use at ``now`` since its last refusal.

        With ``W`` the refused rate, ``K = time`` and ``b = 1 - margin``, the
        allowed rate ``t`` seconds after the refusal is
        ``W * (1 + b * (t / K - 1) ** 3)`` up to ``K``, then
        ``W * (1 + (t / K - 1) ** 3)``.
        """
        refused = state.refused_gap
        if refused <= 0.0:
            return 0.0
        phase = max(0.0, now - state.backoff_at) / (state.recover_in or self.time) - 1.0
        gain = (1.0 - self.margin) if phase < 0.0 else _BEYOND
        return refused / (1.0 + gain * phase**3)

"""The limits a host stated: a pause, and the spacing of a rate-limit budget.

:class:`Limits` holds what responses said of the host's limits (Retry-After,
an advertised budget and its policy's pace); this module is the only one that
writes it (``tests/test_architecture.py`` checks it). :class:`Budget` turns an
advertised budget into spacing or a pause; it is pure: no clock, slot or
throttle, only a ``Limits``, the budget and the time. The rules are written
out in ``docs/signals.md`` ("Rate-limit headers"); the gate reads the record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ._headers import HeaderSignals, RateLimit

__all__ = ["Budget", "Limits", "rounding"]


@dataclass(slots=True)
class Limits:
    """What a slot's host said of its limits.

    Attributes:
        pause_until: No send before this time (Retry-After, exhausted budget).
        budget_gap: Spacing a rate-limit header asked for, until ``budget_until``.
        budget_until: When that budget resets.
        sustained_gap: The spacing of the advertised policy's own pace (window
            over quota), until ``sustained_until``.
        sustained_until: When that pace stops holding unless renewed.
        rate_limit: The last budget a response advertised.
    """

    pause_until: float = -math.inf
    budget_gap: float = 0.0
    budget_until: float = -math.inf
    sustained_gap: float = 0.0
    sustained_until: float = -math.inf
    rate_limit: RateLimit | None = None

    def pause(self, until: float) -> bool:
        """Send nothing before ``until``; True if that ends a pause later than before."""
        if until <= self.pause_until:
            return False
        self.pause_until = until
        return True

    def stated_gap(self, now: float) -> float:
        """The spacing the host's headers ask for at ``now`` (0: none in force)."""
        gap = self.sustained_gap if now < self.sustained_until else 0.0
        if now < self.budget_until and self.budget_gap > gap:
            gap = self.budget_gap
        return gap

    def stated_next(self, last: float, now: float, above: float = 0.0) -> float:
        """When the send after one at ``last`` may go by the paces the host stated
        that hold at ``now`` and are wider than ``above`` (-inf: none): each
        pace's gap after ``last``, but no later than that pace's end (the window
        resets, the budget is renewed: the next answer says what holds then).

        The one home of that rule: the gate spaces its sends by it
        (``Gate._admit``, ``above`` its own gap, which it calls only while such
        a pace holds), the fleet floors its gap by it (:meth:`stated_gap_left`)."""
        at = -math.inf
        if self.budget_gap > above and now < self.budget_until:
            at = min(last + self.budget_gap, self.budget_until)
        if self.sustained_gap > above and now < self.sustained_until:
            at = max(at, min(last + self.sustained_gap, self.sustained_until))
        return at

    def stated_gap_left(self, now: float) -> float:
        """The spacing a send at ``now`` keeps before the next one by the host's
        stated paces (:meth:`stated_next`; 0.0: none holds): each gap cut to
        what is left of its pace. A fleet reserves its next turn one gap on
        (``Fleet.ask``): a gap past the pace's end would hold every process
        longer than its own gate would."""
        at = self.stated_next(now, now)
        return at - now if at > now else 0.0

    def stated_pace(self, now: float) -> tuple[float, float]:
        """The stated pace that keeps a send at ``now`` longest (the one
        :meth:`stated_gap_left` is cut from), as its gap and its end; ``(0.0,
        -inf)``: none holds. What a fleet's store keeps for the processes that
        did not hear it (``autothrottle._fleet``, rule 5)."""
        left = self.stated_gap_left(now)
        if left <= 0.0:
            return 0.0, -math.inf
        if now < self.budget_until and min(self.budget_gap, self.budget_until - now) >= left:
            return self.budget_gap, self.budget_until
        return self.sustained_gap, self.sustained_until

    def bound(self, now: float, longest: float) -> None:
        """End every pause and budget of a loaded record within ``longest`` of ``now``.

        A record from a file or another process obeys the loading throttle's
        ``max_pause``, as a header read here would.
        """
        latest = now + longest
        self.pause_until = min(self.pause_until, latest)
        self.budget_until = min(self.budget_until, latest)
        self.sustained_until = min(self.sustained_until, latest)


class Budget:
    """Pacing by an advertised rate-limit budget (``docs/signals.md``).

    Args:
        max_pause: The longest any budget may hold the slot, in seconds.
    """

    __slots__ = ("max_pause",)

    def __init__(self, max_pause: float) -> None:
        self.max_pause = max_pause

    def apply(
        self,
        limits: Limits,
        budget: RateLimit,
        now: float,
        sent_at: float | None,
        *,
        refused: bool,
    ) -> float | None:
        """Take ``budget``, read at ``now`` from the answer to a request sent at ``sent_at``.

        Returns the seconds to pause the slot for when nothing remains (the
        caller pauses it, capped by ``max_pause`` and logged), else None after
        spacing the sends until the reset. ``refused``: the response was a 4xx
        or 5xx, so the request that spent the last unit was not this one.
        """
        limits.rate_limit = budget
        # With several windows, the long-run pace is the slowest window's. Every
        # answer that states it renews it, a spent budget's too: a host paced at
        # exactly its rate says r=0 after each request, and the pace it states
        # must not lapse under it (a refusal at it would then be no refusal at
        # the stated pace: docs/recovery.md).
        paced = budget.slowest
        sustained = paced.sustained
        if sustained is not None:
            # Exactly the stated pace: the arrival guard keeps it as the host
            # sees it (docs/scheduling.md, rule 10).
            limits.sustained_gap = sustained
            horizon = max(budget.reset, paced.window or 0.0)
            limits.sustained_until = now + min(horizon, self.max_pause)
        if budget.remaining <= 0:
            return self._spent(budget, now, sent_at, refused=refused)
        spacing = budget.spacing
        if budget.reset >= 1.0 and budget.reset.is_integer():
            # Whole seconds, rounded up by the server: the reset may be a second nearer.
            spacing = (budget.reset - 1.0) / budget.remaining
        limits.budget_gap = spacing
        limits.budget_until = now + min(budget.reset, self.max_pause)
        return None

    @staticmethod
    def _spent(budget: RateLimit, now: float, sent_at: float | None, *, refused: bool) -> float:
        """How long a spent budget pauses the slot: until the reset, or less when
        the last unit went to a request sent at the policy's own pace."""
        wait = budget.reset
        sustained = budget.sustained
        if not refused and sustained is not None and wait <= math.ceil(sustained):
            # The last unit went to a request sent at the policy's own pace,
            # and t is no later than one such gap rounded up to the second:
            # the window ends within that gap of the send, not at the
            # second t rounds to (nor one gap after the response).
            since = 0.0 if sent_at is None else max(0.0, now - sent_at)
            wait = min(wait, max(0.0, sustained - since))
        return wait


def rounding(read: HeaderSignals | None, gap: float) -> bool:
    """Whether every wait a refusal's headers ask for is at most ``gap`` rounded
    up to the second: the rounding of a token due within a gap. A longer wait
    (a ``Retry-After``, an exhausted budget's reset) is a penalty."""
    if read is None:
        return True
    longest = max(1.0, math.ceil(gap))
    if read.retry_after is not None and read.retry_after > longest:
        return False
    budget = read.rate_limit
    return budget is None or budget.remaining > 0 or budget.reset <= longest

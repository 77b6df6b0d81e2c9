"""When a request reached its host, at the latest: the arrival guard of a strict pace.

A host that limits its rate by arrivals (a token bucket with no burst to
spare, a sliding window, a crawl delay) judges the gap between two requests
as *it* sees them. A request written to the wire exactly ``gap`` after the
previous one can still arrive early, when the previous one was held up on its
way (the client's event loop, the kernel, the host's own loop before it read
and stamped the request): the host then sees the two closer than ``gap`` and
refuses the second. :class:`ArrivalGuard` keeps such a pace as the host sees
it, from what the client can observe (``docs/scheduling.md``, rule 10):

* **What the latency shows.** The host stamped a request at ``wired + u`` and
  answered at ``wired + u + v``; the latency ``u + v`` is at least its least
  value seen lately, and whatever it exceeds that by may all have been spent
  before the stamp. So the request arrived no later than ``wired + (latency -
  least latency)``, and the next gap counts from there: a held-up request
  never lets the next one arrive early. An answer *faster* than any lately
  says the path is speeding up (a burst at the host draining), and the next
  request may gain as much again: that counts as well. The first
  ``EARLY_ANSWERS`` answers count all of their latency: the least of so few
  is no least (a crawl that starts many hosts at once answers its first
  rounds slowly on both sides, and the excess over them then misses by
  tens of milliseconds what the host saw). Only an answer
  that came back before the next request went counts (the latency is below
  the gap: a strict pace at a fast host, exactly when the host's gap is
  tight); a later one says nothing the next send could still use.
* **The client's own timing noise.** What no latency shows (a few hundred
  microseconds of scheduling on either side, lost in the host's own noise) is
  of the size of the client's timer noise: how late a request that was told
  to wait is let go. Every gap is wider by that lateness, averaged: a
  fraction of a millisecond on an idle machine, a few on a busy one.
* **The host's refusal.** A refusal of a request sent at the stated pace, one
  that the host let through just before, is the host saying the margin was too
  small, not that the pace is too fast: the margin doubles (from
  ``MARGIN_STEP``), and nothing else changes (the rules decide which refusal
  is one: ``docs/recovery.md``, "At the stated pace").

The margin is never more than ``MAX_MARGIN_SHARE`` of the gap: a refusal that
the refusals' own margin at its most does not stop is no longer jitter. The
guard is pure: it is given wire times, latencies and lateness, on whatever
clock the caller keeps, and holds no clock of its own. The gate owns one per
slot whose pace is strict.
"""

from __future__ import annotations

import math

__all__ = ["EARLY_ANSWERS", "LATENCY_WINDOW", "MARGIN_STEP", "MAX_MARGIN_SHARE", "ArrivalGuard"]

EARLY_ANSWERS = 4
"""The first answers count all of their latency, not their excess over the
least: the least of fewer is no measure of the path's own."""

LATENCY_WINDOW = 16
"""The least latency is the least of the last 16 to 32 answers: a host whose path
got slower is followed within a few dozen answers, a rare fast answer is not
forgotten before the next one."""

MARGIN_STEP = 0.001
"""Seconds the margin a refusal at the stated pace sets at least (then doubles)."""

MAX_MARGIN_SHARE = 0.02
"""The margin is at most this share of the gap: a refusal it does not stop is no
longer jitter, and the pace keeps at least 98 % of what was stated."""

_LATE_WEIGHT = 0.1
"""Least weight of one grant's lateness in the averaged timing noise (about the last
10 count; the first ones weigh 1/n, so it starts as their plain mean)."""


class ArrivalGuard:
    """The latest moment the last request on the wire may have reached its host.

    Attributes:
        latest: That moment (``-inf`` until an answer said it).
        refused_margin: Seconds the host's refusals at the stated pace widened
            every gap by (0 until one).
        lateness: The averaged lateness of the slot's grants, in seconds.
    """

    __slots__ = (
        "_answers",
        "_count",
        "_lates",
        "_least",
        "_next",
        "lateness",
        "latest",
        "refused_margin",
    )

    def __init__(self) -> None:
        self.latest = -math.inf
        self.refused_margin = 0.0
        self.lateness = 0.0
        self._lates = 0
        self._least = math.inf
        self._next = math.inf
        self._count = 0
        self._answers = 0

    def least_latency(self) -> float:
        """The least latency of the last ``LATENCY_WINDOW`` to twice that answers (inf: none)."""
        return min(self._least, self._next)

    def answered(self, latency: float, wired_at: float | None) -> None:
        """Count one answer's ``latency``; ``wired_at``: when its request went on the
        wire, if it is the last request that did (None: another went since)."""
        least = self.least_latency()
        if self._answers < EARLY_ANSWERS:
            self._answers += 1
            late = latency
        else:
            late = abs(latency - least)
        if latency < self._next:
            self._next = latency
        self._count += 1
        if self._count >= LATENCY_WINDOW:
            self._least, self._next, self._count = self._next, math.inf, 0
        if wired_at is not None and late > 0.0 and wired_at + late > self.latest:
            self.latest = wired_at + late

    def late(self, seconds: float) -> None:
        """A request told to wait was let go ``seconds`` after its time."""
        self._lates += 1
        weight = max(_LATE_WEIGHT, 1.0 / self._lates)  # the plain mean of the first ones
        self.lateness += weight * (max(0.0, seconds) - self.lateness)

    def margin(self, gap: float) -> float:
        """Seconds a gap of about ``gap`` is widened by."""
        margin = max(self.refused_margin, self.lateness)
        most = MAX_MARGIN_SHARE * gap
        return margin if margin < most else most

    def since(self, last: float, gap: float) -> float:
        """Where the next gap (about ``gap`` long) counts from, after a request sent
        at ``last``: its latest arrival when that is later, and the margin on top."""
        latest = self.latest
        return (latest if latest > last else last) + self.margin(gap)

    def widen(self, gap: float) -> bool:
        """A refusal at the stated pace ``gap``: the refusals' margin doubles; False
        when the refusals alone have taken it to its most (the refusal is then
        no jitter).

        The client's own lateness does not count towards that most: on a busy
        machine it fills the margin before any refusal, and the jitter it
        stands for is then what the refusal is.
        """
        most = MAX_MARGIN_SHARE * gap
        if self.refused_margin >= most:
            return False
        self.refused_margin = min(max(2.0 * self.refused_margin, MARGIN_STEP), most)
        return True

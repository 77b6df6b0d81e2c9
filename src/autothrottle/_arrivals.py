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
  value seen lately (the last 8 to 16 answers: a loaded client reads every
  answer a few milliseconds late, and the least of a longer past counted
  that lateness as a held-up arrival on every gap), and whatever it exceeds
  that by may all have been spent before the stamp. So the request arrived
  no later than ``wired + (latency - least latency)``, and the next gap
  counts from there: a held-up request never lets the next one arrive
  early. An answer *faster* than any lately says the path is speeding up (a
  burst at the host draining), and the next request may gain as much again:
  that counts as well. The first ``EARLY_ANSWERS`` answers count all of
  their latency: the least of so few is no least (a crawl that starts many
  hosts at once answers its first rounds slowly on both sides, and the
  excess over them then misses by tens of milliseconds what the host saw).
  Only an answer that came back before the next request went counts (the
  latency is below the gap: a strict pace at a fast host, exactly when the
  host's gap is tight); a later one says nothing the next send could still
  use.
* **The margin: what no latency shows.** The least latency is the luckiest
  answer of a few, and some of its luck may have been on the way to the
  host: a later request as lucky on its way arrives early by what no
  latency shows. Every gap is wider by a margin for it: the client's own
  timer noise (how late a request that was told to wait is let go,
  averaged by the gate: a fraction of a millisecond on an idle machine, a
  few on a busy one), but no more than the quicker answers lately stand above the least
  (the first quarter of the last 16 over their least, at least
  ``MARGIN_STEP``): on a busy client the lateness grows past anything the
  host's arrivals vary by (at load 6 on 200 strict hosts, 7.7 ms a gap
  where the quick answers' spread was 3.4).
* **The host's refusal.** A refusal of a request sent at the stated pace, one
  that the host let through just before, is the host saying the margin was
  too small, not that the pace is too fast: a margin of the refusals' own
  doubles (from ``MARGIN_STEP``) and counts when it is the larger, and
  nothing else changes (the rules decide which refusal
  is one: ``docs/recovery.md``, "At the stated pace"). The refused request
  arrived closer than the gap by an amount nobody saw, and its answer, given
  without the work, says nothing of its way: so the next gap, the first
  counted from a send made before the refusal came, is longer by the
  margin's most (the makeup). A short gap is followed by a long one: two
  gaps in a row at the host sum to two gaps at least, and a host that counts
  a window (two a second) does not see three in one.

The margin is never more than ``MAX_MARGIN_SHARE`` of the gap: a refusal that
the refusals' own margin at its most does not stop is no longer jitter. The
guard is pure: it is given wire times, latencies and the gate's lateness, on
whatever clock the caller keeps, and holds no clock of its own. The gate owns one per
slot whose pace is strict.
"""

from __future__ import annotations

import math

__all__ = ["EARLY_ANSWERS", "LATENCY_WINDOW", "MARGIN_STEP", "MAX_MARGIN_SHARE", "ArrivalGuard"]

EARLY_ANSWERS = 4
"""The first answers count all of their latency, not their excess over the
least: the least of fewer is no measure of the path's own."""

LATENCY_WINDOW = 8
"""The least latency is the least of the last 8 to 16 answers: a path that got
slower (a loaded client reads its answers late) is followed within a few
seconds at a strict pace, a rare fast answer is not forgotten before the next
one."""

MARGIN_STEP = 0.001
"""Seconds the margin a refusal at the stated pace sets at least (then doubles)."""

MAX_MARGIN_SHARE = 0.02
"""The margin is at most this share of the gap: a refusal it does not stop is no
longer jitter, and the pace keeps at least 98 % of what was stated."""


class ArrivalGuard:
    """The latest moment the last request on the wire may have reached its host.

    Attributes:
        latest: That moment (``-inf`` until an answer said it).
        refused_margin: Seconds the host's refusals at the stated pace widened
            every gap by (0 until one).
        refused_at: When the last refusal at the stated pace came (``-inf``:
            none); a gap counted from a send made before it keeps the makeup.
        spread: How far the quicker answers lately stand above the least: the
            first quarter of the last ``2 * LATENCY_WINDOW`` latencies over
            their least (inf until that many).
    """

    __slots__ = (
        "_answers",
        "_count",
        "_least",
        "_next",
        "_recent",
        "latest",
        "refused_at",
        "refused_margin",
        "spread",
    )

    def __init__(self) -> None:
        self.latest = -math.inf
        self.refused_margin = 0.0
        self.refused_at = -math.inf
        self._least = math.inf
        self._next = math.inf
        self._count = 0
        self._answers = 0
        self._recent: list[float] = []
        self.spread = math.inf

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
        recent = self._recent
        recent.append(latency)
        self._count += 1
        if self._count >= LATENCY_WINDOW:
            self._least, self._next, self._count = self._next, math.inf, 0
            if len(recent) >= 2 * LATENCY_WINDOW:
                del recent[: len(recent) - 2 * LATENCY_WINDOW]
                ordered = sorted(recent)
                self.spread = ordered[len(ordered) // 4] - ordered[0]
        if wired_at is not None and late > 0.0 and wired_at + late > self.latest:
            self.latest = wired_at + late

    def margin(self, gap: float, lateness: float) -> float:
        """Seconds a gap of about ``gap`` is widened by: the client's ``lateness``
        (the gate's average), no more than the spread of the quicker answers
        shows (at least ``MARGIN_STEP``), or the refusals' margin when that is
        more."""
        spread = self.spread if self.spread > MARGIN_STEP else MARGIN_STEP
        noise = lateness if lateness < spread else spread
        margin = self.refused_margin if self.refused_margin > noise else noise
        most = MAX_MARGIN_SHARE * gap
        return margin if margin < most else most

    def since(self, last: float, gap: float, lateness: float) -> float:
        """Where the next gap (about ``gap`` long) counts from, after a request sent
        at ``last``: its latest arrival when that is later, and the margin on top
        (for the client's ``lateness``; and the makeup, when ``last`` came
        before the last refusal at the pace)."""
        latest = self.latest
        at = (latest if latest > last else last) + self.margin(gap, lateness)
        if last <= self.refused_at:
            # The first gap after a refusal at the stated pace: the makeup.
            at += MAX_MARGIN_SHARE * gap
        return at

    def widen(self, gap: float, now: float) -> bool:
        """A refusal at the stated pace ``gap``, come at ``now``: the refusals'
        margin doubles, and the next gap keeps the makeup; False when the
        refusals alone have taken the margin to its most (the refusal is then
        no jitter).

        The client's own lateness does not count towards that most: on a busy
        machine it fills the margin before any refusal, and the jitter it
        stands for is then what the refusal is.
        """
        most = MAX_MARGIN_SHARE * gap
        if self.refused_margin >= most:
            return False
        self.refused_margin = min(max(2.0 * self.refused_margin, MARGIN_STEP), most)
        self.refused_at = now
        return True

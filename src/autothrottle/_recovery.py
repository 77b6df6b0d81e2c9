"""The refusal memory: what a slot learned from being refused, and how it returns.

:class:`Refusal` is the record (the last backoff, the refused gap, the success
count); this module is the only one that writes it (``tests/test_architecture.py``
checks it). :class:`Recovery` is pure, no clock of its own: every method takes
``now`` and the record, and reads or writes plain numbers in it.
:func:`first_of_burst` is the one statement of which backoff signals count.
The rules are written out in ``docs/recovery.md``; in short:

* Successful responses since the last refusal are counted, from the first of
  them: ``(n - 1) / (now - first)`` is the rate the host let through (the one
  less for the request any host lets through at once), the best estimate of
  its limit. Before a slot's first refusal only the latest 8 to 16 count: a
  slot that ramped up was let through at its latest rate, not at the mean of
  its ramp. After one, all of them count: a token bucket's burst, spent while
  the floor comes back past the limit, reads the latest few high.
* At a refusal, the host's limit lies between that rate (a lower bound) and the
  pace it refused (an upper one). At a later refusal, take their geometric
  mean, a step of binary search. At the first, close together, the lower
  bound is the limit; far apart, their geometric mean; but
  after a ramp-up, the lower bound: a token bucket's
  burst hides how far a ramp ran past the limit before the first refusal, so
  the refused pace bounds nothing, and a guess above what got through is
  refused a second time once the burst refills. Without a ramp the successes
  measured mostly the slot's start: the first refusal is bracketed, never
  past the larger of what got through and the refused rate over the backoff
  factor (a guess probed past sooner).
* A refusal whose pause (``Retry-After``) is longer, by a whole second, than
  the successes since the last refusal took says how slow the host is: they
  were a token bucket's whole burst, and its gap is their span plus the pause.
* After a refusal the delay may not fall below a floor that follows a cubic
  around the refused gap, as TCP CUBIC does around the window of its last loss:
  ``margin`` of the refused rate at once, the refused rate after ``time``
  seconds (at least 8 refused gaps) with a long flat stretch around it, then
  rising ever faster beyond (the rate doubles by twice that), so a host whose
  limit is higher is found.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ._validate import check_positive

__all__ = ["RECENT_SUCCESSES", "Recovery", "Refusal", "first_of_burst", "refused_pace"]

_MIN_SPAN = 3
"""Successes since the last refusal before their rate is an estimate at all."""

_KEPT = 2
"""Successes since the last refusal before a refusal at the stated pace may be jitter."""

RECENT_SUCCESSES = 8
"""Successes a rate is measured over at least (and at most twice as many)."""

_ALLOWED_MEMORY = 60.0
"""Seconds a success rate measured at a refusal stays the lower bound."""

_CLOSE = 1.25
"""A refused gap within this factor of the allowed gap is taken as the limit itself."""

_GUESS_SPEEDUP = 0.7
"""A first refusal's guessed limit (no ramp-up) is reached, and probed past, in this
share of ``time``: halved from the refused rate, it may lie far below the limit."""

_WHOLE = 1.0
"""A pause a refusal asks for (``Retry-After``) is read as rounded up to this: the
host's next token is due within the last second of it."""

_RECOVERY_SENDS = 8
"""The floor comes back to the refused gap in no fewer of its gaps than this (as the
ramp-up doubles a rate in no fewer than 8 sends): at a host that allows one request
every 20 s, ``time`` is less than one gap, and the floor would be past it at once."""

_BEYOND = 1.0
"""How fast the floor opens past the refused rate: by ``2 * time`` the rate has doubled."""

_LOCAL = {"flat": False}
"""A record field's metadata: this process's own observation, not written to a
state file or a shared record (its default stands in a loaded one)."""

_FLAT = 1e6
"""Phases of the floor's cubic past this are all the same: the floor is 0 by then."""


def _rate(count: int, first: float, now: float) -> float | None:
    """``count`` successes from ``first`` to ``now``: their rate, one less (the
    first came at once), or None before there are ``_MIN_SPAN``."""
    span = now - first
    if count < _MIN_SPAN or span <= 0.0:
        return None
    return (count - 1) / span


def first_of_burst(sent_at: float | None, backoff_at: float) -> bool:
    """Whether a backoff signal counts: only the first signal of a burst does.

    A signal (a refusal, a failure, a block) answers a request sent at
    ``sent_at``. It counts, and backs the slot off, when that request was sent
    at or after the slot's last backoff (``backoff_at``; ``-inf`` when it never
    backed off), or when its send time is unknown (None). A request sent
    before the last backoff was sent at the old pace, which that backoff
    already answered: its signal is the lag of that pace, not new evidence,
    and changes nothing but the count of ignored backoffs. So a burst of
    refusals to requests in flight together backs the slot off once.

    Both times are on one clock: the slot's own (a send time from another
    clock cannot be compared with ``backoff_at``). A store that merges what
    several processes learned applies the same rule: a backoff learned from a
    request sent before the shared record's last backoff does not compound it.
    """
    return sent_at is None or sent_at >= backoff_at


def refused_pace(
    delay: float, latency: float | None, in_flight: int, granted: float = 0.0
) -> float:
    """The gap between sends a refusal answered: the delay or, when the cap rather
    than the delay held the slot back, the last ``latency`` over the requests
    ``in_flight`` (Little's law), whichever is larger.

    ``granted``: the gap the refused request's own grant kept after the grant
    before it (0: not known), when wider than the delay. A gap once begun keeps
    its delay (``docs/scheduling.md``, rule 3), so a success answered while the
    refused request waited lowers the delay but not the gap it went at: read
    from the delay alone, a refusal of the first send after a pause at a
    doubled delay was taken for one at half of it, and the floor came back to
    that half (a 5/s host with a burst of 1, refused after every pause).
    """
    if granted > delay:
        delay = granted
    if latency and in_flight:
        return max(delay, latency / in_flight)
    return delay


@dataclass(slots=True)
class Refusal:
    """What a slot learned from being refused.

    Attributes:
        backoff_at: When the slot last backed off (``-inf``: never).
        refused_gap: The gap between sends the host last refused (0: none).
        recover_in: Seconds until the floor is back at the refused gap (0: the
            throttle's ``recovery_time``).
        allowed: The success rate measured at the last refusal that had one
            (requests/s).
        allowed_at: When ``allowed`` was measured.
        ok_count: Successful responses counted into the success rate: those
            since the last refusal, or only the latest ones (between
            ``RECENT_SUCCESSES`` and twice that) once there are more.
        ok_first: The first of them.
        ok_next: Successes since ``ok_next_first``, the window that replaces
            the counted one when it reaches ``RECENT_SUCCESSES``.
        ok_all: Every successful response since the last refusal.
        ok_all_first: The first of them.
        ok_latest: The latest successful response (this process's own: not in
            the flat form, so not in a state file or a shared record).
        ok_before: The one before it (the same).
    """

    backoff_at: float = -math.inf
    refused_gap: float = 0.0
    recover_in: float = 0.0
    allowed: float = 0.0
    allowed_at: float = -math.inf
    ok_count: int = 0
    ok_first: float = -math.inf
    ok_next: int = 0
    ok_next_first: float = -math.inf
    ok_all: int = 0
    ok_all_first: float = -math.inf
    ok_latest: float = field(default=-math.inf, compare=False, metadata=_LOCAL)
    ok_before: float = field(default=-math.inf, compare=False, metadata=_LOCAL)

    def bound(self, now: float) -> None:
        """Place a loaded record's times no later than ``now``: they are past events."""
        self.backoff_at = min(self.backoff_at, now)
        self.allowed_at = min(self.allowed_at, now)
        self.ok_first = min(self.ok_first, now)
        self.ok_next_first = min(self.ok_next_first, now)
        self.ok_all_first = min(self.ok_all_first, now)
        self.ok_latest = min(self.ok_latest, now)
        self.ok_before = min(self.ok_before, now)


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

    def count_success(self, refusal: Refusal, now: float) -> None:
        """Count one successful response at ``now`` (on every 200: each count is
        read once into a local and written once)."""
        ok_all = refusal.ok_all
        if not ok_all:
            refusal.ok_all_first = now
        refusal.ok_all = ok_all + 1
        refusal.ok_before = refusal.ok_latest
        refusal.ok_latest = now
        count = refusal.ok_count
        if count < RECENT_SUCCESSES:  # this one still fits the counted window
            if not count:
                refusal.ok_first = now
            refusal.ok_count = count + 1
            return
        # A second window runs behind the counted one and replaces it when full.
        following = refusal.ok_next
        if not following:
            refusal.ok_next_first = now
        following += 1
        if following < RECENT_SUCCESSES:
            refusal.ok_count = count + 1
            refusal.ok_next = following
        else:
            refusal.ok_count, refusal.ok_first = following, refusal.ok_next_first
            refusal.ok_next = 0

    def success_rate(self, refusal: Refusal, now: float) -> float | None:
        """The rate the latest successes came at, or None before there is one."""
        return _rate(refusal.ok_count, refusal.ok_first, now)

    def span_rate(self, refusal: Refusal, now: float) -> float | None:
        """The rate every success since the last refusal came at, or None before
        there is one: over the whole span, a burst the host held in reserve
        counts for little."""
        return _rate(refusal.ok_all, refusal.ok_all_first, now)

    def let_through(self, refusal: Refusal, gap: float, now: float, *, stated: bool) -> bool:
        """Whether the host let the slot run at sends ``gap`` apart lately, as a
        refusal answered at ``now`` sees it: the successes since the last refusal
        came within ``_CLOSE`` of that pace (the evidence that a refusal at it is
        jitter, ``docs/recovery.md``).

        The span from the first success to the refusal holds one gap per
        success, the refused request's own included: ``n`` successes at the
        pace span ``n`` gaps. (The success rate counts one less, for the limit;
        here that would read a slot three successes in at two thirds of its
        pace, and back off on the jitter of its fourth request.) Two successes
        will do: a host that holds the slot below the pace refuses its second
        request already, or with a burst a later one, after which the
        successes come too slowly to count.

        ``stated``: the pace is one the slot was told the host allows, and the
        slot never sends faster. Then the latest two successes at it will do
        too: gaps above the pace before them were the slot's own (a start delay
        coming down to it), and a refusal between them would have spaced them
        three gaps apart. A pace of the slot's own (a ramp running down its
        delay) needs them all: its latest two may be a token bucket's burst,
        filled while the ramp was slower.
        """
        if refusal.ok_count < _KEPT:
            return False
        slack = _CLOSE * gap
        if stated and now - refusal.ok_before <= _KEPT * slack:
            return True
        span = now - refusal.ok_first
        return span > 0.0 and refusal.ok_count * slack >= span

    def refused(
        self,
        refusal: Refusal,
        pace: float,
        now: float,
        *,
        ramped: bool = True,
        factor: float = 2.0,
        asked: float = 0.0,
    ) -> None:
        """Remember a refusal of sends ``pace`` seconds apart, at ``now``.

        ``ramped``: the slot came to that pace by a ramp-up (its policy's), so
        the successes before a first refusal were measured near the host's
        limit. Without one (Scrapy's rule halves its delay with each fast
        response) they measured mostly the slot's start, and a first refusal
        far above them is bracketed instead: never past the larger of what got
        through and the refused rate over ``factor``, the throttle's backoff
        factor, and probed past sooner when that is the guess.

        ``asked``: the pause the refusal asks for (its ``Retry-After``, in
        seconds; 0: none). Longer by a whole second than the successes since
        the last refusal took, it says how slow the host is (:meth:`refill`).
        """
        refused_gap = pace
        guessed = False
        later = refusal.refused_gap > 0.0
        measured = self.span_rate(refusal, now) if later else self.success_rate(refusal, now)
        allowed = measured or 0.0
        if measured is None and now - refusal.allowed_at < _ALLOWED_MEMORY:
            # Right after a pause too few successes to measure: keep the last measured.
            allowed = refusal.allowed
        if allowed > 0.0:
            refusal.allowed = allowed
            refusal.allowed_at = now
            if later:
                # Between the bounds, or the refused pace if more got through.
                refused_gap = max(pace, math.sqrt(pace / allowed))
            elif 1.0 / allowed <= _CLOSE * pace:
                refused_gap = max(pace, 1.0 / allowed)
            elif ramped:
                # A first refusal after a ramp-up: a burst may have hidden how far
                # the ramp ran past the limit, so the refused pace bounds nothing.
                # What got through is a rate the host kept.
                refused_gap = 1.0 / allowed
            else:
                refused_gap = math.sqrt(pace / allowed)
                guess = min(pace * factor, 1.0 / allowed)
                if guess > refused_gap:
                    refused_gap = guess
                    guessed = guess < 1.0 / allowed
        refill = self.refill(refusal, asked, now)
        if refill > refused_gap:
            refused_gap, guessed = refill, False
        refusal.refused_gap = refused_gap
        recover_in = self.time * (_GUESS_SPEEDUP if guessed else 1.0)
        refusal.recover_in = max(recover_in, _RECOVERY_SENDS * refused_gap)
        refusal.backoff_at = now
        refusal.ok_count = refusal.ok_next = refusal.ok_all = 0

    @staticmethod
    def refill(refusal: Refusal, asked: float, now: float) -> float:
        """The gap a token bucket's refusal at ``now`` reveals, from the pause it
        asks for (``asked`` seconds, rounded up to the whole second); 0.0 when it
        reveals none.

        When the pause is longer than the span ``S`` of the successes since the
        last refusal (the first of them to ``now``) by a whole second, the next
        token is due more than ``S`` away, so the host's gap is longer than the
        span: less than one token came back while it let them through. Then they
        were its whole burst (a new host's full bucket, or the one token a pause
        left), and the token of the first of them comes back when the pause
        ends: the gap is ``S`` plus the pause, exactly within the rounding (at
        most a second more). A host that allows one request every 20 s, after a
        burst of 2 in a second, says ``Retry-After: 19``: its gap is 20 s, where
        the refused pace (the ramp's 0.6 s) and the two successes (too few for a
        rate) said nothing, and the slot was refused once every gap. A pause of
        a second (``Retry-After: 1`` at a 10/s host, the rounding of a token
        due within a gap) reveals nothing.

        Only while the successes are too few to measure a rate (fewer than 3):
        a fixed window that let its quota through and asks for a pause until it
        resets reads the same, and taking its whole window for one request's
        gap costs it all of its quota but one (at most half, here); with more
        successes their rate brackets the limit as before.
        """
        if refusal.ok_all >= _MIN_SPAN or asked <= _WHOLE:
            return 0.0
        span = max(0.0, now - refusal.ok_all_first) if refusal.ok_all else 0.0
        if asked - _WHOLE < span:
            return 0.0
        return span + asked

    def floor(self, refusal: Refusal, now: float) -> float:
        """The smallest delay the slot may use at ``now`` since its last refusal.

        With ``W`` the refused rate, ``K = time`` and ``b = 1 - margin``, the
        allowed rate ``t`` seconds after the refusal is
        ``W * (1 + b * (t / K - 1) ** 3)`` up to ``K``, then
        ``W * (1 + (t / K - 1) ** 3)``.
        """
        refused = refusal.refused_gap
        if refused <= 0.0:
            return 0.0
        phase = max(0.0, now - refusal.backoff_at) / (refusal.recover_in or self.time) - 1.0
        phase = min(phase, _FLAT)  # cubed, a far larger one would overflow
        gain = (1.0 - self.margin) if phase < 0.0 else _BEYOND
        return refused / (1.0 + gain * phase**3)

"""Token budgets: what a host's token windows hold now, and when a request's cost fits.

The LLM APIs limit tokens as well as requests, each window a bucket that
holds ``limit`` tokens and refills continuously (OpenAI's and Anthropic's
documented behaviour; their ``reset`` is the time until the bucket is full
again). A request may carry a cost in tokens (``RequestOptions.cost``); this
module keeps, per window, an estimate of the tokens available and says when a
cost fits (``docs/signals.md``, "Token budgets"):

* a response's ``remaining`` is the level as the server counted it when the
  request arrived; requests granted since that request was sent are not in
  it yet, so their costs come off (:class:`TokenBook` keeps them; grants at
  the very same moment are taken as later, but for one, and the highest of
  their answers' readings stands); so do those of requests the wire turn
  holds (a grant made before a pause, held until it ends), which no answer
  counts until they go, after sends granted later perhaps: one that waited
  for its wire turn counts from when it went, not from its grant;
* the window refills at ``(limit - remaining) / reset`` tokens a second, as
  the last response at least a tenth empty said (nearer full, the reset is
  mostly the server's rounding), or, until one did, at no less than its limit
  a minute; and it is full again at its reset at the latest;
* a request waits until its cost fits every window (at least one token: a
  spent window holds a request without a cost too); a cost above a window's
  limit waits for a full window, and then goes, for the server to answer;
* a refusal that says a window is spent pauses the slot until that window's
  reset.

:class:`TokenBudget` is pure: no clock, slot or throttle, only a
:class:`TokenBook`, what a response said or what a grant cost, and the time.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from ._headers import RateLimit
from ._request import Cost, tokens_of

__all__ = ["Sent", "TokenBook", "TokenBudget"]

_FALLBACK_WINDOW = 60.0
"""Seconds a window is taken to refill its limit in until a response shows its
rate: the vendors' windows are a minute."""

_MEASURED = 0.1
"""A response teaches a window's refill rate when at least this share of it is empty."""

_MAX_SPENDS = 1024
"""Grants with a cost remembered until a response accounts for them. More in
flight at once than this, and the oldest are forgotten (the estimate is then
that much too high, until the next response)."""

_NO_SPENDS: deque[tuple[float, Cost]] = deque()
"""The spends of a book no grant with a cost has used yet: shared, empty, and
never appended to (:meth:`TokenBudget.spend` gives the book its own first). An
empty deque holds a block of 64 places, 760 bytes a slot, and most slots never
spend a token."""


_PAST_THE_INSTANT = 1e-6
"""Seconds a refill's wait goes past the instant the window holds the need. The
server counts the same refill from its own stamps: at the exact instant it may
hold a rounding less (30.999999999 of 31 tokens) and refuse the request."""


@dataclass(slots=True)
class TokenWindow:
    """One token window as this slot estimates it.

    Attributes:
        unit: What it counts: ``"tokens"``, ``"input-tokens"`` or ``"output-tokens"``.
        limit: The window's whole quota, if the server said.
        level: Tokens available at ``at``.
        at: When ``level`` was true.
        rate: Tokens it refills a second (0: not known).
        measured: Whether ``rate`` was read off a window at least a tenth empty.
        full_at: When the server said it would be full again.
        spent_since: Tokens granted since the response that set ``level``.
        read_sent: When the request whose response set ``level`` was sent.
    """

    unit: str
    limit: int | None = None
    level: float = 0.0
    at: float = -math.inf
    rate: float = 0.0
    measured: bool = False
    full_at: float = -math.inf
    spent_since: float = 0.0
    read_sent: float = -math.inf

    def level_at(self, now: float) -> float:
        """Tokens available at ``now``: refilled since ``at``, and full at the reset."""
        level = self.level
        if self.rate > 0.0 and now > self.at:
            level += self.rate * (now - self.at)
        if now >= self.full_at:
            full = math.inf if self.limit is None else self.limit - self.spent_since
            level = max(level, full)
        return level if self.limit is None else min(level, float(self.limit))

    def fits_at(self, need: float, now: float) -> float:
        """The earliest time from ``now`` at which ``need`` tokens are available."""
        level = self.level_at(now)
        if level >= need:
            return now
        at = math.inf
        if self.rate > 0.0:
            at = now + (need - level) / self.rate + _PAST_THE_INSTANT
        full = math.inf if self.limit is None else self.limit - self.spent_since
        if full >= need:
            at = min(at, max(now, self.full_at))
        return at


class Sent(Protocol):
    """A granted request, as the wire turn holds it: when it was granted, and
    whether it was let go."""

    sent_at: float

    @property
    def released(self) -> bool: ...


@dataclass(slots=True)
class TokenBook:
    """A slot's token windows, and the grants with a cost no response has accounted for.

    It belongs to one process (the slot's gate keeps it): the grants are this
    process's, and the windows are read from the answers to them.

    Attributes:
        windows: The windows by unit.
        spends: ``(granted at, cost)`` of recent grants with a cost, oldest
            first; a grant that waited for its wire turn, ``(went at, cost)``.
        longest: The longest a window may hold a request (the throttle's ``max_pause``).
        held: ``(request, cost)`` of grants the wire turn holds (None: none yet).
        went: When each grant that waited for its wire turn went, by its grant
            time, until its answer is read (None: none yet).
    """

    windows: dict[str, TokenWindow] = field(default_factory=dict)
    spends: deque[tuple[float, Cost]] = field(default_factory=lambda: _NO_SPENDS)
    longest: float = math.inf
    held: list[tuple[Sent, Cost]] | None = None
    went: dict[float, float] | None = None


class TokenBudget:
    """The token-window rules (module docstring), over a :class:`TokenBook`.

    Args:
        max_pause: The longest a token window may hold the slot, in seconds.
    """

    __slots__ = ("max_pause",)

    def __init__(self, max_pause: float) -> None:
        self.max_pause = max_pause

    def read(
        self,
        book: TokenBook,
        windows: Iterable[RateLimit],
        now: float,
        sent_at: float | None,
        *,
        refused: bool,
    ) -> float | None:
        """Take the token windows a response read at ``now`` advertised.

        ``sent_at``: when its request was granted (None: unknown, taken as
        now). What was granted since comes off what remains; so does what was
        granted at the same moment, but for one grant (the smallest, taken as
        this request's own). Returns how long to pause the slot when a refusal
        says a window is spent, else None.
        """
        book.longest = self.max_pause
        sent = now if sent_at is None else sent_at
        if book.went and sent_at is not None:
            sent = book.went.pop(sent_at, sent)  # it waited for its wire turn
        since = [(at, cost) for at, cost in book.spends if at >= sent]
        own = [item for item in since if item[0] == sent]
        if own:
            since.remove(min(own, key=lambda item: tokens_of(item[1], "tokens")))
        if book.held:
            book.held = [item for item in book.held if not item[0].released]
            since += [(math.inf, cost) for _, cost in book.held]
        pause = None
        for advertised in windows:
            window = book.windows.get(advertised.unit)
            if window is None:
                window = book.windows[advertised.unit] = TokenWindow(advertised.unit)
            if sent >= window.read_sent:
                spent = sum(tokens_of(cost, window.unit) for _, cost in since)
                # Several grants of one moment: this answer's remaining counts
                # those the server took before it, and `spent` counts them again;
                # the reading of the one it took first is right, every other one
                # lower, so the highest reading of the moment stands.
                tie = sent_at is not None and len(own) > 1 and sent == window.read_sent
                kept = window.level_at(now) if tie else -math.inf
                _reread(window, advertised, now, sent, spent)
                if kept > window.level:
                    window.level = kept
            if refused and advertised.remaining == 0:
                pause = max(pause or 0.0, advertised.reset)
        oldest = min((w.read_sent for w in book.windows.values()), default=-math.inf)
        while book.spends and book.spends[0][0] < oldest:
            book.spends.popleft()
        return pause

    @staticmethod
    def spend(book: TokenBook, cost: Cost | None, now: float) -> None:
        """A request of ``cost`` was granted at ``now``: its tokens are no longer there."""
        if not book.windows or not cost:
            return
        for window in book.windows.values():
            amount = tokens_of(cost, window.unit)
            window.level = window.level_at(now) - amount
            window.at = now
            window.spent_since += amount
        spends = book.spends
        if spends is _NO_SPENDS:
            spends = book.spends = deque(maxlen=_MAX_SPENDS)
        spends.append((now, cost))

    @staticmethod
    def hold(book: TokenBook, request: Sent) -> None:
        """The wire turn holds ``request`` (a pause, a gap): no answer counts its
        cost until it goes on the wire (:meth:`went`), or ever if it is let go first."""
        granted = request.sent_at
        spends = book.spends
        for index in range(len(spends) - 1, -1, -1):  # the newest first: it is near the end
            at, cost = spends[index]
            if at < granted:
                return  # no cost was spent on its grant
            if at == granted:
                del spends[index]
                if book.held is None:
                    book.held = []
                book.held.append((request, cost))
                return

    @staticmethod
    def went(book: TokenBook, request: Sent, now: float) -> None:
        """``request``, which the wire turn held, went on the wire at ``now``: the
        answers to requests sent after it count its cost, and its own answer is
        read as of now."""
        held = book.held
        if not held:
            return
        for index, (waiting, cost) in enumerate(held):
            if waiting is request:
                del held[index]
                book.spends.append((now, cost))  # no grant is later than now
                went = book.went
                if went is None or len(went) >= _MAX_SPENDS:  # answers never read: forgotten
                    went = book.went = {}
                went[request.sent_at] = now
                return

    @staticmethod
    def fits_at(book: TokenBook, cost: Cost | None, now: float) -> float:
        """When a request of ``cost`` fits every window: ``now`` if it does now.

        Never later than ``max_pause`` (of the last :meth:`read`) from ``now``.
        """
        at = now
        for window in book.windows.values():
            need = float(max(1, tokens_of(cost, window.unit)))
            if window.limit is not None:
                need = min(need, float(window.limit))
            at = max(at, window.fits_at(need, now))
        return min(at, now + book.longest)


def _reread(
    window: TokenWindow, advertised: RateLimit, now: float, sent: float, spent: float
) -> None:
    """Set ``window`` from a response: its level less what was granted since its request."""
    limit = advertised.limit
    window.limit = limit
    if limit is not None:
        missing = max(0, limit - advertised.remaining)
        said = missing / advertised.reset if advertised.reset > 0.0 else 0.0
        if missing >= _MEASURED * limit and said > 0.0:
            window.rate, window.measured = said, True
        elif not window.measured:
            window.rate = max(said, limit / _FALLBACK_WINDOW)
    window.level = advertised.remaining - spent
    window.at = now
    window.full_at = now + advertised.reset
    window.spent_since = spent
    window.read_sent = sent

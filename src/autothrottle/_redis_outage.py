"""When Redis does not answer: :class:`~autothrottle.redis.RedisStore`'s side of
rules 6 and 7 of :mod:`autothrottle._fleet`.

:class:`Outage` knows whether Redis is down (and until when the process waits
before trying again), says it once in the log when it goes and once when it
comes back, and keeps, per slot, what a process needs to pace alone: its share
of the fleet's last pace, the pause it already waited out, and whether the
slot's keys hold data of the wrong type. It holds no connection: the sender
(:mod:`autothrottle._redis_send`) tells it what Redis answered.
"""

from __future__ import annotations

import logging
import math
import threading
import time

from ._fleet import SharedTurn, TurnAsk
from ._redis_parts import ALONE, Alone

__all__ = ["Outage"]

logger = logging.getLogger("autothrottle")


class Outage:
    """Whether Redis answers, and each slot's pace while it does not (rule 6)."""

    __slots__ = (
        "_alone",
        "_lock",
        "_warned",
        "down_until",
        "fail_closed",
        "prefix",
        "processes",
        "retry_after",
    )

    def __init__(self, prefix: str, retry_after: float, fail_closed: bool) -> None:
        self.prefix = prefix
        self.retry_after = retry_after
        self.fail_closed = fail_closed
        self.down_until = -math.inf
        """Until when (``time.monotonic``) Redis is not asked again."""
        self.processes = 1
        """The most processes seen sharing a slot."""
        self._warned = False
        self._alone: dict[str, Alone] = {}
        self._lock = threading.Lock()

    def down(self) -> bool:
        """Whether the process waits before trying Redis again."""
        return time.monotonic() < self.down_until

    def went_down(self, error: BaseException) -> None:
        """Redis did not answer, or answered with a store error: pace alone for
        ``retry_after`` seconds (logged once)."""
        self.down_until = time.monotonic() + self.retry_after
        if not self._warned:
            self._warned = True
            how = "waiting for it" if self.fail_closed else "pacing on this process's own state"
            logger.warning(
                "autothrottle: Redis store %r unreachable (%s: %s); %s, retrying every %gs",
                self.prefix,
                type(error).__name__,
                error,
                how,
                self.retry_after,
            )

    def came_back(self) -> None:
        self.down_until = -math.inf
        if self._warned:
            self._warned = False
            logger.warning("autothrottle: Redis store %r reachable again; sharing", self.prefix)

    # -- per slot --------------------------------------------------------------------------

    def forget(self, key: str) -> None:
        with self._lock:
            self._alone.pop(key, None)

    def paused(self, key: str, now: float) -> str:
        """The end (on Redis's clock) of the fleet's pause this process waited out
        for the slot, '' if none: the next turn names it (rule 2)."""
        with self._lock:
            memo = self._alone.get(key)
            return "" if memo is None or now < memo.paused_until else memo.paused

    def waits(self, key: str, paused: str, pause_ends: float) -> None:
        """The process waits out the fleet's pause ``paused`` (its end on Redis's
        clock, heard: rule 2) until ``pause_ends`` on the throttle's clock: the
        next turn after that names it as waited out."""
        with self._lock:
            alone = self._alone.get(key)
            if alone is None:
                alone = self._alone[key] = Alone()
            alone.paused, alone.paused_until = paused, pause_ends

    def shared(
        self,
        key: str,
        gap: float | None,
        processes: int,
        paused: str,
        pause_ends: float,
        stated: tuple[float, float] = (0.0, math.inf),
    ) -> None:
        """Redis answered a turn of the slot: keep the process's share of the
        fleet's pace (``gap`` times the processes sharing it) and the pause it
        waits out (until ``pause_ends`` on the throttle's clock). ``stated``:
        the gap without the pace a host stated, and when that pace ends (the
        throttle's clock): the share after it, so that a process alone goes
        back to the fleet's own pace when the host's ends, as the fleet does.
        ``gap`` None: the answer said none (a look's), the share is kept."""
        with self._lock:
            alone = self._alone.get(key)
            if alone is None:
                alone = self._alone[key] = Alone()
            share = max(1, processes)
            if gap is not None:
                alone.gap, alone.after = gap * share, stated[0] * share
                alone.gap_until = stated[1]
            self.processes = max(self.processes, processes)
            if paused and paused != alone.paused:
                alone.paused, alone.paused_until = paused, pause_ends
            again, alone.bad = alone.bad, False
        if again:
            logger.warning("autothrottle: Redis store %r: slot %r shared again", self.prefix, key)

    def data_error(self, key: str, ask: TurnAsk, error: BaseException, now: float) -> SharedTurn:
        """A key of this slot holds something else: only this slot goes alone (rule 6)."""
        with self._lock:
            alone = self._alone.setdefault(key, Alone())
            first, alone.bad = not alone.bad, True
            alone.until = time.monotonic() + self.retry_after
        if first:
            logger.warning(
                "autothrottle: Redis store %r: data error for slot %r (%s); pacing that "
                "slot on this process's own state, retrying every %gs",
                self.prefix,
                key,
                error,
                self.retry_after,
            )
        return self.alone_turn(key, ask, now)

    def alone_now(self, key: str, ask: TurnAsk, now: float) -> SharedTurn | None:
        """The turn while Redis is down or this slot's data is bad; None: ask Redis."""
        if self.down():
            return self.while_down(key, ask, now)
        alone = self._alone.get(key)
        if alone is not None and alone.bad and time.monotonic() < alone.until:
            return self.alone_turn(key, ask, now)
        return None

    def while_down(self, key: str, ask: TurnAsk, now: float) -> SharedTurn:
        if self.fail_closed:
            return SharedTurn(max(self.down_until - time.monotonic(), 0.05), None, None, 0.0)
        return self.alone_turn(key, ask, now)

    def alone_turn(self, key: str, ask: TurnAsk, now: float) -> SharedTurn:
        """This process's share of the fleet's last pace: the slot's gap times the
        processes that shared it (without a host's stated pace once that ended);
        a slot never shared here yet, its own gap times the most processes seen
        on any slot."""
        with self._lock:
            alone = self._alone.setdefault(key, Alone())
            if alone.next > now:
                return SharedTurn(alone.next - now, None, None, 0.0)  # asks again then, and goes
            gap = alone.gap if now < alone.gap_until else alone.after
            gap = gap or ask.gap * ask.margin * self.processes
            alone.next = now + gap
        return ALONE

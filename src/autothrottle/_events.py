"""What happened to a slot, told to whoever listens (metrics, logs, a shared store).

:class:`ThrottleEvent` is the public record of one response, failure or
backoff; :class:`Listeners` is the list ``Throttle.listen`` adds to. The rules
tell every event to every listener, inline and under the slot's lock; a
listener that raises is logged and never breaks the request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Listener", "Listeners", "ThrottleEvent"]

logger = logging.getLogger("autothrottle")


@dataclass(frozen=True, slots=True)
class ThrottleEvent:
    """One thing that happened to a slot, for listeners (metrics, logs).

    Attributes:
        kind: ``"response"``, ``"failure"`` or ``"backoff"``.
        slot: The slot key.
        status: The response's status (responses only).
        latency: The response's latency in seconds (responses only).
        reason: Why the slot backed off (``"status 429"``, ``"blocked"`` ...),
            or the failure's exception name.
    """

    kind: str
    slot: str
    status: int | None = None
    latency: float | None = None
    reason: str | None = None


Listener = Callable[[ThrottleEvent], None]


class Listeners(list[Listener]):
    """The listeners of one throttle, in the order they were added.

    A list, so that ``if listeners:`` (asked for every response) costs no call.
    """

    __slots__ = ()

    def add(self, listener: Listener) -> Callable[[], None]:
        """Add ``listener``; returns a function that removes it (safe to call twice)."""
        self.append(listener)

        def stop() -> None:
            if listener in self:
                self.remove(listener)

        return stop

    def tell(self, event: ThrottleEvent) -> None:
        """Hand ``event`` to every listener; a failing listener is logged, never raised."""
        for listener in self:
            try:
                listener(event)
            except Exception:
                logger.exception("autothrottle: listener %r failed on %r", listener, event)

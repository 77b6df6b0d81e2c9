"""The library's own exceptions."""

from __future__ import annotations

__all__ = ["ThrottleTimeout"]


class ThrottleTimeout(TimeoutError):
    """A request waited longer than its ``max_wait`` for its slot's turn.

    A :class:`TimeoutError`, so it is in aiohttp's timeout family
    (``asyncio.TimeoutError``); the httpx adapters raise a subclass that is
    also an ``httpx.PoolTimeout``. Nothing was sent and nothing is held.

    Attributes:
        slot: The slot key.
        waited: The bound that was reached, in seconds.
        bound: Which setting set that bound: ``"max_wait"`` (the throttle's,
            the host's or the request's) or ``"httpx pool timeout"``.
    """

    def __init__(self, slot: str, waited: float, bound: str = "max_wait") -> None:
        super().__init__(f"waited {waited:g}s for the turn of slot {slot!r} ({bound})")
        self.slot = slot
        self.waited = waited
        self.bound = bound

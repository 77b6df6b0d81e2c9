"""Test doubles shared by the engine tests."""

from __future__ import annotations

import asyncio
import contextlib

from autothrottle import Lease, Throttle

WALL = 1_700_000_000.0
"""The fake wall clock's epoch seconds when the fake monotonic clock reads 0."""


class FakeClock:
    """A monotonic clock that only moves when told to, with a wall clock beside it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def wall(self) -> float:
        return WALL + self.now


def refusal_floor(refused_gap: float, elapsed: float) -> float:
    """The least delay ``elapsed`` seconds after a refusal at ``refused_gap`` (issue 3's
    "approach the refused pace with care"), as the throttle documents it: the allowed
    rate follows ``W * (1 + (1 - recovery_margin) * (t / recovery_time - 1) ** 3)``.
    """
    phase = elapsed / Throttle.recovery_time - 1.0
    return refused_gap / (1.0 + (1.0 - Throttle.recovery_margin) * phase**3)


async def take(throttle: Throttle, key: str = "example.com") -> Lease:
    """``await throttle.acquire(key)``, asserting the gate is open now.

    With a fake clock nothing moves time while a request waits, so a closed
    gate would hang; instead the wait is cancelled and the test fails.
    """
    task = asyncio.ensure_future(throttle.acquire(key))
    await asyncio.sleep(0)
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise AssertionError(f"the gate of {key!r} is closed")
    return task.result()

"""How a process maps Redis's clock onto its own at connection (``ServerClock``).

A fake client stands in for Redis: its ``TIME`` is this process's own
``time.monotonic``, so the true offset is zero, and an answer read late (the
process stood still after Redis answered) shows as an offset that large.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from autothrottle._redis_outage import Outage
from autothrottle._redis_parts import CALIBRATE, CALIBRATE_MOST
from autothrottle._redis_send import Sender

STALL = 0.2


class Client:
    """``TIME`` answered at once, but the first ``stalled`` answers read ``STALL`` late."""

    def __init__(self, stalled: int) -> None:
        self.stalled = stalled
        self.calls = 0

    async def script_load(self, text: str) -> str:
        return ""

    def _now(self) -> tuple[int, int]:
        now = time.monotonic()
        return int(now), int((now % 1) * 1e6)

    async def time(self) -> tuple[int, int]:
        self.calls += 1
        answer = self._now()
        if self.calls <= self.stalled:
            await asyncio.sleep(STALL)  # the answer is read late
        return answer


def sender() -> Sender:
    outage = Outage("clock", 5.0, False)
    return Sender(
        outage, prefix="clock", url=None, async_client=None, sync_client=None, ttl=60.0,
        timeout=0.25,
    )  # fmt: skip


def _best(sent: Sender) -> float:
    clock: Any = sent.server_clock
    return float(min(clock._best, clock._previous))


async def test_answers_all_read_late_are_not_taken_for_the_clock() -> None:
    # Four processes starting on a loaded machine read every one of their five
    # TIME answers late and mapped Redis's clock hundreds of ms apart.
    sent, client = sender(), Client(stalled=CALIBRATE)
    await sent._load_async(client)  # type: ignore[arg-type]
    assert client.calls > CALIBRATE  # it asked again until an answer came clean
    assert _best(sent) < STALL / 2


async def test_a_clean_start_asks_no_more_than_it_needs() -> None:
    sent, client = sender(), Client(stalled=0)
    await sent._load_async(client)  # type: ignore[arg-type]
    assert CALIBRATE <= client.calls < CALIBRATE_MOST
    assert _best(sent) == pytest.approx(0.0, abs=STALL / 2)

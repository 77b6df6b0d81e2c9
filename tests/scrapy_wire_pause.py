"""A Scrapy extension for the crawls of ``test_wire_bound.py``: the crawl's second
request, granted at once, waits before its wire turn until its slot is paused.

Scrapy says nothing of its connections: the middleware takes the wire turn as
the request leaves for the downloader, right after its grant. The other
clients' requests wait for a connection between the two, and a 429 on another
request lands meanwhile; here that wait is made by hand, polling the slot (at
most :data:`HOLD` seconds), so that the pause is known before the wire turn
whatever the machine's load. What the request then spent at its wire turn
goes into the crawl's stats (``test/at_the_wire``, seconds).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from autothrottle._exchange import Exchange

HOLD = 20.0
"""Seconds the second request waits at most for its slot's pause."""

STEP = 0.01
"""Seconds between two looks at the slot."""


class PauseBeforeTheWire:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.asked = 0
        own = Exchange.on_wire

        async def on_wire(exchange: Exchange, wait: float | None = None) -> None:
            self.asked += 1
            if self.asked != 2:
                await own(exchange, wait)
                return
            await self.until_paused(exchange)
            started = time.monotonic()
            try:
                await own(exchange, wait)
            finally:
                stats = self.crawler.stats
                stats.set_value("test/at_the_wire", time.monotonic() - started)

        Exchange.on_wire = on_wire  # type: ignore[method-assign, assignment]

    @classmethod
    def from_crawler(cls, crawler: Any) -> PauseBeforeTheWire:
        return cls(crawler)

    async def until_paused(self, exchange: Exchange) -> None:
        slot = exchange.lease.slot
        for _ in range(round(HOLD / STEP)):  # bounded: a pause never set is the test's failure
            if slot.snapshot().pauses:
                break
            await asyncio.sleep(STEP)
        self.crawler.stats.set_value("test/paused_before_the_wire", slot.snapshot().pauses)

"""A Scrapy extension for the crawls of ``test_fleet_unsent.py``: each request is
held at its wire turn (the slot's gate answers ``HOLD`` seconds, once), and the
spider is closed as soon as one is, so that the close finds it waiting there."""

from __future__ import annotations

import asyncio
from typing import Any

from autothrottle._gate import Gate

HOLD = 8.0
"""Seconds a request waits at its wire turn: the crawl, closed meanwhile, must
not wait for it (before the close gave it back, it went after them)."""


class HoldAtTheWire:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.held: set[int] = set()
        own = Gate.wire_wait

        def held_once(gate: Gate, hold: Any) -> float:
            if id(hold) in self.held:
                return own(gate, hold)
            self.held.add(id(hold))
            asyncio.get_running_loop().call_soon(self.close)
            return HOLD

        Gate.wire_wait = held_once  # type: ignore[method-assign, assignment]

    @classmethod
    def from_crawler(cls, crawler: Any) -> HoldAtTheWire:
        return cls(crawler)

    def close(self) -> None:
        engine = self.crawler.engine
        close_async = getattr(engine, "close_spider_async", None)  # Scrapy 2.14 on
        if close_async is not None:
            asyncio.get_running_loop().create_task(close_async(reason="held at the wire"))
        else:
            engine.close_spider(self.crawler.spider, "held at the wire")

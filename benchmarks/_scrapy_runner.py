"""Run a real Scrapy spider against one URL prefix, for adaptive.py: Scrapy's AutoThrottle,
or autothrottle's middleware in its place (``--autothrottle``).

Used as a subprocess (Scrapy's reactor wants a process of its own)::

    python benchmarks/_scrapy_runner.py --base http://127.0.0.2:41234 --seconds 45 \\
        --settings '{"AUTOTHROTTLE_TARGET_CONCURRENCY": 4.0, ...}' --out result.json

The spider requests ``BASE/page/0``, ``BASE/page/1``, ... (the same URLs, in
the same order, as adaptive.py's own clients) for ``--seconds`` seconds
(``CLOSESPIDER_TIMEOUT``), then writes what it saw as JSON: responses by
status, soft-block pages (``autothrottle.sim.is_blocked_page``: Scrapy has no
way to tell AutoThrottle about them, so it only counts them), and every
response's time, status, latency and the slot's delay afterwards. The ground
truth is the simulator's; this is the client's side, for diagnosis.

Scrapy's own defaults stay, except what the benchmark sets through
``--settings`` (AutoThrottle's settings, concurrency, jitter, retries) and
what would add traffic or noise the other clients do not make: robots.txt,
cookies, the telnet console, and logging below WARNING.

``--autothrottle`` turns Scrapy's extension off and enables
``autothrottle.scrapy.AutoThrottleMiddleware`` with the same settings (plus
any ``AUTOTHROTTLE_POLICY`` given in ``--settings``); the spider then reports
each CAPTCHA page with the middleware's ``blocked`` signal, as autothrottle's
other clients call ``throttle.backoff``, and the delay recorded is the
throttle's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import scrapy
from scrapy.crawler import CrawlerProcess
from scrapy.http import Response

from autothrottle.scrapy import AutoThrottleMiddleware, blocked
from autothrottle.sim import is_blocked_page

BASE_SETTINGS: dict[str, Any] = {
    "AUTOTHROTTLE_ENABLED": True,
    "ROBOTSTXT_OBEY": False,
    "COOKIES_ENABLED": False,
    "TELNETCONSOLE_ENABLED": False,
    "LOG_LEVEL": "WARNING",
    "DOWNLOAD_TIMEOUT": 30,
    "HTTPERROR_ALLOW_ALL": True,  # 429s reach the callback, so they are counted
}


class SimSpider(scrapy.Spider):
    """Fetches ``/page/N`` for N = 0, 1, 2 ... until the crawl is closed on time."""

    name = "autothrottle-benchmark"

    def __init__(self, base: str, pages: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.middleware: AutoThrottleMiddleware | None = None
        self.bases = [b.rstrip("/") for b in base.split(",") if b.strip()]
        self.pages = pages
        self.t0 = time.monotonic()
        self.statuses: dict[str, int] = {}
        self.blocked = 0
        self.events: list[tuple[float, int, float, float]] = []

    async def start(self) -> AsyncIterator[Any]:
        engine = self.crawler.engine
        assert engine is not None
        for middleware in engine.downloader.middleware.middlewares:
            if isinstance(middleware, AutoThrottleMiddleware):
                self.middleware = middleware
        # Scrapy takes start requests into its scheduler eagerly, so the count
        # is bounded by the caller to what the crawl could possibly use, and
        # the loop is given back after each one: thousands enqueued in one go
        # would hold up the first responses and inflate their latency.
        for i in range(self.pages):
            for base in self.bases:
                yield scrapy.Request(f"{base}/page/{i}", dont_filter=True, callback=self.parse)
                await asyncio.sleep(0)

    def parse(self, response: Response) -> None:
        status = str(response.status)
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if response.status == 200 and is_blocked_page(response.body):
            self.blocked += 1
            if self.middleware is not None:
                self.crawler.signals.send_catch_log(blocked, response=response)
        latency = float(response.meta.get("download_latency", 0.0))
        delay = -1.0
        slot_key = response.meta.get("download_slot")
        engine = self.crawler.engine
        if slot_key is not None and self.middleware is not None:
            delay = self.middleware.throttle.slot(slot_key).delay
        elif slot_key is not None and engine is not None:
            slot = engine.downloader.slots.get(slot_key)
            if slot is not None:
                delay = slot.delay
        self.events.append(
            (round(time.monotonic() - self.t0, 4), response.status, round(latency, 5), delay)
        )


def _policy_states(spider: SimSpider) -> dict[str, dict[str, float]]:
    """Each slot's policy memory at the end (``--autothrottle``), for diagnosis."""
    if spider.middleware is None:
        return {}
    store = spider.middleware.throttle.store
    records = {key: store.load(key) for key in store}
    return {key: dict(record.policy_state) for key, record in records.items() if record}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base",
        required=True,
        help="http://ADDRESS:PORT of the sim host (several: comma-separated; --pages each)",
    )
    parser.add_argument("--seconds", type=float, required=True, help="crawl time")
    parser.add_argument("--settings", default="{}", help="Scrapy settings as a JSON object")
    parser.add_argument(
        "--pages", type=int, default=20_000, help="URLs to queue (/page/0 ... /page/N-1)"
    )
    parser.add_argument("--out", default="-", help="where to write the JSON (default stdout)")
    parser.add_argument(
        "--autothrottle",
        action="store_true",
        help="autothrottle's middleware in place of Scrapy's AutoThrottle extension",
    )
    args = parser.parse_args()
    if not 1 <= args.seconds <= 600:
        parser.error("--seconds must be in [1, 600]")
    if not 1 <= args.pages <= 1_000_000:
        parser.error("--pages must be in [1, 1000000]")
    overrides = json.loads(args.settings)
    if not isinstance(overrides, dict):
        parser.error("--settings must be a JSON object")
    settings = {**BASE_SETTINGS, **overrides, "CLOSESPIDER_TIMEOUT": args.seconds}
    if args.autothrottle:
        settings["AUTOTHROTTLE_ENABLED"] = False
        settings["DOWNLOADER_MIDDLEWARES"] = {"autothrottle.scrapy.AutoThrottleMiddleware": 950}

    process = CrawlerProcess(settings=settings)
    crawler = process.create_crawler(SimSpider)
    started = time.monotonic()
    process.crawl(crawler, base=args.base, pages=args.pages)
    process.start()
    elapsed = time.monotonic() - started
    spider = crawler.spider
    assert isinstance(spider, SimSpider)
    stats = crawler.stats.get_stats() if crawler.stats is not None else {}
    result = {
        "scrapy": scrapy.__version__,
        "settings": settings,
        "elapsed": elapsed,
        "statuses": spider.statuses,
        "blocked": spider.blocked,
        "responses": len(spider.events),
        "pages_queued": args.pages,
        "final_delay": spider.events[-1][3] if spider.events else None,
        "events": spider.events,
        "finish_reason": stats.get("finish_reason"),
        "downloader_exceptions": {
            k: v for k, v in stats.items() if k.startswith("downloader/exception_type_count")
        },
        "autothrottle_stats": {k: v for k, v in stats.items() if k.startswith("autothrottle/")},
        "policy_state": _policy_states(spider),
    }
    text = json.dumps(result, default=str)
    if args.out == "-":
        sys.stdout.write(text + "\n")
    else:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()

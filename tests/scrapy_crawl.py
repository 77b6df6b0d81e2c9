"""One real Scrapy crawl with autothrottle's middleware, for test_scrapy.py.

Run as ``python tests/scrapy_crawl.py SPEC_JSON OUT_JSON`` (Scrapy's reactor
wants a process of its own). SPEC is ``{"settings": {...}, "requests": [{"url":
..., "meta": {...}, "headers": {...}}, ...], "signal_blocks": bool}``. OUT gets
what the test asserts on: the crawl's stats, each response's status (and
each errback's exception name), and every slot of the throttle once the
crawl is over. ``"close_after": N`` in SPEC has the spider's callback raise
``CloseSpider("enough")`` at its Nth response.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

import scrapy
from scrapy import signals
from scrapy.crawler import CrawlerProcess
from scrapy.exceptions import CloseSpider
from scrapy.http import Response
from twisted.python.failure import Failure

from autothrottle.scrapy import AutoThrottleMiddleware, blocked
from autothrottle.sim import is_blocked_page
from loopback import promptly_on

BASE_SETTINGS: dict[str, Any] = {
    "DOWNLOADER_MIDDLEWARES": {"autothrottle.scrapy.AutoThrottleMiddleware": 950},
    "AUTOTHROTTLE_ENABLED": False,
    "ROBOTSTXT_OBEY": False,
    "COOKIES_ENABLED": False,
    "TELNETCONSOLE_ENABLED": False,
    "LOG_LEVEL": "INFO",
    "HTTPERROR_ALLOW_ALL": True,
    "DOWNLOAD_DELAY_JITTER": 0.0,
    "DOWNLOAD_TIMEOUT": 10,
}


class Stall:
    """A downloader middleware after autothrottle's (``"__main__.Stall": 960``)
    that blocks the loop for ``request.meta["stall"]`` seconds: the request is
    held up between its wire turn and Scrapy's download handler, as a busy
    loop holds it up."""

    def process_request(self, request: scrapy.Request, spider: Any = None) -> None:
        stall = request.meta.get("stall")
        if stall:
            time.sleep(stall)


class TestSpider(scrapy.Spider):
    name = "autothrottle-test"

    def __init__(self, spec: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.outcomes: list[dict[str, Any]] = []
        self.middleware: AutoThrottleMiddleware | None = None

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> TestSpider:
        spider: TestSpider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.opened, signal=signals.spider_opened)
        return spider

    def opened(self) -> None:
        assert self.crawler.engine is not None
        for middleware in self.crawler.engine.downloader.middleware.middlewares:
            if isinstance(middleware, AutoThrottleMiddleware):
                self.middleware = middleware

    async def start(self) -> AsyncIterator[Any]:
        for entry in self.spec["requests"]:
            yield scrapy.Request(
                entry["url"],
                meta=entry.get("meta", {}),
                headers=entry.get("headers"),
                dont_filter=True,
                callback=self.parse,
                errback=self.failed,
            )

    def parse(self, response: Response) -> None:
        page_blocked = response.status == 200 and is_blocked_page(response.body)
        if page_blocked and self.spec.get("signal_blocks"):
            self.crawler.signals.send_catch_log(blocked, response=response)
        info = response.meta.get("autothrottle_info")
        self.outcomes.append(
            {
                "url": response.url,
                "status": response.status,
                "blocked": page_blocked,
                "slot": getattr(info, "slot", None),
                "waited": getattr(info, "waited", None),
                "latency": response.meta.get("download_latency"),
            }
        )
        close_after = self.spec.get("close_after")
        if close_after is not None and len(self.outcomes) >= close_after:
            raise CloseSpider("enough")

    def failed(self, failure: Failure) -> None:
        self.outcomes.append(
            {"url": failure.request.url, "error": type(failure.value).__name__}  # type: ignore[attr-defined]
        )


def main(spec_path: str, out_path: str) -> None:
    with open(spec_path, encoding="utf-8") as file:
        spec = json.load(file)
    process = CrawlerProcess(settings={**BASE_SETTINGS, **spec["settings"]})
    crawler = process.create_crawler(TestSpider)
    process.crawl(crawler, spec=spec)
    # The crawl, from here (Scrapy imported and set up, its reactor and the
    # threads it starts to come), ahead of every ordinary process: the tests
    # time its requests at the host, and a write put off in a busy machine's
    # run queue would arrive late and make the next gap read short.
    promptly_on(1)
    process.start()
    spider = crawler.spider
    assert isinstance(spider, TestSpider)
    assert spider.middleware is not None, "the middleware was not enabled"
    throttle = spider.middleware.throttle
    stats = crawler.stats.get_stats() if crawler.stats is not None else {}
    result = {
        "stats": {k: v for k, v in stats.items() if isinstance(v, (int, float, str))},
        "outcomes": spider.outcomes,
        "slots": {key: asdict(snapshot) for key, snapshot in throttle.snapshot().items()},
    }
    with open(out_path, "w", encoding="utf-8") as file:
        json.dump(result, file, default=str)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

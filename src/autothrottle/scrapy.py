"""autothrottle inside Scrapy: a downloader middleware that paces every download slot.

Enable it in ``settings.py`` (Scrapy 2.13+, asyncio reactor), in place of
Scrapy's AutoThrottle extension::

    DOWNLOADER_MIDDLEWARES = {"autothrottle.scrapy.AutoThrottleMiddleware": 950}
    AUTOTHROTTLE_ENABLED = False  # the extension: the middleware replaces it

Every request then waits for its download slot's turn in the shared engine
(per host by default, or per IP with ``CONCURRENT_REQUESTS_PER_IP``, or the
``download_slot`` you set), with Scrapy's own slot delay kept at zero so the
throttle alone sets the pace. Each response teaches the slot its
``download_latency``, its status and its headers (Retry-After, rate-limit
headers, cache hits); each download error backs it off as a connection error
does in the other adapters. Retries by Scrapy's RetryMiddleware come back
through the scheduler and wait their turn like any request.

Scrapy's settings keep their meaning (``AUTOTHROTTLE_START_DELAY``,
``AUTOTHROTTLE_MAX_DELAY``, ``AUTOTHROTTLE_TARGET_CONCURRENCY``,
``AUTOTHROTTLE_DEBUG``, ``DOWNLOAD_DELAY``, ``CONCURRENT_REQUESTS_PER_DOMAIN``,
``CONCURRENT_REQUESTS_PER_IP``, ``DOWNLOAD_DELAY_JITTER`` /
``RANDOMIZE_DOWNLOAD_DELAY``, ``DOWNLOAD_SLOTS``); new ones choose a policy,
per-host settings, a fleet through Redis, a state file and soft-block rules.
``docs/scrapy.md`` has the table of every setting.

Per request, ``request.meta["autothrottle"] = {"bypass": True}`` (or ``adjust``,
``slot``, ``max_wait``), the ``X-AutoThrottle`` header, and Scrapy's own
``autothrottle_dont_adjust_delay``. A spider callback that sees a soft block
(a CAPTCHA page) says so in one line::

    self.crawler.signals.send_catch_log(autothrottle.scrapy.blocked, response=response)

What the throttle did lands in the crawl's stats under ``autothrottle/``
(counted in the middleware and written at most a second late, in full when
the spider closes: Scrapy's stats collector costs more per call than the
throttle's own turn).
"""

from __future__ import annotations

import logging
import re
import time
import weakref
from time import perf_counter
from typing import TYPE_CHECKING, Any, Self

import anyio

try:
    import scrapy as _needed  # noqa: F401  (the extra this module needs)
except ImportError as _missing:  # pragma: no cover - depends on the environment
    from ._extras import missing_extra_error

    raise missing_extra_error("autothrottle.scrapy", "scrapy", "scrapy") from _missing

from scrapy import Request, Spider, signals
from scrapy.crawler import Crawler
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response, TextResponse

from ._errors import ThrottleTimeout
from ._events import ThrottleEvent
from ._exchange import Exchange, ThrottleInfo
from ._lease import Lease
from ._request import CONTROL_HEADER, RequestOptions, options_from_header, options_from_mapping
from ._scrapy_parts import (
    CLOSING,
    Held,
    as_meta,
    hook_engine_close,
    host_failure,
    response_headers,
    unconnected,
)
from ._scrapy_settings import kept_limits, throttle_from_settings
from ._store import MemoryStore

if TYPE_CHECKING:
    from . import SlotSnapshot

__all__ = ["INFO_KEY", "AutoThrottleMiddleware", "ThrottleWaitTimeout", "blocked"]

logger = logging.getLogger(__name__)

blocked = object()
"""The signal a spider sends when a response is a soft block (a CAPTCHA, a
login wall): its slot backs off as on a 429. Arguments: ``response``, and
optionally ``pause`` (seconds to send nothing to the slot)::

    self.crawler.signals.send_catch_log(blocked, response=response)
"""

_STATS_EVERY = 1.0
"""Seconds between writes of the counted stats to the crawl's stats collector."""

_LOOK_AT = 1024
"""The fewest slots noted before the middleware looks for those the throttle forgot."""

INFO_KEY = "autothrottle_info"
"""The ``request.meta`` (and ``response.meta``) key of the
:class:`~autothrottle.ThrottleInfo` of a paced request: its slot, how long it
waited, when it was granted."""


class ThrottleWaitTimeout(IgnoreRequest):
    """A request waited its ``max_wait`` for its turn and was dropped unsent.

    An ``IgnoreRequest``, so the request's errback receives it and
    RetryMiddleware leaves it alone (a retry would wait again). The
    :class:`~autothrottle.ThrottleTimeout` is its ``__cause__``.

    Attributes:
        slot: The slot key.
        waited: The bound that was reached, in seconds.
    """

    def __init__(self, error: ThrottleTimeout) -> None:
        super().__init__(str(error))
        self.slot = error.slot
        self.waited = error.waited


class AutoThrottleMiddleware:
    """A Scrapy downloader middleware that paces every download slot with autothrottle.

    Build it through Scrapy (``DOWNLOADER_MIDDLEWARES``, priority 950: after
    HttpCacheMiddleware, so cache hits never wait, and last before the
    downloader); the throttle is made from the crawl's settings
    (``docs/scrapy.md``). One middleware, one throttle, per crawl. Its methods
    take the ``spider`` argument Scrapy passes before 2.14, and do without it.

    Raises:
        ValueError: ``AUTOTHROTTLE_ENABLED`` is on (the extension and the
            middleware would both pace), or a setting is wrong (named).
    """

    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        if settings.getbool("AUTOTHROTTLE_ENABLED"):
            raise ValueError(
                "AUTOTHROTTLE_ENABLED = True turns on Scrapy's AutoThrottle extension, which "
                "autothrottle.scrapy.AutoThrottleMiddleware replaces: set it to False"
            )
        self.crawler = crawler
        self.throttle = throttle_from_settings(
            settings, getattr(crawler.spidercls, "name", None) or "spider"
        )
        limits = kept_limits(settings)
        if limits is not None:
            logger.info(limits)
        self._debug = settings.getbool("AUTOTHROTTLE_DEBUG")
        pattern = settings.get("AUTOTHROTTLE_BLOCK_PATTERN")
        self._block_pattern = re.compile(pattern) if pattern else None
        self._state_file = settings.get("AUTOTHROTTLE_STATE_FILE")
        self._held: weakref.WeakKeyDictionary[Request, Held] = weakref.WeakKeyDictionary()
        self._waiting: set[anyio.CancelScope] = set()
        # Each slot this crawl used, its pauses and cache hits when last read; the
        # slots the throttle forgot are let go of (_let_go) and banked here.
        self._seen: dict[str, tuple[int, int]] = {}
        self._banked = [0, 0, 0]  # slots let go of, their pauses, their cache hits
        self._look_at = _LOOK_AT
        self._closing = False
        self._counts: dict[str, int] = {}  # stats counted since they were last written
        self._waited = self._waited_max = 0.0
        self._written = perf_counter()
        self._refusals = self.throttle.backoff_statuses
        self.throttle.listen(self._count)
        hook_engine_close()
        CLOSING[crawler] = self._begin_closing
        connect = crawler.signals.connect
        connect(self._spider_closed, signal=signals.spider_closed)
        connect(self._headers, signal=signals.headers_received)
        connect(self._downloaded, signal=signals.response_downloaded)
        connect(self._response_received, signal=signals.response_received)
        connect(self._blocked, signal=blocked)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    # -- the downloader's side ------------------------------------------------------------

    async def process_request(
        self, request: Request, spider: Spider | None = None
    ) -> Request | None:
        """Wait for the slot's turn; hand the request back to the scheduler if the
        spider closes meanwhile."""
        options = self._options(request)
        if options.bypass:
            self._inc("autothrottle/bypassed")
            return None
        key = self._scrapy_slot(request)
        if options.slot is not None:
            key = options.slot
        if self._closing:
            return self._give_back(request)
        request.meta.pop("download_latency", None)  # a retry's copy of the last one
        request.meta.pop(INFO_KEY, None)
        self._first_sight(key)
        exchange = await self._turns(key, options)
        if exchange is None:
            return self._give_back(request)
        self._held[request] = Held(request, exchange)
        self._inc("autothrottle/requests")
        waited = exchange.waited
        self._waited += waited
        if waited > self._waited_max:
            self._waited_max = waited
        now = exchange.started
        if now - self._written >= _STATS_EVERY:
            self._write_stats(now)
        return None

    async def _turns(self, key: str, options: RequestOptions) -> Exchange | None:
        """The request's turn, then its wire turn (Scrapy tells nothing of its
        connection: the wire turn is taken as the request leaves for the
        downloader); None when the spider began closing meanwhile. A request
        given up so was never sent: a fleet's turn it holds goes back whole,
        its time too (``Exchange.on_wire``; the fleet's own step at the turn)."""
        asked = perf_counter()
        lease: Lease | None = None
        exchange: Exchange | None = None
        with anyio.CancelScope() as scope:
            self._waiting.add(scope)
            try:
                lease = await self.throttle.acquire(
                    key, adjust=options.adjust, max_wait=options.max_wait, cost=options.cost
                )
                exchange = Exchange(lease, asked)
                if options.max_wait is not None:  # the wire turn's wait counts against it too
                    exchange.bound = options.max_wait
                await exchange.on_wire()
            except ThrottleTimeout as error:  # at the turn, or a fleet's new turn at the wire
                if lease is not None:
                    lease.release()
                self._inc("autothrottle/timeouts")
                raise ThrottleWaitTimeout(error) from error
            except BaseException:
                if lease is not None:
                    lease.release()
                raise
            finally:
                self._waiting.discard(scope)
        if exchange is None or not exchange.wired:  # the spider closes: cancelled
            return None
        return exchange

    def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Response:
        """A response the downloader never saw (a middleware after this one made it)
        lets the slot go and teaches it nothing; the downloader's own were
        taken as they arrived (:meth:`_downloaded`)."""
        held = self._held.pop(request, None)
        if held is not None:
            self._answered(request, response, held)
        return response

    def _headers(self, request: Request, **kwargs: Any) -> None:
        """Scrapy's ``headers_received``: when the answer began, on the clock of
        the wire turn (Scrapy's ``download_latency`` is timed from its download
        handler, which starts later: :meth:`_answered`)."""
        held = self._held.get(request)
        if held is not None:
            held.headers_at = perf_counter()
            # Scrapy's HTTP/1.1 handler (and its streaming ones) set the latency
            # before this signal; its HTTP/2 handler only once the body is in.
            held.timed_to_body = "download_latency" not in request.meta

    def _downloaded(self, response: Response, request: Request, spider: Spider) -> None:
        """Scrapy's ``response_downloaded``: the body is in, the handler done.

        The slot is let go here rather than in :meth:`process_response`, which
        comes after the downloader's and the middlewares' own work: a slot held
        for that too would count Scrapy's processing as time in flight at the
        host, and a policy that caps requests in flight by their latency (the
        adaptive one) would cap them too low.
        """
        held = self._held.pop(request, None)
        if held is not None:
            self._answered(request, response, held)

    def _answered(self, request: Request, response: Response, held: Held) -> None:
        """Teach the slot the response and let it go."""
        exchange = held.done()
        latency = request.meta.get("download_latency")
        key = exchange.lease.slot.key
        before = self.throttle.slot(key).snapshot() if self._debug else None
        ready, headers_at = exchange.ready, held.headers_at
        if held.timed_to_body and latency is not None and headers_at is not None:
            # Timed to the body's end, which is now: the headers came as long
            # before as the body took (Scrapy's HTTP/2 handler).
            latency = max(0.0, float(latency) - (perf_counter() - headers_at))
        try:
            if latency is not None and ready is not None and headers_at is not None:
                # The turn's way to Scrapy's download handler, which
                # download_latency misses: a loop busy then holds the request
                # up on its way to the host, and a strict pace's next request,
                # sent on time, would arrive early by as much.
                late = headers_at - ready - float(latency)
                if late > 0.0:
                    exchange.lease.started_late(late)
            exchange.responded(
                response.status,
                response_headers(response),
                from_cache="cached" in response.flags or latency is None,
                latency=None if latency is None else float(latency),
            )
        finally:
            exchange.lease.release()
        request.meta[INFO_KEY] = exchange.info()
        if before is not None:
            self._log_response(key, before, response, latency)

    def process_exception(
        self, request: Request, exception: Exception, spider: Spider | None = None
    ) -> None:
        """A download error: the host's failure backs the slot off; anything else
        only lets the slot go. A download that failed before anything of the
        request was written (:func:`~autothrottle._scrapy_parts.unconnected`)
        hands a fleet's turn back whole, its time too: its wire turn, taken
        before Scrapy connects, went unused (``Exchange.failed``, told that
        the wire turn came before the connection)."""
        held = self._held.pop(request, None)
        if held is not None:
            held.done().failed(exception, host_failure, unconnected, wired_before_connect=True)

    # -- options and slots ----------------------------------------------------------------

    def _options(self, request: Request) -> RequestOptions:
        """The request's options from its meta and its control header, which is
        moved into the meta (a retry is a copy without the header)."""
        options = options_from_mapping(request.meta)
        if request.meta.get("autothrottle_dont_adjust_delay") is True:
            options = options.merged(RequestOptions(adjust=False))
        values = request.headers.getlist(CONTROL_HEADER)
        if values:
            del request.headers[CONTROL_HEADER]
            text = ", ".join(value.decode("latin-1") for value in values)
            options = options.merged(options_from_header(text))
            request.meta["autothrottle"] = as_meta(options)
        return options

    def _scrapy_slot(self, request: Request) -> str:
        """Scrapy's download slot for ``request``, its own delay kept at zero.

        Scrapy makes a slot with ``DOWNLOAD_DELAY`` (or its ``DOWNLOAD_SLOTS``
        delay) on its first request, which goes at once; Scrapy then holds the
        slot for that delay. From the next request on, its delay is zero (that
        hold cancelled), and its concurrency no lower than the throttle's cap.
        """
        engine = self.crawler.engine
        assert engine is not None
        downloader = engine.downloader
        key = downloader.get_slot_key(request)
        slot = downloader.slots.get(key)
        if slot is not None:
            if slot.delay:
                slot.delay = 0.0
                if slot.latercall is not None:  # a wait for that delay, queue empty or not
                    slot.latercall.cancel()
                    slot.latercall = None
            cap = self.throttle.config_for(key).max_concurrency
            if slot.concurrency < cap:
                slot.concurrency = cap
        return key

    def _give_back(self, request: Request) -> Request:
        """The spider is closing: the request goes back to the scheduler unsent
        (kept with ``JOBDIR``), rather than hold the close up for its turn."""
        self._inc("autothrottle/rescheduled_at_close")
        return request.replace(dont_filter=True)

    def _first_sight(self, key: str) -> None:
        """Note the slot's counters when this crawl first uses it: a state file or
        the fleet may bring counts from earlier runs."""
        if key not in self._seen:
            if len(self._seen) >= self._look_at:
                self._let_go()
            snapshot = self.throttle.slot(key).snapshot()
            self._seen[key] = (snapshot.pauses, snapshot.cache_hits)

    def _let_go(self) -> dict[str, SlotSnapshot]:
        """Bank what the slots counted so far and let go of those the throttle
        forgot (idle past its store's ``idle_timeout``), so that a crawl of
        millions of hosts keeps about its live slots here, not every host it
        met. Looked at when the slots noted reach twice those kept at the last
        look: a first sight pays for it, never the usual request."""
        live = self.throttle.snapshot()
        kept: dict[str, tuple[int, int]] = {}
        banked = self._banked
        for key, (pauses, hits) in self._seen.items():
            snapshot = live.get(key)
            if snapshot is None:
                banked[0] += 1  # what it counted since the last look went with it
                continue
            # (a slot forgotten and made again since counts from its new start)
            banked[1] += max(0, snapshot.pauses - pauses)
            banked[2] += max(0, snapshot.cache_hits - hits)
            kept[key] = (snapshot.pauses, snapshot.cache_hits)
        self._seen = kept
        self._look_at = max(_LOOK_AT, 2 * len(kept))
        return live

    # -- signals ------------------------------------------------------------------------

    def _begin_closing(self) -> None:
        self._closing = True
        for scope in list(self._waiting):
            scope.cancel()

    async def _spider_closed(self, spider: Spider, reason: str) -> None:
        """Let go of anything still held; write the stats; keep what was learned."""
        self._begin_closing()
        for held in list(self._held.values()):
            held.done().lease.release()
            self._inc("autothrottle/released_at_close")
        self._held.clear()
        self._write_stats(perf_counter())
        self._final_stats()
        store = self.throttle.store
        if self._state_file and isinstance(store, MemoryStore):
            store.save_file(self._state_file, now=time.monotonic())
        aclose = getattr(store, "aclose", None)  # a fleet's RedisStore: flush, then close
        if aclose is not None:
            await aclose()

    def _response_received(self, response: Response, request: Request, spider: Spider) -> None:
        """``AUTOTHROTTLE_BLOCK_PATTERN``: read the body as the spider will (decoded)."""
        if self._block_pattern is None or "cached" in response.flags:
            return
        info = request.meta.get(INFO_KEY)
        if not isinstance(info, ThrottleInfo):
            return
        text = (
            response.text if isinstance(response, TextResponse) else response.body.decode("latin-1")
        )
        if self._block_pattern.search(text):
            self._inc("autothrottle/blocked")
            self.throttle.backoff(info.slot, sent_at=info.sent_at, reason="blocked")

    def _blocked(self, response: Response, pause: float | None = None, **kwargs: Any) -> None:
        """The :data:`blocked` signal: back the response's slot off."""
        info = response.meta.get(INFO_KEY)
        self._inc("autothrottle/blocked")
        if isinstance(info, ThrottleInfo):
            self.throttle.backoff(info.slot, pause=pause, sent_at=info.sent_at, reason="blocked")
            return
        key = response.meta.get("download_slot")
        if isinstance(key, str) and key:
            self.throttle.backoff(key, pause=pause, reason="blocked")

    # -- stats and the debug log ------------------------------------------------------------

    def _inc(self, key: str) -> None:
        counts = self._counts
        counts[key] = counts.get(key, 0) + 1
        if self._closing:  # the crawl's stats may be read any moment now
            self._write_stats(perf_counter())

    def _write_stats(self, now: float) -> None:
        """Add what was counted since the last write to the crawl's stats."""
        self._written = now
        stats = self.crawler.stats
        if stats is None:
            return
        counts = self._counts
        if counts.get("autothrottle/requests"):
            total = stats.get_value("autothrottle/wait_seconds", 0.0) + self._waited
            stats.set_value("autothrottle/wait_seconds", total)
            stats.max_value("autothrottle/wait_seconds_max", self._waited_max)
            self._waited = self._waited_max = 0.0
        for key, count in counts.items():
            stats.inc_value(key, count)
        counts.clear()

    def _count(self, event: ThrottleEvent) -> None:
        """Every response, failure and backoff, as the crawl's stats."""
        if event.kind == "response":
            self._inc("autothrottle/responses")
            if event.status in self._refusals:
                self._inc("autothrottle/refusals")
                self._inc(f"autothrottle/refusals/{event.status}")
        elif event.kind == "failure":
            self._inc("autothrottle/failures")
        elif event.kind == "backoff":
            self._inc("autothrottle/backoffs")
            reason = (event.reason or "unknown").replace(": ", "/").replace(" ", "_")
            self._inc(f"autothrottle/backoffs/{reason}")

    def _final_stats(self) -> None:
        """The slots' figures, read from the live slots once (a slot the throttle
        forgot is not made again to be read)."""
        stats = self.crawler.stats
        if stats is None or not (self._seen or self._banked[0]):
            return
        live = self._let_go()
        slots, pauses, cache_hits = self._banked
        stats.set_value("autothrottle/slots", slots + len(self._seen))
        stats.set_value("autothrottle/pauses", pauses)
        stats.set_value("autothrottle/cache_hits", cache_hits)
        delays = [live[key].delay for key in self._seen if key in live]
        if delays:
            stats.set_value("autothrottle/delay_max", max(delays))
            stats.set_value("autothrottle/delay_mean", sum(delays) / len(delays))

    def _log_response(
        self, key: str, before: Any, response: Response, latency: float | None
    ) -> None:
        """``AUTOTHROTTLE_DEBUG``: one line per response, as Scrapy's AutoThrottle
        writes it, with what the throttle did beyond the delay."""
        after = self.throttle.slot(key).snapshot()
        notes = []
        if after.backoffs > before.backoffs:
            notes.append(f"backoff: {after.last_backoff_reason}")
        if after.pause_remaining > 0.0 and after.pauses > before.pauses:
            notes.append(f"paused {after.pause_remaining:.1f}s")
        logger.info(
            "slot: %(slot)s | conc:%(conc)2d | delay:%(delay)5d ms (%(diff)+d) | "
            "latency:%(latency)5d ms | status: %(status)d | size:%(size)6d bytes%(notes)s",
            {
                "slot": key,
                "conc": after.in_flight,
                "delay": after.delay * 1000,
                "diff": (after.delay - before.delay) * 1000,
                "latency": (latency or 0.0) * 1000,
                "status": response.status,
                "size": len(response.body),
                "notes": "".join(f" | {note}" for note in notes),
            },
            extra={"spider": self.crawler.spider},
        )

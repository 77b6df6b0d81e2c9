"""What the Scrapy middleware needs around each request: the failures that count
against a host, the response's headers and meta, the backstop release of a dropped
request, and the hook on the engine's close."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import weakref
from collections.abc import Callable
from typing import Any

from scrapy import Request
from scrapy.crawler import Crawler
from scrapy.http import Response
from scrapy.utils.misc import load_object

from ._exchange import Exchange
from ._lease import Lease
from ._request import RequestOptions

__all__ = [
    "CLOSING",
    "Held",
    "as_meta",
    "hook_engine_close",
    "host_failure",
    "response_headers",
    "unconnected",
]


def _load_exceptions(names: tuple[str, ...]) -> tuple[type[BaseException], ...]:
    found: list[type[BaseException]] = []
    for name in names:
        with contextlib.suppress(ImportError, AttributeError, NameError, ValueError):
            found.append(load_object(name))  # absent from an older Scrapy or Twisted
    return tuple(found)


_HOST_FAILURES: tuple[type[BaseException], ...] = (
    OSError,
    *_load_exceptions(
        (
            "scrapy.exceptions.CannotResolveHostError",
            "scrapy.exceptions.DownloadConnectionRefusedError",
            "scrapy.exceptions.DownloadFailedError",
            "scrapy.exceptions.DownloadTimeoutError",
            "scrapy.exceptions.ResponseDataLossError",
            "scrapy.core.downloader.handlers.http11.TunnelError",
            "twisted.internet.error.ConnectError",
            "twisted.internet.error.ConnectionLost",
            "twisted.internet.error.ConnectionDone",
            "twisted.internet.error.TimeoutError",
            "twisted.internet.defer.TimeoutError",
            "twisted.web.client.ResponseFailed",
            "twisted.web.client.ResponseNeverReceived",
        )
    ),
)


def host_failure(error: BaseException) -> bool:
    """The host failed: refused, unreachable, timed out, cut the body short.

    A cancelled download, an unsupported scheme or a middleware's own error
    is not the host's.
    """
    return isinstance(error, _HOST_FAILURES)


_UNCONNECTED: tuple[type[BaseException], ...] = _load_exceptions(
    (
        "scrapy.exceptions.CannotResolveHostError",
        "scrapy.exceptions.DownloadConnectionRefusedError",
        "scrapy.core.downloader.handlers.http11.TunnelError",
        "twisted.internet.error.ConnectError",
        "twisted.internet.error.DNSLookupError",
        "twisted.internet.error.ConnectingCancelledError",
    )
)
_WHOLE_DOWNLOAD_TIMEOUT = _load_exceptions(("twisted.internet.error.TimeoutError",))
_WRAPPED = _load_exceptions(("scrapy.exceptions.DownloadFailedError",))
_TIMED_OUT = _load_exceptions(("scrapy.exceptions.DownloadTimeoutError",))
_NEVER_RECEIVED = _load_exceptions(("twisted.web.client.ResponseNeverReceived",))
_VERIFICATION = _load_exceptions(("service_identity.exceptions.VerificationError",))
_TLS_ERROR = _load_exceptions(("OpenSSL.SSL.Error",))


def unconnected(error: BaseException) -> bool:
    """The download failed before anything of the request was written: its
    connection was never made (refused, a name not found, no route, the
    system's connect timeout, the connect cancelled, a proxy's tunnel refused),
    or the server's certificate was refused, which ends the TLS handshake
    before the request leaves the client.

    Scrapy 2.14 on raises its own error with Twisted's as its cause; 2.13,
    Twisted's. A download timeout is not one: Scrapy's handler raises the same
    error whether the connect or the response was slow (2.13 raises Twisted's
    ``TimeoutError``, a ``ConnectError``, for both), but for its experimental
    httpx handler (Scrapy 2.19 on), whose timeout's cause is httpx's (or
    httpx2's) ``ConnectTimeout`` when the connection was never made.
    """
    if isinstance(error, _TIMED_OUT):
        return _connect_timed_out(error.__cause__)
    if isinstance(error, _WRAPPED) and error.__cause__ is not None:
        error = error.__cause__
    if isinstance(error, _UNCONNECTED):
        return not isinstance(error, _WHOLE_DOWNLOAD_TIMEOUT)
    if isinstance(error, _NEVER_RECEIVED):
        reasons = getattr(error, "reasons", None) or []
        return bool(reasons) and all(_certificate_refused(reason.value) for reason in reasons)
    return False


def _connect_timed_out(cause: BaseException | None) -> bool:
    """``cause`` is httpx's or httpx2's ``ConnectTimeout`` (raised while the
    connection was being made, before a byte of the request was written).
    Looked up among the modules loaded: only a crawl that loaded one can have
    raised its error, and a crawl without pays no import."""
    if cause is None:
        return False
    for name in ("httpx2", "httpx"):
        module = sys.modules.get(name)
        if module is not None and isinstance(cause, module.ConnectTimeout):
            return True
    return False


def _certificate_refused(error: object) -> bool:
    """The client refused the server's certificate (OpenSSL's verification, or the
    name check Twisted makes at the end of the handshake)."""
    if isinstance(error, _VERIFICATION):
        return True
    if not isinstance(error, _TLS_ERROR) or not error.args:
        return False
    found = error.args[0]
    return isinstance(found, list) and any(
        isinstance(entry, tuple) and "certificate verify failed" in entry for entry in found
    )


def response_headers(response: Response) -> dict[str, str]:
    """The response headers as the engine reads them: the first value of each."""
    return {
        name.decode("latin-1"): values[0].decode("latin-1")
        for name, values in response.headers.items()
        if values
    }


def as_meta(options: RequestOptions) -> dict[str, Any]:
    """``options`` as the ``request.meta["autothrottle"]`` dict that reads back as them."""
    meta: dict[str, Any] = {}
    if not options.adjust:
        meta["adjust"] = False
    if options.bypass:
        meta["bypass"] = True
    if options.slot is not None:
        meta["slot"] = options.slot
    if options.max_wait is not None:
        meta["max_wait"] = options.max_wait
    cost = options.cost
    if isinstance(cost, int):
        meta["cost"] = cost
    elif cost is not None:
        meta["cost"] = {"input": cost[0], "output": cost[1]}
    return meta


class Held:
    """A request's exchange while it is in Scrapy's downloader, with a backstop:
    a request dropped without a response or an error releases when collected.

    ``headers_at``: when its response headers came (``perf_counter``; None
    until then), on the clock its wire turn was timed on. ``timed_to_body``:
    the handler had not set ``download_latency`` by then, so it times the
    download to the body's end (Scrapy's HTTP/2 handler), not to the headers.
    """

    __slots__ = ("exchange", "finalizer", "headers_at", "timed_to_body")

    def __init__(self, request: Request, exchange: Exchange) -> None:
        self.exchange = exchange
        self.headers_at: float | None = None
        self.timed_to_body = False
        loop = asyncio.get_running_loop()
        self.finalizer = weakref.finalize(request, _release_soon, loop, exchange.lease)
        self.finalizer.atexit = False

    def done(self) -> Exchange:
        self.finalizer.detach()
        return self.exchange


def _release_soon(loop: asyncio.AbstractEventLoop, lease: Lease) -> None:
    """Collection may run inside the slot's own bookkeeping: release on the loop."""
    try:
        loop.call_soon_threadsafe(lease.release)
    except RuntimeError:  # the loop is closed: nothing waits any more
        lease.release()


CLOSING: weakref.WeakKeyDictionary[Crawler, Callable[[], None]] = weakref.WeakKeyDictionary()
"""What each crawl's middleware does when its engine starts closing the spider."""

_ENGINE_WRAPPERS: set[Callable[..., Any]] = set()
"""The engine's close methods as wrapped here, so that they are wrapped once."""


def hook_engine_close() -> None:
    """Tell a crawl's middleware when its engine starts closing the spider.

    Scrapy sends no signal then: ``spider_closed`` comes once every request
    in progress, those waiting for their turn included, has finished. The
    engine's close is wrapped on its class, once, before any spider opens, so
    that callers holding the method already (Scrapy 2.13's CloseSpider keeps
    ``engine.close_spider`` for its timeout) reach the wrapper too; engines
    of crawls without the middleware are not affected.
    """
    from scrapy.core.engine import ExecutionEngine

    for name in ("close_spider_async", "close_spider"):
        original = getattr(ExecutionEngine, name, None)
        if original is None or original in _ENGINE_WRAPPERS:
            continue

        def closing(engine: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
            begin_closing = CLOSING.get(engine.crawler)
            if begin_closing is not None:
                begin_closing()
            return __original(engine, *args, **kwargs)

        functools.update_wrapper(closing, original)
        _ENGINE_WRAPPERS.add(closing)
        setattr(ExecutionEngine, name, closing)

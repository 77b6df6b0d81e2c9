"""Crawl two local hosts with httpx, paced per host by autothrottle.

Run it with ``python examples/httpx_example.py`` (needs ``autothrottle[httpx]``
and nothing else: the two hosts are the standard library's ``http.server``, in
threads). It starts a fast server on 127.0.0.2 (~20 ms per answer) and a slow
one on 127.0.0.3 (~120 ms), fetches 20 pages through
:class:`autothrottle.httpx.AsyncThrottledTransport`, and prints every slot's
state. Each host gets its own slot: the slow host's delay settles higher than
the fast one's, and neither holds the other back.

On macOS, 127.0.0.2 and 127.0.0.3 need aliases first:
``sudo ifconfig lo0 alias 127.0.0.2 && sudo ifconfig lo0 alias 127.0.0.3``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from autothrottle import AutoThrottlePolicy, Throttle
from autothrottle.httpx import AsyncThrottledTransport

HOSTS = {"127.0.0.2": 0.02, "127.0.0.3": 0.12}  # address -> seconds per answer


def _handler(latency: float) -> type[BaseHTTPRequestHandler]:
    class Page(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real site

        def do_GET(self) -> None:
            time.sleep(latency)
            body = f"page {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

    return Page


@contextmanager
def demo_servers() -> Iterator[list[str]]:
    """Start one threaded server per address; yield their origins."""
    servers = [ThreadingHTTPServer((address, 0), _handler(t)) for address, t in HOSTS.items()]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield [f"http://{a}:{s.server_port}" for a, s in zip(HOSTS, servers, strict=True)]
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


async def main() -> None:
    # debug=True logs one line per adjusted response on the "autothrottle" logger.
    logging.basicConfig(stream=sys.stdout, format="%(relativeCreated)6.0fms %(name)s: %(message)s")
    logging.getLogger("autothrottle").setLevel(logging.DEBUG)
    # Scrapy's rules, to show each host's delay following its latency
    # (Throttle() alone finds each host's pace without a target).
    throttle = Throttle(
        policy=AutoThrottlePolicy(),
        start_delay=0.3,
        max_delay=3.0,
        target_concurrency=2.0,
        debug=True,
    )

    with demo_servers() as origins:
        urls = [f"{origin}/page/{n}" for origin in origins for n in range(10)]
        transport = AsyncThrottledTransport(throttle=throttle)
        started = time.monotonic()
        async with httpx.AsyncClient(transport=transport) as client:
            # All 20 at once: the throttle spaces them per host.
            responses = await asyncio.gather(*(client.get(url) for url in urls))
            # Per-request control: a health check that is neither delayed nor counted.
            await client.get(urls[0], headers={"X-AutoThrottle": "bypass"})
        elapsed = time.monotonic() - started

    print(f"\nfetched {len(responses)} pages in {elapsed:.1f}s")
    print(f"statuses: {sorted({r.status_code for r in responses})}")
    for key, slot in throttle.snapshot().items():
        latency = f"{slot.last_latency * 1000:.0f}ms" if slot.last_latency is not None else "-"
        print(
            f"slot {key}: delay={slot.delay * 1000:.0f}ms in_flight={slot.in_flight} "
            f"sent={slot.sent} responses={slot.responses} failures={slot.failures} "
            f"last_latency={latency} statuses={dict(slot.status_counts)}"
        )


if __name__ == "__main__":
    asyncio.run(main())

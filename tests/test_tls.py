"""Every adapter over HTTPS: the handshake is neither latency nor a share of the gap.

A loopback aiohttp.web server over TLS (``tls.py``) sits behind a front that
holds each new connection as long as the test says, so the client's TLS
handshake ends that much later. The contract (``docs/adapters.md``): latency
runs from the connection being ready (after DNS, TCP and TLS) to the response
headers; the turn is taken on the wire, when the connection is ready, so a
slow handshake neither shortens nor lengthens the gap the host sees; a
certificate the client refuses is the host's failure under every adapter.
Timing bounds are generous.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import httpx
import pytest
import requests

from autothrottle import Throttle
from autothrottle.aiohttp import ThrottledSession as AiohttpSession
from autothrottle.httpx import AsyncThrottledClient, ThrottledClient
from autothrottle.requests import ThrottledSession as RequestsSession
from helpers import fixed

tls = pytest.importorskip("tls")  # trustme

KINDS = ["httpx", "httpx-sync", "aiohttp", "requests"]


@pytest.fixture(scope="module")
def host() -> Any:
    with tls.tls_host("h1", "127.0.0.2") as served:
        yield served


def in_threads(get: Callable[[str], Any], urls: list[str]) -> list[Any]:
    def one(url: str) -> Any:
        try:
            return get(url)
        except Exception as error:
            return error

    with ThreadPoolExecutor(len(urls)) as pool:
        return list(pool.map(one, urls))


async def fetch(kind: str, throttle: Throttle, urls: list[str], *, trust: bool = True) -> list[Any]:
    """Each of ``urls`` at once through ``kind``: its status, or the error it raised."""
    answers: Sequence[object]
    if kind == "httpx":
        verify: Any = tls.trusting() if trust else True
        async with AsyncThrottledClient(throttle=throttle, verify=verify) as client:
            answers = await asyncio.gather(*map(client.get, urls), return_exceptions=True)
    elif kind == "httpx-sync":
        verify = tls.trusting() if trust else True
        with ThrottledClient(throttle=throttle, verify=verify) as sync_client:
            answers = await asyncio.to_thread(in_threads, sync_client.get, urls)
    elif kind == "aiohttp":
        ssl = tls.trusting() if trust else True
        async with AiohttpSession(throttle=throttle) as session:

            async def get(url: str) -> int:
                async with session.get(url, ssl=ssl) as response:
                    await response.read()
                    return response.status

            answers = await asyncio.gather(*map(get, urls), return_exceptions=True)
    else:
        with RequestsSession(throttle=throttle) as requests_session:
            ca = tls.CA_FILE if trust else True
            answers = await asyncio.to_thread(
                in_threads, lambda url: requests_session.get(url, verify=ca), urls
            )
    return [getattr(answer, "status_code", answer) for answer in answers]


def assert_idle(throttle: Throttle, key: str) -> None:
    slot = throttle.slot(key)
    assert (slot.in_flight, slot.queued) == (0, 0)


@pytest.mark.parametrize("kind", KINDS)
async def test_latency_excludes_a_slow_handshake(host: Any, kind: str) -> None:
    throttle = Throttle(start_delay=0.0)
    host.forget()
    host.hold(300)  # the handshake ends 300 ms after the connect; the server takes 20 ms
    assert await fetch(kind, throttle, [host.url("/delay/20")]) == [200]
    assert host.connections == 1
    latency = throttle.slot(host.address).last_latency
    assert latency is not None and 0.019 <= latency < 0.2, latency
    assert_idle(throttle, host.address)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_slow_handshake_neither_shortens_nor_lengthens_the_gap(
    host: Any, kind: str
) -> None:
    # Two requests, each on a new connection: the first connection's handshake
    # takes 400 ms, the second's none. Paced at the grant only, the second
    # would reach the host first and the first 150 ms after it; the wire turn
    # keeps the delay between them, and no handshake is added to it.
    throttle = fixed(0.25)
    host.forget()
    host.hold(400, 0)
    assert await fetch(kind, throttle, [host.url("/a"), host.url("/b")]) == [200, 200]
    assert host.connections == 2
    first, second = sorted(host.arrival_times())
    assert 0.22 <= second - first < 0.5, second - first
    assert_idle(throttle, host.address)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_refused_certificate_is_the_hosts_failure_and_holds_nothing(
    host: Any, kind: str
) -> None:
    # The client does not trust the server's authority: the handshake fails.
    # Every adapter counts it as the host's failure (as a refused connection),
    # releases the slot, and the next request goes at once.
    throttle = Throttle(start_delay=0.0)
    host.forget()
    (error,) = await fetch(kind, throttle, [host.url("/untrusted")], trust=False)
    assert isinstance(error, Exception)
    assert "CERTIFICATE_VERIFY_FAILED" in repr(error) or "certificate verify" in repr(error)
    # httpcore 1.0.0 (the oldest allowed) hands the ssl module's own error on:
    # an OSError, which is the host's failure as well.
    assert isinstance(
        error,
        httpx.ConnectError | aiohttp.ClientSSLError | requests.exceptions.SSLError | ssl.SSLError,
    )
    slot = throttle.slot(host.address).snapshot()
    assert (slot.sent, slot.responses, slot.failures) == (1, 0, 1)
    assert_idle(throttle, host.address)
    assert await fetch(kind, throttle, [host.url("/trusted")]) == [200]
    assert [a["path"] for a in host.arrivals] == ["/trusted"]
    assert_idle(throttle, host.address)

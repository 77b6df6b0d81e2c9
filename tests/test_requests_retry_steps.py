"""The steps of urllib3's ``urlopen`` where the adapter reads an error urllib3 retries.

An error is read, and its attempt's turn let go, as it leaves the step that
raised it, before urllib3 sleeps its backoff (``_requests_parts._RetryTurns``).
Where urllib3 has no such step (a release that renamed it), the error is read
when urllib3 calls ``urlopen`` again, as before: later, never twice.

urllib3 opens the tunnel (CONNECT, then the TLS handshake through it) in its
pool's ``_prepare_proxy``, before ``_make_request``: a proxy that is down, one
that refuses the CONNECT, and a tunnel whose far end does not speak TLS all
fail there. The attempt's turn must be let go before urllib3 sleeps its
backoff, as for an error ``_make_request`` raises (test_requests_retry.py):
another thread's request to the same host goes during the backoff, under a cap
of 1. A direct HTTPS request to a host that does not speak TLS fails in
``_make_request`` (its handshake), the same way. The proxy is an
``http.server`` on a loopback address in a thread; the other thread's request
goes to test_requests_retry.py's scripted host, direct.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from typing import Any

import pytest
import requests
import urllib3
from urllib3.util.retry import Retry

from autothrottle import _requests_parts
from test_requests_retry import (
    ADDRESS,
    LettingOneGo,
    ScriptedHost,
    closed_port,
    counts,
    fixed,
    host,
    noting_backoffs,
    session_with,
)

__all__ = ["host"]

PROXY_ADDRESS = "127.0.0.34"


class Proxy:
    """An HTTP proxy that answers every CONNECT with ``status`` (200: the tunnel
    is "open", then closed at once, so the TLS handshake through it fails)."""

    def __init__(self, status: int) -> None:
        self.connects = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_CONNECT(self) -> None:
                proxy.connects += 1
                self.send_response(status)
                if status != 200:
                    self.send_header("Content-Length", "0")
                self.end_headers()
                self.close_connection = True

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((PROXY_ADDRESS, 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{PROXY_ADDRESS}:{self.server.server_address[1]}"


ROUTES = {"proxy-down": None, "connect-refused": 403, "not-tls": 200, "tls-direct": None}
"""The failing request's way: through a proxy that is down, one that answers
its CONNECT with that status, or straight to a host that does not speak TLS
(its handshake fails in ``_make_request``, the step after the tunnel's)."""


@pytest.fixture
def proxy(request: pytest.FixtureRequest) -> Iterator[Proxy | None]:
    """The proxy the failing request goes through; None: none, or one that is down."""
    status: int | None = ROUTES[request.param]
    if status is None:
        yield None
        return
    started = Proxy(status)
    started.thread.start()
    try:
        yield started
    finally:
        started.server.shutdown()
        started.server.server_close()


@pytest.mark.parametrize(
    ("route", "proxy"), [(route, route) for route in ROUTES], indirect=["proxy"], ids=list(ROUTES)
)
def test_a_failed_tunnel_lets_its_turn_go_before_urllib3_backs_off(
    host: ScriptedHost, route: str, proxy: Proxy | None
) -> None:
    throttle = fixed(0.0, max_concurrency=1)
    retries = LettingOneGo(total=2, backoff_factor=0.05)
    proxy_url = (
        f"http://{PROXY_ADDRESS}:{closed_port(PROXY_ADDRESS)}" if proxy is None else proxy.url
    )
    proxies = {} if route == "tls-direct" else {"https": proxy_url}
    failing = host.url("/tunnelled").replace("http://", "https://")  # the same host, its slot
    with session_with(throttle, retries) as session, ThreadPoolExecutor(1) as other:
        session.mount("https://", session.get_adapter("http://"))
        during_backoffs = noting_backoffs(session, other, host.url("/during"), throttle)
        with pytest.raises(requests.ConnectionError):
            session.get(failing, proxies=proxies, verify=False)
    assert during_backoffs == [(1, 200), (2, 200)]
    assert len(host.times("/during")) == 2
    assert host.times("/tunnelled") == []  # no request reached the host: no TLS, no tunnel
    if proxy is not None:
        assert proxy.connects == 3
    assert counts(throttle) == {
        "sent": 5,
        "responses": 2,
        "failures": 3,
        "backoffs": 3,
        "pauses": 0,
        "in_flight": 0,
        "queued": 0,
    }


class Noting(Retry):
    """A ``Retry`` that notes, at each error's backoff, the failures the slot has
    heard and what it holds (urllib3 makes each new ``Retry`` of the same class)."""

    throttle: Any
    noted: list[tuple[int, int]]

    def sleep(self, response: Any = None) -> None:
        if response is None:
            got = counts(Noting.throttle, ADDRESS)
            Noting.noted.append((got["failures"], got["in_flight"]))
        super().sleep(response)


@pytest.mark.parametrize("steps", ["hooked", "unhooked"])
def test_without_urllib3s_steps_an_error_is_read_at_the_next_attempt_once(
    monkeypatch: pytest.MonkeyPatch, steps: str
) -> None:
    """Unhooked (as a urllib3 whose ``urlopen`` has no ``_make_request`` or
    ``_prepare_proxy`` step would leave it), the refused attempt holds its turn
    through urllib3's backoff and is read when urllib3 tries again, from the
    ``Retry``'s history: slower for the slot's other requests, the same counts."""
    if steps == "unhooked":
        monkeypatch.delattr(_requests_parts._RetryTurns, "_make_request")
        monkeypatch.delattr(_requests_parts._RetryTurns, "_prepare_proxy")
    throttle = fixed(0.0, max_concurrency=1)
    Noting.throttle = throttle
    Noting.noted = []
    session = session_with(throttle, Noting(connect=2, backoff_factor=0))
    with session, pytest.raises(requests.ConnectionError):
        session.get(f"http://{ADDRESS}:{closed_port(ADDRESS)}/")
    assert Noting.noted == ([(1, 0), (2, 0)] if steps == "hooked" else [(0, 1), (1, 1)])
    got = counts(throttle, ADDRESS)
    assert (got["sent"], got["failures"], got["backoffs"]) == (3, 3, 3)
    assert (got["in_flight"], got["queued"]) == (0, 0)


def test_urllib3s_steps_the_retry_hooks_are_built_on() -> None:
    # Named so that a release without one shows here (a skip that says so):
    # the adapter then takes the slower path above.
    found = {
        "HTTPConnectionPool._make_request": urllib3.HTTPConnectionPool,
        "HTTPSConnectionPool._prepare_proxy": urllib3.HTTPSConnectionPool,
    }
    missing = [name for name, pool in found.items() if not hasattr(pool, name.split(".")[1])]
    if missing:
        pytest.skip(f"urllib3 {metadata.version('urllib3')} lacks {missing}: the slower path")

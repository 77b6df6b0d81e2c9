"""urllib3's ``Retry`` under the requests adapter: each attempt paced and heard.

``ThrottledHTTPAdapter(max_retries=Retry(...))``: every attempt urllib3 makes
waits for a turn of the slot of its own (the pace, the cap, FIFO with other
threads), and every attempt it retries reaches the throttle as any response
or failure does, while urllib3 still decides what to retry, how long to sleep
and what to raise. The server is an ``http.server`` on a loopback address in
a thread, answering each path from a script (a 429, then a 200), so that what
the host saw is asserted at the host.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis
import requests
from urllib3.util.retry import Retry

from autothrottle import FixedDelayPolicy, Throttle
from autothrottle.redis import RedisStore
from autothrottle.requests import ThrottledHTTPAdapter, ThrottleWaitTimeout, throttle_info
from helpers import needs_redis
from redis_keys import fresh_prefix

ADDRESS = "127.0.0.31"
REDIS = "redis://127.0.0.1:6379/0"

ARRIVAL_JITTER = 0.015
"""How early an arrival may be stamped and still count as kept apart (as in
test_requests_adapter.py)."""

Answer = tuple[int, dict[str, str], float]
"""A status, its headers, and how long the server takes to send it."""

DROP = 0
"""The status of an answer that closes the connection without a byte."""


class ScriptedHost:
    """An ``http.server`` answering each path from its script, in order (the last
    answer repeats), noting when each request arrived and how many it served
    at once."""

    def __init__(self) -> None:
        self.scripts: dict[str, list[Answer]] = {}
        self.arrivals: list[tuple[str, float]] = []
        self.in_service = 0
        self.max_in_service = 0
        self._lock = threading.Lock()
        host = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                status, headers, delay = host._arrived(self.path)
                try:
                    time.sleep(delay)
                    if status == DROP:
                        self.close_connection = True  # nothing written: dropped
                        return
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                finally:
                    with host._lock:
                        host.in_service -= 1

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((ADDRESS, 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _arrived(self, path: str) -> Answer:
        with self._lock:
            self.arrivals.append((path, time.monotonic()))
            self.in_service += 1
            self.max_in_service = max(self.max_in_service, self.in_service)
            script = self.scripts.get(path, [(200, {}, 0.0)])
            return script.pop(0) if len(script) > 1 else script[0]

    def url(self, path: str) -> str:
        return f"http://{ADDRESS}:{self.server.server_address[1]}{path}"

    def times(self, path: str | None = None) -> list[float]:
        return [at for seen, at in self.arrivals if path is None or seen == path]


@pytest.fixture
def host() -> Iterator[ScriptedHost]:
    started = ScriptedHost()
    started.thread.start()
    try:
        yield started
    finally:
        started.server.shutdown()
        started.server.server_close()


def fixed(delay: float, **kwargs: Any) -> Throttle:
    return Throttle(policy=FixedDelayPolicy(delay), **kwargs)


def session_with(throttle: Throttle, retries: Retry, **kwargs: Any) -> requests.Session:
    session = requests.Session()
    adapter = ThrottledHTTPAdapter(throttle=throttle, max_retries=retries, **kwargs)
    session.mount("http://", adapter)
    return session


def counts(throttle: Throttle, key: str = ADDRESS) -> dict[str, int]:
    snapshot = throttle.slot(key).snapshot()
    return {
        "sent": snapshot.sent,
        "responses": snapshot.responses,
        "failures": snapshot.failures,
        "backoffs": snapshot.backoffs,
        "pauses": snapshot.pauses,
        "in_flight": snapshot.in_flight,
        "queued": snapshot.queued,
    }


def test_a_retried_429_is_heard_and_its_retry_waits_for_retry_after(host: ScriptedHost) -> None:
    host.scripts["/a"] = [(429, {"Retry-After": "1"}, 0.0), (200, {}, 0.0)]
    throttle = fixed(0.0)
    retries = Retry(total=3, status_forcelist=[429], respect_retry_after_header=True)
    with session_with(throttle, retries) as session:
        response = session.get(host.url("/a"))
    assert response.status_code == 200
    first, second = host.times("/a")
    assert second - first >= 1.0 - ARRIVAL_JITTER
    assert counts(throttle) == {
        "sent": 2,
        "responses": 2,
        "failures": 0,
        "backoffs": 1,
        "pauses": 1,
        "in_flight": 0,
        "queued": 0,
    }


def test_each_retry_waits_for_the_slots_pace(host: ScriptedHost) -> None:
    # urllib3 retries a 503 at once here (no backoff, no Retry-After): the
    # spacing the host sees is the slot's.
    host.scripts["/a"] = [(503, {}, 0.0), (503, {}, 0.0), (200, {}, 0.0)]
    throttle = fixed(0.3)
    retries = Retry(total=3, status_forcelist=[503], backoff_factor=0)
    with session_with(throttle, retries) as session:
        response = session.get(host.url("/a"))
    assert response.status_code == 200
    times = host.times("/a")
    assert len(times) == 3
    assert min(b - a for a, b in itertools.pairwise(times)) >= 0.3 - ARRIVAL_JITTER
    assert counts(throttle)["sent"] == counts(throttle)["responses"] == 3
    info = throttle_info(response)
    assert info is not None
    assert info.waited >= 0.3 - ARRIVAL_JITTER  # the last attempt's wait for its turn


def closed_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def test_a_refused_connection_retried_is_the_hosts_failure_each_time() -> None:
    address = "127.0.0.32"
    throttle = fixed(0.2)
    retries = Retry(total=2, connect=2, backoff_factor=0)
    url = f"http://{address}:{closed_port(address)}/"
    started = time.monotonic()
    with session_with(throttle, retries) as session, pytest.raises(requests.ConnectionError):
        session.get(url)
    assert time.monotonic() - started >= 0.4 - ARRIVAL_JITTER  # two gaps of the slot's pace
    assert counts(throttle, address) == {
        "sent": 3,
        "responses": 0,
        "failures": 3,
        "backoffs": 3,
        "pauses": 0,
        "in_flight": 0,
        "queued": 0,
    }


class LettingOneGo(Retry):
    """A ``Retry`` whose backoff before retrying an error first sends another
    thread's request to the same host (:attr:`during`), and waits for its
    answer (at most :data:`WAIT_FOR_THE_OTHER` seconds), then sleeps as urllib3's
    own (urllib3 makes each new ``Retry`` of the same class)."""

    during: Any

    def sleep(self, response: Any = None) -> None:
        if response is None:  # an error's backoff
            LettingOneGo.during()
        super().sleep(response)


WAIT_FOR_THE_OTHER = 10.0
"""Seconds a backoff waits for the other thread's answer: reached only when the
retried request holds its turn (the cap of 1) through the backoff."""


def noting_backoffs(
    session: requests.Session, other: ThreadPoolExecutor, url: str, throttle: Throttle
) -> list[tuple[int, int | None]]:
    """Make each backoff of :class:`LettingOneGo` send ``url`` from ``other`` first;
    the list it returns gets, at each, the failures the slot had heard and that
    request's status (None: not answered within :data:`WAIT_FOR_THE_OTHER`)."""
    noted: list[tuple[int, int | None]] = []

    def during() -> None:
        answer = other.submit(session.get, url)
        try:
            status: int | None = answer.result(timeout=WAIT_FOR_THE_OTHER).status_code
        except TimeoutError:
            status = None
        noted.append((counts(throttle)["failures"], status))

    LettingOneGo.during = during
    return noted


@pytest.mark.parametrize("error", ["refused", "dropped"])
def test_a_retried_error_lets_its_turn_go_before_urllib3_backs_off(
    host: ScriptedHost, error: str
) -> None:
    """A connection refused, or dropped once the request was written, that
    urllib3 retries after a backoff: the failure is read and its turn let go
    before urllib3 sleeps, so another thread's request to the host goes
    during the backoff (under a cap of 1), and the slot has heard each
    failure by then."""
    throttle = fixed(0.0, max_concurrency=1)
    if error == "refused":
        retries = LettingOneGo(connect=2, backoff_factor=0.05)
        failing = f"http://{ADDRESS}:{closed_port(ADDRESS)}/"
    else:
        retries = LettingOneGo(total=2, backoff_factor=0.05)
        host.scripts["/dropped"] = [(DROP, {}, 0.0)]
        failing = host.url("/dropped")
    with session_with(throttle, retries) as session, ThreadPoolExecutor(1) as other:
        during_backoffs = noting_backoffs(session, other, host.url("/during"), throttle)
        with pytest.raises(requests.ConnectionError):
            session.get(failing)
    assert during_backoffs == [(1, 200), (2, 200)]
    assert len(host.times("/during")) == 2
    assert len(host.times("/dropped")) == (3 if error == "dropped" else 0)
    assert counts(throttle) == {
        "sent": 5,
        "responses": 2,
        "failures": 3,
        "backoffs": 3,
        "pauses": 0,
        "in_flight": 0,
        "queued": 0,
    }


def test_retries_run_out_each_attempt_counted_once_and_nothing_held(host: ScriptedHost) -> None:
    host.scripts["/a"] = [(503, {}, 0.0)]
    throttle = fixed(0.0)
    retries = Retry(total=2, status_forcelist=[503], backoff_factor=0)
    with session_with(throttle, retries) as session, pytest.raises(requests.exceptions.RetryError):
        session.get(host.url("/a"))
    assert len(host.times("/a")) == 3
    got = counts(throttle)
    assert (got["sent"], got["responses"], got["failures"]) == (3, 3, 0)
    assert (got["in_flight"], got["queued"]) == (0, 0)


def test_retries_run_out_without_raising_return_the_last_response(host: ScriptedHost) -> None:
    host.scripts["/a"] = [(503, {}, 0.0)]
    throttle = fixed(0.0)
    retries = Retry(total=1, status_forcelist=[503], backoff_factor=0, raise_on_status=False)
    with session_with(throttle, retries) as session:
        response = session.get(host.url("/a"))
    assert response.status_code == 503
    got = counts(throttle)
    assert (got["sent"], got["responses"], got["failures"]) == (2, 2, 0)
    assert (got["in_flight"], got["queued"]) == (0, 0)


def test_a_retrys_turn_keeps_to_max_wait(host: ScriptedHost) -> None:
    # urllib3 would retry at once (it ignores Retry-After here); the slot heard
    # it, and the retry's turn would come 5 s on: past max_wait, it is given up.
    host.scripts["/a"] = [(429, {"Retry-After": "5"}, 0.0), (200, {}, 0.0)]
    throttle = fixed(0.0)
    retries = Retry(total=3, status_forcelist=[429], respect_retry_after_header=False)
    with session_with(throttle, retries) as session, pytest.raises(ThrottleWaitTimeout):
        session.get(host.url("/a"), headers={"X-AutoThrottle": "max-wait=0.3"})
    assert len(host.times("/a")) == 1
    got = counts(throttle)
    assert (got["sent"], got["responses"], got["failures"]) == (1, 1, 0)
    assert (got["in_flight"], got["queued"]) == (0, 0)


def test_sixteen_threads_with_retries_keep_the_pace_and_the_cap(host: ScriptedHost) -> None:
    # Every request is answered 503 once, then 200: 32 attempts, each on a turn
    # of its own, never more than two at the host, the slot's spacing between
    # any two (half of it at least: see test_requests_adapter.py's first test).
    # A 503 backs nothing off here, or sixteen of them would stretch the delay
    # for minutes.
    for n in range(16):
        host.scripts[f"/{n}"] = [(503, {}, 0.02), (200, {}, 0.02)]
    throttle = fixed(0.1, max_concurrency=2, backoff_statuses=())
    retries = Retry(total=2, status_forcelist=[503], backoff_factor=0)
    urls = [host.url(f"/{n}") for n in range(16)]
    session = session_with(throttle, retries, pool_maxsize=16)
    with session, ThreadPoolExecutor(16) as pool:
        statuses = [r.status_code for r in pool.map(session.get, urls)]
    assert statuses == [200] * 16
    times = sorted(host.times())
    assert len(times) == 32
    assert min(b - a for a, b in itertools.pairwise(times)) >= 0.05
    assert host.max_in_service <= 2
    got = counts(throttle)
    assert (got["sent"], got["responses"], got["in_flight"], got["queued"]) == (32, 32, 0, 0)


def test_the_default_retries_take_one_turn(host: ScriptedHost) -> None:
    # requests' default (no retries): the pools are the plain ones.
    throttle = fixed(0.0)
    session = requests.Session()
    adapter = ThrottledHTTPAdapter(throttle=throttle)
    session.mount("http://", adapter)
    with session:
        assert session.get(host.url("/a")).status_code == 200
        pool = adapter.poolmanager.connection_from_url(host.url("/a"))
        assert "Retry" not in type(pool).__name__
    assert counts(throttle)["sent"] == 1


def test_retries_set_after_the_adapter_was_made_take_a_turn_each(host: ScriptedHost) -> None:
    host.scripts["/a"] = [(503, {}, 0.0), (200, {}, 0.0)]
    throttle = fixed(0.0)
    session = requests.Session()
    adapter = ThrottledHTTPAdapter(throttle=throttle)
    session.mount("http://", adapter)
    with session:
        assert session.get(host.url("/warm")).status_code == 200  # a pool made first
        adapter.max_retries = Retry(total=2, status_forcelist=[503], backoff_factor=0)
        assert session.get(host.url("/a")).status_code == 200
    got = counts(throttle)
    assert (got["sent"], got["responses"], got["in_flight"]) == (3, 3, 0)


class Interrupted(BaseException):
    """An interrupt (as ``KeyboardInterrupt``), raised where urllib3 sleeps."""


class InterruptedRetry(Retry):
    """A ``Retry`` whose sleep before a retry is interrupted (urllib3 makes each
    new ``Retry`` of the same class)."""

    def sleep(self, response: Any = None) -> None:
        raise Interrupted


def test_an_interrupt_while_urllib3_sleeps_after_a_response_holds_nothing(
    host: ScriptedHost,
) -> None:
    host.scripts["/a"] = [(503, {}, 0.0), (200, {}, 0.0)]
    throttle = fixed(0.0)
    retries = InterruptedRetry(total=2, status_forcelist=[503], backoff_factor=0)
    with session_with(throttle, retries) as session, pytest.raises(Interrupted):
        session.get(host.url("/a"))
    got = counts(throttle)
    assert (got["sent"], got["responses"], got["failures"]) == (1, 1, 0)
    assert (got["in_flight"], got["queued"]) == (0, 0)


def test_an_interrupt_while_urllib3_sleeps_after_an_error_holds_nothing() -> None:
    # The refused attempt is read as it raised, before urllib3 sleeps: the
    # interrupt there finds it counted once and let go, nothing held.
    address = "127.0.0.32"
    throttle = fixed(0.0)
    retries = InterruptedRetry(total=2, connect=2, backoff_factor=0)
    url = f"http://{address}:{closed_port(address)}/"
    with session_with(throttle, retries) as session, pytest.raises(Interrupted):
        session.get(url)
    got = counts(throttle, address)
    assert (got["sent"], got["failures"], got["in_flight"], got["queued"]) == (1, 1, 0, 0)


def test_in_a_fleet_each_attempt_takes_and_gives_back_its_turn(host: ScriptedHost) -> None:
    needs_redis()
    prefix = fresh_prefix("retry-c")
    leases = f"{{{prefix}:{ADDRESS}}}:l"
    store = RedisStore(REDIS, prefix=prefix, timeout=5.0)
    admin = redis.Redis.from_url(REDIS)
    host.scripts["/a"] = [(503, {}, 0.0), (200, {}, 0.0)]
    throttle = Throttle(policy=FixedDelayPolicy(0.2), store=store)
    retries = Retry(total=2, status_forcelist=[503], backoff_factor=0)
    try:
        with session_with(throttle, retries) as session:
            assert session.get(host.url("/a")).status_code == 200
        store.flush_blocking()
        first, second = host.times("/a")
        assert second - first >= 0.2 - ARRIVAL_JITTER
        got = counts(throttle)
        assert (got["sent"], got["responses"], got["in_flight"]) == (2, 2, 0)
        assert admin.zcard(leases) == 0
    finally:
        store.close()  # the prefix's keys are deleted after the test (redis_keys)
        admin.close()


class ClosingRetry(Retry):
    """A ``Retry`` that closes the session while urllib3 sleeps before a retry."""

    session: requests.Session

    def sleep(self, response: Any = None) -> None:
        ClosingRetry.session.close()


@pytest.mark.parametrize("pool_block", [False, True])
@pytest.mark.parametrize("after", ["response", "error"])
def test_the_session_closed_while_urllib3_sleeps_lets_the_retries_go_on_each_counted_once(
    host: ScriptedHost, after: str, pool_block: bool
) -> None:
    """urllib3 goes on retrying on the pool the session closed (a new connection
    each time, as requests goes on after ``Session.close()``): each attempt on
    its own turn, each read once, nothing held after."""
    host.scripts["/a"] = [(503, {}, 0.0), (200, {}, 0.0)]
    throttle = fixed(0.0)
    address = "127.0.0.33"
    session = session_with(
        throttle,
        ClosingRetry(total=2, status_forcelist=[503], backoff_factor=0)
        if after == "response"
        else ClosingRetry(total=2, connect=2, backoff_factor=0),
        pool_block=pool_block,
    )
    ClosingRetry.session = session
    with session:
        if after == "response":
            assert session.get(host.url("/a")).status_code == 200
            got = counts(throttle)
            assert len(host.times("/a")) == 2
            assert (got["sent"], got["responses"], got["failures"]) == (2, 2, 0)
        else:
            with pytest.raises(requests.ConnectionError):
                session.get(f"http://{address}:{closed_port(address)}/")
            got = counts(throttle, address)
            assert (got["sent"], got["responses"], got["failures"]) == (3, 0, 3)
    assert (got["in_flight"], got["queued"]) == (0, 0)


def test_a_streamed_request_whose_503_is_retried_holds_the_slot_for_the_last_only(
    host: ScriptedHost,
) -> None:
    """``stream=True``: urllib3 drains each response it retries (its turn let go
    then); the last, returned, holds the slot until its body is read."""
    host.scripts["/a"] = [(503, {}, 0.0), (503, {}, 0.0), (200, {}, 0.0)]
    throttle = fixed(0.0, max_concurrency=1)
    retries = Retry(total=3, status_forcelist=[503], backoff_factor=0)
    with session_with(throttle, retries) as session:
        response = session.get(host.url("/a"), stream=True)
        assert response.status_code == 200
        got = counts(throttle)
        assert (got["sent"], got["responses"], got["in_flight"]) == (3, 3, 1)
        assert response.content == b"ok"
        got = counts(throttle)
        assert (got["in_flight"], got["queued"]) == (0, 0)


def test_a_redirect_under_retry_is_a_send_of_its_own_each_on_its_turn(
    host: ScriptedHost,
) -> None:
    """requests follows redirects itself (``redirect=False`` to urllib3): a
    ``Retry`` with redirect counts retries nothing of a 302, and each hop
    takes a turn of its own, paced."""
    host.scripts["/a"] = [(302, {"Location": "/b"}, 0.0)]
    throttle = fixed(0.2)
    retries = Retry(total=3, redirect=2, status_forcelist=[503], backoff_factor=0)
    with session_with(throttle, retries) as session:
        response = session.get(host.url("/a"))
    assert response.status_code == 200
    assert [r.status_code for r in response.history] == [302]
    (a,), (b,) = host.times("/a"), host.times("/b")
    assert b - a >= 0.2 - ARRIVAL_JITTER
    got = counts(throttle)
    assert (got["sent"], got["responses"], got["in_flight"]) == (2, 2, 0)

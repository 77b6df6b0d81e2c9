"""The requests adapter against real loopback servers, from threads.

The servers run in a process of their own (``running_hosts``); the clients are
requests sessions used from a thread pool, as requests is used. Pacing is
asserted at the server's arrival log, latency on what the slot learned.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import redis
import requests
import urllib3

from autothrottle import (
    FixedDelayPolicy,
    FixedRatePolicy,
    Throttle,
    ThrottleEvent,
    ThrottleTimeout,
    _fleet,
)
from autothrottle._lease import Lease
from autothrottle._request import RequestOptions, header_value, options_from_header
from autothrottle._requests_parts import _Hold
from autothrottle.httpx import AsyncThrottledClient
from autothrottle.redis import RedisStore
from autothrottle.requests import (
    ThrottledHTTPAdapter,
    ThrottledSession,
    ThrottleWaitTimeout,
    throttle_info,
)
from helpers import needs_redis, wait_for
from loopback import LoopbackHost, promptly, running_hosts
from redis_keys import fresh_prefix

REDIS = "redis://127.0.0.1:6379/0"

ARRIVAL_JITTER = 0.015
"""How early an arrival may be stamped and still count as kept apart: one
request's way from its wire turn to the server's stamp may be longer than the
next one's (see test_lifecycle.py)."""


def fixed(delay: float, **kwargs: Any) -> Throttle:
    return Throttle(policy=FixedDelayPolicy(delay), **kwargs)


@pytest.fixture
def hosts() -> Iterator[list[LoopbackHost]]:
    """Two hosts, and the test's thread (with every thread it starts) ahead of
    the machine's ordinary processes while it uses them.

    Nearly every test here times something a busy machine stretches: gaps at
    a host (one request's write put off in the run queue arrives late, and
    the next gap reads short by as much), a latency under a bound, a request
    that must go at once. The pacing is what those verdicts are about, not
    how soon the operating system ran a thread; raised, it runs at once.
    """
    with running_hosts(2) as started, promptly():
        yield started


def assert_spaced(host: LoopbackHost, delay: float) -> None:
    gaps = host.gaps()
    assert gaps, "fewer than two arrivals"
    assert min(gaps) >= delay - ARRIVAL_JITTER, gaps


def in_flight(throttle: Throttle, host: LoopbackHost) -> int:
    return throttle.slot(host.address).snapshot().in_flight


# -- pacing, from threads ---------------------------------------------------------------


def test_eight_threads_keep_each_hosts_spacing_and_cap(hosts: list[LoopbackHost]) -> None:
    # Gaps of at least half the delay: a pause of the whole process (a full
    # collection in a worker that ran a thousand tests before this one) between
    # one thread's wire turn and its write sends it beside the next thread's,
    # which its own turn let go on time; the raised priority cannot help there.
    # Unpaced, the pairs the cap lets through arrive a few ms apart.
    throttle = fixed(0.1, max_concurrency=2)
    urls = [host.url("/delay/30") for host in hosts for _ in range(6)]
    with ThrottledSession(throttle=throttle) as session, ThreadPoolExecutor(8) as pool:
        statuses = [r.status_code for r in pool.map(session.get, urls)]
    assert statuses == [200] * 12
    for host in hosts:
        assert len(host.arrivals) == 6
        assert min(host.gaps()) >= 0.05, host.gaps()
        assert host.max_in_service <= 2
        assert in_flight(throttle, host) == 0


def test_a_slow_host_never_holds_up_a_fast_one(hosts: list[LoopbackHost]) -> None:
    slow, fast = hosts
    throttle = Throttle(hosts={slow.address: {"min_delay": 1.0}}, start_delay=0.0)
    with ThrottledSession(throttle=throttle) as session, ThreadPoolExecutor(4) as pool:
        slow_calls = [pool.submit(session.get, slow.url()) for _ in range(3)]
        started = time.monotonic()
        for _ in range(5):
            session.get(fast.url())
        fast_time = time.monotonic() - started
        for call in slow_calls:
            call.result()
    assert fast_time < 1.0  # the slow host's queue takes 2 s
    assert_spaced(slow, 1.0)


def test_threads_and_an_async_client_share_one_hosts_spacing(hosts: list[LoopbackHost]) -> None:
    host = hosts[0]
    throttle = fixed(0.04)

    async def async_side() -> None:
        async with AsyncThrottledClient(throttle=throttle) as client:
            await asyncio.gather(*(client.get(host.url("/async")) for _ in range(5)))

    with ThrottledSession(throttle=throttle) as session, ThreadPoolExecutor(4) as pool:
        threaded = [pool.submit(session.get, host.url("/thread")) for _ in range(5)]
        asyncio.run(async_side())
        for call in threaded:
            call.result()
    paths = {arrival.path for arrival in host.arrivals}
    assert paths == {"/async", "/thread"}
    assert len(host.arrivals) == 10
    assert_spaced(host, 0.04)


def test_a_mounted_adapter_on_a_plain_session_is_throttled(hosts: list[LoopbackHost]) -> None:
    host = hosts[0]
    throttle = fixed(0.05)
    session = requests.Session()
    adapter = ThrottledHTTPAdapter(throttle=throttle, pool_maxsize=4)
    session.mount(host.origin, adapter)
    with session, ThreadPoolExecutor(4) as pool:
        list(pool.map(session.get, [host.url()] * 4))
    assert_spaced(host, 0.05)
    assert throttle.slot(host.address).snapshot().responses == 4


# -- latency ------------------------------------------------------------------------


def latencies(throttle: Throttle) -> list[float]:
    seen: list[float] = []

    def listen(event: ThrottleEvent) -> None:
        if event.kind == "response" and event.latency is not None:
            seen.append(event.latency)

    throttle.listen(listen)
    return seen


def test_latency_excludes_the_wait_for_a_pooled_connection(hosts: list[LoopbackHost]) -> None:
    """One connection for four threads: each waits for it, but is timed from it."""
    host = hosts[0]
    throttle = fixed(0.0)
    seen = latencies(throttle)
    session = requests.Session()
    session.mount(
        host.origin, ThrottledHTTPAdapter(throttle=throttle, pool_maxsize=1, pool_block=True)
    )
    with session, ThreadPoolExecutor(4) as pool:
        list(pool.map(session.get, [host.url("/delay/150")] * 4))
    assert host.max_in_service == 1
    assert len(seen) == 4
    # Waiting for the connection took up to 450 ms; the latency is the server's.
    assert max(seen) < 0.3, seen
    assert min(seen) >= 0.15


def test_latency_excludes_the_wait_for_the_turn(hosts: list[LoopbackHost]) -> None:
    host = hosts[0]
    throttle = fixed(0.3)
    seen = latencies(throttle)
    with ThrottledSession(throttle=throttle) as session, ThreadPoolExecutor(3) as pool:
        list(pool.map(session.get, [host.url("/delay/50")] * 3))
    assert len(seen) == 3
    assert max(seen) < 0.25, seen  # the third waited 600 ms for its turn


# -- options and the control header ---------------------------------------------------


def test_the_control_header_never_reaches_the_server_and_survives_redirects(
    hosts: list[LoopbackHost],
) -> None:
    a, b = hosts
    throttle = fixed(0.0)
    with ThrottledSession(throttle=throttle) as session:
        response = session.get(
            a.url(f"/redirect?to={b.url('/landed')}"), autothrottle={"slot": "shared"}
        )
    assert response.status_code == 200
    for host in hosts:
        assert all("X-AutoThrottle" not in arrival.headers for arrival in host.arrivals)
    # Both hops went to the named slot; neither host got one of its own.
    assert throttle.slot("shared").snapshot().responses == 2
    assert {slot.key for slot in throttle.slots()} == {"shared"}


def test_redirect_hops_wait_on_their_own_hosts(hosts: list[LoopbackHost]) -> None:
    a, b = hosts
    throttle = fixed(0.0)
    with ThrottledSession(throttle=throttle) as session:
        session.get(a.url(f"/redirect?to={b.url('/landed')}"))
    assert throttle.slot(a.address).snapshot().status_counts == {302: 1}
    assert throttle.slot(b.address).snapshot().status_counts == {200: 1}


def test_bypass_is_neither_delayed_nor_counted(hosts: list[LoopbackHost]) -> None:
    host = hosts[0]
    throttle = fixed(5.0)
    with ThrottledSession(throttle=throttle) as session:
        session.get(host.url())
        started = time.monotonic()
        session.get(host.url(), autothrottle={"bypass": True})
        session.get(host.url(), headers={"X-AutoThrottle": "bypass"})
        assert time.monotonic() - started < 2.0
    assert throttle.slot(host.address).snapshot().sent == 1
    assert len(host.arrivals) == 3


def test_no_adjust_waits_its_turn_but_leaves_the_delay(hosts: list[LoopbackHost]) -> None:
    host = hosts[0]
    throttle = Throttle(start_delay=0.2)
    with ThrottledSession(throttle=throttle) as session:
        session.get(host.url("/delay/10"), autothrottle={"adjust": False})
        session.get(host.url("/delay/10"), autothrottle={"adjust": False})
    assert_spaced(host, 0.2)
    assert throttle.slot(host.address).delay == 0.2


def test_max_wait_fails_without_sending_or_holding(hosts: list[LoopbackHost]) -> None:
    host = hosts[0]
    throttle = fixed(10.0)
    with ThrottledSession(throttle=throttle) as session:
        session.get(host.url())
        with pytest.raises(ThrottleWaitTimeout) as caught:
            session.get(host.url(), autothrottle={"max_wait": 0.1})
        with pytest.raises(requests.Timeout):
            session.get(host.url(), headers={"X-AutoThrottle": "max-wait=0.1"})
    assert isinstance(caught.value, ThrottleTimeout)
    assert isinstance(caught.value, requests.RequestException)
    assert caught.value.slot == host.address
    assert len(host.arrivals) == 1
    snapshot = throttle.slot(host.address).snapshot()
    assert (snapshot.in_flight, snapshot.queued) == (0, 0)


def test_malformed_options_raise_before_anything_is_sent(hosts: list[LoopbackHost]) -> None:
    host = hosts[0]
    with ThrottledSession(throttle=fixed(0.0)) as session:
        with pytest.raises(ValueError, match="adjsut"):
            session.get(host.url(), autothrottle={"adjsut": False})
        with pytest.raises(ValueError, match="sideways"):
            session.get(host.url(), headers={"X-AutoThrottle": "sideways"})
    assert host.arrivals == []


def test_the_keyword_joins_a_control_header_given_by_position(hosts: list[LoopbackHost]) -> None:
    host = hosts[0]
    throttle = Throttle(start_delay=0.2)
    with ThrottledSession(throttle=throttle) as session:
        session.request(
            "GET",
            host.url(),
            None,
            None,
            {"x-autothrottle": "no-adjust"},
            autothrottle={"slot": "named"},
        )
    assert throttle.slot("named").snapshot().responses == 1
    assert throttle.slot("named").delay == 0.2  # no-adjust, from the header


@pytest.mark.parametrize(
    "options",
    [
        RequestOptions(),
        RequestOptions(adjust=False, bypass=True),
        RequestOptions(slot="api pool", max_wait=2.5),
        RequestOptions(max_wait=0.1),
    ],
)
def test_the_header_form_reads_back_as_the_options(options: RequestOptions) -> None:
    assert options_from_header(header_value(options)) == options


def test_a_slot_name_the_header_cannot_carry_is_refused() -> None:
    with pytest.raises(ValueError, match="comma"):
        header_value(RequestOptions(slot="a,b"))


# -- holding the slot until the body is finished --------------------------------------


def test_a_streamed_body_holds_the_slot_until_read(hosts: list[LoopbackHost]) -> None:
    host = hosts[0]
    throttle = fixed(0.0)
    with ThrottledSession(throttle=throttle) as session:
        response = session.get(host.url("/stream/3/20"), stream=True)
        assert in_flight(throttle, host) == 1
        assert response.content == b"x" * 48
        assert in_flight(throttle, host) == 0


def test_a_closed_stream_releases_the_slot(hosts: list[LoopbackHost]) -> None:
    host = hosts[0]
    # A slot still held would make the next request wait for the cap until
    # max_wait and fail (ThrottleWaitTimeout): the verdict is that error, not
    # a clock a busy machine can stretch.
    throttle = fixed(0.0, max_concurrency=1, max_wait=10.0)
    with ThrottledSession(throttle=throttle) as session:
        response = session.get(host.url("/stream/20/20"), stream=True)
        next(response.iter_content(16))
        response.close()
        assert in_flight(throttle, host) == 0
        assert session.get(host.url()).status_code == 200  # the cap of 1 lets it go


def test_a_response_dropped_unread_is_released_when_collected(hosts: list[LoopbackHost]) -> None:
    host = hosts[0]
    throttle = fixed(0.0, max_concurrency=1, max_wait=10.0)  # held: ThrottleWaitTimeout
    with ThrottledSession(throttle=throttle) as session:
        session.get(host.url("/stream/50/20"), stream=True)  # dropped at once
        gc.collect()
        wait_for(lambda: in_flight(throttle, host) == 0, within=2.0)
        assert session.get(host.url()).status_code == 200


EXIT_SCRIPT = """
import sys
from autothrottle import FixedDelayPolicy, Throttle
from autothrottle.requests import ThrottledSession

session = ThrottledSession(throttle=Throttle(policy=FixedDelayPolicy(0.0)))
response = session.get(sys.argv[1], stream=True)
cycle = [response]
cycle.append(cycle)  # once the module is cleared, only the cycle holds it
del response
"""


def test_a_stream_collected_at_interpreter_exit_lets_the_process_end(
    hosts: list[LoopbackHost], tmp_path: Path
) -> None:
    """The response is collected in the interpreter's final collection, where
    a release thread would be started that CPython 3.11 never lets run."""
    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), hosts[0].url("/stream/50/20")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_a_response_collected_while_the_interpreter_finalizes_starts_no_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Refused:
        def __init__(self, **kwargs: Any) -> None:
            raise AssertionError(f"a thread started: {kwargs}")

    lease = SimpleNamespace(released=False, releases=0)
    lease.release = lambda: setattr(lease, "releases", lease.releases + 1)
    hold = _Hold(cast("Lease", lease))
    hold.collected = True
    monkeypatch.setattr(threading, "Thread", Refused)
    monkeypatch.setattr(sys, "is_finalizing", lambda: True)
    hold.finish()
    assert lease.releases == 0  # left: the process is going away


def test_an_open_stream_in_one_thread_holds_the_cap_for_another(
    hosts: list[LoopbackHost],
) -> None:
    host = hosts[0]
    throttle = fixed(0.0, max_concurrency=1)
    with ThrottledSession(throttle=throttle) as session:
        response = session.get(host.url("/stream/3/10"), stream=True)
        second = threading.Thread(target=session.get, args=(host.url("/second"),))
        second.start()
        time.sleep(0.3)
        assert [a.path for a in host.arrivals] == ["/stream/3/10"]
        response.close()
        second.join(5)
    assert [a.path for a in host.arrivals] == ["/stream/3/10", "/second"]


def test_what_the_throttle_did_is_on_the_response(hosts: list[LoopbackHost]) -> None:
    host = hosts[0]
    throttle = fixed(0.2)
    with ThrottledSession(throttle=throttle) as session:
        session.get(host.url())
        response = session.get(host.url())
        untouched = session.get(host.url(), autothrottle={"bypass": True})
    info = throttle_info(response)
    assert info is not None
    assert info.slot == host.address
    assert info.waited >= 0.15
    assert throttle_info(untouched) is None


# -- statuses and failures ---------------------------------------------------------------


def test_a_429_with_retry_after_pauses_the_slot(hosts: list[LoopbackHost]) -> None:
    host = hosts[0]
    throttle = fixed(0.0)
    with ThrottledSession(throttle=throttle) as session:
        response = session.get(host.url("/status/429?h.Retry-After=1"))
        assert response.status_code == 429
        session.get(host.url("/after"))
    snapshot = throttle.slot(host.address).snapshot()
    assert snapshot.backoffs == 1
    assert snapshot.pauses == 1
    assert host.arrivals[1].time - host.arrivals[0].time >= 1.0 - ARRIVAL_JITTER


def closed_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def test_a_refused_connection_is_the_hosts_failure_and_releases() -> None:
    throttle = fixed(0.0)
    url = f"http://127.0.0.9:{closed_port('127.0.0.9')}/"
    with ThrottledSession(throttle=throttle) as session, pytest.raises(requests.ConnectionError):
        session.get(url)
    snapshot = throttle.slot("127.0.0.9").snapshot()
    assert (snapshot.failures, snapshot.backoffs, snapshot.in_flight) == (1, 1, 0)


def test_a_read_timeout_is_the_hosts_failure(hosts: list[LoopbackHost]) -> None:
    host = hosts[0]
    throttle = fixed(0.0)
    with ThrottledSession(throttle=throttle) as session, pytest.raises(requests.ReadTimeout):
        session.get(host.url("/delay/1000"), timeout=0.2)
    snapshot = throttle.slot(host.address).snapshot()
    assert (snapshot.failures, snapshot.in_flight) == (1, 0)


def test_an_invalid_header_is_the_callers_own(hosts: list[LoopbackHost]) -> None:
    host = hosts[0]
    throttle = fixed(0.0)
    with ThrottledSession(throttle=throttle) as session, pytest.raises(requests.RequestException):
        session.get(host.url(), headers={"X-Bad": "line\r\nbreak"})
    snapshot = throttle.slot(host.address).snapshot()
    assert (snapshot.failures, snapshot.backoffs, snapshot.in_flight) == (0, 0, 0)


# -- in a fleet -----------------------------------------------------------------------------

FLEET_GAP = 5.0
"""The fleet's gap (FixedRatePolicy(0.2)): a turn's time kept lies 5 s ahead in Redis."""


@pytest.mark.parametrize(
    ("interrupt", "scheme"),
    [(KeyboardInterrupt, "http"), (SystemExit, "http"), (KeyboardInterrupt, "https")],
)
def test_in_a_fleet_an_interrupt_while_connecting_gives_the_turn_back_with_its_time(
    interrupt: type[BaseException], scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted in its connect, before its wire turn, the request carried
    nothing to the host: its fleet turn goes back whole, as a refused
    connection's does (``docs/fleet.md``, "A request that never reached its
    host"); kept, the slot's next free time in Redis lay a gap ahead. urllib3
    connects a new HTTPS connection itself, before the request: the same hook."""
    needs_redis()
    # The turn goes at its due however late a loaded machine wakes it there.
    monkeypatch.setattr(_fleet, "LATE_TOLERANCE", 60.0)
    address = "127.0.0.2"
    prefix = fresh_prefix("at-b")
    state, leases = f"{{{prefix}:{address}}}:s", f"{{{prefix}:{address}}}:l"
    store = RedisStore(REDIS, prefix=prefix, timeout=5.0)
    admin = redis.Redis.from_url(REDIS)
    throttle = Throttle(policy=FixedRatePolicy(1 / FLEET_GAP), store=store)
    connects = 0

    def connecting(*args: object, **kwargs: object) -> socket.socket:
        nonlocal connects
        connects += 1
        raise interrupt

    monkeypatch.setattr(urllib3.util.connection, "create_connection", connecting)
    try:
        with ThrottledSession(throttle=throttle) as session, pytest.raises(interrupt):
            session.get(f"{scheme}://{address}:9/", timeout=10.0)
        store.flush_blocking()
        assert connects == 1
        assert admin.zcard(leases) == 0
        seconds, micros = admin.time()
        ahead = (float(admin.hget(state, "tat") or 0) - (seconds * 1e6 + micros)) / 1e6
        assert ahead < FLEET_GAP / 2, ahead
        assert throttle.slot(address).snapshot().failures == 0  # not the host's
    finally:
        store.close()
        admin.delete(state, leases)
        admin.close()


# -- construction -------------------------------------------------------------------------


def test_a_plain_adapter_mounted_on_a_throttled_session_warns() -> None:
    session = ThrottledSession(throttle=fixed(0.0))
    with pytest.warns(UserWarning, match="not throttled"):
        session.mount("https://api.example.com/", requests.adapters.HTTPAdapter())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        session.mount("https://other.example.com/", ThrottledHTTPAdapter(throttle=fixed(0.0)))


@pytest.mark.parametrize("make", [ThrottledSession, ThrottledHTTPAdapter])
def test_a_throttle_that_is_not_one_is_refused(make: Any) -> None:
    with pytest.raises(TypeError, match="throttle must be"):
        make(throttle="fast")

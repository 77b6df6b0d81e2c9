"""requests as users write it, with urllib3's ``Retry`` beside the throttle.

A plain ``requests.Session`` shared by eight threads, with a
``ThrottledHTTPAdapter`` mounted whose ``Retry`` retries 429 and 503 and
sleeps their ``Retry-After``, against a rate-limited ``autothrottle.sim``
host on loopback: the slot's counts are the host's (each attempt urllib3
makes counted once), and a retry that urllib3 held for its ``Retry-After``
is not held a second time for the throttle's pause of the same answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import requests
from urllib3.util.retry import Retry

from autothrottle import FixedDelayPolicy, Throttle
from autothrottle.requests import ThrottledHTTPAdapter, throttle_info
from autothrottle.sim import HostStats, RateLimited, SimServer
from test_requests_retry import ARRIVAL_JITTER, ScriptedHost, host

__all__ = ["host"]

SIM_ADDRESS = "127.0.0.35"


def users_retry() -> Retry:
    """The ``Retry`` a requests user mounts for a rate-limited API."""
    return Retry(
        total=3,
        backoff_factor=0.2,
        status_forcelist=[429, 503],
        respect_retry_after_header=True,
    )


class Sim:
    """``SimServer`` in a loop of its own thread; its ground truth read there."""

    def __init__(self, server: SimServer, loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.loop = loop

    def stats(self, host: str) -> HostStats:
        async def read() -> HostStats:
            return self.server.host_stats(host)

        return asyncio.run_coroutine_threadsafe(read(), self.loop).result(10)


@contextlib.contextmanager
def serving(server: SimServer) -> Iterator[Sim]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
    try:
        yield Sim(server, loop)
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def test_eight_threads_retrying_429s_count_each_attempt_once_as_the_host_saw_it() -> None:
    # A start four times faster than the host's bucket: it refuses at once, and
    # urllib3 retries each 429 after its Retry-After (no rate-limit headers: the
    # 429 and its Retry-After are all the slot hears). A request refused four
    # times raises RetryError (its retries ran out): counted all the same.
    behaviour = RateLimited(rate=5, burst=1, headers=False)
    with serving(SimServer({SIM_ADDRESS: behaviour}, seed=1)) as sim:
        throttle = Throttle(start_delay=0.05)
        session = requests.Session()
        session.mount("http://", ThrottledHTTPAdapter(throttle=throttle, max_retries=users_retry()))

        def get(n: int) -> int | str:
            try:
                return session.get(sim.server.url(SIM_ADDRESS, f"/page/{n}")).status_code
            except requests.RequestException as error:
                return type(error).__name__

        with session, ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(get, range(8)))
        truth = sim.stats(SIM_ADDRESS)
    assert truth.limited > 0  # urllib3 retried refusals
    assert set(outcomes) <= {200, "RetryError"}
    assert truth.ok == outcomes.count(200)
    slot = throttle.slot(SIM_ADDRESS).snapshot()
    assert slot.sent == slot.responses == truth.requests == truth.completed
    assert slot.status_counts == {200: truth.ok, 429: truth.limited}
    assert (slot.in_flight, slot.queued) == (0, 0)


def test_a_retry_urllib3_held_for_retry_after_does_not_wait_for_it_again(
    host: ScriptedHost,
) -> None:
    """urllib3 sleeps the 429's ``Retry-After`` (3 s) holding nothing, while the
    slot pauses for the same answer and doubles its 1-s delay: the retry then
    asks for its turn, which is due (the pause is over, and the slot's 2-s
    spacing ran during the sleep): the host sees it ``Retry-After`` after the
    429, not that plus a gap."""
    host.scripts["/a"] = [(429, {"Retry-After": "3"}, 0.0), (200, {}, 0.0)]
    throttle = Throttle(policy=FixedDelayPolicy(1.0))
    session = requests.Session()
    session.mount("http://", ThrottledHTTPAdapter(throttle=throttle, max_retries=users_retry()))
    with session:
        response = session.get(host.url("/a"))
    assert response.status_code == 200
    first, second = host.times("/a")
    assert second - first >= 3.0 - ARRIVAL_JITTER
    info = throttle_info(response)
    assert info is not None
    assert info.waited < 1.0  # the retry's own turn: a second wait would be 2 s

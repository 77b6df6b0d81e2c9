"""The aiohttp adapter and the session's connector: a request waiting a long
time for its wire turn does not hold one of the connector's connections.

Against real loopback servers; the wait is a ``Retry-After`` pause that
begins after the request was granted.
"""

from __future__ import annotations

import asyncio
import resource

import aiohttp
import pytest

from autothrottle import Throttle
from autothrottle.aiohttp import ThrottledSession
from helpers import wait_until
from loopback import loopback_hosts


async def test_a_long_wire_wait_hands_the_connection_back_to_the_connector() -> None:
    throttle = Throttle(start_delay=0.0)
    connector = aiohttp.TCPConnector(limit=1)  # one connection for every host
    async with (
        loopback_hosts(2) as (a, b),
        ThrottledSession(throttle=throttle, connector=connector) as session,
    ):

        async def get(url: str) -> int:
            async with session.get(url) as response:
                await response.read()
                return response.status

        # Both granted at once; the second waits for the connector's one
        # connection, which it gets after the first's 429 paused the host.
        refused = asyncio.ensure_future(get(a.url("/status/429?h.Retry-After=3")))
        paused = asyncio.ensure_future(get(a.url("/")))
        assert await refused == 429
        await asyncio.sleep(0.2)  # the second has the connection and finds the pause
        await wait_until(lambda: not connector._acquired)  # waiting, holding nothing
        started = asyncio.get_running_loop().time()
        assert await get(b.url("/")) == 200  # another host's request is not held back
        assert asyncio.get_running_loop().time() - started < 2.0
        assert not paused.done()
        assert await paused == 200
    times = [arrival.time for arrival in a.arrivals]
    assert len(times) == 2 and times[1] - times[0] >= 2.9  # the pause still holds at the host


async def test_a_session_given_no_connector_is_not_capped_at_aiohttps_100() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    async with ThrottledSession(throttle=Throttle()) as session:
        limit = session.connector.limit  # type: ignore[union-attr]
    if soft == resource.RLIM_INFINITY:
        assert limit == 0  # no cap
    else:
        assert limit == max(100, soft // 2)  # half the file descriptors


async def test_a_connector_you_give_keeps_its_limit() -> None:
    connector = aiohttp.TCPConnector(limit=7)
    async with ThrottledSession(throttle=Throttle(), connector=connector) as session:
        assert session.connector is connector
        assert connector.limit == 7


def test_a_request_with_no_room_for_the_exchange_hands_it_over_in_the_context() -> None:
    """The middleware puts the exchange on the request it sends, for the
    connector's hook; a request class that takes no attribute (none of
    aiohttp's does so) hands it over in the context variable instead, where
    the hook looks when the request has none."""
    from autothrottle._aiohttp_parts import EXCHANGE
    from autothrottle.aiohttp import _PLUG

    exchange = object()
    request = object()  # no __dict__: setattr raises
    assert EXCHANGE.get() is None
    wiring = _PLUG.wire(exchange, request)  # type: ignore[arg-type]
    assert EXCHANGE.get() is exchange
    _PLUG.unwire(request, wiring)  # type: ignore[arg-type]
    assert EXCHANGE.get() is None


async def test_the_hook_finds_the_exchange_in_the_context_when_the_request_has_none() -> None:
    from autothrottle._aiohttp_parts import EXCHANGE, hook_connector

    class Wired:
        asked = 0

        def wire_now(self) -> float:
            Wired.asked += 1
            return 0.0

    connector = _Connector()
    hook_connector(connector)
    token = EXCHANGE.set(Wired())  # type: ignore[arg-type]
    try:
        connection = await connector.connect(object(), [], None)
    finally:
        EXCHANGE.reset(token)
    assert connection is connector.made[0] and not connection.closed
    assert Wired.asked == 1
    await connector.close()


class _Connection:
    """What the hooked ``connect`` hands over: records how it was let go."""

    def __init__(self) -> None:
        self.closed = self.released = False

    def close(self) -> None:
        self.closed = True

    def release(self) -> None:
        self.released = True


class _Connector(aiohttp.BaseConnector):
    def __init__(self) -> None:
        super().__init__()
        self.made: list[_Connection] = []

    async def connect(  # type: ignore[override]
        self,
        req: object,
        traces: object,
        timeout: object,  # noqa: ASYNC109 (aiohttp's own parameter)
    ) -> _Connection:
        self.made.append(_Connection())
        return self.made[-1]


class _Refusing:
    """An exchange whose wire turn fails at its check number ``fails_at`` (1: the
    first), after asking for a wait of ``wait`` seconds before it."""

    def __init__(self, fails_at: int, wait: float) -> None:
        self.fails_at, self.wait, self.asked, self.waited = fails_at, wait, 0, 0.0

    def within_bound(self, wait: float) -> None:
        """No bound: the request waits as long as its wire turn says."""

    def wire_now(self) -> float:
        self.asked += 1
        if self.asked == self.fails_at:
            raise RuntimeError("the wire turn failed")
        return self.wait

    async def on_wire(self, wait: float | None = None) -> None:  # pragma: no cover (never reached)
        raise AssertionError("the check failed before")


@pytest.mark.parametrize(
    ("fails_at", "wait"),
    [(1, 0.0), (2, 0.06)],  # the first check; the check after a long wait, on a new connection
    ids=["first-check", "after-handing-back"],
)
async def test_a_wire_turn_that_fails_keeps_no_connection(fails_at: int, wait: float) -> None:
    """A wire turn's check can raise (a fleet's new turn past ``max_wait``, a
    store's fault): the request fails, and the connection it was handed is
    closed, not left checked out of the connector."""
    from autothrottle._aiohttp_parts import EXCHANGE, hook_connector

    connector = _Connector()
    hook_connector(connector)
    token = EXCHANGE.set(_Refusing(fails_at, wait))  # type: ignore[arg-type]
    try:
        with pytest.raises(RuntimeError, match="wire turn failed"):
            await connector.connect(object(), [], None)
    finally:
        EXCHANGE.reset(token)
    assert len(connector.made) == fails_at
    *handed_back, last = connector.made
    assert all(made.released for made in handed_back)
    assert last.closed
    await connector.close()

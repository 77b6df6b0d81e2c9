"""A fleet's wire-turn timeout under urllib3's ``Retry``: the request's
``max_wait`` holds though urllib3 may retry what the wire turn raised.

urllib3 reads the wire turn's ``ThrottleTimeout`` (an ``OSError`` raised
inside its ``conn.request``) as a read error, "Connection aborted.", and may
retry it; the adapter's next attempt must end the request with the turn's
timeout, not send it again or count a host failure. The machinery (a
fleet crowded at the wire, real Redis, a loopback site) is
``test_redis_wire``'s.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import requests
import urllib3.connection
from urllib3.util.retry import Retry

from autothrottle.requests import ThrottledHTTPAdapter, ThrottleWaitTimeout
from test_redis_wire import LATE, MAX_WAIT, Fleet, fleet, site

__all__ = ["fleet"]  # the fixture, imported to be found

RETRIES = {
    "total": Retry(total=3, respect_retry_after_header=False),
    "read=0": Retry(total=None, connect=2, read=0, respect_retry_after_header=False),
}


@pytest.mark.parametrize("retries", list(RETRIES))
async def test_requests_with_retries_fails_at_the_wire_once(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch, retries: str
) -> None:
    connect = urllib3.connection.HTTPConnection.connect

    def slow_connect(self: Any) -> None:
        connect(self)
        fleet.crowd_blocking()
        time.sleep(LATE)

    monkeypatch.setattr(urllib3.connection.HTTPConnection, "connect", slow_connect)
    errors: list[BaseException] = []

    def send(url: str) -> None:
        fleet.warm_blocking()
        adapter = ThrottledHTTPAdapter(throttle=fleet.throttle, max_retries=RETRIES[retries])
        with requests.Session() as session:
            session.mount("http://", adapter)
            try:
                session.get(url, headers={"X-AutoThrottle": f"max-wait={MAX_WAIT}"})
            except BaseException as error:
                errors.append(error)

    async with site() as target:
        await asyncio.wait_for(asyncio.to_thread(send, target.url), 30.0)
        assert len(errors) == 1 and isinstance(errors[0], ThrottleWaitTimeout), errors
        fleet.ours.flush_blocking()
        await fleet.check(target)

"""A fleet request whose lease's hold ran out before it ended (docs/fleet.md,
"A request that never finishes"; the fleet's rule 7).

The gate lets go of a lease ``hold_timeout`` after its grant, wherever the
request is: still waiting for the fleet's turn (a pause, the cap) too. That
request is not lost: it goes when its turn comes and ends as any other, and
what it holds of the fleet (its turn's lease in Redis, the run of its process)
must go back when it ends, not ``hold_timeout`` after its send. Needs Redis on
127.0.0.1:6379; real time, generous bounds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis

from autothrottle import FixedDelayPolicy, Throttle, ThrottleTimeout
from autothrottle.redis import RedisStore
from helpers import connected, needs_redis, wait_until
from redis_keys import REDIS_URL, fresh_prefix

HOLD = 2.0
"""The throttles' ``hold_timeout``: shorter than the fleet's pause."""

BOUND = 1.2
"""The other process's ``max_wait``: well under ``HOLD``, what a lease nobody
hands back holds the host for after its send, and well over a round trip."""

PAUSE = 4.0
"""The pause another process set: the request waits it out holding its lease."""


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Throttle, Throttle, str]]:
    """Two processes of one fleet (a store each, one prefix), a cap of one
    request in flight fleet-wide, and the prefix; closed at the end."""
    needs_redis()
    prefix = fresh_prefix()
    stores = [await connected(RedisStore(REDIS_URL, prefix=prefix)) for _ in range(2)]
    throttles = [
        Throttle(
            store=store,
            policy=FixedDelayPolicy(0.05),
            max_concurrency=1,
            hold_timeout=HOLD,
            max_pause=30.0,
        )
        for store in stores
    ]
    try:
        yield throttles[0], throttles[1], prefix
    finally:
        for store in stores:
            await store.aclose()


async def test_a_lease_let_go_while_it_waited_out_a_pause_hands_its_turn_back_when_done(
    pair: tuple[Throttle, Throttle, str],
) -> None:
    """The other process paused the host for longer than ``hold_timeout``; a
    request granted meanwhile waits the pause out, and its lease's hold runs out
    on the way (a look at the slot lets it go, as another request's end does).
    Sent at the pause's end and finished at once, its turn goes back to Redis
    then: the other process, capped at one request fleet-wide, gets the host
    within its 1.2-s ``max_wait``, and nothing is left in Redis. It used to be
    held until ``hold_timeout`` after the send: its release found the lease let
    go already and ran none of the fleet's hooks."""
    one, other, prefix = pair
    other.backoff("host", pause=PAUSE)
    server = redis.Redis.from_url(REDIS_URL)
    state = f"{{{prefix}:host}}:s"
    await wait_until(lambda: server.hget(state, "pause") is not None, within=5.0)
    waiting = asyncio.ensure_future(one.acquire("host"))
    await asyncio.sleep(HOLD + 0.3)
    assert not waiting.done()  # the pause runs
    assert one.slot("host").snapshot().in_flight == 0  # its hold ran out
    lease = await asyncio.wait_for(waiting, 10.0)
    lease.release()  # the response came at once
    started = time.monotonic()
    try:
        async with other.acquire("host", max_wait=BOUND):
            pass
    except ThrottleTimeout:
        pytest.fail(f"the host stayed held {time.monotonic() - started:.2f} s after the request")
    await one.store.flush()  # type: ignore[attr-defined]
    await other.store.flush()  # type: ignore[attr-defined]
    assert server.zcard(f"{{{prefix}:host}}:l") == 0

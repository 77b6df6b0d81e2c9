"""One worker process of the fleet tests: N requests through a shared Redis store.

Run as ``python tests/fleet_worker.py URL REDIS_URL PREFIX COUNT [HOLD_TIMEOUT [CAP]]``;
prints one line per finished request ("ok STATUS" or "error NAME"). A REDIS_URL
``cluster://HOST:PORT`` names a Redis Cluster by one of its nodes. With
``FLEET_WORKER_GO=1`` in its environment it prints "ready" once it is started
and its store connected, and waits for a line on its standard input before it
sends: workers started one after another on a loaded machine then still send
together, and a test's bound from "ready" holds no start-up (a store's first
connection maps Redis's clock: up to 50 round trips on a loaded machine).
With ``FLEET_WORKER_GRANTS=1`` it prints, once its requests are done, one line
"granted SECONDS" per turn it sent: the send time Redis granted that turn
(:class:`helpers.Grants`, on Redis's clock, the machine's wall clock).
With ``FLEET_WORKER_TOGETHER=1`` it starts its COUNT requests at once instead of
one after another, so that each process always has a request asking for a turn.
"""

from __future__ import annotations

import asyncio
import os
import sys

from redis.asyncio.cluster import RedisCluster

from autothrottle import FixedRatePolicy, Throttle
from autothrottle.aiohttp import ThrottledSession
from autothrottle.redis import RedisStore
from helpers import Grants, connected


async def main(url: str, redis_url: str, prefix: str, count: int, hold: float, cap: int) -> None:
    client: str | RedisCluster = redis_url
    if redis_url.startswith("cluster://"):
        host, _, port = redis_url.removeprefix("cluster://").partition(":")
        client = RedisCluster(host=host, port=int(port))
    # Redis gets time to answer: a loaded machine (four workers and a cluster's
    # nodes starting on two busy cores) must not read as an outage, after which
    # each worker would pace alone; the fleet tests here are about sharing.
    store = RedisStore(client, prefix=prefix, timeout=2.0, retry_after=0.5)
    throttle = Throttle(
        policy=FixedRatePolicy(10), store=store, hold_timeout=hold, max_concurrency=cap
    )
    async with ThrottledSession(throttle=throttle) as session:
        if os.environ.get("FLEET_WORKER_GO") == "1":
            await connected(store)
            print("ready", flush=True)
            await asyncio.to_thread(sys.stdin.readline)
        grants = Grants(store) if os.environ.get("FLEET_WORKER_GRANTS") == "1" else None

        async def one() -> None:
            try:
                async with session.get(url) as response:
                    await response.read()
                    print("ok", response.status, flush=True)
            except Exception as error:  # reported to the test, which counts them
                print("error", type(error).__name__, flush=True)

        if os.environ.get("FLEET_WORKER_TOGETHER") == "1":
            await asyncio.gather(*(one() for _ in range(count)))
        else:
            for _ in range(count):
                await one()
        if grants is not None:
            for granted in grants.sent():
                print("granted", repr(granted), flush=True)
    await store.aclose()


if __name__ == "__main__":
    hold = float(sys.argv[5]) if len(sys.argv) > 5 else 300.0
    cap = int(sys.argv[6]) if len(sys.argv) > 6 else 8
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), hold, cap))

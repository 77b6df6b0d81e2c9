"""A store closed while its process's threads still send (docs/fleet.md).

A sync crawl's shutdown closes its client and store while threads are still
mid-request: their responses finish after the close, and what their leases
hold of the fleet must go back then, not wait in Redis until ``hold_timeout``
(the fleet's cap counts them meanwhile: with a cap of one, nobody sends). Needs
Redis on 127.0.0.1:6379; the threads are this test's own.
"""

from __future__ import annotations

import threading

import pytest
import redis

from autothrottle import FixedDelayPolicy, Throttle
from autothrottle.redis import RedisStore
from helpers import connected_blocking, needs_redis, wait_for
from redis_keys import REDIS_URL, fresh_prefix


def _fleet() -> tuple[Throttle, RedisStore, redis.Redis, str]:
    needs_redis()
    prefix = fresh_prefix()
    store = RedisStore(REDIS_URL, prefix=prefix)
    throttle = Throttle(store=store, policy=FixedDelayPolicy(0.05), max_concurrency=1)
    return throttle, connected_blocking(store), redis.Redis.from_url(REDIS_URL), prefix


@pytest.mark.parametrize("where", ["this thread", "another thread"])
def test_a_request_finished_after_its_store_closed_hands_its_turn_back(where: str) -> None:
    """A request is in flight when its store is closed (the crawl shuts down);
    it finishes after. Its turn's lease goes back to Redis then: nothing of the
    slot is left held (it stayed until ``hold_timeout``, 300 s, and the fleet's
    cap of one let nobody send meanwhile)."""
    throttle, store, server, prefix = _fleet()
    lease = throttle.acquire_blocking("host")
    leases = f"{{{prefix}:host}}:l"
    assert server.zcard(leases) == 1
    store.close()
    if where == "this thread":
        lease.release()
    else:
        finishing = threading.Thread(target=lease.release)
        finishing.start()
        finishing.join(10.0)
    wait_for(lambda: server.zcard(leases) == 0, within=5.0)
    server.close()


def test_a_turn_taken_after_the_close_is_handed_back_too() -> None:
    """A thread that was still to ask for its turn when the store closed takes
    it (the store reconnects) and sends; its end hands the turn back too, and
    the store's connection is closed again."""
    throttle, store, server, prefix = _fleet()
    store.close()
    lease = throttle.acquire_blocking("host")
    leases = f"{{{prefix}:host}}:l"
    assert server.zcard(leases) == 1
    lease.release()
    wait_for(lambda: server.zcard(leases) == 0, within=5.0)
    server.close()

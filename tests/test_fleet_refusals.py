"""A refusal in a fleet is judged by when its request's turn was taken
(docs/fleet.md; docs/recovery.md, "One backoff per burst").

Only the first signal of a burst counts: a refusal of a request sent before
the slot's last backoff is the lag of that backoff, and changes nothing, its
``Retry-After`` included. A fleet's request is granted by its process's gate
first, then waits for the fleet's turn: a request granted before a backoff
may wait its pause out and take its turn after, at the new pace. Its refusal
is the host's new word, and its ``Retry-After`` must hold for every process.
Needs Redis on 127.0.0.1:6379; real time, generous bounds.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from autothrottle import Throttle
from autothrottle._fleet import Fleet, Run, SharedTurn, TurnAsk
from autothrottle._fleet_hooks import HeldTurn
from autothrottle._redis_runs import Runs
from autothrottle.redis import RedisStore
from helpers import connected, needs_redis
from redis_keys import REDIS_URL, fresh_prefix

REFUSED = {"Retry-After": "1"}


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Throttle, Throttle]]:
    """Two processes of one fleet, two requests in flight at most, fleet-wide."""
    needs_redis()
    prefix = fresh_prefix()
    stores = [await connected(RedisStore(REDIS_URL, prefix=prefix)) for _ in range(2)]
    try:
        yield tuple(  # type: ignore[misc]
            Throttle(store=store, start_delay=0.05, max_concurrency=2) for store in stores
        )
    finally:
        for store in stores:
            await store.aclose()


async def test_a_refusal_of_a_turn_taken_after_the_backoff_pauses_the_fleet(
    pair: tuple[Throttle, Throttle],
) -> None:
    """The fleet's two places are held, one by each process. A second request of
    the first is granted by its gate and waits for a place. The first's request
    is refused (``Retry-After: 1``): it backs off, and the waiting request waits
    the pause out, then goes, and is refused in turn with ``Retry-After: 1``.
    That refusal is new (its turn came after the backoff): neither process
    sends for a second after it. It used to be taken for the lag of the first
    (the request was granted before it), and both sent again at once."""
    one, other = pair
    held = await other.acquire("host")
    first = await one.acquire("host")
    waiting = asyncio.ensure_future(one.acquire("host"))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # granted here, waiting for the fleet's place
    first.finish(latency=0.01, status=429, headers=REFUSED)
    held.release()
    second = await asyncio.wait_for(waiting, 10.0)
    second.finish(latency=0.01, status=429, headers=REFUSED)
    refused = time.monotonic()
    for throttle in (one, other):
        lease = await asyncio.wait_for(throttle.acquire("host"), 10.0)
        went = time.monotonic() - refused
        lease.finish(latency=0.01, status=200)
        assert went >= 0.9, f"sent {went:.2f} s into the host's 1-s Retry-After"


@pytest.mark.parametrize(
    ("asked", "counted"),
    [
        (3.0, 3.0),  # asked after the backoff (its pause waited out): the new pace
        (1.5, 1.0),  # a turn of a run asked for before the backoff: its lag
        (-math.inf, 1.0),  # not known (a turn taken at the wire): the grant
    ],
)
def test_a_refusal_counts_from_the_ask_of_its_turn_when_the_slot_backed_off_since_its_grant(
    asked: float, counted: float
) -> None:
    """Granted at 1.0, the slot backed off at 2.0: a refusal of the request
    counts as sent when its process asked for the turn it went on, if that was
    after the backoff; else at its grant, as the lag of that backoff."""
    slot: Any = SimpleNamespace(state=SimpleNamespace(refusal=SimpleNamespace(backoff_at=2.0)))
    fleet: Any = SimpleNamespace()
    lease: Any = SimpleNamespace(sent_at=1.0, on_release=HeldTurn(fleet, slot, "x", asked))
    assert Fleet._refused_sent(slot, lease) == counted
    slot.state.refusal.backoff_at = 0.5  # no backoff since the grant: the grant
    assert Fleet._refused_sent(slot, lease) == 1.0


def test_a_turn_of_a_run_carries_the_time_its_run_was_asked_for() -> None:
    run = Run()
    run.reserved([10.0, 10.5], ["x", "x:2"], 0.5, None, 1, asked=7.0)
    runs = Runs(lambda key, gap, leases: None)
    runs._runs["k"] = run
    turn, _ = runs._next(run, TurnAsk(0.5, 0.0, 60.0, 8, 300.0, 300.0), 10.4)
    assert isinstance(turn, SharedTurn) and turn.lease == "x:2" and turn.asked == 7.0

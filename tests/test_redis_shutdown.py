"""A Redis store's pause listener ends when cancelled, closed or not (docs/fleet.md).

redis-py 8 on Python 3.11 can lose a cancel that lands as a send completes
(its ``asyncio.wait_for`` around the send returns the send's result). A
listener cancelled while subscribing then waited for a message for ever, and
``asyncio.run`` over a store never closed never returned. One ``sleep(0)``
after the turn that starts the listener lands the cancel there every time.
These tests need Redis on 127.0.0.1:6379; elsewhere they skip.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from autothrottle._fleet import TurnAsk
from autothrottle.redis import RedisStore
from helpers import needs_redis
from redis_keys import fresh_prefix

REDIS = "redis://127.0.0.1:6379/0"
ENDS_WITHIN = 20.0
"""Seconds a cancelled listener or a process is given to end (generous: it takes
at most LISTEN_CHECK; a hang runs into this bound)."""

_ASK = TurnAsk(0.1, 0.0, 60.0, 8, 300.0, 300.0)


@pytest.fixture(autouse=True)
def _needs_redis() -> None:
    needs_redis()


async def started(store: RedisStore) -> asyncio.Task[None]:
    """``store``'s listener task, started by a turn and stepped into subscribing."""
    turn = await store.take_turn("slot", _ASK, time.monotonic())
    assert turn.lease is not None, "the store did not reach Redis"
    store.released("slot", turn.lease)
    task = store._listener._task
    assert task is not None
    await asyncio.sleep(0)  # the listener is sending its SUBSCRIBE now
    return task


UNCLOSED = f"""
import asyncio, sys, time
from autothrottle._fleet import TurnAsk
from autothrottle.redis import RedisStore

KEPT = []  # held: no finalizer stops the listener, only asyncio.run's shutdown

async def main():
    store = RedisStore({REDIS!r}, prefix=sys.argv[1])
    KEPT.append(store)
    turn = await store.take_turn("slot", TurnAsk(0.1, 0.0, 60.0, 8, 300.0, 300.0), time.monotonic())
    assert turn.lease is not None
    store.released("slot", turn.lease)
    await asyncio.sleep(0)
    if sys.argv[2] == "listening":
        for _ in range(500):
            if store._listener.listening:
                break
            await asyncio.sleep(0.01)
        assert store._listener.listening
    if sys.argv[3] == "raise":
        raise RuntimeError("main failed")

try:
    asyncio.run(main())
except RuntimeError:
    pass
print("returned", flush=True)
"""


@pytest.mark.parametrize("when", ["subscribing", "listening"])
@pytest.mark.parametrize("how", ["return", "raise"])
def test_a_program_that_never_closes_its_store_still_exits(when: str, how: str) -> None:
    started_at = time.monotonic()
    with subprocess.Popen(
        [sys.executable, "-c", UNCLOSED, fresh_prefix("test-shutdown"), when, how],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        try:
            out, err = process.communicate(timeout=ENDS_WITHIN)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            pytest.fail(f"asyncio.run did not return within {ENDS_WITHIN} s (store not closed)")
    assert process.returncode == 0, err.decode()
    assert out.decode().strip() == "returned"
    assert time.monotonic() - started_at < ENDS_WITHIN


async def test_a_listener_cancelled_while_subscribing_ends() -> None:
    for _ in range(5):  # each a fresh listener: the lost cancel hit every one
        store = RedisStore(REDIS, prefix=fresh_prefix("test-shutdown"))
        try:
            task = await started(store)
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=ENDS_WITHIN)
            assert done, f"a cancelled listener did not end within {ENDS_WITHIN} s"
            assert task.cancelled()
        finally:
            await store.aclose()


async def test_a_listening_listener_cancelled_ends() -> None:
    store = RedisStore(REDIS, prefix=fresh_prefix("test-shutdown"))
    try:
        task = await started(store)
        for _ in range(int(ENDS_WITHIN / 0.01)):
            if store._listener.listening:
                break
            await asyncio.sleep(0.01)
        assert store._listener.listening
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=ENDS_WITHIN)
        assert done and task.cancelled()
    finally:
        await store.aclose()


async def test_closing_a_store_while_its_listener_subscribes_ends_it() -> None:
    store = RedisStore(REDIS, prefix=fresh_prefix("test-shutdown"))
    task = await started(store)
    await asyncio.wait_for(store.aclose(), ENDS_WITHIN)
    assert task.done()
    assert not store._listener.listening

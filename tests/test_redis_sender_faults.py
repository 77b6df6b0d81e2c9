"""Whatever ends a Redis pipeline before it is settled, its turns are answered and
what it took is kept (``docs/fleet.md``, "When Redis fails").

A pipeline carries the turns waiting (of any slot) and the finished leases and
changes waiting to ride with them. Redis failing or slow is the outage rule
(``test_redis.py``); here the pipeline ends otherwise: its sender task
cancelled mid-call (as the event loop's shutdown does), a cancel redis-py
raises of its own, or a fault (a ``ValueError`` out of the client). Each turn
in flight must be answered (its request, and the ones lined up behind it, go
on as while Redis is down, never wait for ever), and the leases and changes
taken must reach Redis later, or the fleet counts a phantom reservation until
the lease expires. The fault strikes ``before`` Redis ran the pipeline (what
it took was not sent) or ``after`` (the turns were reserved and their answers
lost: their leases must go back). The sync client's sender is a thread
holding the sender lock for every thread waiting: the same there.

A fault as Redis's answers are settled leaves the runs Redis reserved: they
go back with their time (nobody reserved after them), as a given-up
request's do, not as a lost answer's (leases only: the slot's pace would keep
a hole). A change whose command cannot be built is dropped and logged once;
kept, it failed every send after it.

Real Redis on 127.0.0.1:6379 (a prefix per test); elsewhere these skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from autothrottle._fleet import SharedTurn, TurnAsk
from autothrottle._state import SlotState
from autothrottle.redis import RedisStore
from helpers import connected, connected_blocking, needs_redis, wait_until
from redis_keys import fresh_prefix

REDIS = "redis://127.0.0.1:6379/0"
BOUND = 15.0
"""Seconds a request in flight is given to be answered (generous: a stranded one
waits for ever, and runs into this)."""

HANDED_BACK_WITHIN = 10.0
"""Seconds what a broken pipeline took is given to reach Redis (it goes within
``retry_after``, 0.3 s here, once the next send starts)."""

_ASK = TurnAsk(0.0, 0.0, 60.0, 8, 300.0, 300.0)


@pytest.fixture(autouse=True)
def _needs_redis() -> None:
    needs_redis()


def leases(admin: redis.Redis, name: str, key: str) -> int:
    """The leases the fleet counts in flight for slot ``key``."""
    return int(admin.zcard(f"{{{name}:{key}}}:l"))


def fault(how: str) -> BaseException | None:
    if how == "raise":
        return ValueError("a reply of a shape nobody expected")
    if how == "cancelled":
        return asyncio.CancelledError()  # redis-py's own, the sender task not cancelled
    if how == "interrupt":
        return KeyboardInterrupt()
    return None  # "cancel": the call stalls until the test cancels the sender task


def break_async_pipeline(store: RedisStore, how: str, when: str) -> tuple[asyncio.Event, list[int]]:
    """Make the store's next async pipeline end by ``how``, ``when`` Redis ran it
    ("after") or not ("before"); later pipelines go through. Returns an event
    set once the pipeline is under way and the count of commands it carried."""
    send = store._send
    real = send._pipeline_async
    under_way = asyncio.Event()
    carried: list[int] = []

    async def broken(client: Any, commands: Any) -> list[Any]:
        if carried:
            return await real(client, commands)
        carried.append(len(commands))
        if when == "after":
            await real(client, commands)
        under_way.set()
        error = fault(how)
        if error is None:
            await asyncio.Event().wait()  # until cancelled
        assert error is not None
        raise error

    send._pipeline_async = broken  # type: ignore[method-assign]
    return under_way, carried


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("how", ["cancel", "cancelled", "raise"])
async def test_a_pipeline_ended_otherwise_than_by_redis_answers_its_turns_and_keeps_what_it_took(
    how: str, when: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = fresh_prefix("test-faults")
    admin = redis.Redis.from_url(REDIS)
    store = await connected(RedisStore(REDIS, prefix=name, timeout=10.0, retry_after=0.3))
    held = await store.take_turn("held", _ASK, time.monotonic())
    assert held.lease is not None
    assert leases(admin, name, "held") == 1
    under_way, carried = break_async_pipeline(store, how, when)
    caplog.set_level(logging.WARNING, logger="autothrottle")

    # The finished lease and a learned backoff wait to ride with the next turns
    # (a linger far off: they go with these turns, in the pipeline that breaks).
    store._send.released("held", held.lease, 60.0)
    now = time.monotonic()
    store.changed("learned", SlotState(delay=0.7), now, sent_at=now, backed_off=True)
    asked = [
        asyncio.create_task(store.take_turn(key, _ASK, time.monotonic())) for key in "aab"
    ]  # the second "a" waits behind the first's ask
    async with asyncio.timeout(BOUND):
        await under_way.wait()
        assert carried == [4]  # the lease, the change, a turn of each slot
        sender = store._send._sender
        if how == "cancel":
            assert sender is not None
            sender.cancel()
        turns = await asyncio.gather(*asked)  # nothing stranded

    assert all(isinstance(turn, SharedTurn) for turn in turns)
    for key, turn in zip("aab", turns, strict=True):
        if turn.lease is not None:  # (the second "a" may have asked Redis again)
            store.released(key, turn.lease)
    for key in "ab":
        store.idle(key)  # no request left: a run's turns not taken go back too

    def handed_back() -> bool:
        return (
            sum(leases(admin, name, key) for key in ("held", "a", "b")) == 0
            and admin.hget(f"{{{name}:learned}}:s", "record") is not None
        )

    try:
        await wait_until(handed_back, HANDED_BACK_WITHIN)  # kept, and sent once Redis answers
    except AssertionError:
        found = {key: leases(admin, name, key) for key in ("held", "a", "b")}
        record = admin.hget(f"{{{name}:learned}}:s", "record")
        raise AssertionError(f"in Redis still: {found}, the change's record {record!r}") from None
    errors = [r for r in caplog.records if r.name == "autothrottle" and r.levelno >= logging.ERROR]
    if how == "cancel":  # the sender stopped: not Redis's failure, nor a fault
        assert errors == []
    else:  # a fault (redis-py's stray cancel too) is logged with its traceback
        assert len(errors) == 1 and errors[0].exc_info is not None
        assert type(fault(how)).__name__ in errors[0].getMessage()
    await store.aclose()
    admin.close()


async def test_a_flush_cancelled_while_a_pipeline_is_under_way_leaves_it_to_answer() -> None:
    """``aclose`` (``flush``) waits for the pipeline under way; cancelled meanwhile
    (a close under a timeout), it leaves that pipeline to finish and answer its
    turns with Redis's answers, not cut off."""
    name = fresh_prefix("test-faults")
    store = await connected(RedisStore(REDIS, prefix=name, timeout=10.0))
    send = store._send
    real = send._pipeline_async
    under_way = asyncio.Event()

    async def slow(client: Any, commands: Any) -> list[Any]:
        results = await real(client, commands)
        under_way.set()
        await asyncio.sleep(0.5)  # Redis answered; the answer is still on its way
        return results

    send._pipeline_async = slow  # type: ignore[method-assign]
    asked = asyncio.create_task(store.take_turn("host", _ASK, time.monotonic()))
    async with asyncio.timeout(BOUND):
        await under_way.wait()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.05):
                await store.flush()
        assert not asked.done()
        turn = await asked
    assert turn.lease is not None  # Redis's answer, not "down": the pipeline was not cut off
    store.released("host", turn.lease)
    send._pipeline_async = real  # type: ignore[method-assign]
    await store.aclose()
    admin = redis.Redis.from_url(REDIS)
    assert leases(admin, name, "host") == 0
    admin.close()


# -- the sync client: the thread holding the sender lock sends for every thread waiting -------


def break_sync_pipeline(store: RedisStore, how: str, when: str, waiting: int, held: str) -> None:
    """The store's next sync pipeline stalls until ``waiting`` turns are lined up
    behind it, then lets the finished lease ``held`` (of slot "held") wait to
    ride with them; the pipeline after it, which carries them, ends by ``how``
    ``when`` Redis ran it or not."""
    send = store._send
    real = send._run_blocking
    calls: list[int] = []

    def broken(client: Any, commands: Any) -> list[Any]:
        calls.append(len(commands))
        if len(calls) == 1:
            deadline = time.monotonic() + BOUND
            while len(send._sync_turns) < waiting and time.monotonic() < deadline:
                time.sleep(0.005)
            send.released("held", held, 60.0)  # a linger far off: it rides with the turns
            return real(client, commands)
        if len(calls) == 2:
            if when == "after":
                real(client, commands)
            error = fault(how)
            assert error is not None
            raise error
        return real(client, commands)

    send._run_blocking = broken  # type: ignore[method-assign]


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("how", ["raise", "interrupt"])
def test_a_sync_pipeline_ended_otherwise_answers_every_thread_waiting(
    how: str, when: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = fresh_prefix("test-faults")
    admin = redis.Redis.from_url(REDIS)
    store = connected_blocking(RedisStore(REDIS, prefix=name, timeout=10.0, retry_after=0.3))
    held = store.take_turn_blocking("held", _ASK, time.monotonic())
    assert held.lease is not None
    caplog.set_level(logging.WARNING, logger="autothrottle")
    store.flush_blocking()  # nothing left for the background sender: the threads send
    keys = [f"t{i}" for i in range(4)]
    break_sync_pipeline(store, how, when, len(keys) - 1, held.lease)
    outcomes: dict[str, SharedTurn | BaseException] = {}

    def asker(key: str) -> Callable[[], None]:
        def run() -> None:
            try:
                outcomes[key] = store.take_turn_blocking(key, _ASK, time.monotonic())
            except BaseException as error:  # an interrupt is recorded too
                outcomes[key] = error

        return run

    first = threading.Thread(target=asker(keys[0]))
    first.start()  # its pipeline holds the sender lock until the others wait
    while not store._send._sync_sender.locked():
        time.sleep(0.001)
    threads = [first] + [threading.Thread(target=asker(key)) for key in keys[1:]]
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join(BOUND)
    assert not any(thread.is_alive() for thread in threads), "a thread was stranded"

    turns = [outcomes[key] for key in keys]
    interrupted = [turn for turn in turns if isinstance(turn, KeyboardInterrupt)]
    assert len(interrupted) == (1 if how == "interrupt" else 0)  # the one that sent
    answered = [turn for turn in turns if not isinstance(turn, KeyboardInterrupt)]
    assert all(isinstance(turn, SharedTurn) for turn in answered), turns
    for key, turn in zip(keys, turns, strict=True):
        if isinstance(turn, SharedTurn) and turn.lease is not None:
            store.released(key, turn.lease)
        store.idle(key)

    deadline = time.monotonic() + HANDED_BACK_WITHIN
    while sum(leases(admin, name, key) for key in ["held", *keys]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert {key: leases(admin, name, key) for key in ["held", *keys]} == dict.fromkeys(
        ["held", *keys], 0
    )
    errors = [r for r in caplog.records if r.name == "autothrottle" and r.levelno >= logging.ERROR]
    if how == "raise":
        assert len(errors) == 1 and errors[0].exc_info is not None
        assert "ValueError" in errors[0].getMessage()
    else:
        assert errors == []
    store.close()
    admin.close()


# -- a fault while Redis's answers are settled: the runs reserved go back with their time ------

_PACED = TurnAsk(0.5, 0.0, 60.0, 8, 300.0, 300.0)  # a gap: a turn moves the slot's next free time


def tat(admin: redis.Redis, name: str, key: str) -> int:
    """The slot's next free send time in Redis (µs on its clock)."""
    return int(admin.hget(f"{{{name}:{key}}}:s", "tat") or 0)


def break_settling(store: RedisStore, admin: redis.Redis, name: str) -> list[int]:
    """Make the store's next settling of Redis's answers fail (a fault after Redis
    ran the pipeline); returns the slot "paced"'s next free time as that
    pipeline left it, once it ran."""
    send = store._send
    real = send._settle
    seen: list[int] = []

    def broken(commands: Any, results: Any, turns: Any) -> None:
        if seen or not turns:  # (a finished lease lingering goes on its own)
            return real(commands, results, turns)
        seen.append(tat(admin, name, "paced"))
        raise ValueError("a reply of a shape nobody expected")

    send._settle = broken  # type: ignore[method-assign]
    return seen


def given_back(admin: redis.Redis, name: str, reserved: int, held: int) -> Callable[[], bool]:
    """The faulted turn's lease went back and its time with it (one gap at least)."""

    def check() -> bool:
        moved = reserved - tat(admin, name, "paced")
        return leases(admin, name, "paced") == held and moved >= 500_000

    return check


async def test_a_fault_while_answers_are_settled_hands_the_run_back_with_its_time() -> None:
    """Redis reserved the turn, and a fault ended its settling: the request goes
    on as while Redis is down, and what Redis reserved goes back, its time
    too (nobody reserved after it). Only the lease, and the slot's pace keeps
    a hole of a gap: every process's next turn of it a gap later."""
    name = fresh_prefix("test-faults")
    admin = redis.Redis.from_url(REDIS)
    store = await connected(RedisStore(REDIS, prefix=name, timeout=10.0, retry_after=0.3))
    other = await connected(RedisStore(REDIS, prefix=name, timeout=10.0))
    held = await other.take_turn("paced", _PACED, time.monotonic())  # another process's turn
    assert held.lease is not None
    seen = break_settling(store, admin, name)
    async with asyncio.timeout(BOUND):
        turn = await store.take_turn("paced", _PACED, time.monotonic())
    assert turn.lease is None  # answered as while Redis is down: alone
    assert len(seen) == 1 and seen[0] > 0
    try:
        await wait_until(given_back(admin, name, seen[0], 1), HANDED_BACK_WITHIN)
    except AssertionError:
        found = (leases(admin, name, "paced"), tat(admin, name, "paced") - seen[0])
        raise AssertionError(f"leases, next free time moved by (µs): {found}") from None
    other.released("paced", held.lease)
    await other.aclose()
    await store.aclose()
    admin.close()


def test_a_fault_while_a_sync_pipelines_answers_are_settled_hands_the_run_back() -> None:
    name = fresh_prefix("test-faults")
    admin = redis.Redis.from_url(REDIS)
    store = connected_blocking(RedisStore(REDIS, prefix=name, timeout=10.0, retry_after=0.3))
    other = connected_blocking(RedisStore(REDIS, prefix=name, timeout=10.0))
    held = other.take_turn_blocking("paced", _PACED, time.monotonic())
    assert held.lease is not None
    seen = break_settling(store, admin, name)
    turn = store.take_turn_blocking("paced", _PACED, time.monotonic())
    assert turn.lease is None
    assert len(seen) == 1 and seen[0] > 0
    check = given_back(admin, name, seen[0], 1)
    deadline = time.monotonic() + HANDED_BACK_WITHIN
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert check(), (leases(admin, name, "paced"), tat(admin, name, "paced") - seen[0])
    other.released("paced", held.lease)
    other.close()
    store.close()
    admin.close()


# -- a change whose command cannot be built: dropped, logged once, the rest goes ---------------


async def test_a_change_that_cannot_be_sent_is_dropped_and_the_store_keeps_sharing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A record that is not JSON (a custom policy's state holding an object)
    fails its change's command. Kept to go again, it failed every send
    after it: every turn answered as while Redis is down, for good. Dropped,
    the turns and the other slots' changes go, and it is logged once."""
    name = fresh_prefix("test-faults")
    admin = redis.Redis.from_url(REDIS)
    store = await connected(RedisStore(REDIS, prefix=name, timeout=10.0, retry_after=0.3))
    caplog.set_level(logging.DEBUG, logger="autothrottle")
    poisoned = SlotState(delay=0.5, policy_state={"client": object()})
    now = time.monotonic()
    for _ in range(2):  # the second change of the slot fails as the first
        store.changed("bad", poisoned, now, sent_at=now, backed_off=True)
        store.changed("good", SlotState(delay=0.7), now, sent_at=now, backed_off=True)
        async with asyncio.timeout(BOUND):
            turn = await store.take_turn("t", _ASK, time.monotonic())
        assert turn.lease is not None  # shared, not alone: the send went
        store.released("t", turn.lease)
        store.idle("t")
    await store.flush()
    assert admin.hget(f"{{{name}:good}}:s", "record") is not None
    assert admin.hget(f"{{{name}:bad}}:s", "record") is None
    errors = [r for r in caplog.records if r.name == "autothrottle" and r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "'bad'" in errors[0].getMessage() and errors[0].exc_info is not None
    assert not store._outage.down()
    # A good change of the slot is shared again, and a later poisoned one logged again.
    store.changed("bad", SlotState(delay=0.6), now, sent_at=now, backed_off=False)
    await store.flush()
    assert admin.hget(f"{{{name}:bad}}:s", "record") is not None
    store.changed("bad", poisoned, now, sent_at=now, backed_off=False)
    await store.flush()
    errors = [r for r in caplog.records if r.name == "autothrottle" and r.levelno >= logging.ERROR]
    assert len(errors) == 2
    await store.aclose()
    admin.close()

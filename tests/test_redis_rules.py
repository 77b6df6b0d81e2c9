"""The fleet's rules as the Lua scripts run them, on a real Redis (docs/fleet.md).

Each test calls a script the way ``RedisStore`` does and reads the keys it
left. Times are on Redis's clock; the rules are ``autothrottle._fleet``'s,
cited by number. Redis on 127.0.0.1:6379; elsewhere these tests skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any, cast

import pytest
import redis

from autothrottle import FixedRatePolicy, Throttle, ThrottleTimeout, _fleet
from autothrottle._fleet import FRESH_MOST, FRESH_ROOM, SPACING_MARGIN, TurnAsk
from autothrottle._redis_lua import GIVE_BACK, MERGE, TURN
from autothrottle._redis_parts import LINGER, LINGER_MOST
from autothrottle.redis import RedisStore
from redis_keys import fresh_prefix

URL = "redis://127.0.0.1:6379/0"
GAP_US = 500_000
TTL_MS = 60_000


@pytest.fixture
def server() -> Iterator[redis.Redis]:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", 6379), 0.5):
        client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
        yield client
        client.close()
        return
    if os.environ.get("CI"):
        pytest.fail("Redis is not running on 127.0.0.1:6379 (.ci/run starts it)")
    pytest.skip("no Redis on 127.0.0.1:6379: start one with `redis-server --daemonize yes`")


class Slot:
    """One slot's keys under a prefix of its own."""

    def __init__(self, client: redis.Redis) -> None:
        tag = f"{{{fresh_prefix('rules')}:host}}"
        self.client = client
        self.state, self.leases, self.processes = f"{tag}:s", f"{tag}:l", f"{tag}:p"

    def turn(
        self,
        lease: str,
        *,
        want: int = 1,
        cap: int = 8,
        room_us: int = 0,
        max_pause_us: int = 10**9,
    ) -> list[str]:
        """A turn as a process at 2/s asks it (gap 0.5 s, no margin, no lateness)."""
        args: list[Any] = [
            GAP_US, 0, 10**9, cap, 300 * 10**6, lease, TTL_MS, "process",
            max_pause_us, "", "1.0", 0, "0.0", want, room_us,
        ]  # fmt: skip
        reply = self.client.eval(TURN, 3, self.state, self.leases, self.processes, *args)
        return [part.decode() if isinstance(part, bytes) else str(part) for part in reply]

    def merge(
        self,
        *,
        delay_us: int,
        backed_off: bool,
        oks: int,
        pause_us: int = 0,
        told: str = "",
        stated: tuple[int, int] | None = None,
    ) -> None:
        """A change at a strict pace (FixedRatePolicy's), from a request sent just
        now; a pause it sets is told on the channel ``told`` ('' none); ``stated``:
        the pace the host stated to the process, its gap and how long it holds (µs)."""
        gap, holds = ("", "") if stated is None else stated
        args: list[Any] = [
            delay_us, "1" if backed_off else "0", 0, pause_us, json.dumps({}), TTL_MS, oks, "1",
            told, "process", "host", gap, holds,
        ]  # fmt: skip
        self.client.eval(MERGE, 1, self.state, *args)

    @staticmethod
    def at(reply: list[str]) -> int:
        """When a reserved turn is due, on Redis's clock (µs): its wait from the script's now."""
        return int(reply[0]) + int(reply[6])

    def field(self, name: str) -> float:
        return float(self.client.hget(self.state, name) or 0)

    def tat(self) -> float:
        return self.field("tat")


def test_a_run_is_reserved_in_one_script_its_turns_one_gap_apart(server: redis.Redis) -> None:
    slot = Slot(server)
    run = slot.turn("a", want=3)
    assert (run[1], int(run[7]), int(run[8])) == ("a", 3, GAP_US)
    leases = cast(list[bytes], server.zrange(slot.leases, 0, -1))
    assert {m.decode() for m in leases} == {"a", "a:2", "a:3"}
    # The next process's turn comes one gap after the run's last.
    assert Slot.at(slot.turn("b")) - Slot.at(run) == 3 * GAP_US


def test_a_run_takes_at_most_half_of_the_free_leases(server: redis.Redis) -> None:
    slot = Slot(server)
    assert slot.turn("a", want=4, cap=4)[7] == "2"
    assert slot.turn("b", want=4, cap=4)[7] == "1"  # one free: still one turn
    assert slot.turn("c", want=4, cap=4)[7] == "1"
    assert slot.turn("d", want=4, cap=4)[1] == ""  # at the cap: nothing reserved


def test_the_room_asked_for_comes_after_the_run(server: redis.Redis) -> None:
    slot = Slot(server)
    first = Slot.at(slot.turn("a", room_us=100_000))
    assert Slot.at(slot.turn("b")) - first == GAP_US + 100_000


def test_an_unused_tail_of_the_latest_run_gives_its_time_back(server: redis.Redis) -> None:
    slot = Slot(server)
    slot.turn("a", want=3)
    before = slot.tat()
    freed = server.eval(GIVE_BACK, 2, slot.state, slot.leases, GAP_US, "a:3", "a:2")
    assert freed == 2
    assert slot.tat() == pytest.approx(before - 2 * GAP_US, abs=1)
    assert server.zcard(slot.leases) == 1  # the turn its asker took is still held


def test_an_unused_turn_with_another_reserved_after_it_only_goes_back(
    server: redis.Redis,
) -> None:
    slot = Slot(server)
    slot.turn("a", want=2)
    slot.turn("b")  # another process reserved after the run
    before = slot.tat()
    assert server.eval(GIVE_BACK, 2, slot.state, slot.leases, GAP_US, "a:2") == 0
    assert slot.tat() == before  # the other's time stays where it was
    assert server.zcard(slot.leases) == 2


def test_a_refusal_at_a_strict_pace_the_fleet_kept_is_jitter(server: redis.Redis) -> None:
    slot = Slot(server)
    for _ in range(4):  # the fleet's successes at 2/s, from several processes
        slot.merge(delay_us=GAP_US, backed_off=False, oks=1)
    # One process took a refusal for a real one: its delay doubled, it paused 1 s.
    slot.merge(delay_us=2 * GAP_US, backed_off=True, oks=0, pause_us=1_000_000)
    assert slot.field("delay") == GAP_US  # the fleet's pace stays
    now = server.time()
    now_us = int(now[0]) * 1_000_000 + int(now[1])
    assert slot.field("pause") - now_us <= GAP_US + 5_000  # at most one gap


def test_a_refusal_without_the_fleets_successes_is_counted(server: redis.Redis) -> None:
    slot = Slot(server)
    slot.merge(delay_us=GAP_US, backed_off=False, oks=1)  # one success: not yet evidence
    slot.merge(delay_us=2 * GAP_US, backed_off=True, oks=0)
    assert slot.field("delay") == 2 * GAP_US
    assert slot.field("oks") == 0  # the count starts again


def test_a_refusal_after_a_slow_start_is_jitter_when_the_latest_two_kept_the_pace(
    server: redis.Redis,
) -> None:
    # The fleet's first success came slowly (a start, a delay coming back down
    # after a backoff), its latest two at the pace: the slow start's span is
    # no sign that the host did not keep the pace, which it did for the latest.
    slot = Slot(server)
    gap_us = 200_000
    slot.merge(delay_us=gap_us, backed_off=False, oks=1)
    time.sleep(1.2)  # three successes spanning 1.2 s: more than 3 x 1.25 gaps
    slot.merge(delay_us=gap_us, backed_off=False, oks=1)
    slot.merge(delay_us=gap_us, backed_off=False, oks=1)
    slot.merge(delay_us=2 * gap_us, backed_off=True, oks=0, pause_us=1_000_000)
    assert slot.field("delay") == gap_us  # jitter: the fleet's pace stays
    assert slot.field("oks") == 3  # and the count goes on


def test_a_refusal_after_two_successes_slower_than_the_pace_is_counted(
    server: redis.Redis,
) -> None:
    slot = Slot(server)
    gap_us = 200_000
    slot.merge(delay_us=gap_us, backed_off=False, oks=1)
    time.sleep(0.6)  # the host let the fleet through at a third of its pace
    slot.merge(delay_us=gap_us, backed_off=False, oks=1)
    time.sleep(0.6)
    slot.merge(delay_us=2 * gap_us, backed_off=True, oks=0)
    assert slot.field("delay") == 2 * gap_us  # counted: the pace was not kept
    assert slot.field("oks") == 0
    assert server.hget(slot.state, "ok_before") is None  # the latest two start again


def test_a_strict_pace_rises_only_by_a_counted_backoff(server: redis.Redis) -> None:
    slot = Slot(server)
    slot.merge(delay_us=GAP_US, backed_off=False, oks=1)
    slot.merge(delay_us=GAP_US + 40_000, backed_off=False, oks=1)  # a recovery floor's step
    assert slot.field("delay") == GAP_US


def test_an_unused_turn_before_a_run_already_finished_gives_no_time_back(
    server: redis.Redis,
) -> None:
    # Another process reserved after the run, sent and handed its lease back:
    # the unused turn is now the latest lease held, yet not the latest reserved.
    slot = Slot(server)
    slot.turn("a", want=2)
    slot.turn("b")
    server.zrem(slot.leases, "b")
    before = slot.tat()
    assert server.eval(GIVE_BACK, 2, slot.state, slot.leases, GAP_US, "a:2") == 0
    assert slot.tat() == before


def test_a_reserved_run_says_how_many_leases_it_left_free(server: redis.Redis) -> None:
    slot = Slot(server)
    assert slot.turn("a", want=3)[9] == "5"  # a cap of 8, three taken
    assert slot.turn("b", want=4, cap=6)[9] == "2"  # half of the three left: one


ASK = TurnAsk(0.5, 0.0, 60.0, 8, 300.0, 300.0, SPACING_MARGIN)


def fresh_store(timeout: float = 0.25) -> RedisStore:
    return RedisStore(URL, prefix=fresh_prefix("rules"), timeout=timeout)


def test_a_turn_reached_after_its_slack_goes_back_with_its_time(server: redis.Redis) -> None:
    # Rule 1: a process that reaches its turn later than the room the fleet
    # left hands it back; as nobody reserved after it, its time comes back too:
    # the next turn is not a gap after a send that never left.
    store = fresh_store()
    try:
        first = store.take_turn_blocking("h", ASK, 0.0)
        assert first.lease is not None
        room = min(FRESH_ROOM * 0.5, FRESH_MOST)  # its first turn of the slot
        assert first.slack == pytest.approx(0.5 * (SPACING_MARGIN - 1.0) + room, abs=1e-6)
        state, leases = (f"{{{store.prefix}:h}}:s", f"{{{store.prefix}:h}}:l")
        before = float(server.hget(state, "tat") or 0)
        store.late("h", first.lease)
        store.flush_blocking()
        assert server.zscore(leases, first.lease) is None
        after = float(server.hget(state, "tat") or 0)
        assert before - after == pytest.approx(0.5 * SPACING_MARGIN * 1e6, abs=2)
    finally:
        store.close()


def test_a_finished_lease_far_from_the_cap_waits_longer_for_a_turn(server: redis.Redis) -> None:
    # Over few hosts turns come seldom: a lease the fleet does not need soon
    # rides with a later turn instead of costing a round trip of its own.
    for cap, longest in ((8, LINGER_MOST), (2, LINGER)):
        store = fresh_store()
        try:
            turn = store.take_turn_blocking("h", ASK._replace(cap=cap), 0.0)
            assert turn.lease is not None
            store.released("h", turn.lease)
            left = store._send._flush_at - time.monotonic()
            assert (LINGER < left <= longest) if cap == 8 else (left <= longest), (cap, left)
        finally:
            store.close()


def test_a_pause_merged_is_told_on_the_channel_once_and_only_a_pause(server: redis.Redis) -> None:
    # Rule 2: the processes holding turns reserved before a pause hear of it.
    slot = Slot(server)
    told = f"autothrottle:{fresh_prefix('rules')}:pauses"
    listener = server.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    listener.subscribe(told)
    try:
        slot.merge(delay_us=GAP_US, backed_off=False, oks=1, told=told)  # no pause
        slot.merge(delay_us=GAP_US, backed_off=True, oks=0, pause_us=2_000_000, told=told)
        slot.merge(delay_us=GAP_US, backed_off=True, oks=0, pause_us=1_000_000, told=told)
        messages = []
        for _ in range(20):  # bounded: what was published is there at once
            message = listener.get_message(timeout=0.05)
            if message is not None:
                messages.append(message["data"].decode())
        assert len(messages) == 1  # the shorter pause extended nothing: not told
        end, now, process, key = messages[0].split(" ", 3)
        assert int(end) - int(now) == 2_000_000 and (process, key) == ("process", "host")
        assert int(end) == slot.field("pause")
    finally:
        listener.close()


async def test_requests_before_the_first_answer_share_one_reservation(
    server: redis.Redis,
) -> None:
    # Rule 8: a process keeps one reservation of a slot waiting at a time, so a
    # run, not a queue of single turns, serves its requests. Redis answers
    # slower than the slot's gap (a loaded machine, a distant Redis): the
    # requests let through meanwhile wait for the first answer, not each
    # asking the store on its own.
    store = fresh_store()
    throttle = Throttle(policy=FixedRatePolicy(100), store=store)
    run = store._send._run_async
    asking, most = 0, 0

    async def slow(client: Any, commands: Any) -> list[Any]:
        nonlocal asking, most
        turns = sum(1 for script, _ in commands if script == "turn")
        asking += turns
        most = max(most, asking)
        await asyncio.sleep(0.05)
        try:
            return await run(client, commands)
        finally:
            asking -= turns

    store._send._run_async = slow  # type: ignore[method-assign]

    async def one() -> None:
        with await throttle.acquire("h"):
            pass

    try:
        await asyncio.wait_for(asyncio.gather(*(one() for _ in range(8))), 10.0)
    finally:
        await store.aclose()
    assert most == 1, most
    assert store.turns >= 8


def test_sync_requests_before_the_first_answer_share_one_reservation(
    server: redis.Redis,
) -> None:
    # The same through the sync client: threads let through the process's gate
    # before the first answer wait for it, as tasks do.
    store = fresh_store()
    throttle = Throttle(policy=FixedRatePolicy(100), store=store)
    run = store._send._run_blocking
    lock = threading.Lock()
    asking, most = 0, 0

    def slow(client: Any, commands: Any) -> list[Any]:
        nonlocal asking, most
        turns = sum(1 for script, _ in commands if script == "turn")
        with lock:
            asking += turns
            most = max(most, asking)
        time.sleep(0.05)
        try:
            return run(client, commands)
        finally:
            with lock:
                asking -= turns

    store._send._run_blocking = slow  # type: ignore[method-assign]
    failed: list[BaseException] = []

    def one() -> None:
        try:
            with throttle.acquire_blocking("h"):
                pass
        except BaseException as error:
            failed.append(error)

    threads = [threading.Thread(target=one) for _ in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10.0)
    finally:
        store.close()
    assert not any(thread.is_alive() for thread in threads)
    assert not failed, failed
    assert most == 1, most


class Held:
    """Redis's answers to turns held until :attr:`go` is set; the turns asked counted."""

    def __init__(self, store: RedisStore) -> None:
        self.go = asyncio.Event()
        self.asked = 0
        self._run = store._send._run_async
        store._send._run_async = self  # type: ignore[method-assign]

    async def __call__(self, client: Any, commands: Any) -> list[Any]:
        self.asked += sum(1 for script, _ in commands if script == "turn")
        await self.go.wait()
        return await self._run(client, commands)


async def behind(store: RedisStore, held: Held, waiting: int) -> None:
    """Until the slot's ask reached Redis (connected, the clock mapped: slow on a
    loaded machine) and ``waiting`` requests wait behind it (bounded)."""
    for _ in range(1000):
        run = store._runs.get("h")
        if run is not None and len(run.behind) == waiting and held.asked:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the requests never came behind the ask")


async def nothing_held(store: RedisStore, throttle: Throttle, server: redis.Redis) -> None:
    """No lease, reserved turn or request is left, here or in Redis."""
    await store.flush()
    run = store._runs.get("h")
    assert run is None or (len(run) == 0 and not run.behind and not run.asking)
    slot = throttle.slot("h")
    assert (slot.in_flight, slot.queued) == (0, 0)
    assert server.zcard(f"{{{store.prefix}:h}}:l") == 0


async def test_a_request_given_up_behind_the_first_ask_holds_nothing(
    server: redis.Redis,
) -> None:
    store = fresh_store(timeout=30.0)  # Redis held, not down
    throttle = Throttle(policy=FixedRatePolicy(100), store=store)
    held = Held(store)

    async def one() -> None:
        with await throttle.acquire("h"):
            pass

    try:
        first = asyncio.create_task(one())
        second = asyncio.create_task(one())
        await behind(store, held, 1)
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        assert not store._runs._runs["h"].behind  # out of the line at once
        assert (held.asked, store._send._turns) == (1, [])  # and nothing asked for it
        held.go.set()
        await asyncio.wait_for(first, 10.0)
        await nothing_held(store, throttle, server)
    finally:
        await store.aclose()


async def test_the_ask_given_up_passes_to_the_request_behind_it(server: redis.Redis) -> None:
    # The asking request is cancelled before its answer: the request behind it
    # asks in its place, and the turns reserved for the one given up go back.
    store = fresh_store(timeout=30.0)  # Redis held, not down
    throttle = Throttle(policy=FixedRatePolicy(100), store=store)
    held = Held(store)

    async def one() -> None:
        with await throttle.acquire("h"):
            pass

    try:
        first = asyncio.create_task(one())
        second = asyncio.create_task(one())
        await behind(store, held, 1)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await asyncio.sleep(0)  # the request behind resumes: it asks in its place
        assert store._runs._runs["h"].asking and len(store._send._turns) == 1
        held.go.set()
        await asyncio.wait_for(second, 10.0)
        await nothing_held(store, throttle, server)
    finally:
        await store.aclose()


async def test_a_request_whose_max_wait_ends_behind_the_first_ask_times_out(
    server: redis.Redis,
) -> None:
    store = fresh_store(timeout=30.0)  # Redis held, not down
    throttle = Throttle(policy=FixedRatePolicy(100), store=store)
    held = Held(store)

    async def one(max_wait: float | None = None) -> None:
        with await throttle.acquire("h", max_wait=max_wait):
            pass

    try:
        first = asyncio.create_task(one())
        await behind(store, held, 0)
        started = time.monotonic()
        with pytest.raises(ThrottleTimeout):
            await asyncio.wait_for(one(max_wait=0.3), 10.0)
        assert time.monotonic() - started >= 0.29  # the bound, not sooner
        assert not first.done()  # it did not wait for the answer
        assert not store._runs._runs["h"].behind
        assert (held.asked, store._send._turns) == (1, [])  # nothing asked for it
        held.go.set()
        await asyncio.wait_for(first, 10.0)
        await nothing_held(store, throttle, server)
    finally:
        await store.aclose()


async def test_a_store_dropped_unclosed_ends_its_subscriber_quietly(server: redis.Redis) -> None:
    # A store never closed (its docstring asks for aclose) and dropped: once it
    # is collected its subscriber ends, connection and all, instead of pending
    # until its task is destroyed ("Task was destroyed but it is pending").
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    # A generous timeout: at load 10 the default 0.25 s read as an outage, and
    # the subscriber waited the 5-s retry_after before subscribing again.
    store = fresh_store(timeout=5.0)
    channel = f"autothrottle:{store.prefix}:pauses"
    throttle = Throttle(policy=FixedRatePolicy(100), store=store)
    client = store._send.async_redis()  # closed by the test: not the subscriber's concern
    try:
        with await throttle.acquire("h"):
            pass
        for _ in range(3000):  # bounded: subscribed within moments on loopback
            if store._listener.listening:
                break
            await asyncio.sleep(0.01)
        assert server.pubsub_numsub(channel) == [(channel.encode(), 1)]
        task = weakref.ref(store._listener._task)
        del store, throttle
        for _ in range(500):
            gc.collect()
            if task() is None and server.pubsub_numsub(channel)[0][1] == 0:
                break
            await asyncio.sleep(0.01)
        gc.collect()
        assert task() is None  # ended, and let go
        assert server.pubsub_numsub(channel)[0][1] == 0  # its connection closed
        assert not [c for c in reported if "destroyed" in str(c.get("message"))], reported
    finally:
        loop.set_exception_handler(previous)
        await client.aclose()


SLOW = TurnAsk(5.0, 0.0, 60.0, 8, 300.0, 300.0, SPACING_MARGIN)
"""Another process's ask at one turn in 5 s: the next turn is seconds away."""


def unsent_setup(server: redis.Redis, store: RedisStore) -> tuple[str, str, RedisStore]:
    """Another process (a store of its own under the same prefix) takes the slot's
    turn, so this process's next one is due seconds later; the keys to read."""
    other = RedisStore(URL, prefix=store.prefix, timeout=5.0)
    assert other.take_turn_blocking("h", SLOW, 0.0).lease is not None
    other.flush_blocking()
    return f"{{{store.prefix}:h}}:s", f"{{{store.prefix}:h}}:l", other


def tat(server: redis.Redis, state: str) -> float:
    return float(server.hget(state, "tat") or 0)


async def test_a_request_given_up_waiting_for_its_due_turn_gives_its_time_back(
    server: redis.Redis,
) -> None:
    # Rule 8: a request cancelled while it waits for its reserved turn's due time
    # hands the turn back, its time too when nobody reserved after it: else the
    # fleet keeps a gap that no request of any process uses.
    store = fresh_store(timeout=5.0)
    throttle = Throttle(policy=FixedRatePolicy(0.2), store=store)
    state, leases, other = unsent_setup(server, store)
    try:
        before = tat(server, state)
        task = asyncio.create_task(throttle.acquire("h"))
        for _ in range(3000):  # bounded: answered within moments on loopback
            if store.turns == 1:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # its turn answered, it waits for the due (seconds away)
        reserved = tat(server, state)
        assert reserved > before and not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await store.flush()
        assert server.zcard(leases) == 1  # the other process's turn only
        assert reserved - tat(server, state) == pytest.approx(5.0 * SPACING_MARGIN * 1e6, abs=2)
    finally:
        await store.aclose()
        other.close()


def test_a_sync_request_whose_turn_is_past_max_wait_gives_its_time_back(
    server: redis.Redis,
) -> None:
    # Rule 3, through the sync client: a reserved turn further away than the
    # request's max_wait is handed back at once, and, never sent, its time too.
    store = fresh_store(timeout=5.0)
    throttle = Throttle(policy=FixedRatePolicy(0.2), store=store)
    state, leases, other = unsent_setup(server, store)
    try:
        before = tat(server, state)
        with pytest.raises(ThrottleTimeout):
            throttle.acquire_blocking("h", max_wait=1.0)
        assert store.turns == 1  # a turn was reserved, a gap after the other's
        store.flush_blocking()
        assert server.zcard(leases) == 1  # the other process's turn only
        # The next free time is the other process's turn's again, but for the
        # room this process's first turn of the slot left for a new connection.
        room = min(FRESH_ROOM * 5.0, FRESH_MOST)
        assert tat(server, state) - before == pytest.approx(room * 1e6, abs=2)
    finally:
        store.close()
        other.close()


async def test_a_request_given_up_at_the_wire_on_a_turn_taken_there_gives_its_time_back(
    server: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rule 1 at the wire: a request whose connection is ready far past its
    # turn's slack hands that turn back and takes a new one there (after
    # another process's); cancelled while it waits for it, it never sent it,
    # so that turn's time goes back too: else the fleet keeps a gap that no
    # request of any process uses.
    store = fresh_store(timeout=5.0)
    throttle = Throttle(policy=FixedRatePolicy(0.2), store=store)
    other = RedisStore(URL, prefix=store.prefix, timeout=5.0)
    state, leases = f"{{{store.prefix}:h}}:s", f"{{{store.prefix}:h}}:l"
    # Its turn goes at the turn however late a loaded machine wakes it there:
    # the wire is what is tested (its own tolerance is the wire check's).
    monkeypatch.setattr(_fleet, "LATE_TOLERANCE", 60.0)
    try:
        lease = await asyncio.wait_for(throttle.acquire("h"), 10.0)
        assert other.take_turn_blocking("h", SLOW, 0.0).lease is not None
        other.flush_blocking()
        before = tat(server, state)  # the other process's turn is the latest reserved
        await asyncio.sleep(0.5)  # the connection is ready: far past the slack (0.2 s)
        wait = 0.0
        for _ in range(2500):  # bounded: the new turn is answered within moments
            wait = lease.wire_wait()
            if wait > 1.0:
                break
            await asyncio.sleep(wait or 0.002)
        assert wait > 1.0, wait  # waits at the wire for its new turn, after the other's
        assert tat(server, state) > before
        lease.release()  # cancelled meanwhile, as an adapter releases it
        await store.flush()
        assert server.zcard(leases) == 1  # the other process's turn only
        assert tat(server, state) == pytest.approx(before, abs=2)
    finally:
        await store.aclose()
        other.close()


async def test_the_last_request_given_up_in_its_process_queue_hands_the_run_back(
    server: redis.Redis,
) -> None:
    # Rule 8: the rest of a run goes back when no request of the process is left
    # for the slot. The last one given up in the process's own queue (its gate)
    # counts too: the requests before it finished while it was queued (so they
    # handed nothing back), and without it the run's rest stayed reserved in
    # Redis until the process's next request for the slot or its close.
    store = fresh_store(timeout=5.0)
    throttle = Throttle(policy=FixedRatePolicy(2), store=store)
    leases = f"{{{store.prefix}:h}}:l"
    run_async = store._send._run_async

    async def slow(client: Any, commands: Any) -> list[Any]:
        await asyncio.sleep(1.0)  # slower than the slot's gap
        return await run_async(client, commands)

    store._send._run_async = slow  # type: ignore[method-assign]
    try:
        # The second comes behind the first's ask: its own asks for a run of two.
        # (A gap of 0.5 s: a first turn reached later than its slack, as on a
        # loaded machine, would be handed back and take the run's rest.)
        first, second = await asyncio.wait_for(
            asyncio.gather(throttle.acquire("h"), throttle.acquire("h")), 10.0
        )
        run = store._runs.get("h")
        assert run is not None and len(run) == 1  # the run's rest, reserved ahead
        throttle.set_host("h", {"min_delay": 30.0})  # the next waits in the queue
        third = asyncio.create_task(throttle.acquire("h"))
        for _ in range(500):
            if throttle.slot("h").queued == 1:
                break
            await asyncio.sleep(0.01)
        first.release()
        second.release()
        third.cancel()
        with pytest.raises(asyncio.CancelledError):
            await third
        await store.flush()
        assert len(run) == 0
        assert server.zcard(leases) == 0
    finally:
        await store.aclose()


def test_the_last_sync_request_timed_out_in_its_process_queue_hands_the_run_back(
    server: redis.Redis,
) -> None:
    # The same through the sync client, the last request past its max_wait in
    # the queue. Redis answers slower than the slot's gap, so the second request
    # comes behind the first's ask, and its own asks for a run of two. A gap of
    # 0.5 s, as in the async test: a first turn reached later than its slack (a
    # loaded machine) would be handed back and take the run's rest instead.
    store = fresh_store(timeout=5.0)
    throttle = Throttle(policy=FixedRatePolicy(2), store=store)
    leases = f"{{{store.prefix}:h}}:l"
    run_blocking = store._send._run_blocking

    def slow(client: Any, commands: Any) -> list[Any]:
        time.sleep(1.0)  # slower than the slot's gap
        return run_blocking(client, commands)

    store._send._run_blocking = slow  # type: ignore[method-assign]
    held: list[Any] = []
    failed: list[BaseException] = []

    def one(max_wait: float | None = None) -> None:
        try:
            held.append(throttle.acquire_blocking("h", max_wait=max_wait))
        except BaseException as error:
            failed.append(error)

    try:
        threads = [threading.Thread(target=one) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10.0)
        assert len(held) == 2, failed
        run = store._runs.get("h")
        assert run is not None and len(run) == 1  # the run's rest, reserved ahead
        throttle.set_host("h", {"min_delay": 30.0})  # the next waits in the queue
        third = threading.Thread(target=one, args=(1.0,))
        third.start()
        for _ in range(500):
            if throttle.slot("h").queued == 1:
                break
            time.sleep(0.01)
        for lease in held:
            lease.release()
        third.join(10.0)
        assert [type(error) for error in failed] == [ThrottleTimeout]
        store.flush_blocking()
        assert len(run) == 0
        assert server.zcard(leases) == 0
    finally:
        store.close()


STATED_US = 2_000_000
"""A pace a host stated: one request per 2 s (four of the slot's gaps)."""


def test_a_stated_pace_merged_is_the_floor_of_every_askers_gap(server: redis.Redis) -> None:
    # Rules 1 and 5: a pace the host stated to one process spaces the turns of
    # every process while it holds, those asking with a gap of their own (0.5 s)
    # that never heard it too; the run's turns and the answer's spacing keep it.
    slot = Slot(server)
    slot.merge(delay_us=GAP_US, backed_off=False, oks=1, stated=(STATED_US, 60_000_000))
    first = slot.turn("a", want=2)
    assert int(first[8]) == STATED_US
    assert Slot.at(slot.turn("b")) - Slot.at(first) == 2 * STATED_US


def test_a_stated_pace_spaces_the_next_turn_from_the_latest_reserved(server: redis.Redis) -> None:
    # A turn reserved at the fleet's gap before the pace was stated: the next goes
    # a stated gap after it at once, not one gap of the old pace after it.
    slot = Slot(server)
    first = slot.turn("a")
    slot.merge(delay_us=GAP_US, backed_off=False, oks=1, stated=(STATED_US, 60_000_000))
    assert Slot.at(slot.turn("b")) - Slot.at(first) == STATED_US


def test_a_stated_pace_is_held_to_the_askers_max_pause_and_to_what_is_left(
    server: redis.Redis,
) -> None:
    # As a header read by the asker: at most its max_pause, and a gap cut to
    # what is left of the pace (the window resets: the next answer says more).
    slot = Slot(server)
    slot.merge(delay_us=GAP_US, backed_off=False, oks=1, stated=(STATED_US, 60_000_000))
    first = slot.turn("a")
    second = slot.turn("b", max_pause_us=1_000_000)
    assert Slot.at(second) - Slot.at(first) == 1_000_000
    other = Slot(server)
    other.merge(delay_us=100_000, backed_off=False, oks=1, stated=(STATED_US, 300_000))
    first = other.turn("a")
    gap = Slot.at(other.turn("b")) - Slot.at(first)
    assert 100_000 < gap <= 300_000  # wider than the fleet's 0.1 s, but the pace ends in 0.3 s


def test_a_stated_pace_ends_when_it_ends_the_later_end_winning(server: redis.Redis) -> None:
    slot = Slot(server)
    slot.merge(delay_us=GAP_US, backed_off=False, oks=1, stated=(STATED_US, 60_000_000))
    ends = slot.field("stated_until")
    slot.merge(delay_us=GAP_US, backed_off=False, oks=1, stated=(GAP_US, 1_000_000))
    assert (slot.field("stated"), slot.field("stated_until")) == (STATED_US, ends)
    slot.merge(delay_us=GAP_US, backed_off=False, oks=1)  # a process that did not hear it
    assert slot.field("stated_until") == ends
    short = Slot(server)
    short.merge(delay_us=GAP_US, backed_off=False, oks=1, stated=(STATED_US, 1))
    time.sleep(0.01)  # past its end on Redis's clock
    first = short.turn("a")
    assert Slot.at(short.turn("b")) - Slot.at(first) == GAP_US


def test_a_stated_pace_that_begins_or_widens_is_told_on_the_channel(server: redis.Redis) -> None:
    # Rule 8: the processes holding runs reserved before it hear of it; a pace
    # renewed as it was, or a little wider, is not news.
    slot = Slot(server)
    told = f"autothrottle:{fresh_prefix('rules')}:pauses"
    listener = server.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    listener.subscribe(told)
    try:
        for stated in (
            (GAP_US, 10_000_000),
            (GAP_US, 20_000_000),  # renewed
            (GAP_US * 6 // 5, 25_000_000),  # a fifth wider: a budget spent
            (STATED_US, 30_000_000),
        ):
            slot.merge(delay_us=GAP_US, backed_off=False, oks=1, told=told, stated=stated)
        messages = []
        for _ in range(20):  # bounded: what was published is there at once
            message = listener.get_message(timeout=0.05)
            if message is not None:
                messages.append(message["data"].decode())
        assert len(messages) == 2, messages  # it began, then widened
        kind, gap, until, now, process, key = messages[1].split(" ", 5)
        assert (kind, int(gap), process, key) == ("stated", STATED_US, "process", "host")
        assert int(until) - int(now) == 30_000_000 and int(until) == slot.field("stated_until")
    finally:
        listener.close()

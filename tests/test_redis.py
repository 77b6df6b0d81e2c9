"""The fleet: slot state shared through a real Redis (docs/fleet.md).

These tests need Redis on 127.0.0.1:6379 (CI starts it); elsewhere they skip,
saying why. Tests that stop Redis run their own redis-server on a free port.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from aiohttp import web

from autothrottle import FixedRatePolicy, Throttle, ThrottleTimeout
from autothrottle._fleet import FRESH_MOST, FRESH_ROOM, SPACING_MARGIN, TurnAsk
from autothrottle.aiohttp import ThrottledSession
from autothrottle.httpx import ThrottledClient
from autothrottle.redis import RedisStore
from helpers import FakeClock, Grants, connected, connected_blocking, needs_redis, reachable
from redis_keys import fresh_prefix

REDIS = "redis://127.0.0.1:6379/0"
HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _needs_redis() -> None:
    needs_redis()


def ask(gap: float, cap: int = 8, hold: float = 300.0, max_pause: float = 300.0) -> TurnAsk:
    """A turn's question as a throttle with these settings asks it."""
    return TurnAsk(gap, 0.0, 60.0, cap, hold, max_pause)


class Site:
    """A loopback server recording arrival times (and answering with a status)."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.walls: list[float] = []  # the same arrivals on the wall clock, Redis's
        self.delay = 0.0
        self.arrived = asyncio.Event()
        self.status = 200
        self.headers: dict[str, str] = {}
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.arrivals.append(time.monotonic())
        self.walls.append(time.time())
        self.arrived.set()
        await asyncio.sleep(self.delay)
        return web.Response(status=self.status, headers=self.headers, text="ok")

    def most_in_a_second(self) -> int:
        times = sorted(self.arrivals)
        return max(
            (sum(1 for t in times[i:] if t < start + 1.0) for i, start in enumerate(times)),
            default=0,
        )


@contextlib.asynccontextmanager
async def site() -> AsyncIterator[Site]:
    target = Site()
    app = web.Application()
    app.router.add_get("/", target.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.2", 0)
    await tcp.start()
    target.url = f"http://127.0.0.2:{runner.addresses[0][1]}/"
    try:
        yield target
    finally:
        await runner.cleanup()


async def crawl(url: str, store: RedisStore, count: int, rate: float = 10.0) -> None:
    throttle = Throttle(policy=FixedRatePolicy(rate), store=store)
    async with ThrottledSession(throttle=throttle) as session:
        for _ in range(count):
            async with session.get(url) as response:
                await response.read()


async def four_workers_keep_the_pace_of_one(redis_url: str, name: str) -> None:
    """Four fleet_worker.py processes, ten requests each at FixedRatePolicy(10),
    sent once all four have started (at load 15 a Python process takes seconds
    to start: one started first would pace alone, and the span would be theirs).
    Each starts its ten at once, so some process always has a request asking
    for the next turn: sent one after another, a turn came free whenever every
    process was between a response and its next request, which two busy cores
    made half the gaps (a median of 0.204 s). Each prints the send times the
    fleet granted its turns (:func:`one_pace_of_ten`)."""
    async with site() as target:
        workers = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                str(HERE / "fleet_worker.py"),
                target.url,
                redis_url,
                name,
                "10",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env={
                    **os.environ,
                    "FLEET_WORKER_GO": "1",
                    "FLEET_WORKER_GRANTS": "1",
                    "FLEET_WORKER_TOGETHER": "1",
                },
            )
            for _ in range(4)
        ]
        for worker in workers:
            assert worker.stdout is not None
            assert await asyncio.wait_for(worker.stdout.readline(), 60) == b"ready\n"
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write(b"go\n")
            worker.stdin.close()
        outputs = [await asyncio.wait_for(worker.communicate(), 60) for worker in workers]
    lines = [line for out, _ in outputs for line in out.decode().splitlines()]
    assert lines.count("ok 200") == 40, lines
    granted = [float(line.split()[1]) for line in lines if line.startswith("granted ")]
    one_pace_of_ten(granted, target, 40)


def one_pace_of_ten(
    granted: list[float], target: Site, sent: int, reserved: list[float] | None = None
) -> None:
    """The ``sent`` requests that reached ``target`` went on turns the fleet
    granted (``granted``: their send times on Redis's clock, :class:`helpers.Grants`)
    at one pace of FixedRatePolicy(10) across its processes, each no sooner than its turn.
    ``reserved``: every turn the fleet reserved, sent or handed back late
    (:meth:`helpers.Grants.reserved`), whose pace a stalled process leaves no
    hole in; by default the sent ones'.

    The arrivals are no measure of the pace: a process standing still 0.3 s
    (two cores busy) sends its turn late, and the host's loop standing still
    bunches the arrivals after it; a ceiling on their rate or a count in any
    second judges the machine's load, and a floor its start-up."""
    assert len(target.arrivals) == sent
    assert len(granted) == sent, granted  # every request went on a turn of the fleet's
    granted = sorted(granted)
    gaps = [b - a for a, b in itertools.pairwise(granted)]
    # Burst 1: the fleet grants one send a gap (0.1 s) apart, whichever
    # process asks. Processes each pacing alone have turns granted together.
    assert min(gaps) >= 0.1 - 0.0005, gaps
    # They share one pace rather than each taking the fleet's delay times the
    # processes (0.3-0.4 s gaps): one standing still leaves a wider gap now
    # and then, the others' asks fill the rest.
    paced = gaps if reserved is None else [b - a for a, b in itertools.pairwise(sorted(reserved))]
    assert statistics.median(paced) < 0.2, paced
    # And each request waited for its turn: the k-th to reach the host came
    # no sooner than the k-th turn granted (a due mapped onto this machine's
    # clock from Redis's is never early; a late send only comes later).
    early = [g - a for a, g in zip(sorted(target.walls), granted, strict=True) if a < g - 0.01]
    assert not early, early


async def test_four_processes_keep_the_pace_of_one() -> None:
    await four_workers_keep_the_pace_of_one(REDIS, fresh_prefix())


async def test_a_retry_after_seen_by_one_pauses_the_others() -> None:
    name = fresh_prefix()
    async with site() as target:
        first, second = RedisStore(REDIS, prefix=name), RedisStore(REDIS, prefix=name)
        target.status, target.headers = 429, {"Retry-After": "2"}
        await crawl(target.url, first, 1)
        await first.flush()
        refused_at = target.arrivals[-1]
        target.status, target.headers = 200, {}
        await crawl(target.url, second, 1)
        await first.aclose()
        await second.aclose()
    assert target.arrivals[-1] - refused_at >= 1.8


async def test_throttles_with_different_prefixes_share_nothing() -> None:
    # Each store is connected first: a first connection that one of them makes
    # while the other's turn is taken (the process standing still a second on
    # a loaded machine) would part their sends by its length, not by the fleet.
    async with site() as target:
        one = await connected(RedisStore(REDIS, prefix=fresh_prefix()))
        other = await connected(RedisStore(REDIS, prefix=fresh_prefix()))
        await asyncio.gather(crawl(target.url, one, 1, 0.2), crawl(target.url, other, 1, 0.2))
        await one.aclose()
        await other.aclose()
    first, second = sorted(target.arrivals)
    # One shared slot at 0.2/s would part them by its gap, 5 s. Apart, each
    # goes at the host's phase point, the same instant for both: a second
    # apart only when that point fell between their two asks.
    assert second - first < 2.5


async def test_closing_the_store_sends_a_lingering_hand_back_and_leaves_no_timer() -> None:
    """A finished lease waits up to a linger to ride with a turn; ``async with``
    (``aclose``) sends it at once, and no timer is left to start a send on a
    loop that is ending."""
    name = fresh_prefix()
    admin = redis.Redis.from_url(REDIS)
    async with RedisStore(REDIS, prefix=name) as store:
        turn = await store.take_turn("host", ask(0.0), time.monotonic())
        assert turn.lease is not None
        store.released("host", turn.lease)
        assert admin.zcard(f"{{{name}:host}}:l") == 1  # lingering: not sent yet
    assert admin.zcard(f"{{{name}:host}}:l") == 0  # handed back as the store closed
    assert store._send._lingering is None  # the timer itself
    admin.close()


async def test_closing_the_store_while_redis_is_down_leaves_no_retry_timer() -> None:
    """Redis down, the store tries it again every ``retry_after``; closed
    meanwhile, it leaves no timer to start a send on a loop that is ending."""
    store = RedisStore(
        f"redis://127.0.0.1:{_free_port()}/0", prefix=fresh_prefix(), timeout=0.1, retry_after=0.2
    )
    turn = await store.take_turn("host", ask(0.0), time.monotonic())
    assert turn.lease is None  # down: this process goes alone
    await store.aclose()
    sends: list[bool] = []

    async def send_loop(everything: bool) -> None:
        sends.append(everything)

    store._send._send_loop = send_loop  # type: ignore[method-assign]
    await asyncio.sleep(0.5)  # past the retry
    assert sends == []


async def test_a_crashed_workers_lease_comes_back_after_it_expires() -> None:
    name = fresh_prefix()
    # Both connected first: the lease's 1-s hold must outlast the alive
    # process's turn, not its first connection too (past a second on a loaded
    # machine, which left the lease expired before it was asked about).
    crashed = await connected(RedisStore(REDIS, prefix=name))
    alive = await connected(RedisStore(REDIS, prefix=name))
    turn = await crashed.take_turn("host", ask(0.0, 1, 1.0), time.monotonic())
    assert turn.lease is not None  # and never released: the worker died
    blocked = await alive.take_turn("host", ask(0.0, 1, 1.0), time.monotonic())
    assert blocked.lease is None and blocked.wait > 0  # the fleet is at its cap
    await asyncio.sleep(1.1)
    later = await alive.take_turn("host", ask(0.0, 1, 1.0), time.monotonic())
    assert later.lease is not None
    await crashed.aclose()
    await alive.aclose()


async def test_a_worker_killed_mid_request_gives_its_share_back_when_its_lease_expires() -> None:
    # A fleet cap of 1: while the killed worker's lease lives, nobody may send.
    name = fresh_prefix()
    worker = [HERE / "fleet_worker.py"]
    async with site() as target:
        target.delay = 3.0  # the killed worker's request outlives its 2 s lease
        doomed = await asyncio.create_subprocess_exec(
            sys.executable, *map(str, worker), target.url, REDIS, name, "1", "2.0", "1"
        )
        await asyncio.wait_for(target.arrived.wait(), 30)
        doomed.kill()
        await doomed.wait()
        killed_at = time.monotonic()
        target.delay = 0.0
        survivor = await asyncio.create_subprocess_exec(
            sys.executable,
            *map(str, worker),
            target.url,
            REDIS,
            name,
            "1",
            "2.0",
            "1",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "FLEET_WORKER_GO": "1"},
        )
        assert survivor.stdout is not None
        # The bound below counts from the survivor's being ready: its start (a
        # few seconds at load 11, imports and all) and its store's first
        # connection (made before "ready") are not the lease's doing.
        assert await asyncio.wait_for(survivor.stdout.readline(), 30) == b"ready\n"
        ready_at = time.monotonic()
        out, _ = await asyncio.wait_for(survivor.communicate(b"go\n"), 30)
    assert out.decode().split() == ["ok", "200"]
    assert len(target.arrivals) == 2
    assert target.arrivals[1] - killed_at >= 0.5  # held by the dead lease
    assert target.arrivals[1] - ready_at <= 10.0  # then let go on its expiry, not held on


async def test_a_new_process_starts_from_what_the_fleet_learned() -> None:
    name = fresh_prefix()
    async with site() as target:
        old = RedisStore(REDIS, prefix=name)
        target.status = 503
        throttle = Throttle(start_delay=0.5, store=old)
        async with (
            ThrottledSession(throttle=throttle) as session,
            session.get(target.url) as response,
        ):
            await response.read()
        learned = throttle.slot("127.0.0.2").delay
        await old.aclose()
        new = RedisStore(REDIS, prefix=name)
        fresh = Throttle(start_delay=0.0, store=new)
        lease = await fresh.acquire("127.0.0.2")
        lease.release()
        assert fresh.slot("127.0.0.2").delay == pytest.approx(learned, rel=0.01)
        assert await new.shared_record("127.0.0.2") is not None
        await new.aclose()


# -- failure ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def own_redis(port: int) -> Iterator[subprocess.Popen[bytes]]:
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not on PATH")
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while not reachable(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


async def test_redis_stopped_and_restarted_mid_run_fails_no_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = _free_port()
    url = f"redis://127.0.0.1:{port}/0"
    caplog.set_level(logging.WARNING, logger="autothrottle")
    async with site() as target:
        with own_redis(port) as first:
            store = RedisStore(url, prefix=fresh_prefix(), timeout=0.2, retry_after=0.3)
            crawler = asyncio.create_task(crawl(target.url, store, 30, rate=20.0))
            await asyncio.sleep(0.4)
            first.kill()
            first.wait()
            await asyncio.sleep(0.6)
            with own_redis(port):
                await asyncio.wait_for(crawler, 30)  # every request succeeded
                await store.take_turn("after", ask(0.0, 8, 1.0), time.monotonic())
                await store.aclose()
    assert len(target.arrivals) == 30
    assert target.most_in_a_second() <= 20 + 1  # paced alone meanwhile, not unthrottled
    messages = [record.getMessage() for record in caplog.records]
    assert sum("unreachable" in m for m in messages) == 1  # one warning per outage
    assert any("reachable again" in m for m in messages)


async def test_fail_closed_waits_for_redis_instead_of_going_alone() -> None:
    store = RedisStore(
        f"redis://127.0.0.1:{_free_port()}/0", prefix=fresh_prefix(), fail_closed=True, timeout=0.1
    )
    throttle = Throttle(start_delay=0.0, store=store, max_wait=0.5)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(throttle.acquire("host"), 1.0)
    await store.aclose()


def test_bad_arguments_are_named() -> None:
    with pytest.raises(TypeError, match="url_or_client"):
        RedisStore(42, prefix="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prefix"):
        RedisStore(REDIS, prefix="")
    with pytest.raises(ValueError, match="ttl"):
        RedisStore(REDIS, prefix="x", ttl=0)


async def test_alone_each_process_keeps_its_share_of_the_fleets_pace() -> None:
    # Two processes shared a slot at 10/s; with Redis gone each goes on at 5/s,
    # so together they still send 10/s, not 20/s.
    port = _free_port()
    url = f"redis://127.0.0.1:{port}/0"
    with own_redis(port) as server:
        name = fresh_prefix()
        stores = [RedisStore(url, prefix=name, timeout=0.2, retry_after=30) for _ in "ab"]
        for store in stores:  # one turn each: no run reserved ahead (rule 8)
            turn = await store.take_turn("host", ask(0.1, 8, 5.0), time.monotonic())
            assert turn.lease is not None
        await asyncio.sleep(0.3)  # both turns are due: none is waited for
        server.kill()
        server.wait()
        # The second process was told two processes share the slot. Both asks
        # at one instant (the throttle's clock is the caller's): the second's
        # wait is the whole alone gap, not less the time the loop stood still
        # between them (0.11 s read with every loop standing still now and then).
        now = time.monotonic()
        first = await stores[1].take_turn("host", ask(0.1, 8, 5.0), now)
        assert (first.lease, first.wait) == (None, 0.0)  # down: go, alone
        second = await stores[1].take_turn("host", ask(0.1, 8, 5.0), now)
        assert second.lease is None
        assert second.wait == pytest.approx(0.2, abs=0.01)  # 0.1 s times 2 processes
        for store in stores:
            await store.aclose()


# -- faults: each wait obeys the local bounds, each fault touches only what it must ---------


async def test_a_lease_handed_back_while_redis_is_slow_is_sent_again() -> None:
    # A fleet cap of 1: a hand-back lost in a slow moment would block the host for
    # every process until the lease's hold_timeout (300 s).
    port = _free_port()
    url = f"redis://127.0.0.1:{port}/0"
    with own_redis(port):
        admin = redis.Redis(port=port)
        name = fresh_prefix()
        one = RedisStore(url, prefix=name, timeout=0.2, retry_after=0.5)
        first = Throttle(start_delay=0.0, max_concurrency=1, store=one)
        lease = await first.acquire("host")
        admin.client_pause(700)  # Redis is slow for 0.7 s
        await first.acquire("elsewhere")  # its turn times out: this process goes alone
        lease.release()  # ... and its hand-back cannot get through now
        await asyncio.sleep(1.5)
        other = RedisStore(url, prefix=name, timeout=0.2, retry_after=0.5)
        second = Throttle(start_delay=0.0, max_concurrency=1, store=other)
        (await asyncio.wait_for(second.acquire("host"), 5.0)).release()
        await one.aclose()
        await other.aclose()


async def test_fail_closed_raises_throttle_timeout_at_max_wait_while_redis_is_down() -> None:
    port = _free_port()
    with own_redis(port) as server:
        store = RedisStore(
            f"redis://127.0.0.1:{port}/0",
            prefix=fresh_prefix(),
            fail_closed=True,
            timeout=0.2,
            retry_after=5.0,
        )
        throttle = Throttle(start_delay=0.0, store=store, max_wait=0.5)
        await connected(store)  # within its timeout, not within the first request's max_wait
        (await throttle.acquire("host")).release()
        server.kill()
        server.wait()
        started = time.monotonic()
        with pytest.raises(ThrottleTimeout):
            await asyncio.wait_for(throttle.acquire("host"), 5.0)
        assert time.monotonic() - started < 2.0
        await store.aclose()


async def test_a_pause_from_the_fleet_lasts_at_most_the_local_max_pause() -> None:
    name = fresh_prefix()
    patient = Throttle(start_delay=0.0, max_pause=7200, store=RedisStore(REDIS, prefix=name))
    lease = await patient.acquire("host")
    lease.observe(latency=0.01, status=429, headers={"Retry-After": "3600"})
    lease.release()
    await patient.store.flush()  # type: ignore[attr-defined]
    joining = await connected(RedisStore(REDIS, prefix=name))  # not inside the bound below
    hasty = Throttle(start_delay=0.0, max_pause=1.0, store=joining)
    started = time.monotonic()
    (await asyncio.wait_for(hasty.acquire("host"), 10.0)).release()
    assert 0.8 <= time.monotonic() - started <= 3.0  # the pause, as long as max_pause allows
    (await asyncio.wait_for(hasty.acquire("host"), 10.0)).release()  # waited out: no more
    for store in (patient.store, hasty.store):
        await store.aclose()  # type: ignore[attr-defined]


async def test_a_fleet_delay_above_the_local_max_delay_spaces_sends_by_max_delay() -> None:
    name = fresh_prefix()
    slow = Throttle(start_delay=3600, max_delay=7200, store=RedisStore(REDIS, prefix=name))
    lease = await slow.acquire("host")
    lease.observe(latency=0.01, status=200)
    lease.release()
    await slow.store.flush()  # type: ignore[attr-defined]
    joining = await connected(RedisStore(REDIS, prefix=name))  # not inside the bound below
    quick = Throttle(start_delay=0.0, max_delay=0.5, store=joining)
    started = time.monotonic()
    for _ in range(3):
        (await asyncio.wait_for(quick.acquire("host"), 10.0)).release()
    assert time.monotonic() - started <= 3.0  # the second and third within max_delay each
    assert quick.slot("host").delay <= 0.5
    for store in (slow.store, quick.store):
        await store.aclose()  # type: ignore[attr-defined]


async def test_a_pace_the_host_states_in_headers_is_the_fleets_not_each_processes() -> None:
    """Two processes' throttles, ``Throttle()``'s defaults, share a host that states
    5 requests a second in its headers. Each learns that pace from its own answers
    and its gate keeps to it; the fleet's turns must keep to it too, not to the
    policy's delay, which ramps below it (the pace was paced by the headers, not by
    the delay): each process at 5/s alone, the two sent 10/s and were refused."""
    name = fresh_prefix()
    async with site() as target:
        target.headers = {"RateLimit-Policy": '"default";q=5;w=1', "RateLimit": '"default";r=5;t=1'}
        stores = [await connected(RedisStore(REDIS, prefix=name)) for _ in range(2)]
        grants = [Grants(store) for store in stores]

        async def one_process(store: RedisStore) -> None:
            async with ThrottledSession(throttle=Throttle(store=store)) as session:
                for _ in range(12):
                    async with session.get(target.url) as response:
                        await response.read()

        await asyncio.gather(*(one_process(store) for store in stores))
        for store in stores:
            await store.aclose()
    granted = sorted(t for record in grants for t in record.sent())
    assert len(granted) == 24
    # The first two turns come before either process heard the host (its first
    # answer states the pace); every turn after them, at least the stated gap apart.
    gaps = [round(b - a, 4) for a, b in itertools.pairwise(granted)][2:]
    assert min(gaps) >= 0.2 - 0.0005, gaps


async def test_a_reserved_turn_further_than_max_wait_fails_at_once_and_is_handed_back() -> None:
    name = fresh_prefix()
    # Every store connected first: its max_wait and "at once" are the turn's,
    # not a first connection's too (past a second on a loaded machine), nor
    # the time the others' turns passed by meanwhile.
    ours = await connected(RedisStore(REDIS, prefix=name))
    others = [await connected(RedisStore(REDIS, prefix=name)) for _ in range(4)]
    for store in others:  # four other processes reserved the next four sends, a second apart
        assert (await store.take_turn("host", ask(1.0), time.monotonic())).lease is not None
    admin = redis.Redis.from_url(REDIS)
    assert admin.zcard(f"{{{name}:host}}:l") == 4
    # Its turn is reserved four seconds on, past max_wait: known at once, it
    # fails well before the bound (a wait for the bound would take 3 s).
    throttle = Throttle(policy=FixedRatePolicy(1), max_wait=3.0, store=ours)
    started = time.monotonic()
    with pytest.raises(ThrottleTimeout):
        await asyncio.wait_for(throttle.acquire("host"), 6.0)
    assert time.monotonic() - started < 2.0  # known at once: no waiting for the bound
    await ours.flush()
    assert admin.zcard(f"{{{name}:host}}:l") == 4  # its lease went back
    # Every client closed while the loop runs: one collected after it closes is
    # an unraisable error that fails whichever test runs then.
    for store in [*others, ours]:
        await store.aclose()
    admin.close()


async def test_a_key_of_the_wrong_type_sends_only_its_slot_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="autothrottle")
    name = fresh_prefix()
    admin = redis.Redis.from_url(REDIS)
    admin.set(f"{{{name}:bad}}:s", "not a hash")
    store = RedisStore(REDIS, prefix=name)
    throttle = Throttle(start_delay=0.0, store=store)
    for _ in range(2):
        for host in ("bad", "good"):
            lease = await asyncio.wait_for(throttle.acquire(host), 5.0)
            lease.observe(latency=0.01, status=200)
            lease.release()
    await store.flush()
    assert admin.exists(f"{{{name}:good}}:s")  # the good slot is shared
    assert admin.hget(f"{{{name}:good}}:s", "record") is not None
    messages = [record.getMessage() for record in caplog.records]
    assert any("data error" in m and "'bad'" in m for m in messages), messages
    assert not any("unreachable" in m or "reachable again" in m for m in messages), messages
    await store.aclose()


async def test_forgotten_slots_leave_nothing_behind_in_the_store() -> None:
    clock = FakeClock()
    # What is measured is memory, not speed: a pipeline of a thousand turns under
    # tracemalloc on a loaded machine may take longer than the default 0.25 s, and
    # a process that goes alone keeps its releases to resend, which is not a leak.
    store = RedisStore(REDIS, prefix=fresh_prefix(), idle_timeout=10.0, timeout=10.0)
    throttle = Throttle(start_delay=0.0, store=store, clock=clock)

    async def crawl_and_forget(batch: int) -> None:
        hosts = [f"h{batch}-{i}" for i in range(1000)]
        leases = await asyncio.gather(*(throttle.acquire(host) for host in hosts))
        for lease in leases:
            lease.release()
        await store.flush()
        clock.advance(20.0)
        assert throttle.evict_idle() == 1000

    def held() -> int:
        gc.collect()
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, "*autothrottle/*redis*.py")]
        )
        return sum(stat.size for stat in snapshot.statistics("filename"))

    tracemalloc.start()
    try:
        for batch in range(2):  # past what the first batches leave (connections, scripts)
            await crawl_and_forget(batch)
        first = held()
        for batch in range(2, 5):
            await crawl_and_forget(batch)
        grown = held() - first
    finally:
        tracemalloc.stop()
    assert grown < 50_000, grown  # 3,000 more hosts seen and forgotten
    await store.aclose()


async def test_sync_clients_in_threads_keep_the_fleets_pace() -> None:
    """Three throttles, each with its own store and sync client, as three processes
    would have: one shared pace of 10/s at the host.

    Each sends its ten requests from ten threads at once (a pool, as a sync
    crawler has), once all three stores are connected, so some thread always
    asks for the next turn. Sent one after another, a turn came free whenever
    every client was between a response and its next request, which two busy
    cores made half the gaps (a median of 0.204 s): a verdict on the machine's
    load, not on the fleet's pace. The pace is judged on every turn the fleet
    reserved: a thread that woke past its turn's slack hands the turn back (one
    gap unused at the host: 1 to 7 of 30 at load 4), which the sent turns'
    gaps alone would count against the fleet."""
    name = fresh_prefix()
    granted: list[float] = []
    reserved: list[float] = []
    connected_all = threading.Barrier(3, timeout=30)
    async with site() as target:

        def worker() -> None:
            store = connected_blocking(RedisStore(REDIS, prefix=name))
            grants = Grants(store)
            throttle = Throttle(policy=FixedRatePolicy(10), store=store)
            with ThrottledClient(throttle=throttle) as http, ThreadPoolExecutor(10) as pool:
                connected_all.wait()
                for response in pool.map(lambda _: http.get(target.url), range(10)):
                    response.raise_for_status()
            store.close()
            granted.extend(grants.sent())
            reserved.extend(grants.reserved())

        await asyncio.wait_for(asyncio.gather(*(asyncio.to_thread(worker) for _ in "abc")), 60)
    # One pace, not three (30/s), nor a third of one (3.3/s).
    one_pace_of_ten(granted, target, 30, reserved)


def test_threads_taking_turns_at_once_are_each_counted() -> None:
    # The sync client's threads take turns of several slots at the same time:
    # some asked of Redis (each slot's asks answered in its own thread), some
    # from the runs they reserved. Every turn a thread holds is counted once.
    store = RedisStore(REDIS, prefix=fresh_prefix(), timeout=10.0)  # never alone here
    wide = ask(0.001, cap=10_000)  # no cap, no pause: every answer of Redis is a turn
    held = [0] * 8
    failed: list[BaseException] = []

    def take(index: int) -> None:
        key = f"h{index % 4}"  # two threads a slot: one asks, the other waits behind it
        try:
            while held[index] < 25:
                turn = store.take_turn_blocking(key, wide, time.monotonic())
                if turn.lease is None:  # its last reserved turn is not due yet
                    time.sleep(min(turn.wait, 0.05))
                    continue
                held[index] += 1
                store.released(key, turn.lease)
        except BaseException as error:
            failed.append(error)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60.0)
    finally:
        store.close()
    assert not any(thread.is_alive() for thread in threads)
    assert not failed, failed
    assert held == [25] * 8
    assert store.turns == 200


async def test_a_pause_that_begins_while_a_turn_waits_voids_the_turn() -> None:
    name = fresh_prefix()
    # Ours connected before the others' turns: its first connection after
    # them (past a second on a loaded machine) left them behind, and its turn
    # due at once, before the pause.
    store = await connected(RedisStore(REDIS, prefix=name))
    other = RedisStore(REDIS, prefix=name)
    for _ in range(2):  # another process holds the next two sends, 0.2 s apart
        await other.take_turn("host", ask(0.2), time.monotonic())
    throttle = Throttle(start_delay=0.0, policy=FixedRatePolicy(5), store=store)
    waiting = asyncio.ensure_future(throttle.acquire("host"))  # its turn is ~0.4 s away
    await asyncio.sleep(0.15)
    throttle.observe("host", latency=0.01, status=429, headers={"Retry-After": "1"})
    paused_at = time.monotonic()
    (await asyncio.wait_for(waiting, 5.0)).release()
    assert time.monotonic() - paused_at >= 0.8  # not at its reserved time, in the pause
    await store.aclose()
    await other.aclose()


async def test_turns_are_reserved_the_spacing_margin_wider_than_the_gap() -> None:
    name = fresh_prefix()
    # Two processes, connected first: the second's first connection, made
    # after the first turn, would leave the first turn's next free time behind.
    stores = [await connected(RedisStore(REDIS, prefix=name)) for _ in "ab"]
    margin = TurnAsk(0.5, 0.0, 60.0, 8, 300.0, 300.0, SPACING_MARGIN)
    asked = time.monotonic()
    first = await stores[0].take_turn("host", margin, asked)
    answered = time.monotonic()
    second = await stores[1].take_turn("host", margin, time.monotonic())
    # The slot's phase point: at most a gap after Redis ran the script, which a
    # loaded machine may do a few ms after the turn was asked for.
    assert 0.0 <= first.wait <= 0.5 + (answered - asked) + 0.005
    assert first.due is not None and second.due is not None
    # The first process's first turn of the slot: room for a new connection after it.
    fresh = min(FRESH_ROOM * 0.5, FRESH_MOST)
    assert second.due - first.due == pytest.approx(0.5 * SPACING_MARGIN + fresh, abs=0.003)
    assert SPACING_MARGIN > 1.0
    for store in stores:
        await store.aclose()


async def test_a_process_that_stood_still_is_not_taken_for_a_slow_redis(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A loaded machine: the process gets no CPU for longer than the timeout
    # while Redis answers at once. Taken for a slow Redis, it would go on alone
    # and add its pace to the fleet's (the host above its limit).
    # The timeout leaves Redis itself room on a loaded machine (at load 10 it
    # took over 0.1 s to answer); the process stands still for more than twice it.
    store = RedisStore(REDIS, prefix=fresh_prefix(), timeout=0.5)
    await store.take_turn("warm", ask(0.0), time.monotonic())  # connected, scripts loaded
    loop = asyncio.get_running_loop()
    for host in ("a", "b", "c"):  # a slot each: no turn of its own to wait for (rule 8)
        loop.call_later(0.0005, time.sleep, 1.2)  # the process stands still meanwhile
        with caplog.at_level(logging.WARNING, logger="autothrottle"):
            turn = await store.take_turn(host, ask(0.1), time.monotonic())
        assert turn.lease is not None  # shared, not alone
    assert "unreachable" not in caplog.text
    await store.aclose()


def test_try_acquire_refuses_to_bypass_the_fleet() -> None:
    # A lease taken without the fleet's turn would add this process's pace to
    # the fleet's; the fleet's turn needs a round trip, which try_acquire never waits for.
    throttle = Throttle(store=RedisStore(REDIS, prefix=fresh_prefix()))
    with pytest.raises(TypeError, match="try_acquire"):
        throttle.try_acquire("host")

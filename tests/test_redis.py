"""The fleet: slot state shared through a real Redis (docs/fleet.md).

These tests need Redis on 127.0.0.1:6379 (CI starts it); elsewhere they skip,
saying why. Tests that stop Redis run their own redis-server on a free port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from autothrottle import FixedRatePolicy, Throttle
from autothrottle.aiohttp import ThrottledSession
from autothrottle.redis import RedisStore

REDIS = "redis://127.0.0.1:6379/0"
HERE = Path(__file__).resolve().parent


def _reachable(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


@pytest.fixture(autouse=True)
def _needs_redis() -> None:
    if _reachable(6379):
        return
    if os.environ.get("CI"):
        pytest.fail("Redis is not running on 127.0.0.1:6379 (.ci/run starts it)")
    pytest.skip("no Redis on 127.0.0.1:6379: start one with `redis-server --daemonize yes`")


def prefix() -> str:
    return f"test-{uuid.uuid4().hex}"


class Site:
    """A loopback server recording arrival times (and answering with a status)."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.delay = 0.0
        self.arrived = asyncio.Event()
        self.status = 200
        self.headers: dict[str, str] = {}
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.arrivals.append(time.monotonic())
        self.arrived.set()
        await asyncio.sleep(self.delay)
        return web.Response(status=self.status, headers=self.headers, text="ok")

    def most_in_a_second(self) -> int:
        times = sorted(self.arrivals)
        return max(
            (sum(1 for t in times[i:] if t < start + 1.0) for i, start in enumerate(times)),
            default=0,
        )

    def rate(self) -> float:
        times = sorted(self.arrivals)
        return (len(times) - 1) / (times[-1] - times[0])


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


async def test_four_processes_keep_the_pace_of_one() -> None:
    name = prefix()
    async with site() as target:
        workers = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                str(HERE / "fleet_worker.py"),
                target.url,
                REDIS,
                name,
                "10",
                stdout=asyncio.subprocess.PIPE,
            )
            for _ in range(4)
        ]
        outputs = [await worker.communicate() for worker in workers]
    lines = [line for out, _ in outputs for line in out.decode().splitlines()]
    assert lines.count("ok 200") == 40, lines
    assert len(target.arrivals) == 40
    assert 9.0 <= target.rate() <= 10.6, target.rate()  # FixedRatePolicy(10), burst 1
    assert target.most_in_a_second() <= 10 + 1


async def test_a_retry_after_seen_by_one_pauses_the_others() -> None:
    name = prefix()
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
    async with site() as target:
        one, other = RedisStore(REDIS, prefix=prefix()), RedisStore(REDIS, prefix=prefix())
        await asyncio.gather(crawl(target.url, one, 1, 0.2), crawl(target.url, other, 1, 0.2))
        await one.aclose()
        await other.aclose()
    first, second = sorted(target.arrivals)
    assert second - first < 1.0  # each went at once; one shared slot at 0.2/s would wait 5 s


async def test_a_crashed_workers_lease_comes_back_after_it_expires() -> None:
    name = prefix()
    crashed, alive = RedisStore(REDIS, prefix=name), RedisStore(REDIS, prefix=name)
    turn = await crashed.take_turn("host", gap=0.0, cap=1, hold=1.0)
    assert turn.lease is not None  # and never released: the worker died
    blocked = await alive.take_turn("host", gap=0.0, cap=1, hold=1.0)
    assert blocked.lease is None and blocked.wait > 0  # the fleet is at its cap
    await asyncio.sleep(1.1)
    later = await alive.take_turn("host", gap=0.0, cap=1, hold=1.0)
    assert later.lease is not None
    await crashed.aclose()
    await alive.aclose()


async def test_a_worker_killed_mid_request_gives_its_share_back_when_its_lease_expires() -> None:
    # A fleet cap of 1: while the killed worker's lease lives, nobody may send.
    name = prefix()
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
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(survivor.communicate(), 30)
    assert out.decode().split() == ["ok", "200"]
    assert len(target.arrivals) == 2
    waited = target.arrivals[1] - killed_at
    assert 0.5 <= waited <= 10.0  # held by the dead lease, then let go on its expiry


async def test_a_new_process_starts_from_what_the_fleet_learned() -> None:
    name = prefix()
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
    while not _reachable(port) and time.monotonic() < deadline:
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
            store = RedisStore(url, prefix=prefix(), timeout=0.2, retry_after=0.3)
            crawler = asyncio.create_task(crawl(target.url, store, 30, rate=20.0))
            await asyncio.sleep(0.4)
            first.kill()
            first.wait()
            await asyncio.sleep(0.6)
            with own_redis(port):
                await asyncio.wait_for(crawler, 30)  # every request succeeded
                await store.take_turn("after", gap=0.0, cap=8, hold=1.0)
                await store.aclose()
    assert len(target.arrivals) == 30
    assert target.most_in_a_second() <= 20 + 1  # paced alone meanwhile, not unthrottled
    messages = [record.getMessage() for record in caplog.records]
    assert sum("unreachable" in m for m in messages) == 1  # one warning per outage
    assert any("reachable again" in m for m in messages)


async def test_fail_closed_waits_for_redis_instead_of_going_alone() -> None:
    store = RedisStore(
        f"redis://127.0.0.1:{_free_port()}/0", prefix=prefix(), fail_closed=True, timeout=0.1
    )
    throttle = Throttle(start_delay=0.0, store=store, max_wait=0.5)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(throttle.acquire("host"), 1.0)


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
        name = prefix()
        stores = [RedisStore(url, prefix=name, timeout=0.2, retry_after=30) for _ in "ab"]
        for _ in range(2):
            for store in stores:
                turn = await store.take_turn("host", gap=0.1, cap=8, hold=5.0)
                assert turn.lease is not None
        server.kill()
        server.wait()
        first = await stores[0].take_turn("host", gap=0.1, cap=8, hold=5.0)
        assert (first.lease, first.wait) == (None, 0.0)  # down: go, alone
        second = await stores[0].take_turn("host", gap=0.1, cap=8, hold=5.0)
        assert second.lease is None
        assert second.wait == pytest.approx(0.2, abs=0.05)  # 0.1 s times 2 processes

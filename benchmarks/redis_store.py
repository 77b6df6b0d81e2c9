"""The Redis store: what sharing costs, how many turns Redis gives, how polite a fleet is.

Run with ``python benchmarks/redis_store.py`` (about a minute; Redis on
127.0.0.1:6379, ``--redis URL`` for another). Loopback only.

* **Cost per request**: one throttle, ``acquire`` + ``observe`` + ``release``
  in a loop with nothing to wait for, with a ``MemoryStore`` and with a
  ``RedisStore``: the time added per request and the round trips per request
  (``RedisStore.round_trips``: a turn is one, a background flush one more).
* **Turns per second**: 1, 4 and 16 processes taking turns as fast as Redis
  gives them, on one slot (gap 0) and spread over 1,000 slots.
* **Politeness**: 1 and 4 processes through one slot to a loopback server,
  with ``FixedRatePolicy(10)`` (the host's rate and the most requests in any
  second), and with AutoThrottle's rules (target 1, a server answering in
  50 ms), where the fleet should keep one process's rate.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import time
import uuid
from typing import Any

from _common import write_results
from aiohttp import web

from autothrottle import AutoThrottlePolicy, FixedRatePolicy, Throttle
from autothrottle.aiohttp import ThrottledSession
from autothrottle.redis import RedisStore
from autothrottle.store import MemoryStore


async def cost(redis: str, count: int) -> dict[str, float]:
    results: dict[str, float] = {}
    for name in ("memory", "redis"):
        store: Any = (
            MemoryStore() if name == "memory" else RedisStore(redis, prefix=uuid.uuid4().hex)
        )
        throttle = Throttle(start_delay=0.0, max_delay=0.0, max_concurrency=10**6, store=store)
        start = time.perf_counter()
        for index in range(count):
            lease = await throttle.acquire(f"host{index % 10}")
            lease.observe(latency=0.01, status=200)
            lease.release()
        results[f"{name}_us"] = 1e6 * (time.perf_counter() - start) / count
        if isinstance(store, RedisStore):
            await store.flush()
            results["round_trips_per_request"] = store.round_trips / count
            await store.aclose()
    results["added_us"] = results["redis_us"] - results["memory_us"]
    return results


def _turns(redis: str, prefix: str, slots: int, seconds: float, out: Any) -> None:
    async def run() -> int:
        store = RedisStore(redis, prefix=prefix, timeout=2.0)
        end = time.monotonic() + seconds
        turns = 0
        while time.monotonic() < end:
            turn = await store.take_turn(f"s{turns % slots}", gap=0.0, cap=10**6, hold=1.0)
            if turn.lease is not None:
                store.released(f"s{turns % slots}", turn.lease)
                turns += 1
        await store.aclose()
        return turns

    out.put(asyncio.run(run()))


def turns_per_second(redis: str, processes: int, slots: int, seconds: float = 3.0) -> float:
    queue: Any = multiprocessing.Queue()
    prefix = uuid.uuid4().hex
    workers = [
        multiprocessing.Process(target=_turns, args=(redis, prefix, slots, seconds, queue))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    total = sum(queue.get() for _ in workers)
    for worker in workers:
        worker.join()
    return total / seconds


def _crawl(redis: str, prefix: str, url: str, count: int, policy: str, out: Any) -> None:
    async def run() -> None:
        store = RedisStore(redis, prefix=prefix)
        chosen: Any = FixedRatePolicy(10) if policy == "fixed" else AutoThrottlePolicy()
        throttle = Throttle(policy=chosen, start_delay=0.1, store=store)
        async with ThrottledSession(throttle=throttle) as session:

            async def one_task() -> None:
                for _ in range(count):
                    async with session.get(url) as response:
                        await response.read()

            await asyncio.gather(*(one_task() for _ in range(4)))
        await store.aclose()

    asyncio.run(run())
    out.put(True)


async def politeness(redis: str, processes: int, policy: str, seconds: float) -> dict[str, float]:
    arrivals: list[float] = []

    async def handle(request: web.Request) -> web.Response:
        arrivals.append(time.monotonic())
        await asyncio.sleep(0.05)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.2", 0)
    await site.start()
    url = f"http://127.0.0.2:{runner.addresses[0][1]}/"
    count = int(seconds * 10 / processes / 4) + 1 if policy == "fixed" else int(seconds * 5)
    queue: Any = multiprocessing.Queue()
    prefix = uuid.uuid4().hex
    workers = [
        multiprocessing.Process(target=_crawl, args=(redis, prefix, url, count, policy, queue))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:  # the server runs on this loop: wait without blocking it
        await asyncio.to_thread(worker.join, seconds * 3)
    await runner.cleanup()
    times = sorted(arrivals[len(arrivals) // 10 :])  # past the start
    window = max(sum(1 for t in times[i:] if t < s + 1.0) for i, s in enumerate(times))
    return {
        "requests": len(arrivals),
        "rate": (len(times) - 1) / (times[-1] - times[0]),
        "max_in_1s": window,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"cost": await cost(args.redis, args.requests)}
    c = results["cost"]
    print(
        f"per request: memory {c['memory_us']:.0f} µs, redis {c['redis_us']:.0f} µs "
        f"(+{c['added_us']:.0f} µs), {c['round_trips_per_request']:.2f} round trips",
        flush=True,
    )
    results["turns"] = {}
    for slots in (1, 1000):
        for processes in (1, 4, 16):
            rate = turns_per_second(args.redis, processes, slots)
            results["turns"][f"{processes}x{slots}"] = rate
            print(f"turns/s, {processes:2} processes, {slots:4} slot(s): {rate:,.0f}", flush=True)
    results["politeness"] = {}
    for policy in ("fixed", "autothrottle"):
        for processes in (1, 4):
            row = await politeness(args.redis, processes, policy, args.seconds)
            results["politeness"][f"{policy} x{processes}"] = row
            print(
                f"{policy:12} {processes} process(es): {row['rate']:.2f}/s at the host, "
                f"at most {row['max_in_1s']} in any 1 s",
                flush=True,
            )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument(
        "--name", default="redis_store", help="results file name (default redis_store)"
    )
    arguments = parser.parse_args()
    found = asyncio.run(main(arguments))
    print(f"results: {write_results(arguments.name, {'figures': found})}")
    sys.exit(0)

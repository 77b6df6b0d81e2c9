"""stats() and snapshot() over many slots: how long each blocks the event loop.

Run with ``python benchmarks/stats.py`` (a few seconds; ``--slots N``). A
throttle with N slots, each with some traffic, then: ``stats()``,
``stats(top=20)``, ``snapshot()`` (each one blocking call), and
``stats_async(top=20)`` / ``snapshot_async()`` with the longest stretch the
event loop went without running another task while they ran.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from autothrottle import Throttle


def build(slots: int) -> Throttle:
    now = [1000.0]
    throttle = Throttle(start_delay=0.0, clock=lambda: now[0])
    for index in range(slots):
        lease = throttle.try_acquire(f"host{index}")
        assert lease is not None
        lease.observe(latency=0.01 * (1 + index % 7), status=200 if index % 9 else 429)
        lease.release()
    return throttle


def blocking(name: str, call: Callable[[], Any]) -> None:
    start = time.perf_counter()
    call()
    print(f"{name:28} {1000 * (time.perf_counter() - start):8.1f} ms (one blocking call)")


async def longest_block(name: str, call: Callable[[], Awaitable[Any]]) -> None:
    gaps: list[float] = []
    done = False

    async def ticker() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    start = time.perf_counter()
    await call()
    total = time.perf_counter() - start
    done = True
    await task
    longest = 1000 * max(gaps)
    print(f"{name:28} {1000 * total:8.1f} ms in all, loop blocked at most {longest:.1f} ms")


async def main(slots: int) -> None:
    throttle = build(slots)
    print(f"{slots:,} slots")
    blocking("stats()", throttle.stats)
    blocking("stats(top=20)", lambda: throttle.stats(top=20))
    blocking("snapshot()", throttle.snapshot)
    await longest_block("stats_async(top=20)", lambda: throttle.stats_async(top=20))
    await longest_block("snapshot_async()", throttle.snapshot_async)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=100_000)
    asyncio.run(main(parser.parse_args().slots))

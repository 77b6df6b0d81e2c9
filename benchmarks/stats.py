"""stats() and snapshot() over many slots: how long each blocks the event loop.

Run with ``python benchmarks/stats.py`` (a few seconds; ``--slots N``). A
throttle with N slots, each with some traffic, then: ``stats()``,
``stats(top=20)``, ``snapshot()`` (each one blocking call), and
``stats_async(top=20)`` / ``snapshot_async()`` with the longest stretch the
event loop went without running another task while they ran. Each blocking
call's time is also given a slot, by the clock and in CPU (``time.process_time``;
on a loaded machine the CPU is the steadier figure).

``--bytecodes`` counts instead (``sys.settrace`` over one call on 1,000 slots):
the bytecodes each function runs and the calls made of it, a slot, for
``snapshot()``, ``stats(top=20)`` and ``stats()``. Counts do not move with the
machine's load; the clock does.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _bytecodes import BytecodeCount

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


def blocking(name: str, call: Callable[[], Any], slots: int) -> None:
    start, cpu = time.perf_counter(), time.process_time()
    call()
    took, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(
        f"{name:28} {1000 * took:8.1f} ms (one blocking call; {1e6 * took / slots:.1f} µs a slot, "
        f"CPU {1e6 * cpu / slots:.1f})"
    )


def count_bytecodes(name: str, call: Callable[[], Any], slots: int) -> None:
    """Per function: bytecodes run and calls made by one ``call()``, a slot."""
    counted = BytecodeCount()
    call()  # warm
    with counted:
        call()
    ops, calls = counted.ops, counted.calls
    print(
        f"{name}: {sum(ops.values()) / slots:,.0f} bytecodes and "
        f"{sum(calls.values()) / slots:.1f} calls a slot"
    )
    for where in sorted(ops.keys() | calls.keys(), key=lambda each: -ops[each]):
        if ops[where] >= slots / 10:
            print(f"  {ops[where] / slots:8.1f} {calls[where] / slots:6.2f}  {where}")


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
    blocking("stats()", throttle.stats, slots)
    blocking("stats(top=20)", lambda: throttle.stats(top=20), slots)
    blocking("snapshot()", throttle.snapshot, slots)
    await longest_block("stats_async(top=20)", lambda: throttle.stats_async(top=20))
    await longest_block("snapshot_async()", throttle.snapshot_async)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=100_000)
    parser.add_argument("--bytecodes", action="store_true", help="count, on 1,000 slots")
    args = parser.parse_args()
    if args.bytecodes:
        counted = build(1000)
        count_bytecodes("snapshot()", counted.snapshot, 1000)
        count_bytecodes("stats(top=20)", lambda: counted.stats(top=20), 1000)
        count_bytecodes("stats()", counted.stats, 1000)
    else:
        asyncio.run(main(args.slots))

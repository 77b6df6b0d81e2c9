"""The client's own lag read as the host's latency: the capacity site on a virtual clock.

Run with ``python benchmarks/lag_replay.py`` (a few seconds; no network, no
server). The capacity site of ``benchmarks/adaptive.py`` (4 workers, 50 ms a
page, 80/s) crawled by the one policy (``AdaptiveConcurrencyPolicy()``, as
adaptive.py's one-policy client: start 0.5 s, 16 per host, 32 tasks) on
looptime's fake-time loop, each answer read ``--lag`` seconds late on
average (exponential): what a loaded client's event loop does to every
answer. The client's timers are as late (each draws its own lag from the
same law): a request the gate told to wait is let go late, as a loaded loop
lets it go, and the gate sees that. The host's work is the same at every
lag; what changes is what the client reads. For each lag it prints the
goodput over the second half (as adaptive.py's "steady") against the 80/s
the workers serve, the mean queue at the host (requests waiting for a
worker, the goal's measure), the limit the policy ended at and the
lateness the gate measured (docs/signals.md, "The client's own lag"); beside
it, the same crawl with the limit pinned at the host's 4 workers (what the
lag costs by holding a request in flight while the client reads it late,
the policy's reading aside).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import random
import statistics
from collections.abc import Callable
from typing import Any

import looptime

from autothrottle import AdaptiveConcurrencyPolicy, Throttle

HOST = "capacity.test"
WORKERS = 4
SERVICE = 0.05
CAPACITY = WORKERS / SERVICE
TASKS = 32
WALL = 1_700_000_000.0

_CLIENT = contextvars.ContextVar("client", default=False)
"""True while a task runs the client's own code (its timers run late), not the host's."""


def lag_client_timers(loop: asyncio.AbstractEventLoop, rng: random.Random, lag: float) -> None:
    """Make every timer the client sets on ``loop`` fire late by an exponential lag of
    mean ``lag``, as a loaded event loop runs it; the host's timers stay on time."""
    call_at = loop.call_at

    def late_call_at(when: float, callback: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        if lag and _CLIENT.get():
            when += rng.expovariate(1.0 / lag)
        return call_at(when, callback, *args, **kw)

    loop.call_at = late_call_at  # type: ignore[method-assign]


async def crawl(
    seconds: float, lag: float, seed: int, pinned: bool
) -> tuple[float, float, float, float]:
    """The steady goodput's share of the capacity, the mean queue at the host (requests
    waiting for a worker, over the second half), the limit the policy ended at, and
    the lateness the gate measured (its average as the crawl ended)."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    lag_client_timers(loop, random.Random(seed + 1000), lag)
    # Pinned: the limit never moves from the host's workers (never above, no queue read).
    policy = (
        AdaptiveConcurrencyPolicy(initial_limit=WORKERS, max_limit=WORKERS, beta=1e9)
        if pinned
        else AdaptiveConcurrencyPolicy()
    )
    throttle = Throttle(
        policy=policy,
        start_delay=0.5,
        max_delay=10.0,
        max_concurrency=16,
        clock=loop.time,
        wall_clock=lambda: WALL + loop.time(),
    )
    workers = asyncio.Semaphore(WORKERS)
    served: list[float] = []
    waited = [0.0]

    async def task() -> None:
        while loop.time() < seconds:
            _CLIENT.set(True)
            lease = await throttle.acquire(HOST)
            _CLIENT.set(False)
            sent = loop.time()
            arrived = loop.time()
            async with workers:
                if arrived >= seconds / 2:
                    waited[0] += loop.time() - arrived
                await asyncio.sleep(SERVICE * rng.uniform(0.9, 1.1))
            served.append(loop.time())
            await asyncio.sleep(rng.expovariate(1.0 / lag) if lag else 0.0)
            lease.observe(latency=loop.time() - sent, status=200)
            lease.release()

    await asyncio.gather(*(task() for _ in range(TASKS)))
    state = throttle.store.load(HOST)
    limit = state.policy_state.get("limit", 0.0) if state is not None else 0.0
    steady = sum(1 for at in served if at >= seconds / 2) / (seconds / 2)
    lateness = throttle.slot(HOST)._live.gate.lateness
    return steady / CAPACITY, waited[0] / (seconds / 2), limit, lateness


def run(seconds: float, lag: float, seed: int, pinned: bool) -> tuple[float, float, float, float]:
    loop = looptime.new_event_loop(start=0.0)
    try:
        return loop.run_until_complete(crawl(seconds, lag, seed, pinned))
    finally:
        loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--lag", default="0,0.002,0.005,0.01,0.02,0.05", help="mean client lags, seconds"
    )
    args = parser.parse_args()
    for lag in (float(x) for x in args.lag.split(",")):
        policy = [run(args.seconds, lag, seed, False) for seed in range(args.seeds)]
        pinned = [run(args.seconds, lag, seed, True) for seed in range(args.seeds)]
        print(
            f"lag {1000 * lag:4.0f} ms: one policy {statistics.fmean(r[0] for r in policy):4.0%} "
            f"of {CAPACITY:.0f}/s, queue {statistics.fmean(r[1] for r in policy):.2f}, "
            f"limits {', '.join(f'{r[2]:g}' for r in policy)}, "
            f"lateness {1000 * statistics.fmean(r[3] for r in policy):.1f} ms; "
            f"limit pinned at {WORKERS}: {statistics.fmean(r[0] for r in pinned):4.0%}, "
            f"queue {statistics.fmean(r[1] for r in pinned):.2f}"
        )


if __name__ == "__main__":
    main()

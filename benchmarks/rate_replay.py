"""The rate429 site replayed on a virtual clock: the engine's own rules, no load noise.

Run with ``python benchmarks/rate_replay.py`` (a second or two; no network,
no server). ``benchmarks/adaptive.py`` measures the rate429 site (a token
bucket of 10/s, burst 2, answering the excess with 429 and ``Retry-After``
only) through real clients on a loaded machine, where a run's figure swings
by a few percent. This runs the same throttle (``AutoThrottlePolicy``,
Scrapy's settings: start 0.5 s, max 10 s, 16 per host, target 1) from 32
tasks against the simulator's own bucket on looptime's fake-time loop: each
request reaches the host ``--wire`` seconds after its turn, is served in 10
ms (+-10 %) or refused at once, and its answer comes back ``--wire`` later,
plus ``--lag`` seconds of client time (exponential, the mean given) to stand
for a loaded machine. Every decision is the engine's, on the loop's clock.

``--walk`` replays a short crawl instead: ``Throttle(start_delay=0.05)`` (the
adaptive policy), 8 tasks, 40 requests, against a 5/s bucket with a burst of
1, refusals not retried (``--host-rate`` and ``--start-delay`` change those);
it prints how long the crawl took, the requests let through and refused, and
the slot's delay and backoffs at the end (``docs/recovery.md``, "The refused
pace").

Otherwise it prints, for each seed, the goodput over ``--seconds`` from the first
arrival (as ``adaptive.py`` counts it), the share refused, the pages in the
first two seconds, the goodput from the second second on, and each refusal
that backed off (when, the delay before and after, the pause it left); then
the mean over the seeds.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
from dataclasses import dataclass, field

import looptime
from _replay import through_bucket

from autothrottle import AdaptiveConcurrencyPolicy, AutoThrottlePolicy, Throttle
from autothrottle.sim._buckets import Bucket

HOST = "rate429.test"
TASKS = 32
WALL = 1_700_000_000.0


@dataclass
class Run:
    """What one replay saw, at the host."""

    ok: list[float] = field(default_factory=list)  # arrival times of served requests
    refused: list[float] = field(default_factory=list)
    backoffs: list[tuple[float, float, float, float]] = field(default_factory=list)


async def crawl(seconds: float, seed: int, wire: float, lag: float, policy: str) -> Run:
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    # The one policy gets no target, as adaptive.py's one-policy client.
    settings = (
        {"policy": AdaptiveConcurrencyPolicy()}
        if policy == "adaptive"
        else {
            "policy": AutoThrottlePolicy(),
            "target_concurrency": 1.0,
        }
    )
    throttle = Throttle(
        start_delay=0.5,
        max_delay=10.0,
        max_concurrency=16,
        clock=loop.time,
        wall_clock=lambda: WALL + loop.time(),
        **settings,
    )
    start = loop.time()
    bucket = Bucket(10.0, 2, start)
    run = Run()
    deadline = start + seconds + 1.0

    async def worker() -> None:
        while loop.time() < deadline:
            lease = await throttle.acquire(HOST)
            sent = loop.time()
            status, headers = await through_bucket(bucket, run.ok, run.refused, rng, wire, lag)
            slot = throttle.slot(HOST)
            before, backoffs = slot.delay, slot.snapshot().backoffs
            lease.observe(latency=loop.time() - sent, status=status, headers=headers)
            lease.release()
            snap = slot.snapshot()
            if snap.backoffs > backoffs:
                run.backoffs.append((loop.time() - start, before, snap.delay, snap.pause_remaining))

    await asyncio.gather(*(worker() for _ in range(TASKS)))
    return run


async def walk(
    seed: int, wire: float, lag: float, rate: float, start_delay: float | None
) -> tuple[float, Run, float, int]:
    """The short crawl of ``--walk``: how long it took, what the host saw, and the
    slot's delay and backoffs at the end."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    throttle = Throttle(
        start_delay=start_delay, clock=loop.time, wall_clock=lambda: WALL + loop.time()
    )
    start = loop.time()
    bucket = Bucket(rate, 1, start)
    run = Run()
    left = 40

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            lease = await throttle.acquire(HOST)
            sent = loop.time()
            status, headers = await through_bucket(bucket, run.ok, run.refused, rng, wire, lag)
            lease.observe(latency=loop.time() - sent, status=status, headers=headers)
            lease.release()

    await asyncio.gather(*(worker() for _ in range(8)))
    snap = throttle.slot(HOST).snapshot()
    return loop.time() - start, run, snap.delay, snap.backoffs


def walks(args: argparse.Namespace) -> None:
    """``--walk``, seed by seed."""
    for seed in range(args.seeds):
        loop = looptime.new_event_loop(start=0.0)
        try:
            took, run, delay, backoffs = loop.run_until_complete(
                walk(seed, args.wire, args.lag, args.host_rate, args.start_delay or None)
            )
        finally:
            loop.close()
        print(
            f"seed {seed}: took {took:.2f} s, {len(run.ok)} let through, "
            f"{len(run.refused)} refused, delay {delay:.3f}, {backoffs} backoffs"
        )


def figures(run: Run, seconds: float) -> dict[str, float]:
    t0 = min(run.ok + run.refused)
    ok = [a for a in run.ok if a < t0 + seconds]
    refused = [a for a in run.refused if a < t0 + seconds]
    return {
        "goodput": len(ok) / seconds,
        "refused": len(refused) / max(1, len(ok) + len(refused)),
        "first2": sum(1 for a in ok if a < t0 + 2.0),
        "steady": sum(1 for a in ok if a >= t0 + 2.0) / (seconds - 2.0),
        "backoffs": sum(1 for b in run.backoffs if b[0] < seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--wire", type=float, default=0.0005, help="one-way seconds")
    parser.add_argument("--lag", type=float, default=0.002, help="mean client lag, seconds")
    parser.add_argument("--policy", choices=("autothrottle", "adaptive"), default="autothrottle")
    parser.add_argument("--quiet", action="store_true", help="the summary lines only")
    parser.add_argument(
        "--walk", action="store_true", help="40 requests of 8 tasks at a 5/s host, burst 1"
    )
    parser.add_argument("--host-rate", type=float, default=5.0, help="--walk: the host's rate")
    parser.add_argument(
        "--start-delay", type=float, default=0.05, help="--walk: the start delay (0: the default)"
    )
    args = parser.parse_args()
    if args.walk:
        walks(args)
        return
    rows = []
    for seed in range(args.seeds):
        loop = looptime.new_event_loop(start=0.0)
        try:
            run = loop.run_until_complete(
                crawl(args.seconds, seed, args.wire, args.lag, args.policy)
            )
        finally:
            loop.close()
        f = figures(run, args.seconds)
        rows.append(f)
        print(
            f"seed {seed}: {f['goodput']:.2f}/s, {f['refused']:.1%} refused, "
            f"{f['first2']:.0f} pages in the first 2 s, {f['steady']:.2f}/s after, "
            f"{f['backoffs']:.0f} backoffs"
        )
        if not args.quiet:
            for at, before, after, pause in run.backoffs:
                if at < args.seconds:
                    print(f"    {at:7.3f} s  delay {before:.4f} -> {after:.4f}  pause {pause:.3f}")
    mean = {k: statistics.fmean(r[k] for r in rows) for k in rows[0]}
    print(
        f"mean: {mean['goodput']:.2f}/s, {mean['refused']:.1%} refused, "
        f"{mean['first2']:.1f} pages in the first 2 s, {mean['steady']:.2f}/s after, "
        f"{mean['backoffs']:.1f} backoffs"
    )


if __name__ == "__main__":
    main()

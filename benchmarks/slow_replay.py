"""One crawl_10k host replayed on a virtual clock: a slow strict host, the default policy.

Run with ``python benchmarks/slow_replay.py`` (a few seconds; no network, no
server). ``benchmarks/crawl_10k.py`` crawls 10,000 hosts, each a token bucket
``RateLimited(rate=0.05, burst=2, headers=False)``: one request every 20 s,
a burst of 2, the excess answered with a 429 and ``Retry-After`` (whole
seconds until the next token, at least 1). Its hosts are independent but for
the client's CPU, so one host's replay is the crawl's: ``Throttle()`` as
shipped (the adaptive policy) and one task fetching back to back, against
the simulator's own bucket on looptime's fake-time loop. Each request
reaches the host ``--wire`` seconds after its turn, is served in 10 ms
(+-10 %) or refused at once, and its answer comes back ``--wire`` later,
plus ``--lag`` seconds of client time (exponential, the mean given: the
crawl's event loop runs late at 10,000 hosts). Every decision is the
engine's, on the loop's clock.

Each seed is one host starting at a time as crawl_10k starts them (host *i*
at *i* / 500 s: spread over one period), and the figures are crawl_10k's:
refusals a host within ``--seconds`` of the crawl's start, and goodput (200s
at the host a second) from one period on, against the host's rate. It prints
both for 60 s and 300 s, and with ``--trace`` each refusal of the first few
hosts: when, the delay before and after, the pause it left, and the refused
gap and recovery time the slot learned.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
from dataclasses import dataclass, field

import looptime
from _replay import through_bucket

from autothrottle import Throttle
from autothrottle.sim._buckets import Bucket

HOST = "h1.crawl.test"
RATE = 0.05
PERIOD = 1.0 / RATE
WALL = 1_700_000_000.0


@dataclass
class Run:
    """What one host saw, at the host (times from the crawl's start)."""

    ok: list[float] = field(default_factory=list)
    refused: list[float] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)


async def host(seconds: float, start: float, seed: int, wire: float, lag: float, burst: int) -> Run:
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    throttle = Throttle(clock=loop.time, wall_clock=lambda: WALL + loop.time())
    await asyncio.sleep(start)
    bucket = Bucket(RATE, burst, loop.time())
    run = Run()
    while loop.time() < seconds:
        lease = await throttle.acquire(HOST)
        sent = loop.time()
        status, headers = await through_bucket(bucket, run.ok, run.refused, rng, wire, lag)
        slot = throttle.slot(HOST)
        before = slot.delay
        lease.observe(latency=loop.time() - sent, status=status, headers=headers)
        lease.release()
        if status == 429:
            snap = slot.snapshot()
            record = throttle.store.load(HOST)
            learned = ""
            if record is not None:
                learned = f"  gap {record.refused_gap:.2f} s, back in {record.recover_in:.0f} s"
            run.trace.append(
                f"    {run.refused[-1] - start:7.2f} s  Retry-After {headers['Retry-After']:>2}  "
                f"delay {before:.3f} -> {snap.delay:.3f}  pause {snap.pause_remaining:.2f}{learned}"
            )
    return run


def figures(run: Run, seconds: float) -> tuple[int, float]:
    """Refusals within ``seconds``, and goodput from one period on as a share of the rate."""
    refused = sum(1 for a in run.refused if a < seconds)
    ok = sum(1 for a in run.ok if PERIOD <= a < seconds)
    return refused, ok / (RATE * (seconds - PERIOD))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=40, help="hosts (seeds) replayed")
    parser.add_argument("--wire", type=float, default=0.0005, help="one-way seconds")
    parser.add_argument("--lag", type=float, default=0.02, help="mean client lag, seconds")
    parser.add_argument("--trace", type=int, default=3, help="hosts whose refusals are shown")
    parser.add_argument("--burst", type=int, default=2, help="the hosts' burst (crawl_10k: 2)")
    args = parser.parse_args()
    rows: dict[float, list[tuple[int, float]]] = {60.0: [], 300.0: []}
    for seed in range(args.hosts):
        start = PERIOD * seed / args.hosts
        loop = looptime.new_event_loop(start=0.0)
        try:
            run = loop.run_until_complete(host(300.0, start, seed, args.wire, args.lag, args.burst))
        finally:
            loop.close()
        for seconds, row in rows.items():
            row.append(figures(run, seconds))
        if seed < args.trace:
            print(f"host {seed} (starts at {start:.2f} s): {len(run.refused)} refusals in 300 s")
            for line in run.trace:
                print(line)
    for seconds, row in rows.items():
        refusals = statistics.fmean(r for r, _ in row)
        goodput = statistics.fmean(g for _, g in row)
        print(
            f"{seconds:.0f} s: {refusals:.2f} refusals a host (most {max(r for r, _ in row)}), "
            f"goodput {goodput:.1%} of the rate from {PERIOD:.0f} s on"
        )


if __name__ == "__main__":
    main()

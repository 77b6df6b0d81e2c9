"""Scrapy's AutoThrottle rule on the mixed site, simulated: the load the rule itself causes.

Run with ``python benchmarks/scrapy_rule.py`` (a few seconds; no network, no
Scrapy). ``benchmarks/adaptive.py`` compares the host's queue under
``AutoThrottlePolicy`` with Scrapy's own; a real Scrapy also spends CPU on each
request, so its figures mix its rule with its speed. This runs the rule alone
on a simulated clock: Scrapy's downloader slot (one send per delay, a pending
send not moved by a falling delay, 16 in flight at most) and AutoThrottle's
update (``max(target, (delay + target) / 2)``, ``target = latency / 4``, start
0.5 s, max 10 s) against the mixed site (4 workers in FIFO, 70 % of pages 30
ms, 30 % 800 ms), with ``--overhead`` seconds of client time added to every
latency. It prints the goodput and the mean queue at the host over 300 s, and
their spread over 15-s runs (as ``adaptive.py --quick`` measures).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import statistics


def crawl(seconds: float, seed: int, overhead: float = 0.0) -> tuple[float, float]:
    """(goodput/s, time-average queue at the host) of one simulated crawl."""
    rng = random.Random(seed)
    order = itertools.count()
    events: list[tuple[float, int, str, float]] = []  # (time, order, kind, sent at)
    waiting: list[float] = []  # sent-at times of requests queued at the host
    busy = in_flight = served = 0
    delay, lastseen, later = 0.5, -1e9, False
    area = last = 0.0

    def push(at: float, kind: str, sent: float = 0.0) -> None:
        heapq.heappush(events, (at, next(order), kind, sent))

    def process_queue(now: float) -> None:  # Scrapy's Downloader._process_queue
        nonlocal lastseen, in_flight, later
        if later:
            return
        if delay - (now - lastseen) > 1e-9:
            later = True
            push(lastseen + delay, "later")
        elif in_flight < 16:
            lastseen, in_flight = now, in_flight + 1
            push(now + overhead / 2, "arrive", now)
            process_queue(now)

    def serve(now: float, sent: float) -> None:
        push(now + (0.8 if rng.random() < 0.3 else 0.03), "done", sent)

    process_queue(0.0)
    while events:
        now, _, kind, sent = heapq.heappop(events)
        if now > seconds:
            break
        area, last = area + len(waiting) * (now - last), now
        if kind == "later":
            later = False
            process_queue(now)
        elif kind == "arrive" and busy < 4:
            busy += 1
            serve(now, sent)
        elif kind == "arrive":
            waiting.append(sent)
        elif kind == "done":
            if waiting:
                serve(now, waiting.pop(0))
            else:
                busy -= 1
            push(now + overhead / 2, "answer", sent)
        else:  # an answer: AutoThrottle adjusts the delay, the slot may send
            in_flight, served = in_flight - 1, served + 1
            target = (now - sent) / 4.0
            delay = min(max(target, (delay + target) / 2.0), 10.0)
            process_queue(now)
    return served / seconds, area / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overhead", type=float, default=0.0, help="client seconds a request")
    args = parser.parse_args()
    long = [crawl(300.0, seed, args.overhead) for seed in range(3)]
    print(
        f"300 s: goodput {statistics.fmean(g for g, _ in long):.1f}/s, "
        f"mean queue {statistics.fmean(q for _, q in long):.2f}"
    )
    short = [crawl(15.0, seed, args.overhead) for seed in range(40)]
    goodputs = sorted(g for g, _ in short)
    queues = sorted(q for _, q in short)
    print(
        f"15-s runs: goodput median {statistics.median(goodputs):.1f}/s "
        f"(p10 {goodputs[4]:.1f}, p90 {goodputs[35]:.1f}), mean queue median "
        f"{statistics.median(queues):.2f} (p10 {queues[4]:.2f}, p90 {queues[35]:.2f})"
    )


if __name__ == "__main__":
    main()

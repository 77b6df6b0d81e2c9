"""``Throttle()`` with nothing passed: a fast start that is still a polite first contact.

The defaults are the adaptive policy with its own 1 s start (README, "How it
works"; docs/signals.md, "Ramp-up"). Each test drives a whole small crawl
through the real driver on looptime's fake-time loop, against a host written
out in the test (a token bucket, a pool of workers), so what is asserted is
what the rules do, not how fast this machine is. ``benchmarks/adaptive.py``
measures the same three against the simulator (the ``defaults`` client).
"""

from __future__ import annotations

import asyncio
import math

import pytest

from autothrottle import AdaptiveConcurrencyPolicy, AutoThrottlePolicy, Throttle
from helpers import bounded

looptime = pytest.mark.looptime


def now() -> float:
    return asyncio.get_running_loop().time()


def defaults() -> Throttle:
    """``Throttle()`` as a user gets it, on the fake loop's clock."""
    return Throttle(clock=now)


class Bucket:
    """A host's token bucket of ``rate`` a second holding ``burst``; a refusal
    says ``Retry-After`` in whole seconds, and a bucket ``with_headers`` states
    its policy as the simulator's does (``q`` per 1 s)."""

    def __init__(self, rate: float, burst: int, *, with_headers: bool) -> None:
        self.rate, self.burst, self.with_headers = rate, burst, with_headers
        self.tokens, self.stamp = float(burst), 0.0
        self.refused = 0

    def answer(self, at: float) -> tuple[int, dict[str, str]]:
        self.tokens = min(self.burst, self.tokens + (at - self.stamp) * self.rate)
        self.stamp = at
        headers: dict[str, str] = {}
        if self.with_headers:
            left = min(int(self.rate), math.floor(self.tokens + self.rate))
            headers["RateLimit-Policy"] = f'"default";q={int(self.rate)};w=1'
            headers["RateLimit"] = f'"default";r={left};t=1'
        if self.tokens >= 1.0 - 1e-9:
            self.tokens -= 1.0
            return 200, headers
        self.refused += 1
        wait = max(1, math.ceil((1.0 - self.tokens) / self.rate - 1e-9))
        return 429, {**headers, "Retry-After": str(wait)}


async def fetch_from(throttle: Throttle, key: str, bucket: Bucket, latency: float) -> int:
    lease = await throttle.acquire(key)
    status, headers = bucket.answer(now())
    await asyncio.sleep(latency)
    lease.observe(latency=latency, status=status, headers=headers)
    lease.release()
    return status


def test_the_defaults_are_the_adaptive_policy_at_one_second() -> None:
    throttle = Throttle()
    assert isinstance(throttle.config.policy, AdaptiveConcurrencyPolicy)
    assert throttle.config.start_delay == 1.0
    scrapy = Throttle(policy=AutoThrottlePolicy())  # Scrapy's rules: one argument away
    assert scrapy.config.start_delay == 5.0


@looptime
async def test_the_tenth_answer_of_a_10_per_second_api_comes_within_1_5_s() -> None:
    # The API states its pace from the first answer; the ramp-up never holds a
    # slot slower than a pace the host stated (docs/signals.md, "Ramp-up").
    throttle = defaults()
    bucket = Bucket(10.0, 1, with_headers=True)
    answered: list[float] = []

    async def user() -> None:
        while len(answered) < 10:
            if await fetch_from(throttle, "api.test", bucket, 0.02) == 200:
                answered.append(now())

    async with bounded():
        start = now()
        await asyncio.gather(*(user() for _ in range(32)))
    assert answered[9] - start <= 1.5
    assert bucket.refused == 0


@looptime
async def test_a_4_worker_origin_is_served_at_80_percent_within_10_s() -> None:
    workers = asyncio.Semaphore(4)
    service = 0.05  # 4 workers x 50 ms: 80/s
    done: list[float] = []

    async def origin() -> float:
        asked = now()
        async with workers:
            await asyncio.sleep(service)
        return now() - asked

    throttle = defaults()

    async def user() -> None:
        while now() < 12.0:
            lease = await throttle.acquire("origin.test")
            latency = await origin()
            lease.observe(latency=latency, status=200)
            lease.release()
            done.append(now())

    async with bounded():
        await asyncio.gather(*(user() for _ in range(32)))
    per_second = [sum(1 for t in done if s <= t < s + 1) for s in range(12)]
    reached = next(s + 1 for s, n in enumerate(per_second) if n >= 0.8 * 80)
    assert reached <= 10, per_second


@looptime
async def test_a_first_contact_is_refused_at_most_once_per_host() -> None:
    # The "learn" crawl: hosts that allow 2/s with a burst of 2 and say nothing,
    # 20 pages each, two tasks a host, all at once.
    throttle = defaults()
    buckets = {f"h{i}.test": Bucket(2.0, 2, with_headers=False) for i in range(5)}

    async def host_worker(key: str, pages: list[int]) -> None:
        while pages:
            pages.pop()
            await fetch_from(throttle, key, buckets[key], 0.01)

    async with bounded():
        tasks = []
        for key in buckets:
            pages = list(range(20))
            tasks += [host_worker(key, pages), host_worker(key, pages)]
        await asyncio.gather(*tasks)
    assert all(bucket.refused <= 1 for bucket in buckets.values()), [
        b.refused for b in buckets.values()
    ]

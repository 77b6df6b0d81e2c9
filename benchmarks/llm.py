"""LLM API limits: N workers against a tokens-per-minute and a requests-per-minute limit.

Run with ``python benchmarks/llm.py`` (about 50 s). Loopback only.

The API is ``autothrottle.sim.llm``: OpenAI's chat completions, with a
requests limit and a tokens limit per window, each a token bucket holding a
window's worth, as OpenAI runs them; a "minute" here is ``--window`` seconds
(3 by default), so a run of ``--seconds`` (12) spans several minutes of the
API's time. ``--workers`` (16) workers each send requests of random size
(prompt 100-1500 tokens, ``max_tokens`` 50-500) one after another as fast as
the API answers; a refused request (429) is retried after the ``retry-after-ms``
the API sent, as the OpenAI SDK does. The tokens limit binds: at the mean
request size it allows fewer requests than the requests limit.

Four ways of sending, each on a fresh API:

* ``no throttle``: the workers alone;
* ``request limiter at RPM``: a plain limiter of requests per window (what
  aiolimiter or a ``Semaphore`` and a sleep give) set to the requests limit;
* ``request limiter at TPM/mean``: the same, set to the tokens limit over
  the mean request size (the best a request count can do with the tokens);
* ``autothrottle``: ``AsyncThrottledClient``, each request carrying its cost
  (``extensions={"autothrottle": {"cost": prompt + max_tokens}}``).

For each: the share of each limit used (what the API accepted over what it
allows in the run: one window's worth at the start plus the refill), the
binding share (the larger), and the share of requests refused (429). The goal:
at least 95 % of the binding limit used with at most 0.5 % refused.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from _common import add_results_option, print_table, write_results

from autothrottle import FixedDelayPolicy, Throttle
from autothrottle.httpx import AsyncThrottledClient
from autothrottle.sim.llm import LLMLimits, LLMServer

PROMPT = (100, 1500)
"""Prompt sizes in tokens, drawn uniformly."""

OUTPUT = (50, 500)
"""``max_tokens``, drawn uniformly."""


class RequestLimiter:
    """A plain limiter of ``rate`` requests a second, spaced evenly (no burst)."""

    def __init__(self, rate: float) -> None:
        self.gap = 1.0 / rate
        self.next = time.monotonic()
        self.lock = asyncio.Lock()

    async def wait(self) -> None:
        async with self.lock:
            now = time.monotonic()
            if self.next > now:
                await asyncio.sleep(self.next - now)
            self.next = max(self.next, now) + self.gap


Send = Callable[[dict[str, Any], int], Awaitable[httpx.Response]]


async def worker(send: Send, seed: int, until: float, counts: dict[str, int]) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        prompt, output = rng.randint(*PROMPT), rng.randint(*OUTPUT)
        body = {
            "model": "sim",
            "messages": [{"role": "user", "content": " ".join(["word"] * prompt)}],
            "max_tokens": output,
        }
        while time.monotonic() < until:
            response = await send(body, prompt + output)
            counts["sent"] += 1
            if response.status_code != 429:
                break
            counts["refused"] += 1
            await asyncio.sleep(int(response.headers.get("retry-after-ms", "1000")) / 1000.0)


async def run(
    arm: str, limits: LLMLimits, workers: int, seconds: float, seed: int
) -> dict[str, Any]:
    counts = {"sent": 0, "refused": 0}
    async with LLMServer(limits) as api:
        url = api.url + "/v1/chat/completions"
        client: httpx.AsyncClient
        if arm == "autothrottle":
            client = AsyncThrottledClient(throttle=llm_throttle(), timeout=30.0)
        else:
            client = httpx.AsyncClient(timeout=30.0, limits=httpx.Limits(max_connections=None))
        limiter = None
        if arm == "request limiter at RPM":
            limiter = RequestLimiter(limits.requests / limits.window)
        elif arm == "request limiter at TPM/mean":
            mean = (sum(PROMPT) + sum(OUTPUT)) / 2
            limiter = RequestLimiter((limits.tokens or 0) / mean / limits.window)

        async def send(body: dict[str, Any], cost: int) -> httpx.Response:
            if limiter is not None:
                await limiter.wait()
            extensions = {"autothrottle": {"cost": cost}} if arm == "autothrottle" else None
            return await client.post(url, json=body, extensions=extensions)

        started = time.monotonic()
        until = started + seconds
        async with client:
            await asyncio.gather(*(worker(send, seed + i, until, counts) for i in range(workers)))
        span = min(api.now(), seconds)
    shares = {}
    for unit in ("requests", "tokens"):
        limit = limits.limit(unit) or 0
        allowed = limit + limit / limits.window * span
        shares[unit] = api.used(unit, until=span) / allowed
    return {
        "arm": arm,
        "requests": shares["requests"],
        "tokens": shares["tokens"],
        "binding": max(shares.values()),
        "refused": counts["refused"] / max(1, counts["sent"]),
        "sent": counts["sent"],
    }


def llm_throttle() -> Throttle:
    """The throttle docs/llm.md recommends for an LLM API."""
    return Throttle(policy=FixedDelayPolicy(0.0), max_concurrency=32)


ARMS = ("no throttle", "request limiter at RPM", "request limiter at TPM/mean", "autothrottle")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--window", type=float, default=3.0, help="seconds in the API's minute")
    parser.add_argument("--rpm", type=int, default=60, help="requests per window")
    parser.add_argument("--tpm", type=int, default=30_000, help="tokens per window")
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--seed", type=int, default=1)
    add_results_option(parser)
    args = parser.parse_args()
    limits = LLMLimits(requests=args.rpm, tokens=args.tpm, window=args.window, latency=args.latency)
    results: dict[str, list[dict[str, Any]]] = {}
    for index in range(args.runs):
        for arm in args.arms.split(","):
            result = asyncio.run(run(arm, limits, args.workers, args.seconds, args.seed + index))
            results.setdefault(arm, []).append(result)
    rows = []
    for arm, runs in results.items():
        rows.append(
            [
                arm,
                f"{statistics.median(r['requests'] for r in runs):.1%}",
                f"{statistics.median(r['tokens'] for r in runs):.1%}",
                f"{statistics.median(r['binding'] for r in runs):.1%}",
                f"{statistics.median(r['refused'] for r in runs):.2%}",
                str(int(statistics.median(r["sent"] for r in runs))),
            ]
        )
    title = (
        f"{args.workers} workers, {args.rpm} requests and {args.tpm} tokens per "
        f"{args.window:g} s, {args.seconds:g} s (median of {args.runs})"
    )
    print_table(title, ["arm", "requests used", "tokens used", "binding", "refused", "sent"], rows)
    write_results("llm", {"args": vars(args), "runs": results})


if __name__ == "__main__":
    main()

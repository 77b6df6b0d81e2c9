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

``--spent`` runs another scenario instead (about 4 s a run): another client
of the key spent its tokens, then ``--calls`` (8) concurrent calls go through
the throttle. The key allows 1,000 tokens and 100 requests a "minute" of 1 s.
One call teaches the throttle the budget and a minute passes (the throttle's
book refills); then the API is charged ``--other`` (2,500) tokens as the other
client would, and the calls, ``--cost`` (200) tokens each, start together.
The throttle cannot see the other client: the first call to reach the API is
refused, and its ``retry-after-ms`` pauses the slot while the calls granted
with it wait for their wire turn. Every refusal after that one is a request
the throttle let through that did not fit (or one that reached the API with
the first, before its answer: each run's arrivals are in the JSON). Calls go
through the OpenAI SDK (its default two retries, the throttle's client as its
``http_client``) when it is installed, else through ``AsyncThrottledClient``, retrying a 429 twice
after its ``retry-after-ms`` as the SDK does (``--client`` picks). Counted at
the API, in each of ``--runs`` runs on a fresh API and throttle: the
refusals, the runs with more than the first, and the calls that failed (the
SDK raised after its retries).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import random
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from _common import add_results_option, print_table, write_results

import autothrottle
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


# -- --spent: another client of the key spent its tokens ---------------------------

SPENT_LIMITS = LLMLimits(requests=100, tokens=1000, window=1.0)
"""The key in ``--spent``: 1,000 tokens and 100 requests per "minute" of 1 s."""

SPENT_BOUND = 60.0
"""Seconds a ``--spent`` run may take; past them it fails with ``TimeoutError`` (a run
takes about 4 s): a call stuck behind the pause is a finding, not a wait."""

Call = Callable[[], Awaitable[str]]
"""One call of the API: ``"ok"``, or what went wrong."""

Close = Callable[[], Awaitable[None]]
"""What closes the client the calls went through."""


def sdk_call(url: str, http: AsyncThrottledClient, cost: int) -> tuple[Call, Close]:
    """A chat completion through the OpenAI SDK, and what closes its client."""
    import openai

    client = openai.AsyncOpenAI(http_client=http, base_url=url + "/v1", api_key="sim")
    prompt = cost // 2

    async def call() -> str:
        try:
            await client.chat.completions.create(
                model="sim",
                messages=[{"role": "user", "content": " ".join(["word"] * prompt)}],
                max_tokens=cost - prompt,
                extra_headers={"X-AutoThrottle": f"cost={cost}"},
            )
        except openai.APIError as error:
            return type(error).__name__
        return "ok"

    return call, client.close


def httpx_call(url: str, http: AsyncThrottledClient, cost: int) -> tuple[Call, Close]:
    """The same call through ``AsyncThrottledClient``, retried as the SDK does: a 429
    twice at most, after its ``retry-after-ms``."""
    prompt = cost // 2
    body = {
        "model": "sim",
        "messages": [{"role": "user", "content": " ".join(["word"] * prompt)}],
        "max_tokens": cost - prompt,
    }

    async def call() -> str:
        for _ in range(3):
            response = await http.post(
                url + "/v1/chat/completions",
                json=body,
                extensions={"autothrottle": {"cost": cost}},
            )
            if response.status_code != 429:
                return "ok" if response.is_success else str(response.status_code)
            await asyncio.sleep(int(response.headers.get("retry-after-ms", "1000")) / 1000.0)
        return "RateLimitError"

    return call, http.aclose


async def spent_run(client: str, calls: int, cost: int, other: int) -> dict[str, Any]:
    """One run of ``--spent`` on a fresh API and throttle: what the API saw after the charge."""
    async with LLMServer(SPENT_LIMITS) as api:
        http = AsyncThrottledClient(throttle=llm_throttle(), timeout=30.0)
        make = sdk_call if client == "openai" else httpx_call
        call, close = make(api.url, http, cost)
        try:
            async with asyncio.timeout(SPENT_BOUND):
                taught = await call()  # the throttle learns the budget from its answer
                await asyncio.sleep(SPENT_LIMITS.window)  # and the window refills
                api.charge(requests=0, input_tokens=other)
                before, charged = len(api.records), api.now()
                outcomes = await asyncio.gather(*(call() for _ in range(calls)))
        finally:
            await close()
    seen = api.records[before:]
    return {
        "first": taught,
        "refused": sum(r.status == 429 for r in seen),
        "sent": len(seen),
        "failed": sum(outcome != "ok" for outcome in outcomes),
        "outcomes": outcomes,
        "arrivals": [(round(r.arrival - charged, 3), r.status) for r in seen],
    }


def source() -> str:
    """Where the ``autothrottle`` measured was imported from, and its commit if known."""
    where = Path(autothrottle.__file__).resolve().parent.parent
    try:
        done = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return str(where)
    return f"{where} ({done.stdout.strip()})"


def spent(args: argparse.Namespace) -> None:
    """``--spent``: each run's refusals at the API; the runs with one the throttle let through."""
    client = args.client
    if client == "auto":
        client = "openai" if importlib.util.find_spec("openai") else "httpx"
    runs = [
        asyncio.run(spent_run(client, args.calls, args.cost, args.other)) for _ in range(args.runs)
    ]
    extra = sum(r["refused"] > 1 for r in runs)
    rows = [
        [
            "openai SDK" if client == "openai" else "AsyncThrottledClient",
            str(len(runs)),
            ", ".join(str(r["refused"]) for r in runs),
            f"{extra} of {len(runs)}",
            str(sum(r["failed"] for r in runs)),
        ]
    ]
    measured = source()
    title = (
        f"another client spent {args.other} tokens of {SPENT_LIMITS.tokens} a "
        f"{SPENT_LIMITS.window:g}-s minute, then {args.calls} calls of {args.cost} at once; "
        f"autothrottle from {measured}"
    )
    columns = ["client", "runs", "refused a run", "runs refused past the first", "calls failed"]
    print_table(title, columns, rows)
    write_results(
        "llm_spent",
        {"args": vars(args), "client": client, "source": measured, "runs": runs, "extra": extra},
    )


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
    parser.add_argument(
        "--spent",
        action="store_true",
        help="instead: another client spent the key's tokens, then --calls concurrent calls",
    )
    parser.add_argument("--calls", type=int, default=8, help="--spent: concurrent calls")
    parser.add_argument("--cost", type=int, default=200, help="--spent: tokens a call")
    parser.add_argument("--other", type=int, default=2500, help="--spent: the other's tokens")
    parser.add_argument(
        "--client",
        choices=("auto", "openai", "httpx"),
        default="auto",
        help="--spent: the OpenAI SDK (auto: when installed) or AsyncThrottledClient",
    )
    add_results_option(parser)
    args = parser.parse_args()
    if args.spent:
        for name, low in (("runs", 1), ("calls", 1), ("cost", 2), ("other", 0)):
            if getattr(args, name) < low:
                parser.error(f"--{name} must be at least {low}, got {getattr(args, name)}")
        spent(args)
        return
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

"""Wire gaps: the smallest gap the host sees between two requests of one slot.

Run with ``python benchmarks/wire_gap.py`` (about a minute). Loopback only.

The promise is the slot's spacing *at the host*: with ``min_delay=0.2`` no two
requests may arrive closer than 200 ms, whatever happens between the grant and
the wire. Two settings make granted requests leave together unless the
spacing is enforced when the connection is ready (``docs/scheduling.md``,
rule 10):

* ``saturated pool``: a pool of 2 connections; the first two responses take
  1.0 and 0.8 s, so both connections come free together while later granted
  requests wait for one.
* ``slow setup``: every request opens a new connection (``Connection:
  close``) and connecting takes 150 ms (as a TLS handshake may), on a pool of 2.

For each client, setting and policy (each with ``min_delay=0.2``), 8 requests
are sent at once; the table gives the smallest and median gap between arrivals
at the server and whether the smallest is within 5 ms of the 200 ms promised.

``--smoke`` runs the first policy only (each client and setting once, about
10 s): every code path, for the test that keeps the benchmarks runnable.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from statistics import median
from typing import Any

import aiohttp
import httpcore
import httpx
from _common import add_results_option, write_results
from aiohttp import web

from autothrottle import (
    AdaptiveConcurrencyPolicy,
    AutoThrottlePolicy,
    FixedDelayPolicy,
    FixedRatePolicy,
    Throttle,
)
from autothrottle.aiohttp import ThrottledSession
from autothrottle.httpx import AsyncThrottledTransport
from autothrottle.policy import DelayPolicy

PROMISE = 0.2
SETUP = 0.15
POLICIES: dict[str, Callable[[], DelayPolicy]] = {
    "fixed delay 0.2 s": lambda: FixedDelayPolicy(PROMISE),
    "fixed rate 5/s": lambda: FixedRatePolicy(1 / PROMISE),
    "AutoThrottle": AutoThrottlePolicy,
    "adaptive": AdaptiveConcurrencyPolicy,
}


@asynccontextmanager
async def server() -> AsyncIterator[tuple[str, list[float]]]:
    arrivals: list[float] = []

    async def handle(request: web.Request) -> web.Response:
        arrivals.append(time.monotonic())
        await asyncio.sleep(int(request.query.get("ms", "0")) / 1000)
        response = web.Response(text="ok")
        if "close" in request.query:
            response.force_close()
        return response

    app = web.Application()
    app.router.add_get("/", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.2", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.2:{port}/", arrivals
    finally:
        await runner.cleanup()


class _SlowBackend(httpcore.AsyncNetworkBackend):
    """httpcore's own backend, with every connection taking ``SETUP`` longer."""

    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        await asyncio.sleep(SETUP)
        return await self._inner.connect_tcp(*args, **kwargs)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _SlowResolver(aiohttp.abc.AbstractResolver):
    """Resolves loopback addresses, ``SETUP`` seconds late (part of connection setup)."""

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> Any:
        await asyncio.sleep(SETUP)
        return [
            {"hostname": host, "host": host, "port": port, "family": family, "proto": 0, "flags": 0}
        ]

    async def close(self) -> None:
        return None


def _paths(setting: str) -> list[str]:
    if setting == "saturated pool":
        return [f"?ms={ms}" for ms in (1000, 800, 50, 50, 50, 50, 50, 50)]
    return ["?ms=20&close=1"] * 8


async def _run_httpx(throttle: Throttle, url: str, setting: str) -> None:
    pool = httpcore.AsyncConnectionPool(
        max_connections=2, network_backend=_SlowBackend() if setting == "slow setup" else None
    )
    inner = httpx.AsyncHTTPTransport()
    inner._pool = pool  # the documented transport, with a slow network backend
    async with httpx.AsyncClient(
        transport=AsyncThrottledTransport(inner, throttle=throttle)
    ) as http:
        await asyncio.gather(*(http.get(url + path) for path in _paths(setting)))


async def _run_aiohttp(throttle: Throttle, url: str, setting: str) -> None:
    resolver = _SlowResolver() if setting == "slow setup" else None
    connector = aiohttp.TCPConnector(limit=2, resolver=resolver, use_dns_cache=False)

    async def one(session: aiohttp.ClientSession, path: str) -> None:
        async with session.get(url + path) as response:
            await response.read()

    async with ThrottledSession(throttle=throttle, connector=connector) as session:
        await asyncio.gather(*(one(session, path) for path in _paths(setting)))


async def measure(client: str, setting: str, policy: str) -> dict[str, Any]:
    throttle = Throttle(
        policy=POLICIES[policy](), start_delay=PROMISE, min_delay=PROMISE, max_concurrency=8
    )
    async with server() as (url, arrivals):
        run = _run_httpx if client == "httpx" else _run_aiohttp
        await run(throttle, url, setting)
    gaps = [b - a for a, b in itertools.pairwise(sorted(arrivals))]
    return {
        "client": client,
        "setting": setting,
        "policy": policy,
        "requests": len(arrivals),
        "min_gap_ms": round(min(gaps) * 1000, 1),
        "median_gap_ms": round(median(gaps) * 1000, 1),
        "kept": min(gaps) >= PROMISE - 0.005,
    }


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    policies = list(POLICIES)[:1] if args.smoke else list(POLICIES)
    for client in ("httpx", "aiohttp"):
        for setting in ("saturated pool", "slow setup"):
            for policy in policies:
                row = await measure(client, setting, policy)
                rows.append(row)
                print(
                    f"{client:8} {setting:15} {policy:18} min {row['min_gap_ms']:6.1f} ms  "
                    f"median {row['median_gap_ms']:6.1f} ms  "
                    f"{'kept' if row['kept'] else 'BROKEN'}",
                    flush=True,
                )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="wire_gap", help="results file name (default wire_gap)")
    parser.add_argument(
        "--smoke", action="store_true", help="the first policy only: every code path, ~10 s"
    )
    add_results_option(parser)
    arguments = parser.parse_args()
    results = asyncio.run(main(arguments))
    print(f"results: {write_results(arguments.name, {'cases': results})}")
    broken = [r for r in results if not r["kept"]]
    print(f"{len(results) - len(broken)} of {len(results)} kept the 200 ms promise at the host")
    sys.exit(1 if broken else 0)

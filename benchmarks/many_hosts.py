"""Many hosts: 200 simulated hosts, each limited to 2 requests/s, crawled at a fixed rate.

Run with ``python benchmarks/many_hosts.py`` (about 40 s; ``--quick``: 12 s of
crawling). Loopback only.

The hosts are ``autothrottle.sim`` token buckets, ``RateLimited(rate=2,
burst=1, headers=False)`` (excess gets a 429 with ``Retry-After``), served by
``python -m autothrottle.sim`` in a separate process on 127.0.0.2 ...
127.0.0.201. The crawler, in this process, uses one
``ThrottledSession`` (``--client httpx``: one ``AsyncThrottledClient``; ``httpx-per-host``: the same
with ``pool_per_host=True``) and
``Throttle(policy=FixedRatePolicy(2))``; two tasks per host fetch pages back to
back for ``--seconds`` (default 25), so every host always has a request
waiting and the throttle alone sets the pace.

What it reports, from the simulator's ground truth (not the client's view):

* aggregate rate: the sum over hosts of each host's steady rate, ``(arrivals -
  1) / (last arrival - first arrival)``, against the sum of the limits (400/s),
  and the same for successful responses only (goodput);
* the worst rate any host saw in any 1-second window (``max_in_window``: the
  most arrivals in any half-open window ``[t, t+1)``), and how many hosts ever
  had a window above the limit;
* 429s, and the smallest gap between two arrivals at one host (arrival jitter).

Goals (docs/benchmarks.md): aggregate >= 95 % of 400/s, no host above 2 in any
1-second window. It runs the library as shipped, with either client
(``--client``, default all three).

``--headers`` makes the hosts send rate-limit headers too.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
from _common import SimProcess, control_session, print_table, write_results

from autothrottle import FixedRatePolicy, Throttle

if not sys.stdout.isatty():
    os.environ.setdefault("COLUMNS", "160")  # rich's tables: no wrapping when piped

HOSTS = 200
RATE = 2.0
GOAL_AGGREGATE = 0.95

# -- the crawler ---------------------------------------------------------------------------


async def crawl(
    urls: Sequence[str],
    throttle: Throttle,
    client: str,
    seconds: float,
    per_host: int,
) -> dict[str, int]:
    """Fetch pages from every base URL for ``seconds``; client-side status counts."""
    counts: dict[str, int] = {}
    deadline = time.monotonic() + seconds

    def count(what: str) -> None:
        counts[what] = counts.get(what, 0) + 1

    if client.startswith("httpx"):
        import httpx

        from autothrottle.httpx import AsyncThrottledClient

        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        # httpcore's pool does work quadratic in its idle connections on every
        # request (encode/httpcore#1035); "httpx-per-host" has one pool per host.
        async with AsyncThrottledClient(
            throttle=throttle,
            limits=limits,
            timeout=30,
            pool_per_host=client == "httpx-per-host",
        ) as hx:

            async def worker_httpx(base: str, n: int) -> None:
                i = n
                while time.monotonic() < deadline:
                    try:
                        response = await hx.get(f"{base}/page/{i}")
                        count(str(response.status_code))
                    except httpx.HTTPError as exc:
                        count(type(exc).__name__)
                    i += per_host

            await _run_until([worker_httpx(u, n) for u in urls for n in range(per_host)], deadline)
    else:
        from autothrottle.aiohttp import ThrottledSession

        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=30)
        async with ThrottledSession(
            throttle=throttle, connector=connector, timeout=timeout
        ) as session:

            async def worker_aiohttp(base: str, n: int) -> None:
                i = n
                while time.monotonic() < deadline:
                    try:
                        async with session.get(f"{base}/page/{i}") as response:
                            await response.read()
                            count(str(response.status))
                    except (TimeoutError, aiohttp.ClientError) as exc:
                        count(type(exc).__name__)
                    i += per_host

            await _run_until(
                [worker_aiohttp(u, n) for u in urls for n in range(per_host)], deadline
            )
    return counts


async def _run_until(coros: list[Any], deadline: float) -> None:
    """Run the workers; cancel whatever is still waiting at the deadline."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()) + 0.05)
    finally:
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, Exception):
            raise result


# -- figures -------------------------------------------------------------------------------


def host_figures(h: dict[str, Any]) -> dict[str, Any]:
    arrivals: list[float] = h["series"]["arrivals"]
    rec = h["series"]["requests"]
    ok_times = sorted(a for a, o in zip(rec["arrival"], rec["outcome"], strict=True) if o == "ok")
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    ok_span = ok_times[-1] - ok_times[0] if len(ok_times) > 1 else 0.0
    return {
        "requests": h["requests"],
        "ok": h["outcomes"]["ok"],
        "limited": h["outcomes"]["limited"],
        "rate": (len(arrivals) - 1) / span if span > 0 else 0.0,
        "goodput": (len(ok_times) - 1) / ok_span if ok_span > 0 else 0.0,
        "max_in_window": h["max_in_window"],
        "min_gap": min(gaps) if gaps else None,
        "gaps": gaps,
    }


def summarize(doc: dict[str, Any], limit: float) -> dict[str, Any]:
    per_host = {addr: host_figures(h) for addr, h in doc["hosts"].items()}
    figures = list(per_host.values())
    all_gaps = sorted(g for f in figures for g in f["gaps"])
    gap = 1.0 / limit

    def share_below(x: float) -> float:
        return sum(1 for g in all_gaps if g < x) / len(all_gaps) if all_gaps else 0.0

    windows = [f["max_in_window"] for f in figures]
    return {
        "hosts": len(figures),
        "limit_sum": limit * len(figures),
        "aggregate_rate": sum(f["rate"] for f in figures),
        "aggregate_goodput": sum(f["goodput"] for f in figures),
        "requests": sum(f["requests"] for f in figures),
        "ok": sum(f["ok"] for f in figures),
        "limited": sum(f["limited"] for f in figures),
        "worst_window": max(windows),
        "hosts_above_limit": sum(1 for w in windows if w > limit),
        "windows_histogram": {str(w): windows.count(w) for w in sorted(set(windows))},
        "min_gap": all_gaps[0] if all_gaps else None,
        "gap_p01": all_gaps[len(all_gaps) // 100] if all_gaps else None,
        "gap_median": statistics.median(all_gaps) if all_gaps else None,
        "share_gaps_below_limit_gap": share_below(gap),
        "share_gaps_below_limit_gap_minus_1ms": share_below(gap - 0.001),
        "per_host": {
            addr: {k: v for k, v in f.items() if k != "gaps"} for addr, f in per_host.items()
        },
    }


async def run_once(sim: SimProcess, args: argparse.Namespace, client: str) -> dict[str, Any]:
    policy = FixedRatePolicy(RATE)
    throttle = Throttle(policy=policy)
    async with control_session() as http:
        await sim.wait_idle(http)
        await sim.reset(http)
        cpu0, t0 = time.process_time(), time.monotonic()
        counts = await crawl(
            list(sim.hosts.values()), throttle, client, args.seconds, args.per_host
        )
        wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
        await sim.wait_idle(http)
        doc = await sim.stats(http)
    summary = summarize(doc, RATE)
    snaps = throttle.snapshot().values()
    summary.update(
        label=f"{client}, FixedRatePolicy({RATE:g})",
        policy=repr(policy),
        client_counts=counts,
        client_cpu_share=cpu / wall,
        backoffs=sum(s.backoffs for s in snaps),
        pauses=sum(s.pauses for s in snaps),
    )
    return summary


async def bench(args: argparse.Namespace, sim: SimProcess) -> list[dict[str, Any]]:
    runs = []
    for client in args.clients:
        print(f"  crawling {len(sim.hosts)} hosts for {args.seconds:g} s: {client}", flush=True)
        runs.append(await run_once(sim, args, client))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=25.0, help="crawl time (default 25)")
    parser.add_argument("--quick", action="store_true", help="a 12-second crawl")
    parser.add_argument("--hosts", type=int, default=HOSTS, help=f"hosts (default {HOSTS})")
    parser.add_argument("--per-host", type=int, default=2, help="tasks per host (default 2)")
    parser.add_argument(
        "--client",
        choices=("aiohttp", "httpx", "httpx-per-host", "all"),
        default="all",
        help="which adapter crawls (default all, one run each; httpx-per-host: "
        "AsyncThrottledClient(pool_per_host=True))",
    )
    parser.add_argument("--headers", action="store_true", help="hosts also send rate-limit headers")
    args = parser.parse_args()
    if args.quick:
        args.seconds = 12.0
    if not 2 <= args.seconds <= 300:
        parser.error("--seconds must be in [2, 300]")
    if not 1 <= args.hosts <= 1000 or not 1 <= args.per_host <= 8:
        parser.error("--hosts must be in [1, 1000] and --per-host in [1, 8]")
    args.clients = ["aiohttp", "httpx", "httpx-per-host"] if args.client == "all" else [args.client]

    spec = f"rate:rate={RATE:g},burst=1,headers={'true' if args.headers else 'false'}"
    sim = SimProcess(["--many", f"{args.hosts}={spec}", "--seed", "1"])
    try:
        runs = asyncio.run(bench(args, sim))
    finally:
        sim.stop()

    rows = []
    for r in runs:
        agg = r["aggregate_rate"] / r["limit_sum"]
        good = r["aggregate_goodput"] / r["limit_sum"]
        met = agg >= GOAL_AGGREGATE and good >= GOAL_AGGREGATE and r["hosts_above_limit"] == 0
        rows.append(
            (
                r["label"],
                f"{r['aggregate_rate']:.1f}",
                f"{agg:.1%}",
                f"{r['aggregate_goodput']:.1f}",
                f"{good:.1%}",
                f"{r['limited']}",
                f"{r['worst_window']}",
                f"{r['hosts_above_limit']}",
                f"{r['min_gap'] * 1000:.1f}",
                f"{r['share_gaps_below_limit_gap']:.1%}",
                "met" if met else "MISSED",
            )
        )
    print_table(
        f"{args.hosts} hosts x {RATE:g} req/s (sum {args.hosts * RATE:g}/s), "
        f"{args.seconds:g} s, sim spec {spec}",
        [
            "client and policy",
            "rate/s",
            "of sum",
            "goodput/s",
            "of sum",
            "429s",
            "worst 1-s window",
            "hosts > limit",
            "min gap ms",
            "gaps < 500 ms",
            "goal",
        ],
        rows,
    )
    path = write_results(
        "many_hosts",
        {
            "settings": {
                "hosts": args.hosts,
                "rate": RATE,
                "sim_spec": spec,
                "seconds": args.seconds,
                "clients": args.clients,
                "tasks_per_host": args.per_host,
                "goal_aggregate": GOAL_AGGREGATE,
            },
            "runs": runs,
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()

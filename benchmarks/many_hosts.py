"""Many hosts: 200 simulated hosts, each limited to 2 requests/s, crawled at a fixed rate.

Run with ``python benchmarks/many_hosts.py`` (about 40 s; ``--quick``: 12 s of
crawling). Loopback only.

The hosts are ``autothrottle.sim`` token buckets, ``RateLimited(rate=2,
burst=1, headers=False)`` (excess gets a 429 with ``Retry-After``), served by
``python -m autothrottle.sim`` in a separate process on 127.0.0.2 ...
127.0.0.201. The crawler, in this process, uses one
``ThrottledSession`` (``--client httpx``: one ``AsyncThrottledClient`` as shipped, a
connection pool per host; ``httpx-one-pool``: the same with ``pool_per_host=False``,
httpx's single pool) and
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

Goals (docs/benchmarks.md), printed met or missed with the figure:

* ``FixedRatePolicy(2)`` on strict hosts (the default, ``--burst 1``): a host
  whose limit is the configured rate gets at least 97 % of it (the aggregate
  rate and goodput against 400/s) with at most 0.2 % of the requests refused,
  and no host sees more than 2 in any 1-second window;
* ``--policy adaptive --burst 2``: ``AdaptiveConcurrencyPolicy()`` with the
  throttle's defaults, on hosts that allow 2/s with a burst of 2 and say
  nothing in headers, makes at most one refusal per host and reaches at least
  90 % of the allowed total (goodput against 400/s).

It runs the library as shipped, with either client (``--client``, default
aiohttp and httpx; ``all`` adds httpx-one-pool).

``--wire-truth`` lines every wire turn up with the host's arrival stamps
and prints where each gap's extra milliseconds go, and each gap a host saw
shorter than 500 ms or two in a row shorter than a second, with its split and
its neighbours' (``benchmarks/_wire_truth.py``; the rows go to the JSON too).

``--headers`` makes the hosts send rate-limit headers too; ``--burst 2`` gives
each host a bucket of 2 (a host that tolerates arrival jitter).

``--new-hosts N`` (e.g. 3000) measures instead what many *new* hosts cost each
client as shipped: one request to each of N hosts (``--many N`` simulated
hosts that never refuse), 64 at a time, then every host left idle past httpx's
keep-alive expiry (5 s) while one host is still fetched. It reports the
client process's resident memory grown and its CPU per new host and, for
httpx, the connection pools still open after the expiry. Goals: at most
100 KB and 5 ms per new host (3,000 hosts in a few hundred MB; an SSL
context per pool used to cost 0.8 MB and 28 ms), and no pool left but the
busy host's. With ``--smoke`` the hosts idle 0.5 s, not past the expiry (the
pools left then say nothing): what the test suite runs to keep this working.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import itertools
import multiprocessing
import os
import pstats
import statistics
import sys
import time
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import _wire_truth
import aiohttp
from _common import (
    SimProcess,
    add_results_option,
    control_session,
    print_table,
    results_dir,
    write_results,
)

from autothrottle import AdaptiveConcurrencyPolicy, FixedRatePolicy, Throttle
from autothrottle.policy import DelayPolicy

if not sys.stdout.isatty():
    os.environ.setdefault("COLUMNS", "160")  # rich's tables: no wrapping when piped

HOSTS = 200
RATE = 2.0
GOAL_FIXED_SHARE = 0.97
GOAL_FIXED_REFUSED = 0.002
GOAL_ADAPTIVE_SHARE = 0.90
GOAL_ADAPTIVE_REFUSALS = 1.0

# -- the crawler ---------------------------------------------------------------------------


async def crawl(
    urls: Sequence[str],
    throttle: Throttle,
    client: str,
    seconds: float,
    per_host: int,
) -> dict[str, int]:
    """Fetch pages from every base URL for ``seconds``; client-side status counts.

    The ``seconds`` start once the client is open: the first httpx run imports
    httpx and its backends here, which on a loaded machine (under ``--profile``
    too) took longer than a 2-s smoke crawl, and the run sent nothing."""
    counts: dict[str, int] = {}
    deadline = 0.0  # set once the client is open

    def count(what: str) -> None:
        counts[what] = counts.get(what, 0) + 1

    if client.startswith("httpx"):
        import httpx

        from autothrottle.httpx import AsyncThrottledClient

        # httpcore's pool does work quadratic in its idle connections on every
        # request (encode/httpcore#1035); the client keeps a pool per host unless
        # told otherwise ("httpx-one-pool").
        async with AsyncThrottledClient(
            throttle=throttle, pool_per_host=client != "httpx-one-pool"
        ) as hx:
            deadline = time.monotonic() + seconds

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
            deadline = time.monotonic() + seconds

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


# -- new hosts ----------------------------------------------------------------------------

NEW_HOST_GOAL_BYTES = 100_000
NEW_HOST_GOAL_CPU = 0.005


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _fetch_all(get: Any, urls: Sequence[str]) -> None:
    for start in range(0, len(urls), 64):
        await asyncio.gather(*(get(url) for url in urls[start : start + 64]))


async def new_hosts(urls: Sequence[str], client: str, idle: float = 5.5) -> dict[str, Any]:
    """One request to each new host, then all idle past the keep-alive expiry
    (``idle`` seconds: 5.5, past httpx's 5)."""
    throttle = Throttle()
    if client == "httpx":
        from autothrottle.httpx import AsyncThrottledClient

        http: Any = AsyncThrottledClient(throttle=throttle)

        async def get(url: str) -> None:
            (await http.get(url)).raise_for_status()

    else:
        from autothrottle.aiohttp import ThrottledSession

        http = ThrottledSession(throttle=throttle)

        async def get(url: str) -> None:
            async with http.get(url) as response:
                response.raise_for_status()
                await response.read()

    async with http:
        await get(urls[0])  # imports and one-time costs before measuring
        rss0, cpu0 = _rss(), time.process_time()
        await _fetch_all(get, urls[1:])
        cpu, grown = time.process_time() - cpu0, _rss() - rss0
        pools = http._transport.inner.pools if client == "httpx" else None
        live = len(pools) if pools is not None else None
        await asyncio.sleep(idle)  # every host idle past httpx's keep-alive expiry
        for _ in range(len(urls) // 8 + 10):
            await get(urls[0])
        left = len(pools) if pools is not None else None
    new = len(urls) - 1
    return {
        "client": client,
        "new_hosts": new,
        "rss_grown": grown,
        "bytes_per_host": grown / new,
        "cpu_per_host": cpu / new,
        "pools_live": live,
        "pools_left": left,
        "met": grown / new <= NEW_HOST_GOAL_BYTES
        and cpu / new <= NEW_HOST_GOAL_CPU
        and (left is None or left <= 1),
    }


def _new_hosts_in_process(urls: Sequence[str], client: str, idle: float) -> dict[str, Any]:
    return asyncio.run(new_hosts(urls, client, idle))


def new_hosts_main(args: argparse.Namespace) -> None:
    sim = SimProcess(["--many", f"{args.new_hosts}=rate:rate=1000,burst=1000", "--seed", "1"])
    try:
        urls = list(sim.hosts.values())
        # Each client in a fresh process, so that neither reuses memory the other freed.
        spawn = multiprocessing.get_context("spawn")
        runs = []
        idle = 0.5 if args.smoke else 5.5
        for client in ("aiohttp", "httpx"):
            with spawn.Pool(1) as pool:
                runs.append(pool.apply(_new_hosts_in_process, (urls, client, idle)))
    finally:
        sim.stop()
    rows = [
        (
            r["client"],
            f"{r['new_hosts']}",
            f"{r['rss_grown'] / 1e6:.0f}",
            f"{r['bytes_per_host'] / 1e3:.1f}",
            f"{r['cpu_per_host'] * 1e3:.2f}",
            "-" if r["pools_live"] is None else f"{r['pools_live']}",
            "-" if r["pools_left"] is None else f"{r['pools_left']}",
            "met" if r["met"] else "MISSED",
        )
        for r in runs
    ]
    print_table(
        f"{args.new_hosts} new hosts, one request each (goal: <= "
        f"{NEW_HOST_GOAL_BYTES / 1e3:g} KB and {NEW_HOST_GOAL_CPU * 1e3:g} ms per host, "
        "no idle pool left)",
        ["client", "hosts", "RSS grown MB", "KB/host", "CPU ms/host", "pools", "left", "goal"],
        rows,
    )
    print(f"results: {write_results('many_hosts_new', {'runs': runs})}")


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
        "arrivals": len(arrivals),
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
        # A host with fewer than two arrivals has no rate and no gap: a thin run
        # (a tiny smoke run on a loaded machine) is told apart, not judged as slow.
        "hosts_thin": sum(1 for f in figures if f["arrivals"] < 2),
        "limit_sum": limit * len(figures),
        "aggregate_rate": sum(f["rate"] for f in figures),
        "aggregate_goodput": sum(f["goodput"] for f in figures),
        "requests": sum(f["requests"] for f in figures),
        "ok": sum(f["ok"] for f in figures),
        "limited": sum(f["limited"] for f in figures),
        "worst_window": max(windows, default=0),
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


def make_policy(name: str) -> DelayPolicy:
    """The policy a run is judged with: the configured rate, or the one policy."""
    return FixedRatePolicy(RATE) if name == "fixed" else AdaptiveConcurrencyPolicy()


async def run_once(sim: SimProcess, args: argparse.Namespace, client: str) -> dict[str, Any]:
    policy = make_policy(args.policy)
    throttle = Throttle(policy=policy)
    async with control_session() as http:
        await sim.wait_idle(http)
        await sim.reset(http)
        # CPU time, not the wall clock: on shared cores a wall-clock profile
        # blames whatever ran when the process was descheduled.
        profiler = cProfile.Profile(time.process_time) if args.profile else None
        cpu0, t0 = time.process_time(), time.monotonic()
        if profiler is not None:
            profiler.enable()
        with _wire_truth.recording() if args.wire_truth else nullcontext() as passes:
            counts = await crawl(
                list(sim.hosts.values()), throttle, client, args.seconds, args.per_host
            )
        if profiler is not None:
            profiler.disable()
        wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
        await sim.wait_idle(http)
        doc = await sim.stats(http)
    summary = summarize(doc, RATE)
    if passes is not None:
        summary["wire_truth"] = _wire_truth.report(passes, throttle, doc["hosts"])
        _wire_truth.print_report(client, summary["wire_truth"])
    if profiler is not None:
        results_dir().mkdir(parents=True, exist_ok=True)
        profiler.dump_stats(results_dir() / f"many_hosts-{client}-{args.policy}.prof")
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
        print(out.getvalue())
    snaps = throttle.snapshot().values()
    summary.update(
        label=f"{client}, {policy!r}".replace("AdaptiveConcurrencyPolicy", "Adaptive"),
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


def goal_of(r: dict[str, Any], policy: str) -> tuple[str, str, str]:
    """The goal a run is held to, its figure, and the verdict: ``met``, ``MISSED``,
    or ``MISSED`` with why the run cannot be judged (too thin)."""
    limit_sum = r["limit_sum"]
    agg = r["aggregate_rate"] / limit_sum if limit_sum else 0.0
    good = r["aggregate_goodput"] / limit_sum if limit_sum else 0.0
    refused = r["limited"] / r["requests"] if r["requests"] else 0.0
    if policy == "fixed":
        goal = (
            f">= {GOAL_FIXED_SHARE:.0%} of the limit, <= {GOAL_FIXED_REFUSED:.1%} refused, "
            "no host above it in any 1-s window"
        )
        figure = (
            f"rate {agg:.1%}, goodput {good:.1%}, {refused:.2%} refused, "
            f"{r['hosts_above_limit']} hosts above"
        )
        met = (
            min(agg, good) >= GOAL_FIXED_SHARE
            and refused <= GOAL_FIXED_REFUSED
            and r["hosts_above_limit"] == 0
        )
    else:
        per_host = r["limited"] / r["hosts"] if r["hosts"] else 0.0
        goal = (
            f"<= {GOAL_ADAPTIVE_REFUSALS:g} refusal per host, "
            f">= {GOAL_ADAPTIVE_SHARE:.0%} of the allowed total"
        )
        figure = f"{per_host:.2f} refusals per host, goodput {good:.1%}"
        met = per_host <= GOAL_ADAPTIVE_REFUSALS and good >= GOAL_ADAPTIVE_SHARE
    thin = r.get("hosts_thin", 0)
    if not r["hosts"] or thin:
        # A host that got fewer than two requests has no rate: the shares above
        # count it as 0, so the run is not judged slow, it is too thin to judge.
        why = f"{thin} of {r['hosts']} hosts with < 2 arrivals"
        return goal, figure, f"MISSED: too thin to judge ({why})"
    return goal, figure, "met" if met else "MISSED"


def _ms_or_dash(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def tables(
    runs: list[dict[str, Any]], policy: str
) -> tuple[list[tuple[str, ...]], list[tuple[str, str, str, str]]]:
    """The figures' rows and the goals' rows (run, goal, figure, verdict) of ``runs``;
    a figure a thin run does not have (no gap, no host) shows as ``-``."""
    rows = []
    goal_rows = []
    for r in runs:
        limit_sum = r["limit_sum"]
        goal, figure, verdict = goal_of(r, policy)
        goal_rows.append((r["label"], goal, figure, verdict))
        rows.append(
            (
                r["label"],
                f"{r['aggregate_rate']:.1f}",
                f"{r['aggregate_rate'] / limit_sum:.1%}" if limit_sum else "-",
                f"{r['aggregate_goodput']:.1f}",
                f"{r['aggregate_goodput'] / limit_sum:.1%}" if limit_sum else "-",
                f"{r['limited']}",
                f"{r['worst_window']}",
                f"{r['hosts_above_limit']}",
                _ms_or_dash(r["min_gap"]),
                f"{r['share_gaps_below_limit_gap']:.1%}" if r["min_gap"] is not None else "-",
                "met" if verdict == "met" else "MISSED",
            )
        )
    return rows, goal_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=25.0, help="crawl time (default 25)")
    parser.add_argument("--quick", action="store_true", help="a 12-second crawl")
    parser.add_argument("--hosts", type=int, default=HOSTS, help=f"hosts (default {HOSTS})")
    parser.add_argument("--per-host", type=int, default=2, help="tasks per host (default 2)")
    parser.add_argument(
        "--client",
        choices=("aiohttp", "httpx", "httpx-one-pool", "both", "all"),
        default="both",
        help="which adapter crawls (default both: aiohttp and httpx, one run each; "
        "httpx-one-pool: AsyncThrottledClient(pool_per_host=False); all: the three)",
    )
    parser.add_argument(
        "--policy",
        choices=("fixed", "adaptive"),
        default="fixed",
        help="fixed: FixedRatePolicy(2), the hosts' own rate (default); "
        "adaptive: AdaptiveConcurrencyPolicy(), the one policy (use with --burst 2)",
    )
    parser.add_argument("--headers", action="store_true", help="hosts also send rate-limit headers")
    parser.add_argument(
        "--burst", type=int, default=1, help="each host's bucket size (default 1: strict)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="cProfile each crawl (CPU time); the profile in benchmarks/results/",
    )
    parser.add_argument(
        "--wire-truth",
        action="store_true",
        help="line every wire turn up with the host's arrival stamps: where each "
        "gap's extra ms go (benchmarks/_wire_truth.py)",
    )
    parser.add_argument(
        "--new-hosts",
        type=int,
        default=0,
        help="measure N new hosts' memory and CPU instead (e.g. 3000)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="with --new-hosts: idle 0.5 s, not past the keep-alive expiry (for the tests)",
    )
    add_results_option(parser)
    args = parser.parse_args()
    if args.new_hosts:
        if not 2 <= args.new_hosts <= 10_000:
            parser.error("--new-hosts must be in [2, 10000]")
        new_hosts_main(args)
        return
    if args.quick:
        args.seconds = 12.0
    if not 2 <= args.seconds <= 300:
        parser.error("--seconds must be in [2, 300]")
    if not 1 <= args.hosts <= 1000 or not 1 <= args.per_host <= 8:
        parser.error("--hosts must be in [1, 1000] and --per-host in [1, 8]")
    args.clients = {
        "both": ["aiohttp", "httpx"],
        "all": ["aiohttp", "httpx", "httpx-one-pool"],
    }.get(args.client, [args.client])

    spec = f"rate:rate={RATE:g},burst={args.burst},headers={'true' if args.headers else 'false'}"
    sim = SimProcess(["--many", f"{args.hosts}={spec}", "--seed", "1"])
    try:
        runs = asyncio.run(bench(args, sim))
    finally:
        sim.stop()

    rows, goal_rows = tables(runs, args.policy)
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
    print_table(
        f"goals (docs/benchmarks.md); load average {os.getloadavg()[0]:.1f}",
        ["run", "goal", "figure", "verdict"],
        goal_rows,
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
                "policy": args.policy,
                "load_average": os.getloadavg(),
            },
            "goals": [
                {"run": run, "goal": goal, "figure": figure, "verdict": verdict}
                for run, goal, figure, verdict in goal_rows
            ],
            "runs": runs,
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()

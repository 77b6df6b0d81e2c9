"""The Redis store: a fleet as fast as its hosts allow, what sharing costs, turns per second.

Run with ``python benchmarks/redis_store.py`` (about two minutes; Redis on
127.0.0.1:6379, ``--redis URL`` for another; ``--quick``: a 10 s crawl).
Loopback only. It prints each goal met or missed with its figure.
``--trace`` (with ``--crawl-only`` for the crawl alone) explains the gaps
shorter than the limit's at the hosts (``benchmarks/_fleet_trace.py``).
Each worker's full garbage collections are counted (their CPU, what they
walk, the longest pause of any); ``--gc-freeze`` and ``--gc-threshold`` try
the collector's settings in the workers (``docs/fleet.md``).
Every part's keys are under a fresh prefix, ``--prefix`` then a random hex.
``--smoke`` is the shortest run of every part (a 2-s crawl of 4 hosts, 50
requests a cost, 0.3-s turns, 1-s one-slot runs): its figures mean nothing; it
is what the test suite runs to keep the benchmark working.

* **The fleet crawl** (the goals): four worker processes share 200 hosts
  through one ``RedisStore``, each with ``Throttle(policy=FixedRatePolicy(2))``
  and one ``ThrottledSession``, two tasks per host, for ``--seconds``. The
  hosts are ``autothrottle.sim`` token buckets, ``RateLimited(rate=2, burst=1,
  headers=False)``, in a separate process on 127.0.0.2 ... 127.0.0.201; the
  figures are the simulator's own arrival log: the aggregate rate (the sum over
  hosts of ``(arrivals - 1) / (last - first)``) against 400/s, the most
  arrivals at any host in any 1-second window, the 429s, and the round trips
  to Redis per request (``RedisStore.round_trips`` over requests sent).
  Goals: aggregate >= 95 % of 400/s; no host above 2 in any 1-s window; at
  most one round trip per request.
* **Cost per request**: one throttle, ``acquire`` + ``observe`` + ``release``
  in a loop with nothing to wait for, with a ``MemoryStore`` and with a
  ``RedisStore``, async and sync (``acquire_blocking``): the latency the store
  adds per request and its round trips per request.
* **Turns per second**: 1 and 4 processes taking turns as fast as Redis gives
  them, on one slot and spread over 1,000 slots.
* **One slot, 1 and 4 processes**: ``FixedRatePolicy(10)`` to one loopback
  server: the host's rate and the most requests in any second.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import sys
import time
import uuid
from typing import Any

import _fleet_trace
import aiohttp
from _common import SimProcess, add_results_option, control_session, write_results
from aiohttp import web
from many_hosts import summarize

from autothrottle import FixedRatePolicy, Throttle
from autothrottle.aiohttp import ThrottledSession
from autothrottle.redis import RedisStore
from autothrottle.store import MemoryStore

HOSTS = 200
RATE = 2.0
WORKERS = 4
GOAL_AGGREGATE = 0.95
GOAL_ROUND_TRIPS = 1.0
PREFIX = [""]
"""``--prefix``: what every part's key prefix starts with."""


def _prefix() -> str:
    """A fresh key prefix: no part shares a key with another, or with another run."""
    return PREFIX[0] + uuid.uuid4().hex


# -- the fleet crawl ----------------------------------------------------------------------


def _crawler(
    redis: str,
    prefix: str,
    urls: list[str],
    start: float,
    seconds: float,
    out: Any,
    trace: bool = False,
    collector: dict[str, Any] | None = None,
) -> None:
    """One worker process: two tasks per host until ``start + seconds`` (wall clock).

    ``collector``: ``threshold`` (``gc.set_threshold``'s arguments, or None:
    Python's) and ``freeze`` (``gc.freeze()`` once set up, before the crawl).
    """
    collector = collector or {}

    async def run() -> dict[str, Any]:
        records: list[dict[str, Any]] = []
        traces = [_fleet_trace.install(records)] if trace else []
        pauses = _fleet_trace.collections_timed()
        store = RedisStore(redis, prefix=prefix)
        throttle = Throttle(policy=FixedRatePolicy(RATE), store=store)
        counts: dict[str, int] = {}
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=30)
        if collector.get("threshold"):
            gc.set_threshold(*collector["threshold"])
        async with ThrottledSession(
            throttle=throttle, connector=connector, timeout=timeout, trace_configs=traces
        ) as s:
            if collector.get("freeze"):  # set up: what is alive now stays
                gc.collect()
                gc.freeze()
            await asyncio.sleep(max(0.0, start - time.time()))
            for passes in pauses.values():
                passes.clear()  # the crawl's own
            full_cpu = _full_passes_cpu()
            tracked = len(gc.get_objects())  # what a full pass walks (none of it frozen)
            deadline = time.monotonic() + seconds
            cpu = time.process_time()

            async def worker(base: str) -> None:
                while time.monotonic() < deadline:
                    try:
                        async with s.get(f"{base}/page") as response:
                            await response.read()
                            counts[str(response.status)] = counts.get(str(response.status), 0) + 1
                    except (TimeoutError, aiohttp.ClientError) as error:
                        counts[type(error).__name__] = counts.get(type(error).__name__, 0) + 1

            tasks = [asyncio.ensure_future(worker(url)) for url in urls for _ in range(2)]
            await asyncio.wait(tasks, timeout=seconds + 1.0)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        cpu_share = (time.process_time() - cpu) / seconds
        await store.aclose()
        sent = throttle.stats().totals.sent
        return {
            **counts,
            "sent": sent,
            "round_trips": store.round_trips,
            "turns": store.turns,
            "pauses_heard": store._listener.heard,
            "cpu_share": cpu_share,
            "gc": pauses,
            "gc_full_cpu": full_cpu,
            "gc_tracked": tracked,
            "gc_frozen": gc.get_freeze_count(),
            **({"trace": records} if trace else {}),
        }

    out.put(asyncio.run(run()))


def _full_passes_cpu() -> list[float]:
    """The CPU seconds of each full (generation-2) garbage collection from now
    on: the wall-clock pause also counts the time the process waited for a
    core, which on a loaded machine is most of it."""
    spent: list[float] = []
    began = [0.0]

    def timing(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            began[0] = time.process_time()
        else:
            spent.append(time.process_time() - began[0])

    gc.callbacks.append(timing)
    return spent


async def fleet_crawl(
    redis: str,
    seconds: float,
    hosts: int = HOSTS,
    trace: bool = False,
    collector: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec = f"rate:rate={RATE:g},burst=1,headers=false"
    sim = SimProcess(["--many", f"{hosts}={spec}", "--seed", "1"])
    try:
        urls = list(sim.hosts.values())
        async with control_session() as http:
            await sim.reset(http)
            queue: Any = multiprocessing.Queue()
            prefix = _prefix()
            start = time.time() + 3.0  # every worker imported and ready
            workers = [
                multiprocessing.Process(
                    target=_crawler,
                    args=(redis, prefix, urls, start, seconds, queue, trace, collector),
                )
                for _ in range(WORKERS)
            ]
            for worker in workers:
                worker.start()
            results = [await asyncio.to_thread(queue.get) for _ in workers]
            for worker in workers:
                await asyncio.to_thread(worker.join, 30)
            await sim.wait_idle(http)
            doc = await sim.stats(http)
    finally:
        sim.stop()
    summary = summarize(doc, RATE)
    pauses = [r.pop("gc") for r in results]
    summary["gc"] = [
        {
            "tracked": r.pop("gc_tracked"),
            "frozen": r.pop("gc_frozen"),
            "full": len(p[2]),
            "full_cpu_ms": 1e3 * sum(r.pop("gc_full_cpu")),
            "longest_ms": 1e3 * max(max(p[g], default=0.0) for g in (0, 1, 2)),
        }
        for p, r in zip(pauses, results, strict=True)
    ]
    if trace:
        traces = [r.pop("trace") for r in results]
        summary["trace"] = _fleet_trace.analyse(traces, doc, 1.0 / RATE, pauses)
        write_results("redis_store_trace", {"traces": traces, "hosts": doc["hosts"]})
    sent = sum(r["sent"] for r in results)
    summary.pop("per_host")
    summary.update(
        workers=results,
        sent=sent,
        round_trips_per_request=sum(r["round_trips"] for r in results) / max(1, sent),
    )
    return summary


# -- cost per request ---------------------------------------------------------------------


def _stores(redis: str) -> list[tuple[str, Any]]:
    return [("memory", MemoryStore()), ("redis", RedisStore(redis, prefix=_prefix()))]


def _added(results: dict[str, float]) -> dict[str, float]:
    results["added_us"] = results["redis_us"] - results["memory_us"]
    return results


async def cost(redis: str, count: int) -> dict[str, float]:
    """acquire + observe + release with nothing to wait for, async."""
    results: dict[str, float] = {}
    for name, store in _stores(redis):
        throttle = Throttle(start_delay=0.0, max_delay=0.0, max_concurrency=10**6, store=store)
        start = time.perf_counter()
        for index in range(count):
            lease = await throttle.acquire(f"host{index % 10}")
            lease.observe(latency=0.01, status=200)
            lease.release()
        results[f"{name}_us"] = 1e6 * (time.perf_counter() - start) / count
        if isinstance(store, RedisStore):
            await store.flush()
            results["round_trips_per_request"] = store.round_trips / count
            await store.aclose()
    return _added(results)


def cost_blocking(redis: str, count: int) -> dict[str, float]:
    """The same through ``acquire_blocking`` (redis-py's sync client)."""
    results: dict[str, float] = {}
    for name, store in _stores(redis):
        throttle = Throttle(start_delay=0.0, max_delay=0.0, max_concurrency=10**6, store=store)
        start = time.perf_counter()
        for index in range(count):
            lease = throttle.acquire_blocking(f"host{index % 10}")
            lease.observe(latency=0.01, status=200)
            lease.release()
        results[f"{name}_us"] = 1e6 * (time.perf_counter() - start) / count
        if isinstance(store, RedisStore):
            store.flush_blocking()
            results["round_trips_per_request"] = store.round_trips / count
            store.close()
    return _added(results)


# -- turns per second ---------------------------------------------------------------------


def _turns(redis: str, prefix: str, slots: int, seconds: float, out: Any) -> None:
    async def run() -> int:
        store = RedisStore(redis, prefix=prefix, timeout=2.0)
        throttle = Throttle(start_delay=0.0, max_delay=0.0, max_concurrency=10**6, store=store)
        end = time.monotonic() + seconds
        turns = 0
        while time.monotonic() < end:
            lease = await throttle.acquire(f"s{turns % slots}")
            lease.release()
            turns += 1
        await store.aclose()
        return turns

    out.put(asyncio.run(run()))


def turns_per_second(redis: str, processes: int, slots: int, seconds: float = 3.0) -> float:
    queue: Any = multiprocessing.Queue()
    prefix = _prefix()
    workers = [
        multiprocessing.Process(target=_turns, args=(redis, prefix, slots, seconds, queue))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    total = sum(queue.get() for _ in workers)
    for worker in workers:
        worker.join()
    return total / seconds


# -- one slot -----------------------------------------------------------------------------


def _one_slot(redis: str, prefix: str, url: str, count: int, out: Any) -> None:
    async def run() -> None:
        store = RedisStore(redis, prefix=prefix)
        throttle = Throttle(policy=FixedRatePolicy(10), store=store)
        async with ThrottledSession(throttle=throttle) as session:

            async def one_task() -> None:
                for _ in range(count):
                    async with session.get(url) as response:
                        await response.read()

            await asyncio.gather(*(one_task() for _ in range(4)))
        await store.aclose()

    asyncio.run(run())
    out.put(True)


async def one_slot(redis: str, processes: int, seconds: float) -> dict[str, float]:
    arrivals: list[float] = []

    async def handle(request: web.Request) -> web.Response:
        arrivals.append(time.monotonic())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.2", 0)
    await site.start()
    url = f"http://127.0.0.2:{runner.addresses[0][1]}/"
    count = int(seconds * 10 / processes / 4) + 1
    queue: Any = multiprocessing.Queue()
    prefix = _prefix()
    workers = [
        multiprocessing.Process(target=_one_slot, args=(redis, prefix, url, count, queue))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:  # the server runs on this loop: wait without blocking it
        await asyncio.to_thread(worker.join, seconds * 3)
    await runner.cleanup()
    return slot_figures(arrivals)


def slot_figures(arrivals: list[float]) -> dict[str, Any]:
    """The rate and the most arrivals in any 1 s, past the first tenth (the start).

    A worker that never got going on a loaded machine leaves fewer than two
    arrivals: no rate (None), not a crash."""
    times = sorted(arrivals[len(arrivals) // 10 :])  # past the start
    window = max((sum(1 for t in times[i:] if t < s + 1.0) for i, s in enumerate(times)), default=0)
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return {
        "requests": len(arrivals),
        "rate": (len(times) - 1) / span if span > 0 else None,
        "max_in_1s": window,
    }


# -- the report ---------------------------------------------------------------------------


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def print_goals(crawl: dict[str, Any]) -> None:
    """The fleet crawl's three goals, each with its verdict and figure.

    A thin crawl (a smoke run on a loaded machine: a host with fewer than two
    arrivals) has no gap and no rate for that host: its gap shows as ``-`` and
    the aggregate goal says it was too thin to judge."""
    limit_sum = crawl["limit_sum"]
    share = crawl["aggregate_rate"] / limit_sum if limit_sum else 0.0
    thin = crawl.get("hosts_thin", 0)
    aggregate = verdict(share >= GOAL_AGGREGATE)
    if thin or not crawl["hosts"]:
        aggregate = (
            f"MISSED: too thin to judge ({thin} of {crawl['hosts']} hosts with < 2 arrivals)"
        )
    gap = crawl["min_gap"]
    print(
        f"  goal aggregate >= {GOAL_AGGREGATE:.0%} of {limit_sum:g}/s: "
        f"{aggregate} ({crawl['aggregate_rate']:.1f}/s, {share:.1%}; "
        f"goodput {crawl['aggregate_goodput']:.1f}/s; {crawl['limited']} refused)",
        flush=True,
    )
    print(
        f"  goal no host above {RATE:g} in any 1-s window: "
        f"{verdict(crawl['hosts_above_limit'] == 0)} ({crawl['hosts_above_limit']} hosts above, "
        f"worst window {crawl['worst_window']}, smallest gap "
        f"{'-' if gap is None else f'{gap * 1000:.1f}'} ms)",
        flush=True,
    )
    trips = crawl["round_trips_per_request"]
    print(
        f"  goal at most {GOAL_ROUND_TRIPS:g} round trip per request: "
        f"{verdict(trips <= GOAL_ROUND_TRIPS)} ({trips:.2f})",
        flush=True,
    )


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    print(
        f"fleet crawl: {WORKERS} processes, {args.hosts} hosts x {RATE:g}/s, {args.seconds:g} s",
        flush=True,
    )
    crawl = results["fleet_crawl"] = await fleet_crawl(
        args.redis, args.seconds, args.hosts, args.trace, args.collector
    )
    print_goals(crawl)
    cpu = [f"{worker['cpu_share']:.0%}" for worker in crawl["workers"]]
    print(f"  each worker's CPU (of one core): {', '.join(cpu)}", flush=True)
    heard = [str(worker.get("pauses_heard", 0)) for worker in crawl["workers"]]
    print(f"  each worker's pauses heard from the others: {', '.join(heard)}", flush=True)
    collections = ", ".join(
        f"{w['full']} ({w['full_cpu_ms']:.0f} ms CPU; {w['tracked']:,} tracked, "
        f"{w['frozen']:,} frozen; longest pause {w['longest_ms']:.0f} ms)"
        for w in crawl["gc"]
    )
    print(f"  each worker's full garbage collections: {collections}", flush=True)
    if "trace" in crawl:
        print(json.dumps(crawl["trace"], indent=1), flush=True)
    if args.crawl_only:
        return results
    c = results["cost"] = await cost(args.redis, args.requests)
    b = results["cost_blocking"] = await asyncio.to_thread(cost_blocking, args.redis, args.requests)
    for label, row in (("async", c), ("sync", b)):
        print(
            f"per request, {label}: memory {row['memory_us']:.0f} µs, "
            f"redis {row['redis_us']:.0f} µs (added latency +{row['added_us']:.0f} µs), "
            f"{row['round_trips_per_request']:.2f} round trips",
            flush=True,
        )
    results["turns"] = {}
    for slots in (1, 1000):
        for processes in (1, 4):
            rate = turns_per_second(args.redis, processes, slots, args.turn_seconds)
            results["turns"][f"{processes}x{slots}"] = rate
            print(f"turns/s, {processes} process(es), {slots:4} slot(s): {rate:,.0f}", flush=True)
    results["one_slot"] = {}
    for processes in (1, 4):
        row = await one_slot(args.redis, processes, args.slot_seconds)
        results["one_slot"][f"x{processes}"] = row
        rate = "-" if row["rate"] is None else f"{row['rate']:.2f}"
        print(
            f"FixedRatePolicy(10), one slot, {processes} process(es): {rate}/s "
            f"at the host, at most {row['max_in_1s']} in any 1 s",
            flush=True,
        )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=30.0, help="fleet crawl (default 30)")
    parser.add_argument("--quick", action="store_true", help="a 10-second fleet crawl")
    parser.add_argument(
        "--trace", action="store_true", help="explain the short gaps at the hosts (slower)"
    )
    parser.add_argument(
        "--crawl-only", action="store_true", help="the fleet crawl only, not the costs"
    )
    parser.add_argument("--hosts", type=int, default=HOSTS, help=f"hosts (default {HOSTS})")
    parser.add_argument(
        "--name", default="redis_store", help="results file name (default redis_store)"
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="each worker calls gc.freeze() once set up (docs/fleet.md, the garbage collector)",
    )
    parser.add_argument(
        "--gc-threshold",
        metavar="N[,N,N]",
        help="each worker calls gc.set_threshold(N, ...) first (Python's: 700,10,10)",
    )
    parser.add_argument(
        "--prefix", default="", help="what every key prefix starts with (default nothing)"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the shortest run of every part (a 2-s crawl of 4 hosts): for the tests",
    )
    add_results_option(parser)
    arguments = parser.parse_args()
    PREFIX[0] = arguments.prefix
    arguments.turn_seconds, arguments.slot_seconds = 3.0, 8.0
    if arguments.smoke:
        arguments.seconds, arguments.hosts, arguments.requests = 2.0, 4, 50
        arguments.turn_seconds, arguments.slot_seconds = 0.3, 1.0
    threshold = None
    if arguments.gc_threshold:
        try:
            threshold = tuple(int(n) for n in arguments.gc_threshold.split(","))
        except ValueError:
            parser.error(f"--gc-threshold: expected 1-3 integers, got {arguments.gc_threshold!r}")
    arguments.collector = {"freeze": arguments.gc_freeze, "threshold": threshold}
    if arguments.quick:
        arguments.seconds = 10.0
    if not 1 <= arguments.hosts <= 1000:
        parser.error("--hosts must be in [1, 1000]")
    found = asyncio.run(main(arguments))
    print(f"results: {write_results(arguments.name, {'figures': found})}")
    sys.exit(0)

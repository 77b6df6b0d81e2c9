"""Ten thousand hosts: a broad crawl, each host at the rate it allows, the total their sum.

Run with ``python benchmarks/crawl_10k.py`` (four crawls of 60 s, about six
minutes in all; ``--quick``: 40 s crawls; ``--policy fixed``: two). Loopback only.

The hosts are 10,000 ``autothrottle.sim`` virtual hosts, ``h1.crawl.test`` …
``h10000.crawl.test``, each a token bucket ``RateLimited(rate=0.05, burst=2,
headers=False)`` (excess: 429 with ``Retry-After``), all served by one
``python -m autothrottle.sim --domain crawl.test`` process on one socket at
127.0.0.2 and told apart by the ``Host`` header. The sum of the limits is
10,000 x 0.05 = 500 requests a second, what the simulator and a client can
serve on two shared cores. The crawler runs in a process of its own (one per
crawl, so its memory is its own), with an event loop whose ``getaddrinfo``
answers 127.0.0.2 for every ``*.crawl.test`` name: both clients resolve
through the loop as shipped (aiohttp's default ``ThreadedResolver``,
httpx through anyio), with no thread hop and no ``/etc/hosts``.

Each host has one task fetching ``/page/N`` back to back, so a request is
always waiting and the throttle alone sets the pace. The hosts are found as a
broad crawl finds them, at a steady rate: host *i* starts at *i* / 500 s, so
all have started after one period (20 s) and the load is even from the
start. Clients: ``ThrottledSession`` (aiohttp) and ``AsyncThrottledClient``
(httpx), each with its default settings; ``--client raw`` adds plain aiohttp
with no throttle, each task sleeping out the period itself (the floor any
throttle adds to). Policies: ``FixedRatePolicy(0.05)``, the hosts' own rate,
and ``Throttle()``'s default adaptive policy, which has to find it.

What it reports, from the simulator's ground truth:

* the aggregate: arrivals a second at the hosts over the steady part of the
  crawl (from one period on, when every host has started), and goodput
  (200s a second) over the same span, against the sum of the limits;
* refusals (429s), per host and as a share of the requests;
* the client's CPU per request (process time over the crawl, from the first
  host's start to the deadline, / responses in that time; the crawl starts
  once its client is open, after one request through a throwaway client of
  the same kind, so the modules a first request imports are not counted)
  and its share of
  a core, the simulator's CPU per request, and how late the client's event
  loop ran (a 50 ms ticker's lateness, 99th percentile);
* memory per slot: the client's resident memory grown over the crawl, with
  10,000 live slots (and their connections, pools and tasks), per host;
* the garbage collector's passes over the crawl (``gc.callbacks``): how
  many full (generation-2) passes, their CPU a request and the young
  passes', and the longest pause; ``--census`` also counts, at the
  deadline, the objects it tracks a host by type (a plain container named
  by the object that holds it) and the garbage left in the oldest
  generation; ``--gc-threshold`` and ``--gc-freeze`` try the collector's
  settings in the crawler (docs/benchmarks.md, "The garbage collector");
* for aiohttp, the most hosts at once whose requests waited in the
  connector for a connection (``ThrottledSession``'s connector allows half
  the process's file descriptors; aiohttp's own default, 100 connections,
  is ``--client aiohttp-limit100``).

Goal (docs/benchmarks.md), printed met or missed with the figure: goodput at
least 95 % of the sum of the limits wherever the client's CPU is not the
bound. The client's CPU is the bound when serving the sum at the CPU per
request measured would take 0.9 of the one core its event loop can use;
a miss without that bound but with the loop more than 100 ms late (99th
percentile) is put down to the machine's load, and says so. ``--profile``
runs each crawl under cProfile (CPU time), prints the top functions and
keeps the profile in ``benchmarks/results/``; ``--rate 0.1`` (1,000/s)
makes the client's CPU the bound on two shared cores.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import gc
import io
import math
import multiprocessing
import os
import pstats
import socket
import statistics
import sys
import time
import types
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from _common import (
    SimProcess,
    add_results_option,
    control_session,
    print_table,
    results_dir,
    write_results,
)

from autothrottle import FixedRatePolicy, Throttle

if not sys.stdout.isatty():
    os.environ.setdefault("COLUMNS", "160")  # rich's tables: no wrapping when piped

HOSTS = 10_000
RATE = 0.05
BURST = 2
DOMAIN = "crawl.test"
ADDRESS = "127.0.0.2"
GOAL_SHARE = 0.95
CPU_BOUND_SHARE = 0.9
CPU_BOUND_LAG = 0.100
TICK = 0.05
CLIENTS = {"aiohttp", "httpx", "raw", "aiohttp-unlimited", "aiohttp-limit100"}

# -- names to loopback ----------------------------------------------------------------------


class NamesLoop(asyncio.SelectorEventLoop):
    """An event loop that resolves every ``*.crawl.test`` name to the simulator's address.

    aiohttp's default resolver and anyio (under httpx) both ask the loop's
    ``getaddrinfo``; answering here keeps both clients as shipped.
    """

    async def getaddrinfo(  # type: ignore[override]
        self,
        host: Any,
        port: Any,
        *,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> list[tuple[Any, ...]]:
        name = host.decode() if isinstance(host, bytes) else host
        if isinstance(name, str) and name.endswith("." + DOMAIN):
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (ADDRESS, port))]
        return await super().getaddrinfo(
            host, port, family=family, type=type, proto=proto, flags=flags
        )


# -- the crawler (in its own process) -------------------------------------------------------


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Collections:
    """The collector's passes during the crawl (``gc.callbacks``): per generation,
    how many, their CPU time and the objects they freed; the longest pause."""

    def __init__(self) -> None:
        self.passes = [0, 0, 0]
        self.cpu = [0.0, 0.0, 0.0]
        self.collected = [0, 0, 0]
        self.longest = 0.0  # wall seconds, any generation
        self.full: list[tuple[float, float]] = []  # each generation-2 pass: when, CPU seconds
        self.on = False
        self._began = (0.0, 0.0)

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._began = (time.process_time(), time.perf_counter())
            return
        generation = info["generation"]
        self.passes[generation] += 1
        self.cpu[generation] += time.process_time() - self._began[0]
        self.collected[generation] += info["collected"]
        if generation == 2:
            self.full.append((time.monotonic(), time.process_time() - self._began[0]))
        self.longest = max(self.longest, time.perf_counter() - self._began[1])


_PLAIN = (list, dict, set, tuple, collections.deque, collections.Counter)


def _name(o: object) -> str:
    """A tracked object's type, and for a function, method or coroutine its code."""
    kind = type(o)
    code = getattr(o, "__qualname__", None) if kind.__name__ in ("coroutine", "function") else None
    if kind.__name__ == "method":
        code = f"{type(o.__self__).__qualname__}.{o.__func__.__name__}"  # type: ignore[attr-defined]
    name = f"{kind.__module__}.{kind.__qualname__}"
    return name if code is None else f"{name} {code}"


_CODE = ("cr_code", "gi_code", "ag_code", "__code__", "f_code")
_CODED = (
    types.CoroutineType,
    types.GeneratorType,
    types.AsyncGeneratorType,
    types.FunctionType,
    types.MethodType,
    types.FrameType,
)


def _package(o: object, holder: str | None) -> str:
    """Whose an object is: the package of its type, of its code (a coroutine,
    function, method or generator), or of its holder (a plain container)."""
    if holder is not None:
        return holder
    kind = type(o)
    code = None
    if kind in _CODED:  # no other object is asked: an attribute may be anything
        target = o.__func__ if isinstance(o, types.MethodType) else o
        code = next((getattr(target, a) for a in _CODE if hasattr(target, a)), None)
    if isinstance(code, types.CodeType):
        path = code.co_filename.replace("\\", "/")
        for name in ("autothrottle", "httpx", "httpcore", "anyio", "asyncio", "h11"):
            if f"/{name}/" in path:
                return name
        return "the crawl" if path.endswith("crawl_10k.py") else "other"
    module = kind.__module__
    return module.split(".")[0].lstrip("_") if isinstance(module, str) else "other"


def _census(top: int = 60) -> dict[str, Any]:
    """The objects the collector tracks now, by type (module and name), most first.

    A plain container (list, dict, set, tuple, deque, Counter) is named with
    the object that holds it (the holder of an instance's ``__dict__`` for a
    dict that is one), so that what a library keeps per host can be told apart.
    """
    # What is garbage now is not what the crawl keeps: collected first, and what
    # of it was in the oldest generation (only a full pass frees it) counted.
    old = {id(o) for o in gc.get_objects(generation=2)}
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    gc.set_debug(0)
    garbage = collections.Counter(_name(o) for o in gc.garbage if id(o) in old)
    gc.garbage.clear()
    gc.collect()
    objects = gc.get_objects()
    holder: dict[int, tuple[str, str]] = {}  # a container's: (holder's name, its package)
    for o in objects:
        if isinstance(o, _PLAIN):
            continue  # a container's contents are named by the container's holder
        for inner in gc.get_referents(o):
            if isinstance(inner, _PLAIN) and id(inner) not in holder:
                holder[id(inner)] = (_name(o), _package(o, None))
    for o in objects:  # an instance's __dict__ holds containers for the instance
        if type(o) is dict and id(o) in holder:
            for inner in gc.get_referents(o):
                if isinstance(inner, _PLAIN) and id(inner) not in holder:
                    holder[id(inner)] = holder[id(o)]
    by_type: collections.Counter[str] = collections.Counter()
    by_package: collections.Counter[str] = collections.Counter()
    for o in objects:
        held = holder.get(id(o)) if isinstance(o, _PLAIN) else None
        by_type[_name(o) + ("" if held is None else f" in {held[0]}")] += 1
        by_package[_package(o, None if held is None else held[1])] += 1
    del objects
    return {
        "tracked": sum(by_type.values()),
        "packages": dict(by_package.most_common()),
        "types": dict(by_type.most_common(top)),
        "old_garbage": sum(garbage.values()),
        "old_garbage_types": dict(garbage.most_common(top // 2)),
    }


class _Crawl:
    """One host's task per base URL, each started at its turn, fetching until the deadline."""

    def __init__(self, urls: list[str], seconds: float, rate: float) -> None:
        self.urls = urls
        self.seconds = seconds
        self.start = self.deadline = math.inf  # set as the crawl begins (:meth:`run`)
        self.step = 1.0 / (rate * len(urls))  # host i starts at i * step
        self.period = 1.0 / rate
        self.counts: dict[str, int] = {}
        self.lags: list[float] = []
        self.cpu = 0.0  # process time over the crawl
        self.crawled = 0  # responses over the crawl
        self.connector: Any = None  # aiohttp's, to watch its waiters
        self.connector_waiting = 0
        self.acquired_max = 0
        self.collections = _Collections()
        self.census: dict[str, Any] | None = None  # asked for: taken at the deadline

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def responses(self) -> int:
        return sum(n for what, n in self.counts.items() if what.isdigit())

    async def ticker(self) -> None:
        """How late the loop runs: the lateness of a 50 ms sleep, again and again;
        and the most hosts waiting in aiohttp's connector for a connection."""
        while time.monotonic() < self.deadline:
            asked = time.monotonic()
            await asyncio.sleep(TICK)
            self.lags.append(time.monotonic() - asked - TICK)
            if self.connector is not None:
                waiting = sum(1 for w in self.connector._waiters.values() if w)
                self.connector_waiting = max(self.connector_waiting, waiting)
                self.acquired_max = max(self.acquired_max, len(self.connector._acquired))

    async def run(self, fetch: Callable[[str], Awaitable[str]], paced: bool) -> None:
        # The crawl's seconds start once its client is open and warm: a short run
        # on a busy machine spent them all on setting up before.
        self.start = time.monotonic() + 0.5
        self.deadline = self.start + self.seconds

        async def host(i: int, base: str) -> None:
            await asyncio.sleep(max(0.0, self.start + i * self.step - time.monotonic()))
            page = 0
            while time.monotonic() < self.deadline:
                sent = time.monotonic()
                try:
                    self.count(await fetch(f"{base}/page/{page}"))
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    self.count(type(exc).__name__)
                except Exception as exc:  # httpx's errors, without importing httpx here
                    if type(exc).__module__.split(".")[0] not in ("httpx", "httpcore"):
                        raise
                    self.count(type(exc).__name__)
                page += 1
                if paced:  # the raw client paces itself
                    await asyncio.sleep(max(0.0, sent + self.period - time.monotonic()))

        tasks = [asyncio.ensure_future(host(i, u)) for i, u in enumerate(self.urls)]
        tasks.append(asyncio.ensure_future(self.ticker()))
        try:
            await asyncio.sleep(max(0.0, self.start - time.monotonic()))
            cpu0, responses0 = time.process_time(), self.responses()
            self.collections.on = True
            await asyncio.wait(tasks, timeout=self.deadline - time.monotonic())
            # The crawl alone: not the tasks' start, nor their cancelling.
            self.cpu = time.process_time() - cpu0
            self.collections.on = False
            self.crawled = self.responses() - responses0
            if self.census is not None:  # what the crawl keeps alive, at its end
                self.census = _census()
        finally:
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                raise result


async def _warm_up(client: str, url: str) -> None:
    """One request through a throwaway client of the same kind, to a host the
    simulator does not serve, before the crawl.

    What a process pays once is not the crawl's: a client's first request
    imports modules in the event loop (anyio's asyncio backend under httpx),
    which took up to a second of a 2-s crawl on a busy machine.
    """
    name = url.partition("//")[2].partition(":")[0]
    url = url.replace(name, f"warm-up.{DOMAIN}", 1)
    if client == "httpx":
        from autothrottle.httpx import AsyncThrottledClient

        async with AsyncThrottledClient(throttle=Throttle()) as hx:
            await hx.get(url)
        return
    from autothrottle.aiohttp import ThrottledSession

    session = aiohttp.ClientSession() if client == "raw" else ThrottledSession(throttle=Throttle())
    async with session, session.get(url) as response:
        await response.read()


async def _crawl_with(client: str, policy: str, crawl: _Crawl, rate: float) -> dict[str, Any]:
    """Run the crawl through one client; what the client holds at its end."""
    await _warm_up(client, crawl.urls[0])
    throttle = Throttle(policy=FixedRatePolicy(rate)) if policy == "fixed" else Throttle()
    held: dict[str, Any] = {}
    if client == "httpx":
        from autothrottle.httpx import AsyncThrottledClient

        async with AsyncThrottledClient(throttle=throttle) as hx:
            pools = hx._transport.inner.pools  # type: ignore[attr-defined]
            make, made = pools._make, [0]

            def counted() -> Any:  # each pool made opens a connection for its first request
                made[0] += 1
                return make()

            pools._make = counted

            async def get_httpx(url: str) -> str:
                return str((await hx.get(url)).status_code)

            await crawl.run(get_httpx, paced=False)
            held["pools"] = len(pools)
            held["pools_made"] = made[0]
            held["rss_end"] = _rss()
    else:
        from autothrottle.aiohttp import ThrottledSession

        # "aiohttp-unlimited": no cap on the connector's connections; "aiohttp-limit100":
        # aiohttp's own default cap (it wakes its waiters in O(hosts waiting)).
        connector = {
            "aiohttp-unlimited": lambda: aiohttp.TCPConnector(limit=0),
            "aiohttp-limit100": lambda: aiohttp.TCPConnector(limit=100),
        }.get(client, lambda: None)()
        session: aiohttp.ClientSession = (
            aiohttp.ClientSession()
            if client == "raw"
            else ThrottledSession(throttle=throttle, connector=connector)
        )
        crawl.connector = session.connector
        async with session:

            async def get_aiohttp(url: str) -> str:
                async with session.get(url) as response:
                    await response.read()
                    return str(response.status)

            await crawl.run(get_aiohttp, paced=client == "raw")
            held["rss_end"] = _rss()
    held["slots"] = 0 if client == "raw" else sum(1 for _ in throttle.slots())
    return held


def client_run(
    client: str,
    policy: str,
    urls: list[str],
    seconds: float,
    rate: float,
    profile: str | None,
    collector: dict[str, Any],
) -> dict[str, Any]:
    """One crawl in this (fresh) process: the client's own figures.

    ``collector``: ``census`` (count what the collector tracks at the end),
    ``threshold`` (``gc.set_threshold``'s arguments, or None: Python's) and
    ``freeze`` (``gc.freeze()`` once the modules are imported and the crawl set up).
    """
    import autothrottle.aiohttp
    import autothrottle.httpx  # noqa: F401

    crawl = _Crawl(urls, seconds, rate)
    if collector["census"]:
        crawl.census = {}
    gc.callbacks.append(crawl.collections)
    if collector["threshold"] is not None:
        gc.set_threshold(*collector["threshold"])
    if collector["freeze"]:
        gc.collect()
        gc.freeze()
    rss0 = _rss()
    # CPU time, not the wall clock: on shared cores a wall-clock profile blames
    # whatever ran when the process was descheduled.
    profiler = cProfile.Profile(time.process_time) if profile else None
    with asyncio.Runner(loop_factory=NamesLoop) as runner:
        if profiler is not None:
            profiler.enable()
        held = runner.run(_crawl_with(client, policy, crawl, rate))
        if profiler is not None:
            profiler.disable()
    top = None
    if profiler is not None and profile:
        profiler.dump_stats(profile)
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        top = out.getvalue()
    lags = sorted(crawl.lags)
    cpu = crawl.cpu
    passes = crawl.collections
    return {
        "client_counts": crawl.counts,
        "responses": crawl.crawled,
        "cpu": cpu,
        "cpu_share": cpu / seconds,
        "cpu_per_request": cpu / crawl.crawled if crawl.crawled else None,
        "loop_lag_p50": statistics.median(lags) if lags else None,
        "loop_lag_p99": lags[int(len(lags) * 0.99)] if lags else None,
        "rss_grown": held["rss_end"] - rss0,
        "bytes_per_host": (held["rss_end"] - rss0) / len(urls),
        "slots": held["slots"],
        "pools": held.get("pools"),
        "pools_made": held.get("pools_made"),
        "connector_waiting_hosts": crawl.connector_waiting,
        "connector_acquired_max": crawl.acquired_max,
        "profile_top": top,
        "gc_passes": passes.passes,
        "gc_cpu": passes.cpu,
        "gc_collected": passes.collected,
        "gc_longest_pause": passes.longest,
        "gc_full": [(round(at - crawl.start, 2), round(cpu, 4)) for at, cpu in passes.full],
        "gc_frozen": gc.get_freeze_count(),
        "census": crawl.census,
    }


# -- the run, from the simulator's side ------------------------------------------------------


def _proc_cpu(pid: int) -> float:
    """A process's CPU seconds so far (user + system)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ground_truth(doc: dict[str, Any], start: float, end: float) -> dict[str, Any]:
    """Arrivals, 200s and 429s at the hosts, in all and within ``[start, end)``."""
    arrivals = ok = limited = requests = in_window = ok_in_window = 0
    for h in doc["hosts"].values():
        rec = h["series"]["requests"]
        requests += h["requests"]
        limited += h["outcomes"]["limited"]
        ok += h["outcomes"]["ok"]
        for at, outcome in zip(rec["arrival"], rec["outcome"], strict=True):
            arrivals += 1
            if start <= at < end:
                in_window += 1
                ok_in_window += outcome == "ok"
    span = end - start
    return {
        "hosts": len(doc["hosts"]),
        "requests": requests,
        "ok": ok,
        "limited": limited,
        "window": [round(start, 3), round(end, 3)],
        "rate": in_window / span,
        "goodput": ok_in_window / span,
    }


async def one_run(
    sim: SimProcess, args: argparse.Namespace, client: str, policy: str
) -> dict[str, Any]:
    urls = list(sim.hosts.values())
    profile = str(results_dir() / f"{args.name}-{client}-{policy}.prof") if args.profile else None
    results_dir().mkdir(parents=True, exist_ok=True)
    async with control_session() as http:
        await sim.wait_idle(http)
        await sim.reset(http)
        doc = await sim.stats(http, next(iter(sim.hosts)), series=False)
        sim_started = time.monotonic() - doc["now"]  # the sim's time 0 on our clock
        sim_cpu0 = _proc_cpu(sim.pid)
        began = time.monotonic()
        spawn = multiprocessing.get_context("spawn")
        with spawn.Pool(1) as pool:
            mine = await asyncio.to_thread(
                pool.apply,
                client_run,
                (client, policy, urls, args.seconds, args.rate, profile, args.collector),
            )
        await sim.wait_idle(http)
        sim_cpu = _proc_cpu(sim.pid) - sim_cpu0
        doc = await sim.stats(http)
    # The crawl began within a second or two of ``began`` (the child's start-up):
    # the steady span runs from one period after the first arrival to the last.
    firsts = [h["first_arrival"] for h in doc["hosts"].values() if h["first_arrival"] is not None]
    first = min(firsts) if firsts else began - sim_started
    end = first + args.seconds
    truth = ground_truth(doc, first + 1.0 / args.rate, end)
    limit_sum = args.rate * len(urls)
    return {
        "client": client,
        "policy": policy,
        "limit_sum": limit_sum,
        **truth,
        **mine,
        "sim_cpu_per_request": sim_cpu / truth["requests"] if truth["requests"] else None,
        "load_average": os.getloadavg(),
    }


def bound_of(r: dict[str, Any]) -> str | None:
    """What held the client back, if anything: its own CPU, or the machine.

    The client's CPU is the bound when serving the sum of the limits would
    take ``CPU_BOUND_SHARE`` of the one core its event loop can use, at the
    CPU per request measured. Otherwise a loop that ran late means the
    process was not given the CPU it needed: the shared machine's load.
    """
    per_request = r["cpu_per_request"] or 0.0
    if per_request * r["limit_sum"] >= CPU_BOUND_SHARE:
        return "client CPU"
    lag = r["loop_lag_p99"]
    if lag is not None and lag > CPU_BOUND_LAG:
        return f"machine load {r['load_average'][0]:.1f}: loop late"
    return None


def _lag_ms(r: dict[str, Any]) -> str:
    """The loop's p99 lateness in ms, or ``-``: a crawl whose deadline came before
    the ticker's first tick (a tiny run on a loaded machine) measured none."""
    lag = r["loop_lag_p99"]
    return "-" if lag is None else f"{lag * 1e3:.0f}"


def goal_of(r: dict[str, Any]) -> tuple[str, str, str]:
    good = r["goodput"] / r["limit_sum"]
    need = (r["cpu_per_request"] or 0.0) * r["limit_sum"]
    figure = (
        f"goodput {good:.1%} of {r['limit_sum']:g}/s, {r['limited']} refused "
        f"({r['limited'] / max(1, r['requests']):.2%}); the sum needs {need:.2f} of a core "
        f"at the client's CPU per request; loop late {_lag_ms(r)} ms (p99)"
    )
    goal = f">= {GOAL_SHARE:.0%} of the sum unless the client's CPU is the bound"
    if good >= GOAL_SHARE:
        return goal, figure, "met"
    bound = bound_of(r)
    return goal, figure, "MISSED" if bound is None else f"MISSED ({bound})"


async def bench(args: argparse.Namespace, sim: SimProcess) -> list[dict[str, Any]]:
    runs = []
    for policy in args.policies:
        for client in args.clients:
            if client == "raw" and policy != args.policies[0]:
                continue  # no throttle, no policy: once is enough
            print(f"  crawling {len(sim.hosts)} hosts for {args.seconds:g} s: {client}, {policy}")
            runs.append(await one_run(sim, args, client, policy))
            if runs[-1]["profile_top"]:
                print(runs[-1]["profile_top"])
            if runs[-1]["census"]:
                print_census(runs[-1])
    return runs


def print_census(r: dict[str, Any]) -> None:
    census, hosts = r["census"], r["hosts"]
    tracked = census["tracked"]
    print(f"  tracked objects at the deadline: {tracked:,} ({tracked / hosts:.0f} a host)")
    packages = list(census["packages"].items())[:12]
    print("  a host, by package:", ", ".join(f"{p} {n / hosts:.1f}" for p, n in packages))
    for name, n in census["types"].items():
        print(f"    {n:>9,}  {n / hosts:7.2f} a host  {name}")
    print(f"  garbage in the oldest generation at the deadline: {census['old_garbage']:,}")
    for name, n in census["old_garbage_types"].items():
        print(f"    {n:>9,}  {name}")


def report(runs: list[dict[str, Any]], args: argparse.Namespace) -> list[tuple[str, ...]]:
    rows, goals = [], []
    for r in runs:
        label = f"{r['client']}, {'-' if r['client'] == 'raw' else r['policy']}"
        rows.append(
            (
                label,
                f"{r['rate']:.1f}",
                f"{r['goodput']:.1f}",
                f"{r['goodput'] / r['limit_sum']:.1%}",
                f"{r['limited']}",
                f"{r['limited'] / r['hosts']:.2f}",
                f"{r['cpu_per_request'] * 1e6:.0f}" if r["cpu_per_request"] else "-",
                f"{r['cpu_share']:.2f}",
                _lag_ms(r),
                f"{r['sim_cpu_per_request'] * 1e6:.0f}" if r["sim_cpu_per_request"] else "-",
                f"{r['bytes_per_host'] / 1e3:.1f}",
                f"{r['slots']}",
                f"{r['gc_passes'][2]}",
                *(
                    f"{cpu / max(1, r['responses']) * 1e6:.0f}"
                    for cpu in (r["gc_cpu"][2], r["gc_cpu"][0] + r["gc_cpu"][1])
                ),
                f"{r['gc_longest_pause'] * 1e3:.0f}",
            )
        )
        if r["client"] != "raw":
            goals.append((label, *goal_of(r)))
    print_table(
        f"{args.hosts} hosts x {args.rate:g}/s (sum {args.rate * args.hosts:g}/s), "
        f"burst {args.burst}, {args.seconds:g} s crawls; rates over the steady part",
        [
            "client, policy",
            "arrivals/s",
            "goodput/s",
            "of sum",
            "429s",
            "429s/host",
            "client CPU µs/req",
            "client CPU share",
            "loop late p99 ms",
            "sim CPU µs/req",
            "client KB/host",
            "slots",
            "gen-2 passes",
            "gen-2 CPU µs/req",
            "gen-0/1 CPU µs/req",
            "longest gc pause ms",
        ],
        rows,
    )
    print_table(
        f"goals (docs/benchmarks.md); load average {os.getloadavg()[0]:.1f}",
        ["run", "goal", "figure", "verdict"],
        goals,
    )
    return goals


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="crawl time (default 60)")
    parser.add_argument("--quick", action="store_true", help="40-second crawls")
    parser.add_argument("--hosts", type=int, default=HOSTS, help=f"hosts (default {HOSTS})")
    parser.add_argument(
        "--rate", type=float, default=RATE, help=f"each host's limit a second (default {RATE:g})"
    )
    parser.add_argument("--burst", type=int, default=BURST, help=f"bucket size (default {BURST})")
    parser.add_argument(
        "--client",
        default="both",
        help="aiohttp, httpx, raw (aiohttp, unthrottled), aiohttp-unlimited "
        "(TCPConnector(limit=0)), aiohttp-limit100 (aiohttp's default cap), "
        "a comma-separated list of them, "
        "both (default: aiohttp and httpx) or all (raw, aiohttp and httpx)",
    )
    parser.add_argument(
        "--policy",
        choices=("fixed", "adaptive", "both"),
        default="both",
        help="fixed: FixedRatePolicy(rate); adaptive: Throttle()'s default; both (default)",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile each crawl")
    parser.add_argument(
        "--census",
        action="store_true",
        help="count the objects the collector tracks at each crawl's end, by type and by package",
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="the crawler calls gc.freeze() once set up (docs/benchmarks.md, the collector)",
    )
    parser.add_argument(
        "--gc-threshold",
        metavar="N[,N,N]",
        help="the crawler calls gc.set_threshold(N, ...) first (Python's: 700,10,10)",
    )
    parser.add_argument(
        "--name", default="crawl_10k", help="results file: benchmarks/results/NAME.json"
    )
    add_results_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.seconds = 40.0
    if not 0 < args.rate <= 10 or not 1 <= args.hosts <= 100_000 or args.burst < 1:
        parser.error("--rate must be in (0, 10], --hosts in [1, 100000], --burst >= 1")
    if not 2.0 / args.rate <= args.seconds <= 600:
        parser.error(f"--seconds must be in [{2.0 / args.rate:g}, 600]: two periods at least")
    args.clients = {"both": ["aiohttp", "httpx"], "all": ["raw", "aiohttp", "httpx"]}.get(
        args.client, args.client.split(",")
    )
    if not set(args.clients) <= CLIENTS:
        parser.error(f"--client: expected aiohttp, httpx, raw, both or all, got {args.client!r}")
    args.policies = ["fixed", "adaptive"] if args.policy == "both" else [args.policy]
    threshold = None
    if args.gc_threshold:
        try:
            threshold = tuple(int(n) for n in args.gc_threshold.split(","))
        except ValueError:
            parser.error(f"--gc-threshold: expected 1-3 integers, got {args.gc_threshold!r}")
        if not 1 <= len(threshold) <= 3 or min(threshold) < 0:
            parser.error(f"--gc-threshold: expected 1-3 integers >= 0, got {args.gc_threshold!r}")
    args.collector = {"census": args.census, "freeze": args.gc_freeze, "threshold": threshold}
    return args


def main() -> None:
    args = parse_args()

    spec = f"rate:rate={args.rate:g},burst={args.burst},headers=false"
    sim = SimProcess(
        ["--domain", DOMAIN, "--first", ADDRESS, "--many", f"{args.hosts}={spec}", "--seed", "1"]
    )
    try:
        with asyncio.Runner(loop_factory=NamesLoop) as runner:  # the names, for the stats too
            runs = runner.run(bench(args, sim))
    finally:
        sim.stop()
    goals = report(runs, args)
    path = write_results(
        args.name,
        {
            "settings": {
                "hosts": args.hosts,
                "rate": args.rate,
                "burst": args.burst,
                "sim_spec": spec,
                "seconds": args.seconds,
                "clients": args.clients,
                "policies": args.policies,
                "load_average": os.getloadavg(),
            },
            "goals": [
                {"run": run, "goal": goal, "figure": figure, "verdict": verdict}
                for run, goal, figure, verdict in goals
            ],
            "runs": runs,
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()

"""Adaptive: every simulated site, side by side with Scrapy, and one policy for all of them.

Run with ``python benchmarks/adaptive.py`` (every site and client, 45 s a run:
about 55 minutes), ``--quick`` (15 s a run), or pick sites and clients:
``--sites capacity,cdn --clients one-policy,scrapy``. Loopback only.

One ``python -m autothrottle.sim`` process (a separate process, so clients and
server never share an event loop) serves one host per site:

==============  =============================================================  =========
site            sim spec                                                       capacity
==============  =============================================================  =========
capacity        ``capacity:workers=4,service_time=0.05``                       80/s
mixed           ``variable:fast_time=0.03,slow_time=0.8,slow_ratio=0.3,...``   15.3/s
cdn             ``cdn:hit_ratio=0.9,edge_time=0.005,workers=2,...=0.2``        100/s
rate429         ``rate:rate=10,burst=2,headers=false`` (429+Retry-After)       10/s
rate-even       ``rate:...,header_style=even`` (RateLimit, t = the window)     10/s
rate-window     ``rate:...,header_style=window`` (fixed window, reset at t)    10/s
rate-refill     ``rate:...,header_style=refill`` (t = time to refill)          10/s
rate-eager      ``rate:...,header_style=eager`` (t=0 while tokens remain)      10/s
softblock       ``softblock:rate=5`` (excess: a fast 200 CAPTCHA page)         5/s
api             ``rate:rate=10`` (burst 1: strict; RateLimit headers)          10/s
==============  =============================================================  =========

and ``learn``: 20 hosts at 2/s each (burst 2, no headers), 20 pages each, all
crawled at once, for the rule "learn a host once".

Clients, all but ``defaults`` with the settings a new user would copy from Scrapy's docs
(``start_delay=0.5``, ``max_delay=10``, 16 per host, no jitter, no retries):

* ``aiohttp``, ``httpx``: autothrottle's adapters with ``AutoThrottlePolicy``
  and the site's target concurrency (4 for capacity, mixed and the CDN, 1 for
  the rest), as Scrapy is given;
* ``one-policy``: ``ThrottledSession`` with ``AdaptiveConcurrencyPolicy()``,
  no target and no per-host settings: the one setting every goal is judged on;
* ``scrapy``: a real Scrapy spider with AutoThrottle and the same settings
  (``_scrapy_runner.py``, in a subprocess);
* ``scrapy-autothrottle``: the same spider and settings with
  ``autothrottle.scrapy.AutoThrottleMiddleware`` in place of the extension;
* ``scrapy-adaptive``: that, with ``AUTOTHROTTLE_POLICY = "adaptive"`` and no
  target: Scrapy's counterpart of ``one-policy``;
* ``defaults``: ``ThrottledSession`` with ``Throttle()``, nothing passed: what a
  new user gets (judged on a fast start and a polite first contact);
* ``fixed``: plain ``aiohttp`` with a semaphore of 16, for scale.

Every client requests ``/page/0``, ``/page/1``, ... of the same host from 32
tasks (Scrapy: its scheduler); on the soft-block host autothrottle's clients
call ``throttle.backoff(url)`` on a CAPTCHA page (Scrapy + autothrottle: the
spider sends ``autothrottle.scrapy.blocked``). Figures come from the
simulator's ground truth over ``[first arrival, first arrival + run length)``:
goodput (200s with a real page per second) and its share of the site's
capacity ("steady": the second half only), errors (429s and CAPTCHA pages),
the host's (for the CDN: the origin's) time-average queue, the busiest
1-second window, and when the goodput settled. The goals are in
docs/benchmarks.md; they are printed at the end, met or missed, never part
of the test run.

``--busy 0.02`` holds the client's own event loop 20 ms of every 40 while
autothrottle's aiohttp and httpx clients crawl: a busy client, whose loop
reads every answer late (docs/signals.md, "The client's own lag"). Each run
of those clients reports the lateness its throttle measured.

``--smoke`` makes every run 2 s and every learn host 4 pages: the shortest run
of each code path (figures and verdicts mean nothing), which the test suite
runs to keep this benchmark working.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from _common import (
    SimProcess,
    add_results_option,
    control_session,
    print_table,
    write_results,
)

from autothrottle import (
    AdaptiveConcurrencyPolicy,
    AutoThrottlePolicy,
    Throttle,
)
from autothrottle.aiohttp import ThrottledSession
from autothrottle.httpx import AsyncThrottledClient
from autothrottle.sim import is_blocked_page, max_in_window

if not sys.stdout.isatty():
    os.environ.setdefault("COLUMNS", "200")  # rich's tables: no wrapping when piped

HERE = Path(__file__).resolve().parent
TASKS = 32
MAX_CONCURRENCY = 16
START_DELAY = 0.5
MAX_DELAY = 10.0


@dataclass(frozen=True)
class Site:
    """One simulated behaviour and the settings every client uses against it."""

    name: str
    spec: str
    target: float
    description: str


def _rate(style: str) -> str:
    return f"rate:rate=10,burst=2,header_style={style}"


SITES: dict[str, Site] = {
    s.name: s
    for s in (
        Site("capacity", "capacity:workers=4,service_time=0.05", 4.0, "4 workers x 50 ms: 80/s"),
        Site(
            "mixed",
            "variable:fast_time=0.03,slow_time=0.8,slow_ratio=0.3,workers=4",
            4.0,
            "70 % of pages 30 ms, 30 % 800 ms, 4 workers: 15.3/s",
        ),
        Site(
            "cdn",
            "cdn:hit_ratio=0.9,edge_time=0.005,workers=2,service_time=0.2",
            4.0,
            "90 % hits in 5 ms; misses to an origin of 2 workers x 200 ms (10/s)",
        ),
        Site(
            "rate429",
            "rate:rate=10,burst=2,headers=false",
            1.0,
            "token bucket 10/s, burst 2; 429 + Retry-After only",
        ),
        Site("rate-even", _rate("even"), 1.0, "10/s; RateLimit r = what the window allows"),
        Site("rate-window", _rate("window"), 1.0, "fixed window of 10 per second, reset at t"),
        Site("rate-refill", _rate("refill"), 1.0, "token bucket; t = seconds to refill"),
        Site("rate-eager", _rate("eager"), 1.0, "token bucket; t=0 while tokens remain"),
        Site(
            "softblock",
            "softblock:rate=5",
            1.0,
            "token bucket 5/s, burst 1; excess gets a fast 200 CAPTCHA page",
        ),
        Site("api", "rate:rate=10", 1.0, "10/s API, burst 1 (strict), RateLimit headers"),
    )
}

LEARN_HOSTS = 20
LEARN_PAGES = 20
LEARN_SPEC = "rate:rate=2,burst=2,headers=false"

CLIENTS = (
    "one-policy",
    "aiohttp",
    "httpx",
    "scrapy",
    "scrapy-autothrottle",
    "scrapy-adaptive",
    "defaults",
    "fixed",
)
CLIENT_LABELS = {
    "httpx": "autothrottle httpx, AutoThrottlePolicy",
    "aiohttp": "autothrottle aiohttp, AutoThrottlePolicy",
    "one-policy": "autothrottle aiohttp, AdaptiveConcurrencyPolicy()",
    "scrapy": "Scrapy AutoThrottle",
    "scrapy-autothrottle": "Scrapy + autothrottle, AutoThrottlePolicy",
    "scrapy-adaptive": "Scrapy + autothrottle, AUTOTHROTTLE_POLICY=adaptive",
    "fixed": f"aiohttp, semaphore({MAX_CONCURRENCY})",
    "defaults": "autothrottle aiohttp, Throttle() (nothing passed)",
}
THROTTLED = ("httpx", "aiohttp", "one-policy", "defaults")
SCRAPY_CLIENTS = ("scrapy", "scrapy-autothrottle", "scrapy-adaptive")


# -- the clients -----------------------------------------------------------------------


@dataclass
class Tally:
    """What a client saw (the ground truth is the simulator's)."""

    statuses: dict[str, int] = field(default_factory=dict)
    blocked: int = 0
    backoff_calls: int = 0
    #: (seconds since start, status, slot delay after, pause remaining) per response.
    events: list[tuple[float, int, float, float]] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)

    def add(self, what: str) -> None:
        self.statuses[what] = self.statuses.get(what, 0) + 1

    def record(self, throttle: Throttle, url: str, status: int) -> None:
        slot = throttle.slot(throttle.key_for(url))
        now = time.monotonic()
        pause = max(0.0, slot.pause_until - now)  # the throttle's clock is monotonic
        self.events.append((round(now - self.t0, 4), status, round(slot.delay, 5), round(pause, 3)))


# -- the throttles -----------------------------------------------------------------------


def make_throttle(site: Site, client: str, args: argparse.Namespace) -> Throttle:
    """The client's throttle: Scrapy's settings; the one-policy client gets no target,
    the defaults client nothing at all."""
    if client == "defaults":
        return Throttle(**args.throttle_args)
    common: dict[str, Any] = {
        "start_delay": START_DELAY,
        "max_delay": MAX_DELAY,
        "max_concurrency": MAX_CONCURRENCY,
        **args.throttle_args,
    }
    if client == "one-policy":
        return Throttle(policy=AdaptiveConcurrencyPolicy(**args.adaptive), **common)
    return Throttle(
        policy=AutoThrottlePolicy(), target_concurrency=args.target or site.target, **common
    )


async def _run_workers(
    fetch: Callable[[str], Any], base: str, seconds: float, tasks: int = TASKS
) -> None:
    """``tasks`` workers fetch /page/0, /page/1, ... in order until the time is up."""
    counter = itertools.count()
    deadline = time.monotonic() + seconds

    async def worker() -> None:
        while time.monotonic() < deadline:
            await fetch(f"{base}/page/{next(counter)}")

    workers = [asyncio.ensure_future(worker()) for _ in range(tasks)]
    try:
        await asyncio.wait(workers, timeout=seconds + 0.05)
    finally:
        for task in workers:
            task.cancel()
        results = await asyncio.gather(*workers, return_exceptions=True)
    for result in results:
        if isinstance(result, Exception):
            raise result


async def run_httpx(
    base: str, seconds: float, throttle: Throttle, softblock: bool, tally: Tally
) -> None:
    async with AsyncThrottledClient(throttle=throttle, timeout=30) as client:

        async def fetch(url: str) -> None:
            try:
                response = await client.get(url)
            except httpx.HTTPError as exc:
                tally.add(type(exc).__name__)
                return
            tally.add(str(response.status_code))
            if softblock and is_blocked_page(response.content):
                tally.blocked += 1
                tally.backoff_calls += throttle.backoff(url)
            tally.record(throttle, url, response.status_code)

        await _run_workers(fetch, base, seconds)


async def run_aiohttp(
    base: str, seconds: float, throttle: Throttle, softblock: bool, tally: Tally
) -> None:
    timeout = aiohttp.ClientTimeout(total=30)
    async with ThrottledSession(throttle=throttle, timeout=timeout) as session:

        async def fetch(url: str) -> None:
            try:
                async with session.get(url) as response:
                    body = await response.read()
                    status = response.status
            except (TimeoutError, aiohttp.ClientError) as exc:
                tally.add(type(exc).__name__)
                return
            tally.add(str(status))
            if softblock and is_blocked_page(body):
                tally.blocked += 1
                tally.backoff_calls += throttle.backoff(url)
            tally.record(throttle, url, status)

        await _run_workers(fetch, base, seconds)


@contextlib.asynccontextmanager
async def _busy_loop(busy: float) -> Any:
    """With ``busy`` > 0, hold the client's event loop ``busy`` seconds out of every
    ``2 * busy`` while the crawl runs: a client with work of its own (parsing its
    pages), whose loop then runs everything late, the answers' reading too."""

    async def hold() -> None:
        while True:
            await asyncio.sleep(busy)
            end = time.perf_counter() + busy
            while time.perf_counter() < end:
                pass

    task = asyncio.ensure_future(hold()) if busy > 0 else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def run_fixed(base: str, seconds: float, tally: Tally) -> None:
    gate = asyncio.Semaphore(MAX_CONCURRENCY)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def fetch(url: str) -> None:
            async with gate:
                try:
                    async with session.get(url) as response:
                        body = await response.read()
                        status = response.status
                except (TimeoutError, aiohttp.ClientError) as exc:
                    tally.add(type(exc).__name__)
                    return
            tally.add(str(status))
            if is_blocked_page(body):
                tally.blocked += 1

        await _run_workers(fetch, base, seconds)


async def run_scrapy(
    base: str,
    seconds: float,
    site: Site,
    args: argparse.Namespace,
    tally: Tally,
    *,
    pages: int | None = None,
    client: str = "scrapy",
) -> dict[str, Any]:
    """A Scrapy crawl: Scrapy's AutoThrottle, or autothrottle's middleware with the
    same settings (``scrapy-autothrottle``) or with the one policy and no target
    (``scrapy-adaptive``, as the one-policy client)."""
    settings: dict[str, Any] = {
        "AUTOTHROTTLE_START_DELAY": START_DELAY,
        "AUTOTHROTTLE_MAX_DELAY": MAX_DELAY,
        "AUTOTHROTTLE_TARGET_CONCURRENCY": args.target or site.target,
        "CONCURRENT_REQUESTS_PER_DOMAIN": MAX_CONCURRENCY,
        "CONCURRENT_REQUESTS": TASKS,
        "DOWNLOAD_DELAY": 0.0,
        "DOWNLOAD_DELAY_JITTER": 0.0,
        "RETRY_ENABLED": False,
    }
    middleware = client != "scrapy"
    if client == "scrapy-adaptive":
        del settings["AUTOTHROTTLE_TARGET_CONCURRENCY"]
        settings["AUTOTHROTTLE_POLICY"] = "adaptive"
    # Scrapy needs a second or two to start; the window is measured from its
    # first request, so give it the run length after that. The crawl's clock
    # (CLOSESPIDER_TIMEOUT) starts as the spider opens, a moment before its
    # first request: a smoke run, whose figures mean nothing, keeps 1 s of margin.
    crawl_seconds = seconds + (1 if args.smoke else 3)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "scrapy.json"
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(HERE / "_scrapy_runner.py"),
            "--base",
            base,
            "--seconds",
            f"{crawl_seconds:g}",
            "--pages",
            str(pages or int(crawl_seconds * 200)),
            "--settings",
            json.dumps(settings),
            "--out",
            str(out),
            *(["--autothrottle"] if middleware else []),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            _, err = await asyncio.wait_for(proc.communicate(), timeout=seconds + 120)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RuntimeError("the Scrapy run did not finish in time") from None
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"the Scrapy run failed:\n{err.decode(errors='replace')[-2000:]}")
        result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    tally.statuses = dict(result["statuses"])
    tally.blocked = result["blocked"]
    tally.events = [tuple(e) for e in result["events"]]
    return {
        "final_delay": result["final_delay"],
        "finish_reason": result["finish_reason"],
        "downloader_exceptions": result["downloader_exceptions"],
        "scrapy": result["scrapy"],
        "autothrottle_stats": result.get("autothrottle_stats", {}),
        "policy_state": result.get("policy_state", {}),
    }


# -- figures ---------------------------------------------------------------------------


def step_average(series: Sequence[Sequence[float]], start: float, end: float) -> float:
    """Time average over [start, end) of a step series [[t, value], ...]."""
    if end <= start or not series:
        return 0.0
    total = 0.0
    for i, (t, value) in enumerate(series):
        nxt = series[i + 1][0] if i + 1 < len(series) else end
        lo, hi = max(t, start), min(nxt, end)
        if hi > lo:
            total += value * (hi - lo)
    return total / (end - start)


def settle_time(ok_arrivals: Sequence[float], t0: float, seconds: float) -> dict[str, Any]:
    """When the windowed goodput stops moving; see the module docstring."""
    width = min(10, max(3, int(seconds // 3)))
    n = int(seconds)
    bins = [0] * n
    for a in ok_arrivals:
        k = int(a - t0)
        if 0 <= k < n:
            bins[k] += 1
    windows = [sum(bins[s : s + width]) / width for s in range(n - width + 1)]
    if not windows:
        return {"window": width, "settle": None, "final": 0.0}
    final = windows[-1]
    settle: float | None = None
    if final > 0:
        start = len(windows) - 1
        while start > 0 and abs(windows[start - 1] - final) <= 0.1 * final:
            start -= 1
        settle = float(start) if start < len(windows) - 1 else None
    return {"window": width, "settle": settle, "final": final, "windows": windows}


def reach_time(
    ok_arrivals: Sequence[float], t0: float, seconds: float, rate: float
) -> float | None:
    """The end of the first whole second (from the first arrival) in which at least
    ``rate`` pages were answered, or None."""
    bins = [0] * int(seconds)
    for a in ok_arrivals:
        k = int(a - t0)
        if 0 <= k < len(bins):
            bins[k] += 1
    return next((float(k + 1) for k, n in enumerate(bins) if n >= rate), None)


def measure(doc: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The run's figures from one host's ground truth (the sim's JSON)."""
    series = doc["series"]
    rec = series["requests"]
    arrivals = series["arrivals"]
    if not arrivals:
        raise RuntimeError(f"no request reached {doc['host']}")
    t0 = arrivals[0]
    t1 = t0 + seconds
    inside = [(a, o) for a, o in zip(rec["arrival"], rec["outcome"], strict=True) if t0 <= a < t1]
    requests = [a for a in arrivals if t0 <= a < t1]
    ok = [a for a, o in inside if o == "ok"]
    half = t0 + seconds / 2
    steady = sum(1 for a in ok if a >= half) / (seconds / 2)
    limited = sum(1 for _, o in inside if o == "limited")
    blocked = sum(1 for _, o in inside if o == "blocked")
    answered = len(inside)
    capacity = doc["capacity"]
    queue_series = series["queued"]
    figures: dict[str, Any] = {
        "capacity": capacity,
        "requests": len(requests),
        "answered": answered,
        "ok": len(ok),
        "limited": limited,
        "blocked": blocked,
        "goodput": len(ok) / seconds,
        "goodput_share": len(ok) / seconds / capacity if capacity else None,
        "steady_goodput": steady,
        "steady_share": steady / capacity if capacity else None,
        "error_share": (limited + blocked) / answered if answered else 0.0,
        "limited_share": limited / answered if answered else 0.0,
        "blocked_share": blocked / answered if answered else 0.0,
        "max_in_window": max_in_window(requests, 1.0),
        "mean_queue": step_average(queue_series, t0, t1),
        "queue_first_half": step_average(queue_series, t0, t0 + seconds / 2),
        "queue_second_half": step_average(queue_series, t0 + seconds / 2, t1),
        "mean_in_service": step_average(series["in_service"], t0, t1),
        "latency_p50": doc["latency"]["p50"],
        "settle": settle_time(ok, t0, seconds),
        "reach_80": reach_time(ok, t0, seconds, 0.8 * capacity) if capacity else None,
    }
    origin = doc.get("origin")
    if origin:
        o_series = origin["series"]
        o_arrivals = [a for a in o_series["arrivals"] if t0 <= a < t1]
        o_queue = o_series["queued"]
        figures["origin"] = {
            "capacity": origin["capacity"],
            "rate": len(o_arrivals) / seconds,
            "load": len(o_arrivals) / seconds / origin["capacity"],
            "max_in_window": max_in_window(o_arrivals, 1.0),
            "mean_queue": step_average(o_queue, t0, t1),
            "queue_first_half": step_average(o_queue, t0, t0 + seconds / 2),
            "queue_second_half": step_average(o_queue, t0 + seconds / 2, t1),
            "max_queued": origin["max_queued"],
            "max_in_service": origin["max_in_service"],
        }
        figures["origin"]["queue_growth"] = (
            figures["origin"]["queue_second_half"] - figures["origin"]["queue_first_half"]
        )
    figures["queue_growth"] = figures["queue_second_half"] - figures["queue_first_half"]
    return figures


# -- one run ---------------------------------------------------------------------------


async def run_one(
    sim: SimProcess, host: str, site: Site, client: str, args: argparse.Namespace
) -> dict[str, Any]:
    base = sim.hosts[host]
    seconds = args.seconds
    tally = Tally()
    extra: dict[str, Any] = {}
    throttle: Throttle | None = None
    softblock = site.name == "softblock"
    async with control_session() as http:
        await sim.wait_idle(http, host)
        await sim.reset(http, host)
        started = tally.t0 = time.monotonic()
        if client in THROTTLED:
            throttle = make_throttle(site, client, args)
            runner = run_httpx if client == "httpx" else run_aiohttp
            async with _busy_loop(args.busy):
                await runner(base, seconds, throttle, softblock, tally)
        elif client == "fixed":
            await run_fixed(base, seconds, tally)
        else:
            extra = await run_scrapy(base, seconds, site, args, tally, client=client)
        wall = time.monotonic() - started
        await sim.wait_idle(http, host)
        doc = await sim.stats(http, host)
    figures = measure(doc, seconds)
    figures.update(
        behaviour=site.name,
        client=client,
        label=CLIENT_LABELS[client],
        wall=wall,
        client_statuses=tally.statuses,
        client_blocked=tally.blocked,
        client_events=tally.events,
        **extra,
    )
    ok_times = sorted(e[0] for e in tally.events if e[1] == 200)
    # From the start of the run to the tenth page answered, as the client saw it.
    figures["tenth_ok"] = ok_times[9] if len(ok_times) >= 10 else None
    if throttle is not None:
        snap = throttle.snapshot().get(host)
        if snap is not None:
            figures["throttle"] = {
                "final_delay": snap.delay,
                "backoffs": snap.backoffs,
                "ignored_backoffs": snap.ignored_backoffs,
                "pauses": snap.pauses,
                "backoff_calls_taken": tally.backoff_calls,
            }
            figures["final_delay"] = snap.delay
            record = throttle.store.load(host)
            figures["policy_state"] = {} if record is None else dict(record.policy_state)
            # How late the client let its timed waits go, and the lag the policy
            # discounts (docs/signals.md, "The client's own lag"), as the run ended.
            gate = throttle.slot(host)._live.gate
            if hasattr(gate, "lag"):  # a checkout from before the lag was measured has none
                figures["client_lag"] = {"lateness": gate.lateness, "lag": gate.lag}
    return figures


async def run_learn(sim: SimProcess, client: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every learn host at once, ``LEARN_PAGES`` pages each: refusals per host, total goodput."""
    hosts = [h for h in sim.hosts if sim.specs[h].startswith("rate:rate=2,")]
    bases = [sim.hosts[h] for h in hosts]
    tally = Tally()
    site = Site("learn", LEARN_SPEC, 1.0, "")
    async with control_session() as http:
        await sim.wait_idle(http)
        for host in hosts:
            await sim.reset(http, host)
        started = time.monotonic()
        if client in THROTTLED:
            throttle = make_throttle(site, client, args)
            await _crawl_pages(client, throttle, bases, tally)
        elif client in SCRAPY_CLIENTS:
            await run_scrapy(
                ",".join(bases), 120.0, site, args, tally, pages=LEARN_PAGES, client=client
            )
        else:
            return {}
        wall = time.monotonic() - started
        await sim.wait_idle(http)
        docs = [await sim.stats(http, host, series=True) for host in hosts]
    ok = limited = 0
    first: list[float] = []
    last: list[float] = []
    for doc in docs:
        outcomes = doc["series"]["requests"]["outcome"]
        arrivals = doc["series"]["requests"]["arrival"]
        ok += sum(1 for o in outcomes if o == "ok")
        limited += sum(1 for o in outcomes if o == "limited")
        if arrivals:
            first.append(min(arrivals))
            last.append(max(arrivals))
    span = (max(last) - min(first)) if first else wall
    answered = ok + limited
    # The fastest the hosts allow: the burst at once, then 2/s each.
    ideal = (LEARN_PAGES - 2) / 2.0
    return {
        "behaviour": "learn",
        "client": client,
        "label": CLIENT_LABELS[client],
        "ok": ok,
        "limited": limited,
        "limited_share": limited / answered if answered else 0.0,
        "refusals_per_host": limited / len(hosts),
        "span": span,
        "ideal_span": ideal,
        "allowed_share": ideal / span if span > 0 else 0.0,
        "wall": wall,
    }


async def _crawl_pages(client: str, throttle: Throttle, bases: list[str], tally: Tally) -> None:
    """Fetch ``LEARN_PAGES`` pages of every base, all hosts at once, 2 tasks a host."""

    async def fetch_all(fetch: Callable[[str], Any]) -> None:
        async def host_worker(base: str, pages: Any) -> None:
            for i in pages:
                await fetch(f"{base}/page/{i}")

        tasks = []
        for base in bases:
            pages = iter(range(LEARN_PAGES))
            tasks += [host_worker(base, pages), host_worker(base, pages)]
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=300)

    if client == "httpx":
        async with AsyncThrottledClient(throttle=throttle, timeout=30) as hx:

            async def fetch_httpx(url: str) -> None:
                response = await hx.get(url)
                tally.add(str(response.status_code))

            await fetch_all(fetch_httpx)
    else:
        async with ThrottledSession(
            throttle=throttle, timeout=aiohttp.ClientTimeout(total=30)
        ) as session:

            async def fetch_aiohttp(url: str) -> None:
                async with session.get(url) as response:
                    await response.read()
                    tally.add(str(response.status))

            await fetch_all(fetch_aiohttp)


# -- goals -----------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def goals(runs: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """(site, goal, figure, verdict) for every goal the runs can speak to (docs/benchmarks.md)."""
    rows: list[tuple[str, str, str, str]] = []
    by = {(r["behaviour"], r["client"]): r for r in runs}
    one = "one-policy"
    r = by.get(("capacity", one))
    if r:
        share, queue = r["steady_share"], r["mean_queue"]
        rows.append(
            (
                "capacity",
                "one policy: >= 90 % of capacity, mean queue < 0.5",
                f"steady {share:.0%}, queue {queue:.2f}",
                _verdict(share >= 0.9 and queue < 0.5),
            )
        )
    r = by.get(("mixed", one))
    if r:
        share, queue = r["steady_share"], r["mean_queue"]
        rows.append(
            (
                "mixed",
                "one policy: >= 80 % of capacity, mean queue <= 1.0",
                f"steady {share:.0%}, queue {queue:.2f}",
                _verdict(share >= 0.8 and queue <= 1.0),
            )
        )
    r, scrapy = by.get(("cdn", one)), by.get(("cdn", "scrapy"))
    if r and scrapy and "origin" in r and "origin" in scrapy:
        q, sq = r["origin"]["mean_queue"], scrapy["origin"]["mean_queue"]
        rows.append(
            (
                "cdn",
                "one policy: goodput > Scrapy's, origin queue <= half of Scrapy's",
                f"{r['goodput']:.1f}/s vs {scrapy['goodput']:.1f}/s, origin queue "
                f"{q:.2f} vs {sq:.2f}; origin busy {r['origin']['load']:.0%} of its capacity",
                _verdict(r["goodput"] > scrapy["goodput"] and q <= sq / 2),
            )
        )
    for site in ("rate-even", "rate-window", "rate-refill", "rate-eager"):
        for client in (one, "aiohttp"):
            r = by.get((site, client))
            if r:
                share, lim = r["steady_share"], r["limited_share"]
                rows.append(
                    (
                        site,
                        f"{client}: >= 95 % of the advertised rate, <= 0.5 % refused",
                        f"steady {share:.1%}, {lim:.2%} refused",
                        _verdict(share >= 0.95 and lim <= 0.005),
                    )
                )
    r = by.get(("rate429", one))
    if r:
        share, lim = r["steady_share"], r["limited_share"]
        rows.append(
            (
                "rate429",
                "one policy: >= 90 % of R, <= 2 % refused",
                f"steady {share:.1%}, {lim:.1%} refused",
                _verdict(share >= 0.9 and lim <= 0.02),
            )
        )
    r = by.get(("softblock", one))
    if r:
        rows.append(
            (
                "softblock",
                "one policy: <= 5 % CAPTCHA pages",
                f"{r['blocked_share']:.1%}",
                _verdict(r["blocked_share"] <= 0.05),
            )
        )
    for client in (one, "aiohttp"):
        r = by.get(("learn", client))
        if r:
            rows.append(
                (
                    "learn",
                    f"{client}: <= 1 refusal per host (<= 5 %), >= 90 % of the allowed total",
                    f"{r['refusals_per_host']:.2f} per host ({r['limited_share']:.1%}), "
                    f"{r['allowed_share']:.0%} of the allowed pace",
                    _verdict(r["limited_share"] <= 0.05 and r["allowed_share"] >= 0.9),
                )
            )
    rows += _strict_api_terms(by)
    rows += _defaults_terms(by)
    rows += _scrapy_terms(runs, by)
    rows += _scrapy_middleware_terms(runs, by)
    return rows


def _strict_api_terms(by: dict[tuple[str, str], dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """A strict host at the pace it states: at least 97 % of it, at most 0.2 % refused,
    never more than its limit in a second (docs/scheduling.md, rule 10)."""
    rows = []
    for client in ("one-policy", "aiohttp", "defaults"):
        r = by.get(("api", client))
        if r:
            share, lim, most = r["steady_share"], r["limited_share"], r["max_in_window"]
            rows.append(
                (
                    "api",
                    f"{client}: >= 97 % of the stated rate, <= 0.2 % refused, <= 10 in any 1 s",
                    f"steady {share:.1%}, {lim:.2%} refused, at most {most} in 1 s",
                    _verdict(share >= 0.97 and lim <= 0.002 and most <= 10),
                )
            )
    return rows


def _defaults_terms(by: dict[tuple[str, str], dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """``Throttle()`` with nothing passed: a fast start, a polite first contact."""
    rows = []
    timed = (
        ("api", "tenth_ok", "the tenth page of a 10/s API within 1.5 s", 1.5, "{:.2f} s"),
        ("capacity", "reach_80", "80 % of a 4-worker origin within 10 s", 10.0, "after {:.0f} s"),
    )
    for site, key, goal, bound, shown in timed:
        r = by.get((site, "defaults"))
        if r:
            value = r[key]
            figure = "never" if value is None else shown.format(value)
            rows.append(
                (site, f"defaults: {goal}", figure, _verdict(value is not None and value <= bound))
            )
    r = by.get(("learn", "defaults"))
    if r:
        rows.append(
            (
                "learn",
                "defaults: <= 1 refusal per host on first contact",
                f"{r['refusals_per_host']:.2f} per host, {r['allowed_share']:.0%} of the pace",
                _verdict(r["refusals_per_host"] <= 1.0),
            )
        )
    return rows


def _scrapy_terms(
    runs: list[dict[str, Any]], by: dict[tuple[str, str], dict[str, Any]]
) -> list[tuple[str, str, str, str]]:
    """AutoThrottlePolicy with Scrapy's settings: goodput >= Scrapy's, errors no higher;
    and never a heavier load on the host (its, or behind a CDN its origin's, mean
    queue) than Scrapy's own rule causes."""
    rows = []
    sites = sorted({r["behaviour"] for r in runs} - {"learn"}, key=list(SITES).index)
    for site in sites:
        scrapy = by.get((site, "scrapy"))
        if scrapy is None:
            continue
        for client in ("aiohttp", "httpx"):
            r = by.get((site, client))
            if r is None:
                continue
            # Within 2 % of Scrapy's goodput counts as "at least": runs differ by noise.
            ok = r["goodput"] >= 0.98 * scrapy["goodput"] and (
                r["error_share"] <= scrapy["error_share"] + 0.001
            )
            rows.append(
                (
                    site,
                    f"{client}: goodput >= Scrapy's, errors <= Scrapy's",
                    f"{r['goodput']:.1f}/s vs {scrapy['goodput']:.1f}/s, "
                    f"errors {r['error_share']:.1%} vs {scrapy['error_share']:.1%}",
                    _verdict(ok),
                )
            )
            if site in ("mixed", "cdn"):
                rows.append(
                    (
                        site,
                        f"{client}: host queue <= Scrapy's (with Scrapy's settings)",
                        f"{_host_load(r):.2f} vs {_host_load(scrapy):.2f}",
                        _verdict(_host_load(r) <= _host_load(scrapy)),
                    )
                )
    return rows


def _host_load(r: dict[str, Any]) -> float:
    """The host's (behind a CDN: the origin's) time-average queue."""
    return float(r["origin"]["mean_queue"] if "origin" in r else r["mean_queue"])


def _scrapy_middleware_terms(
    runs: list[dict[str, Any]], by: dict[tuple[str, str], dict[str, Any]]
) -> list[tuple[str, str, str, str]]:
    """Scrapy + autothrottle: with AutoThrottle's settings, at least Scrapy's goodput
    with at most its errors and host load; with the adaptive policy, within 5 %
    of the one-policy client."""
    rows = []
    sites = sorted({r["behaviour"] for r in runs} - {"learn"}, key=list(SITES).index)
    for site in sites:
        r, scrapy = by.get((site, "scrapy-autothrottle")), by.get((site, "scrapy"))
        if r and scrapy:
            ok = (
                r["goodput"] >= 0.98 * scrapy["goodput"]
                and r["error_share"] <= scrapy["error_share"] + 0.001
                and _host_load(r) <= _host_load(scrapy) + 0.05
            )
            rows.append(
                (
                    site,
                    "Scrapy + autothrottle: goodput >= Scrapy's, errors and host queue <= Scrapy's",
                    f"{r['goodput']:.1f}/s vs {scrapy['goodput']:.1f}/s, errors "
                    f"{r['error_share']:.1%} vs {scrapy['error_share']:.1%}, queue "
                    f"{_host_load(r):.2f} vs {_host_load(scrapy):.2f}",
                    _verdict(ok),
                )
            )
        r, one = by.get((site, "scrapy-adaptive")), by.get((site, "one-policy"))
        if r and one:
            ok = r["goodput"] >= 0.95 * one["goodput"] and r["error_share"] <= max(
                1.05 * one["error_share"], one["error_share"] + 0.005
            )
            rows.append(
                (
                    site,
                    "Scrapy + autothrottle, adaptive: within 5 % of the one-policy client",
                    f"{r['goodput']:.1f}/s vs {one['goodput']:.1f}/s, errors "
                    f"{r['error_share']:.1%} vs {one['error_share']:.1%}",
                    _verdict(ok),
                )
            )
    rows += _scrapy_middleware_learn_terms(by)
    return rows


def _scrapy_middleware_learn_terms(
    by: dict[tuple[str, str], dict[str, Any]],
) -> list[tuple[str, str, str, str]]:
    """learn: Scrapy + autothrottle fetches at least the pages Scrapy fetches with
    at most its refusals; with the adaptive policy, within 5 % of the one policy."""
    rows = []
    r, scrapy = by.get(("learn", "scrapy-autothrottle")), by.get(("learn", "scrapy"))
    if r and scrapy:
        rows.append(
            (
                "learn",
                "Scrapy + autothrottle: pages >= Scrapy's, refusals <= Scrapy's",
                f"{r['ok']} vs {scrapy['ok']} pages, {r['limited_share']:.1%} vs "
                f"{scrapy['limited_share']:.1%} refused",
                _verdict(r["ok"] >= scrapy["ok"] and r["limited_share"] <= scrapy["limited_share"]),
            )
        )
    r, one = by.get(("learn", "scrapy-adaptive")), by.get(("learn", "one-policy"))
    if r and one:
        ok = (
            r["refusals_per_host"] <= 1.05 * one["refusals_per_host"] + 0.05
            and r["allowed_share"] >= 0.95 * one["allowed_share"]
        )
        rows.append(
            (
                "learn",
                "Scrapy + autothrottle, adaptive: within 5 % of the one-policy client",
                f"{r['refusals_per_host']:.2f} vs {one['refusals_per_host']:.2f} refusals per "
                f"host, {r['allowed_share']:.0%} vs {one['allowed_share']:.0%} of the allowed pace",
                _verdict(ok),
            )
        )
    return rows


# -- main ------------------------------------------------------------------------------


def _fmt_settle(s: dict[str, Any]) -> str:
    return "never" if s["settle"] is None else f"{s['settle']:.0f} s"


async def bench(args: argparse.Namespace, sim: SimProcess) -> list[dict[str, Any]]:
    runs = []
    sites = [s for s in args.sites if s != "learn"]
    hosts = dict(zip(sites, sim.hosts, strict=False))
    for name in sites:
        site = SITES[name]
        for client in args.clients:
            print(f"  {name:<12} {CLIENT_LABELS[client]:<50} {args.seconds:g} s ...", end="")
            r = await run_one(sim, hosts[name], site, client, args)
            lag = r.get("client_lag")
            print(
                f" goodput {r['goodput']:.1f}/s ({r['goodput_share']:.0%}), "
                f"errors {r['error_share']:.1%}, queue {r['mean_queue']:.2f}"
                + (
                    f", client late {1000 * lag['lateness']:.1f} ms, lag {1000 * lag['lag']:.1f}"
                    if lag
                    else ""
                ),
                flush=True,
            )
            runs.append(r)
    if "learn" in args.sites:
        for client in args.clients:
            if client == "fixed":
                continue
            print(f"  learn        {CLIENT_LABELS[client]:<50} ...", end="", flush=True)
            r = await run_learn(sim, client, args)
            print(f" {r['limited']} refused, {r['allowed_share']:.0%} of the pace", flush=True)
            runs.append(r)
    return runs


def _site_table(name: str, runs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    site = SITES[name]
    rows = []
    for r in runs:
        if r["behaviour"] != name:
            continue
        queue = r["origin"]["mean_queue"] if "origin" in r else r["mean_queue"]
        delay = r.get("final_delay")
        rows.append(
            (
                r["label"],
                f"{r['goodput']:.1f}",
                f"{r['goodput_share']:.0%}",
                f"{r['steady_share']:.0%}",
                f"{r['limited_share']:.1%}",
                f"{r['blocked_share']:.1%}",
                f"{queue:.2f}",
                f"{r['max_in_window']}",
                _fmt_settle(r["settle"]),
                "" if delay is None else f"{delay * 1000:.0f}",
            )
        )
    note = " (queue: the origin's)" if name == "cdn" else ""
    print_table(
        f"{name}: {site.description}; {args.seconds:g} s{note}",
        [
            "client",
            "goodput/s",
            "of capacity",
            "steady",
            "429",
            "blocked",
            "mean queue",
            "max/1s",
            "settle",
            "final delay ms",
        ],
        rows,
    )


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=45.0, help="run length (default 45)")
    parser.add_argument("--quick", action="store_true", help="15-second runs")
    every = [*SITES, "learn"]
    parser.add_argument(
        "--sites", default=",".join(every), help=f"comma-separated, among {', '.join(every)}"
    )
    parser.add_argument(
        "--clients",
        default=",".join(CLIENTS),
        help=f"comma-separated, among {', '.join(CLIENTS)} (default all)",
    )
    parser.add_argument("--target", type=float, default=None, help="override target concurrency")
    parser.add_argument(
        "--throttle-args",
        default="",
        metavar="NAME=VALUE,...",
        help="more Throttle keywords for autothrottle's clients, e.g. recovery_time=10",
    )
    parser.add_argument(
        "--adaptive-args",
        default="",
        metavar="NAME=VALUE,...",
        help="AdaptiveConcurrencyPolicy keywords for the one-policy client, e.g. beta=0.6",
    )
    parser.add_argument(
        "--busy",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="hold the client's event loop SECONDS of every 2 x SECONDS (autothrottle's "
        "aiohttp and httpx clients): a busy client, whose loop runs everything late",
    )
    parser.add_argument("--seed", type=int, default=1, help="the simulator's jitter seed")
    parser.add_argument("--name", default="adaptive", help="results file name (default adaptive)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="2-s runs, 4 pages a learn host: every code path, no figure worth reading",
    )
    add_results_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.seconds = 15.0
    if args.smoke:
        global LEARN_PAGES
        args.seconds, LEARN_PAGES = 2.0, 4
    elif not 6 <= args.seconds <= 600:
        parser.error("--seconds must be in [6, 600]")
    args.sites = [b.strip() for b in args.sites.split(",") if b.strip()]
    args.clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    if not args.sites or not set(args.sites) <= set(every):
        parser.error(f"--sites must be among {', '.join(every)}")
    if not args.clients or not set(args.clients) <= set(CLIENTS):
        parser.error(f"--clients must be among {', '.join(CLIENTS)}")
    try:
        args.adaptive = _keywords(args.adaptive_args)
        AdaptiveConcurrencyPolicy(**args.adaptive)
        args.throttle_args = _keywords(args.throttle_args)
        Throttle(**args.throttle_args)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    if args.target is not None and not args.target > 0:
        parser.error("--target must be > 0")
    if not 0 <= args.busy <= 1:
        parser.error("--busy must be in [0, 1] seconds")
    if not (args.name and all(ch.isalnum() or ch in "-_" for ch in args.name)):
        parser.error("--name must be letters, digits, - or _")
    return args


def _keywords(text: str) -> dict[str, float]:
    return {
        k.strip(): float(v) for k, v in (item.split("=", 1) for item in text.split(",") if item)
    }


def main() -> None:
    args = _parse_args()
    sim_args = ["--seed", str(args.seed)]
    sites = [s for s in args.sites if s != "learn"]
    for i, name in enumerate(sites):
        sim_args += ["--host", f"127.0.0.{2 + i}={SITES[name].spec}"]
    if "learn" in args.sites:
        sim_args += ["--many", f"{LEARN_HOSTS}={LEARN_SPEC}", "--first", "127.0.1.2"]
    print(f"adaptive: {len(args.sites)} site(s) x {len(args.clients)} client(s)", flush=True)
    sim = SimProcess(sim_args)
    try:
        runs = asyncio.run(bench(args, sim))
    finally:
        sim.stop()
    for name in sites:
        _site_table(name, runs, args)
    goal_rows = goals(runs)
    if goal_rows:
        print_table("goals (docs/benchmarks.md)", ["site", "goal", "figure", "verdict"], goal_rows)
    path = write_results(
        args.name,
        {
            "settings": {
                "seconds": args.seconds,
                "tasks": TASKS,
                "start_delay": START_DELAY,
                "max_delay": MAX_DELAY,
                "max_concurrency": MAX_CONCURRENCY,
                "target_override": args.target,
                "throttle_args": args.throttle_args,
                "busy": args.busy,
                "adaptive_args": args.adaptive,
                "sites": {b: SITES[b].__dict__ for b in sites},
                "seed": args.seed,
            },
            "runs": runs,
            "goals": [
                {"site": b, "goal": g, "figure": f, "verdict": v} for b, g, f, v in goal_rows
            ],
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()

"""Adaptive: each simulated behaviour, side by side with Scrapy and a plain client.

Run with ``python benchmarks/adaptive.py`` (every behaviour and client, 45 s a
run: about 25 minutes), ``--quick`` (15 s a run: about 9 minutes), or pick
behaviours and clients: ``--behaviours capacity,rate429 --clients
aiohttp,scrapy``. Loopback only.

One ``python -m autothrottle.sim`` process (a separate process, so clients and
server never share an event loop) serves one host per behaviour:

=============  =========================================================  =========
behaviour      sim spec                                                   capacity
=============  =========================================================  =========
capacity       ``capacity:workers=4,service_time=0.05``                   80/s
rate429        ``rate:rate=10,burst=2,headers=false`` (429+Retry-After)   10/s
rateheaders    ``rate:rate=10,burst=2,headers=true`` (and RateLimit)      10/s
cdn            ``cdn:hit_ratio=0.9,edge_time=0.005,workers=2,...=0.2``    100/s
softblock      ``softblock:rate=5`` (excess: a fast 200 CAPTCHA page)     5/s
variable       ``variable:fast_time=0.03,slow_time=0.5,slow_ratio=0.2``   32/s
=============  =========================================================  =========

Each behaviour is crawled, one run after another, by:

* ``httpx``: autothrottle's ``ThrottledClient``;
* ``aiohttp``: autothrottle's ``ThrottledSession``;
* ``scrapy``: a real Scrapy spider with AutoThrottle and the same settings
  (``_scrapy_runner.py``, in a subprocess);
* ``fixed``: plain ``aiohttp`` with a semaphore of ``max_concurrency`` (8);
* ``adaptive`` (capacity only): ``ThrottledSession`` with
  ``AdaptiveConcurrencyPolicy()`` and no target given.

The same settings everywhere: ``start_delay=1``, ``max_delay=60``,
``max_concurrency=8`` (``CONCURRENT_REQUESTS_PER_DOMAIN``), ``min_delay=0``
(``DOWNLOAD_DELAY``), jitter 0 (``DOWNLOAD_DELAY_JITTER``), and the target
concurrency of each behaviour (``--target`` overrides): 4 for capacity and
variable (the host's workers), 2 for the CDN (its origin's workers), 1 for the
rest. Scrapy's retries are off (as the other clients do not retry). Every
client requests ``/page/0``, ``/page/1``, ... of the same host from 16 tasks
(Scrapy: its scheduler), and on the soft-block host autothrottle's clients
call ``throttle.backoff(url)`` when ``is_blocked_page(body)`` (Scrapy and the
plain client cannot tell anyone). The host's stats are reset before each run.

Figures, all from the simulator's ground truth, over ``[first arrival, first
arrival + run length)``:

* goodput: 200 responses with a real page per second, and its share of the
  host's true capacity; "steady": the same over the second half of the run
  only (what the client settled at, without the ramp from ``start_delay``);
* errors: the share of requests answered 429 or with a CAPTCHA page;
* queue: the host's time-average queue (requests waiting for a worker; the
  origin's for the CDN), and its growth: the mean over the second half minus
  the mean over the first;
* max/1s: the most requests that arrived in any 1-second window;
* settle: the first time T such that the goodput of every W-second window
  starting at or after T is within 10 % of the last window's (W = 10 s, or a
  third of the run if shorter); "never" if only the last window qualifies.

Goals (issue 4) are checked and printed at the end; they are never part of
the test run.
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
from _common import SimProcess, control_session, print_table, write_results

from autothrottle import (
    AdaptiveConcurrencyPolicy,
    AutoThrottlePolicy,
    DelayPolicy,
    Sample,
    SlotConfig,
    Throttle,
)
from autothrottle.aiohttp import ThrottledSession
from autothrottle.httpx import ThrottledClient
from autothrottle.sim import is_blocked_page, max_in_window

if not sys.stdout.isatty():
    os.environ.setdefault("COLUMNS", "200")  # rich's tables: no wrapping when piped

HERE = Path(__file__).resolve().parent
TASKS = 16
MAX_CONCURRENCY = 8
START_DELAY = 1.0
MAX_DELAY = 60.0


@dataclass(frozen=True)
class Site:
    """One simulated behaviour and the settings every client uses against it."""

    name: str
    spec: str
    target: float
    description: str


SITES: dict[str, Site] = {
    s.name: s
    for s in (
        Site(
            "capacity",
            "capacity:workers=4,service_time=0.05",
            4.0,
            "C=4 workers, S=50 ms: C/S = 80/s",
        ),
        Site(
            "rate429",
            "rate:rate=10,burst=2,headers=false",
            1.0,
            "token bucket 10/s, burst 2; 429 + Retry-After only",
        ),
        Site(
            "rateheaders",
            "rate:rate=10,burst=2,headers=true",
            1.0,
            "token bucket 10/s, burst 2; 429 + Retry-After + RateLimit headers",
        ),
        Site(
            "cdn",
            "cdn:hit_ratio=0.9,edge_time=0.005,workers=2,service_time=0.2",
            2.0,
            "90 % hits in 5 ms; misses to an origin of 2 workers x 200 ms (10/s)",
        ),
        Site(
            "softblock",
            "softblock:rate=5",
            1.0,
            "token bucket 5/s, burst 1; excess gets a fast 200 CAPTCHA page",
        ),
        Site(
            "variable",
            "variable:fast_time=0.03,slow_time=0.5,slow_ratio=0.2,workers=4",
            4.0,
            "80 % of pages 30 ms, 20 % 500 ms, 4 workers: 32/s",
        ),
    )
}

CLIENTS = ("httpx", "aiohttp", "scrapy", "fixed", "adaptive")
CLIENT_LABELS = {
    "httpx": "autothrottle httpx",
    "aiohttp": "autothrottle aiohttp",
    "scrapy": "Scrapy AutoThrottle",
    "fixed": f"aiohttp, semaphore({MAX_CONCURRENCY})",
    "adaptive": "autothrottle aiohttp, AdaptiveConcurrency",
}


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


# -- prototypes of core changes (--prototype); the stock engine is the default -------

PROTOTYPES = ("cache-aware", "adaptive-fine")


class CacheAwarePolicy(AutoThrottlePolicy):
    """Prototype: AutoThrottle's rule aimed at the origin behind a cache.

    The stock rule lets only misses lower the delay, so the slot paces every
    request as if it went to the origin: on a 90 % hit site it sends a tenth
    of what the origin could take, and starting from ``start_delay`` it waits
    for misses (one in ten responses) to come down at all. This policy keeps
    an average of the share of misses and of the misses' latency, and aims at
    ``target_concurrency`` requests in flight *at the origin*: ``target =
    miss latency * miss share / target_concurrency``, by AutoThrottle's
    averaging rule. Hits move the delay too (they update the miss share), so
    the throttle must be built with ``cache_hits_lower_delay=True``. Before
    the first miss it keeps the delay: hits say nothing about the origin.
    """

    __slots__ = ("smoothing",)

    def __init__(self, smoothing: float = 0.05) -> None:
        self.smoothing = smoothing

    def next_delay(self, delay: float, sample: Sample, config: SlotConfig) -> float:
        state = sample.state
        share = state.get("miss_share", 1.0)
        share += self.smoothing * ((0.0 if sample.cache_hit else 1.0) - share)
        state["miss_share"] = share
        if not sample.cache_hit:
            miss = state.get("miss_latency", sample.latency)
            state["miss_latency"] = miss + 0.3 * (sample.latency - miss)
        miss_latency = state.get("miss_latency")
        if miss_latency is None:
            return delay
        target = miss_latency * share / config.target_concurrency
        return max(target, (delay + target) / 2.0)

    def __repr__(self) -> str:
        return f"CacheAwarePolicy(smoothing={self.smoothing!r})"


class FineAdaptivePolicy(AdaptiveConcurrencyPolicy):
    """Prototype: AdaptiveConcurrencyPolicy with a steadier queue estimate and finer steps.

    The stock policy compares the smoothed latency with the *lowest single*
    latency seen, so service-time jitter alone (a 45-55 ms host) reads as
    0.3-0.4 requests queued and stops the limit at the host's worker count,
    where the latency that also counts the trip to and from the host (about
    10 % more than the service time here) paces it at about 88 % of capacity.
    This one keeps as ``base`` the lowest *smoothed* latency (slowly
    forgotten), so jitter cancels out, and moves the limit by ``step`` (0.5)
    instead of 1, so it can settle between C and C + 1.
    """

    __slots__ = ("step",)

    def __init__(self, *, step: float = 0.5, **kwargs: float) -> None:
        super().__init__(**kwargs)
        self.step = step

    def next_delay(self, delay: float, sample: Sample, config: SlotConfig) -> float:
        state = sample.state
        latency = sample.latency
        limit = state.get("limit", self.initial_limit)
        if sample.status != 200 or sample.cache_hit or latency <= 0.0:
            state["limit"] = limit
            return delay
        short = state.get("short", latency)
        short += self.smoothing * (latency - short)
        base = min(short, state.get("base", short) * (1.0 + self.base_decay))
        seen = state.get("seen", 0.0) + 1.0
        if seen >= limit:
            seen = 0.0
            queued = limit * (1.0 - base / short) if short > 0 else 0.0
            cap = min(self.max_limit, float(config.max_concurrency))
            if queued < self.alpha and sample.in_flight >= limit - 1.0:
                limit = min(limit + self.step, cap)
            elif queued > self.beta:
                limit = max(limit - self.step, 1.0)
        state.update(limit=limit, base=base, short=short, seen=seen)
        return short / limit


def make_throttle(
    site: Site, args: argparse.Namespace, policy: DelayPolicy | None = None
) -> Throttle:
    prototypes = frozenset(args.prototypes)
    options: dict[str, Any] = {}
    if "cache-aware" in prototypes and policy is None:
        policy = CacheAwarePolicy()
        options["cache_hits_lower_delay"] = True
    throttle = Throttle(
        start_delay=START_DELAY,
        max_delay=MAX_DELAY,
        target_concurrency=args.target or site.target,
        max_concurrency=MAX_CONCURRENCY,
        policy=policy,
        **options,
    )
    if args.recovery_margin is not None:
        throttle.recovery_margin = args.recovery_margin
    if args.recovery_time is not None:
        throttle.recovery_time = args.recovery_time
    return throttle


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
    async with ThrottledClient(throttle=throttle, timeout=30) as client:

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
    base: str, seconds: float, site: Site, args: argparse.Namespace, tally: Tally
) -> dict[str, Any]:
    settings = {
        "AUTOTHROTTLE_START_DELAY": START_DELAY,
        "AUTOTHROTTLE_MAX_DELAY": MAX_DELAY,
        "AUTOTHROTTLE_TARGET_CONCURRENCY": args.target or site.target,
        "CONCURRENT_REQUESTS_PER_DOMAIN": MAX_CONCURRENCY,
        "CONCURRENT_REQUESTS": TASKS,
        "DOWNLOAD_DELAY": 0.0,
        "DOWNLOAD_DELAY_JITTER": 0.0,
        "RETRY_ENABLED": False,
    }
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "scrapy.json"
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(HERE / "_scrapy_runner.py"),
            "--base",
            base,
            # Scrapy needs a second or two to start; the window is measured
            # from its first request, so give it the run length after that.
            "--seconds",
            f"{seconds + 3:g}",
            "--pages",
            str(int((seconds + 3) * 1000)),
            "--settings",
            json.dumps(settings),
            "--out",
            str(out),
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
        if client in ("httpx", "aiohttp", "adaptive"):
            policy = None
            if client == "adaptive":
                cls = (
                    FineAdaptivePolicy
                    if "adaptive-fine" in args.prototypes
                    else AdaptiveConcurrencyPolicy
                )
                policy = cls(**args.adaptive)
            throttle = make_throttle(site, args, policy)
            runner = run_httpx if client == "httpx" else run_aiohttp
            await runner(base, seconds, throttle, softblock, tally)
        elif client == "fixed":
            await run_fixed(base, seconds, tally)
        else:
            extra = await run_scrapy(base, seconds, site, args, tally)
        wall = time.monotonic() - started
        await sim.wait_idle(http, host)
        doc = await sim.stats(http, host)
    figures = measure(doc, seconds)
    figures.update(
        behaviour=site.name,
        client=client,
        label=CLIENT_LABELS[client] + (variant_suffix(args) if throttle is not None else ""),
        wall=wall,
        client_statuses=tally.statuses,
        client_blocked=tally.blocked,
        client_events=tally.events,
        **extra,
    )
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
        policy_state = throttle.slot(host).policy_state
        if policy_state:
            figures["policy_state"] = dict(policy_state)
    return figures


# -- goals -----------------------------------------------------------------------------


def goals(runs: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """(behaviour, goal, figure, verdict) for every goal the runs can speak to."""
    rows: list[tuple[str, str, str, str]] = []
    by = {(r["behaviour"], r["client"]): r for r in runs}

    def verdict(ok: bool, short: str = "") -> str:
        return "met" if ok else f"MISSED{' ' + short if short else ''}"

    for client in ("httpx", "aiohttp"):
        r = by.get(("capacity", client))
        if r:
            share = r["steady_share"]
            ok = share >= 0.9 and r["queue_growth"] <= 0.5
            rows.append(
                (
                    "capacity",
                    f"{client}: goodput >= 0.9 C/S, no growing queue",
                    f"steady {share:.1%} of C/S, queue {r['queue_first_half']:.2f} -> "
                    f"{r['queue_second_half']:.2f}",
                    verdict(ok, f"by {0.9 - share:.1%}" if share < 0.9 else "(queue)"),
                )
            )
    r = by.get(("capacity", "adaptive"))
    if r:
        share = r["steady_share"]
        ok = share >= 0.9 and r["mean_queue"] < 0.5
        rows.append(
            (
                "capacity",
                "adaptive (no target): >= 0.9 C/S, mean queue < 0.5",
                f"steady {share:.1%} of C/S, mean queue {r['mean_queue']:.2f}",
                verdict(ok, f"by {0.9 - share:.1%}" if share < 0.9 else "(queue)"),
            )
        )
    for client in ("httpx", "aiohttp"):
        r = by.get(("rate429", client))
        if r:
            share, lim = r["steady_share"], r["limited_share"]
            rows.append(
                (
                    "rate429",
                    f"{client}: goodput >= 0.9 R, <= 2 % 429",
                    f"steady {share:.1%} of R, {lim:.1%} 429",
                    verdict(share >= 0.9 and lim <= 0.02),
                )
            )
        r = by.get(("rateheaders", client))
        if r:
            share, lim = r["steady_share"], r["limited_share"]
            rows.append(
                (
                    "rateheaders",
                    f"{client}: <= 0.5 % 429",
                    f"{lim:.2%} 429 (steady {share:.0%} of R)",
                    verdict(lim <= 0.005),
                )
            )
        r = by.get(("cdn", client))
        if r and "origin" in r:
            o = r["origin"]
            ok = o["load"] <= 1.0 and o["mean_queue"] < 0.5
            rows.append(
                (
                    "cdn",
                    f"{client}: origin never above capacity",
                    f"origin at {o['load']:.0%} of capacity, mean queue {o['mean_queue']:.2f}, "
                    f"busiest 1 s {o['max_in_window']} vs {o['capacity']:g}",
                    verdict(ok),
                )
            )
        r = by.get(("softblock", client))
        if r:
            rows.append(
                (
                    "softblock",
                    f"{client}: blocked share <= 5 %",
                    f"{r['blocked_share']:.1%}",
                    verdict(r["blocked_share"] <= 0.05),
                )
            )
    behaviours = sorted({r["behaviour"] for r in runs}, key=list(SITES).index)
    for behaviour in behaviours:
        scrapy = by.get((behaviour, "scrapy"))
        if scrapy is None:
            continue
        for client in ("httpx", "aiohttp"):
            r = by.get((behaviour, client))
            if r is None:
                continue
            # Goodput within 2 % of Scrapy's counts as "at least": runs differ by noise.
            ok = r["goodput"] >= 0.98 * scrapy["goodput"] and (
                r["error_share"] <= scrapy["error_share"] + 0.001
            )
            rows.append(
                (
                    behaviour,
                    f"{client}: goodput >= Scrapy's, errors <= Scrapy's",
                    f"{r['goodput']:.1f}/s vs {scrapy['goodput']:.1f}/s, "
                    f"errors {r['error_share']:.1%} vs {scrapy['error_share']:.1%}",
                    verdict(ok),
                )
            )
    return rows


# -- main ------------------------------------------------------------------------------


def _fmt_settle(s: dict[str, Any]) -> str:
    return "never" if s["settle"] is None else f"{s['settle']:.0f} s"


async def bench(args: argparse.Namespace, sim: SimProcess) -> list[dict[str, Any]]:
    runs = []
    hosts = dict(zip(args.behaviours, sim.hosts, strict=True))
    for behaviour in args.behaviours:
        site = SITES[behaviour]
        for client in args.clients:
            if client == "adaptive" and behaviour != "capacity":
                continue
            print(
                f"  {behaviour:<12} {CLIENT_LABELS[client]:<42} {args.seconds:g} s ...",
                end="",
                flush=True,
            )
            r = await run_one(sim, hosts[behaviour], site, client, args)
            print(
                f" goodput {r['goodput']:.1f}/s ({r['goodput_share']:.0%}), "
                f"errors {r['error_share']:.1%}, queue {r['mean_queue']:.2f}",
                flush=True,
            )
            runs.append(r)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=45.0, help="run length (default 45)")
    parser.add_argument("--quick", action="store_true", help="15-second runs")
    parser.add_argument(
        "--behaviours",
        default=",".join(SITES),
        help=f"comma-separated, among {', '.join(SITES)} (default all)",
    )
    parser.add_argument(
        "--clients",
        default=",".join(CLIENTS),
        help=f"comma-separated, among {', '.join(CLIENTS)} (default all)",
    )
    parser.add_argument("--target", type=float, default=None, help="override target concurrency")
    parser.add_argument(
        "--recovery-margin", type=float, default=None, help="Throttle.recovery_margin to use"
    )
    parser.add_argument(
        "--recovery-time", type=float, default=None, help="Throttle.recovery_time to use"
    )
    parser.add_argument(
        "--prototype",
        default="",
        help=f"comma-separated prototypes of core changes for autothrottle's clients, "
        f"among {', '.join(PROTOTYPES)} (see CacheAwarePolicy, FineAdaptivePolicy)",
    )
    parser.add_argument(
        "--adaptive-args",
        default="",
        metavar="NAME=VALUE,...",
        help="keyword arguments of AdaptiveConcurrencyPolicy for the adaptive client, "
        "e.g. alpha=0.5,beta=1.0 (default: none, the policy's defaults)",
    )
    parser.add_argument("--seed", type=int, default=1, help="the simulator's jitter seed")
    parser.add_argument("--name", default="adaptive", help="results file name (default adaptive)")
    args = parser.parse_args()
    if args.quick:
        args.seconds = 15.0
    if not 6 <= args.seconds <= 600:
        parser.error("--seconds must be in [6, 600]")
    args.behaviours = [b.strip() for b in args.behaviours.split(",") if b.strip()]
    args.clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    if not args.behaviours or not set(args.behaviours) <= set(SITES):
        parser.error(f"--behaviours must be among {', '.join(SITES)}")
    if not args.clients or not set(args.clients) <= set(CLIENTS):
        parser.error(f"--clients must be among {', '.join(CLIENTS)}")
    try:
        args.adaptive = {
            k.strip(): float(v)
            for k, v in (item.split("=", 1) for item in args.adaptive_args.split(",") if item)
        }
        AdaptiveConcurrencyPolicy(**args.adaptive)
    except (ValueError, TypeError) as exc:
        parser.error(f"--adaptive-args: {exc}")
    args.prototypes = [p.strip() for p in args.prototype.split(",") if p.strip()]
    if not set(args.prototypes) <= set(PROTOTYPES):
        parser.error(f"--prototype must be among {', '.join(PROTOTYPES)}")
    if args.target is not None and not args.target > 0:
        parser.error("--target must be > 0")
    if not re_safe_name(args.name):
        parser.error("--name must be letters, digits, - or _")

    sim_args = ["--seed", str(args.seed)]
    for i, behaviour in enumerate(args.behaviours):
        sim_args += ["--host", f"127.0.0.{2 + i}={SITES[behaviour].spec}"]
    print(
        f"adaptive: {len(args.behaviours)} behaviour(s) x {len(args.clients)} client(s), "
        f"{args.seconds:g} s a run",
        flush=True,
    )
    sim = SimProcess(sim_args)
    try:
        runs = asyncio.run(bench(args, sim))
    finally:
        sim.stop()

    for behaviour in args.behaviours:
        site = SITES[behaviour]
        rows = []
        for r in runs:
            if r["behaviour"] != behaviour:
                continue
            queue = r["mean_queue"]
            growth = r["queue_growth"]
            if "origin" in r:
                queue, growth = r["origin"]["mean_queue"], r["origin"]["queue_growth"]
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
                    f"{growth:+.2f}",
                    f"{r['max_in_window']}",
                    _fmt_settle(r["settle"]),
                    "" if delay is None else f"{delay * 1000:.0f}",
                )
            )
        origin_note = " (queue: the origin's)" if behaviour == "cdn" else ""
        print_table(
            f"{behaviour}: {site.description}; target {args.target or site.target:g}, "
            f"{args.seconds:g} s{origin_note}",
            [
                "client",
                "goodput/s",
                "of capacity",
                "steady",
                "429",
                "blocked",
                "mean queue",
                "queue growth",
                "max/1s",
                "settle",
                "final delay ms",
            ],
            rows,
        )
    goal_rows = goals(runs)
    if goal_rows:
        print_table("goals (issue 4)", ["behaviour", "goal", "figure", "verdict"], goal_rows)
    path = write_results(
        args.name,
        {
            "settings": {
                "seconds": args.seconds,
                "tasks": TASKS,
                "start_delay": START_DELAY,
                "max_delay": MAX_DELAY,
                "max_concurrency": MAX_CONCURRENCY,
                "jitter": 0.0,
                "target_override": args.target,
                "recovery_margin": args.recovery_margin,
                "recovery_time": args.recovery_time,
                "prototypes": args.prototypes,
                "adaptive_args": args.adaptive,
                "sites": {b: SITES[b].__dict__ for b in args.behaviours},
                "seed": args.seed,
            },
            "runs": runs,
            "goals": [
                {"behaviour": b, "goal": g, "figure": f, "verdict": v} for b, g, f, v in goal_rows
            ],
        },
    )
    print(f"results: {path}")


def variant_suffix(args: argparse.Namespace) -> str:
    """What differs from the stock engine, for the labels of autothrottle's runs."""
    parts = list(args.prototypes)
    parts += [f"{k}={v:g}" for k, v in args.adaptive.items()]
    if args.recovery_margin is not None:
        parts.append(f"margin {args.recovery_margin:g}")
    if args.recovery_time is not None:
        parts.append(f"recovery {args.recovery_time:g} s")
    return f" [{', '.join(parts)}]" if parts else ""


def re_safe_name(name: str) -> bool:
    return bool(name) and all(ch.isalnum() or ch in "-_" for ch in name)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()

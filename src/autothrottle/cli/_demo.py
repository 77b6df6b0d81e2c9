"""``autothrottle demo``: watch the throttle find the pace of five simulated sites.

Everything runs on loopback: an :class:`autothrottle.sim.SimServer`, in a
process of its own, serves five hosts of different behaviours (127.0.0.2 …
127.0.0.6), and a few workers per host fetch pages from them through ONE
:class:`~autothrottle.Throttle`, some hosts with httpx and some with aiohttp,
until the time is up. The site's ground truth (what arrived, the busiest
second, its queue) is what the summary judges the throttle by, not the
throttle's own view.

The sites get a process of their own as a real site has a machine of its own:
sharing the crawler's event loop, a site answered only when the crawler let
it run, so on a busy machine the crawler's own work read as the site's
latency, and the throttle slowed down for a load the site never had.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import math
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Literal, TextIO, cast

import aiohttp
import httpx
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from autothrottle import AdaptiveConcurrencyPolicy, HostSettings, Throttle, __version__
from autothrottle.aiohttp import ThrottledSession
from autothrottle.httpx import AsyncThrottledClient
from autothrottle.sim import (
    CDN,
    Behaviour,
    Capacity,
    HostStats,
    RateLimited,
    SimServer,
    SoftBlock,
    VariableLatency,
    is_blocked_page,
)
from autothrottle.timeline import Timeline

__all__ = ["Outcome", "Site", "build_throttle", "run", "sites"]

Client = Literal["httpx", "aiohttp"]

#: Requests each host's workers may have under way at once; the throttle's
#: ``max_concurrency`` is the same, so the throttle, not the worker count, sets the pace.
_WORKERS = 8


@dataclass(frozen=True)
class Site:
    """One simulated host of the demo and how it is crawled."""

    address: str
    name: str
    about: str
    behaviour: Behaviour
    client: Client
    settings: HostSettings | None = None


def sites() -> list[Site]:
    """The demo's hosts: one of each behaviour the simulator knows."""
    return [
        Site(
            "127.0.0.2",
            "slow origin",
            "4 workers, 50 ms a page; extra requests queue",
            Capacity(workers=4, service_time=0.05),
            "httpx",
        ),
        Site(
            "127.0.0.3",
            "rate-limited API",
            "10 requests/s (burst 5), told in RateLimit headers; excess gets 429",
            RateLimited(rate=10, burst=5),
            "aiohttp",
        ),
        Site(
            "127.0.0.4",
            "CAPTCHA wall",
            "5 requests/s; excess gets a 200 CAPTCHA page",
            SoftBlock(rate=5),
            "httpx",
        ),
        Site(
            "127.0.0.5",
            "CDN",
            "90 % cache hits (5 ms); misses go to a 2-worker origin (200 ms)",
            CDN(hit_ratio=0.9, origin=Capacity(workers=2, service_time=0.2), edge_time=0.005),
            "aiohttp",
        ),
        Site(
            "127.0.0.6",
            "mixed pages",
            "80 % fast pages (30 ms), 20 % slow (500 ms); 4 workers",
            VariableLatency(fast_time=0.03, slow_time=0.5, slow_ratio=0.2, workers=4),
            "httpx",
        ),
    ]


def build_throttle(demo_sites: list[Site], *, seed: int | None = None) -> Throttle:
    """The one throttle every host goes through: one policy for every site, no
    per-host tuning (a newcomer's settings), and a short start delay."""
    return Throttle(
        policy=AdaptiveConcurrencyPolicy(),
        start_delay=0.5,
        max_delay=10.0,
        max_concurrency=_WORKERS,
        hosts={s.address: s.settings for s in demo_sites if s.settings is not None},
        rng=random.Random(seed),
    )


# -- the sites, in a process of their own ------------------------------------------------


def _write(stream: BinaryIO, message: object) -> None:
    """One message on a pipe: its pickle, after its length."""
    data = pickle.dumps(message)
    stream.write(len(data).to_bytes(8, "big") + data)
    stream.flush()


def _read(stream: BinaryIO) -> object:
    """One message from a pipe (``EOFError``: the pipe closed)."""
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError
    return pickle.loads(stream.read(int.from_bytes(head, "big")))


def _serve_sites() -> None:
    """The child process (``python -c``): read the behaviours and seed from stdin,
    serve the sites, write their URLs; on "stats", their ground truth; on
    "stop", or stdin closed (the parent gone), end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the crawl, which ends us
    ask, tell = sys.stdin.buffer, sys.stdout.buffer
    behaviours, seed = cast(tuple[dict[str, Behaviour], int | None], _read(ask))

    async def serve() -> None:
        async with SimServer(behaviours, seed=seed) as server:
            _write(tell, {address: server.base_url(address) for address in behaviours})
            while True:
                try:
                    command = await asyncio.to_thread(_read, ask)
                except EOFError:
                    return
                if command != "stats":
                    return
                _write(tell, server.stats())

    asyncio.run(serve())


class _Sites:
    """The simulated sites, served by a child process; :class:`SimServer`'s
    ``base_url`` and ``stats``, asked across its pipes."""

    def __init__(self, behaviours: Mapping[str, Behaviour], seed: int | None) -> None:
        self._behaviours = dict(behaviours)
        self._seed = seed
        self._urls: dict[str, str] = {}
        self._process: asyncio.subprocess.Process | None = None

    async def _send(self, message: object) -> None:
        assert self._process is not None and self._process.stdin is not None
        data = pickle.dumps(message)
        self._process.stdin.write(len(data).to_bytes(8, "big") + data)
        await self._process.stdin.drain()

    async def _receive(self) -> object:
        assert self._process is not None and self._process.stdout is not None
        try:
            head = await self._process.stdout.readexactly(8)
            return pickle.loads(await self._process.stdout.readexactly(int.from_bytes(head, "big")))
        except asyncio.IncompleteReadError:
            raise RuntimeError("the simulated sites' process ended") from None

    async def __aenter__(self) -> _Sites:
        code = "from autothrottle.cli._demo import _serve_sites; _serve_sites()"
        self._process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        await self._send((self._behaviours, self._seed))
        self._urls = cast(dict[str, str], await self._receive())
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        process = self._process
        if process is None:
            return
        with contextlib.suppress(OSError, ConnectionError):
            await self._send("stop")
        try:
            await asyncio.wait_for(process.wait(), 10.0)
        except TimeoutError:  # pragma: no cover - a stuck child
            process.kill()
            await process.wait()

    def base_url(self, address: str) -> str:
        return self._urls[address]

    async def stats(self) -> dict[str, HostStats]:
        await self._send("stats")
        return cast(dict[str, HostStats], await self._receive())


# -- the crawl -------------------------------------------------------------------------


@dataclass
class Tally:
    """What the crawler itself saw from one host."""

    responses: int = 0
    ok: int = 0
    limited: int = 0
    blocked: int = 0
    cache_hits: int = 0
    other: int = 0
    errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)


@dataclass
class _Host:
    site: Site
    base_url: str
    tally: Tally = field(default_factory=Tally)
    pages: itertools.count[int] = field(default_factory=itertools.count)

    def next_url(self) -> str:
        return f"{self.base_url}/page/{next(self.pages)}"


Fetch = Callable[[str], Awaitable[tuple[int, bytes, str]]]


class _Crawl:
    """The crawl's shared state: hosts, throttle, timeline, stop signal."""

    def __init__(self, hosts: list[_Host], throttle: Throttle, timeline: Timeline) -> None:
        self.hosts = hosts
        self.throttle = throttle
        self.timeline = timeline
        self.stop = asyncio.Event()

    def record(self, host: _Host, url: str, status: int, body: bytes, cache: str) -> None:
        tally = host.tally
        tally.responses += 1
        tally.statuses[status] = tally.statuses.get(status, 0) + 1
        if cache.upper().startswith("HIT"):
            tally.cache_hits += 1
        if status == 200 and is_blocked_page(body):
            # Status 200, fast: only the body says we were blocked. Tell the
            # throttle, as any crawler that can recognise a block page should.
            tally.blocked += 1
            self.throttle.backoff(url)
            self.timeline.mark(host.site.address, "blocked")
        elif status == 200:
            tally.ok += 1
        elif status == 429:
            tally.limited += 1
        else:
            tally.other += 1

    async def worker(self, host: _Host, fetch: Fetch) -> None:
        while not self.stop.is_set():
            url = host.next_url()
            try:
                status, body, cache = await fetch(url)
            except (TimeoutError, httpx.HTTPError, aiohttp.ClientError, OSError):
                host.tally.errors += 1
                await asyncio.sleep(0.05)  # never spin on a dead host
                continue
            self.record(host, url, status, body, cache)


def _httpx_fetch(client: httpx.AsyncClient) -> Fetch:
    async def fetch(url: str) -> tuple[int, bytes, str]:
        response = await client.get(url)
        return response.status_code, response.content, response.headers.get("X-Cache", "")

    return fetch


def _aiohttp_fetch(session: aiohttp.ClientSession) -> Fetch:
    async def fetch(url: str) -> tuple[int, bytes, str]:
        async with session.get(url) as response:
            body = await response.read()
            return response.status, body, response.headers.get("X-Cache", "")

    return fetch


# -- what the user sees ------------------------------------------------------------------


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds * 1000:.0f} ms"


def _rate(value: float) -> str:
    if not math.isfinite(value):
        return "unlimited"
    return f"{value:.1f}/s" if value < 100 else f"{value:.0f}/s"


def _capacity(behaviour: Behaviour) -> str:
    """The true capacity, and for a CDN its origin's, which is what the pace must respect."""
    if isinstance(behaviour, CDN):
        return f"{behaviour.capacity:.3g}/s (origin {behaviour.origin.capacity:.3g}/s)"
    return f"{behaviour.capacity:.3g}/s"


def _share(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f} %" if whole else "-"


def _statuses(tally: Tally) -> Text:
    text = Text()
    parts: list[tuple[str, str]] = [(f"{tally.ok} ok", "green")]
    if tally.limited:
        parts.append((f"{tally.limited} refused (429)", "bold red"))
    if tally.blocked:
        parts.append((f"{tally.blocked} blocked", "bold magenta"))
    if tally.cache_hits:
        parts.append((f"{tally.cache_hits} cached", "cyan"))
    if tally.other:
        parts.append((f"{tally.other} other", "yellow"))
    if tally.errors:
        parts.append((f"{tally.errors} errors", "red"))
    for i, (label, style) in enumerate(parts):
        if i:
            text.append("  ")
        text.append(label, style=style)
    return text


def _live_table(crawl: _Crawl, elapsed: float, duration: float) -> Group:
    table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)
    table.add_column("site", no_wrap=True, style="bold")
    table.add_column("client", no_wrap=True)
    for name in ("delay", "latency", "in flight", "req/s", "capacity"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("responses", ratio=1)  # wraps on a narrow terminal; the rest never cut
    snapshot = crawl.throttle.snapshot()
    for host in crawl.hosts:
        address = host.site.address
        snap = snapshot.get(address)
        table.add_row(
            host.site.name,
            host.site.client,
            _ms(snap.delay if snap else None),
            _ms(snap.last_latency if snap else None),
            str(snap.in_flight if snap else 0),
            _rate(crawl.timeline.rate(address, 2.0)),
            f"{host.site.behaviour.capacity:.3g}/s",
            _statuses(host.tally),
        )
    bar = Text(
        f"crawling · {elapsed:3.0f} s of {duration:g} s · Ctrl-C ends it early", style="bold"
    )
    return Group(bar, table)


class _NoTrailingSpaces(io.TextIOBase):
    """A text stream that drops the spaces rich pads lines with, for pipes and logs."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        self._inner.write("\n".join(line.rstrip(" ") for line in text.split("\n")))
        return len(text)

    def flush(self) -> None:
        self._inner.flush()


def _console() -> Console:
    """A terminal's own width; piped, the ``COLUMNS`` width (or 100) and no padding."""
    if Console().is_terminal:
        return Console()
    try:
        width = int(os.environ.get("COLUMNS", "100"))
    except ValueError:
        width = 100
    stream = cast(TextIO, _NoTrailingSpaces(sys.stdout))
    return Console(file=stream, width=max(width, 60))


def _progress_line(crawl: _Crawl, elapsed: float) -> str:
    parts = []
    for host in crawl.hosts:
        t = host.tally
        note = ""
        if t.limited:
            note += f", {t.limited} refused (429)"
        if t.blocked:
            note += f", {t.blocked} blocked"
        rate = crawl.timeline.rate(host.site.address, 2.0)
        parts.append(f"{host.site.name} {rate:.1f}/s{note}")
    return f"[{elapsed:3.0f} s] " + " · ".join(parts)


def _intro(demo_sites: list[Site], hosts: list[_Host], duration: float, width: int) -> Group:
    table = Table(box=None, header_style="bold", pad_edge=False)
    narrow = width < 100  # the client column goes first; the URL is never cut
    for name in ("url", "site", "client", "behaviour", "true capacity"):
        if name == "client" and narrow:
            continue
        table.add_column(
            name,
            justify="right" if name == "true capacity" else "left",
            no_wrap=name != "behaviour",
            ratio=1 if name == "behaviour" else None,
        )
    for h in hosts:
        row = [h.base_url, h.site.name, h.site.client, h.site.about, _capacity(h.site.behaviour)]
        if narrow:
            del row[2]
        table.add_row(*row)
    head = Text.assemble(
        (f"autothrottle {__version__} demo", "bold"),
        f": {len(demo_sites)} simulated sites on loopback, crawled for {duration:g} s "
        "through ONE Throttle with one policy for every site (AdaptiveConcurrencyPolicy, "
        f"start_delay 0.5 s, at most {_WORKERS} requests in flight per host). "
        "Nothing leaves this machine.",
    )
    hint = Text(
        "Each host starts at a 0.5 s delay; watch it settle at the pace the site allows.",
        style="dim",
    )
    return Group(head, table, hint)


JUDGED = 0.5
"""The verdicts judge the last half of each host's crawl: the pace found. The
first half includes finding it (the ramp up from the start delay, a first
refusal), which the summary table's whole-run figures show."""


@dataclass(frozen=True)
class Figures:
    """A host's own counts over the judged part of its crawl (see :data:`JUDGED`)."""

    goodput: float
    answered: int
    limited: int
    blocked: int
    mean_queued: float
    wait_mean: float

    @classmethod
    def judged(cls, stats: HostStats) -> Figures:
        """``stats`` over the last :data:`JUDGED` of the host's active period (the
        whole of it when the stats keep no history)."""
        first, last = stats.first_arrival, stats.last_finish
        if first is None or last is None or last <= first or not stats.records:
            waits = stats.wait_mean
            return cls(
                stats.goodput,
                stats.completed,
                stats.limited,
                stats.blocked,
                stats.mean_queued,
                waits,
            )
        start = last - JUDGED * (last - first)
        inside = [r for r in stats.records if start <= r.finish <= last and r.outcome != "aborted"]
        span = last - start
        count = {o: sum(r.outcome == o for r in inside) for o in ("ok", "limited", "blocked")}
        return cls(
            goodput=count["ok"] / span,
            answered=len(inside),
            limited=count["limited"],
            blocked=count["blocked"],
            mean_queued=_mean_of_steps(stats.queued_series, start, last),
            wait_mean=sum(r.wait for r in inside) / len(inside) if inside else 0.0,
        )


def _mean_of_steps(series: tuple[tuple[float, int], ...], start: float, end: float) -> float:
    """The time average over ``[start, end]`` of a count that holds from each step to the next."""
    total = 0.0
    for (at, count), (after, _) in zip(series, (*series[1:], (end, 0)), strict=True):
        overlap = min(after, end) - max(at, start)
        if overlap > 0.0:
            total += count * overlap
    return total / (end - start)


@dataclass(frozen=True)
class Outcome:
    """One host's result: the crawler's tally, the site's truth, the throttle's state."""

    site: Site
    tally: Tally
    truth: HostStats
    delay: float

    @property
    def capacity(self) -> float:
        return self.site.behaviour.capacity

    def verdict(self) -> str:
        """One sentence a newcomer understands, on the judged part of the crawl."""
        f = Figures.judged(self.truth)
        b = self.site.behaviour
        good = f.goodput
        answered = max(f.answered, 1)
        if isinstance(b, RateLimited):
            return _bucket_verdict(good, b.rate, f.limited / answered, 0.03, "refused", "with 429")
        if isinstance(b, SoftBlock):
            return _bucket_verdict(good, b.rate, f.blocked / answered, 0.05, "CAPTCHA pages", "")
        if isinstance(b, CDN):
            return self._cdn_verdict(good)
        # A host bound by its workers (Capacity, VariableLatency): busy, without a pile-up.
        workers = b.workers if isinstance(b, (Capacity, VariableLatency)) else 1
        head = _load_word(good, self.capacity, f.mean_queued, workers)
        return (
            f"{head}: {good:.1f}/s of the {self.capacity:.0f}/s it can serve, "
            f"{_ms(f.wait_mean)} average wait for a worker there"
        )

    def _cdn_verdict(self, good: float) -> str:
        """A CDN is judged by its origin: misses against what the origin serves."""
        b = self.site.behaviour
        assert isinstance(b, CDN)
        if self.truth.origin is None:  # pragma: no cover - a CDN host always has one
            return f"{good:.1f}/s"
        origin = Figures.judged(self.truth.origin)
        head = _load_word(origin.goodput, b.origin.capacity, origin.mean_queued, b.origin.workers)
        return (
            f"{head}: {origin.goodput:.1f} misses/s of the {b.origin.capacity:g}/s its origin "
            f"serves ({good:.0f}/s in all), {origin.mean_queued:.1f} waiting there on average"
        )


FOUND = 0.75
"""The share of what a site allows that "found the pace" needs."""

VERDICT_WORDS = (
    (
        "found the pace",
        f"at least {FOUND:.0%} of what the site allows, within its refusal bound, "
        "over the second half of the crawl (the first half finds the pace)",
    ),
    ("too cautious", f"under {FOUND:.0%} of what the site allows"),
    ("too fast", "more refusals (429s, CAPTCHA pages) than the site's bound (3 %, 5 %)"),
    ("pushed too hard", "more waiting at the host (behind a cache: its origin) than workers"),
)
"""Each verdict word and what it means, printed under the verdicts."""


def _load_word(good: float, capacity: float, queued: float, workers: int) -> str:
    if queued > workers:
        return "pushed too hard"
    if capacity > 0 and good >= FOUND * capacity:
        return "found the pace"
    return "too cautious"


_SUMMARY_COLUMNS = (
    "site",
    "goodput",
    "true capacity",
    "429",
    "blocked",
    "final delay",
    "requests",
    "max in 1 s",
)
"""The summary's columns, most wanted first: a narrow terminal drops from the end."""


def _summary_row(o: Outcome) -> list[str]:
    s = o.truth
    return [
        o.site.name,
        _rate(s.goodput),
        f"{o.capacity:.3g}/s",
        _share(s.limited, s.completed),
        _share(s.blocked, s.completed),
        _ms(o.delay),
        str(s.requests),
        str(s.max_in_window),
    ]


def _summary_table(outcomes: list[Outcome], elapsed: float, width: int = 200) -> Table:
    rows = [_summary_row(o) for o in outcomes]
    widths = [
        max(len(name), *(len(row[i]) for row in rows)) for i, name in enumerate(_SUMMARY_COLUMNS)
    ]
    keep = len(_SUMMARY_COLUMNS)
    while keep > 2 and sum(widths[:keep]) + 3 * (keep - 1) > width:
        keep -= 1
    table = Table(
        title=f"after {elapsed:.0f} s, as the sites counted it",
        box=box.SIMPLE_HEAD,
        header_style="bold",
        pad_edge=False,
    )
    for index, name in enumerate(_SUMMARY_COLUMNS[:keep]):
        table.add_column(
            name,
            no_wrap=True,
            style="bold" if index == 0 else "",
            justify="left" if index == 0 else "right",
        )
    for row in rows:
        table.add_row(*row[:keep])
    return table


def _verdicts(outcomes: list[Outcome]) -> Table:
    table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 1))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for o in outcomes:
        style = "green" if o.verdict().startswith("found") else "yellow"
        table.add_row(o.site.name, Text(o.verdict(), style=style))
    table.add_row("", "")
    for word, meaning in VERDICT_WORDS:
        table.add_row(Text(word, style="dim"), Text(meaning, style="dim"))
    return table


# -- running it ----------------------------------------------------------------------------


async def _progress(
    crawl: _Crawl, console: Console, live: bool, started: float, duration: float
) -> None:
    """Refresh the live view (or print a line now and then) until cancelled."""
    if live:
        with Live(
            _live_table(crawl, 0.0, duration),
            console=console,
            auto_refresh=False,
            transient=False,
        ) as view:
            while True:  # ends by cancellation
                await asyncio.sleep(0.25)
                elapsed = time.monotonic() - started
                view.update(_live_table(crawl, elapsed, duration), refresh=True)
    every = 5.0 if duration >= 10 else 1.0
    for tick in itertools.count(1):  # ends by cancellation
        await asyncio.sleep(max(0.0, started + tick * every - time.monotonic()))
        console.print(_progress_line(crawl, time.monotonic() - started), highlight=False)


async def _crawl(
    duration: float, live: bool, seed: int | None, console: Console
) -> tuple[list[Outcome], Timeline, float]:
    """Serve the sites, crawl them until the time is up; the outcomes, timeline, seconds."""
    demo_sites = sites()
    throttle = build_throttle(demo_sites, seed=seed)
    timeline = Timeline(throttle, interval=0.1)
    async with _Sites({s.address: s.behaviour for s in demo_sites}, seed) as server:
        hosts = [_Host(s, server.base_url(s.address)) for s in demo_sites]
        console.print(_intro(demo_sites, hosts, duration, console.width))
        crawl = _Crawl(hosts, throttle, timeline)
        async with (
            AsyncThrottledClient(
                throttle=throttle,
                trust_env=False,  # loopback only, whatever proxies the environment names
                timeout=httpx.Timeout(15.0),
                limits=httpx.Limits(max_connections=100, max_keepalive_connections=100),
            ) as client,
            ThrottledSession(
                throttle=throttle,
                timeout=aiohttp.ClientTimeout(total=15.0),
                connector=aiohttp.TCPConnector(limit=100),
            ) as session,
        ):
            fetchers: dict[Client, Fetch] = {
                "httpx": _httpx_fetch(client),
                "aiohttp": _aiohttp_fetch(session),
            }
            started = time.monotonic()
            await timeline.start()
            workers = [
                asyncio.create_task(crawl.worker(h, fetchers[h.site.client]))
                for h in hosts
                for _ in range(_WORKERS)
            ]
            progress = asyncio.create_task(_progress(crawl, console, live, started, duration))
            try:
                await _wait(duration)
            finally:
                elapsed = time.monotonic() - started
                crawl.stop.set()
                progress.cancel()
                await asyncio.gather(progress, return_exceptions=True)
                # Give the requests under way a moment to finish, then cancel
                # the rest (most are only waiting for their turn).
                _, pending = await asyncio.wait(workers, timeout=0.5)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                await timeline.stop()
        truth = await server.stats()
    snapshot = throttle.snapshot()
    outcomes = [
        Outcome(h.site, h.tally, truth[h.site.address], snapshot[h.site.address].delay)
        for h in hosts
        if h.site.address in snapshot
    ]
    return outcomes, timeline, elapsed


async def _wait(duration: float) -> None:
    """Sleep ``duration`` seconds, or until Ctrl-C, which then only ends the crawl."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    try:
        loop.add_signal_handler(signal.SIGINT, stop.set)
    except (NotImplementedError, RuntimeError, ValueError):  # Windows, or not the main thread
        await asyncio.sleep(duration)
        return
    try:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), duration)
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def run(
    *,
    duration: float,
    out: str | Path,
    live: bool = True,
    seed: int | None = None,
    console: Console | None = None,
) -> int:
    """Run the demo and save its chart to ``out``; returns the exit status (0).

    Raises:
        ValueError: ``out`` cannot be written (checked before the crawl starts).
    """
    if console is None:
        console = _console()
    live = live and console.is_terminal
    path = Path(out).expanduser().resolve()
    try:  # fail now rather than after the whole crawl
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"out: cannot write the chart to {str(path)!r}: {exc}") from None
    if path.is_dir():
        raise ValueError(f"out: {str(path)!r} is a directory; give a file name such as demo.png")
    outcomes, timeline, elapsed = asyncio.run(_crawl(duration, live, seed, console))
    console.print()
    console.print(_summary_table(outcomes, elapsed, console.width))
    console.print(_verdicts(outcomes))
    console.print()
    timeline.plot(
        path,
        title="autothrottle demo: each host's pace, found by one Throttle",
        labels={
            o.site.address: f"{o.site.address}  {o.site.name} ({o.site.client}): {o.site.about}"
            for o in outcomes
        },
        capacities={o.site.address: o.capacity for o in outcomes},
        keys=[o.site.address for o in outcomes],
        origin_capacities={
            o.site.address: o.site.behaviour.origin.capacity
            for o in outcomes
            if isinstance(o.site.behaviour, CDN)
        },
    )
    console.print(f"chart saved to [bold]{path}[/]", highlight=False)
    return 0


def _bucket_verdict(
    good: float, rate: float, bad: float, max_bad: float, what: str, how: str
) -> str:
    """The verdict on a token-bucket site: found its pace, too fast, or too cautious."""
    if bad <= max_bad and good >= FOUND * rate:
        return f"found the pace: {good:.1f}/s of {rate:g}/s allowed, {100 * bad:.1f} % {what}"
    if bad > max_bad:
        return f"too fast: {100 * bad:.1f} % {what} {how} ({good:.1f}/s)".replace("  ", " ")
    return f"too cautious: {good:.1f}/s of {rate:g}/s allowed"

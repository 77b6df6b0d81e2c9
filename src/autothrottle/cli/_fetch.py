"""``autothrottle fetch``: fetch a list of URLs, each host as fast as it allows, all at once.

The pieces (docs/cli.md, "fetch", states the rules):

* a reader thread hands the URL list over in batches through a bounded queue,
  so the input streams;
* a scheduler holds at most ``buffer`` URLs, in one queue per host, and starts
  a task for the next host in turn that has room: at most the slot's
  ``max_concurrency`` tasks per host and ``max_in_flight`` in all, so one slow
  host never takes every task;
* each task sends through the throttled client, retries a 429, a 503 or a
  failure at most ``retries`` times (each retry waits for the slot's turn
  again: the throttle's pause obeys ``Retry-After``), and writes one line;
* the first SIGINT/SIGTERM stops taking URLs, gives the requests under way
  ``grace`` seconds, then cancels the rest; a cancelled URL writes nothing, so
  a rerun fetches it. A second signal cancels at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from autothrottle import Throttle
from autothrottle.timeline import Timeline

from ._fetch_clients import open_sender
from ._fetch_io import BodyStore, LineWriter, UrlSet, count_urls, read_urls, resume
from ._fetch_options import FetchJob
from ._fetch_progress import Tally, live_view, plain_line, summary, summary_data
from ._fetch_url import UrlFetch, error_text, record
from ._fetch_url import problem as url_problem
from ._robots import FetchTimeline, Robots

__all__ = ["run"]

# -- the scheduler ------------------------------------------------------------------------


class _Scheduler:
    """Per-host queues of URLs, handed out one host at a time, within two caps."""

    def __init__(self, cap: Callable[[str], int], max_in_flight: int) -> None:
        self._cap = cap
        self._max = max_in_flight
        self._queues: dict[str, deque[str]] = {}
        self._active: dict[str, int] = {}
        self._caps: dict[str, int] = {}
        self._ready: deque[str] = deque()
        self._in_ready: set[str] = set()
        self.buffered = 0
        self.in_flight = 0

    def _room(self, key: str) -> bool:
        cap = self._caps.get(key)
        if cap is None:
            cap = self._caps[key] = self._cap(key)
        return self._active.get(key, 0) < cap

    def _offer(self, key: str) -> None:
        if key not in self._in_ready and key in self._queues and self._room(key):
            self._ready.append(key)
            self._in_ready.add(key)

    def put(self, key: str, url: str) -> None:
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        queue.append(url)
        self.buffered += 1
        self._offer(key)

    def take(self) -> tuple[str, str] | None:
        """The next (host, URL) to start, or None if nothing may start now."""
        if self.in_flight >= self._max or not self._ready:
            return None
        key = self._ready.popleft()
        self._in_ready.discard(key)
        queue = self._queues[key]
        url = queue.popleft()
        if not queue:
            del self._queues[key]
        self.buffered -= 1
        self.in_flight += 1
        self._active[key] = self._active.get(key, 0) + 1
        self._offer(key)  # back of the line: every host in turn
        return key, url

    def finish(self, key: str) -> None:
        self.in_flight -= 1
        left = self._active[key] - 1
        if left:
            self._active[key] = left
        else:
            del self._active[key]
            if key not in self._queues:
                self._caps.pop(key, None)
        self._offer(key)

    @property
    def idle(self) -> bool:
        return not self.buffered and not self.in_flight


# -- the input ------------------------------------------------------------------------------

_BATCH = 512
_DEPTH = 8  # batches in the hand-over queue: at most _BATCH * _DEPTH URLs read ahead


def _start_reader(
    urls: Iterator[str], loop: asyncio.AbstractEventLoop
) -> asyncio.Queue[list[str] | BaseException | None]:
    """Read ``urls`` in a daemon thread (stdin may block), batches through a bounded queue.

    The thread blocks while the queue is full; None ends the input, an
    exception is the reader's error. A daemon thread never holds up the exit.
    """
    queue: asyncio.Queue[list[str] | BaseException | None] = asyncio.Queue(_DEPTH)

    def hand(item: list[str] | BaseException | None) -> bool:
        try:
            asyncio.run_coroutine_threadsafe(queue.put(item), loop).result()
        except (RuntimeError, asyncio.CancelledError):  # the loop is gone: stop reading
            return False
        return True

    def read() -> None:
        try:
            while batch := list(itertools.islice(urls, _BATCH)):
                if not hand(batch):
                    return
        except Exception as exc:
            hand(exc)
            return
        hand(None)

    threading.Thread(target=read, name="autothrottle-fetch-reader", daemon=True).start()
    return queue


# -- the fetch -------------------------------------------------------------------------------


class _Fetch:
    """One run: admits URLs, starts a task per URL, writes each finished line."""

    def __init__(
        self, job: FetchJob, throttle: Throttle, writer: LineWriter, seen: UrlSet, tally: Tally
    ) -> None:
        self.job = job
        self.throttle = throttle
        self.writer = writer
        self.seen = seen
        self.tally = tally
        self.output_error: OSError | None = None
        self.sched = _Scheduler(lambda k: throttle.config_for(k).max_concurrency, job.max_in_flight)
        self.tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        self.signal: int | None = None  # the first signal that stopped the run
        self.stop_now = asyncio.Event()
        self.input_done = False
        self.url: UrlFetch | None = None  # set once the client is open
        self.robots: Robots | None = None
        self.timeline: FetchTimeline | None = None
        self.note: Callable[[str], None] = lambda text: None  # -v's lines
        self._work = asyncio.Event()
        self._space = asyncio.Event()
        self._stopped = asyncio.Event()

    def stop(self, signum: int | None = None) -> None:
        """First call: take no new URL, finish what is under way. Second: cancel it."""
        if self.signal is None:
            self.signal = signum
        if self.stopping:
            self.stop_now.set()
        self.stopping = True
        self._stopped.set()
        self._work.set()
        self._space.set()

    def write(self, line: dict[str, Any], key: str | None) -> None:
        """Write ``line``; if the output fails, the run ends at once (nothing more to keep)."""
        if self.output_error is not None:
            return
        try:
            self.writer.write(line)
        except OSError as exc:
            self.output_error = exc
            self.stop()
            self.stop()
            return
        self.tally.finished(key, line)

    # -- input ---------------------------------------------------------------------------

    async def produce(self, batches: asyncio.Queue[list[str] | BaseException | None]) -> None:
        """Admit URLs from the reader while the buffer has room, until the input ends."""
        try:
            while not self.stopping:
                item = await batches.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                for url in item:
                    self._admit(url)
                while self.sched.buffered >= self.job.buffer and not self.stopping:
                    self._space.clear()
                    await self._space.wait()
        finally:
            self.input_done = True
            self._work.set()

    def _admit(self, url: str) -> None:
        if not self.seen.add(url):  # written by an earlier run, or repeated in the input
            self.tally.skipped += 1
            return
        problem = url_problem(url)
        key = ""
        if problem is None:
            try:
                key = self.throttle.key_for(url)
            except (TypeError, ValueError) as exc:
                problem = error_text(exc)
        if problem is not None:
            self.note(f"{url}: {problem}")
            self.write(record(url, key, None, problem, 0, 0.0), None)
            return
        self.sched.put(key, url)
        self._work.set()

    # -- the tasks -------------------------------------------------------------------------

    async def dispatch(self) -> None:
        """Start tasks while the scheduler allows, until the input is done or a stop."""
        while True:
            self._work.clear()
            started = False
            while not self.stopping and (item := self.sched.take()) is not None:
                self._spawn(*item)
                started = True
            if started:
                self._space.set()
            if self.stopping or (self.input_done and self.sched.idle):
                return
            await self._work.wait()

    def _spawn(self, key: str, url: str) -> None:
        self.tally.host(key).active += 1
        task = asyncio.get_running_loop().create_task(self._one(key, url))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _one(self, key: str, url: str) -> None:
        assert self.url is not None
        try:
            line = await self.url.line(key, url)
        except Exception as exc:  # what no rule foresaw: the URL still gets its line
            self.note(f"{url}: {error_text(exc)}")
            line = record(url, key, None, error_text(exc), 0, 0.0)
        finally:
            self.sched.finish(key)
            self.tally.host(key).active -= 1
            self._work.set()
        if line is not None:
            self.write(line, key)

    async def drain(self) -> None:
        """Wait for the tasks; once stopping, for ``grace`` seconds at most, then cancel."""
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        try:
            while self.tasks and not self.stop_now.is_set():
                left: float | None = None
                event = self._stopped
                if self.stopping:
                    if deadline is None:
                        deadline = loop.time() + self.job.grace
                    left, event = deadline - loop.time(), self.stop_now
                    if left <= 0:
                        break
                waiter = loop.create_task(event.wait())
                try:
                    await asyncio.wait(
                        {*self.tasks, waiter}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    waiter.cancel()
        finally:
            pending = list(self.tasks)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


# -- running it ---------------------------------------------------------------------------


@contextlib.contextmanager
def _signals(stop: Callable[[int], None]) -> Iterator[None]:
    """SIGINT and SIGTERM call ``stop(signum)`` instead of killing the run (where the
    loop can)."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop, int(sig))
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # Windows, not the main thread
            pass
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


async def _progress(job: FetchJob, fetch: _Fetch, console: Console, live: bool) -> None:
    """Refresh the live view, or print a line every ``interval`` seconds, until cancelled."""
    tally, throttle = fetch.tally, fetch.throttle
    if live:
        with Live(console=console, auto_refresh=False, transient=True) as view:
            while True:  # ends by cancellation
                view.update(live_view(tally, throttle, fetch.sched.in_flight), refresh=True)
                await asyncio.sleep(0.5)
    while True:  # ends by cancellation
        await asyncio.sleep(job.interval)
        line = plain_line(tally, throttle, fetch.sched.in_flight)
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def _live(job: FetchJob, console: Console) -> bool | None:
    """True: the live table; False: plain lines; None: no progress at all.

    ``auto`` draws the table on a terminal, but for lines that go to a terminal
    too (no ``-o``, standard output not redirected): each redraw of the table
    would write over the lines printed since the last.
    """
    if job.progress == "none":
        return None
    if job.progress == "auto":
        return console.is_terminal and not (job.out is None and os.isatty(1))
    return job.progress == "live"


async def _fetch(job: FetchJob, throttle: Throttle, console: Console, fetch: _Fetch) -> None:
    """Fetch every URL not seen before, through one client and (unless told not to) the
    hosts' robots.txt."""
    loop = asyncio.get_running_loop()
    bodies = BodyStore(job.bodies) if job.bodies is not None else None
    async with open_sender(
        job.client,
        throttle,
        io_timeout=job.timeout,
        connections=job.max_in_flight,
        headers=job.request_headers(),
        proxy=job.proxy,
        bodies=bodies,
    ) as sender:
        note = fetch.note = _noter(job, console)
        if job.robots:
            fetch.robots = Robots(
                sender, throttle, job.agent, attempts=job.retries + 1, note=note, within=job.timeout
            )
        fetch.url = UrlFetch(
            job,
            throttle,
            sender,
            fetch.tally,
            fetch.robots,
            stopping=lambda: fetch.stopping,
            note=note,
        )
        with _signals(fetch.stop):
            reader = _start_reader(read_urls(job.urls), loop)
            producer = loop.create_task(fetch.produce(reader))
            live = _live(job, console)
            helpers = [producer]
            if live is not None:
                helpers.append(loop.create_task(_progress(job, fetch, console, live)))
            if fetch.timeline is not None:
                await fetch.timeline.start()
            try:
                await fetch.dispatch()
                await fetch.drain()
            finally:
                await _end(helpers, fetch.timeline)
            if producer.done() and not producer.cancelled() and producer.exception():
                raise producer.exception()  # type: ignore[misc]


def _noter(job: FetchJob, console: Console) -> Callable[[str], None]:
    """Where ``-v``'s lines go (nowhere without it)."""

    def note(text: str) -> None:
        if job.verbosity > 0:
            console.print(text, highlight=False, markup=False, soft_wrap=True)

    return note


async def _end(helpers: list[asyncio.Task[None]], timeline: Timeline | None) -> None:
    for task in helpers:
        if not task.done():
            task.cancel()
    await asyncio.gather(*helpers, return_exceptions=True)
    if timeline is not None:
        await timeline.stop()
        timeline.close()


class _ConsoleLog(logging.Handler):
    """``--debug``'s records, printed by the run's console: above the live table, not
    through it, and with ``-q`` too (asked for by name, they are not progress)."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.DEBUG)
        self._console = console
        self.setFormatter(logging.Formatter("%(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            self._console.print(text, highlight=False, markup=False, soft_wrap=True)
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def _debug_log(throttle: Throttle, console: Console) -> Iterator[None]:
    """With ``--debug``, the throttle's ``autothrottle`` logger shows its records on the
    console: ``Throttle(debug=True)`` only makes them, and a command has no logging set up
    of its own to show them."""
    if not throttle.debug:
        yield
        return
    logger = logging.getLogger("autothrottle")
    handler, level = _ConsoleLog(console), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


SAMPLE_INTERVAL = 0.25
"""Seconds between two samples of ``--chart`` and ``--timeline``'s timeline, at least."""

SAMPLE_INTERVAL_PER_SLOT = 0.0001
"""And at least this long a slot sampled: one sample of 10,000 hosts a second."""


def timeline_for(throttle: Throttle, jsonl: str | None) -> FetchTimeline:
    """The timeline of ``--chart`` and ``--timeline``: a sample every 0.25 s, or
    0.1 ms a slot when longer (past 2,500 hosts: a sample costs about 2.7 µs of
    CPU a slot, so sampling stays within about 3 % of a core), and the
    Timeline's own bounds (its ``max_slots`` slots, idle ones held as runs),
    which keep it bounded on a crawl of any number of hosts. Its chart leaves
    out robots.txt's answers that there is none (:class:`FetchTimeline`)."""
    return FetchTimeline(
        throttle, interval=SAMPLE_INTERVAL, interval_per_slot=SAMPLE_INTERVAL_PER_SLOT, jsonl=jsonl
    )


def run(job: FetchJob, throttle: Throttle, *, console: Console | None = None) -> int:
    """Run the fetch; the exit status (docs/cli.md): 0 every URL answered (or excluded
    by robots.txt), 1 some URL ended in an error, 3 the output could not be written,
    130/143 stopped by SIGINT/SIGTERM (rerun to resume).

    Progress and the summary go to ``console`` (standard error by default), so
    the JSON lines may go to standard output.
    """
    if console is None:
        probe = Console(stderr=True)
        console = Console(stderr=True, width=None if probe.is_terminal else 120)
    seen, lines = resume(job.out)
    tally = Tally(total=count_urls(job.urls))
    if lines and job.verbosity >= 0:
        console.print(
            f"resuming: {job.out} already holds {lines:,} lines ({len(seen):,} URLs)",
            highlight=False,
        )
    writer = LineWriter(job.out)
    fetch = _Fetch(job, throttle, writer, seen, tally)
    if job.chart is not None or job.timeline is not None:
        fetch.timeline = timeline_for(throttle, job.timeline)
    try:
        with _debug_log(throttle, console):
            asyncio.run(_fetch(job, throttle, console, fetch))
    finally:
        writer.close()
    status = _status(fetch)
    report(job, fetch, console, status)
    return status


def _status(fetch: _Fetch) -> int:
    if fetch.output_error is not None:
        return 3
    if fetch.signal is not None:
        return 128 + fetch.signal
    if fetch.stopping:
        return 130
    return 1 if fetch.tally.errors else 0


def report(job: FetchJob, fetch: _Fetch, console: Console, status: int) -> None:
    """The end of the run on standard error, the chart, and ``--summary-json``."""
    tally, throttle = fetch.tally, fetch.throttle
    interrupted = fetch.stopping and fetch.output_error is None
    if fetch.output_error is not None:
        out = job.out or "standard output"
        console.print(
            f"autothrottle fetch: error: cannot write to {out}: {fetch.output_error}",
            highlight=False,
            markup=False,
        )
    if job.verbosity >= 0:
        totals, *table = summary(tally, throttle, interrupted=interrupted).renderables
        # soft_wrap: the totals' one line stays one line in a log, wrapped by a terminal only.
        console.print(totals, soft_wrap=True)
        console.print(*table)
        if interrupted:
            console.print(
                "stopped early: run the same command again to fetch the rest", highlight=False
            )
    timeline = fetch.timeline
    if timeline is not None and job.chart is not None:
        keys = timeline.busiest(8)
        if keys:
            timeline.plot(
                Path(job.chart),
                title=f"autothrottle fetch: the {len(keys)} busiest hosts",
                keys=keys,
            )
            if job.verbosity >= 0:
                console.print(f"chart saved to {job.chart}", highlight=False, soft_wrap=True)
        elif job.verbosity >= 0:
            console.print(
                f"no chart at {job.chart}: no host was sampled, nothing to draw",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
    if job.timeline is not None and job.verbosity >= 0:
        console.print(f"timeline written to {job.timeline}", highlight=False)
    if job.summary_json is not None:
        robots = fetch.robots
        data = summary_data(tally, throttle, interrupted=interrupted, status=status)
        data["robots"] = {
            "read": job.robots,
            "requests": robots.requests if robots else 0,
            "floors": robots.floors if robots else {},
        }
        data["signal"] = signal.Signals(fetch.signal).name if fetch.signal else None
        Path(job.summary_json).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")

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
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console
from rich.live import Live

from autothrottle import Throttle
from autothrottle.timeline import Timeline

from ._fetch_clients import FAILURES, Reply, Sender, open_sender
from ._fetch_io import BodyStore, LineWriter, UrlSet, count_urls, read_urls, resume
from ._fetch_options import FetchJob
from ._fetch_progress import Tally, live_view, plain_line, summary

__all__ = ["RETRY_STATUSES", "run"]

#: Statuses worth another attempt: the host said "not now", not "no".
RETRY_STATUSES = frozenset({429, 503})

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


def _problem(url: str) -> str | None:
    """Why ``url`` cannot be fetched at all, or None."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        return f"InvalidURL: {exc}"
    if parts.scheme.lower() not in ("http", "https"):
        return f"InvalidURL: scheme must be http or https, got {parts.scheme!r}"
    if not parts.hostname:
        return "InvalidURL: no host"
    return None


def _error(exc: BaseException) -> str:
    text = str(exc)
    name = type(exc).__name__
    return (f"{name}: {text}" if text else name)[:300]


def _record(
    url: str, key: str, reply: Reply | None, error: str | None, attempts: int, seconds: float
) -> dict[str, Any]:
    return {
        "url": url,
        "final_url": reply.final_url if reply else None,
        "status": reply.status if reply else None,
        "bytes": reply.nbytes if reply else 0,
        "seconds": round(seconds, 4),
        "slot": key,
        "attempts": attempts,
        "error": error,
    }


# -- the fetch -------------------------------------------------------------------------------


class _Fetch:
    """One run: admits URLs, starts a task per URL, writes each finished line."""

    def __init__(
        self,
        job: FetchJob,
        throttle: Throttle,
        sender: Sender,
        writer: LineWriter,
        seen: UrlSet,
        tally: Tally,
    ) -> None:
        self.job = job
        self.throttle = throttle
        self.sender = sender
        self.writer = writer
        self.seen = seen
        self.tally = tally
        self.sched = _Scheduler(lambda k: throttle.config_for(k).max_concurrency, job.max_in_flight)
        self.tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        self.stop_now = asyncio.Event()
        self.input_done = False
        self._work = asyncio.Event()
        self._space = asyncio.Event()
        self._stopped = asyncio.Event()

    def stop(self) -> None:
        """First call: take no new URL, finish what is under way. Second: cancel it."""
        if self.stopping:
            self.stop_now.set()
        self.stopping = True
        self._stopped.set()
        self._work.set()
        self._space.set()

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
        problem = _problem(url)
        key = ""
        if problem is None:
            try:
                key = self.throttle.key_for(url)
            except (TypeError, ValueError) as exc:
                problem = _error(exc)
        if problem is not None:
            self.writer.write(_record(url, key, None, problem, 0, 0.0))
            self.tally.finished(None, None, 0, 0)
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
        started = time.perf_counter()
        try:
            record = await self._attempts(key, url, started)
        finally:
            self.sched.finish(key)
            self.tally.host(key).active -= 1
            self._work.set()
        if record is not None:
            self.writer.write(record)
            self.tally.finished(key, record["status"], record["bytes"], record["attempts"])

    async def _attempts(self, key: str, url: str, started: float) -> dict[str, Any] | None:
        """Up to ``retries + 1`` attempts; None if a stop came before the retry it needed."""
        for attempt in range(1, self.job.retries + 2):
            reply: Reply | None = None
            error: str | None = None
            try:
                reply = await self.sender.get(url)
            except FAILURES as exc:
                error = _error(exc)
            self.tally.attempt(key, reply.status if reply else None)
            if reply is not None and reply.status not in RETRY_STATUSES:
                break
            if attempt <= self.job.retries and self.stopping:
                return None  # not finished: a rerun fetches it
        record = _record(url, key, reply, error, attempt, time.perf_counter() - started)
        if self.job.bodies is not None:
            record["sha256"] = reply.sha256 if reply else None
        return record

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
def _signals(stop: Callable[[], None]) -> Iterator[None]:
    """SIGINT and SIGTERM call ``stop`` instead of killing the run (where the loop can)."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop)
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
    """True: the live table; False: plain lines; None: no progress at all."""
    if job.progress == "none":
        return None
    if job.progress == "auto":
        return console.is_terminal
    return job.progress == "live"


async def _fetch(
    job: FetchJob, throttle: Throttle, console: Console, seen: UrlSet, tally: Tally
) -> tuple[bool, Timeline | None]:
    """Fetch every URL not seen before; True if a signal stopped it, and the timeline."""
    loop = asyncio.get_running_loop()
    bodies = BodyStore(job.bodies) if job.bodies is not None else None
    timeline = None
    if job.chart is not None or job.timeline is not None:
        timeline = Timeline(throttle, interval=0.25, jsonl=job.timeline)
    writer = LineWriter(job.out)
    try:
        async with open_sender(
            job.client,
            throttle,
            io_timeout=job.timeout,
            connections=job.max_in_flight,
            user_agent=job.user_agent,
            bodies=bodies,
        ) as sender:
            fetch = _Fetch(job, throttle, sender, writer, seen, tally)
            with _signals(fetch.stop):
                reader = _start_reader(read_urls(job.urls), loop)
                producer = loop.create_task(fetch.produce(reader))
                live = _live(job, console)
                helpers = [producer]
                if live is not None:
                    helpers.append(loop.create_task(_progress(job, fetch, console, live)))
                if timeline is not None:
                    await timeline.start()
                try:
                    await fetch.dispatch()
                    await fetch.drain()
                finally:
                    await _end(helpers, timeline)
                if producer.done() and not producer.cancelled() and producer.exception():
                    raise producer.exception()  # type: ignore[misc]
    finally:
        writer.close()
    return fetch.stopping, timeline


async def _end(helpers: list[asyncio.Task[None]], timeline: Timeline | None) -> None:
    for task in helpers:
        if not task.done():
            task.cancel()
    await asyncio.gather(*helpers, return_exceptions=True)
    if timeline is not None:
        await timeline.stop()
        timeline.close()


def run(job: FetchJob, throttle: Throttle, *, console: Console | None = None) -> int:
    """Run the fetch; the exit status: 0 done, 130 stopped by a signal (rerun to resume).

    Progress and the summary go to ``console`` (standard error by default), so
    the JSON lines may go to standard output.
    """
    if console is None:
        probe = Console(stderr=True)
        console = Console(stderr=True, width=None if probe.is_terminal else 120)
    seen, lines = resume(job.out)
    tally = Tally(total=count_urls(job.urls))
    if lines:
        console.print(
            f"resuming: {job.out} already holds {lines:,} lines ({len(seen):,} URLs)",
            highlight=False,
        )
    interrupted, timeline = asyncio.run(_fetch(job, throttle, console, seen, tally))
    console.print(summary(tally, throttle, interrupted=interrupted))
    if interrupted:
        console.print(
            "stopped early: run the same command again to fetch the rest", highlight=False
        )
    if timeline is not None and job.chart is not None:
        keys = timeline.busiest(8)
        if keys:
            timeline.plot(
                Path(job.chart),
                title=f"autothrottle fetch: the {len(keys)} busiest hosts",
                keys=keys,
            )
            console.print(f"chart saved to {job.chart}", highlight=False)
    if job.timeline is not None:
        console.print(f"timeline written to {job.timeline}", highlight=False)
    return 130 if interrupted else 0

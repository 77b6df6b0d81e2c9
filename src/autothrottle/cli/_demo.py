"""``autothrottle demo``: watch the throttle find the pace of five simulated sites.

Everything runs on loopback: an :class:`autothrottle.sim.SimServer`, in a
process of its own, serves five hosts of different behaviours (127.0.0.2 …
127.0.0.6; ``_demo_sites``), and a few workers per host fetch pages from them
through ONE :class:`~autothrottle.Throttle`, some hosts with httpx and some
with aiohttp, until the time is up (``_demo_crawl``). The site's ground truth
(what arrived, the busiest second, its queue) is what the summary judges the
throttle by, not the throttle's own view (``_demo_judge``); ``_demo_view`` is
what the user sees. This module runs them in order and draws the chart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

from rich.console import Console

from autothrottle.sim import CDN
from autothrottle.timeline import Timeline

from ._demo_crawl import Crawl, Host, build_throttle, fetchers
from ._demo_judge import Outcome
from ._demo_sites import Sites, sites
from ._demo_view import busy_note, intro, new_console, progress, summary_table, verdicts

__all__ = ["run"]


async def _crawl(
    duration: float, live: bool, seed: int | None, console: Console, lateness: list[float]
) -> tuple[list[Outcome], Timeline, float]:
    """Serve the sites, crawl them until the time is up; the outcomes, timeline, seconds.

    ``lateness`` gets how late the event loop woke, again and again, over the crawl.
    """
    demo_sites = sites()
    throttle = build_throttle(demo_sites, seed=seed)
    timeline = Timeline(throttle, interval=0.1)
    async with Sites({s.address: s.behaviour for s in demo_sites}, seed) as server:
        hosts = [Host(s, server.base_url(s.address)) for s in demo_sites]
        console.print(intro(demo_sites, hosts, duration, console.width))
        crawl = Crawl(hosts, throttle, timeline)
        async with fetchers(throttle) as fetch:
            started = time.monotonic()
            await timeline.start()
            workers = crawl.start(fetch)
            shown = asyncio.create_task(progress(crawl, console, live, started, duration))
            ticking = asyncio.create_task(_tick(lateness))
            try:
                await _wait(duration)
            finally:
                elapsed = time.monotonic() - started
                crawl.stop.set()
                shown.cancel()
                ticking.cancel()
                await asyncio.gather(shown, ticking, return_exceptions=True)
                await crawl.finish(workers)
                await timeline.stop()
        truth = await server.stats()
    snapshot = throttle.snapshot()
    outcomes = [
        Outcome(h.site, h.tally, truth[h.site.address], snapshot[h.site.address].delay)
        for h in hosts
        if h.site.address in snapshot
    ]
    return outcomes, timeline, elapsed


async def _tick(lateness: list[float], every: float = 0.05) -> None:
    """How late the event loop wakes from a short sleep, until cancelled: on a busy
    machine the crawl's requests go out later than the throttle allows."""
    while True:
        asked = time.monotonic()
        await asyncio.sleep(every)
        lateness.append(max(0.0, time.monotonic() - asked - every))


def _p90(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.9)] if values else 0.0


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:  # no load average on this system
        return None


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
        console = new_console()
    live = live and console.is_terminal
    path = Path(out).expanduser().resolve()
    try:  # fail now rather than after the whole crawl
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"out: cannot write the chart to {str(path)!r}: {exc}") from None
    if path.is_dir():
        raise ValueError(f"out: {str(path)!r} is a directory; give a file name such as demo.png")
    lateness: list[float] = []
    outcomes, timeline, elapsed = asyncio.run(_crawl(duration, live, seed, console, lateness))
    console.print()
    console.print(summary_table(outcomes, elapsed, console.width))
    console.print(verdicts(outcomes))
    note = busy_note(_p90(lateness), _load(), os.cpu_count())
    if note is not None:
        console.print()
        console.print(note)
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
    console.print(f"chart saved to [bold]{path}[/]", highlight=False, soft_wrap=True)
    return 0

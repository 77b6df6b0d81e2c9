"""What the demo shows: the sites it will crawl, the crawl as it goes, the summary.

A terminal gets a live table (refreshed four times a second); a pipe or a log
gets a plain progress line now and then, without the spaces rich pads lines
with. After the crawl, a summary table of the sites' own counts (a narrow
terminal drops columns from the end) and one verdict per site.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import math
import os
import sys
import time
from typing import TextIO, cast

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from autothrottle import __version__
from autothrottle.sim import CDN, Behaviour

from ._demo_crawl import WORKERS, Crawl, Host, Tally
from ._demo_judge import VERDICT_WORDS, Outcome, ms
from ._demo_sites import Site

__all__ = [
    "BUSY_LATENESS",
    "busy_note",
    "new_console",
    "intro",
    "progress",
    "summary_table",
    "verdicts",
]


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


def _live_table(crawl: Crawl, elapsed: float, duration: float) -> Group:
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
            ms(snap.delay if snap else None),
            ms(snap.last_latency if snap else None),
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


def new_console() -> Console:
    """A terminal's own width; piped, the ``COLUMNS`` width (or 100) and no padding."""
    if Console().is_terminal:
        return Console()
    try:
        width = int(os.environ.get("COLUMNS", "100"))
    except ValueError:
        width = 100
    stream = cast(TextIO, _NoTrailingSpaces(sys.stdout))
    return Console(file=stream, width=max(width, 60))


def _progress_line(crawl: Crawl, elapsed: float) -> str:
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


def intro(demo_sites: list[Site], hosts: list[Host], duration: float, width: int) -> Group:
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
        f"start_delay 0.5 s, at most {WORKERS} requests in flight per host). "
        "Nothing leaves this machine.",
    )
    hint = Text(
        "Each host starts at a 0.5 s delay; watch it settle at the pace the site allows.",
        style="dim",
    )
    return Group(head, table, hint)


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
        ms(o.delay),
        str(s.requests),
        str(s.max_in_window),
    ]


def summary_table(outcomes: list[Outcome], elapsed: float, width: int = 200) -> Table:
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


def verdicts(outcomes: list[Outcome]) -> Table:
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


BUSY_LATENESS = 0.010
"""How late (seconds, at the 90th percentile) the crawler's event loop may wake
before the demo says the machine was busy. A quiet 2-core machine wakes it
within a millisecond or two; at 10 ms and more the workers send later than
the throttle allows, and the sites see a slower crawl than the throttle's."""


def busy_note(lateness_p90: float, load: float | None, cores: int | None) -> Text | None:
    """A warning under the verdicts when the machine, not the throttle, set the pace.

    ``lateness_p90``: how late the crawler's event loop woke, at the 90th
    percentile; ``load``: the 1-minute load average at the end (None where the
    system has none); ``cores``: the machine's. None when the loop kept time.
    """
    if not lateness_p90 >= BUSY_LATENESS:
        return None
    where = f"load {load:.1f} on {cores} cores; " if load is not None and cores else ""
    return Text(
        f"This machine was busy while the demo ran ({where}the crawler's event loop woke "
        f"{lateness_p90 * 1000:.0f} ms late at the 90th percentile): its requests went out "
        "later than the throttle allowed, so a verdict of too cautious is the machine's as "
        "much as the throttle's. Run it again when the machine is quieter.",
        style="yellow",
    )


async def progress(
    crawl: Crawl, console: Console, live: bool, started: float, duration: float
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

"""``autothrottle fetch``'s views: the tally, the live table, plain progress lines, the summary.

The tally is the fetch's own count (what it wrote, per host); the delay, the
requests in flight and those waiting for their turn come from the throttle's
slots, read only for the rows shown. Ranking the busiest hosts looks at every
host once per refresh, so a refresh costs O(hosts), not O(URLs).
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from autothrottle import Throttle

__all__ = ["HostTally", "Tally", "live_view", "plain_line", "summary"]


@dataclass(slots=True)
class HostTally:
    """One host (slot) as the fetch saw it."""

    done: int = 0
    ok: int = 0
    limited: int = 0
    blocked: int = 0
    errors: int = 0
    retries: int = 0
    nbytes: int = 0
    active: int = 0
    # When its first URL was started (the row is made then) and its last line written:
    # the summary's rate runs over that span, not from its first line, which a host
    # whose lines all end together (an unreachable robots.txt) would make no time.
    begun: float = 0.0
    last: float = 0.0
    # Two marks (done, time), the older one 5 to 10 s back: the rate's window.
    mark: tuple[int, float] = (0, 0.0)
    newer: tuple[int, float] = (0, 0.0)

    def rate(self, now: float) -> float:
        """Lines per second over the last 5 to 10 seconds (since the older mark)."""
        if now - self.newer[1] >= 5.0:
            self.mark, self.newer = self.newer, (self.done, now)
        done, then = self.mark
        return (self.done - done) / (now - then) if now > then else 0.0


@dataclass
class Tally:
    """The whole fetch: totals, per-host rows, and a recent rate for the ETA."""

    total: int | None = None
    skipped: int = 0
    done: int = 0
    ok: int = 0
    errors: int = 0
    retries: int = 0
    limited: int = 0
    blocked: int = 0
    excluded: int = 0
    nbytes: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    hosts: dict[str, HostTally] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    clock: Callable[[], float] = time.monotonic
    _recent: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))

    def host(self, key: str) -> HostTally:
        row = self.hosts.get(key)
        if row is None:
            now = self.clock()
            row = self.hosts[key] = HostTally(begun=now, mark=(0, now), newer=(0, now))
        return row

    def attempt(self, key: str, status: int | None) -> None:
        """One attempt's outcome (before retries are decided)."""
        if status == 429:
            self.limited += 1
            self.host(key).limited += 1

    def block(self, key: str) -> None:
        """One attempt's answer was a block (a CAPTCHA page, a status said to be one)."""
        self.blocked += 1
        self.host(key).blocked += 1

    def finished(self, key: str | None, line: Mapping[str, Any]) -> None:
        """One URL's line written (``key`` None: a URL with no host, never sent)."""
        self.done += 1
        error = line["error"] is not None
        self.errors += error
        if key is None:
            return
        if line.get("excluded") is not None:
            self.excluded += 1
            return
        status, nbytes, retries = line["status"], line["bytes"], max(0, line["attempts"] - 1)
        row = self.host(key)
        now = self.clock()
        row.done += 1
        row.last = now
        row.nbytes += nbytes
        row.retries += retries
        row.errors += error
        self.nbytes += nbytes
        self.retries += retries
        if status is not None:
            self.statuses[status] = self.statuses.get(status, 0) + 1
            if 200 <= status < 300 and not error:
                row.ok += 1
                self.ok += 1

    # -- derived figures -------------------------------------------------------------

    def elapsed(self) -> float:
        return self.clock() - self.started

    def rate(self) -> float:
        """Lines per second over about the last 10 seconds (the whole run at first)."""
        now = self.clock()
        recent = self._recent
        recent.append((now, self.done))
        while len(recent) > 2 and now - recent[1][0] >= 10.0:
            recent.popleft()
        t0, d0 = recent[0] if len(recent) > 1 else (self.started, 0)
        return (self.done - d0) / (now - t0) if now > t0 else 0.0

    def remaining(self) -> int | None:
        if self.total is None:
            return None
        return max(0, self.total - self.skipped - self.done)

    def busiest(self, n: int) -> list[tuple[str, HostTally]]:
        """The ``n`` hosts with the most requests under way, then the most done."""
        return heapq.nlargest(n, self.hosts.items(), key=lambda kv: (kv[1].active, kv[1].done))


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.1f} ms" if seconds < 0.01 else f"{seconds * 1000:.0f} ms"


def _eta(tally: Tally, rate: float) -> str:
    remaining = tally.remaining()
    if remaining is None:
        return "ETA unknown (stdin)"
    if remaining == 0:
        return "ETA 0 s"
    if rate <= 0:
        return "ETA -"
    seconds = remaining / rate
    if seconds >= 3600:
        return f"ETA {seconds / 3600:.1f} h"
    return f"ETA {seconds / 60:.1f} min" if seconds >= 120 else f"ETA {seconds:.0f} s"


def _head(tally: Tally, in_flight: int) -> str:
    rate = tally.rate()
    total = tally.total
    if total is not None:
        done = tally.done + tally.skipped
        share = f" ({100.0 * done / total:.1f} %)" if total else ""
        count = f"{done:,} of {total:,}{share}"
    else:
        count = f"{tally.done + tally.skipped:,}"
    skipped = f" ({tally.skipped:,} from before)" if tally.skipped else ""
    return (
        f"{count} done{skipped} · {rate:,.1f}/s · {_eta(tally, rate)} · "
        f"{in_flight} under way · {tally.retries} retries · {tally.limited} 429s · "
        f"{_blocks(tally)}{tally.errors} errors"
    )


def _blocks(tally: Tally) -> str:
    return f"{tally.blocked} blocked · " if tally.blocked else ""


def plain_line(tally: Tally, throttle: Throttle, in_flight: int, hosts: int = 3) -> str:
    """One line for a log: elapsed, totals, ETA, and the busiest hosts' pace."""
    now = tally.clock()
    parts = []
    for key, row in tally.busiest(hosts):
        slot = throttle.slot(key)
        parts.append(
            f"{key} {row.rate(now):.1f}/s delay {_ms(slot.delay)} "
            f"in flight {slot.in_flight}" + (f" 429s {row.limited}" if row.limited else "")
        )
    busiest = f" | busiest: {'; '.join(parts)}" if parts else ""
    return f"[{tally.elapsed():6.1f} s] {_head(tally, in_flight)}{busiest}"


def live_view(tally: Tally, throttle: Throttle, in_flight: int, rows: int = 10) -> Group:
    """The live table: a head line, then one row per busiest host."""
    table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)
    table.add_column("host", no_wrap=True, style="bold")
    for name in ("done", "rate", "delay", "in flight", "waiting", "429s", "errors"):
        table.add_column(name, justify="right", no_wrap=True)
    now = tally.clock()
    for key, row in tally.busiest(rows):
        slot = throttle.slot(key)
        table.add_row(
            key,
            f"{row.done:,}",
            f"{row.rate(now):.1f}/s",
            _ms(slot.delay),
            str(slot.in_flight),
            str(slot.queued),
            Text(str(row.limited), style="bold red" if row.limited else ""),
            Text(str(row.errors), style="red" if row.errors else ""),
        )
    head = Text(f"fetching · {tally.elapsed():.0f} s · {_head(tally, in_flight)}", style="bold")
    more = len(tally.hosts) - min(rows, len(tally.hosts))
    parts: list[Text | Table] = [head, table]
    if more > 0:
        parts.append(Text(f"… and {more:,} more hosts", style="dim"))
    return Group(*parts)


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else many or one + 's'}"


def _hosts_title(shown: int, hosts: int) -> str:
    if shown == hosts:
        return "per host"
    which = "the host" if shown == 1 else f"the {shown:,} hosts"
    return f"{which} with the most URLs, of {hosts:,}"


def summary(tally: Tally, throttle: Throttle, *, interrupted: bool, rows: int = 10) -> Group:
    """The end of the run: totals by status, then the hosts with the most lines."""
    elapsed = max(tally.elapsed(), 1e-9)
    statuses = ", ".join(f"{code}: {n:,}" for code, n in sorted(tally.statuses.items()))
    head = Text.assemble(
        ("interrupted" if interrupted else "done", "bold yellow" if interrupted else "bold green"),
        f": {tally.done:,} URLs in {elapsed:.1f} s ({tally.done / elapsed:,.1f}/s), "
        f"{tally.skipped:,} skipped (done before or repeated), {tally.nbytes:,} bytes; "
        f"statuses {statuses or '-'}; {_count(tally.errors, 'error')}; "
        f"{_count(tally.retries, 'retry', 'retries')}; "
        f"{tally.limited:,} 429s; {tally.blocked:,} blocked; "
        f"{tally.excluded:,} excluded by robots.txt",
    )
    if not tally.hosts:
        return Group(head)  # no host met: an empty table says nothing more
    table = Table(
        title=_hosts_title(min(rows, len(tally.hosts)), len(tally.hosts)),
        box=box.SIMPLE_HEAD,
        header_style="bold",
        pad_edge=False,
    )
    table.add_column("host", no_wrap=True, style="bold")
    for name in ("URLs", "ok", "rate", "429s", "blocked", "retries", "errors", "final delay"):
        table.add_column(name, justify="right", no_wrap=True)
    for key, row in heapq.nlargest(rows, tally.hosts.items(), key=lambda kv: kv[1].done):
        span = row.last - row.begun
        rate = f"{row.done / span:.1f}/s" if span > 0 and row.done else "-"
        table.add_row(
            key,
            f"{row.done:,}",
            f"{row.ok:,}",
            rate,
            str(row.limited),
            str(row.blocked),
            str(row.retries),
            str(row.errors),
            _ms(throttle.slot(key).delay),
        )
    return Group(head, table)


def summary_data(
    tally: Tally, throttle: Throttle, *, interrupted: bool, status: int, rows: int = 10
) -> dict[str, Any]:
    """The summary as JSON-ready data (``--summary-json``): totals, then the busiest hosts."""
    elapsed = max(tally.elapsed(), 1e-9)
    hosts = []
    busiest = heapq.nlargest(rows, tally.hosts.items(), key=lambda kv: kv[1].done)
    reasons = {row.key: dict(row.backoff_reasons) for row in throttle.stats().slots}
    for key, row in busiest:
        slot = throttle.slot(key).snapshot()
        hosts.append(
            {
                "host": key,
                "urls": row.done,
                "ok": row.ok,
                "limited": row.limited,
                "blocked": row.blocked,
                "retries": row.retries,
                "errors": row.errors,
                "bytes": row.nbytes,
                "delay": slot.delay,
                "backoffs": slot.backoffs,
                "backoff_reasons": reasons.get(key, {}),
            }
        )
    return {
        "exit_status": status,
        "interrupted": interrupted,
        "seconds": round(elapsed, 3),
        "urls": tally.done,
        "skipped": tally.skipped,
        "ok": tally.ok,
        "errors": tally.errors,
        "excluded": tally.excluded,
        "retries": tally.retries,
        "limited": tally.limited,
        "blocked": tally.blocked,
        "bytes": tally.nbytes,
        "statuses": {str(code): n for code, n in sorted(tally.statuses.items())},
        "hosts": len(tally.hosts),
        "busiest_hosts": hosts,
    }

"""A recorder of how a throttle's slots evolve over time, and a chart of it.

:class:`Timeline` samples :meth:`Throttle.snapshot` at a fixed interval and
keeps, per slot, the delay, the last latency, the requests in flight and
queued, and what happened since the previous sample (responses by status,
cache hits, backoffs, pauses, failures). That is what you need to see a slot
*find its pace*: the delay settling, the 429s thinning out. :meth:`Timeline.plot`
draws it as a PNG with matplotlib (an optional dependency, imported only there).
With ``jsonl=PATH`` it also streams every sample and mark to a JSON-lines file
as it takes them (bounded by ``jsonl_max_bytes``); :meth:`Timeline.read_jsonl`
loads such a file back, for a chart drawn later (``autothrottle plot``).

    async with Timeline(throttle, interval=0.1, jsonl="crawl.jsonl") as timeline:
        await crawl()
    timeline.plot("crawl.png")
    Timeline.read_jsonl("crawl.jsonl").plot("same-chart.png")
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Protocol

from autothrottle._validate import check_int, check_positive

from ._samples import Mark, SlotSample

if TYPE_CHECKING:
    from autothrottle import SlotSnapshot

__all__ = ["Timeline"]

#: The first line of a timeline file names the format and its version.
_FORMAT = "autothrottle-timeline"
_VERSION = 1


class _Snapshots(Protocol):
    """Anything with ``snapshot()`` like :class:`~autothrottle.Throttle`'s."""

    def snapshot(self) -> Mapping[str, SlotSnapshot]: ...


class Timeline:
    """Samples a throttle's slots periodically, for a chart or your own analysis.

    Start it with ``async with Timeline(throttle) as timeline:`` (or
    :meth:`start` and :meth:`stop`); it then samples every ``interval``
    seconds in a task of the running event loop. :meth:`sample` takes one
    sample at once, without the task. Counters are turned into per-sample
    deltas, so each :class:`SlotSample` says what happened *since the one
    before*; a slot that appears between two samples (or whose counters went
    back, because the store evicted and re-created it) counts from zero.

    Each sample costs one :meth:`Throttle.snapshot` of every slot: it is meant
    for watching tens of hosts, not a crawl of a hundred thousand.

    Args:
        throttle: The :class:`~autothrottle.Throttle` to watch (anything with a
            ``snapshot()`` method returning ``{key: SlotSnapshot}``).
        interval: Seconds between samples (> 0).
        max_samples: Samples kept per slot; older ones are dropped, so a
            timeline left running forever holds bounded memory.
        clock: Monotonic clock in seconds; inject one to test.
        jsonl: Also write every sample and mark, as taken, to this file (one
            JSON object a line, the file replaced; see ``docs/observability.md``).
            Closed by :meth:`close` or on leaving ``async with``.
        jsonl_max_bytes: Stop writing the file past this size, with a last
            ``{"truncated": true}`` line, so a run left going fills no disk.

    Raises:
        TypeError, ValueError: a bad argument, named in the message.
        OSError: ``jsonl`` cannot be written.
    """

    def __init__(
        self,
        throttle: _Snapshots,
        interval: float = 0.1,
        *,
        max_samples: int = 36_000,
        clock: Callable[[], float] = time.monotonic,
        jsonl: str | os.PathLike[str] | None = None,
        jsonl_max_bytes: int = 512 * 1024 * 1024,
    ) -> None:
        if not callable(getattr(throttle, "snapshot", None)):
            raise TypeError(f"throttle must have a snapshot() method, got {throttle!r}")
        if not callable(clock):
            raise TypeError(f"clock must be a callable returning seconds, got {clock!r}")
        self._throttle = throttle
        self.interval = check_positive("interval", interval)
        self.max_samples = check_int("max_samples", max_samples, minimum=1)
        self._clock = clock
        self._t0 = clock()
        self._series: dict[str, deque[SlotSample]] = {}
        self._last: dict[str, SlotSnapshot] = {}
        self._marks: deque[Mark] = deque(maxlen=self.max_samples)
        self._task: asyncio.Task[None] | None = None
        self._out: _JsonlOut | None = None
        if jsonl is not None:
            limit = check_int("jsonl_max_bytes", jsonl_max_bytes, minimum=1024)
            self._out = _JsonlOut(Path(jsonl), limit)
            self._out.write([_header(self)])

    def __repr__(self) -> str:
        running = "running" if self.running else "stopped"
        return f"<Timeline {running} interval={self.interval}s slots={len(self._series)}>"

    # -- recording -----------------------------------------------------------------

    def now(self) -> float:
        """Seconds since the timeline was created (or last :meth:`clear`-ed)."""
        return self._clock() - self._t0

    def sample(self) -> None:
        """Take one sample of every slot now."""
        t = self.now()
        taken = []
        # Only the slots sampled now are kept as the last ones: a slot the throttle
        # forgot (and one made again under its key) counts from zero when it comes back.
        last, self._last = self._last, {}
        for key, snap in self._throttle.snapshot().items():
            before = last.get(key)
            self._last[key] = snap
            sample = _delta(t, snap, before)
            self._add(key, sample)
            taken.append((key, sample))
        if self._out is not None and taken:
            self._out.write([_sample_line(key, sample) for key, sample in taken])

    def _add(self, key: str, sample: SlotSample) -> None:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = deque(maxlen=self.max_samples)
        series.append(sample)

    def _replay(self, line: dict[str, Any]) -> None:
        """One line of a timeline file (a sample, a mark or a clear) applied as
        recorded: the file's times are kept, not the clock's."""
        if "mark" in line:
            self._marks.append(Mark(float(line["t"]), str(line["key"]), str(line["mark"])))
        elif line.get("clear"):
            self._series.clear()
            self._marks.clear()
        elif "key" in line:
            self._add(str(line["key"]), _sample_from(line))

    def mark(self, key: str, kind: str) -> None:
        """Record an event of slot ``key`` that the throttle cannot see, at this moment."""
        if not isinstance(key, str) or not key:
            raise TypeError(f"key must be a non-empty str, got {key!r}")
        if not isinstance(kind, str) or not kind:
            raise TypeError(f"kind must be a non-empty str, got {kind!r}")
        mark = Mark(self.now(), key, kind)
        self._marks.append(mark)
        if self._out is not None:
            self._out.write([_mark_line(mark)])

    def clear(self) -> None:
        """Forget every sample and mark; times restart from zero."""
        self._series.clear()
        self._last.clear()
        self._marks.clear()
        self._t0 = self._clock()
        if self._out is not None:
            self._out.write([{"clear": True}])

    async def start(self) -> None:
        """Start sampling every ``interval`` seconds in a task of the running loop."""
        if self._task is not None:
            raise RuntimeError("Timeline already started")
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop sampling, after one last sample. Idempotent."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self.sample()

    @property
    def running(self) -> bool:
        """True while the sampling task runs."""
        return self._task is not None

    async def _run(self) -> None:
        while True:  # ends by cancellation, from stop()
            self.sample()
            await asyncio.sleep(self.interval)

    async def __aenter__(self) -> Timeline:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
        self.close()

    def close(self) -> None:
        """Close the ``jsonl`` file, if any; later samples are kept in memory only."""
        out, self._out = self._out, None
        if out is not None:
            out.close()

    # -- files ---------------------------------------------------------------------

    def write_jsonl(self, path: str | os.PathLike[str]) -> Path:
        """Write every sample and mark held now to ``path`` (replaced); returns the path.

        The same format as ``jsonl=``: :meth:`read_jsonl` reads either.
        """
        lines: list[dict[str, Any]] = [_header(self)]
        for key, series in self._series.items():
            lines.extend(_sample_line(key, sample) for sample in series)
        lines.extend(_mark_line(mark) for mark in self._marks)
        target = Path(path)
        with target.open("w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
        return target

    @classmethod
    def read_jsonl(
        cls, path: str | os.PathLike[str], *, max_samples: int | None = None
    ) -> Timeline:
        """A stopped timeline holding what a timeline file recorded, ready to :meth:`plot`.

        Memory stays bounded whatever the file's size: each slot keeps its last
        ``max_samples`` samples (default: the recording timeline's). A last
        line cut short (the recorder was killed mid-write) is ignored.

        Raises:
            ValueError: the file is not a timeline file, or a line in it is
                broken; the message names the file and the line.
        """
        source = Path(path)
        with source.open("r", encoding="utf-8") as fh:
            head = _read_head(fh, source)
            keep = head.get("max_samples", 36_000) if max_samples is None else max_samples
            timeline = cls(_NoSnapshots(), float(head.get("interval", 0.1)), max_samples=keep)
            for number, raw in enumerate(fh, start=2):
                if not raw.endswith("\n"):
                    break  # cut short by a recorder killed mid-write
                try:
                    timeline._replay(json.loads(raw))
                except (ValueError, TypeError, KeyError, AttributeError) as exc:
                    raise ValueError(f"{str(source)!r} line {number}: {exc!r}") from None
        return timeline

    # -- reading -------------------------------------------------------------------

    @property
    def keys(self) -> tuple[str, ...]:
        """The slots seen so far, in order of first appearance."""
        return tuple(self._series)

    def samples(self, key: str) -> list[SlotSample]:
        """The samples of slot ``key``, oldest first (empty if never seen)."""
        return list(self._series.get(key, ()))

    def marks(self, key: str | None = None) -> list[Mark]:
        """The caller's marks, oldest first; only those of ``key`` if given."""
        return [m for m in self._marks if key is None or m.key == key]

    def rate(self, key: str, window: float = 1.0) -> float:
        """Responses per second of slot ``key`` over about the last ``window`` seconds.

        Measured between the oldest and the newest sample in the window, so it
        is 0.0 until two samples exist.
        """
        window = check_positive("window", window)
        series = self._series.get(key)
        if not series:
            return 0.0
        end = series[-1].time
        inside: list[SlotSample] = []
        for s in reversed(series):  # bounded by max_samples
            if end - s.time > window:
                break
            inside.append(s)
        span = end - inside[-1].time
        if span <= 0:
            return 0.0
        # The oldest sample's responses came before the span began.
        return sum(s.responses for s in inside[:-1]) / span

    # -- the chart -----------------------------------------------------------------

    def plot(
        self,
        path: str | os.PathLike[str],
        *,
        title: str | None = None,
        labels: Mapping[str, str] | None = None,
        capacities: Mapping[str, float] | None = None,
        keys: Iterable[str] | None = None,
        origin_capacities: Mapping[str, float] | None = None,
    ) -> Path:
        """Draw the timeline as a PNG: one row per slot, returns the path written.

        Each row has three panels: the delay, the gap actually kept between
        responses (what set the pace when the delay did not: header spacing, a
        pause, the cap) and the latency's rolling median (seconds, log scale),
        with the status events as markers along the top (429/503 and other
        errors, backoffs, pauses, failures, your marks); the responses per
        second, with cache hits shaded and the slot's capacity if given; the
        requests in flight and queued, each a 1 s mean.

        Args:
            path: Where to write the PNG.
            title: A title for the whole figure.
            labels: A row heading per slot key (default: the key).
            capacities: Per slot key, a known capacity in responses/s, drawn as
                a dashed line to compare the rate against.
            keys: The slots to draw, in order (default: every slot seen).
            origin_capacities: Per slot key behind a cache, what its origin
                serves in responses/s: the misses (responses a cache did not
                answer) are drawn against it, since they are the origin's load.

        Raises:
            ImportError: matplotlib is not installed.
            ValueError: nothing to draw (no samples yet, or none of ``keys``).
        """
        from ._chart import draw

        rows = self.keys if keys is None else tuple(keys)
        if keys is not None and rows and not any(self._series.get(key) for key in rows):
            seen = list(self.keys)
            raise ValueError(f"keys={list(rows)!r}: no samples of these slots; there are {seen!r}")
        return draw(
            Path(path),
            {key: self.samples(key) for key in rows},
            {key: self.marks(key) for key in rows},
            interval=self.interval,
            title=title,
            labels=labels or {},
            capacities=capacities or {},
            origins=origin_capacities or {},
        )

    def busiest(self, n: int) -> list[str]:
        """The ``n`` slots with the most responses recorded, busiest first (for a chart)."""
        n = check_int("n", n, minimum=1)
        totals = {key: sum(s.responses for s in series) for key, series in self._series.items()}
        return sorted(totals, key=lambda key: -totals[key])[:n]


def _delta(t: float, snap: SlotSnapshot, before: SlotSnapshot | None) -> SlotSample:
    if before is not None and (snap.sent < before.sent or snap.responses < before.responses):
        before = None  # a new slot under an old key: its counters started again
    if before is None:
        statuses = {code: n for code, n in snap.status_counts.items() if n > 0}
        responses, cache_hits = snap.responses, snap.cache_hits
        backoffs = snap.backoffs + snap.ignored_backoffs
        pauses, failures = snap.pauses, snap.failures
    else:
        old = before.status_counts
        statuses = {}
        for code, n in snap.status_counts.items():
            d = n - old.get(code, 0)
            if d > 0:
                statuses[code] = d
        responses = max(0, snap.responses - before.responses)
        cache_hits = max(0, snap.cache_hits - before.cache_hits)
        backoffs = max(
            0,
            snap.backoffs + snap.ignored_backoffs - before.backoffs - before.ignored_backoffs,
        )
        pauses = max(0, snap.pauses - before.pauses)
        failures = max(0, snap.failures - before.failures)
    return SlotSample(
        time=t,
        delay=snap.delay,
        latency=snap.last_latency,
        in_flight=snap.in_flight,
        queued=snap.queued,
        responses=responses,
        statuses=statuses,
        cache_hits=cache_hits,
        backoffs=backoffs,
        pauses=pauses,
        failures=failures,
        backoff_reason=snap.last_backoff_reason if backoffs else None,
    )


# -- the file ------------------------------------------------------------------------

_COUNTS = ("responses", "cache_hits", "backoffs", "pauses", "failures")


class _JsonlOut:
    """The ``jsonl=`` stream: whole lines, flushed per sample, stopping at a byte cap."""

    def __init__(self, path: Path, limit: int) -> None:
        self._fh: IO[str] | None = path.open("w", encoding="utf-8")
        self._limit = limit
        self._size = 0

    def write(self, lines: list[dict[str, Any]]) -> None:
        fh = self._fh
        if fh is None:
            return
        text = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
        if self._size + len(text) > self._limit:
            fh.write('{"truncated":true}\n')
            self.close()
            return
        fh.write(text)
        fh.flush()
        self._size += len(text)

    def close(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            fh.close()


class _NoSnapshots:
    """The throttle of a timeline read from a file: there is nothing left to sample."""

    def snapshot(self) -> Mapping[str, SlotSnapshot]:
        return {}


def _header(timeline: Timeline) -> dict[str, Any]:
    return {
        "format": _FORMAT,
        "version": _VERSION,
        "interval": timeline.interval,
        "max_samples": timeline.max_samples,
    }


def _sample_line(key: str, s: SlotSample) -> dict[str, Any]:
    """A sample as a JSON object: zero counters and empty fields left out."""
    line: dict[str, Any] = {"t": round(s.time, 4), "key": key, "delay": s.delay}
    if s.latency is not None:
        line["latency"] = s.latency
    line["in_flight"] = s.in_flight
    line["queued"] = s.queued
    for name in _COUNTS:
        value = getattr(s, name)
        if value:
            line[name] = value
    if s.statuses:
        line["statuses"] = {str(code): n for code, n in s.statuses.items()}
    if s.backoff_reason is not None:
        line["backoff_reason"] = s.backoff_reason
    return line


def _mark_line(mark: Mark) -> dict[str, Any]:
    return {"t": round(mark.time, 4), "key": mark.key, "mark": mark.kind}


def _sample_from(line: dict[str, Any]) -> SlotSample:
    latency = line.get("latency")
    return SlotSample(
        time=float(line["t"]),
        delay=float(line["delay"]),
        latency=None if latency is None else float(latency),
        in_flight=int(line["in_flight"]),
        queued=int(line["queued"]),
        statuses={int(code): int(n) for code, n in line.get("statuses", {}).items()},
        backoff_reason=line.get("backoff_reason"),
        **{name: int(line.get(name, 0)) for name in _COUNTS},
    )


def _read_head(fh: IO[str], path: Path) -> dict[str, Any]:
    try:
        head = json.loads(fh.readline())
    except ValueError:
        head = None
    if not isinstance(head, dict) or head.get("format") != _FORMAT:
        raise ValueError(f"{str(path)!r} is not an autothrottle timeline file (line 1)")
    return head

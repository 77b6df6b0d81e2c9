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
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Protocol, cast

from autothrottle._validate import check_int, check_number, check_positive

from ._samples import Mark, Series, SlotSample, is_quiet

if TYPE_CHECKING:
    from autothrottle import SlotSnapshot

__all__ = ["Timeline"]

#: The first line of a timeline file names the format and its version (2: a sample
#: line may stand for a run of repeats, ``"repeat": n``; version 1 files read the same).
_FORMAT = "autothrottle-timeline"
_VERSION = 2

_MAX_SAMPLES = 36_000
_MAX_SLOTS = 100

#: Distinct ``statuses`` mappings a timeline shares between its samples before it
#: starts afresh: most samples of a busy slot repeat a few ({200: 1}, {200: 2}...).
_SHARED_STATUSES = 1024


class _Snapshots(Protocol):
    """Anything with ``snapshot()`` like :class:`~autothrottle.Throttle`'s."""

    def snapshot(self) -> Mapping[str, SlotSnapshot]: ...


class Timeline:
    """Samples a throttle's slots periodically, for a chart or your own analysis.

    Start it with ``async with Timeline(throttle) as timeline:`` (or
    :meth:`start` and :meth:`stop`); it then samples every ``interval``
    seconds in a task of the running event loop, reading the throttle with
    ``snapshot_async()`` when it has one (:class:`~autothrottle.Throttle`
    does: 1,000 slots at a time, the loop free in between). :meth:`sample`
    takes one sample at once, without the task. Counters are turned into per-sample
    deltas, so each :class:`SlotSample` says what happened *since the one
    before*; a slot that appears between two samples (or whose counters went
    back, because the store evicted and re-created it) counts from zero.

    Memory is bounded, whatever the run's length and the hosts it meets:

    * An idle slot costs next to nothing: while its snapshot does not change
      after a quiet sample (nothing happened, same delay, latency, requests in
      flight and queued), its repeats are held as one run, a count and the
      time of the last, and :meth:`samples` gives them back, their times
      spread evenly over the run. The ``jsonl`` file writes such a run as one
      line when it ends.
    * At most ``max_samples`` samples per slot (repeats counted), older ones
      dropped. At most ``max_slots`` slots: a slot met when that many are kept
      takes the place of the one idle longest (nothing in flight or waiting at
      its last sample, or gone from the throttle); while every slot kept is at
      work, it is not kept, until a change of it finds room. A slot forgotten
      starts a new series at its next change.

    A slot at work costs about 190 bytes a sample (equal ``statuses`` shared).
    Over a crawl of 1,000 hosts, about 50 at work at once, 10 minutes at 0.1 s
    hold 54 MiB with every host kept, 3.4 MiB with the default ``max_slots``
    (1.2 GiB when every sample was held: ``benchmarks/timeline_memory.py``).
    Each sample still reads every slot: the throttle's snapshot, then about 90
    bytecodes a slot that did not change and 360 one that did (2.7 µs of CPU a
    slot, most of them idle: ``docs/observability.md``). ``interval_per_slot``
    keeps that a small share of a core over many slots: the task then waits
    that long a slot the last sample read, if it is longer than ``interval``.

    Args:
        throttle: The :class:`~autothrottle.Throttle` to watch (anything with a
            ``snapshot()`` method returning ``{key: SlotSnapshot}``).
        interval: Seconds between samples (> 0).
        interval_per_slot: Seconds the sampling task waits between two samples,
            a slot the last one read, when that is longer than ``interval``
            (>= 0; 0: ``interval`` whatever the slots). ``autothrottle fetch``
            uses 0.0001: 10,000 slots are sampled every second.
        max_samples: Samples kept per slot; older ones are dropped.
        max_slots: Slots whose samples are kept; past it, the series of the
            slot idle longest is forgotten.
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
        interval_per_slot: float = 0.0,
        max_samples: int = _MAX_SAMPLES,
        max_slots: int = _MAX_SLOTS,
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
        self.interval_per_slot = check_number("interval_per_slot", interval_per_slot)
        self.max_samples = check_int("max_samples", max_samples, minimum=1)
        self.max_slots = check_int("max_slots", max_slots, minimum=1)
        self._clock = clock
        self._t0 = clock()
        self._series: dict[str, Series] = {}
        # The slots kept whose last sample had nothing in flight or waiting, the one
        # that changed longest ago first: the next forgotten when a slot needs room.
        self._idle: OrderedDict[str, None] = OrderedDict()
        # Per slot sampled last time: its snapshot then, and whether that sample was quiet.
        self._last: dict[str, tuple[SlotSnapshot, bool]] = {}
        self._statuses: dict[tuple[tuple[int, int], ...], Mapping[int, int]] = {}
        self._marks: deque[Mark] = deque(maxlen=self.max_samples)
        self._task: asyncio.Task[None] | None = None
        self._out: _JsonlOut | None = None
        # Per idle slot, the repeats not yet in the file: how many, the last's time, its state.
        self._unwritten: dict[str, _Unwritten] = {}
        # Replaying a version 1 file, which has a line for every repeat.
        self._merge = False
        # Samples taken (a subclass's notes may count their age in them).
        self._takes = 0
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
        self._take(self.now(), self._throttle.snapshot())

    async def _sample_async(self) -> int:
        """:meth:`sample`, reading the throttle with its ``snapshot_async()`` if it
        has one: a few thousand slots read at once would hold the event loop (and
        every request due in it) for tens of milliseconds at each sample. Returns
        the slots read."""
        read = getattr(self._throttle, "snapshot_async", None)
        if read is None:
            t = self.now()
            snapshots = self._throttle.snapshot()
        else:
            reader = cast("Callable[[], Awaitable[Mapping[str, SlotSnapshot]]]", read)
            snapshots = await reader()
            t = self.now()  # timed as taken: in order with sample()
        self._take(t, snapshots)
        return len(snapshots)

    def _take(self, t: float, snapshots: Mapping[str, SlotSnapshot]) -> None:
        self._takes += 1
        as_kept = self._as_kept
        lines: list[dict[str, Any]] | None = [] if self._out is not None else None
        # Only the slots sampled now are kept as the last ones: a slot the throttle
        # forgot (and one made again under its key) counts from zero when it comes back.
        last, self._last = self._last, {}
        for key, snap in snapshots.items():
            before = last.get(key)
            if before is not None and before[1] and _unchanged(snap, before[0]):
                # A repeat of a quiet sample: the run it is in grows.
                self._last[key] = before
                series = self._series.get(key)
                if series is None or series.repeat_tail(t, self.max_samples):
                    if lines is not None:
                        self._unwritten_repeat(key, t, snap)
                    continue
            sample = _delta(t, snap, None if before is None else before[0], self._statuses)
            self._last[key] = (snap, is_quiet(sample))
            self._record(key, as_kept(key, sample))
            if lines is not None:
                if key in self._unwritten:
                    lines.append(self._unwritten_line(key))
                lines.append(_sample_line(key, sample))
        if lines is not None:
            # A slot gone from the throttle ends its run.
            gone = [key for key in self._unwritten if key not in self._last]
            lines.extend(self._unwritten_line(key) for key in gone)
            if lines and self._out is not None:
                self._out.write(lines)

    def _as_kept(self, key: str, sample: SlotSample) -> SlotSample:
        """Slot ``key``'s sample just taken (not a repeat), as this timeline keeps it:
        what :meth:`samples` and the chart give back. The ``jsonl`` file has it as
        taken. A subclass may leave out of it what it knows its chart should not
        show (``autothrottle fetch`` leaves out each robots.txt's answer that
        there is none); this one keeps it whole."""
        return sample

    def _record(self, key: str, sample: SlotSample, *, merge: bool = False) -> None:
        """Add a sample that is not a repeat: the slot changed (``merge``: or a
        repeat, from a version 1 file, where every sample has its line).

        A slot not kept yet, with ``max_slots`` kept, takes the place of the one
        idle longest; if every slot kept is at work, it is not kept (until its
        next change finds room): forgetting a slot at work for another would
        leave every series a few samples long when more slots than that work at once.
        """
        series = self._series.get(key)
        if series is None:
            if len(self._series) >= self.max_slots:
                if not self._idle:
                    return
                forgotten, _ = self._idle.popitem(last=False)
                del self._series[forgotten]
            series = self._series[key] = Series()
        self._idle.pop(key, None)  # idle from now, if at all: the newest idle
        if not (sample.in_flight or sample.queued):
            self._idle[key] = None
        if merge:
            series.add_or_repeat(sample, self.max_samples)
        else:
            series.add(sample, self.max_samples)

    def _unwritten_repeat(self, key: str, t: float, snap: SlotSnapshot) -> None:
        unwritten = self._unwritten.get(key)
        if unwritten is None:
            self._unwritten[key] = _Unwritten(t, snap)
        else:
            unwritten.count += 1
            unwritten.last = t

    def _unwritten_line(self, key: str) -> dict[str, Any]:
        """The line of ``key``'s repeats not yet in the file (they are, once it is written)."""
        unwritten = self._unwritten.pop(key)
        quiet = _delta(unwritten.last, unwritten.snap, unwritten.snap, self._statuses)
        return _sample_line(key, quiet, unwritten.count)

    def _write_unwritten(self) -> None:
        """Write every run's repeats not yet in the file."""
        if self._unwritten and self._out is not None:
            self._out.write([self._unwritten_line(key) for key in list(self._unwritten)])
        self._unwritten.clear()

    def _replay(self, line: dict[str, Any]) -> None:
        """One line of a timeline file (a sample, a run of repeats, a mark or a
        clear) applied as recorded: the file's times are kept, not the clock's."""
        if "mark" in line:
            self._marks.append(Mark(float(line["t"]), str(line["key"]), str(line["mark"])))
        elif line.get("clear"):
            self._series.clear()
            self._idle.clear()
            self._marks.clear()
        elif "key" in line:
            key, sample = str(line["key"]), _sample_from(line)
            count = line.get("repeat")
            if count is None:
                self._record(key, sample, merge=self._merge)
                return
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"repeat must be an int >= 1, got {count!r}")
            series = self._series.get(key)
            # A slot forgotten (max_slots) gets a series at its next change, as when recording.
            if series is not None and not series.repeat(sample, count, self.max_samples):
                self._record(key, sample)  # not the tail's state: kept as a sample

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
        self._write_unwritten()
        self._series.clear()
        self._idle.clear()
        self._last.clear()
        self._marks.clear()
        self._statuses.clear()
        self._t0 = self._clock()
        if self._out is not None:
            self._out.write([{"clear": True}])

    async def start(self) -> None:
        """Start sampling every ``interval`` seconds in a task of the running loop."""
        if self._task is not None:
            raise RuntimeError("Timeline already started")
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop sampling, after one last sample (the file then holds every sample). Idempotent."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await self._sample_async()
        self._write_unwritten()

    @property
    def running(self) -> bool:
        """True while the sampling task runs."""
        return self._task is not None

    async def _run(self) -> None:
        while True:  # ends by cancellation, from stop()
            slots = await self._sample_async()
            await asyncio.sleep(max(self.interval, self.interval_per_slot * slots))

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
        self._write_unwritten()
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
            for sample, count, last in series.stored():
                lines.append(_sample_line(key, sample))
                if count:
                    lines.append(_sample_line(key, replace(sample, time=last), count))
        lines.extend(_mark_line(mark) for mark in self._marks)
        target = Path(path)
        with target.open("w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
        return target

    @classmethod
    def read_jsonl(
        cls,
        path: str | os.PathLike[str],
        *,
        max_samples: int | None = None,
        max_slots: int | None = None,
    ) -> Timeline:
        """A stopped timeline holding what a timeline file recorded, ready to :meth:`plot`.

        Memory stays bounded whatever the file's size: each slot keeps its last
        ``max_samples`` samples, and the ``max_slots`` slots that changed last
        are kept (defaults: the recording timeline's). A last line cut short
        (the recorder was killed mid-write) is ignored.

        Raises:
            ValueError: the file is not a timeline file, or a line in it is
                broken; the message names the file and the line.
        """
        source = Path(path)
        with source.open("r", encoding="utf-8") as fh:
            head = _read_head(fh, source)
            if max_samples is None:
                max_samples = head.get("max_samples", _MAX_SAMPLES)
            if max_slots is None:
                max_slots = head.get("max_slots", _MAX_SLOTS)
            timeline = cls(
                _NoSnapshots(),
                float(head.get("interval", 0.1)),
                interval_per_slot=float(head.get("interval_per_slot", 0.0)),
                max_samples=max_samples,
                max_slots=max_slots,
            )
            version = head.get("version")
            timeline._merge = not (isinstance(version, int) and version >= 2)
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
        """The slots kept, in order of first appearance."""
        return tuple(self._series)

    def samples(self, key: str) -> list[SlotSample]:
        """The samples of slot ``key``, oldest first (empty if never seen, or forgotten)."""
        series = self._series.get(key)
        return [] if series is None else list(series)

    def marks(self, key: str | None = None) -> list[Mark]:
        """The caller's marks, oldest first; only those of ``key`` if given."""
        return [m for m in self._marks if key is None or m.key == key]

    def rate(self, key: str, window: float = 1.0) -> float:
        """Responses per second of slot ``key`` over about the last ``window`` seconds.

        Measured between the oldest and the newest sample in the window, so it
        is 0.0 until two samples exist. Samples further apart than ``window``
        (a long ``interval``, or ``interval_per_slot`` over many slots) leave
        the newest alone in it: the rate is then over the gap back to the one
        before, not 0.0.
        """
        window = check_positive("window", window)
        series = self._series.get(key)
        if not series:
            return 0.0
        end = series.last_time
        inside: list[SlotSample] = []
        for s in reversed(series):  # bounded by max_samples
            if end - s.time > window:
                if len(inside) == 1:
                    inside.append(s)
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
        totals = {key: series.responses() for key, series in self._series.items()}
        return sorted(totals, key=lambda key: -totals[key])[:n]


def _unchanged(snap: SlotSnapshot, before: SlotSnapshot) -> bool:
    """True if ``snap`` shows what ``before`` did: a sample of it would be quiet and
    in the same state."""
    return snap is before or (
        snap.responses == before.responses
        and snap.sent == before.sent
        and snap.failures == before.failures
        and snap.backoffs == before.backoffs
        and snap.ignored_backoffs == before.ignored_backoffs
        and snap.pauses == before.pauses
        and snap.cache_hits == before.cache_hits
        and snap.in_flight == before.in_flight
        and snap.queued == before.queued
        and snap.delay == before.delay
        and snap.last_latency == before.last_latency
        and snap.status_counts == before.status_counts
    )


def _delta(
    t: float,
    snap: SlotSnapshot,
    before: SlotSnapshot | None,
    shared: dict[tuple[tuple[int, int], ...], Mapping[int, int]],
) -> SlotSample:
    """The sample of ``snap`` at ``t``, its counters less ``before``'s; its
    ``statuses`` one of the mappings in ``shared`` (added to it if new)."""
    if before is not None and (snap.sent < before.sent or snap.responses < before.responses):
        before = None  # a new slot under an old key: its counters started again
    if before is None:
        statuses: dict[int, int] = {code: n for code, n in snap.status_counts.items() if n > 0}
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
        statuses=_share(statuses, shared),
        cache_hits=cache_hits,
        backoffs=backoffs,
        pauses=pauses,
        failures=failures,
        backoff_reason=snap.last_backoff_reason if backoffs else None,
    )


#: The ``statuses`` of every sample without a response (shared, never changed).
_NO_STATUSES: Mapping[int, int] = {}


def _share(
    statuses: dict[int, int], shared: dict[tuple[tuple[int, int], ...], Mapping[int, int]]
) -> Mapping[int, int]:
    """``statuses``, or an equal mapping an earlier sample holds: a busy slot's
    samples repeat a few ({200: 1}, {200: 2}...), and a dict is most of a sample's size."""
    if not statuses:
        return _NO_STATUSES
    items = tuple(statuses.items())
    found = shared.get(items)
    if found is not None:
        return found
    if len(shared) >= _SHARED_STATUSES:
        shared.clear()
    shared[items] = statuses
    return statuses


class _Unwritten:
    """An idle slot's repeats not yet in the file: how many, the last's time, its state."""

    __slots__ = ("count", "last", "snap")

    def __init__(self, last: float, snap: SlotSnapshot) -> None:
        self.count = 1
        self.last = last
        self.snap = snap


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
        "interval_per_slot": timeline.interval_per_slot,
        "max_samples": timeline.max_samples,
        "max_slots": timeline.max_slots,
    }


def _sample_line(key: str, s: SlotSample, repeat: int = 0) -> dict[str, Any]:
    """A sample as a JSON object: zero counters and empty fields left out.

    With ``repeat``, the line stands for that many samples like ``s``, the
    last at its time, following the slot's line before.
    """
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
    if repeat:
        line["repeat"] = repeat
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

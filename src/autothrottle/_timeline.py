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
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Protocol, cast

from ._validate import check_int, check_positive

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import SubFigure

    from ._slot import SlotSnapshot

__all__ = ["Mark", "SlotSample", "Timeline", "busiest_keys"]

#: The first line of a timeline file names the format and its version.
_FORMAT = "autothrottle-timeline"
_VERSION = 1


class _Snapshots(Protocol):
    """Anything with ``snapshot()`` like :class:`~autothrottle.Throttle`'s."""

    def snapshot(self) -> Mapping[str, SlotSnapshot]: ...


@dataclass(frozen=True, slots=True)
class SlotSample:
    """One slot at one sampling moment, and what happened since the sample before.

    Attributes:
        time: Seconds since the timeline started.
        delay: The slot's delay then, in seconds.
        latency: The last latency it had observed, or None.
        in_flight: Requests in flight.
        queued: Requests waiting for their turn.
        responses: Responses observed since the previous sample.
        statuses: Those responses by HTTP status.
        cache_hits: Responses since the previous sample that a cache answered.
        backoffs: Backoffs since the previous sample (ignored ones included).
        pauses: Pauses since the previous sample (Retry-After, rate-limit budget).
        failures: Requests that failed without a response since the previous sample.
        backoff_reason: The slot's last backoff reason, when ``backoffs`` > 0.
    """

    time: float
    delay: float
    latency: float | None
    in_flight: int
    queued: int
    responses: int = 0
    statuses: Mapping[int, int] = field(default_factory=dict)
    cache_hits: int = 0
    backoffs: int = 0
    pauses: int = 0
    failures: int = 0
    backoff_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Mark:
    """An event the throttle cannot see, recorded by the caller (a CAPTCHA page, say).

    Attributes:
        time: Seconds since the timeline started.
        key: The slot key it belongs to.
        kind: A short label, e.g. ``"blocked"``.
    """

    time: float
    key: str
    kind: str


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
        for key, snap in self._throttle.snapshot().items():
            before = self._last.get(key)
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
        return _read(cls, Path(path), max_samples)

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
            ValueError: nothing to draw (no samples yet).
        """
        return _plot(
            self,
            Path(path),
            title=title,
            labels=labels or {},
            capacities=capacities or {},
            keys=list(self.keys if keys is None else keys),
            origins=origin_capacities or {},
        )


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


def _read(cls: type[Timeline], path: Path, max_samples: int | None) -> Timeline:
    with path.open("r", encoding="utf-8") as fh:
        first = fh.readline()
        try:
            head = json.loads(first)
        except ValueError:
            head = None
        if not isinstance(head, dict) or head.get("format") != _FORMAT:
            raise ValueError(f"{str(path)!r} is not an autothrottle timeline file (line 1)")
        keep = head.get("max_samples", 36_000) if max_samples is None else max_samples
        timeline = cls(_NoSnapshots(), float(head.get("interval", 0.1)), max_samples=keep)
        for number, raw in enumerate(fh, start=2):
            if not raw.endswith("\n"):
                break  # cut short by a recorder killed mid-write
            try:
                _apply(timeline, json.loads(raw))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise ValueError(f"{str(path)!r} line {number}: {exc!r}") from None
    return timeline


def _apply(timeline: Timeline, line: dict[str, Any]) -> None:
    if "mark" in line:
        timeline._marks.append(Mark(float(line["t"]), str(line["key"]), str(line["mark"])))
    elif line.get("clear"):
        timeline._series.clear()
        timeline._marks.clear()
    elif "key" in line:
        timeline._add(str(line["key"]), _sample_from(line))


def busiest_keys(timeline: Timeline, n: int) -> list[str]:
    """The ``n`` slots with the most responses recorded, busiest first (for a chart)."""
    n = check_int("n", n, minimum=1)
    totals = {key: sum(s.responses for s in timeline.samples(key)) for key in timeline.keys}
    return sorted(totals, key=lambda key: -totals[key])[:n]


# -- drawing -------------------------------------------------------------------------

# Event kinds of the marker strip: colour, marker, legend label; the order is the lanes'.
_EVENT_STYLES: dict[str, tuple[str, str, str]] = {
    "429": ("#d62728", "X", "429 Too Many Requests"),
    "5xx": ("#8c1c13", "X", "5xx error"),
    "4xx": ("#ff7f0e", "x", "other 4xx"),
    "blocked": ("#9467bd", "D", "blocked (CAPTCHA page)"),
    "backoff": ("#e377c2", "v", "backoff"),
    "pause": ("#555555", "|", "pause (Retry-After, budget)"),
    "failure": ("#000000", "*", "failure (no response)"),
}
_OTHER_EVENT = ("#17becf", "o")


def _rolling_rate(times: list[float], counts: list[int], window: float) -> list[float]:
    """Counts per second over a trailing window, at each sample time.

    A sample's count happened between the sample before and its own time, so
    the count of the window's first sample is left out.
    """
    rates: list[float] = []
    left = 0
    total = 0
    for right, t in enumerate(times):
        total += counts[right]
        while left < right and t - times[left] > window:
            total -= counts[left]
            left += 1
        span = t - times[left]
        rates.append((total - counts[left]) / span if span > 0 else 0.0)
    return rates


def _rolling_mean(times: list[float], values: list[float], window: float) -> list[float]:
    """The mean of the samples in a trailing window, at each sample time."""
    means: list[float] = []
    left = 0
    total = 0.0
    for right, t in enumerate(times):
        total += values[right]
        while left < right and t - times[left] > window:
            total -= values[left]
            left += 1
        means.append(total / (right - left + 1))
    return means


def _rolling_median(times: list[float], values: list[float | None], window: float) -> list[float]:
    """The median of the known values in a trailing window (NaN where none)."""
    medians: list[float] = []
    left = 0
    for right, t in enumerate(times):
        while left < right and t - times[left] > window:
            left += 1
        known = sorted(v for v in values[left : right + 1] if v is not None)
        medians.append(max(known[len(known) // 2], 1e-4) if known else math.nan)
    return medians


def _events(samples: list[SlotSample], marks: list[Mark]) -> dict[str, list[float]]:
    """Times of each kind of event, for the marker strip."""
    out: dict[str, list[float]] = {}
    for s in samples:
        for code in s.statuses:
            kind = "429" if code == 429 else "5xx" if code >= 500 else "4xx" if code >= 400 else ""
            if kind:
                out.setdefault(kind, []).append(s.time)
        if s.backoffs:
            out.setdefault("backoff", []).append(s.time)
        if s.pauses:
            out.setdefault("pause", []).append(s.time)
        if s.failures:
            out.setdefault("failure", []).append(s.time)
    for m in marks:
        out.setdefault(m.kind, []).append(m.time)
    order = list(_EVENT_STYLES)
    return dict(
        sorted(out.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else 99, kv[0]))
    )


def _seconds_label(value: float, _: object = None) -> str:
    if value >= 1.0:
        return f"{value:g} s"
    return f"{value * 1000:g} ms"


def _plot(
    timeline: Timeline,
    path: Path,
    *,
    title: str | None,
    labels: Mapping[str, str],
    capacities: Mapping[str, float],
    keys: list[str],
    origins: Mapping[str, float],
) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display needed, and never steal focus
    import matplotlib.pyplot as plt

    rows = [k for k in keys if timeline.samples(k)]
    if not rows:
        raise ValueError("nothing to plot: the timeline has no samples")
    window = max(3.0, 10 * timeline.interval)
    end = max(max(timeline.samples(k)[-1].time for k in rows), timeline.interval)
    fig = plt.figure(figsize=(16, 2.75 * len(rows) + 1.4), layout="constrained")
    if title:
        fig.suptitle(title, fontsize=15, fontweight="bold")
    grid = fig.subfigures(
        len(rows) + 1, 1, squeeze=False, height_ratios=[*([1.0] * len(rows)), 0.22]
    )
    subfigs: list[SubFigure] = [cast("SubFigure", cell) for cell in grid[:, 0]]
    seen: list[str] = []
    for row, key in enumerate(rows):
        samples = timeline.samples(key)
        t = [s.time for s in samples]
        sub = subfigs[row]
        sub.suptitle(labels.get(key, key), x=0.005, ha="left", fontsize=11, fontweight="bold")
        pace, rate_ax, load = sub.subplots(1, 3, width_ratios=[1.3, 1.0, 0.75])
        _plot_pace(pace, t, samples, timeline.marks(key), seen, window)
        _plot_rate(rate_ax, t, samples, window, capacities.get(key))
        _plot_origin(rate_ax, t, samples, window, origins.get(key))
        _plot_load(load, t, samples, window)
        for ax in (pace, rate_ax, load):
            ax.set_xlim(0, end)
            if row < len(rows) - 1:
                ax.tick_params(labelbottom=False)
            else:
                ax.set_xlabel("seconds since start")
        if row == 0:
            pace.set_title("delay · gap kept · latency · events", fontsize=10)
            rate_ax.set_title(f"responses per second ({window:g} s average)", fontsize=10)
            load.set_title("requests in flight · waiting their turn", fontsize=10)
    _legend(subfigs[-1], seen)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
    return path


def _plot_pace(
    pace: Axes,
    t: list[float],
    samples: list[SlotSample],
    marks: list[Mark],
    seen: list[str],
    window: float,
) -> None:
    """The delay, the gap actually kept, and the latency (smoothed), on a log
    scale; events along the top.

    The gap kept (one over the responses per second) is what set the pace
    when something other than the delay did: rate-limit header spacing, a
    pause, the concurrency cap. The raw latency of a site with slow and fast
    pages is noise, so its rolling median is drawn instead.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator
    from matplotlib.transforms import blended_transform_factory

    delay = [max(s.delay, 1e-4) for s in samples]
    rates = _rolling_rate(t, [s.responses for s in samples], window)
    kept = [1.0 / r if r > 0 else math.nan for r in rates]
    pace.plot(
        t,
        _rolling_median(t, [s.latency for s in samples], window / 3),
        color="#2ca02c",
        lw=1.0,
        alpha=0.8,
    )
    pace.plot(t, kept, color="#d62728", lw=1.2, ls="--", alpha=0.8)
    pace.plot(t, delay, color="#1f77b4", lw=2.2)
    pace.set_yscale("log")
    pace.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    pace.yaxis.set_major_formatter(FuncFormatter(_seconds_label))
    pace.yaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
    low, high = pace.get_ylim()
    pace.set_ylim(low, high * 2.5)  # headroom for the event strip
    pace.grid(True, which="major", alpha=0.3)
    strip = blended_transform_factory(pace.transData, pace.transAxes)
    for lane, (kind, times) in enumerate(_events(samples, marks).items()):
        colour, marker = _EVENT_STYLES.get(kind, _OTHER_EVENT)[:2]
        if kind not in seen:
            seen.append(kind)
        pace.scatter(
            times,
            [0.93 - 0.08 * lane] * len(times),
            transform=strip,
            color=colour,
            marker=marker,
            s=30,
            lw=1.2,
            zorder=3,
        )


def _plot_rate(
    rate_ax: Axes,
    t: list[float],
    samples: list[SlotSample],
    window: float,
    capacity: float | None,
) -> None:
    """Responses per second, cache hits shaded, the site's capacity dashed."""
    rates = _rolling_rate(t, [s.responses for s in samples], window)
    hits = _rolling_rate(t, [s.cache_hits for s in samples], window)
    if any(hits):
        rate_ax.fill_between(t, 0, hits, color="#17becf", alpha=0.35, lw=0)
    rate_ax.plot(t, rates, color="#ff7f0e", lw=1.8)
    top = max([*rates, 1.0])
    if capacity is not None and math.isfinite(capacity) and capacity > 0:
        rate_ax.axhline(capacity, color="#555555", ls="--", lw=1.2)
        rate_ax.annotate(
            f"site capacity {capacity:.3g}/s",
            (0.01, capacity),
            xycoords=("axes fraction", "data"),
            xytext=(0, 3),
            textcoords="offset points",
            fontsize=8.5,
            color="#333333",
        )
        top = max(top, capacity)
    rate_ax.set_ylim(0, top * 1.2)
    rate_ax.grid(True, alpha=0.3)


def _plot_origin(
    rate_ax: Axes, t: list[float], samples: list[SlotSample], window: float, capacity: float | None
) -> None:
    """Behind a cache: the misses per second (the origin's load) against what it serves."""
    if capacity is None:
        return
    misses = _rolling_rate(t, [s.responses - s.cache_hits for s in samples], window)
    rate_ax.plot(t, misses, color="#8c564b", lw=1.6)
    rate_ax.axhline(capacity, color="#8c564b", ls=":", lw=1.2)
    rate_ax.annotate(
        f"origin serves {capacity:.3g}/s",
        (0.01, capacity),
        xycoords=("axes fraction", "data"),
        xytext=(0, 3),
        textcoords="offset points",
        fontsize=8.5,
        color="#8c564b",
    )


def _plot_load(load: Axes, t: list[float], samples: list[SlotSample], window: float) -> None:
    """Requests in flight and waiting in the throttle, each averaged over a second.

    A fast host's requests are in flight for a few milliseconds: a sample
    seldom catches one, and a raw step line sits at 0; the mean says how
    busy it kept the host.
    """
    from matplotlib.ticker import MaxNLocator

    in_flight = _rolling_mean(t, [float(s.in_flight) for s in samples], 1.0)
    queued = _rolling_mean(t, [float(s.queued) for s in samples], 1.0)
    load.plot(t, queued, color="#bcbd22", lw=1.0, ls=":")
    load.plot(t, in_flight, color="#9467bd", lw=1.4)
    load.set_ylim(0, max([*in_flight, *queued, 1.0]) * 1.15)
    load.yaxis.set_major_locator(MaxNLocator(integer=True))
    load.grid(True, alpha=0.3)


def _legend(sub: SubFigure, seen: list[str]) -> None:
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color="#1f77b4", lw=2.2, label="delay"),
        Line2D([], [], color="#d62728", lw=1.2, ls="--", label="gap kept (1 / responses/s)"),
        Line2D([], [], color="#2ca02c", lw=1.0, label="latency (median)"),
        Line2D([], [], color="#ff7f0e", lw=1.8, label="responses/s"),
        Line2D([], [], color="#17becf", lw=7, alpha=0.35, label="cache hits/s"),
        Line2D([], [], color="#8c564b", lw=1.6, label="misses/s (the origin's load)"),
        Line2D([], [], color="#555555", ls="--", label="site capacity"),
        Line2D([], [], color="#9467bd", lw=1.4, label="in flight (1 s mean)"),
        Line2D([], [], color="#bcbd22", ls=":", label="waiting in the throttle (1 s mean)"),
    ]
    for kind in seen:
        colour, marker = _EVENT_STYLES.get(kind, _OTHER_EVENT)[:2]
        label = _EVENT_STYLES[kind][2] if kind in _EVENT_STYLES else kind
        handles.append(
            Line2D([], [], color=colour, marker=marker, ls="", markersize=7, label=label)
        )
    sub.legend(handles=handles, loc="center", ncol=min(len(handles), 6), frameon=False)

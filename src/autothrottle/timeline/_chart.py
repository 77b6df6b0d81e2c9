"""The chart of a timeline: one row per slot, drawn with matplotlib (imported only here).

Each row has three panels: the pace (the delay, the gap kept, the latency and
the events), the responses per second, and the requests in flight and waiting.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast

from autothrottle._extras import missing_extra

from ._samples import Mark, SlotSample

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import SubFigure

__all__ = ["draw", "gap_kept"]


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


def _spacing(series: Mapping[str, list[SlotSample]], rows: list[str]) -> float:
    """The median time between two samples of the rows drawn: more than the
    timeline's ``interval`` when its task waited longer over many slots
    (``interval_per_slot``), and a rate needs two samples in its window."""
    gaps = sorted(
        later.time - earlier.time
        for key in rows
        for earlier, later in zip(series[key], series[key][1:], strict=False)
    )
    return gaps[len(gaps) // 2] if gaps else 0.0


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


def draw(
    path: Path,
    series: Mapping[str, list[SlotSample]],
    marks: Mapping[str, list[Mark]],
    *,
    interval: float,
    title: str | None,
    labels: Mapping[str, str],
    capacities: Mapping[str, float],
    origins: Mapping[str, float],
) -> Path:
    """Draw ``series`` (slot key to samples, in row order) as a PNG at ``path``.

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: no slot has a sample.
    """
    try:
        import matplotlib
    except ImportError as exc:
        message = missing_extra("Timeline.plot", ["matplotlib"], "plot")
        raise ImportError(message, name="matplotlib") from exc

    matplotlib.use("Agg")  # no display needed, and never steal focus
    import matplotlib.pyplot as plt

    rows = [k for k, samples in series.items() if samples]
    if not rows:
        raise ValueError("nothing to plot: the timeline has no samples")
    window = max(3.0, 10 * max(interval, _spacing(series, rows)))
    end = max(max(series[k][-1].time for k in rows), interval)
    fig = plt.figure(figsize=(16, 2.75 * len(rows) + 1.4), layout="constrained")
    if title:
        fig.suptitle(title, fontsize=15, fontweight="bold")
    grid = fig.subfigures(
        len(rows) + 1, 1, squeeze=False, height_ratios=[*([1.0] * len(rows)), 0.22]
    )
    subfigs: list[SubFigure] = [cast("SubFigure", cell) for cell in grid[:, 0]]
    seen: list[str] = []
    drawn: set[str] = set()
    for row, key in enumerate(rows):
        samples = series[key]
        t = [s.time for s in samples]
        sub = subfigs[row]
        sub.suptitle(labels.get(key, key), x=0.005, ha="left", fontsize=11, fontweight="bold")
        pace, rate_ax, load = sub.subplots(1, 3, width_ratios=[1.3, 1.0, 0.75])
        _plot_pace(pace, t, samples, marks.get(key, []), seen, window, drawn)
        _plot_rate(rate_ax, t, samples, window, capacities.get(key), drawn)
        _plot_origin(rate_ax, t, samples, window, origins.get(key), drawn)
        _plot_load(load, t, samples, window, drawn)
        _frame((pace, rate_ax, load), end, window, first=row == 0, last=row == len(rows) - 1)
    _legend(subfigs[-1], seen, drawn)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
    return path


def _frame(
    axes: tuple[Axes, Axes, Axes], end: float, window: float, *, first: bool, last: bool
) -> None:
    """One row's shared x axis; the panels' titles on the first row, the x label on the last."""
    for ax in axes:
        ax.set_xlim(0, end)
        if last:
            ax.set_xlabel("seconds since start")
        else:
            ax.tick_params(labelbottom=False)
    if first:
        pace, rate_ax, load = axes
        pace.set_title("delay · gap kept · latency · events", fontsize=10)
        rate_ax.set_title(f"responses per second ({window:g} s average)", fontsize=10)
        load.set_title("requests in flight · waiting their turn", fontsize=10)


def gap_kept(times: list[float], responses: list[int], window: float) -> list[float]:
    """One over the responses per second (trailing ``window``), while the slot answers.

    Once a slot's last response is in, the trailing rate only decays towards 0
    and its inverse would climb to a spike no host ever kept: the line stops at
    the last sample that had responses (NaN after it). A pause in the middle
    still shows as the long gap it was.
    """
    rates = _rolling_rate(times, responses, window)
    last = max((i for i, n in enumerate(responses) if n), default=-1)
    return [1.0 / r if r > 0 and i <= last else math.nan for i, r in enumerate(rates)]


def _plot_pace(
    pace: Axes,
    t: list[float],
    samples: list[SlotSample],
    marks: list[Mark],
    seen: list[str],
    window: float,
    drawn: set[str],
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
    kept = gap_kept(t, [s.responses for s in samples], window)
    latency = _rolling_median(t, [s.latency for s in samples], window / 3)
    if any(math.isfinite(v) for v in latency):
        pace.plot(t, latency, color="#2ca02c", lw=1.0, alpha=0.8)
        drawn.add("latency")
    if any(math.isfinite(v) for v in kept):
        pace.plot(t, kept, color="#d62728", lw=1.2, ls="--", alpha=0.8)
        drawn.add("kept")
    pace.plot(t, delay, color="#1f77b4", lw=2.2)
    drawn.add("delay")
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
    drawn: set[str],
) -> None:
    """Responses per second, cache hits shaded, the site's capacity dashed."""
    rates = _rolling_rate(t, [s.responses for s in samples], window)
    hits = _rolling_rate(t, [s.cache_hits for s in samples], window)
    if any(hits):
        rate_ax.fill_between(t, 0, hits, color="#17becf", alpha=0.35, lw=0)
        drawn.add("hits")
    rate_ax.plot(t, rates, color="#ff7f0e", lw=1.8)
    drawn.add("responses")
    top = max([*rates, 1.0])
    if capacity is not None and math.isfinite(capacity) and capacity > 0:
        rate_ax.axhline(capacity, color="#555555", ls="--", lw=1.2)
        drawn.add("capacity")
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
    rate_ax: Axes,
    t: list[float],
    samples: list[SlotSample],
    window: float,
    capacity: float | None,
    drawn: set[str],
) -> None:
    """Behind a cache: the misses per second (the origin's load) against what it serves."""
    if capacity is None:
        return
    misses = _rolling_rate(t, [s.responses - s.cache_hits for s in samples], window)
    rate_ax.plot(t, misses, color="#8c564b", lw=1.6)
    drawn.add("misses")
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


def _plot_load(
    load: Axes, t: list[float], samples: list[SlotSample], window: float, drawn: set[str]
) -> None:
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
    drawn.update(("queued", "in_flight"))
    load.set_ylim(0, max([*in_flight, *queued, 1.0]) * 1.15)
    load.yaxis.set_major_locator(MaxNLocator(integer=True))
    load.grid(True, alpha=0.3)


#: Each line the chart may draw: its legend entry (colour, width, style, label), in order.
_LINES: dict[str, tuple[str, float, str, str]] = {
    "delay": ("#1f77b4", 2.2, "-", "delay"),
    "kept": ("#d62728", 1.2, "--", "gap kept (1 / responses/s)"),
    "latency": ("#2ca02c", 1.0, "-", "latency (median)"),
    "responses": ("#ff7f0e", 1.8, "-", "responses/s"),
    "hits": ("#17becf", 7.0, "-", "cache hits/s"),
    "misses": ("#8c564b", 1.6, "-", "misses/s (the origin's load)"),
    "capacity": ("#555555", 1.5, "--", "site capacity"),
    "in_flight": ("#9467bd", 1.4, "-", "in flight (1 s mean)"),
    "queued": ("#bcbd22", 1.5, ":", "waiting in the throttle (1 s mean)"),
}


def _legend(sub: SubFigure, seen: list[str], drawn: set[str]) -> None:
    """The legend of what was drawn in some row: a line no row has is not listed."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D(
            [],
            [],
            color=colour,
            lw=width,
            ls=style,
            label=label,
            alpha=0.35 if name == "hits" else 1,
        )
        for name, (colour, width, style, label) in _LINES.items()
        if name in drawn
    ]
    for kind in seen:
        colour, marker = _EVENT_STYLES.get(kind, _OTHER_EVENT)[:2]
        label = _EVENT_STYLES[kind][2] if kind in _EVENT_STYLES else kind
        handles.append(
            Line2D([], [], color=colour, marker=marker, ls="", markersize=7, label=label)
        )
    sub.legend(handles=handles, loc="center", ncol=min(len(handles), 6), frameon=False)

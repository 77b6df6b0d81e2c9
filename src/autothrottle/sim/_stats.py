"""Ground truth per simulated host: what arrived, when, and how loaded the host was.

The request handler only appends to flat arrays (O(1) per event, no scans of
history), so recording stays cheap with hundreds of hosts; every figure that
needs the whole history (the busiest 1-second window, time averages,
percentiles) is computed when a snapshot is taken.

Times are ``time.monotonic()`` readings while recording and are reported in
seconds since the server started.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["HostStats", "RequestRecord", "max_in_window"]

#: Outcome of a finished request, as recorded (the index is what is stored).
OUTCOMES = ("ok", "limited", "blocked", "error", "aborted", "robots")
_OUTCOME_INDEX = {name: i for i, name in enumerate(OUTCOMES)}


def max_in_window(times: Sequence[float], window: float = 1.0) -> int:
    """The most events in any half-open interval ``[t, t + window)``.

    ``times`` must be sorted ascending (arrival times are). Half-open, so a
    client sending exactly ``R`` requests a second, ``1/R`` apart, counts ``R``
    and not ``R + 1``. Linear time, two pointers.
    """
    if not window > 0 or not math.isfinite(window):
        raise ValueError(f"window must be a finite number > 0, got {window!r}")
    best = 0
    left = 0
    for right, t in enumerate(times):
        while t - times[left] >= window:
            left += 1
        best = max(best, right - left + 1)
    return best


class RequestRecord(NamedTuple):
    """One finished (or aborted) request as the host saw it.

    Attributes:
        arrival: When the handler received it (seconds since server start).
        start: When service began, after any wait in the queue.
        finish: When the answer was ready (or the request was aborted).
        status: HTTP status sent; 0 if the request was aborted.
        outcome: ``"ok"`` (a real page), ``"limited"`` (429), ``"blocked"``
            (a CAPTCHA page), ``"error"``, ``"aborted"`` or ``"robots"`` (a
            request for ``/robots.txt``, served by the server, not the behaviour).
    """

    arrival: float
    start: float
    finish: float
    status: int
    outcome: str

    @property
    def latency(self) -> float:
        """Seconds from arrival to answer, queueing included."""
        return self.finish - self.arrival

    @property
    def wait(self) -> float:
        """Seconds spent waiting in the queue for a worker."""
        return self.start - self.arrival


@dataclass(frozen=True)
class HostStats:
    """A snapshot of one host's ground truth (or of a CDN host's origin).

    Figures over the *active period* run from the first arrival to the last
    answer (or to now, while requests are still in progress), so a snapshot
    taken long after a crawl ended is not diluted by idle time.

    Attributes:
        host: The host's address (``"127.0.0.2"``), or ``"<address> origin"``.
        url: The host's base URL, e.g. ``http://127.0.0.2:41234``.
        behaviour: The behaviour's spec, as the command line writes it.
        capacity: The most successful responses per second the host can
            sustain (its true capacity), for comparing goodput against.
        since: When recording began (server start or the last reset).
        now: When the snapshot was taken.
        requests: Requests that arrived.
        completed: Requests answered (aborted ones excluded).
        ok, limited, blocked, errors, aborted: Requests by outcome.
        robots: Requests for ``/robots.txt`` (counted in ``requests`` too: each
            is a request the host received).
        statuses: Answered requests by HTTP status.
        first_arrival, last_finish: Bounds of the active period (None if empty).
        active: Length of the active period in seconds.
        goodput: ``ok`` per second of the active period.
        max_in_window: Most arrivals in any 1-second window ``[t, t + 1)``.
        in_service, queued: Requests in service / waiting now.
        max_in_service, max_queued: Their peaks since ``since``.
        mean_in_service, mean_queued: Their time averages over the active period.
        latency_mean, latency_p50, latency_p95, latency_max: Seconds from arrival
            to answer over answered requests (0 if none).
        wait_mean: Mean seconds spent queued over answered requests.
        origin: For a CDN host, the same figures for its origin alone.
        arrivals: Every arrival time, ascending.
        records: Every finished request, in order of finishing.
        in_service_series, queued_series: ``(time, count)`` steps: the count
            holds from that time until the next step.
    """

    host: str
    url: str
    behaviour: str
    capacity: float
    since: float
    now: float
    requests: int
    completed: int
    ok: int
    limited: int
    blocked: int
    errors: int
    aborted: int
    robots: int
    statuses: Mapping[int, int]
    first_arrival: float | None
    last_finish: float | None
    active: float
    goodput: float
    max_in_window: int
    in_service: int
    queued: int
    max_in_service: int
    max_queued: int
    mean_in_service: float
    mean_queued: float
    latency_mean: float
    latency_p50: float
    latency_p95: float
    latency_max: float
    wait_mean: float
    origin: HostStats | None
    arrivals: tuple[float, ...]
    records: tuple[RequestRecord, ...]
    in_service_series: tuple[tuple[float, int], ...]
    queued_series: tuple[tuple[float, int], ...]

    def to_dict(self, *, series: bool = True) -> dict[str, Any]:
        """A JSON-ready dict; ``series=False`` leaves out the per-event data."""
        out: dict[str, Any] = {
            "host": self.host,
            "url": self.url,
            "behaviour": self.behaviour,
            "capacity": _r(self.capacity) if math.isfinite(self.capacity) else None,
            "since": _r(self.since),
            "now": _r(self.now),
            "requests": self.requests,
            "completed": self.completed,
            "outcomes": {
                "ok": self.ok,
                "limited": self.limited,
                "blocked": self.blocked,
                "error": self.errors,
                "aborted": self.aborted,
                "robots": self.robots,
            },
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "first_arrival": None if self.first_arrival is None else _r(self.first_arrival),
            "last_finish": None if self.last_finish is None else _r(self.last_finish),
            "active": _r(self.active),
            "goodput": _r(self.goodput),
            "max_in_window": self.max_in_window,
            "in_service": self.in_service,
            "queued": self.queued,
            "max_in_service": self.max_in_service,
            "max_queued": self.max_queued,
            "mean_in_service": _r(self.mean_in_service),
            "mean_queued": _r(self.mean_queued),
            "latency": {
                "mean": _r(self.latency_mean),
                "p50": _r(self.latency_p50),
                "p95": _r(self.latency_p95),
                "max": _r(self.latency_max),
            },
            "wait_mean": _r(self.wait_mean),
            "origin": None if self.origin is None else self.origin.to_dict(series=series),
        }
        if series:
            recs = self.records
            out["series"] = {
                "arrivals": [_r(t) for t in self.arrivals],
                "requests": {
                    "arrival": [_r(r.arrival) for r in recs],
                    "start": [_r(r.start) for r in recs],
                    "finish": [_r(r.finish) for r in recs],
                    "status": [r.status for r in recs],
                    "outcome": [r.outcome for r in recs],
                },
                "in_service": [[_r(t), n] for t, n in self.in_service_series],
                "queued": [[_r(t), n] for t, n in self.queued_series],
            }
        return out


def _r(x: float) -> float:
    """Round to microseconds: keeps the JSON small without losing anything real."""
    return round(x, 6)


_NEW, _QUEUED, _SERVING = 0, 1, 2


class Ticket:
    """Per-request bookkeeping handed from arrival to finish."""

    __slots__ = ("arrival", "history", "start", "state")

    def __init__(self, arrival: float, history: _History) -> None:
        self.arrival = arrival
        self.start = arrival
        self.history = history
        self.state = _NEW


class _Steps:
    """A step function recorded on change: parallel arrays of times and values."""

    __slots__ = ("times", "values")

    def __init__(self, t: float, value: int) -> None:
        self.times = array("d", (t,))
        self.values = array("q", (value,))

    def add(self, t: float, value: int) -> None:
        self.times.append(t)
        self.values.append(value)

    def average(self, start: float, end: float) -> float:
        """Time average over ``[start, end]``."""
        if end <= start:
            return float(self.value_at(start))
        total = 0.0
        times, values = self.times, self.values
        n = len(times)
        for i in range(n):
            lo = max(times[i], start)
            hi = min(times[i + 1] if i + 1 < n else end, end)
            if hi > lo:
                total += values[i] * (hi - lo)
        return total / (end - start)

    def value_at(self, t: float) -> int:
        value = self.values[0]
        for ti, vi in zip(self.times, self.values, strict=True):
            if ti > t:
                break
            value = vi
        return value


class _History:
    """What happened since the last reset. Replaced wholesale on reset."""

    __slots__ = (
        "arrivals",
        "in_service",
        "queued",
        "r_arrival",
        "r_finish",
        "r_outcome",
        "r_start",
        "r_status",
        "since",
    )

    def __init__(self, since: float, in_service: int, queued: int) -> None:
        self.since = since
        self.arrivals = array("d")
        self.r_arrival = array("d")
        self.r_start = array("d")
        self.r_finish = array("d")
        self.r_status = array("H")
        self.r_outcome = array("B")
        self.in_service = _Steps(since, in_service)
        self.queued = _Steps(since, queued)


class Recorder:
    """Records one host's (or one origin's) traffic. Cheap per event.

    A request is *queued* while it waits for a worker and *in service* while
    it holds one (from :meth:`begin` to :meth:`done`); one answered at once
    without any work (a 429, a CAPTCHA page) is never in service.
    """

    __slots__ = ("_history", "in_service", "queued")

    def __init__(self, now: float) -> None:
        self.in_service = 0
        self.queued = 0
        self._history = _History(now, 0, 0)

    def reset(self, now: float) -> None:
        """Forget the history; requests in progress keep counting as load."""
        self._history = _History(now, self.in_service, self.queued)

    def arrive(self, now: float) -> Ticket:
        h = self._history
        h.arrivals.append(now)
        return Ticket(now, h)

    def wait(self, ticket: Ticket, now: float) -> None:
        """The request found no free worker and joins the queue."""
        ticket.state = _QUEUED
        self.queued += 1
        self._history.queued.add(now, self.queued)

    def begin(self, ticket: Ticket, now: float) -> None:
        """The request got a worker (straight away, or out of the queue)."""
        h = self._history
        if ticket.state == _QUEUED:
            self.queued -= 1
            h.queued.add(now, self.queued)
        ticket.state = _SERVING
        ticket.start = now
        self.in_service += 1
        h.in_service.add(now, self.in_service)

    def done(self, ticket: Ticket, now: float, status: int, outcome: str) -> None:
        """The request was answered (``outcome`` one of :data:`OUTCOMES`)."""
        h = self._history
        if ticket.state == _QUEUED:
            self.queued -= 1
            h.queued.add(now, self.queued)
        elif ticket.state == _SERVING:
            self.in_service -= 1
            h.in_service.add(now, self.in_service)
        ticket.state = _NEW
        if ticket.history is h:
            h.r_arrival.append(ticket.arrival)
            h.r_start.append(ticket.start)
            h.r_finish.append(now)
            h.r_status.append(status)
            h.r_outcome.append(_OUTCOME_INDEX[outcome])

    def abort(self, ticket: Ticket, now: float) -> None:
        """The request was cancelled (server shutting down) before its answer."""
        if ticket.state == _QUEUED:
            ticket.start = now
        self.done(ticket, now, 0, "aborted")

    def _records(self, t0: float) -> tuple[RequestRecord, ...]:
        h = self._history
        outcomes = [OUTCOMES[i] for i in h.r_outcome]
        return tuple(
            RequestRecord(a - t0, s - t0, f - t0, st, o)
            for a, s, f, st, o in zip(
                h.r_arrival, h.r_start, h.r_finish, h.r_status, outcomes, strict=True
            )
        )

    def _activity(
        self, first: float | None, t0: float, end_abs: float
    ) -> tuple[float, float, float]:
        """The active period's length and its mean in service and queued."""
        if first is None:
            return 0.0, 0.0, 0.0
        h = self._history
        start_abs = first + t0
        return (
            max(0.0, end_abs - start_abs),
            h.in_service.average(start_abs, end_abs),
            h.queued.average(start_abs, end_abs),
        )

    def snapshot(
        self,
        *,
        host: str,
        url: str,
        behaviour: str,
        capacity: float,
        origin_time: float,
        now: float,
        origin: HostStats | None = None,
    ) -> HostStats:
        """Compute every figure; O(history). ``origin_time`` is the server start."""
        h = self._history
        t0 = origin_time
        arrivals = tuple(t - t0 for t in h.arrivals)
        records = self._records(t0)
        counts, statuses = _tally(records)
        answered = [r for r in records if r.outcome != "aborted"]
        latencies = sorted(r.latency for r in answered)
        first = arrivals[0] if arrivals else None  # the active period runs from it
        last = max((r.finish for r in records), default=None)
        busy = self.in_service + self.queued > 0
        end_abs = now if busy or last is None else last + t0
        active, mean_in_service, mean_queued = self._activity(first, t0, end_abs)
        return HostStats(
            host=host,
            url=url,
            behaviour=behaviour,
            capacity=capacity,
            since=h.since - t0,
            now=now - t0,
            requests=len(arrivals),
            completed=len(answered),
            ok=counts["ok"],
            limited=counts["limited"],
            blocked=counts["blocked"],
            errors=counts["error"],
            aborted=counts["aborted"],
            robots=counts["robots"],
            statuses=statuses,
            first_arrival=first,
            last_finish=last,
            active=active,
            goodput=counts["ok"] / active if active > 0 else 0.0,
            max_in_window=max_in_window(arrivals, 1.0),
            in_service=self.in_service,
            queued=self.queued,
            max_in_service=max(h.in_service.values),
            max_queued=max(h.queued.values),
            mean_in_service=mean_in_service,
            mean_queued=mean_queued,
            **_latency_figures(latencies),
            wait_mean=sum(r.wait for r in answered) / len(answered) if answered else 0.0,
            origin=origin,
            arrivals=arrivals,
            records=records,
            in_service_series=_series(h.in_service.times, h.in_service.values, t0),
            queued_series=_series(h.queued.times, h.queued.values, t0),
        )


def _latency_figures(latencies: Sequence[float]) -> dict[str, float]:
    """Mean, median, 95th percentile and maximum of sorted latencies (0 when none)."""
    return {
        "latency_mean": sum(latencies) / len(latencies) if latencies else 0.0,
        "latency_p50": _quantile(latencies, 0.5),
        "latency_p95": _quantile(latencies, 0.95),
        "latency_max": latencies[-1] if latencies else 0.0,
    }


def _series(times: Sequence[float], values: Sequence[int], t0: float) -> tuple[Any, ...]:
    """A step series as ``(seconds since t0, value)`` pairs."""
    return tuple((t - t0, n) for t, n in zip(times, values, strict=True))


def _tally(records: Sequence[RequestRecord]) -> tuple[dict[str, int], dict[int, int]]:
    """Requests by outcome, and by status (0, no status, left out)."""
    counts = dict.fromkeys(OUTCOMES, 0)
    statuses: dict[int, int] = {}
    for rec in records:
        counts[rec.outcome] += 1
        if rec.status:
            statuses[rec.status] = statuses.get(rec.status, 0) + 1
    return counts, statuses


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of sorted data (0 if empty)."""
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]

"""The demo's verdicts: what each site's own count says of the pace the throttle found.

A site is judged by its ground truth (what arrived, the busiest second, its
queue, how busy its workers were), not by the throttle's own view, and over
the last :data:`JUDGED` of its crawl: the pace found, not the finding. A
site bound by its workers is judged in its own time (the requests it held,
in service or waiting, on average): a busy machine makes its pages slower,
which moves its pages a second and not that. :data:`VERDICT_WORDS` says what
each verdict word means; the demo prints them under the verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass

from autothrottle.sim import CDN, Capacity, HostStats, RateLimited, SoftBlock, VariableLatency

from ._demo_crawl import Tally
from ._demo_sites import Site

__all__ = ["FOUND", "JUDGED", "VERDICT_WORDS", "Figures", "Outcome", "ms"]


JUDGED = 0.5
"""The verdicts judge the last half of each host's crawl: the pace found. The
first half includes finding it (the ramp up from the start delay, a first
refusal), which the summary table's whole-run figures show."""


@dataclass(frozen=True)
class Figures:
    """A host's own counts over the judged part of its crawl (see :data:`JUDGED`)."""

    goodput: float
    answered: int
    limited: int
    blocked: int
    mean_queued: float
    wait_mean: float
    mean_in_service: float
    """Workers busy, on average: the time the host spent serving, in its own time."""

    @classmethod
    def judged(cls, stats: HostStats) -> Figures:
        """``stats`` over the last :data:`JUDGED` of the host's active period (the
        whole of it when the stats keep no history)."""
        first, last = stats.first_arrival, stats.last_finish
        if first is None or last is None or last <= first or not stats.records:
            waits = stats.wait_mean
            return cls(
                stats.goodput,
                stats.completed,
                stats.limited,
                stats.blocked,
                stats.mean_queued,
                waits,
                stats.mean_in_service,
            )
        start = last - JUDGED * (last - first)
        inside = [r for r in stats.records if start <= r.finish <= last and r.outcome != "aborted"]
        span = last - start
        count = {o: sum(r.outcome == o for r in inside) for o in ("ok", "limited", "blocked")}
        return cls(
            goodput=count["ok"] / span,
            answered=len(inside),
            limited=count["limited"],
            blocked=count["blocked"],
            mean_queued=_mean_of_steps(stats.queued_series, start, last),
            wait_mean=sum(r.wait for r in inside) / len(inside) if inside else 0.0,
            mean_in_service=_mean_of_steps(stats.in_service_series, start, last),
        )


def _mean_of_steps(series: tuple[tuple[float, int], ...], start: float, end: float) -> float:
    """The time average over ``[start, end]`` of a count that holds from each step to the next."""
    if not series:
        return 0.0
    total = 0.0
    for (at, count), (after, _) in zip(series, (*series[1:], (end, 0)), strict=True):
        overlap = min(after, end) - max(at, start)
        if overlap > 0.0:
            total += count * overlap
    return total / (end - start)


@dataclass(frozen=True)
class Outcome:
    """One host's result: the crawler's tally, the site's truth, the throttle's state."""

    site: Site
    tally: Tally
    truth: HostStats
    delay: float

    @property
    def capacity(self) -> float:
        return self.site.behaviour.capacity

    def verdict(self) -> str:
        """One sentence a newcomer understands, on the judged part of the crawl."""
        f = Figures.judged(self.truth)
        b = self.site.behaviour
        good = f.goodput
        answered = max(f.answered, 1)
        if isinstance(b, RateLimited):
            return _bucket_verdict(good, b.rate, f.limited / answered, 0.03, "refused", "with 429")
        if isinstance(b, SoftBlock):
            return _bucket_verdict(good, b.rate, f.blocked / answered, 0.05, "CAPTCHA pages", "")
        if isinstance(b, CDN):
            return self._cdn_verdict(good)
        # A host bound by its workers (Capacity, VariableLatency): busy, without a pile-up.
        workers = b.workers if isinstance(b, (Capacity, VariableLatency)) else 1
        head = _load_word(f, workers)
        return (
            f"{head}: its {workers} workers busy {_busy(f, workers)} of the time "
            f"({good:.1f}/s of the {self.capacity:.0f}/s they serve at full speed), "
            f"{ms(f.wait_mean)} average wait for a worker there"
        )

    def _cdn_verdict(self, good: float) -> str:
        """A CDN is judged by its origin: misses against what the origin serves."""
        b = self.site.behaviour
        assert isinstance(b, CDN)
        if self.truth.origin is None:  # pragma: no cover - a CDN host always has one
            return f"{good:.1f}/s"
        origin = Figures.judged(self.truth.origin)
        workers = b.origin.workers
        head = _load_word(origin, workers)
        return (
            f"{head}: its origin's {workers} workers busy {_busy(origin, workers)} of the time "
            f"({origin.goodput:.1f} misses/s, {good:.0f}/s in all), "
            f"{origin.mean_queued:.1f} waiting there on average"
        )


FOUND = 0.75
"""The share of what a site allows that "found the pace" needs."""

VERDICT_WORDS = (
    (
        "found the pace",
        f"at least {FOUND:.0%} of what the site allows (its rate; its workers, in requests "
        "held), within its refusal bound, over the second half of the crawl (the first half "
        "finds the pace)",
    ),
    ("too cautious", f"under {FOUND:.0%} of what the site allows"),
    ("too fast", "more refusals (429s, CAPTCHA pages) than the site's bound (3 %, 5 %)"),
    ("pushed too hard", "more waiting at the host (behind a cache: its origin) than workers"),
)
"""Each verdict word and what it means, printed under the verdicts."""


def _load_word(f: Figures, workers: int) -> str:
    """A host bound by its workers, judged at the host in its own time: the
    requests it held on average (in service or waiting) at least :data:`FOUND`
    of its workers, and no more waiting than workers.

    Not its pages a second against what its workers serve at full speed: on a
    busy machine the host's own work takes longer (its 50 ms page 60 ms), and
    a crawl that kept every worker busy read as too cautious. Nor its workers'
    busy time alone: a cache's misses reach its origin in bursts, which wait
    for a worker while another is idle, and a crawl that kept a queue there
    read as too cautious too.
    """
    if f.mean_queued > workers:
        return "pushed too hard"
    if f.mean_in_service + f.mean_queued >= FOUND * workers:
        return "found the pace"
    return "too cautious"


def _busy(f: Figures, workers: int) -> str:
    return f"{min(f.mean_in_service / workers, 1.0):.0%}"


def _bucket_verdict(
    good: float, rate: float, bad: float, max_bad: float, what: str, how: str
) -> str:
    """The verdict on a token-bucket site: found its pace, too fast, or too cautious."""
    if bad <= max_bad and good >= FOUND * rate:
        return f"found the pace: {good:.1f}/s of {rate:g}/s allowed, {100 * bad:.1f} % {what}"
    if bad > max_bad:
        return f"too fast: {100 * bad:.1f} % {what} {how} ({good:.1f}/s)".replace("  ", " ")
    return f"too cautious: {good:.1f}/s of {rate:g}/s allowed"


def ms(seconds: float | None) -> str:
    """Seconds as a person reads them: ``2.50 s``, ``120 ms``, ``4.2 ms``."""
    if seconds is None:
        return "-"
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds * 1000:.0f} ms"

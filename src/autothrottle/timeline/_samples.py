"""What a :class:`~autothrottle.timeline.Timeline` records: samples of a slot, their
series, and marks."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

__all__ = ["Mark", "Series", "SlotSample", "is_quiet"]


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
        statuses: Those responses by HTTP status (read it, do not change it:
            samples share equal mappings).
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


class _Run:
    """A quiet sample and ``count`` more like it, the last at ``last``: a stretch of
    samples in which the slot did not change, held as one entry."""

    __slots__ = ("count", "head", "last")

    def __init__(self, head: SlotSample, count: int, last: float) -> None:
        self.head = head
        self.count = count
        self.last = last

    def at(self, i: int) -> SlotSample:
        """The ``i``-th repeat (1 to ``count``): the head, at a time spread evenly
        between the head's and the last's."""
        head = self.head
        return replace(head, time=head.time + (self.last - head.time) * i / self.count)


def is_quiet(sample: SlotSample) -> bool:
    """True if nothing happened in the slot since the sample before (no counter moved)."""
    return not (
        sample.responses
        or sample.statuses
        or sample.cache_hits
        or sample.backoffs
        or sample.pauses
        or sample.failures
    )


def same_state(a: SlotSample, b: SlotSample) -> bool:
    """True if two samples show the slot in the same state (times aside)."""
    return (
        a.delay == b.delay
        and a.latency == b.latency
        and a.in_flight == b.in_flight
        and a.queued == b.queued
    )


class Series:
    """One slot's samples, oldest first, at most ``limit`` of them.

    A slot that does not change is sampled all the same, at every interval, and
    most slots of a crawl over many hosts are idle most of the time: a run of
    samples that repeat a quiet one (same state, nothing happened) is held as
    one entry, its count and the time of its last sample. Iterating gives every
    sample back, the repeats' times spread evenly over the run (the sampling
    moments inside it are not kept: they are about ``interval`` apart).
    """

    __slots__ = ("_entries", "size")

    def __init__(self) -> None:
        self._entries: deque[SlotSample | _Run] = deque()
        self.size = 0
        """Samples held, each repeat counted."""

    def add(self, sample: SlotSample, limit: int) -> None:
        """Add ``sample``, a change."""
        self._entries.append(sample)
        self.size += 1
        if self.size > limit:
            self._trim(limit)

    def add_or_repeat(self, sample: SlotSample, limit: int) -> None:
        """Add ``sample``, or a repeat if it is one of the quiet tail (a file that
        holds every sample as its own)."""
        if not (is_quiet(sample) and self.repeat(sample, 1, limit)):
            self.add(sample, limit)

    def repeat(self, sample: SlotSample, count: int, limit: int) -> bool:
        """Add ``count`` repeats of the quiet tail, the last at ``sample.time``, if
        ``sample`` is in the tail's state and the tail is quiet; else False."""
        if not self._entries:
            return False
        tail = self._entries[-1]
        if isinstance(tail, _Run):
            if not same_state(tail.head, sample):
                return False
            tail.count += count
            tail.last = sample.time
        elif is_quiet(tail) and same_state(tail, sample):
            self._entries[-1] = _Run(tail, count, sample.time)
        else:
            return False
        self.size += count
        self._trim(limit)
        return True

    def repeat_tail(self, time: float, limit: int) -> bool:
        """One more repeat of the tail at ``time`` if the tail is quiet (the caller
        knows the slot's state did not change since); else False."""
        tail = self._entries[-1]
        if isinstance(tail, _Run):
            tail.count += 1
            tail.last = time
        elif is_quiet(tail):
            self._entries[-1] = _Run(tail, 1, time)
        else:
            return False
        self.size += 1
        if self.size > limit:
            self._trim(limit)
        return True

    def _trim(self, limit: int) -> None:
        entries = self._entries
        while self.size > limit:
            first = entries[0]
            over = self.size - limit
            if not isinstance(first, _Run):
                entries.popleft()
                self.size -= 1
            elif over > first.count:
                entries.popleft()
                self.size -= first.count + 1
            else:  # the run's first samples go: it starts at its over-th repeat
                head = first.at(over)
                first.count -= over
                entries[0] = _Run(head, first.count, first.last) if first.count else head
                self.size -= over

    def __iter__(self) -> Iterator[SlotSample]:
        for entry in self._entries:
            if isinstance(entry, _Run):
                yield entry.head
                for i in range(1, entry.count + 1):
                    yield entry.at(i)
            else:
                yield entry

    def __reversed__(self) -> Iterator[SlotSample]:
        for entry in reversed(self._entries):
            if isinstance(entry, _Run):
                for i in range(entry.count, 0, -1):
                    yield entry.at(i)
                yield entry.head
            else:
                yield entry

    def __len__(self) -> int:
        return self.size

    @property
    def last_time(self) -> float:
        """The time of the newest sample."""
        tail = self._entries[-1]
        return tail.last if isinstance(tail, _Run) else tail.time

    def responses(self) -> int:
        """Responses over every sample held (a run's are none)."""
        return sum(e.responses for e in self._entries if not isinstance(e, _Run))

    def stored(self) -> Iterator[tuple[SlotSample, int, float]]:
        """Each entry as it is held: a sample, how many repeats of it follow, and
        the time of the last of them (the sample's own if none)."""
        for entry in self._entries:
            if isinstance(entry, _Run):
                yield entry.head, entry.count, entry.last
            else:
                yield entry, 0, entry.time

"""``autothrottle fetch``'s manners: each host's robots.txt, read once, through the throttle.

The rules it keeps (RFC 9309; docs/cli.md, "robots.txt"):

* each origin's ``/robots.txt`` is requested once per run, by the first URL of
  that origin, through the same throttled client as every other request (so it
  is paced, and teaches the slot); the origin's other URLs wait for it. The
  rules are kept while the origin's slot lives: those of a slot the throttle
  forgot (idle past its ``idle_timeout``) are let go of, and read again if
  the host comes back, so a crawl of millions of hosts holds the rules of its
  live ones, not of every host it met;
* 2xx: its rules are read with protego (which reads fractional delays and
  ``Request-rate``), matched against the user agent; at most 512 KiB are read;
* 4xx (no robots.txt): everything is allowed;
* 429, 5xx or no answer, after the fetch's retries: the host is "unreachable",
  and nothing is fetched from it (the RFC's "complete disallow");
* ``Crawl-delay: D`` and ``Request-rate: N/Ss`` make ``max(D, S/N)`` that host's
  ``min_delay`` in the throttle (``Throttle.set_host``);
* a 4xx that says there is none is no error of the host's: the throttle counts
  it as the response it is, and ``--chart`` leaves it out of its events
  (:class:`FetchTimeline`, which knows it by the mark on its request).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from urllib.parse import urlsplit

from protego import Protego

from autothrottle import HostSettings, Throttle, ThrottleEvent
from autothrottle.timeline import SlotSample, Timeline

from ._fetch_clients import FAILURES, Reply, Sender

__all__ = ["ROBOTS_BYTES", "FetchTimeline", "HostRules", "Robots"]

#: How much of a robots.txt is read (RFC 9309 asks crawlers to parse at least 500 KiB).
ROBOTS_BYTES = 512 * 1024

#: The fewest origins' rules held before the fetch looks for those whose slot is gone.
_LOOK_AT = 1024


@dataclass(frozen=True, slots=True)
class HostRules:
    """What one origin's robots.txt says, as far as the fetch is concerned."""

    origin: str
    parser: Protego | None = None
    unreachable: str | None = None
    floor: float | None = None

    def excluded(self, url: str, agent: str) -> str | None:
        """Why robots.txt keeps ``url`` from being fetched by ``agent``, or None."""
        if self.parser is None or self.parser.can_fetch(url, agent):
            return None
        return f"robots.txt of {self.origin} disallows it"


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: the scope of one robots.txt."""
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.rpartition('@')[2].lower()}"


def _error(exc: BaseException) -> str:
    text = str(exc)
    return (f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:200]


class Robots:
    """Every origin's rules, each read once; the floors they set on the throttle."""

    def __init__(
        self,
        sender: Sender,
        throttle: Throttle,
        agent: str,
        *,
        attempts: int,
        note: Callable[[str], None],
    ) -> None:
        self._sender = sender
        self._throttle = throttle
        self._agent = agent
        self._attempts = attempts
        self._note = note
        self._known: dict[str, asyncio.Future[HostRules]] = {}
        self._look_at = _LOOK_AT
        self._floors: dict[str, float] = {}
        self.requests = 0

    @property
    def floors(self) -> dict[str, float]:
        """Slot key to the min_delay a robots.txt set."""
        return dict(self._floors)

    async def rules(self, url: str) -> HostRules:
        """The rules of ``url``'s origin: read now by the first caller, awaited by the rest."""
        origin = origin_of(url)
        known = self._known.get(origin)
        if known is not None:
            return await known
        if len(self._known) >= self._look_at:
            self._let_go()
        future: asyncio.Future[HostRules] = asyncio.get_running_loop().create_future()
        self._known[origin] = future
        try:
            rules = await self._read(origin)
        except BaseException:
            self._known.pop(origin, None)  # cancelled: the next URL of the origin reads it again
            future.cancel()
            raise
        self._apply(url, rules)
        future.set_result(rules)
        return rules

    def _let_go(self) -> None:
        """Let go of the rules of origins whose slot the throttle forgot. Looked
        at when the origins held reach twice those kept at the last look: a new
        origin pays for it, never a URL of a known one."""
        live = {slot.key for slot in self._throttle.slots()}
        key_for = self._throttle.key_for
        self._known = {
            origin: future
            for origin, future in self._known.items()
            if not future.done() or key_for(f"{origin}/robots.txt") in live
        }
        self._look_at = max(_LOOK_AT, 2 * len(self._known))

    async def _read(self, origin: str) -> HostRules:
        problem = "no answer"
        for _ in range(self._attempts):
            try:
                reply = await self._ask(origin)
            except FAILURES as exc:
                self.requests += 1
                problem = _error(exc)
                continue
            self.requests += 1
            if 200 <= reply.status < 300:
                parser = Protego.parse(reply.head.decode("utf-8", "replace"))
                return HostRules(origin, parser, floor=self._floor(parser))
            if reply.status == 429 or reply.status >= 500:
                problem = f"status {reply.status}"
                continue
            return HostRules(origin)  # 4xx (none_found): there is none; everything is allowed
        return HostRules(origin, unreachable=f"robots.txt of {origin} unreachable ({problem})")

    async def _ask(self, origin: str) -> Reply:
        """One GET of ``origin``'s robots.txt, marked as such for the throttle's
        listeners (:class:`FetchTimeline`)."""
        asking = _ASKING.set(True)
        try:
            return await self._sender.get(f"{origin}/robots.txt", keep=ROBOTS_BYTES, store=False)
        finally:
            _ASKING.reset(asking)

    def _floor(self, parser: Protego) -> float | None:
        floors = []
        delay = parser.crawl_delay(self._agent)
        if delay is not None and delay > 0:
            floors.append(float(delay))
        rate = parser.request_rate(self._agent)
        if rate is not None and rate.requests > 0 and rate.seconds > 0:
            floors.append(rate.seconds / rate.requests)
        return max(floors) if floors else None

    def _apply(self, url: str, rules: HostRules) -> None:
        if rules.unreachable is not None:
            self._note(f"{rules.unreachable}: none of its URLs is fetched")
            return
        if rules.floor is None:
            return
        key = self._throttle.key_for(url)
        floor = max(rules.floor, self._floors.get(key, 0.0))
        self._floors[key] = floor
        config = self._throttle.config_for(key)
        settings = HostSettings(min_delay=floor, max_delay=max(config.max_delay, floor))
        self._throttle.set_host(key, settings)
        self._note(f"robots.txt of {rules.origin}: at most one request every {floor:g} s")


def none_found(status: int) -> bool:
    """Whether a robots.txt answered ``status`` says there is none (4xx, not 429)."""
    return 400 <= status < 500 and status != 429


#: True while the task it is read in asks for a robots.txt (:meth:`Robots._read`):
#: the mark the throttle's listeners see on that request's responses, and only on them.
_ASKING: ContextVar[bool] = ContextVar("autothrottle_fetch_robots", default=False)


class FetchTimeline(Timeline):
    """The fetch's timeline (``--chart``, ``--timeline``): the samples it keeps, and
    so the chart, leave out each robots.txt's answer that there is none (a 404, say).

    The throttle counts that answer like any response, and the ``--timeline``
    file keeps it as counted; a chart that drew it among the "other 4xx" would
    show every host without a robots.txt failing once, at its start. The
    throttle tells its listeners of each response inline, as it counts it, in
    the task that sent the request: the robots.txt request is marked there
    (:data:`_ASKING`), so the timeline hears exactly that response, on the
    slot that counted it. The next sample of that slot with that status holds
    it (the next but one, when a sample read 1,000 slots at a time read this
    one just before), and is kept without it.

    A note not taken by the second sample since it was heard is of a slot the
    throttle forgot meanwhile: such notes are let go of when the notes held
    reach twice those kept at the last look, so they stay those of the last
    two samples' slots.
    """

    def __init__(
        self, throttle: Throttle, *, interval: float, interval_per_slot: float, jsonl: str | None
    ) -> None:
        # Slot to the answers heard on it not yet left out: their status, and the
        # samples taken when each was heard.
        self._none: dict[str, list[tuple[int, int]]] = {}
        self._look_at = _LOOK_AT
        super().__init__(throttle, interval, interval_per_slot=interval_per_slot, jsonl=jsonl)
        self._stop_hearing = throttle.listen(self._hear)

    def _hear(self, event: ThrottleEvent) -> None:
        if event.status is None or not _ASKING.get() or not none_found(event.status):
            return
        if len(self._none) >= self._look_at:
            recent = self._takes - 1  # a note heard before this was through two samples
            self._none = {
                slot: kept
                for slot, notes in self._none.items()
                if (kept := [note for note in notes if note[1] >= recent])
            }
            self._look_at = max(_LOOK_AT, 2 * len(self._none))
        self._none.setdefault(event.slot, []).append((event.status, self._takes))

    def _as_kept(self, key: str, sample: SlotSample) -> SlotSample:
        """``sample`` less the robots.txt answers heard on slot ``key`` that it holds."""
        notes = self._none.pop(key, None)
        if notes is None:
            return sample
        statuses = dict(sample.statuses)
        left = []
        for note in notes:
            status = note[0]
            if statuses.get(status, 0) > 0:
                statuses[status] -= 1
                if not statuses[status]:
                    del statuses[status]
            else:
                left.append(note)  # counted after this sample read the slot
        if left:
            self._none[key] = left
        return sample if len(left) == len(notes) else dataclasses.replace(sample, statuses=statuses)

    def close(self) -> None:
        self._stop_hearing()
        super().close()

"""``autothrottle fetch``'s manners: each host's robots.txt, read once, through the throttle.

The rules it keeps (RFC 9309; docs/cli.md, "robots.txt"):

* each origin's ``/robots.txt`` is requested once per run, by the first URL of
  that origin, through the same throttled client as every other request (so it
  is paced, and teaches the slot); the origin's other URLs wait for it. The
  rules are kept while the origin's slot lives: those of a slot the throttle
  forgot (idle past its ``idle_timeout``) are let go of, and read again if
  the host comes back, so a crawl of millions of hosts holds the rules of its
  live ones, not of every host it met;
* redirects are followed, each hop paced by its own host, up to 5 (RFC 9309,
  2.3.1.2); a sixth means there is none, as a 4xx does; the rules found are
  the first origin's;
* 2xx: its rules are read with protego (which reads fractional delays and
  ``Request-rate``), matched against the user agent's product token (its
  first word, up to a ``/``: RFC 9309, 2.2.1); at most 512 KiB are read, never
  more (2.5), and within ``within`` seconds of its headers (the fetch's
  ``--timeout``: a body that trickles in is no answer), and a line the
  limit cut is dropped, not read as a shorter rule;
  a UTF-8 byte-order mark is no part of the first line;
* 4xx, 401 and 403 included (no robots.txt): everything is allowed (2.3.1.3);
* 429, 5xx or no answer, after the fetch's retries: the host is "unreachable",
  and nothing is fetched from it (the RFC's "complete disallow", 2.3.1.4);
* ``Crawl-delay: D`` and ``Request-rate: N/Ss`` make ``max(D, S/N)`` that host's
  ``min_delay`` in the throttle (``Throttle.set_host``), never below the one it
  had, and at most the throttle's ``max_pause``, the longest a site may make it
  wait by what it says;
* a 4xx that says there is none is no error of the host's: the throttle counts
  it as the response it is, and ``--chart`` leaves it out of its events
  (:class:`FetchTimeline`, which knows it by the mark on its request).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from protego import Protego

from autothrottle import HostSettings, Throttle, ThrottleEvent
from autothrottle.timeline import SlotSample, Timeline

from ._fetch_clients import FAILURES, Reply, Sender

__all__ = ["ROBOTS_BYTES", "FetchTimeline", "HostRules", "Robots"]

#: How much of a robots.txt is read (RFC 9309 asks crawlers to parse at least 500 KiB).
ROBOTS_BYTES = 512 * 1024

#: Redirects of a robots.txt followed (RFC 9309, 2.3.1.2: at least five).
ROBOTS_REDIRECTS = 5

#: The fewest origins' rules held before the fetch looks for those whose slot is gone.
_LOOK_AT = 1024

_REDIRECTS = frozenset({301, 302, 303, 307, 308})

#: A product token (RFC 9309, 2.2.1): letters, underscores and hyphens.
_TOKEN = re.compile(r"[A-Za-z_-]*")


def product_token(agent: str) -> str:
    """The name robots.txt groups are matched against: ``agent``'s first word, up to
    its ``/`` (``autothrottle`` of ``autothrottle/1.0 (fetch; +URL)``), lowercased.

    Matched against the whole header, a group named for a word of its comment
    or its URL (``fetch``, ``github``) would apply to the fetch, and its rules
    instead of those the site wrote for everyone. Empty when the agent starts
    with no such word: only the ``*`` group applies then.
    """
    match = _TOKEN.match(agent.strip())
    return match.group().lower() if match else ""


@dataclass(frozen=True, slots=True)
class HostRules:
    """What one origin's robots.txt says, as far as the fetch is concerned."""

    origin: str
    parser: Protego | None = None
    unreachable: str | None = None
    floor: float | None = None

    def excluded(self, url: str, agent: str) -> str | None:
        """Why robots.txt keeps ``url`` from being fetched by ``agent``, or None."""
        if self.parser is None or self.parser.can_fetch(url, product_token(agent)):
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
        within: float | None = None,
    ) -> None:
        self._sender = sender
        self._within = within
        self._throttle = throttle
        self._agent = product_token(agent)
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
            self._apply(url, rules)
        except BaseException as exc:
            # The next URL of the origin reads it again; those waiting now share the
            # outcome, so that none waits for a result that will never come.
            self._known.pop(origin, None)
            if isinstance(exc, Exception):
                future.set_exception(exc)
                future.exception()  # told to whoever awaits it; none may
            else:
                future.cancel()
            raise
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
                reply = await self._follow(f"{origin}/robots.txt")
            except FAILURES as exc:
                problem = _error(exc)
                continue
            if 200 <= reply.status < 300:
                parser = Protego.parse(_text(reply))
                return HostRules(origin, parser, floor=self._floor(parser))
            if reply.status == 429 or reply.status >= 500:
                problem = f"status {reply.status}"
                continue
            if reply.status in _REDIRECTS:
                self._note(
                    f"robots.txt of {origin}: still a redirect after {ROBOTS_REDIRECTS}, "
                    "taken as none (RFC 9309, 2.3.1.2)"
                )
            return HostRules(origin)  # 4xx (none_found): there is none; everything is allowed
        return HostRules(origin, unreachable=f"robots.txt of {origin} unreachable ({problem})")

    async def _follow(self, url: str) -> Reply:
        """The robots.txt at ``url``, through at most :data:`ROBOTS_REDIRECTS`
        redirects, each hop a request of its own through the throttle; past
        them, the last redirect."""
        for _ in range(ROBOTS_REDIRECTS):
            reply = await self._ask(url)
            if reply.status not in _REDIRECTS or not reply.location:
                return reply
            url = urljoin(url, reply.location)
            if urlsplit(url).scheme.lower() not in ("http", "https"):
                return reply
        return await self._ask(url)

    async def _ask(self, url: str) -> Reply:
        """One GET of a robots.txt, marked as such for the throttle's listeners
        (:class:`FetchTimeline`)."""
        asking = _ASKING.set(True)
        self.requests += 1
        try:
            return await self._sender.get(
                url,
                keep=ROBOTS_BYTES,
                store=False,
                only_head=True,
                follow=False,
                within=self._within,
            )
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
        most = self._throttle.max_pause
        if rules.floor > most:
            self._note(
                f"robots.txt of {rules.origin} asks for one request every {rules.floor:g} s: "
                f"held to {most:g} s (--max-pause)"
            )
        floor = max(min(rules.floor, most), self._floors.get(key, 0.0))
        self._floors[key] = floor
        config = self._throttle.config_for(key)
        floor = max(floor, config.min_delay)  # a floor of the user's own stays
        settings = HostSettings(min_delay=floor, max_delay=max(config.max_delay, floor))
        self._throttle.set_host(key, settings)
        self._note(f"robots.txt of {rules.origin}: at most one request every {floor:g} s")


def _text(reply: Reply) -> str:
    """A robots.txt's text: a line the size limit cut is dropped (``Disallow: /private``
    cut to ``Disallow: /`` would shut the whole site), and so is a UTF-8 byte-order
    mark, which would else make the first line an unknown field. Bytes that are
    not UTF-8 are replaced, as RFC 9309 (2.2) asks for UTF-8."""
    body = reply.head
    if reply.cut:
        body = body[: body.rfind(b"\n") + 1]
    return body.decode("utf-8-sig", "replace")


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

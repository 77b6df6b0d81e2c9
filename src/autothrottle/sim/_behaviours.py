"""What a simulated host does with a request: the behaviours and their runtime state.

A behaviour is an immutable, validated description (a frozen dataclass). The
server turns it into a private runtime object per host, which holds the mutable
state (workers, queue, token bucket) and answers requests. Keeping the two
apart lets one behaviour describe many hosts (``SimServer.many``) without any
of them sharing state.

Everything here is free of aiohttp: a runtime returns a :class:`Reply` and the
server turns it into an HTTP response.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import math
import random
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import ClassVar

from ._stats import Recorder, Ticket

__all__ = [
    "CDN",
    "Behaviour",
    "Capacity",
    "RateLimited",
    "SoftBlock",
    "VariableLatency",
    "is_blocked_page",
]

# --------------------------------------------------------------------------- checks


def _number(owner: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{owner}: {name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{owner}: {name} must be finite, got {value!r}")
    return float(value)


def _at_least(owner: str, name: str, value: object, minimum: float) -> None:
    if _number(owner, name, value) < minimum:
        raise ValueError(f"{owner}: {name} must be >= {minimum:g}, got {value!r}")


def _positive(owner: str, name: str, value: object) -> None:
    if _number(owner, name, value) <= 0:
        raise ValueError(f"{owner}: {name} must be > 0, got {value!r}")


def _fraction(owner: str, name: str, value: object, *, below_one: bool = False) -> None:
    x = _number(owner, name, value)
    if x < 0 or x > 1 or (below_one and x == 1):
        bound = "[0, 1)" if below_one else "[0, 1]"
        raise ValueError(f"{owner}: {name} must be in {bound}, got {value!r}")


def _count(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}: {name} must be an int >= 1, got {value!r}")


def _flag(owner: str, name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}: {name} must be a bool, got {value!r}")


# --------------------------------------------------------------------------- pages

#: Marker in every CAPTCHA page; what :func:`is_blocked_page` looks for.
BLOCK_MARKER = "autothrottle-sim-captcha"

_CAPTCHA_PAGE = (
    "<!doctype html><html><head><title>Just a moment...</title>"
    '<meta name="robots" content="noindex"></head><body>'
    "<h1>Please verify you are a human</h1>"
    "<p>Unusual traffic was detected from your network. "
    "Complete the challenge below to continue.</p>"
    f'<form id="{BLOCK_MARKER}" method="post" action="/challenge">'
    '<div class="captcha-box">[ ] I am not a robot</div>'
    '<button type="submit">Continue</button></form></body></html>'
).encode()
_BLOCK_MARKER_BYTES = BLOCK_MARKER.encode()


def is_blocked_page(body: bytes | str) -> bool:
    """Whether ``body`` is a soft-block (CAPTCHA) page from a :class:`SoftBlock` host.

    Soft blocks come with status 200 and arrive fast, so only the body tells
    them apart; a crawler under test calls this to classify what it got.
    """
    if isinstance(body, str):
        return BLOCK_MARKER in body
    return _BLOCK_MARKER_BYTES in body


def _page(host: str, target: str) -> bytes:
    """A small HTML page with a few links, so link-following crawlers have a site."""
    path = html.escape(target.split("?", 1)[0])
    tail = path.rstrip("/").rsplit("/", 1)[-1]
    n = int(tail) if tail.isdigit() and len(tail) < 12 else 0
    links = "".join(
        f'<li><a href="/page/{k}">page {k}</a></li>' for k in (n + 1, 2 * n + 2, 2 * n + 3)
    )
    return (
        f"<!doctype html><html><head><title>{host} {path}</title></head><body>"
        f"<h1>{path}</h1><p>A page of simulated host {host}.</p><ul>{links}</ul>"
        "</body></html>"
    ).encode()


def _share(salt: str, target: str) -> float:
    """A stable number in [0, 1) for a path: decides hit/miss, fast/slow per path."""
    digest = hashlib.blake2b(target.encode(), digest_size=8, person=salt.encode()).digest()
    return int.from_bytes(digest, "big") / 2.0**64


# --------------------------------------------------------------------------- runtime


@dataclass(frozen=True, slots=True)
class Reply:
    """What a runtime answers; the server makes the HTTP response."""

    status: int
    body: bytes
    outcome: str = "ok"
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str = "text/html"


class _Pool:
    """``workers`` workers and a strict FIFO queue in front of them.

    A released worker is handed straight to the oldest waiter, so a newcomer
    can never overtake the queue.
    """

    __slots__ = ("_free", "_waiters")

    def __init__(self, workers: int) -> None:
        self._free = workers
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self, tickets: tuple[tuple[Recorder, Ticket], ...]) -> None:
        now = time.monotonic()
        if self._free > 0 and not self._waiters:
            self._free -= 1
            for rec, ticket in tickets:
                rec.begin(ticket, now)
            return
        for rec, ticket in tickets:
            rec.wait(ticket, now)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # handed a worker just as we were cancelled: pass it on
            raise
        now = time.monotonic()
        for rec, ticket in tickets:
            rec.begin(ticket, now)

    def release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self._free += 1


class _Bucket:
    """A token bucket of ``rate`` tokens a second holding at most ``burst``."""

    __slots__ = ("_stamp", "_tokens", "burst", "quota", "rate", "window")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = burst
        # The advertised policy: ``quota`` requests per ``window`` whole seconds,
        # the window long enough to refill a full burst.
        self.window = max(1, math.ceil(burst / rate - 1e-9))
        self.quota = max(1, round(rate * self.window))
        self._tokens = float(burst)
        self._stamp = now

    def refill(self, now: float) -> None:
        self._tokens = float(self.burst)
        self._stamp = now

    def take(self, now: float) -> bool:
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        if self._tokens >= 1.0 - 1e-9:
            self._tokens = max(0.0, self._tokens - 1.0)
            return True
        return False

    def retry_after(self) -> int:
        """Whole seconds until a token is available, rounded up, at least 1."""
        return max(1, math.ceil((1.0 - self._tokens) / self.rate - 1e-9))

    def headers(self, *, limited: bool = False, style: str = "even") -> dict[str, str]:
        """The budget in the IETF draft's fields and the ``X-RateLimit-*`` family.

        ``style`` is how the server words "``r`` requests in the next ``t``
        seconds" (real servers differ; see :class:`RateLimited`):

        * ``"even"``: the tokens now plus what refills within the policy
          window, at most the quota, over the whole window: spent evenly, that
          is exactly the bucket's rate;
        * ``"refill"``: the whole tokens now, and ``t`` the seconds until the
          bucket is full again;
        * ``"eager"``: the whole tokens now, ``t=0`` while any remain and the
          seconds to the next token once empty.

        A refused request reads ``r=0`` until the next token, in every style.
        """
        tokens = self._tokens
        if limited:
            remaining, reset = 0, self.retry_after()
        elif style == "even":
            remaining = min(self.quota, math.floor(tokens + self.rate * self.window + 1e-9))
            reset = self.window
        else:
            remaining = math.floor(tokens + 1e-9)
            if style == "refill":
                reset = max(0, math.ceil((self.burst - tokens) / self.rate - 1e-9))
            else:
                reset = 0 if remaining else self.retry_after()
        return _budget_headers(self.quota, self.window, remaining, reset)


def _budget_headers(quota: int, window: int, remaining: int, reset: int) -> dict[str, str]:
    return {
        "RateLimit-Policy": f'"default";q={quota};w={window}',
        "RateLimit": f'"default";r={remaining};t={reset}',
        "X-RateLimit-Limit": str(quota),
        "X-RateLimit-Remaining": str(remaining),
        "X-RateLimit-Reset": str(reset),
    }


class _Window:
    """A fixed-window counter: ``quota`` requests per ``window`` seconds, reset on the edge."""

    __slots__ = ("_start", "_used", "quota", "window")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.window = max(1, math.ceil(burst / rate - 1e-9))
        self.quota = max(1, round(rate * self.window))
        self._start = now
        self._used = 0

    def refill(self, now: float) -> None:
        self._start = now
        self._used = 0

    def _roll(self, now: float) -> None:
        if now - self._start >= self.window:
            self._start += math.floor((now - self._start) / self.window) * self.window
            self._used = 0

    def take(self, now: float) -> bool:
        self._roll(now)
        if self._used < self.quota:
            self._used += 1
            return True
        return False

    def retry_after(self) -> int:
        """Whole seconds until the window resets, rounded up, at least 1."""
        left = self._start + self.window - time.monotonic()
        return max(1, math.ceil(left - 1e-9))

    def headers(self, *, limited: bool = False, style: str = "window") -> dict[str, str]:
        """``r`` what is left of the quota, ``t`` the seconds to the window's edge."""
        self._roll(time.monotonic())
        left = self._start + self.window - time.monotonic()
        reset = max(0, math.ceil(left - 1e-9))
        remaining = 0 if limited else self.quota - self._used
        return _budget_headers(self.quota, self.window, remaining, reset)


_HEADER_STYLES = ("even", "window", "refill", "eager")


class Runtime:
    """Per-host mutable state of a behaviour; subclasses answer requests."""

    origin: Recorder | None = None

    def __init__(self, host: str, rng: random.Random) -> None:
        self.host = host
        self.rng = rng

    async def serve(self, target: str, ticket: Ticket, rec: Recorder) -> Reply:
        raise NotImplementedError

    def reset(self, now: float) -> None:
        """Back to the initial state (full buckets); in-progress requests go on."""
        if self.origin is not None:
            self.origin.reset(now)

    def jittered(self, seconds: float, jitter: float) -> float:
        if jitter == 0 or seconds == 0:
            return seconds
        return seconds * self.rng.uniform(1.0 - jitter, 1.0 + jitter)


# --------------------------------------------------------------------------- behaviours


class Behaviour:
    """Base class of the behaviours; each is a frozen, validated dataclass."""

    __slots__ = ()

    kind: ClassVar[str] = ""

    @property
    def capacity(self) -> float:
        """The most successful responses per second the host can sustain."""
        raise NotImplementedError

    @property
    def spec(self) -> str:
        """The behaviour in command-line syntax (``kind:name=value,...``)."""
        parts = []
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, Capacity):
                parts.append(f"workers={value.workers}")
                parts.append(f"service_time={value.service_time:g}")
                parts.append(f"jitter={value.jitter:g}")
            elif isinstance(value, bool):
                parts.append(f"{f.name}={str(value).lower()}")
            elif isinstance(value, float):
                parts.append(f"{f.name}={value:g}")
            else:
                parts.append(f"{f.name}={value}")
        return f"{self.kind}:{','.join(parts)}"

    def new_runtime(self, host: str, rng: random.Random, now: float) -> Runtime:
        """A fresh per-host state for a server starting at ``now``: the server
        calls it once per host and run, so a restart begins with full buckets."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Capacity(Behaviour):
    """An origin with ``workers`` workers, each taking ``service_time`` s a request.

    Requests beyond ``workers`` wait in a FIFO queue, so latency grows with
    load the way an overloaded origin's does. Each service time is drawn
    uniformly from ``service_time * [1 - jitter, 1 + jitter]``. True capacity:
    ``workers / service_time`` requests a second.
    """

    workers: int
    service_time: float
    jitter: float = 0.1

    kind: ClassVar[str] = "capacity"

    def __post_init__(self) -> None:
        _count("Capacity", "workers", self.workers)
        _positive("Capacity", "service_time", self.service_time)
        _fraction("Capacity", "jitter", self.jitter, below_one=True)

    @property
    def capacity(self) -> float:
        return self.workers / self.service_time

    def new_runtime(self, host: str, rng: random.Random, now: float) -> Runtime:
        return _CapacityRuntime(self, host, rng)


class _CapacityRuntime(Runtime):
    def __init__(self, b: Capacity, host: str, rng: random.Random) -> None:
        super().__init__(host, rng)
        self.b = b
        self.pool = _Pool(b.workers)

    async def serve(self, target: str, ticket: Ticket, rec: Recorder) -> Reply:
        await self.pool.acquire(((rec, ticket),))
        try:
            await asyncio.sleep(self.jittered(self.b.service_time, self.b.jitter))
        finally:
            self.pool.release()
        return Reply(200, _page(self.host, target))


@dataclass(frozen=True, slots=True)
class RateLimited(Behaviour):
    """A token bucket of ``rate`` requests a second holding up to ``burst``.

    A request that finds a token is served in ``service_time`` seconds; one
    that does not gets an immediate 429, with ``Retry-After`` (whole seconds
    until a token is back, at least 1) if ``retry_after``. With ``headers``,
    every response carries the rate-limit headers: the IETF draft's
    ``RateLimit-Policy: "default";q=Q;w=W`` and ``RateLimit: "default";r=R;t=T``,
    and ``X-RateLimit-Limit/Remaining/Reset`` (``Q``, ``R``, ``T``), where the
    policy is ``Q`` requests per ``W`` whole seconds (``Q / W`` about ``rate``),
    ``R`` the requests allowed in the next ``T`` seconds: on a 200, the tokens
    now plus those that refill within the window ``T = W``, at most ``Q``
    (spent evenly, that is the bucket's rate); on a 429, 0 until the next token.
    ``header_style`` words the budget the way other servers do: ``"window"``
    is a fixed-window counter instead of a bucket (``Q`` per ``W`` seconds,
    reset on the window's edge, ``T`` the seconds to it); ``"refill"`` a
    bucket whose ``T`` is the time until it is full again and ``R`` its whole
    tokens; ``"eager"`` a bucket that sends ``T=0`` while tokens remain.
    True capacity: ``rate``.
    """

    rate: float
    burst: int = 1
    retry_after: bool = True
    headers: bool = True
    service_time: float = 0.01
    header_style: str = "even"

    kind: ClassVar[str] = "rate"

    def __post_init__(self) -> None:
        _positive("RateLimited", "rate", self.rate)
        _count("RateLimited", "burst", self.burst)
        _flag("RateLimited", "retry_after", self.retry_after)
        _flag("RateLimited", "headers", self.headers)
        _at_least("RateLimited", "service_time", self.service_time, 0.0)
        if self.header_style not in _HEADER_STYLES:
            raise ValueError(
                f"RateLimited: header_style must be one of {list(_HEADER_STYLES)}, "
                f"got {self.header_style!r}"
            )

    @property
    def capacity(self) -> float:
        return float(self.rate)

    def new_runtime(self, host: str, rng: random.Random, now: float) -> Runtime:
        return _RateRuntime(self, host, rng, now)


class _BucketRuntime(Runtime):
    """A token bucket in front of the pages; subclasses say how excess is answered."""

    def __init__(
        self, b: RateLimited | SoftBlock, host: str, rng: random.Random, now: float
    ) -> None:
        super().__init__(host, rng)
        self.service_time = b.service_time
        window = isinstance(b, RateLimited) and b.header_style == "window"
        self.bucket: _Bucket | _Window = (
            _Window(b.rate, b.burst, now) if window else _Bucket(b.rate, b.burst, now)
        )

    def reset(self, now: float) -> None:
        super().reset(now)
        self.bucket.refill(now)

    def refused(self) -> Reply:
        raise NotImplementedError

    def served_headers(self) -> dict[str, str]:
        return {}

    async def serve(self, target: str, ticket: Ticket, rec: Recorder) -> Reply:
        if not self.bucket.take(ticket.arrival):
            return self.refused()
        headers = self.served_headers()
        rec.begin(ticket, ticket.arrival)
        if self.service_time > 0:
            await asyncio.sleep(self.jittered(self.service_time, 0.1))
        return Reply(200, _page(self.host, target), "ok", headers)


class _RateRuntime(_BucketRuntime):
    def __init__(self, b: RateLimited, host: str, rng: random.Random, now: float) -> None:
        super().__init__(b, host, rng, now)
        self.b = b

    def refused(self) -> Reply:
        style = self.b.header_style
        headers = self.bucket.headers(limited=True, style=style) if self.b.headers else {}
        if self.b.retry_after:
            headers["Retry-After"] = str(self.bucket.retry_after())
        return Reply(429, b"Too Many Requests\n", "limited", headers, "text/plain")

    def served_headers(self) -> dict[str, str]:
        return self.bucket.headers(style=self.b.header_style) if self.b.headers else {}


@dataclass(frozen=True, slots=True)
class SoftBlock(Behaviour):
    """Like :class:`RateLimited`, but excess gets a fast 200 CAPTCHA page.

    Nothing in the status or headers says "blocked": a crawler has to look at
    the body (:func:`is_blocked_page`). Allowed requests take
    ``service_time`` seconds. True capacity: ``rate``.
    """

    rate: float
    burst: int = 1
    service_time: float = 0.01

    kind: ClassVar[str] = "softblock"

    def __post_init__(self) -> None:
        _positive("SoftBlock", "rate", self.rate)
        _count("SoftBlock", "burst", self.burst)
        _at_least("SoftBlock", "service_time", self.service_time, 0.0)

    @property
    def capacity(self) -> float:
        return float(self.rate)

    def new_runtime(self, host: str, rng: random.Random, now: float) -> Runtime:
        return _SoftBlockRuntime(self, host, rng, now)


class _SoftBlockRuntime(_BucketRuntime):
    def refused(self) -> Reply:
        return Reply(200, _CAPTCHA_PAGE, "blocked", {"Cache-Control": "no-store"})


@dataclass(frozen=True, slots=True)
class CDN(Behaviour):
    """A CDN edge in front of a slow origin of limited capacity.

    A fixed share ``hit_ratio`` of paths (chosen by a hash of path and query,
    so the same path always hits or always misses) are cache hits served by
    the edge in ``edge_time`` seconds with ``Age``, ``X-Cache: HIT`` and
    ``CF-Cache-Status: HIT``; the rest are misses (``MISS``) served by
    ``origin``, a :class:`Capacity`, with its workers and queue. The origin's
    load is recorded separately. True capacity: the total rate at which the
    misses alone fill the origin, ``origin.capacity / (1 - hit_ratio)``.
    """

    hit_ratio: float = 0.9
    origin: Capacity = Capacity(2, 0.2)
    edge_time: float = 0.005

    kind: ClassVar[str] = "cdn"

    def __post_init__(self) -> None:
        _fraction("CDN", "hit_ratio", self.hit_ratio)
        if not isinstance(self.origin, Capacity):
            raise ValueError(f"CDN: origin must be a Capacity, got {self.origin!r}")
        _at_least("CDN", "edge_time", self.edge_time, 0.0)

    @property
    def capacity(self) -> float:
        if self.hit_ratio >= 1:
            return math.inf
        return self.origin.capacity / (1.0 - self.hit_ratio)

    def is_hit(self, target: str) -> bool:
        """Whether ``target`` (path and query) is a cache hit on this CDN."""
        return _share("cdn-hit", target) < self.hit_ratio

    def new_runtime(self, host: str, rng: random.Random, now: float) -> Runtime:
        return _CDNRuntime(self, host, rng, now)


class _CDNRuntime(Runtime):
    def __init__(self, b: CDN, host: str, rng: random.Random, now: float) -> None:
        super().__init__(host, rng)
        self.b = b
        self.pool = _Pool(b.origin.workers)
        self.origin = Recorder(now)
        self.start = now

    async def serve(self, target: str, ticket: Ticket, rec: Recorder) -> Reply:
        b = self.b
        if b.is_hit(target):
            rec.begin(ticket, ticket.arrival)
            await asyncio.sleep(self.jittered(b.edge_time, b.origin.jitter))
            # Each path was cached at its own moment before the server started.
            cached_for = int(_share("cdn-age", target) * 3600 + (time.monotonic() - self.start))
            headers = {
                "Age": str(cached_for % 86400),
                "X-Cache": "HIT",
                "CF-Cache-Status": "HIT",
                "Cache-Control": "public, max-age=86400",
            }
            return Reply(200, _page(self.host, target), "ok", headers)
        origin = self.origin
        assert origin is not None
        oticket = origin.arrive(time.monotonic())
        try:
            await self.pool.acquire(((rec, ticket), (origin, oticket)))
            try:
                await asyncio.sleep(self.jittered(b.origin.service_time, b.origin.jitter))
            finally:
                self.pool.release()
        except BaseException:
            origin.abort(oticket, time.monotonic())
            raise
        origin.done(oticket, time.monotonic(), 200, "ok")
        headers = {
            "Age": "0",
            "X-Cache": "MISS",
            "CF-Cache-Status": "MISS",
            "Cache-Control": "public, max-age=86400",
        }
        return Reply(200, _page(self.host, target), "ok", headers)


@dataclass(frozen=True, slots=True)
class VariableLatency(Behaviour):
    """A backend whose pages are fast or slow, by path.

    A share ``slow_ratio`` of paths (by a hash of path and query) take
    ``slow_time`` seconds, the rest ``fast_time``, each with ``jitter``; all
    share ``workers`` workers and a FIFO queue. True capacity:
    ``workers`` over the mean service time.
    """

    fast_time: float = 0.03
    slow_time: float = 0.5
    slow_ratio: float = 0.2
    workers: int = 4
    jitter: float = 0.1

    kind: ClassVar[str] = "variable"

    def __post_init__(self) -> None:
        _at_least("VariableLatency", "fast_time", self.fast_time, 0.0)
        _positive("VariableLatency", "slow_time", self.slow_time)
        if self.slow_time < self.fast_time:
            raise ValueError(
                f"VariableLatency: slow_time must be >= fast_time ({self.fast_time!r}), "
                f"got {self.slow_time!r}"
            )
        _fraction("VariableLatency", "slow_ratio", self.slow_ratio)
        _count("VariableLatency", "workers", self.workers)
        _fraction("VariableLatency", "jitter", self.jitter, below_one=True)

    @property
    def mean_service_time(self) -> float:
        """Service time averaged over paths."""
        return self.slow_ratio * self.slow_time + (1.0 - self.slow_ratio) * self.fast_time

    @property
    def capacity(self) -> float:
        mean = self.mean_service_time
        return math.inf if mean == 0 else self.workers / mean

    def is_slow(self, target: str) -> bool:
        """Whether ``target`` (path and query) is one of the slow pages."""
        return _share("slow-path", target) < self.slow_ratio

    def new_runtime(self, host: str, rng: random.Random, now: float) -> Runtime:
        return _VariableRuntime(self, host, rng)


class _VariableRuntime(Runtime):
    def __init__(self, b: VariableLatency, host: str, rng: random.Random) -> None:
        super().__init__(host, rng)
        self.b = b
        self.pool = _Pool(b.workers)

    async def serve(self, target: str, ticket: Ticket, rec: Recorder) -> Reply:
        b = self.b
        seconds = b.slow_time if b.is_slow(target) else b.fast_time
        await self.pool.acquire(((rec, ticket),))
        try:
            await asyncio.sleep(self.jittered(seconds, b.jitter))
        finally:
            self.pool.release()
        return Reply(200, _page(self.host, target))

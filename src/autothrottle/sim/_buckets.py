"""The hosts bound by a rate: a token bucket, and the excess refused or blocked.

:class:`RateLimited` answers the excess with a 429 (``Retry-After``, and the
rate-limit headers in the wording a real server uses: :data:`HEADER_STYLES`);
:class:`SoftBlock` with a fast 200 CAPTCHA page. The budget is a
:class:`Bucket`, or for ``header_style="window"`` a fixed :class:`Window`.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass
from typing import ClassVar

from ._behaviours import Behaviour, Runtime, at_least, count, flag, positive
from ._pages import CAPTCHA_PAGE, Reply, page
from ._stats import Recorder, Ticket

__all__ = ["HEADER_STYLES", "Bucket", "RateLimited", "SoftBlock", "Window"]


class Bucket:
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


class Window:
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


HEADER_STYLES = ("even", "window", "refill", "eager")


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
        positive("RateLimited", "rate", self.rate)
        count("RateLimited", "burst", self.burst)
        flag("RateLimited", "retry_after", self.retry_after)
        flag("RateLimited", "headers", self.headers)
        at_least("RateLimited", "service_time", self.service_time, 0.0)
        if self.header_style not in HEADER_STYLES:
            raise ValueError(
                f"RateLimited: header_style must be one of {list(HEADER_STYLES)}, "
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
        self.bucket: Bucket | Window = (
            Window(b.rate, b.burst, now) if window else Bucket(b.rate, b.burst, now)
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
        return Reply(200, page(self.host, target), "ok", headers)


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
        positive("SoftBlock", "rate", self.rate)
        count("SoftBlock", "burst", self.burst)
        at_least("SoftBlock", "service_time", self.service_time, 0.0)

    @property
    def capacity(self) -> float:
        return float(self.rate)

    def new_runtime(self, host: str, rng: random.Random, now: float) -> Runtime:
        return _SoftBlockRuntime(self, host, rng, now)


class _SoftBlockRuntime(_BucketRuntime):
    def refused(self) -> Reply:
        return Reply(200, CAPTCHA_PAGE, "blocked", {"Cache-Control": "no-store"})

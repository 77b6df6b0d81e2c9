"""``autothrottle fetch``'s one URL: robots.txt, the attempts, blocks, and its output line.

The rules (docs/cli.md, "Rules it keeps"):

* a URL robots.txt disallows is not fetched: its line says why (``excluded``);
  a host whose robots.txt could not be read gets nothing fetched (``error``);
* at most ``retries + 1`` attempts, each through the throttle: another is made
  after a 429, a 503, a block or a failure, unless a stop came first (then the
  URL writes nothing, and a rerun fetches it);
* a block (``--block-status``, or a body matching ``--block-pattern``) backs the
  host off through ``Throttle.backoff`` (reason ``"blocked"``, once per burst, by the send time);
* a URL whose last attempt was a failure, a block, or still a 429/503 ends in
  an ``error``: that is what exit status 1 counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from autothrottle import Throttle, ThrottleTimeout

from ._fetch_clients import FAILURES, Reply, Sender
from ._fetch_options import FetchJob
from ._fetch_progress import Tally
from ._robots import Robots

__all__ = ["RETRY_STATUSES", "UrlFetch", "error_text", "problem", "record"]

#: Statuses worth another attempt: the host said "not now", not "no".
RETRY_STATUSES = frozenset({429, 503})

#: How much of a body a block pattern is matched against.
BLOCK_BYTES = 1024 * 1024

#: Characters no host name holds (RFC 3986's reg-name, and what IDNA refuses).
_NOT_IN_HOST = frozenset('<>"{}|\\^`%')
_SCHEMES = ("http", "https")


def problem(url: str) -> str | None:
    """Why ``url`` cannot be fetched at all, or None."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - it raises on a port out of range, as a client would later
    except ValueError as exc:
        return f"InvalidURL: {exc}"
    if not parts.scheme or (not parts.netloc and parts.path.split("/")[0].isdigit()):
        # "example.com/x", "localhost:8080/x" ("localhost" read as a scheme, 8080 a path)
        return "InvalidURL: no scheme: a URL starts with http:// or https://"
    if parts.scheme.lower() not in _SCHEMES:
        return f"InvalidURL: scheme must be http or https, got {parts.scheme!r}"
    if not host:
        return "InvalidURL: no host"
    if any(ch.isspace() or not ch.isprintable() or ch in _NOT_IN_HOST for ch in host):
        return f"InvalidURL: the host {host!r} holds a character no host name may"
    return None


def error_text(exc: BaseException) -> str:
    text = str(exc)
    name = type(exc).__name__
    return (f"{name}: {text}" if text else name)[:300]


def record(
    url: str,
    key: str,
    reply: Reply | None,
    error: str | None,
    attempts: int,
    seconds: float,
    *,
    blocked: int = 0,
    excluded: str | None = None,
) -> dict[str, Any]:
    """One output line."""
    return {
        "url": url,
        "final_url": reply.final_url if reply else None,
        "status": reply.status if reply else None,
        "bytes": reply.nbytes if reply else 0,
        "seconds": round(seconds, 4),
        "slot": key,
        "attempts": attempts,
        "blocked": blocked,
        "excluded": excluded,
        "error": error,
    }


class UrlFetch:
    """Fetches one URL at a time for the run (many at once: it keeps no per-URL state)."""

    def __init__(
        self,
        job: FetchJob,
        throttle: Throttle,
        sender: Sender,
        tally: Tally,
        robots: Robots | None,
        *,
        stopping: Callable[[], bool],
        note: Callable[[str], None],
    ) -> None:
        self.job = job
        self.throttle = throttle
        self.sender = sender
        self.tally = tally
        self.robots = robots
        self._stopping = stopping
        self._note = note
        self._keep = BLOCK_BYTES if job.block_pattern is not None else 0

    async def line(self, key: str, url: str) -> dict[str, Any] | None:
        """The URL's output line, or None if a stop came before the attempt it needed."""
        started = time.perf_counter()
        if self.robots is not None:
            rules = await self.robots.rules(url)
            if rules.unreachable is not None:
                return record(url, key, None, f"RobotsUnreachable: {rules.unreachable}", 0, 0.0)
            excluded = rules.excluded(url, self.job.agent)
            if excluded is not None:
                return record(url, key, None, None, 0, 0.0, excluded=excluded)
        return await self._attempts(key, url, started)

    def _blocked(self, reply: Reply) -> bool:
        job = self.job
        if reply.status in job.block_statuses:
            return True
        pattern = job.block_pattern
        return (
            pattern is not None
            and pattern.search(reply.head.decode("utf-8", "replace")) is not None
        )

    async def _attempts(self, key: str, url: str, started: float) -> dict[str, Any] | None:
        blocked = 0
        for attempt in range(1, self.job.retries + 2):
            reply: Reply | None = None
            error: str | None = None
            try:
                reply = await self.sender.get(url, keep=self._keep)
            except FAILURES as exc:
                error = error_text(exc)
                if isinstance(exc, ThrottleTimeout):
                    # --max-wait bounds the URL's wait for its turn: a retry would wait again.
                    self.tally.attempt(key, None)
                    break
            self.tally.attempt(key, reply.status if reply else None)
            block = reply is not None and self._blocked(reply)
            if block:
                assert reply is not None
                blocked += 1
                self.tally.block(key)
                self.throttle.backoff(url, sent_at=reply.sent_at, reason="blocked")
            elif reply is not None and reply.status not in RETRY_STATUSES:
                break
            if attempt <= self.job.retries and self._stopping():
                return None  # not finished: a rerun fetches it
        if reply is not None and error is None:
            error = _gave_up(reply, block, attempt)
        if error is not None:
            self._note(f"{url}: {error}")
        line = record(
            url, key, reply, error, attempt, time.perf_counter() - started, blocked=blocked
        )
        if self.job.bodies is not None:
            line["sha256"] = reply.sha256 if reply else None
        return line


def _gave_up(reply: Reply, block: bool, attempts: int) -> str | None:
    """The error of a URL whose last answer was still a refusal, or None."""
    tries = f"{attempts} attempt{'s' * (attempts != 1)}"
    if block:
        return f"Blocked: status {reply.status} after {tries} (--block-pattern, --block-status)"
    if reply.status in RETRY_STATUSES:
        return f"GaveUp: status {reply.status} after {tries}"
    return None

"""``autothrottle fetch``'s senders: one GET through the public httpx or aiohttp adapter.

A sender streams the body (to count it, and to a :class:`BodyStore` when
bodies are kept) so a large page never sits in memory whole; bytes are counted
after content decoding (gzip and the like), as a caller of either client sees them. It raises the
client's own exceptions; :data:`FAILURES` is what counts as a failed attempt.
Timeouts cover connecting and each read, never the wait for the slot's turn:
that wait is the throttle's to decide, however long a ``Retry-After`` makes it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

import aiohttp
import httpx

from autothrottle import Throttle, ThrottleInfo
from autothrottle.aiohttp import ThrottledSession, throttle_info
from autothrottle.httpx import AsyncThrottledClient

from ._fetch_io import BodyFile, BodyStore

__all__ = ["CLIENTS", "FAILURES", "Reply", "Sender", "open_sender"]

Client = Literal["httpx", "aiohttp"]
CLIENTS: tuple[Client, ...] = ("httpx", "aiohttp")

#: Exceptions that mean "this attempt failed", not "the program is broken".
FAILURES: tuple[type[BaseException], ...] = (
    httpx.HTTPError,
    httpx.InvalidURL,
    aiohttp.ClientError,
    TimeoutError,
    OSError,
    UnicodeError,
)

_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class Reply:
    """What one attempt got back.

    ``head`` is the body's first bytes when the caller asked to keep some (a
    robots.txt, a body to match a block pattern against); ``sent_at`` is when
    the throttle granted the request its turn (``ThrottleInfo.sent_at``), for a
    soft-block signal that counts once per burst. ``cut``: the body went on
    past ``head`` and was not read further (``only_head``); ``location``: the
    ``Location`` of a redirect not followed (``follow=False``).
    """

    status: int
    final_url: str
    nbytes: int
    sha256: str | None = None
    head: bytes = b""
    sent_at: float | None = None
    cut: bool = False
    location: str | None = None


class Sender(Protocol):
    async def get(
        self,
        url: str,
        *,
        keep: int = 0,
        store: bool = True,
        only_head: bool = False,
        follow: bool = True,
        within: float | None = None,
    ) -> Reply:
        """One GET; ``keep`` bytes of the body in ``Reply.head``; ``store``: to the
        bodies; ``only_head``: read no more of the body than ``keep`` (a robots.txt
        of gigabytes, or one that never ends, is read up to its limit); ``follow``:
        follow redirects (else a 3xx is the reply, with its ``location``);
        ``within``: seconds the body may take, from the response's headers
        (``TimeoutError`` past them; never the wait for the turn)."""
        ...


class _Body:
    """Counts a body's bytes, keeps its first ``keep``, and, with a store, writes them."""

    def __init__(self, store: BodyStore | None, keep: int, *, only_head: bool = False) -> None:
        self.nbytes = 0
        self._keep = keep
        self._only_head = only_head
        self._head = bytearray()
        self._file: BodyFile | None = store.open() if store is not None else None
        self.cut = False

    def add(self, chunk: bytes) -> bool:
        """Take ``chunk``; False once no more is to be read (``only_head``, head full)."""
        room = self._keep - len(self._head)
        if self._only_head and len(chunk) > room:
            self.cut = True
            chunk = chunk[: max(room, 0)]
        self.nbytes += len(chunk)
        if room > 0:
            self._head += chunk[:room]
        if self._file is not None:
            self._file.write(chunk)
        return not self.cut

    def reply(
        self, status: int, final_url: str, info: ThrottleInfo | None, location: str | None
    ) -> Reply:
        file, self._file = self._file, None
        digest = file.commit() if file is not None else None
        sent_at = info.sent_at if info is not None else None
        head = bytes(self._head)
        return Reply(status, final_url, self.nbytes, digest, head, sent_at, self.cut, location)

    def discard(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.discard()


class _HttpxSender:
    def __init__(self, client: httpx.AsyncClient, store: BodyStore | None) -> None:
        self._client = client
        self._store = store

    async def get(
        self,
        url: str,
        *,
        keep: int = 0,
        store: bool = True,
        only_head: bool = False,
        follow: bool = True,
        within: float | None = None,
    ) -> Reply:
        body = _Body(self._store if store else None, keep, only_head=only_head)
        try:
            async with self._client.stream("GET", url, follow_redirects=follow) as response:
                async with asyncio.timeout(within):
                    async for chunk in response.aiter_bytes(_CHUNK):
                        if not body.add(chunk):
                            break
                info = response.extensions.get("autothrottle")
                location = None if follow else response.headers.get("location")
                return body.reply(response.status_code, str(response.url), info, location)
        finally:
            body.discard()


class _AiohttpSender:
    def __init__(self, session: aiohttp.ClientSession, store: BodyStore | None) -> None:
        self._session = session
        self._store = store

    async def get(
        self,
        url: str,
        *,
        keep: int = 0,
        store: bool = True,
        only_head: bool = False,
        follow: bool = True,
        within: float | None = None,
    ) -> Reply:
        body = _Body(self._store if store else None, keep, only_head=only_head)
        try:
            async with self._session.get(url, allow_redirects=follow) as response:
                async with asyncio.timeout(within):
                    async for chunk in response.content.iter_chunked(_CHUNK):
                        if not body.add(chunk):
                            break
                info = throttle_info(response)
                location = None if follow else response.headers.get("Location")
                return body.reply(response.status, str(response.url), info, location)
        finally:
            body.discard()


@contextlib.asynccontextmanager
async def open_sender(
    client: Client,
    throttle: Throttle,
    *,
    io_timeout: float,
    connections: int,
    headers: Mapping[str, str],
    proxy: str | None = None,
    bodies: BodyStore | None = None,
) -> AsyncIterator[Sender]:
    """A sender on one shared client or session, closed on exit.

    ``io_timeout`` bounds connecting and each read; ``connections`` bounds
    open connections overall (the fetch's ``--max-in-flight``); redirects are
    followed, each hop paced by its own host's slot; every request carries
    ``headers`` and goes through ``proxy`` if given.
    """
    if client == "httpx":
        async with AsyncThrottledClient(
            throttle=throttle,
            follow_redirects=True,
            headers=dict(headers),
            proxy=proxy,
            timeout=httpx.Timeout(io_timeout, pool=None),
            # No pool limit (the fetch's tasks bound the requests under way) and
            # few idle connections: httpcore's pool scans its connections once per
            # connection and per queued request, so its cost grows with their
            # square (256 connections over 50 hosts: 10x slower than this).
            limits=httpx.Limits(
                max_connections=None, max_keepalive_connections=min(connections, 64)
            ),
        ) as http:
            yield _HttpxSender(http, bodies)
        return
    async with ThrottledSession(
        throttle=throttle,
        headers=dict(headers),
        proxy=proxy,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=io_timeout, sock_read=io_timeout),
        connector=aiohttp.TCPConnector(limit=connections, limit_per_host=0),
    ) as session:
        yield _AiohttpSender(session, bodies)

"""The demo's five sites, and the process of their own that serves them.

Each :class:`Site` is one simulated host (127.0.0.2 … 127.0.0.6), one of each
behaviour the simulator knows, and the client the demo crawls it with. An
:class:`autothrottle.sim.SimServer` serves them all in a child process
(:class:`Sites` asks it across its pipes).

The sites get a process of their own as a real site has a machine of its own:
sharing the crawler's event loop, a site answered only when the crawler let
it run, so on a busy machine the crawler's own work read as the site's
latency, and the throttle slowed down for a load the site never had.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import BinaryIO, Literal, cast

from autothrottle import HostSettings
from autothrottle.sim import (
    CDN,
    Behaviour,
    Capacity,
    HostStats,
    RateLimited,
    SimServer,
    SoftBlock,
    VariableLatency,
)

__all__ = ["Client", "Site", "Sites", "serve_sites", "sites"]

Client = Literal["httpx", "aiohttp"]


@dataclass(frozen=True)
class Site:
    """One simulated host of the demo and how it is crawled."""

    address: str
    name: str
    about: str
    behaviour: Behaviour
    client: Client
    settings: HostSettings | None = None


def sites() -> list[Site]:
    """The demo's hosts: one of each behaviour the simulator knows."""
    return [
        Site(
            "127.0.0.2",
            "slow origin",
            "4 workers, 50 ms a page; extra requests queue",
            Capacity(workers=4, service_time=0.05),
            "httpx",
        ),
        Site(
            "127.0.0.3",
            "rate-limited API",
            "10 requests/s (burst 5), told in RateLimit headers; excess gets 429",
            RateLimited(rate=10, burst=5),
            "aiohttp",
        ),
        Site(
            "127.0.0.4",
            "CAPTCHA wall",
            "5 requests/s; excess gets a 200 CAPTCHA page",
            SoftBlock(rate=5),
            "httpx",
        ),
        Site(
            "127.0.0.5",
            "CDN",
            "90 % cache hits (5 ms); misses go to a 2-worker origin (200 ms)",
            CDN(hit_ratio=0.9, origin=Capacity(workers=2, service_time=0.2), edge_time=0.005),
            "aiohttp",
        ),
        Site(
            "127.0.0.6",
            "mixed pages",
            "80 % fast pages (30 ms), 20 % slow (500 ms); 4 workers",
            VariableLatency(fast_time=0.03, slow_time=0.5, slow_ratio=0.2, workers=4),
            "httpx",
        ),
    ]


# -- the sites, in a process of their own ------------------------------------------------


def _write(stream: BinaryIO, message: object) -> None:
    """One message on a pipe: its pickle, after its length."""
    data = pickle.dumps(message)
    stream.write(len(data).to_bytes(8, "big") + data)
    stream.flush()


def _read(stream: BinaryIO) -> object:
    """One message from a pipe (``EOFError``: the pipe closed)."""
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError
    return pickle.loads(stream.read(int.from_bytes(head, "big")))


def serve_sites() -> None:
    """The child process (``python -c``): read the behaviours and seed from stdin,
    serve the sites, write their URLs; on "stats", their ground truth; on
    "stop", or stdin closed (the parent gone), end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the crawl, which ends us
    ask, tell = sys.stdin.buffer, sys.stdout.buffer
    behaviours, seed = cast(tuple[dict[str, Behaviour], int | None], _read(ask))

    async def serve() -> None:
        async with SimServer(behaviours, seed=seed) as server:
            _write(tell, {address: server.base_url(address) for address in behaviours})
            while True:
                try:
                    command = await asyncio.to_thread(_read, ask)
                except EOFError:
                    return
                if command != "stats":
                    return
                _write(tell, server.stats())

    asyncio.run(serve())


class Sites:
    """The simulated sites, served by a child process; :class:`SimServer`'s
    ``base_url`` and ``stats``, asked across its pipes."""

    def __init__(self, behaviours: Mapping[str, Behaviour], seed: int | None) -> None:
        self._behaviours = dict(behaviours)
        self._seed = seed
        self._urls: dict[str, str] = {}
        self._process: asyncio.subprocess.Process | None = None

    async def _send(self, message: object) -> None:
        assert self._process is not None and self._process.stdin is not None
        data = pickle.dumps(message)
        self._process.stdin.write(len(data).to_bytes(8, "big") + data)
        await self._process.stdin.drain()

    async def _receive(self) -> object:
        assert self._process is not None and self._process.stdout is not None
        try:
            head = await self._process.stdout.readexactly(8)
            return pickle.loads(await self._process.stdout.readexactly(int.from_bytes(head, "big")))
        except asyncio.IncompleteReadError:
            raise RuntimeError("the simulated sites' process ended") from None

    async def __aenter__(self) -> Sites:
        code = "from autothrottle.cli._demo_sites import serve_sites; serve_sites()"
        self._process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        await self._send((self._behaviours, self._seed))
        self._urls = cast(dict[str, str], await self._receive())
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        process = self._process
        if process is None:
            return
        with contextlib.suppress(OSError, ConnectionError):
            await self._send("stop")
        try:
            await asyncio.wait_for(process.wait(), 10.0)
        except TimeoutError:  # pragma: no cover - a stuck child
            process.kill()
            await process.wait()

    def base_url(self, address: str) -> str:
        return self._urls[address]

    async def stats(self) -> dict[str, HostStats]:
        await self._send("stats")
        return cast(dict[str, HostStats], await self._receive())

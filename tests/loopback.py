"""Real aiohttp.web servers on distinct loopback addresses, recording what arrives.

Each :class:`LoopbackHost` listens on its own address (127.0.0.2, 127.0.0.3 …)
so the throttle sees distinct hosts. It records, for every request, when it
arrived (``time.monotonic()``), its path and headers, and how many requests
were in service at once, so tests can assert pacing *at the server*.

Routes (all methods); on any of them, ``?wait=MS`` first waits MS milliseconds
and ``?h.NAME=VALUE`` adds response header NAME:


* ``/`` and any path not below: 200 ``ok``.
* ``/delay/{ms}``: waits ``ms`` milliseconds, then 200.
* ``/status/{code}``: answers with that status.
* ``/redirect?to=URL``: 302 to ``URL``.
* ``/stream/{chunks}/{ms}``: a chunked body of ``chunks`` pieces, ``ms`` apart.
* ``/close``: drops the connection without answering.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Arrival:
    path: str
    time: float
    headers: dict[str, str]


@dataclass
class LoopbackHost:
    address: str
    port: int = 0
    arrivals: list[Arrival] = field(default_factory=list)
    in_service: int = 0
    max_in_service: int = 0
    finished: list[float] = field(default_factory=list)

    @property
    def origin(self) -> str:
        return f"http://{self.address}:{self.port}"

    def url(self, path: str = "/") -> str:
        return self.origin + path

    def arrival_times(self) -> list[float]:
        return [a.time for a in self.arrivals]

    def gaps(self) -> list[float]:
        times = self.arrival_times()
        return [b - a for a, b in itertools.pairwise(times)]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.arrivals.append(Arrival(request.path, time.monotonic(), dict(request.headers)))
        self.in_service += 1
        self.max_in_service = max(self.max_in_service, self.in_service)
        try:
            return await self._respond(request)
        finally:
            self.in_service -= 1
            self.finished.append(time.monotonic())

    async def _respond(self, request: web.Request) -> web.StreamResponse:
        response = await self._route(request)
        for name, value in request.query.items():
            if name.startswith("h.") and not response.prepared:
                response.headers[name[2:]] = value
        return response

    async def _route(self, request: web.Request) -> web.StreamResponse:
        if "wait" in request.query:
            await asyncio.sleep(int(request.query["wait"]) / 1000)
        parts = [p for p in request.path.split("/") if p]
        if parts[:1] == ["delay"] and len(parts) == 2:
            await asyncio.sleep(int(parts[1]) / 1000)
            return web.Response(text="ok")
        if parts[:1] == ["status"] and len(parts) == 2:
            return web.Response(status=int(parts[1]), text="status")
        if parts[:1] == ["redirect"]:
            raise web.HTTPFound(request.query["to"])
        if parts[:1] == ["stream"] and len(parts) == 3:
            response = web.StreamResponse()
            await response.prepare(request)
            for _ in range(int(parts[1])):
                await response.write(b"x" * 16)
                await asyncio.sleep(int(parts[2]) / 1000)
            await response.write_eof()
            return response
        if parts[:1] == ["close"]:
            assert request.transport is not None
            request.transport.close()
            raise asyncio.CancelledError
        return web.Response(text="ok")


@asynccontextmanager
async def loopback_hosts(count: int = 2, *, first: int = 2) -> AsyncIterator[list[LoopbackHost]]:
    """Start ``count`` servers on 127.0.0.{first}, 127.0.0.{first + 1} …"""
    hosts: list[LoopbackHost] = []
    async with AsyncExitStack() as stack:
        for i in range(count):
            host = LoopbackHost(f"127.0.0.{first + i}")
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", host._handle)
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await runner.setup()
            stack.push_async_callback(runner.cleanup)
            site = web.TCPSite(runner, host.address, 0)
            await site.start()
            server = site._server
            assert isinstance(server, asyncio.base_events.Server)
            host.port = server.sockets[0].getsockname()[1]
            hosts.append(host)
        yield hosts


@contextmanager
def running_hosts(count: int, *, first: int = 2) -> Iterator[list[LoopbackHost]]:
    """Loopback hosts served by a loop in a background thread (for threaded clients)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop = asyncio.Event()
    hosts: list[LoopbackHost] = []

    async def serve() -> None:
        async with loopback_hosts(count, first=first) as started:
            hosts.extend(started)
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),))
    thread.start()
    assert ready.wait(30)
    try:
        yield hosts
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()

"""HTTPS and HTTP/2 servers on loopback addresses, with a handshake as slow as a test asks.

A :class:`TlsHost` listens on one loopback address (127.0.0.2, 127.0.0.3 …)
with a certificate of this module's own authority (``trustme``): HTTP/1.1
served by aiohttp.web (``kind="h1"``, the routes of ``loopback``), or HTTP/2
and HTTP/1.1 by hypercorn, chosen by ALPN (``kind="h2"``: ``/``,
``/delay/{ms}``, ``/stream/{chunks}/{ms}``; ``?status=N`` answers ``/`` with
status N). Each host has two ports:

* ``port``, a plain TCP front that holds each new connection for the next of
  the host's ``holds`` (milliseconds; :meth:`TlsHost.hold`) before relaying
  it to the server: the client's TLS handshake ends that much later, which
  the tests tell apart from the server's own time;
* ``direct_port``, the server itself.

The servers run in a process of their own at a real-time priority, as
``loopback``'s do and for the same reason: an arrival is stamped when the
request reaches the host, not when a busy client lets the server run. Each
arrival records its path, its time (``time.monotonic()``), the HTTP version
(``"1.1"``, ``"2"``) and the peer port the server saw, which tells one
connection from another.

:func:`trusting` is an SSL context that trusts the authority, :data:`CA_FILE`
its certificate as a file (for requests' ``verify=``). A client that does
not trust it fails the handshake with a certificate verification error. The
authority and its files are made when first asked for, not at import, and
removed when the test process exits.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import itertools
import json
import os
import shutil
import socket
import ssl
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import trustme

import loopback

NAMES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "localhost")
"""What the server certificate is good for."""

_SHARED = "AUTOTHROTTLE_TLS_FILES"  # the server process finds the test process's files there


@functools.cache
def _files() -> Path:
    """The authority and server certificate: made by the test process on first use
    (not at import: every process that imports this module, a pytest worker that
    runs no TLS test too, would make a directory), found by the server process
    where the test process's environment says."""
    given = os.environ.get(_SHARED)
    if given:
        return Path(given)
    files = Path(tempfile.mkdtemp(prefix="autothrottle-tls-"))
    # Gone when the test process ends (after its server process, ended at exit too).
    atexit.register(shutil.rmtree, files, ignore_errors=True)
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(files / "ca.pem"))
    ca.issue_cert(*NAMES).private_key_and_cert_chain_pem.write_to_path(str(files / "server.pem"))
    return files


CA_FILE: str
"""The authority's certificate as a file (for requests' ``verify=``); made on first use."""
SERVER_FILE: str
"""The server's certificate chain and key as a file; made on first use."""


def __getattr__(name: str) -> str:
    """:data:`CA_FILE` and :data:`SERVER_FILE`, each read the first time it is asked for."""
    if name == "CA_FILE":
        return str(_files() / "ca.pem")
    if name == "SERVER_FILE":
        return str(_files() / "server.pem")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def trusting() -> ssl.SSLContext:
    """A client SSL context that trusts this module's authority (and verifies names)."""
    return ssl.create_default_context(cafile=str(_files() / "ca.pem"))


# -- in the server process ------------------------------------------------------------


@dataclass
class _Host:
    """One address: a server, its front, and what reached it (lives in the server process)."""

    kind: str
    address: str
    holds: list[float] = field(default_factory=list)
    arrivals: list[dict[str, Any]] = field(default_factory=list)
    in_service: int = 0
    max_in_service: int = 0
    connections: int = 0  # accepted by the front
    port: int = 0
    direct_port: int = 0
    stop: list[Any] = field(default_factory=list)

    def arrived(self, path: str, version: str, peer: int) -> None:
        self.arrivals.append(
            {"path": path, "time": time.monotonic(), "version": version, "peer": peer}
        )
        self.in_service += 1
        self.max_in_service = max(self.max_in_service, self.in_service)

    async def route(self, path: str, query: dict[str, str], write: Any) -> None:
        """Answer ``path`` through ``write(status, chunk, more)``."""
        if "wait" in query:
            await asyncio.sleep(int(query["wait"]) / 1000)
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["delay"] and len(parts) == 2:
            await asyncio.sleep(int(parts[1]) / 1000)
        elif parts[:1] == ["stream"] and len(parts) == 3:
            for _ in range(int(parts[1])):
                await write(200, b"x" * 16, True)
                await asyncio.sleep(int(parts[2]) / 1000)
            await write(200, b"", False)
            return
        await write(int(query.get("status", 200)), b"ok", False)

    async def asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": message["type"] + ".complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.arrived(scope["path"], scope["http_version"], scope["client"][1])
        started = False

        async def write(status: int, chunk: bytes, more: bool) -> None:
            nonlocal started
            if not started:
                started = True
                await send({"type": "http.response.start", "status": status, "headers": []})
            await send({"type": "http.response.body", "body": chunk, "more_body": more})

        query = dict(p.split("=", 1) for p in scope["query_string"].decode().split("&") if p)
        try:
            await self.route(scope["path"], query, write)
        finally:
            self.in_service -= 1

    async def handle(self, request: Any) -> Any:  # aiohttp.web
        from aiohttp import web

        peer = request.transport.get_extra_info("peername")[1]
        self.arrived(request.path, "1.1", peer)
        response: Any = None

        async def write(status: int, chunk: bytes, more: bool) -> None:
            nonlocal response
            if response is None:
                if not more:
                    response = web.Response(status=status, body=chunk)
                    return
                response = web.StreamResponse(status=status)
                await response.prepare(request)
            await response.write(chunk)
            if not more:
                await response.write_eof()

        try:
            await self.route(request.path, dict(request.query), write)
        finally:
            self.in_service -= 1
        return response

    async def relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The front: hold the new connection, then pass bytes both ways."""
        self.connections += 1
        hold = self.holds.pop(0) if self.holds else 0.0
        try:
            await asyncio.sleep(hold / 1000)
            inner_reader, inner_writer = await asyncio.open_connection(
                self.address, self.direct_port
            )
        except (OSError, asyncio.CancelledError):
            writer.close()
            return

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while chunk := await source.read(65536):
                    sink.write(chunk)
                    await sink.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, inner_writer), pipe(inner_reader, writer))

    async def start(self) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(_files() / "server.pem")
        if self.kind == "h1":
            from aiohttp import web

            context.set_alpn_protocols(["http/1.1"])
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self.handle)
            runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
            await runner.setup()
            site = web.TCPSite(runner, self.address, 0, ssl_context=context)
            await site.start()
            self.direct_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.stop.append(runner.cleanup)
        else:
            from hypercorn.asyncio import serve
            from hypercorn.config import Config

            sock = socket.socket()
            sock.bind((self.address, 0))
            self.direct_port = sock.getsockname()[1]
            config = Config()
            config.bind = [f"fd://{sock.detach()}"]  # hypercorn's to close
            config.certfile = config.keyfile = str(_files() / "server.pem")
            config.alpn_protocols = ["h2", "http/1.1"]
            config.graceful_timeout = 0.1
            config.accesslog = config.errorlog = None
            done = asyncio.Event()
            task = asyncio.ensure_future(serve(self.asgi, config, shutdown_trigger=done.wait))  # type: ignore[arg-type]

            async def stop() -> None:
                done.set()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 5)

            self.stop.append(stop)
            await asyncio.sleep(0.05)  # hypercorn listens once its task has run
        front = await asyncio.start_server(self.relay, self.address, 0)
        self.port = front.sockets[0].getsockname()[1]

        async def close_front() -> None:
            front.close()
            with contextlib.suppress(Exception):
                front.close_clients()  # type: ignore[attr-defined]

        self.stop.insert(0, close_front)


class _Server:
    def __init__(self) -> None:
        self.hosts: dict[int, _Host] = {}
        self.ids = itertools.count()

    async def start(self, kind: str, address: str) -> list[int]:
        host = _Host(kind, address)
        await host.start()
        ident = next(self.ids)
        self.hosts[ident] = host
        return [ident, host.port, host.direct_port]

    async def stop(self, ident: int) -> None:
        for stop in self.hosts[ident].stop:
            await stop()

    async def hold(self, ident: int, holds: list[float]) -> None:
        self.hosts[ident].holds = list(holds)

    async def state(self, ident: int) -> dict[str, Any]:
        host = self.hosts[ident]
        return {
            "arrivals": host.arrivals,
            "in_service": host.in_service,
            "max_in_service": host.max_in_service,
            "connections": host.connections,
        }

    async def forget(self, ident: int) -> None:
        host = self.hosts[ident]
        host.arrivals.clear()
        host.max_in_service = host.in_service
        host.connections = 0

    async def answer(self, line: str) -> Any:
        command, *args = json.loads(line)
        return await getattr(self, command)(*args)


def _serve(commands: TextIO, replies: TextIO) -> None:
    """The server process: answer one JSON line per command until stdin closes."""
    loopback.run_promptly()
    loop = asyncio.new_event_loop()
    # A connection the client drops as a server stops cancels hypercorn's task
    # for it, which asyncio would print: nothing a test asked about.
    loop.set_exception_handler(
        lambda loop, context: (
            None
            if isinstance(context.get("exception"), asyncio.CancelledError)
            else loop.default_exception_handler(context)
        )
    )
    loopback.answer_lines(commands, replies, loop, _Server().answer)


# -- in the test process -----------------------------------------------------------


@functools.cache
def _process() -> loopback.ServerProcess:
    """The server process, told where the certificate files are (started on first use)."""
    return loopback.ServerProcess("tls", {_SHARED: str(_files())})


@dataclass
class TlsHost:
    """A server in the server process, as the tests see it: every read is fresh."""

    kind: str
    address: str
    port: int
    direct_port: int
    ident: int

    def url(self, path: str = "/", *, direct: bool = False) -> str:
        """``path`` on this host through its front (a handshake as slow as
        :meth:`hold` says), or ``direct`` to the server."""
        return f"https://{self.address}:{self.direct_port if direct else self.port}{path}"

    def hold(self, *milliseconds: float) -> None:
        """Hold the front's next connections these many ms each (then none)."""
        _process().ask("hold", self.ident, list(milliseconds))

    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = _process().ask("state", self.ident)
        return state

    @property
    def arrivals(self) -> list[dict[str, Any]]:
        return list(self._state()["arrivals"])

    def arrival_times(self) -> list[float]:
        return [a["time"] for a in self.arrivals]

    @property
    def max_in_service(self) -> int:
        return int(self._state()["max_in_service"])

    @property
    def in_service(self) -> int:
        return int(self._state()["in_service"])

    @property
    def connections(self) -> int:
        """Connections the front accepted."""
        return int(self._state()["connections"])

    def forget(self) -> None:
        """Start counting arrivals, connections and the most in service afresh."""
        _process().ask("forget", self.ident)


@contextmanager
def tls_host(kind: str = "h1", address: str = "127.0.0.2") -> Iterator[TlsHost]:
    """A ``kind`` server ("h1" or "h2") on ``address``, stopped at the end."""
    ident, port, direct_port = _process().ask("start", kind, address)
    try:
        yield TlsHost(kind, address, port, direct_port, ident)
    finally:
        _process().ask("stop", ident)

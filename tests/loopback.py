"""Real aiohttp.web servers on distinct loopback addresses, recording what arrives.

Each :class:`LoopbackHost` listens on its own address (127.0.0.2, 127.0.0.3 …)
so the throttle sees distinct hosts. It records, for every request, when it
arrived (``time.monotonic()``, one clock for every process on the machine),
its path and headers, and how many requests were in service at once, so tests
can assert pacing *at the server*.

The servers run in a process of their own, scheduled ahead of every ordinary
process where the system allows it (:func:`promptly`). A server sharing the
client's event loop, or its interpreter lock, stamps an arrival only when the
client lets it run: with two busy cores that was up to 25 ms late, and the
next gap read 25 ms short, a pacing fault that never happened on the wire.
In a process of its own, at an ordinary priority (even at nice -10), it was
still woken late: at load 5-12 the way from the client's write to the stamp
was under 1 ms for half the requests, over 5 ms for one in ten and up to
49 ms (a first gap read 168 ms for 200). At a real-time priority it was
1.2 ms at most (540 requests at the same loads): the stamp is taken when the
request reaches the host, as another machine would.
One process serves every test of a session; it leaves when the session does.

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
import atexit
import contextlib
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from aiohttp import web


@dataclass
class Arrival:
    path: str
    time: float
    headers: dict[str, str]


# -- scheduling ---------------------------------------------------------------------


SERVER = 2
"""The real-time priority of the server process: above :func:`promptly`'s default."""

_SCHEDULING = hasattr(os, "sched_getscheduler")


def promptly_on(priority: int) -> bool:
    """Schedule the calling thread, and the threads it starts, first-in first-out at
    the real-time ``priority``: ahead of every ordinary process, so a busy machine
    preempts it for no one of them. False where the system does not allow it
    (not Linux, not root): the thread is left as it was."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (AttributeError, OSError):  # no such call here, or not permitted
        return False
    return True


@contextmanager
def promptly(priority: int = 1) -> Iterator[bool]:
    """Run the calling thread ahead of every ordinary process while inside (see
    :func:`promptly_on`); yields whether it could.

    A test that asserts gaps at the host measures, beside the pacing, how soon
    the operating system ran the client from its wire turn to its write: on two
    busy cores (load 9-12) that way took over 20 ms for one request in a
    hundred and up to 60 ms, all of it in the run queue (a first gap of 181 ms
    for 200), with nothing late in the library. At a real-time priority it
    took 0.7 ms at most (240 requests): the way is the client's own. The thread
    should wait on I/O or timers, as an event loop does: spinning, it would
    hold a core.
    """
    before = (os.sched_getscheduler(0), os.sched_getparam(0)) if _SCHEDULING else None
    raised = promptly_on(priority)
    try:
        yield raised
    finally:
        if raised and before is not None:
            os.sched_setscheduler(0, *before)


# -- in the server process ------------------------------------------------------------


@dataclass
class _ServedHost:
    """One listening address and what reached it (lives in the server process)."""

    address: str
    port: int = 0
    arrivals: list[Arrival] = field(default_factory=list)
    in_service: int = 0
    max_in_service: int = 0
    finished: list[float] = field(default_factory=list)
    runner: web.AppRunner | None = None

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


class _Server:
    """The server process's side: starts and stops hosts, answers for their records."""

    def __init__(self) -> None:
        self.hosts: dict[int, _ServedHost] = {}
        self.ids = itertools.count()

    async def start(self, addresses: list[str]) -> list[list[Any]]:
        started = []
        for address in addresses:
            host = _ServedHost(address)
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", host._handle)
            # A handler still running at the stop serves a request its client gave
            # up: cancelled at once (aiohttp waits up to 60 s for it, the test too).
            host.runner = web.AppRunner(
                app, access_log=None, handle_signals=False, shutdown_timeout=0.1
            )
            await host.runner.setup()
            site = web.TCPSite(host.runner, address, 0)
            await site.start()
            server = site._server
            assert isinstance(server, asyncio.base_events.Server)
            host.port = server.sockets[0].getsockname()[1]
            ident = next(self.ids)
            self.hosts[ident] = host
            started.append([ident, host.port])
        return started

    async def stop(self, idents: list[int]) -> None:
        for ident in idents:  # the record stays: tests read it after the server stops
            host = self.hosts[ident]
            assert host.runner is not None
            await host.runner.cleanup()
            host.runner = None

    async def state(self, ident: int) -> dict[str, Any]:
        host = self.hosts[ident]
        return {
            "arrivals": [asdict(a) for a in host.arrivals],
            "in_service": host.in_service,
            "max_in_service": host.max_in_service,
            "finished": host.finished,
        }

    async def forget(self, ident: int) -> None:
        self.hosts[ident].arrivals.clear()

    async def answer(self, line: str) -> Any:
        command, *args = json.loads(line)
        return await getattr(self, command)(*args)


RUN_ALONE = 1.0
"""Seconds of processor the server process may take at its real-time priority
without once waiting (in the selector, on stdin): past it the kernel ends the
process, and the tests see ``server process died``."""


def run_promptly() -> None:
    """A server process ahead of its clients, and bounded there.

    Ahead of the clients (a test's own thread, at most SERVER - 1): woken by a
    request, the server stamps it before the client that wrote it runs on.
    Nothing here spins: the loop waits in its selector, the reader on stdin,
    and a request's own work is bounded (the longest, /stream, sleeps between
    its pieces). Should that ever break, a spinning real-time process would
    hold a core from every ordinary one (the kernel's real-time share leaves
    them 5 %), so the kernel's limit on unbroken real-time work ends it first.
    """
    if promptly_on(SERVER):  # Linux, so the limit is there too
        import resource

        microseconds = int(RUN_ALONE * 1_000_000)
        resource.setrlimit(resource.RLIMIT_RTTIME, (microseconds, microseconds))
    else:
        with contextlib.suppress(OSError):
            os.nice(-10)  # the most an ordinary process may ask for


def answer_lines(
    commands: TextIO,
    replies: TextIO,
    loop: asyncio.AbstractEventLoop,
    answer: Callable[[str], Coroutine[Any, Any, Any]],
) -> None:
    """A server process's main loop: ``answer`` one JSON line per command, on
    ``loop``, until ``commands`` closes; an error goes back to the test that asked."""

    def read() -> None:
        for line in commands:
            future = asyncio.run_coroutine_threadsafe(answer(line), loop)
            try:
                reply: Any = {"ok": future.result(60)}
            except Exception as error:  # reported to the test that asked
                reply = {"error": repr(error)}
            replies.write(json.dumps(reply) + "\n")
            replies.flush()
        loop.call_soon_threadsafe(loop.stop)

    threading.Thread(target=read, daemon=True).start()
    loop.run_forever()


def _serve(commands: TextIO, replies: TextIO) -> None:
    """The server process: answer one JSON line per command until stdin closes."""
    run_promptly()
    loop = asyncio.new_event_loop()
    answer_lines(commands, replies, loop, _Server().answer)


# -- in the test process -----------------------------------------------------------


class ServerProcess:
    """The test process's end of a server process (``module``'s ``_serve``):
    one per session, started on first use, ended at exit."""

    def __init__(self, module: str, env: dict[str, str] | None = None) -> None:
        self.module = module
        self.env = env or {}
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None

    def ask(self, command: str, *args: Any) -> Any:
        with self._lock:
            process = self._process
            if process is None or process.poll() is not None:
                process = self._process = self._spawn()
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(json.dumps([command, *args]) + "\n")
            process.stdin.flush()
            reply = json.loads(process.stdout.readline() or '{"error": "server process died"}')
        if "error" in reply:
            raise RuntimeError(f"{self.module} server: {command}: {reply['error']}")
        return reply["ok"]

    def _spawn(self) -> subprocess.Popen[str]:
        here = str(Path(__file__).resolve().parent)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]),
            **self.env,
        }
        code = f"import sys, {self.module}; {self.module}._serve(sys.stdin, sys.stdout)"
        process = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        atexit.register(self._end, process)
        return process

    @staticmethod
    def _end(process: subprocess.Popen[str]) -> None:
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        if process.stdout is not None:  # left open, it warns at the interpreter's exit
            process.stdout.close()


_PROCESS = ServerProcess("loopback")


@dataclass
class LoopbackHost:
    """A server in the server process, as the tests see it: every read is fresh."""

    address: str
    port: int
    ident: int

    @property
    def origin(self) -> str:
        return f"http://{self.address}:{self.port}"

    def url(self, path: str = "/") -> str:
        return self.origin + path

    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = _PROCESS.ask("state", self.ident)
        return state

    @property
    def arrivals(self) -> list[Arrival]:
        return [Arrival(**a) for a in self._state()["arrivals"]]

    @property
    def in_service(self) -> int:
        return int(self._state()["in_service"])

    @property
    def max_in_service(self) -> int:
        return int(self._state()["max_in_service"])

    @property
    def finished(self) -> list[float]:
        return list(self._state()["finished"])

    def forget_arrivals(self) -> None:
        """Start counting arrivals afresh (after a warm-up request, say)."""
        _PROCESS.ask("forget", self.ident)

    def arrival_times(self) -> list[float]:
        return [a.time for a in self.arrivals]

    def gaps(self) -> list[float]:
        times = self.arrival_times()
        return [b - a for a, b in itertools.pairwise(times)]


def _start(count: int, first: int) -> list[LoopbackHost]:
    addresses = [f"127.0.0.{first + i}" for i in range(count)]
    started = _PROCESS.ask("start", addresses)
    return [
        LoopbackHost(address, port, ident)
        for address, (ident, port) in zip(addresses, started, strict=True)
    ]


@asynccontextmanager
async def loopback_hosts(count: int = 2, *, first: int = 2) -> AsyncIterator[list[LoopbackHost]]:
    """Start ``count`` servers on 127.0.0.{first}, 127.0.0.{first + 1} …"""
    hosts = _start(count, first)
    try:
        yield hosts
    finally:
        _PROCESS.ask("stop", [host.ident for host in hosts])


@contextmanager
def running_hosts(count: int, *, first: int = 2) -> Iterator[list[LoopbackHost]]:
    """:func:`loopback_hosts` for tests without an event loop of their own (threads)."""
    hosts = _start(count, first)
    try:
        yield hosts
    finally:
        _PROCESS.ask("stop", [host.ident for host in hosts])


@asynccontextmanager
async def served_here(addresses: list[str], app: web.Application) -> AsyncIterator[list[str]]:
    """``app`` served in this process on each of ``addresses`` (a free port each);
    their base URLs. For the tests that need a hundred hosts cheaply, or that
    read what the server saw as it happens; :func:`loopback_hosts` serves from
    a process of its own, whose record of arrivals an event loop standing still
    on this side cannot delay.

    A handler still running when the block ends serves a request its client
    gave up (the clients are closed by then): it is cancelled at once, not
    waited for (aiohttp waits up to 60 s; a test's 5-s answer, 5 s)."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    try:
        urls = []
        for address in addresses:
            site = web.TCPSite(runner, address, 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            urls.append(f"http://{address}:{port}/")
        yield urls
    finally:
        await runner.cleanup()

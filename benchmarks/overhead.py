"""Overhead: requests/s through raw httpx and aiohttp vs the same clients throttled.

Run with ``python benchmarks/overhead.py`` (about 1.5 minutes; ``--quick`` for
a rough figure in ~30 s; ``--breakdown`` adds the variants that say where the
adapters' cost goes). Loopback only.

One aiohttp.web server runs in a separate process (so client and server do not
share an event loop) and answers ``GET /`` with a small body at once. In the
client process, ``--concurrency`` tasks share one client and send requests back
to back for a fixed time. Against a server that does no work, the client's own
CPU is the bottleneck, so this is the harshest setting for the ratio: any real
site's latency would hide the adapter's cost. The variants:

* ``httpx``: ``httpx.AsyncClient()``; ``httpx + AsyncThrottledClient``.
* ``aiohttp``: ``aiohttp.ClientSession()``; ``aiohttp + ThrottledSession``
  (the throttle's middleware, its connector hook and the TraceConfig that
  reads ``trace_request_ctx`` options); the same with
  ``request_options=False`` (no TraceConfig); ``aiohttp + middleware
  only``: ``ClientSession(middlewares=(throttle_middleware(t),))`` without the
  TraceConfig (documented: latency then includes connecting and pool waits,
  and ``trace_request_ctx`` options are not read).

The throttle is ``Throttle(start_delay=0, min_delay=0, max_delay=0,
max_concurrency=10**6, policy=AutoThrottlePolicy())``: zero delay
(``max_delay=0`` clamps whatever the policy computes, so every response still
runs the whole observe path: header reading, the policy, the clamp) and a cap
never reached. Every request still passes the throttle's gate, takes and
releases a lease, and is timed. ``--policy adaptive`` measures ``Throttle()``'s
default policy instead, which caps requests in flight at a limit of its own:
against a zero-work server the concurrent tasks then queue in the gate, which
is its pacing at work, not overhead (one request at a time, as
``--instructions`` sends them, never queues).

Rounds interleave the variants of one client in mirrored order (A B C C B A,
reversed every other round), so background load and drift hit all alike. The
table gives the median requests/s over half-rounds, the median per-round
ratio to raw, and the client process's CPU time per request
(``time.process_time``): CPU per request is disturbed far less by background
load than a wall-clock rate, and its difference is the adapter's own cost.

Goals (printed, each met or missed, for the lead to rerun on a quiet machine):
added CPU per request at most 12 µs on either client; against a zero-work
server, throughput at least 0.85 of raw aiohttp's and 0.97 of raw httpx's;
with a server that takes 1 ms or more (``--server-delay 1``), at least 0.99 of
either. The breakdown beside them: the engine alone (in-process, the
throttle's calls as the adapters make them: the turn, the wire turn through
``free_exchange`` and ``Exchange.wire_now``, the response observed and
released, with the client's own header type), the adapter (the rest of the
added CPU), and the total.

Wall-clock rates and CPU times swing with other work on the machine.
``--instructions`` counts instructions instead (valgrind's callgrind, one
request at a time, the difference between two run lengths so start-up
cancels), which load does not change: use it to compare two versions of the
code. It takes several minutes. ``--bytecodes`` says where the added cost is, by
function: the bytecodes each runs and the calls made of it a request
(``sys.settrace`` over warm requests one at a time, throttled minus raw).
``--tasks 8`` counts the same with eight
concurrent tasks: with ``--policy adaptive`` they queue in the gate, so the
waiting loop's cost (the driver's wake-ups) is counted too.

``--count-engine N`` counts the engine alone quickly, for an A/B of a change
to it: N warm requests a client under callgrind, counted only inside
``sys.call_tracing`` (``--toggle-collect=sys_call_tracing``: start-up,
imports and warm-up are never counted, so one run says the figure, no
difference of two), about 20 s a client. It prints instructions a request
and which tree's ``autothrottle`` it counted: run it once with
``PYTHONPATH=/tmp/base/src`` (a ``git worktree`` of the base, acf252f or
later: the path calls ``free_exchange``) and once without.
``PYTHONHASHSEED`` is 0 unless set. It counts the path ``--instructions``'
engine column counts, and agrees with it within 50 instructions.

``--smoke`` makes the chosen mode as short as it goes: one round of 0.2 s
(0.1 s of warm-up); with ``--instructions``, 2 and 4 requests a count (still six
runs under valgrind a client, about half a minute each). Its figures mean
nothing: it is what the test suite runs to keep the benchmark working.

httpcore calls ``import sniffio`` on every request; anyio >= 4.12 no longer
installs sniffio, and a failing import searches ``sys.path`` each time
(~0.3 ms here), which would slow raw httpx and flatter the ratio. Unless
``--no-sniffio-stub`` is given, a stub ``sniffio`` module answering "asyncio"
is put in ``sys.modules`` so httpx runs at the speed it has with sniffio
installed.

``--body-bytes N`` makes the server send a body of N bytes that does not
arrive with the headers, as most real pages' do not: the headers first, the
body 20 ms later (``BODY_PAUSE``: a client slowed by valgrind has read the
headers by then). A throttled aiohttp response then holds its slot until the
body ends (the adapter's hold path), which the default ~120-byte body, read
with its headers, never takes. The aiohttp figures say how many bodies came
after their headers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import multiprocessing
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Awaitable, Callable, Coroutine
from multiprocessing.connection import Connection
from time import perf_counter
from typing import TYPE_CHECKING, Any

if not sys.stdout.isatty():
    os.environ.setdefault("COLUMNS", "160")  # rich's tables: no wrapping when piped

if "--no-sniffio-stub" not in sys.argv and "sniffio" not in sys.modules:
    try:
        import sniffio  # noqa: F401
    except ImportError:
        sys.modules["sniffio"] = types.SimpleNamespace(  # type: ignore[assignment]
            current_async_library=lambda: "asyncio"
        )
        SNIFFIO = "stub"
    else:
        SNIFFIO = "installed"
else:
    SNIFFIO = "absent"

from _bytecodes import BytecodeCount

from autothrottle import AdaptiveConcurrencyPolicy, AutoThrottlePolicy, Throttle
from autothrottle._exchange import Exchange, free_exchange

if TYPE_CHECKING:
    # The clients, their adapters and _common (which imports aiohttp) are
    # imported where they are used: ``--count-engine``'s child, started under
    # callgrind, needs none of them, and importing them there took most of its
    # minute or more.
    import aiohttp
    import httpx

BODY = b"<html><body>ok</body></html>\n" * 4  # ~120 bytes
GOAL_ADDED_US = 12.0
"""The most CPU a throttled request may add, on either client."""
GOAL_RATIO = {"aiohttp": 0.85, "httpx": 0.97}
"""Least throughput of the throttled client over the raw one, zero-work server."""
GOAL_RATIO_SLOW = 0.99
"""The same against a server that takes 1 ms or more."""
BODY_PAUSE = 0.02
"""With ``--body-bytes``: seconds between the headers and the body."""
BODY_BYTES = [0]
"""This run's ``--body-bytes`` (0: the small body, sent with the headers)."""
HELD = [0, 0]
"""With ``--body-bytes``: aiohttp responses whose body had not arrived with
their headers, and responses, so far."""

# -- the server (its own process) --------------------------------------------------------


def _serve(conn: Connection, delay: float, body_bytes: int = 0) -> None:
    """Serve ``GET /`` on 127.0.0.1 until the parent says stop (or goes away)."""
    from aiohttp import web

    async def index(request: web.Request) -> web.Response:
        if delay > 0:
            await asyncio.sleep(delay)
        return web.Response(body=BODY, content_type="text/html")

    body = b"x" * body_bytes

    async def later(request: web.Request) -> web.StreamResponse:
        """The headers at once (a StreamResponse sends them at ``prepare``),
        the body after ``BODY_PAUSE``."""
        if delay > 0:
            await asyncio.sleep(delay)
        response = web.StreamResponse(headers={"Content-Type": "text/html"})
        response.content_length = body_bytes
        await response.prepare(request)
        await asyncio.sleep(BODY_PAUSE)
        await response.write(body)
        await response.write_eof()
        return response

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/", later if body_bytes else index)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        server = site._server
        assert server is not None and server.sockets
        conn.send(server.sockets[0].getsockname()[1])
        # Block in a thread until the parent writes or closes the pipe.
        with contextlib.suppress(EOFError, OSError):
            await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        await runner.cleanup()

    asyncio.run(main())


class ServerProcess:
    """The loopback server in a child process; ``url`` once started."""

    def __init__(self, delay: float = 0.0, body_bytes: int = 0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, delay, body_bytes), daemon=True)
        self._proc.start()
        child.close()
        try:
            if not self._conn.poll(30):
                raise RuntimeError("the benchmark server did not start within 30 s")
            self.url = f"http://127.0.0.1:{self._conn.recv()}/"
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.send("stop")
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)


# -- the clients -------------------------------------------------------------------------


POLICIES = {"autothrottle": AutoThrottlePolicy, "adaptive": AdaptiveConcurrencyPolicy}
"""``--policy``: AutoThrottle's rule keeps the cap out of reach; the adaptive
policy (``Throttle()``'s default) caps requests in flight at its own limit,
and against a zero-work server 8 tasks then wait in the gate's queue."""

POLICY = ["autothrottle"]
"""The policy of this run's throttles (set from ``--policy``)."""


def _throttle() -> Throttle:
    return Throttle(
        start_delay=0.0,
        min_delay=0.0,
        max_delay=0.0,
        max_concurrency=10**6,
        policy=POLICIES[POLICY[0]](),
    )


Fetch = Callable[[], Awaitable[None]]


async def _noop_middleware(
    request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
) -> aiohttp.ClientResponse:
    return await handler(request)


def _noop_transport(inner: httpx.AsyncBaseTransport, trace: bool) -> httpx.AsyncBaseTransport:
    """A wrapping transport that does nothing (optionally sets a trace callback)."""
    import httpx

    class _NoopTransport(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if trace:

                async def callback(name: str, info: dict[str, Any]) -> None:
                    return None

                request.extensions = {**request.extensions, "trace": callback}
            return await inner.handle_async_request(request)

        async def aclose(self) -> None:
            await inner.aclose()

    return _NoopTransport()


class Variant:
    """One client setup: opened once, measured in several rounds."""

    def __init__(self, name: str, client: str, kind: str) -> None:
        self.name = name
        self.client = client
        self.kind = kind
        self.rates: list[float] = []
        self.cpu_us: list[float] = []
        self.throttle: Throttle | None = None
        self._stack = contextlib.AsyncExitStack()
        self.fetch: Fetch | None = None

    async def open(self, url: str, concurrency: int) -> None:
        import aiohttp
        import httpx

        from autothrottle.aiohttp import ThrottledSession, throttle_middleware
        from autothrottle.httpx import AsyncThrottledClient

        limit = concurrency * 2
        if self.client == "httpx":
            pool = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
            if self.kind == "throttled":
                self.throttle = _throttle()
                hx: httpx.AsyncClient = AsyncThrottledClient(throttle=self.throttle, limits=pool)
            elif self.kind in ("noop", "noop+trace"):
                inner = httpx.AsyncHTTPTransport(limits=pool)
                transport = _noop_transport(inner, trace=self.kind == "noop+trace")
                hx = httpx.AsyncClient(transport=transport)
            else:
                hx = httpx.AsyncClient(limits=pool)
            await self._stack.enter_async_context(hx)

            async def fetch_httpx() -> None:
                response = await hx.get(url)
                if response.status_code != 200:
                    raise RuntimeError(f"unexpected status {response.status_code}")

            self.fetch = fetch_httpx
        else:
            connector = aiohttp.TCPConnector(limit=limit)
            if self.kind == "throttled":
                self.throttle = _throttle()
                session = ThrottledSession(throttle=self.throttle, connector=connector)
            elif self.kind == "no-options":
                self.throttle = _throttle()
                session = ThrottledSession(
                    throttle=self.throttle, connector=connector, request_options=False
                )
            elif self.kind == "middleware":
                self.throttle = _throttle()
                session = aiohttp.ClientSession(
                    connector=connector, middlewares=(throttle_middleware(self.throttle),)
                )
            elif self.kind == "noop":
                session = aiohttp.ClientSession(
                    connector=connector, middlewares=(_noop_middleware,)
                )
            elif self.kind == "trace":
                session = aiohttp.ClientSession(
                    connector=connector, trace_configs=[aiohttp.TraceConfig()]
                )
            else:
                session = aiohttp.ClientSession(connector=connector)
            await self._stack.enter_async_context(session)

            async def fetch_aiohttp() -> None:
                async with session.get(url) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"unexpected status {response.status}")

            async def fetch_aiohttp_later() -> None:
                """``fetch_aiohttp`` that counts the responses whose body came later."""
                async with session.get(url) as response:
                    HELD[0] += not response.content.is_eof()
                    HELD[1] += 1
                    body = await response.read()
                    if response.status != 200 or len(body) != BODY_BYTES[0]:
                        raise RuntimeError(f"unexpected {response.status}, {len(body)} bytes")

            self.fetch = fetch_aiohttp_later if BODY_BYTES[0] else fetch_aiohttp

    async def close(self) -> None:
        await self._stack.aclose()

    async def run(self, seconds: float, concurrency: int, *, record: bool = True) -> int:
        """Send back to back from ``concurrency`` tasks for ``seconds``; the count."""
        fetch = self.fetch
        assert fetch is not None
        count = 0
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            # At least one request a task: on a loaded machine a short round's
            # deadline can pass before a task first runs, and a round of none
            # has no rate and no CPU per request (it divided by zero).
            nonlocal count
            while True:
                await fetch()
                count += 1
                if time.perf_counter() >= deadline:
                    return

        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        if record:
            self.rates.append(count / wall)
            self.cpu_us.append(cpu / count * 1e6)
        return count

    def check(self) -> None:
        """A throttled variant must have kept its books straight."""
        if self.throttle is None:
            return
        slots = list(self.throttle.slots())
        if len(slots) != 1:
            raise RuntimeError(f"expected one slot, got {slots}")
        snap = slots[0].snapshot()
        if snap.in_flight or snap.queued or snap.delay != 0.0 or snap.sent != snap.responses:
            raise RuntimeError(f"the throttle left state behind: {snap}")


def _module(filename: str) -> str:
    """A profile entry's module group: autothrottle files one by one, packages whole."""
    path = filename.replace(os.sep, "/")
    if "/autothrottle/" in path:
        return "autothrottle/" + os.path.basename(path)
    if "/aiohttp/tracing" in path:
        return "aiohttp/tracing.py"
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0]
    if filename.startswith("~") or filename.startswith("<"):
        return "builtins"
    return "stdlib"


def _profile_by_module(profiler: cProfile.Profile, requests: int) -> dict[str, float]:
    """Own time per request (µs, profiler-inflated) by module group."""
    totals: dict[str, float] = {}
    raw_stats: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    for (filename, _line, _func), (_cc, _nc, tt, _ct, _callers) in raw_stats.items():
        group = _module(filename)
        totals[group] = totals.get(group, 0.0) + tt / requests * 1e6
    return totals


_HEADERS = {
    "Content-Type": "text/html; charset=utf-8",
    "Content-Length": "120",
    "Date": "Sat, 22 Nov 2025 05:00:00 GMT",
    "Server": "Python/3.11 aiohttp/3.14",
}


def _client_headers(client: str) -> Any:
    """The benchmark server's response headers as the client hands them over."""
    if client == "httpx":
        import httpx

        # The adapter's import tells the engine that httpx's headers can be read
        # undecoded: the path of every AsyncThrottledClient, so the engine's too.
        import autothrottle.httpx  # noqa: F401

        return httpx.Headers(_HEADERS)
    from multidict import CIMultiDict, CIMultiDictProxy

    return CIMultiDictProxy(CIMultiDict(_HEADERS))


ENGINE_LATENCY = 0.001
"""The latency the engine alone is given for each response (seconds)."""


async def _engine_requests(client: str, n: int, throttle: Throttle | None = None) -> None:
    """``n`` requests through the engine alone, each as the adapters take it
    (``_ThrottleMiddleware.__call__``, ``_exchange.paced``, the connector's hook).

    The turn: ``acquire_now``, and the exchange made as theirs
    (``free_exchange``; the queue, ``acquire``, and ``Exchange`` only when the
    turn is not free). The wire turn: ``Exchange.wire_now``, awaiting
    ``on_wire`` only when it is not free. The response, with the client's own
    header type: aiohttp's, its body with its headers, observed and released
    in one step (``Lease.finish``, the middleware's usual case; with
    ``--body-bytes``, observed, then released when the body ends); httpx's
    through ``Exchange.responded``, released when its body's stream closes.
    The latency is ``ENGINE_LATENCY``, given, not timed (httpx's adapter
    gives ``responded`` the moment its headers came): the clock reads that
    time it are the adapters', and one that differs in its last bits from
    response to response (``started + ENGINE_LATENCY - started``) counted
    1.6k instructions a request more than a steady one (httpx, the adaptive
    default): the figure is the path's, not its latencies'.
    """
    if throttle is None:
        throttle = _throttle()
    headers = _client_headers(client)
    finish = client == "aiohttp" and not BODY_BYTES[0]
    key = "host"
    for _ in range(n):
        asked = perf_counter()
        lease = throttle.acquire_now(key)
        if lease is None:
            lease = await throttle.acquire(key)
            exchange = Exchange(lease, asked, key)
        else:
            exchange = free_exchange(lease, asked, key)
        wait = exchange.wire_now()
        if wait > 0.0:
            await exchange.on_wire(wait)
        if finish:
            lease.finish(ENGINE_LATENCY, 200, headers)
        elif client == "aiohttp":
            lease.observe(ENGINE_LATENCY, 200, headers)
            lease.release()
        else:
            exchange.responded(200, headers, latency=ENGINE_LATENCY)
            lease.release()


async def _engine_cost(n: int = 50_000) -> dict[str, float]:
    """The engine alone, in-process, per client's header type: CPU µs per request."""
    out: dict[str, float] = {}
    for client in ("aiohttp", "httpx"):
        await _engine_requests(client, 1000)  # warm up
        started = time.process_time()
        await _engine_requests(client, n)
        out[client] = (time.process_time() - started) / n * 1e6
    return out


# -- main ----------------------------------------------------------------------------------


def _groups(breakdown: bool) -> list[list[Variant]]:
    httpx_group = [
        Variant("httpx", "httpx", "raw"),
        Variant("httpx + AsyncThrottledClient", "httpx", "throttled"),
    ]
    aiohttp_group = [
        Variant("aiohttp", "aiohttp", "raw"),
        Variant("aiohttp + ThrottledSession", "aiohttp", "throttled"),
        Variant("aiohttp + ThrottledSession(request_options=False)", "aiohttp", "no-options"),
        Variant("aiohttp + middleware only", "aiohttp", "middleware"),
    ]
    if breakdown:
        httpx_group += [
            Variant("httpx + no-op transport", "httpx", "noop"),
            Variant("httpx + no-op transport + trace", "httpx", "noop+trace"),
        ]
        aiohttp_group += [
            Variant("aiohttp + no-op middleware", "aiohttp", "noop"),
            Variant("aiohttp + empty TraceConfig", "aiohttp", "trace"),
        ]
    return [httpx_group, aiohttp_group]


async def bench(args: argparse.Namespace, url: str) -> dict[str, Any]:
    groups = _groups(args.breakdown)
    variants = [v for group in groups for v in group]
    conc = args.concurrency
    for variant in variants:
        await variant.open(url, conc)
    profiles: dict[str, dict[str, float]] = {}
    try:
        for variant in variants:  # warm up: connections, caches, code paths
            await variant.run(args.warmup, conc, record=False)
        half = args.seconds / 2
        for i in range(args.rounds):
            for group in groups:
                order = [*group, *reversed(group)]
                if i % 2:
                    order.reverse()
                for variant in order:
                    await variant.run(half, conc)
            print(f"  round {i + 1}/{args.rounds} done", flush=True)
        for variant in variants:
            variant.check()
        if args.profile:
            for variant in variants:
                if variant.kind not in ("raw", "throttled", "middleware"):
                    continue
                profiler = cProfile.Profile()
                profiler.enable()
                try:
                    count = await variant.run(args.profile_seconds, conc, record=False)
                finally:
                    profiler.disable()
                profiles[variant.name] = _profile_by_module(profiler, count)
    finally:
        for variant in variants:
            await variant.close()

    results: dict[str, Any] = {"variants": {}}
    for group in groups:
        raw = group[0]
        raw_rounds = [(raw.rates[2 * i] + raw.rates[2 * i + 1]) / 2 for i in range(args.rounds)]
        raw_cpu = statistics.median(raw.cpu_us)
        for variant in group:
            rounds = [
                (variant.rates[2 * i] + variant.rates[2 * i + 1]) / 2 for i in range(args.rounds)
            ]
            ratios = [v / r for v, r in zip(rounds, raw_rounds, strict=True)]
            cpu = statistics.median(variant.cpu_us)
            results["variants"][variant.name] = {
                "client": variant.client,
                "kind": variant.kind,
                "median_rps": statistics.median(variant.rates),
                "rps_half_rounds": [round(r, 1) for r in variant.rates],
                "median_ratio_to_raw": statistics.median(ratios),
                "ratios_per_round": [round(r, 4) for r in ratios],
                "median_cpu_us_per_request": cpu,
                "cpu_us_half_rounds": [round(c, 1) for c in variant.cpu_us],
                "cpu_us_added_per_request": cpu - raw_cpu,
                "cpu_ratio_to_raw": raw_cpu / cpu,
            }
    results["engine_us_per_request"] = await _engine_cost()
    results["profiles"] = profiles
    return results


def _parse() -> argparse.Namespace:
    from _common import add_results_option

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="seconds per variant per round (default 3)"
    )
    parser.add_argument("--concurrency", type=int, default=8, help="client tasks (default 8)")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per variant")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 2 s: a rough figure")
    parser.add_argument(
        "--breakdown", action="store_true", help="add no-op wrappers: where the cost goes"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the throttled variants")
    parser.add_argument("--profile-seconds", type=float, default=3.0)
    parser.add_argument(
        "--server-delay",
        type=float,
        default=0.0,
        metavar="MS",
        help="the server waits this long before answering (default 0: client CPU-bound)",
    )
    parser.add_argument(
        "--no-sniffio-stub",
        action="store_true",
        help="measure httpx with its failing per-request 'import sniffio' (see the docstring)",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per request under valgrind instead (independent of load)",
    )
    parser.add_argument(
        "--policy",
        choices=sorted(POLICIES),
        default="autothrottle",
        help="the throttle's policy (default autothrottle: no cap of its own; adaptive, "
        "Throttle()'s default, caps requests in flight, so concurrent tasks queue)",
    )
    parser.add_argument(
        "--tasks",
        type=int,
        default=1,
        help="with --instructions: requests from this many concurrent tasks (default 1, one "
        "at a time; with --policy adaptive, more than its limit queue in the gate)",
    )
    parser.add_argument(
        "--clients",
        default="aiohttp,httpx",
        help="with --instructions, --bytecodes or --count-engine: which clients, comma-separated "
        "(default both)",
    )
    parser.add_argument(
        "--bytecodes",
        action="store_true",
        help="per function, the bytecodes and calls a throttled request adds (sys.settrace)",
    )
    parser.add_argument(
        "--body-bytes",
        type=int,
        default=0,
        metavar="N",
        help="the server sends a body of N bytes after its headers, not with them (default 0: "
        "the ~120-byte body with the headers); aiohttp's throttled responses then hold their "
        "slot until the body ends",
    )
    parser.add_argument(
        "--count-engine",
        type=int,
        metavar="N",
        help="count the engine alone's instructions a request under valgrind, fast (~20 s a "
        "client): N warm requests (2000 is plenty), counted inside sys.call_tracing only; "
        "to compare two trees, run it with PYTHONPATH=TREE/src for each",
    )
    parser.add_argument("--count", nargs=4, help=argparse.SUPPRESS)  # one run under valgrind
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the shortest run of the mode (one 0.2-s round; --instructions: 2 and 4 "
        "requests a count): for the tests, no figure worth reading",
    )
    add_results_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 3, 2.0
    if args.smoke:
        args.rounds, args.seconds, args.warmup, args.profile_seconds = 1, 0.2, 0.1, 0.2
        for kind in COUNT_RUNS:
            COUNT_RUNS[kind] = (2, 4)
    if not 1 <= args.rounds <= 50 or not 0.2 <= args.seconds <= 60:
        parser.error("--rounds must be in [1, 50] and --seconds in [0.2, 60]")
    if not 1 <= args.concurrency <= 256:
        parser.error("--concurrency must be in [1, 256]")
    if not 1 <= args.tasks <= 64:
        parser.error("--tasks must be in [1, 64]")
    if not 0 <= args.server_delay <= 1000:
        parser.error("--server-delay must be in [0, 1000] ms")
    if not 0 <= args.body_bytes <= 10**7:
        parser.error("--body-bytes must be in [0, 10**7]")
    if args.count_engine is not None and not 1 <= args.count_engine <= 10**6:
        parser.error("--count-engine must be in [1, 10**6]")
    return args


def _print_variants(args: argparse.Namespace, results: dict[str, Any]) -> None:
    from _common import print_table

    rows = []
    for name, v in results["variants"].items():
        rows.append(
            (
                name,
                f"{v['median_rps']:,.0f}",
                f"{min(v['rps_half_rounds']):,.0f}-{max(v['rps_half_rounds']):,.0f}",
                f"{v['median_ratio_to_raw']:.3f}",
                f"{v['median_cpu_us_per_request']:.0f}",
                f"{v['cpu_us_added_per_request']:+.1f}",
                f"{v['cpu_ratio_to_raw']:.3f}",
            )
        )
    print_table(
        f"requests/s, raw vs throttled; {args.concurrency} tasks, server delay "
        f"{args.server_delay:g} ms, median of {args.rounds} interleaved rounds",
        ["client", "req/s", "range", "ratio to raw", "CPU µs/req", "CPU µs added", "CPU ratio"],
        rows,
    )


def goals(results: dict[str, Any], server_delay_ms: float) -> list[dict[str, Any]]:
    """Each goal of the shipped clients, with its figure, breakdown and verdict."""
    engine = results["engine_us_per_request"]
    out = []
    for v in results["variants"].values():
        if v["kind"] != "throttled":
            continue
        client = v["client"]
        added = v["cpu_us_added_per_request"]
        ratio = v["median_ratio_to_raw"]
        ratio_goal = GOAL_RATIO[client] if server_delay_ms < 1.0 else GOAL_RATIO_SLOW
        breakdown = {
            "engine_us": engine[client],
            "adapter_us": added - engine[client],
            "total_us": added,
        }
        out.append(
            {
                "goal": f"{client}: added CPU <= {GOAL_ADDED_US:g} µs a request",
                "figure": f"{added:.1f} µs",
                "met": added <= GOAL_ADDED_US,
                **breakdown,
            }
        )
        out.append(
            {
                "goal": f"{client}: throughput >= {ratio_goal:g} of raw "
                f"(server {server_delay_ms:g} ms)",
                "figure": f"{ratio:.3f}",
                "met": ratio >= ratio_goal,
                **breakdown,
            }
        )
    return out


def _print_goals(verdicts: list[dict[str, Any]]) -> None:
    from _common import print_table

    print_table(
        "goals (CPU µs added = engine alone + adapter)",
        ["goal", "figure", "engine alone µs", "adapter µs", "total µs", "verdict"],
        [
            (
                g["goal"],
                g["figure"],
                f"{g['engine_us']:.1f}",
                f"{g['adapter_us']:.1f}",
                f"{g['total_us']:.1f}",
                "met" if g["met"] else "MISSED",
            )
            for g in verdicts
        ],
    )
    print(
        "The engine alone runs in a tight loop, its code and data hot in the CPU's caches; "
        "inside a client the same instructions cost two to three times as long, so the "
        "adapter column over-counts. --instructions splits the added cost by instructions."
    )


def _print_profiles(profiles: dict[str, dict[str, float]]) -> None:
    from _common import print_table

    for group in _groups(False):
        raw = profiles.get(group[0].name)
        if raw is None:
            continue
        for variant in group[1:]:
            prof = profiles.get(variant.name)
            if prof is None:
                continue
            diff = sorted(
                ((prof.get(k, 0.0) - raw.get(k, 0.0), k) for k in set(raw) | set(prof)),
                reverse=True,
            )
            print_table(
                f"cProfile: where {variant.name} spends more than {group[0].name} "
                f"(own time, µs/request, profiler-inflated; total "
                f"{sum(raw.values()):.0f} -> {sum(prof.values()):.0f})",
                ["module", "µs/request added"],
                [(k, f"{d:+.1f}") for d, k in diff[:8]],
            )


# -- instructions (valgrind) -------------------------------------------------------------

COUNT_RUNS = {"engine": (2000, 6000), "aiohttp": (400, 1200), "httpx": (200, 600)}
"""Requests per run for the instruction counts: the difference of two runs is counted."""


async def _count_requests(client: str, kind: str, n: int, url: str, tasks: int = 1) -> None:
    """``n`` requests after a warm-up (what runs under valgrind): one at a time,
    or from ``tasks`` concurrent tasks (which, with a policy that caps requests
    in flight, queue in the gate: the waiting loop's cost counted too)."""
    if kind == "engine":
        await _engine_requests(client, 200)
        await _engine_requests(client, n)
        return
    variant = Variant(kind, client, kind)
    await variant.open(url, tasks)
    fetch = variant.fetch
    assert fetch is not None

    async def worker(count: int) -> None:
        for _ in range(count):
            await fetch()

    try:
        await asyncio.gather(*(worker(20 // tasks + 1) for _ in range(tasks)))
        HELD[:] = [0, 0]
        await asyncio.gather(*(worker(n // tasks) for _ in range(tasks)))
    finally:
        await variant.close()
    if BODY_BYTES[0]:
        print(f"held {HELD[0]} {HELD[1]}")


def _instructions(
    client: str, kind: str, n: int, url: str, tasks: int = 1, held: list[int] | None = None
) -> int:
    """Instructions of one run; ``held`` gains its responses held (``HELD``)."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--policy",
        POLICY[0],
        "--tasks",
        str(tasks),
        "--body-bytes",
        str(BODY_BYTES[0]),
        "--count",
        client,
        kind,
        str(n),
        url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=1800)
    for line in done.stdout.splitlines():
        if held is not None and line.startswith("held "):
            held[:] = [a + int(b) for a, b in zip(held, line.split()[1:], strict=True)]
    for line in done.stderr.splitlines():
        if "Collected :" in line:
            return int(line.rsplit(":", 1)[1].strip())
    raise RuntimeError(f"valgrind gave no count: {done.stderr[-500:]}")


def _per_request(
    client: str, kind: str, url: str, tasks: int = 1, held: list[int] | None = None
) -> float:
    few, many = COUNT_RUNS["engine" if kind == "engine" else client]
    low = _instructions(client, kind, few, url, tasks, held)
    high = _instructions(client, kind, many, url, tasks, held)
    return (high - low) / (many - few)


def instructions_main(args: argparse.Namespace) -> None:
    from _common import print_table, write_results

    if shutil.which("valgrind") is None:
        sys.exit("--instructions needs valgrind (apt-get install valgrind)")
    server = ServerProcess(args.server_delay / 1000, args.body_bytes)
    counts: dict[str, dict[str, float]] = {}
    held: dict[str, list[int]] = {}
    try:
        for client in args.clients.split(","):
            counts[client] = {}
            for kind in ("raw", "throttled", "engine"):
                print(f"  counting {client} {kind} under valgrind ...", flush=True)
                held[f"{client} {kind}"] = tally = [0, 0]
                counts[client][kind] = _per_request(client, kind, server.url, args.tasks, tally)
    finally:
        server.stop()
    for name, (late, total) in held.items():
        if total:
            print(f"  {name}: {late} of {total} bodies came after their headers")
    rows = []
    for client, c in counts.items():
        added = c["throttled"] - c["raw"]
        rows.append(
            (
                client,
                f"{c['raw']:,.0f}",
                f"{c['throttled']:,.0f}",
                f"{added:+,.0f}",
                f"{c['engine']:,.0f}",
                f"{added - c['engine']:+,.0f}",
                f"{c['raw'] / c['throttled']:.3f}",
            )
        )
    print_table(
        f"instructions per request (callgrind, {_tasks_text(args.tasks)}{_body_text()}; "
        "load does not change them)",
        ["client", "raw", "throttled", "added", "engine alone", "adapter", "raw/throttled"],
        rows,
    )
    doc = {
        "per_request": counts,
        "policy": args.policy,
        "tasks": args.tasks,
        "body_bytes": args.body_bytes,
        "bodies_after_headers": {k: v for k, v in held.items() if v[1]},
    }
    name = (
        "overhead_instructions" if args.tasks == 1 else f"overhead_instructions_{args.tasks}tasks"
    )
    if args.body_bytes:
        name += f"_body{args.body_bytes}"
    print(f"results: {write_results(name, doc)}")


# -- the engine alone, counted quickly (valgrind) --------------------------------------

ENGINE_WARMUP = 200
"""Requests through a throttle before ``--count-engine`` counts its next N."""


def _run_free(coroutine: Coroutine[Any, Any, None]) -> None:
    """Run ``coroutine`` to its end in one step, with no event loop between.

    Every turn free (the benchmark's throttle has no delay and no cap in
    reach), the engine's path never suspends, and its first ``send`` ends it.
    One that does would count a wait, not the path: an error then."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()
    raise RuntimeError("a turn or wire turn was not free: the count would include its wait")


async def _count_engine_child(client: str, n: int) -> None:
    """What runs under callgrind for ``--count-engine``: ``ENGINE_WARMUP``
    requests, then ``n`` inside ``sys.call_tracing``, the one C function that
    callgrind's ``--toggle-collect`` turns collection on for (a call into the
    interpreter that changes nothing when no tracer is set): start-up,
    imports and warm-up are not counted at all."""
    throttle = _throttle()
    await _engine_requests(client, ENGINE_WARMUP, throttle)
    sys.call_tracing(_run_free, (_engine_requests(client, n, throttle),))


def engine_child(client: str, n: str, policy: str, body_bytes: str) -> None:
    """``--count-engine``'s child (``_ENGINE_CHILD``): set as ``main`` sets the
    policy and body size, without ``_parse`` (its ``--results-dir`` is
    _common's, and _common imports aiohttp)."""
    POLICY[0] = policy
    BODY_BYTES[0] = int(body_bytes)
    asyncio.run(_count_engine_child(client, int(n)))


_ENGINE_CHILD = (
    f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
    "import overhead; overhead.engine_child(*sys.argv[1:])"
)
"""The child's program: this module imported, not run, so that what it imports
at its top is all that starts under callgrind."""


def count_engine_main(args: argparse.Namespace) -> None:
    from _common import print_table, write_results

    if shutil.which("valgrind") is None:
        sys.exit("--count-engine needs valgrind (apt-get install valgrind)")
    import autothrottle

    n = args.count_engine
    # The same hash seed in each run (unless the caller set one): the layout
    # of a dict or set of strings then does not move a count between runs.
    env = {**os.environ, "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}
    rows = []
    per_request: dict[str, float] = {}
    for client in args.clients.split(","):
        command = [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            "--collect-atstart=no",
            "--toggle-collect=sys_call_tracing",
            sys.executable,
            "-c",
            _ENGINE_CHILD,
            client,
            str(n),
            POLICY[0],
            str(BODY_BYTES[0]),
        ]
        done = subprocess.run(
            command, capture_output=True, text=True, check=True, timeout=600, env=env
        )
        counts = [
            int(line.rsplit(":", 1)[1].strip())
            for line in done.stderr.splitlines()
            if "Collected :" in line
        ]
        if not counts or counts[0] <= 0:
            raise RuntimeError(
                "callgrind collected nothing: it sees no sys_call_tracing in this Python "
                f"(a stripped build?): {done.stderr[-500:]}"
            )
        per_request[client] = counts[0] / n
        rows.append((client, f"{counts[0] / n:,.0f}", f"{counts[0]:,}"))
    print_table(
        f"the engine alone, instructions a request (callgrind, {n:,} warm requests one at a "
        f"time, {_policy_text()}{_body_text()}, PYTHONHASHSEED={env['PYTHONHASHSEED']}; "
        "autothrottle from "
        f"{os.path.dirname(autothrottle.__file__)})",
        ["client", "instructions a request", f"instructions, {n:,} requests"],
        rows,
    )
    doc = {
        "engine_per_request": per_request,
        "requests": n,
        "policy": args.policy,
        "body_bytes": args.body_bytes,
        "pythonhashseed": env["PYTHONHASHSEED"],
        "autothrottle": os.path.dirname(autothrottle.__file__),
    }
    print(f"results: {write_results('overhead_count_engine', doc)}")


# -- bytecodes (sys.settrace) ---------------------------------------------------------

TRACED_REQUESTS = 50
"""Warm requests traced per variant for ``--bytecodes`` (the counts are per request)."""


async def _trace_requests(client: str, kind: str, url: str) -> dict[str, tuple[float, float]]:
    """Per function (``file:qualname``): bytecodes run and calls made, a request."""
    variant = Variant(kind, client, kind)
    await variant.open(url, 1)
    fetch = variant.fetch
    assert fetch is not None
    counted = BytecodeCount()
    try:
        for _ in range(30):  # warm up: connections, caches, code paths
            await fetch()
        with counted:
            for _ in range(TRACED_REQUESTS):
                await fetch()
    finally:
        await variant.close()
    ops, calls = counted.ops, counted.calls
    n = TRACED_REQUESTS
    return {name: (ops[name] / n, calls[name] / n) for name in ops.keys() | calls.keys()}


def bytecodes_main(args: argparse.Namespace) -> None:
    from _common import print_table

    server = ServerProcess(args.server_delay / 1000, args.body_bytes)
    try:
        for client in args.clients.split(","):
            raw = asyncio.run(_trace_requests(client, "raw", server.url))
            throttled = asyncio.run(_trace_requests(client, "throttled", server.url))
            rows = []
            for name in raw.keys() | throttled.keys():
                ops, calls = throttled.get(name, (0.0, 0.0))
                raw_ops, raw_calls = raw.get(name, (0.0, 0.0))
                if abs(ops - raw_ops) >= 1.0 or abs(calls - raw_calls) >= 0.5:
                    rows.append((ops - raw_ops, calls - raw_calls, name))
            rows.sort(key=lambda row: (-row[0], row[2]))
            total = [sum(v[i] for v in d.values()) for d in (raw, throttled) for i in (0, 1)]
            print_table(
                f"{client}: what a throttled request adds, by function ({_policy_text()}; "
                f"bytecodes {total[0]:,.0f} -> {total[2]:,.0f}, calls {total[1]:,.0f} -> "
                f"{total[3]:,.0f} a request)",
                ["function", "bytecodes added", "calls added"],
                [(name, f"{ops:+.0f}", f"{calls:+.1f}") for ops, calls, name in rows],
            )
    finally:
        server.stop()


def _policy_text() -> str:
    return "the adaptive default" if POLICY[0] == "adaptive" else "AutoThrottle's rule"


def _tasks_text(tasks: int) -> str:
    return "one request at a time" if tasks == 1 else f"{tasks} concurrent tasks"


def _body_text() -> str:
    return f", a {BODY_BYTES[0]:,}-byte body after the headers" if BODY_BYTES[0] else ""


def main() -> None:
    from _common import write_results

    args = _parse()
    POLICY[0] = args.policy
    BODY_BYTES[0] = args.body_bytes
    if args.count:
        client, kind, n, url = args.count
        asyncio.run(_count_requests(client, kind, int(n), url, args.tasks))
        return
    if args.count_engine is not None:
        count_engine_main(args)
        return
    if args.instructions:
        instructions_main(args)
        return
    if args.bytecodes:
        bytecodes_main(args)
        return
    print(
        f"overhead: {args.rounds} rounds x {args.seconds:g} s per variant, "
        f"{args.concurrency} concurrent tasks, server in a separate process "
        f"(answers after {args.server_delay:g} ms{_body_text()}), sniffio {SNIFFIO}, "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    server = ServerProcess(args.server_delay / 1000, args.body_bytes)
    try:
        results = asyncio.run(bench(args, server.url))
    finally:
        server.stop()
    _print_variants(args, results)
    results["goals"] = goals(results, args.server_delay)
    _print_goals(results["goals"])
    _print_profiles(results["profiles"])
    results["settings"] = {
        "rounds": args.rounds,
        "seconds_per_variant_per_round": args.seconds,
        "concurrency": args.concurrency,
        "throttle": "Throttle(start_delay=0, min_delay=0, max_delay=0, max_concurrency=10**6)",
        "policy": args.policy,
        "sniffio": SNIFFIO,
        "server_delay_ms": args.server_delay,
        "body_bytes": args.body_bytes,
        "load_average_end": os.getloadavg(),
    }
    name = "overhead" if not args.server_delay else f"overhead_delay{args.server_delay:g}ms"
    if args.body_bytes:
        name += f"_body{args.body_bytes}"
    path = write_results(name, results)
    print(f"load average (1, 5, 15 min) at the end: {os.getloadavg()}")
    print(f"results: {path}")


if __name__ == "__main__":
    main()

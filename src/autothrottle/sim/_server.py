"""One aiohttp.web server serving many simulated hosts, each on its own loopback address.

A single application answers on every address; it tells the hosts apart by
the local address of the connection, so 200 hosts cost 200 listening sockets
and one dictionary lookup per request, nothing more. Given one ``address``,
it serves hosts by name instead (virtual hosts, told apart by the ``Host``
header) on that address's one socket: ten thousand hosts cost one listening
socket rather than ten thousand file descriptors.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import random
import re
import socket
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from aiohttp import web

from ._behaviours import Behaviour, Runtime
from ._stats import HostStats, Recorder, Ticket

__all__ = ["SimServer"]

#: Seconds ``close()`` lets requests still in progress finish before cancelling them.
_SHUTDOWN_TIMEOUT = 1.0
#: Pending connections the virtual hosts' one socket queues (the system may cap it).
_VIRTUAL_BACKLOG = 4096


def loopback_address(name: str, value: object) -> str:
    """The normalised address if ``value`` is a loopback IP address."""
    try:
        ip = ipaddress.ip_address(value)  # type: ignore[arg-type]
    except ValueError:
        raise ValueError(f"{name}: {value!r} is not an IP address") from None
    if not ip.is_loopback:
        raise ValueError(f"{name}: {value!r} is not a loopback address (127.x.x.x or ::1)")
    return str(ip)


_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


def host_name(name: str, value: object) -> str:
    """The normalised host name (lower case, no final dot) if ``value`` is one.

    Letters, digits and hyphens in dot-separated labels, as in DNS; an IP
    address is not a name.
    """
    if not isinstance(value, str):
        raise ValueError(f"{name}: {value!r} is not a host name")
    norm = value.strip().lower().removesuffix(".")
    labels = norm.split(".")
    if len(norm) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"{name}: {value!r} is not a host name (letters, digits, - and .)")
    if labels[-1].isdigit():
        raise ValueError(f"{name}: {value!r} is an address, not a host name")
    return norm


def loopback_addresses(first: str, n: int) -> list[str]:
    """``n`` loopback IPv4 addresses from ``first`` on, skipping ``x.x.x.0`` and ``x.x.x.255``.

    127.0.0.254 is followed by 127.0.1.1, and so on through 127/8.
    """
    start = loopback_address("first", first)
    ip = ipaddress.ip_address(start)
    if not isinstance(ip, ipaddress.IPv4Address):
        raise ValueError(f"first: {first!r} must be an IPv4 address (127.x.x.x)")
    if n > _usable_from(int(ip)):
        raise ValueError(f"n: {n} addresses from {first} run past the end of 127.0.0.0/8")
    out: list[str] = []
    while len(out) < n:
        if ip.packed[-1] not in (0, 255):
            out.append(str(ip))
        ip += 1
    return out


def _usable_from(address: int) -> int:
    """How many addresses :func:`loopback_addresses` can give from ``address`` (an
    int of 127/8) to the end of 127/8: 254 in each /24 (no ``.0``, no ``.255``).
    Counted, not walked: a count past the end is refused at once."""
    last = address & 0xFF
    in_this_block = 254 - max(last, 1) + 1 if last < 255 else 0
    blocks_after = (int(ipaddress.IPv4Address("127.255.255.255")) >> 8) - (address >> 8)
    return in_this_block + 254 * blocks_after


class _Host:
    __slots__ = ("address", "behaviour", "port", "recorder", "rng", "robots", "runtime")

    def __init__(self, address: str, behaviour: Behaviour, rng: random.Random) -> None:
        self.address = address
        self.behaviour = behaviour
        self.rng = rng
        self.robots: str | int = 404
        self.port = 0
        now = time.monotonic()
        self.recorder = Recorder(now)
        self.runtime: Runtime = behaviour.new_runtime(address, rng, now)

    @property
    def base_url(self) -> str:
        netloc = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{netloc}:{self.port}"


class SimServer:
    """Simulated sites on loopback: one behaviour per address, ground truth for each.

    Use it as an async context manager (or call :meth:`start` and
    :meth:`close`). Every host also answers ``GET /_sim/stats`` with its own
    ground truth as JSON (``?all=1``: every host; ``?series=0``: figures
    only) and ``POST /_sim/reset`` (``?all=1``); these control requests are
    not recorded.

    A client that gives up on a request does not free its place: like a real
    origin, the host still serves it. Requests still running when the server
    closes are given about a second, then cancelled (recorded as aborted).

    Args:
        hosts: Loopback address to behaviour, e.g.
            ``{"127.0.0.2": Capacity(4, 0.05), "127.0.0.3": RateLimited(10)}``;
            with ``address``, host name to behaviour
            (``{"a.sim.test": Capacity(4, 0.05), ...}``).
        address: None (default): each host listens on its own address, the
            key. A loopback address: every host is served there, on one
            socket, and told apart by the ``Host`` header (virtual hosts); a
            request naming no host of the server gets 421. The client must
            resolve the names to ``address`` itself (they are not in DNS).
        port: 0 (default) gives each address its own free port; any other
            number binds every address to that port.
        seed: Seeds each host's random service-time jitter, for repeatable
            runs; None draws fresh randomness.
        robots: What ``GET /robots.txt`` answers, per address: the file's text
            (status 200, ``text/plain``) or a bare HTTP status (``503``, say).
            ``"*"`` stands for every host not named. Unnamed hosts answer 404
            (no robots.txt: everything allowed). It is answered at once by the
            server, not the behaviour (no token, no worker), and recorded with
            the outcome ``"robots"``.

    Raises:
        ValueError: an address is not a loopback IP (or, with ``address``, a
            key is not a host name), a behaviour is not a :class:`Behaviour`,
            or ``port``/``seed`` is out of range; the message names the
            parameter and the value.
    """

    def __init__(
        self,
        hosts: Mapping[str, Behaviour],
        *,
        port: int = 0,
        seed: int | None = None,
        robots: Mapping[str, str | int] | None = None,
        address: str | None = None,
    ) -> None:
        if not isinstance(hosts, Mapping) or not hosts:
            raise ValueError(
                f"hosts must be a non-empty mapping of address to behaviour, got {hosts!r}"
            )
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in [0, 65535], got {port!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an int or None, got {seed!r}")
        #: The one address of virtual hosts, or None: an address per host.
        self._address = None if address is None else loopback_address("address", address)
        self._hosts: dict[str, _Host] = {}
        for key, behaviour in hosts.items():
            norm = self._key("hosts", key)
            if not isinstance(behaviour, Behaviour):
                raise ValueError(f"hosts[{key!r}] must be a Behaviour, got {behaviour!r}")
            if norm in self._hosts:
                raise ValueError(f"hosts: {key!r} is given twice")
            rng = random.Random(f"{seed}/{norm}") if seed is not None else random.Random()
            self._hosts[norm] = _Host(norm, behaviour, rng)
        self._set_robots(robots or {})
        self._port = port
        self._by_socket: dict[tuple[str, int], _Host] = {}
        self._runner: web.AppRunner | None = None
        self._t0 = time.monotonic()
        self._started = False

    def _set_robots(self, robots: Mapping[str, str | int]) -> None:
        if not isinstance(robots, Mapping):
            raise ValueError(
                f"robots must be a mapping of address to text or status, got {robots!r}"
            )
        for address, answer in robots.items():
            if isinstance(answer, bool) or not isinstance(answer, (str, int)):
                raise ValueError(f"robots[{address!r}] must be a str or a status, got {answer!r}")
            if isinstance(answer, int) and not 100 <= answer <= 599:
                raise ValueError(
                    f"robots[{address!r}] must be a status in [100, 599], got {answer!r}"
                )
            if address == "*":
                targets = list(self._hosts.values())
            else:
                targets = [self._host(self._key("robots", address))]
            for host in targets:
                if address == "*" and host.address in robots:
                    continue
                host.robots = answer

    def _key(self, name: str, value: object) -> str:
        """A host's key: its loopback address, or with one ``address``, its name."""
        if self._address is None:
            return loopback_address(name, value)
        try:
            return host_name(name, value)
        except ValueError as exc:
            raise ValueError(f"{exc}; with address={self._address!r} hosts are named") from None

    @classmethod
    def many(
        cls,
        n: int,
        behaviour: Behaviour,
        *,
        first: str = "127.0.0.2",
        port: int = 0,
        seed: int | None = None,
        domain: str | None = None,
    ) -> SimServer:
        """``n`` hosts with the same behaviour (each with its own state).

        Addresses run from ``first`` upwards, skipping those ending in .0 and
        .255: 127.0.0.2 … 127.0.0.254, 127.0.1.1 … . Linux routes all of
        127.0.0.0/8 to loopback; macOS needs each address aliased first.

        With ``domain`` (``"sim.test"``, say) the hosts are virtual hosts
        named ``h1.sim.test`` … ``h<n>.sim.test``, all served on the one
        address ``first`` and told apart by the ``Host`` header.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        if domain is not None:
            names = host_names(host_name("domain", domain), n)
            return cls(dict.fromkeys(names, behaviour), port=port, seed=seed, address=first)
        return cls(dict.fromkeys(loopback_addresses(first, n), behaviour), port=port, seed=seed)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Bind every address and start serving."""
        if self._started:
            raise RuntimeError("SimServer already started")
        self._started = True
        self._t0 = now = time.monotonic()
        for host in self._hosts.values():
            host.recorder = Recorder(now)
            host.runtime = host.behaviour.new_runtime(host.address, host.rng, now)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=_SHUTDOWN_TIMEOUT
        )
        await runner.setup()
        self._runner = runner
        try:
            if self._address is not None:
                sock = _bind(self._address, self._port)
                for host in self._hosts.values():
                    host.port = sock.getsockname()[1]
                await web.SockSite(runner, sock, backlog=_VIRTUAL_BACKLOG).start()
                return
            for host in self._hosts.values():
                sock = _bind(host.address, self._port)
                host.port = sock.getsockname()[1]
                self._by_socket[(host.address, host.port)] = host
                await web.SockSite(runner, sock, backlog=512).start()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Stop serving. Idempotent; the recorded stats stay readable."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> SimServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ addresses

    @property
    def hosts(self) -> tuple[str, ...]:
        """The addresses (with one ``address``: the names), in the order given."""
        return tuple(self._hosts)

    def address(self, host: str) -> str:
        """The loopback address ``host`` listens on: its own, or the virtual hosts' one."""
        return self._address or self._host(host).address

    @property
    def start_time(self) -> float:
        """``time.monotonic()`` at start: subtract it from a client's times to compare."""
        return self._t0

    def now(self) -> float:
        """Seconds since the server started, the scale of every time in the stats."""
        return time.monotonic() - self._t0

    def behaviour(self, host: str) -> Behaviour:
        """The behaviour of ``host``."""
        return self._host(host).behaviour

    def base_url(self, host: str) -> str:
        """``http://<address>:<port>`` of ``host`` (``http://<name>:<port>`` for a virtual host)."""
        h = self._host(host)
        if h.port == 0:
            if self._port == 0:
                raise RuntimeError("the port is known once the SimServer has started")
            return f"{h.base_url.rsplit(':', 1)[0]}:{self._port}"
        return h.base_url

    def url(self, host: str, path: str = "/") -> str:
        """The URL of ``path`` on ``host``, e.g. ``sim.url("127.0.0.2", "/page/1")``."""
        if not path.startswith("/"):
            path = "/" + path
        return self.base_url(host) + path

    def urls(self, path: str = "/") -> list[str]:
        """The URL of ``path`` on every host, in host order."""
        return [self.url(h, path) for h in self._hosts]

    def _host(self, host: str) -> _Host:
        try:
            return self._hosts[host]
        except KeyError:
            raise ValueError(f"host: {host!r} is not one of this server's hosts") from None

    # ------------------------------------------------------------------ ground truth

    def stats(self) -> dict[str, HostStats]:
        """A snapshot of every host's ground truth, by address."""
        now = time.monotonic()
        return {address: self._snapshot(h, now) for address, h in self._hosts.items()}

    def host_stats(self, host: str) -> HostStats:
        """A snapshot of one host's ground truth."""
        return self._snapshot(self._host(host), time.monotonic())

    def stats_json(self, *, series: bool = True, indent: int | None = None) -> str:
        """Every host's ground truth as JSON text (the shape ``/_sim/stats?all=1`` serves)."""
        return json.dumps(self._stats_doc(self._hosts.values(), series=series), indent=indent)

    def reset(self, host: str | None = None) -> None:
        """Forget the recorded history (of one host, or all) and refill token buckets.

        Requests in progress go on and still count as load, but their answers
        are not recorded (they arrived before the reset). Times stay relative
        to the server start; ``since`` in the stats says when the reset was.
        """
        targets = [self._host(host)] if host is not None else list(self._hosts.values())
        now = time.monotonic()
        for h in targets:
            h.recorder.reset(now)
            h.runtime.reset(now)

    def _snapshot(self, h: _Host, now: float) -> HostStats:
        url = h.base_url if h.port else ""
        origin = None
        if h.runtime.origin is not None:
            capacity_of = getattr(h.behaviour, "origin", None)
            origin = h.runtime.origin.snapshot(
                host=f"{h.address} origin",
                url=url,
                behaviour=capacity_of.spec if isinstance(capacity_of, Behaviour) else "",
                capacity=capacity_of.capacity if isinstance(capacity_of, Behaviour) else 0.0,
                origin_time=self._t0,
                now=now,
            )
        return h.recorder.snapshot(
            host=h.address,
            url=url,
            behaviour=h.behaviour.spec,
            capacity=h.behaviour.capacity,
            origin_time=self._t0,
            now=now,
            origin=origin,
        )

    def _stats_doc(self, hosts: Any, *, series: bool) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "now": round(now - self._t0, 6),
            "hosts": {h.address: self._snapshot(h, now).to_dict(series=series) for h in hosts},
        }

    # ------------------------------------------------------------------ serving

    def _host_of(self, request: web.Request) -> _Host | None:
        """The host a request is for: by the ``Host`` header, or by the local address."""
        if self._address is not None:
            name = request.headers.get("Host", "").rpartition(":")
            return self._hosts.get((name[0] or name[2]).lower().removesuffix("."))
        transport = request.transport
        sockname = transport.get_extra_info("sockname") if transport is not None else None
        return self._by_socket.get(tuple(sockname[:2])) if sockname else None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        now = time.monotonic()
        host = self._host_of(request)
        if host is None:
            return web.Response(status=421, text="not a simulated host\n")
        if request.path.startswith("/_sim/"):
            return self._control(request, host)
        rec = host.recorder
        ticket = rec.arrive(now)
        if request.path == "/robots.txt":
            return _robots(host, rec, ticket)
        try:
            reply = await host.runtime.serve(request.path_qs, ticket, rec)
        except asyncio.CancelledError:
            rec.abort(ticket, time.monotonic())
            raise
        except Exception:
            rec.done(ticket, time.monotonic(), 500, "error")
            raise
        rec.done(ticket, time.monotonic(), reply.status, reply.outcome)
        return web.Response(
            status=reply.status,
            body=reply.body,
            headers=dict(reply.headers),
            content_type=reply.content_type,
        )

    def _control(self, request: web.Request, host: _Host) -> web.Response:
        every = request.query.get("all", "0") not in ("", "0", "false", "no")
        if request.path == "/_sim/stats" and request.method in ("GET", "HEAD"):
            series = request.query.get("series", "1") not in ("0", "false", "no")
            if every:
                doc = self._stats_doc(self._hosts.values(), series=series)
            else:
                doc = self._snapshot(host, time.monotonic()).to_dict(series=series)
            return web.json_response(doc)
        if request.path == "/_sim/reset" and request.method == "POST":
            self.reset(None if every else host.address)
            return web.json_response({"reset": list(self._hosts) if every else [host.address]})
        return web.Response(status=404, text="unknown control endpoint\n")


def host_names(domain: str, n: int) -> list[str]:
    """``n`` virtual host names in ``domain``: ``h1.<domain>`` … ``h<n>.<domain>``."""
    return [f"h{i}.{domain}" for i in range(1, n + 1)]


def _robots(host: _Host, rec: Recorder, ticket: Ticket) -> web.Response:
    """The host's robots.txt, answered at once and recorded as such."""
    answer = host.robots
    status = answer if isinstance(answer, int) else 200
    rec.done(ticket, time.monotonic(), status, "robots")
    text = answer if isinstance(answer, str) else f"{status}\n"
    return web.Response(status=status, text=text, content_type="text/plain")


def _bind(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if os.name == "posix":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot bind {address}:{port}: {exc.strerror}") from exc
    return sock

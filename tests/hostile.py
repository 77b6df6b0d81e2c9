"""A hostile HTTP/1.1 server on a loopback address: raw bytes, no framework.

It misbehaves at the TCP and HTTP level, one behaviour per path: ``/silent``
accepts and never answers, ``/stall-body`` sends its headers and stalls the
body, ``/reset-before`` resets the connection (``SO_LINGER`` 0) unanswered,
and so on (:data:`BEHAVIOURS`). ``/ok`` answers 200 and keeps the connection.
A server framework would refuse to send most of these, hence raw asyncio.

The request body's side has behaviours of its own (:data:`UPLOADS`), which
take the body themselves: ``/refuse-close`` answers 413 before reading a byte
of it and closes (the unread body turns the close into a reset),
``/refuse-keep`` answers 413 first and reads the body after, ``/refuse-hold``
answers 413 and never reads it, ``/stop-reading`` never reads it (the TCP
window fills) and never answers, ``/reset-upload`` resets the connection
partway through it. Every other behaviour reads and
drops a request's body (``Content-Length`` or chunked) first.

The server runs its own event loop in a thread of the test process, so sync
clients (requests, httpx's ``Client``) and async ones reach it alike. A stalled
behaviour waits until the client closes its end (or the server stops): nothing
is left running on the server's side of a request the client gave up.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Iterator

from autothrottle._headers._names import _TABLE

_Writer = asyncio.StreamWriter
_Behaviour = Callable[[asyncio.StreamReader, _Writer, str], Awaitable[bool]]
"""Answers one request (for its target, path and query); True keeps the connection."""
_Upload = Callable[[asyncio.StreamReader, _Writer, bytes], Awaitable[bool]]
"""Answers one request (for its head, body unread) and takes its body, or not;
True keeps the connection."""

RECEIVE_BUFFER = 65536
"""The server's TCP receive buffer (``SO_RCVBUF``): small and fixed, so a body
the server stops reading fills the window after a few hundred kilobytes (the
client's own send buffer then holds up to 4 MB under Linux's defaults)."""

RATE_NAMES = tuple(name for name, _ in _TABLE)
"""Every response header the library reads, as servers spell it: every dialect."""

HOSTILE_VALUES = {
    "garbage": "soon-ish; q=?? [[nope]]",
    "huge": "9" * 400,
    "negative": "-86400",
    "far-date": "Fri, 01 Jan 9999 00:00:00 GMT",
    "overlong": "7" * 5000,
}
"""What a 429 sends in every header of :data:`RATE_NAMES` (``/429-<kind>``); an
overlong value goes in two of them only (``Retry-After``, ``RateLimit-Remaining``):
in all of them it is past h11's limit of a response head (16 KB), which then
never reaches the throttle."""


def _head(status: bytes, *fields: tuple[str, str | int]) -> bytes:
    lines = [status, *(f"{name}: {value}".encode() for name, value in fields)]
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _until_closed(reader: asyncio.StreamReader) -> None:
    """Stall: read and drop whatever comes until the client closes its end."""
    while await reader.read(65536):
        pass


def _reset(writer: _Writer) -> None:
    """Close with a TCP reset (``SO_LINGER`` on, 0 s), not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _ok(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
    writer.write(_head(b"HTTP/1.1 200 OK", ("Content-Length", 2)) + b"ok")
    return True


async def _silent(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
    await _until_closed(reader)
    return False


async def _stall_body(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
    writer.write(_head(b"HTTP/1.1 200 OK", ("Content-Length", 1000)) + b"x" * 10)
    await _until_closed(reader)
    return False


async def _short_body(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
    writer.write(_head(b"HTTP/1.1 200 OK", ("Content-Length", 1000)) + b"x" * 10)
    return False  # closed with 990 bytes owed


async def _reset_before(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
    _reset(writer)
    return False


async def _reset_after(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
    writer.write(_head(b"HTTP/1.1 200 OK", ("Content-Length", 1000)) + b"x" * 10)
    await writer.drain()
    await asyncio.sleep(0.05)  # let the headers reach the client first
    _reset(writer)
    return False


async def _bad_status(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
    writer.write(b"HTTP/1.1 2x0 Maybe\r\nContent-Length: 2\r\n\r\nok")
    return False


async def _garbage(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
    writer.write(b"\x00\xffSSH-2.0-not-http\r\n\r\n")
    return False


async def _bad_header(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
    writer.write(
        b"HTTP/1.1 200 OK\r\nNo colon here\r\nX-Bad\x00: nul\r\nContent-Length: 2\r\n\r\nok"
    )
    return False


async def _many_headers(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
    fields = [(f"X-Many-{i}", "v") for i in range(10_000)]
    writer.write(_head(b"HTTP/1.1 200 OK", *fields, ("Content-Length", 2)) + b"ok")
    return False


async def _huge_header(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
    fields = (("X-Huge", "h" * 1_000_000), ("Content-Length", 2))
    writer.write(_head(b"HTTP/1.1 200 OK", *fields) + b"ok")
    return False


def _refusal(value: str) -> _Behaviour:
    names = RATE_NAMES if len(value) < 1000 else ("Retry-After", "RateLimit-Remaining")

    async def refuse(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
        fields = [(name, value) for name in names]
        writer.write(_head(b"HTTP/1.1 429 Too Many Requests", *fields, ("Content-Length", 0)))
        return True

    return refuse


async def _continue(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    writer.write(_head(b"HTTP/1.1 200 OK", ("Content-Length", 2)) + b"ok")
    return True


async def _chunked_stall(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
    writer.write(_head(b"HTTP/1.1 200 OK", ("Transfer-Encoding", "chunked")) + b"2\r\nok\r\n")
    await _until_closed(reader)  # the last chunk never comes
    return False


async def _chunked_drip(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
    """A chunked body that never ends and never goes quiet: no read timeout ends it."""
    writer.write(_head(b"HTTP/1.1 200 OK", ("Transfer-Encoding", "chunked")))
    while not reader.at_eof():
        writer.write(b"1\r\nx\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
    return False


async def _upgrade(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
    """Switches protocols nobody asked for, then says nothing."""
    fields = (("Upgrade", "websocket"), ("Connection", "Upgrade"))
    writer.write(_head(b"HTTP/1.1 101 Switching Protocols", *fields))
    await _until_closed(reader)
    return False


async def _redirect_loop(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
    """Redirects to itself, for ever (no client looks for a loop: each stops
    after its most redirects)."""
    fields = (("Location", target),)
    writer.write(_head(b"HTTP/1.1 302 Found", *fields, ("Content-Length", 0)))
    return True


async def _http10(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
    writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + b"y" * 100)
    return False  # the close ends the body


async def _slowloris(reader: asyncio.StreamReader, writer: _Writer, target: str) -> bool:
    """The status line and headers, a byte a second."""
    for byte in _head(b"HTTP/1.1 200 OK", ("Content-Length", 2)):
        if reader.at_eof() or writer.is_closing():
            break
        writer.write(bytes([byte]))
        await writer.drain()
        await asyncio.sleep(1.0)
    return False


async def _refuse_close(reader: asyncio.StreamReader, writer: _Writer, head: bytes) -> bool:
    """413 before reading a byte of the body, then close: the body left unread
    in the server's buffer makes the close a reset."""
    fields = (("Connection", "close"), ("Content-Length", 0))
    writer.write(_head(b"HTTP/1.1 413 Content Too Large", *fields))
    await writer.drain()
    return False


async def _refuse_keep(reader: asyncio.StreamReader, writer: _Writer, head: bytes) -> bool:
    """413 before reading a byte of the body, no ``Connection: close``: the body
    is read and dropped after, and the connection serves the next request. To a
    client that sent ``Expect: 100-continue``, a final status without a 100: it
    must send its body now or close."""
    writer.write(_head(b"HTTP/1.1 413 Content Too Large", ("Content-Length", 0)))
    await writer.drain()
    return await _drop_body(reader, head)


async def _refuse_hold(reader: asyncio.StreamReader, writer: _Writer, head: bytes) -> bool:
    """413 before reading a byte of the body, which is never read, and the
    connection held open: a client that reads only once its body is sent
    stalls on its writes."""
    writer.write(_head(b"HTTP/1.1 413 Content Too Large", ("Content-Length", 0)))
    await writer.drain()
    return await _stop_reading(reader, writer, head)


async def _stop_reading(reader: asyncio.StreamReader, writer: _Writer, head: bytes) -> bool:
    """Never reads the body, never answers: the client's writes stall once the
    TCP window is full. Nothing read, the client's close goes unseen: the
    connection is held until the server stops."""
    await asyncio.Event().wait()
    return False


async def _reset_upload(reader: asyncio.StreamReader, writer: _Writer, head: bytes) -> bool:
    """Reads the first 64 KB of the body, then resets the connection."""
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
        await reader.readexactly(65536)
    _reset(writer)
    return False


UPLOADS: dict[str, _Upload] = {
    "refuse-close": _refuse_close,
    "refuse-keep": _refuse_keep,
    "refuse-hold": _refuse_hold,
    "stop-reading": _stop_reading,
    "reset-upload": _reset_upload,
}


BEHAVIOURS: dict[str, _Behaviour] = {
    "ok": _ok,
    "silent": _silent,
    "stall-body": _stall_body,
    "short-body": _short_body,
    "reset-before": _reset_before,
    "reset-after": _reset_after,
    "bad-status": _bad_status,
    "garbage": _garbage,
    "bad-header": _bad_header,
    "many-headers": _many_headers,
    "huge-header": _huge_header,
    **{f"429-{kind}": _refusal(value) for kind, value in HOSTILE_VALUES.items()},
    "continue": _continue,
    "upgrade": _upgrade,
    "redirect-loop": _redirect_loop,
    "chunked-stall": _chunked_stall,
    "chunked-drip": _chunked_drip,
    "http10": _http10,
    "slowloris": _slowloris,
}


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    """A request's line and headers, its body left unread."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None


def _field(head: bytes, wanted: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == wanted:
            return value.strip().lower()
    return None


async def _drop_body(reader: asyncio.StreamReader, head: bytes) -> bool:
    """Read and drop the body ``head`` announces (by length or chunked); False
    when the client closed before its end."""
    try:
        if _field(head, b"transfer-encoding") == b"chunked":
            while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                await reader.readexactly(size + 2)
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                pass
        elif (length := _field(head, b"content-length")) is not None and length.isdigit():
            await reader.readexactly(int(length))
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
        return False
    return True


class HostileServer:
    """The server, started in a thread of its own; :meth:`url` names a behaviour."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._arrived: dict[str, int] = {}
        self._tags = itertools.count()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def url(self, behaviour: str) -> str:
        """The URL of ``behaviour``, tagged anew on each call: :meth:`arrivals`
        counts the requests that reached this URL alone."""
        return f"http://{self.address}:{self.port}/{behaviour}?{next(self._tags)}"

    def arrivals(self, url: str) -> int:
        """How many requests for ``url`` (its path and query) reached the server."""
        return self._arrived.get(url.partition(f":{self.port}")[2], 0)

    def start(self) -> None:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = started.result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _listen(self) -> int:
        listening = socket.socket()
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        listening.bind((self.address, 0))  # accepted sockets inherit the buffer
        self._server = await asyncio.start_server(self._accept, sock=listening)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _close(self) -> None:
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: _Writer) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: _Writer) -> None:
        while (head := await _read_head(reader)) is not None:
            target = head.split(b" ", 2)[1].decode("latin-1")
            self._arrived[target] = self._arrived.get(target, 0) + 1
            name = target.lstrip("/").partition("?")[0]
            if (upload := UPLOADS.get(name)) is not None:
                keep = await upload(reader, writer, head)
            elif await _drop_body(reader, head):
                keep = await BEHAVIOURS.get(name, _ok)(reader, writer, target)
            else:
                return
            if writer.transport.is_closing():
                return
            await writer.drain()
            if not keep:
                writer.close()
                return


@contextlib.contextmanager
def hostile_server(address: str) -> Iterator[HostileServer]:
    server = HostileServer(address)
    server.start()
    try:
        yield server
    finally:
        server.stop()

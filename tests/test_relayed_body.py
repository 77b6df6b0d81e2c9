"""An error a request's body raised is the caller's, not the host's it was sent
to (``docs/adapters.md``, "Failure"): here a body that relays a download
from another host, whose transport error (that host broke its body off) is
raised while the body goes to the upload host. Every adapter alike: the
upload host's slot releases, counts no failure and never backs off.

Real loopback servers, each in a thread: the download host (127.0.0.2)
promises 100,000 bytes and closes after 1,000; the upload host (127.0.0.3)
reads what comes and never answers.
"""

from __future__ import annotations

import contextlib
import io
import socket
import socketserver
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import httpx
import pytest
import requests

from autothrottle import Throttle
from autothrottle.aiohttp import ThrottledSession as AiohttpSession
from autothrottle.httpx import AsyncThrottledClient, ThrottledClient
from autothrottle.requests import ThrottledSession as RequestsSession

DOWNLOAD, UPLOAD = "127.0.0.2", "127.0.0.3"


class _BrokenDownload(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(10.0)
        seen = b""
        while b"\r\n\r\n" not in seen and len(seen) < 65536:
            data = sock.recv(4096)
            if not data:
                return
            seen += data
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"d" * 1000)


class _SilentUpload(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(10.0)
        with contextlib.suppress(OSError):
            while sock.recv(65536):
                pass


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextlib.contextmanager
def serving(address: str, handler: type[socketserver.BaseRequestHandler]) -> Iterator[str]:
    server = _Server((address, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{address}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10.0)


@pytest.fixture
def hosts() -> Iterator[tuple[str, str]]:
    with serving(DOWNLOAD, _BrokenDownload) as download, serving(UPLOAD, _SilentUpload) as upload:
        yield download, upload


def _caused_by(error: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``error`` is ``kind``, or wraps one (its cause or context, or
    requests' first argument), a few links deep."""
    seen: BaseException | None = error
    for _ in range(6):
        if seen is None:
            return False
        if isinstance(seen, kind):
            return True
        inner = seen.__cause__ or seen.__context__
        if inner is None and seen.args and isinstance(seen.args[0], BaseException):
            inner = seen.args[0]
        seen = inner
    return False


def _upload_slot_untouched(throttle: Throttle) -> None:
    slot = throttle.slot(UPLOAD).snapshot()
    assert (slot.in_flight, slot.failures, slot.backoffs) == (0, 0, 0), slot


async def test_httpx_a_relayed_downloads_error_is_the_callers(hosts: tuple[str, str]) -> None:
    download, upload = hosts
    throttle = Throttle(start_delay=0.0)

    async with httpx.AsyncClient(timeout=10.0) as plain:

        async def relay() -> AsyncIterator[bytes]:
            async with plain.stream("GET", download) as response:
                async for chunk in response.aiter_raw():
                    yield chunk

        async with AsyncThrottledClient(throttle=throttle, timeout=10.0) as client:
            with pytest.raises(httpx.RemoteProtocolError):  # the download host's
                await client.post(upload, content=relay())
    _upload_slot_untouched(throttle)


def test_httpx_sync_a_relayed_downloads_error_is_the_callers(hosts: tuple[str, str]) -> None:
    download, upload = hosts
    throttle = Throttle(start_delay=0.0)

    with httpx.Client(timeout=10.0) as plain:

        def relay() -> Iterator[bytes]:
            with plain.stream("GET", download) as response:
                yield from response.iter_raw()

        with (
            ThrottledClient(throttle=throttle, timeout=10.0) as client,
            pytest.raises(httpx.RemoteProtocolError),
        ):
            client.post(upload, content=relay())
    _upload_slot_untouched(throttle)


def test_requests_a_relayed_downloads_error_is_the_callers(hosts: tuple[str, str]) -> None:
    download, upload = hosts
    throttle = Throttle(start_delay=0.0)

    def relay() -> Iterator[bytes]:
        with requests.get(download, stream=True, timeout=10.0) as response:
            yield from response.iter_content(4096)

    # requests hands it on as a ConnectionError ("Connection aborted.") caused by it.
    with (
        RequestsSession(throttle=throttle) as session,
        pytest.raises(requests.RequestException) as raised,
    ):
        session.post(upload, data=relay(), timeout=10.0)
    assert _caused_by(raised.value, requests.exceptions.ChunkedEncodingError), raised.value
    _upload_slot_untouched(throttle)


def test_requests_a_file_body_that_fails_to_read_is_the_callers(hosts: tuple[str, str]) -> None:
    # A file-like body (read in blocks by urllib3) whose read fails: an OSError
    # of the caller's disk, not of the upload host's socket.
    _, upload = hosts
    throttle = Throttle(start_delay=0.0)

    class Failing:
        def __init__(self) -> None:
            self.reads = 0

        def read(self, size: int = -1) -> bytes:
            self.reads += 1
            if self.reads > 2:
                raise OSError(5, "Input/output error")
            return b"f" * 1024

    with (
        RequestsSession(throttle=throttle) as session,
        pytest.raises(requests.RequestException) as raised,
    ):
        session.post(upload, data=Failing(), timeout=10.0)
    assert _caused_by(raised.value, OSError), raised.value
    _upload_slot_untouched(throttle)


class _Recorder(socketserver.BaseRequestHandler):
    """Keeps each request as it arrived (its head, and its body framed by
    Content-Length or chunked) in ``seen``, then answers 204."""

    seen: ClassVar[list[bytes]] = []

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(10.0)
        data = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in data and len(data) < 65536:
                chunk = sock.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lowered = head.lower()
            length = None
            for line in lowered.split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line.partition(b":")[2])
            while (
                len(body) < length if length is not None else not body.endswith(b"0\r\n\r\n")
            ) and len(body) < 1 << 20:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                body += chunk
            self.seen.append(head + b"\r\n\r\n" + body[:length])
            sock.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")


class _NotABody:
    """Neither bytes, a file nor an iterable."""

    def __repr__(self) -> str:
        return "<not a body>"


def _bodies(folder: Path) -> list[tuple[str, Callable[[], object]]]:
    binary = folder / "binary"
    binary.write_bytes(bytes(range(256)) * 160)  # 40,960 bytes: three of urllib3's blocks
    return [
        ("a binary file", lambda: binary.open("rb")),
        ("a text buffer", lambda: io.StringIO("h\u00e9llo w\u00f6rld " * 3000)),
        ("an iterable of str and bytes", lambda: iter(["caf\u00e9 ", b"bytes ", "\u00fc" * 5000])),
        ("not a body", lambda: _NotABody()),
    ]


def test_requests_sends_every_kind_of_body_as_urllib3_does(tmp_path: Path) -> None:
    # The wrapper that marks a body's errors as the caller's must not change the
    # body: the host gets the bytes it gets without the throttle, and a body
    # urllib3 refuses is refused with its TypeError, before anything is sent.
    throttle = Throttle(start_delay=0.0)
    with serving(UPLOAD, _Recorder) as upload:
        for kind, body in _bodies(tmp_path):
            got: list[tuple[object, list[bytes]]] = []
            for session in (requests.Session(), RequestsSession(throttle=throttle)):
                seen: list[bytes] = []
                _Recorder.seen = seen
                with session:
                    try:
                        data: Any = body()  # "not a body" on purpose
                        outcome: object = session.post(upload, data=data, timeout=10.0).status_code
                    except TypeError as error:
                        outcome = str(error)
                got.append((outcome, seen))
            plain, throttled = got
            assert throttled == plain, kind
            if kind == "not a body":
                assert plain == (
                    "'body' must be a bytes-like object, file-like object, or "
                    "iterable. Instead was <not a body>",
                    [],
                ), plain
            else:
                assert plain[0] == 204 and len(plain[1]) == 1, kind
    slot = throttle.slot(UPLOAD).snapshot()
    assert (slot.in_flight, slot.failures, slot.responses) == (0, 0, 3), slot


async def test_aiohttp_a_relayed_downloads_error_is_the_callers(hosts: tuple[str, str]) -> None:
    download, upload = hosts
    throttle = Throttle(start_delay=0.0)
    timeout = aiohttp.ClientTimeout(total=10.0)

    async with aiohttp.ClientSession(timeout=timeout) as plain:

        async def relay() -> AsyncIterator[bytes]:
            async with plain.get(download) as response:
                async for chunk in response.content.iter_any():
                    yield chunk

        async with AiohttpSession(throttle=throttle, timeout=timeout) as session:
            with pytest.raises(aiohttp.ClientConnectionError) as raised:
                await session.post(upload, data=relay())
    assert _caused_by(raised.value, aiohttp.ClientPayloadError), raised.value
    _upload_slot_untouched(throttle)


class _HangUp(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(10.0)
        with contextlib.suppress(OSError):
            sock.recv(65536)  # the request's first bytes, then the host hangs up


def test_an_upload_hosts_own_failure_stays_the_hosts() -> None:
    # The other side: a body that raised nothing, sent to a host that hung up
    # without answering, is the host's failure.
    throttle = Throttle(start_delay=0.0)

    def body() -> Iterator[bytes]:
        yield b"u" * 1024

    with (
        serving(UPLOAD, _HangUp) as upload,
        ThrottledClient(throttle=throttle) as client,
        pytest.raises(httpx.TransportError),
    ):
        client.post(upload, content=body())
    slot = throttle.slot(UPLOAD).snapshot()
    assert (slot.in_flight, slot.failures) == (0, 1), slot

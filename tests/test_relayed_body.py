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
import socket
import socketserver
import threading
from collections.abc import AsyncIterator, Iterator

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

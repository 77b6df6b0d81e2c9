"""The clients' private names the adapters read, each named here.

The adapters are built on a few private names of aiohttp and httpx (and
httpcore under it). Those an adapter cannot work without are its ``PRIVATES``,
checked when it is imported (``autothrottle._extras.require_privates``): a
client release that dropped one fails there, with its version in the message.
The others have a slower path the adapter takes without them; they are named
below so that a release that drops one shows here (a skip that says so), not
only in a benchmark. ``nox -s oldest`` runs this on the oldest releases the
extras allow.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import Any

import aiohttp
import pytest

from autothrottle._aiohttp_parts import PRIVATES as AIOHTTP_PRIVATES
from autothrottle._extras import require_privates
from autothrottle._httpx._async import PRIVATES as HTTPX_ASYNC_PRIVATES
from autothrottle._httpx._sync import PRIVATES as HTTPX_SYNC_PRIVATES

HTTPX_PRIVATES = HTTPX_ASYNC_PRIVATES + HTTPX_SYNC_PRIVATES


def _version(package: str) -> str:
    return metadata.version(package)


@pytest.mark.parametrize("name", AIOHTTP_PRIVATES)
def test_aiohttp_has_each_private_the_adapter_is_built_on(name: str) -> None:
    require_privates(aiohttp, [name])


@pytest.mark.parametrize("package", ["httpx", "httpx2"])
@pytest.mark.parametrize("name", HTTPX_PRIVATES)
def test_httpx_has_each_private_the_adapter_is_built_on(package: str, name: str) -> None:
    require_privates(pytest.importorskip(package), [name])


def test_the_adapters_name_what_they_are_built_on() -> None:
    # A private read in the adapter's code is listed, so a release that drops
    # it fails at import: these are the ones whose absence has no other path.
    assert set(AIOHTTP_PRIVATES) == {
        "client._RequestContextManager",  # what the session's own request methods return
        "ClientSession._request",  # the one entry of every request method
        "ClientResponse._connection",  # whether the body is already finished
        "ClientResponse._headers",  # the headers, without the proxy's copy
    }
    assert set(HTTPX_PRIVATES) == {
        "AsyncClient._transport_for_url",  # every route of a client, throttled
        "Client._transport_for_url",
    }


def test_a_missing_private_fails_at_import_naming_the_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(aiohttp.ClientSession, "_request")
    with pytest.raises(ImportError) as caught:
        require_privates(aiohttp, AIOHTTP_PRIVATES)
    message = str(caught.value)
    assert "ClientSession._request" in message
    assert f"aiohttp {_version('aiohttp')} does not have" in message
    assert "tested on aiohttp 3.12.0 to" in message


def test_a_private_whose_default_is_none_is_present() -> None:
    # ClientResponse._headers is None on the class until a response sets it.
    assert aiohttp.ClientResponse._headers is None
    require_privates(aiohttp, ["ClientResponse._headers"])


# -- privates with a slower path -----------------------------------------------------


def _httpx_fallbacks(package: str) -> dict[str, Any]:
    httpx = pytest.importorskip(package)
    core = importlib.import_module("httpcore" if package == "httpx" else "httpcore2")
    transport = httpx.AsyncHTTPTransport()
    pool = transport._pool
    http2 = importlib.import_module(f"autothrottle._{package}._pools").http2  # its own reading
    return {
        # the control header looked up without decoding every header
        "Headers._list": getattr(httpx.Headers({"A": "b"}), "_list", None),
        # the host, IDNA-encoded, without decoding it at every call
        "URL._uri_reference": getattr(httpx.URL("http://a.example/"), "_uri_reference", None),
        # the stream that refers back to its response (a cycle the adapter breaks)
        "_client.BoundAsyncStream": getattr(httpx._client, "BoundAsyncStream", None),
        # whether a request opens a connection, without asking each connection
        f"{core.__name__} AsyncConnectionPool._connections": getattr(pool, "_connections", None),
        f"{core.__name__} AsyncConnectionPool._requests": getattr(pool, "_requests", None),
        # the same, asked of each connection (the slower path)
        f"{core.__name__} AsyncConnectionPool.connections": getattr(pool, "connections", None),
        # whether HTTP/2 is on in a transport given to AsyncThrottledTransport: without
        # it (or not a bool), each origin's requests are handed over one at a time until
        # one goes out on HTTP/1.1 (the throttled clients know it from http2=)
        f"{core.__name__} AsyncConnectionPool._http2": http2(transport),
    }


@pytest.mark.parametrize("package", ["httpx", "httpx2"])
def test_httpxs_privates_with_a_slower_path(package: str) -> None:
    found = _httpx_fallbacks(package)
    missing = [name for name, value in found.items() if value is None]
    if missing:
        pytest.skip(f"{package} {_version(package)} lacks {missing}: the adapter's slower path")


def test_aiohttps_privates_with_a_slower_path() -> None:
    from aiohttp.client_proto import ResponseHandler
    from aiohttp.streams import StreamReader

    found = {
        # a finished body's callbacks, to let the slot go when it ends
        "StreamReader._eof_callbacks": "_eof_callbacks" in getattr(StreamReader, "__slots__", ())
        or hasattr(StreamReader, "_eof_callbacks"),
        # a connection lost mid-body lets the slot go at once
        "ResponseHandler.closed": hasattr(ResponseHandler, "closed"),
        # throttle_of() finds the throttle among the session's middlewares
        "ClientSession._middlewares": "_middlewares" in aiohttp.ClientSession.ATTRS,
    }
    missing = [name for name, present in found.items() if not present]
    if missing:
        pytest.skip(f"aiohttp {_version('aiohttp')} lacks {missing}: the adapter's slower path")

# Generated from httpx.py by scripts/unasync.py: edit that file and rerun.
"""Throttle an ``httpx2.AsyncClient``: a transport wrapper and a client subclass.

Every request that goes through :class:`AsyncThrottledTransport` waits for its
slot's turn (per host by default), counts as in flight until its response body
has been read or the response closed, and teaches the slot its latency::

    import httpx2
    from autothrottle import Throttle
    from autothrottle.httpx2 import AsyncThrottledTransport

    throttle = Throttle(target_concurrency=2.0)
    transport = AsyncThrottledTransport(throttle=throttle)
    async with httpx2.AsyncClient(transport=transport) as client:
        response = await client.get("https://example.com/")

Passing ``transport=`` to ``httpx2.AsyncClient`` has two side effects in httpx2
itself: the client stops reading proxies from the environment (``HTTP_PROXY``
and friends), and requests routed through ``mounts=`` (or ``proxy=``) skip that
transport, so they would not be throttled. :class:`AsyncThrottledClient` avoids
both: it is an ``httpx2.AsyncClient`` that wraps every transport it builds or
is given (the default one, proxy transports from the environment or from
``proxy=``, every ``mounts=`` transport, and ``transport=``)::

    from autothrottle.httpx2 import AsyncThrottledClient

    async with AsyncThrottledClient(throttle=throttle, mounts={...}) as client:
        ...  # env proxies still apply; every route is throttled

How the adapter behaves:

* **Per-request options**: ``extensions={"autothrottle": {...}}`` (keys
  ``adjust``, ``bypass``, ``slot``) and the header ``X-AutoThrottle:
  no-adjust | bypass | slot=NAME``; the header is removed before the request
  is sent. Malformed options raise ``TypeError``/``ValueError`` before anything
  is sent or held.
* **Latency** is measured from httpcore2's ``trace`` events: from
  ``send_request_headers.started`` (a connection is ready, new or taken from the
  pool) to ``receive_response_headers.complete``, so time spent waiting in the
  throttle or in httpx2's connection pool does not count. A ``trace`` callback
  you set yourself is still called with the same arguments. Inner transports
  that emit no trace events (mocks) fall back to the time the inner transport
  took to return the response.
* **In flight** lasts until the body is fully read or the response is closed.
  A response that is never closed is released when it is garbage-collected,
  and in any case after the throttle's ``hold_timeout`` (300 s by default).
* **Errors** (refused connection, httpx2 timeouts, ...) release the slot and
  count as a failure; **cancellation** releases it and counts nothing.
* **Redirects** are followed by the client, which calls the transport once per
  hop, so every hop waits on its own host's slot. Per-request options (the
  extension and the header) apply to every hop.
* **Mocks**: under ``respx.mock`` in either mode (``using="httpcore2"``, the
  default, replaces httpcore2's pool; ``using="httpx2"`` swaps the client's
  transport per request, which :class:`AsyncThrottledClient` wraps too) and with
  ``httpx2.MockTransport`` as ``inner``, requests are still paced and counted;
  latency is the fallback above. A plain ``httpx2.AsyncClient(transport=
  AsyncThrottledTransport(...))`` under ``using="httpx2"`` is not paced: respx
  replaces the transport itself; use :class:`AsyncThrottledClient`.
* **What the throttle did** is on ``response.extensions["autothrottle"]``: a
  :class:`~autothrottle.ThrottleInfo` (slot, seconds waited, grant time,
  whether it adjusts).

For threads, :class:`ThrottledTransport` and :class:`ThrottledClient`
do the same for ``httpx2.Client``, on the same engine: threads of one process,
and async clients, share slots when they share the throttle.

``autothrottle.httpx2`` offers the same four classes for ``httpx2``, the fork
of httpx2 with the same API, generated from the same source.
"""

from __future__ import annotations

try:
    import httpx2 as _needed  # noqa: F401  (the extra this module needs)
except ImportError as _missing:  # pragma: no cover - depends on the environment
    from ._extras import missing_extra_error

    raise missing_extra_error("autothrottle.httpx2", "httpx2", "httpx2") from _missing

from ._httpx2._async import AsyncThrottledClient, AsyncThrottledTransport
from ._httpx2._common import ThrottlePoolTimeout
from ._httpx2._sync import ThrottledClient, ThrottledTransport

__all__ = [
    "AsyncThrottledClient",
    "AsyncThrottledTransport",
    "ThrottlePoolTimeout",
    "ThrottledClient",
    "ThrottledTransport",
]

# Tracebacks and reprs name the public module (as httpx2 does for its own classes).
for _name in __all__:
    globals()[_name].__module__ = __name__

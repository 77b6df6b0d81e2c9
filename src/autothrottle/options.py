"""Per-request control: what one request may ask of the throttle.

Pass the options as a dict under ``"autothrottle"`` in httpx's ``extensions`` or
aiohttp's ``trace_request_ctx``, or as the ``X-AutoThrottle`` header
(:data:`CONTROL_HEADER`, removed before the request goes on the wire);
:class:`RequestOptions` is what either form is read into.
"""

from ._request import CONTROL_HEADER, RequestOptions

__all__ = ["CONTROL_HEADER", "RequestOptions"]

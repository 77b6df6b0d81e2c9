"""What a simulated host sends back: a :class:`Reply`, its pages, and the CAPTCHA page.

Every page is a small HTML page with a few links (so link-following crawlers
have a site); a soft block is a fast 200 CAPTCHA page that only its body tells
apart (:func:`is_blocked_page`). :func:`share` gives each path a stable number,
which decides per path whether it is a cache hit or a slow page.
"""

from __future__ import annotations

import hashlib
import html
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["BLOCK_MARKER", "CAPTCHA_PAGE", "Reply", "is_blocked_page", "page", "share"]


@dataclass(frozen=True, slots=True)
class Reply:
    """What a runtime answers; the server makes the HTTP response."""

    status: int
    body: bytes
    outcome: str = "ok"
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str = "text/html"


#: Marker in every CAPTCHA page; what :func:`is_blocked_page` looks for.
BLOCK_MARKER = "autothrottle-sim-captcha"

CAPTCHA_PAGE = (
    "<!doctype html><html><head><title>Just a moment...</title>"
    '<meta name="robots" content="noindex"></head><body>'
    "<h1>Please verify you are a human</h1>"
    "<p>Unusual traffic was detected from your network. "
    "Complete the challenge below to continue.</p>"
    f'<form id="{BLOCK_MARKER}" method="post" action="/challenge">'
    '<div class="captcha-box">[ ] I am not a robot</div>'
    '<button type="submit">Continue</button></form></body></html>'
).encode()
_BLOCK_MARKER_BYTES = BLOCK_MARKER.encode()


def is_blocked_page(body: bytes | str) -> bool:
    """Whether ``body`` is a soft-block (CAPTCHA) page from a :class:`SoftBlock` host.

    Soft blocks come with status 200 and arrive fast, so only the body tells
    them apart; a crawler under test calls this to classify what it got.
    """
    if isinstance(body, str):
        return BLOCK_MARKER in body
    return _BLOCK_MARKER_BYTES in body


def page(host: str, target: str) -> bytes:
    """A small HTML page with a few links, so link-following crawlers have a site."""
    path = html.escape(target.split("?", 1)[0])
    tail = path.rstrip("/").rsplit("/", 1)[-1]
    n = int(tail) if tail.isdigit() and len(tail) < 12 else 0
    links = "".join(
        f'<li><a href="/page/{k}">page {k}</a></li>' for k in (n + 1, 2 * n + 2, 2 * n + 3)
    )
    return (
        f"<!doctype html><html><head><title>{host} {path}</title></head><body>"
        f"<h1>{path}</h1><p>A page of simulated host {host}.</p><ul>{links}</ul>"
        "</body></html>"
    ).encode()


def share(salt: str, target: str) -> float:
    """A stable number in [0, 1) for a path: decides hit/miss, fast/slow per path."""
    digest = hashlib.blake2b(target.encode(), digest_size=8, person=salt.encode()).digest()
    return int.from_bytes(digest, "big") / 2.0**64

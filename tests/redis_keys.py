"""Key prefixes of a test's own on the shared Redis, their keys deleted when it ends.

The suite's Redis (127.0.0.1:6379, db 0) is shared by every run on the
machine, and a store's keys live a day (its ``ttl``): left behind, a run's
ten thousand keys pile up run after run. A test names each prefix it uses
with :func:`fresh_prefix`; the autouse fixture of ``conftest.py`` calls
:func:`delete_made` once the test and all its fixtures are done, so a test
of expiry sees its keys expire before they go, and a store closed by a
fixture has sent its last change.

A prefix lives for the test that made it: one made outside a test (at
import, in a module-scoped fixture) is deleted after the next test ends.
"""

from __future__ import annotations

import re
import threading
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the redis extra is not every test's
    import redis

REDIS_URL = "redis://127.0.0.1:6379/0"

_made: list[str] = []
_lock = threading.Lock()  # a prefix may be made in a test's thread


def fresh_prefix(start: str = "test") -> str:
    """``start-<32 hex digits>``: a prefix no other test or run uses, its keys
    deleted at the end of the test (:func:`delete_made`)."""
    name = f"{start}-{uuid.uuid4().hex}"
    with _lock:
        _made.append(name)
    return name


def starts(prefix: str) -> tuple[str, ...]:
    """How every key under ``prefix`` starts: ``prefix`` (the keys a test sets
    itself), ``{prefix`` (the store's slot keys, one hash tag each:
    ``{prefix:slot}:s``, ``:l``, ``:p``) and ``autothrottle:prefix`` (the
    store's namespace, where its pause channel is named)."""
    return prefix, f"{{{prefix}", f"autothrottle:{prefix}"


def delete_under(client: redis.Redis, prefix: str) -> int:
    """Delete (UNLINK) every key under ``prefix`` through the sync ``client``; how many.

    One SCAN of the keys that hold ``prefix`` anywhere (its glob characters
    escaped), those that start as :func:`starts` says kept."""
    pattern = "*" + re.sub(r"([*?\[\]\\])", r"\\\1", prefix) + "*"
    forms = starts(prefix)
    found: list[Any] = [
        key
        for key in client.scan_iter(match=pattern, count=1000)
        if (key.decode(errors="replace") if isinstance(key, bytes) else key).startswith(forms)
    ]
    return sum(int(client.unlink(*found[at : at + 500])) for at in range(0, len(found), 500))


def delete_made() -> int:
    """Delete the keys of every prefix made since the last call; how many.

    Nothing to do (no prefix made) costs no connection. Without the redis
    package or a Redis to reach, the test that made the prefix has skipped
    or failed saying so: nothing is left to delete."""
    with _lock:
        made = _made[:]
        _made.clear()
    if not made:
        return 0
    try:
        import redis
    except ImportError:
        return 0
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1.0, socket_timeout=10.0)
    try:
        return sum(delete_under(client, prefix) for prefix in made)
    except redis.ConnectionError:
        return 0
    finally:
        client.close()

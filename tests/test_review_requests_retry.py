"""An error urllib3 reads and does not retry, under the requests adapter's
retries: it is read once as it leaves the pool (``Attempts.raised``), and what
the adapter then sees raised is not counted again, nor its lease let go twice.

The cases are urllib3's ways of giving up on an error at once: a method its
``Retry`` does not retry, on a read error, a ``read`` count of 0, and retries run
out on a connection dropped each time. The host is an ``http.server`` on a
loopback address (test_requests_retry.py's), the throttle's counts asserted.
"""

from __future__ import annotations

from typing import Any

import pytest
import requests
from urllib3.util.retry import Retry

from test_requests_retry import DROP, ScriptedHost, counts, fixed, host, session_with

__all__ = ["host"]

ONCE = {"sent": 1, "responses": 0, "failures": 1, "backoffs": 1, "in_flight": 0, "queued": 0}


def _sent(throttle: Any) -> dict[str, int]:
    got = counts(throttle)
    del got["pauses"]
    return got


@pytest.mark.parametrize(
    ("method", "retries"),
    [
        ("GET", Retry(total=3, allowed_methods={"PUT"}, backoff_factor=0)),  # a method not retried
        ("GET", Retry(total=3, read=0, backoff_factor=0)),  # no read retry left
        ("GET", Retry(total=3, read=False, backoff_factor=0)),  # read errors raised as they are
    ],
)
def test_a_dropped_answer_urllib3_does_not_retry_is_counted_once(
    host: ScriptedHost, method: str, retries: Retry
) -> None:
    host.scripts["/dropped"] = [(DROP, {}, 0.0)]
    throttle = fixed(0.0, max_concurrency=1)
    with session_with(throttle, retries) as session:
        with pytest.raises(requests.ConnectionError):
            session.request(method, host.url("/dropped"))
        assert _sent(throttle) == ONCE
        # Nothing held: a request after it goes, under the cap of 1.
        assert session.get(host.url("/after"), timeout=5).status_code == 200
    assert _sent(throttle) == {**ONCE, "sent": 2, "responses": 1}


def test_retries_run_out_on_dropped_answers_each_counted_once(host: ScriptedHost) -> None:
    host.scripts["/dropped"] = [(DROP, {}, 0.0)]
    throttle = fixed(0.0, max_concurrency=1)
    with session_with(throttle, Retry(total=2, backoff_factor=0)) as session:
        with pytest.raises(requests.ConnectionError):
            session.get(host.url("/dropped"))
        assert len(host.times("/dropped")) == 3
        assert _sent(throttle) == {**ONCE, "sent": 3, "failures": 3, "backoffs": 3}
        assert session.get(host.url("/after"), timeout=5).status_code == 200


def test_a_read_timeout_not_retried_is_counted_once(host: ScriptedHost) -> None:
    host.scripts["/slow"] = [(200, {}, 1.0)]
    throttle = fixed(0.0, max_concurrency=1)
    with session_with(throttle, Retry(total=3, read=0, backoff_factor=0)) as session:
        with pytest.raises(requests.ConnectionError):
            session.get(host.url("/slow"), timeout=0.2)
        got = _sent(throttle)
        assert (got["sent"], got["failures"], got["in_flight"], got["queued"]) == (1, 1, 0, 0)

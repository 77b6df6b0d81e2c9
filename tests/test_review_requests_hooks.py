"""The requests adapter's hook guard with one prepared request sent by two
threads at once: its hooks dict is shared, and so is the guard
(``_guard_hooks`` in ``autothrottle/requests.py``), which knows each dispatch
by its response. Here one thread's dispatch waits until the other thread's
response was sent, guarded and dispatched: that dispatch must leave the guard
in place for the first, whose hook then raises, and whose response is
finished and its slot handed back while the error is kept.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
import requests.hooks
import requests.sessions

from autothrottle import FixedDelayPolicy, Throttle
from autothrottle.requests import ThrottledHTTPAdapter
from loopback import LoopbackHost, promptly, running_hosts


@pytest.fixture
def host() -> Iterator[LoopbackHost]:
    with running_hosts(1) as started, promptly():
        yield started[0]


@pytest.mark.parametrize("stream", [False, True])
def test_a_dispatch_in_one_thread_keeps_the_guard_of_the_others_response(
    host: LoopbackHost, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    throttle = Throttle(policy=FixedDelayPolicy(0.0), max_concurrency=2, hold_timeout=600.0)
    first_answered, second_dispatched = threading.Event(), threading.Event()
    ran: list[str] = []
    dispatch = requests.hooks.dispatch_hook

    def hook(response: requests.Response, **kwargs: Any) -> None:
        name = threading.current_thread().name
        ran.append(name)
        if name == "first":
            raise ValueError("the hook's own")

    def dispatching(key: str, hooks: Any, data: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "first":
            first_answered.set()
            assert second_dispatched.wait(10)
            return dispatch(key, hooks, data, **kwargs)
        try:
            return dispatch(key, hooks, data, **kwargs)
        finally:
            second_dispatched.set()

    monkeypatch.setattr(requests.sessions, "dispatch_hook", dispatching)
    session = requests.Session()
    session.mount("http://", ThrottledHTTPAdapter(throttle=throttle))
    request = session.prepare_request(
        requests.Request("GET", host.url("/stream/2/10"), hooks={"response": [hook]})
    )
    own = request.hooks["response"]

    def send(name: str) -> Any:
        threading.current_thread().name = name
        if name == "second":
            assert first_answered.wait(10)
        try:
            return session.send(request, stream=stream, timeout=10)
        except ValueError as error:
            return error  # kept: it refers to the response

    with session, ThreadPoolExecutor(2) as pool:
        first, second = pool.submit(send, "first"), pool.submit(send, "second")
        kept, answered = first.result(timeout=30), second.result(timeout=30)
        assert isinstance(kept, ValueError)
        assert isinstance(answered, requests.Response) and answered.status_code == 200
        answered.close()
        snapshot = throttle.slot(host.address).snapshot()
        assert (snapshot.in_flight, snapshot.queued, snapshot.sent) == (0, 0, 2)
    assert sorted(ran) == ["first", "second"]
    assert request.hooks["response"] is own

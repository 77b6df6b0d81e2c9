"""A response hook that raises under the requests adapter: the response it leaves
unread is finished and its slot handed back, however the session is made.

requests dispatches a request's response hooks after the adapter returned and
before it reads the body: a hook that raises leaves the response unread, held
by nothing but the error. ``ThrottledSession`` finishes it in its own
``send``; under a plain ``requests.Session`` (or a subclass of it, or one
whose ``send`` an instrumentation wrapped) the adapter guards the hooks of the
dispatch to come (``_guard_hooks`` in ``autothrottle/requests.py``). An
interrupt (``KeyboardInterrupt``'s kind) is handled as any error, and one that
lands before the dispatch leaves nothing held by the guard.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import requests.sessions

from autothrottle import FixedDelayPolicy, Throttle
from autothrottle.requests import ThrottledHTTPAdapter, ThrottledSession
from helpers import held, wait_for
from loopback import LoopbackHost, promptly, running_hosts


@pytest.fixture
def host() -> Iterator[LoopbackHost]:
    with running_hosts(1) as started, promptly():
        yield started[0]


class Interrupted(BaseException):
    """KeyboardInterrupt's kind (not an ``Exception``), without pytest's meaning."""


class SendingOnItsOwn(requests.Session):
    """A session subclass whose ``send`` does its own work around requests'."""

    sent = 0

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        SendingOnItsOwn.sent += 1
        response = super().send(request, **kwargs)
        response.headers["X-Sent-On-Its-Own"] = "yes"
        return response


def session_of(kind: str, throttle: Throttle) -> requests.Session:
    if kind == "throttled":
        return ThrottledSession(throttle=throttle)
    session = SendingOnItsOwn() if kind == "subclass" else requests.Session()
    session.mount("http://", ThrottledHTTPAdapter(throttle=throttle))
    return session


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("raised", [Interrupted, ValueError])
@pytest.mark.parametrize("kind", ["plain", "subclass", "throttled"])
def test_a_first_hook_that_raises_closes_the_response_and_hands_the_slot_back(
    host: LoopbackHost, kind: str, raised: type[BaseException], stream: bool
) -> None:
    """The first of two hooks raises (an interrupt, or an error): the second never
    runs, the slot is free while the error is kept, and the request's hooks are
    the caller's own again."""
    throttle = Throttle(policy=FixedDelayPolicy(0.0), max_concurrency=1)
    ran: list[str] = []

    def first(response: requests.Response, **kwargs: Any) -> None:
        ran.append("first")
        raise raised("the hook's own")

    def second(response: requests.Response, **kwargs: Any) -> None:
        ran.append("second")

    hooks = [first, second]
    with session_of(kind, throttle) as session:
        request = session.prepare_request(
            requests.Request("GET", host.url("/stream/2/10"), hooks={"response": hooks})
        )
        own = request.hooks["response"]  # the session's copy of the caller's list
        with pytest.raises(raised) as caught:
            session.send(request, stream=stream)
        assert held(throttle, host) == (0, 0)  # the error kept (caught), the slot free
        assert request.hooks["response"] is own
        assert session.get(host.url("/after")).status_code == 200
    assert ran == ["first"]
    assert caught.value.args == ("the hook's own",)


def test_an_interrupt_before_the_dispatch_leaves_nothing_held_by_the_guard(
    host: LoopbackHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt that lands after the adapter returned and before requests
    dispatches the hooks (here: requests' ``dispatch_hook`` raises it): no hook
    runs, so no guard finishes the response; once the error is let go, the
    response is collected and its slot handed back, though the request (and
    its hooks dict, where the guard waits for a dispatch) is kept, and with no
    collection of cycles."""
    throttle = Throttle(policy=FixedDelayPolicy(0.0), max_concurrency=1, hold_timeout=600.0)

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise Interrupted

    def hook(response: requests.Response, **kwargs: Any) -> None:
        pass

    hooks = [hook]
    with session_of("plain", throttle) as session:
        request = session.prepare_request(
            requests.Request("GET", host.url("/stream/2/10"), hooks={"response": hooks})
        )
        own = request.hooks["response"]
        monkeypatch.setattr(requests.sessions, "dispatch_hook", interrupted)
        gc_was = gc.isenabled()
        gc.disable()
        try:
            with pytest.raises(Interrupted) as caught:
                session.send(request, stream=True)
            assert held(throttle, host) == (1, 0)  # the error keeps the response
            del caught
            assert request.hooks["response"] is own  # put back as the response went
            wait_for(lambda: held(throttle, host) == (0, 0))
        finally:
            if gc_was:
                gc.enable()
        monkeypatch.undo()
        # The next dispatch of the same request finds its hooks as they were.
        assert session.send(request).status_code == 200
        assert request.hooks["response"] is own
    assert held(throttle, host) == (0, 0)


INSTRUMENTED_FIRST = """
import functools, sys
import requests

sends = []
original = requests.Session.send

@functools.wraps(original)
def instrumented(self, request, **kwargs):  # as a tracing library wraps it
    sends.append(request.url)
    return original(self, request, **kwargs)

requests.Session.send = instrumented

from autothrottle import FixedDelayPolicy, Throttle
from autothrottle.requests import ThrottledHTTPAdapter

throttle = Throttle(policy=FixedDelayPolicy(0.0), max_concurrency=1, hold_timeout=600.0)
session = requests.Session()
session.mount("http://", ThrottledHTTPAdapter(throttle=throttle))

def raising(response, **kwargs):
    raise ValueError("the hook's own")

try:
    session.get(sys.argv[1], hooks={"response": raising})
except ValueError as error:
    kept = error
snapshot = throttle.slot(sys.argv[2]).snapshot()
print(len(sends), snapshot.in_flight, snapshot.queued)
"""


def test_a_session_send_wrapped_before_the_import_is_still_guarded(host: LoopbackHost) -> None:
    """A tracing library that wraps ``requests.Session.send`` before
    ``autothrottle.requests`` is imported: the adapter still knows requests'
    own ``send`` calls it, and a hook that raises finds its slot handed back
    while the error is kept (in a process of its own: the import order is
    the point)."""
    done = subprocess.run(
        [sys.executable, "-c", INSTRUMENTED_FIRST, host.url("/stream/2/10"), host.address],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.split() == ["1", "0", "0"]

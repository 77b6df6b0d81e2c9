"""The requests adapter driven as a threaded program drives it, against real loopback servers.

One session shared by many threads, a response left open, a hook that raises,
the session closed under waiting threads, a thread interrupted while it waits,
``max_wait`` in threads: after each, the slot's queue moved in order and
nothing is held (``in_flight`` and ``queued`` back to 0).
"""

from __future__ import annotations

import ctypes
import gc
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from autothrottle import FixedDelayPolicy, Throttle, ThrottleTimeout
from autothrottle.requests import ThrottledHTTPAdapter, ThrottledSession, throttle_info
from autothrottle.testing import VirtualClock
from helpers import held, wait_for
from loopback import LoopbackHost, promptly, running_hosts


@pytest.fixture
def host() -> Iterator[LoopbackHost]:
    with running_hosts(1) as started, promptly():
        yield started[0]


def fixed(delay: float, **kwargs: Any) -> Throttle:
    return Throttle(policy=FixedDelayPolicy(delay), **kwargs)


# -- one session, sixteen threads ----------------------------------------------------


def test_sixteen_threads_on_one_session_go_in_the_order_they_queued_under_the_cap(
    host: LoopbackHost,
) -> None:
    """Two open streams fill the cap of 2; sixteen threads then queue one after
    another; closing the streams lets them go, each granted (``sent_at``) in
    the order it queued, never more than two at the host."""
    throttle = fixed(0.0, max_concurrency=2)
    with ThrottledSession(throttle=throttle, pool_maxsize=16) as session:
        streams = [session.get(host.url("/stream/2/10"), stream=True) for _ in range(2)]
        with ThreadPoolExecutor(16) as pool:
            calls = []
            for n in range(16):
                calls.append(pool.submit(session.get, host.url(f"/delay/20?n={n}")))
                wait_for(lambda n=n: held(throttle, host) == (2, n + 1))
            # Sent whole (the server is done), though unread: the host serves none
            # then, and at most two from the closes on.
            wait_for(lambda: host.in_service == 0)
            for stream in streams:
                stream.close()
            responses = [call.result(timeout=30) for call in calls]
    granted = [info.sent_at for info in map(throttle_info, responses) if info is not None]
    assert len(granted) == 16
    assert granted == sorted(granted)
    assert [r.status_code for r in responses] == [200] * 16
    assert host.max_in_service <= 2
    assert held(throttle, host) == (0, 0)


# -- a response left open ------------------------------------------------------------------


def test_a_stream_never_read_nor_closed_holds_its_slot_until_hold_timeout(
    host: LoopbackHost,
) -> None:
    throttle = fixed(0.0, max_concurrency=1, hold_timeout=0.5)
    with ThrottledSession(throttle=throttle) as session:
        left_open = session.get(host.url("/stream/50/20"), stream=True)
        started = time.monotonic()
        after = session.get(host.url("/after"))  # the cap of 1 is the open stream's
        waited = time.monotonic() - started
        left_open.close()  # long expired: releases nothing more
    assert after.status_code == 200
    assert 0.45 <= waited < 10.0
    assert held(throttle, host) == (0, 0)
    assert throttle.slot(host.address).snapshot().sent == 2


LEFT_OPEN_AT_EXIT = """
import sys, threading
from autothrottle import FixedDelayPolicy, Throttle
from autothrottle.requests import ThrottledSession

throttle = Throttle(policy=FixedDelayPolicy(0.0), max_concurrency=1, hold_timeout=0.5)
session = ThrottledSession(throttle=throttle)
response = session.get(sys.argv[1] + "/stream/50/20", stream=True)
waiting = threading.Thread(target=session.get, args=(sys.argv[1] + "/behind",))
waiting.start()  # not a daemon: the interpreter waits for it at exit
print("exiting", flush=True)
"""


def test_a_stream_left_open_at_exit_leaks_nothing_and_lets_the_process_end(
    host: LoopbackHost, tmp_path: Path
) -> None:
    """A module-level stream never closed, and a thread queued behind it: the
    thread goes once ``hold_timeout`` passes, and the process ends with no
    warning under ``-X dev`` (an unclosed socket or file, an error in a
    release thread)."""
    script = tmp_path / "left_open.py"
    script.write_text(LEFT_OPEN_AT_EXIT)
    done = subprocess.run(
        [sys.executable, "-X", "dev", str(script), host.origin],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "exiting\n", "")
    assert [a.path for a in host.arrivals] == ["/stream/50/20", "/behind"]


# -- an error in a hook -------------------------------------------------------------------


def raising_hook(response: requests.Response, *args: Any, **kwargs: Any) -> None:
    raise ValueError("the hook's own")


@pytest.mark.parametrize("stream", [False, True])
def test_a_hook_that_raises_hands_the_slot_back_though_its_error_is_kept(
    host: LoopbackHost, stream: bool
) -> None:
    """requests runs the response hooks after the adapter returned the response
    and before reading its body: the error holds the response (through its
    traceback), and an error kept (a thread pool's future keeps it) held the
    slot until ``hold_timeout``. Never handed to the caller, it is closed."""
    throttle = fixed(0.0, max_concurrency=1)
    with ThrottledSession(throttle=throttle) as session, ThreadPoolExecutor(2) as pool:
        failed = [
            pool.submit(
                session.get,
                host.url(),
                hooks={"response": raising_hook},
                stream=stream,
                autothrottle={"max_wait": 5.0},
            )
            for _ in range(2)
        ]
        errors = [call.exception(timeout=30) for call in failed]
        assert held(throttle, host) == (0, 0)
        after = session.get(host.url("/after"), autothrottle={"max_wait": 5.0})
    assert all(isinstance(error, ValueError) for error in errors)
    assert after.status_code == 200


def raise_for_status(response: requests.Response, *args: Any, **kwargs: Any) -> None:
    response.raise_for_status()


def test_a_raise_for_status_hook_leaves_the_response_readable_and_the_slot_free(
    host: LoopbackHost,
) -> None:
    """The error carries the response (``HTTPError.response``): its body is read,
    as requests reads it before returning, so the caller can still read it and
    the slot is free however long the error is kept."""
    throttle = fixed(0.0, max_concurrency=1)
    with ThrottledSession(throttle=throttle) as session:
        session.hooks["response"].append(raise_for_status)
        with pytest.raises(requests.HTTPError) as caught:
            session.get(host.url("/status/503"))
        assert held(throttle, host) == (0, 0)
        assert caught.value.response is not None
        assert caught.value.response.text == "status"
        with pytest.raises(requests.HTTPError) as streamed:
            session.get(host.url("/status/503"), stream=True)
        assert held(throttle, host) == (1, 0)  # streamed: the caller's, as any stream
        assert streamed.value.response is not None
        streamed.value.response.close()
        assert held(throttle, host) == (0, 0)


def plain_session(throttle: Throttle) -> requests.Session:
    session = requests.Session()
    session.mount("http://", ThrottledHTTPAdapter(throttle=throttle))
    return session


@pytest.mark.parametrize("stream", [False, True])
def test_a_hook_that_raises_on_a_plain_session_hands_the_slot_back(
    host: LoopbackHost, stream: bool
) -> None:
    """The same through a plain ``requests.Session`` with the adapter mounted:
    the adapter guards the hooks of the one dispatch, and the request's hooks
    are the caller's own again before any of them runs and after."""
    throttle = fixed(0.0, max_concurrency=1)
    seen: list[object] = []

    def looking(response: requests.Response, *args: Any, **kwargs: Any) -> None:
        seen.append(response.request.hooks["response"])

    with plain_session(throttle) as session, ThreadPoolExecutor(2) as pool:
        hooks = [looking, raising_hook]
        wait_at_most = {"X-AutoThrottle": "max-wait=5"}
        prepared = [
            session.prepare_request(
                requests.Request("GET", host.url(), headers=wait_at_most, hooks={"response": hooks})
            )
            for _ in range(2)
        ]
        lists = [request.hooks["response"] for request in prepared]
        failed = [pool.submit(session.send, request, stream=stream) for request in prepared]
        errors = [call.exception(timeout=30) for call in failed]
        assert held(throttle, host) == (0, 0)
        after = session.get(host.url("/after"), headers=wait_at_most)
    assert all(isinstance(error, ValueError) for error in errors), errors
    assert after.status_code == 200
    assert [request.hooks["response"] for request in prepared] == lists == [hooks, hooks]
    assert all(a is b for a, b in zip(seen, lists, strict=True))


def test_a_raise_for_status_hook_on_a_plain_session_leaves_the_response_readable(
    host: LoopbackHost,
) -> None:
    throttle = fixed(0.0, max_concurrency=1)
    with plain_session(throttle) as session:
        session.hooks["response"].append(raise_for_status)
        with pytest.raises(requests.HTTPError) as caught:
            session.get(host.url("/status/503"))
        assert held(throttle, host) == (0, 0)
        assert caught.value.response is not None
        assert caught.value.response.text == "status"
        assert session.get(host.url("/")).status_code == 200  # hooks that pass: as ever
    assert held(throttle, host) == (0, 0)


def test_one_prepared_request_sent_from_two_threads_at_once_keeps_each_guard_its_own(
    host: LoopbackHost,
) -> None:
    """The same ``PreparedRequest`` sent by two threads at once shares one hooks
    dict: both adapters have answered before either dispatches its hooks. The
    hook raises in one thread only. In either order of their dispatches, the
    other thread's stream is its own to read, and nothing is held after."""
    throttle = fixed(0.0, max_concurrency=2)
    both_answered = threading.Barrier(2, timeout=10)

    class Waiting(ThrottledHTTPAdapter):
        def send(self, *args: Any, **kwargs: Any) -> requests.Response:
            response = super().send(*args, **kwargs)
            both_answered.wait()
            return response

    for _ in range(6):  # either thread may dispatch first
        both_answered.reset()
        session = requests.Session()
        session.mount("http://", Waiting(throttle=throttle))
        with session:
            request = session.prepare_request(
                requests.Request(
                    "GET", host.url("/stream/2/10"), hooks={"response": [raise_in_one]}
                )
            )
            hooks = request.hooks["response"]
            outcome = sent_at_once(session, request, ("raising", "reading"))
            assert isinstance(outcome["raising"], ValueError)
            assert outcome["reading"] == b"x" * 32
            assert held(throttle, host) == (0, 0)
            assert request.hooks["response"] is hooks


def raise_in_one(response: requests.Response, *args: Any, **kwargs: Any) -> None:
    if threading.current_thread().name == "raising":
        raise ValueError("the hook's own")


def sent_at_once(
    session: requests.Session, request: requests.PreparedRequest, names: tuple[str, ...]
) -> dict[str, Any]:
    """``request`` sent by one thread of each name at once, streamed: each
    thread's body read, or the error it raised."""
    outcome: dict[str, Any] = {}

    def send(name: str) -> None:
        try:
            outcome[name] = session.send(request, stream=True).content
        except BaseException as error:
            outcome[name] = error

    threads = [threading.Thread(target=send, args=(n,), name=n) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return outcome


def test_a_hook_that_sends_again_by_hand_as_an_auth_does_leaves_the_hooks_the_callers(
    host: LoopbackHost,
) -> None:
    """A response hook that answers a 401 by sending a copy of the request on the
    adapter itself (``response.connection.send``, as requests' digest auth
    does): that send has no session to dispatch its hooks, so it is given no
    guard. The request the caller gets back carries the caller's own hooks,
    and a stream it drops unread is let go when it is dropped, not held by a
    guard's reference until a collection of cycles."""
    throttle = fixed(0.0, max_concurrency=1)

    def answer_401(response: requests.Response, **kwargs: Any) -> requests.Response | None:
        if response.status_code != 401:
            return None
        response.content  # noqa: B018 (read: its turn is let go)
        again = response.request.copy()
        again.prepare_url(host.url("/stream/2/10"), None)
        final: requests.Response = response.connection.send(again, **kwargs)
        final.history.append(response)
        final.request = again
        return final

    with plain_session(throttle) as session:
        hooks = [answer_401]
        gc_was = gc.isenabled()
        gc.disable()
        try:
            final = session.get(host.url("/status/401"), hooks={"response": hooks}, stream=True)
            assert final.status_code == 200
            assert final.request.hooks["response"] == hooks
            assert held(throttle, host) == (1, 0)
            del final
            wait_for(lambda: held(throttle, host) == (0, 0))
        finally:
            if gc_was:
                gc.enable()


def test_a_hook_that_sends_the_same_request_again_through_the_session_is_guarded_at_each_level(
    host: LoopbackHost,
) -> None:
    """A hook that sends its own response's request again through the plain
    session (one hooks dict, dispatched within its own dispatch), then raises:
    the inner dispatch is guarded as the outer one, the inner send raising in
    its turn; both slots are handed back, and the request's hooks are the
    caller's after."""
    throttle = fixed(0.0, max_concurrency=2)
    depth = []

    def again_then_raise(response: requests.Response, *args: Any, **kwargs: Any) -> None:
        depth.append(response.request.hooks["response"])
        if len(depth) == 1:
            with pytest.raises(ValueError, match="inner"):
                session.send(response.request)
            raise ValueError("outer")
        raise ValueError("inner")

    with plain_session(throttle) as session:
        hooks = [again_then_raise]
        request = session.prepare_request(
            requests.Request("GET", host.url(), hooks={"response": hooks})
        )
        own = request.hooks["response"]
        with pytest.raises(ValueError, match="outer"):
            session.send(request)
        assert held(throttle, host) == (0, 0)
    assert request.hooks["response"] is own
    assert depth == [own, own]


# -- the session closed, a thread interrupted -----------------------------------------------


def test_closing_the_session_while_threads_wait_leaves_nothing_held(host: LoopbackHost) -> None:
    """``Session.close`` closes its adapters' pools, which requests (and urllib3)
    make again on the next request: the threads that waited for their turn go
    on, and the slot ends empty."""
    throttle = fixed(0.02, max_concurrency=2)
    session = ThrottledSession(throttle=throttle)
    with ThreadPoolExecutor(12) as pool:
        calls = [pool.submit(session.get, host.url("/delay/100")) for _ in range(12)]
        wait_for(lambda: held(throttle, host)[1] > 0)
        session.close()
        outcomes = [call.result(timeout=30).status_code for call in calls]
    assert outcomes == [200] * 12
    assert held(throttle, host) == (0, 0)
    assert host.max_in_service <= 2


class Interrupted(BaseException):
    """KeyboardInterrupt's kind (not an ``Exception``), without pytest's meaning."""


def test_an_interrupt_of_the_main_thread_waiting_for_its_turn_leaves_the_queue_moving(
    host: LoopbackHost,
) -> None:
    """A signal handler raising in the main thread (Ctrl-C's way) while it
    waits behind a held slot: the main thread leaves the queue, and the thread
    queued behind it gets the turn once the slot is free."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    throttle = fixed(0.0, max_concurrency=1)
    main = threading.main_thread().ident
    assert main is not None
    behind: list[Future[requests.Response]] = []
    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        with ThrottledSession(throttle=throttle) as session, ThreadPoolExecutor(1) as pool:

            def queue_behind_then_interrupt() -> None:
                try:  # the main thread queued, then one behind it
                    wait_for(lambda: held(throttle, host) == (1, 1))
                    behind.append(pool.submit(session.get, host.url("/behind")))
                    wait_for(lambda: held(throttle, host) == (1, 2))
                finally:
                    signal.pthread_kill(main, signal.SIGUSR1)

            holder = session.get(host.url("/stream/50/20"), stream=True)
            helper = threading.Thread(target=queue_behind_then_interrupt)
            helper.start()
            with pytest.raises(Interrupted):
                session.get(host.url("/interrupted"))
            helper.join()
            assert held(throttle, host) == (1, 1)  # the holder, and the thread behind
            holder.close()
            assert behind[0].result(timeout=30).status_code == 200
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert [a.path for a in host.arrivals] == ["/stream/50/20", "/behind"]
    assert held(throttle, host) == (0, 0)


def raise_in(thread: threading.Thread, error: type[BaseException]) -> None:
    """Raise ``error`` in ``thread`` when it next runs Python code."""
    assert thread.ident is not None
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(error)
    )
    assert done == 1


def test_an_interrupt_in_a_thread_woken_for_its_turn_hands_the_turn_on(
    host: LoopbackHost,
) -> None:
    """The error raised in a waiting thread reaches it only when it wakes: as the
    slot is freed, at the moment its turn comes. The turn goes to the next
    thread in the queue, and nothing stays held."""
    throttle = fixed(0.0, max_concurrency=1)
    outcomes: dict[str, str] = {}

    def get(path: str) -> None:
        try:
            outcomes[path] = str(session.get(host.url(path)).status_code)
        except Interrupted:
            outcomes[path] = "interrupted"

    with ThrottledSession(throttle=throttle) as session:
        session.get(host.url("/warm"))  # imports done: raised in an import, it would hang it
        holder = session.get(host.url("/stream/50/20"), stream=True)
        threads = [threading.Thread(target=get, args=(path,)) for path in ("/first", "/second")]
        for n, thread in enumerate(threads):
            thread.start()
            wait_for(lambda n=n: held(throttle, host) == (1, n + 1))
        raise_in(threads[0], Interrupted)
        holder.close()
        for thread in threads:
            thread.join(30)
    assert outcomes == {"/first": "interrupted", "/second": "200"}
    assert [a.path for a in host.arrivals] == ["/warm", "/stream/50/20", "/second"]
    assert held(throttle, host) == (0, 0)


# -- max_wait in threads --------------------------------------------------------------------


def test_max_wait_in_threads_holds_to_the_clock_second(host: LoopbackHost) -> None:
    """Eight threads queue behind an open stream for a slot that lets one go a
    second, each with ``max_wait=3.5``, on a clock that skips the waits (none
    while the slot is at its cap, so all eight have queued before the first
    jump): the turns 1, 2 and 3 s after the stream's go; the other five time
    out 3.5 s after they queued, send nothing and hold nothing."""
    clock = VirtualClock()
    throttle = fixed(1.0, max_concurrency=1, clock=clock)
    with ThrottledSession(throttle=throttle) as session, ThreadPoolExecutor(8) as pool:
        holder = session.get(host.url("/stream/50/20"), stream=True)
        calls = []
        for n in range(8):
            calls.append(
                pool.submit(session.get, host.url("/turn"), autothrottle={"max_wait": 3.5})
            )
            wait_for(lambda n=n: held(throttle, host) == (1, n + 1))
        holder.close()
        errors = [call.exception(timeout=60) for call in calls]
    timeouts = [error for error in errors if error is not None]
    assert [error is None for error in errors] == [True] * 3 + [False] * 5
    for error in timeouts:
        assert isinstance(error, ThrottleTimeout)
        assert 3.5 <= error.waited < 3.55
    assert [a.path for a in host.arrivals] == ["/stream/50/20"] + ["/turn"] * 3
    waits = [wait.seconds for wait in clock.waits if wait.slot == host.address]
    assert waits[-3:] == pytest.approx([1.0, 2.0, 3.0], abs=0.3)
    assert held(throttle, host) == (0, 0)

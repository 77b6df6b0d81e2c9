"""The request skeleton (``_exchange.paced``): the order every adapter's request
goes through, and that whatever fails or is cancelled on the way releases."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from autothrottle import Lease, Throttle, ThrottleTimeout
from autothrottle._exchange import Exchange, Plug, paced, paced_blocking
from autothrottle._request import RequestOptions
from helpers import left_for_the_collector


class HostDown(OSError):
    """Stands for a client's connection error: the host's failure."""


class Answer:
    """Stands for a client's response."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.closed = False


class Recording(Plug[str, Answer, str]):
    """A plug that writes down each step it is asked for."""

    __slots__ = ("exchange", "observe_raises", "steps", "wire_raises")

    def __init__(self, observe_raises: bool = False, wire_raises: bool = False) -> None:
        self.exchange: Exchange | None = None  # the last request's
        self.steps: list[str] = []
        self.observe_raises = observe_raises
        self.wire_raises = wire_raises

    def host_failure(self, error: BaseException) -> bool:
        return isinstance(error, HostDown)

    def timed_out(self, error: ThrottleTimeout, request: str) -> BaseException:
        self.steps.append("timed out")
        return TimeoutError(f"{request}: {error}")

    def wire(self, exchange: Exchange, request: str) -> str:
        self.steps.append("wire")
        self.exchange = exchange
        if self.wire_raises:
            raise RuntimeError("a connection pool could not be made")
        return "wiring"

    def unwire(self, request: str, wiring: str) -> None:
        assert wiring == "wiring"
        self.steps.append("unwire")

    def respond(self, exchange: Exchange, response: Answer, wiring: str) -> Answer:
        self.steps.append("respond")
        if self.observe_raises:
            raise ValueError("a classifier of the user's raised")
        exchange.responded(response.status, {})
        exchange.lease.release()  # as if the body were finished at once
        return response

    def close(self, response: Answer) -> None:
        self.steps.append("close")
        response.closed = True


OPTIONS = RequestOptions()


def _sender(plug: Recording, outcome: Answer | BaseException) -> Callable[[str], Any]:
    def send(request: str) -> Answer:
        plug.steps.append("send")
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return send


def _async(send: Callable[[str], Answer]) -> Callable[[str], Any]:
    async def sending(request: str) -> Answer:
        return send(request)

    return sending


async def test_the_steps_come_in_order_and_the_response_teaches_the_slot() -> None:
    throttle, plug = Throttle(start_delay=0.0), Recording()
    answer = Answer()
    got = await paced(plug, throttle, "k", OPTIONS, None, _async(_sender(plug, answer)), "r")
    assert got is answer
    assert plug.steps == ["wire", "send", "unwire", "respond"]
    slot = throttle.slot("k")
    assert (slot.in_flight, slot.snapshot().responses, slot.snapshot().failures) == (0, 1, 0)


def test_the_blocking_skeleton_takes_the_same_steps() -> None:
    throttle, plug = Throttle(start_delay=0.0), Recording()
    paced_blocking(plug, throttle, "k", OPTIONS, None, _sender(plug, Answer()), "r")
    assert plug.steps == ["wire", "send", "unwire", "respond"]
    assert throttle.slot("k").snapshot().responses == 1


class Unwired(Recording):
    """A plug whose wiring leaves nothing to undo: it answers None."""

    __slots__ = ()

    def wire(self, exchange: Exchange, request: str) -> Any:
        super().wire(exchange, request)
        return None


async def test_a_wiring_of_none_is_not_undone_and_still_handed_to_respond() -> None:
    """An adapter with nothing to undo after sending (aiohttp's) answers None
    from ``wire``; the skeleton then makes no ``unwire`` call, on either path."""
    throttle, plug = Throttle(start_delay=0.0), Unwired()
    await paced(plug, throttle, "k", OPTIONS, None, _async(_sender(plug, Answer())), "r")
    paced_blocking(plug, throttle, "k", OPTIONS, None, _sender(plug, Answer()), "r")
    assert plug.steps == ["wire", "send", "respond"] * 2
    assert throttle.slot("k").snapshot().responses == 2


@pytest.mark.parametrize(
    ("error", "failures"), [(HostDown("refused"), 1), (ValueError("bad URL"), 0)]
)
def test_a_failed_send_releases_and_counts_only_the_hosts_failure(
    error: BaseException, failures: int
) -> None:
    throttle, plug = Throttle(start_delay=0.0), Recording()
    with pytest.raises(type(error)):
        paced_blocking(plug, throttle, "k", OPTIONS, None, _sender(plug, error), "r")
    assert plug.steps == ["wire", "send", "unwire"]
    snapshot = throttle.slot("k").snapshot()
    assert (snapshot.in_flight, snapshot.failures, snapshot.responses) == (0, failures, 0)


async def test_a_failed_observation_closes_the_response_and_releases() -> None:
    throttle, plug = Throttle(start_delay=0.0), Recording(observe_raises=True)
    answer = Answer()
    with pytest.raises(ValueError, match="classifier"):
        await paced(plug, throttle, "k", OPTIONS, None, _async(_sender(plug, answer)), "r")
    assert plug.steps == ["wire", "send", "unwire", "respond", "close"]
    assert answer.closed
    assert throttle.slot("k").in_flight == 0


async def test_a_failed_wiring_releases_the_turn_and_sends_nothing() -> None:
    throttle, plug = Throttle(start_delay=0.0), Recording(wire_raises=True)
    with pytest.raises(RuntimeError, match="pool"):
        await paced(plug, throttle, "k", OPTIONS, None, _async(_sender(plug, Answer())), "r")
    with pytest.raises(RuntimeError, match="pool"):
        paced_blocking(plug, throttle, "k", OPTIONS, None, _sender(plug, Answer()), "r")
    assert plug.steps == ["wire", "wire"]
    snapshot = throttle.slot("k").snapshot()
    assert (snapshot.in_flight, snapshot.failures, snapshot.responses) == (0, 0, 0)


async def test_a_request_cancelled_while_sending_releases_without_a_failure() -> None:
    throttle, plug = Throttle(start_delay=0.0), Recording()
    started = anyio.Event()

    async def send(request: str) -> Answer:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("never")

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(paced, plug, throttle, "k", OPTIONS, None, send, "r")
        await started.wait()
        assert throttle.slot("k").in_flight == 1
        tasks.cancel_scope.cancel()
    assert plug.steps == ["wire", "unwire"]
    snapshot = throttle.slot("k").snapshot()
    assert (snapshot.in_flight, snapshot.failures) == (0, 0)


async def test_a_turn_not_come_in_time_raises_the_plugs_error_and_sends_nothing() -> None:
    throttle, plug = Throttle(start_delay=0.0, max_concurrency=1), Recording()
    held = await throttle.acquire("k")
    with pytest.raises(TimeoutError, match="r: ") as caught:
        await paced(plug, throttle, "k", OPTIONS, 0.05, _async(_sender(plug, Answer())), "r")
    assert isinstance(caught.value.__cause__, ThrottleTimeout)
    assert plug.steps == ["timed out"]
    held.release()
    assert throttle.slot("k").in_flight == 0


async def test_a_turn_not_come_in_time_leaves_nothing_for_the_collector() -> None:
    # The error's traceback keeps the skeleton's frames: none of them may
    # keep the error, or the request waits in a cycle for a collection.
    throttle, plug = Throttle(start_delay=0.0, max_concurrency=1), Recording()
    held = await throttle.acquire("k")
    with left_for_the_collector() as left, pytest.raises(TimeoutError):
        await paced(plug, throttle, "k", OPTIONS, 0.01, _async(_sender(plug, Answer())), "r")
    held.release()
    assert left == []


def test_the_collector_check_judges_only_what_its_block_made() -> None:
    # A cycle from before the block that becomes garbage in it (an earlier
    # test's store, dropped, whose thread ends now) is not the block's: under
    # xdist it failed the test above one run in a few. One made in it is.
    before: list[object] = [Throttle()]
    before.append(before)
    with left_for_the_collector() as left:
        del before
    assert left == []
    with left_for_the_collector() as left:
        made: list[object] = [Throttle()]
        made.append(made)
        del made
    assert "autothrottle._throttle.Throttle" in left


@pytest.mark.parametrize("raised", ["timed out", "store failed"])
async def test_an_error_of_the_wire_turn_leaves_nothing_for_the_collector(
    raised: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fleet's wire turn may raise (a new turn past max_wait, the store's
    # error): the exchange that kept it and the skeleton's frame let it go.
    def wire_wait(lease: Lease) -> float:
        if raised == "timed out":
            raise ThrottleTimeout("k", 0.01)
        raise ConnectionError("the store is down")

    monkeypatch.setattr(Lease, "wire_wait", wire_wait)
    throttle, plug = Throttle(start_delay=0.0), Recording()

    async def send(request: str) -> Answer:
        assert plug.exchange is not None
        await plug.exchange.on_wire()
        raise AssertionError("never sent")

    with left_for_the_collector() as left:
        with pytest.raises((TimeoutError, ConnectionError)):
            await paced(plug, throttle, "k", OPTIONS, None, send, "r")
        plug.exchange = None
    assert left == []


class _NoAwait(Throttle):
    """A throttle whose ``acquire`` (the coroutine) must not be called: a free
    turn is taken by ``acquire_now``."""

    def acquire(self, key: str, **kwargs: Any) -> Any:
        raise AssertionError("a free turn built a coroutine")


@pytest.mark.parametrize("outcome", ["cancelled", "host failed", "caller's error"])
async def test_a_free_turn_taken_without_a_coroutine_is_released_whatever_happens(
    outcome: str,
) -> None:
    throttle, plug = _NoAwait(start_delay=0.0), Recording()
    started = anyio.Event()

    async def send(request: str) -> Answer:
        started.set()
        if outcome == "host failed":
            raise HostDown("reset")
        if outcome == "caller's error":
            raise ValueError("bad URL")
        await anyio.sleep_forever()
        raise AssertionError("never")

    async with anyio.create_task_group() as tasks:

        async def request() -> None:
            if outcome == "cancelled":
                await paced(plug, throttle, "k", OPTIONS, 1.0, send, "r")
                return
            with pytest.raises((HostDown, ValueError)):
                await paced(plug, throttle, "k", OPTIONS, 1.0, send, "r")

        tasks.start_soon(request)
        await started.wait()
        if outcome == "cancelled":
            assert throttle.slot("k").in_flight == 1
            tasks.cancel_scope.cancel()
    snapshot = throttle.slot("k").snapshot()
    assert (snapshot.sent, snapshot.in_flight) == (1, 0)
    assert snapshot.failures == (1 if outcome == "host failed" else 0)


async def test_a_turn_not_free_waits_in_the_queue_in_order() -> None:
    """The fast check takes no turn while one is queued or the slot is full:
    the request queues behind the waiting one (FIFO) and gets its turn when
    the slot frees."""
    throttle, plug = Throttle(start_delay=0.0, max_concurrency=1), Recording()
    held = throttle.acquire_now("k")
    assert held is not None
    order: list[str] = []

    async def first() -> None:
        lease = await throttle.acquire("k")
        order.append("first")
        lease.release()

    async def second() -> None:
        await paced(plug, throttle, "k", OPTIONS, None, _async(_sender(plug, Answer())), "r")
        order.append("second")

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(first)
        await anyio.wait_all_tasks_blocked()
        tasks.start_soon(second)
        await anyio.wait_all_tasks_blocked()
        assert throttle.slot("k").queued == 2
        assert throttle.acquire_now("k") is None  # nobody jumps the queue
        held.release()
    assert order == ["first", "second"]
    assert throttle.slot("k").in_flight == 0


def test_acquire_now_checks_its_arguments_before_taking_a_turn() -> None:
    throttle = Throttle(start_delay=0.0)
    with pytest.raises(ValueError, match="max_wait"):
        throttle.acquire_now("k", max_wait=-1.0)
    assert throttle.slot("k").sent == 0

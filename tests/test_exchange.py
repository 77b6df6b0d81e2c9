"""The request's hold (``_hold``): a lease released when its response is finished or collected.

Each test runs through :func:`watch`, the hold every adapter makes (one weak
reference to the owner that is the hold).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from autothrottle import Throttle
from autothrottle._exchange import Exchange, free_exchange
from autothrottle._hold import watch
from autothrottle._lease import Lease
from helpers import wait_until


class Response:
    """Stands for a client's response object: what the hold's life follows."""


def _watch(lease: Lease, owner: object) -> Any:
    return watch(owner, lease)


HOLDS = pytest.mark.parametrize("hold_of", [_watch], ids=["watch"])


@HOLDS
def test_release_is_once_and_forgets_the_owner(hold_of: Callable[[Lease, object], Any]) -> None:
    throttle = Throttle(start_delay=0.0, max_concurrency=1)
    owner = Response()
    hold = hold_of(throttle.acquire_blocking("k"), owner)
    hold.release()
    hold.release()
    assert throttle.slot("k").in_flight == 0
    next_lease = throttle.try_acquire("k")
    assert next_lease is not None
    del owner
    gc.collect()  # the finalizer was detached: the new lease is untouched
    assert throttle.slot("k").in_flight == 1
    next_lease.release()


@HOLDS
def test_an_owner_collected_in_a_thread_is_released_from_another_thread(
    hold_of: Callable[[Lease, object], Any],
) -> None:
    throttle = Throttle(start_delay=0.0)
    lease = throttle.acquire_blocking("k")
    released_by: list[str] = []
    lease.on_release = lambda: released_by.append(threading.current_thread().name)
    owner = Response()
    hold_of(lease, owner)
    del owner
    gc.collect()
    for _ in range(1000):
        if released_by:
            break
        time.sleep(0.01)
    assert released_by == ["autothrottle-release"]  # never inside the collector's thread
    assert throttle.slot("k").in_flight == 0


@HOLDS
async def test_an_owner_collected_under_a_loop_is_released_on_the_loop(
    hold_of: Callable[[Lease, object], Any],
) -> None:
    throttle = Throttle(start_delay=0.0)
    owner = Response()
    hold_of(await throttle.acquire("k"), owner)
    del owner
    gc.collect()
    assert throttle.slot("k").in_flight == 1  # deferred: the collector may be anywhere
    await wait_until(lambda: throttle.slot("k").in_flight == 0)


class Closer:
    """A caller's object that finishes the response when it is collected."""

    hold: Any
    owner: object

    def __del__(self) -> None:
        self.hold.release()


@HOLDS
async def test_a_release_by_a_finalizer_in_the_owners_collection_is_deferred(
    hold_of: Callable[[Lease, object], Any],
) -> None:
    """The collector may have run inside the gate's lock: a finalizer that
    finishes the response as it is collected releases later, on the loop."""
    throttle = Throttle(start_delay=0.0)
    owner, closer = Response(), Closer()
    closer.hold = hold_of(await throttle.acquire("k"), owner)
    closer.owner = owner
    owner.closer = closer  # type: ignore[attr-defined]  # a cycle: only the collector frees it
    del owner, closer
    gc.collect()
    assert throttle.slot("k").in_flight == 1
    await wait_until(lambda: throttle.slot("k").in_flight == 0)


def test_a_free_turns_exchange_is_the_exchange_its_class_makes() -> None:
    """A free turn's exchange is made without calling the class
    (``free_exchange``): every field as ``Exchange(..., free=True)`` sets it."""
    throttle = Throttle(start_delay=0.0)
    lease = throttle.try_acquire("example.com")
    assert lease is not None
    made = free_exchange(lease, 12.5, "example.com")
    spec = Exchange(lease, 12.5, "example.com", True)
    assert type(made) is Exchange

    def fields(exchange: Exchange) -> dict[str, Any]:
        slots = Exchange.__slots__
        return {name: getattr(exchange, name) for name in slots if hasattr(exchange, name)}

    assert fields(made) == fields(spec)
    # Set only when needed, read with getattr: the usual request pays nothing for them.
    assert set(fields(spec)) == set(Exchange.__slots__) - {"wire_error", "asked", "bound"}
    lease.release()


def test_the_wire_turn_asks_the_leases_own_check_first_as_the_lease_does() -> None:
    """``Exchange.wire_now`` passes a lease with no check of its own straight to
    its gate's wire turn, and one with a check (a fleet's, ``Lease.on_wire``)
    the lease's way: the answers are ``Lease.wire_wait``'s, step for step, on
    two throttles driven alike by one clock."""
    now = [100.0]

    def throttle() -> Throttle:
        return Throttle(start_delay=1.0, max_concurrency=4, clock=lambda: now[0])

    by_exchange, by_lease = throttle(), throttle()
    pairs = []
    for _ in range(3):  # three grants, the later ones spaced by the delay
        a, b = by_exchange.try_acquire("k"), by_lease.try_acquire("k")
        assert a is not None and b is not None
        pairs.append((Exchange(a, 0.0, "k"), b))
        now[0] += 1.0
    now[0] = 103.5  # the three go to the wire together: the later two are told to wait
    asked: list[float] = []

    def check() -> float:
        asked.append(now[0])
        return 0.25

    waits = []
    for exchange, lease in pairs:
        waits.append(exchange.wire_now())
        assert waits[-1] == lease.wire_wait()
        now[0] += 0.001
    assert waits[0] == 0.0 and waits[1] > 0.9 and waits[2] > 0.9
    exchange, lease = pairs[1]
    exchange.lease.on_wire = lease.on_wire = check  # a check of its own: asked first
    assert exchange.wire_now() == lease.wire_wait() == 0.25
    assert asked == [now[0], now[0]] and not exchange.wired
    exchange.lease.on_wire = lease.on_wire = None
    now[0] += 1.0
    assert exchange.wire_now() == lease.wire_wait() == 0.0
    assert exchange.wired
    for exchange, lease in pairs:
        exchange.lease.release()
        lease.release()


class _WireLease:
    """A lease whose wire turn is ``first`` seconds away once, then now."""

    def __init__(self, first: float) -> None:
        self.waits = [first]
        config = type("Config", (), {"max_wait": None})()
        self.slot = type("SlotView", (), {"key": "h.example", "config": config})()

    def wire_wait(self) -> float:
        return self.waits.pop() if self.waits else 0.0


@pytest.mark.parametrize("mode", ["async", "thread"])
def test_a_span_s_wait_counts_the_wait_for_the_wire_turn_too(mode: str) -> None:
    # The span says how much of a request's time was the throttle's: the wait
    # for its turn, and for its wire turn (rule 10) when it had one to wait,
    # as ThrottleInfo.waited does. Bounds one way each, so load cannot flip them.
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider: Any = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("test").start_as_current_span("GET"):
        asked = time.perf_counter() - 0.1  # its turn came 0.1 s after it asked
        exchange = Exchange(_WireLease(0.05), asked)  # type: ignore[arg-type]
        at_grant = exchange.waited
        if mode == "async":
            anyio.run(exchange.on_wire)
        else:
            exchange.on_wire_blocking()
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    noted = float(span.attributes["autothrottle.wait_s"])  # type: ignore[arg-type]
    assert at_grant >= 0.1
    assert at_grant + 0.05 <= noted <= exchange.waited, (at_grant, noted, exchange.waited)

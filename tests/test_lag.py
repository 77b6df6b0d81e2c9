"""The client's own lag is not the host's latency: the adaptive policy discounts it.

The rule is docs/signals.md, "The client's own lag": every slot's gate keeps
how late its heads come after a timed wait (``WireTurn.late``), and what of
that is past a timer's grain is the client's lag, handed to the policy with
each response (``Sample.lag``). ``AdaptiveConcurrencyPolicy`` judges a round's
rise in latency above the no-load latency plus that lag: a rise the client's
own lag explains is no queue at the host.

The policy is checked with plain numbers; the whole engine with a crawl on
looptime's fake-time loop of a host of ``WORKERS`` workers, each request
``SERVICE`` seconds, where a loaded client reads every answer late and lets
every timer fire late, each by an exponential lag of the same mean (the
model of ``benchmarks/lag_replay.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections.abc import Callable
from typing import Any

import pytest

from autothrottle import AdaptiveConcurrencyPolicy, Throttle
from autothrottle._wire import TIMER_GRAIN
from autothrottle.policy import Sample, SlotConfig
from helpers import FakeClock, bounded, gate_of

KEY = "example.com"
WORKERS = 4
SERVICE = 0.050
CAPACITY = WORKERS / SERVICE


# -- the policy, with plain numbers ---------------------------------------------------------


def config(policy: AdaptiveConcurrencyPolicy) -> SlotConfig:
    return SlotConfig.build(
        start_delay=0.5,
        min_delay=0.0,
        max_delay=10.0,
        target_concurrency=1.0,
        max_concurrency=16,
        jitter=0.0,
        policy=policy,
    )


def steady_limit(latencies: list[float], lag: float) -> float:
    """The limit after one round of ``latencies`` (with the client's ``lag``), from a
    slot that settled at 4 with a no-load latency of 50 ms."""
    policy = AdaptiveConcurrencyPolicy()
    state = {"limit": 4.0, "base": SERVICE, "steady": 1.0}
    slot = config(policy)
    for latency in latencies:
        sample = Sample(latency, 200, in_flight=4, state=state, lag=lag)
        policy.next_delay(0.1, sample, slot)
    return state["limit"]


def test_a_rise_the_clients_lag_explains_is_no_queue() -> None:
    # Every answer read 10 ms late: the round's lowest is 60 ms, where the
    # host still serves in 50. Read as a queue, 4 * (1 - 50/60) = 0.67 > beta.
    round_ = [SERVICE + 0.010] * 8
    assert steady_limit(round_, lag=0.0) == 3.5  # what the policy did before
    assert steady_limit(round_, lag=0.010) == 4.5  # no queue: it grows


def test_a_queue_above_the_clients_lag_still_slows_the_slot() -> None:
    # 10 ms of lag and 25 ms of queue at the host: 4 * (1 - 60/85) = 1.2 > beta.
    assert steady_limit([SERVICE + 0.010 + 0.025] * 8, lag=0.010) == 3.5


# -- the gate: what of its lateness is lag --------------------------------------------------


def test_a_timers_grain_is_no_lag() -> None:
    clock = FakeClock()
    gate = gate_of(Throttle(clock=clock).slot(KEY))
    for _ in range(20):
        gate.late(0.0008)  # an idle loop: whole-millisecond selector waits
    assert gate.lateness == pytest.approx(0.0008)
    assert gate.lag == 0.0
    for _ in range(100):
        gate.late(0.006)
    assert gate.lag == pytest.approx(0.006 - TIMER_GRAIN, abs=1e-6)


def test_a_head_let_go_late_after_a_timed_wait_tells_the_lag_on_any_slot() -> None:
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=AdaptiveConcurrencyPolicy(), start_delay=0.5)
    slot = throttle.slot(KEY)
    gate = gate_of(slot)
    first = throttle.try_acquire(KEY)
    assert first is not None
    first.release()
    ticket = gate.enqueue()
    make = throttle._turns.maker(throttle._live(KEY), adjust=True)
    wait = gate.try_acquire(ticket, make)
    assert wait > 0.0
    clock.advance(wait + 0.008)  # the timer fired 8 ms late
    assert gate.try_acquire(ticket, make) == 0.0
    assert gate.lag == pytest.approx(0.008 - TIMER_GRAIN)


# -- the engine: a crawl on a loaded client --------------------------------------------------

_CLIENT = contextvars.ContextVar("client", default=False)


async def crawl(
    lag: float, *, seconds: float = 40.0, workers: Callable[[float], int] = lambda _: WORKERS
) -> tuple[float, float, float, float]:
    """Crawl the host from 32 tasks for ``seconds``, the client ``lag`` seconds late on
    average; the second half's goodput, its mean queue at the host, the limit
    the policy ended at and the lag the gate measured. ``workers(t)``: the
    host's workers at ``t``."""
    loop = asyncio.get_running_loop()
    rng = random.Random(1)
    call_at = loop.call_at

    def late_call_at(when: float, callback: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        if lag and _CLIENT.get():  # the client's timers; the host's are on time
            when += rng.expovariate(1.0 / lag)
        return call_at(when, callback, *args, **kw)

    loop.call_at = late_call_at  # type: ignore[method-assign, assignment]
    throttle = Throttle(
        policy=AdaptiveConcurrencyPolicy(),
        start_delay=0.5,
        max_delay=10.0,
        max_concurrency=16,
        clock=loop.time,
    )
    busy = [0]
    waiting: list[asyncio.Future[None]] = []
    served: list[float] = []
    queued = [0.0]

    async def serve() -> None:
        arrived = loop.time()
        while busy[0] >= workers(loop.time()):
            future = loop.create_future()
            waiting.append(future)
            await future
        if arrived >= seconds / 2:
            queued[0] += loop.time() - arrived
        busy[0] += 1
        await asyncio.sleep(SERVICE * rng.uniform(0.9, 1.1))
        busy[0] -= 1
        served.append(loop.time())
        if waiting:
            waiting.pop(0).set_result(None)

    async def task() -> None:
        while loop.time() < seconds:
            _CLIENT.set(True)
            lease = await throttle.acquire(KEY)
            _CLIENT.set(False)
            sent = loop.time()
            await serve()
            await asyncio.sleep(rng.expovariate(1.0 / lag) if lag else 0.0)  # read late
            lease.observe(latency=loop.time() - sent, status=200)
            lease.release()

    try:
        async with bounded(seconds * 10):
            await asyncio.gather(*(task() for _ in range(32)))
    finally:
        del loop.call_at
    half = seconds / 2
    limit = throttle.store.load(KEY).policy_state["limit"]  # type: ignore[union-attr]
    goodput = sum(1 for at in served if at >= half) / half
    return goodput, queued[0] / half, limit, gate_of(throttle.slot(KEY)).lag


@pytest.mark.looptime
async def test_a_loaded_client_still_finds_the_hosts_capacity() -> None:
    # 10 ms of lag on a 50 ms host: 54 % of the capacity before the rule (the
    # limit fell to 2-3.5); holding a request in flight while it is read late
    # needs a limit above the host's 4 workers, and no queue builds there.
    goodput, queue, limit, lag = await crawl(0.010)
    assert lag > TIMER_GRAIN
    assert goodput >= 0.85 * CAPACITY
    assert queue < 0.5
    assert WORKERS <= limit <= 2 * WORKERS


@pytest.mark.looptime
async def test_an_idle_client_measures_no_lag() -> None:
    goodput, queue, _, lag = await crawl(0.0)
    assert lag == 0.0
    assert goodput >= 0.95 * CAPACITY
    assert queue < 0.5


@pytest.mark.looptime
async def test_a_host_that_gets_slower_is_still_slowed_on_a_loaded_client() -> None:
    # Half its workers gone at 20 s: the limit falls with them, and the queue
    # at the host stays within a request (10 ms of lag on the client).
    seconds = 40.0
    goodput, queue, limit, _ = await crawl(
        0.010, seconds=seconds, workers=lambda t: WORKERS if t < seconds / 2 else WORKERS // 2
    )
    assert limit <= 3.5
    assert queue < 1.0
    assert goodput >= 0.9 * CAPACITY / 2

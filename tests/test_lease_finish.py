"""A response finished as it arrives: observed and released in one step (``Lease.finish``).

The adapters use it when a response's body came with its headers (aiohttp's
small bodies): the slot's gate lets go of the lease under the same hold of its
lock as the response is applied. It must release exactly as ``observe`` then
``release`` do: whatever observing raises, once, waking the queue in order,
and never the hold of another request.
"""

from __future__ import annotations

import asyncio

import pytest

from autothrottle import AdaptiveConcurrencyPolicy, Throttle
from autothrottle.policy import Sample, SlotConfig
from helpers import FakeClock

KEY = "example.com"


class _Raising(AdaptiveConcurrencyPolicy):
    """A policy whose delay rule raises (a user's own policy with a bug)."""

    def next_delay(self, current: float, sample: Sample, config: SlotConfig) -> float:
        raise ZeroDivisionError("the policy's own bug")


def _throttle(**kwargs: object) -> Throttle:
    clock = FakeClock()
    return Throttle(start_delay=0.0, clock=clock, wall_clock=clock.wall, **kwargs)  # type: ignore[arg-type]


def test_finish_applies_the_response_and_releases_the_lease() -> None:
    throttle = _throttle()
    lease = throttle.try_acquire(KEY)
    other = throttle.try_acquire(KEY)
    assert lease is not None and other is not None
    lease.finish(0.01, 200, {"Server": "x"})
    slot = throttle.slot(KEY)
    assert lease.released
    assert slot.in_flight == 1  # the other request's hold is untouched
    assert slot.snapshot().responses == 1
    assert slot.last_latency == 0.01
    lease.release()  # once only
    assert slot.in_flight == 1
    other.release()
    assert slot.in_flight == 0


@pytest.mark.parametrize(
    ("headers", "listen"),
    [({"Server": "x"}, False), ({"Retry-After": "1"}, False), ({"Server": "x"}, True)],
    ids=["the usual response", "a header the rules read", "a listener"],
)
def test_finish_releases_when_observing_raises(headers: dict[str, str], listen: bool) -> None:
    """The usual response's one call, and the rules' way, both let go of the lease."""
    throttle = _throttle(policy=_Raising())
    if listen:
        throttle.listen(lambda event: None)
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    with pytest.raises(ZeroDivisionError):
        lease.finish(0.01, 200, headers)
    assert lease.released
    assert throttle.slot(KEY).in_flight == 0


def test_finish_of_an_expired_lease_observes_and_lets_go_of_nothing_else() -> None:
    clock = FakeClock()
    throttle = Throttle(start_delay=0.0, hold_timeout=5.0, clock=clock, wall_clock=clock.wall)
    old = throttle.try_acquire(KEY)
    assert old is not None
    clock.advance(6.0)
    new = throttle.try_acquire(KEY)
    assert new is not None
    assert throttle.slot(KEY).in_flight == 1  # the old hold expired
    old.finish(0.01, 200)
    assert throttle.slot(KEY).snapshot().responses == 1
    assert throttle.slot(KEY).in_flight == 1  # no phantom release of the new one
    new.release()
    assert throttle.slot(KEY).in_flight == 0


def test_finish_of_a_lease_with_its_own_release_step_runs_it_once() -> None:
    """A shared store's lease (``on_release``) releases through ``release``."""
    throttle = _throttle()
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    released: list[bool] = []
    lease.on_release = lambda: released.append(True)
    lease.finish(0.01, 200)
    lease.release()
    assert released == [True]
    assert throttle.slot(KEY).in_flight == 0


async def test_finish_hands_the_slot_to_the_waiters_in_order() -> None:
    throttle = Throttle(start_delay=0.0, max_concurrency=1, policy=AdaptiveConcurrencyPolicy())
    first = await throttle.acquire(KEY)
    order: list[int] = []

    async def wait(n: int) -> None:
        lease = await throttle.acquire(KEY)
        order.append(n)
        lease.finish(0.001, 200)

    waiters = []
    for n in range(3):
        waiters.append(asyncio.create_task(wait(n)))
        await asyncio.sleep(0)  # queued in this order
    assert throttle.slot(KEY).queued == 3
    first.finish(0.001, 200)
    await asyncio.wait_for(asyncio.gather(*waiters), 10.0)
    assert order == [0, 1, 2]
    assert throttle.slot(KEY).in_flight == 0


class _FailingClock(FakeClock):
    """A clock that raises while ``failing`` (an injected clock with a bug)."""

    failing = False

    def __call__(self) -> float:
        if self.failing:
            raise RuntimeError("the clock's own bug")
        return self.now


def test_finish_releases_when_applying_fails_before_the_gate_lets_go() -> None:
    """Whatever the reporter raises, however early, the lease's hold goes:
    ``finish`` marked the lease released, so nobody else would let it go."""
    clock = _FailingClock()
    throttle = Throttle(start_delay=0.0, clock=clock, wall_clock=clock.wall)
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    clock.failing = True
    with pytest.raises(RuntimeError, match="clock's own bug"):
        lease.finish(0.01, 200, {"Server": "x"})
    clock.failing = False
    assert lease.released
    assert throttle.slot(KEY).in_flight == 0

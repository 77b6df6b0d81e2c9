"""The waiting loop under each event loop: asyncio waits on a future of its own
loop, trio through anyio; both keep a slot's queue FIFO, wake on a release from
another thread and on time, and leave nothing behind when cancelled."""

from __future__ import annotations

import time

import anyio
import pytest

from autothrottle import FixedRatePolicy, Throttle

BACKENDS = ["asyncio", "trio"]


def _run(backend: str, main: object) -> None:
    if backend == "trio":
        pytest.importorskip("trio")
    anyio.run(main, backend=backend)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", BACKENDS)
def test_waiters_go_in_order_woken_by_a_release_from_another_thread(backend: str) -> None:
    throttle = Throttle(start_delay=0.0, max_concurrency=1)
    order: list[int] = []

    async def take(index: int) -> None:
        lease = await throttle.acquire("k")
        order.append(index)
        lease.release()

    async def main() -> None:
        first = await throttle.acquire("k")
        async with anyio.create_task_group() as tasks:
            for index in range(3):
                tasks.start_soon(take, index)
                await anyio.wait_all_tasks_blocked()
            assert throttle.slot("k").queued == 3
            await anyio.to_thread.run_sync(first.release)

    _run(backend, main)
    assert order == [0, 1, 2]
    assert (throttle.slot("k").in_flight, throttle.slot("k").queued) == (0, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cancelled_waiter_leaves_the_queue_and_the_next_one_goes(backend: str) -> None:
    throttle = Throttle(start_delay=0.0, max_concurrency=1)
    got: list[str] = []

    async def take(name: str) -> None:
        lease = await throttle.acquire("k")
        got.append(name)
        lease.release()

    async def main() -> None:
        first = await throttle.acquire("k")
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(take, "first")
            await anyio.wait_all_tasks_blocked()
            async with anyio.create_task_group() as doomed:
                doomed.start_soon(take, "cancelled")
                await anyio.wait_all_tasks_blocked()
                doomed.cancel_scope.cancel()
            tasks.start_soon(take, "next")
            await anyio.wait_all_tasks_blocked()
            assert throttle.slot("k").queued == 2
            first.release()

    _run(backend, main)
    assert got == ["first", "next"]
    assert (throttle.slot("k").in_flight, throttle.slot("k").queued) == (0, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_waiter_is_woken_on_time_when_its_turn_is_a_delay_away(backend: str) -> None:
    throttle = Throttle(policy=FixedRatePolicy(10))  # turns 0.1 s apart
    waited: list[float] = []

    async def main() -> None:
        (await throttle.acquire("k")).release()
        started = time.monotonic()
        (await throttle.acquire("k")).release()
        waited.append(time.monotonic() - started)

    _run(backend, main)
    assert 0.05 <= waited[0] < 5.0  # woken by the timer, not by a release

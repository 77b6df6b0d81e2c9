"""The exchange's hold: a lease released when its response is finished or collected."""

from __future__ import annotations

import gc
import threading
import time

from autothrottle import Throttle
from autothrottle._exchange import Hold
from helpers import wait_until


class Response:
    """Stands for a client's response object: what the hold's life follows."""


def test_release_is_once_and_forgets_the_owner() -> None:
    throttle = Throttle(start_delay=0.0, max_concurrency=1)
    owner = Response()
    hold = Hold(throttle.acquire_blocking("k"), owner)
    hold.release()
    hold.release()
    assert throttle.slot("k").in_flight == 0
    next_lease = throttle.try_acquire("k")
    assert next_lease is not None
    del owner
    gc.collect()  # the finalizer was detached: the new lease is untouched
    assert throttle.slot("k").in_flight == 1
    next_lease.release()


def test_an_owner_collected_in_a_thread_is_released_from_another_thread() -> None:
    throttle = Throttle(start_delay=0.0)
    lease = throttle.acquire_blocking("k")
    released_by: list[str] = []
    lease.on_release = lambda: released_by.append(threading.current_thread().name)
    owner = Response()
    Hold(lease, owner)
    del owner
    gc.collect()
    for _ in range(1000):
        if released_by:
            break
        time.sleep(0.01)
    assert released_by == ["autothrottle-release"]  # never inside the collector's thread
    assert throttle.slot("k").in_flight == 0


async def test_an_owner_collected_under_a_loop_is_released_on_the_loop() -> None:
    throttle = Throttle(start_delay=0.0)
    owner = Response()
    Hold(await throttle.acquire("k"), owner)
    del owner
    gc.collect()
    assert throttle.slot("k").in_flight == 1  # deferred: the collector may be anywhere
    await wait_until(lambda: throttle.slot("k").in_flight == 0)

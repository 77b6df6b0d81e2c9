"""``Throttle.set_host``: per-host settings learned while running (a robots.txt Crawl-delay).

Pacing is read on an injected clock: a grant is ``try_acquire`` returning a lease.
"""

from __future__ import annotations

import itertools
import random
import threading

import pytest

from autothrottle import AdaptiveConcurrencyPolicy, FixedDelayPolicy, HostSettings, Throttle
from helpers import FakeClock, gate_of

KEY = "a.example"


def grants_within(throttle: Throttle, clock: FakeClock, seconds: float, step: float) -> list[float]:
    """The times ``try_acquire`` granted a turn over ``seconds``, each released at once."""
    start = clock.now
    times = []
    while clock.now - start < seconds:
        lease = throttle.try_acquire(KEY)
        if lease is not None:
            times.append(clock.now - start)
            lease.observe(latency=0.01, status=200)
            lease.release()
        clock.advance(step)
    return times


def test_a_live_slot_takes_a_floor_at_once_and_keeps_it() -> None:
    clock = FakeClock()
    throttle = Throttle(start_delay=0.05, clock=clock)
    slot = throttle.slot(KEY)
    assert slot.delay == 0.05
    throttle.set_host(KEY, HostSettings(min_delay=0.5))
    assert throttle.slot(KEY) is slot  # the same slot: its queue and leases kept
    assert slot.delay == 0.5 and slot.config.min_delay == 0.5
    times = grants_within(throttle, clock, 5.0, 0.01)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(times) >= 8
    assert min(gaps) >= 0.5 - 1e-9  # fast responses never bring it under the floor


def test_new_slots_and_globs_get_it_and_a_later_call_replaces_it() -> None:
    throttle = Throttle(start_delay=0.05, clock=FakeClock())
    throttle.set_host("*.example", {"min_delay": 1.0})
    assert throttle.slot("b.example").delay == 1.0
    assert throttle.config_for("example.org").min_delay == 0.0
    throttle.set_host("*.example", {"min_delay": 2.0})
    assert throttle.slot("b.example").delay == 2.0
    throttle.set_host("c.example", {"max_concurrency": 1})  # exact beats glob
    assert throttle.config_for("c.example").min_delay == 0.0
    assert throttle.config_for("c.example").max_concurrency == 1


def test_a_live_slot_keeps_its_policy() -> None:
    throttle = Throttle(policy=AdaptiveConcurrencyPolicy(), start_delay=0.05, clock=FakeClock())
    slot = throttle.slot(KEY)
    throttle.set_host(KEY, HostSettings(policy=FixedDelayPolicy(0.3), min_delay=0.2))
    assert isinstance(slot.config.policy, AdaptiveConcurrencyPolicy)
    assert slot.config.min_delay == 0.2 and slot.delay == 0.2
    assert isinstance(throttle.config_for(KEY).policy, FixedDelayPolicy)  # for a new slot


@pytest.mark.parametrize(
    ("settings", "error", "needle"),
    [
        ({"min_delay": 100.0}, ValueError, "max_delay must be >= min_delay"),
        ({"min_delay": -1}, ValueError, "min_delay"),
        ({"colour": 1}, ValueError, "colour"),
        (3, TypeError, "HostSettings"),
    ],
)
def test_bad_settings_are_refused_naming_them(
    settings: object, error: type[Exception], needle: str
) -> None:
    throttle = Throttle(clock=FakeClock())
    with pytest.raises(error, match=needle):
        throttle.set_host(KEY, settings)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="non-empty str"):
        throttle.set_host("", {})


def test_a_jitter_set_or_ended_by_set_host_applies_from_the_next_grant() -> None:
    """The gap begun keeps the jitter factor it was drawn with; the grants
    after the change draw by the new setting: none at all once the jitter is
    0 (a grant with nothing but the usual to do must not keep an old
    factor), and one again once it is set."""
    clock = FakeClock()
    throttle = Throttle(policy=FixedDelayPolicy(1.0), jitter=0.5, clock=clock, rng=random.Random(7))
    gate = gate_of(throttle.slot(KEY))

    def grant() -> None:
        lease = throttle.try_acquire(KEY)
        assert lease is not None
        lease.release()

    def gap() -> float:
        """The time to the next turn, the clock moved to it."""
        start = clock.now
        clock.advance(gate.send_at(clock.now) - clock.now)
        return clock.now - start

    def gaps(count: int) -> list[float]:
        times = []
        for _ in range(count):
            grant()
            times.append(gap())
        return times

    grant()  # the first goes at once; the gap after it is drawn with the jitter
    throttle.set_host(KEY, HostSettings(jitter=0.0))
    begun = gap()
    assert 0.5 <= begun <= 1.5 and begun != pytest.approx(1.0)  # kept its factor
    assert gaps(3) == pytest.approx([1.0] * 3)
    throttle.set_host(KEY, HostSettings(jitter=0.5))
    jittered = gaps(3)
    assert all(0.5 <= g <= 1.5 for g in jittered)
    assert jittered != pytest.approx([1.0] * 3)


def test_a_live_slot_takes_new_settings_under_its_lock() -> None:
    # A sync client answers from its own threads, holding the slot's lock; a
    # set_host from another thread must wait for it, or it could overwrite the
    # delay a response just set with the clamp of the one it read before.
    throttle = Throttle(policy=FixedDelayPolicy(0.1), clock=FakeClock())
    slot = throttle.slot(KEY)
    held, done = threading.Event(), threading.Event()
    lock = gate_of(slot).lock
    lock.acquire()
    try:

        def set_host() -> None:
            held.set()
            throttle.set_host(KEY, {"min_delay": 0.5})
            done.set()

        setter = threading.Thread(target=set_host)
        setter.start()
        assert held.wait(10)
        # While the lock is held the new settings are not in force (a setter that
        # took no lock would have set them by now, on most runs).
        assert not done.wait(0.2)
        assert slot.config.min_delay == 0.0
    finally:
        lock.release()
    assert done.wait(10)
    setter.join(10)
    assert slot.config.min_delay == 0.5 and slot.delay >= 0.5

"""Scheduling with an injected clock, at two levels.

* The sans-I/O :class:`Slot` directly, with a hand-set fake clock: enqueue a
  ticket, ask ``_try_acquire`` how long to wait, move the clock, ask again.
* The asyncio driver (``Throttle.acquire``) on looptime's fake-time loop, with
  the throttle reading the loop's clock, so sleeps take no real time and every
  grant time can be asserted exactly.

The rules under test are docs/scheduling.md: FIFO per slot; one
request may go when the current delay (times a jitter factor drawn once per
send) has passed since the previous send and fewer than ``max_concurrency``
are in flight; the first request to a new slot goes at once; a lower delay lets
queued requests go sooner; slots never wait for each other; cancellation at
any point leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import math
import random
import statistics
import sys
from collections import OrderedDict
from typing import Any

import anyio
import pytest

from autothrottle import (
    AdaptiveConcurrencyPolicy,
    AutoThrottlePolicy,
    FixedDelayPolicy,
    Lease,
    Slot,
    Throttle,
    _table,
)
from autothrottle._gate import Ticket
from autothrottle.store import MemoryStore
from helpers import (
    FakeClock,
    Hold,
    abandon,
    bounded,
    gate_of,
    grant_now,
    record_of,
    try_acquire,
)

KEY = "example.com"
TOL = 1e-5  # looptime's clock ticks in microseconds


def sans_io(**kwargs: object) -> tuple[FakeClock, Throttle, Slot]:
    clock = FakeClock()
    kwargs.setdefault("policy", AutoThrottlePolicy())  # Scrapy's rules unless named
    throttle = Throttle(clock=clock, **kwargs)  # type: ignore[arg-type]
    return clock, throttle, throttle.slot(KEY)


def grant(slot: Slot, throttle: Throttle, *, adjust: bool = True) -> Lease:
    """Take a lease of the slot, asserting it is granted now."""
    lease = throttle.try_acquire(slot.key, adjust=adjust)
    assert lease is not None
    return lease


class WakeCounter:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


# =================================================================================
# (a) the sans-I/O slot with a fake clock
# =================================================================================


class TestSlotFirstRequestAndDelay:
    def test_first_request_to_a_new_slot_goes_at_once(self) -> None:
        clock, throttle, slot = sans_io(start_delay=30.0)
        ticket = gate_of(slot).enqueue()
        assert slot.queued == 1
        assert try_acquire(slot, ticket, throttle.hold_timeout) == 0.0
        assert ticket.hold is not None
        assert ticket.hold.sent_at == clock.now
        assert slot.queued == 0
        assert slot.in_flight == 1
        assert slot.snapshot().sent == 1

    def test_fast_path_grants_a_new_slot_at_once(self) -> None:
        clock, throttle, slot = sans_io(start_delay=30.0)
        lease = grant_now(slot, throttle.hold_timeout)
        assert lease is not None
        assert lease.sent_at == clock.now
        assert slot.in_flight == 1

    @pytest.mark.parametrize("delay", [0.5, 2.0, 5.0, 7.25])
    def test_next_send_waits_exactly_the_delay(self, delay: float) -> None:
        clock, throttle, slot = sans_io(start_delay=delay)
        first = grant(slot, throttle)
        ticket = gate_of(slot).enqueue()
        assert try_acquire(slot, ticket, throttle.hold_timeout) == pytest.approx(delay)
        clock.advance(delay * 0.4)
        assert try_acquire(slot, ticket, throttle.hold_timeout) == pytest.approx(delay * 0.6)
        assert ticket.hold is None
        assert grant_now(slot, throttle.hold_timeout) is None
        clock.advance(delay * 0.6)
        assert try_acquire(slot, ticket, throttle.hold_timeout) == 0.0
        assert ticket.hold is not None
        assert ticket.hold.sent_at - first.sent_at == pytest.approx(delay)

    def test_the_delay_counts_from_the_previous_send_not_its_release(self) -> None:
        clock, throttle, slot = sans_io(start_delay=5.0)
        first = grant(slot, throttle)
        clock.advance(4.0)
        first.release()
        ticket = gate_of(slot).enqueue()
        assert try_acquire(slot, ticket, throttle.hold_timeout) == pytest.approx(1.0)

    def test_zero_delay_sends_back_to_back(self) -> None:
        _clock, throttle, slot = sans_io(start_delay=0.0, max_concurrency=100)
        leases = [grant(slot, throttle) for _ in range(10)]
        assert slot.in_flight == 10
        assert len({lease.sent_at for lease in leases}) == 1

    def test_fast_path_refuses_inside_the_delay(self) -> None:
        clock, throttle, slot = sans_io(start_delay=3.0)
        assert grant_now(slot, throttle.hold_timeout) is not None
        clock.advance(2.999)
        assert grant_now(slot, throttle.hold_timeout) is None
        clock.advance(0.001)
        assert grant_now(slot, throttle.hold_timeout) is not None


class TestSlotFifo:
    def test_only_the_head_may_go(self) -> None:
        _clock, throttle, slot = sans_io(start_delay=0.0, max_concurrency=100)
        tickets = [gate_of(slot).enqueue() for _ in range(5)]
        for ticket in tickets[1:]:
            assert try_acquire(slot, ticket, throttle.hold_timeout) == math.inf
            assert ticket.hold is None
        assert try_acquire(slot, tickets[0], throttle.hold_timeout) == 0.0
        assert try_acquire(slot, tickets[2], throttle.hold_timeout) == math.inf
        assert try_acquire(slot, tickets[1], throttle.hold_timeout) == 0.0

    @pytest.mark.parametrize("seed", range(5))
    def test_grant_order_is_arrival_order_whatever_the_check_order(self, seed: int) -> None:
        rng = random.Random(seed)
        clock, throttle, slot = sans_io(start_delay=1.5, max_concurrency=3)
        tickets = [gate_of(slot).enqueue() for _ in range(30)]
        order: list[int] = []
        held: list[Lease] = []
        for _ in range(10_000):  # bounded
            if len(order) == len(tickets):
                break
            waiting = [i for i, t in enumerate(tickets) if t.hold is None]
            rng.shuffle(waiting)
            waits = []
            for i in waiting:
                wait = try_acquire(slot, tickets[i], throttle.hold_timeout)
                if wait == 0.0:
                    order.append(i)
                    held.append(tickets[i].hold)  # type: ignore[arg-type]
                else:
                    waits.append(wait)
                assert slot.in_flight <= 3
            if held and rng.random() < 0.5:
                held.pop(rng.randrange(len(held))).release()
            finite = [w for w in waits if math.isfinite(w)]
            if finite:
                clock.advance(min(finite))
        assert order == list(range(30))
        assert slot.queued == 0

    def test_fast_path_never_jumps_the_queue(self) -> None:
        _clock, throttle, slot = sans_io(start_delay=0.0, max_concurrency=1)
        first = grant(slot, throttle)
        waiting = gate_of(slot).enqueue()
        assert try_acquire(slot, waiting, throttle.hold_timeout) > 0
        assert waiting.hold is None
        first.release()
        # the gate is open now, but someone is queued: a newcomer must queue too
        assert grant_now(slot, throttle.hold_timeout) is None
        assert try_acquire(slot, waiting, throttle.hold_timeout) == 0.0


class TestSlotCap:
    def test_cap_blocks_until_a_release(self) -> None:
        _clock, throttle, slot = sans_io(start_delay=0.0, max_concurrency=2, hold_timeout=math.inf)
        a, _b = grant(slot, throttle), grant(slot, throttle)
        ticket = gate_of(slot).enqueue()
        assert try_acquire(slot, ticket, throttle.hold_timeout) == math.inf
        assert grant_now(slot, throttle.hold_timeout) is None
        assert slot.in_flight == 2
        a.release()
        assert slot.in_flight == 1
        assert try_acquire(slot, ticket, throttle.hold_timeout) == 0.0
        assert slot.in_flight == 2

    def test_capped_wait_is_the_time_to_the_first_lease_expiry(self) -> None:
        clock, throttle, slot = sans_io(start_delay=0.0, max_concurrency=2, hold_timeout=30.0)
        grant(slot, throttle)
        clock.advance(10.0)
        grant(slot, throttle)
        clock.advance(5.0)
        ticket = gate_of(slot).enqueue()
        assert try_acquire(slot, ticket, throttle.hold_timeout) == pytest.approx(15.0)

    def test_cap_and_delay_both_apply(self) -> None:
        clock, throttle, slot = sans_io(start_delay=4.0, max_concurrency=1, hold_timeout=math.inf)
        first = grant(slot, throttle)
        ticket = gate_of(slot).enqueue()
        clock.advance(1.0)
        first.release()
        # the cap is free, but the delay still holds
        assert try_acquire(slot, ticket, throttle.hold_timeout) == pytest.approx(3.0)


class TestSlotWakes:
    def test_the_head_is_woken_by_a_release(self) -> None:
        _clock, throttle, slot = sans_io(start_delay=0.0, max_concurrency=1)
        lease = grant(slot, throttle)
        head = gate_of(slot).enqueue()
        try_acquire(slot, head, throttle.hold_timeout)
        head.wake = WakeCounter()
        lease.release()
        assert head.wake.count >= 1

    @pytest.mark.parametrize("how", ["setter", "observe"])
    def test_the_head_is_woken_by_a_delay_change(self, how: str) -> None:
        _clock, throttle, slot = sans_io(start_delay=10.0)
        grant(slot, throttle)
        head = gate_of(slot).enqueue()
        try_acquire(slot, head, throttle.hold_timeout)
        head.wake = wake = WakeCounter()
        if how == "setter":
            slot.delay = 2.0
        else:
            throttle.observe(KEY, latency=0.0, status=200)
        assert wake.count >= 1

    def test_the_next_head_is_woken_by_a_grant_and_an_abandon(self) -> None:
        _clock, throttle, slot = sans_io(start_delay=0.0, max_concurrency=100)
        tickets = [gate_of(slot).enqueue() for _ in range(3)]
        counters = [WakeCounter() for _ in tickets]
        for ticket, counter in zip(tickets, counters, strict=True):
            ticket.wake = counter
        assert try_acquire(slot, tickets[0], throttle.hold_timeout) == 0.0
        assert counters[1].count >= 1
        abandon(slot, tickets[1])
        assert counters[2].count >= 1

    def test_abandoning_a_non_head_keeps_the_order(self) -> None:
        _clock, throttle, slot = sans_io(start_delay=0.0, max_concurrency=100)
        tickets = [gate_of(slot).enqueue() for _ in range(4)]
        abandon(slot, tickets[2])
        assert slot.queued == 3
        abandon(slot, tickets[2])  # twice: a no-op
        assert slot.queued == 3
        assert try_acquire(slot, tickets[1], throttle.hold_timeout) == math.inf
        assert try_acquire(slot, tickets[0], throttle.hold_timeout) == 0.0
        assert try_acquire(slot, tickets[3], throttle.hold_timeout) == math.inf
        assert try_acquire(slot, tickets[1], throttle.hold_timeout) == 0.0
        assert try_acquire(slot, tickets[3], throttle.hold_timeout) == 0.0

    def test_abandoning_a_granted_ticket_releases_its_lease(self) -> None:
        _clock, throttle, slot = sans_io(start_delay=0.0)
        ticket = gate_of(slot).enqueue()
        try_acquire(slot, ticket, throttle.hold_timeout)
        assert slot.in_flight == 1
        abandon(slot, ticket)
        assert slot.in_flight == 0
        assert isinstance(ticket.hold, Hold) and ticket.hold.released


class TestSlotReevaluation:
    def test_a_lower_delay_shortens_the_gaps_that_begin_after_it(self) -> None:
        # Scrapy's scheduler: a gap begun at 10 s stays 10 s when a response
        # lowers the delay; the next gap is the new delay.
        clock, throttle, slot = sans_io(start_delay=10.0, policy=AutoThrottlePolicy())
        grant(slot, throttle)
        ticket = gate_of(slot).enqueue()
        assert try_acquire(slot, ticket, throttle.hold_timeout) == pytest.approx(10.0)
        clock.advance(2.0)
        throttle.observe(KEY, latency=0.0, status=200)  # 10 -> 5
        assert slot.delay == 5.0
        assert try_acquire(slot, ticket, throttle.hold_timeout) == pytest.approx(8.0)
        clock.advance(8.0)
        assert try_acquire(slot, ticket, throttle.hold_timeout) == 0.0
        ticket = gate_of(slot).enqueue()
        assert try_acquire(slot, ticket, throttle.hold_timeout) == pytest.approx(5.0)

    def test_a_delay_set_by_hand_applies_to_the_gap_begun(self) -> None:
        clock, throttle, slot = sans_io(start_delay=10.0, policy=AutoThrottlePolicy())
        grant(slot, throttle)
        ticket = gate_of(slot).enqueue()
        clock.advance(2.0)
        slot.delay = 3.0
        assert try_acquire(slot, ticket, throttle.hold_timeout) == pytest.approx(1.0)
        slot.delay = 1.0  # already past: goes now
        assert try_acquire(slot, ticket, throttle.hold_timeout) == 0.0

    def test_the_ramp_up_still_lets_a_held_delay_fall_within_a_gap(self) -> None:
        # The ramp's fall is planned on time, not a response's: a slot that
        # starts at 5 s sends its second request once t = 5 * 2 ** -t.
        _clock, throttle, slot = sans_io(start_delay=5.0, policy=AdaptiveConcurrencyPolicy())
        with grant(slot, throttle) as lease:
            lease.observe(latency=0.01, status=200)
        ticket = gate_of(slot).enqueue()
        wait = try_acquire(slot, ticket, throttle.hold_timeout)
        assert wait == pytest.approx(1.7, abs=0.1)

    def test_a_higher_delay_lengthens_the_wait(self) -> None:
        clock, throttle, slot = sans_io(start_delay=10.0)
        grant(slot, throttle)
        ticket = gate_of(slot).enqueue()
        clock.advance(2.0)
        throttle.observe(KEY, latency=40.0, status=200)  # target 40 > 25
        assert slot.delay == 40.0
        assert try_acquire(slot, ticket, throttle.hold_timeout) == pytest.approx(38.0)


class TestSlotJitter:
    def test_the_factor_is_drawn_once_per_send_not_per_check(self) -> None:
        clock, throttle, slot = sans_io(start_delay=2.0, jitter=0.5, rng=random.Random(3))
        grant(slot, throttle)
        ticket = gate_of(slot).enqueue()
        first = try_acquire(slot, ticket, throttle.hold_timeout)
        for _ in range(50):
            assert try_acquire(slot, ticket, throttle.hold_timeout) == first
        clock.advance(0.1)
        assert try_acquire(slot, ticket, throttle.hold_timeout) == pytest.approx(first - 0.1)

    def test_the_factor_scales_the_delay_in_force(self) -> None:
        _clock, throttle, slot = sans_io(start_delay=2.0, jitter=0.5, rng=random.Random(5))
        grant(slot, throttle)
        ticket = gate_of(slot).enqueue()
        wait = try_acquire(slot, ticket, throttle.hold_timeout)
        factor = wait / 2.0
        assert 0.5 <= factor <= 1.5
        slot.delay = 4.0
        assert try_acquire(slot, ticket, throttle.hold_timeout) == pytest.approx(4.0 * factor)

    @pytest.mark.parametrize(("jitter", "seed"), [(0.1, 1), (0.5, 2), (0.9, 3)])
    def test_gaps_lie_in_the_band_and_are_not_biased_up(self, jitter: float, seed: int) -> None:
        delay = 2.0
        clock, throttle, slot = sans_io(
            start_delay=delay, jitter=jitter, rng=random.Random(seed), max_concurrency=1000
        )
        sends = [grant(slot, throttle).sent_at]
        for _ in range(2000):
            ticket = gate_of(slot).enqueue()
            for _ in range(1000):  # bounded; checks often, as a polling driver would
                wait = try_acquire(slot, ticket, throttle.hold_timeout)
                if wait == 0.0:
                    break
                clock.advance(min(wait, delay / 7))
            assert ticket.hold is not None
            sends.append(ticket.hold.sent_at)
        gaps = [b - a for a, b in itertools.pairwise(sends)]
        low, high = delay * (1 - jitter), delay * (1 + jitter)
        assert all(low - 1e-9 <= gap <= high + 1e-9 for gap in gaps)
        assert statistics.fmean(gaps) == pytest.approx(delay, rel=0.03)
        # the jitter is really applied, across the band
        assert min(gaps) < delay * (1 - jitter / 2)
        assert max(gaps) > delay * (1 + jitter / 2)

    def test_no_jitter_means_exact_gaps(self) -> None:
        clock, throttle, slot = sans_io(start_delay=1.25, max_concurrency=100)
        sends = [grant(slot, throttle).sent_at]
        for _ in range(20):
            ticket = gate_of(slot).enqueue()
            wait = try_acquire(slot, ticket, throttle.hold_timeout)
            assert wait == pytest.approx(1.25)
            clock.advance(wait)
            assert try_acquire(slot, ticket, throttle.hold_timeout) == 0.0
            sends.append(ticket.hold.sent_at)  # type: ignore[union-attr]
        assert all(b - a == pytest.approx(1.25) for a, b in itertools.pairwise(sends))


class TestLeases:
    def test_release_is_idempotent(self) -> None:
        _clock, throttle, slot = sans_io(start_delay=0.0)
        a, b = grant(slot, throttle), grant(slot, throttle)
        assert slot.in_flight == 2
        a.release()
        a.release()
        a.release()
        assert a.released
        assert slot.in_flight == 1
        assert not b.released
        b.release()
        b.release()
        assert slot.in_flight == 0

    def test_lease_is_a_context_manager_that_releases(self) -> None:
        _clock, throttle, slot = sans_io(start_delay=0.0)
        with grant(slot, throttle) as lease:
            assert slot.in_flight == 1
        assert lease.released
        assert slot.in_flight == 0
        with pytest.raises(RuntimeError), grant(slot, throttle):
            raise RuntimeError("boom")
        assert slot.in_flight == 0

    def test_a_lease_never_released_stops_counting_after_hold_timeout(self) -> None:
        clock, throttle, slot = sans_io(start_delay=0.0, max_concurrency=1, hold_timeout=30.0)
        lost = grant(slot, throttle)
        clock.advance(29.9)
        assert slot.in_flight == 1
        ticket = gate_of(slot).enqueue()
        assert try_acquire(slot, ticket, throttle.hold_timeout) == pytest.approx(0.1)
        clock.advance(0.1)
        assert slot.in_flight == 0
        assert lost.released
        assert try_acquire(slot, ticket, throttle.hold_timeout) == 0.0
        assert slot.in_flight == 1
        # the late release of the expired lease must not free the new one
        lost.release()
        assert slot.in_flight == 1
        assert not ticket.hold.released  # type: ignore[union-attr]

    def test_default_hold_timeout_is_a_finite_bound(self) -> None:
        clock, throttle, slot = sans_io(start_delay=0.0)
        assert math.isfinite(throttle.hold_timeout)
        grant(slot, throttle)
        clock.advance(throttle.hold_timeout)
        assert slot.in_flight == 0

    def test_observe_through_a_lease(self) -> None:
        _clock, throttle, slot = sans_io(start_delay=5.0)
        lease = grant(slot, throttle)
        lease.observe(latency=1.0, status=200)
        assert slot.delay == 3.0
        lease.release()

    def test_observe_through_a_no_adjust_lease_counts_but_keeps_the_delay(self) -> None:
        _clock, throttle, slot = sans_io(start_delay=5.0)
        grant(slot, throttle, adjust=False).observe(latency=1.0, status=200)
        assert slot.delay == 5.0
        assert slot.snapshot().responses == 1
        assert slot.snapshot().last_latency == 1.0

    def test_fail_counts_a_failure_without_changing_the_delay(self) -> None:
        # Scrapy's plain rules: a failure gives no latency sample
        _clock, throttle, slot = sans_io(start_delay=5.0, strict_scrapy=True)
        lease = grant(slot, throttle)
        lease.fail(ConnectionRefusedError())
        lease.release()
        snap = slot.snapshot()
        assert (snap.failures, snap.responses, snap.delay, snap.in_flight) == (1, 0, 5.0, 0)


class TestSlotManyAbandons:
    def test_thousands_of_abandons_leave_nothing_behind(self) -> None:
        rng = random.Random(11)
        clock, throttle, slot = sans_io(start_delay=0.5, max_concurrency=3)
        queue: list[Ticket] = []
        held: list[Lease] = []
        abandoned = 0
        while abandoned < 5000:
            for _ in range(rng.randint(1, 20)):
                queue.append(gate_of(slot).enqueue())
            for ticket in list(queue):
                if try_acquire(slot, ticket, throttle.hold_timeout) == 0.0:
                    queue.remove(ticket)
                    held.append(ticket.hold)  # type: ignore[arg-type]
            for ticket in rng.sample(queue, k=rng.randint(0, len(queue))):
                abandon(slot, ticket)
                queue.remove(ticket)
                abandoned += 1
            while held and rng.random() < 0.6:
                held.pop(rng.randrange(len(held))).release()
            clock.advance(rng.uniform(0, 1))
            assert slot.queued == len(queue)
            assert slot.in_flight == len(held) <= 3
        for ticket in queue:
            abandon(slot, ticket)
        for lease in held:
            lease.release()
        assert slot.queued == 0
        assert slot.in_flight == 0
        assert slot.idle
        clock.advance(1.0)
        assert grant_now(slot, throttle.hold_timeout) is not None


class TestIdleEviction:
    def make(self, idle_timeout: float = 10.0) -> tuple[FakeClock, Throttle, MemoryStore]:
        clock = FakeClock()
        store = MemoryStore(idle_timeout=idle_timeout)
        throttle = Throttle(start_delay=5.0, clock=clock, store=store, hold_timeout=math.inf)
        return clock, throttle, store

    def test_an_idle_slot_is_evicted_after_idle_timeout(self) -> None:
        clock, throttle, store = self.make()
        slot = throttle.slot("a.example")
        grant(slot, throttle).release()
        clock.advance(11.0)
        throttle.slot("b.example")  # creating a slot sweeps
        assert store.load("a.example") is None
        assert "a.example" not in throttle.snapshot()
        assert len(store) == 1

    def test_an_idle_slot_is_kept_before_idle_timeout(self) -> None:
        clock, throttle, store = self.make()
        slot = throttle.slot("a.example")
        grant(slot, throttle).release()
        clock.advance(9.0)
        throttle.slot("b.example")
        assert store.load("a.example") is record_of(slot)

    def test_recent_activity_keeps_a_slot(self) -> None:
        clock, throttle, store = self.make()
        slot = throttle.slot("a.example")
        grant(slot, throttle).release()
        clock.advance(8.0)
        throttle.observe("a.example", latency=1.0, status=200)
        clock.advance(3.0)
        throttle.slot("b.example")
        assert store.load("a.example") is record_of(slot)

    @pytest.mark.parametrize("busy", ["in_flight", "queued"])
    def test_a_busy_slot_is_not_evicted(self, busy: str) -> None:
        clock, throttle, store = self.make()
        slot = throttle.slot("a.example")
        lease = grant(slot, throttle)
        if busy == "queued":
            lease.release()
            gate_of(slot).enqueue()
        clock.advance(100.0)
        throttle.slot("b.example")
        assert store.load("a.example") is record_of(slot)
        assert throttle.slot("a.example") is slot

    def test_an_evicted_slot_starts_fresh(self) -> None:
        clock, throttle, _store = self.make()
        slot = throttle.slot("a.example")
        grant(slot, throttle).release()
        throttle.observe("a.example", latency=20.0, status=200)
        assert slot.delay == 20.0
        clock.advance(11.0)
        throttle.slot("b.example")
        fresh = throttle.slot("a.example")
        assert fresh is not slot
        assert fresh.delay == 5.0
        assert fresh.snapshot().responses == 0
        # the old slot would still wait 20 - 11 = 9 s; the fresh one goes at once
        assert grant_now(fresh, throttle.hold_timeout) is not None

    def test_a_paused_slot_is_not_evicted_before_its_pause_ends(self) -> None:
        clock = FakeClock()
        throttle = Throttle(
            start_delay=1.0,
            clock=clock,
            wall_clock=lambda: 1.7e9,
            store=MemoryStore(idle_timeout=10.0),
        )
        slot = throttle.slot("a.example")
        lease = grant(slot, throttle)
        lease.observe(latency=0.1, status=503, headers={"Retry-After": "120"})
        lease.release()
        assert slot.snapshot().pause_remaining == pytest.approx(120.0)
        clock.advance(15.0)
        throttle.slot("b.example")  # sweeps
        again = throttle.slot("a.example")
        assert again.snapshot().pause_remaining == pytest.approx(105.0)
        assert grant_now(again, throttle.hold_timeout) is None

    def test_evict_idle_directly(self) -> None:
        clock, throttle, store = self.make(idle_timeout=10.0)
        busy = grant(throttle.slot("a"), throttle)
        for key in ("b", "c"):
            grant(throttle.slot(key), throttle).release()
        clock.advance(10.5)
        assert throttle.evict_idle() == 2
        assert list(store) == ["a"]
        assert [slot.key for slot in throttle.slots()] == ["a"]
        busy.release()
        clock.advance(10.5)
        assert throttle.evict_idle() == 1
        assert len(store) == 0

    def test_an_evicted_crawl_gives_its_memory_back(self) -> None:
        # A dict keeps the table of the most it held: after a crawl of many
        # hosts is evicted, the store's table is rebuilt to what is left.
        clock, throttle, store = self.make(idle_timeout=10.0)
        for i in range(2000):
            grant(throttle.slot(f"host-{i}"), throttle).release()
        full = sys.getsizeof(store._records)
        clock.advance(10.5)
        grant(throttle.slot("new"), throttle).release()  # evicts a batch
        throttle.evict_idle()  # and the rest
        assert list(store) == ["new"]
        assert sys.getsizeof(store._records) * 50 < full
        assert store.load("new") is not None and throttle.slot("new").key == "new"

    def test_traffic_to_known_slots_alone_still_evicts_stale_ones(self) -> None:
        clock, throttle, store = self.make(idle_timeout=10.0)
        for key in ("stale-1", "stale-2", "busy"):
            grant(throttle.slot(key), throttle).release()
        clock.advance(11.0)
        for _ in range(1000):  # no new slot is ever made
            throttle.slot("busy")
        assert sorted(store) == ["busy"]

    def test_infinite_idle_timeout_keeps_everything(self) -> None:
        clock, throttle, store = self.make(idle_timeout=math.inf)
        throttle.slot("a")
        clock.advance(1e9)
        throttle.slot("b")
        assert len(store) == 2

    @pytest.mark.parametrize("atomic", [True, False])
    def test_a_use_of_a_known_slot_makes_it_the_newest(
        self, atomic: bool, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Taken without the table's lock (one atomic step each, under the GIL)
        or with it (a free-threaded build), a use moves the slot to the end: the
        sweep looks at the least recently used first."""
        monkeypatch.setattr(_table, "_FREE_HITS", _table._HIT_SWEEP - 1 if atomic else 0)
        clock, throttle, store = self.make(idle_timeout=10.0)
        for key in ("a", "b", "c"):
            grant(throttle.slot(key), throttle).release()
        throttle.slot("a")
        assert [slot.key for slot in throttle.slots()] == ["b", "c", "a"]
        clock.advance(11.0)
        grant(throttle.slot("a"), throttle).release()  # a use, then a sweep on the next new slot
        throttle.slot("d")
        assert sorted(store) == ["a", "d"]

    @pytest.mark.parametrize("key", ["", 5, None, b"a", ["a"]])
    def test_a_key_that_is_no_non_empty_str_is_refused_and_makes_no_slot(
        self, key: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The table checks a key before it makes its slot (a known key was
        checked when its slot was made): every way in refuses a bad one alike,
        an unhashable one too, with or without the GIL's lock-free use."""
        for free in (_table._FREE_HITS, 0):
            monkeypatch.setattr(_table, "_FREE_HITS", free)
            _clock, throttle, store = self.make()
            throttle.slot("a")
            for use in (throttle.slot, throttle.acquire_now, throttle.acquire_blocking):
                with pytest.raises(TypeError, match=r"key must be a non-empty str, got "):
                    use(key)
            assert [slot.key for slot in throttle.slots()] == ["a"]
            assert sorted(store) == ["a"]

    def test_a_slot_forgotten_as_it_is_looked_up_is_made_anew(self) -> None:
        """A sweep on another thread may forget the slot between the lock-free
        lookup and its move to the end: the use then goes the locked way and
        makes the slot anew, in the table (never the forgotten one)."""
        _clock, throttle, store = self.make()
        old = throttle.slot("a")
        table = throttle._table

        class ForgetsOnMove(OrderedDict[str, Any]):
            def move_to_end(self, key: str, last: bool = True) -> None:
                if key == "a" and "a" in self:
                    del self[key]  # the other thread's sweep, just before the move
                    store.discard(key)
                super().move_to_end(key, last)

        table._slots = ForgetsOnMove(table._slots)
        fresh = throttle.slot("a")
        assert fresh is not old
        entry = table.get("a")
        assert entry is not None and entry.view is fresh
        assert store.load("a") is record_of(fresh)


# =================================================================================
# (b) the asyncio driver on looptime's fake-time loop
# =================================================================================


def loop_clock() -> float:
    return asyncio.get_running_loop().time()


def make(**kwargs: object) -> Throttle:
    """A throttle whose time is the (fake) loop time: Scrapy's rules unless named."""
    kwargs.setdefault("policy", AutoThrottlePolicy())
    return Throttle(clock=loop_clock, **kwargs)  # type: ignore[arg-type]


def now() -> float:
    return asyncio.get_running_loop().time()


async def settle() -> None:
    """Let every ready task run without moving the fake clock."""
    for _ in range(5):
        await asyncio.sleep(0)


def spawn(
    throttle: Throttle, key: str, log: list[tuple[int, float]], i: int
) -> asyncio.Task[Lease]:
    async def go() -> Lease:
        lease = await throttle.acquire(key)
        log.append((i, now()))
        return lease

    return asyncio.create_task(go())


looptime = pytest.mark.looptime


@looptime
async def test_driver_first_request_goes_at_once() -> None:
    throttle = make(start_delay=60.0)
    async with bounded():
        t0 = now()
        lease = await throttle.acquire(KEY)
        assert now() == t0
        other = await throttle.acquire("other.example")
        assert now() == t0
    assert throttle.slot(KEY).in_flight == 1
    lease.release()
    other.release()


@looptime
@pytest.mark.parametrize("delay", [0.5, 2.0, 7.25])
async def test_driver_spaces_consecutive_sends_by_the_delay(delay: float) -> None:
    throttle = make(start_delay=delay, max_concurrency=100)
    sends = []
    async with bounded():
        for _ in range(10):
            lease = await throttle.acquire(KEY)
            sends.append(now())
            lease.release()
    gaps = [b - a for a, b in itertools.pairwise(sends)]
    assert gaps == pytest.approx([delay] * 9, abs=TOL)


@looptime
async def test_driver_fifo_with_many_waiters() -> None:
    rng = random.Random(42)
    throttle = make(start_delay=1.0, max_concurrency=100)
    arrivals: list[int] = []
    grants: list[tuple[int, float]] = []

    async def worker(i: int) -> None:
        await asyncio.sleep(rng.uniform(0, 0.5))  # arrive in a shuffled order
        arrivals.append(i)
        lease = await throttle.acquire(KEY)
        grants.append((i, now()))
        lease.release()

    async with bounded():
        t0 = now()
        await asyncio.gather(*(worker(i) for i in range(40)))
    assert [i for i, _ in grants] == arrivals
    times = [t - t0 for _, t in grants]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps == pytest.approx([1.0] * 39, abs=TOL)
    assert throttle.slot(KEY).queued == 0
    assert throttle.slot(KEY).in_flight == 0


@looptime
async def test_driver_cap_is_never_exceeded_and_order_is_fifo() -> None:
    rng = random.Random(7)
    throttle = make(start_delay=0.0, max_concurrency=3)
    slot = throttle.slot(KEY)
    order: list[int] = []
    active = 0
    peak = 0

    async def worker(i: int) -> None:
        nonlocal active, peak
        with await throttle.acquire(KEY):
            order.append(i)
            active += 1
            peak = max(peak, active)
            assert slot.in_flight <= 3
            await asyncio.sleep(rng.uniform(0.5, 5.0))
            active -= 1

    async with bounded():
        tasks = []
        for i in range(30):
            tasks.append(asyncio.create_task(worker(i)))
            await settle()  # arrive in index order
        await asyncio.gather(*tasks)
    assert peak == 3
    assert order == list(range(30))
    assert slot.in_flight == 0


@looptime
async def test_driver_a_newcomer_queues_behind_a_woken_head() -> None:
    throttle = make(start_delay=0.0, max_concurrency=1)
    log: list[tuple[int, float]] = []
    async with bounded():
        first = await throttle.acquire(KEY)
        head = spawn(throttle, KEY, log, 1)
        await settle()
        first.release()  # wakes the head, which has not run yet
        newcomer = spawn(throttle, KEY, log, 2)
        await settle()
        assert [i for i, _ in log] == [1]
        (await head).release()
        (await newcomer).release()
    assert [i for i, _ in log] == [1, 2]


@looptime
@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("observe_lower", 10.0),  # latency 0: 10 -> 5, the gap begun at 10 holds
        ("observe_higher", 40.0),  # latency 40: target 40 > 25
        ("set_lower", 2.0),
        ("set_below_elapsed", 1.0),  # already past: goes at once, at t0 + 1
        ("set_higher", 15.0),
    ],
)
async def test_driver_reevaluates_when_the_delay_changes(change: str, expected: float) -> None:
    throttle = make(start_delay=10.0)
    slot = throttle.slot(KEY)
    log: list[tuple[int, float]] = []
    async with bounded():
        t0 = now()
        first = await throttle.acquire(KEY)
        waiter = spawn(throttle, KEY, log, 1)
        await asyncio.sleep(1.0)
        assert not log
        if change == "observe_lower":
            throttle.observe(KEY, latency=0.0, status=200)
        elif change == "observe_higher":
            throttle.observe(KEY, latency=40.0, status=200)
        elif change == "set_lower":
            slot.delay = 2.0
        elif change == "set_below_elapsed":
            slot.delay = 0.5
        else:
            slot.delay = 15.0
        (await waiter).release()
    first.release()
    assert log[0][1] - t0 == pytest.approx(expected, abs=TOL)


@looptime
async def test_driver_a_response_lowering_the_delay_speeds_the_gaps_after_the_one_begun() -> None:
    throttle = make(start_delay=10.0, max_concurrency=100)
    log: list[tuple[int, float]] = []
    async with bounded():
        t0 = now()
        first = await throttle.acquire(KEY)
        tasks = [spawn(throttle, KEY, log, i) for i in range(3)]
        await asyncio.sleep(1.0)
        first.observe(latency=0.0, status=200)  # 10 -> 5
        first.observe(latency=0.0, status=200)  # 5 -> 2.5
        for task in tasks:
            (await task).release()
    first.release()
    # The gap begun at 10 s holds (as Scrapy's scheduler holds it); the next ones are 2.5 s.
    assert [t - t0 for _, t in log] == pytest.approx([10.0, 12.5, 15.0], abs=TOL)


@looptime
@pytest.mark.parametrize(("jitter", "seed"), [(0.3, 1), (0.8, 2)])
async def test_driver_jitter_gaps_in_band_and_unbiased(jitter: float, seed: int) -> None:
    delay = 1.0
    throttle = make(start_delay=delay, jitter=jitter, rng=random.Random(seed))
    slot = throttle.slot(KEY)
    sends: list[float] = []
    stop = asyncio.Event()

    async def poke() -> None:
        # wake the head often (tiny delay changes) so it re-checks many times per gap
        flip = False
        while not stop.is_set():
            await asyncio.sleep(delay / 5)
            flip = not flip
            slot.delay = delay + (1e-9 if flip else 0.0)

    async with bounded():
        poker = asyncio.create_task(poke())
        for _ in range(200):
            lease = await throttle.acquire(KEY)
            sends.append(now())
            lease.release()
        stop.set()
        await poker
    gaps = [b - a for a, b in itertools.pairwise(sends)]
    low, high = delay * (1 - jitter), delay * (1 + jitter)
    assert all(low - TOL <= gap <= high + TOL for gap in gaps)
    # Scrapy's redraw-at-every-check gives about 1.2 x the delay
    assert statistics.fmean(gaps) == pytest.approx(delay, rel=0.07)
    assert max(gaps) - min(gaps) > jitter  # really spread over the band


@looptime
async def test_driver_slots_are_independent() -> None:
    throttle = make(start_delay=60.0, max_concurrency=1, hold_timeout=math.inf)
    slow_log: list[tuple[int, float]] = []
    fast_log: list[tuple[int, float]] = []
    async with bounded():
        t0 = now()
        # the slow slot: at its cap with a lease never released, and a queue behind it
        held = [await throttle.acquire("slow.example")]
        slow = [spawn(throttle, "slow.example", slow_log, i) for i in range(5)]
        await settle()
        throttle.slot("fast.example").delay = 1.0
        for i in range(5):
            lease = await throttle.acquire("fast.example")
            fast_log.append((i, now()))
            lease.release()
        assert not slow_log
        assert throttle.slot("slow.example").queued == 5
        for task in slow:
            task.cancel()
        await asyncio.gather(*slow, return_exceptions=True)
    for lease in held:
        lease.release()
    assert [t - t0 for _, t in fast_log] == pytest.approx([0, 1, 2, 3, 4], abs=TOL)
    assert throttle.slot("slow.example").queued == 0


@looptime
async def test_driver_a_delayed_slot_does_not_delay_another() -> None:
    throttle = make(start_delay=60.0)
    log: list[tuple[int, float]] = []
    async with bounded():
        t0 = now()
        (await throttle.acquire("slow.example")).release()
        waiter = spawn(throttle, "slow.example", log, 0)
        await settle()
        (await throttle.acquire("other.example")).release()
        assert now() == t0
        (await waiter).release()
    assert log[0][1] - t0 == pytest.approx(60.0, abs=TOL)


# -- cancellation ---------------------------------------------------------------------


@looptime
@pytest.mark.parametrize("victim", [0, 1, 2], ids=["head", "middle", "tail"])
async def test_driver_cancel_a_waiter_blocked_by_the_delay(victim: int) -> None:
    throttle = make(start_delay=10.0)
    slot = throttle.slot(KEY)
    log: list[tuple[int, float]] = []
    async with bounded():
        t0 = now()
        (await throttle.acquire(KEY)).release()
        tasks = [spawn(throttle, KEY, log, i) for i in range(3)]
        await asyncio.sleep(1.0)
        assert slot.queued == 3
        tasks[victim].cancel()
        await settle()
        assert tasks[victim].cancelled()
        assert slot.queued == 2
        for i, task in enumerate(tasks):
            if i != victim:
                (await task).release()
    survivors = [i for i in range(3) if i != victim]
    assert [i for i, _ in log] == survivors
    # the cancelled one left no reservation: the others go at 10 and 20
    assert [t - t0 for _, t in log] == pytest.approx([10.0, 20.0], abs=TOL)
    assert (slot.queued, slot.in_flight) == (0, 0)


@looptime
@pytest.mark.parametrize("victim", [0, 1, 2], ids=["head", "middle", "tail"])
async def test_driver_cancel_a_waiter_blocked_by_the_cap(victim: int) -> None:
    throttle = make(start_delay=0.0, max_concurrency=1, hold_timeout=math.inf)
    slot = throttle.slot(KEY)
    log: list[tuple[int, float]] = []
    async with bounded():
        first = await throttle.acquire(KEY)
        tasks = [spawn(throttle, KEY, log, i) for i in range(3)]
        await asyncio.sleep(5.0)
        tasks[victim].cancel()
        await settle()
        assert slot.queued == 2
        assert slot.in_flight == 1
        first.release()
        for i, task in enumerate(tasks):
            if i != victim:
                lease = await task
                assert slot.in_flight == 1
                lease.release()
    assert [i for i, _ in log] == [i for i in range(3) if i != victim]
    assert (slot.queued, slot.in_flight) == (0, 0)


@looptime
@pytest.mark.parametrize("wake", ["release", "delay_drop", "observe"])
async def test_driver_cancel_right_after_the_wake(wake: str) -> None:
    throttle = make(start_delay=10.0, max_concurrency=1, hold_timeout=math.inf)
    slot = throttle.slot(KEY)
    log: list[tuple[int, float]] = []
    async with bounded():
        t0 = now()
        first = await throttle.acquire(KEY)
        if wake != "release":
            first.release()
        head = spawn(throttle, KEY, log, 0)
        second = spawn(throttle, KEY, log, 1)
        await asyncio.sleep(1.0)
        # wake the head and cancel it before it gets to run
        if wake == "release":
            slot.delay = 0.0
            await settle()
            first.release()
        elif wake == "delay_drop":
            slot.delay = 0.0
        else:
            throttle.observe(KEY, latency=0.0, status=200)  # 10 -> 5: the gap begun holds
        head.cancel()
        lease = await second
        with pytest.raises(asyncio.CancelledError):
            await head
        lease.release()
    expected = 10.0 if wake == "observe" else 1.0
    assert log == [(1, pytest.approx(t0 + expected, abs=TOL))]  # type: ignore[comparison-overlap]
    assert (slot.queued, slot.in_flight) == (0, 0)


@looptime
async def test_driver_cancel_at_the_moment_the_timer_fires() -> None:
    throttle = make(start_delay=10.0)
    slot = throttle.slot(KEY)
    async with bounded():
        first = await throttle.acquire(KEY)
        send_at = first.sent_at + 10.0
        got: Lease | None = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(send_at):
                got = await throttle.acquire(KEY)
        first.release()
        if got is None:
            assert (slot.queued, slot.in_flight) == (0, 0)
        else:
            assert (slot.queued, slot.in_flight) == (0, 1)
            got.release()
        # whatever happened, the next request is not held back by a phantom
        t1 = now()
        (await throttle.acquire(KEY)).release()
        assert now() - t1 <= 10.0 + TOL
    assert (slot.queued, slot.in_flight) == (0, 0)


@looptime
@pytest.mark.parametrize("how", ["asyncio.timeout", "wait_for", "anyio.fail_after"])
async def test_driver_timeouts_leave_no_reservation(how: str) -> None:
    throttle = make(start_delay=10.0)
    slot = throttle.slot(KEY)
    async with bounded():
        t0 = now()
        (await throttle.acquire(KEY)).release()
        with pytest.raises(TimeoutError):
            if how == "asyncio.timeout":
                async with asyncio.timeout(5.0):
                    await throttle.acquire(KEY)
            elif how == "wait_for":
                await asyncio.wait_for(throttle.acquire(KEY), 5.0)
            else:
                with anyio.fail_after(5.0):
                    await throttle.acquire(KEY)
        assert now() - t0 == pytest.approx(5.0, abs=TOL)
        assert (slot.queued, slot.in_flight) == (0, 0)
        lease = await throttle.acquire(KEY)
        # goes 10 s after the first send: the timed-out request took no turn
        assert now() - t0 == pytest.approx(10.0, abs=TOL)
        lease.release()


@looptime
async def test_driver_cancel_while_holding_the_lease_releases_it() -> None:
    throttle = make(start_delay=0.0, max_concurrency=1)
    slot = throttle.slot(KEY)

    async def user() -> None:
        with await throttle.acquire(KEY):
            await asyncio.sleep(100.0)

    async with bounded():
        task = asyncio.create_task(user())
        await asyncio.sleep(1.0)
        assert slot.in_flight == 1
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert slot.in_flight == 0
        t1 = now()
        (await throttle.acquire(KEY)).release()
        assert now() == t1


@looptime
async def test_driver_task_group_cancellation_leaves_nothing() -> None:
    throttle = make(start_delay=3.0)
    slot = throttle.slot(KEY)

    async def waiter() -> None:
        with await throttle.acquire(KEY):
            await asyncio.sleep(1.0)

    async def boom() -> None:
        await asyncio.sleep(7.0)
        raise RuntimeError("boom")

    async with bounded():
        with pytest.raises(ExceptionGroup):
            async with asyncio.TaskGroup() as group:
                for _ in range(20):
                    group.create_task(waiter())
                group.create_task(boom())
    assert (slot.queued, slot.in_flight) == (0, 0)
    assert slot.snapshot().sent == 3  # at 0, 3 and 6


@looptime
async def test_driver_double_release_does_not_open_the_cap() -> None:
    throttle = make(start_delay=0.0, max_concurrency=1, hold_timeout=math.inf)
    slot = throttle.slot(KEY)
    log: list[tuple[int, float]] = []
    async with bounded():
        first = await throttle.acquire(KEY)
        a = spawn(throttle, KEY, log, 1)
        b = spawn(throttle, KEY, log, 2)
        await settle()
        first.release()
        lease_a = await a
        first.release()  # again: must not count against lease_a
        await asyncio.sleep(5.0)
        assert [i for i, _ in log] == [1]
        assert slot.in_flight == 1
        lease_a.release()
        (await b).release()
    assert [i for i, _ in log] == [1, 2]


@looptime
async def test_driver_hold_timeout_frees_the_slot_of_a_lost_lease() -> None:
    throttle = make(start_delay=0.0, max_concurrency=1, hold_timeout=30.0)
    slot = throttle.slot(KEY)
    async with bounded():
        t0 = now()
        lost = await throttle.acquire(KEY)  # never released
        lease = await throttle.acquire(KEY)
        assert now() - t0 == pytest.approx(30.0, abs=TOL)
        assert lost.released
        assert slot.in_flight == 1
        lost.release()
        assert slot.in_flight == 1
        lease.release()
    assert slot.in_flight == 0


@looptime
async def test_driver_no_leak_after_thousands_of_cancellations() -> None:
    rng = random.Random(2024)
    gc.collect()
    tickets_before = sum(isinstance(o, Ticket) for o in gc.get_objects())
    throttle = make(start_delay=1.0, max_concurrency=2, hold_timeout=math.inf)
    keys = ["a.example", "b.example"]
    cancelled = 0
    granted = 0

    async def worker(key: str) -> None:
        nonlocal granted
        lease = await throttle.acquire(key)
        granted += 1
        try:
            await asyncio.sleep(rng.uniform(0.0, 1.5))
        finally:
            lease.release()

    async with bounded(10_000_000.0):
        for _ in range(1000):  # bounded
            if cancelled >= 5000:
                break
            key = rng.choice(keys)
            tasks = [asyncio.create_task(worker(key)) for _ in range(rng.randint(20, 80))]
            await asyncio.sleep(rng.choice([0.0, rng.uniform(0.0, 3.0)]))
            if rng.random() < 0.5:
                # wake the head with a delay drop, then cancel before anyone runs
                throttle.slot(key).delay = rng.choice([0.0, 0.5, 1.0])
            for task in rng.sample(tasks, k=len(tasks)):
                task.cancel()
                if rng.random() < 0.3:
                    await asyncio.sleep(0)
            results = await asyncio.gather(*tasks, return_exceptions=True)
            cancelled += sum(isinstance(r, asyncio.CancelledError) for r in results)
            for key_ in keys:
                slot = throttle.slot(key_)
                assert (slot.queued, slot.in_flight) == (0, 0), slot
            throttle.slot(key).delay = 1.0
            del tasks, results  # their tracebacks hold the waiters' frames (and tickets)
    assert cancelled >= 5000
    assert granted > 0
    for key in keys:
        slot = throttle.slot(key)
        assert slot.queued == 0
        assert slot.in_flight == 0
        assert slot.idle
    await settle()  # let asyncio drop its references to the finished tasks
    gc.collect()
    # asyncio may keep the very last CancelledError (and so one waiter's frame)
    # for a while; a leak would keep thousands
    assert sum(isinstance(o, Ticket) for o in gc.get_objects()) <= tickets_before + 2
    # and the slot still works: the next request waits at most one delay
    async with bounded():
        t1 = now()
        (await throttle.acquire("a.example")).release()
        assert now() - t1 <= 1.0 + TOL


class TestWireTurn:
    """Rule 10: the host sees the granted spacing, whenever connections come free."""

    def test_two_grants_that_leave_together_are_spread_on_the_wire(self) -> None:
        clock = FakeClock()
        throttle = Throttle(start_delay=0.5, max_concurrency=4, clock=clock)
        first = throttle.try_acquire("a")
        clock.advance(0.5)
        second = throttle.try_acquire("a")
        assert first is not None and second is not None
        assert second.wire_gap == pytest.approx(0.5)
        clock.advance(2.0)  # both waited for a connection; it comes free now
        assert first.wire_wait() == 0.0
        assert second.wire_wait() == pytest.approx(0.5)
        clock.advance(0.2)
        assert second.wire_wait() == pytest.approx(0.3)  # asked early: wait the rest
        clock.advance(0.3)
        assert second.wire_wait() == 0.0

    def test_a_later_grant_that_reaches_the_wire_first_still_spaces_the_earlier(self) -> None:
        # The first grant of a slot kept no gap after anything; if the second
        # grant's connection is ready first (the first waited on a pool being
        # built, say), the first must still keep the second's gap behind it.
        clock = FakeClock()
        throttle = Throttle(policy=FixedDelayPolicy(0.05), max_concurrency=4, clock=clock)
        first = throttle.try_acquire("a")
        clock.advance(0.05)
        second = throttle.try_acquire("a")
        assert first is not None and second is not None
        clock.advance(0.04)
        assert second.wire_wait() == 0.0
        assert first.wire_wait() == pytest.approx(0.05)
        clock.advance(0.05)
        assert first.wire_wait() == 0.0

    def test_out_of_order_wire_turns_keep_the_later_grants_gap(self) -> None:
        clock = FakeClock()
        throttle = Throttle(start_delay=0.5, max_concurrency=4, clock=clock)
        leases = []
        for _ in range(3):
            lease = throttle.try_acquire("a")
            assert lease is not None
            leases.append(lease)
            clock.advance(0.5)
        clock.advance(5.0)
        went = []
        for lease in (leases[2], leases[0], leases[1]):  # connections ready out of order
            while (wait := lease.wire_wait()) > 0.0:
                clock.advance(wait)
            went.append(clock())
        assert [b - a for a, b in itertools.pairwise(went)] == [pytest.approx(0.5)] * 2

    def test_a_grant_is_made_early_by_its_usual_way_to_the_wire(self) -> None:
        # Connections that get ready 20 ms after the grant (a pool's locks on a
        # busy event loop) would cost those 20 ms every gap, counted once from
        # the previous request's wire turn and again on the way to the next
        # one's: the grant comes that much early, and the wire keeps the gap.
        clock = FakeClock()
        throttle = Throttle(policy=FixedDelayPolicy(0.5), clock=clock, wall_clock=clock.wall)
        went = []
        for i in range(40):
            while (lease := throttle.try_acquire("a")) is None:
                clock.advance(0.001)
            clock.advance(0.02)  # on its way to a connection
            while (wait := lease.wire_wait()) > 0.0:
                clock.advance(wait)
            went.append(clock())
            # The next gap counts from this request's arrival (rule 10): its
            # wire turn, and its latency's excess over the least.
            latency = 0.010 + 0.001 * (i % 2)
            clock.advance(latency)
            lease.observe(latency=latency, status=200)
            lease.release()
        gaps = [b - a for a, b in itertools.pairwise(went)]
        assert min(gaps) >= 0.5 - 1e-9  # never closer on the wire
        assert statistics.fmean(gaps[-10:]) < 0.505  # and the 20 ms are not lost

    def test_a_pause_that_began_after_the_grant_holds_the_wire(self) -> None:
        clock = FakeClock()
        throttle = Throttle(start_delay=0.0, clock=clock)
        lease = throttle.try_acquire("a")
        assert lease is not None
        throttle.backoff("a", pause=3.0)
        assert lease.wire_wait() == pytest.approx(3.0)
        clock.advance(3.0)
        assert lease.wire_wait() == 0.0

    def test_a_clock_that_does_not_move_never_holds_a_request_forever(self) -> None:
        clock = FakeClock()
        throttle = Throttle(start_delay=0.5, max_concurrency=4, clock=clock)
        first = throttle.try_acquire("a")
        clock.advance(0.5)
        second = throttle.try_acquire("a")
        assert first is not None and second is not None
        assert first.wire_wait() == 0.0
        assert second.wire_wait() > 0.0
        assert second.wire_wait() == 0.0  # asked again at the same instant: it goes

"""The gate's rules at their edges, on a hand-set clock (docs/scheduling.md).

``tests/test_scheduling.py`` checks the rules as a crawl meets them; these pin
the edges a mutation run (``scripts/mutants.py _gate``) showed no test
asserted: the moment a pause or budget ends, a ramp-up of its own length and
with a jitter, a gap begun after a refusal by a grant not plain, a burst at a
delay of nothing, a ticket dropped from the queue before it was abandoned, a
waiter whose loop closed, what counts as lateness, a queued request's cost,
the policy's own cap of one, and (``_lease``) a fleet's check before the wire
turn.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
from pathlib import Path

import pytest

from autothrottle import (
    AdaptiveConcurrencyPolicy,
    AutoThrottlePolicy,
    FixedDelayPolicy,
    FixedRatePolicy,
    Throttle,
    ThrottleTimeout,
)
from autothrottle.store import MemoryStore
from autothrottle.testing import VirtualClock
from helpers import FakeClock, abandon, gate_of, record_of, try_acquire

KEY = "example.com"


class WakeCounter:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def _closed_loop() -> None:
    raise RuntimeError("Event loop is closed")


# -- idle: the moment a pause or a budget ends ------------------------------------------


def test_a_slot_is_idle_from_the_moment_its_pause_ends_as_its_gate_opens() -> None:
    # Forgetting a paused slot would let its next request go at once; forgetting
    # it once the pause is over loses nothing: the gate opens at that moment.
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=0.0)
    slot = throttle.slot(KEY)
    throttle.backoff(KEY, pause=5.0)
    end = slot.pause_until
    clock.now = end - 1e-3
    assert not slot.idle
    assert throttle.try_acquire(KEY) is None
    clock.now = end
    assert slot.idle
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    lease.release()


def test_a_slot_is_idle_from_the_moment_its_budget_resets() -> None:
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=0.0)
    slot = throttle.slot(KEY)
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    headers = {"RateLimit-Limit": "10", "RateLimit-Remaining": "5", "RateLimit-Reset": "10"}
    lease.observe(latency=0.01, status=200, headers=headers)
    lease.release()
    reset = clock.now + 10.0
    clock.now = reset - 1e-3
    assert not slot.idle  # the budget still spaces the sends
    clock.now = reset
    assert slot.idle


# -- the ramp-up inside a gap -----------------------------------------------------------


def _ramped_wait(start: float, ramp_up: float, factor: float) -> float:
    """The t with t = factor * start * 2 ** (-t / period): the second send of a
    slot whose delay ramps down from ``start`` (docs/signals.md, "Ramp-up")."""
    period = min(ramp_up, 8 * start)
    low, high = 0.0, factor * start
    for _ in range(60):
        middle = (low + high) / 2.0
        if factor * start * 2.0 ** (-middle / period) <= middle:
            high = middle
        else:
            low = middle
    return high


@pytest.mark.parametrize("ramp_up", [0.5, 4.0])
def test_the_ramp_within_a_gap_falls_at_the_policy_s_own_pace(ramp_up: float) -> None:
    clock = FakeClock()
    policy = AdaptiveConcurrencyPolicy(ramp_up=ramp_up)
    throttle = Throttle(clock=clock, start_delay=5.0, policy=policy)
    slot = throttle.slot(KEY)
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    lease.observe(latency=0.01, status=200)
    lease.release()
    ticket = gate_of(slot).enqueue()
    wait = try_acquire(slot, ticket)
    assert wait == pytest.approx(_ramped_wait(5.0, ramp_up, 1.0), rel=1e-4)
    clock.advance(wait)
    assert try_acquire(slot, ticket) == 0.0


@pytest.mark.parametrize("seed", [1, 2, 7])
def test_the_jitter_factor_stretches_a_ramped_gap_as_it_does_any(seed: int) -> None:
    # The factor drawn at the send scales the ramp's delay at each moment of
    # the gap: the gap is factor * delay(t), not delay(t) / factor.
    jitter = 0.5
    factor = 1.0 + jitter * (2.0 * random.Random(seed).random() - 1.0)
    clock = FakeClock()
    throttle = Throttle(
        clock=clock,
        start_delay=5.0,
        jitter=jitter,
        rng=random.Random(seed),
        policy=AdaptiveConcurrencyPolicy(ramp_up=4.0),
    )
    slot = throttle.slot(KEY)
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    lease.observe(latency=0.01, status=200)
    lease.release()
    ticket = gate_of(slot).enqueue()
    wait = try_acquire(slot, ticket)
    assert wait == pytest.approx(_ramped_wait(5.0, 4.0, factor), rel=1e-4)


@pytest.mark.parametrize("how", ["queued", "jitter"])
def test_a_gap_begun_after_a_refusal_keeps_its_delay_when_the_grant_is_not_plain(
    how: str,
) -> None:
    # docs/scheduling.md, rule 3: a gap once begun is never shortened by a delay
    # that fell since; only the ramp-up of a slot never refused runs within a
    # gap. A refusal at a gap under a second counts as one: here the delay the
    # gap began at holds, whether the grant was a queued request's or a
    # jittered slot's (the general grant, not the plain one).
    seed, jitter = 7, 0.5 if how == "jitter" else 0.0
    clock = FakeClock()
    throttle = Throttle(
        clock=clock,
        start_delay=0.2,
        jitter=jitter,
        rng=random.Random(seed),
        policy=AdaptiveConcurrencyPolicy(),  # a ramp-up of 1 s
    )
    slot = throttle.slot(KEY)
    throttle.observe(KEY, latency=0.05, status=200)
    throttle.observe(KEY, latency=0.05, status=429)
    assert 0.0 < record_of(slot).refused_gap <= 1.0
    begun = slot.delay
    clock.advance(60.0)  # the recovery floor is far below by now
    if how == "queued":
        ticket = gate_of(slot).enqueue()
        assert try_acquire(slot, ticket) == 0.0
        assert ticket.hold is not None
        ticket.hold.release()  # type: ignore[attr-defined]
        throttle.observe(KEY, latency=0.01, status=200)
        assert slot.delay < begun / 10
        ticket = gate_of(slot).enqueue()
        assert try_acquire(slot, ticket) == pytest.approx(begun)
        return
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    lease.observe(latency=0.01, status=200)
    lease.release()
    assert slot.delay < begun / 10
    gap = begun * (1.0 + jitter * (2.0 * random.Random(seed).random() - 1.0))
    clock.advance(gap - 1e-3)
    assert throttle.try_acquire(KEY) is None
    clock.advance(2e-3)
    assert throttle.try_acquire(KEY) is not None


def test_a_loaded_ramp_above_the_delay_the_throttle_bounds_is_no_ramp(tmp_path: Path) -> None:
    # A record saved while the ramp-up held its delay at 10 s on its way down
    # to 5 s, loaded by a throttle whose max_delay is 3 s: the delay is held to
    # 3 s, and so is the gap (a bound the user set holds). The ramp's 5 s is
    # above the delay: no ramp, not a gap of 5 s.
    clock = FakeClock(100.0)
    store = _loaded(tmp_path, {"delay": 10.0, "ramp_to": 5.0}, clock)
    throttle = Throttle(store=store, clock=clock, max_delay=3.0)
    first = throttle.try_acquire(KEY)
    assert first is not None
    first.release()
    assert throttle.slot(KEY).delay == 3.0
    sent = clock.now
    clock.now = sent + 3.0 - 1e-3
    assert throttle.try_acquire(KEY) is None
    clock.now = sent + 3.0
    second = throttle.try_acquire(KEY)
    assert second is not None
    second.release()


# -- a burst at a delay of nothing --------------------------------------------------------


def test_a_burst_policy_set_to_no_delay_sends_at_once_and_keeps_its_tokens() -> None:
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=FixedRatePolicy(10, burst=3), max_concurrency=100)
    slot = throttle.slot(KEY)
    slot.delay = 0.0
    leases = [throttle.try_acquire(KEY) for _ in range(10)]
    assert all(lease is not None for lease in leases)
    assert {lease.sent_at for lease in leases if lease is not None} == {clock.now}
    # Back at its rate the bucket is full: the burst goes, then the rate holds.
    slot.delay = 0.1
    clock.advance(1.0)
    sent = [throttle.try_acquire(KEY) for _ in range(4)]
    assert [lease is not None for lease in sent] == [True, True, True, False]


@pytest.mark.parametrize("tokens", ["a whole one", "the bucket full"])
def test_a_burst_s_grant_that_finds_a_token_keeps_no_gap_on_the_wire(tokens: str) -> None:
    # docs/scheduling.md, rule 10: on the wire a request keeps the gap its
    # grant kept, 0 within a burst. The request before it reached the wire
    # late (its connection was slow); one granted the moment its token is
    # whole, or with the bucket full, still goes on the wire at once.
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=FixedRatePolicy(1, burst=2), max_concurrency=10)
    whole = tokens == "a whole one"
    start = clock.now
    leases = [throttle.try_acquire(KEY) for _ in range(2 if whole else 1)]
    assert all(lease is not None for lease in leases)
    clock.now = start + (0.75 if whole else 4.5)
    assert [lease.wire_wait() for lease in leases if lease is not None] == [0.0] * len(leases)
    # Both tokens spent at the start: one is back a second later. One spent:
    # the bucket is full again 4 s before the next grant.
    clock.now = start + (1.0 if whole else 5.0)
    last = throttle.try_acquire(KEY)
    assert last is not None
    assert last.wire_wait() == 0.0
    for lease in [*leases, last]:
        if lease is not None:
            lease.release()


# -- abandon ------------------------------------------------------------------------------


def test_abandoning_a_ticket_dropped_with_its_closed_loop_is_a_no_op() -> None:
    # A head whose event loop closed is dropped when the gate wakes it; the
    # driver's abandon of that ticket afterwards finds nothing left to do.
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=1.0)
    slot = throttle.slot(KEY)
    gate = gate_of(slot)
    first = throttle.try_acquire(KEY)
    assert first is not None
    dead = gate.enqueue()
    dead.wake = _closed_loop
    first.release()  # wakes the head: its loop is closed, it leaves the queue
    assert slot.queued == 0
    assert gate.abandon(dead) is None
    assert slot.queued == 0


def test_abandoning_a_ticket_behind_the_head_does_not_wake_the_head() -> None:
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=1.0)
    slot = throttle.slot(KEY)
    assert throttle.try_acquire(KEY) is not None
    gate = gate_of(slot)
    head, behind = gate.enqueue(), gate.enqueue()
    head.wake = woken = WakeCounter()
    abandon(slot, behind)
    assert woken.count == 0  # nothing it waits on changed
    abandon(slot, head)
    assert slot.queued == 0


# -- a waiter whose event loop closed ---------------------------------------------------


def test_a_waiter_whose_loop_closed_ahead_of_the_head_is_passed_over() -> None:
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=0.0, max_concurrency=10)
    slot = throttle.slot(KEY)
    gate = gate_of(slot)
    dead, live = gate.enqueue(), gate.enqueue()
    dead.alive = lambda: False
    assert try_acquire(slot, live) == 0.0
    assert live.hold is not None
    assert dead.hold is None
    assert slot.queued == 0


# -- what counts as the client's lateness ----------------------------------------------


def _late_grant(throttle: Throttle, clock: FakeClock, late: float) -> None:
    """A head told to wait out the delay and let go ``late`` seconds after it."""
    slot = throttle.slot(KEY)
    ticket = gate_of(slot).enqueue()
    wait = try_acquire(slot, ticket)
    assert wait > 0.0
    clock.advance(wait + late)
    assert try_acquire(slot, ticket) == 0.0
    assert ticket.hold is not None
    ticket.hold.release()  # type: ignore[attr-defined]


def test_a_head_granted_without_a_timed_wait_counts_no_lateness() -> None:
    # docs/signals.md, "The client's own lag": only a timed wait says how late
    # this process reads its timers.
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=1.0)
    slot = throttle.slot(KEY)
    first = throttle.try_acquire(KEY)
    assert first is not None
    first.release()
    _late_grant(throttle, clock, 0.05)
    gate = gate_of(slot)
    assert gate.lateness == pytest.approx(0.05)
    clock.advance(2.0)
    ticket = gate.enqueue()
    assert try_acquire(slot, ticket) == 0.0  # its turn had come: it never waited
    assert gate.lateness == pytest.approx(0.05)


def test_a_head_that_waited_on_the_cap_counts_no_lateness() -> None:
    # A head woken by a release resumes within the loop's turn: its lateness
    # says little of the timers, and is not counted.
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=1.0, max_concurrency=1)
    slot = throttle.slot(KEY)
    gate = gate_of(slot)
    first = throttle.try_acquire(KEY)
    assert first is not None
    first.release()
    ticket = gate.enqueue()
    clock.advance(0.5)
    assert try_acquire(slot, ticket) == pytest.approx(0.5)  # told to wait: due in 0.5 s
    clock.advance(0.55)
    assert try_acquire(slot, ticket) == 0.0
    assert gate.lateness == pytest.approx(0.05)
    held = ticket.hold
    assert held is not None
    clock.advance(2.0)
    ticket = gate.enqueue()
    assert try_acquire(slot, ticket) == math.inf  # at the cap: only a release wakes it
    held.release()  # type: ignore[attr-defined]
    assert try_acquire(slot, ticket) == 0.0
    assert gate.lateness == pytest.approx(0.05)


# -- a queued request's cost ------------------------------------------------------------


def _told_tokens(throttle: Throttle, remaining: int) -> None:
    """A first answer says ``remaining`` of 1,000 tokens a minute are left."""
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    headers = {
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": str(remaining),
        "x-ratelimit-reset-tokens": "60s",
    }
    lease.observe(latency=0.01, status=200, headers=headers)
    lease.release()


def test_a_queued_request_spends_its_cost_when_granted() -> None:
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=0.0, max_concurrency=10)
    slot = throttle.slot(KEY)
    gate = gate_of(slot)
    _told_tokens(throttle, 1000)
    slot.delay = 0.0  # only the tokens space these two
    first, second = gate.enqueue(600), gate.enqueue(600)
    assert try_acquire(slot, first) == 0.0
    assert first.hold is not None
    first.hold.release()  # type: ignore[attr-defined]
    # 400 left of 1000, refilled at 1000 a minute: 200 more come in 12 s.
    assert try_acquire(slot, second) == pytest.approx(12.0)


def test_the_gate_s_next_send_for_a_cost_is_when_that_cost_fits() -> None:
    # send_at is what the tests read the schedule by: with a cost, it is the
    # wait a queued request of that cost is told, not a cost-less one's.
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=0.0, max_concurrency=10)
    slot = throttle.slot(KEY)
    gate = gate_of(slot)
    _told_tokens(throttle, 400)
    slot.delay = 0.0
    now = clock.now
    assert gate.send_at(now) == now  # a request without a cost needs one token
    # 400 left, refilled at 600 a minute (600 empty, full in 60 s): 200 more in 20 s.
    assert gate.send_at(now, 600) == pytest.approx(now + 20.0)
    assert try_acquire(slot, gate.enqueue(600)) == pytest.approx(20.0)


async def test_a_cost_is_spent_at_its_grant_and_a_cancelled_waiter_spends_nothing() -> None:
    # Through the public throttle: a grant takes its cost at once, and keeps it
    # taken when its lease is let go unanswered (the server may have counted it);
    # a request cancelled while it waited was never granted and took nothing.
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=0.0, max_concurrency=10)
    _told_tokens(throttle, 1000)
    throttle.slot(KEY).delay = 0.0  # only the tokens space these requests
    granted = throttle.try_acquire(KEY, cost=600)
    assert granted is not None
    assert throttle.try_acquire(KEY, cost=600) is None  # 400 left: asking takes nothing
    waiting = asyncio.create_task(throttle.acquire(KEY, cost=600))
    for _ in range(3):
        await asyncio.sleep(0)
    assert throttle.slot(KEY).queued == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert throttle.slot(KEY).queued == 0
    granted.release()  # cancelled after its grant: its 600 stay spent
    # 400 left, refilled at 1000 a minute: 600 fit 12 s after the grant, not
    # before (the released grant's tokens did not come back), and not later
    # (the cancelled waiter's would have made it 48 s).
    clock.advance(11.9)
    assert throttle.try_acquire(KEY, cost=600) is None
    clock.advance(0.1)
    last = throttle.try_acquire(KEY, cost=600)
    assert last is not None
    last.release()


# -- the policy's own cap ---------------------------------------------------------------


def test_a_policy_s_cap_of_one_holds_a_queued_request_until_the_release() -> None:
    # AdaptiveConcurrencyPolicy starts at a limit of one request in flight
    # (docs/signals.md): with max_concurrency at ten, the policy's cap binds.
    clock = FakeClock()
    policy = AdaptiveConcurrencyPolicy(initial_limit=1.0)
    throttle = Throttle(clock=clock, start_delay=0.0, max_concurrency=10, policy=policy)
    slot = throttle.slot(KEY)
    gate = gate_of(slot)
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    lease.observe(latency=0.01, status=200)
    lease.release()
    slot.delay = 0.0
    held = throttle.try_acquire(KEY)
    assert held is not None
    ticket = gate.enqueue()
    assert try_acquire(slot, ticket) == pytest.approx(throttle.hold_timeout)
    assert ticket.hold is None
    held.release()
    assert try_acquire(slot, ticket) == 0.0


# -- a lease's turn on the wire, with a fleet's check first -----------------------------


@pytest.mark.parametrize("fleet_wait", [0.25, 1.5])
def test_a_fleet_s_wait_at_the_wire_comes_first(fleet_wait: float) -> None:
    # Lease.wire_wait: the fleet's check (on_wire) first; while it says wait,
    # that is the answer and the slot's wire turn is not taken.
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=1.0)
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    lease.on_wire = lambda: fleet_wait
    assert lease.wire_wait() == fleet_wait
    lease.on_wire = lambda: 0.0
    assert lease.wire_wait() == 0.0
    lease.release()


def test_a_fleet_s_go_at_the_wire_still_takes_the_slot_s_wire_turn() -> None:
    # When the fleet's check says go, the slot's own turn is taken and
    # recorded (docs/scheduling.md, rule 10): the next grant keeps its gap
    # from this request's time on the wire, not from its grant.
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=1.0)
    first = throttle.try_acquire(KEY)
    assert first is not None
    first.on_wire = lambda: 0.0
    clock.advance(0.5)  # its connection took half a second
    assert first.wire_wait() == 0.0
    clock.advance(0.5)
    second = throttle.try_acquire(KEY)
    assert second is not None
    assert second.wire_wait() == pytest.approx(0.5)
    first.release()
    second.release()


# -- a response finished as it arrives: what it says still counts ------------------------


@pytest.mark.parametrize("path", ["usual", "expired", "fleet"])
def test_a_finished_response_s_headers_and_cache_flag_count_on_every_path(path: str) -> None:
    # Lease.finish applies the response as observe does, whichever way it goes:
    # released with it (usual), or observed then released (a lease that expired,
    # or a fleet's, whose release also tells the store).
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=0.0, hold_timeout=1.0, max_concurrency=10)
    slot = throttle.slot(KEY)
    told: list[str] = []
    hit, refused = throttle.try_acquire(KEY), throttle.try_acquire(KEY)
    assert hit is not None and refused is not None
    if path == "expired":
        clock.advance(2.0)
        assert slot.in_flight == 0 and hit.released and refused.released
    elif path == "fleet":
        hit.on_release = refused.on_release = lambda: told.append("released")
    hit.finish(latency=0.01, status=200, from_cache=True)
    refused.finish(latency=0.01, status=429, headers={"Retry-After": "5"})
    assert slot.snapshot().cache_hits == 1
    assert slot.pause_until == pytest.approx(clock.now + 5.0)
    assert slot.in_flight == 0
    assert told == (["released", "released"] if path == "fleet" else [])


# -- a thread's turn (``_turns.Turns.take_blocking``), on a clock that skips waits -------


def test_a_thread_waits_its_turn_on_the_clock_within_the_shorter_bound() -> None:
    clock = VirtualClock()
    throttle = Throttle(
        policy=FixedDelayPolicy(10.0), clock=clock, hosts={"slow.example": {"max_wait": 2.0}}
    )
    first = throttle.acquire_blocking(KEY)
    first.release()
    second = throttle.acquire_blocking(KEY, max_wait=30.0)  # its turn comes in 10 s
    second.release()
    assert second.sent_at - first.sent_at == pytest.approx(10.0, abs=0.2)
    with pytest.raises(ThrottleTimeout) as raised:
        throttle.acquire_blocking(KEY, max_wait=3.0)
    assert (raised.value.slot, raised.value.waited) == (KEY, 3.0)
    # The slot's own bound (2 s) is the shorter one: it holds.
    throttle.acquire_blocking("slow.example").release()
    with pytest.raises(ThrottleTimeout) as raised:
        throttle.acquire_blocking("slow.example", max_wait=5.0)
    assert (raised.value.slot, raised.value.waited) == ("slow.example", 2.0)


async def test_a_task_waits_its_turn_on_the_clock_within_the_shorter_bound() -> None:
    clock = VirtualClock()
    throttle = Throttle(
        policy=FixedDelayPolicy(10.0), clock=clock, hosts={"slow.example": {"max_wait": 2.0}}
    )
    first = await throttle.acquire(KEY)
    first.release()
    second = await throttle.acquire(KEY, max_wait=30.0)  # its turn comes in 10 s
    second.release()
    assert second.sent_at - first.sent_at == pytest.approx(10.0, abs=0.2)
    with pytest.raises(ThrottleTimeout) as raised:
        await throttle.acquire(KEY, max_wait=3.0)
    assert (raised.value.slot, raised.value.waited) == (KEY, 3.0)
    (await throttle.acquire("slow.example")).release()
    with pytest.raises(ThrottleTimeout) as raised:
        await throttle.acquire("slow.example", max_wait=5.0)
    assert (raised.value.slot, raised.value.waited) == ("slow.example", 2.0)


def _loaded(tmp_path: Path, record: dict[str, float], clock: FakeClock) -> MemoryStore:
    path = tmp_path / "learned.json"
    path.write_text(json.dumps({"autothrottle_slots": 1, "slots": {KEY: record}}))
    return MemoryStore.from_file(path, now=clock.now)


def test_a_loaded_ramp_falls_no_lower_than_the_loading_throttles_min_delay(
    tmp_path: Path,
) -> None:
    # Saved while the ramp-up held the delay at 1 s on its way down to 50 ms,
    # loaded by a throttle whose min_delay is 0.4 s: the ramp may still run
    # (the adaptive policy has one), but it ends at 0.4 s, a bound the user set.
    clock = FakeClock(100.0)
    store = _loaded(tmp_path, {"delay": 1.0, "ramp_to": 0.05}, clock)
    throttle = Throttle(store=store, clock=clock, min_delay=0.4)
    sends = []
    for _ in range(400):  # 4 s: the ramp reaches its end within 2
        lease = throttle.try_acquire(KEY)
        if lease is not None:
            sends.append(clock.now)
            lease.release()
        clock.now += 0.01
    gaps = [b - a for a, b in itertools.pairwise(sends)]
    assert len(sends) >= 6
    assert min(gaps) >= 0.4 - 1e-9, gaps


def test_a_loaded_ramp_is_dropped_under_a_policy_with_no_ramp_up(tmp_path: Path) -> None:
    # Saved by the adaptive policy mid-ramp (delay 1 s, falling to 0.1 s),
    # loaded by a throttle with Scrapy's rule, which has no ramp-up: the
    # record's delay stands, and nothing of another policy's ramp runs on it.
    clock = FakeClock(100.0)
    store = _loaded(tmp_path, {"delay": 1.0, "ramp_to": 0.1}, clock)
    throttle = Throttle(store=store, clock=clock, policy=AutoThrottlePolicy())
    first = throttle.try_acquire(KEY)
    assert first is not None
    first.release()
    assert throttle.slot(KEY).delay == 1.0
    sent = clock.now
    clock.now = sent + 0.999
    assert throttle.try_acquire(KEY) is None  # a ramp would have let it go after ~0.6 s
    clock.now = sent + 1.0
    second = throttle.try_acquire(KEY)
    assert second is not None
    second.release()


async def test_a_queue_of_its_own_for_the_first_request_that_waits() -> None:
    # A gate nobody waited at shares one empty queue (no 760-byte block a slot);
    # the first request that waits gives its gate a queue of its own.
    from autothrottle import _gate

    clock = VirtualClock()
    throttle = Throttle(policy=FixedDelayPolicy(1.0), clock=clock)
    for key in ("a.example", "b.example"):
        (await throttle.acquire(key)).release()
    second = asyncio.ensure_future(throttle.acquire("a.example"))
    await asyncio.sleep(0)
    assert throttle.slot("a.example").queued == 1
    assert throttle.slot("b.example").queued == 0
    assert len(_gate._NO_QUEUE) == 0
    (await second).release()
    assert len(_gate._NO_QUEUE) == 0


# -- a delay set by hand applies to the gap begun ----------------------------------------


def test_a_delay_set_by_hand_to_the_one_in_force_wakes_the_head_of_a_shorter_gap() -> None:
    # A response lowered the delay (0.25 s by hand, then the policy's 0): the
    # gap begun keeps its 0.25 s (rule 3). Setting 0 by hand applies to the gap
    # begun too, though the delay was 0 already: the head's turn comes now, and
    # it must be woken, or it sleeps to the old gap's end, late.
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=FixedDelayPolicy(0.0))
    slot = throttle.slot(KEY)
    slot.delay = 0.25
    first = throttle.try_acquire(KEY)
    assert first is not None
    first.observe(latency=0.01, status=200)  # the policy's delay: 0
    assert slot.delay == 0.0
    ticket = gate_of(slot).enqueue()
    ticket.wake = woken = WakeCounter()
    assert try_acquire(slot, ticket) == pytest.approx(0.25)  # the gap begun holds
    slot.delay = 0.0
    assert woken.count == 1
    assert try_acquire(slot, ticket) == 0.0
    first.release()

"""A stated pace while the host's own count shows a request to spare (docs/scheduling.md, rule 10).

A strict pace counts each gap from the latest moment the last request may
have reached the host, plus a margin, and from when it actually went: a send
let go late by a busy event loop widens that gap by its lateness, and a
loaded client falls a few per cent short of the stated rate. While the
answer to the last request on the wire says the host has at least one more
request to spare (a count below its quota, at least one left), an early
arrival costs nothing there: the gaps count from when each send was *due*,
at most half a gap back, and with no arrival margin. A hand-set clock; a
lease's wire turn stands for the moment its request was written.
"""

from __future__ import annotations

import pytest

from autothrottle import FixedRatePolicy, Throttle
from autothrottle._arrivals import MARGIN_STEP
from helpers import FakeClock, gate_of

KEY = "api.example"
GAP = 0.5  # FixedRatePolicy(2.0)
POLICY = {"RateLimit-Policy": '"default";q=2;w=1'}
SPARE = {**POLICY, "RateLimit": '"default";r=1;t=1'}  # one left of two
WHOLE = {**POLICY, "RateLimit": '"default";r=2;t=1'}  # the whole quota, whatever was sent
LATE = 0.030


def stated() -> tuple[FakeClock, Throttle]:
    clock = FakeClock()
    return clock, Throttle(clock=clock, policy=FixedRatePolicy(2.0))


def send(clock: FakeClock, throttle: Throttle, headers: dict[str, str], late: float = 0.0) -> float:
    """One request ``late`` seconds after its turn, on the wire at once, answered
    200 in 10 ms with ``headers``; the time it went."""
    clock.advance(max(0.0, gate_of(throttle.slot(KEY)).send_at(clock.now) - clock.now) + late)
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    assert lease.wire_wait() == 0.0
    went = clock.now
    lease.observe(latency=0.010, status=200, headers=headers)
    lease.release()
    return went


def next_turn(throttle: Throttle, clock: FakeClock) -> float:
    return gate_of(throttle.slot(KEY)).send_at(clock.now)


def test_a_late_send_costs_the_pace_nothing_while_the_host_has_a_request_to_spare() -> None:
    clock, throttle = stated()
    for _ in range(6):
        on_time = send(clock, throttle, SPARE)
    late = send(clock, throttle, SPARE, late=LATE)
    assert late == pytest.approx(on_time + GAP + LATE)
    # The next keeps the schedule the late one fell behind: due a gap after
    # the late one was due, no margin on top.
    assert next_turn(throttle, clock) == pytest.approx(on_time + 2 * GAP)
    # And the wire agrees: sent then, it goes at once.
    assert send(clock, throttle, SPARE) == pytest.approx(on_time + 2 * GAP)


def test_a_count_that_stays_at_the_whole_quota_is_not_taken_for_a_request_to_spare() -> None:
    # A host that states what its window allows, not what is left of it, may
    # still refuse a request that arrives early (a bucket with no burst).
    clock, throttle = stated()
    for _ in range(6):
        send(clock, throttle, WHOLE)
    late = send(clock, throttle, WHOLE, late=LATE)
    assert next_turn(throttle, clock) >= late + GAP


def test_nothing_left_keeps_every_gap_from_the_latest_arrival() -> None:
    clock, throttle = stated()
    for _ in range(6):
        send(clock, throttle, SPARE)
    late = send(clock, throttle, {**POLICY, "RateLimit": '"default";r=0;t=0.4'}, late=LATE)
    assert next_turn(throttle, clock) >= late + GAP


def test_a_stall_catches_up_half_a_gap_at_most() -> None:
    # Let go 1.2 s late (more than two gaps): the next follows half a gap
    # later, and the schedule goes on from there, with no burst; the other
    # half of the spare is left for what the client cannot see.
    clock, throttle = stated()
    for _ in range(6):
        send(clock, throttle, SPARE)
    stalled = send(clock, throttle, SPARE, late=1.2)
    assert next_turn(throttle, clock) == pytest.approx(stalled + GAP / 2)
    caught_up = send(clock, throttle, SPARE)
    assert caught_up == pytest.approx(stalled + GAP / 2)
    assert next_turn(throttle, clock) == pytest.approx(caught_up + GAP)


def test_a_request_on_the_wire_since_the_count_was_read_has_spent_the_spare() -> None:
    # The count said one to spare before the last request went: until that
    # request's own answer says so again, gaps count as for any strict pace.
    clock, throttle = stated()
    for _ in range(6):
        send(clock, throttle, SPARE)
    clock.advance(max(0.0, next_turn(throttle, clock) - clock.now) + LATE)
    lease = throttle.try_acquire(KEY)
    assert lease is not None and lease.wire_wait() == 0.0
    went = clock.now
    assert next_turn(throttle, clock) >= went + GAP  # not yet answered
    lease.observe(latency=0.010, status=200, headers=SPARE)
    lease.release()
    assert next_turn(throttle, clock) == pytest.approx(went - LATE + GAP)


def test_after_a_refusal_at_the_stated_pace_the_count_is_not_taken_at_its_word() -> None:
    clock, throttle = stated()
    for _ in range(6):
        send(clock, throttle, SPARE)
    clock.advance(max(0.0, next_turn(throttle, clock) - clock.now))
    refused = throttle.try_acquire(KEY)
    assert refused is not None and refused.wire_wait() == 0.0
    refused.observe(latency=0.002, status=429, headers={**SPARE, "Retry-After": "1"})
    refused.release()
    assert throttle.slot(KEY).delay == GAP  # a margin step, not a backoff
    for _ in range(3):
        send(clock, throttle, SPARE)
    late = send(clock, throttle, SPARE, late=LATE)
    assert next_turn(throttle, clock) >= late + GAP + MARGIN_STEP * 0.999


def test_a_fleets_slot_does_not_take_a_count_other_processes_spend_from() -> None:
    clock, throttle = stated()
    throttle._live(KEY).senders = 2
    for _ in range(6):
        send(clock, throttle, SPARE)
    late = send(clock, throttle, SPARE, late=LATE)
    assert next_turn(throttle, clock) >= late + GAP

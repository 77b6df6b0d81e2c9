"""The wire turn's own rules (``autothrottle._wire``), on an injected clock.

What each test pins was left unasserted by the rest of the suite (its mutants
survived, ``docs/mutants.md``): which budget shows a request to spare, how a
grant's way to the wire is averaged into the lead, and what a late start of a
client's latency clock adds to the arrival guard's count.
"""

from __future__ import annotations

import math

import pytest

from autothrottle import AutoThrottlePolicy, FixedRatePolicy, Throttle
from autothrottle._headers import RateLimit
from autothrottle._wire import shows_spare
from helpers import FakeClock, Hold, gate_of, record_of

KEY = "example.com"


def test_only_a_count_of_requests_with_its_quota_shows_one_to_spare() -> None:
    """A budget of tokens shows no request to spare, and a count with no quota
    shows nothing (and is no error)."""
    assert shows_spare(RateLimit(remaining=5, reset=1.0, limit=10))
    assert not shows_spare(RateLimit(remaining=500, reset=1.0, limit=1000, unit="tokens"))
    assert not shows_spare(RateLimit(remaining=5, reset=1.0))
    assert not shows_spare(None)


def test_the_lead_averages_each_grants_way_to_the_wire_capped_at_50_ms() -> None:
    """A grant's first ask of its wire turn moves the lead a tenth of the way to
    the time since its grant, a way of more than 50 ms counting as 50 ms."""
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=0.0)
    slot = throttle.slot(KEY)
    gate = gate_of(slot)
    slow = Hold(slot, clock.now, clock.now + 60.0)
    clock.advance(0.2)  # a new connection's handshake
    assert gate.wire_wait(slow) == 0.0
    assert gate.lead == pytest.approx(0.1 * 0.05)
    quick = Hold(slot, clock.now, clock.now + 60.0)
    clock.advance(0.01)
    assert gate.wire_wait(quick) == 0.0
    assert gate.lead == pytest.approx(0.005 + 0.1 * (0.01 - 0.005))


def wired(clock: FakeClock) -> tuple[Throttle, Hold]:
    """A strict pace's slot whose one request just went on the wire."""
    throttle = Throttle(clock=clock, policy=FixedRatePolicy(1.0))
    slot = throttle.slot(KEY)
    hold = Hold(slot, clock.now, clock.now + 60.0)
    assert gate_of(slot).wire_wait(hold) == 0.0
    return throttle, hold


def test_a_late_start_of_no_time_adds_nothing_to_the_arrival() -> None:
    """A latency clock started "early" (a negative late start) counts as started
    on time: the arrival guard reads the answer's latency as it is."""
    clock = FakeClock()
    throttle, hold = wired(clock)
    gate = gate_of(throttle.slot(KEY))
    gate.answered(hold.sent_at, 0.1, clock.now)  # the guard is made at the first answer
    second = Hold(throttle.slot(KEY), clock.now + 1.0, clock.now + 60.0)
    clock.advance(1.0)
    assert gate.wire_wait(second) == 0.0
    went = clock.now
    gate.started_late(second.sent_at, -0.5)
    gate.answered(second.sent_at, 0.1, clock.now + 0.1)
    assert gate.arrivals is not None
    assert gate.arrivals.latest == pytest.approx(went + 0.1, rel=0, abs=1e-9)


def test_a_late_start_before_the_guard_exists_is_not_kept() -> None:
    """Before a strict pace's first answer there is no arrival guard: a late
    start noted then is not added to that answer's latency."""
    clock = FakeClock()
    throttle, hold = wired(clock)
    gate = gate_of(throttle.slot(KEY))
    gate.started_late(hold.sent_at, 0.3)
    gate.answered(hold.sent_at, 0.1, clock.now + 0.1)
    assert gate.arrivals is not None
    assert gate.arrivals.latest == pytest.approx(clock.now + 0.1, rel=0, abs=1e-9)


def test_the_arrival_margin_is_a_share_of_the_pace_when_the_gap_is_shorter() -> None:
    """A gap shorter than the slot's delay (a burst's, say) does not shrink the
    arrival margin: its share is of the longer of the two (here the 1 s pace)."""
    clock = FakeClock()
    throttle, hold = wired(clock)
    gate = gate_of(throttle.slot(KEY))
    gate.answered(hold.sent_at, 0.1, clock.now + 0.1)
    assert gate.widen_margin(1.0)  # a refusal at the pace: a margin to keep
    assert gate.arrivals is not None
    margin = gate.arrivals.margin(1.0, gate.lateness)
    assert margin > 0.0
    last = clock.now + 5.0  # after the refusal: no makeup
    assert gate.counts_from(last, last, 0.0) == pytest.approx(last + margin, rel=0, abs=1e-9)


def test_a_request_granted_at_the_same_instant_keeps_its_own_gap_on_the_wire() -> None:
    """Of two grants of one instant, the one that reaches the wire second keeps
    its own gap after the first (a grant no earlier than the last one's)."""
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=0.0)
    slot = throttle.slot(KEY)
    gate = gate_of(slot)
    first, second = (Hold(slot, clock.now, clock.now + 60.0) for _ in range(2))
    second.wire_gap = 0.5
    assert gate.wire_wait(first) == 0.0
    assert gate.wire_wait(second) == pytest.approx(0.5)


SPARE = RateLimit(remaining=5, reset=1.0, limit=10)


@pytest.mark.parametrize(
    ("granted", "due", "gap", "wired", "wait", "other"),
    [
        # Due at 1001 (its grant's gap of 1 s), on the wire at 1001.1: the next gap
        # counts from 1001, where it was due.
        (1001.0, 1001.0, 1.0, 1001.1, 0.9, None),
        # Its gap on the wire (0.5 s) ends before its grant's due time: it was due
        # at 1001 all the same, not at 1000.5.
        (1001.0, 1001.0, 0.5, 1001.1, 0.9, None),
        # Granted at 1000.5, due on the wire at 1001 (its 1 s gap after the send
        # at 1000): due at 1001, the later of the two.
        (1000.5, 1000.5, 1.0, 1001.1, 0.9, None),
        # A grant made early (the lead) was due when it was made, no later; one
        # with no due time (no gap begun) too.
        (1000.98, 1001.0, 0.5, 1001.1, 0.88, None),
        (1000.98, -math.inf, 0.5, 1001.1, 0.88, None),
        # Another grant (at 1000.9) came after its own (at 1000.5): it was due at
        # its own grant, not the other's; half its gap back at most (1000.85).
        (1000.5, 1000.5, 0.5, 1001.1, 0.75, 1000.9),
    ],
)
def test_while_the_host_shows_a_request_to_spare_the_next_gap_counts_from_when_the_last_was_due(
    granted: float, due: float, gap: float, wired: float, wait: float, other: float | None
) -> None:
    """A send let go late counts the next gap from when it was due (the later of
    its grant's due time and its turn on the wire), half a gap back at most."""
    clock = FakeClock(1000.0)
    throttle = Throttle(clock=clock, policy=FixedRatePolicy(1.0))
    slot = throttle.slot(KEY)
    gate = gate_of(slot)
    first = Hold(slot, clock.now, clock.now + 60.0)
    first.wire_gap = 1.0
    assert gate.wire_wait(first) == 0.0
    gate.answered(first.sent_at, 0.05, clock.now + 0.05, SPARE)
    clock.now = granted
    gate.granted(granted, due)
    late = Hold(slot, granted, granted + 60.0)
    late.wire_gap = gap
    if other is not None:
        gate.granted(other, other)
    clock.now = wired
    assert gate.wire_wait(late) == 0.0
    gate.answered(late.sent_at, 0.05, clock.now + 0.05, SPARE)
    clock.now = wired + 0.05
    after = Hold(slot, clock.now, clock.now + 60.0)
    after.wire_gap = 1.0
    assert gate.wire_wait(after) == pytest.approx(wait - 0.05, rel=0, abs=1e-9)


def test_a_min_delay_under_a_second_makes_the_pace_strict() -> None:
    """Any ``min_delay`` above 0 is a pace the host holds arrivals to: the first
    answer makes the arrival guard, whatever the policy."""
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=AutoThrottlePolicy(), min_delay=0.5)
    gate = gate_of(throttle.slot(KEY))
    gate.answered(None, 0.1, clock.now)
    assert gate.arrivals is not None


def test_an_answer_to_a_request_not_the_last_on_the_wire_moves_no_arrival() -> None:
    """Only the last request on the wire says when the next may arrive: an answer
    to an earlier one is counted for its latency alone."""
    clock = FakeClock()
    throttle, hold = wired(clock)
    slot = throttle.slot(KEY)
    gate = gate_of(slot)
    gate.answered(hold.sent_at, 0.05, clock.now + 0.05)
    assert gate.arrivals is not None
    latest = gate.arrivals.latest
    earlier, last = Hold(slot, 1001.0, 1061.0), Hold(slot, 1002.0, 1062.0)
    for each in (earlier, last):
        clock.now = each.sent_at
        assert gate.wire_wait(each) == 0.0
    gate.answered(earlier.sent_at, 0.5, clock.now + 0.5)
    assert gate.arrivals.latest == latest


@pytest.mark.parametrize("until", ["sustained_until", "budget_until"])
def test_a_stated_pace_is_strict_until_the_very_moment_it_ends(until: str) -> None:
    """A pace or budget the host stated makes the slot's pace strict while it is
    in force: not at the moment it ends (as a pause ends at its end)."""
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=AutoThrottlePolicy())
    slot = throttle.slot(KEY)
    gate = gate_of(slot)
    setattr(record_of(slot).limits, until, clock.now)
    gate.answered(None, 0.1, clock.now)
    assert gate.arrivals is None
    setattr(record_of(slot).limits, until, clock.now + 1.0)
    gate.answered(None, 0.1, clock.now)
    assert gate.arrivals is not None

"""A strict pace kept as the host sees it: the arrival guard, and a refusal at the stated pace.

The rules are docs/scheduling.md, rule 10 (the wire, and the arrival guard of a
strict pace) and docs/recovery.md ("At the stated pace"). The guard is pure and
tested with plain numbers; the gate and the rules with a hand-set clock: a
lease's wire turn stands for the moment its request was written, the latency
given to ``observe`` for what the host's answer took.
"""

from __future__ import annotations

import logging
import math

import pytest

from autothrottle import (
    AdaptiveConcurrencyPolicy,
    AutoThrottlePolicy,
    FixedDelayPolicy,
    FixedRatePolicy,
    Throttle,
    ThrottleEvent,
)
from autothrottle._arrivals import (
    EARLY_ANSWERS,
    LATENCY_WINDOW,
    MARGIN_STEP,
    MAX_MARGIN_SHARE,
    ArrivalGuard,
)
from helpers import FakeClock, gate_of, record_of

KEY = "example.com"


def run_at_the_pace(clock: FakeClock, throttle: Throttle, n: int) -> float:
    """``n`` requests at the slot's pace, each on the wire at once and answered 200
    in 10 ms; the last send time."""
    sent = -math.inf
    for _ in range(n):
        clock.advance(max(0.0, gate_of(throttle.slot(KEY)).send_at(clock.now) - clock.now))
        lease = throttle.try_acquire(KEY)
        assert lease is not None and lease.wire_wait() == 0.0
        sent = lease.sent_at
        lease.observe(latency=0.010, status=200)
        lease.release()
    return sent


def refuse_next(clock: FakeClock, throttle: Throttle, headers: dict[str, str]) -> float:
    clock.advance(max(0.0, gate_of(throttle.slot(KEY)).send_at(clock.now) - clock.now))
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    lease.observe(latency=0.001, status=429, headers=headers)
    lease.release()
    return lease.sent_at


# -- the guard, with plain numbers ---------------------------------------------------------


def test_the_first_answer_counts_its_whole_latency() -> None:
    guard = ArrivalGuard()
    guard.answered(0.030, wired_at=10.0)
    # Nothing to compare with: all of it may have passed before the host stamped it.
    assert guard.latest == pytest.approx(10.030)
    assert guard.least_latency() == pytest.approx(0.030)


def test_the_first_answers_count_their_whole_latency_then_their_excess() -> None:
    # A crawl that starts many hosts at once answers its first rounds slowly:
    # 30 ms, then 20 ms, where the path's own is 10 ms. An excess over the
    # least of those would miss by 10-20 ms what the host saw.
    guard = ArrivalGuard()
    assert EARLY_ANSWERS == 4
    guard.answered(0.030, wired_at=0.0)
    guard.answered(0.020, wired_at=0.5)
    assert guard.latest == pytest.approx(0.520)  # all 20 ms, not 20 - 30
    guard.answered(0.010, wired_at=1.0)
    guard.answered(0.010, wired_at=1.5)
    assert guard.latest == pytest.approx(1.510)  # the fourth: still all of it
    guard.answered(0.010, wired_at=2.0)  # the fifth: the excess over the least, 0
    assert guard.latest == pytest.approx(1.510)
    guard.answered(0.025, wired_at=2.5)  # 15 ms over the least of 10
    assert guard.latest == pytest.approx(2.515)


def warm(guard: ArrivalGuard, latency: float) -> None:
    """The first answers, which count all of their latency, all at ``latency``."""
    for _ in range(EARLY_ANSWERS):
        guard.answered(latency, wired_at=None)


def test_an_answer_slower_than_the_least_moves_the_arrival_by_the_excess() -> None:
    guard = ArrivalGuard()
    warm(guard, 0.010)
    guard.answered(0.010, wired_at=0.0)
    guard.answered(0.010, wired_at=0.5)
    assert guard.latest == -math.inf  # no excess: nothing moved
    guard.answered(0.090, wired_at=1.0)  # held up 80 ms somewhere
    assert guard.latest == pytest.approx(1.080)
    assert guard.since(1.0, gap=0.5, lateness=0.0) == pytest.approx(1.080)


def test_an_answer_faster_than_any_lately_counts_as_the_path_speeding_up() -> None:
    guard = ArrivalGuard()
    warm(guard, 0.060)
    guard.answered(0.060, wired_at=0.0)
    guard.answered(0.035, wired_at=0.5)  # 25 ms faster: the next may gain as much
    assert guard.latest == pytest.approx(0.525)
    assert guard.least_latency() == pytest.approx(0.035)


def test_an_answer_that_came_after_the_next_request_went_teaches_no_arrival() -> None:
    guard = ArrivalGuard()
    guard.answered(0.010, wired_at=0.0)
    guard.answered(0.800, wired_at=None)
    assert guard.latest == pytest.approx(0.010)


def test_the_least_latency_follows_a_path_that_got_slower() -> None:
    guard = ArrivalGuard()
    guard.answered(0.005, wired_at=None)
    for _ in range(2 * LATENCY_WINDOW):
        guard.answered(0.050, wired_at=None)
    assert guard.least_latency() == pytest.approx(0.050)


def test_a_loaded_client_reading_every_answer_late_is_not_a_held_up_arrival() -> None:
    # A loaded client reads every answer a few ms late: 14 ms where the path
    # once answered in 10. The excess over a least of long ago would push
    # every gap back 4 ms; within 8 to 16 answers the least is the path's own.
    guard = ArrivalGuard()
    warm(guard, 0.010)
    assert LATENCY_WINDOW == 8
    for _ in range(2 * LATENCY_WINDOW - EARLY_ANSWERS):
        guard.answered(0.014, wired_at=None)
    guard.answered(0.014, wired_at=20.0)
    assert guard.least_latency() == pytest.approx(0.014)
    assert guard.since(20.0, gap=0.5, lateness=0.0) == pytest.approx(20.0)


def test_the_gap_after_a_refusal_at_the_pace_keeps_the_makeup_once() -> None:
    # The refused request arrived early by an amount nobody saw: the next gap
    # is long by the margin's most, so two gaps in a row at the host never sum
    # to less than two gaps (no 3 requests in a second at 2/s).
    guard = ArrivalGuard()
    warm(guard, 0.010)
    gap = 0.5
    assert guard.widen(gap, now=10.02)  # the answer to a request sent at 10.0
    most = MAX_MARGIN_SHARE * gap
    assert guard.since(10.0, gap, 0.0) == pytest.approx(10.0 + MARGIN_STEP + most)
    # A gap counted from a send made after the refusal came keeps the margin only.
    assert guard.since(10.5 + MARGIN_STEP + most, gap, 0.0) == pytest.approx(
        10.5 + 2 * MARGIN_STEP + most
    )


def test_the_margin_is_the_averaged_lateness_within_its_share_of_the_gap() -> None:
    guard = ArrivalGuard()
    assert guard.margin(0.5, lateness=0.0) == 0.0  # nothing observed: no margin at all
    assert guard.margin(0.5, lateness=0.003) == pytest.approx(0.003)
    assert guard.since(1.0, gap=0.5, lateness=0.003) == pytest.approx(1.003)
    assert guard.margin(0.5, lateness=1.0) == pytest.approx(MAX_MARGIN_SHARE * 0.5)


def test_the_gates_lateness_is_the_plain_mean_of_the_first_then_about_the_last_10() -> None:
    _, throttle = strict()
    gate = gate_of(throttle.slot(KEY))
    gate.late(0.002)
    gate.late(0.004)
    gate.late(-0.001)  # a timer that fired early counts as on time
    assert gate.lateness == pytest.approx(0.002)
    for _ in range(100):
        gate.late(0.010)
    gate.late(0.0)
    assert gate.lateness == pytest.approx(0.009, abs=1e-6)  # the last weighs a tenth


def test_a_busy_clients_lateness_widens_no_gap_past_what_the_quick_answers_vary() -> None:
    # Timers 8 ms late on a busy client; the host's quick answers lately vary
    # by 3 ms over their least: the margin is 3 ms, not 8 on every gap.
    guard = ArrivalGuard()
    for i in range(2 * LATENCY_WINDOW):
        guard.answered(0.010 + 0.001 * (i % 8), wired_at=None)  # 10 ... 17 ms
    assert guard.spread == pytest.approx(0.002)
    assert guard.margin(0.5, lateness=0.008) == pytest.approx(0.002)
    assert guard.since(1.0, gap=0.5, lateness=0.008) == pytest.approx(1.002)


def test_the_margin_is_the_lateness_where_the_quick_answers_vary_more() -> None:
    guard = ArrivalGuard()
    for i in range(2 * LATENCY_WINDOW):
        guard.answered(0.010 + 0.004 * (i % 2), wired_at=None)
    assert guard.margin(0.5, lateness=0.0005) == pytest.approx(0.0005)
    # ... and at least MARGIN_STEP of it where they vary less than that.
    quiet = ArrivalGuard()
    for _ in range(2 * LATENCY_WINDOW):
        quiet.answered(0.010, wired_at=None)
    assert quiet.margin(0.5, lateness=0.003) == pytest.approx(MARGIN_STEP)


def test_a_refusal_at_the_stated_pace_doubles_the_margin_up_to_its_share() -> None:
    guard = ArrivalGuard()
    gap = 0.5
    assert guard.widen(gap, now=1.0)
    assert guard.margin(gap, lateness=0.0) == pytest.approx(MARGIN_STEP)
    margins = [MARGIN_STEP]
    while guard.widen(gap, now=1.0):
        margins.append(guard.margin(gap, lateness=0.0))
    assert margins == pytest.approx([0.001, 0.002, 0.004, 0.008, 0.010])
    assert not guard.widen(gap, now=1.0)  # at its most: the next refusal is no jitter


def test_a_busy_clients_lateness_leaves_the_host_its_refusal_steps() -> None:
    # Timers 30 ms late fill the margin before any refusal; the host's refusals
    # at the pace are still jitter, each a step, as many as on an idle machine.
    guard = ArrivalGuard()
    gap = 0.5
    assert guard.margin(gap, lateness=0.030) == pytest.approx(MAX_MARGIN_SHARE * gap)
    steps = 0
    while guard.widen(gap, now=1.0):
        steps += 1
    assert steps == 5  # 1, 2, 4, 8, 10 ms
    assert guard.margin(gap, lateness=0.030) == pytest.approx(MAX_MARGIN_SHARE * gap)


def test_a_fast_answer_is_the_least_for_8_to_16_answers() -> None:
    # The least latency is the least of the last 8 to 16 answers: one fast answer
    # stands through the 15 after it, and the 16th after it forgets it.
    guard = ArrivalGuard()
    guard.answered(0.005, wired_at=None)
    for _ in range(2 * LATENCY_WINDOW - 2):
        guard.answered(0.010, wired_at=None)
    assert guard.least_latency() == pytest.approx(0.005)
    guard.answered(0.010, wired_at=None)
    assert guard.least_latency() == pytest.approx(0.010)


def test_the_spread_is_the_first_quarter_of_the_last_16_over_their_least() -> None:
    guard = ArrivalGuard()
    for _ in range(LATENCY_WINDOW):
        guard.answered(0.010, wired_at=None)
    # Too few answers to say how the quick ones vary: the lateness stands alone.
    assert guard.margin(1.0, lateness=0.005) == pytest.approx(0.005)
    for _ in range(LATENCY_WINDOW):
        guard.answered(0.005, wired_at=None)
    # The last 16: one at 8 ms, three at 10, twelve at 12. Their least is 8 ms
    # and the first quarter's edge (the 5th) 12 ms: a spread of 4 ms. The 5 ms
    # answers before them are no longer among the last 16.
    latencies = [0.008] + [0.010] * 3 + [0.012] * 12
    for latency in latencies:
        guard.answered(latency, wired_at=None)
    assert guard.spread == pytest.approx(0.004)
    assert guard.margin(1.0, lateness=0.010) == pytest.approx(0.004)


def test_an_answer_that_pushes_the_arrival_later_by_less_than_its_latency_counts() -> None:
    guard = ArrivalGuard()
    guard.answered(0.030, wired_at=10.0)  # arrived by 10.03
    guard.answered(0.030, wired_at=10.04)  # sent 10 ms after that: by 10.07
    assert guard.latest == pytest.approx(10.07)
    assert guard.since(10.04, gap=0.5, lateness=0.0) == pytest.approx(10.07)


# -- the gate: a strict pace counts from the latest arrival ---------------------------------


def strict(**kwargs: object) -> tuple[FakeClock, Throttle]:
    clock = FakeClock()
    return clock, Throttle(clock=clock, policy=FixedRatePolicy(2.0), **kwargs)  # type: ignore[arg-type]


def test_a_held_up_request_pushes_the_next_one_back_by_what_it_lost() -> None:
    clock, throttle = strict()
    slot = throttle.slot(KEY)
    run_at_the_pace(clock, throttle, EARLY_ANSWERS + 1)  # the least latency: 10 ms
    clock.advance(max(0.0, gate_of(slot).send_at(clock.now) - clock.now))
    lease = throttle.try_acquire(KEY)
    assert lease is not None and lease.wire_wait() == 0.0
    sent = clock.now
    lease.observe(latency=0.070, status=200)  # 60 ms more than the least
    lease.release()
    clock.advance(0.5)
    assert throttle.try_acquire(KEY) is None
    assert gate_of(slot).send_at(clock.now) == pytest.approx(sent + 0.5 + 0.060)
    clock.advance(0.060)
    later = throttle.try_acquire(KEY)
    assert later is not None and later.wire_wait() == 0.0  # the wire keeps it too


def test_a_latency_timed_from_after_the_wire_turn_counts_what_it_missed() -> None:
    # Scrapy's download_latency starts at its download handler: here 60 ms after
    # the wire turn (a busy loop), and the answer took the least latency from
    # there. The request reached the host that much late, and the next gap
    # counts from there, as if the latency had been timed from the turn.
    clock, throttle = strict()
    slot = throttle.slot(KEY)
    run_at_the_pace(clock, throttle, EARLY_ANSWERS + 1)  # the least latency: 10 ms
    clock.advance(max(0.0, gate_of(slot).send_at(clock.now) - clock.now))
    lease = throttle.try_acquire(KEY)
    assert lease is not None and lease.wire_wait() == 0.0
    sent = clock.now
    lease.started_late(0.060)
    lease.observe(latency=0.010, status=200)
    lease.release()
    assert gate_of(slot).send_at(clock.now) == pytest.approx(sent + 0.5 + 0.060)
    # Only for the request that was last on the wire: the next one starts anew.
    assert run_at_the_pace(clock, throttle, 1) == pytest.approx(sent + 0.5 + 0.060)
    assert gate_of(slot).send_at(clock.now) == pytest.approx(sent + 1.0 + 0.060)


def test_a_pace_nobody_stated_is_not_pushed_back() -> None:
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=AutoThrottlePolicy(), start_delay=0.5, max_delay=0.5)
    for latency in (0.010, 0.300):
        lease = throttle.try_acquire(KEY)
        assert lease is not None and lease.wire_wait() == 0.0
        lease.observe(latency=latency, status=200)
        lease.release()
        clock.advance(0.5)
    assert throttle.try_acquire(KEY) is not None


def test_a_grant_let_go_late_widens_every_gap_by_its_lateness() -> None:
    clock, throttle = strict()
    slot = throttle.slot(KEY)
    gate = gate_of(slot)
    first = throttle.try_acquire(KEY)
    assert first is not None
    first.observe(latency=0.010, status=200)
    first.release()
    ticket = gate.enqueue()
    make = throttle._turns.maker(throttle._live(KEY), adjust=True)
    assert gate.try_acquire(ticket, make) == pytest.approx(0.5)
    clock.advance(0.5 + 0.004)  # the timer fired 4 ms late
    assert gate.try_acquire(ticket, make) == 0.0
    assert ticket.hold is not None
    granted = clock.now
    ticket.hold.release()  # type: ignore[attr-defined]
    assert gate.send_at(clock.now) == pytest.approx(granted + 0.5 + 0.004)


# -- the rules: a refusal at the stated pace -------------------------------------------------


def test_a_refusal_at_the_stated_pace_costs_a_margin_step_not_a_retry_after_hole() -> None:
    clock, throttle = strict()
    slot = throttle.slot(KEY)
    run_at_the_pace(clock, throttle, 8)
    refused_at = refuse_next(clock, throttle, {"Retry-After": "1"})
    snap = slot.snapshot()
    assert slot.delay == 0.5  # no backoff: the pace is the one stated
    assert snap.backoffs == 1 and snap.pauses == 1
    # The host's token is due within one gap of the refused request: the
    # whole-second Retry-After is its rounding, and no longer hole is kept.
    assert slot.pause_until == pytest.approx(refused_at + 0.5)
    # A step of the margin, and the makeup once: the refused gap was short.
    makeup = MAX_MARGIN_SHARE * 0.5
    assert gate_of(slot).send_at(clock.now) == pytest.approx(
        refused_at + 0.5 + MARGIN_STEP + makeup
    )


def test_a_margin_step_is_counted_told_and_logged_as_a_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # docs/recovery.md, "At the stated pace": the refusal is counted as a backoff
    # (backoffs, backoff_reasons), told to the listeners, and a debug line says
    # reason=arrival margin.
    clock, throttle = strict(debug=True)
    slot = throttle.slot(KEY)
    run_at_the_pace(clock, throttle, 8)
    events: list[ThrottleEvent] = []
    throttle.listen(events.append)
    with caplog.at_level(logging.DEBUG, logger="autothrottle"):
        refuse_next(clock, throttle, {"Retry-After": "1"})
    assert slot.delay == 0.5  # a step, not a backoff
    snap = slot.snapshot()
    assert snap.backoffs == 1
    assert snap.last_backoff_reason == "status 429"
    assert record_of(slot).backoff_reasons == {"status 429": 1}
    assert ThrottleEvent("backoff", KEY, reason="status 429") in events
    lines = [r.getMessage() for r in caplog.records if "arrival margin" in r.getMessage()]
    assert len(lines) == 1
    assert f"slot={KEY}" in lines[0] and "delay=500ms" in lines[0] and "status=429" in lines[0]
    # The record's fields as docs/guide.md lists them ("Reading the debug output"): the
    # refused request still in flight as its answer is applied, its latency, the reason.
    (record,) = [r for r in caplog.records if getattr(r, "reason", None) == "arrival margin"]
    assert lines[0].endswith(" reason=arrival margin")
    assert (record.in_flight, record.latency, record.status) == (1, 0.001, 429)  # type: ignore[attr-defined]


def test_two_gaps_around_a_refused_request_sum_to_two_gaps_and_more() -> None:
    # On the wire: sent at the pace, refused (it arrived a few ms early), and
    # the next one; at 2/s a host that counts a window of 1 s must not see
    # three requests in it, refused or not.
    clock, throttle = strict()
    slot = throttle.slot(KEY)
    before = run_at_the_pace(clock, throttle, 8)
    clock.advance(max(0.0, gate_of(slot).send_at(clock.now) - clock.now))
    refused = throttle.try_acquire(KEY)
    assert refused is not None and refused.wire_wait() == 0.0
    clock.advance(0.002)
    refused.observe(latency=0.002, status=429, headers={"Retry-After": "1"})
    refused.release()
    assert slot.delay == 0.5  # a step, not a backoff
    nxt = run_at_the_pace(clock, throttle, 1)
    assert nxt - before >= 1.0 + MAX_MARGIN_SHARE * 0.5
    after = run_at_the_pace(clock, throttle, 1)
    assert after - nxt == pytest.approx(0.5 + MARGIN_STEP)  # the makeup was once


def test_a_refusal_at_the_stated_pace_early_on_costs_a_margin_step_too() -> None:
    # Two requests let through at the pace, the third arrives 2 ms early: the
    # host kept the pace for one gap, and the second gap is the refused one's.
    clock, throttle = strict()
    slot = throttle.slot(KEY)
    run_at_the_pace(clock, throttle, 2)
    refused_at = refuse_next(clock, throttle, {"Retry-After": "1"})
    assert slot.delay == 0.5
    assert slot.pause_until == pytest.approx(refused_at + 0.5)


def test_refusals_past_the_largest_margin_are_real_ones() -> None:
    clock, throttle = strict()
    slot = throttle.slot(KEY)
    run_at_the_pace(clock, throttle, 8)
    for _ in range(5):  # 1, 2, 4, 8, 10 ms
        refuse_next(clock, throttle, {"Retry-After": "1"})
        assert slot.delay == 0.5
        run_at_the_pace(clock, throttle, 16)  # one refusal in 16 is still jitter
    refuse_next(clock, throttle, {"Retry-After": "1"})
    assert slot.delay == 1.0  # backed off as on any refusal


def test_refusals_with_nothing_let_through_between_are_real_ones() -> None:
    clock, throttle = strict()
    slot = throttle.slot(KEY)
    run_at_the_pace(clock, throttle, 8)
    refuse_next(clock, throttle, {"Retry-After": "1"})
    assert slot.delay == 0.5
    for _ in range(3):
        refuse_next(clock, throttle, {"Retry-After": "1"})
    assert slot.delay > 0.5


def test_a_long_retry_after_is_a_penalty_not_jitter() -> None:
    clock, throttle = strict()
    slot = throttle.slot(KEY)
    run_at_the_pace(clock, throttle, 8)
    refused_at = refuse_next(clock, throttle, {"Retry-After": "30"})
    assert slot.delay == 1.0
    assert slot.pause_until >= refused_at + 30.0


def test_a_refusal_before_anything_was_let_through_is_a_real_one() -> None:
    clock, throttle = strict()
    refuse_next(clock, throttle, {"Retry-After": "1"})
    assert throttle.slot(KEY).delay == 1.0


def test_a_pace_the_host_never_kept_refused_is_a_real_refusal() -> None:
    # A fixed delay of 50 ms against a host of 1/s: one success, then refused.
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=FixedDelayPolicy(0.05))
    run_at_the_pace(clock, throttle, 1)
    refused_at = refuse_next(clock, throttle, {"Retry-After": "1"})
    assert throttle.slot(KEY).delay == 0.1
    assert throttle.slot(KEY).pause_until >= refused_at + 1.0


def test_a_learned_pace_refused_backs_off() -> None:
    # The adaptive policy's pace is its own estimate: a refusal says it is too fast.
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=AdaptiveConcurrencyPolicy(), start_delay=0.5)
    run_at_the_pace(clock, throttle, 4)
    before = throttle.slot(KEY).delay
    refuse_next(clock, throttle, {"Retry-After": "1"})
    assert throttle.slot(KEY).delay > before


def test_a_refusal_at_a_pace_the_headers_stated_costs_a_margin_step() -> None:
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=AutoThrottlePolicy(), start_delay=0.0)
    slot = throttle.slot(KEY)
    stated = {"RateLimit-Policy": '"default";q=5;w=1', "RateLimit": '"default";r=5;t=1'}
    for _ in range(8):
        clock.advance(max(0.0, gate_of(slot).send_at(clock.now) - clock.now))
        lease = throttle.try_acquire(KEY)
        assert lease is not None
        lease.observe(latency=0.010, status=200, headers=stated)
        lease.release()
    delay = slot.delay
    refused = {**stated, "RateLimit": '"default";r=0;t=1', "Retry-After": "1"}
    refused_at = refuse_next(clock, throttle, refused)
    assert slot.delay == delay
    assert slot.pause_until == pytest.approx(refused_at + 0.2)


def test_a_refusal_at_the_stated_pace_after_a_slow_start_costs_a_margin_step() -> None:
    # The headers state 10/s, but the host's first answers were slow (300 ms),
    # and Scrapy's rule holds the slot at 0.3 s until fast answers bring it
    # down over a few more. The successes of that start came at the slot's own
    # slower pace: they are no sign that the host did not keep the stated one,
    # which it did for the latest of them.
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=AutoThrottlePolicy(), start_delay=0.5)
    slot = throttle.slot(KEY)
    stated = {"RateLimit-Policy": '"default";q=10;w=1', "RateLimit": '"default";r=5;t=1'}
    sends: list[float] = []
    for latency in (0.3, 0.3, 0.3, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01):
        clock.advance(max(0.0, gate_of(slot).send_at(clock.now) - clock.now))
        lease = throttle.try_acquire(KEY)
        assert lease is not None
        sends.append(lease.sent_at)
        lease.observe(latency=latency, status=200, headers=stated)
        lease.release()
    assert sends[2] - sends[1] == pytest.approx(0.3)  # a slow start
    assert sends[-1] - sends[-2] == pytest.approx(0.1, abs=0.005)  # then the stated pace
    delay = slot.delay
    refused = {**stated, "RateLimit": '"default";r=0;t=1', "Retry-After": "1"}
    refused_at = refuse_next(clock, throttle, refused)
    assert slot.delay == delay  # no backoff
    assert slot.pause_until <= refused_at + 0.1 + 1e-9  # one gap, not the whole second


def test_a_refusal_at_the_pace_a_spent_budget_states_costs_a_margin_step() -> None:
    # A token bucket paced at exactly its rate answers every request with r=0
    # (and its policy, 10 a second): the pace is stated on every answer, and
    # a refusal at it is jitter, not a reason to back off and wait a second.
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=AutoThrottlePolicy(), start_delay=0.5)
    slot = throttle.slot(KEY)
    spent = {"RateLimit-Policy": '"default";q=10;w=1', "RateLimit": '"default";r=0;t=1'}
    for _ in range(30):  # 3 s, past the window the first answer stated its pace for
        clock.advance(max(0.0, gate_of(slot).send_at(clock.now) - clock.now))
        lease = throttle.try_acquire(KEY)
        assert lease is not None
        clock.advance(0.012)
        lease.observe(latency=0.012, status=200, headers=spent)
        lease.release()
    delay = slot.delay
    refused_at = refuse_next(clock, throttle, {**spent, "Retry-After": "1"})
    assert slot.delay == delay  # no backoff
    assert slot.pause_until <= refused_at + 0.1 + 1e-9  # one gap, not the whole second


def test_a_refusal_at_a_stated_pace_widens_the_gap_under_a_policy_with_a_shorter_delay() -> None:
    # The adaptive policy's own delay follows the latency (a few ms here), and
    # the host's headers state 10/s, which the gate keeps apart from it: the
    # margin and the makeup are shares of the 100-ms gap the sends keep, not
    # of that delay, or a refusal's step would widen nothing.
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=AdaptiveConcurrencyPolicy(), start_delay=0.5)
    slot = throttle.slot(KEY)
    stated = {"RateLimit-Policy": '"default";q=10;w=1', "RateLimit": '"default";r=10;t=1'}
    for _ in range(30):
        clock.advance(max(0.0, gate_of(slot).send_at(clock.now) - clock.now))
        lease = throttle.try_acquire(KEY)
        assert lease is not None and lease.wire_wait() == 0.0
        lease.observe(latency=0.012, status=200, headers=stated)
        lease.release()
    assert slot.delay < 0.02  # the policy's own delay, a fraction of the stated gap
    refused = {**stated, "RateLimit": '"default";r=0;t=1', "Retry-After": "1"}
    refused_at = refuse_next(clock, throttle, refused)
    assert slot.snapshot().backoffs == 1 and slot.delay < 0.1  # a step, not a backoff
    makeup = MAX_MARGIN_SHARE * 0.1
    assert gate_of(slot).send_at(clock.now) == pytest.approx(
        refused_at + 0.1 + MARGIN_STEP + makeup, abs=1e-6
    )


@pytest.mark.parametrize(
    ("budget", "jitter"),
    [
        # An exhausted budget's reset past the gap rounded up (1 s): a penalty.
        ('"default";r=0;t=30', False),
        # Within it: the rounding of a token due within the gap.
        ('"default";r=0;t=1', True),
        # A budget not exhausted asks for no pause, whatever its reset.
        ('"default";r=1;t=30', True),
    ],
)
def test_a_refusal_at_the_stated_pace_is_a_penalty_when_a_spent_budget_outlasts_the_gap(
    budget: str, jitter: bool
) -> None:
    # docs/recovery.md, "At the stated pace": no pause the refusal asks for (a
    # Retry-After or an exhausted budget's reset) is longer than the gap rounded
    # up to the whole second.
    clock, throttle = strict()
    slot = throttle.slot(KEY)
    run_at_the_pace(clock, throttle, 8)
    refuse_next(clock, throttle, {"RateLimit": budget})
    assert (slot.delay == 0.5) is jitter

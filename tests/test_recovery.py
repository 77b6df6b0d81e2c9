"""The refusal memory through its own interface, with plain numbers (docs/recovery.md).

Only :class:`Recovery`, its :class:`Refusal` record and plain numbers: no
throttle, slot or clock.
"""

from __future__ import annotations

import math
from typing import Any, cast

import pytest

from autothrottle._recovery import Recovery, Refusal, first_of_burst, refused_pace


def succeed(recovery: Recovery, state: Refusal, times: list[float]) -> None:
    for t in times:
        recovery.count_success(state, t)


def test_the_success_rate_needs_three_successes_and_counts_one_less() -> None:
    recovery, state = Recovery(), Refusal()
    succeed(recovery, state, [10.0, 10.5])
    assert recovery.success_rate(state, 11.0) is None
    recovery.count_success(state, 11.0)
    # 3 successes from 10.0 to 11.0: the first came for free, two in one second
    assert recovery.success_rate(state, 11.0) == pytest.approx(2.0)


def test_a_refusal_close_above_what_got_through_takes_that_as_the_limit() -> None:
    recovery, state = Recovery(), Refusal()
    succeed(recovery, state, [i / 10 for i in range(51)])  # 10/s for 5 s
    recovery.refused(state, pace=1 / 11, now=5.0)
    assert 1 / state.refused_gap == pytest.approx(10.0)
    assert state.recover_in == recovery.time


def test_a_first_refusal_far_above_takes_what_got_through() -> None:
    # A burst of 2 let a client run at 4.4/s for a second against a 2/s host.
    recovery, state = Recovery(), Refusal()
    succeed(recovery, state, [0.05, 0.5, 0.85, 1.13])
    recovery.refused(state, pace=0.228, now=1.35)
    # allowed (4-1)/1.3 = 2.3/s; the geometric mean with 4.4/s (3.2/s) would be
    # refused again once the burst refilled
    assert 1 / state.refused_gap == pytest.approx(3 / 1.3)
    # What got through is a rate the host kept: probed past in the whole time.
    assert state.recover_in == pytest.approx(recovery.time)


def test_a_first_refusal_at_four_times_what_got_through_takes_what_got_through() -> None:
    # A client whose sends fell late ramped on to 8.5/s before a 2/s host's
    # burst ran out; halving the refused rate (4.2/s) would be refused again.
    recovery, state = Recovery(), Refusal()
    succeed(recovery, state, [0.0, 1.0, 1.6, 2.0, 2.3, 2.55, 2.97])
    recovery.refused(state, pace=0.117, now=2.97)
    assert 1 / state.refused_gap == pytest.approx(6 / 2.97)
    assert state.recover_in == pytest.approx(recovery.time)


def test_without_a_ramp_a_first_refusal_far_above_is_capped_at_the_rate_over_the_factor() -> None:
    # Scrapy's rule halves its delay with each fast response: the successes
    # measured mostly its start. Bracketed, never past 4.4 / 2 = 2.2/s.
    recovery, state = Recovery(), Refusal()
    succeed(recovery, state, [0.0, 0.667, 1.333, 2.0])
    recovery.refused(state, pace=1 / 4.4, now=2.0, ramped=False, factor=2.0)
    # allowed 1.5/s, geometric mean with 4.4/s is 2.57/s: capped to 2.2/s
    assert 1 / state.refused_gap == pytest.approx(2.2)
    # Halved from the refused rate, the guess may lie far below: probed past sooner.
    assert state.recover_in == pytest.approx(0.7 * recovery.time)


def test_without_a_ramp_a_first_refusal_very_far_above_takes_the_geometric_mean() -> None:
    # 5/s got through a 10/s bucket's slow start; refused at 66/s.
    recovery, state = Recovery(), Refusal()
    succeed(recovery, state, [0.0, 0.5, 0.75, 0.875, 0.94, 0.98])
    recovery.refused(state, pace=0.015, now=1.0, ramped=False, factor=2.0)
    assert 1 / state.refused_gap == pytest.approx(math.sqrt(5.0 / 0.015))


def test_only_the_latest_successes_measure_the_rate() -> None:
    # A slot that ramped from 1/s to 10/s: the rate it was let through lately is
    # 10/s, not the mean of its ramp.
    recovery, state = Recovery(), Refusal()
    times = [float(t) for t in range(5)] + [5.0 + i / 10 for i in range(30)]
    succeed(recovery, state, times)
    rate = recovery.success_rate(state, times[-1])
    assert rate == pytest.approx(10.0)
    assert state.ok_count <= 16


def test_a_later_refusal_far_above_takes_the_geometric_mean() -> None:
    recovery, state = Recovery(), Refusal(refused_gap=0.2)
    succeed(recovery, state, [i / 10 for i in range(51)])
    recovery.refused(state, pace=1 / 40, now=5.0)
    assert 1 / state.refused_gap == pytest.approx(20.0)  # sqrt(10 * 40)


def test_a_later_refusal_measures_the_whole_span_since_the_last() -> None:
    # A 10/s bucket with a burst of 2, after a refusal: the floor let the slot
    # run at 9.6/s for 10 s, then came back past the limit at 10.5/s and spent
    # the burst. Every success since the last refusal is the lower bound, the
    # refused pace the upper one: the limit is taken between them.
    recovery, state = Recovery(), Refusal(refused_gap=0.1, backoff_at=-1.0)
    times = [i / 9.6 for i in range(97)]
    times += [times[-1] + (i + 1) / 10.5 for i in range(15)]
    succeed(recovery, state, times)
    now = times[-1] + 1 / 10.5
    recovery.refused(state, pace=1 / 10.5, now=now)
    span = 111 / (now - times[0])  # every success since the last refusal, one less
    assert state.allowed == pytest.approx(span)
    assert 1 / state.refused_gap == pytest.approx(math.sqrt(span * 10.5))
    assert 9.6 < 1 / state.refused_gap < 10.2


def test_a_measured_rate_replaces_the_last_one() -> None:
    # The successes right after a pause spend a refilled burst: 17.6/s read at
    # a refusal 0.17 s in. Ten seconds on, at 9.8/s, that reading bounds
    # nothing: kept, it would make the refused pace (10.5/s) the limit.
    recovery, state = Recovery(), Refusal(refused_gap=0.1, backoff_at=-1.0)
    succeed(recovery, state, [0.0, 0.05, 0.1, 0.15])
    recovery.refused(state, pace=1 / 20, now=0.17)
    assert state.allowed == pytest.approx(3 / 0.17)
    times = [1.0 + i / 9.8 for i in range(99)]
    succeed(recovery, state, times)
    now = times[-1] + 1 / 10.5
    recovery.refused(state, pace=1 / 10.5, now=now)
    assert state.allowed == pytest.approx(98 / (now - 1.0))
    assert 1 / state.refused_gap == pytest.approx(math.sqrt(state.allowed * 10.5))
    assert 1 / state.refused_gap < 10.3


def test_right_after_a_pause_the_last_measured_rate_stands_in() -> None:
    # Two successes since the last refusal measure nothing: the rate the one
    # before measured is the lower bound still.
    recovery, state = Recovery(), Refusal(refused_gap=0.1, backoff_at=-1.0)
    succeed(recovery, state, [i / 10 for i in range(51)])
    recovery.refused(state, pace=1 / 10.5, now=5.1)
    succeed(recovery, state, [6.2, 6.3])
    recovery.refused(state, pace=1 / 12.0, now=6.35)
    assert state.allowed == pytest.approx(50 / 5.1)
    assert 1 / state.refused_gap == pytest.approx(math.sqrt(50 / 5.1 * 12.0))


def test_a_refusal_with_nothing_counted_remembers_the_refused_pace() -> None:
    recovery, state = Recovery(), Refusal()
    recovery.refused(state, pace=0.3, now=1.0)
    assert state.refused_gap == 0.3
    assert state.ok_count == 0


def test_a_refusal_starts_a_new_count() -> None:
    recovery, state = Recovery(), Refusal()
    succeed(recovery, state, [0.0, 1.0, 2.0, 3.0])
    recovery.refused(state, pace=0.5, now=3.5)
    assert state.ok_count == 0
    assert recovery.success_rate(state, 4.0) is None


@pytest.mark.parametrize(
    ("elapsed", "rate"),
    [
        (0.0, 0.93),  # at once: the margin of the refused rate
        (15.0, 1.0),  # after the recovery time: the refused rate again
        (22.5, 1.125),  # then faster: + (0.5) ** 3
        (30.0, 2.0),  # doubled by twice the recovery time
    ],
)
def test_the_floor_follows_a_cubic_around_the_refused_rate(elapsed: float, rate: float) -> None:
    recovery = Recovery(margin=0.93, time=15.0)
    state = Refusal(refused_gap=1.0, backoff_at=100.0)
    assert 1 / recovery.floor(state, 100.0 + elapsed) == pytest.approx(rate)


def test_no_refusal_no_floor() -> None:
    assert Recovery().floor(Refusal(), 1e6) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"margin": 0.0}, "recovery_margin"),
        ({"margin": 1.5}, "recovery_margin"),
        ({"margin": math.nan}, "recovery_margin"),
        ({"time": 0.0}, "recovery_time"),
        ({"time": -1.0}, "recovery_time"),
    ],
)
def test_bad_knobs_are_refused_naming_them(kwargs: dict[str, float], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Recovery(**kwargs)


@pytest.mark.parametrize(
    ("sent_at", "backoff_at", "counts"),
    [
        (None, 5.0, True),  # the send time is unknown: it counts
        (1.0, -math.inf, True),  # never backed off
        (5.0, 5.0, True),  # sent at the backoff itself: at the new pace
        (6.0, 5.0, True),
        (4.999, 5.0, False),  # sent before the last backoff: the lag of the old pace
    ],
)
def test_only_the_first_signal_of_a_burst_counts(
    sent_at: float | None, backoff_at: float, counts: bool
) -> None:
    assert first_of_burst(sent_at, backoff_at) is counts


@pytest.mark.parametrize(
    ("delay", "latency", "in_flight", "pace"),
    [
        (0.5, 0.2, 4, 0.5),  # the delay held the slot back
        (0.01, 0.4, 4, 0.1),  # the cap did: 4 in flight at 0.4 s is a send every 0.1 s
        (0.01, None, 4, 0.01),  # no latency yet
        (0.01, 0.4, 0, 0.01),  # nothing in flight
    ],
)
def test_the_refused_pace_is_the_delay_or_littles_law(
    delay: float, latency: float | None, in_flight: int, pace: float
) -> None:
    assert refused_pace(delay, latency, in_flight) == pytest.approx(pace)


@pytest.mark.parametrize(
    ("delay", "granted", "pace"),
    [
        (0.05, 0.1, 0.1),  # the gap begun at a delay since lowered: the one kept
        (0.1, 0.05, 0.1),  # a delay raised since: never below it
        (0.05, 0.0, 0.05),  # not known
    ],
)
def test_the_refused_pace_is_at_least_the_gap_the_grant_kept(
    delay: float, granted: float, pace: float
) -> None:
    assert refused_pace(delay, None, 0, granted) == pytest.approx(pace)


def test_the_floor_never_overflows_long_after_a_refusal() -> None:
    state = Refusal(refused_gap=1.0, recover_in=1e-6, backoff_at=0.0)
    assert Recovery().floor(state, 1e250) == pytest.approx(0.0)


def test_a_pause_longer_than_the_burst_took_is_the_buckets_gap() -> None:
    # A new host's burst of 2 in a second, then refused with "Retry-After: 19":
    # its next token is due more than 18 s away, so less than a token came back
    # over the burst; that token (the first success's) is due at the pause's
    # end: the gap is the span plus the pause, 20.1 s, far above the ramp's pace.
    recovery, state = Recovery(), Refusal()
    succeed(recovery, state, [0.0, 1.0])
    recovery.refused(state, pace=0.6, now=1.1, asked=19.0)
    assert state.refused_gap == pytest.approx(20.1)


@pytest.mark.parametrize(
    ("times", "asked", "gap"),
    [
        ([0.0, 1.0], 19.0, 20.1),  # a burst, then the pause: the span plus the pause
        ([], 5.0, 5.0),  # refused at once: the pause alone
        ([0.0, 1.0], 1.0, 0.0),  # a whole second: the rounding of any token due within it
        ([0.0, 0.5], 2.0, 0.0),  # not longer than the span by a second: says nothing
        ([0.5], 2.0, 2.6),  # longer by a second: one token a pause left, then the pause
        ([0.0, 0.3, 0.6], 19.0, 0.0),  # a rate, not a burst (or a fixed window's quota)
        ([0.0], 0.0, 0.0),  # no pause asked
    ],
)
def test_what_a_pause_says_of_the_gap(times: list[float], asked: float, gap: float) -> None:
    recovery, state = Recovery(), Refusal()
    succeed(recovery, state, times)
    assert recovery.refill(state, asked, 1.1) == pytest.approx(gap)


@pytest.mark.parametrize(("pace", "recover_in"), [(0.1, 15.0), (1.0, 15.0), (3.0, 24.0)])
def test_the_floor_comes_back_in_no_fewer_than_eight_of_its_gaps(
    pace: float, recover_in: float
) -> None:
    # At a host that allows one request every 3 s, 15 s is 5 gaps: the floor
    # would be past the refused gap after a few sends, and refused again.
    recovery, state = Recovery(), Refusal()
    recovery.refused(state, pace=pace, now=1.0)
    assert state.refused_gap == pace
    assert state.recover_in == pytest.approx(recover_in)
    assert recovery.floor(state, 1.0 + 2 * pace) > pace


def test_a_slow_start_then_two_successes_at_a_stated_pace_kept_it() -> None:
    # A start delay of 0.5 s coming down to the stated 0.1 s: the window of
    # successes spans 1.5 s, far more than 8 gaps, but the latest two came at
    # the pace, and the slot never sends faster than a stated one.
    recovery, state = Recovery(), Refusal()
    succeed(recovery, state, [0.0, 0.5, 0.755, 0.8875, 0.9875, 1.0875, 1.1875, 1.2875])
    assert recovery.let_through(state, 0.1, 1.3885, stated=True)
    # The slot's own pace (a ramp) needs all of them: the latest two may be a
    # token bucket's burst, filled while the ramp was slower.
    assert not recovery.let_through(state, 0.1, 1.3885, stated=False)


@pytest.mark.parametrize(
    ("times", "now", "kept"),
    [
        ([0.0, 0.1], 0.2, True),  # two at the pace, the refused one a gap later
        ([0.0, 0.125], 0.25, True),  # within 1.25 of the pace
        ([0.0, 0.2], 0.3, False),  # a refusal between them: three gaps
        ([0.0, 0.1], 0.35, False),  # a refusal between the latest and the refused one
        ([0.1], 0.2, False),  # one success: a host that refuses the second request
    ],
)
def test_at_a_stated_pace_the_latest_two_successes_say_whether_it_was_kept(
    times: list[float], now: float, kept: bool
) -> None:
    recovery, state = Recovery(), Refusal()
    succeed(recovery, state, [-5.0, -4.9])  # successes before a refusal: forgotten
    recovery.refused(state, pace=0.1, now=-4.5)
    succeed(recovery, state, times)
    assert recovery.let_through(state, 0.1, now, stated=True) is kept


def test_a_second_count_replaces_the_first_when_it_reaches_eight() -> None:
    # docs/recovery.md, "Bracketing": 8 to 16 of the latest successes count. Eight
    # a second apart, then eight a tenth apart: the second count has reached 8
    # and replaced the first, so the rate is the latest eight's.
    recovery, state = Recovery(), Refusal()
    succeed(recovery, state, [float(t) for t in range(8)])
    latest = [8.0 + i / 10 for i in range(8)]
    succeed(recovery, state, latest)
    assert recovery.success_rate(state, latest[-1]) == pytest.approx(7 / 0.7)


@pytest.mark.parametrize(
    ("times", "gap", "now", "kept"),
    [
        ([0.0, 0.1], 0.1, 0.2, True),  # a fast pace: a span well under a second
        ([0.0, 0.5], 0.5, 1.25, True),  # n successes spanning exactly 1.25 n gaps
        ([0.0, 0.5], 0.5, 1.26, False),  # a little more
        ([5.0, 5.0], 0.5, 5.0, False),  # all at the refusal's moment: no pace kept
    ],
)
def test_a_pace_of_the_slot_s_own_was_kept_when_n_successes_span_at_most_n_gaps(
    times: list[float], gap: float, now: float, kept: bool
) -> None:
    recovery, state = Recovery(), Refusal()
    succeed(recovery, state, times)
    assert recovery.let_through(state, gap, now, stated=False) is kept


def test_at_a_stated_pace_the_latest_two_may_span_two_and_a_half_gaps() -> None:
    recovery, state = Recovery(), Refusal()
    succeed(recovery, state, [0.0, 10.0, 10.5])  # a slow start, then the pace (0.5 s)
    assert recovery.let_through(state, 0.5, 11.25, stated=True)  # 2.5 gaps: kept
    assert not recovery.let_through(state, 0.5, 11.26, stated=True)


def test_a_loaded_record_places_no_past_event_in_the_future() -> None:
    # docs/architecture.md: a record taken from elsewhere is held to the loading
    # throttle's bounds, no past event in the future.
    times = (
        "backoff_at",
        "allowed_at",
        "ok_first",
        "ok_next_first",
        "ok_all_first",
        "ok_latest",
        "ok_before",
    )
    state = Refusal(**cast(dict[str, Any], dict.fromkeys(times, 5000.0)))
    state.bound(100.0)
    assert {name: getattr(state, name) for name in times} == dict.fromkeys(times, 100.0)

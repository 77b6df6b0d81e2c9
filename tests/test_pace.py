"""The ramp-up through its own interface, with plain numbers (docs/signals.md, "Ramp-up").

Only :class:`RampUp`, its :class:`Pace` record and plain numbers: no throttle,
slot or clock.
"""

from __future__ import annotations

import pytest

from autothrottle._pace import RAMP_SENDS, Pace, RampUp, ramp_period


@pytest.mark.parametrize(
    ("ramp_up", "delay", "period"),
    [
        (1.0, 1.0, 1.0),  # a slow slot doubles its rate once a ramp_up
        (1.0, 0.01, RAMP_SENDS * 0.01),  # a fast one every 8 sends
        (1.0, 0.0, 1e-6),  # never a period of 0
    ],
)
def test_the_period_is_ramp_up_or_eight_sends_if_sooner(
    ramp_up: float, delay: float, period: float
) -> None:
    assert ramp_period(ramp_up, delay) == pytest.approx(period)


def test_the_slowest_delay_halves_every_period_since_it_was_set() -> None:
    pace = Pace(delay=1.0, adjusted_at=10.0)
    ramp = RampUp(1.0)
    assert ramp.slowest(pace, 10.0) == 1.0
    assert ramp.slowest(pace, 11.0) == pytest.approx(0.5)
    assert ramp.slowest(pace, 13.0) == pytest.approx(0.125)
    assert ramp.slowest(pace, 5.0) == 1.0  # before it was set: no fall


def test_a_rise_or_a_fall_within_the_ramp_is_taken_as_asked() -> None:
    pace = Pace(delay=1.0, adjusted_at=0.0)
    ramp = RampUp(1.0)
    assert ramp.hold(pace, 2.0, now=0.5) == 2.0  # a rise is never held
    assert ramp.hold(pace, 0.6, now=1.0) == 0.6  # the ramp allows 0.5 by now


def test_a_fall_faster_than_the_ramp_is_held_at_the_slowest_delay() -> None:
    pace = Pace(delay=1.0, adjusted_at=0.0)
    assert RampUp(1.0).hold(pace, 0.01, now=1.0) == pytest.approx(0.5)


def test_a_held_delay_keeps_falling_with_time_down_to_what_was_asked() -> None:
    pace = Pace(delay=1.0, adjusted_at=0.0, ramp_to=0.2)
    ramp = RampUp(1.0)
    assert ramp.delay_at(pace, 1.0) == pytest.approx(0.5)
    assert ramp.delay_at(pace, 2.0) == pytest.approx(0.25)
    assert ramp.delay_at(pace, 3.0) == 0.2  # never below what the policy asked


def test_adapting_records_when_and_what_the_ramp_held_back() -> None:
    pace = Pace(delay=1.0)
    assert pace.adapt(0.5, 7.0, ramp_to=0.1) is True
    assert (pace.delay, pace.adjusted_at, pace.ramp_to) == (0.5, 7.0, 0.1)
    assert pace.adapt(0.5, 8.0) is False  # unchanged: the gate need not re-check
    assert (pace.adjusted_at, pace.ramp_to) == (8.0, 0.0)
    assert pace.set_delay(0.5) is False
    assert pace.set_delay(0.4) is True


def test_a_loaded_pace_is_held_to_the_loading_slots_delay_and_clock() -> None:
    pace = Pace(delay=3000.0, adjusted_at=500.0, ramp_to=20.0)
    pace.bound(100.0, 10.0, 20.0)
    assert (pace.delay, pace.adjusted_at) == (10.0, 100.0)
    assert pace.ramp_to == 0.0  # a ramp's end at or above the delay: no ramp
    pace.bound(100.0, 10.0, 2.0)
    assert pace.ramp_to == 2.0

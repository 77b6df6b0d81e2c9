"""Several limits at once: a rate and further (count, seconds) windows, honoured together
(docs/scheduling.md, rule 4)."""

from __future__ import annotations

import bisect
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autothrottle import FixedRatePolicy, Throttle
from helpers import FakeClock


def sends_over(throttle: Throttle, clock: FakeClock, seconds: float, step: float) -> list[float]:
    """Try to send every ``step`` seconds for ``seconds``; return the send times."""
    sent = []
    end = clock.now + seconds
    while clock.now < end:
        lease = throttle.try_acquire("api")
        if lease is not None:
            sent.append(clock.now)
            lease.release()
        clock.now += step
    return sent


def most_in_any_window(times: list[float], seconds: float) -> int:
    return max((bisect.bisect_left(times, t + seconds) - i for i, t in enumerate(times)), default=0)


def test_ten_per_second_and_twenty_per_five_seconds() -> None:
    clock = FakeClock()
    policy = FixedRatePolicy(10, windows=[(20, 5.0)])
    throttle = Throttle(policy=policy, clock=clock)
    sent = sends_over(throttle, clock, 20.0, 0.01)
    assert most_in_any_window(sent, 5.0) == 20  # the window binds ...
    assert min(b - a for a, b in itertools.pairwise(sent)) >= 0.1 - 1e-9  # the rate too
    assert len(sent) == pytest.approx(20 * 20 / 5, abs=20)  # and the slot keeps going: 4/s


@settings(max_examples=60, deadline=None)
@given(
    per_second=st.floats(1.0, 50.0),
    burst=st.integers(1, 5),
    windows=st.lists(st.tuples(st.integers(1, 30), st.floats(0.5, 10.0)), min_size=1, max_size=3),
    step=st.floats(0.001, 0.2),
)
def test_no_window_is_ever_exceeded(
    per_second: float, burst: int, windows: list[tuple[int, float]], step: float
) -> None:
    clock = FakeClock()
    policy = FixedRatePolicy(per_second, burst=burst, windows=windows)
    throttle = Throttle(policy=policy, clock=clock)
    sent = sends_over(throttle, clock, 15.0, step)
    assert sent
    for count, seconds in windows:
        assert most_in_any_window(sent, seconds - 1e-9) <= count


@pytest.mark.parametrize(
    ("windows", "error"),
    [
        ("10/s", TypeError),
        ([(10,)], TypeError),
        ([(0, 1.0)], ValueError),
        ([(10, 0.0)], ValueError),
        ([(10, "day")], TypeError),
        ([(1.5, 1.0)], TypeError),
    ],
)
def test_bad_windows_are_refused_naming_them(windows: object, error: type) -> None:
    with pytest.raises(error, match="windows"):
        FixedRatePolicy(10, windows=windows)  # type: ignore[arg-type]


def test_windows_show_in_the_repr() -> None:
    assert "windows=[(10000, 86400.0)]" in repr(FixedRatePolicy(10, windows=[(10_000, 86_400)]))

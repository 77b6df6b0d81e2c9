"""Debug output: ``debug=True`` logs one record per adjusted response.

On the ``autothrottle`` logger: the slot, its in-flight count, the delay old ->
new in milliseconds with the difference, the latency in milliseconds and the
status. Nothing is logged with ``debug=False`` or for a response whose request
was sent with ``adjust=False``.
"""

from __future__ import annotations

import logging
import re

import pytest

from autothrottle import AutoThrottlePolicy, Lease, Slot, Throttle
from helpers import FakeClock

KEY = "api.example"


def take(throttle: Throttle, slot: Slot, *, adjust: bool = True) -> Lease:
    """A lease granted now (no event loop needed)."""
    lease = throttle.try_acquire(slot.key, adjust=adjust)
    assert lease is not None
    return lease


def records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "autothrottle"]


@pytest.fixture
def caplog_debug(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="autothrottle")
    return caplog


def numbers_in_order(message: str, *numbers: str) -> bool:
    """True if every number appears in ``message`` as a whole number, in this order."""
    position = 0
    for number in numbers:
        match = re.compile(rf"(?<![\d.]){re.escape(number)}(?![\d.])").search(message, position)
        if match is None:
            return False
        position = match.end()
    return True


def test_one_record_with_every_field(caplog_debug: pytest.LogCaptureFixture) -> None:
    throttle = Throttle(
        policy=AutoThrottlePolicy(),
        start_delay=5.0,
        debug=True,
        max_concurrency=8,
        clock=FakeClock(100.0),
    )
    slot = throttle.slot(KEY)
    leases = [take(throttle, slot)]
    slot.delay = 0.0
    leases += [take(throttle, slot), take(throttle, slot)]
    slot.delay = 5.0
    caplog_debug.clear()

    # target 0.8: (5 + 0.8) / 2 = 2.9 -> 5000 ms -> 2900 ms, -2100 ms
    leases[0].observe(latency=0.8, status=200)

    logged = records(caplog_debug)
    assert len(logged) == 1
    message = logged[0].getMessage()
    assert logged[0].levelno == logging.DEBUG
    assert KEY in message
    # in flight (3), delay old -> new and the difference, latency, status
    assert numbers_in_order(message, "3", "5000", "2900", "-2100", "800", "200"), message
    assert "ms" in message
    for lease in leases:
        lease.release()


def test_a_raise_shows_a_positive_difference(caplog_debug: pytest.LogCaptureFixture) -> None:
    throttle = Throttle(
        policy=AutoThrottlePolicy(), start_delay=1.5, debug=True, clock=FakeClock(100.0)
    )
    # target 4.25 > (1.5 + 4.25) / 2: 1500 ms -> 4250 ms, +2750 ms
    throttle.observe(KEY, latency=4.25, status=200)
    logged = records(caplog_debug)
    assert len(logged) == 1
    message = logged[0].getMessage()
    assert numbers_in_order(message, "0", "1500", "4250", "2750", "4250", "200"), message
    assert "+2750" in message
    assert KEY in message


def test_the_status_is_logged(caplog_debug: pytest.LogCaptureFixture) -> None:
    throttle = Throttle(
        policy=AutoThrottlePolicy(),
        start_delay=2.0,
        debug=True,
        strict_scrapy=True,
        clock=FakeClock(100.0),
    )
    # a 404 may not lower: 2000 ms -> 2000 ms
    throttle.observe(KEY, latency=0.3, status=404)
    logged = records(caplog_debug)
    assert len(logged) == 1
    message = logged[0].getMessage()
    assert numbers_in_order(message, "2000", "300", "404"), message
    assert "(unchanged)" in message


def test_one_record_per_adjusted_response(caplog_debug: pytest.LogCaptureFixture) -> None:
    throttle = Throttle(
        policy=AutoThrottlePolicy(), start_delay=4.0, debug=True, clock=FakeClock(100.0)
    )
    samples = [(1.0, 200), (4.0, 200), (0.5, 200), (10.0, 200), (2.5, 200)]
    for latency, status in samples:
        throttle.observe(KEY, latency=latency, status=status)
    throttle.observe("other.example", latency=1.0, status=200)
    logged = records(caplog_debug)
    assert len(logged) == len(samples) + 1
    assert sum(KEY in r.getMessage() for r in logged) == len(samples)
    assert "other.example" in logged[-1].getMessage()


def test_a_response_that_keeps_the_delay_is_logged_too(
    caplog_debug: pytest.LogCaptureFixture,
) -> None:
    throttle = Throttle(
        policy=AutoThrottlePolicy(), start_delay=3.0, debug=True, clock=FakeClock(100.0)
    )
    throttle.observe(KEY, latency=3.0, status=200)  # steady: 3000 ms -> 3000 ms
    logged = records(caplog_debug)
    assert len(logged) == 1
    message = logged[0].getMessage()
    assert numbers_in_order(message, "3000", "3000", "200"), message
    assert "delay=3000ms (unchanged)" in message


def test_a_small_change_is_not_rounded_away(caplog_debug: pytest.LogCaptureFixture) -> None:
    throttle = Throttle(
        policy=AutoThrottlePolicy(),
        start_delay=0.0124,
        min_delay=0.0,
        debug=True,
        clock=FakeClock(100.0),
    )
    throttle.observe(KEY, latency=0.0108, status=200)  # 12.4 ms -> 11.6 ms
    message = records(caplog_debug)[0].getMessage()
    assert "delay=12.4ms->11.6ms (-0.80ms)" in message, message


def test_a_floor_raise_is_logged_as_the_recovery_floor(
    caplog_debug: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(100.0)
    throttle = Throttle(policy=AutoThrottlePolicy(), start_delay=1.0, debug=True, clock=clock)
    throttle.observe(KEY, latency=0.1, status=429)  # refused at a gap of 1 s
    clock.now += 0.5
    caplog_debug.clear()
    throttle.observe(KEY, latency=0.01, status=200)
    assert records(caplog_debug)[0].getMessage().endswith("reason=recovery floor")


def test_nothing_logged_without_debug(caplog_debug: pytest.LogCaptureFixture) -> None:
    throttle = Throttle(policy=AutoThrottlePolicy(), start_delay=5.0, clock=FakeClock(100.0))
    assert throttle.debug is False
    throttle.observe(KEY, latency=1.0, status=200)
    throttle.observe(KEY, latency=30.0, status=200)
    throttle.observe(KEY, latency=0.1, status=404)
    lease = take(throttle, throttle.slot(KEY))
    lease.observe(latency=2.0, status=200)
    lease.release()
    assert throttle.slot(KEY).delay != 5.0  # the responses were applied ...
    assert records(caplog_debug) == []  # ... silently


@pytest.mark.parametrize("status", [200, 404])
def test_nothing_logged_for_a_no_adjust_response(
    caplog_debug: pytest.LogCaptureFixture, status: int
) -> None:
    throttle = Throttle(
        policy=AutoThrottlePolicy(), start_delay=5.0, debug=True, clock=FakeClock(100.0)
    )
    slot = throttle.slot(KEY)
    lease = take(throttle, slot, adjust=False)
    lease.observe(latency=1.0, status=status)
    lease.observe(latency=30.0, status=status)
    lease.release()
    assert slot.delay == 5.0
    assert slot.snapshot().responses == 2
    assert records(caplog_debug) == []


def test_no_adjust_and_adjusted_responses_mixed(caplog_debug: pytest.LogCaptureFixture) -> None:
    throttle = Throttle(
        policy=AutoThrottlePolicy(), start_delay=0.0, debug=True, clock=FakeClock(100.0)
    )
    slot = throttle.slot(KEY)
    quiet = take(throttle, slot, adjust=False)
    loud = take(throttle, slot)
    quiet.observe(latency=1.0, status=200)
    loud.observe(latency=1.0, status=200)
    quiet.observe(latency=1.0, status=200)
    assert len(records(caplog_debug)) == 1


def test_debug_records_go_to_the_autothrottle_logger_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    throttle = Throttle(
        policy=AutoThrottlePolicy(), start_delay=5.0, debug=True, clock=FakeClock(100.0)
    )
    throttle.observe(KEY, latency=1.0, status=200)
    assert [r.name for r in caplog.records] == ["autothrottle"]


def test_debug_records_are_not_emitted_above_debug_level(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="autothrottle")
    throttle = Throttle(
        policy=AutoThrottlePolicy(), start_delay=5.0, debug=True, clock=FakeClock(100.0)
    )
    throttle.observe(KEY, latency=1.0, status=200)
    assert records(caplog) == []

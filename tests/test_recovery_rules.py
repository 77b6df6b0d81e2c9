"""The recovery floor through a throttle, on a hand-set clock (docs/recovery.md,
"The recovery floor"): after a refusal at gap ``g`` the delay may not fall
below ``g / (1 + (1 - margin) * (t / time - 1) ** 3)``, and a debug line whose
delay the floor set says ``reason=recovery floor``."""

from __future__ import annotations

import logging

import pytest

from autothrottle import AutoThrottlePolicy, Throttle
from helpers import FakeClock, gate_of, record_of

KEY = "example.com"


def test_the_floor_holds_a_fast_answer_after_a_refusal(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=AutoThrottlePolicy(), start_delay=0.5, debug=True)
    throttle.observe(KEY, latency=0.01, status=503)  # refused at 0.5 s, nothing let through
    assert throttle.slot(KEY).delay == 1.0
    with caplog.at_level(logging.DEBUG, logger="autothrottle"):
        throttle.observe(KEY, latency=0.01, status=200)
    # Scrapy's rule says (1.0 + 0.01) / 2; the floor right after says 0.5 / 0.93.
    assert throttle.slot(KEY).delay == pytest.approx(0.5 / (1 - 0.07))
    assert caplog.records[-1].getMessage().endswith("reason=recovery floor")
    clock.advance(15.0)  # the recovery time: the floor is back at the refused gap
    throttle.observe(KEY, latency=0.01, status=200)
    assert throttle.slot(KEY).delay == pytest.approx(0.5)


def test_a_refusal_is_of_the_gap_its_send_kept_not_of_a_delay_fallen_since() -> None:
    # A 5/s host with a burst of 1 (a token every 0.2 s), no rate headers: the
    # adaptive policy's start of 0.05 s is refused at once and the delay
    # doubled. After the pause, the first send takes the one token, and its
    # fast answer lowers the delay to the floor; the next send still keeps
    # the doubled gap begun before (docs/scheduling.md, rule 3) and is
    # refused. That refusal is of the doubled gap: read from the delay fallen
    # since, the floor came back to half of it after every pause, and 18 of
    # 40 requests were refused.
    clock = FakeClock()
    throttle = Throttle(clock=clock, wall_clock=clock.wall, start_delay=0.05)
    slot = throttle.slot(KEY)
    gate = gate_of(slot)
    refused = {"Retry-After": "1"}

    def send(status: int, headers: dict[str, str] | None = None) -> float:
        clock.now = max(clock.now, gate.send_at(clock()))
        lease = throttle.try_acquire(KEY)
        assert lease is not None
        sent = clock()
        clock.advance(0.01)
        lease.observe(latency=0.01, status=status, headers=headers)
        lease.release()
        return sent

    send(200)
    send(429, refused)
    doubled = slot.delay
    assert doubled >= 0.09  # backed off from about 0.05
    first = send(200)  # after the pause: the one token
    assert slot.delay < 0.6 * doubled  # the floor, the refused gap over the margin
    second = send(429, refused)
    assert second - first == pytest.approx(doubled)  # the gap begun at the doubled delay
    assert record_of(slot).refused_gap == pytest.approx(doubled)
    send(200)
    # The floor now holds the gap that was refused, not half of it.
    assert slot.delay >= doubled

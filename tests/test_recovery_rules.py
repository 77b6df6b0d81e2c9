"""The recovery floor through a throttle, on a hand-set clock (docs/recovery.md,
"The recovery floor"): after a refusal at gap ``g`` the delay may not fall
below ``g / (1 + (1 - margin) * (t / time - 1) ** 3)``, and a debug line whose
delay the floor set says ``reason=recovery floor``."""

from __future__ import annotations

import logging

import pytest

from autothrottle import AutoThrottlePolicy, Throttle
from helpers import FakeClock

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

"""A stated start (docs/signals.md, "Rate-limit headers"), on a hand-set clock.

The first response that states the policy's own pace, when the slot's delay is
above it and it was never refused, has the policy adapt from that pace rather
than from its delay. A slot that was refused keeps adapting from its delay:
the host's refusal, not a guess, set it.
"""

from __future__ import annotations

import logging

import pytest

from autothrottle import AdaptiveConcurrencyPolicy, AutoThrottlePolicy, Throttle
from helpers import FakeClock

KEY = "api.example"
STATED = {"RateLimit-Policy": '"default";q=10;w=1', "RateLimit": '"default";r=9;t=1'}


def test_a_slot_never_refused_adapts_from_the_stated_pace() -> None:
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=AutoThrottlePolicy(), start_delay=1.0)
    throttle.observe(KEY, latency=0.01, status=200, headers=STATED)
    # Scrapy's rule from the stated 0.1 s: (0.1 + 0.01) / 2.
    assert throttle.slot(KEY).delay == pytest.approx(0.055)


def test_a_slot_once_refused_adapts_from_its_delay() -> None:
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=AutoThrottlePolicy(), start_delay=0.5)
    throttle.observe(KEY, latency=0.01, status=503)  # refused at 0.5 s: backs off to 1 s
    assert throttle.slot(KEY).delay == 1.0
    clock.advance(600.0)  # long past the recovery: the floor holds nothing back
    throttle.observe(KEY, latency=0.01, status=200, headers=STATED)
    # Scrapy's rule from the delay: (1.0 + 0.01) / 2, not from the stated 0.1 s.
    assert throttle.slot(KEY).delay == pytest.approx(0.505)


def test_the_debug_line_says_what_set_the_delay(caplog: pytest.LogCaptureFixture) -> None:
    # docs/guide.md, "Reading the debug output": `stated pace` when the policy
    # adapted from the pace the headers stated; `ramp-up` when the ramp held a
    # falling delay back (docs/signals.md, "Ramp-up").
    clock = FakeClock()
    stated = Throttle(clock=clock, policy=AutoThrottlePolicy(), start_delay=1.0, debug=True)
    ramped = Throttle(clock=clock, policy=AdaptiveConcurrencyPolicy(), start_delay=2.0, debug=True)
    with caplog.at_level(logging.DEBUG, logger="autothrottle"):
        stated.observe(KEY, latency=0.01, status=200, headers=STATED)
        clock.advance(0.1)
        ramped.observe("ramped.example", latency=0.01, status=200)
    reasons = [r.getMessage().rsplit("reason=", 1)[-1] for r in caplog.records]
    assert reasons == ["stated pace", "ramp-up"]
    assert all("latency=10.0ms status=200 " in r.getMessage() for r in caplog.records)


def test_a_pace_stated_at_the_delay_itself_is_no_stated_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A stated start is a pace below the delay (docs/signals.md, "Rate-limit
    # headers"); stated at exactly the delay there is nothing to start from,
    # and what set the new delay is the latency.
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=AutoThrottlePolicy(), start_delay=0.1, debug=True)
    with caplog.at_level(logging.DEBUG, logger="autothrottle"):
        throttle.observe(KEY, latency=0.01, status=200, headers=STATED)
    assert throttle.slot(KEY).delay == pytest.approx(0.055)
    reasons = [r.getMessage().rsplit("reason=", 1)[-1] for r in caplog.records]
    assert reasons == ["latency"]

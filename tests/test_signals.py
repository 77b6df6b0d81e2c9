"""The status-aware rules: backoff statuses, failures, Retry-After, rate-limit
headers, cache hits, soft blocks, strict Scrapy mode, and what a slot reports.

Two kinds of tests:

* the delay rules, with a :class:`FakeClock` injected as the throttle's clock
  (and its wall clock), leases taken with ``await throttle.acquire(key)`` at a
  moment the gate must be open (:func:`take` fails otherwise), so every
  ``sent_at`` is real and every expected delay can be worked out by hand;
* the gate (pauses, rate-limit spacing), on looptime's fake-time loop with the
  throttle reading the loop's clock, so grant times are exact and no test
  sleeps for real.

Expected numbers come from the rules in docs/signals.md and docs/recovery.md,
not from the code:

* a backoff multiplies the pace the slot kept (its delay here) by
  ``backoff_factor``, bounded by ``max_delay``; only the first signal of a
  burst counts: answers to requests sent before the last backoff are lag;
* after a refusal at gap ``g`` the delay may not fall below
  ``g / (1 + (1 - recovery_margin) * (seconds_since / recovery_time - 1) ** 3)``;
* Scrapy's rule: ``target = latency / target_concurrency``,
  ``new = max(target, (delay + target) / 2)``; non-200 never lowers.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import Mapping
from email.utils import formatdate
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autothrottle import AdaptiveConcurrencyPolicy, AutoThrottlePolicy, Throttle
from autothrottle.policy import DelayPolicy
from autothrottle.store import RateLimit
from helpers import WALL, FakeClock, bounded, record_of, refusal_floor, take

KEY = "example.com"
OTHER = "other.example"
TOL = 1e-5  # looptime's clock ticks in microseconds


def fake(**kwargs: Any) -> tuple[FakeClock, Throttle]:
    """A throttle on a fake clock: Scrapy's rules unless a test names another policy."""
    clock = FakeClock()
    kwargs.setdefault("policy", AutoThrottlePolicy())
    return clock, Throttle(clock=clock, wall_clock=clock.wall, **kwargs)


async def gate_closed(throttle: Throttle, key: str = KEY) -> bool:
    try:
        (await take(throttle, key)).release()
    except AssertionError:
        return True
    return False


# -- looptime helpers --------------------------------------------------------------

looptime = pytest.mark.looptime


def now() -> float:
    return asyncio.get_running_loop().time()


def loop_throttle(**kwargs: Any) -> Throttle:
    """A throttle on the (fake) loop time; its wall clock is WALL + loop time.
    Scrapy's rules unless a test names another policy."""
    kwargs.setdefault("policy", AutoThrottlePolicy())
    return Throttle(clock=now, wall_clock=lambda: WALL + now(), **kwargs)


async def grant_times(throttle: Throttle, key: str, count: int) -> list[float]:
    """Send ``count`` requests from concurrent tasks; their grant times in order."""
    times: list[float] = []

    async def one() -> None:
        lease = await throttle.acquire(key)
        times.append(now())
        lease.release()

    await asyncio.gather(*(one() for _ in range(count)))
    return times


# =================================================================================
# backoff statuses
# =================================================================================


@pytest.mark.parametrize("status", [429, 503])
async def test_backoff_status_multiplies_the_delay_up_to_max_delay(status: int) -> None:
    clock, throttle = fake(start_delay=1.0, max_delay=5.0)
    seen = []
    for _ in range(5):
        lease = await take(throttle)
        clock.advance(0.05)
        lease.observe(latency=0.05, status=status)
        lease.release()
        seen.append(throttle.slot(KEY).delay)
        clock.advance(throttle.slot(KEY).delay)
    assert seen == [2.0, 4.0, 5.0, 5.0, 5.0]
    snap = throttle.slot(KEY).snapshot()
    assert snap.backoffs == 5
    assert snap.ignored_backoffs == 0
    assert snap.last_backoff_reason == f"status {status}"
    assert snap.status_counts == {status: 5}


async def test_backoff_factor_is_configurable() -> None:
    clock, throttle = fake(start_delay=1.0, backoff_factor=3.0)
    for expected in (3.0, 9.0):
        lease = await take(throttle)
        lease.observe(latency=0.01, status=429)
        lease.release()
        assert throttle.slot(KEY).delay == expected
        clock.advance(expected)


async def test_a_custom_set_of_backoff_statuses_replaces_the_default() -> None:
    clock, throttle = fake(start_delay=1.0, backoff_statuses={418, 500})
    lease = await take(throttle)
    lease.observe(latency=0.01, status=429)  # not a backoff status now: Scrapy's rule only
    lease.release()
    assert throttle.slot(KEY).delay == 1.0
    assert throttle.slot(KEY).snapshot().backoffs == 0
    clock.advance(1.0)
    lease = await take(throttle)
    lease.observe(latency=0.01, status=418)
    lease.release()
    assert throttle.slot(KEY).delay == 2.0
    assert throttle.slot(KEY).snapshot().last_backoff_reason == "status 418"


async def test_no_backoff_statuses_at_all() -> None:
    _, throttle = fake(start_delay=1.0, backoff_statuses=())
    lease = await take(throttle)
    lease.observe(latency=0.01, status=429)
    assert throttle.slot(KEY).delay == 1.0
    assert throttle.slot(KEY).snapshot().backoffs == 0


async def test_a_burst_of_429s_to_concurrent_requests_backs_off_once() -> None:
    n = 6
    clock, throttle = fake(start_delay=1.0, max_concurrency=n + 2)
    leases = []
    for _ in range(n):
        leases.append(await take(throttle))
        clock.advance(1.0)
    for lease in leases:
        lease.observe(latency=0.05, status=429)
        clock.advance(0.01)
    slot = throttle.slot(KEY)
    snap = slot.snapshot()
    assert snap.backoffs == 1
    assert snap.ignored_backoffs == n - 1
    assert slot.delay == 2.0  # once: 1 * 2, not 2 ** 6
    for lease in leases:
        lease.release()

    # A 429 to a request sent after the backoff is new evidence: it counts.
    clock.advance(2.0)
    later = await take(throttle)
    later.observe(latency=0.05, status=503)
    assert slot.snapshot().backoffs == 2
    assert slot.delay == 4.0
    # ... and the lag of that second backoff is ignored again.
    leases[0].observe(latency=0.05, status=429)
    assert slot.snapshot().backoffs == 2
    assert slot.delay == 4.0


async def test_throttle_observe_also_counts_only_the_first_429_of_a_burst() -> None:
    clock, throttle = fake(start_delay=1.0, max_concurrency=8)
    for _ in range(4):
        await take(throttle)
        clock.advance(1.0)
    for _ in range(4):  # no send since the first of them backed the slot off
        throttle.observe(KEY, latency=0.05, status=429)
    assert throttle.slot(KEY).snapshot().backoffs == 1
    assert throttle.slot(KEY).delay == 2.0


# =================================================================================
# failures
# =================================================================================


@pytest.mark.parametrize("error", [ConnectionError("refused"), TimeoutError()])
async def test_a_failure_backs_off_and_gives_no_latency_sample(error: BaseException) -> None:
    _, throttle = fake(start_delay=1.0)
    lease = await take(throttle)
    lease.fail(error)
    lease.release()
    snap = throttle.slot(KEY).snapshot()
    assert snap.delay == 2.0
    assert snap.failures == 1
    assert snap.responses == 0
    assert snap.last_latency is None
    assert snap.backoffs == 1
    assert snap.last_backoff_reason == f"failure: {type(error).__name__}"


async def test_a_burst_of_failures_backs_off_once() -> None:
    clock, throttle = fake(start_delay=1.0)
    leases = []
    for _ in range(4):
        leases.append(await take(throttle))
        clock.advance(1.0)
    for lease in leases:
        lease.fail(ConnectionResetError())
    snap = throttle.slot(KEY).snapshot()
    assert (snap.delay, snap.backoffs, snap.ignored_backoffs, snap.failures) == (2.0, 1, 3, 4)


async def test_backoff_on_failure_false_only_counts_failures() -> None:
    _, throttle = fake(start_delay=1.0, backoff_on_failure=False)
    lease = await take(throttle)
    lease.fail(ConnectionError())
    snap = throttle.slot(KEY).snapshot()
    assert (snap.delay, snap.backoffs, snap.failures, snap.last_latency) == (1.0, 0, 1, None)


# =================================================================================
# recovery after a refusal
# =================================================================================


async def test_recovery_approaches_the_refused_pace_with_care() -> None:
    margin, settle = Throttle().recovery_margin, Throttle().recovery_time
    assert 0.0 < margin < 1.0
    assert settle > 0.0
    clock, throttle = fake(start_delay=1.0)
    slot = throttle.slot(KEY)
    lease = await take(throttle)
    clock.advance(0.1)
    lease.observe(latency=0.1, status=429)  # refused at a gap of 1 s
    lease.release()
    refused_at = clock.now
    assert slot.delay == 2.0

    history: list[tuple[float, float]] = []
    gap = slot.delay
    for _ in range(10_000):  # bounded: each turn moves the clock by the delay (> 0.4 s)
        if clock.now - refused_at >= 2 * settle:
            break
        clock.advance(gap)
        lease = await take(throttle)
        gap = slot.delay  # the gap this grant begins: a later fall does not shorten it
        lease.observe(latency=0.01, status=200)  # fast: Scrapy alone would halve each time
        lease.release()
        history.append((clock.now - refused_at, slot.delay))

    # Never below the floor, and the floor is what holds it (the policy wants less).
    for elapsed, delay in history:
        assert delay == pytest.approx(refusal_floor(1.0, elapsed), rel=1e-9)
    # At first it stays above the pace that was refused ...
    first_elapsed, first_delay = history[0]
    assert first_elapsed < 2.5
    assert 1.0 < first_delay <= 1.0 / margin
    assert all(delay > 1.0 for elapsed, delay in history if elapsed < settle)
    # ... and creeps past it as (fake) time goes by, never jumping.
    assert all(b[1] <= a[1] for a, b in itertools.pairwise(history))
    assert history[-1][1] < 1.0
    assert history[-1][1] > 0.4  # nowhere near the 10 ms the latency asks for


async def succeed_at(clock: FakeClock, throttle: Throttle, rate: float, seconds: float) -> None:
    """Fast 200s at ``rate`` per second for ``seconds`` (the slot's delay set to match)."""
    slot = throttle.slot(KEY)
    for _ in range(round(rate * seconds)):
        slot.delay = 1.0 / rate
        clock.advance(1.0 / rate)
        lease = await take(throttle)
        lease.observe(latency=0.0, status=200)
        lease.release()


@pytest.mark.parametrize(
    ("policy", "refused_before", "refused_rate", "expected_limit"),
    [
        # Far above what got through (10/s): the limit lies between; aim at the
        # geometric mean of the two bounds, sqrt(10 * 40) = 20/s (Scrapy's rule,
        # no ramp-up: at a first refusal too, as the refused rate over 2 is no less).
        (AutoThrottlePolicy(), True, 40.0, 20.0),
        (AutoThrottlePolicy(), False, 40.0, 20.0),
        # A slot that ramped up to the refused pace, at its first refusal: a
        # burst may have hidden how far past the limit it ran, so what got
        # through is the limit.
        (AdaptiveConcurrencyPolicy(), False, 40.0, 9.0 / (0.9 + 1.0 / 40.0)),
        # Just above it: what got through is the limit, measured over the
        # latest successes (8 to 16 of them; here the last 10, up to the refusal).
        (AutoThrottlePolicy(), False, 11.0, 9.0 / (0.9 + 1.0 / 11.0)),
    ],
)
async def test_a_refusal_brackets_the_limit_with_what_got_through(
    policy: DelayPolicy, refused_before: bool, refused_rate: float, expected_limit: float
) -> None:
    clock, throttle = fake(start_delay=0.1, policy=policy)
    slot = throttle.slot(KEY)
    if refused_before:
        lease = await take(throttle)
        lease.observe(latency=0.0, status=429)
        lease.release()
        clock.advance(100.0)  # long recovered, and what got through then forgotten
    await succeed_at(clock, throttle, 10.0, 5.0)
    slot.delay = 1.0 / refused_rate
    clock.advance(1.0 / refused_rate)
    lease = await take(throttle)
    lease.observe(latency=0.0, status=429)
    lease.release()
    assert 1.0 / record_of(slot).refused_gap == pytest.approx(expected_limit, rel=0.05)


async def test_the_floor_holds_after_a_failure_too() -> None:
    clock, throttle = fake(start_delay=0.5)
    slot = throttle.slot(KEY)
    lease = await take(throttle)
    lease.fail(ConnectionError())
    lease.release()
    assert slot.delay == 1.0
    clock.advance(1.0)
    lease = await take(throttle)
    lease.observe(latency=0.0, status=200)
    assert slot.delay >= refusal_floor(0.5, 1.0)
    assert slot.delay > 0.5


# =================================================================================
# Retry-After
# =================================================================================


@looptime
@pytest.mark.parametrize("status", [429, 503, 200])
async def test_retry_after_delta_pauses_the_slot_and_only_that_slot(status: int) -> None:
    throttle = loop_throttle(start_delay=1.0, max_concurrency=10)
    async with bounded():
        t0 = now()
        lease = await throttle.acquire(KEY)
        lease.observe(latency=0.0, status=status, headers={"Retry-After": "30"})
        lease.release()
        assert throttle.slot(KEY).snapshot().pause_remaining == pytest.approx(30.0, abs=TOL)
        paused = asyncio.create_task(grant_times(throttle, KEY, 5))
        other = await grant_times(throttle, OTHER, 5)
        times = await paused
    assert times[0] == pytest.approx(t0 + 30.0, abs=TOL)
    assert min(times) >= t0 + 30.0 - TOL
    # The other slot kept its own pace during the pause: one per second from t0.
    gaps = [b - a for a, b in itertools.pairwise(other)]
    assert other[0] == pytest.approx(t0, abs=TOL)
    assert gaps == pytest.approx([1.0] * 4, abs=TOL)
    assert max(other) < t0 + 30.0
    snap = throttle.slot(KEY).snapshot()
    assert snap.pauses == 1
    assert snap.backoffs == (0 if status == 200 else 1)


@looptime
async def test_retry_after_http_date_pauses_until_that_date() -> None:
    throttle = loop_throttle(start_delay=0.0)
    async with bounded():
        t0 = now()
        assert t0 == int(t0)  # whole seconds: HTTP-dates have no fraction
        lease = await throttle.acquire(KEY)
        date = formatdate(WALL + t0 + 45, usegmt=True)
        lease.observe(latency=0.0, status=503, headers={"Retry-After": date})
        lease.release()
        times = await grant_times(throttle, KEY, 3)
    assert times[0] == pytest.approx(t0 + 45.0, abs=TOL)


@looptime
async def test_retry_after_is_capped_at_max_pause_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    throttle = loop_throttle(start_delay=0.0, max_pause=10.0)
    async with bounded():
        t0 = now()
        lease = await throttle.acquire(KEY)
        with caplog.at_level(logging.WARNING, logger="autothrottle"):
            lease.observe(latency=0.0, status=429, headers={"Retry-After": "3600"})
        lease.release()
        times = await grant_times(throttle, KEY, 2)
    assert times[0] == pytest.approx(t0 + 10.0, abs=TOL)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert KEY in message
    assert "3600" in message
    assert "max_pause" in message


@pytest.mark.parametrize(
    ("value", "pause"),
    [
        ("garbage", 0.0),
        ("-5", 0.0),
        ("", 0.0),
        ("NaN", 0.0),
        ("inf", 0.0),
        ("1e999", 0.0),
        ("0", 0.0),
        ("Wed, 32 Foo 2024 99:99:99 GMT", 0.0),
        ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),  # in the past
        (formatdate(WALL + 1000.0 - 60, usegmt=True), 0.0),  # a minute ago
        ("\x00\udcff" * 50, 0.0),
        ("9" * 400, 60.0),  # absurd: capped
        ("99999999999999999999999999", 60.0),
        ("1" * 5000, 0.0),  # over-long: ignored unparsed
        ("7", 7.0),
        ("2.5", 2.5),
        (formatdate(WALL + 1000.0 + 20, usegmt=True), 20.0),
        (formatdate(WALL + 1000.0 + 10**6, usegmt=True), 60.0),
    ],
    ids=lambda v: repr(v)[:30],
)
async def test_retry_after_never_raises_and_never_pauses_beyond_max_pause(
    value: str, pause: float
) -> None:
    clock, throttle = fake(start_delay=0.0, max_pause=60.0)
    assert clock.now == 1000.0  # the dates above are relative to it
    lease = await take(throttle)
    lease.observe(latency=0.0, status=503, headers={"Retry-After": value})
    snap = throttle.slot(KEY).snapshot()
    assert snap.pause_remaining == pytest.approx(pause)
    assert 0.0 <= snap.pause_remaining <= 60.0
    assert snap.pauses == (1 if pause else 0)
    if not pause:
        clock.advance(throttle.slot(KEY).delay)  # the backoff's delay, but no pause
        assert not await gate_closed(throttle)


async def test_a_later_shorter_retry_after_does_not_cut_a_pause_short() -> None:
    clock, throttle = fake(start_delay=0.0, max_concurrency=4)
    first = await take(throttle)
    second = await take(throttle)
    first.observe(latency=0.0, status=429, headers={"Retry-After": "30"})
    clock.advance(1.0)
    second.observe(latency=0.0, status=429, headers={"Retry-After": "5"})
    snap = throttle.slot(KEY).snapshot()
    assert snap.pause_remaining == pytest.approx(29.0)
    assert snap.pauses == 1
    clock.advance(28.9)
    assert await gate_closed(throttle)
    clock.advance(0.1)
    assert not await gate_closed(throttle)


async def test_retry_after_false_ignores_the_header() -> None:
    clock, throttle = fake(start_delay=0.0, retry_after=False)
    lease = await take(throttle)
    lease.observe(latency=0.0, status=429, headers={"Retry-After": "30"})
    assert throttle.slot(KEY).snapshot().pause_remaining == 0.0
    clock.advance(throttle.slot(KEY).delay)  # the backoff's delay, but no pause
    assert not await gate_closed(throttle)


async def refuse_at(
    clock: FakeClock, throttle: Throttle, gap: float, retry_after: str
) -> tuple[float, float]:
    """A 429 with ``Retry-After`` for a request sent ``gap`` after the last, the slot
    at that gap: when it was sent, and when the pause it left ends."""
    throttle.slot(KEY).delay = gap
    clock.advance(gap)
    lease = await take(throttle)
    lease.observe(latency=0.0, status=429, headers={"Retry-After": retry_after})
    lease.release()
    return lease.sent_at, clock.now + throttle.slot(KEY).snapshot().pause_remaining


async def test_a_whole_second_retry_after_at_a_pace_the_host_kept_ends_one_gap_on() -> None:
    # 10/s let through for 2 s, then refused at that pace with "Retry-After: 1":
    # a token due within 0.1 s, rounded up to the second. The pause ends 0.1 s
    # after the refused request was sent; the refusal backs off to the recovery
    # floor (the limit it brackets, less the margin), not to twice the pace.
    clock, throttle = fake(start_delay=0.1)
    await succeed_at(clock, throttle, 10.0, 2.0)
    sent, until = await refuse_at(clock, throttle, 0.1, "1")
    assert until == pytest.approx(sent + 0.1)
    snap = throttle.slot(KEY).snapshot()
    assert snap.backoffs == 1
    refused_gap = record_of(throttle.slot(KEY)).refused_gap
    assert snap.delay == pytest.approx(refusal_floor(refused_gap, 0.0))
    assert 0.1 < snap.delay < 0.12


@pytest.mark.parametrize("status", [503, 429])
async def test_only_a_429_at_a_kept_pace_backs_off_no_further_than_the_floor(status: int) -> None:
    # The same pace kept, refused without a pause: a 429 says the rate is
    # passed by a little, a 503 that the host is overloaded (doubled).
    clock, throttle = fake(start_delay=0.1)
    await succeed_at(clock, throttle, 10.0, 2.0)
    throttle.slot(KEY).delay = 0.1
    clock.advance(0.1)
    lease = await take(throttle)
    lease.observe(latency=0.0, status=status)
    lease.release()
    slot = throttle.slot(KEY)
    if status == 503:
        assert slot.delay == pytest.approx(0.2)
    else:
        assert slot.delay == pytest.approx(refusal_floor(record_of(slot).refused_gap, 0.0))
        assert slot.delay < 0.12


async def test_a_429_at_a_pace_never_kept_still_doubles() -> None:
    # 2/s let through, then refused 20 ms after the last: a pace the host never
    # kept, and nothing bracketed by it: twice the pace (at least 50 ms).
    clock, throttle = fake(start_delay=0.5)
    await succeed_at(clock, throttle, 2.0, 2.0)
    throttle.slot(KEY).delay = 0.04
    clock.advance(0.04)
    lease = await take(throttle)
    lease.observe(latency=0.0, status=429)
    lease.release()
    assert throttle.slot(KEY).delay == pytest.approx(0.08)


@pytest.mark.parametrize(("lag_asks", "paused"), [("1", 0.0), ("30", 30.0)])
async def test_a_lagging_refusal_extends_no_pause_of_its_bursts_first(
    lag_asks: str, paused: float
) -> None:
    # Two requests 0.1 s apart at the kept pace, both refused: the second was
    # sent before the first's backoff, the lag of the same pace, and its
    # "Retry-After: 1" the same rounding. A longer wait is the host's new word.
    clock, throttle = fake(start_delay=0.1, max_concurrency=2)
    await succeed_at(clock, throttle, 10.0, 2.0)
    throttle.slot(KEY).delay = 0.1
    clock.advance(0.1)
    first = await take(throttle)
    clock.advance(0.1)
    second = await take(throttle)
    clock.advance(0.01)
    first.observe(latency=0.0, status=429, headers={"Retry-After": "1"})
    # The pause ended one gap after the first was sent, when the second went.
    assert throttle.slot(KEY).snapshot().pause_remaining == 0.0
    second.observe(latency=0.0, status=429, headers={"Retry-After": lag_asks})
    snap = throttle.slot(KEY).snapshot()
    assert snap.pause_remaining == pytest.approx(paused)
    assert (snap.backoffs, snap.ignored_backoffs) == (1, 1)


async def test_a_longer_retry_after_at_a_kept_pace_is_a_penalty_and_held() -> None:
    clock, throttle = fake(start_delay=0.1)
    await succeed_at(clock, throttle, 10.0, 2.0)
    _, until = await refuse_at(clock, throttle, 0.1, "2")
    assert until == pytest.approx(clock.now + 2.0)


async def test_a_retry_after_for_a_pace_the_host_never_kept_is_held_whole() -> None:
    # 2/s let through, then a request 20 ms after the last (Scrapy's rule
    # halving its delay): the host kept no such pace, its second is waited out.
    clock, throttle = fake(start_delay=0.5)
    await succeed_at(clock, throttle, 2.0, 2.0)
    _, until = await refuse_at(clock, throttle, 0.02, "1")
    assert until == pytest.approx(clock.now + 1.0)


async def burst_then_refused(
    clock: FakeClock, throttle: Throttle, gaps: list[float], last: float, retry_after: str
) -> None:
    """Successes sent ``gaps`` apart, then a 429 with ``Retry-After`` ``last`` later."""
    slot = throttle.slot(KEY)
    for gap in gaps:
        slot.delay = gap
        clock.advance(gap)
        lease = await take(throttle)
        lease.observe(latency=0.0, status=200)
        lease.release()
    slot.delay = last
    clock.advance(last)
    lease = await take(throttle)
    lease.observe(latency=0.0, status=429, headers={"Retry-After": retry_after})
    lease.release()


async def test_a_slow_host_is_learned_from_its_first_retry_after() -> None:
    # A host that allows one request every 20 s, with a burst of 2: the default
    # policy's ramp sends 2 in a second, the third is refused with
    # "Retry-After: 19" (its next token 18.9 s away). The pause plus the 1.1 s
    # the burst took is the host's gap: after the pause the slot waits a gap,
    # not the ramp's 0.6 s (which the host refused once every gap).
    clock, throttle = fake(policy=AdaptiveConcurrencyPolicy(), start_delay=1.0)
    slot = throttle.slot(KEY)
    await burst_then_refused(clock, throttle, [0.0, 1.0], 0.1, "19")
    assert record_of(slot).refused_gap == pytest.approx(20.1)
    clock.advance(19.0)
    lease = await take(throttle)
    clock.advance(0.01)
    lease.observe(latency=0.01, status=200)
    lease.release()
    assert slot.delay > 20.1
    # The floor stays above the host's gap for the first gaps after the pause,
    # and the slot is sent no faster.
    for _ in range(3):
        clock.advance(slot.delay - 0.51)  # 0.01 s after the send already passed
        assert await gate_closed(throttle)
        clock.advance(1.0)
        lease = await take(throttle)
        lease.observe(latency=0.01, status=200)
        lease.release()
        assert slot.delay > 20.1


@pytest.mark.parametrize(
    ("gaps", "retry_after", "refused_gap"),
    [
        # Two successes, refused 1.1 s after the first: "19" says the host's gap
        # is the span plus the pause; "1" (a token within the second) and "2"
        # (maybe not past the span) say nothing, the refused pace stands.
        ([0.0, 1.0], "19", 20.1),
        ([0.0, 1.0], "1", 0.1),
        ([0.0, 1.0], "2", 0.1),
        # Three, 0.55 s apart: a rate, which brackets the limit (a fixed window
        # that let its quota through asks for a long pause too).
        ([0.0, 0.5, 0.5], "19", 0.55),
    ],
)
async def test_only_a_pause_longer_than_a_short_burst_took_says_how_slow_the_host_is(
    gaps: list[float], retry_after: str, refused_gap: float
) -> None:
    clock, throttle = fake(policy=AdaptiveConcurrencyPolicy(), start_delay=0.5)
    await burst_then_refused(clock, throttle, gaps, 0.1, retry_after)
    assert record_of(throttle.slot(KEY)).refused_gap == pytest.approx(refused_gap)


async def test_a_retry_after_that_is_not_obeyed_says_nothing_of_the_gap() -> None:
    clock, throttle = fake(policy=AdaptiveConcurrencyPolicy(), start_delay=1.0, retry_after=False)
    await burst_then_refused(clock, throttle, [0.0, 1.0], 0.1, "19")
    assert record_of(throttle.slot(KEY)).refused_gap < 2.0


# =================================================================================
# rate-limit headers
# =================================================================================


@looptime
@pytest.mark.parametrize(
    "headers",
    [
        {"RateLimit-Limit": "100", "RateLimit-Remaining": "5", "RateLimit-Reset": "10"},
        {"X-RateLimit-Remaining": "5", "X-RateLimit-Reset": "10"},
        {"RateLimit": '"default";r=5;t=10', "RateLimit-Policy": '"default";q=100;w=60'},
    ],
    ids=["RateLimit-*", "X-RateLimit-*", "RateLimit"],
)
async def test_a_budget_spaces_sends_until_its_reset(headers: dict[str, str]) -> None:
    throttle = loop_throttle(start_delay=0.0, max_concurrency=4)
    async with bounded():
        t0 = now()
        lease = await throttle.acquire(KEY)
        lease.observe(latency=0.0, status=200, headers=headers)
        lease.release()
        assert throttle.slot(KEY).snapshot().rate_limit is not None
        times = [t - t0 for t in await grant_times(throttle, KEY, 12)]
    before = [0.0] + [t for t in times if t < 9.0 - TOL]
    gaps = [b - a for a, b in itertools.pairwise(before)]
    # 5 remaining over a reset given in whole seconds (it may be as near as 9 s):
    # sends spread 9 / 5 = 1.8 s apart, never more than 5 before the reset.
    assert all(gap >= 1.8 - TOL for gap in gaps), times
    assert len(before) - 1 <= 5
    assert len(before) >= 4  # it did send while the budget lasted
    # After the reset the budget no longer holds the slot back ...
    assert sum(1 for t in times if t <= 10.0 + TOL) >= len(before) + 1
    if "RateLimit-Policy" not in headers:
        assert max(times) <= 10.0 + TOL
    else:  # ... but a known policy (100 per 60 s) still paces at its own rate.
        after = [t for t in times if t >= 10.0 - TOL]
        assert all(b - a >= 0.6 - TOL for a, b in itertools.pairwise(after)), after


@looptime
async def test_a_policy_with_a_window_paces_at_its_own_rate_past_the_reset() -> None:
    # q=10 per w=1 s: 0.1 s apart, even when t says 0 while tokens remain.
    throttle = loop_throttle(start_delay=0.0, max_concurrency=4)
    headers = {"RateLimit": '"site";r=9;t=0', "RateLimit-Policy": '"site";q=10;w=1'}
    async with bounded():
        t0 = now()
        times = [0.0]
        for _ in range(30):
            lease = await throttle.acquire(KEY)
            times.append(now() - t0)
            lease.observe(latency=0.0, status=200, headers=headers)
            lease.release()
    gaps = [b - a for a, b in itertools.pairwise(times[1:])]
    assert all(gap == pytest.approx(0.1, abs=TOL) for gap in gaps), gaps


@looptime
@pytest.mark.parametrize(
    "headers",
    [
        {"RateLimit": '"default";r=0;t=20'},
        {"RateLimit": "limit=10, remaining=0, reset=20"},
        {"RateLimit-Remaining": "0", "RateLimit-Reset": "20"},
        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "20"},
        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "EPOCH+20"},
        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "EPOCHMS+20"},
    ],
    ids=["draft8", "draft7", "RateLimit-*", "X-RateLimit-*", "epoch", "epoch-ms"],
)
async def test_an_exhausted_budget_pauses_until_the_reset(headers: dict[str, str]) -> None:
    throttle = loop_throttle(start_delay=0.0)
    async with bounded():
        t0 = now()
        wall = WALL + t0
        resolved = {
            name: value.replace("EPOCHMS+20", str(int((wall + 20) * 1000))).replace(
                "EPOCH+20", str(int(wall + 20))
            )
            for name, value in headers.items()
        }
        lease = await throttle.acquire(KEY)
        lease.observe(latency=0.0, status=200, headers=resolved)
        lease.release()
        times = await grant_times(throttle, KEY, 3)
    assert times[0] == pytest.approx(t0 + 20.0, abs=TOL)
    snap = throttle.slot(KEY).snapshot()
    assert snap.pauses == 1
    assert snap.backoffs == 0
    assert snap.rate_limit is not None
    assert snap.rate_limit.remaining == 0


@looptime
async def test_an_exhausted_budget_pause_is_capped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    throttle = loop_throttle(start_delay=0.0, max_pause=60.0)
    async with bounded():
        t0 = now()
        lease = await throttle.acquire(KEY)
        with caplog.at_level(logging.WARNING, logger="autothrottle"):
            lease.observe(
                latency=0.0,
                status=200,
                headers={"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "5000"},
            )
        lease.release()
        times = await grant_times(throttle, KEY, 1)
    assert times[0] == pytest.approx(t0 + 60.0, abs=TOL)
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(KEY in m and "5000" in m for m in messages), messages


@looptime
async def test_budget_spacing_never_holds_a_slot_beyond_max_pause() -> None:
    throttle = loop_throttle(start_delay=0.0, max_pause=60.0)
    async with bounded():
        t0 = now()
        lease = await throttle.acquire(KEY)
        lease.observe(
            latency=0.0,
            status=200,
            headers={"RateLimit-Remaining": "1", "RateLimit-Reset": "3600"},
        )
        lease.release()
        try:
            async with asyncio.timeout(600.0):
                times = await grant_times(throttle, KEY, 1)
        except TimeoutError:
            times = [math.inf]
    assert times[0] <= t0 + 60.0 + TOL


async def test_rate_limit_headers_are_ignored_on_a_cached_response() -> None:
    _, throttle = fake(start_delay=0.0)
    lease = await take(throttle)
    lease.observe(
        latency=0.0,
        status=200,
        headers={"Age": "30", "RateLimit-Remaining": "0", "RateLimit-Reset": "20"},
    )
    snap = throttle.slot(KEY).snapshot()
    assert snap.rate_limit is None
    assert snap.pause_remaining == 0.0
    assert snap.cache_hits == 1
    assert not await gate_closed(throttle)


async def test_an_age_of_zero_does_not_hide_the_budget() -> None:
    _, throttle = fake(start_delay=0.0)
    lease = await take(throttle)
    lease.observe(
        latency=0.0,
        status=200,
        headers={"Age": "0", "RateLimit-Remaining": "0", "RateLimit-Reset": "20"},
    )
    assert throttle.slot(KEY).snapshot().pause_remaining == pytest.approx(20.0)
    assert await gate_closed(throttle)


async def test_rate_limit_headers_false_ignores_them() -> None:
    _, throttle = fake(start_delay=0.0, rate_limit_headers=False)
    lease = await take(throttle)
    lease.observe(
        latency=0.0, status=200, headers={"RateLimit-Remaining": "0", "RateLimit-Reset": "20"}
    )
    snap = throttle.slot(KEY).snapshot()
    assert (snap.rate_limit, snap.pause_remaining) == (None, 0.0)
    assert not await gate_closed(throttle)


# =================================================================================
# cache hits
# =================================================================================

CACHE_HITS: list[tuple[int, dict[str, str]]] = [
    (200, {"Age": "10"}),
    (200, {"X-Cache": "HIT"}),
    (200, {"x-cache": "Hit from cloudfront"}),
    (200, {"CF-Cache-Status": "HIT"}),
    (200, {"X-Cache-Status": "HIT"}),
    (304, {}),
]


@pytest.mark.parametrize(("status", "headers"), CACHE_HITS, ids=repr)
async def test_a_cache_hit_teaches_nothing_of_the_origins_latency(
    status: int, headers: dict[str, str]
) -> None:
    _, throttle = fake(start_delay=2.0)
    throttle.observe(KEY, latency=1.0, status=200)  # a miss: (2 + 1) / 2
    throttle.observe(KEY, latency=0.05, status=status, headers=headers)
    snap = throttle.slot(KEY).snapshot()
    assert snap.cache_hits == 1
    # Scrapy alone: (1.5 + 0.05) / 2. A 200 hit lowers the delay only through
    # the share of misses (one in two); a 304 never lowers it.
    assert snap.delay == pytest.approx(0.75 if status == 200 else 1.5)


@pytest.mark.parametrize(("status", "headers"), CACHE_HITS, ids=repr)
async def test_a_slow_cache_hit_may_raise_the_delay(status: int, headers: dict[str, str]) -> None:
    _, throttle = fake(start_delay=2.0)
    lease = await take(throttle)
    lease.observe(latency=5.0, status=status, headers=headers)
    assert throttle.slot(KEY).delay == 5.0


async def test_one_slow_hit_among_fast_ones_moves_the_delay_a_tenth_of_the_way() -> None:
    """A client that stalls once (a garbage collection, a busy event loop) reads
    one hit as slow: the slot must not take that for the host's pace."""
    _, throttle = fake(start_delay=0.01, target_concurrency=1.0)
    hit = {"X-Cache": "HIT"}
    for _ in range(20):
        throttle.observe(KEY, latency=0.005, status=200, headers=hit)
    fast = throttle.slot(KEY).delay
    throttle.observe(KEY, latency=0.5, status=200, headers=hit)
    # The averaged hit latency: 0.005 + 0.1 * (0.5 - 0.005).
    assert throttle.slot(KEY).delay == pytest.approx(0.0545)
    assert fast < 0.0545
    for _ in range(20):  # hits that stay slow bring the delay up to them
        throttle.observe(KEY, latency=0.5, status=200, headers=hit)
    assert throttle.slot(KEY).delay > 0.4


@pytest.mark.parametrize(("status", "headers"), CACHE_HITS[:-1], ids=repr)
async def test_cache_hits_lower_delay_lets_them_lower_it(
    status: int, headers: dict[str, str]
) -> None:
    _, throttle = fake(start_delay=2.0, cache_hits_lower_delay=True)
    lease = await take(throttle)
    lease.observe(latency=0.05, status=status, headers=headers)
    snap = throttle.slot(KEY).snapshot()
    assert snap.delay == pytest.approx(1.025)
    assert snap.cache_hits == 1  # still counted


@pytest.mark.parametrize(
    "headers",
    [{}, {"Age": "0"}, {"X-Cache": "MISS"}, {"CF-Cache-Status": "MISS"}, {"Age": "soon"}],
    ids=repr,
)
async def test_a_miss_lowers_the_delay_as_usual(headers: dict[str, str]) -> None:
    _, throttle = fake(start_delay=2.0)
    lease = await take(throttle)
    lease.observe(latency=0.05, status=200, headers=headers)
    snap = throttle.slot(KEY).snapshot()
    assert snap.delay == pytest.approx(1.025)
    assert snap.cache_hits == 0


# =================================================================================
# soft blocks: the classifier and Throttle.backoff
# =================================================================================


async def test_block_classifier_backs_off_with_reason_blocked() -> None:
    calls: list[tuple[int, Mapping[str, str]]] = []

    def classify(status: int, headers: Mapping[str, str]) -> bool:
        calls.append((status, headers))
        return headers.get("X-Blocked") == "1"

    clock, throttle = fake(start_delay=1.0, block_classifier=classify)
    lease = await take(throttle)
    lease.observe(latency=0.01, status=200, headers={"X-Blocked": "0"})
    lease.release()
    assert throttle.slot(KEY).delay == pytest.approx(0.505)
    assert calls == [(200, {"X-Blocked": "0"})]

    clock.advance(1.0)
    lease = await take(throttle)
    lease.observe(latency=0.01, status=200, headers={"X-Blocked": "1"})
    snap = throttle.slot(KEY).snapshot()
    # The gap this send kept, begun at 1.0 before the delay fell (scheduling
    # rule 3), doubled; the fast latency ignored.
    assert snap.delay == pytest.approx(2.0)
    assert snap.backoffs == 1
    assert snap.last_backoff_reason == "blocked"


async def test_blocks_of_a_burst_back_off_once() -> None:
    clock, throttle = fake(start_delay=1.0, block_classifier=lambda status, headers: True)
    leases = []
    for _ in range(3):
        leases.append(await take(throttle))
        clock.advance(1.0)
    for lease in leases:
        lease.observe(latency=0.0, status=200)
    snap = throttle.slot(KEY).snapshot()
    assert (snap.delay, snap.backoffs, snap.ignored_backoffs) == (2.0, 1, 2)


async def test_manual_backoff_by_url_or_key() -> None:
    clock, throttle = fake(start_delay=1.0)
    assert throttle.backoff("https://Example.COM:8443/login?next=/") is True
    slot = throttle.slot(KEY)
    assert slot.delay == 2.0
    assert slot.snapshot().last_backoff_reason == "manual"
    # Nothing sent since: a second call is the lag of the first.
    assert throttle.backoff(KEY) is False
    assert slot.delay == 2.0
    assert slot.snapshot().ignored_backoffs == 1
    # After a send it is new evidence again.
    lease = await take(throttle)
    clock.advance(0.5)
    assert throttle.backoff(KEY) is True
    assert slot.delay == 4.0
    assert slot.snapshot().backoffs == 2
    lease.release()


async def test_a_manual_backoff_says_why_when_told() -> None:
    _, throttle = fake(start_delay=1.0)
    seen: list[str | None] = []
    throttle.listen(lambda event: seen.append(event.reason))
    assert throttle.backoff(KEY, reason="blocked") is True
    snap = throttle.slot(KEY).snapshot()
    assert snap.last_backoff_reason == "blocked"
    totals = throttle.stats().totals
    assert totals is not None
    assert totals.backoff_reasons == {"blocked": 1}
    assert seen == ["blocked"]


async def test_manual_backoff_with_sent_at_is_exact() -> None:
    clock, throttle = fake(start_delay=1.0, max_concurrency=4)
    early = await take(throttle)
    clock.advance(1.0)
    assert throttle.backoff(KEY, sent_at=early.sent_at) is True
    clock.advance(2.0)
    late = await take(throttle)  # sent after the backoff
    # The slot has sent since, but this block answers a request sent before.
    assert throttle.backoff(KEY, sent_at=early.sent_at) is False
    assert throttle.slot(KEY).delay == 2.0
    assert throttle.backoff(KEY, sent_at=late.sent_at) is True
    assert throttle.slot(KEY).delay == 4.0


async def test_manual_backoff_with_a_pause() -> None:
    clock, throttle = fake(start_delay=0.0)
    await take(throttle)
    assert throttle.backoff(KEY, pause=30.0) is True
    snap = throttle.slot(KEY).snapshot()
    assert snap.pause_remaining == pytest.approx(30.0)
    assert snap.pauses == 1
    clock.advance(29.5)
    assert await gate_closed(throttle)
    clock.advance(0.5)
    assert not await gate_closed(throttle)


async def test_manual_pause_is_capped_at_max_pause(caplog: pytest.LogCaptureFixture) -> None:
    _, throttle = fake(start_delay=0.0, max_pause=20.0)
    with caplog.at_level(logging.WARNING, logger="autothrottle"):
        throttle.backoff(KEY, pause=1e6)
    assert throttle.slot(KEY).snapshot().pause_remaining == pytest.approx(20.0)
    assert any(KEY in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"url_or_key": ""}, TypeError, "url_or_key"),
        ({"url_or_key": 5}, TypeError, "url_or_key"),
        ({"url_or_key": KEY, "pause": -1.0}, ValueError, "pause"),
        ({"url_or_key": KEY, "pause": math.nan}, ValueError, "pause"),
        ({"url_or_key": KEY, "pause": "10"}, TypeError, "pause"),
        ({"url_or_key": KEY, "sent_at": math.inf}, ValueError, "sent_at"),
        ({"url_or_key": KEY, "reason": ""}, TypeError, "reason"),
        ({"url_or_key": KEY, "reason": None}, TypeError, "reason"),
    ],
)
def test_manual_backoff_rejects_bad_arguments(
    kwargs: dict[str, Any], error: type[Exception], name: str
) -> None:
    _, throttle = fake(start_delay=1.0)
    kwargs = dict(kwargs)  # the parameter's own dict stays whole for a second run
    url_or_key = kwargs.pop("url_or_key")
    with pytest.raises(error, match=name):
        throttle.backoff(url_or_key, **kwargs)


# =================================================================================
# strict Scrapy mode
# =================================================================================

SIGNALS: list[dict[str, str]] = [
    {},
    {"Retry-After": "30"},
    {"Retry-After": formatdate(WALL + 2000.0, usegmt=True)},
    {"RateLimit-Remaining": "0", "RateLimit-Reset": "60"},
    {"X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "100"},
    {"RateLimit": '"q";r=2;t=50'},
    {"Age": "100"},
    {"X-Cache": "HIT"},
    {"CF-Cache-Status": "HIT", "Retry-After": "5"},
]


def scrapy_rule(delay: float, latency: float, status: int, *, concurrency: float) -> float:
    """Scrapy's AutoThrottle, written out again (min 0, max 60)."""
    target = latency / concurrency
    new = min(max(target, (delay + target) / 2.0), 60.0)
    if status != 200 and new <= delay:
        return delay
    return new


async def test_strict_scrapy_by_hand() -> None:
    clock, throttle = fake(
        start_delay=1.0, strict_scrapy=True, block_classifier=lambda s, h: True, max_concurrency=4
    )
    slot = throttle.slot(KEY)
    steps: list[tuple[int, float, dict[str, str], float]] = [
        # 429 in 0.2 s with every signal: may raise, never lower -> stays 1
        (429, 0.2, {"Retry-After": "30", "RateLimit-Remaining": "0", "RateLimit-Reset": "60"}, 1.0),
        (503, 3.0, {"Retry-After": "600"}, 3.0),  # target 3 > 2: raised to 3
        (200, 1.0, {"Age": "100", "X-Cache": "HIT"}, 2.0),  # a cache hit lowers as any 200
        (200, 0.5, {"X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "100"}, 1.25),
    ]
    for status, latency, headers, expected in steps:
        lease = await take(throttle)  # also proves: no pause, no budget spacing
        gap = slot.delay  # the gap this grant begins: a later fall does not shorten it
        lease.observe(latency=latency, status=status, headers=headers)
        lease.release()
        assert slot.delay == pytest.approx(expected), (status, latency, headers)
        clock.advance(max(gap, slot.delay))
    lease = await take(throttle)
    lease.fail(ConnectionError())
    assert slot.delay == pytest.approx(1.25)
    snap = slot.snapshot()
    assert (snap.backoffs, snap.pauses, snap.cache_hits, snap.failures) == (0, 0, 0, 1)
    assert (snap.rate_limit, snap.pause_remaining, snap.last_backoff_reason) == (None, 0.0, None)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from([200, 200, 200, 304, 404, 429, 500, 503]),
            st.floats(min_value=0.0, max_value=20.0),
            st.sampled_from(SIGNALS),
            st.floats(min_value=0.0, max_value=5.0),
        ),
        max_size=30,
    ),
    concurrency=st.sampled_from([0.5, 1.0, 3.0]),
)
def test_strict_scrapy_is_exactly_scrapys_rule(
    steps: list[tuple[int, float, dict[str, str], float]], concurrency: float
) -> None:
    clock, throttle = fake(start_delay=5.0, strict_scrapy=True, target_concurrency=concurrency)
    slot = throttle.slot(KEY)
    expected = 5.0
    for status, latency, headers, pause in steps:
        throttle.observe(KEY, latency=latency, status=status, headers=headers)
        expected = scrapy_rule(expected, latency, status, concurrency=concurrency)
        assert slot.delay == pytest.approx(expected, rel=1e-12, abs=1e-12)
        clock.advance(pause)
    snap = slot.snapshot()
    assert (snap.backoffs, snap.ignored_backoffs, snap.pauses, snap.cache_hits) == (0, 0, 0, 0)
    assert (snap.rate_limit, snap.pause_remaining) == (None, 0.0)


# =================================================================================
# snapshot and debug records
# =================================================================================


async def test_snapshot_of_a_fresh_slot() -> None:
    _, throttle = fake()
    snap = throttle.slot(KEY).snapshot()
    assert snap.last_backoff_ago is None
    assert snap.last_backoff_reason is None
    assert snap.pause_remaining == 0.0
    assert snap.rate_limit is None
    assert (snap.backoffs, snap.ignored_backoffs, snap.pauses, snap.cache_hits) == (0, 0, 0, 0)


async def test_snapshot_shows_the_last_backoff_the_pause_and_the_budget() -> None:
    clock, throttle = fake(start_delay=1.0, max_concurrency=4)
    lease = await take(throttle)
    lease.observe(latency=0.1, status=200, headers={"Age": "5"})
    clock.advance(1.0)
    lease = await take(throttle)
    clock.advance(0.5)
    lease.observe(
        latency=0.5,
        status=429,
        headers={
            "Retry-After": "10",
            "RateLimit-Limit": "50",
            "RateLimit-Remaining": "4",
            "RateLimit-Reset": "40",
        },
    )
    clock.advance(3.0)
    snap = throttle.slot(KEY).snapshot()
    assert snap.last_backoff_ago == pytest.approx(3.0)
    assert snap.last_backoff_reason == "status 429"
    assert snap.pause_remaining == pytest.approx(7.0)
    assert snap.rate_limit == RateLimit(remaining=4, reset=40.0, limit=50, source="RateLimit-*")
    assert (snap.backoffs, snap.pauses, snap.cache_hits) == (1, 1, 1)
    assert snap.status_counts == {200: 1, 429: 1}
    clock.advance(20.0)
    snap = throttle.slot(KEY).snapshot()
    assert snap.pause_remaining == 0.0
    assert snap.last_backoff_ago == pytest.approx(23.0)


def _blocked(status: int, headers: Mapping[str, str]) -> bool:
    return "X-Captcha" in headers


async def _scenario(name: str, throttle: Throttle) -> None:
    lease = await take(throttle)
    if name == "latency":
        lease.observe(latency=0.1, status=200)
    elif name == "status 429":
        lease.observe(latency=0.1, status=429)
    elif name == "Retry-After":
        lease.observe(latency=0.1, status=200, headers={"Retry-After": "5"})
    elif name == "rate-limit header":
        lease.observe(
            latency=0.1, status=200, headers={"RateLimit-Remaining": "0", "RateLimit-Reset": "9"}
        )
    elif name == "cache hit":
        lease.observe(latency=0.1, status=200, headers={"X-Cache": "HIT"})
    elif name == "failure: ConnectionError":
        lease.fail(ConnectionError())
    elif name == "manual":
        throttle.backoff(KEY)
    elif name == "manual pause":
        throttle.backoff(KEY, pause=5.0)
    elif name == "blocked":
        lease.observe(latency=0.1, status=200, headers={"X-Captcha": "1"})
    else:  # pragma: no cover
        raise AssertionError(name)
    lease.release()


REASONS = [
    "latency",
    "status 429",
    "Retry-After",
    "rate-limit header",
    "cache hit",
    "failure: ConnectionError",
    "manual",
    "manual pause",
    "blocked",
]


@pytest.mark.parametrize("reason", REASONS)
async def test_debug_records_carry_the_reason(
    reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, throttle = fake(start_delay=1.0, debug=True, block_classifier=_blocked)
    with caplog.at_level(logging.DEBUG, logger="autothrottle"):
        await _scenario(reason, throttle)
    records = [r for r in caplog.records if r.name == "autothrottle" and r.levelno == logging.DEBUG]
    reasons = [getattr(r, "reason", None) for r in records]
    assert reason in reasons, reasons
    for record in records:
        assert getattr(record, "slot", None) == KEY
        assert KEY in record.getMessage()
        assert str(getattr(record, "reason", None)) in record.getMessage()
    delay_records = [r for r in records if hasattr(r, "new_delay")]
    if delay_records:
        assert delay_records[-1].new_delay == throttle.slot(KEY).delay


async def test_no_debug_records_without_debug(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="autothrottle"):
        for reason in REASONS:
            _, throttle = fake(start_delay=1.0, block_classifier=_blocked)
            await _scenario(reason, throttle)
    assert [r for r in caplog.records if r.levelno == logging.DEBUG] == []


# =================================================================================
# validation of the signal settings
# =================================================================================


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"backoff_factor": 0.5}, ValueError, "backoff_factor"),
        ({"backoff_factor": math.inf}, ValueError, "backoff_factor"),
        ({"backoff_factor": "2"}, TypeError, "backoff_factor"),
        ({"max_pause": -1.0}, ValueError, "max_pause"),
        ({"max_pause": math.nan}, ValueError, "max_pause"),
        ({"backoff_statuses": [99]}, ValueError, "backoff_statuses"),
        ({"backoff_statuses": [429.0]}, ValueError, "backoff_statuses"),
        ({"backoff_statuses": [True]}, ValueError, "backoff_statuses"),
        ({"backoff_statuses": "429"}, TypeError, "backoff_statuses"),
        ({"backoff_statuses": 429}, TypeError, "backoff_statuses"),
        ({"backoff_on_failure": 1}, TypeError, "backoff_on_failure"),
        ({"retry_after": "yes"}, TypeError, "retry_after"),
        ({"rate_limit_headers": None}, TypeError, "rate_limit_headers"),
        ({"cache_hits_lower_delay": 0}, TypeError, "cache_hits_lower_delay"),
        ({"strict_scrapy": 1}, TypeError, "strict_scrapy"),
        ({"block_classifier": "captcha"}, TypeError, "block_classifier"),
        ({"wall_clock": 5.0}, TypeError, "wall_clock"),
    ],
    ids=repr,
)
def test_bad_signal_settings_raise_naming_the_parameter(
    kwargs: dict[str, Any], error: type[Exception], name: str
) -> None:
    with pytest.raises(error, match=name):
        Throttle(**kwargs)


@pytest.mark.parametrize(
    ("status", "reset", "pause"),
    [
        (200, "1", 0.1),  # spent at the policy's pace: the window ends within one gap
        (200, "3", 3.0),  # a reset seconds away is taken as said
        (429, "1", 1.0),  # refused: the header's t, rounding and all
    ],
)
async def test_an_exhausted_budget_with_a_known_policy_pauses_no_longer_than_needed(
    status: int, reset: str, pause: float
) -> None:
    _, throttle = fake(start_delay=0.0, backoff_statuses=())
    headers = {"RateLimit": f'"site";r=0;t={reset}', "RateLimit-Policy": '"site";q=10;w=1'}
    lease = await take(throttle)
    lease.observe(latency=0.0, status=status, headers=headers)
    assert throttle.slot(KEY).snapshot().pause_remaining == pytest.approx(pause)


async def test_a_header_problem_is_logged_once_per_slot_then_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, throttle = fake(start_delay=0.0)
    bad = {"X-RateLimit-Remaining": "lots", "X-RateLimit-Reset": "10"}
    with caplog.at_level(logging.DEBUG, logger="autothrottle"):
        for key in (KEY, KEY, KEY, OTHER):
            throttle.observe(key, latency=0.0, status=200, headers=bad)
    notes = [r for r in caplog.records if "lots" in r.getMessage()]
    assert [r.levelno for r in notes] == [logging.INFO, logging.DEBUG, logging.DEBUG, logging.INFO]
    assert [r.slot for r in notes] == [KEY, KEY, KEY, OTHER]  # type: ignore[attr-defined]


async def test_a_capped_pause_warns_once_per_slot_with_readable_numbers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, throttle = fake(start_delay=0.0, max_pause=0.2)
    with caplog.at_level(logging.DEBUG, logger="autothrottle"):
        for _ in range(3):
            throttle.observe(KEY, latency=0.0, status=503, headers={"Retry-After": "30"})
    capped = [r for r in caplog.records if "capped" in r.getMessage()]
    assert [r.levelno for r in capped] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert "Retry-After of 30s capped to max_pause=0.2s" in capped[0].getMessage()

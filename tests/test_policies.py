"""The delay policies other than Scrapy's: fixed delay, fixed rate, AIMD, adaptive concurrency.

The rules come from docs/signals.md, docs/recovery.md and the policies' docstrings:

* ``FixedDelayPolicy(d)``: the delay is ``d`` whatever the latency; a backoff
  raises it and the refusal floor brings it back;
* ``FixedRatePolicy(per_second, burst=b)``: never more than
  ``b + floor(w * per_second)`` sends in any window of ``w`` seconds (with
  ``b = 1``: consecutive sends at least ``1 / per_second`` apart);
* ``AIMDPolicy``: each 200 adds ``increase * gap`` to the rate (about
  ``increase`` requests/second per second of success); a backoff multiplies
  the rate by ``decrease``, once per burst;
* ``AdaptiveConcurrencyPolicy``: finds how many requests a host serves in
  parallel; checked against a simulated host of ``C`` workers with service
  time ``S`` (a semaphore on looptime's fake-time loop: the latency is ``S``
  while at most ``C`` are in flight and grows with the queue beyond).

Pacing is checked with an injected clock: a :class:`FakeClock` for the delay
rules, looptime's loop clock for grant times.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import re
import statistics
from collections.abc import Callable
from typing import Any

import pytest

from autothrottle import (
    AdaptiveConcurrencyPolicy,
    AIMDPolicy,
    AutoThrottlePolicy,
    FixedDelayPolicy,
    FixedRatePolicy,
    Throttle,
)
from autothrottle.policy import DelayPolicy, Sample, SlotConfig
from helpers import FakeClock, bounded, gate_of, record_of, refusal_floor, take

KEY = "example.com"
TOL = 1e-5  # looptime's clock ticks in microseconds


def fake(**kwargs: Any) -> tuple[FakeClock, Throttle]:
    clock = FakeClock()
    return clock, Throttle(clock=clock, **kwargs)


looptime = pytest.mark.looptime


def now() -> float:
    return asyncio.get_running_loop().time()


def loop_throttle(**kwargs: Any) -> Throttle:
    return Throttle(clock=now, **kwargs)


def assert_rate_kept(times: list[float], per_second: float, burst: int) -> None:
    """No window ``[t_i, t_j]`` holds more than ``burst + floor(w * per_second)`` sends."""
    times = sorted(times)
    for i, start in enumerate(times):
        for j in range(i, len(times)):
            window = times[j] - start
            allowed = burst + math.floor(window * per_second + TOL * per_second)
            assert j - i + 1 <= allowed, (
                f"{j - i + 1} sends in {window:.6f}s from t={start:.6f}: "
                f"more than {burst} + {per_second}/s allows"
            )


# =================================================================================
# FixedDelayPolicy
# =================================================================================


async def test_fixed_delay_keeps_its_delay_whatever_the_latency() -> None:
    clock, throttle = fake(start_delay=5.0, policy=FixedDelayPolicy(0.5))
    slot = throttle.slot(KEY)
    assert slot.delay == 0.5  # not start_delay
    rng = random.Random(1)
    for _ in range(50):
        lease = await take(throttle)
        lease.observe(latency=rng.choice([0.0, 0.01, 2.0, 30.0]), status=200)
        lease.release()
        assert slot.delay == 0.5
        clock.advance(0.5)


async def test_fixed_delay_is_bounded_by_min_delay() -> None:
    _, throttle = fake(min_delay=1.0, policy=FixedDelayPolicy(0.5))
    assert throttle.slot(KEY).delay == 1.0


async def test_fixed_delay_backs_off_and_returns_as_the_floor_allows() -> None:
    clock, throttle = fake(policy=FixedDelayPolicy(0.5))
    slot = throttle.slot(KEY)
    lease = await take(throttle)
    lease.observe(latency=0.01, status=429)
    lease.release()
    refused_at = clock.now
    assert slot.delay == 1.0
    back_at = None
    gap = slot.delay
    for _ in range(10_000):  # bounded: each turn moves the clock by the delay (>= 0.5 s)
        if clock.now - refused_at >= 30.0:
            break
        clock.advance(gap)
        lease = await take(throttle)
        gap = slot.delay  # the gap this grant begins: a later fall does not shorten it
        lease.observe(latency=0.01, status=200)
        lease.release()
        elapsed = clock.now - refused_at
        assert slot.delay == pytest.approx(max(0.5, refusal_floor(0.5, elapsed)))
        if back_at is None and slot.delay == 0.5:
            back_at = elapsed
    assert back_at is not None
    assert back_at >= Throttle().recovery_time - 1e-9  # no sooner than the floor allows


# =================================================================================
# FixedRatePolicy
# =================================================================================


async def run_clients(
    throttle: Throttle,
    arrivals: list[float],
    *,
    seed: int,
    status: Callable[[int], int] = lambda i: 200,
) -> list[float]:
    """One request per arrival time; each holds its lease for a random time."""
    rng = random.Random(seed)
    times: list[float] = []
    t0 = now()

    async def client(i: int, at: float) -> None:
        await asyncio.sleep(at)
        lease = await throttle.acquire(KEY)
        times.append(now() - t0)
        service = rng.uniform(0.0, 0.8)
        await asyncio.sleep(service)
        lease.observe(latency=service, status=status(i))
        lease.release()

    async with bounded():
        await asyncio.gather(*(client(i, at) for i, at in enumerate(arrivals)))
    return sorted(times)


@looptime
@pytest.mark.parametrize("per_second", [5.0, 0.5, 12.5])
async def test_fixed_rate_without_burst_spaces_every_send(per_second: float) -> None:
    throttle = loop_throttle(policy=FixedRatePolicy(per_second), max_concurrency=100)
    rng = random.Random(3)
    arrivals = sorted(rng.uniform(0.0, 20.0 / per_second) for _ in range(40))
    times = await run_clients(throttle, arrivals, seed=4)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 1.0 / per_second - TOL
    assert_rate_kept(times, per_second, 1)
    # It is a rate, not a crawl: a backlog goes at exactly that rate.
    assert times[-1] == pytest.approx(39 / per_second, abs=1.0 / per_second + TOL)


@looptime
@pytest.mark.parametrize("burst", [2, 3, 8])
async def test_fixed_rate_with_burst_never_exceeds_burst_plus_rate(burst: int) -> None:
    per_second = 5.0
    throttle = loop_throttle(policy=FixedRatePolicy(per_second, burst=burst), max_concurrency=100)
    rng = random.Random(burst)
    # Waves with quiet spells between them, so the burst refills, and stragglers.
    arrivals = [wave + rng.uniform(0.0, 0.3) for wave in (0.0, 10.0, 25.0) for _ in range(15)]
    arrivals += [rng.uniform(0.0, 40.0) for _ in range(15)]
    times = await run_clients(throttle, sorted(arrivals), seed=burst)
    assert_rate_kept(times, per_second, burst)
    # The burst is really used: the first wave's first `burst` requests go on arrival.
    assert sum(1 for t in times if t <= 0.3 + TOL) >= burst


@looptime
async def test_fixed_rate_burst_is_exactly_the_burst_after_quiet() -> None:
    throttle = loop_throttle(policy=FixedRatePolicy(5.0, burst=3), max_concurrency=100)
    times = await run_clients(throttle, [0.0] * 10, seed=0)
    assert times[:3] == pytest.approx([0.0, 0.0, 0.0], abs=TOL)
    assert times[3:] == pytest.approx([0.2 * k for k in range(1, 8)], abs=TOL)


@looptime
async def test_fixed_rate_stays_within_its_rate_through_backoffs() -> None:
    per_second = 5.0
    throttle = loop_throttle(policy=FixedRatePolicy(per_second), max_concurrency=100)
    times = await run_clients(
        throttle, [0.1 * i for i in range(60)], seed=9, status=lambda i: 429 if i % 7 == 3 else 200
    )
    assert throttle.slot(KEY).snapshot().backoffs >= 1
    assert_rate_kept(times, per_second, 1)


@looptime
async def test_fixed_rate_with_burst_stays_within_its_rate_through_a_backoff() -> None:
    per_second, burst = 5.0, 3
    throttle = loop_throttle(policy=FixedRatePolicy(per_second, burst=burst), max_concurrency=100)
    times: list[float] = []
    async with bounded():
        first = [await throttle.acquire(KEY) for _ in range(burst)]  # the whole burst at t0
        times += [lease.sent_at for lease in first]
        first[0].observe(latency=0.01, status=429)  # slows the slot down
        for _ in range(5):
            lease = await throttle.acquire(KEY)
            times.append(lease.sent_at)
            lease.release()
    assert_rate_kept(times, per_second, burst)


async def test_fixed_rate_delay_is_bounded_by_min_and_max_delay() -> None:
    _, throttle = fake(min_delay=0.5, policy=FixedRatePolicy(10.0))
    assert throttle.slot(KEY).delay == 0.5
    _, throttle = fake(max_delay=0.05, policy=FixedRatePolicy(1.0))
    assert throttle.slot(KEY).delay == 0.05


async def test_fixed_rate_ignores_latency() -> None:
    clock, throttle = fake(policy=FixedRatePolicy(4.0))
    slot = throttle.slot(KEY)
    for latency in (0.0, 3.0, 0.01, 10.0):
        lease = await take(throttle)
        lease.observe(latency=latency, status=200)
        lease.release()
        assert slot.delay == 0.25
        clock.advance(0.25)


# =================================================================================
# AIMDPolicy
# =================================================================================


async def aimd_run(throttle: Throttle, clock: FakeClock, seconds: float) -> float:
    """Send back to back for ``seconds`` of fake time, every answer a quick 200."""
    slot = throttle.slot(KEY)
    start = clock.now
    for _ in range(100_000):  # bounded: each turn moves the clock by the delay
        if clock.now - start >= seconds:
            break
        # The gap the last grant began (a delay that fell since does not shorten it).
        clock.advance(max(0.0, gate_of(slot).send_at(clock.now) - clock.now))
        lease = await take(throttle)
        lease.observe(latency=0.001, status=200)
        lease.release()
    return clock.now - start


@pytest.mark.parametrize("increase", [0.5, 1.0, 3.0])
async def test_aimd_rate_grows_by_increase_per_second_of_success(increase: float) -> None:
    clock, throttle = fake(policy=AIMDPolicy(increase=increase, start_rate=1.0))
    slot = throttle.slot(KEY)
    assert slot.delay == 1.0
    checkpoints = []
    for _ in range(3):
        elapsed = await aimd_run(throttle, clock, 5.0)
        checkpoints.append((elapsed, 1.0 / slot.delay))
    total = 0.0
    for elapsed, rate in checkpoints:
        total += elapsed
        assert rate == pytest.approx(1.0 + increase * total, rel=0.1)


async def test_aimd_decreases_multiplicatively_once_per_burst() -> None:
    clock, throttle = fake(policy=AIMDPolicy(increase=1.0, decrease=0.5, start_rate=1.0))
    slot = throttle.slot(KEY)
    await aimd_run(throttle, clock, 10.0)
    before = slot.delay
    assert 1.0 / before > 8.0
    leases = []
    for _ in range(5):
        clock.advance(max(0.0, gate_of(slot).send_at(clock.now) - clock.now))
        leases.append(await take(throttle))
    clock.advance(0.01)
    for lease in leases:
        lease.observe(latency=0.01, status=429)
    # The rate halved, once: the pace the first refused send kept, its gap
    # begun before the last answers lowered the delay a little (scheduling
    # rule 3; docs/recovery.md, "The refused pace").
    kept = leases[0].wire_gap
    assert before <= kept < 1.02 * before
    assert slot.delay == pytest.approx(kept / 0.5)
    snap = slot.snapshot()
    assert (snap.backoffs, snap.ignored_backoffs) == (1, 4)


@pytest.mark.parametrize("decrease", [0.25, 0.5, 0.9])
async def test_aimd_decrease_factor(decrease: float) -> None:
    _, throttle = fake(policy=AIMDPolicy(decrease=decrease, start_rate=2.0))
    lease = await take(throttle)
    lease.fail(TimeoutError())
    assert throttle.slot(KEY).delay == pytest.approx(0.5 / decrease)


async def test_aimd_only_200_increases_the_rate() -> None:
    clock, throttle = fake(policy=AIMDPolicy(start_rate=2.0))
    slot = throttle.slot(KEY)
    for status in (404, 500, 302, 304):
        lease = await take(throttle)
        lease.observe(latency=0.0, status=status)
        lease.release()
        assert slot.delay == 0.5
        clock.advance(0.5)


def test_aimd_hook_raises_the_rate_on_a_200_alone_and_never_from_no_delay() -> None:
    """The hook's own rule, as a policy built on it reads it: a status other than
    200 keeps the delay (the throttle keeps it too, which hides the hook's
    answer), and a delay of 0 (no pace to raise) stays 0, not a division by it."""
    policy = AIMDPolicy(increase=1.0)
    config = Throttle(policy=policy).slot(KEY).config
    for status in (404, 500, 302):
        assert policy.next_delay(0.5, Sample(0.01, status, 1), config) == 0.5
    assert policy.next_delay(0.5, Sample(0.01, 200, 1), config) == pytest.approx(1.0 / 2.5)
    assert policy.next_delay(0.0, Sample(0.01, 200, 1), config) == 0.0


async def test_a_policy_of_ones_own_sees_each_response_as_its_sample() -> None:
    """A policy the throttle has no step of its own for is asked through its hook
    with the whole sample: the latency, the status, the slot's requests in flight
    (this one included), no cache hit, the slot's state, the client's lag (0
    on a clock that is never late), and the slot's settings."""
    seen: list[tuple[Sample, SlotConfig]] = []

    class Recording(DelayPolicy):
        def next_delay(self, delay: float, sample: Sample, config: SlotConfig) -> float:
            seen.append((sample, config))
            return delay

    _, throttle = fake(policy=Recording(), start_delay=0.0)
    first, second = await take(throttle), await take(throttle)
    first.observe(latency=0.3, status=200)
    second.observe(latency=0.2, status=404)
    slot = throttle.slot(KEY)
    state = record_of(slot).pace.policy_state
    assert [sample for sample, _ in seen] == [
        Sample(0.3, 200, 2, False, state, 0.0),
        Sample(0.2, 404, 2, False, state, 0.0),
    ]
    assert all(config is slot.config for _, config in seen)


async def test_aimd_start_rate_defaults_to_start_delay() -> None:
    _, throttle = fake(start_delay=4.0, policy=AIMDPolicy())
    assert throttle.slot(KEY).delay == 4.0


# =================================================================================
# AdaptiveConcurrencyPolicy
# =================================================================================


async def simulate_host(
    policy: DelayPolicy, workers: int, service: float, *, seconds: float, max_concurrency: int = 16
) -> tuple[Throttle, list[tuple[float, float, float]]]:
    """Crawl a host of ``workers`` parallel workers, each ``service`` seconds per request.

    Plenty of clients want to send; the throttle alone decides the pace.
    Returns the throttle and, per response, (send time, limit, delay).
    """
    throttle = loop_throttle(start_delay=1.0, max_concurrency=max_concurrency, policy=policy)
    host = asyncio.Semaphore(workers)
    log: list[tuple[float, float, float]] = []
    t0 = now()
    stop = t0 + seconds
    slot = throttle.slot(KEY)

    async def client() -> None:
        while now() < stop:
            lease = await throttle.acquire(KEY)
            sent = now()
            async with host:
                await asyncio.sleep(service)
            lease.observe(latency=now() - sent, status=200)
            lease.release()
            log.append((sent - t0, record_of(slot).policy_state["limit"], slot.delay))

    async with bounded(seconds * 10):
        await asyncio.gather(*(client() for _ in range(2 * max_concurrency)))
    return throttle, log


@looptime
@pytest.mark.parametrize(
    ("workers", "service"),
    [
        (1, 0.2),
        (4, 0.1),
        (8, 0.2),
    ],
)
async def test_adaptive_concurrency_finds_the_host_capacity(workers: int, service: float) -> None:
    seconds = 60.0
    _, log = await simulate_host(AdaptiveConcurrencyPolicy(), workers, service, seconds=seconds)
    # Sends in the second half of the run only: requests still queued in the
    # throttle at the end go after it, and would count twice the time.
    late = [entry for entry in log if seconds / 2 <= entry[0] < seconds]
    limits = [limit for _, limit, _ in late]
    in_band = sum(1 for limit in limits if workers / 2 <= limit <= 2 * workers) / len(limits)
    delay = statistics.median(delay for _, _, delay in late)
    throughput = len(late) / (seconds / 2)
    capacity = workers / service
    assert in_band >= 0.75, f"limit near {workers} only {in_band:.0%} of the time"
    assert service / workers / 2 <= delay <= 2 * service / workers
    assert throughput >= 0.5 * capacity
    assert throughput <= capacity * 1.05  # nothing serves more than the host can


async def test_adaptive_concurrency_doubles_its_limit_until_the_first_queue() -> None:
    # Rounds of 8 responses at the no-load latency: 1, 2, 4, 8 (slow start).
    # max_delay=0: only the limit holds requests back.
    _, throttle = fake(start_delay=0.0, max_delay=0.0, policy=AdaptiveConcurrencyPolicy())
    slot = throttle.slot(KEY)
    state = record_of(slot).policy_state
    limits = []
    for _ in range(3):
        for _ in range(8):
            # As many in flight as the limit allows: the limit is what held it back.
            leases = [await take(throttle) for _ in range(int(state.get("limit", 1.0)))]
            leases[0].observe(latency=0.1, status=200)
            for lease in leases:
                lease.release()
        limits.append(state["limit"])
    assert limits == [2.0, 4.0, 8.0]
    # A round whose latencies all doubled: queued 8 * (1 - 0.1 / 0.2) = 4 > beta.
    # Back to the last limit without a queue, and additive steps from then on.
    for _ in range(8):
        lease = await take(throttle)
        lease.observe(latency=0.2, status=200)
        lease.release()
    assert state["limit"] == 4.0
    assert state["steady"] == 1.0
    for _ in range(8):
        lease = await take(throttle)
        lease.observe(latency=0.2, status=200)
        lease.release()
    assert state["limit"] == 3.5


@looptime
async def test_adaptive_concurrency_limit_is_capped() -> None:
    _, log = await simulate_host(
        AdaptiveConcurrencyPolicy(max_limit=3.0), workers=8, service=0.2, seconds=20.0
    )
    assert max(limit for _, limit, _ in log) <= 3.0
    _, log = await simulate_host(
        AdaptiveConcurrencyPolicy(), workers=8, service=0.2, seconds=20.0, max_concurrency=2
    )
    assert max(limit for _, limit, _ in log) <= 2.0


async def test_adaptive_concurrency_ignores_errors_and_cache_hits() -> None:
    clock, throttle = fake(start_delay=1.0, policy=AdaptiveConcurrencyPolicy(initial_limit=2.0))
    slot = throttle.slot(KEY)
    for status, headers in ((500, {}), (404, {}), (200, {"X-Cache": "HIT"})):
        lease = await take(throttle)
        lease.observe(latency=0.01, status=status, headers=headers)
        lease.release()
        assert record_of(slot).policy_state.get("limit", 2.0) == 2.0
        clock.advance(1.0)
    # Errors never lower the delay; the hit lowers it only through the share of
    # sends that reach the origin (docs/signals.md, "Caches"): one in three.
    assert slot.delay == pytest.approx(2.0 / 3.0)


def test_adaptive_concurrency_limit_hook_reads_no_limit_as_its_initial_one() -> None:
    """The hook a subclass and the throttle read the cap by: a slot with no limit
    yet, or a record's limit that is none at all (0 or below), has
    ``initial_limit``; a limit learned is the limit."""
    policy = AdaptiveConcurrencyPolicy(initial_limit=3.0)
    assert policy.in_flight_limit({}) == 3.0
    assert policy.in_flight_limit({"limit": 0.0}) == 3.0
    assert policy.in_flight_limit({"limit": -2.0}) == 3.0
    assert policy.in_flight_limit({"limit": 5.5}) == 5.5


def test_adaptive_concurrency_keeps_its_limit_at_exactly_beta_queued() -> None:
    """``beta`` is the most queued requests the limit stands: a round judged at
    exactly ``beta`` queued keeps the limit; only above it does the limit fall.
    A round of 4 at a limit of 4, no-load latency 0.875 s: a round's
    second-lowest latency of 1 s reads ``4 * (1 - 0.875 / 1) = 0.5`` queued
    (exact in binary), of 1.25 s 1.2 queued."""
    policy = AdaptiveConcurrencyPolicy(beta=0.5, base_decay=0.0, round_size=4)
    config = Throttle(policy=policy).slot(KEY).config
    for second, limit in ((1.0, 4.0), (1.25, 3.5)):
        state = {"limit": 4.0, "base": 0.875, "seen": 3.0, "low": 1.0, "second": 0.0}
        state["steady"] = 1.0  # past the slow start: the limit moves a step
        delay = policy.next_delay(1.0, Sample(second, 200, 4, state=state), config)
        assert (state["limit"], delay) == (limit, 0.875 / limit)


async def test_adaptive_concurrency_delay_is_the_no_load_latency_over_limit() -> None:
    policy = AdaptiveConcurrencyPolicy(initial_limit=4.0, ramp_up=None)
    _, throttle = fake(start_delay=1.0, policy=policy)
    lease = await take(throttle)
    lease.observe(latency=0.4, status=200)
    # First sample: no queue seen; the limit does not grow past what is in flight.
    assert record_of(throttle.slot(KEY)).policy_state["limit"] == 4.0
    assert throttle.slot(KEY).delay == pytest.approx(0.1)
    # A slow page does not slow the pace: the cap of 4 in flight holds the host.
    throttle.observe(KEY, latency=1.6, status=200)
    assert throttle.slot(KEY).delay == pytest.approx(0.4 * 1.001 / 4.0)
    assert record_of(throttle.slot(KEY)).in_flight_cap == 4


# =================================================================================
# validation
# =================================================================================


@pytest.mark.parametrize(
    ("build", "error", "names"),
    [
        (lambda: FixedDelayPolicy(-1.0), ValueError, ["delay"]),
        (lambda: FixedDelayPolicy(math.nan), ValueError, ["delay"]),
        (lambda: FixedDelayPolicy("1"), TypeError, ["delay"]),  # type: ignore[arg-type]
        (lambda: FixedRatePolicy(0.0), ValueError, ["per_second"]),
        (lambda: FixedRatePolicy(-2.0), ValueError, ["per_second"]),
        (lambda: FixedRatePolicy(math.inf), ValueError, ["per_second"]),
        (lambda: FixedRatePolicy(1.0, burst=0), ValueError, ["burst"]),
        (lambda: FixedRatePolicy(1.0, burst=1.5), TypeError, ["burst"]),  # type: ignore[arg-type]
        (lambda: FixedRatePolicy(1.0, burst=True), TypeError, ["burst"]),
        (lambda: AIMDPolicy(increase=0.0), ValueError, ["increase"]),
        (lambda: AIMDPolicy(decrease=0.0), ValueError, ["decrease"]),
        (lambda: AIMDPolicy(decrease=1.0), ValueError, ["decrease"]),
        (lambda: AIMDPolicy(decrease=1.5), ValueError, ["decrease"]),
        (lambda: AIMDPolicy(start_rate=-1.0), ValueError, ["start_rate"]),
        (lambda: AIMDPolicy(start_rate="fast"), TypeError, ["start_rate"]),  # type: ignore[arg-type]
        (lambda: AdaptiveConcurrencyPolicy(initial_limit=0.0), ValueError, ["initial_limit"]),
        (lambda: AdaptiveConcurrencyPolicy(alpha=-0.1), ValueError, ["alpha"]),
        (lambda: AdaptiveConcurrencyPolicy(beta=0.0), ValueError, ["beta"]),
        (lambda: AdaptiveConcurrencyPolicy(alpha=1.0, beta=0.5), ValueError, ["beta", "alpha"]),
        (lambda: AdaptiveConcurrencyPolicy(max_limit=0.0), ValueError, ["max_limit"]),
        (lambda: AdaptiveConcurrencyPolicy(base_decay=1.0), ValueError, ["base_decay"]),
        (lambda: AdaptiveConcurrencyPolicy(base_decay=-0.1), ValueError, ["base_decay"]),
        (lambda: AdaptiveConcurrencyPolicy(alpha=0.5, beta=0.5), ValueError, ["beta", "alpha"]),
        (lambda: AdaptiveConcurrencyPolicy(step=0.0), ValueError, ["step"]),
        (lambda: AdaptiveConcurrencyPolicy(round_size=0), ValueError, ["round_size"]),
        (lambda: AdaptiveConcurrencyPolicy(ramp_up=0.0), ValueError, ["ramp_up"]),
        (lambda: FixedRatePolicy(1.0, windows=5), TypeError, ["windows"]),  # type: ignore[arg-type]
        (lambda: FixedRatePolicy(1.0, windows="10/s"), TypeError, ["windows"]),  # type: ignore[arg-type]
        (lambda: FixedRatePolicy(1.0, windows=[(0, 60.0)]), ValueError, ["windows count"]),
        (lambda: FixedRatePolicy(1.0, windows=[(10, 0.0)]), ValueError, ["windows seconds"]),
    ],
)
def test_invalid_policy_arguments_raise_naming_the_parameter(
    build: Callable[[], object], error: type[Exception], names: list[str]
) -> None:
    """The message begins with the parameter it is about (a whole word), and
    names any other it was checked against."""
    with pytest.raises(error) as info:
        build()
    message = str(info.value)
    assert message.startswith(f"{names[0]} "), message
    for name in names:
        assert re.search(rf"\b{name}\b", message), message


def test_throttle_rejects_a_policy_that_is_not_one() -> None:
    with pytest.raises(TypeError, match="policy"):
        Throttle(policy=FixedRatePolicy)  # type: ignore[arg-type]


def test_policies_have_a_readable_repr() -> None:
    assert repr(FixedDelayPolicy(0.5)) == "FixedDelayPolicy(delay=0.5)"
    assert repr(FixedRatePolicy(2.0, burst=3)) == "FixedRatePolicy(per_second=2.0, burst=3)"
    assert "increase=2.0" in repr(AIMDPolicy(increase=2.0))
    assert repr(AutoThrottlePolicy()) == "AutoThrottlePolicy()"
    # The defaults the docstrings state are the ones a policy is built with.
    assert repr(AIMDPolicy()) == "AIMDPolicy(increase=1.0, decrease=0.5, start_rate=None)"
    adaptive = AdaptiveConcurrencyPolicy()
    assert (adaptive.initial_limit, adaptive.alpha, adaptive.beta, adaptive.max_limit) == (
        1.0,
        0.1,
        0.4,
        256.0,
    )
    assert (adaptive.base_decay, adaptive.step, adaptive.round_size, adaptive.ramp_up) == (
        0.001,
        0.5,
        8,
        1.0,
    )

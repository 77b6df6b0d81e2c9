"""Per-host settings: ``Throttle(hosts={...})``.

The rules (docs/guide.md, "Policies", and :mod:`autothrottle._hosts`): a pattern is an exact host
or a glob; an exact host beats any glob; among matching globs the most
specific wins (most literal characters, then longest, then first given);
``*.example.com`` matches subdomains but not ``example.com``; a dict and a
:class:`HostSettings` are both accepted; unset fields inherit the throttle's;
bad input fails at construction naming ``hosts['pattern']`` and the setting.
The settings then really govern the slot: its delays, cap, jitter and policy.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from typing import Any

import pytest

from autothrottle import (
    AutoThrottlePolicy,
    FixedDelayPolicy,
    FixedRatePolicy,
    HostSettings,
    Lease,
    Throttle,
)
from helpers import bounded

TOL = 1e-5  # looptime's clock ticks in microseconds

# =================================================================================
# resolution
# =================================================================================


def start_delays(hosts: dict[str, Any], keys: list[str], **kwargs: Any) -> list[float]:
    throttle = Throttle(start_delay=5.0, hosts=hosts, **kwargs)
    return [throttle.config_for(key).start_delay for key in keys]


HOSTS: dict[str, Any] = {
    "api.example.com": {"start_delay": 1.0},
    "*.example.com": HostSettings(start_delay=2.0),
    "*.cdn.example.com": {"start_delay": 3.0},
    "img?.cdn.example.com": {"start_delay": 4.0},
    "*": {"start_delay": 9.0},
}


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("api.example.com", 1.0),  # exact beats every glob that matches too
        ("www.example.com", 2.0),
        ("a.b.example.com", 2.0),  # '*' spans dots
        ("static.cdn.example.com", 3.0),  # more specific than *.example.com
        ("img1.cdn.example.com", 4.0),  # more literal characters still
        ("img12.cdn.example.com", 3.0),  # '?' is one character
        ("example.com", 9.0),  # *.example.com needs a subdomain
        ("cdn.example.com", 2.0),  # *.cdn.example.com needs one too
        ("elsewhere.org", 9.0),
        ("API.Example.COM", 1.0),  # keys compare lowercase
    ],
)
def test_resolution(key: str, expected: float) -> None:
    assert start_delays(HOSTS, [key]) == [expected]


def test_resolution_does_not_depend_on_the_order_given() -> None:
    keys = ["api.example.com", "www.example.com", "img1.cdn.example.com", "x.cdn.example.com"]
    expected = start_delays(HOSTS, keys)
    rng = random.Random(0)
    for _ in range(10):
        items = list(HOSTS.items())
        rng.shuffle(items)
        assert start_delays(dict(items), keys) == expected


def test_without_a_match_the_throttle_settings_apply() -> None:
    throttle = Throttle(start_delay=5.0, max_delay=30.0, hosts={"*.example.com": {"min_delay": 1}})
    assert throttle.config_for("example.org") == throttle.config
    assert throttle.slot("example.org").delay == 5.0


def test_a_plain_glob_does_not_match_the_bare_domain() -> None:
    throttle = Throttle(start_delay=5.0, hosts={"*.example.com": {"start_delay": 1.0}})
    assert throttle.slot("example.com").delay == 5.0
    assert throttle.slot("www.example.com").delay == 1.0
    assert throttle.slot("wwwexample.com").delay == 5.0


def test_uppercase_patterns_match_lowercase_keys() -> None:
    throttle = Throttle(
        start_delay=5.0,
        hosts={"API.EXAMPLE.COM": {"start_delay": 1.0}, "*.Example.ORG": {"start_delay": 2.0}},
    )
    assert throttle.slot("api.example.com").delay == 1.0
    assert throttle.slot("www.example.org").delay == 2.0


def test_equally_specific_globs_first_given_wins() -> None:
    # Both match 'ab.example.com' with the same number of literal characters and length.
    first = {"a?.example.com": {"start_delay": 1.0}, "?b.example.com": {"start_delay": 2.0}}
    assert start_delays(first, ["ab.example.com"]) == [1.0]
    second = dict(reversed(list(first.items())))
    assert start_delays(second, ["ab.example.com"]) == [2.0]


def test_character_class_globs() -> None:
    hosts = {"node[0-9].example.com": {"start_delay": 1.0}}
    assert start_delays(hosts, ["node3.example.com", "nodex.example.com"]) == [1.0, 5.0]


def test_hosts_work_with_urls_through_key_for() -> None:
    throttle = Throttle(start_delay=5.0, hosts={"*.example.com": {"start_delay": 1.0}})
    key = throttle.key_for("https://WWW.Example.com:8443/path?q=1")
    assert throttle.slot(key).delay == 1.0


# =================================================================================
# merging
# =================================================================================


def test_dict_and_host_settings_are_equivalent() -> None:
    values: dict[str, Any] = {
        "start_delay": 0.5,
        "min_delay": 0.25,
        "max_delay": 10.0,
        "target_concurrency": 2.0,
        "max_concurrency": 3,
        "jitter": 0.1,
        "policy": FixedDelayPolicy(0.75),
    }
    a = Throttle(hosts={"a.test": values}).config_for("a.test")
    b = Throttle(hosts={"a.test": HostSettings(**values)}).config_for("a.test")
    assert a == b
    assert (a.start_delay, a.min_delay, a.max_delay) == (0.5, 0.25, 10.0)
    assert (a.target_concurrency, a.max_concurrency, a.jitter) == (2.0, 3, 0.1)
    assert a.policy is values["policy"]


def test_unset_fields_inherit_the_throttle_settings() -> None:
    policy = AutoThrottlePolicy()
    throttle = Throttle(
        start_delay=3.0,
        max_delay=40.0,
        min_delay=0.5,
        target_concurrency=2.0,
        max_concurrency=6,
        jitter=0.2,
        policy=policy,
        hosts={"a.test": {"max_concurrency": 1}, "b.test": HostSettings(), "c.test": {}},
    )
    config = throttle.config_for("a.test")
    assert config.max_concurrency == 1
    assert (config.start_delay, config.max_delay, config.min_delay) == (3.0, 40.0, 0.5)
    assert (config.target_concurrency, config.jitter, config.policy) == (2.0, 0.2, policy)
    assert throttle.config_for("b.test") == throttle.config
    assert throttle.config_for("c.test") == throttle.config


def test_per_host_policy_sets_the_burst() -> None:
    throttle = Throttle(hosts={"api.test": {"policy": FixedRatePolicy(2.0, burst=4)}})
    assert throttle.config_for("api.test").burst == 4
    assert throttle.config_for("other.test").burst == 1


# =================================================================================
# validation
# =================================================================================


@pytest.mark.parametrize(
    ("hosts", "error", "fragments"),
    [
        ({"a.test": {"start_dely": 1.0}}, ValueError, ["hosts['a.test']", "start_dely"]),
        ({"a.test": {"delay": 1.0, "jitter": 0.1}}, ValueError, ["hosts['a.test']", "delay"]),
        ({"*.a.test": {"max_delay": -1.0}}, ValueError, ["hosts['*.a.test']", "max_delay"]),
        ({"a.test": {"max_delay": 0.1, "min_delay": 1.0}}, ValueError, ["a.test", "max_delay"]),
        ({"a.test": {"jitter": 1.5}}, ValueError, ["hosts['a.test']", "jitter"]),
        ({"a.test": {"start_delay": "1"}}, TypeError, ["hosts['a.test']", "start_delay"]),
        ({"a.test": {"start_delay": math.nan}}, ValueError, ["hosts['a.test']", "start_delay"]),
        (
            {"a.test": {"target_concurrency": 0}},
            ValueError,
            ["hosts['a.test']", "target_concurrency"],
        ),
        (
            {"a.test": {"max_concurrency": 0}},
            ValueError,
            ["hosts['a.test']", "max_concurrency"],
        ),
        (
            {"a.test": {"max_concurrency": 2.5}},
            TypeError,
            ["hosts['a.test']", "max_concurrency"],
        ),
        ({"a.test": {"policy": "fixed"}}, TypeError, ["hosts['a.test']", "policy"]),
        ({"a.test": HostSettings(jitter=-0.1)}, ValueError, ["hosts['a.test']", "jitter"]),
        ({"a.test": 5}, TypeError, ["hosts['a.test']"]),
        ({"a.test": None}, TypeError, ["hosts['a.test']"]),
        ({"": {"start_delay": 1.0}}, TypeError, ["hosts"]),
        ({5: {"start_delay": 1.0}}, TypeError, ["hosts"]),
    ],
    ids=repr,
)
def test_bad_hosts_raise_naming_the_pattern_and_setting(
    hosts: dict[Any, Any], error: type[Exception], fragments: list[str]
) -> None:
    with pytest.raises(error) as info:
        Throttle(hosts=hosts)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


@pytest.mark.parametrize("hosts", [[("a.test", {})], "a.test", 5])
def test_hosts_must_be_a_mapping(hosts: object) -> None:
    with pytest.raises(TypeError, match="hosts"):
        Throttle(hosts=hosts)  # type: ignore[arg-type]


# =================================================================================
# the settings govern the slot
# =================================================================================

looptime = pytest.mark.looptime


def now() -> float:
    return asyncio.get_running_loop().time()


async def crawl(
    throttle: Throttle, key: str, count: int, *, hold: float, latency: float
) -> tuple[list[float], int]:
    """``count`` concurrent requests, each holding its lease ``hold`` seconds.

    Returns the grant times and the most leases seen in flight at once.
    """
    times: list[float] = []
    active = 0
    peak = 0

    async def one() -> None:
        nonlocal active, peak
        lease: Lease = await throttle.acquire(key)
        times.append(now())
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(hold)
        lease.observe(latency=latency, status=200)
        active -= 1
        lease.release()

    async with bounded():
        await asyncio.gather(*(one() for _ in range(count)))
    return times, peak


@looptime
async def test_per_host_cap_applies_to_its_slot_only() -> None:
    throttle = Throttle(
        clock=now,
        policy=AutoThrottlePolicy(),
        start_delay=0.0,
        max_concurrency=8,
        hosts={"*.capped.test": {"max_concurrency": 2}},
    )
    capped, other = await asyncio.gather(
        crawl(throttle, "a.capped.test", 10, hold=1.0, latency=0.0),
        crawl(throttle, "free.test", 10, hold=1.0, latency=0.0),
    )
    assert capped[1] == 2
    assert other[1] == 8
    # Two at a time, a second each: five rounds.
    assert max(capped[0]) - min(capped[0]) == pytest.approx(4.0, abs=TOL)


@looptime
async def test_per_host_policy_applies_to_its_slot_only() -> None:
    throttle = Throttle(
        clock=now,
        policy=AutoThrottlePolicy(),
        start_delay=1.0,
        max_concurrency=50,
        hosts={"rate.test": {"policy": FixedRatePolicy(10.0)}},
    )
    fixed, _ = await crawl(throttle, "rate.test", 20, hold=0.0, latency=3.0)
    gaps = [b - a for a, b in itertools.pairwise(fixed)]
    assert gaps == pytest.approx([0.1] * 19, abs=TOL)  # the latency does not matter
    assert throttle.slot("rate.test").delay == 0.1
    await crawl(throttle, "auto.test", 3, hold=0.0, latency=3.0)
    assert throttle.slot("auto.test").delay == 3.0  # Scrapy's rule: target 3 > (1 + 3) / 2


def test_per_host_max_delay_caps_backoffs() -> None:
    throttle = Throttle(
        start_delay=1.0, clock=lambda: 1000.0, hosts={"slow.test": {"max_delay": 3.0}}
    )
    for key in ("slow.test", "fast.test"):
        for _ in range(4):
            # A block seen on a request sent now, not before the last backoff: it counts.
            assert throttle.backoff(key, sent_at=1000.0)
    assert throttle.slot("slow.test").delay == 3.0
    assert throttle.slot("fast.test").delay == 16.0


async def test_per_host_min_and_max_delay_bound_the_slot() -> None:
    throttle = Throttle(
        policy=AutoThrottlePolicy(),
        start_delay=1.0,
        hosts={"slow.test": {"max_delay": 3.0, "min_delay": 0.5}},
    )
    for key in ("slow.test", "fast.test"):
        for latency in (10.0, 0.0, 0.0, 0.0, 0.0, 0.0):
            throttle.observe(key, latency=latency, status=200)
    # 10 s of latency: capped at 3 for slow.test; then halving, floored at 0.5.
    assert throttle.slot("slow.test").delay == 0.5
    assert throttle.slot("fast.test").delay == pytest.approx(10.0 / 2**5)
    throttle.observe("slow.test", latency=10.0, status=200)
    assert throttle.slot("slow.test").delay == 3.0


@looptime
async def test_per_host_jitter_applies_to_its_slot() -> None:
    throttle = Throttle(
        clock=now,
        policy=AutoThrottlePolicy(),
        start_delay=1.0,
        max_concurrency=100,
        rng=random.Random(5),
        hosts={"jitter.test": {"jitter": 0.5}},
    )
    jittered, _ = await crawl(throttle, "jitter.test", 30, hold=0.0, latency=1.0)
    steady, _ = await crawl(throttle, "steady.test", 10, hold=0.0, latency=1.0)
    gaps = [b - a for a, b in itertools.pairwise(jittered)]
    assert all(0.5 - TOL <= gap <= 1.5 + TOL for gap in gaps)
    assert max(gaps) - min(gaps) > 0.3  # it really varies
    steady_gaps = [b - a for a, b in itertools.pairwise(steady)]
    assert steady_gaps == pytest.approx([1.0] * 9, abs=TOL)


def test_unicode_host_patterns_match_their_idna_keys() -> None:
    throttle = Throttle(
        start_delay=5.0,
        hosts={"bücher.example": {"start_delay": 1.0}, "*.bücher.example": {"start_delay": 2.0}},
    )
    assert throttle.slot(throttle.key_for("http://Bücher.example/")).delay == 1.0
    assert throttle.slot(throttle.key_for("http://www.bücher.example/")).delay == 2.0

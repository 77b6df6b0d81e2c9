"""The usual response's fast path agrees with the rules, field for field.

A lease's response goes to ``LiveSlot.respond`` in one call when it is the
usual one (a 2xx/3xx with no header the rules read, no listener, no cache:
``_turns.Plain``), and to the rules otherwise; the rules are the spec. Two
throttles with the same settings and the same injected clock are driven by
the same random requests: one answers the usual responses by the fast path,
the other has a listener, which sends every response to the rules; a
response released as it is observed is released in the same step by the first
(``Lease.finish``), after it by the second. After each step the two slots'
whole state (the record, the gate's and the wire's memory, the cap, in
flight, the next send time) must be the same.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autothrottle import (
    AdaptiveConcurrencyPolicy,
    AIMDPolicy,
    AutoThrottlePolicy,
    FixedDelayPolicy,
    FixedRatePolicy,
    Lease,
    Throttle,
)
from autothrottle._lease import lease_at
from autothrottle._policies import usual_step
from autothrottle._slot import LiveSlot
from autothrottle.policy import Sample, SlotConfig
from helpers import FakeClock

KEY = "example.com"


class OwnAdaptive(AdaptiveConcurrencyPolicy):
    """A user's subclass: its own hooks are asked with a sample (no shipped step)."""

    __slots__ = ()

    def next_delay(self, delay: float, sample: Sample, config: SlotConfig) -> float:
        return super().next_delay(delay, sample, config) * 1.5


POLICIES = {
    "own adaptive": lambda: OwnAdaptive(round_size=2),
    "adaptive": lambda: AdaptiveConcurrencyPolicy(round_size=2),
    "adaptive, no ramp": lambda: AdaptiveConcurrencyPolicy(ramp_up=None, round_size=3),
    "autothrottle": AutoThrottlePolicy,
    "aimd": lambda: AIMDPolicy(increase=2.0),
    "fixed rate": lambda: FixedRatePolicy(20.0),
    "fixed delay": lambda: FixedDelayPolicy(0.05),
}

SHIPPED_STEPS: dict[type, Any] = {
    AdaptiveConcurrencyPolicy: AdaptiveConcurrencyPolicy,
    AutoThrottlePolicy: AutoThrottlePolicy,
    FixedDelayPolicy: lambda: FixedDelayPolicy(0.05),
    FixedRatePolicy: lambda: FixedRatePolicy(20.0),
}
"""The shipped policies that answer the usual response without a sample."""

HEADERS: list[dict[str, str] | None] = [
    None,
    {},
    {"Server": "x", "Content-Type": "text/html"},
    {"Content-Type": "text/html", "Date": "Sat, 22 Nov 2025 05:00:00 GMT"},
    {"Retry-After": "1"},
    {"X-Cache": "HIT"},
    {"Age": "30"},
    {"RateLimit-Limit": "10", "RateLimit-Remaining": "4", "RateLimit-Reset": "2"},
]

STATUSES = [200, 200, 200, 200, 204, 301, 302, 304, 404, 429, 500, 503, 101]

settings_ = st.fixed_dictionaries(
    {
        "policy": st.sampled_from(sorted(POLICIES)),
        "start_delay": st.sampled_from([0.0, 0.01, 0.2, 1.0]),
        "min_delay": st.sampled_from([0.0, 0.0, 0.005]),
        "max_delay": st.sampled_from([0.0, 0.5, 60.0]),
        "max_concurrency": st.sampled_from([1, 4, 64]),
        "strict_scrapy": st.booleans(),
    }
).filter(lambda config: config["max_delay"] >= config["min_delay"])

step = st.one_of(
    st.tuples(st.just("send"), st.floats(0.0, 0.5), st.booleans()),
    st.tuples(
        st.just("answer"),
        st.integers(0, 7),
        st.floats(0.0, 0.3),
        st.sampled_from(STATUSES),
        st.integers(0, len(HEADERS) - 1),
        st.sampled_from([None, None, None, False, True]),
        st.booleans(),
    ),
    st.tuples(st.just("release"), st.integers(0, 7)),
    st.tuples(st.just("fail"), st.integers(0, 7)),
    st.tuples(st.just("wait"), st.floats(0.0, 5.0)),
)


def _slots(obj: object) -> dict[str, Any]:
    """Every slot attribute of ``obj`` (and its bases) that is set."""
    out: dict[str, Any] = {}
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if name != "__weakref__" and hasattr(obj, name):
                out[name] = getattr(obj, name)
    return out


def _whole_state(throttle: Throttle, clock: FakeClock) -> dict[str, Any]:
    live = throttle._live(KEY)
    gate = live.gate
    now = clock()
    arrivals = gate.arrivals
    return {
        "record": live.state.to_dict(now),
        "ramp_to": live.state.pace.ramp_to,
        "adjusted_at": live.state.pace.adjusted_at,
        "policy_state": dict(live.state.pace.policy_state),
        "cap": gate.cap(),
        "in_flight": gate.in_flight(),
        "send_at": gate.send_at(now),
        "lead": gate.lead,
        "last_send": gate.last_send,
        "arrivals": None if arrivals is None else _slots(arrivals),
    }


def _pair(config: dict[str, Any]) -> tuple[FakeClock, Throttle, Throttle]:
    clock = FakeClock()
    made = []
    for _ in range(2):
        kwargs = dict(config)
        kwargs["policy"] = POLICIES[config["policy"]]()
        made.append(Throttle(clock=clock, wall_clock=clock.wall, **kwargs))
    fast, spec = made
    spec.listen(lambda event: None)  # a listener: every response goes to the rules
    return clock, fast, spec


def _answer(leases: list[Lease], index: int, op: tuple[Any, ...], *, finish: bool) -> None:
    """Observe a response; released with it: in one step (``finish``), or after it."""
    _, _, latency, status, headers, from_cache, release = op
    lease = leases[index]
    if release and finish:
        lease.finish(latency, status, HEADERS[headers], from_cache)
        leases.remove(lease)
        return
    lease.observe(latency=latency, status=status, headers=HEADERS[headers], from_cache=from_cache)
    if release:
        lease.release()
        leases.remove(lease)


@settings(max_examples=300, deadline=None)
@given(settings_, st.lists(step, max_size=60))
def test_the_fast_path_and_the_rules_leave_the_same_state(
    config: dict[str, Any], steps: list[tuple[Any, ...]]
) -> None:
    # The fast throttle's finished responses are released with them (``finish``),
    # the spec's after them (``observe``, then ``release``).
    clock, fast, spec = _pair(config)
    open_leases: list[list[Lease]] = [[], []]
    for op in steps:
        kind = op[0]
        if kind == "wait":
            clock.advance(op[1])
        elif kind == "send":
            clock.advance(op[1])
            got = [t.try_acquire(KEY, adjust=op[2]) for t in (fast, spec)]
            assert (got[0] is None) == (got[1] is None)
            for leases, lease in zip(open_leases, got, strict=True):
                if lease is not None:
                    leases.append(lease)
        elif open_leases[0]:
            index = op[1] % len(open_leases[0])
            for leases, finish in zip(open_leases, (True, False), strict=True):
                if kind == "answer":
                    clock.advance(op[2])
                    _answer(leases, index, op, finish=finish)
                    clock.advance(-op[2])  # both throttles answer at the same moment
                elif kind == "fail":
                    leases[index].fail(ConnectionError("reset"))
                else:
                    leases.pop(index).release()
            if kind == "answer":
                clock.advance(op[2])
        assert _whole_state(fast, clock) == _whole_state(spec, clock)


def test_the_usual_response_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without this the test above could pass with the fast path never taken."""
    clock = FakeClock()
    throttle = Throttle(start_delay=0.0, clock=clock, wall_clock=clock.wall)
    headers = {"Server": "x", "Content-Type": "text/html"}
    # Header names never seen are looked up by the rules once (then remembered
    # as read by none): a first response makes the test independent of order.
    throttle.observe("warm.example", latency=0.01, status=200, headers=headers)
    taken: list[int] = []
    respond = LiveSlot.respond

    def spy(self: LiveSlot, *args: Any) -> None:
        taken.append(args[1])
        respond(self, *args)

    monkeypatch.setattr(LiveSlot, "respond", spy)
    for status, header in [(200, headers), (204, None), (301, headers), (429, headers)]:
        lease = throttle.try_acquire(KEY)
        assert lease is not None
        lease.observe(latency=0.01, status=status, headers=header)
        lease.release()
        clock.advance(2.0)
    assert taken == [200, 204, 301]
    for header, status, from_cache in [
        ({"Retry-After": "1"}, 200, None),
        (headers, 304, None),
        (headers, 200, True),
    ]:
        lease = throttle.try_acquire(KEY)
        assert lease is not None
        lease.observe(latency=0.01, status=status, headers=header, from_cache=from_cache)
        lease.release()
        clock.advance(2.0)
    assert taken == [200, 204, 301]
    stop = throttle.listen(lambda event: None)
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    lease.observe(latency=0.01, status=200, headers=headers)
    lease.release()
    assert taken == [200, 204, 301]
    stop()
    clock.advance(2.0)
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    lease.observe(latency=0.01, status=200, headers=headers)
    assert taken == [200, 204, 301]  # a slot that saw a cache hit goes to the rules
    other = throttle.try_acquire("other.example")
    assert other is not None
    other.observe(latency=0.01, status=200, headers=headers)
    assert taken == [200, 204, 301, 200]
    assert math.isfinite(throttle.slot(KEY).delay)


@pytest.mark.parametrize("adjust", [True, False])
def test_a_grants_lease_is_the_lease_its_class_makes(adjust: bool) -> None:
    """The gate's grant makes its lease without calling the class (``lease_at``):
    every field as ``Lease(...)`` sets it."""
    clock = FakeClock()
    throttle = Throttle(start_delay=0.0, clock=clock, wall_clock=clock.wall)
    live = throttle._live(KEY)
    reporter = object()
    made = lease_at(live, reporter, 30.0, adjust, 5.0)  # type: ignore[arg-type]
    spec = Lease(live, reporter, 5.0, 35.0, adjust)  # type: ignore[arg-type]
    assert type(made) is Lease
    assert _slots(made) == _slots(spec)
    assert set(_slots(spec)) == set(Lease.__slots__) - {"__weakref__"}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_shipped_step_is_taken_only_for_the_shipped_class(name: str) -> None:
    """The usual response's step without a sample is a shipped policy's own rule:
    never a subclass's, nor one whose hook was replaced on the instance."""
    policy = POLICIES[name]()
    shipped = type(policy) in SHIPPED_STEPS
    by_hooks = usual_step(AIMDPolicy())
    assert (usual_step(policy) is not by_hooks) is shipped
    policy.next_delay = lambda delay, sample, config: delay  # type: ignore[method-assign]
    assert usual_step(policy) is by_hooks


@pytest.mark.parametrize("kind", SHIPPED_STEPS)
@pytest.mark.parametrize("hook", ["next_delay", "in_flight_limit"])
def test_a_shipped_class_whose_hook_was_patched_is_asked_through_it(
    kind: type, hook: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hook patched on a shipped class (a test's monkeypatch, say) is the rule
    from then on: a slot made after it asks the hooks, not the shipped step."""
    by_hooks = usual_step(AIMDPolicy())
    policy = SHIPPED_STEPS[kind]()
    assert usual_step(policy) is not by_hooks
    original = getattr(kind, hook)
    monkeypatch.setattr(kind, hook, lambda self, *args: original(self, *args))
    assert usual_step(policy) is by_hooks


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(POLICIES)),
    st.lists(
        st.tuples(
            st.floats(0.0, 2.0),
            st.sampled_from([200, 200, 204, 304, 429]),
            st.booleans(),
            st.integers(0, 70),
            st.floats(0.0, 0.01),
        ),
        max_size=40,
    ),
    st.sampled_from([1, 4, 64]),
)
def test_a_shipped_step_answers_as_its_hooks(
    name: str, samples: list[tuple[float, int, bool, int, float]], cap: int
) -> None:
    """Step by step, the step's (delay, limit) is next_delay's and in_flight_limit's,
    and it leaves the policy's memory as they do."""
    policy = POLICIES[name]()
    step = usual_step(policy)
    config = SlotConfig(0.1, 0.0, 60.0, 2.0, cap, 0.0, policy)
    by_step: dict[str, float] = {}
    by_hooks: dict[str, float] = {}
    delay_step = delay_hooks = 0.1
    for latency, status, cache_hit, in_flight, lag in samples:
        load = _Load(in_flight, lag)
        delay_step, limit = step(
            policy, delay_step, latency, status, cache_hit, load, 1.0, by_step, config
        )
        sample = Sample(latency, status, in_flight, cache_hit, by_hooks, lag)
        delay_hooks = policy.next_delay(delay_hooks, sample, config)
        assert delay_step == delay_hooks
        assert limit == policy.in_flight_limit(by_hooks)
        assert by_step == by_hooks


class _Load:
    """A gate's count and lag as a step reads them (``_policies.Load``)."""

    def __init__(self, in_flight: int, lag: float) -> None:
        self.in_flight = in_flight
        self.lag = lag

    def in_flight_at(self, now: float) -> int:
        return self.in_flight


def test_a_cap_changed_elsewhere_is_set_again_by_the_next_usual_response() -> None:
    """The usual response skips the cache's cap when the policy's limit and the
    cap are what it last left (the same two give the same cap); a cap another
    writer changed (a loaded or shared record) is set again, as the rules do."""
    config = {"policy": "adaptive", "start_delay": 0.0, "min_delay": 0.0, "max_delay": 60.0}
    clock, fast, spec = _pair({**config, "max_concurrency": 64, "strict_scrapy": False})
    for _ in range(6):
        for throttle in (fast, spec):
            lease = throttle.try_acquire(KEY)
            assert lease is not None
            lease.finish(0.05, 200, None)
        clock.advance(1.0)
    caps = [throttle._live(KEY).gate.cap() for throttle in (fast, spec)]
    assert caps[0] == caps[1] > 1
    for throttle in (fast, spec):
        throttle._live(KEY).state.cache.in_flight_cap = 1  # another writer's
        lease = throttle.try_acquire(KEY)
        assert lease is not None
        lease.finish(0.05, 200, None)
    assert [throttle._live(KEY).gate.cap() for throttle in (fast, spec)] == caps

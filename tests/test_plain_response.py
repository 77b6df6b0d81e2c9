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

The step a shipped policy answers the usual response with (``usual_step``, the
very rule its ``next_delay`` runs) is checked against each policy's rule as
the documents state it, written here from their words (``AdaptiveRule``):
comparing the step with its own hooks would compare a rule with itself.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given, settings
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
from autothrottle._policies import _Sampled, usual_step
from autothrottle._slot import LiveSlot
from autothrottle.policy import DelayPolicy, Sample, SlotConfig
from helpers import FakeClock, slot_fields

KEY = "example.com"


class OwnAdaptive(AdaptiveConcurrencyPolicy):
    """A user's subclass: its own hooks are asked with a sample (no shipped step)."""

    __slots__ = ()

    def next_delay(self, delay: float, sample: Sample, config: SlotConfig) -> float:
        return super().next_delay(delay, sample, config) * 1.5


POLICIES: dict[str, Callable[[], DelayPolicy]] = {
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


def _max_not_below_min(config: dict[str, Any]) -> bool:
    return bool(config["max_delay"] >= config["min_delay"])


settings_: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {
        "policy": st.sampled_from(sorted(POLICIES)),
        "start_delay": st.sampled_from([0.0, 0.01, 0.2, 1.0]),
        "min_delay": st.sampled_from([0.0, 0.0, 0.005]),
        "max_delay": st.sampled_from([0.0, 0.5, 60.0]),
        "max_concurrency": st.sampled_from([1, 4, 64]),
        "strict_scrapy": st.booleans(),
    }
).filter(_max_not_below_min)

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
        "arrivals": None if arrivals is None else slot_fields(arrivals),
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
    assert slot_fields(made) == slot_fields(spec)
    assert set(slot_fields(spec)) == set(Lease.__slots__) - {"__weakref__"}


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


# -- the shipped steps against their documented rules ----------------------------------


class AdaptiveRule:
    """:class:`AdaptiveConcurrencyPolicy`'s rule as its documentation states it
    (its docstring, in docs/reference/api.md; docs/signals.md, "In-flight cap"
    and "The client's own lag"; docs/guide.md, "Policies"), written from those
    words, not from the code, with its own memory: the shipped step must answer
    as it does.

    Where the documents are silent the code's choice is taken, each marked
    "not in the docs" below.
    """

    def __init__(self, policy: AdaptiveConcurrencyPolicy, config: SlotConfig) -> None:
        self.policy = policy
        self.cap = min(policy.max_limit, config.max_concurrency)  # "max_concurrency also caps"
        self.limit = policy.initial_limit  # "Concurrency estimate of a new slot"
        self.base: float | None = None  # the lowest latency seen (none yet)
        self.round: list[float] = []  # the latencies of the round so far
        self.steady = False  # until the first round above beta: the slow start

    def memory(self) -> dict[str, float]:
        """The same memory as the policy keeps it (``Sample.state``, a slot's
        saved ``policy_state``): a previous state handed to both."""
        lows = sorted(self.round)
        state = {"limit": self.limit, "seen": float(len(lows)), "steady": float(self.steady)}
        if self.base is not None:
            state["base"] = self.base
        state["low"] = lows[0] if lows else 0.0  # 0: none
        state["second"] = lows[1] if len(lows) > 1 else 0.0
        return state

    def answer(
        self, delay: float, latency: float, status: int, cache_hit: bool, in_flight: int, lag: float
    ) -> tuple[float, float]:
        """The next delay and the in-flight limit after one response."""
        policy = self.policy
        # The latency of a 200 is the policy's; a hit never teaches it (guide,
        # "Signals"). Not in the docs: a latency of 0 (none measured) neither.
        if status != 200 or cache_hit or latency <= 0.0:
            return delay, self.limit
        # "the lowest latency seen (the no-load latency, slowly forgotten)",
        # base_decay being the "per-sample factor by which [it] is forgotten".
        if self.base is None:
            self.base = latency
        else:
            self.base = min(latency, self.base * (1.0 + policy.base_decay))
        self.round.append(latency)
        # round_size: "Responses per round at least (more when the limit is higher)".
        if len(self.round) >= max(policy.round_size, self.limit):
            self._judge(sorted(self.round), in_flight, lag)
            self.round = []
        # "the delay is the no-load latency over the limit"
        return self.base / self.limit, self.limit

    def _judge(self, lows: list[float], in_flight: int, lag: float) -> None:
        """Once per round: "It judges the round's second-lowest latency", and
        ``queued = limit * (1 - (base + lag) / round_min)`` (signals.md)."""
        policy = self.policy
        assert self.base is not None
        # Not in the docs: a round of one has no second, and shows no queue.
        queued = 0.0 if len(lows) < 2 else self.limit * (1.0 - (self.base + lag) / lows[1])
        # Not in the docs: the limit grows only while the slot uses it (one
        # request short of it in flight at least), so a slot that never fills
        # its limit does not raise it for nothing.
        if queued < policy.alpha and in_flight >= self.limit - 1.0:
            # "Under alpha queued it raises the limit by step ... Until the first
            # round above beta it doubles the limit instead"; "The largest limit
            # it will try (max_concurrency also caps)".
            grown = self.limit + policy.step if self.steady else self.limit * 2.0
            self.limit = min(grown, self.cap)
        elif queued > policy.beta:
            # "above beta it lowers it by step ... at that round goes back to the
            # last limit that showed no queue": the one before slow start's last
            # doubling, half. Not in the docs: never below 1.
            lowered = self.limit - policy.step if self.steady else self.limit / 2.0
            self.limit = max(lowered, 1.0)
            self.steady = True


def _autothrottle_rule(delay: float, latency: float, config: SlotConfig) -> float:
    """Scrapy's rule (docs/guide.md, "Policies"): ``target = latency /
    target_concurrency``, ``new = max(target, (delay + target) / 2)``, whatever
    the status (the rules keep a non-200 from lowering the delay, not the policy)."""
    target = latency / config.target_concurrency
    return max(target, (delay + target) / 2.0)


# Latencies near a no-load one of 50 ms, so that a round's judgment (and the
# lag's share in it) falls either side of alpha and beta; in-flight counts near
# the limits a slot reaches, so that "uses its limit" goes either way.
latencies = st.sampled_from([0.0, 0.05, 0.05, 0.055, 0.06, 0.07, 0.1, 0.2]) | st.floats(0.0, 2.0)
responses = st.lists(
    st.tuples(
        latencies,
        st.sampled_from([200, 200, 200, 200, 204, 304, 429, 503]),
        st.sampled_from([False, False, False, True]),
        st.integers(0, 10) | st.integers(0, 70),
        st.sampled_from([0.0, 0.0, 0.001, 0.01, 0.02]) | st.floats(0.0, 0.1),
    ),
    max_size=60,
)
adaptive_settings = st.fixed_dictionaries(
    {
        "initial_limit": st.sampled_from([1.0, 1.0, 2.0, 3.5, 8.0, 300.0]),
        "alpha_beta": st.sampled_from([(0.1, 0.4), (0.0, 0.5), (1.0, 3.0), (0.0, 0.01)]),
        "max_limit": st.sampled_from([256.0, 3.0, 16.0]),
        "base_decay": st.sampled_from([0.001, 0.0, 0.2]),
        "step": st.sampled_from([0.5, 1.0, 2.0]),
        "round_size": st.sampled_from([8, 1, 2, 3]),
    }
)
previous_states = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {
            "limit": st.sampled_from([1.0, 2.0, 5.0, 64.0, 500.0]) | st.floats(1.0, 100.0),
            "base": st.floats(0.001, 1.0),
            "round": st.lists(st.floats(0.001, 2.0), max_size=6),
            "steady": st.booleans(),
        }
    ),
)


def _config(policy: Any, max_concurrency: int, target: float = 1.0) -> SlotConfig:
    return SlotConfig(0.1, 0.0, 60.0, target, max_concurrency, 0.0, policy)


def _ok(
    latency: float, in_flight: int = 1, lag: float = 0.0
) -> tuple[float, int, bool, int, float]:
    return (latency, 200, False, in_flight, lag)


DEFAULTS = {
    "initial_limit": 1.0,
    "alpha_beta": (0.1, 0.4),
    "max_limit": 256.0,
    "base_decay": 0.001,
    "step": 0.5,
    "round_size": 2,
}
BOUNDS = [
    # Each judges a round of two at limit 1 (base 50.05 ms after the decay),
    # either side of one of the rule's bounds.
    [_ok(0.05), _ok(1.0)],  # the round's first is its lowest: the second is judged
    [_ok(0.05), _ok(0.0795)],  # 0.370 queued: between alpha and beta, kept
    [_ok(0.05), _ok(0.085)],  # 0.411: above beta, halved (to 1: no lower)
    [_ok(0.05), _ok(0.055)],  # 0.090: under alpha, doubled
    [_ok(0.05), _ok(0.0557)],  # 0.101: over alpha, kept
    [_ok(0.05, lag=0.02), _ok(0.07, lag=0.02)],  # a rise the lag explains: doubled
    [_ok(0.05, 0), _ok(0.05, 0)],  # in flight one short of the limit: doubled
    # slow start to 4, a queue (back to 2, steady), then a step up
    [*[_ok(0.05, 9)] * 4, _ok(0.05), _ok(0.2), _ok(0.2), _ok(0.2), *[_ok(0.05, 9)] * 2],
    [*[_ok(0.05, 3)] * 4, *[_ok(0.05, 2)] * 8],  # limit 4, 2 in flight: not used, kept
    [  # taught nothing: no latency, a 204, a 429, a hit
        _ok(0.05),
        _ok(0.0),
        (0.01, 204, False, 1, 0.0),
        (0.01, 429, False, 1, 0.0),
        (0.01, 200, True, 1, 0.0),
        _ok(0.06),
    ],
]


@settings(max_examples=1000, deadline=None)
@given(
    adaptive_settings,
    st.sampled_from([1, 4, 64]),
    previous_states,
    st.floats(0.0, 5.0),
    responses,
)
@example(DEFAULTS, 64, None, 1.0, BOUNDS[0])
@example(DEFAULTS, 64, None, 1.0, BOUNDS[1])
@example(DEFAULTS, 64, None, 1.0, BOUNDS[2])
@example(DEFAULTS, 64, None, 1.0, BOUNDS[3])
@example(DEFAULTS, 64, None, 1.0, BOUNDS[4])
@example(DEFAULTS, 64, None, 1.0, BOUNDS[5])
@example(DEFAULTS, 64, None, 1.0, BOUNDS[6])
@example(DEFAULTS, 64, None, 1.0, BOUNDS[7])
@example(DEFAULTS, 64, None, 1.0, BOUNDS[8])
@example(DEFAULTS, 64, None, 1.0, BOUNDS[9])
def test_the_adaptive_step_is_its_documented_rule(
    kwargs: dict[str, Any],
    max_concurrency: int,
    previous: dict[str, Any] | None,
    delay: float,
    samples: list[tuple[float, int, bool, int, float]],
) -> None:
    """Response by response, the shipped step (the usual response's one call)
    and ``next_delay``/``in_flight_limit`` give the documented rule's delay and
    limit, from a new slot or from a previous state."""
    kwargs = dict(kwargs)
    alpha, beta = kwargs.pop("alpha_beta")
    policy = AdaptiveConcurrencyPolicy(alpha=alpha, beta=beta, **kwargs)
    config = _config(policy, max_concurrency)
    step = usual_step(policy)
    assert step is not usual_step(AIMDPolicy())  # the shipped step, not the hooks
    rule = AdaptiveRule(policy, config)
    if previous is not None:
        rule.limit, rule.base, rule.steady = previous["limit"], previous["base"], previous["steady"]
        rule.round = previous["round"][: max(policy.round_size, math.ceil(rule.limit)) - 1]
    # A new slot's memory is empty; a previous state is handed to both.
    by_step = {} if previous is None else rule.memory()
    by_hooks = dict(by_step)
    delay_step = delay_hooks = delay
    for latency, status, cache_hit, in_flight, lag in samples:
        want = rule.answer(delay_step, latency, status, cache_hit, in_flight, lag)
        load = _Sampled(in_flight, lag)
        got = step(policy, delay_step, latency, status, cache_hit, load, 1.0, by_step, config)
        assert got == want
        sample = Sample(latency, status, in_flight, cache_hit, by_hooks, lag)
        delay_hooks = policy.next_delay(delay_hooks, sample, config)
        assert (delay_hooks, policy.in_flight_limit(by_hooks)) == want
        delay_step = got[0]
    assert by_step == by_hooks
    unset = {"limit": policy.initial_limit, "seen": 0.0, "steady": 0.0, "low": 0.0, "second": 0.0}
    assert {**unset, **by_step} == rule.memory()


def test_a_state_of_another_type_gives_the_adaptive_rule_what_a_dict_does() -> None:
    """The adaptive step reads a slot's dict by subscript; a state of another
    type handed to ``next_delay`` (a ``defaultdict``, whose subscript would make
    each key it misses) gives the same delays and ends with the same keys."""
    policy = AdaptiveConcurrencyPolicy(round_size=2)
    config = _config(policy, 64)
    plain: dict[str, float] = {}
    other: defaultdict[str, float] = defaultdict(float)
    answers = [(0.05, 429), (0.05, 200), (0.0, 200), (0.06, 200), (0.04, 200), (0.2, 200)]
    for latency, status in answers:
        want = policy.next_delay(1.0, Sample(latency, status, 1, False, plain), config)
        assert policy.next_delay(1.0, Sample(latency, status, 1, False, other), config) == want
        assert dict(other) == plain
    assert set(plain) >= {"limit", "base", "low", "second", "seen"}


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 60.0), st.sampled_from([1.0, 2.5, 8.0]), responses)
def test_the_other_shipped_steps_are_their_documented_rules(
    delay: float, target: float, samples: list[tuple[float, int, bool, int, float]]
) -> None:
    """AutoThrottle's step is Scrapy's rule; the fixed policies' are their
    delay and their rate's gap (docs/guide.md, "Policies"); none caps in flight."""
    rules: list[tuple[Any, Any]] = [
        (
            AutoThrottlePolicy(),
            lambda config, delay, latency: _autothrottle_rule(delay, latency, config),
        ),
        (FixedDelayPolicy(0.05), lambda config, delay, latency: 0.05),
        (FixedRatePolicy(20.0), lambda config, delay, latency: 1.0 / 20.0),
    ]
    for policy, rule in rules:
        config = _config(policy, 4, target)
        step = usual_step(policy)
        assert step is not usual_step(AIMDPolicy())
        state: dict[str, float] = {}
        now = delay
        for latency, status, cache_hit, in_flight, lag in samples:
            want = rule(config, now, latency)
            load = _Sampled(in_flight, lag)
            assert step(policy, now, latency, status, cache_hit, load, 1.0, state, config) == (
                want,
                None,
            )
            sample = Sample(latency, status, in_flight, cache_hit, state, lag)
            assert policy.next_delay(now, sample, config) == want
            assert policy.in_flight_limit(state) is None
            now = want
        assert state == {}


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

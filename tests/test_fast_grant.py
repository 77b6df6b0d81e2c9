"""The gate's short way for a plain slot is the general rules' answer for it.

``Gate._admit`` is the one home of the spacing rules and the grant. A slot with
nothing but the usual to space by (no window, a burst of 1, no jitter: a plain
grant; and no ramp in force) takes a short way through it: its delay's spacing
is written in rather than asked of ``Gate._paced_at``, and its grant asks
``Gate._grant_extras`` (a strict pace's due time, windows, a burst, a jitter,
a cost's tokens) only when it has a strict pace or a cost. Two throttles with
the same settings, the same injected clock and the same random sends, answers
(usual, refused, paused, a stated budget or pace), wire turns and releases:
one as shipped, the other's gates never taking the short way (every spacing
through ``_paced_at``, every grant through ``_grant_extras``, as a slot with a
window, a burst or a jitter has them). After each step the two slots' whole
state (the record, every field of the gate and its wire layer, the leases'
grant fields) must be the same, and the same requests granted.

The rules both ways share (a stated budget's and a sustained pace's gaps, the
begun gap, the lead) have one home, so this comparison cannot see them: the
lead's is tested below; the others' in ``test_signals.py``,
``test_pacing_rules.py`` and ``test_scheduling.py``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from autothrottle import (
    AdaptiveConcurrencyPolicy,
    AutoThrottlePolicy,
    FixedDelayPolicy,
    FixedRatePolicy,
    Lease,
    Throttle,
)
from autothrottle._gate import Gate
from autothrottle.store import MemoryStore, SlotState
from helpers import FakeClock, slot_fields

KEY = "example.com"


class GeneralGate(Gate):
    """A gate that never takes a plain slot's short way: its plain-grant flag
    reads False, whatever the settings say."""

    __slots__ = ()

    @property
    def _plain_grant(self) -> bool:
        return False

    @_plain_grant.setter
    def _plain_grant(self, value: bool) -> None:
        pass


POLICIES: dict[str, Callable[[], Any]] = {
    "adaptive": lambda: AdaptiveConcurrencyPolicy(round_size=2),
    "adaptive, no ramp": lambda: AdaptiveConcurrencyPolicy(ramp_up=None, round_size=3),
    "autothrottle": AutoThrottlePolicy,
    "fixed rate (strict)": lambda: FixedRatePolicy(20.0),
    "fixed rate, a burst": lambda: FixedRatePolicy(20.0, burst=3),
    "fixed rate, a window": lambda: FixedRatePolicy(50.0, windows=[(3, 1.0)]),
    "fixed delay": lambda: FixedDelayPolicy(0.05),
}

HEADERS: list[dict[str, str] | None] = [
    None,
    {"Content-Type": "text/html"},
    {"Retry-After": "1"},
    {"RateLimit-Limit": "10", "RateLimit-Remaining": "4", "RateLimit-Reset": "2"},
    {"RateLimit-Limit": "10", "RateLimit-Remaining": "0", "RateLimit-Reset": "3"},
    {"X-RateLimit-Limit": "100", "X-RateLimit-Remaining": "90", "X-RateLimit-Reset": "60"},
]

STATUSES = [200, 200, 200, 200, 204, 301, 404, 429, 503]


def _max_not_below_min(config: dict[str, Any]) -> bool:
    return bool(config["max_delay"] >= config["min_delay"])


settings_: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {
        "policy": st.sampled_from(sorted(POLICIES)),
        "start_delay": st.sampled_from([0.0, 0.01, 0.2, 1.0]),
        "min_delay": st.sampled_from([0.0, 0.0, 0.005]),
        "max_delay": st.sampled_from([0.5, 60.0]),
        "max_concurrency": st.sampled_from([1, 4, 64]),
        "jitter": st.sampled_from([0.0, 0.0, 0.0, 0.3]),
        "limits": st.sampled_from(["none", "none", "budget", "sustained", "both"]),
    }
).filter(_max_not_below_min)

LIMITS = {
    "none": {},
    "budget": {"budget_gap": 0.08, "budget_until": 1003.0},
    "sustained": {"sustained_gap": 0.05, "sustained_until": 1002.0},
    "both": {
        "budget_gap": 0.04,
        "budget_until": 1001.0,
        "sustained_gap": 0.07,
        "sustained_until": 1004.0,
    },
}
"""A record stated limits in force when it was loaded (the gate has no arrival
guard yet: the plain grant spaces by them until an answer makes one)."""

step = st.one_of(
    st.tuples(st.just("send"), st.floats(0.0, 0.5), st.booleans()),
    # A send at the moment the general gate says is due (or just before or after).
    st.tuples(st.just("due"), st.sampled_from([-1e-7, 0.0, 1e-7])),
    # A grant's way to the wire as the wire turns averaged it (a long one too).
    st.tuples(st.just("lead"), st.sampled_from([0.0, 0.001, 0.004, 0.03])),
    st.tuples(st.just("wire"), st.integers(0, 7), st.floats(0.0, 0.02)),
    st.tuples(
        st.just("answer"),
        st.integers(0, 7),
        st.floats(0.0, 0.3),
        st.sampled_from(STATUSES),
        st.integers(0, len(HEADERS) - 1),
        st.booleans(),
    ),
    st.tuples(st.just("release"), st.integers(0, 7)),
    st.tuples(st.just("wait"), st.floats(0.0, 5.0)),
)


_NOT_COMPARED = frozenset(
    {"lock", "clock", "state", "config", "_rng", "token_book", "_plain_grant"}
)
"""The gate's own objects (each throttle has its own; the record is compared
whole), and the flag the general gate reads as False."""


def _whole_state(throttle: Throttle, clock: FakeClock, leases: list[Lease]) -> dict[str, Any]:
    live = throttle._live(KEY)
    gate = live.gate
    fields = slot_fields(gate, _NOT_COMPARED)
    fields["_queue"] = len(fields["_queue"])
    fields["_holds"] = sorted(hold.sent_at for hold in fields["_holds"])
    arrivals = fields.get("arrivals")
    fields["arrivals"] = None if arrivals is None else slot_fields(arrivals)
    return {
        "record": live.state.to_dict(clock()),
        "ramp_to": live.state.pace.ramp_to,
        "adjusted_at": live.state.pace.adjusted_at,
        "gate": fields,
        "leases": [(lease.sent_at, lease.wire_gap, lease.expires_at) for lease in leases],
    }


def _pair(config: dict[str, Any]) -> tuple[FakeClock, Throttle, Throttle]:
    clock = FakeClock()
    made = []
    for _ in range(2):
        kwargs = dict(config)
        kwargs["policy"] = POLICIES[config["policy"]]()
        store = MemoryStore()
        limits = LIMITS[kwargs.pop("limits")]
        if limits:
            store.save(KEY, SlotState(delay=0.02, **limits))
        made.append(
            Throttle(
                clock=clock, wall_clock=clock.wall, rng=random.Random(7), store=store, **kwargs
            )
        )
    plain, general = made
    plain._live(KEY)  # both slots made at the same moment
    general._live(KEY).gate.__class__ = GeneralGate
    return clock, plain, general


@settings(max_examples=300, deadline=None)
@given(settings_, st.lists(step, max_size=60))
@example(  # the delay fell within a gap begun before: the gap keeps its start's delay
    {
        "policy": "autothrottle",
        "start_delay": 1.0,
        "min_delay": 0.0,
        "max_delay": 60.0,
        "max_concurrency": 4,
        "jitter": 0.0,
        "limits": "none",
    },
    [("send", 0.0, True), ("answer", 0, 0.1, 200, 1, False), ("due", -1e-7), ("due", 0.0)],
)
@example(  # the adaptive policy lowered the delay faster than the ramp-up lets it fall
    {
        "policy": "adaptive",
        "start_delay": 1.0,
        "min_delay": 0.0,
        "max_delay": 60.0,
        "max_concurrency": 4,
        "jitter": 0.0,
        "limits": "none",
    },
    [("send", 0.0, True), ("answer", 0, 0.01, 200, 0, True), ("due", 0.0)],
)
def test_the_short_way_and_the_general_one_leave_the_same_state(
    config: dict[str, Any], steps: list[tuple[Any, ...]]
) -> None:
    clock, plain, general = _pair(config)
    throttles = (plain, general)
    open_leases: list[list[Lease]] = [[], []]
    for op in steps:
        kind = op[0]
        if kind == "wait":
            clock.advance(op[1])
        elif kind == "lead":
            for throttle in throttles:
                throttle._live(KEY).gate.lead = op[1]
        elif kind in ("send", "due"):
            if kind == "send":
                clock.advance(op[1])
            else:
                for throttle in throttles:  # both gates' send_at: their fields stay alike
                    due = throttle._live(KEY).gate.send_at(clock())
                clock.now = max(clock.now, due + op[1])
            adjust = op[2] if kind == "send" else True
            got = [t.try_acquire(KEY, adjust=adjust) for t in throttles]
            assert (got[0] is None) == (got[1] is None)
            for leases, lease in zip(open_leases, got, strict=True):
                if lease is not None:
                    leases.append(lease)
        elif open_leases[0]:
            index = op[1] % len(open_leases[0])
            if kind == "wire":
                clock.advance(op[2])
                waits = [leases[index].wire_wait() for leases in open_leases]
                assert waits[0] == waits[1]
            elif kind == "answer":
                _, _, latency, status, headers, finish = op
                clock.advance(latency)
                for leases in open_leases:
                    lease = leases[index]
                    if finish:
                        lease.finish(latency, status, HEADERS[headers])
                        leases.remove(lease)
                    else:
                        lease.observe(latency=latency, status=status, headers=HEADERS[headers])
            else:
                for leases in open_leases:
                    leases.pop(index).release()
        assert _whole_state(plain, clock, open_leases[0]) == _whole_state(
            general, clock, open_leases[1]
        )


@pytest.mark.parametrize("policy", ["adaptive, no ramp", "autothrottle"])
def test_a_plain_slot_takes_the_short_way(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without this the test above could pass with the short way never taken;
    a slot with a burst asks ``_paced_at``, one with a strict pace
    ``_grant_extras``, as always."""
    asked: list[str] = []
    paced_at, extras = Gate._paced_at, Gate._grant_extras

    def spy_paced(self: Gate, now: float, last: float, delay: float) -> tuple[float, float]:
        asked.append("paced_at")
        return paced_at(self, now, last, delay)

    def spy_extras(self: Gate, *args: Any) -> None:
        asked.append("extras")
        extras(self, *args)

    monkeypatch.setattr(Gate, "_paced_at", spy_paced)
    monkeypatch.setattr(Gate, "_grant_extras", spy_extras)
    clock = FakeClock()
    throttle = Throttle(
        start_delay=0.1, policy=POLICIES[policy](), clock=clock, wall_clock=clock.wall
    )
    for _ in range(3):
        lease = throttle.try_acquire(KEY)
        assert lease is not None
        assert throttle.try_acquire(KEY) is None  # the gap is kept
        clock.advance(0.05)
        lease.finish(0.05, 200)
        clock.advance(1.0)
    assert asked == []
    burst = Throttle(policy=FixedRatePolicy(10.0, burst=3), clock=clock, wall_clock=clock.wall)
    assert burst.try_acquire(KEY) is not None
    assert burst.try_acquire(KEY) is not None  # the second asks for the burst's spacing
    assert "paced_at" in asked
    asked.clear()
    strict = Throttle(
        start_delay=0.1, policy=FixedDelayPolicy(0.1), clock=clock, wall_clock=clock.wall
    )
    lease = strict.try_acquire(KEY)
    assert lease is not None
    assert asked == []  # plain: no guard before its first answer
    lease.finish(0.05, 200)  # a strict pace keeps the arrival guard from now on
    clock.advance(1.0)
    assert strict.try_acquire(KEY) is not None
    assert asked == ["extras"]
    assert math.isfinite(throttle.slot(KEY).delay)


def _spaced(clock: FakeClock, lead: float, **limits: float) -> tuple[Throttle, Lease]:
    """A slot 0.1 s apart (AutoThrottle's rule: no ramp, no strict pace) with
    ``limits`` stated, its first request on the wire, and ``lead`` set."""
    store = MemoryStore()
    if limits:
        store.save(KEY, SlotState(delay=0.1, **limits))
    throttle = Throttle(
        start_delay=0.1,
        policy=AutoThrottlePolicy(),
        store=store,
        clock=clock,
        wall_clock=clock.wall,
    )
    first = throttle.try_acquire(KEY)
    assert first is not None
    assert first.wire_wait() == 0.0
    throttle._live(KEY).gate.lead = lead
    return throttle, first


@pytest.mark.parametrize(
    ("lead", "limits", "early"),
    [
        (0.01, {}, 0.01),  # the whole lead, below a quarter of the gap
        (0.04, {}, 0.025),  # a quarter of the 0.1-s gap at most
        (0.04, {"budget_gap": 0.4, "budget_until": 1010.0}, 0.04),  # of the gap kept: 0.4 s
        (0.2, {"sustained_gap": 0.4, "sustained_until": 1010.0}, 0.1),
    ],
)
def test_a_spaced_grant_is_made_early_by_the_lead_at_most_a_quarter_of_its_gap(
    lead: float, limits: dict[str, float], early: float
) -> None:
    """Rule 10: a grant is made early by the time grants take to reach the
    wire, at most a quarter of the gap it keeps; the wire turn keeps the whole
    gap."""
    clock = FakeClock()
    throttle, first = _spaced(clock, lead, **limits)
    gap = 0.4 if limits else 0.1
    clock.now = first.sent_at + gap - early - 1e-6
    assert throttle.try_acquire(KEY) is None
    clock.now = first.sent_at + gap - early + 1e-6
    second = throttle.try_acquire(KEY)
    assert second is not None
    assert second.wire_gap == pytest.approx(gap)
    assert second.wire_wait() == pytest.approx(early - 1e-6)

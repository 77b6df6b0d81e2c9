"""A process's run of a slot's turns (the fleet's rule 8), with plain numbers for time.

:class:`Run` is pure: every method is given ``now``. The Lua side of the rule
(reserving a run, handing its unused tail back) is checked against a real
Redis in tests/test_redis_rules.py.
"""

from __future__ import annotations

import math
import time
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from autothrottle import ThrottleTimeout
from autothrottle._fleet import (
    AGAIN,
    FRESH_AFTER,
    FRESH_MOST,
    FRESH_ROOM,
    GO,
    LOOK,
    RUN_MOST,
    SPACING_MARGIN,
    Fleet,
    Run,
    SharedTurn,
    TurnAsk,
    slack,
)
from autothrottle._fleet_wire import NoTurn
from autothrottle._redis_runs import Runs

ROOM = 0.05
GAP = 0.5


def reserve(run: Run, at: float, turns: int, lease: str = "x") -> None:
    """The store answered with a run of ``turns`` turns from ``at``, GAP apart:
    the process's ask is answered."""
    dues = [at + i * GAP for i in range(turns)]
    leases = [lease] + [f"{lease}:{i}" for i in range(2, turns + 1)]
    run.reserved(dues, leases, GAP, 0.5, 4)
    run.answered()


def test_a_first_run_is_one_turn_and_the_process_asks() -> None:
    run = Run()
    assert run.next(100.0, ROOM) == (1, [])


def test_a_request_behind_the_process_own_reserved_turn_waits_for_it() -> None:
    run = Run()
    run.next(100.0, ROOM)
    reserve(run, 102.0, 1)  # the fleet's turn for it is two seconds away
    assert run.next(100.5, ROOM) == (102.0, [])  # wait for it, then ask: one at a time


def test_a_request_while_another_of_the_process_asks_waits_behind_it() -> None:
    # One reservation in flight per process: before the store's first answer
    # too, a second request waits for that answer instead of asking on its own.
    run = Run()
    assert run.next(100.0, ROOM) == (1, [])
    assert run.asking
    assert run.next(100.01, ROOM) == (None, [])
    run.behind.extend(["b", "c"])  # the store's waiters, in the order they came
    assert run.serve() is None  # not while the ask is on its way
    reserve(run, 100.5, 1)  # the turn is the asker's
    assert run.serve() == "b"
    assert run.next(100.2, ROOM, waited=True) == (2, [])  # b asks next, for two: demand
    assert run.asking and run.serve() is None  # c waits behind b's ask in turn
    reserve(run, 101.0, 2)
    assert run.serve() == "c"
    assert run.next(100.3, ROOM, waited=True) == ((101.5, "x:2", True), [])  # from b's run
    assert run.serve() is None
    # A request that did not wait behind an ask waits for the last turn's due.
    assert run.next(100.4, ROOM) == (101.5, [])


def test_a_request_that_comes_while_others_wait_for_the_answer_is_served_after_them() -> None:
    # A thread may come between the store's recording a run and its serving the
    # requests behind the ask: the run has turns then, but they are the older
    # requests' first (per slot, first come first).
    run = Run()
    assert run.next(100.0, ROOM) == (1, [])
    assert run.next(100.01, ROOM) == (None, [])
    run.behind.append("b")
    dues = [100.5 + i * GAP for i in range(3)]
    run.reserved(dues, ["x", "x:2", "x:3"], GAP, 0.5, 4)  # recorded, b not yet served
    assert run.next(100.02, ROOM) == (None, [])  # the newcomer waits behind b
    run.behind.append("c")
    run.answered()
    assert run.serve() == "b"
    assert run.next(100.03, ROOM, waited=True) == ((101.0, "x:2", False), [])
    assert run.serve() == "c"
    assert run.next(100.03, ROOM, waited=True) == ((101.5, "x:3", True), [])
    assert run.serve() is None and not run.behind
    # Nobody waits any more: a request goes by the usual rule again.
    assert run.next(100.04, ROOM) == (101.5, [])


def test_a_request_given_up_behind_the_ask_leaves_the_next_to_ask() -> None:
    run = Run()
    run.next(100.0, ROOM)
    run.next(100.01, ROOM)
    run.answered()  # the asker was cancelled before its answer came
    assert run.next(100.02, ROOM, waited=True)[0] == 2  # the next asks (it waited: demand)


def test_a_run_doubles_while_the_process_requests_come_as_fast_as_its_turns() -> None:
    run = Run()
    lengths = []
    now = 100.0
    for _ in range(5):
        length, stale = run.next(now, ROOM)
        assert isinstance(length, int) and not stale
        lengths.append(length)
        reserve(run, now + 1.0, length)
        if length == 1:  # a second request waits behind this one
            assert run.next(now + 0.1, ROOM) == (now + 1.0, [])
        now += 1.0
        for _ in range(length - 1):  # or takes the run's next turns
            now += GAP
            took, _ = run.next(now, ROOM)
            assert isinstance(took, tuple) and took[0] == now
    assert lengths == [1, 2, 4, RUN_MOST, RUN_MOST]
    assert RUN_MOST == 4


def test_a_process_whose_requests_come_slower_keeps_runs_of_one() -> None:
    run = Run()
    for start in (100.0, 110.0, 120.0):
        assert run.next(start, ROOM) == (1, [])
        reserve(run, start + 0.2, 1)


def test_a_run_turn_no_request_took_in_time_goes_back_and_the_next_run_is_one() -> None:
    run = Run()
    run.length = 4
    reserve(run, 100.0, 4)  # the asker took 100.0; 100.5, 101.0, 101.5 wait here
    turn, stale = run.next(101.0 + ROOM / 2, ROOM)  # 100.5 passed unused
    assert stale == ["x:2"]
    assert turn == (101.0, "x:3", False)
    turn, stale = run.next(101.5, ROOM)
    assert (turn, stale) == ((101.5, "x:4", True), [])  # the last: it closes the run
    assert run.length == 1  # the next run starts again from one (then doubles)


def test_a_run_none_of_whose_turns_was_taken_is_followed_by_one_turn() -> None:
    run = Run()
    run.length = 4
    reserve(run, 100.0, 4)
    assert run.next(103.0, ROOM) == (1, ["x:2", "x:3", "x:4"])


def test_the_rest_of_a_run_goes_back_at_once_when_dropped() -> None:
    run = Run()
    reserve(run, 100.0, 3)
    assert run.drop() == ["x:2", "x:3"]
    assert len(run) == 0
    assert run.next(100.1, ROOM) == (1, [])


def test_a_first_turn_in_a_while_leaves_room_for_a_new_connection() -> None:
    run = Run()
    assert run.room(100.0, GAP) == min(FRESH_ROOM * GAP, FRESH_MOST)  # never sent
    reserve(run, 100.0, 1)
    assert run.room(100.6, GAP) == 0.0  # its connection is still open
    assert run.room(100.0 + FRESH_AFTER + 1.0, GAP) == min(FRESH_ROOM * GAP, FRESH_MOST)
    assert run.room(200.0, 10.0) == FRESH_MOST  # at most that, however long the gap


def ask() -> TurnAsk:
    return TurnAsk(GAP, 0.0, 60.0, 8, 300.0, 300.0, SPACING_MARGIN)


NOW = 1_000.0
"""The moment the fleet's rules read from ``time.monotonic()`` in these tests
(:func:`at_now`): a stall of the test's process between making a turn and
judging it (tens of ms on a loaded machine) must not change the verdict."""


def at_now() -> Any:
    """Stop the monotonic clock at :data:`NOW` while inside."""
    return mock.patch.object(time, "monotonic", return_value=NOW)


def turn(*, joined: bool) -> SharedTurn:
    return SharedTurn(0.0, "lease", GAP, 0.0, NOW, 4, joined=joined)


def test_a_run_turn_goes_a_run_gap_after_the_process_own_previous_send() -> None:
    slot: Any = SimpleNamespace(fleet_went=NOW)  # the previous one just went
    with at_now():
        waited = Fleet.after_own(slot, turn(joined=True), ask())
    assert waited == pytest.approx(GAP * SPACING_MARGIN)


def test_a_run_turn_after_a_send_long_gone_waits_no_more() -> None:
    slot: Any = SimpleNamespace(fleet_went=NOW - 10.0)
    with at_now():
        assert Fleet.after_own(slot, turn(joined=True), ask()) < 0.0


def test_a_turn_that_begins_a_run_follows_another_process_and_waits_no_more() -> None:
    slot: Any = SimpleNamespace(fleet_went=NOW)
    with at_now():
        assert Fleet.after_own(slot, turn(joined=False), ask()) == 0.0


class LateStore:
    """What :meth:`Fleet._done` tells the store of a turn it does not send."""

    def __init__(self) -> None:
        self.late: list[str] = []
        self.released: list[str] = []

    def late_turn(self, key: str, lease: str) -> None:
        self.late.append(lease)


def done(
    turn: SharedTurn, *, skipped: bool = False, heard: float = 0.0
) -> tuple[int, LateStore, Any]:
    """What the request does with ``turn`` now (GO, AGAIN, LOOK), what the store
    was told, the lease (``adopted``: the pauses adopted); ``heard``: the seconds
    of another process's pause the store heard of meanwhile."""
    store = LateStore()
    shared: Any = SimpleNamespace(
        late=store.late_turn,
        released=lambda key, lease: store.released.append(lease),
        fleet_pause=lambda key, max_pause, now: min(heard, max_pause),
    )
    adopted: list[float] = []
    rules: Any = SimpleNamespace(
        signals=SimpleNamespace(max_pause=300.0),
        adopt=lambda slot, delay, pause, now: adopted.append(pause),
    )
    fleet = Fleet(shared, rules, clock=lambda: 0.0)
    slot: Any = SimpleNamespace(
        key="k", state=SimpleNamespace(pause_until=-math.inf), fleet_went=-math.inf
    )
    lease: Any = SimpleNamespace(wire_gap=0.3, on_release=object(), adopted=adopted)
    with at_now():
        return fleet._done(slot, lease, turn, skipped), store, lease


def late_turn(late: float, slack: float, *, closes: bool = True) -> SharedTurn:
    due = NOW - late
    return SharedTurn(0.0, "lease", GAP, 0.0, due, 4, closes=closes, slack=slack)


def test_the_slack_is_the_margin_the_lateness_of_each_turn_and_the_room() -> None:
    spacing = GAP * SPACING_MARGIN
    assert slack(spacing, SPACING_MARGIN, 0.003, 2, 0.025) == pytest.approx(
        GAP * (SPACING_MARGIN - 1.0) + 2 * 0.003 + 0.025
    )


def test_a_turn_on_time_in_a_pause_another_process_set_goes_back() -> None:
    # Nothing of this process asked the store for the slot since the turn was
    # reserved: the pause came on the store's channel. The turn is void, as in
    # the process's own pause, and the pause is the slot's now (rule 4).
    went, store, lease = done(late_turn(0.001, 0.016), heard=1.0)
    assert went == AGAIN
    assert store.released == ["lease"] and store.late == []
    assert isinstance(lease.on_release, NoTurn) and lease.adopted == [1.0]  # nothing held


def test_a_pause_heard_is_held_to_the_processs_max_pause() -> None:
    went, _, lease = done(late_turn(0.001, 0.016), heard=1e6)
    assert went == AGAIN and lease.adopted == [300.0]


def test_a_turn_later_than_its_slack_is_handed_back_not_sent() -> None:
    # 30 ms late where the fleet left 16 ms: sent, it would reach the host 14 ms
    # closer than the gap to the next process's punctual send.
    went, store, lease = done(late_turn(0.03, 0.016))
    assert went == AGAIN
    assert store.late == ["lease"] and store.released == []
    assert isinstance(lease.on_release, NoTurn)  # its release is the store's now, once


def test_a_turn_within_its_slack_goes_spaced_by_the_fleet_alone() -> None:
    went, store, lease = done(late_turn(0.005, 0.016))
    assert went == GO and store.late == []
    assert lease.wire_gap == 0.0


def test_a_late_turn_inside_a_run_goes_the_next_send_is_the_process_own() -> None:
    went, store, _ = done(late_turn(1.0, math.inf, closes=False))
    assert went == GO and store.late == []


def test_a_request_whose_turn_came_late_once_looks_before_going_on_its_next_late_turn() -> None:
    # Not handed back again (a process late every time still sends), but not
    # sent blind either: the store says whether the fleet paused the slot
    # while this process stood still.
    went, store, lease = done(late_turn(0.03, 0.016), skipped=True)
    assert went == LOOK and store.late == [] and store.released == []
    assert lease.on_release is not None and lease.wire_gap == 0.3  # still held, not let go


def looked(seen: SharedTurn, left: float = math.inf) -> tuple[float, LateStore, Any, Any]:
    """What :meth:`Fleet.looked` makes of the store's answer ``seen``: the wait,
    what the store was told, the lease, the slot."""
    store = LateStore()
    shared: Any = SimpleNamespace(late=store.late_turn, released=store.released.append)
    adopted: list[float] = []
    rules: Any = SimpleNamespace(
        signals=SimpleNamespace(max_pause=300.0),
        adopt=lambda slot, delay, pause, now: adopted.append(pause),
    )
    fleet = Fleet(shared, rules, clock=lambda: 0.0)
    slot: Any = SimpleNamespace(key="k", fleet_went=-math.inf, senders=1)
    lease: Any = SimpleNamespace(wire_gap=0.3, on_release=object())
    bound = None if left == math.inf else 1.0
    wait = fleet.looked(slot, lease, "lease", seen, bound, left)
    slot.adopted = adopted
    return wait, store, lease, slot


def test_a_late_turn_the_store_finds_free_goes() -> None:
    wait, store, lease, slot = looked(SharedTurn(0.0, "lease", GAP, 0.0, None, 4))
    assert wait == 0.0 and store.late == [] and lease.on_release is not None
    assert lease.wire_gap == 0.0 and slot.fleet_went > 0.0


def test_a_late_turn_in_the_fleets_pause_goes_back_and_the_pause_is_waited() -> None:
    wait, store, lease, slot = looked(SharedTurn(1.5, None, GAP, 1.5, None, 4))
    assert wait == 1.5 and store.late == ["lease"]  # back, its time too
    assert isinstance(lease.on_release, NoTurn) and slot.adopted == [1.5]  # nothing held; paused


def test_a_late_turn_in_a_pause_past_the_bound_fails_at_once() -> None:
    with pytest.raises(ThrottleTimeout):
        looked(SharedTurn(1.5, None, GAP, 1.5, None, 4), left=0.5)


def test_turns_with_no_gap_between_them_have_no_order_to_keep() -> None:
    # A slot paced at zero delay: any lateness is fine, nothing is handed back.
    assert slack(0.0, SPACING_MARGIN, 0.003, 1, 0.0) == math.inf


def test_a_turn_answered_before_the_process_stood_still_is_bounded_by_what_is_left() -> None:
    # Answered with 1.5 s to wait; the process then stood still 1 s: the turn is
    # 0.5 s away, within the 0.7 s left of the request's bound.
    rules: Any = SimpleNamespace(signals=SimpleNamespace(max_pause=300.0), adopt=lambda *args: None)
    fleet = Fleet(SimpleNamespace(), rules, clock=lambda: 0.0)
    slot: Any = SimpleNamespace(key="k", senders=1)
    lease: Any = SimpleNamespace(on_release=None)
    turn = SharedTurn(1.5, "lease", GAP, 0.0, NOW + 0.5, 1)
    with at_now():
        assert fleet._settle(slot, lease, turn, ask(), 2.0, 0.7) == pytest.approx(0.5)
        with pytest.raises(ThrottleTimeout):
            fleet._settle(slot, lease, turn, ask(), 2.0, 0.3)


MERGED = 2_000_000.0
"""When the merge that told a stated pace ran, on Redis's clock (µs)."""


def _told(spacing: float, gap: float, left: float, *, max_pause: float, at: float) -> int:
    """A process's run of four turns ``spacing`` apart, reserved at ``at`` (Redis's
    µs) by an ask with ``max_pause``; then the channel tells a pace of one send
    per ``gap`` seconds, ``left`` seconds of it left, merged at :data:`MERGED`.
    How many of the run's untaken turns go back (three: it is void)."""
    back: list[str] = []
    runs = Runs(lambda key, gap, leases: back.extend(leases))
    ask = TurnAsk(spacing, 0.0, 60.0, 8, 300.0, max_pause)
    now = time.monotonic()

    def asked(key: str, ask: TurnAsk, now: float, ready: tuple[int, float], run: Run) -> Any:
        dues = [now + i * spacing for i in range(4)]
        leases = ["x", "x:2", "x:3", "x:4"]
        runs.reserved(
            key, run, dues, leases, spacing=spacing, delay=None, senders=1, slack=0.0, free=4, at=at
        )
        return SharedTurn(0.0, "x", None, 0.0, now, 1)

    run = Run()
    run.length, run._demand = 2, True  # the ask reserves four turns
    runs._runs["k"] = run
    runs.take_turn_blocking("k", ask, now, math.inf, asked)
    runs.stated("k", gap, time.monotonic() + left, MERGED)
    return len(back)


@pytest.mark.parametrize(
    ("spacing", "gap", "left", "max_pause", "at", "void"),
    [
        (0.05, 0.5, 30.0, 300.0, MERGED - 1, True),  # before the pace: its old spacing
        (0.05, 0.5, 30.0, 300.0, MERGED, False),  # after the merge: Redis spaced it
        (0.3 * SPACING_MARGIN, 0.5, 30.0, 0.3, MERGED - 1, False),  # the asker's max_pause
        (0.3 * SPACING_MARGIN, 0.5, 30.0, 1.0, MERGED - 1, True),
        (0.2, 1.0, 0.15, 300.0, MERGED - 1, False),  # 0.15 s of the pace left: spaced wider
        (0.2, 1.0, 5.0, 300.0, MERGED - 1, True),
    ],
)
def test_a_run_is_void_by_a_pace_told_as_the_store_would_have_spaced_it(
    spacing: float, gap: float, left: float, max_pause: float, at: float, void: bool
) -> None:
    """A pace told on the channel voids a run as the store floors a run's gap
    by it (rule 1): only one reserved before the merge that told it, and only
    narrower than the pace cut to what is left of it and to the asker's
    ``max_pause`` (the check at the due, ``Fleet.respaced``, cuts it so too).
    A run spaced as the pace asks keeps its turns: void, its requests would
    each ask again, a round trip, and lose their places."""
    assert _told(spacing, gap, left, max_pause=max_pause, at=at) == (3 if void else 0)

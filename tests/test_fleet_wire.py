"""A fleet turn's second look at its slack, at the wire (the fleet's rule 1).

:class:`WireCheck` runs when a request's connection is ready: a request let
go on time may reach the wire long after (a new connection, a busy event
loop), and a turn later than its slack there goes back and another is taken.
Plain numbers for the turns; the store is a fake that records what it was told.

The clock is a :class:`~helpers.FakeClock` that moves only when a test moves
it, in the wire check and the fleet alike: on the real clock a test read a
wait, then read it again as still above a bound, and a process standing still
between the two reads (two cores busy) failed it.
"""

from __future__ import annotations

import asyncio
import logging
import math
from types import SimpleNamespace
from typing import Any

import pytest

from autothrottle import ThrottleTimeout, _fleet, _fleet_wire
from autothrottle._fleet import Fleet, SharedTurn, TurnAsk
from autothrottle._fleet_wire import WIRE_POLL, HeldTurn, NoTurn, WireCheck
from autothrottle._limits import Limits
from helpers import FakeClock

GAP = 0.5

clock = FakeClock()
"""The check's and the fleet's ``time.monotonic`` (:func:`_fake_clock`)."""


@pytest.fixture(autouse=True)
def _fake_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both modules read ``time.monotonic`` (and the fleet's blocking path
    sleeps): here they read :data:`clock`, and a sleep moves it."""
    fake = SimpleNamespace(monotonic=clock, sleep=clock.advance)
    monkeypatch.setattr(_fleet_wire, "time", fake)
    monkeypatch.setattr(_fleet, "time", fake)


class Store:
    """A shared store that answers every new turn with ``answer``."""

    def __init__(self, answer: SharedTurn) -> None:
        self.answer = answer
        self.late: list[str] = []
        self.released: list[str] = []
        self.asked = 0
        self.heard = 0.0  # seconds of another process's pause heard (fleet_pause)
        self.idled = 0  # times told no request of the process is left (the run's rest goes back)
        self.gate = asyncio.Event()  # the async answer comes when set

    def late_turn(self, key: str, lease: str) -> None:
        self.late.append(lease)

    def idle(self, key: str) -> None:
        self.idled += 1

    def take_turn_blocking(
        self, key: str, ask: TurnAsk, now: float, left: float = math.inf
    ) -> SharedTurn:
        self.asked += 1
        return self.answer

    async def take_turn(
        self, key: str, ask: TurnAsk, now: float, left: float = math.inf
    ) -> SharedTurn:
        self.asked += 1
        await self.gate.wait()
        if self.error is not None:
            raise self.error
        return self.answer

    error: BaseException | None = None
    seen = SharedTurn(0.0, "old", GAP, 0.0, None, 4)  # what a look answers: go
    looked = 0

    def look_blocking(self, key: str, lease: str, ask: TurnAsk, now: float) -> SharedTurn:
        self.looked += 1
        return self.seen if self.seen.lease is None else self.seen._replace(lease=lease)

    async def look(self, key: str, lease: str, ask: TurnAsk, now: float) -> SharedTurn:
        self.looked += 1
        await self.gate.wait()
        if self.error is not None:
            raise self.error
        return self.seen if self.seen.lease is None else self.seen._replace(lease=lease)


def setup(
    answer: SharedTurn,
    late: float,
    until: float = math.inf,
    *,
    skipped: bool = False,
    slack: float = 0.016,
) -> tuple[Any, Store, Any]:
    """A check for a closing turn reached ``late`` seconds after its due (its
    ``slack``: 16 ms); ``skipped``: its request handed a late turn back already."""
    store = Store(answer)
    shared: Any = SimpleNamespace(
        late=store.late_turn,
        released=lambda key, lease: store.released.append(lease),
        take_turn=store.take_turn,
        take_turn_blocking=store.take_turn_blocking,
        look=store.look,
        look_blocking=store.look_blocking,
        idle=store.idle,
        fleet_pause=lambda key, max_pause, now: min(store.heard, max_pause),
    )
    adopted: list[float] = []
    rules: Any = SimpleNamespace(
        signals=SimpleNamespace(hold_timeout=300.0, max_pause=300.0),
        adopt=lambda slot, delay, pause, now: adopted.append(pause),
    )
    fleet = Fleet(shared, rules, clock=clock)
    gate = SimpleNamespace(in_flight=lambda: 1, queued=lambda: 0)
    slot: Any = SimpleNamespace(
        key="k",
        state=SimpleNamespace(delay=GAP, pause_until=-math.inf, limits=Limits()),
        config=SimpleNamespace(min_delay=0.0, max_delay=60.0, max_concurrency=8),
        gate=gate,
        fleet_went=-math.inf,
        adopted=adopted,
        senders=1,
    )
    lease: Any = SimpleNamespace(on_release=None, on_wire=None, released=False)
    turn = SharedTurn(0.0, "old", GAP, 0.0, clock() - late, 4, slack=slack)
    fleet._settle(slot, lease, turn, fleet.ask(slot), None, math.inf)  # the turn's hook
    adopted.clear()
    bound = None if until == math.inf else 1.0
    lease.on_wire = WireCheck(fleet, slot, lease, turn, until, bound, skipped)
    return lease, store, slot


def holds(lease: Any) -> tuple[str, str] | None:
    """The turn the lease's release hands back, and how: ``"sent"`` (a finished
    request's: its lease only) or ``"unsent"`` (its time too); None: none."""
    hook = lease.on_release
    if isinstance(hook, HeldTurn):
        return hook.lease, "sent"
    owner = getattr(hook, "__self__", None)
    if isinstance(owner, HeldTurn) and hook == owner.hand_back:
        return owner.lease, "unsent"
    assert isinstance(hook, NoTurn), hook  # its release: only that the request left
    return None


async def answered(lease: Any) -> float:
    """What the wire check says once the store's answer came: it polls until then
    (bounded: the answer comes within a few loop turns)."""
    wait = WIRE_POLL
    for _ in range(100):
        await asyncio.sleep(0)
        wait = lease.on_wire()
        if wait != WIRE_POLL:
            break
    return wait


ON_TIME = 0.016
"""The slack of a turn reached on time (5 ms after its due): a closing turn's
16 ms, as a real one has (the clock stands still between the check's making
and its call, however loaded the machine)."""


def new_turn(due_in: float) -> SharedTurn:
    return SharedTurn(due_in, "new", GAP, 0.0, clock() + due_in, 4, slack=0.016)


def test_a_turn_on_time_at_the_wire_goes() -> None:
    lease, store, slot = setup(new_turn(1.0), late=0.005, slack=ON_TIME)
    assert lease.on_wire() == 0.0
    assert lease.on_wire is None and store.late == [] and store.asked == 0
    assert slot.fleet_went > 0.0  # the run's next turn counts from this send


def test_a_turn_later_than_its_slack_at_the_wire_is_taken_again_sync() -> None:
    lease, store, _ = setup(new_turn(0.4), late=0.08)  # no event loop: the sync client
    wait = lease.on_wire()
    assert store.late == ["old"] and store.asked == 1
    assert wait == pytest.approx(0.4, abs=0.05)  # the new turn's due
    assert holds(lease) == ("new", "unsent")  # the request now holds the new turn
    assert lease.on_wire is not None  # and looks again when woken


def test_the_new_turn_once_due_lets_the_request_go() -> None:
    lease, store, _ = setup(new_turn(-0.001), late=0.08)
    assert lease.on_wire() == 0.0
    assert lease.on_wire is None and store.asked == 1  # once per request


async def test_a_turn_later_than_its_slack_at_the_wire_is_taken_again_async() -> None:
    lease, store, _ = setup(new_turn(0.3), late=0.08)
    assert lease.on_wire() == WIRE_POLL  # asked; the answer is on its way
    await asyncio.sleep(0)
    assert lease.on_wire() == WIRE_POLL and store.asked == 1  # asked once, not again
    store.gate.set()
    wait = await answered(lease)
    assert wait == pytest.approx(0.3, abs=0.1)
    assert store.late == ["old"] and holds(lease) == ("new", "unsent")


async def test_a_turn_answered_after_the_request_was_given_up_goes_back() -> None:
    lease, store, _ = setup(new_turn(0.3), late=0.08)
    assert lease.on_wire() == WIRE_POLL
    lease.released = True  # cancelled while the new turn was being taken
    store.gate.set()
    for _ in range(100):
        await asyncio.sleep(0)
        if len(store.late) == 2:
            break
    assert store.late == ["old", "new"] and store.released == []  # never sent: its time too


def test_a_turn_reached_during_the_processs_own_pause_goes_back_and_is_taken_anew() -> None:
    # A 429 paused this process's slot after its turn was let go: the gate
    # would hold the request to the pause's end, past its turn and into the
    # next process's. The turn goes back; a new one is taken after the pause.
    lease, store, slot = setup(new_turn(0.4), late=0.005, slack=ON_TIME)
    slot.state.pause_until = clock() + 0.05
    wait = lease.on_wire()
    assert 0.0 < wait <= 0.05
    assert store.released == ["old"] and store.late == [] and store.asked == 0
    assert holds(lease) is None and lease.on_wire is not None  # nothing held; looks again
    clock.advance(wait + 0.005)
    assert 0.2 < lease.on_wire() <= 0.4  # the new turn's due (the sync client asked at once)
    assert store.asked == 1 and holds(lease) == ("new", "unsent")


def test_a_turn_let_go_before_another_processs_pause_goes_back_at_the_wire() -> None:
    # The pause came on the store's channel while the request went to the wire:
    # void as in the process's own pause; the slot adopts it.
    lease, store, slot = setup(new_turn(0.4), late=0.005, slack=ON_TIME)
    store.heard = 0.05
    wait = lease.on_wire()
    assert 0.0 < wait <= 0.05 and slot.adopted == [0.05]
    assert store.released == ["old"] and store.late == [] and store.asked == 0
    assert holds(lease) is None and lease.on_wire is not None  # nothing held; looks again


def test_a_late_turn_in_a_pause_heard_at_the_wire_goes_back_with_its_time() -> None:
    lease, store, _ = setup(new_turn(0.4), late=0.08)
    store.heard = 0.05
    assert 0.0 < lease.on_wire() <= 0.05
    assert store.late == ["old"] and store.released == [] and store.asked == 0


def test_a_pause_past_the_request_bound_at_the_wire_fails_at_once() -> None:
    lease, store, slot = setup(new_turn(0.4), late=0.005, slack=ON_TIME, until=clock() + 1.0)
    slot.state.pause_until = clock() + 5.0
    with pytest.raises(ThrottleTimeout):
        lease.on_wire()
    assert store.released == ["old"] and store.asked == 0


async def test_a_new_turn_due_during_the_processs_own_pause_goes_back() -> None:
    lease, store, slot = setup(new_turn(-0.001), late=0.08)
    assert lease.on_wire() == WIRE_POLL  # late: a new turn is being taken
    slot.state.pause_until = clock() + 0.3  # meanwhile a 429 paused the slot
    store.gate.set()
    wait = await answered(lease)
    assert wait == pytest.approx(0.3, abs=0.1)  # the pause, not a send at its end
    assert store.late == ["old"] and store.released == ["new"]


def test_a_new_turn_past_the_request_bound_fails_and_goes_back() -> None:
    lease, store, _ = setup(new_turn(2.0), late=0.08, until=clock() + 1.0)
    with pytest.raises(ThrottleTimeout):  # not sent off its turn: max_wait and the host's limit
        lease.on_wire()
    assert store.late == ["old", "new"]  # both turns back, the new one's time too
    assert holds(lease) is None  # nothing held for the lease's release to hand back
    with pytest.raises(ThrottleTimeout):  # a client's retry of the write is refused again
        lease.on_wire()
    assert store.asked == 1


def test_a_pause_past_the_request_bound_fails_at_the_wire() -> None:
    pause = SharedTurn(3.0, None, GAP, 3.0, None, 4)  # the fleet's pause: ask again in 3 s
    lease, store, _ = setup(pause, late=0.08, until=clock() + 1.0)
    with pytest.raises(ThrottleTimeout):  # not sent through the host's pause
        lease.on_wire()
    assert store.late == ["old"] and holds(lease) is None


def test_a_pause_within_the_bound_is_waited_then_a_turn_asked_for() -> None:
    pause = SharedTurn(0.5, None, GAP, 0.5, None, 4)
    lease, store, slot = setup(pause, late=0.08, until=clock() + 1.0)
    assert lease.on_wire() == pytest.approx(0.5, abs=0.05)
    assert lease.on_wire() > 0.3 and store.asked == 1  # not asked again before its end
    assert slot.adopted == [0.5]  # this process's other turns waiting see the pause too


async def test_what_the_store_raised_at_the_wire_the_request_raises() -> None:
    lease, store, _ = setup(new_turn(0.3), late=0.08)
    store.error = RuntimeError("the store broke")
    assert lease.on_wire() == WIRE_POLL
    store.gate.set()
    with pytest.raises(RuntimeError, match="the store broke"):  # not sent, as at its turn
        for _ in range(100):  # bounded: the answer comes within a few loop turns
            await asyncio.sleep(0)
            assert lease.on_wire() == WIRE_POLL  # until the answer came: never "go"


async def test_what_the_store_raised_after_the_request_was_given_up_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="autothrottle")
    lease, store, _ = setup(new_turn(0.3), late=0.08)
    store.error = RuntimeError("the store broke")
    assert lease.on_wire() == WIRE_POLL
    lease.released = True  # cancelled while the new turn was being taken
    store.gate.set()
    for _ in range(100):  # bounded: the answer comes within a few loop turns
        await asyncio.sleep(0)
        if caplog.records:
            break
    assert ["the store broke" in record.getMessage() for record in caplog.records] == [True]


async def test_what_the_store_raised_before_the_request_was_given_up_is_logged_at_release(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="autothrottle")
    lease, store, _ = setup(new_turn(0.3), late=0.08)
    store.error = RuntimeError("the store broke")
    assert lease.on_wire() == WIRE_POLL
    store.gate.set()
    for _ in range(100):
        await asyncio.sleep(0)
        if not isinstance(lease.on_release, NoTurn):  # the answer came: the error's hook
            break
    assert not caplog.records  # left for the request's look to raise
    lease.on_release()  # given up without looking: released
    assert ["the store broke" in record.getMessage() for record in caplog.records] == [True]


async def test_what_the_store_raised_and_the_request_raised_is_not_logged_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="autothrottle")
    lease, store, _ = setup(new_turn(0.3), late=0.08)
    store.error = RuntimeError("the store broke")
    assert lease.on_wire() == WIRE_POLL
    store.gate.set()
    with pytest.raises(RuntimeError, match="the store broke"):
        for _ in range(100):
            await asyncio.sleep(0)
            lease.on_wire()
    assert holds(lease) is None and not caplog.records


def test_a_request_late_again_at_the_wire_looks_and_goes_on_its_turn() -> None:
    # It handed a late turn back already: not again (a process late every time
    # still sends), but the store looks for a pause the fleet set meanwhile.
    lease, store, slot = setup(new_turn(0.4), late=0.08, skipped=True)
    assert lease.on_wire() == 0.0
    assert store.looked == 1 and store.asked == 0 and store.late == []
    assert lease.on_wire is None and holds(lease) == ("old", "sent")  # it went on its own turn
    assert slot.fleet_went > 0.0


def test_a_request_late_again_in_the_fleets_pause_waits_it_out_then_takes_a_turn() -> None:
    lease, store, slot = setup(new_turn(0.0), late=0.08, skipped=True)
    store.seen = SharedTurn(0.05, None, GAP, 0.05, None, 4)  # another process paused the host
    wait = lease.on_wire()
    assert 0.0 < wait <= 0.05  # not sent through the pause
    assert store.late == ["old"] and holds(lease) is None  # the turn went back
    assert slot.adopted == [0.05]  # this process's other turns waiting see the pause too
    clock.advance(wait + 0.005)
    store.answer = new_turn(0.0)  # the fleet's next turn, due now, after the pause
    assert lease.on_wire() == 0.0
    assert store.asked == 1 and holds(lease) == ("new", "sent")


def test_a_request_late_again_in_a_pause_past_its_bound_fails_at_once() -> None:
    lease, store, _ = setup(new_turn(0.0), late=0.08, until=clock() + 1.0, skipped=True)
    store.seen = SharedTurn(3.0, None, GAP, 3.0, None, 4)
    with pytest.raises(ThrottleTimeout):  # neither sent through the pause nor waiting past it
        lease.on_wire()
    assert store.late == ["old"] and store.asked == 0 and holds(lease) is None


async def test_a_request_late_again_looks_async() -> None:
    lease, store, _ = setup(new_turn(0.3), late=0.08, skipped=True)
    store.seen = SharedTurn(0.2, None, GAP, 0.2, None, 4)
    assert lease.on_wire() == WIRE_POLL  # the look is on its way
    assert holds(lease) == ("old", "unsent")  # held meanwhile, not sent
    store.gate.set()
    wait = await answered(lease)
    assert wait == pytest.approx(0.2, abs=0.1)
    assert store.looked == 1 and store.late == ["old"] and store.asked == 0


async def test_what_the_store_raised_at_a_look_the_request_raises_and_its_turn_goes_back() -> None:
    lease, store, _ = setup(new_turn(0.3), late=0.08, skipped=True)
    store.error = RuntimeError("the store broke")
    assert lease.on_wire() == WIRE_POLL
    store.gate.set()
    with pytest.raises(RuntimeError, match="the store broke"):
        for _ in range(100):
            await asyncio.sleep(0)
            assert lease.on_wire() == WIRE_POLL
    assert holds(lease) == ("old", "unsent")  # its release hands the turn back, whole
    lease.on_release()  # the request raised it; its release
    assert store.late == ["old"] and store.released == []


def test_a_new_turn_taken_at_the_wire_and_reached_late_looks_before_it_goes() -> None:
    lease, store, _ = setup(new_turn(-0.08), late=0.08)  # due 80 ms ago: its slack is 16 ms
    assert lease.on_wire() == 0.0
    assert store.late == ["old"] and store.asked == 1 and store.looked == 1
    assert holds(lease) == ("new", "sent")


def test_a_turn_inside_a_run_notes_when_it_reached_the_wire() -> None:
    # The run's next turn goes a gap after this send left, not after the
    # moment the fleet let it go (its connection may have kept it longer).
    store = Store(new_turn(1.0))
    shared: Any = SimpleNamespace(late=store.late_turn)
    fleet = Fleet(shared, SimpleNamespace(), clock=clock)  # type: ignore[arg-type]
    slot: Any = SimpleNamespace(fleet_went=-math.inf)
    lease: Any = SimpleNamespace(on_wire=None)
    inside = SharedTurn(0.0, "x", GAP, 0.0, clock() - 0.3, 4, joined=True, closes=False)
    fleet._check_at_wire(slot, lease, inside, False, None, math.inf)
    assert slot.fleet_went == -math.inf  # not yet: the request waits for its connection
    assert lease.on_wire() == 0.0  # never held back: the next send is this process's own
    assert slot.fleet_went > -math.inf and lease.on_wire is None
    assert store.late == []


def test_a_closing_turn_of_a_run_let_go_on_time_goes_at_the_wire_at_once() -> None:
    # Its own let-go set when the run's last send went (rule 8): held here a
    # run's gap after that, it reached the host a gap late, on the next
    # process's (or this process's next run's) turn.
    lease, store, slot = setup(new_turn(1.0), late=0.005, slack=ON_TIME)
    turn = lease.on_wire._turn._replace(joined=True)
    slot.fleet_went = clock()  # Fleet._done let it go just now
    lease.on_wire = WireCheck(lease.on_wire._fleet, slot, lease, turn, math.inf)
    assert lease.on_wire() == 0.0
    assert store.asked == 0 and store.looked == 0 and store.late == []


# -- a request given up before its turn went hands it back whole ------------------------
#
# Its release (``Lease.release``: the gate lets go, then ``on_release``) is
# called here as an adapter's would be when the request is cancelled, fails
# or raises what the wire check raised: a turn it never sent goes back with
# its time (``late``), not as a finished request's lease (``released``).


def test_a_request_given_up_waiting_at_the_wire_for_its_new_turn_hands_it_back_whole() -> None:
    lease, store, _ = setup(new_turn(0.4), late=0.08)  # no event loop: the sync client
    assert lease.on_wire() == pytest.approx(0.4, abs=0.05)  # waits for the new turn's due
    lease.on_release()  # cancelled meanwhile
    assert store.late == ["old", "new"] and store.released == []


async def test_a_request_given_up_waiting_at_the_wire_for_its_new_turn_hands_it_back_async() -> (
    None
):
    lease, store, _ = setup(new_turn(0.3), late=0.08)
    assert lease.on_wire() == WIRE_POLL
    store.gate.set()
    assert await answered(lease) == pytest.approx(0.3, abs=0.1)
    lease.on_release()
    assert store.late == ["old", "new"] and store.released == []


async def test_a_request_given_up_before_it_looked_at_its_new_turn_hands_it_back_whole() -> None:
    lease, store, _ = setup(new_turn(0.3), late=0.08)
    assert lease.on_wire() == WIRE_POLL
    store.gate.set()
    for _ in range(100):  # bounded: the answer comes within a few loop turns
        await asyncio.sleep(0)
        if holds(lease) is not None:
            break
    lease.on_release()  # the answer came; the request never looked at it
    assert store.late == ["old", "new"] and store.released == []


async def test_a_request_given_up_while_the_store_looks_at_its_turn_hands_it_back_whole() -> None:
    lease, store, _ = setup(new_turn(0.3), late=0.08, skipped=True)
    assert lease.on_wire() == WIRE_POLL  # the look is on its way
    lease.on_release()
    assert store.late == ["old"] and store.released == []


async def test_a_turn_the_store_failed_to_look_at_goes_back_whole_unlooked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="autothrottle")
    lease, store, _ = setup(new_turn(0.3), late=0.08, skipped=True)
    store.error = RuntimeError("the store broke")
    assert lease.on_wire() == WIRE_POLL
    store.gate.set()
    for _ in range(20):  # the answer (an error) comes within a few loop turns
        await asyncio.sleep(0)
    assert not caplog.records  # left for the request's look to raise
    lease.on_release()  # given up without looking: logged, and the turn back
    assert store.late == ["old"] and store.released == []
    assert ["the store broke" in record.getMessage() for record in caplog.records] == [True]


def test_a_request_that_went_on_a_new_turn_hands_back_its_lease_only() -> None:
    lease, store, _ = setup(new_turn(-0.001), late=0.08)
    assert lease.on_wire() == 0.0  # went on the turn taken at the wire
    lease.on_release()  # finished: the turn's time was spent
    assert store.late == ["old"] and store.released == ["new"]


def test_a_request_that_went_on_its_late_turn_after_a_look_hands_back_its_lease_only() -> None:
    lease, store, _ = setup(new_turn(0.4), late=0.08, skipped=True)
    assert lease.on_wire() == 0.0  # the store looked: it went on its turn
    lease.on_release()
    assert store.late == [] and store.released == ["old"]


# -- ... and so does one given up at its turn (Fleet._unsent) ----------------------------


class GivenUpLease:
    """A lease as :meth:`Fleet.take_turn` uses it: released once, through its hook."""

    def __init__(self) -> None:
        self.on_release: Any = None
        self.on_wire: Any = None
        self.released = False
        self.wire_gap = 0.3

    def release(self) -> None:
        if not self.released:
            self.released = True
            if self.on_release is not None:
                self.on_release()


def fleet_of(answer: SharedTurn) -> tuple[Fleet, Store, Any]:
    """A fleet whose store answers every turn with ``answer``, and its slot."""
    lease, store, slot = setup(answer, late=0.0)
    fleet: Fleet = lease.on_wire._fleet
    store.gate.set()
    return fleet, store, slot


async def test_a_request_cancelled_waiting_for_its_turns_due_hands_it_back_whole() -> None:
    fleet, store, slot = fleet_of(new_turn(5.0))
    lease = GivenUpLease()
    task = asyncio.create_task(fleet.take_turn(slot, lease, None, math.inf))  # type: ignore[arg-type]
    for _ in range(100):  # bounded: answered within a few loop turns
        await asyncio.sleep(0)
        if lease.on_release is not None:
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert store.late == ["new"] and store.released == [] and lease.released


async def test_a_request_cancelled_while_the_store_looks_at_its_late_turn_hands_it_back() -> None:
    # Late once (handed back, taken again), late again: the store looks first.
    fleet, store, slot = fleet_of(SharedTurn(0.0, "late", GAP, 0.0, clock() - 0.08, 4, slack=0.016))
    looking = asyncio.Event()

    async def look(key: str, lease: str, ask: TurnAsk, now: float) -> SharedTurn:
        looking.set()
        await asyncio.Event().wait()  # until cancelled
        raise AssertionError("unreachable")

    fleet.store.look = look  # type: ignore[method-assign]
    lease = GivenUpLease()
    task = asyncio.create_task(fleet.take_turn(slot, lease, None, math.inf))  # type: ignore[arg-type]
    await asyncio.wait_for(looking.wait(), 5.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert store.late == ["late", "late"] and store.released == []  # the first, then the held


def test_a_sync_request_whose_turn_is_past_max_wait_hands_it_back_whole() -> None:
    fleet, store, slot = fleet_of(new_turn(5.0))
    lease = GivenUpLease()
    with pytest.raises(ThrottleTimeout):
        fleet.take_turn_blocking(slot, lease, 1.0, 1.0)  # type: ignore[arg-type]
    assert store.late == ["new"] and store.released == [] and lease.released


async def test_a_request_that_went_on_its_turn_hands_back_its_lease_only() -> None:
    fleet, store, slot = fleet_of(new_turn(0.0))
    lease = GivenUpLease()
    await fleet.take_turn(slot, lease, None, math.inf)  # type: ignore[arg-type]
    lease.on_wire = None  # went on the wire
    lease.release()
    assert store.late == [] and store.released == ["new"]


# -- the last request of the process hands the run's rest back, however it ends ----------
#
# Rule 8: the rest of a run goes back when no request of the process is left for
# the slot (``Fleet.left``, then the store's ``idle``). A request that holds no
# turn when it ends (waiting out a pause or the cap, its ask on its way, gone
# alone) must reach it too: the requests before it finished while it waited, so
# they saw it in flight and handed nothing back, and the run's rest stayed
# reserved in the store until the process's next request for the slot.


def last_of(slot: Any, lease: Any) -> None:
    """``lease`` is the slot's only request in this process: the gate counts it
    until it is released."""
    slot.gate = SimpleNamespace(in_flight=lambda: 0 if lease.released else 1, queued=lambda: 0)


def release(lease: Any) -> None:
    """What ``Lease.release`` does: the gate lets go, then the hook, once."""
    if not lease.released:
        lease.released = True
        if lease.on_release is not None:
            lease.on_release()


PAUSE = SharedTurn(5.0, None, GAP, 5.0, None, 4)  # the fleet's pause: ask again in 5 s
ALONE = SharedTurn(0.0, None, GAP, 0.0, None, 1)  # the store is down: go, paced alone


async def started(fleet: Fleet, slot: Any, lease: Any) -> asyncio.Task[None]:
    """The request's fleet turn, taken in a task, a few loop turns on (the store
    answered, if it may)."""
    last_of(slot, lease)
    task = asyncio.create_task(fleet.take_turn(slot, lease, None, math.inf))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not task.done()
    return task


@pytest.mark.parametrize(
    ("answer", "answered"),
    [(PAUSE, True), (new_turn(5.0), True), (PAUSE, False)],
    ids=["in-a-pause", "holding-a-turn", "its-ask-on-its-way"],
)
async def test_the_last_request_cancelled_at_its_turn_hands_the_run_back(
    answer: SharedTurn, answered: bool
) -> None:
    fleet, store, slot = fleet_of(answer)
    if not answered:
        store.gate.clear()  # the store has not answered yet
    lease = GivenUpLease()
    task = await started(fleet, slot, lease)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert lease.released and store.idled == 1


def test_the_last_sync_request_past_its_max_wait_in_a_pause_hands_the_run_back() -> None:
    fleet, store, slot = fleet_of(PAUSE)
    lease = GivenUpLease()
    last_of(slot, lease)
    with pytest.raises(ThrottleTimeout):
        fleet.take_turn_blocking(slot, lease, 1.0, 1.0)  # type: ignore[arg-type]
    assert lease.released and store.idled == 1


@pytest.mark.parametrize("answer", [ALONE, new_turn(0.0)], ids=["alone", "on-a-turn"])
async def test_the_last_request_finished_hands_the_run_back(answer: SharedTurn) -> None:
    fleet, store, slot = fleet_of(answer)
    lease = GivenUpLease()
    last_of(slot, lease)
    await fleet.take_turn(slot, lease, None, math.inf)  # type: ignore[arg-type]
    assert store.idled == 0
    release(lease)
    assert store.idled == 1


@pytest.mark.parametrize(
    ("answer", "skipped"),
    [(PAUSE, False), (ALONE, False), (SharedTurn(5.0, None, GAP, 5.0, None, 4), True)],
    ids=["waiting-out-a-pause", "gone-alone", "looked-in-a-pause"],
)
def test_the_last_request_ended_at_the_wire_holding_no_turn_hands_the_run_back(
    answer: SharedTurn, skipped: bool
) -> None:
    # Late at the wire: its turn went back and a new one was asked for (a pause
    # answered, or the store is down); late again: the store looked and found
    # the fleet's pause. Then it ends, given up or finished.
    lease, store, slot = setup(answer, late=0.08, skipped=skipped)
    if skipped:
        store.seen = answer
    last_of(slot, lease)
    lease.on_wire()
    assert holds(lease) is None and store.idled == 0
    release(lease)
    assert store.idled == 1


async def test_the_last_request_given_up_at_the_wire_while_it_asks_hands_the_run_back() -> None:
    lease, store, slot = setup(new_turn(0.3), late=0.08)
    last_of(slot, lease)
    assert lease.on_wire() == WIRE_POLL  # its late turn went back; the ask is on its way
    release(lease)
    assert store.idled == 1
    store.gate.set()  # the turn answered after it: back whole, and the run's rest with it
    for _ in range(100):
        await asyncio.sleep(0)
        if len(store.late) == 2:
            break
    assert store.late == ["old", "new"] and store.idled == 2


@pytest.mark.parametrize(("stated", "delay"), [(0.2, 0.05), (90.0, 1.0)])
def test_the_fleet_is_asked_for_the_pace_the_host_stated(stated: float, delay: float) -> None:
    """A host that stated its pace in headers (here a policy of one request per
    ``stated`` seconds) is paced by it fleet-wide: each process's gate keeps it,
    so the fleet must too, or N processes send N times what it allows. The gate
    keeps a stated pace slower than ``max_delay`` (60 s) as well: the ask's ceiling
    must not cut it back to 60 s."""
    clock = FakeClock()
    rules: Any = SimpleNamespace(signals=SimpleNamespace(hold_timeout=300.0, max_pause=300.0))
    fleet = Fleet(SimpleNamespace(), rules, clock=clock)
    limits = Limits(sustained_gap=stated, sustained_until=clock() + 1000.0)
    slot: Any = SimpleNamespace(
        state=SimpleNamespace(delay=delay, limits=limits),
        config=SimpleNamespace(min_delay=0.0, max_delay=60.0, max_concurrency=8),
    )
    ask = fleet.ask(slot)
    # What the store makes of it (rule 1): the gap within the ask's bounds.
    assert min(max(ask.gap, ask.min_gap), ask.max_gap) == pytest.approx(stated)
    limits.sustained_until = clock() - 1.0  # the stated pace no longer holds
    ask = fleet.ask(slot)
    assert min(max(ask.gap, ask.min_gap), ask.max_gap) == pytest.approx(delay)


@pytest.mark.parametrize("stated_by", ["sustained", "budget"])
def test_the_fleet_keeps_a_stated_pace_no_longer_than_it_holds(stated_by: str) -> None:
    """A stated pace ends (the window resets, the budget is renewed): the gate
    spaces a send at most until then (``min(last + gap, until)``), and the
    fleet's gap must not reserve the slot's next turn past it. A host stating
    one request per 90 s in a window that resets in 5 s is asked again in 5 s
    by each process's gate; a fleet's gap of 90 s held the next process 85 s
    longer than any of them would have waited alone."""
    clock = FakeClock()
    rules: Any = SimpleNamespace(signals=SimpleNamespace(hold_timeout=300.0, max_pause=300.0))
    fleet = Fleet(SimpleNamespace(), rules, clock=clock)
    ends = clock() + 5.0
    limits = (
        Limits(sustained_gap=90.0, sustained_until=ends)
        if stated_by == "sustained"
        else Limits(budget_gap=90.0, budget_until=ends)
    )
    slot: Any = SimpleNamespace(
        state=SimpleNamespace(delay=1.0, limits=limits),
        config=SimpleNamespace(min_delay=0.0, max_delay=60.0, max_concurrency=8),
    )
    ask = fleet.ask(slot)
    assert min(max(ask.gap, ask.min_gap), ask.max_gap) == pytest.approx(5.0)
    clock.advance(3.0)
    ask = fleet.ask(slot)
    assert min(max(ask.gap, ask.min_gap), ask.max_gap) == pytest.approx(2.0)
    clock.advance(2.5)  # ended: the process's own delay
    ask = fleet.ask(slot)
    assert min(max(ask.gap, ask.min_gap), ask.max_gap) == pytest.approx(1.0)

"""A model-based test of the fleet (``docs/fleet.md``) under concurrency and faults.

The example tests of ``test_redis*.py`` pin one interleaving each; here
hypothesis writes the scripts. Two "processes" share one event loop, each its
own :class:`~autothrottle.redis.RedisStore` on the same prefix (a prefix per
script) of the real Redis on 127.0.0.1:6379: the first serves two
:class:`~autothrottle.Throttle` objects, the second one. A script starts
requests (a throttle, one of two slots; a third of them have their
connection ready late, past their turn's slack, so the wire check takes a
new turn there or looks at theirs), finishes them (200, 429 with
``Retry-After``, a failure; a request not sent yet finishes so once sent),
cancels them (waiting for a turn, at the wire, or in flight), lets real time
pass, and injects faults into a store's next pipeline as
``test_redis_sender_faults.py`` does: its sender task cancelled mid-call, a
cancel of redis-py's own, a fault (before or after Redis ran it), Redis
failing (a connection error, before or after), a fault as Redis's answers are
settled. A request runs as an adapter's does: ``acquire``, then
``wire_wait`` until it is 0, then its response.

What is checked:

- **a sent turn is held as sent**: a request that goes on a fleet turn
  holds it as a finished request hands it back (its lease only): one
  still held as never sent would give the turn's time back at its release
  too, and the next turn would reach the host closer than the gap;
- **the fleet's cap**: when a request goes on a turn the fleet granted, the
  requests in flight on such turns, fleet-wide, are at most the slot's
  ``max_concurrency`` (and each throttle's own, counting the requests that
  went alone while a store counted Redis as down, at most that too);
- **no lease lost under a request**: after every step, each request in flight
  on a fleet turn still holds that turn's lease in Redis (a lease handed
  back under a request frees its place for another);
- **the fleet's pace**: the send times the fleet granted the turns requests
  went on (:class:`helpers.Grants`: Redis's own ``server + waited``), slot by
  slot, are never closer than the gap times the spacing margin;
- **nothing waits for ever**: each request is sent or cancelled within
  :data:`REQUEST_BOUND` real seconds, and raises nothing but its cancel;
- **no phantom reservation**: once every request is finished or cancelled
  and the stores' lingering hand-backs are sent, Redis holds no lease of the
  prefix;
- **no change lost**: by then, each store's latest change of each slot (what
  a response taught) went in a pipeline Redis answered.

Load-independence: Redis's clock is real (``TIME``), so the scripts run in
real time, with a short gap (:data:`GAP`). No verdict reads a real time: the
pace is judged on the times Redis granted (a process reaching its turn late
on a busy machine sends late; its grant does not move), the cap and the
leases at the instant a request goes or after a step (one event loop: the
count is exact), and the end after waiting for it with a generous bound.
Lateness only changes which paths run (turns handed back late, looks). The
stores get a long ``timeout``, so only the injected faults send them alone,
and a short ``retry_after``. ``min_delay = max_delay`` holds the gap whatever
a 429 does to the delay, so the pace has one figure.

``AUTOTHROTTLE_FLEET_EXAMPLES=200`` runs more scripts than the suite's.
Not covered: the sync client's threads (``acquire_blocking``), a Redis
Cluster, holds that expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
import redis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from autothrottle import FixedRatePolicy, Lease, Throttle
from autothrottle._fleet import SPACING_MARGIN
from autothrottle._fleet_wire import HeldTurn, NoTurn
from autothrottle.redis import RedisStore
from helpers import Grants, connected, needs_redis
from redis_keys import fresh_prefix

REDIS = "redis://127.0.0.1:6379/0"
GAP = 0.01
"""Seconds between the fleet's sends of a slot (its ``min_delay`` and ``max_delay``)."""
CAP = 2
"""Each slot's ``max_concurrency``, the fleet's and each throttle's."""
SLOTS = ("a.test", "b.test")
THROTTLES = (0, 0, 1)
"""Each throttle's store (process)."""
REQUEST_BOUND = 15.0
"""Real seconds a request is given to be sent (generous: a stranded one waits for ever)."""
SETTLE_BOUND = 15.0
"""Real seconds the stores are given to hand every lease back at the end."""
LATE_AT_WIRE = 0.03
"""Seconds a late request's connection takes to be ready after its turn: past
its turn's slack (a few ms at :data:`GAP`), so the wire check hands the turn
back and takes another there, or looks at it (the fleet's rule 1)."""
EPSILON = 5e-6
"""Seconds of rounding in the granted times (the scripts count in whole µs)."""

FAULTS = (
    "cancel-before",  # the sender task cancelled mid-call, before Redis ran the pipeline
    "cancel-after",  # ... after it ran
    "stray-after",  # a cancel of redis-py's own, the sender not cancelled
    "raise-before",  # a fault out of the client
    "raise-after",
    "error-before",  # Redis failing: a connection error
    "error-after",
    "settle",  # a fault as Redis's answers are settled
)


@dataclass(frozen=True)
class Start:
    throttle: int
    slot: int
    late: bool = False  # its connection is ready LATE_AT_WIRE after its turn


@dataclass(frozen=True)
class Finish:
    request: int  # among the requests started, modulo their number
    outcome: str  # "200", "429", "fail"


@dataclass(frozen=True)
class Cancel:
    request: int


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class Fault:
    store: int
    kind: str
    laden: bool  # it waits for a pipeline carrying finished leases or changes


Op = Start | Finish | Cancel | Advance | Fault

_start = st.builds(
    Start,
    st.sampled_from(range(len(THROTTLES))),
    st.sampled_from((0, 0, 0, 1)),
    st.sampled_from((False, False, True)),
)
ops = st.one_of(
    _start,
    _start,
    _start,
    st.builds(Finish, st.integers(0, 30), st.sampled_from(("200", "200", "429", "fail"))),
    st.builds(Cancel, st.integers(0, 30)),
    st.builds(Advance, st.sampled_from((0.0, 0.005, 0.02, 0.06))),
    st.builds(Advance, st.sampled_from((0.0, 0.005, 0.02))),
    st.builds(Fault, st.sampled_from((0, 1)), st.sampled_from(FAULTS), st.booleans()),
    st.builds(Fault, st.sampled_from((0, 1)), st.sampled_from(FAULTS), st.booleans()),
)
scripts = st.lists(ops, min_size=6, max_size=30)


@dataclass(eq=False)
class Request:
    index: int
    throttle: int
    slot: str
    outcome: asyncio.Future[str]
    late: bool = False
    task: asyncio.Task[None] | None = None
    lease: Lease | None = None
    fleet: str | None = None  # the fleet's lease it went on (None: alone)
    sent: bool = False
    ended: str = ""
    errors: list[str] = field(default_factory=list)


class Faults:
    """Faults waiting for a store's next pipelines, one a pipeline (``FAULTS``),
    and the store's changes: made (``changed``, numbered per slot) and merged
    (the number of the latest a pipeline Redis answered carried)."""

    def __init__(self, store: RedisStore) -> None:
        self.pending: list[tuple[str, bool]] = []
        self.struck: list[str] = []
        self.made: dict[str, int] = {}
        self.merged: dict[str, int] = {}
        self._built: dict[int, dict[str, int]] = {}
        send = store._send
        pipeline, settle = send._pipeline_async, send._settle
        changed, commands_of = send.changed, send._commands

        def counted(key: str, change: Any) -> None:
            self.made[key] = self.made.get(key, 0) + 1
            changed(key, change)

        def built(turns: Any, releases: Any, changes: dict[str, Any]) -> Any:
            commands = commands_of(turns, releases, changes)
            self._built[id(commands)] = {key: self.made[key] for key in changes}
            return commands

        async def run(client: Any, commands: Any) -> list[Any]:
            carried = self._built.pop(id(commands), {})
            results = await pipeline(client, commands)
            for key, made in carried.items():  # (a merge answers 1)
                self.merged[key] = max(self.merged.get(key, 0), made)
            return results

        async def broken_pipeline(client: Any, commands: Any) -> list[Any]:
            kind, laden = self.pending[0] if self.pending else ("", False)
            if kind == "settle" or not kind:
                return await run(client, commands)
            if laden and all(script in ("turn", "look") for script, _ in commands):
                return await run(client, commands)
            outer = send._sender
            if kind.startswith("cancel") and (outer is None or outer.done()):
                return await run(client, commands)  # not the sender's: left pending
            self.pending.pop(0)
            self.struck.append(kind)
            self._built.pop(id(commands), None)
            if kind.endswith("after"):
                await pipeline(client, commands)  # merged, and sent again (rule 7)
            if kind.startswith("cancel"):
                assert outer is not None
                outer.cancel()
                await asyncio.Event().wait()  # until the cancel reaches this call
            if kind.startswith("stray"):
                raise asyncio.CancelledError
            if kind.startswith("raise"):
                raise ValueError("a reply of a shape nobody expected")
            raise redis.ConnectionError("injected: Redis went away")

        def broken_settle(commands: Any, results: Any, turns: Any) -> None:
            if self.pending and self.pending[0][0] == "settle" and turns:
                self.struck.append(self.pending.pop(0)[0])
                raise ValueError("a reply of a shape nobody expected, as it was settled")
            settle(commands, results, turns)

        send._pipeline_async = broken_pipeline  # type: ignore[method-assign]
        send._settle = broken_settle  # type: ignore[method-assign]
        send.changed = counted  # type: ignore[method-assign]
        send._commands = built  # type: ignore[method-assign]

    def lost(self) -> dict[str, tuple[int, int]]:
        """The slots whose latest change made never reached Redis: (made, merged)."""
        return {
            key: (made, self.merged.get(key, 0))
            for key, made in self.made.items()
            if self.merged.get(key, 0) < made
        }


class Model:
    """The fleet, the requests the script started, and the checks."""

    def __init__(self, name: str, stores: list[RedisStore], admin: redis.Redis) -> None:
        self.name = name
        self.stores = stores
        self.admin = admin
        self.grants = [Grants(store) for store in stores]
        self.faults = [Faults(store) for store in stores]
        self.throttles = [
            Throttle(
                policy=FixedRatePolicy(1.0 / GAP),
                min_delay=GAP,
                max_delay=GAP,
                max_concurrency=CAP,
                max_pause=0.05,
                store=stores[store],
            )
            for store in THROTTLES
        ]
        self.requests: list[Request] = []
        self.failures: list[str] = []
        self.went: dict[str, list[str]] = {slot: [] for slot in SLOTS}  # fleet leases sent

    # -- the script -------------------------------------------------------------------

    async def apply(self, op: Op) -> None:
        if isinstance(op, Start):
            loop = asyncio.get_running_loop()
            request = Request(
                len(self.requests), op.throttle, SLOTS[op.slot], loop.create_future(), op.late
            )
            self.requests.append(request)
            request.task = asyncio.ensure_future(self.run(request))
        elif isinstance(op, Finish):
            if self.requests:
                request = self.requests[op.request % len(self.requests)]
                if not request.outcome.done():
                    request.outcome.set_result(op.outcome)
        elif isinstance(op, Cancel):
            if self.requests:
                request = self.requests[op.request % len(self.requests)]
                assert request.task is not None
                request.task.cancel()
        elif isinstance(op, Fault):
            self.faults[op.store].pending.append((op.kind, op.laden))
        await asyncio.sleep(op.seconds if isinstance(op, Advance) else 0.0)

    async def run(self, request: Request) -> None:
        """One request, as an adapter sends it: its turn, its wire, its response."""
        throttle = self.throttles[request.throttle]
        try:
            async with asyncio.timeout(REQUEST_BOUND):
                lease = request.lease = await throttle.acquire(request.slot)
                if request.late:
                    await asyncio.sleep(LATE_AT_WIRE)
                while (wait := lease.wire_wait()) > 0.0:  # noqa: ASYNC110 (an adapter's loop)
                    await asyncio.sleep(wait)
        except asyncio.CancelledError:
            request.ended = "cancelled waiting"
            if request.lease is not None:
                request.lease.release()
            raise
        except BaseException as error:
            request.ended = "failed"
            self.failures.append(f"request {request.index} raised {error!r}")
            if request.lease is not None:
                request.lease.release()
            return
        self.sent(request, lease)
        try:
            outcome = await request.outcome
        except asyncio.CancelledError:
            request.ended = "cancelled in flight"
            lease.release()
            raise
        request.ended = f"finished {outcome}"
        if outcome == "fail":
            lease.fail(ConnectionResetError("the host hung up"))
            lease.release()
        else:
            headers = {"Retry-After": "1"} if outcome == "429" else {}
            lease.finish(0.005, int(outcome), headers)

    # -- the checks ---------------------------------------------------------------------

    def sent(self, request: Request, lease: Lease) -> None:
        """The request goes: on the fleet's turn its lease's release hands back
        (as a sent turn: its lease only, not its time), or alone. The caps hold
        at this instant (one event loop: exact)."""
        on_release = lease.on_release
        if isinstance(on_release, HeldTurn):
            request.fleet = on_release.lease
        elif not isinstance(on_release, NoTurn):  # alone: its release only says it left
            self.failures.append(f"request {request.index} went holding {on_release!r}")
        request.sent = True
        self.went[request.slot].append(request.fleet or "")
        flying = [r for r in self.requests if r.sent and not r.ended and r.slot == request.slot]
        fleet = [r.index for r in flying if r.fleet is not None]
        if len(fleet) > CAP:
            self.failures.append(f"{request.slot}: {len(fleet)} in flight on fleet turns {fleet}")
        own = [r.index for r in flying if r.throttle == request.throttle]
        if len(own) > CAP:
            self.failures.append(f"throttle {request.throttle}: {len(own)} in flight {own}")

    def check_leases(self) -> None:
        """Every request in flight on a fleet turn still holds its lease in Redis."""
        flying = [r for r in self.requests if r.sent and not r.ended and r.fleet]
        if not flying:
            return
        pipe = self.admin.pipeline(transaction=False)
        for request in flying:
            pipe.zscore(f"{{{self.name}:{request.slot}}}:l", cast(str, request.fleet))
        for request, score in zip(flying, pipe.execute(), strict=True):
            if score is None and not request.ended:
                self.failures.append(
                    f"request {request.index} in flight on {request.fleet}: not in Redis"
                )

    def check_pace(self) -> None:
        """The fleet's granted times of the turns requests went on, slot by slot."""
        granted: dict[str, float] = {}
        for grants in self.grants:
            granted.update(grants.granted)
        for slot, leases in self.went.items():
            times = sorted(granted[lease] for lease in leases if lease)
            for earlier, later in itertools.pairwise(times):
                if later - earlier < GAP * SPACING_MARGIN - EPSILON:
                    self.failures.append(
                        f"{slot}: sends granted {1e3 * (later - earlier):.3f} ms apart"
                    )

    def leases_left(self) -> dict[str, int]:
        found = {}
        for key in self.admin.scan_iter(match=f"{{{self.name}:*}}:l", count=1000):
            count = int(self.admin.zcard(key))
            if count:
                found[key.decode()] = count
        return found

    async def drain(self) -> None:
        """No more faults; every request finishes (200) once sent; every lease goes
        back. Fails, rather than hangs, past the bounds."""
        for faults in self.faults:
            faults.pending.clear()
        for request in self.requests:
            if not request.outcome.done():
                request.outcome.set_result("200")
        tasks = [r.task for r in self.requests if r.task is not None]
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=2 * REQUEST_BOUND)
            for task in stuck:
                task.cancel()
                self.failures.append("a request never ended")
        deadline = time.monotonic() + SETTLE_BOUND
        left, lost = self.leases_left(), [f.lost() for f in self.faults]
        while (left or any(lost)) and time.monotonic() < deadline:
            for store in self.stores:
                await store.flush()
            await asyncio.sleep(0.02)
            left, lost = self.leases_left(), [f.lost() for f in self.faults]
        if left:
            self.failures.append(f"leases left in Redis: {left}")
        if any(lost):
            self.failures.append(f"changes never merged, per store (made, merged): {lost}")


async def run_script(script: list[Op]) -> Model:
    name = fresh_prefix("test-fleet-model")
    admin = redis.Redis.from_url(REDIS)
    stores = [RedisStore(REDIS, prefix=name, timeout=10.0, retry_after=0.05) for _ in range(2)]
    try:
        for store in stores:
            await connected(store)
        model = Model(name, stores, admin)
        for op in script:
            await model.apply(op)
            model.check_leases()
        await model.drain()
        model.check_pace()
        return model
    finally:
        for store in stores:
            with contextlib.suppress(Exception):
                await store.aclose()
        for key in admin.scan_iter(match=f"{{{name}:*", count=1000):
            admin.delete(key)
        admin.close()


@pytest.fixture(autouse=True)
def _needs_redis() -> None:
    needs_redis()


@settings(
    max_examples=int(os.environ.get("AUTOTHROTTLE_FLEET_EXAMPLES", "40")),
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(script=scripts)
def test_random_scripts_keep_the_fleets_promises(script: list[Op]) -> None:
    model = asyncio.run(run_script(script))
    assert not model.failures, model.failures
    for request in model.requests:
        event(f"a request {request.ended}")
        if request.sent:
            event("went on a fleet turn" if request.fleet else "went alone")
        if request.late:
            event("its connection ready late")
    for faults in model.faults:
        for kind in faults.struck:
            event(f"fault struck: {kind}")

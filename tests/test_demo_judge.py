"""The demo's judge, with fixed numbers: a host bound by its workers is judged in its own time.

A site is judged by what it counted itself (``docs/sim.md``); these hosts are
recorded by hand, request by request, at set times: no server, no clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from autothrottle.cli._demo import _p90, _tick
from autothrottle.cli._demo_crawl import Tally
from autothrottle.cli._demo_judge import Figures, Outcome
from autothrottle.cli._demo_sites import Site
from autothrottle.cli._demo_view import BUSY_LATENESS, busy_note
from autothrottle.sim import CDN, Capacity, HostStats
from autothrottle.sim._stats import Recorder

ORIGIN = Capacity(workers=4, service_time=0.05)  # 80 pages a second at full speed


def _host(page: float, in_service: int, seconds: float = 20.0, queued: int = 0) -> HostStats:
    """``in_service`` of the host's workers busy all the time, each page ``page``
    seconds, ``queued`` more requests waiting all the time."""
    rec = Recorder(0.0)
    waiting = [rec.arrive(0.0) for _ in range(queued)]
    for ticket in waiting:
        rec.wait(ticket, 0.0)
    for worker in range(in_service):
        t = worker * page / in_service  # staggered, as a steady crawl keeps them
        while t + page <= seconds:
            ticket = rec.arrive(t)
            rec.begin(ticket, t)
            rec.done(ticket, t + page, 200, "ok")
            t += page
    for ticket in waiting:
        rec.begin(ticket, seconds)
        rec.done(ticket, seconds, 200, "ok")
    return rec.snapshot(
        host="127.0.0.9",
        url="",
        behaviour=ORIGIN.spec,
        capacity=ORIGIN.capacity,
        origin_time=0.0,
        now=seconds,
    )


def _verdict(stats: HostStats) -> str:
    site = Site("127.0.0.9", "slow origin", "", ORIGIN, "httpx")
    return Outcome(site, Tally(), stats, 0.0).verdict()


def test_every_worker_busy_on_a_busy_machine_is_the_pace_found() -> None:
    # The machine is busy: the 50 ms page takes 80 ms, 50 pages a second in
    # all, 62 % of the 80 the workers serve at full speed. Every worker was
    # busy all the time, and nothing waited: the crawl used all the host had.
    slow = _host(page=0.08, in_service=4)
    figures = Figures.judged(slow)
    assert 48.0 < figures.goodput < 51.0
    assert figures.mean_in_service > 3.8
    assert _verdict(slow).startswith("found the pace: its 4 workers busy")


def test_idle_workers_are_too_cautious_however_fast_their_pages() -> None:
    # Two of four workers busy at full speed: 40 pages a second, half the host.
    half = _host(page=0.05, in_service=2)
    assert _verdict(half).startswith("too cautious: its 4 workers busy 50% of the time")


def test_a_queue_longer_than_the_workers_is_pushed_too_hard() -> None:
    piled = _host(page=0.05, in_service=4, queued=5)
    assert _verdict(piled).startswith("pushed too hard")


def test_a_cache_s_origin_with_misses_waiting_is_not_too_cautious() -> None:
    # Misses reach a 2-worker origin in bursts: its workers busy 72 % of the
    # time, and 0.6 requests waiting for one on average. The crawl held 2.0
    # requests there on average, all the origin's workers' worth.
    cdn = CDN(hit_ratio=0.9, origin=Capacity(workers=2, service_time=0.2), edge_time=0.005)
    origin = dataclasses.replace(
        _host(page=0.2, in_service=2),
        mean_in_service=1.44,
        mean_queued=0.6,
        goodput=7.2,
        records=(),
        first_arrival=None,
    )
    front = dataclasses.replace(origin, goodput=80.0, origin=origin)
    site = Site("127.0.0.9", "CDN", "", cdn, "aiohttp")
    verdict = Outcome(site, Tally(), front, 0.0).verdict()
    assert verdict.startswith("found the pace: its origin's 2 workers busy 72% of the time")
    calm = dataclasses.replace(origin, mean_queued=0.0)
    quiet = dataclasses.replace(front, origin=calm)
    assert Outcome(site, Tally(), quiet, 0.0).verdict().startswith("too cautious")


# -- a busy machine -----------------------------------------------------------------------


def test_a_loop_that_kept_time_gets_no_busy_note() -> None:
    assert busy_note(0.0, 0.3, 2) is None
    assert busy_note(BUSY_LATENESS * 0.9, 12.0, 2) is None  # the loop, not the load, decides


def test_a_late_loop_gets_a_note_with_its_lateness_and_the_load() -> None:
    note = busy_note(0.054, 10.63, 2)
    assert note is not None
    text = note.plain
    assert "load 10.6 on 2 cores" in text and "54 ms late" in text and "too cautious" in text
    bare = busy_note(BUSY_LATENESS, None, None)  # no load average on this system
    assert bare is not None and "load" not in bare.plain and "10 ms late" in bare.plain


def test_the_ticker_sees_a_loop_held_back() -> None:
    # A callback that holds the loop 150 ms makes the ticker's next wake-up at
    # least that late (a lower bound: more load only makes it later).
    async def scenario() -> list[float]:
        lateness: list[float] = []
        ticking = asyncio.create_task(_tick(lateness, every=0.01))
        await asyncio.sleep(0.05)
        time.sleep(0.15)  # noqa: ASYNC251 (holding the loop is the point)
        await asyncio.sleep(0.05)
        ticking.cancel()
        await asyncio.gather(ticking, return_exceptions=True)
        return lateness

    lateness = asyncio.run(scenario())
    assert max(lateness) >= 0.14 - 0.01
    assert all(late >= 0.0 for late in lateness)
    assert _p90([0.0] * 9 + [1.0]) == 1.0 and _p90([]) == 0.0

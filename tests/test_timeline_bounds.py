"""A Timeline's memory bounds: idle slots held as runs, and ``max_slots``.

A slot whose snapshot does not change after a quiet sample adds no entry, yet
``samples()``, ``rate()``, ``busiest()``, the chart, the ``jsonl`` stream and
``read_jsonl`` give what sampling it every time gave. At most ``max_slots``
slots are kept, the one idle longest forgotten first. Fake throttle, fake clock.
"""

from __future__ import annotations

import asyncio
import json
import random
import tracemalloc
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from autothrottle import SlotSnapshot, Throttle
from autothrottle.timeline import SlotSample, Timeline
from autothrottle.timeline._record import _sample_line
from helpers import FakeClock, FakeThrottle

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def held(timeline: Timeline, key: str) -> int:
    """The entries ``key``'s series holds (a run of repeats is one)."""
    return sum(1 for _ in timeline._series[key].stored())


class Partial(FakeThrottle):
    """A fake throttle whose snapshot holds the ``present`` slots only."""

    def __init__(self) -> None:
        super().__init__()
        self.present: list[str] = []

    def snapshot(self) -> Mapping[str, SlotSnapshot]:
        return {key: self.slots[key] for key in self.present}


class Crawl:
    """A fake throttle driven tick by tick, and the samples a timeline that kept
    every sample as its own must hold (computed here, not by the timeline)."""

    def __init__(self, timeline_kwargs: dict[str, Any] | None = None) -> None:
        self.clock = FakeClock(100.0)
        self.fake = Partial()
        self.timeline = Timeline(
            self.fake, interval=0.1, clock=self.clock, **(timeline_kwargs or {})
        )
        self.expected: dict[str, list[SlotSample]] = {}
        self.tick = 0

    def step(self, busy: dict[str, int], present: list[str]) -> None:
        """One interval: each ``busy`` key gets that many responses (0: a change of
        state only), every key of ``present`` is in the snapshot; then a sample."""
        for key, n in busy.items():
            before = self.fake.slots.get(key)
            total = (before.responses if before else 0) + n
            self.fake.set(
                key,
                sent=total + 1,
                responses=total,
                status_counts={200: total} if total else {},
                in_flight=self.tick % 2,
                delay=0.5 + 0.1 * (self.tick % 3),
                last_latency=0.01 * (1 + self.tick % 5),
            )
        self.fake.present = present
        t = round(self.tick * 0.1, 10)
        for key in present:
            snap = self.fake.slots[key]
            n = busy.get(key, 0)
            first = key not in self.expected or self.expected[key][-1].time < t - 0.15
            if first:  # counts from zero, as a slot seen anew does
                n = snap.responses
            self.expected.setdefault(key, []).append(
                SlotSample(
                    time=t,
                    delay=snap.delay,
                    latency=snap.last_latency,
                    in_flight=snap.in_flight,
                    queued=snap.queued,
                    responses=n,
                    statuses={200: n} if n else {},
                )
            )
        self.timeline.sample()
        self.clock.advance(0.1)
        self.tick += 1


def assert_same_samples(got: list[SlotSample], want: list[SlotSample]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.time == pytest.approx(w.time, abs=1e-6)
        assert (g.delay, g.latency, g.in_flight, g.queued, g.responses, dict(g.statuses)) == (
            w.delay,
            w.latency,
            w.in_flight,
            w.queued,
            w.responses,
            dict(w.statuses),
        )


def reference_rate(samples: list[SlotSample], window: float) -> float:
    end = samples[-1].time
    inside = [s for s in samples if end - s.time <= window + 1e-9]
    span = end - inside[0].time
    return sum(s.responses for s in inside[1:]) / span if span > 0 else 0.0


def mixed_crawl(ticks: int = 600, **timeline_kwargs: Any) -> Crawl:
    """Three slots over a minute: ``busy`` at work in bursts, ``idle`` at work
    once then idle, ``gone`` leaving the snapshot and coming back."""
    crawl = Crawl(timeline_kwargs)
    rng = random.Random(7)
    for tick in range(ticks):
        busy: dict[str, int] = {}
        if tick % 100 < 30:  # a 3-s burst every 10 s
            busy["busy"] = rng.randint(0, 3)
        if tick < 5:
            busy["idle"] = 2
        present = ["busy", "idle"]
        if not 200 <= tick < 260:
            present.append("gone")
            if tick in (0, 300):
                busy["gone"] = 1
        crawl.step(busy, present)
    return crawl


def test_an_idle_slot_holds_one_entry_and_gives_every_sample_back() -> None:
    crawl = mixed_crawl()
    timeline = crawl.timeline
    for key in ("busy", "idle", "gone"):
        assert_same_samples(timeline.samples(key), crawl.expected[key])
    assert len(timeline.samples("idle")) == 600
    # Its 5 samples at work, and one run (a quiet sample and its repeats) for the rest.
    assert held(timeline, "idle") == 6
    assert held(timeline, "busy") < 250  # 6 bursts of 30 samples, a run after each
    for window in (0.25, 1.0, 3.0, 30.0):
        for key in ("busy", "idle", "gone"):
            want = reference_rate(crawl.expected[key], window)
            assert timeline.rate(key, window) == pytest.approx(want, rel=1e-6), (key, window)
    totals = {key: sum(s.responses for s in crawl.expected[key]) for key in crawl.expected}
    assert timeline.busiest(3) == sorted(totals, key=lambda k: -totals[k])


def test_samples_further_apart_than_the_window_still_give_a_rate() -> None:
    # interval_per_slot over many slots spaces samples 10 s apart: a 1-s window
    # holds the newest alone, and the rate is over the gap back to the one before.
    clock, fake = FakeClock(100.0), FakeThrottle()
    timeline = Timeline(fake, clock=clock)
    for responses in (0, 30, 80):
        fake.set("a", responses=responses)
        timeline.sample()
        clock.now += 10.0
    assert timeline.rate("a", window=1.0) == pytest.approx(5.0)  # 50 in the last 10 s
    assert timeline.rate("a", window=25.0) == pytest.approx(4.0)  # 80 over 20 s


def test_max_samples_counts_the_repeats_and_cuts_a_run_where_it_must() -> None:
    crawl = mixed_crawl(max_samples=250)
    for key in ("busy", "idle", "gone"):
        assert_same_samples(crawl.timeline.samples(key), crawl.expected[key][-250:])
    assert held(crawl.timeline, "idle") == 1  # the run alone, its head moved


def test_the_stream_writes_a_run_as_one_line_and_reads_back_the_same(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    crawl = mixed_crawl(jsonl=path)
    timeline = crawl.timeline
    timeline.close()
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["version"] == 2
    assert len(lines) < 300  # 1,800 samples taken
    loaded = Timeline.read_jsonl(path)
    assert loaded.keys == timeline.keys
    for key in timeline.keys:
        assert_same_samples(loaded.samples(key), crawl.expected[key])
        assert held(loaded, key) == held(timeline, key)
    again = Timeline.read_jsonl(timeline.write_jsonl(tmp_path / "w.jsonl"))
    for key in timeline.keys:
        assert_same_samples(again.samples(key), crawl.expected[key])


def test_a_file_of_every_sample_written_before_loads_the_same(tmp_path: Path) -> None:
    crawl = mixed_crawl()
    path = tmp_path / "v1.jsonl"
    header = {"format": "autothrottle-timeline", "version": 1, "interval": 0.1}
    lines = [header]
    for tick in range(600):  # as a version 1 recorder wrote: every sample, tick by tick
        t = round(tick * 0.1, 10)
        for key, samples in crawl.expected.items():
            lines.extend(_sample_line(key, s) for s in samples if abs(s.time - t) < 1e-9)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    loaded = Timeline.read_jsonl(path)
    for key in crawl.expected:
        assert_same_samples(loaded.samples(key), crawl.expected[key])
        assert held(loaded, key) == held(crawl.timeline, key)  # held as runs too


def test_a_slot_back_in_the_same_state_keeps_the_gap_it_was_gone(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    crawl = Crawl({"jsonl": path})
    crawl.step({"a": 0}, ["a"])  # never a response: every sample quiet, in the same state
    for tick in range(1, 21):
        crawl.step({}, [] if 10 <= tick < 15 else ["a"])
    crawl.timeline.close()
    times = [round(s.time, 6) for s in crawl.timeline.samples("a")]
    assert times == [round(0.1 * i, 6) for i in (*range(10), *range(15, 21))]
    assert_same_samples(Timeline.read_jsonl(path).samples("a"), crawl.expected["a"])


def test_stop_writes_the_run_under_way(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    clock, fake = FakeClock(), FakeThrottle()
    timeline = Timeline(fake, interval=0.1, clock=clock, jsonl=path)
    fake.set("a", responses=1, status_counts={200: 1})
    for _ in range(50):
        timeline.sample()
        clock.advance(0.1)
    assert len(path.read_text().splitlines()) == 3  # header, the response, the quiet sample
    timeline.close()
    assert len(Timeline.read_jsonl(path).samples("a")) == 50


async def test_leaving_async_with_writes_the_run_under_way(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    clock, fake = FakeClock(), FakeThrottle()
    fake.set("a", responses=1, status_counts={200: 1})
    async with Timeline(fake, interval=0.001, clock=clock, jsonl=path) as timeline:
        for _ in range(100):
            clock.advance(0.1)
            timeline.sample()
    loaded = Timeline.read_jsonl(path)
    assert len(loaded.samples("a")) == len(timeline.samples("a")) > 100


def test_the_chart_of_an_idle_slot_draws(tmp_path: Path) -> None:
    crawl = mixed_crawl()
    path = crawl.timeline.plot(tmp_path / "c.png", keys=["busy", "idle", "gone"])
    assert path.read_bytes().startswith(PNG_MAGIC)


# -- max_slots ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error"), [(0, ValueError), (-5, ValueError), (2.5, TypeError), (True, TypeError)]
)
def test_max_slots_is_checked_at_construction(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=rf"max_slots.*{value!r}"):
        Timeline(FakeThrottle(), max_slots=value)  # type: ignore[arg-type]


def test_a_slot_met_past_max_slots_takes_the_place_of_the_one_idle_longest() -> None:
    clock, fake = FakeClock(), FakeThrottle()
    timeline = Timeline(fake, clock=clock, max_slots=3)

    def step(**changes: dict[str, Any]) -> None:
        for key, values in changes.items():
            fake.set(key, **values)
        timeline.sample()
        clock.advance(0.1)

    at_work, idle = {"queued": 1}, {"queued": 0}
    step(a=at_work, b=at_work, c=at_work)
    step(a=idle, b={"responses": 1}, c={"responses": 1})
    del fake.slots["a"]  # gone from the throttle
    step(b=idle, c={"responses": 2})
    step(c={"responses": 3}, d=at_work)
    assert timeline.keys == ("b", "c", "d")  # a, idle longest, forgotten
    assert timeline.samples("a") == []
    step(e=at_work)
    assert timeline.keys == ("c", "d", "e")  # then b
    # Every slot kept at work: a slot met now is not kept, and they keep every sample.
    step(c={"responses": 4}, f=at_work)
    step(c={"responses": 5}, f={"responses": 1})
    assert timeline.keys == ("c", "d", "e")
    assert len(timeline.samples("c")) == 7
    step(d=idle)  # f's change then (quiet, after its response) finds d's place
    assert timeline.keys == ("c", "e", "f")
    step(f={"responses": 2})
    assert [s.responses for s in timeline.samples("f")] == [0, 1]  # from there on


def test_read_jsonl_keeps_the_slots_and_spacing_the_recorder_kept(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    crawl = Crawl({"max_slots": 5, "interval_per_slot": 0.002, "jsonl": path})
    for wave in range(4):  # four waves of 5 hosts, each at work 11 ticks then idle 9
        keys = [f"w{wave}-{i}" for i in range(5)]
        for tick in range(20):  # (in flight at odd ticks: none after the 11th)
            crawl.step({key: 1 for key in keys} if tick < 11 else {}, keys)
    crawl.timeline.close()
    assert crawl.timeline.keys == tuple(f"w3-{i}" for i in range(5))
    loaded = Timeline.read_jsonl(path)
    assert loaded.max_slots == 5 and loaded.keys == crawl.timeline.keys
    assert loaded.interval_per_slot == crawl.timeline.interval_per_slot == 0.002
    for key in loaded.keys:
        assert_same_samples(loaded.samples(key), crawl.expected[key])
    assert len(Timeline.read_jsonl(path, max_slots=100).keys) == 20


def test_a_thousand_idle_slots_for_a_minute_hold_little_memory() -> None:
    clock, fake = FakeClock(), FakeThrottle()
    for i in range(1000):
        fake.set(f"h{i}", responses=1, status_counts={200: 1})
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        timeline = Timeline(fake, interval=0.1, clock=clock, max_slots=1000)
        for _ in range(600):  # one minute at 0.1 s: 600,000 samples taken
            timeline.sample()
            clock.advance(0.1)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(timeline.samples("h999")) == 600
    assert used < 5_000_000, used  # about 1.4 MB, a series each; a sample each was 150 MB


async def test_the_sampling_task_lets_the_loop_run_while_it_reads_many_slots() -> None:
    clock = FakeClock()
    throttle = Throttle(start_delay=0.0, clock=clock, wall_clock=clock.wall)
    for i in range(3000):
        lease = throttle.try_acquire(f"h{i}.test")
        assert lease is not None
        lease.finish(0.01, 200)
    turns = 0
    done = False

    async def other_task() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(other_task())
    await asyncio.sleep(0)
    timeline = Timeline(throttle, clock=clock, max_slots=3000)
    before = turns
    await timeline._sample_async()  # what the task and stop() take: 1,000 slots at a time
    assert turns - before >= 2
    assert len(timeline.keys) == 3000
    done = True
    await other


async def test_the_sampling_task_waits_longer_the_more_slots_it_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    fake = FakeThrottle()
    for i in range(10):
        fake.set(f"h{i}")
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:  # the task's waits, on the fake clock
        waits.append(seconds)
        clock.advance(seconds)
        await real_sleep(0)

    async def until(count: int) -> None:
        for _ in range(1000):
            if len(waits) >= count:
                return
            await real_sleep(0)
        raise AssertionError(f"the task waited {len(waits)} times, not {count}")

    monkeypatch.setattr(asyncio, "sleep", sleep)
    timeline = Timeline(fake, interval=0.25, interval_per_slot=0.1, clock=clock)
    await timeline.start()
    await until(2)
    for i in range(10, 40):
        fake.set(f"h{i}")
    await until(3)
    await timeline.stop()
    assert waits[:3] == pytest.approx([1.0, 1.0, 4.0])  # 0.1 s a slot read, over 0.25 s

    waits.clear()
    few = Timeline(fake, interval=0.25, interval_per_slot=0.001, clock=clock)
    await few.start()
    await until(2)
    await few.stop()
    assert waits[:2] == [0.25, 0.25]  # 40 slots at 1 ms: the interval holds
    with pytest.raises(ValueError, match="interval_per_slot"):
        Timeline(fake, interval_per_slot=-1.0)

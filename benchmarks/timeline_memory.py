"""What a Timeline holds after a long run over many hosts, and what a sample costs.

Run with ``python benchmarks/timeline_memory.py`` (about a minute; ``--hosts``,
``--minutes``, ``--interval``, ``--pattern``, ``--max-slots``). A fake throttle
on a fake clock (no sleeps) is sampled every ``interval`` for ``minutes``:

* ``busy``: every slot changes at every sample (responses, latency, in flight),
  the worst case, which only ``max_slots`` and ``max_samples`` bound;
* ``crawl``: each host is busy for 30 s, the hosts one after another (about
  50 at once with the defaults), and idle in the snapshot the rest of the run,
  as in a crawl of many hosts whose slots the throttle still holds;
* ``idle``: every slot in the snapshot, unchanged after its first sample.

It prints the memory the timeline holds (tracemalloc), the samples it gives
back (``samples()`` of every slot, counted, not built), the bytes a sample and a
slot's series cost, the CPU time ``sample()`` takes per slot sampled (a second
pass without tracemalloc, over at most 600 samples) and, with ``--bytecodes``,
the bytecodes it runs per slot sampled (``sys.settrace`` over 20 samples after
the first 580, a count that does not depend on the machine's load).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import inspect
import time
import tracemalloc
from collections.abc import Mapping
from typing import Any

from _bytecodes import BytecodeCount

from autothrottle import SlotSnapshot
from autothrottle.timeline import Timeline

BUSY_SECONDS = 30.0
"""How long each host of the ``crawl`` pattern is busy."""


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeThrottle:
    """Snapshots set by the benchmark: a slot that does not change keeps its object."""

    def __init__(self, hosts: int) -> None:
        self.slots: dict[str, SlotSnapshot] = {
            f"host{i}.test": SlotSnapshot(
                key=f"host{i}.test",
                delay=0.5,
                in_flight=0,
                queued=0,
                last_latency=None,
                sent=0,
                responses=0,
                failures=0,
            )
            for i in range(hosts)
        }

    def snapshot(self) -> Mapping[str, SlotSnapshot]:
        return self.slots

    def work(self, key: str, tick: int) -> None:
        """One interval's traffic on ``key``: responses, a latency, requests in flight."""
        old = self.slots[key]
        responses = old.responses + 1 + tick % 3
        self.slots[key] = dataclasses.replace(
            old,
            sent=responses + tick % 4,
            responses=responses,
            status_counts={200: responses},
            last_latency=0.05 + 0.001 * (tick % 50),
            in_flight=tick % 4,
            delay=0.1 + 0.01 * (tick % 7),
        )


def busy_keys(pattern: str, keys: list[str], tick: int, interval: float) -> list[str]:
    if pattern == "busy":
        return keys
    if pattern == "idle":
        return []
    # crawl: host i is busy from i * spacing for BUSY_SECONDS
    now = tick * interval
    spacing = BUSY_SECONDS / 50  # about 50 hosts busy at once
    first = max(0, int((now - BUSY_SECONDS) / spacing) + 1)
    last = min(len(keys) - 1, int(now / spacing))
    return keys[first : last + 1]


def run(
    args: argparse.Namespace, ticks: int, *, trace: bool, count: bool = False
) -> dict[str, Any]:
    clock = FakeClock()
    fake = FakeThrottle(args.hosts)
    keys = list(fake.slots)
    kwargs: dict[str, Any] = {"interval": args.interval, "clock": clock}
    if args.max_slots is not None:
        kwargs["max_slots"] = args.max_slots
    gc.collect()
    if trace:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0] if trace else 0
    timeline = Timeline(fake, **kwargs)
    spent = 0.0
    counted = BytecodeCount()

    for tick in range(ticks):
        for key in busy_keys(args.pattern, keys, tick, args.interval):
            fake.work(key, tick)
        traced = count and tick >= ticks - 20
        with counted if traced else contextlib.nullcontext():
            start = time.perf_counter()
            timeline.sample()
            spent += time.perf_counter() - start
        clock.now += args.interval
    held = 0
    if trace:
        gc.collect()
        # What the fake throttle's snapshots hold is the throttle's, not the timeline's.
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
    samples = sum(len(timeline.samples(key)) for key in timeline.keys)
    return {
        "held": held,
        "samples": samples,
        "slots": len(timeline.keys),
        "spent": spent,
        "sampled": ticks * args.hosts,
        "bytecodes": counted.total / (20 * args.hosts),
    }


def series_overhead() -> float:
    """Bytes a slot's series costs beyond its samples: 1,000 slots with one sample each."""
    every = 1000 if "max_slots" in inspect.signature(Timeline).parameters else None
    args = argparse.Namespace(hosts=1000, interval=0.1, max_slots=every, pattern="idle")
    one = run(args, 1, trace=True)
    return float(one["held"]) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--pattern", choices=("busy", "crawl", "idle"), default="crawl")
    parser.add_argument("--max-slots", type=int, default=None)
    parser.add_argument(
        "--bytecodes", action="store_true", help="also count the bytecodes sample() runs"
    )
    args = parser.parse_args()
    ticks = round(args.minutes * 60 / args.interval)
    print(
        f"{args.hosts:,} hosts, {args.minutes:g} min at {args.interval:g} s "
        f"({ticks:,} samples of each), pattern {args.pattern}"
        + (f", max_slots={args.max_slots}" if args.max_slots is not None else "")
    )
    memory = run(args, ticks, trace=True)
    print(
        f"held: {memory['held'] / 2**20:,.1f} MiB for {memory['samples']:,} samples "
        f"of {memory['slots']:,} slots "
        f"({memory['held'] / max(memory['samples'], 1):,.0f} bytes a sample given back)"
    )
    print(f"a slot's series with one sample: {series_overhead():,.0f} bytes")
    cpu = run(args, min(ticks, 600), trace=False)
    print(f"sample(): {1e6 * cpu['spent'] / cpu['sampled']:.2f} µs a slot sampled (CPU)")
    if args.bytecodes:
        counted = run(args, 600, trace=False, count=True)
        print(f"sample(): {counted['bytecodes']:,.1f} bytecodes a slot sampled")


if __name__ == "__main__":
    main()

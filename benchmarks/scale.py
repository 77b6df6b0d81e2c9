"""Scale: memory per slot, per-request cost, and idle-slot eviction at 10 to 10^5 slots.

Run with ``python benchmarks/scale.py`` (well under a minute on 2 cores; no
network, no sockets: the throttle is driven directly through its lease API).
``--smoke`` runs every part at 10 and 1,000 slots in short rounds (a second
or two, no figure worth reading): what the test suite runs to keep it working.

What it measures, at 10, 10^3 and 10^5 slots of one
``Throttle(start_delay=0, max_delay=60, max_concurrency=8)``:

* memory per slot: bytes still allocated (tracemalloc) after each of N slots
  has taken and released one lease and observed one response, divided by N.
  The key strings are made before tracing starts: they are the caller's.
* per-request cost: mean microseconds of the whole fast path
  ``lease = await throttle.acquire(key)``, ``lease.observe(latency=0.01,
  status=200)``, ``lease.release()`` under asyncio, round-robin over the N
  slots, many thousand times. A fake clock that moves 10 ms per reading keeps
  every slot's gate open (each slot has learned a 10 ms delay), so every
  request takes the fast path, which the benchmark checks; the store never
  sweeps in the timed loop (``idle_timeout=inf``) because eviction is
  measured on its own.
* eviction: a ``MemoryStore(idle_timeout=60)`` on a hand-moved clock holds
  10^5 idle slots and 100 slots with a request in flight; the clock moves past
  the idle timeout, a new key arrives (eviction runs as new slots are made),
  and the store shrinks to the busy slots, which are kept until their
  requests finish and they have then been idle for the timeout too.

What an evicted slot forgets: everything it learned. Its delay, the floor it
learned from its last refusal (429/503, block, failure), any pause or
rate-limit budget from headers, its counters (sent, responses, statuses,
backoffs) and its policy state. The next request to that key makes a fresh
slot at ``start_delay`` and goes at once. An evicted slot has sent nothing for
at least ``idle_timeout`` seconds, so its last pace is stale anyway. (As
written, a pause alone does not keep a slot: keep ``idle_timeout`` above the
throttle's ``max_pause``, as the defaults of 600 s and 300 s do, or a slot
paused by ``Retry-After`` could be forgotten and hit again early.)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import linecache
import math
import statistics
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import add_results_option, print_table, write_results

from autothrottle import Lease, Throttle
from autothrottle.store import MemoryStore

SIZES = (10, 1_000, 100_000)
ROUNDS = 5
PER_ROUND = 40_000
EVICT_SLOTS = 100_000
BUSY_SLOTS = 100
IDLE_TIMEOUT = 60.0
_SRC = str(Path(__file__).resolve().parent.parent / "src" / "autothrottle")


def _throttle(store: MemoryStore, clock: Callable[[], float]) -> Throttle:
    return Throttle(start_delay=0.0, max_delay=60.0, max_concurrency=8, store=store, clock=clock)


def _ticking_clock() -> Callable[[], float]:
    """A fake clock read at C speed that moves 10 ms per reading."""
    return itertools.count(0.0, 0.01).__next__


class _HandClock:
    """A fake clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _store_table_bytes() -> int:
    """Traced bytes allocated in ``_store.py`` now: the store's own dict table."""
    if not tracemalloc.is_tracing():
        return 0
    stats = tracemalloc.take_snapshot().statistics("filename")
    return sum(s.size for s in stats if s.traceback[0].filename.endswith("_store.py"))


async def _request(throttle: Throttle, key: str) -> None:
    lease = await throttle.acquire(key)
    lease.observe(latency=0.01, status=200)
    lease.release()


def _keys(n: int, prefix: str = "host") -> list[str]:
    return [f"{prefix}-{i}.example" for i in range(n)]


# -- (a) memory per slot ------------------------------------------------------------


async def memory_per_slot(n: int) -> dict[str, Any]:
    keys = _keys(n)
    throttle = _throttle(MemoryStore(idle_timeout=math.inf), _ticking_clock())
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for key in keys:
            await _request(throttle, key)
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
        sites = tracemalloc.take_snapshot().statistics("lineno")
    finally:
        tracemalloc.stop()
    top = [
        {
            "site": f"{Path(s.traceback[0].filename).name}:{s.traceback[0].lineno}",
            "code": linecache.getline(s.traceback[0].filename, s.traceback[0].lineno).strip(),
            "bytes_per_slot": round(s.size / n, 1),
        }
        for s in sites
        if s.traceback[0].filename.startswith(_SRC)
    ][:6]
    return {"slots": n, "bytes_per_slot": round(used / n, 1), "top_sites": top}


# -- (b) per-request cost -----------------------------------------------------------


class _Bench:
    """One throttle with N slots, all created and warmed up, ready for timed rounds."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.keys = _keys(n)
        self.throttle = _throttle(MemoryStore(idle_timeout=math.inf), _ticking_clock())
        self.ring = itertools.cycle(self.keys)
        self.round_us: list[float] = []
        self.new_slot_us = 0.0

    async def prepare(self) -> None:
        started = time.perf_counter()
        for key in self.keys:
            await _request(self.throttle, key)
        self.new_slot_us = (time.perf_counter() - started) / self.n * 1e6
        # Every slot has learned its delay; one more pass (capped) warms up.
        for key in self.keys[:10_000]:
            await _request(self.throttle, key)

    async def run_round(self) -> None:
        throttle = self.throttle
        batch = list(itertools.islice(self.ring, PER_ROUND))
        started = time.perf_counter()
        for key in batch:
            lease: Lease = await throttle.acquire(key)
            lease.observe(latency=0.01, status=200)
            lease.release()
        self.round_us.append((time.perf_counter() - started) / PER_ROUND * 1e6)

    def result(self) -> dict[str, Any]:
        slots = list(self.throttle.slots())
        # The timed rounds measure the turn taken at once: a sample of the slots
        # must still grant a turn without a wait (try_acquire never queues).
        queued = 0
        for key in self.keys[:100]:
            lease = self.throttle.try_acquire(key)
            if lease is None:
                queued += 1
            else:
                lease.release()
        in_flight = sum(slot.in_flight for slot in slots)
        if queued or in_flight or len(slots) != self.n:
            raise RuntimeError(f"not the fast path: {queued=} {in_flight=} slots={len(slots)}")
        return {
            "slots": self.n,
            "requests": len(self.round_us) * PER_ROUND,
            "us_per_request": round(statistics.fmean(self.round_us), 3),
            "us_per_request_rounds": [round(us, 3) for us in self.round_us],
            "us_first_request_new_slot": round(self.new_slot_us, 3),
        }


async def request_cost(sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    """Time all sizes in interleaved rounds, so background load hits each alike."""
    benches = [_Bench(n) for n in sizes]
    for bench in benches:
        await bench.prepare()
    for _ in range(ROUNDS):
        for bench in benches:
            await bench.run_round()
    return [bench.result() for bench in benches]


# -- (c) eviction -------------------------------------------------------------------


async def eviction(trace: bool) -> dict[str, Any]:
    """Fill a store, let it go idle, and watch a new key sweep it.

    With ``trace`` the figures are memory (tracemalloc on); without, timings.
    """
    keys = _keys(EVICT_SLOTS)
    busy_keys = _keys(BUSY_SLOTS, "busy")
    clock = _HandClock()
    store = MemoryStore(idle_timeout=IDLE_TIMEOUT)
    throttle = _throttle(store, clock)
    gc.collect()
    if trace:
        tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for key in keys:
            await _request(throttle, key)
        held = [await throttle.acquire(key) for key in busy_keys]
        learned_delay = throttle.slot(keys[0]).delay
        gc.collect()
        slots_before = len(store)
        mem_before = tracemalloc.get_traced_memory()[0] - base
        table_before = _store_table_bytes()

        # A quiet spell longer than idle_timeout, then one new host: its slot
        # evicts a batch of the least recently used; then the whole sweep.
        clock.now = IDLE_TIMEOUT + 1.0
        started = time.perf_counter()
        await _request(throttle, "new-0.example")
        batch_ms = (time.perf_counter() - started) * 1e3
        batch_evicted = slots_before - len(store) + 1
        started = time.perf_counter()
        throttle.evict_idle()
        sweep_ms = (time.perf_counter() - started) * 1e3
        gc.collect()
        slots_after = len(store)
        mem_after = tracemalloc.get_traced_memory()[0] - base
        table_after = _store_table_bytes()
        busy_kept = sum(1 for key in busy_keys if store.load(key) is not None)
        # The forgotten slot starts over at start_delay.
        fresh_delay = throttle.slot(keys[0]).delay

        # A sweep that finds nothing to evict still visits every slot: time it
        # over a full store whose slots are all recent.
        quiet_sweep_ms = 0.0
        if not trace:
            for key in keys:
                await _request(throttle, key)
            started = time.perf_counter()
            throttle.evict_idle()
            quiet_sweep_ms = (time.perf_counter() - started) * 1e3

        # The busy slots finish, stay idle past the timeout, and go too.
        for lease in held:
            lease.release()
        clock.now = 3 * IDLE_TIMEOUT + 3.0
        await _request(throttle, "new-1.example")
        busy_after_release = sum(1 for key in busy_keys if store.load(key) is not None)
        slots_end = len(store)
    finally:
        if trace:
            tracemalloc.stop()
    return {
        "slots_before": slots_before,
        "slots_after": slots_after,
        "busy_slots": BUSY_SLOTS,
        "busy_kept_while_in_flight": busy_kept,
        "busy_kept_after_release_and_idle": busy_after_release,
        "slots_end": slots_end,
        "learned_delay_before": learned_delay,
        "delay_after_eviction": fresh_delay,
        "traced_bytes_before": mem_before if trace else None,
        "traced_bytes_after": mem_after if trace else None,
        "store_table_bytes_before": table_before if trace else None,
        "store_table_bytes_after": table_after if trace else None,
        "evicted_by_a_new_slot": batch_evicted,
        "new_slot_ms_evicting_a_batch": None if trace else round(batch_ms, 2),
        "sweep_ms_evicting": None if trace else round(sweep_ms, 2),
        "sweep_ms_nothing_to_evict": None if trace else round(quiet_sweep_ms, 2),
    }


# -- main ---------------------------------------------------------------------------


async def main() -> None:
    # Warm up the code paths so the first size measured pays no one-off costs.
    warm = _throttle(MemoryStore(idle_timeout=math.inf), _ticking_clock())
    for key in _keys(1_000, "warm") * 3:
        await _request(warm, key)
    memory = [await memory_per_slot(n) for n in SIZES]
    cost = await request_cost(SIZES)
    evicted = await eviction(trace=True)
    timed = await eviction(trace=False)

    rows = []
    for mem, req in zip(memory, cost, strict=True):
        rounds = req["us_per_request_rounds"]
        rows.append(
            (
                f"{mem['slots']:,}",
                f"{mem['bytes_per_slot']:,.0f}",
                f"{req['us_per_request']:.2f}",
                f"{min(rounds):.2f}-{max(rounds):.2f}",
                f"{req['us_first_request_new_slot']:.2f}",
            )
        )
    print_table(
        "autothrottle scale: per slot and per request (fast path, asyncio)",
        ["slots", "bytes/slot", "µs/request", "rounds µs", "µs 1st request (new slot)"],
        rows,
    )
    print_table(
        f"bytes per slot by allocation site ({SIZES[-1]:,} slots)",
        ["site", "code", "bytes/slot"],
        [
            (site["site"], site["code"][:48], f"{site['bytes_per_slot']:,.0f}")
            for site in memory[-1]["top_sites"]
        ],
    )
    mib = 1024 * 1024
    print_table(
        f"eviction: MemoryStore(idle_timeout={IDLE_TIMEOUT:g}), {EVICT_SLOTS:,} idle + "
        f"{BUSY_SLOTS} in flight",
        ["measure", "before", "after"],
        [
            ("slots in store", f"{evicted['slots_before']:,}", f"{evicted['slots_after']:,}"),
            (
                "traced memory (MiB)",
                f"{evicted['traced_bytes_before'] / mib:.1f}",
                f"{evicted['traced_bytes_after'] / mib:.1f}",
            ),
            (
                "  of which the store's dict table (MiB)",
                f"{evicted['store_table_bytes_before'] / mib:.1f}",
                f"{evicted['store_table_bytes_after'] / mib:.1f}",
            ),
            (
                "slots with a request in flight",
                f"{BUSY_SLOTS}",
                f"{evicted['busy_kept_while_in_flight']}",
            ),
            (
                "  same, released, then idle > timeout",
                f"{BUSY_SLOTS}",
                f"{evicted['busy_kept_after_release_and_idle']}",
            ),
            (
                "delay of an evicted key (s)",
                f"{evicted['learned_delay_before']:g}",
                f"{evicted['delay_after_eviction']:g}",
            ),
            ("slots a new slot's acquire evicts", "", f"{evicted['evicted_by_a_new_slot']:,}"),
            ("  its acquire (ms)", "", f"{timed['new_slot_ms_evicting_a_batch']:.1f}"),
            ("evict_idle(), the rest (ms)", "", f"{timed['sweep_ms_evicting']:.1f}"),
            ("sweep, nothing to evict (ms)", "", f"{timed['sweep_ms_nothing_to_evict']:.1f}"),
        ],
    )
    path = write_results(
        "scale",
        {
            "throttle": "Throttle(start_delay=0, max_delay=60, max_concurrency=8)",
            "memory": memory,
            "requests": cost,
            "eviction": {"memory": evicted, "timing": timed},
        },
    )
    print(f"results: {path}")


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="10 and 1,000 slots, short rounds, 1,000 to evict: every part in seconds",
    )
    add_results_option(parser)
    return parser.parse_args()


if __name__ == "__main__":
    if _parse().smoke:
        SIZES, ROUNDS, PER_ROUND, EVICT_SLOTS = (10, 1_000), 2, 2_000, 1_000
    asyncio.run(main())

"""Where the fleet crawl's short gaps come from: every turn, its send and its arrival.

``python benchmarks/redis_store.py --trace`` records, in each worker, every
turn a request of the fleet took: its reserved time on Redis's clock, its due
time on the process's clock (``time.monotonic``, one clock for every process
on the machine), when the fleet let it go, and when aiohttp wrote its headers
(the send). The main process lines the sends up with the simulated hosts'
arrival stamps, host by host in order, and splits every gap at the host that
was shorter than the limit's gap into its parts::

    arrival gap = reserved gap + skew + lateness + transit

* **reserved**: the two turns' reserved times on Redis's clock (the rule);
* **skew**: how differently the two processes mapped Redis's clock onto
  theirs (0 within one process);
* **lateness**: the later send's lateness after its due, less the earlier's;
* **transit**: the later request's way to the host (the wire and the host's
  own event loop) less the earlier's.

The part that took the most off the gap names the cause. It also says where
the hosts' time went (``host_time_lost``: each band of gaps' time past the
limit's, as a share of the aggregate), how late turns' answers came after
their reserved time, and every garbage collection's pause in each worker.
Instrumentation only: it patches the store and the fleet in the worker that
asks for it.
"""

from __future__ import annotations

import collections
import contextvars
import gc
import itertools
import statistics
import time
from typing import Any

import aiohttp

from autothrottle import _fleet_wire
from autothrottle._fleet import GO, Fleet
from autothrottle._lease import Lease
from autothrottle.redis import RedisStore

_current: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "fleet_trace", default=None
)


def collections_timed() -> dict[int, list[float]]:
    """The wall-clock seconds of each garbage collection of this process, by
    generation, from now on (a collection is a pause of its event loop)."""
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    began = [0.0]

    def timing(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            pauses[info["generation"]].append(time.perf_counter() - began[0])

    gc.callbacks.append(timing)
    return pauses


def install(records: list[dict[str, Any]]) -> aiohttp.TraceConfig:
    """Patch this process's store and fleet to append one record per turn sent
    to ``records``; return the TraceConfig that stamps each send."""
    reserved: dict[str, float] = {}
    hidden: dict[str, float] = {}  # how much later than its reserved time an answer came
    answer, done = RedisStore._answer, Fleet._done

    def traced_answer(self: RedisStore, key: str, ask: Any, reply: list[Any], *rest: Any) -> Any:
        turn = answer(self, key, ask, reply, *rest)
        if turn.lease is not None:
            at = (float(_text(reply[6])) + float(_text(reply[0]))) / 1e6
            turns = int(_text(reply[7])) if len(reply) > 7 else 1
            spacing = float(_text(reply[8])) / 1e6 if len(reply) > 8 else 0.0
            reserved[turn.lease] = at
            clock = getattr(self, "_send").server_clock  # noqa: B009
            offset = min(getattr(clock, "_best"), getattr(clock, "_previous"))  # noqa: B009
            if turn.due is not None and offset < float("inf"):
                hidden[turn.lease] = turn.due - (at + offset)
            for i in range(2, turns + 1):
                reserved[f"{turn.lease}:{i}"] = at + (i - 1) * spacing
        return turn

    def traced_done(self: Fleet, slot: Any, lease: Any, turn: Any, skipped: bool) -> int:
        verdict = done(self, slot, lease, turn, skipped)
        went = verdict == GO
        if turn.lease is not None:
            record = {
                "key": slot.key,
                "reserved": reserved.pop(turn.lease, None),
                "hidden": hidden.pop(turn.lease, 0.0),
                "due": turn.due,
                "went": time.monotonic() if went else None,
                "joined": turn.joined,
                "closes": turn.closes,
                "sent": None,
            }
            records.append(record)
            if went:
                _current.set(record)
        return verdict

    wire_wait = Lease.wire_wait

    def traced_wire_wait(self: Lease) -> float:
        wait = wire_wait(self)
        record = _current.get()
        if wait <= 0.0 and record is not None and record.get("wired") is None:
            record["wired"] = time.monotonic()
        return wait

    Lease.wire_wait = traced_wire_wait  # type: ignore[method-assign]
    check = getattr(_fleet_wire, "WireCheck", None)  # the turn taken again at the wire
    if check is not None:
        taken = check._taken

        def traced_taken(self: Any, new: Any) -> float:
            record = _current.get()
            if new.lease is not None and record is not None:
                record.update(due=new.due, reserved=reserved.pop(new.lease, None), retaken=True)
            return float(taken(self, new))

        check._taken = traced_taken
    RedisStore._answer = traced_answer  # type: ignore[method-assign]
    Fleet._done = traced_done  # type: ignore[method-assign]

    async def headers_sent(*_: Any) -> None:
        record = _current.get()
        if record is not None and record["sent"] is None:
            record["sent"] = time.monotonic()

    config = aiohttp.TraceConfig()
    config.on_request_headers_sent.append(headers_sent)
    return config


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _host_of(key: str) -> str:
    return key.split("://")[-1].split(":")[0].split("/")[0]


def analyse(
    traces: list[list[dict[str, Any]]],
    doc: dict[str, Any],
    gap: float,
    pauses: list[dict[int, list[float]]],
) -> dict[str, Any]:
    """Line the workers' sends up with the hosts' arrivals; explain the short gaps."""
    sends: dict[str, list[tuple[float, int, dict[str, Any]]]] = collections.defaultdict(list)
    for worker, records in enumerate(traces):
        for record in records:
            if record["sent"] is not None and record["due"] is not None:
                sends[_host_of(record["key"])].append((record["sent"], worker, record))
    pairs: list[tuple[str, float, int, dict[str, Any], str]] = []
    origin = -float("inf")
    for address, host in doc["hosts"].items():
        mine = sorted(sends.get(address, []), key=lambda s: s[0])
        requests = host["series"]["requests"]
        arrivals = sorted(zip(requests["arrival"], requests["outcome"], strict=True))
        for (arrival, outcome), (sent, worker, record) in zip(arrivals, mine, strict=False):
            pairs.append((address, arrival, worker, record, outcome))
            origin = max(origin, sent - arrival)  # the host's clock starts at or after it
    by_host: dict[str, list[tuple[float, int, dict[str, Any], str]]] = collections.defaultdict(list)
    for address, arrival, worker, record, outcome in pairs:
        by_host[address].append((arrival + origin, worker, record, outcome))
    late = [r["sent"] - r["due"] for rs in traces for r in rs if r["sent"] and r["due"]]
    wire = [r["sent"] - r["went"] for rs in traces for r in rs if r["sent"] and r["went"]]
    to_wire = [r["wired"] - r["went"] for rs in traces for r in rs if r.get("wired") and r["went"]]
    closing = [
        r["sent"] - r["due"] for rs in traces for r in rs if r["sent"] and r["due"] and r["closes"]
    ]
    short: list[dict[str, Any]] = []
    junctions = same = 0
    for rows in by_host.values():
        for (a1, w1, r1, _), (a2, w2, r2, o2) in itertools.pairwise(rows):
            if w1 == w2:
                same += 1
            else:
                junctions += 1
            if a2 - a1 >= gap or r1["reserved"] is None or r2["reserved"] is None:
                continue
            parts = {
                "reserved": r2["reserved"] - r1["reserved"] - gap,
                "skew": (r2["due"] - r2["reserved"]) - (r1["due"] - r1["reserved"]),
                "lateness": (r2["sent"] - r2["due"]) - (r1["sent"] - r1["due"]),
                "transit": (a2 - r2["sent"]) - (a1 - r1["sent"]),
            }
            short.append(
                {
                    "at": a2 - origin,
                    "gap": a2 - a1,
                    "same_process": w1 == w2,
                    "refused": o2 != "ok",
                    "cause": min(parts, key=lambda k: parts[k]),
                    "first_late": r1["sent"] - r1["due"],
                    "second_late": r2["sent"] - r2["due"],
                    **parts,
                }
            )
    start = min((rows[0][0] for rows in by_host.values() if rows), default=origin) - origin
    causes = collections.Counter(s["cause"] for s in short)
    early = collections.Counter(s["cause"] for s in short if s["at"] < start + 3.0)
    refused = collections.Counter(s["cause"] for s in short if s["refused"])

    def pct(values: list[float], q: float) -> float:
        return sorted(values)[int(q * (len(values) - 1))] if values else 0.0

    return {
        "turns": sum(len(rs) for rs in traces),
        "pairs_same_process": same,
        "pairs_junction": junctions,
        "short_gaps": len(short),
        "short_gaps_same_process": sum(1 for s in short if s["same_process"]),
        "causes": dict(causes),
        "causes_of_refused": dict(refused),
        "causes_in_first_3_s": dict(early),
        "lateness_p50_p90_p99_max_ms": [1e3 * pct(late, q) for q in (0.5, 0.9, 0.99, 1.0)],
        "went_to_sent_p50_p90_p99_max_ms": [1e3 * pct(wire, q) for q in (0.5, 0.9, 0.99, 1.0)],
        "went_to_wire_p50_p90_p99_max_ms": [1e3 * pct(to_wire, q) for q in (0.5, 0.9, 0.99, 1.0)],
        "closing_turns_later_than_ms": {
            ms: sum(1 for x in closing if x > ms / 1e3) / max(1, len(closing))
            for ms in (2, 5, 10, 15, 20, 30, 50)
        },
        "answered_after_due_p50_p90_p99_max_ms": [
            1e3 * pct([r.get("hidden", 0.0) for rs in traces for r in rs], q)
            for q in (0.5, 0.9, 0.99, 1.0)
        ],
        "answered_after_due_share_over_2_10_ms": [
            sum(1 for rs in traces for r in rs if r.get("hidden", 0.0) > ms / 1e3)
            / max(1, sum(len(rs) for rs in traces))
            for ms in (2, 10)
        ],
        "host_time_lost": _time_lost(doc, gap),
        "gc_pauses_count_total_max_ms": [
            {g: [len(p), 1e3 * sum(p), 1e3 * max(p, default=0.0)] for g, p in w.items()}
            for w in pauses
        ],
        "turns_not_sent": sum(1 for rs in traces for r in rs if r["went"] is None),
        "turns_taken_again_at_the_wire": sum(1 for rs in traces for r in rs if r.get("retaken")),
        "mean_parts_ms": {
            k: 1e3 * statistics.fmean(s[k] for s in short) if short else 0.0
            for k in ("reserved", "skew", "lateness", "transit")
        },
        "worst": sorted(short, key=lambda s: s["gap"])[:15],
    }


def _time_lost(doc: dict[str, Any], gap: float) -> dict[str, float]:
    """Where the hosts' time went: each band of arrival gaps' time past the
    limit's gap, as a share of all the time between arrivals (the aggregate's
    loss). The first four gaps of a host (each worker's first send there, with
    the room after a first turn) are counted apart from the bands."""
    bands = {"first_four": 0.0, "margin": 0.0, "room": 0.0, "late": 0.0, "holes": 0.0}
    total = 0.0
    for host in doc["hosts"].values():
        arrivals = sorted(host["series"]["requests"]["arrival"])
        for index, (first, second) in enumerate(itertools.pairwise(arrivals)):
            between = second - first
            total += between
            excess = between - gap
            if index < 4:
                bands["first_four"] += excess
            elif between < gap * 1.03:  # the spacing margin and the wake-up's jitter
                bands["margin"] += excess
            elif between < gap * 1.2:  # the room for lateness after a send
                bands["room"] += excess
            elif between < gap * 1.6:  # a turn sent late, a pause
                bands["late"] += excess
            else:  # a turn not sent: handed back late, its time lost
                bands["holes"] += excess
    return {band: lost / total if total else 0.0 for band, lost in bands.items()}

"""Where a strict pace's gaps go, from the wire turn and the host's own arrival stamps.

``python benchmarks/many_hosts.py --wire-truth`` records every wire turn a slot
passes (the gate's own numbers: the arrival guard's latency excess and margin,
the time the gap was due, when the request first asked for its turn) and lines
them up with the simulated host's arrival stamps, request by request. What the
load cannot fool: the gap at the host, and by how much the host saw two
requests closer than they left the wire (``shrink``: the earlier one's way to
the host minus the later one's, which the arrival guard exists to cover).

Each wire gap is ``gap + counted + late``: what the guard counted, the
latency's excess (the previous request's answer came slower than the least
lately) and the margin (the client's averaged lateness within the spread of
its quick answers, or the refusals'; after a refusal at the pace the makeup
too), and how late the request passed after that (``came late``: it reached the wire
after its due, held up at the grant or in the client's pool; otherwise the
lag of its wake-up). ``counterfactual`` gives, for other ways of adding the
pieces, the mean extra and the share of gaps the host would have seen closer
than its limit, the lateness taken as it was.
"""

from __future__ import annotations

import collections
import math
import re
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from autothrottle import Throttle
from autothrottle._arrivals import MAX_MARGIN_SHARE
from autothrottle._wire import WireTurn

# (passed, excess, margin, due, first ask, least latency, counted) per wire turn, by id(gate)
_Pass = tuple[float, float, float, float, float, float, float]

_ADDRESS = re.compile(r"127\.\d+\.\d+\.\d+")


@contextmanager
def recording() -> Iterator[dict[int, list[_Pass]]]:
    """Record every wire turn passed while inside; yields the record."""
    passes: dict[int, list[_Pass]] = collections.defaultdict(list)
    first: dict[int, float] = {}
    original = WireTurn.wire_wait

    def wire_wait(self: WireTurn, hold: Any) -> float:
        first.setdefault(id(hold), self.clock())
        prev = self._wire_last
        guard = self.arrivals
        gap = self.state.pace.delay
        excess = margin = counted = 0.0
        least = math.inf
        if guard is not None and prev is not None:
            excess = max(0.0, guard.latest - prev)
            margin = guard.margin(gap, self.lateness)
            if prev <= guard.refused_at:
                margin += MAX_MARGIN_SHARE * gap  # the makeup after a refusal
            counted = guard.since(prev, gap, self.lateness) - prev
            least = guard.least_latency()
        wait = original(self, hold)
        if wait == 0.0:
            now = self._wire_last
            asked = first.pop(id(hold))
            if prev is None or now is None:
                passes[id(self)].append((asked, 0.0, 0.0, asked, asked, least, 0.0))
            else:
                due = prev + counted + hold.wire_gap
                passes[id(self)].append((now, excess, margin, due, asked, least, counted))
        return wait

    WireTurn.wire_wait = wire_wait  # type: ignore[method-assign]
    try:
        yield passes
    finally:
        WireTurn.wire_wait = original  # type: ignore[method-assign]


def _ms(values: list[float], share: float | None = None) -> float:
    if not values:
        return math.nan
    if share is None:
        return 1000.0 * statistics.fmean(values)
    ordered = sorted(values)
    return 1000.0 * ordered[min(len(ordered) - 1, int(share * len(ordered)))]


_RULES: dict[str, Callable[[float, float, float], float]] = {
    "excess + margin + late (the rule)": lambda e, m, late: e + m + late,
    "max(excess, margin) + late": lambda e, m, late: max(e, m) + late,
    "excess + max(margin, late)": lambda e, m, late: e + max(m, late),
    "excess + late (no margin)": lambda e, m, late: e + late,
    "late only (no guard)": lambda e, m, late: late,
}


def report(
    passes: dict[int, list[_Pass]], throttle: Throttle, hosts: dict[str, Any]
) -> dict[str, Any]:
    """Line the recorded turns up with each host's arrivals (``hosts``: the
    simulator's stats per address, with series)."""
    gates = {}
    for live in throttle._table:
        found = _ADDRESS.search(live.key)
        if found:
            gates[found.group()] = id(live.gate)
    rows: list[tuple[_Pass, _Pass, float, float]] = []
    short: list[str] = []
    starts: list[int] = []
    for addr, h in hosts.items():
        found = _ADDRESS.search(addr)
        mine = passes.get(gates.get(found.group() if found else "", -1), [])
        arrivals = h["series"]["requests"]["arrival"]
        if len(mine) != len(arrivals):
            continue  # a request the host did not stamp (or one not on the wire)
        ways = [a - p[0] for a, p in zip(arrivals, mine, strict=True)]
        start = len(rows)
        starts.append(start)
        for i in range(1, len(mine)):
            host_gap = arrivals[i] - arrivals[i - 1]
            rows.append((mine[i - 1], mine[i], host_gap, ways[i - 1] - ways[i]))
        short += _short_gaps(addr, rows[start:], h["series"]["requests"]["status"][1:], arrivals)
    if not rows:
        return {"matched": 0}
    turns = [b for _, b, _, _ in rows]
    late = [b[0] - b[3] for b in turns]
    came_late = [b[4] - b[3] for b in turns if b[4] >= b[3]]
    woke = [b[0] - b[3] for b in turns if b[4] < b[3]]
    shrink = [s for _, _, _, s in rows]
    excess = [b[1] for b in turns]
    margin = [b[2] for b in turns]
    counter = {}
    for name, rule in _RULES.items():
        extra = [rule(e, m, x) for e, m, x in zip(excess, margin, late, strict=True)]
        close = sum(1 for x, s in zip(extra, shrink, strict=True) if s > x)
        counter[name] = {"extra_ms": _ms(extra), "closer_share": close / len(rows)}
    return {
        "matched": len(rows),
        "wire_gap_ms": _ms([b[0] - a[0] for a, b, _, _ in rows]),
        "host_gap_ms": _ms([g for _, _, g, _ in rows]),
        "host_gap_p001_ms": _ms([g for _, _, g, _ in rows], 0.001),
        "counted_ms": _ms([b[6] for b in turns]),
        "excess_ms": _ms(excess),
        "margin_ms": _ms(margin),
        "late_ms": _ms(late),
        "came_late_share": len(came_late) / len(rows),
        "came_late_ms": _ms(came_late),
        "wake_lag_ms": _ms(woke),
        "shrink_p50_ms": _ms(shrink, 0.5),
        "shrink_p99_ms": _ms(shrink, 0.99),
        "shrink_p999_ms": _ms(shrink, 0.999),
        "shrink_above_excess_share": sum(1 for e, s in zip(excess, shrink, strict=True) if s > e)
        / len(rows),
        "counterfactual": counter,
        "short": short,
        "starts": starts,
        # (host gap, wire gap, excess, margin, late, shrink, least, counted), a gap each
        "rows": [(g, b[0] - a[0], b[1], b[2], b[0] - b[3], sh, b[5], b[6]) for a, b, g, sh in rows],
    }


def _short_gaps(
    addr: str,
    rows: list[tuple[_Pass, _Pass, float, float]],
    status: list[int],
    arrivals: list[float],
    gap: float = 0.5,
) -> list[str]:
    """The gaps of one host shorter than ``gap`` at the host, or two in a row
    shorter than twice it: each with its split (wire gap, counted, late, shrink), to read."""
    out = []
    for i in range(1, len(rows)):
        pair = rows[i - 1][2] + rows[i][2]
        if pair >= 2.0 * gap and rows[i][2] >= gap:
            continue
        lines = [f"    {addr} at {arrivals[i]:.3f}: pair {1000 * pair:.1f} ms"]
        for j in range(max(0, i - 2), min(len(rows), i + 2)):
            a, b, host_gap, shrink = rows[j]
            lines.append(
                f"      host {1000 * host_gap:6.1f} wire {1000 * (b[0] - a[0]):6.1f} = "
                f"counted {1000 * b[6]:5.1f} (excess {1000 * b[1]:5.1f} margin {1000 * b[2]:4.1f}) "
                f"late {1000 * (b[0] - b[3]):5.1f}; shrink {1000 * shrink:5.1f}; "
                f"least {1000 * b[5]:5.1f}; status {status[j]}"
            )
        out.append("\n".join(lines))
    return out


def print_report(label: str, r: dict[str, Any]) -> None:
    """The report, in a few lines."""
    if not r.get("matched"):
        print(f"  wire truth, {label}: no host matched")
        return
    print(
        f"  wire truth, {label} ({r['matched']} gaps): wire gap {r['wire_gap_ms']:.1f} ms, "
        f"host gap {r['host_gap_ms']:.1f} ms (p0.1 {r['host_gap_p001_ms']:.1f}) = gap + "
        f"counted {r['counted_ms']:.1f} (excess {r['excess_ms']:.1f}, margin {r['margin_ms']:.1f}) "
        f"+ late {r['late_ms']:.1f}; "
        f"came late to the wire {r['came_late_share']:.0%} by {r['came_late_ms']:.1f} ms, "
        f"else woke {r['wake_lag_ms']:.1f} ms late\n"
        f"    shrink at the host p50 {r['shrink_p50_ms']:.2f} p99 {r['shrink_p99_ms']:.1f} "
        f"p99.9 {r['shrink_p999_ms']:.1f} ms; above the excess {r['shrink_above_excess_share']:.1%}"
    )
    for text in r.get("short", [])[:8]:
        print(text)
    for name, c in r["counterfactual"].items():
        print(
            f"    {name:36s} extra {c['extra_ms']:6.1f} ms, "
            f"closer than the limit {c['closer_share']:.2%}"
        )

"""Many hosts: 200 simulated hosts, each limited to 2 requests/s, crawled at a fixed rate.

Run with ``python benchmarks/many_hosts.py`` (about 40 s; ``--quick``: 12 s of
crawling). Loopback only.

The hosts are ``autothrottle.sim`` token buckets, ``RateLimited(rate=2,
burst=1, headers=False)`` (excess gets a 429 with ``Retry-After``), served by
``python -m autothrottle.sim`` in a separate process on 127.0.0.2 ...
127.0.0.201. The crawler, in this process, uses one
``ThrottledSession`` (``--client httpx``: one ``ThrottledClient``) and
``Throttle(policy=FixedRatePolicy(2))``; two tasks per host fetch pages back to
back for ``--seconds`` (default 25), so every host always has a request
waiting and the throttle alone sets the pace.

What it reports, from the simulator's ground truth (not the client's view):

* aggregate rate: the sum over hosts of each host's steady rate, ``(arrivals -
  1) / (last arrival - first arrival)``, against the sum of the limits (400/s),
  and the same for successful responses only (goodput);
* the worst rate any host saw in any 1-second window (``max_in_window``: the
  most arrivals in any half-open window ``[t, t+1)``), and how many hosts ever
  had a window above the limit;
* 429s, and the smallest gap between two arrivals at one host (arrival jitter).

Goals (issue 4): aggregate >= 95 % of 400/s, no host above 2 in any 1-second
window.

Two prototypes of core changes can run next to the plain policy
(``--variants``, default ``base,wire``):

* ``wire``: count each gap from the moment the request's new connection was
  ready rather than from the grant (a TraceConfig defined here that moves the
  slot's last-send time). The first request to each host opens a connection
  and so reaches the server later than it was granted; the next one, on a
  pooled connection, does not, so the first gap at the server is short and,
  against a burst-1 bucket, draws a 429.
* ``guard``: ``--guard-ms`` added to every gap (a ``FixedRatePolicy``
  subclass), against arrival jitter in the steady state.

``--headers`` makes the hosts send rate-limit headers too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
from _common import print_table, write_results

from autothrottle import FixedRatePolicy, SlotConfig, Throttle

if not sys.stdout.isatty():
    os.environ.setdefault("COLUMNS", "160")  # rich's tables: no wrapping when piped

HOSTS = 200
RATE = 2.0
GOAL_AGGREGATE = 0.95

# -- the simulator in its own process ----------------------------------------------------

_URL_LINE = re.compile(r"^\s+(http://\S+)\s+(\S+)")


class SimProcess:
    """``python -m autothrottle.sim`` in a child process, driven over HTTP.

    Start with the sim's command-line arguments; ``hosts`` maps each address
    to its base URL. Ground truth comes from ``GET /_sim/stats?all=1`` and
    ``POST /_sim/reset``, the control endpoints every simulated host serves.
    """

    def __init__(self, sim_args: Sequence[str], *, start_timeout: float = 60.0) -> None:
        command = [sys.executable, "-m", "autothrottle.sim", "--quiet", *sim_args]
        self._proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # Ctrl-C in the terminal goes to us, not it
        )
        self.hosts: dict[str, str] = {}
        self.specs: dict[str, str] = {}
        deadline = time.monotonic() + start_timeout
        assert self._proc.stdout is not None
        try:
            for line in self._proc.stdout:
                match = _URL_LINE.match(line)
                if match:
                    url = match.group(1).rstrip("/")
                    address = url.split("//", 1)[1].rsplit(":", 1)[0]
                    self.hosts[address] = url
                    self.specs[address] = match.group(2)
                if line.startswith("running until"):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the simulator did not start in time")
            if not self.hosts or self._proc.poll() is not None:
                err = self._proc.stderr.read() if self._proc.stderr else ""
                raise RuntimeError(f"the simulator did not start: {err.strip()}")
        except BaseException:
            self.stop()
            raise

    @property
    def control_url(self) -> str:
        return next(iter(self.hosts.values()))

    async def stats(
        self, http: aiohttp.ClientSession, host: str | None = None, *, series: bool = True
    ) -> dict[str, Any]:
        """Every host's ground truth (or one host's), as the sim's JSON."""
        flag = "1" if series else "0"
        if host is None:
            url = f"{self.control_url}/_sim/stats?all=1&series={flag}"
        else:
            url = f"{self.hosts[host]}/_sim/stats?series={flag}"
        async with http.get(url) as response:
            response.raise_for_status()
            doc: dict[str, Any] = await response.json(loads=json.loads)
        return doc

    async def reset(self, http: aiohttp.ClientSession, host: str | None = None) -> None:
        url = (
            f"{self.control_url}/_sim/reset?all=1"
            if host is None
            else f"{self.hosts[host]}/_sim/reset"
        )
        async with http.post(url) as response:
            response.raise_for_status()

    async def wait_idle(
        self, http: aiohttp.ClientSession, host: str | None = None, within: float = 30.0
    ) -> None:
        """Wait until nothing is queued or in service (abandoned requests finish)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            doc = await self.stats(http, host, series=False)
            hosts = doc["hosts"].values() if host is None else [doc]
            busy = sum(h["in_service"] + h["queued"] for h in hosts)
            if not busy:
                return
            await asyncio.sleep(0.2)

    def stop(self) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()


def control_session() -> aiohttp.ClientSession:
    """A plain session for the simulator's control endpoints (never throttled)."""
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))


# -- the crawler ---------------------------------------------------------------------------


class GuardedFixedRate(FixedRatePolicy):
    """Prototype: ``FixedRatePolicy`` with ``guard`` seconds added to every gap.

    Arrival times at a server differ from send times by a varying transit
    delay (event-loop lag, the network stack); a guard at least as large as
    that variation keeps arrivals, not only sends, within the limit.
    """

    __slots__ = ("guard",)

    def __init__(self, per_second: float, *, guard: float, burst: int = 1) -> None:
        super().__init__(per_second, burst=burst)
        self.guard = guard

    def initial_delay(self, config: SlotConfig) -> float:
        return 1.0 / self.per_second + self.guard

    def next_delay(self, delay: float, sample: Any, config: SlotConfig) -> float:
        return 1.0 / self.per_second + self.guard


def wire_time_trace_config(throttle: Throttle) -> aiohttp.TraceConfig:
    """Prototype of a core change: count a slot's gap from when a new connection is ready.

    The throttle stamps a send when it grants the lease; a request that must
    first open a connection reaches the server that much later, while the next
    one (on a pooled connection) does not, so their gap at the server is
    shorter than the delay. This moves the slot's last-send time to the moment
    the connection is ready, if no later request has been granted since (burst
    1 only). It reaches into private slot state, which is why it lives here and
    not in the adapter.
    """

    async def on_start(
        session: aiohttp.ClientSession, ctx: Any, params: aiohttp.TraceRequestStartParams
    ) -> None:
        ctx.wire_key = throttle.key_for(str(params.url))

    async def on_create_start(session: aiohttp.ClientSession, ctx: Any, params: Any) -> None:
        ctx.wire_sent = throttle.slot(ctx.wire_key).sent

    async def on_create_end(session: aiohttp.ClientSession, ctx: Any, params: Any) -> None:
        slot = throttle.slot(ctx.wire_key)
        if slot.sent != ctx.wire_sent:  # a later request was granted meanwhile
            return
        now = time.monotonic()  # the throttle's default clock
        last = slot._last_send
        if last is not None and now > last and slot.config.burst == 1:
            slot._last_send = now

    config = aiohttp.TraceConfig()
    config.on_request_start.append(on_start)
    config.on_connection_create_start.append(on_create_start)
    config.on_connection_create_end.append(on_create_end)
    return config


async def crawl(
    urls: Sequence[str],
    throttle: Throttle,
    client: str,
    seconds: float,
    per_host: int,
    *,
    wire_time: bool = False,
) -> dict[str, int]:
    """Fetch pages from every base URL for ``seconds``; client-side status counts."""
    counts: dict[str, int] = {}
    deadline = time.monotonic() + seconds

    def count(what: str) -> None:
        counts[what] = counts.get(what, 0) + 1

    if client == "httpx":
        import httpx

        from autothrottle.httpx import ThrottledClient

        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with ThrottledClient(throttle=throttle, limits=limits, timeout=30) as hx:

            async def worker_httpx(base: str, n: int) -> None:
                i = n
                while time.monotonic() < deadline:
                    try:
                        response = await hx.get(f"{base}/page/{i}")
                        count(str(response.status_code))
                    except httpx.HTTPError as exc:
                        count(type(exc).__name__)
                    i += per_host

            await _run_until([worker_httpx(u, n) for u in urls for n in range(per_host)], deadline)
    else:
        from autothrottle.aiohttp import ThrottledSession

        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=30)
        traces = [wire_time_trace_config(throttle)] if wire_time else []
        async with ThrottledSession(
            throttle=throttle, connector=connector, timeout=timeout, trace_configs=traces
        ) as session:

            async def worker_aiohttp(base: str, n: int) -> None:
                i = n
                while time.monotonic() < deadline:
                    try:
                        async with session.get(f"{base}/page/{i}") as response:
                            await response.read()
                            count(str(response.status))
                    except (TimeoutError, aiohttp.ClientError) as exc:
                        count(type(exc).__name__)
                    i += per_host

            await _run_until(
                [worker_aiohttp(u, n) for u in urls for n in range(per_host)], deadline
            )
    return counts


async def _run_until(coros: list[Any], deadline: float) -> None:
    """Run the workers; cancel whatever is still waiting at the deadline."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()) + 0.05)
    finally:
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, Exception):
            raise result


# -- figures -------------------------------------------------------------------------------


def host_figures(h: dict[str, Any]) -> dict[str, Any]:
    arrivals: list[float] = h["series"]["arrivals"]
    rec = h["series"]["requests"]
    ok_times = sorted(a for a, o in zip(rec["arrival"], rec["outcome"], strict=True) if o == "ok")
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    ok_span = ok_times[-1] - ok_times[0] if len(ok_times) > 1 else 0.0
    return {
        "requests": h["requests"],
        "ok": h["outcomes"]["ok"],
        "limited": h["outcomes"]["limited"],
        "rate": (len(arrivals) - 1) / span if span > 0 else 0.0,
        "goodput": (len(ok_times) - 1) / ok_span if ok_span > 0 else 0.0,
        "max_in_window": h["max_in_window"],
        "min_gap": min(gaps) if gaps else None,
        "gaps": gaps,
    }


def summarize(doc: dict[str, Any], limit: float) -> dict[str, Any]:
    per_host = {addr: host_figures(h) for addr, h in doc["hosts"].items()}
    figures = list(per_host.values())
    all_gaps = sorted(g for f in figures for g in f["gaps"])
    gap = 1.0 / limit

    def share_below(x: float) -> float:
        return sum(1 for g in all_gaps if g < x) / len(all_gaps) if all_gaps else 0.0

    windows = [f["max_in_window"] for f in figures]
    return {
        "hosts": len(figures),
        "limit_sum": limit * len(figures),
        "aggregate_rate": sum(f["rate"] for f in figures),
        "aggregate_goodput": sum(f["goodput"] for f in figures),
        "requests": sum(f["requests"] for f in figures),
        "ok": sum(f["ok"] for f in figures),
        "limited": sum(f["limited"] for f in figures),
        "worst_window": max(windows),
        "hosts_above_limit": sum(1 for w in windows if w > limit),
        "windows_histogram": {str(w): windows.count(w) for w in sorted(set(windows))},
        "min_gap": all_gaps[0] if all_gaps else None,
        "gap_p01": all_gaps[len(all_gaps) // 100] if all_gaps else None,
        "gap_median": statistics.median(all_gaps) if all_gaps else None,
        "share_gaps_below_limit_gap": share_below(gap),
        "share_gaps_below_limit_gap_minus_1ms": share_below(gap - 0.001),
        "per_host": {
            addr: {k: v for k, v in f.items() if k != "gaps"} for addr, f in per_host.items()
        },
    }


async def run_once(
    sim: SimProcess, args: argparse.Namespace, guard: float, wire_time: bool, label: str
) -> dict[str, Any]:
    policy: FixedRatePolicy = (
        GuardedFixedRate(RATE, guard=guard) if guard > 0 else FixedRatePolicy(RATE)
    )
    throttle = Throttle(policy=policy)
    async with control_session() as http:
        await sim.wait_idle(http)
        await sim.reset(http)
        cpu0, t0 = time.process_time(), time.monotonic()
        counts = await crawl(
            list(sim.hosts.values()),
            throttle,
            args.client,
            args.seconds,
            args.per_host,
            wire_time=wire_time,
        )
        wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
        await sim.wait_idle(http)
        doc = await sim.stats(http)
    summary = summarize(doc, RATE)
    snaps = throttle.snapshot().values()
    summary.update(
        label=label,
        policy=repr(policy),
        guard_ms=guard * 1000,
        wire_time=wire_time,
        client_counts=counts,
        client_cpu_share=cpu / wall,
        backoffs=sum(s.backoffs for s in snaps),
        pauses=sum(s.pauses for s in snaps),
    )
    return summary


async def bench(args: argparse.Namespace, sim: SimProcess) -> list[dict[str, Any]]:
    runs = []
    guard = args.guard_ms / 1000
    configs = {
        "base": (0.0, False, "FixedRatePolicy(2)"),
        "guard": (guard, False, f"+ guard {args.guard_ms:g} ms"),
        "wire": (0.0, True, "+ gap from connection ready (prototype)"),
        "wire+guard": (guard, True, f"+ connection ready + guard {args.guard_ms:g} ms"),
    }
    for name in args.variants:
        g, wire, label = configs[name]
        print(f"  crawling {len(sim.hosts)} hosts for {args.seconds:g} s: {label}", flush=True)
        runs.append(await run_once(sim, args, g, wire, label))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=25.0, help="crawl time (default 25)")
    parser.add_argument("--quick", action="store_true", help="a 12-second crawl")
    parser.add_argument("--hosts", type=int, default=HOSTS, help=f"hosts (default {HOSTS})")
    parser.add_argument("--per-host", type=int, default=2, help="tasks per host (default 2)")
    parser.add_argument("--client", choices=("aiohttp", "httpx"), default="aiohttp")
    parser.add_argument(
        "--variants",
        default="base,wire",
        help="comma-separated runs among base, guard, wire, wire+guard (default base,wire): "
        "guard adds --guard-ms to every gap; wire counts gaps from connection ready "
        "(prototypes of core changes, aiohttp only)",
    )
    parser.add_argument(
        "--guard-ms", type=float, default=5.0, help="the guard of the guard variants (ms)"
    )
    parser.add_argument("--headers", action="store_true", help="hosts also send rate-limit headers")
    args = parser.parse_args()
    if args.quick:
        args.seconds = 12.0
    if not 2 <= args.seconds <= 300:
        parser.error("--seconds must be in [2, 300]")
    if not 1 <= args.hosts <= 1000 or not 1 <= args.per_host <= 8:
        parser.error("--hosts must be in [1, 1000] and --per-host in [1, 8]")
    if not 0 < args.guard_ms <= 100:
        parser.error("--guard-ms must be in (0, 100]")
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    known = {"base", "guard", "wire", "wire+guard"}
    if not args.variants or not set(args.variants) <= known:
        parser.error(f"--variants must be a comma-separated list of {sorted(known)}")
    if args.client == "httpx" and any("wire" in v for v in args.variants):
        parser.error("the wire-time prototype exists for --client aiohttp only")

    spec = f"rate:rate={RATE:g},burst=1,headers={'true' if args.headers else 'false'}"
    sim = SimProcess(["--many", f"{args.hosts}={spec}", "--seed", "1"])
    try:
        runs = asyncio.run(bench(args, sim))
    finally:
        sim.stop()

    rows = []
    for r in runs:
        agg = r["aggregate_rate"] / r["limit_sum"]
        good = r["aggregate_goodput"] / r["limit_sum"]
        met = agg >= GOAL_AGGREGATE and good >= GOAL_AGGREGATE and r["hosts_above_limit"] == 0
        rows.append(
            (
                r["label"],
                f"{r['aggregate_rate']:.1f}",
                f"{agg:.1%}",
                f"{r['aggregate_goodput']:.1f}",
                f"{good:.1%}",
                f"{r['limited']}",
                f"{r['worst_window']}",
                f"{r['hosts_above_limit']}",
                f"{r['min_gap'] * 1000:.1f}",
                f"{r['share_gaps_below_limit_gap']:.1%}",
                "met" if met else "MISSED",
            )
        )
    print_table(
        f"{args.hosts} hosts x {RATE:g} req/s (sum {args.hosts * RATE:g}/s), "
        f"{args.seconds:g} s, {args.client}, sim spec {spec}",
        [
            "policy",
            "rate/s",
            "of sum",
            "goodput/s",
            "of sum",
            "429s",
            "worst 1-s window",
            "hosts > limit",
            "min gap ms",
            "gaps < 500 ms",
            "goal",
        ],
        rows,
    )
    path = write_results(
        "many_hosts",
        {
            "settings": {
                "hosts": args.hosts,
                "rate": RATE,
                "sim_spec": spec,
                "seconds": args.seconds,
                "client": args.client,
                "tasks_per_host": args.per_host,
                "goal_aggregate": GOAL_AGGREGATE,
            },
            "runs": runs,
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()

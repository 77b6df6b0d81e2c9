"""``autothrottle fetch``: throughput against the sum of the hosts' limits, and memory.

Run with ``python benchmarks/fetch.py`` (about a minute; ``--quick``: about
25 s). Loopback only. It runs the command as shipped, in a child process
(``python -m autothrottle fetch``), against ``python -m autothrottle.sim`` in
another.

1. **Throughput**: ``--hosts`` (50) token-bucket hosts of ``--rate`` (10)
   requests/s each (``rate:rate=R,burst=1``: excess gets 429 + Retry-After),
   ``--seconds`` (20) worth of URLs per host, interleaved. The fetch uses
   ``--policy fixed-rate=R`` (the limit is known: ``--policy`` changes it).
   Reported from the sites' ground truth: each host's steady rate
   ``(ok - 1) / (last arrival - first arrival)`` summed, against the sum of
   the limits; and the whole run's URLs per second of wall time.
   Goal (docs/benchmarks.md): >= 90 % of the sum, without 429s.

2. **Memory for 10**6 input URLs**: the input holds 10**6 URLs of one host
   answering at once, and the output already holds a line for all but the
   last ``--fresh`` (1,000) of them, as a resumed run finds it: the fetch
   reads the whole output back (the done set), streams the whole input, and
   fetches the rest. Peak RSS of the child (``ru_maxrss``) against the same
   run with a 1,000-URL input: the difference is what 10**6 URLs cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    SimProcess,
    add_results_option,
    control_session,
    print_table,
    write_results,
)

GOAL = 0.90


def run_fetch(args: list[str]) -> tuple[float, int, str]:
    """Run ``autothrottle fetch`` in a child; its wall time, peak RSS (KiB) and stderr.

    The peak is read from ``wait4``'s rusage of that child alone.
    """
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "autothrottle", "fetch", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.monotonic() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"fetch failed: {err[-2000:]}")
    return elapsed, usage.ru_maxrss, err


async def ground_truth(sim: SimProcess) -> dict[str, Any]:
    async with control_session() as http:
        return (await sim.stats(http))["hosts"]


def steady(host: dict[str, Any]) -> float:
    arrivals = [
        a
        for a, outcome in zip(
            host["series"]["requests"]["arrival"],
            host["series"]["requests"]["outcome"],
            strict=True,
        )
        if outcome == "ok"
    ]
    if len(arrivals) < 2:
        return 0.0
    arrivals.sort()
    return (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])


def throughput(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    sim = SimProcess(["--many", f"{args.hosts}=rate:rate={args.rate:g},burst=1"])
    try:
        per_host = int(args.rate * args.seconds)
        bases = list(sim.hosts.values())
        urls = folder / "urls.txt"
        with urls.open("w") as fh:
            for i in range(per_host):
                fh.writelines(f"{base}/page/{i}\n" for base in bases)
        out = folder / "out.jsonl"
        policy = args.policy or f"fixed-rate={args.rate:g}"
        flags = [str(urls), "-o", str(out), "--client", args.client, "--policy", policy]
        elapsed, rss, _ = run_fetch([*flags, "--progress", "none", "--start-delay", "0"])
        hosts = asyncio.run(ground_truth(sim))
    finally:
        sim.stop()
    limit = args.hosts * args.rate
    total = sum(steady(h) for h in hosts.values())
    lines = sum(1 for _ in out.open())
    return {
        "hosts": args.hosts,
        "rate_per_host": args.rate,
        "client": args.client,
        "policy": policy,
        "urls": lines,
        "sum_of_limits": limit,
        "aggregate_steady_rate": round(total, 1),
        "share_of_limits": round(total / limit, 3),
        "wall_seconds": round(elapsed, 2),
        "urls_per_wall_second": round(lines / elapsed, 1),
        "limited_429": sum(h["outcomes"]["limited"] for h in hosts.values()),
        "max_in_1s_any_host": max(h["max_in_window"] for h in hosts.values()),
        "peak_rss_mib": round(rss / 1024, 1),
    }


def memory(args: argparse.Namespace, folder: Path, n: int) -> dict[str, Any]:
    """Peak RSS of a resumed fetch whose input holds ``n`` URLs, ``args.fresh`` of them new."""
    sim = SimProcess(["--host", "127.0.0.2=capacity:workers=64,service_time=0.0001"])
    try:
        base = sim.hosts["127.0.0.2"]
        urls, out = folder / f"urls-{n}.txt", folder / f"out-{n}.jsonl"
        with urls.open("w") as u, out.open("w") as o:
            for i in range(n):
                url = f"{base}/page/{i}"
                u.write(url + "\n")
                if i < n - args.fresh:
                    o.write(json.dumps({"url": url, "status": 200}) + "\n")
        flags = [str(urls), "-o", str(out), "--client", args.client, "--progress", "none"]
        elapsed, rss, _ = run_fetch([*flags, "--policy", "fixed-rate=1000", "--start-delay", "0"])
    finally:
        sim.stop()
    return {"input_urls": n, "fetched": args.fresh, "seconds": round(elapsed, 2), "rss_kib": rss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 s of URLs, 2*10**5 for memory")
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--client", choices=("aiohttp", "httpx"), default="aiohttp")
    parser.add_argument("--policy", default=None, help="default: fixed-rate=RATE")
    parser.add_argument("--urls", type=int, default=1_000_000, help="input size for memory")
    parser.add_argument("--fresh", type=int, default=1_000)
    add_results_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.urls = 10.0, 200_000
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        speed = throughput(args, folder)
        small = memory(args, folder, args.fresh)
        large = memory(args, folder, args.urls)
    per_url = (large["rss_kib"] - small["rss_kib"]) * 1024 / max(1, args.urls - args.fresh)
    mem = {
        "small": small,
        "large": large,
        "extra_mib": round((large["rss_kib"] - small["rss_kib"]) / 1024, 1),
        "bytes_per_url": round(per_url, 1),
    }
    met = speed["share_of_limits"] >= GOAL
    print_table(
        f"autothrottle fetch: {speed['hosts']} hosts x {speed['rate_per_host']:g}/s "
        f"({args.client}, {speed['policy']})",
        ["measure", "value"],
        [
            ["URLs", speed["urls"]],
            ["sum of the hosts' limits /s", speed["sum_of_limits"]],
            ["aggregate steady rate /s", speed["aggregate_steady_rate"]],
            ["share of the limits", f"{100 * speed['share_of_limits']:.1f}%"],
            [f"goal >= {100 * GOAL:.0f}%", "met" if met else "MISSED"],
            ["URLs per wall second", speed["urls_per_wall_second"]],
            ["429s", speed["limited_429"]],
            ["max in 1 s at any host", speed["max_in_1s_any_host"]],
            ["peak RSS (MiB)", speed["peak_rss_mib"]],
            [f"peak RSS, {args.fresh:,} input URLs (MiB)", round(small["rss_kib"] / 1024, 1)],
            [f"peak RSS, {args.urls:,} input URLs (MiB)", round(large["rss_kib"] / 1024, 1)],
            ["extra bytes per input URL", mem["bytes_per_url"]],
            [f"seconds for the {args.urls:,}-URL resume", large["seconds"]],
        ],
    )
    path = write_results("fetch", {"throughput": speed, "memory": mem, "goal": GOAL, "met": met})
    print(f"results written to {path}")


if __name__ == "__main__":
    main()

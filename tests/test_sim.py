"""autothrottle.sim against real loopback traffic, plus its pure parts.

Real-time checks only assert lower bounds (a sleep cannot end early) and
orderings, never speed: the machine is small and shared.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from autothrottle.sim import (
    CDN,
    Capacity,
    HostStats,
    RateLimited,
    SimServer,
    SoftBlock,
    VariableLatency,
    is_blocked_page,
    main,
    max_in_window,
    parse_behaviour,
)
from autothrottle.sim._buckets import Bucket
from autothrottle.sim._cli import DEFAULT_SPECS, build_parser, hosts_from_args
from autothrottle.sim._server import loopback_addresses

A, B = "127.0.0.2", "127.0.0.3"


class Got:
    def __init__(self, status: int, headers: dict[str, str], body: bytes, latency: float):
        self.status, self.headers, self.body, self.latency = status, headers, body, latency


async def fetch(http: aiohttp.ClientSession, url: str) -> Got:
    t = time.monotonic()
    async with http.get(url) as r:
        body = await r.read()
        return Got(r.status, dict(r.headers), body, time.monotonic() - t)


@pytest.fixture
async def http() -> Any:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


# ----------------------------------------------------------------------------- pure parts


def brute_max_in_window(times: list[float], window: float) -> int:
    return max((sum(1 for u in times if t <= u < t + window) for t in times), default=0)


def test_max_in_window_on_synthetic_arrivals() -> None:
    assert max_in_window([]) == 0
    assert max_in_window([5.0]) == 1
    # Exactly 1/R apart: R per second, not R + 1 (the window is half-open).
    assert max_in_window([i * 0.5 for i in range(10)]) == 2
    assert max_in_window([0.0, 0.25, 0.5, 0.75, 1.0]) == 4
    # A burst in the middle of a slow trickle.
    trickle = [0.0, 2.0, 3.0, 3.1, 3.2, 3.3, 3.99, 4.0, 6.0]
    assert max_in_window(trickle) == 5
    assert max_in_window(trickle, 0.25) == 3
    assert max_in_window(trickle, 10.0) == len(trickle)
    rng = random.Random(4)
    for _ in range(50):
        times = sorted(rng.uniform(0, 5) for _ in range(rng.randrange(1, 60)))
        for window in (0.3, 1.0):
            assert max_in_window(times, window) == brute_max_in_window(times, window)
    with pytest.raises(ValueError, match="window"):
        max_in_window([1.0], 0)


def test_token_bucket_retry_after_and_headers() -> None:
    bucket = Bucket(rate=10, burst=2, now=0.0)
    assert bucket.take(0.0) and bucket.take(0.0)
    assert not bucket.take(0.01)
    assert bucket.retry_after() == 1  # 0.09 s rounds up to the minimum of 1
    headers = bucket.headers(limited=True)
    assert headers["RateLimit-Policy"] == '"default";q=10;w=1'
    assert headers["RateLimit"] == '"default";r=0;t=1'
    assert headers["X-RateLimit-Remaining"] == "0"
    # Served: the tokens now (0) plus a window's refill (10), at most the quota.
    assert bucket.headers()["RateLimit"] == '"default";r=10;t=1'
    assert bucket.take(0.11)  # a token came back after 0.1 s

    slow = Bucket(rate=0.25, burst=1, now=0.0)
    assert slow.take(0.0)
    assert not slow.take(0.5)
    assert slow.retry_after() == 4  # 3.5 s, rounded up
    assert slow.headers()["RateLimit-Policy"] == '"default";q=1;w=4'
    assert not slow.take(3.9)
    assert slow.take(4.0)


def test_path_classes_are_deterministic_and_near_their_ratio() -> None:
    cdn = CDN(hit_ratio=0.8, origin=Capacity(1, 0.1), edge_time=0.001)
    var = VariableLatency(slow_ratio=0.3)
    paths = [f"/page/{i}" for i in range(2000)]
    hits = sum(cdn.is_hit(p) for p in paths) / len(paths)
    slow = sum(var.is_slow(p) for p in paths) / len(paths)
    assert 0.75 < hits < 0.85
    assert 0.25 < slow < 0.35
    assert [cdn.is_hit(p) for p in paths[:50]] == [cdn.is_hit(p) for p in paths[:50]]
    assert not CDN(hit_ratio=0.0).is_hit("/x") and CDN(hit_ratio=1.0).is_hit("/x")


def test_capacity_figures() -> None:
    assert Capacity(4, 0.05).capacity == pytest.approx(80)
    assert RateLimited(7).capacity == 7
    assert CDN(0.9, Capacity(2, 0.2), 0.01).capacity == pytest.approx(100)
    assert VariableLatency(0.1, 0.5, 0.25, 3).capacity == pytest.approx(3 / 0.2)


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: Capacity(0, 0.1), ["workers", "0"]),
        (lambda: Capacity(2.5, 0.1), ["workers", "2.5"]),  # type: ignore[arg-type]
        (lambda: Capacity(True, 0.1), ["workers", "True"]),
        (lambda: Capacity(2, 0), ["service_time", "0"]),
        (lambda: Capacity(2, float("nan")), ["service_time", "nan"]),
        (lambda: Capacity(2, 0.1, jitter=1.0), ["jitter", "1.0"]),
        (lambda: RateLimited(0), ["rate", "0"]),
        (lambda: RateLimited(-1), ["rate", "-1"]),
        (lambda: RateLimited(5, burst=0), ["burst", "0"]),
        (lambda: RateLimited(5, retry_after="yes"), ["retry_after", "yes"]),  # type: ignore[arg-type]
        (lambda: RateLimited(5, headers=1), ["headers", "1"]),  # type: ignore[arg-type]
        (lambda: RateLimited(5, service_time=-0.1), ["service_time", "-0.1"]),
        (lambda: SoftBlock(float("inf")), ["rate", "inf"]),
        (lambda: SoftBlock(1, burst=-2), ["burst", "-2"]),
        (lambda: CDN(hit_ratio=1.5), ["hit_ratio", "1.5"]),
        (lambda: CDN(origin=RateLimited(1)), ["origin", "RateLimited"]),  # type: ignore[arg-type]
        (lambda: CDN(edge_time=-1), ["edge_time", "-1"]),
        (lambda: VariableLatency(slow_ratio=-0.1), ["slow_ratio", "-0.1"]),
        (lambda: VariableLatency(fast_time=0.5, slow_time=0.1), ["slow_time", "0.1"]),
        (lambda: VariableLatency(workers=0), ["workers", "0"]),
        (lambda: SimServer({}), ["hosts"]),
        (lambda: SimServer({"10.0.0.1": Capacity(1, 1)}), ["hosts", "10.0.0.1"]),
        (lambda: SimServer({"localhost": Capacity(1, 1)}), ["hosts", "localhost"]),
        (lambda: SimServer({A: "capacity"}), ["hosts", "capacity"]),  # type: ignore[dict-item]
        (lambda: SimServer({A: Capacity(1, 1)}, port=70000), ["port", "70000"]),
        (lambda: SimServer({A: Capacity(1, 1)}, seed=1.5), ["seed", "1.5"]),  # type: ignore[arg-type]
        (lambda: SimServer.many(0, Capacity(1, 1)), ["n", "0"]),
        (lambda: SimServer.many(2, Capacity(1, 1), first="127.255.255.254"), ["n", "2"]),
        (lambda: SimServer.many(2, Capacity(1, 1), first="::1"), ["first", "::1"]),
        (lambda: SimServer({A: Capacity(1, 1)}, address=A), ["hosts", A, "named"]),
        (lambda: SimServer({"a_b.test": Capacity(1, 1)}, address=A), ["hosts", "a_b.test"]),
        (lambda: SimServer({"a.test": Capacity(1, 1)}, address="10.0.0.1"), ["address"]),
        (lambda: SimServer.many(2, Capacity(1, 1), domain="-x.test"), ["domain", "-x.test"]),
    ],
)
def test_bad_values_fail_at_construction_naming_parameter_and_value(
    make: Any, words: list[str]
) -> None:
    with pytest.raises(ValueError) as info:
        make()
    for word in words:
        assert word in str(info.value)


def test_addresses_continue_past_the_last_octet() -> None:
    got = loopback_addresses("127.0.0.252", 5)
    assert got == ["127.0.0.252", "127.0.0.253", "127.0.0.254", "127.0.1.1", "127.0.1.2"]
    many = SimServer.many(200, RateLimited(2))
    assert many.hosts[0] == "127.0.0.2" and many.hosts[-1] == "127.0.0.201"
    assert len(set(many.hosts)) == 200


@pytest.mark.parametrize(
    ("first", "room"),
    [("127.255.255.254", 1), ("127.255.254.200", 55 + 254), ("127.0.0.1", 254 * 65536)],
)
def test_a_count_past_the_end_of_127_8_is_refused_at_once(
    first: str, room: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Counted, not walked: each step to the next address is counted, and a refusal
    # takes none (walking 20 million addresses to the end took about a minute).
    steps = 0
    step = ipaddress.IPv4Address.__add__

    def counted(self: ipaddress.IPv4Address, other: int) -> ipaddress.IPv4Address:
        nonlocal steps
        steps += 1
        if steps > 1000:
            raise AssertionError("walked the addresses")
        return step(self, other)

    monkeypatch.setattr(ipaddress.IPv4Address, "__add__", counted)
    assert loopback_addresses(first, 1) == [first]
    shown = min(room, 600)
    steps = 0
    assert len(loopback_addresses(first, shown)) == shown
    assert steps >= shown  # the counter sees the walk
    for n in (room + 1, 20_000_000):
        steps = 0
        with pytest.raises(ValueError, match=f"n: {n} addresses from {first} run past the end"):
            loopback_addresses(first, n)
        assert steps == 0


# ----------------------------------------------------------------------------- command line


def test_parse_behaviour_round_trips_and_reports_errors() -> None:
    for spec in DEFAULT_SPECS:
        b = parse_behaviour(spec)
        assert parse_behaviour(b.spec) == b
    assert parse_behaviour("capacity:workers=4,service-time=0.05") == Capacity(4, 0.05)
    assert parse_behaviour("rate-limited:rate=2,headers=no") == RateLimited(2, headers=False)
    assert parse_behaviour("cdn:workers=3") == CDN(origin=Capacity(3, 0.2))
    assert parse_behaviour("variable") == VariableLatency()
    for bad, words in [
        ("teapot:x=1", ["teapot"]),
        ("capacity:service_time=0.1", ["workers", "required"]),
        ("capacity:workers=four,service_time=1", ["workers", "four"]),
        ("capacity:workers=4,service_time=1,colour=red", ["colour"]),
        ("rate:rate=2,headers=maybe", ["headers", "maybe"]),
        ("rate:rate=0", ["rate", "0"]),
        ("rate:rate", ["rate"]),
    ]:
        with pytest.raises(ValueError) as info:
            parse_behaviour(bad)
        for word in words:
            assert word in str(info.value)


def test_command_line_hosts() -> None:
    parser = build_parser()
    args = parser.parse_args(
        [
            "--host",
            "127.0.0.3=capacity:workers=4,service_time=0.05",
            "--many",
            "3=rate:rate=2",
            "--port",
            "0",
        ]
    )
    hosts = hosts_from_args(args)
    assert hosts == {
        "127.0.0.3": Capacity(4, 0.05),
        "127.0.0.2": RateLimited(2),
        "127.0.0.4": RateLimited(2),
        "127.0.0.5": RateLimited(2),
    }
    defaults = hosts_from_args(parser.parse_args(["--first", "127.0.0.10"]))
    assert list(defaults) == [f"127.0.0.{i}" for i in range(10, 15)]
    assert [b.kind for b in defaults.values()] == [
        "capacity",
        "rate",
        "softblock",
        "cdn",
        "variable",
    ]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--host", "127.0.0.2=capacity:workers=0,service_time=1"], ["workers", "0"]),
        (["--host", "8.8.8.8=rate:rate=1"], ["8.8.8.8", "loopback"]),
        (["--host", "127.0.0.2"], ["127.0.0.2"]),
        (["--many", "0=rate:rate=1"], ["count", "0"]),
        (["--duration", "-1"], ["duration", "-1"]),
        (["--port", "99999"], ["port", "99999"]),
        (["--first", "example.org"], ["first", "example.org"]),
    ],
)
def test_command_line_errors_exit_2_with_a_message(
    argv: list[str], words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err


def test_main_runs_for_a_duration_and_writes_stats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "stats.json"
    argv = ["--host", "127.0.0.2=rate:rate=3", "--duration", "0.2", "--stats-file", str(out_file)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "http://127.0.0.2:" in out and "rate:rate=3" in out
    doc = json.loads(out_file.read_text())
    assert list(doc["hosts"]) == ["127.0.0.2"]
    assert doc["hosts"]["127.0.0.2"]["capacity"] == 3


def test_the_stats_file_holds_the_last_runs_stats_until_this_runs_replace_them(
    tmp_path: Path,
) -> None:
    """While serving, ``--stats-file`` still holds what it held (a previous run's
    stats), whole; at exit the new stats replace it whole, and nothing is left
    beside it."""
    stats = tmp_path / "stats.json"
    previous = '{"hosts": {"127.0.0.99": {}}}\n'
    stats.write_text(previous)
    command = [sys.executable, "-m", "autothrottle", "sim", "--quiet", "--ready-json"]
    command += ["--duration", "60", "--host", "127.0.0.11=cdn", "--stats-file", str(stats)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # the URL
        assert json.loads(proc.stdout.readline())["ready"] is True
        assert stats.read_text() == previous
        assert os.listdir(tmp_path) == ["stats.json"]
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert list(json.loads(stats.read_text())["hosts"]) == ["127.0.0.11"]
    assert os.listdir(tmp_path) == ["stats.json"]


_SIGTERM_ON_READY = """
import os, signal, sys
from autothrottle.sim._cli import main


class Out:
    # A stdout that sends this process SIGTERM as the ready line goes out:
    # the earliest a user who waits for that line can stop the sim.
    def __init__(self, inner):
        self.inner = inner

    def write(self, text):
        written = self.inner.write(text)
        if '"ready": true' in text:
            os.kill(os.getpid(), signal.SIGTERM)
        return written

    def flush(self):
        self.inner.flush()


sys.stdout = Out(sys.stdout)
sys.exit(main(sys.argv[1:], prog="autothrottle sim"))
"""


def test_a_sigterm_as_soon_as_the_sim_says_it_is_ready_still_writes_the_stats(
    tmp_path: Path,
) -> None:
    """The ready line promises a sim that a signal stops the ordinary way; a
    SIGTERM sent the moment it is out (before the sim's next step, as a busy
    machine can make happen) must not kill it with the stats unwritten."""
    stats = tmp_path / "stats.json"
    argv = ["--quiet", "--ready-json", "--duration", "60", "--host", "127.0.0.12=cdn"]
    proc = subprocess.run(
        [sys.executable, "-c", _SIGTERM_ON_READY, *argv, "--stats-file", str(stats)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert list(json.loads(stats.read_text())["hosts"]) == ["127.0.0.12"]


def test_a_stats_file_behind_a_link_is_written_through_it(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    target, link = tmp_path / "runs" / "stats.json", tmp_path / "stats.json"
    link.symlink_to(target)
    argv = ["--host", "127.0.0.2=cdn", "--duration", "0", "--stats-file", str(link), "--quiet"]
    assert main(argv) == 0
    assert link.is_symlink()
    assert list(json.loads(target.read_text())["hosts"]) == ["127.0.0.2"]
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["runs", "stats.json", "stats.json"]


def test_stats_that_cannot_be_written_at_exit_leave_the_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stats = tmp_path / "stats.json"
    stats.write_text("previous\n")

    def full(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("autothrottle.sim._cli.os.replace", full)
    argv = ["--host", "127.0.0.2=cdn", "--duration", "0", "--stats-file", str(stats), "--quiet"]
    assert main(argv, prog="autothrottle sim") == 1
    err = capsys.readouterr().err
    assert err == (
        f"autothrottle sim: error: --stats-file: cannot write {str(stats)!r}: "
        "No space left on device\n"
    )
    assert stats.read_text() == "previous\n"
    assert os.listdir(tmp_path) == ["stats.json"]


def test_python_dash_m_runs_and_stops() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "autothrottle.sim", "--duration", "1", "--host", "127.0.0.9=cdn"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert "http://127.0.0.9:" in proc.stdout
    assert "max/1s" in proc.stdout  # the closing summary


def test_python_dash_m_without_aiohttp_says_what_to_install_as_the_command_does(
    tmp_path: Path,
) -> None:
    (tmp_path / "aiohttp.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'aiohttp'\", name='aiohttp')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # an aiohttp that cannot be imported

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args, "--duration", "1"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=tmp_path,
        )

    as_module, as_command = run("-m", "autothrottle.sim"), run("-m", "autothrottle", "sim")
    assert (as_module.returncode, as_command.returncode) == (1, 1)
    assert "needs aiohttp" in as_command.stderr and "[sim]" in as_command.stderr
    assert "Traceback" not in as_module.stderr
    assert as_module.stderr == as_command.stderr.replace(
        "autothrottle sim", "python -m autothrottle.sim"
    )
    assert as_module.stdout == ""


def test_the_help_lists_the_options_without_aiohttp_and_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user reads the options before installing the extra: ``--help`` prints the
    simulator's own help, ended by what to install, and exits 0 (a run still
    refuses, as above)."""
    (tmp_path / "aiohttp.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'aiohttp'\", name='aiohttp')\n"
    )
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps the help to the terminal's width
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, timeout=60, env=env
        )

    for args, prog in [
        (("-m", "autothrottle.sim", "--help"), "python -m autothrottle.sim"),
        (("-m", "autothrottle", "sim", "--duration", "1", "-h"), "autothrottle sim"),
    ]:
        done = run(*args)
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
        options, _, note = done.stdout.rpartition(f"\n{prog} needs aiohttp")
        assert options == build_parser(prog).format_help()  # the same options
        assert "which is not installed (the 'sim' extra)" in note
        assert 'pip install -e ".[sim]"' in note


def test_quiet_prints_the_urls_alone_one_a_line_while_serving(tmp_path: Path) -> None:
    """What a script reading the URLs from stdout relies on: a line per host, in host
    order, each a URL it can fetch at once; nothing else, then or at exit."""
    stats = tmp_path / "stats.json"
    hosts = ["127.0.0.9=rate:rate=50,burst=5", "127.0.0.10=capacity:workers=1,service_time=0.01"]
    command = [sys.executable, "-m", "autothrottle", "sim", "--quiet", "--duration", "60"]
    command += [arg for host in hosts for arg in ("--host", host)]
    proc = subprocess.Popen(
        [*command, "--stats-file", str(stats)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        urls = [proc.stdout.readline().rstrip("\n") for _ in hosts]
        assert [url.rsplit(":", 1)[0] for url in urls] == ["http://127.0.0.9", "http://127.0.0.10"]
        assert all(url.rsplit(":", 1)[1].isdigit() for url in urls), urls
        for url in urls:
            with urllib.request.urlopen(url + "/page/1", timeout=30) as response:
                assert response.status == 200
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out == ""  # no summary, no "stats written" line
    assert list(json.loads(stats.read_text())["hosts"]) == ["127.0.0.9", "127.0.0.10"]


# ----------------------------------------------------------------------------- real traffic


async def test_capacity_site_queues_beyond_its_workers(http: aiohttp.ClientSession) -> None:
    workers, service = 2, 0.2
    async with SimServer({A: Capacity(workers, service, jitter=0.0)}) as sim:
        got = await asyncio.gather(*(fetch(http, sim.url(A, f"/page/{i}")) for i in range(4)))
        truth = sim.host_stats(A)
    assert [g.status for g in got] == [200] * 4
    assert all(b"<a href=" in g.body for g in got)
    lat = sorted(g.latency for g in got)
    assert lat[0] >= service * 0.9
    assert lat[2] >= 2 * service * 0.9 and lat[3] >= 2 * service * 0.9  # waited a full service
    assert truth.requests == truth.ok == 4
    assert truth.max_in_service == workers
    assert truth.max_queued == 2
    assert truth.mean_queued > 0
    waits = sorted(r.wait for r in truth.records)
    assert waits[2] >= service * 0.9 and waits[3] >= service * 0.9
    # FIFO: service starts in arrival order.
    by_arrival = sorted(truth.records, key=lambda r: r.arrival)
    starts = [r.start for r in by_arrival]
    assert starts == sorted(starts)
    assert truth.in_service == truth.queued == 0
    assert truth.goodput > 0


async def test_rate_limited_site_answers_429_beyond_the_burst(
    http: aiohttp.ClientSession,
) -> None:
    # One token every 2 s: concurrent requests cannot earn a new one in time.
    async with SimServer(
        {A: RateLimited(0.5, burst=3), B: RateLimited(0.5, 1, False, False)}
    ) as sim:
        got = await asyncio.gather(*(fetch(http, sim.url(A, f"/p{i}")) for i in range(6)))
        bare = [await fetch(http, sim.url(B, "/")) for _ in range(2)]
        truth = sim.host_stats(A)
    ok = [g for g in got if g.status == 200]
    limited = [g for g in got if g.status == 429]
    assert len(ok) == 3 and len(limited) == 3
    # Tokens now plus the window's refill (3), capped at the quota of 3.
    assert [g.headers["X-RateLimit-Remaining"] for g in ok] == ["3", "3", "3"]
    for g in got:
        assert g.headers["RateLimit-Policy"] == '"default";q=3;w=6'
        assert g.headers["X-RateLimit-Limit"] == "3"
        assert g.headers["RateLimit"].startswith('"default";r=')
    for g in limited:
        assert 1 <= int(g.headers["Retry-After"]) <= 2
        assert g.headers["X-RateLimit-Remaining"] == "0"
    assert truth.requests == 6 and truth.ok == 3 and truth.limited == 3
    assert dict(truth.statuses) == {200: 3, 429: 3}
    assert truth.max_in_window == max_in_window(truth.arrivals) == 6
    assert [g.status for g in bare] == [200, 429]
    assert "Retry-After" not in bare[1].headers
    assert not any(k.lower().startswith(("ratelimit", "x-ratelimit")) for k in bare[1].headers)


async def test_rate_limited_window_counts_paced_arrivals(http: aiohttp.ClientSession) -> None:
    async with SimServer({A: RateLimited(1000, burst=1000, service_time=0)}) as sim:
        for _ in range(5):
            await fetch(http, sim.url(A))
            await asyncio.sleep(0.3)
        truth = sim.host_stats(A)
    # 0.3 s apart at least, so no 1-second window holds more than 4.
    assert truth.requests == 5
    assert 1 <= truth.max_in_window <= 4
    assert truth.max_in_window == brute_max_in_window(list(truth.arrivals), 1.0)


async def test_soft_block_serves_captcha_pages_with_200(http: aiohttp.ClientSession) -> None:
    async with SimServer({A: SoftBlock(0.5, burst=2)}) as sim:
        got = [await fetch(http, sim.url(A, f"/item/{i}")) for i in range(5)]
        truth = sim.host_stats(A)
    assert [g.status for g in got] == [200] * 5
    assert [is_blocked_page(g.body) for g in got] == [False, False, True, True, True]
    assert is_blocked_page(got[4].body.decode())
    assert "Retry-After" not in got[4].headers
    assert truth.ok == 2 and truth.blocked == 3 and truth.limited == 0
    assert dict(truth.statuses) == {200: 5}


async def test_cdn_hits_carry_cache_headers_and_spare_the_origin(
    http: aiohttp.ClientSession,
) -> None:
    cdn = CDN(hit_ratio=0.5, origin=Capacity(1, 0.1, jitter=0.0), edge_time=0.001)
    paths = [f"/page/{i}" for i in range(100)]
    hits = [p for p in paths if cdn.is_hit(p)][:5]
    misses = [p for p in paths if not cdn.is_hit(p)][:3]
    async with SimServer({A: cdn}) as sim:
        got_hits = await asyncio.gather(*(fetch(http, sim.url(A, p)) for p in hits))
        after_hits = sim.host_stats(A)
        got_misses = await asyncio.gather(*(fetch(http, sim.url(A, p)) for p in misses))
        again = await fetch(http, sim.url(A, hits[0]))
        truth = sim.host_stats(A)
    for g in [*got_hits, again]:
        assert g.status == 200
        assert g.headers["X-Cache"] == "HIT" and g.headers["CF-Cache-Status"] == "HIT"
        assert int(g.headers["Age"]) >= 0
    assert after_hits.requests == 5
    assert after_hits.origin is not None and after_hits.origin.requests == 0
    for g in got_misses:
        assert g.headers["X-Cache"] == "MISS" and g.headers["CF-Cache-Status"] == "MISS"
    assert sorted(g.latency for g in got_misses)[-1] >= 3 * 0.1 * 0.9  # one origin worker
    origin = truth.origin
    assert origin is not None
    assert origin.requests == 3 and origin.ok == 3
    assert origin.max_in_service == 1 and origin.max_queued == 2
    assert origin.capacity == pytest.approx(10)
    assert truth.requests == 9 and truth.ok == 9


async def test_variable_latency_mixes_fast_and_slow_pages(http: aiohttp.ClientSession) -> None:
    var = VariableLatency(fast_time=0.01, slow_time=0.3, slow_ratio=0.5, workers=8, jitter=0.0)
    paths = [f"/page/{i}" for i in range(100)]
    slow = [p for p in paths if var.is_slow(p)][:3]
    fast = [p for p in paths if not var.is_slow(p)][:3]
    async with SimServer({A: var}) as sim:
        got_slow = await asyncio.gather(*(fetch(http, sim.url(A, p)) for p in slow))
        got_fast = await asyncio.gather(*(fetch(http, sim.url(A, p)) for p in fast))
        truth = sim.host_stats(A)
    assert all(g.latency >= 0.27 for g in got_slow)
    assert [g.status for g in got_fast] == [200] * 3
    server_lat = {r.arrival: r.latency for r in truth.records}
    ordered = [server_lat[t] for t in truth.arrivals]
    slow_lat, fast_lat = sorted(ordered[:3]), sorted(ordered[3:])
    assert min(slow_lat) >= 0.27
    assert fast_lat[1] < slow_lat[1]  # medians
    assert truth.ok == 6


async def test_stats_endpoint_reset_and_control_requests_unrecorded(
    http: aiohttp.ClientSession,
) -> None:
    async with SimServer({A: Capacity(2, 0.01), B: RateLimited(100)}, seed=3) as sim:
        for i in range(3):
            await fetch(http, sim.url(A, f"/page/{i}"))
        await fetch(http, sim.url(B, "/"))
        async with http.get(sim.url(A, "/_sim/stats")) as r:
            assert r.status == 200
            doc = await r.json()
        async with http.get(sim.url(A, "/_sim/stats?all=1&series=0")) as r:
            every = await r.json()
        assert doc["host"] == A and doc["requests"] == 3
        assert doc["outcomes"]["ok"] == 3 and doc["statuses"] == {"200": 3}
        assert len(doc["series"]["arrivals"]) == 3
        assert doc["series"]["requests"]["status"] == [200, 200, 200]
        assert doc["series"]["in_service"][0] == [0.0, 0]
        assert doc["capacity"] == pytest.approx(200)
        assert set(every["hosts"]) == {A, B}
        assert "series" not in every["hosts"][B] and every["hosts"][B]["requests"] == 1
        assert sim.host_stats(A).requests == 3  # the stats requests were not counted

        from_python = json.loads(sim.stats_json())
        assert from_python["hosts"][A]["requests"] == 3
        stats = sim.stats()
        assert set(stats) == {A, B} and isinstance(stats[A], HostStats)
        assert stats[A].url == sim.base_url(A)

        async with http.post(sim.url(B, "/_sim/reset")) as r:
            assert r.status == 200
        assert sim.host_stats(B).requests == 0 and sim.host_stats(A).requests == 3
        sim.reset()
        after = sim.host_stats(A)
        assert after.requests == 0 and after.since > 0
        await fetch(http, sim.url(A, "/again"))
        assert sim.host_stats(A).requests == 1
        async with http.get(sim.url(A, "/_sim/nothing")) as r:
            assert r.status == 404


async def test_many_hosts_each_see_only_their_own_traffic(http: aiohttp.ClientSession) -> None:
    sim = SimServer.many(200, RateLimited(2), first="127.0.0.100")
    assert "127.0.1.1" in sim.hosts
    async with sim:
        targets = sim.hosts[::20]  # ten hosts across the range
        for host in targets:
            await fetch(http, sim.url(host, "/"))
        stats = sim.stats()
    assert sum(s.requests for s in stats.values()) == len(targets)
    for host in targets:
        assert stats[host].requests == 1 and stats[host].ok == 1


async def test_fixed_port_for_every_address(http: aiohttp.ClientSession) -> None:
    probe = SimServer({A: Capacity(1, 0.01)})
    async with probe:
        port = int(probe.base_url(A).rsplit(":", 1)[1])
    sim = SimServer({A: Capacity(1, 0.01), B: Capacity(1, 0.01)}, port=port)
    assert sim.url(B, "x") == f"http://{B}:{port}/x"
    async with sim:
        assert (await fetch(http, sim.url(B))).status == 200
        assert sim.host_stats(B).requests == 1 and sim.host_stats(A).requests == 0


class _Names(AbstractResolver):
    """Resolves every name to one loopback address, as a crawl of virtual hosts needs."""

    def __init__(self, address: str) -> None:
        self.address = address

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        address = self.address
        return [
            ResolveResult(
                hostname=host, host=address, port=port, family=socket.AF_INET, proto=0, flags=0
            )
        ]

    async def close(self) -> None:
        pass


async def test_virtual_hosts_are_told_apart_by_the_host_header() -> None:
    sim = SimServer.many(3, RateLimited(1, burst=1), domain="Sim.Test", first=B)
    assert sim.hosts == ("h1.sim.test", "h2.sim.test", "h3.sim.test")
    assert sim.address("h2.sim.test") == B
    connector = aiohttp.TCPConnector(resolver=_Names(B))
    async with sim, aiohttp.ClientSession(connector=connector) as session:
        assert sim.url("h2.sim.test", "/x").startswith("http://h2.sim.test:")
        got = [(await fetch(session, sim.url(h, "/"))).status for h in ("h1.sim.test",) * 2]
        assert got == [200, 429]  # one bucket, one host
        assert (await fetch(session, sim.url("h2.sim.test", "/"))).status == 200
        stranger = sim.url("h1.sim.test", "/").replace("h1.sim.test", "h9.sim.test")
        assert (await fetch(session, stranger)).status == 421
        async with session.get(sim.url("h3.sim.test", "/_sim/stats?all=1&series=0")) as r:
            doc = await r.json()
    assert {h: s["requests"] for h, s in doc["hosts"].items()} == {
        "h1.sim.test": 2,
        "h2.sim.test": 1,
        "h3.sim.test": 0,
    }


def test_command_line_virtual_hosts(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    args = parser.parse_args(["--domain", "sim.test", "--host", "h2.sim.test=cdn"])
    args.many = [(2, RateLimited(2))]
    assert list(hosts_from_args(args)) == ["h2.sim.test", "h1.sim.test", "h3.sim.test"]
    argv = ["--domain", "sim.test", "--many", "2=rate:rate=3", "--ready-json"]
    assert main([*argv, "--first", "127.0.0.7", "--duration", "0.1"]) == 0
    ready = next(line for line in capsys.readouterr().out.splitlines() if '"ready"' in line)
    hosts = json.loads(ready)["hosts"]
    assert list(hosts) == ["h1.sim.test", "h2.sim.test"]
    assert hosts["h2.sim.test"]["address"] == "127.0.0.7"
    assert hosts["h2.sim.test"]["url"].startswith("http://h2.sim.test:")
    with pytest.raises(SystemExit):
        main(["--domain", "sim.test", "--host", "127.0.0.2=cdn", "--duration", "0"])
    assert "named" in capsys.readouterr().err


async def test_closing_with_requests_queued_releases_all_load() -> None:
    sim = SimServer({A: Capacity(1, 30.0, jitter=0.0)})
    await sim.start()
    async with aiohttp.ClientSession() as session:

        async def doomed(i: int) -> None:
            with contextlib.suppress(aiohttp.ClientError):
                await fetch(session, sim.url(A, f"/slow/{i}"))

        tasks = [asyncio.create_task(doomed(i)) for i in range(3)]
        for _ in range(200):  # bounded wait until all three have arrived
            if sim.host_stats(A).requests == 3:
                break
            await asyncio.sleep(0.02)
        live = sim.host_stats(A)
        assert live.in_service == 1 and live.queued == 2
        await sim.close()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
    truth = sim.host_stats(A)
    assert truth.in_service == 0 and truth.queued == 0
    assert truth.aborted == 3 and truth.completed == 0

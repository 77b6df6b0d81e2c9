"""``autothrottle fetch`` against simulated hosts on loopback, and its pure parts.

The simulator runs in its own process (``python -m autothrottle.sim``), so the
fetch can own its event loop and its signal handlers, as it does for a user.
The assertions are on what the output file and the sites' ground truth hold,
never on speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from autothrottle import FixedDelayPolicy, FixedRatePolicy, Throttle, ThrottleEvent
from autothrottle.cli._fetch import _Scheduler
from autothrottle.cli._fetch_clients import CLIENTS, Client, open_sender
from autothrottle.cli._fetch_io import LineWriter, UrlSet, resume
from autothrottle.cli._fetch_options import NOT_FLAGS, SETTINGS, throttle_kwargs
from autothrottle.cli._main import build_parser, main
from autothrottle.cli._robots import _ASKING, FetchTimeline, Robots
from autothrottle.timeline import Timeline
from helpers import FakeClock
from loopback import served_here

# ----------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def sim(*args: str) -> Iterator[dict[str, str]]:
    """``python -m autothrottle.sim`` in a child process; address -> base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "autothrottle.sim", "--quiet", "--ready-json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        hosts: dict[str, str] = {}
        for _, line in zip(range(1000), proc.stdout, strict=False):
            if line.startswith('{"ready"'):
                hosts = {a: h["url"] for a, h in json.loads(line)["hosts"].items()}
                break
        assert hosts, proc.stderr.read() if proc.stderr else "the simulator did not start"
        yield hosts
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


def truth(base_url: str) -> dict[str, Any]:
    """One host's ground truth, without any proxy the environment names."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{base_url}/_sim/stats", timeout=20) as response:
        doc: dict[str, Any] = json.load(response)
    return doc


def lines_of(path: Path) -> list[dict[str, Any]]:
    text = path.read_text()
    assert not text or text.endswith("\n"), "a partial line was left in the output"
    return [json.loads(line) for line in text.splitlines()]


def fetch_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "autothrottle", "fetch", *args]


# ----------------------------------------------------------------------------- pure parts


def test_every_throttle_setting_has_a_flag_or_a_reason() -> None:
    keywords = set(inspect.signature(Throttle).parameters)
    assert keywords == set(SETTINGS) | set(NOT_FLAGS)


def test_flags_reach_the_throttle_by_their_setting_names() -> None:
    ns = build_parser().parse_args(
        [
            "fetch",
            "urls.txt",
            "--start-delay",
            "0.25",
            "--max-concurrency",
            "3",
            "--no-retry-after",
            "--backoff-statuses",
            "429,503,502",
            "--policy",
            "fixed-rate=4",
        ]
    )
    given = throttle_kwargs(ns)
    assert set(given) == {
        "start_delay",
        "max_concurrency",
        "retry_after",
        "backoff_statuses",
        "policy",
    }
    throttle = Throttle(**given)
    assert throttle.config.max_concurrency == 3 and not throttle.retry_after
    assert set(throttle.backoff_statuses) == {429, 503, 502}
    assert isinstance(throttle.config.policy, FixedRatePolicy)
    assert throttle.config.policy.per_second == 4.0


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--start-delay", "-1"], "start_delay"),
        (["--jitter", "1.5"], "jitter"),
        (["--policy", "fastest"], "--policy"),
        (["--retries", "-1"], "--retries"),
        (["--backoff-statuses", "4x9"], "--backoff-statuses"),
    ],
)
def test_a_bad_flag_exits_naming_it(
    tmp_path: Path, flags: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = tmp_path / "urls.txt"
    urls.write_text("http://127.0.0.2/\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["fetch", str(urls), *flags])
    assert exit_info.value.code == 2
    assert needle in capsys.readouterr().err


def test_a_missing_urls_file_exits_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fetch", str(tmp_path / "absent.txt")])
    assert exit_info.value.code == 2
    assert "absent.txt" in capsys.readouterr().err


def test_url_set_remembers_urls_compactly() -> None:
    seen = UrlSet()
    urls = [f"http://h{i % 97}.example/{i}" for i in range(20_000)]
    assert all(seen.add(u) for u in urls)
    assert not any(seen.add(u) for u in urls[::7])
    assert len(seen) == 20_000
    assert urls[123] in seen and "http://other/" not in seen
    assert seen.nbytes <= 20_000 * 8 * 4  # a set of str would take ~100 bytes each


def test_resume_drops_a_cut_line_and_knows_what_is_done(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    writer = LineWriter(str(out))
    writer.write({"url": "http://a/1", "status": 200})
    writer.write({"url": "http://a/2", "status": 429})
    writer.close()
    with out.open("ab") as fh:
        fh.write(b'{"url": "http://a/3", "sta')  # killed in the middle of a write
    done, lines = resume(str(out))
    assert lines == 2 and len(done) == 2
    assert "http://a/1" in done and "http://a/3" not in done
    assert out.read_bytes().endswith(b'"status":429}\n')
    writer = LineWriter(str(out))
    writer.write({"url": "http://a/3", "status": 200})
    writer.close()
    assert [r["url"] for r in lines_of(out)] == ["http://a/1", "http://a/2", "http://a/3"]


def test_the_charts_robots_notes_stay_bounded_over_many_hosts() -> None:
    """A note no sample took by the second since it was heard (its slot gone from
    the throttle) is let go of: 100,000 hosts noted, sampled every 1,000, leave
    at most those of the last two samples (twice, as the look waits for the notes
    to double). A note whose slot counted the answer is taken by its sample."""
    throttle = Throttle()
    timeline = FetchTimeline(throttle, interval=0.25, interval_per_slot=0.0, jsonl=None)
    asking = _ASKING.set(True)
    try:
        throttle.observe("kept.test", latency=0.1, status=404)
        for i in range(100_000):
            timeline._hear(ThrottleEvent("response", f"host{i}.test", 404))
            if i % 1000 == 999:
                timeline.sample()
                assert len(timeline._none) <= 4 * 1000 + 1
    finally:
        _ASKING.reset(asking)
    assert len(timeline._none) <= 4 * 1000
    assert "kept.test" not in timeline._none
    first = timeline.samples("kept.test")[0]
    assert (first.responses, first.statuses) == (1, {})
    timeline.close()


@pytest.mark.parametrize("client", CLIENTS)
async def test_the_chart_leaves_out_the_robots_txt_answer_it_heard_not_another_origins(
    client: Client, tmp_path: Path
) -> None:
    """Two origins on one slot (one host, two ports): origin A's page answers 404
    while origin B's robots.txt, asked before it, has not answered yet; then B's
    answers 404 (there is none). The chart keeps A's 404, in the sample it
    came in, and leaves out B's, in the sample after; the throttle counted both."""
    asked, release = asyncio.Event(), asyncio.Event()

    async def robots(request: web.Request) -> web.Response:
        asked.set()
        await release.wait()
        return web.Response(status=404)

    async def gone(request: web.Request) -> web.Response:
        return web.Response(status=404)

    app = web.Application()
    app.router.add_get("/robots.txt", robots)
    app.router.add_get("/gone", gone)
    throttle = Throttle(policy=FixedDelayPolicy(0.0))
    filed = tmp_path / "timeline.jsonl"
    timeline = FetchTimeline(throttle, interval=60.0, interval_per_slot=0.0, jsonl=str(filed))
    async with (
        served_here(["127.0.0.2", "127.0.0.2"], app) as (a, b),
        open_sender(client, throttle, io_timeout=10.0, connections=4, headers={}) as sender,
    ):
        rules = Robots(sender, throttle, "test", attempts=1, note=lambda text: None)
        reading = asyncio.create_task(rules.rules(f"{b}page"))
        await asyncio.wait_for(asked.wait(), 10.0)
        assert (await sender.get(f"{a}gone")).status == 404
        timeline.sample()
        release.set()
        assert (await asyncio.wait_for(reading, 10.0)).parser is None
        timeline.sample()
    timeline.close()
    as_counted = Timeline.read_jsonl(filed).samples("127.0.0.2")
    assert [s.statuses for s in as_counted] == [{404: 1}, {404: 1}]
    assert [s.statuses for s in timeline.samples("127.0.0.2")] == [{404: 1}, {}]


def test_scheduler_takes_hosts_in_turn_within_both_caps() -> None:
    sched = _Scheduler(lambda key: 2, max_in_flight=5)
    for i in range(6):
        sched.put("a", f"a{i}")
    sched.put("b", "b0")
    sched.put("c", "c0")
    taken = [sched.take() for _ in range(6)]
    assert taken[:5] == [("a", "a0"), ("b", "b0"), ("c", "c0"), ("a", "a1"), None]
    assert taken[5] is None  # a has 2 under way: its cap; and 4 in all
    assert sched.in_flight == 4
    sched.finish("b")
    assert sched.take() is None  # b has nothing queued; a is at its cap
    sched.finish("a")
    assert sched.take() == ("a", "a2")
    assert (sched.buffered, sched.in_flight) == (3, 3)
    assert not sched.idle


# ----------------------------------------------------------------------------- real runs


def test_ten_thousand_urls_on_fifty_hosts_one_line_each_through_a_sigint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with sim("--many", "50=capacity:workers=8,service_time=0.002") as hosts:
        bases = list(hosts.values())
        urls = [f"{base}/page/{i}" for i in range(200) for base in bases]
        source = tmp_path / "urls.txt"
        # Repeats, blank lines and comments are not URLs to fetch twice.
        source.write_text("# crawl\n\n" + "\n".join(urls + urls[:25]) + "\n")
        out = tmp_path / "out.jsonl"
        flags = ["-o", str(out), "--policy", "fixed-rate=60", "--start-delay", "0"]
        flags += ["--progress", "plain", "--interval", "0.3"]
        first = subprocess.Popen(
            fetch_command(str(source), *flags),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and first.poll() is None:
            if out.exists() and out.stat().st_size > 1500 * 150:
                break
            time.sleep(0.05)
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=60)
        assert first.returncode == 130, err
        before = lines_of(out)
        assert 1000 < len(before) < len(urls)

        # Not a terminal: plain lines a log can hold, no escape codes, a summary.
        progress = [line for line in err.splitlines() if line.startswith("[")]
        assert progress and all("done" in line and "ETA" in line for line in progress)
        assert "\x1b[" not in err
        assert "interrupted" in err and "run the same command again" in err

        assert main(["fetch", str(source), *flags]) == 0
        assert "resuming" in capsys.readouterr().err
    records = lines_of(out)
    counts = Counter(r["url"] for r in records)
    assert set(counts) == set(urls)
    assert max(counts.values()) == 1
    assert all(r["status"] == 200 and r["error"] is None for r in records)
    assert all(r["slot"] == r["url"].split("/")[2].split(":")[0] for r in records)


class _Pauses(logging.Handler):
    """The pauses a throttle held, as its debug log states them, each stamped with
    ``time.monotonic()`` when it was set: the simulator's clock, in another process."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.held: list[tuple[float, float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        seconds = getattr(record, "pause", None)
        if seconds is not None:
            self.held.append((time.monotonic(), seconds, getattr(record, "reason", "")))


@contextlib.contextmanager
def pauses_logged() -> Iterator[_Pauses]:
    """Collect what ``autothrottle fetch --debug`` logs of its pauses."""
    logger = logging.getLogger("autothrottle")
    handler, level = _Pauses(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_a_host_that_refuses_is_retried_within_the_bound_and_paced(tmp_path: Path) -> None:
    # 5 requests/s; the throttle starts far too fast and does not read the
    # rate-limit headers, so only 429 + Retry-After (1 s) can slow it down.
    with sim("--host", "127.0.0.2=rate:rate=5,burst=1,headers=false") as hosts:
        base = hosts["127.0.0.2"]
        urls = [f"{base}/page/{i}" for i in range(12)]
        source = tmp_path / "urls.txt"
        source.write_text("\n".join(urls) + "\n")
        out = tmp_path / "out.jsonl"
        flags = ["-o", str(out), "--retries", "3", "--start-delay", "0", "--progress", "none"]
        with pauses_logged() as pauses:
            status = main(["fetch", str(source), *flags, "--max-concurrency", "4", "--debug"])
        before = time.monotonic()
        site = truth(base)
        after = time.monotonic()
    records = lines_of(out)
    assert sorted(r["url"] for r in records) == sorted(urls)
    assert all(1 <= r["attempts"] <= 4 for r in records)
    assert all(r["status"] == 429 for r in records if r["attempts"] < 4 and r["status"] != 200)
    # A URL still refused after its last retry ended in an error, and says so.
    gave_up = [r for r in records if r["status"] == 429]
    assert all(r["error"] == "GaveUp: status 429 after 4 attempts" for r in gave_up)
    assert status == (1 if gave_up else 0)
    # Every attempt reached the site once: no retry outside the bound (and robots.txt once).
    assert site["outcomes"]["robots"] == 1
    assert site["requests"] == sum(r["attempts"] for r in records) + 1
    assert site["outcomes"]["limited"] >= 1 and any(r["attempts"] > 1 for r in records)
    # Paced: never more than the rate and burst plus the first volley in a second ...
    assert site["max_in_window"] <= 5 + 1 + 4
    # ... and nothing sent during a pause a Retry-After set, once it was set
    # (requests already on their way then may still arrive). Its length is the
    # throttle's to judge: the whole second, or, for a refusal at a pace the
    # host had kept, until one gap after the refused request was sent
    # (docs/recovery.md, "At a pace the host kept"), which timing decides.
    held = [(at, seconds) for at, seconds, reason in pauses.held if reason == "Retry-After"]
    assert held, "no Retry-After was obeyed"
    # The simulator's times count from its start: when that was, on this
    # process's clock, is known to within the stats request's round trip. A
    # pause is stamped here a moment after it was set: 0.1 s to spare at its end.
    start_at_least, start_at_most = before - site["now"], after - site["now"]
    arrivals = site["series"]["arrivals"]
    sent_in_pause = [
        (at, seconds, arrival)
        for at, seconds in held
        for arrival in arrivals
        if at - start_at_least + 0.25 < arrival < at - start_at_most + seconds - 0.1
    ]
    assert not sent_in_pause


def test_stdin_to_stdout_with_bodies_named_by_their_hash(tmp_path: Path) -> None:
    with sim("--host", "127.0.0.2=capacity:workers=2,service_time=0.001") as hosts:
        base = hosts["127.0.0.2"]
        urls = [f"{base}/page/{i}" for i in range(5)] + [f"{base}/../../etc/passwd", "ftp://x/"]
        bodies = tmp_path / "bodies"
        result = subprocess.run(
            fetch_command("-", "--bodies", str(bodies), "--client", "httpx", "--start-delay", "0"),
            input="\n".join(urls) + "\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1, result.stderr  # ftp://x/ ended in an error
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted(r["url"] for r in records) == sorted(urls)
    bad = next(r for r in records if r["url"] == "ftp://x/")
    assert bad["status"] is None and "scheme" in bad["error"] and bad["attempts"] == 0
    stored = {p.name: p for p in bodies.rglob("*") if p.is_file()}
    for r in records:
        if r["status"] is None:
            continue
        path = stored[r["sha256"]]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == r["sha256"]
        assert path.stat().st_size == r["bytes"] and path.parent.parent == bodies
    assert not any(name.startswith(".part") for name in os.listdir(bodies))


def line(
    status: int | None, nbytes: int, attempts: int, error: str | None = None
) -> dict[str, Any]:
    """An output line's fields the tally reads."""
    return {"status": status, "bytes": nbytes, "attempts": attempts, "error": error}


def test_a_hosts_rate_in_the_summary_runs_from_its_first_url_started() -> None:
    """A host whose URLs all end together (its robots.txt unreachable after 4 s of
    retries: five lines at once) did 5 URLs in 4 s, not 5 in no time: its rate
    was the lines over the span between its first and last line, tens of
    thousands a second."""
    from rich.console import Console

    from autothrottle.cli._fetch_progress import Tally, summary

    clock = FakeClock(0.0)
    tally = Tally(total=5, clock=clock, started=0.0)
    tally.host("h.example").active += 1  # its first URL started
    clock.advance(4.0)
    for _ in range(5):
        clock.advance(0.0001)
        tally.finished("h.example", line(None, 0, 0, error="RobotsUnreachable: status 503"))
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(summary(tally, Throttle(), interrupted=False))
    (row,) = (r for r in console.export_text().splitlines() if "h.example" in r)
    assert row.split()[3] == "1.2/s", row


def test_the_live_view_and_summary_show_the_busiest_hosts() -> None:
    from rich.console import Console

    from autothrottle.cli._fetch_progress import Tally, live_view, plain_line, summary

    clock = FakeClock(0.0)
    tally = Tally(total=100, clock=clock, started=0.0)
    throttle = Throttle(start_delay=0.25)
    for i in range(12):
        key = f"h{i}.example"
        tally.host(key).active = i % 3
        for _ in range(i):
            clock.advance(0.1)
            tally.finished(key, line(200, 10, 1))
    tally.attempt("h11.example", 429)
    tally.block("h11.example")
    tally.finished("h11.example", line(429, 0, 3, error="GaveUp: status 429 after 3 attempts"))
    tally.finished(None, line(None, 0, 0, error="InvalidURL: no host"))
    console = Console(width=120, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(live_view(tally, throttle, in_flight=7, rows=5))
    console.print(summary(tally, throttle, interrupted=True, rows=3))
    text = console.export_text()
    assert "h11.example" in text and "250 ms" in text and "and 7 more hosts" in text
    assert "interrupted" in text and "statuses 200: 66, 429: 1" in text
    plain = plain_line(tally, throttle, in_flight=7)
    assert plain.count("\n") == 0 and "68 of 100" in plain and "1 429s" in plain
    assert "1 blocked" in plain and "2 errors" in plain
    assert "busiest: h11.example" in plain

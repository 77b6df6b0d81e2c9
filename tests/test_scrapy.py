"""autothrottle inside Scrapy: real crawls against simulated sites on loopback.

Each crawl runs in a subprocess (``scrapy_crawl.py``: Scrapy's reactor wants a
process of its own) against ``autothrottle.sim`` served from a thread of the
test process; what the hosts saw is the simulator's ground truth. The settings
are read without crawling.

Both sides run ahead of the machine's ordinary processes where it allows
(``loopback.promptly_on``): the simulator's thread above the crawl, as
loopback's server is above its clients. A gap at the host is the time between
two stamps, and on two busy cores either the crawl's write or the stamp could
wait tens of milliseconds in the run queue, so that the next gap read short by
as much, a pacing fault that never happened on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from scrapy.settings import Settings

from autothrottle import (
    AdaptiveConcurrencyPolicy,
    AutoThrottlePolicy,
    FixedDelayPolicy,
    FixedRatePolicy,
    Throttle,
)
from autothrottle._scrapy_settings import throttle_from_settings
from autothrottle.scrapy import AutoThrottleMiddleware
from autothrottle.sim import Behaviour, Capacity, HostStats, RateLimited, SimServer, SoftBlock
from helpers import needs_redis
from loopback import SERVER, promptly_on
from redis_keys import fresh_prefix

HERE = Path(__file__).resolve().parent
ARRIVAL_JITTER = 0.015
"""How early an arrival may be stamped and still count as kept apart: one
request's way from its wire turn to the simulator's stamp may be longer than
the next one's."""


class Sim:
    """``SimServer`` in a background loop; ground truth read from that loop."""

    def __init__(self, server: SimServer, loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.loop = loop

    def url(self, host: str, path: str = "/") -> str:
        return self.server.url(host, path)

    def stats(self, host: str) -> HostStats:
        async def read() -> HostStats:
            return self.server.host_stats(host)

        return asyncio.run_coroutine_threadsafe(read(), self.loop).result(10)


@contextlib.contextmanager
def serving(hosts: dict[str, Behaviour]) -> Iterator[Sim]:
    loop = asyncio.new_event_loop()

    def run() -> None:
        promptly_on(SERVER)  # this thread only: it waits in its selector between requests
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    server = SimServer(hosts, seed=1)
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
    try:
        yield Sim(server, loop)
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def crawl(
    tmp_path: Path,
    settings: dict[str, Any],
    requests: list[dict[str, Any]],
    *,
    signal_blocks: bool = False,
    close_after: int | None = None,
    name: str = "crawl",
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run one crawl to its end; its stats, outcomes and the throttle's slots
    (``env``: more of the crawl process's environment; ``close_after``: the
    spider's callback raises ``CloseSpider`` at that response)."""
    spec = tmp_path / f"{name}.spec.json"
    out = tmp_path / f"{name}.out.json"
    doc = {"settings": settings, "requests": requests, "signal_blocks": signal_blocks}
    if close_after is not None:
        doc["close_after"] = close_after
    spec.write_text(json.dumps(doc))
    done = subprocess.run(
        [sys.executable, str(HERE / "scrapy_crawl.py"), str(spec), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )
    if done.returncode != 0 or not out.exists():
        pytest.fail(f"the crawl failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    result["log"] = done.stderr
    return result


def pages(sim: Sim, host: str, count: int, **entry: Any) -> list[dict[str, Any]]:
    return [{"url": sim.url(host, f"/page/{i}"), **entry} for i in range(count)]


def assert_nothing_held(result: dict[str, Any]) -> None:
    for key, slot in result["slots"].items():
        assert (slot["in_flight"], slot["queued"]) == (0, 0), key


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


# -- pacing ----------------------------------------------------------------------------


def test_a_crawl_is_paced_at_the_host_by_the_throttle_alone(tmp_path: Path) -> None:
    """Scrapy's defaults would start every slot at a 5 s delay; the policy's pace
    is what the host sees, and Scrapy's slot adds none of its own."""
    host = "127.0.0.2"
    with serving({host: Capacity(workers=4, service_time=0.01)}) as sim:
        result = crawl(
            tmp_path,
            {
                "AUTOTHROTTLE_POLICY": "fixed-delay=0.1",
                # Scrapy's own slot would wait 2 s between these: it is kept at zero.
                "DOWNLOAD_SLOTS": {host: {"delay": 2.0}},
            },
            pages(sim, host, 12),
        )
        truth = sim.stats(host)
    assert truth.ok == 12
    # From the second gap on: Scrapy gives no hook at the connection, so the
    # wire turn is taken as the request leaves the middlewares, and the crawl's
    # first download also starts Scrapy's HTTP handler and its first connection.
    spacing = gaps(list(truth.arrivals))[1:]
    assert min(spacing) >= 0.1 - ARRIVAL_JITTER, spacing
    assert max(spacing) < 1.0, spacing  # not Scrapy's 5 s start delay, nor its own slot delay
    stats = result["stats"]
    assert stats["autothrottle/requests"] == 12
    assert stats["autothrottle/responses"] == 12
    assert stats["autothrottle/slots"] == 1
    assert_nothing_held(result)


def test_a_request_held_up_after_its_wire_turn_pushes_the_next_one_back(
    tmp_path: Path,
) -> None:
    """Scrapy's download_latency starts at its download handler; a loop busy
    between the wire turn and the handler (here a middleware after this one
    blocks it 80 ms) holds the request up on its way to the host, and at a
    strict pace the next request, sent on time, would arrive 80 ms early."""
    host = "127.0.0.2"
    with serving({host: Capacity(workers=4, service_time=0.01, jitter=0.0)}) as sim:
        requests = pages(sim, host, 10)
        requests[6]["meta"] = {"stall": 0.08}
        result = crawl(
            tmp_path,
            {
                "AUTOTHROTTLE_POLICY": "fixed-delay=0.2",
                "DOWNLOADER_MIDDLEWARES": {
                    "autothrottle.scrapy.AutoThrottleMiddleware": 950,
                    "__main__.Stall": 960,
                },
            },
            requests,
        )
        truth = sim.stats(host)
    assert truth.ok == 10
    spacing = gaps(list(truth.arrivals))[1:]  # the first: Scrapy's handler starting
    assert min(spacing) >= 0.2 - ARRIVAL_JITTER, spacing
    assert_nothing_held(result)


def test_the_delay_adapts_to_download_latency(tmp_path: Path) -> None:
    host = "127.0.0.2"
    with serving({host: Capacity(workers=1, service_time=0.2, jitter=0.0)}) as sim:
        result = crawl(
            tmp_path,
            {
                "AUTOTHROTTLE_START_DELAY": 0.01,
                "AUTOTHROTTLE_TARGET_CONCURRENCY": 1.0,
                "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
            },
            pages(sim, host, 6),
        )
    slot = result["slots"][host]
    # AutoThrottle's rule: the delay moves toward latency / target (0.2 s).
    assert 0.1 < slot["delay"] < 0.4, slot
    assert 0.18 < slot["last_latency"] < 0.5, slot


# -- what the host says ------------------------------------------------------------------


def test_a_429_with_retry_after_pauses_the_slot_and_the_retry_waits(tmp_path: Path) -> None:
    host = "127.0.0.2"
    with serving({host: RateLimited(rate=1, burst=1, headers=False)}) as sim:
        result = crawl(
            tmp_path,
            {
                "AUTOTHROTTLE_POLICY": "fixed-delay=0.05",
                "RETRY_ENABLED": True,
                "RETRY_TIMES": 3,
                "RETRY_HTTP_CODES": [429],
            },
            pages(sim, host, 2),
        )
        truth = sim.stats(host)
    # The records come in the order the host finished them: on a loaded machine
    # the first page's 10 ms of service can end after the second's immediate 429.
    arrived = sorted(truth.records, key=lambda record: record.arrival)
    statuses = [record.status for record in arrived]
    assert statuses[:2] == [200, 429], statuses
    assert truth.ok == 2  # the refused page was retried, and got through
    first_refusal = arrived[1].arrival
    after = [a for a in truth.arrivals if a > first_refusal]
    assert after and after[0] - first_refusal >= 1.0 - ARRIVAL_JITTER  # Retry-After: 1
    stats = result["stats"]
    assert stats["autothrottle/refusals/429"] >= 1
    assert stats["autothrottle/backoffs/status_429"] >= 1
    assert stats["autothrottle/pauses"] >= 1
    assert_nothing_held(result)


def test_rate_limit_headers_keep_the_crawl_under_the_limit(tmp_path: Path) -> None:
    host = "127.0.0.2"
    with serving({host: RateLimited(rate=5, burst=5)}) as sim:
        result = crawl(
            tmp_path,
            {"AUTOTHROTTLE_START_DELAY": 0.0, "CONCURRENT_REQUESTS_PER_DOMAIN": 4},
            pages(sim, host, 16),
        )
        truth = sim.stats(host)
    assert truth.limited <= 1, truth.statuses
    assert truth.ok >= 15
    assert result["slots"][host]["rate_limit"] is not None


def test_a_captcha_signalled_by_the_spider_backs_the_slot_off(tmp_path: Path) -> None:
    host = "127.0.0.2"
    with serving({host: SoftBlock(rate=2, burst=1)}) as sim:
        result = crawl(
            tmp_path,
            {"AUTOTHROTTLE_POLICY": "autothrottle", "AUTOTHROTTLE_START_DELAY": 0.05},
            pages(sim, host, 8),
            signal_blocks=True,
        )
    stats = result["stats"]
    assert any(outcome.get("blocked") for outcome in result["outcomes"])
    assert stats["autothrottle/blocked"] >= 1
    assert stats["autothrottle/backoffs/blocked"] >= 1
    assert result["slots"][host]["last_backoff_reason"] == "blocked"


def test_a_block_pattern_backs_off_without_code(tmp_path: Path) -> None:
    host = "127.0.0.2"
    with serving({host: SoftBlock(rate=2, burst=1)}) as sim:
        result = crawl(
            tmp_path,
            {"AUTOTHROTTLE_START_DELAY": 0.05, "AUTOTHROTTLE_BLOCK_PATTERN": "(?i)captcha"},
            pages(sim, host, 8),
        )
    assert result["stats"]["autothrottle/backoffs/blocked"] >= 1


def test_a_refused_connection_is_a_failure_that_backs_off(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.9", 0))
        port = sock.getsockname()[1]
    result = crawl(
        tmp_path,
        {"RETRY_ENABLED": False, "AUTOTHROTTLE_START_DELAY": 0.0},
        [{"url": f"http://127.0.0.9:{port}/"}],
    )
    stats = result["stats"]
    assert stats["autothrottle/failures"] == 1
    assert any(key.startswith("autothrottle/backoffs/failure/") for key in stats), stats
    # Scrapy 2.14 on raises its own error, 2.13 Twisted's.
    errors = [outcome.get("error") for outcome in result["outcomes"]]
    assert errors in (["DownloadConnectionRefusedError"], ["ConnectionRefusedError"])
    assert_nothing_held(result)


# -- per-request options ------------------------------------------------------------------


def test_per_request_options_from_meta_and_the_header(tmp_path: Path) -> None:
    host = "127.0.0.2"
    with serving({host: Capacity(workers=4, service_time=0.01)}) as sim:
        result = crawl(
            tmp_path,
            {"AUTOTHROTTLE_POLICY": "fixed-delay=5"},
            [
                {"url": sim.url(host, "/page/0")},
                {"url": sim.url(host, "/page/1"), "meta": {"autothrottle": {"bypass": True}}},
                {"url": sim.url(host, "/page/2"), "headers": {"X-AutoThrottle": "slot=other"}},
                {"url": sim.url(host, "/page/3"), "meta": {"autothrottle": {"max_wait": 0.2}}},
            ],
        )
    by_url = {outcome["url"].rsplit("/", 1)[1]: outcome for outcome in result["outcomes"]}
    assert by_url["0"]["slot"] == host
    assert by_url["1"]["slot"] is None  # bypassed: not paced, not counted
    assert by_url["2"]["slot"] == "other"
    assert by_url["3"]["error"] == "ThrottleWaitTimeout"
    stats = result["stats"]
    assert stats["autothrottle/bypassed"] == 1
    assert stats["autothrottle/timeouts"] == 1
    assert "retry/count" not in stats  # a wait past max_wait is not retried
    assert_nothing_held(result)


# -- closing ------------------------------------------------------------------------------


def test_closing_mid_crawl_gives_waiting_requests_back_and_holds_nothing(
    tmp_path: Path,
) -> None:
    host = "127.0.0.2"
    with serving({host: Capacity(workers=4, service_time=0.01)}) as sim:
        result = crawl(
            tmp_path,
            {"AUTOTHROTTLE_POLICY": "fixed-delay=0.5", "CLOSESPIDER_TIMEOUT": 1.5},
            pages(sim, host, 30),
        )
        truth = sim.stats(host)
    assert truth.requests <= 6  # one every 0.5 s for 1.5 s, not 30 of them
    stats = result["stats"]
    assert stats["finish_reason"] == "closespider_timeout"
    assert stats["autothrottle/rescheduled_at_close"] >= 1
    # The queue of 15 s was not drained: timed by Scrapy, from the spider's
    # opening to its close. The whole subprocess, Python and Scrapy starting
    # up at an ordinary priority, took 40 s on two busy cores (load 19).
    assert stats["elapsed_time_seconds"] < 10
    assert_nothing_held(result)


def test_close_spider_from_a_callback_mid_crawl_holds_nothing(tmp_path: Path) -> None:
    """The spider's own callback raises ``CloseSpider`` at its second response,
    with requests waiting their turn and others on the wire: the waiting ones go
    back unsent, those on the wire end as Scrapy lets them, and when the spider
    has closed no slot holds anything, and nothing had to be let go at close."""
    host = "127.0.0.2"
    with serving({host: Capacity(workers=8, service_time=0.3, jitter=0.0)}) as sim:
        result = crawl(
            tmp_path,
            {"AUTOTHROTTLE_POLICY": "fixed-delay=0.1", "CONCURRENT_REQUESTS_PER_DOMAIN": 4},
            pages(sim, host, 40),
            close_after=2,
        )
        truth = sim.stats(host)
    stats = result["stats"]
    assert stats["finish_reason"] == "enough"
    assert stats["autothrottle/rescheduled_at_close"] >= 1
    assert stats.get("autothrottle/released_at_close", 0) == 0
    assert truth.requests < 40 and stats["autothrottle/requests"] == truth.requests
    assert_nothing_held(result)


# -- a fleet -------------------------------------------------------------------------------


def test_two_spider_processes_share_one_pace_through_redis(tmp_path: Path) -> None:
    needs_redis()
    host = "127.0.0.2"
    settings = {
        "AUTOTHROTTLE_POLICY": "fixed-rate=4",
        "AUTOTHROTTLE_REDIS_URL": "redis://127.0.0.1:6379/0",
        "AUTOTHROTTLE_REDIS_PREFIX": fresh_prefix("test-scrapy"),
    }
    with serving({host: Capacity(workers=8, service_time=0.01)}) as sim:
        results: list[dict[str, Any]] = []
        workers = [
            threading.Thread(
                target=lambda n=n: results.append(
                    crawl(tmp_path, settings, pages(sim, host, 10), name=f"worker{n}")
                )
            )
            for n in range(2)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(120)
        truth = sim.stats(host)
    assert len(results) == 2
    assert truth.ok == 20
    # Two processes at 4/s each would put 8 in a second; one pace puts 4 (+1 burst).
    assert truth.max_in_window <= 5, truth.max_in_window
    active = (truth.arrivals[-1] - truth.arrivals[0]) if truth.arrivals else 0.0
    assert active >= 19 / 4 * 0.9
    for result in results:
        assert_nothing_held(result)


# -- state across runs ----------------------------------------------------------------------


def test_a_state_file_carries_what_was_learned_to_the_next_run(tmp_path: Path) -> None:
    """Two crawls, each a process of its own: the second starts at the pace the
    first learned, at the host, not at the 10-ms start delay."""
    host = "127.0.0.2"
    state = tmp_path / "learned.json"
    settings = {"AUTOTHROTTLE_STATE_FILE": str(state), "AUTOTHROTTLE_START_DELAY": 0.01}
    with serving({host: Capacity(workers=1, service_time=0.3, jitter=0.0)}) as sim:
        first = crawl(tmp_path, settings, pages(sim, host, 4), name="first")
        learned = first["slots"][host]["delay"]
        assert learned > 0.1
        assert host in json.loads(state.read_text())["slots"]
        before = len(sim.stats(host).arrivals)
        second = crawl(tmp_path, settings, pages(sim, host, 3), name="second")
        arrivals = sim.stats(host).arrivals[before:]
    assert len(arrivals) == 3
    # Its first two requests were sent the learned delay apart (a fresh start: 10 ms).
    assert arrivals[1] - arrivals[0] >= learned * 0.5, (arrivals, learned)
    assert second["stats"]["autothrottle/requests"] == 3


# -- settings, without a crawl ------------------------------------------------------------


def build(settings: dict[str, Any]) -> Throttle:
    return throttle_from_settings(Settings(settings))


def test_the_extension_left_on_is_refused() -> None:
    crawler = SimpleNamespace(settings=Settings({"AUTOTHROTTLE_ENABLED": True}))
    with pytest.raises(ValueError, match="AUTOTHROTTLE_ENABLED"):
        AutoThrottleMiddleware(crawler)  # type: ignore[arg-type]


def test_scrapys_settings_keep_their_meaning() -> None:
    throttle = build(
        {
            "AUTOTHROTTLE_START_DELAY": 2.0,
            "AUTOTHROTTLE_MAX_DELAY": 30.0,
            "AUTOTHROTTLE_TARGET_CONCURRENCY": 3.0,
            "DOWNLOAD_DELAY": 0.25,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 5,
            "RANDOMIZE_DOWNLOAD_DELAY": False,
        }
    )
    config = throttle.config
    assert (config.start_delay, config.max_delay, config.target_concurrency) == (2.0, 30.0, 3.0)
    assert (config.min_delay, config.max_concurrency, config.jitter) == (0.25, 5, 0.0)
    assert isinstance(config.policy, AutoThrottlePolicy)


def test_scrapys_defaults_are_scrapys() -> None:
    config = build({}).config
    assert (config.start_delay, config.max_delay, config.target_concurrency) == (5.0, 60.0, 1.0)
    assert (config.min_delay, config.max_concurrency, config.jitter) == (0.0, 8, 0.5)


@pytest.mark.filterwarnings("ignore:The CONCURRENT_REQUESTS_PER_IP setting is deprecated")
def test_concurrent_requests_per_ip_is_the_cap_when_set() -> None:
    settings = {"CONCURRENT_REQUESTS_PER_IP": 3, "CONCURRENT_REQUESTS_PER_DOMAIN": 9}
    assert build(settings).config.max_concurrency == 3


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("autothrottle", AutoThrottlePolicy),
        ("adaptive", AdaptiveConcurrencyPolicy),
        ("fixed-rate=4", FixedRatePolicy),
        ("fixed-delay=0.5", FixedDelayPolicy),
        ("autothrottle.AdaptiveConcurrencyPolicy", AdaptiveConcurrencyPolicy),
        (FixedRatePolicy(2), FixedRatePolicy),
    ],
)
def test_the_policy_setting(value: Any, kind: type) -> None:
    assert isinstance(build({"AUTOTHROTTLE_POLICY": value}).config.policy, kind)


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"AUTOTHROTTLE_POLICY": "fastest"}, "AUTOTHROTTLE_POLICY"),
        ({"AUTOTHROTTLE_POLICY": "fixed-rate=lots"}, "AUTOTHROTTLE_POLICY"),
        ({"AUTOTHROTTLE_POLICY": "logging.Logger"}, "AUTOTHROTTLE_POLICY"),
        ({"AUTOTHROTTLE_TARGET_CONCURRENCY": 0.0}, "AUTOTHROTTLE_TARGET_CONCURRENCY"),
        ({"AUTOTHROTTLE_START_DELAY": -1.0}, "AUTOTHROTTLE_START_DELAY"),
        ({"DOWNLOAD_DELAY_JITTER": 1.5}, "DOWNLOAD_DELAY_JITTER"),
        ({"AUTOTHROTTLE_HOSTS": {"a.com": {"spead": 1}}}, "spead"),
        (
            {"AUTOTHROTTLE_REDIS_URL": "redis://x", "AUTOTHROTTLE_STATE_FILE": "s.json"},
            "AUTOTHROTTLE_STATE_FILE",
        ),
    ],
)
def test_a_wrong_setting_is_named(settings: dict[str, Any], named: str) -> None:
    with pytest.raises((TypeError, ValueError), match=named):
        build(settings)


def test_per_host_settings_and_download_slots() -> None:
    throttle = build(
        {
            "DOWNLOAD_SLOTS": {"slow.example": {"delay": 3.0, "concurrency": 1}},
            "AUTOTHROTTLE_HOSTS": {
                "*.api.example": {"policy": "fixed-rate=2", "max_concurrency": 2},
                "slow.example": {"max_delay": 90.0},
            },
        }
    )
    slow = throttle.config_for("slow.example")
    assert (slow.start_delay, slow.max_concurrency, slow.max_delay) == (3.0, 1, 90.0)
    api = throttle.config_for("v1.api.example")
    assert isinstance(api.policy, FixedRatePolicy)
    assert api.max_concurrency == 2


@pytest.mark.parametrize(
    "header", ["no-adjust, slot=api, max-wait=2.5", "bypass", "cost=600", "cost=500+100"]
)
def test_options_from_the_header_are_kept_in_the_meta_for_retries(header: str) -> None:
    from autothrottle._request import options_from_header, options_from_mapping
    from autothrottle._scrapy_parts import as_meta

    options = options_from_header(header)
    assert options_from_mapping({"autothrottle": as_meta(options)}) == options


def test_the_block_statuses_back_off_as_blocks() -> None:
    throttle = build({"AUTOTHROTTLE_BLOCK_STATUSES": [403], "AUTOTHROTTLE_START_DELAY": 1.0})
    throttle.observe("a.example", latency=0.1, status=403)
    snapshot = throttle.slot("a.example").snapshot()
    assert snapshot.last_backoff_reason == "blocked"


def test_randomize_download_delay_set_by_the_project_wins() -> None:
    settings = Settings({"RANDOMIZE_DOWNLOAD_DELAY": False})
    assert throttle_from_settings(settings).config.jitter == 0.0
    settings = Settings({"DOWNLOAD_DELAY_JITTER": 0.2})
    assert throttle_from_settings(settings).config.jitter == 0.2
    assert math.isclose(throttle_from_settings(Settings()).config.jitter, 0.5)


def test_the_debug_log_says_what_each_response_did(tmp_path: Path) -> None:
    host = "127.0.0.2"
    # One token each 10 s: the second page is refused however late a loaded machine sends it.
    with serving({host: RateLimited(rate=0.1, burst=1, headers=False)}) as sim:
        result = crawl(
            tmp_path,
            {
                "AUTOTHROTTLE_DEBUG": True,
                "AUTOTHROTTLE_POLICY": "fixed-delay=0.05",
                "RETRY_ENABLED": False,
            },
            pages(sim, host, 2),
        )
    lines = [line for line in result["log"].splitlines() if "[autothrottle.scrapy] INFO" in line]
    assert len(lines) == 2, lines
    # Whichever page reached the host second was refused: on a loaded machine the
    # first page's new connection may be slower than the second's 50 ms gap.
    (refused,) = [line for line in lines if "status: 429" in line]
    assert "backoff: status 429" in refused
    assert "paused" in refused
    assert any("status: 200" in line for line in lines), lines
    logging.getLogger(__name__).debug("%s", lines)

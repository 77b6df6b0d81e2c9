"""The Scrapy middleware over HTTPS: real crawls against ``tls.py``'s loopback server.

Each crawl runs in a subprocess, as in ``test_scrapy.py``, against an aiohttp.web
server over TLS behind a front that holds each new connection as long as the
test says (the handshake ends that much later). Scrapy verifies no certificate
unless told to: ``DOWNLOAD_VERIFY_CERTIFICATES`` (Scrapy 2.15 on) or, before it,
``BrowserLikeContextFactory``; either checks against the platform's authorities,
which ``SSL_CERT_FILE`` replaces with the test's own (``trustme``) in the crawl's
process.

What differs from the other adapters (``docs/adapters.md``, "HTTPS and HTTP/2")
and is documented in ``docs/scrapy.md``, "Over HTTPS": Scrapy's
``download_latency`` and the wire turn both start before the connection is made,
and Scrapy tells no one whether a request opened a connection, so a slow
handshake is in its request's latency and comes out of the gap after it.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scrapy.settings import default_settings

from test_scrapy import ARRIVAL_JITTER, assert_nothing_held, crawl, gaps

tls = pytest.importorskip("tls")  # trustme

HERE = Path(__file__).resolve().parent

VERIFYING: dict[str, Any] = (
    {"DOWNLOAD_VERIFY_CERTIFICATES": True}
    if hasattr(default_settings, "DOWNLOAD_VERIFY_CERTIFICATES")
    else {
        "DOWNLOADER_CLIENTCONTEXTFACTORY": (
            "scrapy.core.downloader.contextfactory.BrowserLikeContextFactory"
        )
    }
)
"""Scrapy's settings that verify the server's certificate, on the Scrapy installed."""

DEBUG_LINE = re.compile(r"delay:\s*(\d+) ms .*latency:\s*(\d+) ms")


@pytest.fixture(scope="module")
def host() -> Iterator[Any]:
    with tls.tls_host("h1", "127.0.0.2") as served:
        yield served


def trusted() -> dict[str, str]:
    """The crawl process's environment that trusts ``tls.py``'s authority alone."""
    return {"SSL_CERT_FILE": tls.CA_FILE}


def urls(host: Any, count: int, path: str = "/delay/20") -> list[dict[str, Any]]:
    return [{"url": host.url(f"{path}?page={i}")} for i in range(count)]


def test_a_slow_handshake_is_in_the_first_latency_and_its_delay_halves_away(
    host: Any, tmp_path: Path
) -> None:
    """Scrapy's rule (the default policy) from a 50-ms start: the first connection's
    600-ms handshake is in its request's ``download_latency``, so the delay jumps to
    it, and each later response halves the difference (the pages reuse the
    connection; docs/scrapy.md gives the figures of a 300-ms one).

    Each bound is half the first latency or delay: a handshake counted again
    would put a later latency near the first, and keep the delay there, while
    a request of the 20-ms page held up by two busy cores would need nearly
    300 ms more to cross it (a bound of 200 ms left 180)."""
    host.forget()
    host.hold(600)
    result = crawl(
        tmp_path,
        {
            "AUTOTHROTTLE_START_DELAY": 0.05,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
            "AUTOTHROTTLE_DEBUG": True,
        },
        urls(host, 6),
    )
    assert host.connections == 1
    latencies = [outcome["latency"] for outcome in result["outcomes"]]
    assert latencies[0] >= 0.6, latencies
    assert max(latencies[1:]) < latencies[0] / 2, latencies
    delays = [int(match[1]) / 1000 for match in DEBUG_LINE.finditer(result["log"])]
    assert len(delays) == 6, result["log"][-3000:]
    assert delays[0] >= 0.6, delays
    assert delays[-1] < delays[0] / 2, delays
    assert delays[1] < 0.75 * delays[0], delays  # half way back to the 20-ms answer
    assert_nothing_held(result)


def test_the_pace_holds_at_the_host_but_a_slow_handshake_comes_out_of_the_gap_after_it(
    host: Any, tmp_path: Path
) -> None:
    """A verified certificate of a trusted authority: every page comes. The wire
    turn is taken as the request leaves the middlewares, so a request whose new
    connection takes 300 ms to open reaches the host that much late, and the
    next one, on a connection of its own, on time: the host sees them closer
    than the 200-ms delay (or in the other order). From the next request on,
    on the open connections, the delay apart."""
    host.forget()
    host.hold(300)
    result = crawl(
        tmp_path,
        {**VERIFYING, "AUTOTHROTTLE_POLICY": "fixed-delay=0.2"},
        urls(host, 6),
        env=trusted(),
    )
    assert [outcome.get("status") for outcome in result["outcomes"]] == [200] * 6, result["log"]
    assert max(outcome["latency"] for outcome in result["outcomes"]) >= 0.3
    spacing = gaps(host.arrival_times())
    assert min(spacing[:2]) < 0.2 - ARRIVAL_JITTER, spacing
    assert min(spacing[3:]) >= 0.2 - ARRIVAL_JITTER, spacing
    assert result["stats"]["autothrottle/responses"] == 6
    assert_nothing_held(result)


def test_a_refused_certificate_is_the_hosts_failure_and_holds_nothing(
    host: Any, tmp_path: Path
) -> None:
    """Verifying against the platform's authorities, which do not include the
    test's: the handshake fails, each request is the host's failure (as a
    refused connection is), the slot backs off and holds nothing, and the
    second request still reaches the host's front."""
    host.forget()
    result = crawl(
        tmp_path,
        {**VERIFYING, "RETRY_ENABLED": False, "AUTOTHROTTLE_START_DELAY": 0.0},
        urls(host, 2, "/"),
    )
    errors = [outcome.get("error") for outcome in result["outcomes"]]
    # Scrapy 2.15 on raises its own error, 2.13 Twisted's (both checked).
    assert errors in (["DownloadFailedError"] * 2, ["ResponseNeverReceived"] * 2), errors
    assert host.arrivals == []
    assert host.connections == 2
    stats = result["stats"]
    assert stats["autothrottle/failures"] == 2
    assert any(key.startswith("autothrottle/backoffs/failure/") for key in stats), stats
    assert_nothing_held(result)


# -- tls.py's certificate files ---------------------------------------------------------


def test_tls_makes_its_files_on_first_use_and_removes_them_at_exit(tmp_path: Path) -> None:
    """A process that imports ``tls`` and never serves makes no directory; one that
    reads ``CA_FILE`` makes it, and it is gone when the process ends."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {
        **os.environ,
        "TMPDIR": str(temp),
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("AUTOTHROTTLE_TLS_FILES", None)
    code = (
        "import os, sys, tls; made = os.listdir(sys.argv[1]); "
        "assert not made, made; "
        "assert os.path.exists(tls.CA_FILE) and os.path.exists(tls.SERVER_FILE); "
        "print(len(os.listdir(sys.argv[1])))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(temp)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "1"  # one directory while it ran
    assert list(temp.iterdir()) == []


# -- Scrapy's HTTP/2 download handler ---------------------------------------------------

H2_HANDLER = {"https": "scrapy.core.downloader.handlers.http2.H2DownloadHandler"}
"""Scrapy's HTTP/2 handler (the ``h2`` package; https only): not Scrapy's default."""


@pytest.fixture(scope="module")
def h2_host() -> Iterator[Any]:
    pytest.importorskip("h2")
    with tls.tls_host("h2", "127.0.0.3") as served:
        yield served


def test_over_scrapys_http2_handler_the_pace_the_latency_and_each_ending_hold(
    h2_host: Any, tmp_path: Path
) -> None:
    """One HTTP/2 connection carries every page: the pace holds at the host, the
    status is read (a 429 backs off), a refused connection is the host's failure
    (once the download times out), and nothing stays held. The handler times
    ``download_latency`` to the end of the body, not to the headers as Scrapy's
    HTTP/1.1 handler does: a page whose headers come at once and its body over
    400 ms teaches the slot the headers' time, not the body's."""
    h2_host.forget()
    with socket.socket() as refusing:  # bound, not listening
        refusing.bind(("127.0.0.4", 0))
        refused = f"https://127.0.0.4:{refusing.getsockname()[1]}/"
        result = crawl(
            tmp_path,
            {
                "DOWNLOAD_HANDLERS": H2_HANDLER,
                "AUTOTHROTTLE_POLICY": "fixed-delay=0.2",
                "AUTOTHROTTLE_DEBUG": True,
                "RETRY_ENABLED": False,
            },
            [
                *urls(h2_host, 4, "/stream/5/100"),
                {"url": h2_host.url("/?status=429")},
                {"url": refused, "meta": {"download_timeout": 2}},
            ],
        )
    outcomes = result["outcomes"]
    statuses = sorted(str(outcome.get("status") or outcome["error"]) for outcome in outcomes)
    # The handler reports no refused connection: the request waits out its
    # download_timeout (Scrapy's, docs/scrapy.md), the host's failure still.
    assert statuses == ["200"] * 4 + ["429", "DownloadTimeoutError"], outcomes
    arrivals = h2_host.arrivals
    assert {(arrival["version"], arrival["peer"]) for arrival in arrivals} == {
        ("2", arrivals[0]["peer"])
    }
    # (the first request's handshake comes out of the gap after it: "Over HTTPS")
    assert min(gaps(h2_host.arrival_times())[1:]) >= 0.2 - ARRIVAL_JITTER
    bodies = [outcome["latency"] for outcome in outcomes if outcome.get("status") == 200]
    assert min(bodies) >= 0.4, bodies  # Scrapy's download_latency: the whole body
    taught = [
        int(found[2]) / 1000
        for line in result["log"].splitlines()
        if "status: 200" in line and (found := DEBUG_LINE.search(line))
    ]
    assert len(taught) == 4 and max(taught) < 0.2, taught  # the headers', each
    stats = result["stats"]
    assert stats["autothrottle/refusals/429"] == 1
    assert stats["autothrottle/backoffs/status_429"] == 1
    assert stats["autothrottle/failures"] == 1
    assert_nothing_held(result)

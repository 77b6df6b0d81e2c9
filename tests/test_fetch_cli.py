"""``autothrottle fetch`` as a script sees it: the real command in a subprocess.

Against ``autothrottle sim`` (robots.txt served by the sim) for what a site sees,
and against a small recording server in a thread for what a request carries
(headers, the proxy's request line). Assertions are on the output lines, the
exit status, standard error and the sites' ground truth, never on speed.
"""

from __future__ import annotations

import http.server
import itertools
import json
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import autothrottle
from autothrottle.cli._main import main as fetch_main
from autothrottle.timeline import SlotSample, Timeline
from test_fetch import fetch_command, lines_of, sim, truth

ENV = {**os.environ, "NO_PROXY": "*", "no_proxy": "*"}


def fetch(
    *args: str, stdin: bytes | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        fetch_command(*args), input=stdin, capture_output=True, timeout=timeout, env=ENV
    )


def urls_file(tmp_path: Path, urls: list[str], name: str = "urls.txt") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(urls) + "\n")
    return path


def arrivals(doc: dict[str, Any]) -> list[float]:
    return sorted(doc["series"]["arrivals"])


# ----------------------------------------------------------------------------- a recorder


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, dict[str, str]]]

    def do_GET(self) -> None:
        self.seen.append((self.requestline, dict(self.headers.items())))
        body = b"User-agent: *\nAllow: /\n" if self.path.endswith("/robots.txt") else b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[tuple[str, dict[str, str]]]]]:
    """A loopback server that records each request line and its headers."""
    seen: list[tuple[str, dict[str, str]]] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


# ----------------------------------------------------------------------------- input and output


def test_invalid_utf8_gives_one_valid_json_line_and_reruns_add_none(tmp_path: Path) -> None:
    with sim("--host", "127.0.0.2=capacity:workers=2,service_time=0.001") as hosts:
        base = hosts["127.0.0.2"].encode()
        source = tmp_path / "urls.txt"
        source.write_bytes(base + b"/caf\xe9/\xff\xfe\n" + base + b"/ok\n")
        out = tmp_path / "out.jsonl"
        for _ in range(3):
            done = fetch(str(source), "-o", str(out), "--start-delay", "0", "-q")
            assert done.returncode == 0, done.stderr
    raw = out.read_bytes()
    raw.decode("utf-8")  # valid UTF-8, whatever the input was
    records = lines_of(out)
    assert len(records) == 2  # one line per URL, never appended again
    odd = next(r for r in records if "caf" in r["url"])
    assert odd["url"].endswith("/caf%E9/%FF%FE") and odd["status"] == 200


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("-o", "{tmp}", "is a directory"),
        ("-o", "{tmp}/missing/out.jsonl", "no such directory"),
        ("-o", "/sys/kernel/notes", "cannot write"),
        ("--summary-json", "{tmp}", "is a directory"),
        ("--bodies", "{tmp}/urls.txt", "not a directory"),
        ("--timeline", "{tmp}/missing/t.jsonl", "no such directory"),
    ],
)
def test_a_bad_path_is_one_line_naming_the_flag_and_exit_2(
    tmp_path: Path, flag: str, value: str, needle: str
) -> None:
    if value == "/sys/kernel/notes" and os.access(value, os.W_OK) and os.geteuid() != 0:
        pytest.skip("this machine lets us write there")
    source = urls_file(tmp_path, ["http://127.0.0.2:9/"])
    done = fetch(str(source), flag, value.format(tmp=tmp_path))
    err = done.stderr.decode()
    assert done.returncode == 2
    assert err.count("\n") == 1 and needle in err
    assert ("--out" if flag == "-o" else flag) in err


@pytest.mark.parametrize("flag", ["-o", "--timeline", "--summary-json"])
def test_writing_into_the_urls_file_is_refused_and_leaves_it_as_it_was(
    tmp_path: Path, flag: str
) -> None:
    """``fetch urls.txt -o urls.txt`` would append its lines to the list, which a rerun
    reads as URLs: the same file, by any name, is refused before anything is written."""
    source = urls_file(tmp_path, ["http://127.0.0.2:9/"])
    before = source.read_bytes()
    (tmp_path / "link.txt").symlink_to(source)
    done = fetch(str(tmp_path / "link.txt"), flag, str(source))
    err = done.stderr.decode()
    assert done.returncode == 2
    assert err.count("\n") == 1 and "is URLS_FILE" in err, err
    assert ("--out" if flag == "-o" else flag) in err
    assert source.read_bytes() == before


def test_a_folder_as_urls_file_is_named(tmp_path: Path) -> None:
    done = fetch(str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.decode().count("\n") == 1 and "URLS_FILE" in done.stderr.decode()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["fetch", "u.txt", "--retries", "-1"], "--retries"),
        (["fetch", "u.txt", "--start-delay", "-1"], "--start-delay"),
        (["fetch", "u.txt", "--policy", "fastest"], "--policy"),
        (["fetch", "u.txt", "-H", "no colon"], "-H/--header"),
        (["fetch", "u.txt", "--proxy", "socks9://x"], "--proxy"),
        (["fetch", "u.txt", "--block-pattern", "("], "--block-pattern"),
        (["fetch", "u.txt", "--block-status", "4x3"], "--block-status"),
        (["fetch", "u.txt", "--bogus"], "--bogus"),
        (["plot", "t.jsonl", "-o", "c.png", "--top", "0"], "--top"),
    ],
)
def test_every_bad_flag_is_one_line_naming_it(tmp_path: Path, args: list[str], needle: str) -> None:
    (tmp_path / "u.txt").write_text("http://127.0.0.2:9/\n")
    done = subprocess.run(
        [sys.executable, "-m", "autothrottle", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and needle in done.stderr, done.stderr
    assert "usage:" not in done.stderr


def test_a_host_with_a_space_is_refused_up_front(tmp_path: Path) -> None:
    with sim("--host", "127.0.0.2=capacity:workers=2,service_time=0.001") as hosts:
        base = hosts["127.0.0.2"]
        source = urls_file(tmp_path, ["http://bad host.example/x", f"{base}/fine"])
        done = fetch(str(source), "--start-delay", "0", "-q")
        site = truth(base)
    assert done.returncode == 1  # a URL ended in an error
    records = [json.loads(line) for line in done.stdout.splitlines()]
    bad = next(r for r in records if "bad host" in r["url"])
    assert bad["attempts"] == 0 and bad["error"].startswith("InvalidURL")
    assert site["outcomes"]["ok"] == 1


def test_a_url_without_its_scheme_or_with_a_port_out_of_range_is_an_invalid_url(
    tmp_path: Path,
) -> None:
    """The usual slips of a URL list say what to fix, as an ``InvalidURL`` line."""
    urls = ["example.com/x", "localhost:8080/x", "http://127.0.0.2:99999/x", "mailto:a@b"]
    done = fetch(str(urls_file(tmp_path, urls)), "-q")
    assert done.returncode == 1
    errors = {r["url"]: r["error"] for r in map(json.loads, done.stdout.splitlines())}
    no_scheme = "InvalidURL: no scheme: a URL starts with http:// or https://"
    assert errors["example.com/x"] == errors["localhost:8080/x"] == no_scheme
    assert errors["http://127.0.0.2:99999/x"].startswith("InvalidURL: Port out of range")
    assert errors["mailto:a@b"] == "InvalidURL: scheme must be http or https, got 'mailto'"


def test_a_list_with_no_url_says_it_drew_no_chart_and_shows_no_empty_table(
    tmp_path: Path,
) -> None:
    source = urls_file(tmp_path, ["# nothing yet"])
    chart = tmp_path / "c.png"
    done = fetch(str(source), "-o", str(tmp_path / "o.jsonl"), "--chart", str(chart))
    assert done.returncode == 0, done.stderr
    err = done.stderr.decode()
    assert f"no chart at {chart}" in " ".join(err.split()) and not chart.exists()
    assert "done: 0 URLs" in err and "host" not in err.replace("no host", "")


def test_a_utf8_file_with_a_byte_order_mark_reads_its_first_url(tmp_path: Path) -> None:
    """Notepad's "UTF-8 with BOM" starts the file with U+FEFF: not part of the first URL,
    from a file or from standard input."""
    with sim("--host", "127.0.0.2=capacity:workers=2,service_time=0.001") as hosts:
        base = hosts["127.0.0.2"]
        text = f"\ufeff{base}/first\n{base}/second\n".encode()
        source = tmp_path / "bom.txt"
        source.write_bytes(text)
        runs = [fetch(str(source), "--ignore-robots", "-q"), fetch("-", "-q", stdin=text)]
    for done in runs:
        records = [json.loads(line) for line in done.stdout.splitlines()]
        assert done.returncode == 0, records
        assert sorted(r["url"] for r in records) == [f"{base}/first", f"{base}/second"]


def test_max_wait_bounds_a_url_s_wait_for_its_turn_not_each_retry_s(tmp_path: Path) -> None:
    """A URL whose turn is further than ``--max-wait`` fails once, not ``--retries`` + 1
    times: a retry would wait its turn again, and the URL would wait past the bound."""
    with sim("--host", "127.0.0.2=capacity:workers=2,service_time=0.001") as hosts:
        source = urls_file(tmp_path, [f"{hosts['127.0.0.2']}/page/{i}" for i in range(5)])
        args = ("--ignore-robots", "--policy", "fixed-delay=1", "--max-wait", "0.3", "-q")
        done = fetch(str(source), *args, "--retries", "2")
    records = [json.loads(line) for line in done.stdout.splitlines()]
    waited = [r for r in records if r["error"] is not None]
    assert done.returncode == 1 and len(records) == 5
    assert waited and all("Timeout: waited 0.3s" in r["error"] for r in waited), waited
    assert all(r["attempts"] == 1 for r in waited), waited


def test_dash_o_dash_streams_to_stdout_with_no_resume(tmp_path: Path) -> None:
    with sim("--host", "127.0.0.2=capacity:workers=2,service_time=0.001") as hosts:
        source = urls_file(tmp_path, [f"{hosts['127.0.0.2']}/page/{i}" for i in range(4)])
        runs = [fetch(str(source), "-o", "-", "--start-delay", "0", "-q") for _ in range(2)]
    for done in runs:
        assert done.returncode == 0 and done.stderr == b""
        assert len(done.stdout.splitlines()) == 4  # each run fetches all: stdout has no memory
    assert not (tmp_path / "-").exists()
    help_text = subprocess.run(
        fetch_command("--help"), capture_output=True, text=True, timeout=60
    ).stdout
    assert "no resume" in help_text


def test_dash_o_dev_stdout_in_a_pipe_works_and_dev_full_fails_cleanly(tmp_path: Path) -> None:
    with sim("--host", "127.0.0.2=capacity:workers=2,service_time=0.001") as hosts:
        source = urls_file(tmp_path, [f"{hosts['127.0.0.2']}/page/{i}" for i in range(3)])
        piped = fetch(str(source), "-o", "/dev/stdout", "--start-delay", "0", "-q")
        full = fetch(str(source), "-o", "/dev/full", "--start-delay", "0", timeout=60)
    assert piped.returncode == 0, piped.stderr
    assert len(piped.stdout.splitlines()) == 3
    assert full.returncode == 3
    err = full.stderr.decode()
    assert "cannot write to /dev/full" in err and "No space left" in err


def test_sigterm_exits_143_and_sigint_130(tmp_path: Path) -> None:
    with sim("--host", "127.0.0.2=capacity:workers=1,service_time=0.2") as hosts:
        source = urls_file(tmp_path, [f"{hosts['127.0.0.2']}/page/{i}" for i in range(50)])
        for sig, status in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
            out = tmp_path / f"out-{sig}.jsonl"
            proc = subprocess.Popen(
                fetch_command(str(source), "-o", str(out), "--start-delay", "0", "-q"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=ENV,
            )
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (out.exists() and out.stat().st_size):
                time.sleep(0.05)
            proc.send_signal(sig)
            proc.communicate(timeout=60)
            assert proc.returncode == status
            assert 0 < len(lines_of(out)) < 50


def test_quiet_says_nothing_and_verbose_tells_robots_and_errors(tmp_path: Path) -> None:
    robots = tmp_path / "robots.txt"
    robots.write_text("User-agent: *\nCrawl-delay: 0.05\n")
    with sim(
        "--host", "127.0.0.2=capacity:workers=2,service_time=0.001", "--robots", str(robots)
    ) as hosts:
        source = urls_file(tmp_path, [f"{hosts['127.0.0.2']}/a", "ftp://nope/"])
        quiet = fetch(str(source), "-o", str(tmp_path / "q.jsonl"), "--start-delay", "0", "-q")
        loud = fetch(str(source), "-o", str(tmp_path / "v.jsonl"), "--start-delay", "0", "-v")
    assert quiet.returncode == loud.returncode == 1
    assert quiet.stderr == b""
    err = loud.stderr.decode()
    assert "at most one request every 0.05 s" in err
    assert "ftp://nope/: InvalidURL" in err
    assert "robots.txt of http://127.0.0.2:" in err
    # The totals are one line in a log (standard error is no terminal here), not cut at 120.
    totals = [line for line in err.splitlines() if line.startswith("done:")]
    assert len(totals) == 1 and totals[0].endswith("; 0 excluded by robots.txt"), err
    assert any(line.startswith("   ") and line.strip() == "per host" for line in err.splitlines())


def test_on_a_terminal_without_out_the_lines_are_not_written_over_by_a_live_table(
    tmp_path: Path, recorder: tuple[str, list[tuple[str, dict[str, str]]]]
) -> None:
    """``autothrottle fetch urls.txt`` at a terminal: the lines and the progress share
    the screen, so the progress is plain lines (a live table's redraws would
    erase the lines printed between two of them)."""
    base, _ = recorder
    source = urls_file(tmp_path, [f"{base}/{i}" for i in range(3)])
    command = fetch_command(str(source), "--ignore-robots", "--start-delay", "0")
    main, child = pty.openpty()
    with subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=child, stderr=child, env=ENV
    ) as proc:
        os.close(child)
        screen = bytearray()
        for _ in range(2000):  # at most 200 s
            if select.select([main], [], [], 0.1)[0]:
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                screen += chunk
            elif proc.poll() is not None:
                break
        os.close(main)
        assert proc.wait(timeout=60) == 0
    text = screen.decode()
    assert "in flight" not in text  # the live table's column
    lines = [json.loads(line) for line in text.splitlines() if line.startswith('{"url"')]
    assert sorted(line["url"] for line in lines) == [f"{base}/{i}" for i in range(3)]


def test_debug_shows_each_delay_change_on_stderr_and_leaves_stdout_to_the_lines(
    tmp_path: Path,
) -> None:
    """``--debug`` is ``Throttle(debug=True)``, whose records only a configured logger
    shows: the command shows them, even with ``-q`` (asked for by name)."""
    with sim("--host", "127.0.0.2=capacity:workers=2,service_time=0.001") as hosts:
        source = urls_file(tmp_path, [f"{hosts['127.0.0.2']}/page/{i}" for i in range(4)])
        done = fetch(str(source), "--ignore-robots", "--debug", "-q")
    assert done.returncode == 0, done.stderr
    debug = done.stderr.decode().splitlines()
    assert debug  # a record per adjusted response
    assert all(line.startswith("autothrottle: slot=127.0.0.2 ") for line in debug), debug
    assert all("reason=" in line for line in debug)
    assert len(done.stdout.splitlines()) == 4  # the JSON lines, and nothing else
    assert all(json.loads(line)["status"] == 200 for line in done.stdout.splitlines())


# ----------------------------------------------------------------------------- requests


def test_headers_user_agent_and_proxy_reach_the_wire(
    tmp_path: Path, recorder: tuple[str, list[tuple[str, dict[str, str]]]]
) -> None:
    base, seen = recorder
    source = urls_file(tmp_path, [f"{base}/one"])
    summary = tmp_path / "summary.json"
    done = fetch(
        str(source),
        "-H",
        "X-Token: abc",
        "-H",
        "Accept: text/plain",
        "--start-delay",
        "0",
        "--summary-json",
        str(summary),
        "-q",
    )
    assert done.returncode == 0, done.stderr
    lines = dict(seen)
    assert set(lines) == {"GET /robots.txt HTTP/1.1", "GET /one HTTP/1.1"}
    headers = {k.lower(): v for k, v in lines["GET /one HTTP/1.1"].items()}
    assert headers["x-token"] == "abc" and headers["accept"] == "text/plain"
    agent = headers["user-agent"]
    assert agent.startswith(f"autothrottle/{autothrottle.__version__} (fetch")
    data = json.loads(summary.read_text())
    assert data["exit_status"] == 0 and data["urls"] == 1 and data["ok"] == 1
    assert data["robots"]["requests"] == 1 and data["busiest_hosts"][0]["host"] == "127.0.0.1"

    # Through a proxy (the recorder stands in for it): the request line names the target.
    seen.clear()
    target = urls_file(tmp_path, ["http://127.0.0.9:9/via"], "target.txt")
    done = fetch(
        str(target),
        "--proxy",
        base,
        "--user-agent",
        "probe/1",
        "--start-delay",
        "0",
        "--ignore-robots",
        "-q",
    )
    assert done.returncode == 0, done.stderr
    assert [line for line, _ in seen] == ["GET http://127.0.0.9:9/via HTTP/1.1"]
    assert seen[0][1]["User-Agent"] == "probe/1"


# ----------------------------------------------------------------------------- robots.txt


def test_robots_txt_is_obeyed_read_once_per_host_and_its_delay_is_the_floor(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.txt").write_text("User-agent: *\nDisallow: /private\nCrawl-delay: 0.3\n")
    (tmp_path / "b.txt").write_text("User-agent: autothrottle\nRequest-rate: 4/1s\n")
    with sim(
        "--host",
        "127.0.0.2=capacity:workers=4,service_time=0.001",
        "--host",
        "127.0.0.3=capacity:workers=4,service_time=0.001",
        "--robots",
        f"127.0.0.2={tmp_path / 'a.txt'}",
        "--robots",
        f"127.0.0.3={tmp_path / 'b.txt'}",
    ) as hosts:
        a, b = hosts["127.0.0.2"], hosts["127.0.0.3"]
        urls = [f"{a}/page/{i}" for i in range(6)] + [f"{a}/private/{i}" for i in range(3)]
        urls += [f"{b}/page/{i}" for i in range(6)]
        out = tmp_path / "out.jsonl"
        summary = tmp_path / "summary.json"
        done = fetch(
            str(urls_file(tmp_path, urls)),
            "-o",
            str(out),
            "--start-delay",
            "0",
            "--policy",
            "fixed-rate=100",
            "--summary-json",
            str(summary),
            "-q",
        )
        site_a, site_b = truth(a), truth(b)
    assert done.returncode == 0, done.stderr
    records = {r["url"]: r for r in lines_of(out)}
    assert len(records) == len(urls)
    for i in range(3):
        line = records[f"{a}/private/{i}"]
        assert line["status"] is None and line["attempts"] == 0 and line["error"] is None
        assert "disallows" in line["excluded"]
    assert site_a["outcomes"] == {**site_a["outcomes"], "ok": 6, "robots": 1}
    assert site_b["outcomes"]["robots"] == 1 and site_b["outcomes"]["ok"] == 6
    # Crawl-delay 0.3 and Request-rate 4/1s are the hosts' floors, robots.txt's own
    # request included (a 50 ms allowance for arrival jitter on a busy machine).
    for doc, floor in ((site_a, 0.3), (site_b, 0.25)):
        gaps = [y - x for x, y in itertools.pairwise(arrivals(doc))]
        assert min(gaps) >= floor - 0.05, (floor, gaps)
    data = json.loads(summary.read_text())
    assert data["excluded"] == 3 and data["robots"]["floors"] == {
        "127.0.0.2": 0.3,
        "127.0.0.3": 0.25,
    }


def test_ignore_robots_fetches_everything_and_asks_for_no_robots_txt(tmp_path: Path) -> None:
    (tmp_path / "r.txt").write_text("User-agent: *\nDisallow: /\n")
    with sim(
        "--host",
        "127.0.0.2=capacity:workers=2,service_time=0.001",
        "--robots",
        str(tmp_path / "r.txt"),
    ) as hosts:
        base = hosts["127.0.0.2"]
        source = urls_file(tmp_path, [f"{base}/page/{i}" for i in range(3)])
        polite = fetch(str(source), "-o", str(tmp_path / "p.jsonl"), "--start-delay", "0", "-q")
        before = truth(base)
        rude = fetch(
            str(source),
            "-o",
            str(tmp_path / "r.jsonl"),
            "--start-delay",
            "0",
            "-q",
            "--ignore-robots",
        )
        after = truth(base)
    assert polite.returncode == rude.returncode == 0
    assert before["outcomes"]["ok"] == 0 and before["outcomes"]["robots"] == 1
    assert after["outcomes"]["ok"] == 3 and after["outcomes"]["robots"] == 1


def test_an_unreachable_robots_txt_fetches_nothing_from_the_host(tmp_path: Path) -> None:
    with sim(
        "--host", "127.0.0.2=capacity:workers=2,service_time=0.001", "--robots", "status:503"
    ) as hosts:
        base = hosts["127.0.0.2"]
        source = urls_file(tmp_path, [f"{base}/page/{i}" for i in range(3)])
        done = fetch(str(source), "--start-delay", "0", "--retries", "1", "-q")
        site = truth(base)
    assert done.returncode == 1
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(records) == 3
    assert all(r["error"].startswith("RobotsUnreachable") for r in records)
    assert site["outcomes"]["ok"] == 0 and site["outcomes"]["robots"] == 2  # retries + 1


def test_a_missing_robots_txt_is_not_drawn_as_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sim answers robots.txt 404 (there is none, everything allowed): the
    chart's events leave that 404 out, and keep a URL's own 404; the
    ``--timeline`` file keeps both, as the throttle counted them."""
    drawn: dict[str, list[SlotSample]] = {}

    def plot(self: Timeline, path: str, *, keys: Any = None, **_: Any) -> Path:
        drawn.update({key: self.samples(key) for key in keys})
        return Path(path)

    monkeypatch.setattr(Timeline, "plot", plot)  # what the chart would draw
    timeline = tmp_path / "t.jsonl"
    with sim("--host", "127.0.0.2=capacity:workers=2,service_time=0.001") as hosts:
        base = hosts["127.0.0.2"]
        urls = [f"{base}/page/{i}" for i in range(3)] + [f"{base}/_sim/none"]
        argv = ["fetch", str(urls_file(tmp_path, urls)), "-o", str(tmp_path / "o.jsonl")]
        argv += ["--start-delay", "0", "--chart", str(tmp_path / "c.png")]
        argv += ["--timeline", str(timeline), "-q"]
        assert fetch_main(argv) == 0
    assert list(drawn) == ["127.0.0.2"]
    charted: Counter[int] = Counter()
    for sample in drawn["127.0.0.2"]:
        charted.update(sample.statuses)
    assert charted == {200: 3, 404: 1}  # the URL's own 404, not robots.txt's
    filed: Counter[int] = Counter()
    for line in lines_of(timeline):
        filed.update({int(code): n for code, n in line.get("statuses", {}).items()})
    assert filed == {200: 3, 404: 2}


# ----------------------------------------------------------------------------- soft blocks


def test_a_captcha_wall_is_seen_counted_backed_off_and_retried(tmp_path: Path) -> None:
    with sim("--host", "127.0.0.2=softblock:rate=5") as hosts:
        base = hosts["127.0.0.2"]
        urls = [f"{base}/page/{i}" for i in range(20)]
        out, summary = tmp_path / "out.jsonl", tmp_path / "s.json"
        done = fetch(
            str(urls_file(tmp_path, urls)),
            "-o",
            str(out),
            "--start-delay",
            "0",
            "--retries",
            "4",
            "--block-pattern",
            "autothrottle-sim-captcha",
            "--summary-json",
            str(summary),
            "-q",
        )
        site = truth(base)
    records = lines_of(out)
    assert len(records) == 20
    blocked = sum(r["blocked"] for r in records)
    # Every CAPTCHA page the site served was seen as a block, counted in the lines and
    # the summary; each was retried within the bound; the host was backed off.
    assert blocked == site["outcomes"]["blocked"] >= 1
    data = json.loads(summary.read_text())
    assert data["blocked"] == blocked and data["busiest_hosts"][0]["backoffs"] >= 1
    assert data["busiest_hosts"][0]["backoff_reasons"].get("blocked", 0) >= 1
    assert all(r["attempts"] <= 5 for r in records)
    assert site["requests"] == sum(r["attempts"] for r in records) + site["outcomes"]["robots"]
    still = [r for r in records if r["error"] is not None]
    assert all(r["error"].startswith("Blocked") and r["blocked"] == 5 for r in still)
    assert done.returncode == (1 if still else 0)
    assert sum(r["status"] == 200 and r["error"] is None for r in records) == site["outcomes"]["ok"]


def test_block_status_marks_a_status_as_a_block(tmp_path: Path) -> None:
    with sim("--host", "127.0.0.2=rate:rate=2,burst=1,headers=false,retry_after=false") as hosts:
        base = hosts["127.0.0.2"]
        urls = [f"{base}/page/{i}" for i in range(6)]
        out = tmp_path / "out.jsonl"
        fetch(
            str(urls_file(tmp_path, urls)),
            "-o",
            str(out),
            "--start-delay",
            "0",
            "--retries",
            "1",
            "--block-status",
            "429",
            "--backoff-statuses",
            "503",
            "-q",
        )
        site = truth(base)
    records = lines_of(out)
    assert sum(r["blocked"] for r in records) == site["outcomes"]["limited"] >= 1

"""``autothrottle fetch`` meets what no rule of its own foresaw: a header value a
client refuses to send, and an error no failure class names.

Found walking docs/cli.md: ``--user-agent`` with a line break, or ``-H`` with a
control character other than one, passed the flags' checks; under aiohttp every
URL's task then died of aiohttp's ``ValueError`` ("Forbidden control character
detected in headers"), no line was written for any URL, and the run exited 0.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from autothrottle.cli import _fetch_url
from autothrottle.cli._main import main as fetch_main


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--user-agent", "bot\r\nX-Evil: 1"], "--user-agent"),
        (["--user-agent", "bot\x01"], "--user-agent"),
        (["-H", "X-A: b\x01c"], "-H/--header"),
        (["-H", "X-A: b\x7fc"], "-H/--header"),
    ],
)
def test_a_header_value_no_client_sends_is_refused_naming_its_flag(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    (tmp_path / "u.txt").write_text("http://127.0.0.2:9/\n")
    done = subprocess.run(
        [sys.executable, "-m", "autothrottle", "fetch", "u.txt", "-o", "out.jsonl", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and needle in done.stderr, done.stderr
    assert "control character" in done.stderr
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--user-agent", ""], "--user-agent"),
        (["--user-agent", "  "], "--user-agent"),
        (["-H", "User-Agent:"], "-H/--header"),
        (["-H", "user-agent:   "], "-H/--header"),
    ],
)
def test_an_empty_user_agent_is_refused_naming_its_flag(
    tmp_path: Path, args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """wget takes ``--user-agent ''`` to send none; the fetch says who it is (robots.txt
    rules are matched against that name), and was sending an empty one, matched
    against whatever group came first."""
    (tmp_path / "u.txt").write_text("http://127.0.0.2:9/\n")
    with pytest.raises(SystemExit) as exit_info:
        fetch_main(["fetch", str(tmp_path / "u.txt"), "-o", str(tmp_path / "o.jsonl"), *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "may not be empty" in err, err
    assert not (tmp_path / "o.jsonl").exists()


def test_a_tab_in_a_header_value_is_a_header_value(tmp_path: Path) -> None:
    """RFC 9110 lets a field value hold a tab: it is not refused."""
    from autothrottle.cli._fetch_options import _header_arg

    assert _header_arg("X-A: b\tc") == ("X-A", "b\tc")


def test_an_error_no_rule_names_still_gives_the_url_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Whatever a URL's fetch raises, the URL gets its one line, with the error,
    and the exit status says a URL ended in an error: no URL is lost silently."""

    async def surprise(self: object, key: str, url: str) -> None:
        raise ValueError("Forbidden control character detected in headers")

    monkeypatch.setattr(_fetch_url.UrlFetch, "line", surprise)
    urls = tmp_path / "u.txt"
    urls.write_text("http://127.0.0.2:9/a\nhttp://127.0.0.2:9/b\n")
    out = tmp_path / "out.jsonl"
    status = fetch_main(["fetch", str(urls), "-o", str(out), "-q", "--ignore-robots"])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert status == 1
    assert sorted(line["url"] for line in lines) == ["http://127.0.0.2:9/a", "http://127.0.0.2:9/b"]
    assert {line["error"] for line in lines} == {
        "ValueError: Forbidden control character detected in headers"
    }
    assert {line["status"] for line in lines} == {None}


class _Attachment(http.server.BaseHTTPRequestHandler):
    """Every page an attachment whose suggested name climbs out of any folder."""

    def do_GET(self) -> None:
        if self.path == "/robots.txt":
            self.send_error(404)
            return
        body = b"the same body\n"
        self.send_response(200)
        self.send_header("Content-Disposition", 'attachment; filename="../../escaped.txt"')
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_body_lands_in_bodies_by_its_hash_whatever_name_the_server_suggests(
    tmp_path: Path,
) -> None:
    """wget's ``--content-disposition`` would name the file ``../../escaped.txt``;
    the fetch names a body by its SHA-256 under ``--bodies``, so nothing lands
    outside it, and fetching the same body again (wget's ``-nc`` question)
    overwrites nothing: it is the same name, one file."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Attachment)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        (work / "u.txt").write_text(f"{base}/one\n{base}/two\n")
        for out in ("first.jsonl", "second.jsonl"):
            argv = ["fetch", str(work / "u.txt"), "-o", str(work / out), "-q"]
            assert fetch_main([*argv, "--bodies", str(work / "bodies"), "--start-delay", "0"]) == 0
    finally:
        server.shutdown()
        server.server_close()
    digest = hashlib.sha256(b"the same body\n").hexdigest()
    files = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert [str(p) for p in files] == [
        f"a/b/bodies/{digest[:2]}/{digest}",
        "a/b/first.jsonl",
        "a/b/second.jsonl",
        "a/b/u.txt",
    ]
    lines = [json.loads(line) for line in (work / "second.jsonl").read_text().splitlines()]
    assert {line["sha256"] for line in lines} == {digest}
